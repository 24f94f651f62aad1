//! Hang diagnostics: what a vnode waits for, so that a run that stops progressing says so
//! instead of idling silently (issue 13 "no hang without a word").
//!
//! Rules:
//!
//! 1. A driver whose vnodes have seen no task complete in the whole run for
//!    [`Stall::after`] reports, once per stall, every one of its vnodes' [`VnodeWaits`]: on
//!    standard error (a warning), or as [`RunError::Stalled`] ending the run when
//!    [`Stall::fail`] is set (tests use it as a deadline).
//! 2. A report names, per vnode: its epoch and outstanding work units, ready tasks, tasks
//!    blocked on inputs (with the data they miss), grants not acknowledged (task, thief),
//!    returns not acknowledged (data, victim), returns expected from thieves, messages held
//!    for durability (with the sequence they wait for and the durable mark), and an
//!    outstanding steal request.

use std::fmt;
use std::time::Duration;

use crate::error::RunError;
use crate::ids::{DataId, TaskId, VnodeId};

/// When a run is said to stall (rule 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// No task completed anywhere in the run for this long.
    pub after: Duration,
    /// End the run with [`RunError::Stalled`] instead of warning.
    pub fail: bool,
}

impl Default for Stall {
    fn default() -> Self {
        // Far above any pause a healthy run has (a recovery, a slow flush), short enough that
        // someone watching a hung run hears why within a minute.
        Stall {
            after: Duration::from_secs(30),
            fail: false,
        }
    }
}

/// Examples of each kind a report names; the counts are always whole.
const EXAMPLES: usize = 4;

/// What one vnode waits for (rule 2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VnodeWaits {
    /// The vnode.
    pub vnode: VnodeId,
    /// Its incarnation.
    pub epoch: u64,
    /// Outstanding work units (live tasks and obligations).
    pub work: u64,
    /// Ready tasks not yet run.
    pub ready: usize,
    /// Tasks waiting for inputs: how many, and some with the data they miss.
    pub blocked: (usize, Vec<(TaskId, Vec<DataId>)>),
    /// Grants not acknowledged: how many, and some (task, thief).
    pub grants: (usize, Vec<(TaskId, VnodeId)>),
    /// Returns not acknowledged: how many, and some (data, victim).
    pub returns: (usize, Vec<(DataId, VnodeId)>),
    /// Outputs of given-away tasks not back yet: how many, and some (data, thief).
    pub expected: (usize, Vec<(DataId, VnodeId)>),
    /// Messages held until their event is durable: how many, the sequence the first waits
    /// for, and the durable mark.
    pub held: (usize, u64, u64),
    /// The victim of an outstanding steal request.
    pub stealing_from: Option<VnodeId>,
}

/// The first [`EXAMPLES`] items and the count of all.
pub(crate) fn sample<T>(items: impl Iterator<Item = T>) -> (usize, Vec<T>) {
    let mut n = 0;
    let mut some = Vec::new();
    for x in items {
        if some.len() < EXAMPLES {
            some.push(x);
        }
        n += 1;
    }
    (n, some)
}

fn list<T>(
    f: &mut fmt::Formatter<'_>,
    what: &str,
    (n, some): &(usize, Vec<T>),
    show: impl Fn(&T) -> String,
) -> fmt::Result {
    if *n == 0 {
        return Ok(());
    }
    let shown: Vec<String> = some.iter().map(show).collect();
    let more = if *n > some.len() { ", ..." } else { "" };
    write!(f, "; {n} {what} [{}{more}]", shown.join(", "))
}

impl fmt::Display for VnodeWaits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (epoch {}): {} work units, {} ready",
            self.vnode,
            self.epoch,
            super::shared::work_units(self.work),
            self.ready
        )?;
        list(f, "blocked on inputs", &self.blocked, |(t, d)| {
            let d: Vec<String> = d.iter().map(|d| format!("{d:#}")).collect();
            format!("{t:#} waits for {}", d.join(" "))
        })?;
        list(f, "grants unacknowledged", &self.grants, |(t, v)| {
            format!("{t:#} to {v}")
        })?;
        list(f, "returns unacknowledged", &self.returns, |(d, v)| {
            format!("{d:#} to {v}")
        })?;
        list(f, "returns expected", &self.expected, |(d, v)| {
            format!("{d:#} from {v}")
        })?;
        if self.held.0 > 0 {
            write!(
                f,
                "; {} messages held for durability (first waits for seq {}, durable {})",
                self.held.0, self.held.1, self.held.2
            )?;
        }
        if let Some(v) = self.stealing_from {
            write!(f, "; a steal request out to {v}")?;
        }
        Ok(())
    }
}

/// The error of a stalled run (rule 1).
pub(crate) fn stalled(after: Duration, waits: Vec<VnodeWaits>) -> RunError {
    RunError::Stalled { after, waits }
}

//! Workers from a resource manager (HyperQueue's automatic allocation): allocations submitted
//! to Slurm whose job script runs `APP worker --join ...`, listed, cancelled, and resubmitted
//! while the coordinator still needs workers.
//!
//! The decisions (what to submit, when to try again, when to give up) are the I/O-free
//! [`AutoAlloc`], driven with explicit times, what the resource manager lists and what the
//! coordinator says it needs; the [`slurm`] driver runs `sbatch`, `squeue` and `scancel`.
//!
//! Rules:
//!
//! 1. An allocation is one resource-manager job hosting one worker: per task (one Slurm task
//!    with `threads` CPUs, jobs sharing nodes) or per node (a whole node, `threads` = its
//!    CPUs). The job's script `exec`s the worker, so the allocation ends when the worker does,
//!    and a lost allocation (scancel, time limit, node failure) is a lost worker, which the
//!    coordinator handles like any other. Workers started this way are ordinary members.
//! 2. The allocations of one pool are told apart in the resource manager's own listing, with
//!    no state kept here: job name `veriflow-<program>`, comment
//!    `veriflow:<worker|spare>:<coordinators>`.
//! 3. An allocation counts towards the pool while it is queued, running or ending
//!    ([`AllocState`]; while Slurm finishes a job its node is still held, and how it ended is
//!    not known yet); one that ended does not.
//! 4. Automatic allocation keeps `workers` worker and `spares` spare allocations counted
//!    (rule 3) while the coordinator has a job or submissions waiting for workers
//!    ([`Demand::Needed`]); until the pool the user asked for has been complete once, it
//!    counts as needed whatever the coordinator says. With no demand nothing is submitted,
//!    and nothing is ever cancelled.
//! 5. A failed submission waits [`RETRY_FIRST`], doubling up to [`RETRY_MAX`], before the
//!    next; after [`MAX_FAILURES`] failures in a row the watcher stops with the last error.
//! 6. A coordinator that cannot be asked gets nothing submitted for it; after
//!    [`COORDINATOR_PATIENCE`] without an answer the watcher stops (its workers give up too).
//! 7. Crash loop: an allocation whose worker failed (its script exited non-zero,
//!    [`AllocState::Failed`]) less than [`MIN_LIFE`] after it was submitted or first seen is
//!    short-lived (a wrong key or address, a missing binary on the nodes); after
//!    [`MAX_SHORT_LIVED`] of them in a row the watcher stops rather than submit forever. Any
//!    other end of an allocation that ran, or lived that long, resets the count (a scancel, a
//!    time limit, a lost node); one cancelled while queued is neither. An allocation first
//!    seen already ending or ended (an earlier watcher's) is not counted. One seen ending
//!    ([`AllocState::Ending`], Slurm's `COMPLETING`) is judged by the state it ends in.

pub mod slurm;

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::protocol::ClusterStatus;

/// First wait after a failed submission (rule 5): a resource manager refusing once (busy
/// controller) is asked again soon.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between failed submissions (rule 5), HyperQueue's order of magnitude.
pub const RETRY_MAX: Duration = Duration::from_secs(60);
/// Failed submissions in a row before the watcher gives up (rule 5): 1+2+4+8 s of retrying.
pub const MAX_FAILURES: u32 = 5;
/// A failed allocation that ended sooner after it was submitted is short-lived (rule 7): a
/// worker that fails at start (its address, a refused key) does so within seconds of starting;
/// 20 s leaves room for a slow scheduler and a watch interval.
pub const MIN_LIFE: Duration = Duration::from_secs(20);
/// Short-lived allocations in a row before the watcher stops (rule 7): one or two can be
/// scancels or lost nodes; three in a row with nothing longer between is a pattern.
pub const MAX_SHORT_LIVED: u32 = 3;
/// How long the watcher goes on without an answer from the coordinator (rule 6): twice a
/// worker's default rejoin patience, so a standby's takeover is waited out.
pub const COORDINATOR_PATIENCE: Duration = Duration::from_secs(60);

/// What an allocation's worker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// An ordinary worker.
    Worker,
    /// A spare (`worker --spare`), idle until a lost worker's vnodes need a host.
    Spare,
}

impl Role {
    /// Its name in the allocation's comment (rule 2).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Spare => "spare",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Where an allocation is in its life (rule 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllocState {
    /// Waiting for resources (or requeued).
    Queued,
    /// Its worker runs.
    Running,
    /// Its worker stopped and Slurm is finishing it (`COMPLETING`): it still counts (rule 3),
    /// and how it ended (rule 7) is known once it is [`Ended`](Self::Ended) or
    /// [`Failed`](Self::Failed).
    Ending,
    /// Ended (cancelled, timed out, its node lost, completed): it no longer counts.
    Ended,
    /// Ended with its worker failing (rule 7): it no longer counts.
    Failed,
}

/// One allocation of a pool, as the resource manager lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// The resource manager's job id.
    pub id: String,
    /// What its worker is.
    pub role: Role,
    /// Where it is in its life.
    pub state: AllocState,
    /// The resource manager's own word for the state (`PENDING`, `RUNNING`, ...).
    pub raw_state: String,
    /// The coordinators its worker joins, as given to `--join`.
    pub coordinator: String,
    /// Time it has run, as the resource manager prints it.
    pub time: String,
    /// Its time limit, as the resource manager prints it.
    pub time_limit: String,
    /// Its node(s), or why it waits.
    pub nodes: String,
}

impl Allocation {
    /// Whether it counts towards its pool (rule 3).
    pub fn counts(&self) -> bool {
        matches!(
            self.state,
            AllocState::Queued | AllocState::Running | AllocState::Ending
        )
    }
}

/// How many allocations of each role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pool {
    /// Worker allocations.
    pub workers: u32,
    /// Spare allocations.
    pub spares: u32,
}

impl Pool {
    /// Both roles together.
    pub fn total(self) -> u32 {
        self.workers.saturating_add(self.spares)
    }

    /// How many of `role`.
    pub fn of(self, role: Role) -> u32 {
        match role {
            Role::Worker => self.workers,
            Role::Spare => self.spares,
        }
    }
}

/// What the coordinator needs, from its status (rule 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demand {
    /// A job runs or submissions wait for workers.
    Needed,
    /// No job and nothing waiting.
    Idle,
    /// The coordinator could not be asked, or is a standby.
    Unknown,
}

impl Demand {
    /// The demand a coordinator's status shows.
    pub fn of(status: &ClusterStatus) -> Demand {
        if status.role != "active" {
            Demand::Unknown
        } else if status.waiting > 0 || status.jobs.iter().any(|j| !j.ended()) {
            Demand::Needed
        } else {
            Demand::Idle
        }
    }
}

/// The allocations of `pool` missing from `allocs` (those that count, rule 3), by role.
pub fn missing(pool: Pool, allocs: &[Allocation]) -> Pool {
    let have = |role| {
        let n = allocs
            .iter()
            .filter(|a| a.role == role && a.counts())
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    };
    Pool {
        workers: pool.workers.saturating_sub(have(Role::Worker)),
        spares: pool.spares.saturating_sub(have(Role::Spare)),
    }
}

/// What the watcher does next.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Step {
    /// Submit these allocations, reporting each result with [`AutoAlloc::submitted`].
    Submit(Pool),
    /// Nothing to do until the next round.
    Wait,
    /// Stop watching (rules 5 and 6), for this reason.
    Stop(String),
}

/// What [`AutoAlloc`] knows of an allocation it watches (rule 7).
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// When it was submitted or first seen.
    since: Duration,
    /// Whether it was seen running.
    ran: bool,
}

/// Automatic allocation's decisions (rules 4-7), free of I/O: the driver calls [`tick`]
/// every round with the time, the pool's allocations and the coordinator's demand.
///
/// [`tick`]: AutoAlloc::tick
#[derive(Debug, Clone)]
pub struct AutoAlloc {
    pool: Pool,
    first: bool,
    failures: u32,
    last_error: String,
    retry_at: Option<Duration>,
    unanswered_since: Option<Duration>,
    /// Every allocation submitted or seen counting and not ended yet (rule 7).
    seen: std::collections::BTreeMap<String, Seen>,
    short_lived: u32,
}

impl AutoAlloc {
    /// Keeps `pool` allocated.
    pub fn new(pool: Pool) -> AutoAlloc {
        AutoAlloc {
            pool,
            first: true,
            failures: 0,
            last_error: String::new(),
            retry_at: None,
            unanswered_since: None,
            seen: std::collections::BTreeMap::new(),
            short_lived: 0,
        }
    }

    /// Notes which allocations ran and which ended since the last round (rule 7).
    fn observe(&mut self, now: Duration, allocs: &[Allocation]) {
        for a in allocs {
            let seen = match self.seen.get_mut(&a.id) {
                Some(seen) => seen,
                // First seen ending or ended: an earlier watcher's, not counted.
                None if !matches!(a.state, AllocState::Queued | AllocState::Running) => continue,
                None => self.seen.entry(a.id.clone()).or_insert(Seen {
                    since: now,
                    ran: false,
                }),
            };
            seen.ran |= a.state == AllocState::Running;
        }
        let ended: Vec<(String, AllocState)> = self
            .seen
            .keys()
            .filter_map(|id| match allocs.iter().find(|a| &a.id == id) {
                Some(a) if a.counts() => None,
                Some(a) => Some((id.clone(), a.state)),
                None => Some((id.clone(), AllocState::Ended)),
            })
            .collect();
        for (id, state) in ended {
            let Some(seen) = self.seen.remove(&id) else {
                continue;
            };
            let lived = now.saturating_sub(seen.since);
            if state == AllocState::Failed && lived < MIN_LIFE {
                self.short_lived += 1;
            } else if seen.ran || lived >= MIN_LIFE {
                self.short_lived = 0;
            }
        }
    }

    /// One round at time `now` (since any fixed start).
    pub fn tick(&mut self, now: Duration, allocs: &[Allocation], demand: Demand) -> Step {
        self.observe(now, allocs);
        if self.short_lived >= MAX_SHORT_LIVED {
            return Step::Stop(format!(
                "{} allocations in a row failed less than {MIN_LIFE:?} after they were \
                 submitted: their workers fail at once",
                self.short_lived
            ));
        }
        if self.failures >= MAX_FAILURES {
            return Step::Stop(format!(
                "{} submissions failed in a row; the last: {}",
                self.failures, self.last_error
            ));
        }
        // Rule 6.
        let demand = match demand {
            Demand::Unknown if self.first => Demand::Needed,
            Demand::Unknown => {
                let since = *self.unanswered_since.get_or_insert(now);
                if now.saturating_sub(since) >= COORDINATOR_PATIENCE {
                    return Step::Stop(format!(
                        "the coordinator did not answer for {COORDINATOR_PATIENCE:?}"
                    ));
                }
                return Step::Wait;
            }
            d => {
                self.unanswered_since = None;
                d
            }
        };
        // Rule 5.
        if self.retry_at.is_some_and(|at| now < at) {
            return Step::Wait;
        }
        // Rule 4.
        if demand != Demand::Needed && !self.first {
            return Step::Wait;
        }
        let need = missing(self.pool, allocs);
        if need.total() == 0 {
            // The pool the user asked for is there: from now on, only demand refills it.
            self.first = false;
            Step::Wait
        } else {
            Step::Submit(need)
        }
    }

    /// The result of one submission of the last [`Step::Submit`]: the allocation's id, or why
    /// it was refused (rules 5 and 7).
    pub fn submitted(&mut self, now: Duration, result: Result<String, String>) {
        match result {
            Ok(id) => {
                self.failures = 0;
                self.retry_at = None;
                self.seen.entry(id).or_insert(Seen {
                    since: now,
                    ran: false,
                });
            }
            Err(e) => {
                self.failures += 1;
                self.last_error = e;
                let wait = RETRY_FIRST
                    .saturating_mul(1 << (self.failures - 1).min(16))
                    .min(RETRY_MAX);
                self.retry_at = Some(now + wait);
            }
        }
    }
}

/// Parses a time limit: `90s`, `30m`, `1h`, `1h30m`, `2d`, or a bare number of minutes (as
/// sbatch reads one). Whole seconds, at least one.
pub fn parse_time_limit(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let bad = || format!("time limit {text:?}: expected e.g. 90s, 30m, 1h, 1h30m or 2d");
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(minutes) = t.parse::<u64>() {
        return minutes
            .checked_mul(60)
            .filter(|&s| s > 0)
            .map(Duration::from_secs)
            .ok_or_else(bad);
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    for c in t.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(bad()),
        };
        let n: u64 = number.parse().map_err(|_| bad())?;
        number.clear();
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(bad)?;
    }
    if !number.is_empty() || total == 0 {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

#[cfg(test)]
mod tests;

//! The elementary oracle O_e (paper 001 Fig. 5): re-run a task from its logged record and
//! compare with the log.
//!
//! Rules:
//!
//! 1. A task is forged when its re-run differs from its log in any value it wrote (compared by
//!    digest, datum by datum), in the children it declared (ids and full records: name,
//!    arguments, inputs, outputs), or when it cannot be re-run on its logged inputs at all
//!    (its body fails or panics where the log says it completed).
//! 2. A task whose name the registry does not know is not a forgery but a wrong program: an
//!    error for the whole certification.
//! 3. The oracle is a pure function of the track: checks run in parallel on a thread pool and
//!    their verdicts do not depend on the order.

use serde::{Deserialize, Serialize};
use veriflow_runtime::replay::replay;
use veriflow_runtime::{Registry, RunError};

use crate::track::{Ix, Track};

/// A forged task found by the oracle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detection {
    /// The task.
    pub task: String,
    /// Its name.
    pub name: String,
    /// The vnode that ran it (and lied).
    pub vnode: Option<u32>,
    /// What differs.
    pub reason: String,
}

/// The oracle's answer for one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The re-run agrees with the log.
    Clean,
    /// It does not (rule 1).
    Forged(Detection),
}

/// Checks task `t` of `track` (rules 1-2).
pub fn check(track: &Track, registry: &Registry, t: Ix) -> Result<Verdict, RunError> {
    let rec = track.task(t);
    let forged = |reason: String| {
        Ok(Verdict::Forged(Detection {
            task: format!("{:#}", rec.id),
            name: rec
                .record
                .as_ref()
                .map_or_else(|| "?".to_string(), |r| r.name.to_string()),
            vnode: rec.ran_on.map(|v| v.0),
            reason,
        }))
    };
    let (Some(record), Some(wrote)) = (&rec.record, &rec.wrote) else {
        return forged("not declared and completed in the log".to_string());
    };
    let Some(inputs) = track.input_values(t)? else {
        return forged("an input has no logged value".to_string());
    };
    let args = track.resolve((&record.args).into())?;
    let again = match replay(registry, record, &args, &inputs) {
        Ok(r) => r,
        Err(e @ (RunError::UnknownTaskName { .. } | RunError::UnregisteredTask { .. })) => {
            return Err(e)
        }
        Err(e) => return forged(format!("the oracle's re-run failed: {e}")),
    };
    let mut logged: Vec<_> = wrote.iter().map(|o| (o.data, o.digest)).collect();
    let mut fresh: Vec<_> = again.outputs.iter().map(|o| (o.data, o.digest)).collect();
    logged.sort_unstable_by_key(|(d, _)| *d);
    fresh.sort_unstable_by_key(|(d, _)| *d);
    if logged != fresh {
        let diff = fresh
            .iter()
            .zip(&logged)
            .find(|(a, b)| a != b)
            .map(|((d, o), (_, l))| format!("{d} is {o} on the oracle, {l} in the log"))
            .unwrap_or_else(|| {
                format!(
                    "it wrote {} values on the oracle, {} in the log",
                    fresh.len(),
                    logged.len()
                )
            });
        return forged(format!("output differs: {diff}"));
    }
    if again.children.len() != rec.children.len() {
        return forged(format!(
            "declared {} children on the oracle, {} in the log",
            again.children.len(),
            rec.children.len()
        ));
    }
    for (i, (c, &logged_id)) in again.children.iter().zip(&rec.children).enumerate() {
        let logged = track.index_of(logged_id).and_then(|ci| track.record(ci));
        if c.task != logged_id || logged.as_ref() != Some(c) {
            return forged(format!(
                "child {i} ({}) differs from its logged record",
                c.task
            ));
        }
    }
    Ok(Verdict::Clean)
}

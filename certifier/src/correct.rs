//! Algorithm 1's correction (paper 001 §V-B): a forged task and all its successors form G_F;
//! G_F is re-executed on the oracle and written as a new generation of the log.
//!
//! Rules:
//!
//! 1. G_F is closed under successors in G: the readers of every value a task of G_F wrote,
//!    and its children (transitively).
//! 2. Re-execution is a small data-flow run on the oracle, in waves: a task runs when every
//!    input is known; an input written by a task of G_F (or by a task that a re-run declared
//!    anew) waits for the re-run value, any other input is the logged value. The tasks of G_F
//!    whose parent is outside G_F start from their logged records; every other task starts
//!    from the record its re-run parent declared — so a lying parent's wrong children are
//!    replaced by the right ones, and children it should have declared appear.
//! 3. Each wave runs in parallel and is ordered by task id: the result does not depend on the
//!    number of threads.
//! 4. The new generation is the old one without any event of a task of G_F (nor any returned
//!    copy of a value they wrote), plus the oracle's log (vnode `VnodeId::ORACLE`): for each
//!    re-run task its `Declared`, `Started` and `Completed` events.
//! 5. A re-run that fails, or data that nothing will ever write, is an error: the correction
//!    is abandoned and the log is left as it was.

use std::collections::VecDeque;

use rayon::prelude::*;
use veriflow_runtime::log::{Declared, Event, LogError, LogReader, Output, Payload};
use veriflow_runtime::replay::replay;
use veriflow_runtime::{DataId, Digest, IdMap, IdSet, Registry, RunError, TaskId, VnodeId};

use crate::track::{Ix, Track};

/// A task the oracle re-ran.
#[derive(Clone, Debug)]
pub struct Redone {
    /// The record it ran from.
    pub record: Declared,
    /// Digests of the inputs it read.
    pub inputs: Vec<Digest>,
    /// What it wrote.
    pub outputs: Vec<Output>,
    /// Children it declared.
    pub children: Vec<TaskId>,
}

/// What went wrong while correcting (rule 5).
#[derive(Debug, Clone, thiserror::Error)]
pub enum CorrectError {
    /// A re-run task failed on the oracle.
    #[error("re-running {task} on the oracle failed: {source}")]
    Rerun {
        /// The task.
        task: TaskId,
        /// Why.
        source: RunError,
    },
    /// Tasks wait for data that no task will write.
    #[error("correction is stuck: {count} tasks wait, e.g. {task} for {data}")]
    Stuck {
        /// How many wait.
        count: usize,
        /// One of them.
        task: TaskId,
        /// A datum it waits for.
        data: DataId,
    },
    /// A logged value a re-run needs cannot be read (missing from the value store, or not what
    /// its digest says).
    #[error("re-running {task} on the oracle: {source}")]
    Value {
        /// The task.
        task: TaskId,
        /// Why.
        source: LogError,
    },
    /// The correction itself failed (a bug in the certifier: please report it).
    #[error("the correction stopped unexpectedly: {0}")]
    Internal(String),
}

/// Rule 1: G_F, grown one forged task at a time (each addition visits only what is new).
pub struct Closure {
    readers: IdMap<DataId, Vec<Ix>>,
    in_gf: Vec<bool>,
}

impl Closure {
    /// An empty G_F over `track`.
    pub fn new(track: &Track) -> Closure {
        Closure {
            readers: track.readers(),
            in_gf: vec![false; track.len()],
        }
    }

    /// Adds `t` and all its successors.
    pub fn add(&mut self, track: &Track, t: Ix) {
        if self.in_gf[t as usize] {
            return;
        }
        self.in_gf[t as usize] = true;
        let mut stack = vec![t];
        while let Some(t) = stack.pop() {
            for s in track.successors(t, &self.readers) {
                if !self.in_gf[s as usize] {
                    self.in_gf[s as usize] = true;
                    stack.push(s);
                }
            }
        }
    }

    /// Membership of each task.
    pub fn marks(&self) -> &[bool] {
        &self.in_gf
    }
}

/// Rule 2-3: re-executes G_F; `progress(done)` after each task.
pub fn reexecute(
    track: &Track,
    registry: &Registry,
    in_gf: &[bool],
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<Redone>, CorrectError> {
    let mut recomputed: IdSet<DataId> = IdSet::default();
    let mut pending: Vec<Declared> = Vec::new();
    for (i, _) in in_gf.iter().enumerate().filter(|(_, &b)| b) {
        let Some(r) = track.record(i as Ix) else {
            continue;
        };
        recomputed.extend(r.outputs.iter().copied());
        let parent_in_gf = r
            .parent
            .and_then(|p| track.index_of(p))
            .is_some_and(|p| in_gf[p as usize]);
        if !parent_in_gf {
            pending.push(r);
        }
    }
    let mut fresh: IdMap<DataId, (Payload, Digest)> = IdMap::default();
    let mut done: Vec<Redone> = Vec::new();
    let mut waiting: VecDeque<Declared> = VecDeque::new();
    loop {
        waiting.extend(pending.drain(..));
        let mut ready = Vec::new();
        let mut still = VecDeque::new();
        for r in waiting.drain(..) {
            if r.inputs
                .iter()
                .all(|d| available(track, &recomputed, &fresh, *d))
            {
                ready.push(r);
            } else {
                still.push_back(r);
            }
        }
        waiting = still;
        if ready.is_empty() {
            break;
        }
        ready.sort_unstable_by_key(|r| r.task);
        let results: Vec<Result<(Redone, Vec<Declared>), CorrectError>> = ready
            .into_par_iter()
            .map(|r| {
                let values: Vec<(Payload, Digest)> = r
                    .inputs
                    .iter()
                    .filter_map(|d| value(track, &recomputed, &fresh, *d))
                    .collect();
                let bytes: Vec<Vec<u8>> = values
                    .iter()
                    .map(|(v, _)| track.resolve(v.into()))
                    .collect::<Result<_, _>>()
                    .map_err(|source| CorrectError::Value {
                        task: r.task,
                        source,
                    })?;
                let args =
                    track
                        .resolve((&r.args).into())
                        .map_err(|source| CorrectError::Value {
                            task: r.task,
                            source,
                        })?;
                let again =
                    replay(registry, &r, &args, &bytes).map_err(|source| CorrectError::Rerun {
                        task: r.task,
                        source,
                    })?;
                progress(1);
                let redone = Redone {
                    inputs: values.iter().map(|(_, d)| *d).collect(),
                    children: again.children.iter().map(|c| c.task).collect(),
                    outputs: again.outputs,
                    record: r,
                };
                Ok((redone, again.children))
            })
            .collect();
        for result in results {
            let (redone, kids) = result?;
            for o in &redone.outputs {
                fresh.insert(o.data, (o.value.clone(), o.digest));
            }
            for k in &kids {
                recomputed.extend(k.outputs.iter().copied());
            }
            pending.extend(kids);
            done.push(redone);
        }
    }
    if let Some(r) = waiting.front() {
        let data = r
            .inputs
            .iter()
            .copied()
            .find(|d| !available(track, &recomputed, &fresh, *d))
            .unwrap_or(DataId(0));
        return Err(CorrectError::Stuck {
            count: waiting.len(),
            task: r.task,
            data,
        });
    }
    Ok(done)
}

/// Whether datum `d` is known for a re-run (rule 2).
fn available(
    track: &Track,
    recomputed: &IdSet<DataId>,
    fresh: &IdMap<DataId, (Payload, Digest)>,
    d: DataId,
) -> bool {
    // `value` without the copy.
    fresh.contains_key(&d) || (!recomputed.contains(&d) && track.value(d).is_some())
}

fn value(
    track: &Track,
    recomputed: &IdSet<DataId>,
    fresh: &IdMap<DataId, (Payload, Digest)>,
    d: DataId,
) -> Option<(Payload, Digest)> {
    if let Some(v) = fresh.get(&d) {
        return Some(v.clone());
    }
    if recomputed.contains(&d) {
        return None;
    }
    track.value(d).map(|(v, digest)| (v.to_payload(), digest))
}

/// Rule 4: the events of the next generation, per vnode.
pub fn next_generation(
    reader: &LogReader,
    track: &Track,
    in_gf: &[bool],
    redone: &[Redone],
) -> Result<Vec<(VnodeId, Vec<Event>)>, veriflow_runtime::log::LogError> {
    let mut dropped_tasks: IdSet<TaskId> = IdSet::default();
    let mut dropped_data: IdSet<DataId> = IdSet::default();
    for (i, _) in in_gf.iter().enumerate().filter(|(_, &b)| b) {
        dropped_tasks.insert(track.id(i as Ix));
        if let Some(r) = track.record(i as Ix) {
            dropped_data.extend(r.outputs);
        }
    }
    for r in redone {
        dropped_tasks.insert(r.record.task);
        dropped_data.extend(r.record.outputs.iter().copied());
    }
    let mut logs = Vec::new();
    let mut oracle_old = Vec::new();
    for v in reader.vnodes()? {
        let kept: Vec<Event> = reader
            .read_vnode(v)?
            .events
            .into_iter()
            .map(|e| e.event)
            .filter(|e| match e {
                Event::Returned { output } => !dropped_data.contains(&output.data),
                Event::Input { .. } => true,
                other => !dropped_tasks.contains(&TaskId(other.key().0)),
            })
            .collect();
        if v == VnodeId::ORACLE {
            oracle_old = kept;
        } else {
            logs.push((v, kept));
        }
    }
    let mut oracle = oracle_old;
    for r in redone {
        oracle.push(Event::Declared(r.record.clone()));
        oracle.push(Event::Started {
            task: r.record.task,
            inputs: r.inputs.clone(),
        });
        oracle.push(Event::Completed {
            task: r.record.task,
            outputs: r.outputs.clone(),
            children: r.children.clone(),
        });
    }
    logs.push((VnodeId::ORACLE, oracle));
    Ok(logs)
}

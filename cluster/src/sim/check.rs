//! The simulator's checkers (rule 6 of `sim/mod.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use veriflow_certifier::Prior;

use veriflow_checkpoint::Store;
use veriflow_runtime::log::segment::{decode_segment, parse_segment_key};
use veriflow_runtime::log::{Event, LogReader};
use veriflow_runtime::{MemoryStore, Runtime, TaskId, VnodeId};

use super::{program, SimConfig};

/// An invariant a seed broke.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Violation {
    /// The outputs differ from the single-vnode reference run.
    #[error("outputs {got:?} differ from the reference {want:?}")]
    Outputs {
        /// The reference's encoded outputs.
        want: Vec<Vec<u8>>,
        /// The cluster's.
        got: Vec<Vec<u8>>,
    },
    /// A task's event is in no vnode's log, or in several.
    #[error("task {task:#}: its {kind} event is in the logs of {vnodes:?} (exactly one expected)")]
    Placement {
        /// The task.
        task: TaskId,
        /// Which event.
        kind: &'static str,
        /// Where it was found.
        vnodes: Vec<VnodeId>,
    },
    /// A task completed more than once (counting duplicates the reader drops).
    #[error("task {task:#} completed {times} times in the raw logs (segments {segments:?}): a completed task ran again")]
    RanAgain {
        /// The task.
        task: TaskId,
        /// How often.
        times: usize,
        /// Where: (vnode, segment).
        segments: Vec<(VnodeId, u64)>,
    },
    /// The log has a different number of tasks than the program.
    #[error("the logs hold {got} tasks, the program has {want}")]
    TaskCount {
        /// The program's.
        want: u64,
        /// The logs'.
        got: u64,
    },
    /// A segment the store acknowledged is gone or does not decode.
    #[error("acknowledged segment {key:?} {what}")]
    LostSegment {
        /// Its key.
        key: Vec<u8>,
        /// What is wrong with it.
        what: String,
    },
    /// The logs cannot be read.
    #[error("the logs cannot be read: {0}")]
    Unreadable(String),
    /// Certification with correction did not end in ACCEPT.
    #[error("certification: {0}")]
    Certification(String),
}

/// The outputs of the program on one vnode, without faults: what every seed must give.
pub(super) fn reference(cfg: &SimConfig) -> Result<Vec<Vec<u8>>, String> {
    let rt = Runtime::builder(program::registry().map_err(|e| e.to_string())?)
        .program("sim")
        .threads(1)
        .vnodes(1)
        .store(Arc::new(MemoryStore::default()))
        .build()
        .map_err(|e| e.to_string())?;
    let report = rt
        .run(
            program::Node {
                depth: cfg.depth,
                fanout: cfg.fanout,
                path: 1,
            },
            (),
        )
        .map_err(|e| format!("the reference run failed: {e}"))?;
    Ok(vec![postcard_u64(report.outputs.0)])
}

/// The encoding of a u64 output, as the runtime encodes values.
fn postcard_u64(v: u64) -> Vec<u8> {
    veriflow_runtime::codec::encode(&v).unwrap_or_default()
}

/// Runs the checkers; returns how many invariants were checked.
pub(super) fn check(
    cfg: &SimConfig,
    store: &dyn Store,
    acked: &[Vec<u8>],
    reference: &[Vec<u8>],
    outcome: &(Vec<Vec<u8>>, u32),
) -> Result<u64, Violation> {
    let mut checks = 0u64;
    // A run with forgeries gives wrong outputs until certified and corrected (below).
    if cfg.forge.is_none() && outcome.0 != reference {
        return Err(Violation::Outputs {
            want: reference.to_vec(),
            got: outcome.0.clone(),
        });
    }
    checks += 1;
    // Every acknowledged segment is there and decodes: read once through the store (its
    // strategy decodes every value), each key checked once however often it was written.
    let shared = snapshot(store)?;
    let acked: BTreeSet<&Vec<u8>> = acked.iter().collect();
    for key in acked {
        match shared.get(key) {
            Ok(Some(bytes)) => {
                if parse_segment_key(key).is_some() {
                    decode_segment(&bytes).map_err(|e| Violation::LostSegment {
                        key: key.clone(),
                        what: format!("does not decode: {e:?}"),
                    })?;
                }
            }
            Ok(None) => {
                return Err(Violation::LostSegment {
                    key: key.clone(),
                    what: "is gone".to_string(),
                })
            }
            Err(e) => {
                return Err(Violation::LostSegment {
                    key: key.clone(),
                    what: e.to_string(),
                })
            }
        }
        checks += 1;
    }
    // Placement: each task's Declared, Started and Completed in exactly one vnode's log.
    let logs = LogReader::new(shared.clone())
        .read_all()
        .map_err(|e| Violation::Unreadable(e.to_string()))?;
    let mut placed: BTreeMap<(TaskId, &'static str), BTreeSet<VnodeId>> = BTreeMap::new();
    for l in &logs {
        for e in &l.events {
            let (task, kind) = match &e.event {
                Event::Declared(d) => (d.task, "Declared"),
                Event::Started { task, .. } => (*task, "Started"),
                Event::Completed { task, .. } => (*task, "Completed"),
                _ => continue,
            };
            placed.entry((task, kind)).or_default().insert(l.vnode);
        }
    }
    let declared: BTreeSet<TaskId> = placed
        .keys()
        .filter(|(_, k)| *k == "Declared")
        .map(|(t, _)| *t)
        .collect();
    let want = program::tasks(cfg.depth, cfg.fanout);
    if declared.len() as u64 != want {
        return Err(Violation::TaskCount {
            want,
            got: declared.len() as u64,
        });
    }
    for &t in &declared {
        for kind in ["Declared", "Started", "Completed"] {
            let at: Vec<VnodeId> = placed
                .get(&(t, kind))
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default();
            if at.len() != 1 {
                return Err(Violation::Placement {
                    task: t,
                    kind,
                    vnodes: at,
                });
            }
            checks += 1;
        }
    }
    // Completed exactly once in the raw segments, duplicates included.
    let mut completions: BTreeMap<TaskId, Vec<(VnodeId, u64)>> = BTreeMap::new();
    for (key, bytes) in shared
        .scan_prefix(b"")
        .map_err(|e| Violation::Unreadable(e.to_string()))?
    {
        let Some((vnode, segno)) = parse_segment_key(&key) else {
            continue;
        };
        let seg = decode_segment(&bytes).map_err(|e| Violation::LostSegment {
            key: key.clone(),
            what: format!("does not decode: {e:?}"),
        })?;
        for e in &seg.events {
            if let (_, Event::Completed { task, .. }) = e {
                completions.entry(*task).or_default().push((vnode, segno));
            }
        }
    }
    for (task, segments) in completions {
        if segments.len() != 1 {
            return Err(Violation::RanAgain {
                task,
                times: segments.len(),
                segments,
            });
        }
        checks += 1;
    }
    // With an online oracle, the run's own `run` certifies with what it learned (rule 10).
    if cfg.forge.is_some() && !cfg.oracle {
        checks += certify_and_correct(shared, reference, &Prior::default(), None)?;
    }
    Ok(checks)
}

/// Certifies the run with every task re-run and forged ones corrected (paper 001 Algorithm
/// 1), starting from what an online oracle learned (`prior`, with its `secret`): the verdict
/// is ACCEPT and the corrected outputs are the reference's.
pub(super) fn certify_and_correct(
    store: Arc<dyn Store>,
    reference: &[Vec<u8>],
    prior: &Prior,
    secret: Option<[u8; 32]>,
) -> Result<u64, Violation> {
    let registry = program::registry().map_err(|e| Violation::Unreadable(e.to_string()))?;
    let opts = veriflow_certifier::Options {
        full: true,
        correct: true,
        seed: Some(0),
        secret,
        ..Default::default()
    };
    let cert = veriflow_certifier::certify_with(
        store.clone(),
        &registry,
        &opts,
        prior,
        &veriflow_certifier::NoProgress,
    )
    .map_err(|e| Violation::Certification(e.to_string()))?;
    if cert.decision != veriflow_certifier::Decision::Accept {
        return Err(Violation::Certification(format!(
            "REJECT after correction at generation {}",
            cert.generation
        )));
    }
    let reader = LogReader::latest(store).map_err(|e| Violation::Unreadable(e.to_string()))?;
    let got = veriflow_runtime::log::terminal_outputs(&reader)
        .map_err(|e| Violation::Unreadable(e.to_string()))?
        .unwrap_or_default();
    if got != reference {
        return Err(Violation::Outputs {
            want: reference.to_vec(),
            got,
        });
    }
    Ok(2)
}

/// A copy of a store's contents, so that checking reads nothing the run still holds.
fn snapshot(store: &dyn Store) -> Result<Arc<dyn Store>, Violation> {
    let copy = MemoryStore::default();
    let pairs = store
        .scan_prefix(b"")
        .map_err(|e| Violation::Unreadable(e.to_string()))?;
    copy.put_batch(&pairs)
        .map_err(|e| Violation::Unreadable(e.to_string()))?;
    Ok(Arc::new(copy))
}

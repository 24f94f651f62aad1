//! What recovery needs from a prefix of a vnode's log, folded event by event and compacted: the
//! body of a recovery checkpoint (`checkpoint.rs`, rule 9 of `log/mod.rs`).
//!
//! Rules:
//!
//! 1. **Folding is the log's set semantics.** [`LogState::fold`] applies one event; applying an
//!    event twice changes nothing, so a tail that repeats an event of the prefix is harmless.
//! 2. **A task is live** when it is declared (or adopted) here, not completed, and not stolen.
//!    Recovery restarts exactly the live tasks (`exec/recover.rs` rule 2).
//! 3. **Compaction keeps what a recovery can still use** ([`LogState::compact`]) and drops the
//!    rest, so the state is proportional to the live frontier, not to the tasks run. A task's
//!    record is kept while the task is live; while its parent is live (the parent re-runs after
//!    a failure and must recognise it by id, recovery rule 3); for the root (never planted
//!    twice, recovery rule 5); while it is stolen and an output has not come back (its grant is
//!    sent again, recovery rule 4); and while it is adopted and an output is not yet
//!    acknowledged by its victim (sent again, recovery rule 4). A value is kept while it is a
//!    program input, a terminal output, an input of a live task, an output of a kept task, or
//!    an input of a kept stolen task.
//! 4. **Counts survive compaction**: [`LogState::completed`] counts every task completed in
//!    the folded log (a recovery reports it as "reused"), and the ids of dropped adopted tasks
//!    are kept (a task moves at most once: a late duplicate grant is only acknowledged,
//!    `exec/vnode.rs` rule 4), so their number grows with steals, not tasks.
//! 5. Acknowledgements are not logged. A vnode tells its log writer when a victim acknowledged
//!    a returned value ([`crate::log::VnodeLog::note_acknowledged`]); the victim logged it
//!    durably before acknowledging, so dropping it from a checkpoint loses nothing even though
//!    the note itself is not durable.
//!
//! Recovering from the whole log and from a checkpoint plus the log after it both go through
//! a `LogState`, so they restart the same tasks with the same values (tested in `tests.rs`).
//! The log writer folds a window of events at once ([`LogState::fold_window`], `window.rs`),
//! which gives the state of folding them one by one and compacting.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::{Declared, Event, Output, Payload};
use crate::codec::{self, CodecError, Digest};
use crate::ids::{DataId, IdMap, IdSet, TaskId, VnodeId};

/// One task of the folded log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskState {
    /// Its declaration (from `Declared`, or the record of `Adopted`).
    pub record: Declared,
    /// For an adopted task: its victim and input values.
    pub adopted: Option<(VnodeId, Vec<Payload>)>,
    /// Whether `Started` was logged.
    pub started: bool,
    /// Whether `Completed` was logged.
    pub completed: bool,
    /// The thief, if `Stolen` was logged.
    pub stolen: Option<VnodeId>,
    /// Position of its declaration in the log (restarts follow log order).
    pub order: u64,
}

impl TaskState {
    /// Rule 2.
    pub fn live(&self) -> bool {
        !self.completed && self.stolen.is_none()
    }
}

/// A value written in the folded log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredValue {
    /// Encoded value, or (a large one) its reference in the value store: the state never holds
    /// a large value's bytes (rule 10 of `log/mod.rs`).
    pub value: Payload,
    /// Its digest as logged.
    pub digest: Digest,
    /// Whether it is a program input (`Input`).
    pub input: bool,
}

/// The recovery state of a log prefix (module rules).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogState {
    /// Tasks still needed (rule 3), by id.
    pub tasks: IdMap<TaskId, TaskState>,
    /// Values still needed (rule 3), by data id.
    pub values: IdMap<DataId, StoredValue>,
    /// Tasks completed in the folded log (rule 4).
    pub completed: u64,
    /// Adopted tasks whose records were dropped (rule 4).
    pub adopted: IdSet<TaskId>,
    /// Values returned to a victim and acknowledged (rule 5), while their task is kept.
    pub acked: HashSet<(DataId, VnodeId)>,
    /// Terminal outputs: their values are always kept (rule 3).
    pub pinned: Vec<DataId>,
    /// The order the next declared task gets (`window.rs` counts the tasks it settles).
    pub(super) next_order: u64,
}

impl LogState {
    /// An empty state whose compaction keeps the values of `pinned` (the terminal outputs).
    pub fn new(pinned: Vec<DataId>) -> Self {
        LogState {
            pinned,
            ..LogState::default()
        }
    }

    /// Applies one event (rule 1).
    pub fn fold(&mut self, event: Event) {
        match event {
            Event::Declared(d) => self.declare(d, None),
            Event::Adopted {
                victim,
                record,
                inputs,
            } => self.declare(record, Some((victim, inputs))),
            Event::Started { task, .. } => {
                if let Some(t) = self.tasks.get_mut(&task) {
                    t.started = true;
                }
            }
            Event::Completed { task, outputs, .. } => self.complete(task, outputs),
            Event::Stolen { task, thief } => {
                if let Some(t) = self.tasks.get_mut(&task) {
                    t.stolen = Some(thief);
                }
            }
            Event::Returned { output } => self.value(output, false),
            Event::Input { output } => self.value(output, true),
        }
    }

    /// Applies one encoded event, as [`LogState::fold`] of its decoding. The log writer folds
    /// with it every event of a window it does not settle (rule 9 of `log/mod.rs`,
    /// `window.rs`), and postcard's serde path, which reads
    /// an id one byte at a time, was half of the log's CPU per task: the task-path events are
    /// read by `decode.rs` (its rule 1), the others by postcard.
    pub fn fold_encoded(&mut self, bytes: &[u8]) -> Result<(), CodecError> {
        let event = match super::decode::decode_event(bytes) {
            Some(event) => event,
            None => codec::decode(bytes)?,
        };
        self.fold(event);
        Ok(())
    }

    fn complete(&mut self, task: TaskId, outputs: Vec<Output>) {
        match self.tasks.get_mut(&task) {
            Some(t) if t.completed => return,
            Some(t) => t.completed = true,
            None => {} // never declared here: counted as a full read counts it
        }
        self.completed += 1;
        for o in outputs {
            self.value(o, false);
        }
    }

    fn declare(&mut self, record: Declared, adopted: Option<(VnodeId, Vec<Payload>)>) {
        if self.tasks.contains_key(&record.task) || self.adopted.contains(&record.task) {
            return;
        }
        let order = self.next_order;
        self.next_order += 1;
        self.tasks.insert(
            record.task,
            TaskState {
                record,
                adopted,
                started: false,
                completed: false,
                stolen: None,
                order,
            },
        );
    }

    pub(super) fn value(&mut self, o: Output, input: bool) {
        self.values.insert(
            o.data,
            StoredValue {
                value: o.value,
                digest: o.digest,
                input,
            },
        );
    }

    /// Rule 5: `victim` acknowledged the value of `data`.
    pub fn acknowledged(&mut self, data: DataId, victim: VnodeId) {
        self.acked.insert((data, victim));
    }

    /// Whether `t` is here and live (rule 2).
    pub fn is_live(&self, t: TaskId) -> bool {
        self.tasks.get(&t).is_some_and(TaskState::live)
    }

    /// Bytes of value held inline: values, and adopted tasks' inputs (large ones are held as
    /// their digest, rule 10 of `log/mod.rs`).
    pub fn inline_bytes(&self) -> u64 {
        let inline = |p: &Payload| p.inline().map_or(0, |b| b.len() as u64);
        let values: u64 = self.values.values().map(|v| inline(&v.value)).sum();
        let adopted: u64 = self
            .tasks
            .values()
            .filter_map(|t| t.adopted.as_ref())
            .flat_map(|(_, inputs)| inputs.iter().map(inline))
            .sum();
        values + adopted
    }

    /// Tasks and values held: what compaction bounds.
    pub fn size(&self) -> usize {
        self.tasks.len() + self.values.len() + self.acked.len()
    }

    /// Drops what no recovery can use any more (rule 3).
    pub fn compact(&mut self) {
        let keep: IdSet<TaskId> = self
            .tasks
            .values()
            .filter(|t| self.keeps(t))
            .map(|t| t.record.task)
            .collect();
        let mut needed: IdSet<DataId> = self.pinned.iter().copied().collect();
        for t in self.tasks.values() {
            if !keep.contains(&t.record.task) {
                continue;
            }
            needed.extend(t.record.outputs.iter().copied());
            if t.live() || t.stolen.is_some() {
                needed.extend(t.record.inputs.iter().copied());
            }
        }
        let adopted = &mut self.adopted;
        self.tasks.retain(|id, t| {
            let kept = keep.contains(id);
            if !kept && t.adopted.is_some() {
                adopted.insert(*id);
            }
            kept
        });
        self.values.retain(|d, v| v.input || needed.contains(d));
        let owed: IdSet<DataId> = self
            .tasks
            .values()
            .filter(|t| t.adopted.is_some())
            .flat_map(|t| t.record.outputs.iter().copied())
            .collect();
        self.acked.retain(|(d, _)| owed.contains(d));
    }

    /// Whether compaction keeps `t` (rule 3).
    fn keeps(&self, t: &TaskState) -> bool {
        if t.live() || t.record.parent.is_none() {
            return true;
        }
        if t.record.parent.is_some_and(|p| self.is_live(p)) {
            return true;
        }
        let outputs = &t.record.outputs;
        if t.stolen.is_some() && outputs.iter().any(|o| !self.values.contains_key(o)) {
            return true;
        }
        match &t.adopted {
            Some((victim, _)) => outputs.iter().any(|o| !self.acked.contains(&(*o, *victim))),
            None => false,
        }
    }
}

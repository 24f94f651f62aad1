//! The run as time passed on each vnode, from its log: what `inspect --html` draws.
//!
//! Rules:
//!
//! 1. **Time is the log's own order.** The log records no clock time, so a vnode's clock is
//!    the place of an event among its log's distinct events (0, 1, 2, ...). A task's span
//!    runs from its `Started` event to its `Completed` event in the log of the vnode that ran
//!    it; places on two vnodes are not comparable instants.
//! 2. **A stolen task** is drawn on its thief, which logged `Adopted` then ran it
//!    ([`Span::adopted`]); the victim's `Stolen` event is a [`MarkKind::Stolen`] mark.
//! 3. **A recovery** starts a new incarnation of the vnode, whose log goes on at a new epoch
//!    (segments from `e << 40`, in cluster mode and after an embedded vnode failed,
//!    `exec/recover.rs` rule 1): its first event is a [`MarkKind::Incarnation`] mark. A task
//!    declared (or adopted) by an older incarnation and started by a newer one was *recovered*
//!    from the log ([`Span::recovered`]); so was a task whose `Started` is logged twice
//!    (`log/reader.rs`, [`Repeat`]: [`Span::restarts`], a [`MarkKind::Restart`] mark where it
//!    happened). A torn last segment is a [`MarkKind::Torn`] mark at the end of the log.
//! 4. **Failure points**: a task that started and never completed in the log is a span
//!    without an end ([`Span::end`] `None`): its vnode stopped while it ran and no later
//!    incarnation finished it.
//! 5. Building is linear in the number of events and keeps one [`Span`] per task started.
//!
//! [`Repeat`]: veriflow_runtime::log::Repeat

use serde::Serialize;
use veriflow_runtime::log::{segment, Event, EventKind, VnodeEvents};
use veriflow_runtime::{IdMap, TaskId, VnodeId};

/// One task as run by one vnode (rule 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// The task.
    pub task: TaskId,
    /// Its registered name.
    pub name: String,
    /// Place of its `Started` event.
    pub start: u64,
    /// Place of its `Completed` event; `None`: it never completed here (rule 4).
    pub end: Option<u64>,
    /// Whether this vnode adopted it from another (it was stolen, rule 2).
    pub adopted: bool,
    /// Times its `Started` was logged again: re-runs after a recovery (rule 3).
    pub restarts: u32,
    /// Run by a later incarnation than the one that declared it, or started again (rule 3).
    pub recovered: bool,
}

/// What a mark on a vnode's row says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// This vnode gave a ready task to `thief` (rule 2).
    Stolen {
        /// Where it went.
        thief: VnodeId,
    },
    /// A task started again after a recovery (rule 3).
    Restart,
    /// A cluster incarnation at this epoch began writing the log (rule 3).
    Incarnation {
        /// Its epoch.
        epoch: u64,
    },
    /// The log's last segment was torn: the writer was cut off (rule 3).
    Torn,
}

/// A point on a vnode's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// Its place in the vnode's log (rule 1).
    pub at: u64,
    /// What happened.
    pub kind: MarkKind,
    /// The task concerned, if any.
    pub task: Option<TaskId>,
}

/// One vnode's row.
#[derive(Clone, Debug)]
pub struct VnodeTimeline {
    /// The vnode.
    pub vnode: VnodeId,
    /// Distinct events in its log: the length of its row.
    pub events: u64,
    /// Tasks it started, in the order they started.
    pub spans: Vec<Span>,
    /// Steals, restarts, incarnations and tears, in log order.
    pub marks: Vec<Mark>,
}

/// Counts of what the timeline shows, for the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TimelineCounts {
    /// Tasks started (spans).
    pub started: u64,
    /// Spans that never completed (rule 4).
    pub incomplete: u64,
    /// Spans run by a thief (rule 2).
    pub stolen: u64,
    /// Spans recovered from the log by a new incarnation (rule 3).
    pub recovered: u64,
    /// Cluster incarnations after the first, over all vnodes.
    pub incarnations: u64,
}

/// Every vnode's row, and who spawned whom.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// One row per vnode, in the logs' order.
    pub vnodes: Vec<VnodeTimeline>,
    /// (parent, child) for every task declared with a parent.
    pub spawns: Vec<(TaskId, TaskId)>,
    /// The vnode that ran each task: the one that completed it, else the last that started it.
    pub ran_on: IdMap<TaskId, VnodeId>,
}

impl Timeline {
    /// Builds the rows from the logs (rules 1-5).
    pub fn from_logs(logs: &[VnodeEvents]) -> Timeline {
        let mut t = Timeline::default();
        let mut declared: veriflow_runtime::IdSet<TaskId> = Default::default();
        for log in logs {
            t.vnodes.push(row(log, &mut t.spawns, &mut declared));
        }
        for row in &t.vnodes {
            for s in &row.spans {
                let slot = t.ran_on.entry(s.task).or_insert(row.vnode);
                if s.end.is_some() {
                    *slot = row.vnode;
                }
            }
        }
        t
    }

    /// What the rows show, counted.
    pub fn counts(&self) -> TimelineCounts {
        let mut c = TimelineCounts::default();
        for row in &self.vnodes {
            for s in &row.spans {
                c.started += 1;
                c.incomplete += u64::from(s.end.is_none());
                c.stolen += u64::from(s.adopted);
                c.recovered += u64::from(s.recovered);
            }
            for m in &row.marks {
                if let MarkKind::Incarnation { .. } = m.kind {
                    c.incarnations += 1;
                }
            }
        }
        c
    }
}

fn row(
    log: &VnodeEvents,
    spawns: &mut Vec<(TaskId, TaskId)>,
    declared: &mut veriflow_runtime::IdSet<TaskId>,
) -> VnodeTimeline {
    let mut spans: Vec<Span> = Vec::new();
    let mut index: IdMap<TaskId, usize> = IdMap::default();
    let mut names: IdMap<TaskId, String> = IdMap::default();
    let mut adopted: veriflow_runtime::IdSet<TaskId> = Default::default();
    // The epoch whose incarnation declared (or adopted) each task.
    let mut declared_in: IdMap<TaskId, u64> = IdMap::default();
    let mut marks = Vec::new();
    let mut epoch = None;
    for (at, e) in log.events.iter().enumerate() {
        let at = at as u64;
        let e_epoch = e.segment >> segment::EPOCH_SHIFT;
        if epoch.is_some_and(|p| p != e_epoch) || (epoch.is_none() && e_epoch > 0) {
            marks.push(Mark {
                at,
                kind: MarkKind::Incarnation { epoch: e_epoch },
                task: None,
            });
        }
        epoch = Some(e_epoch);
        match &e.event {
            Event::Declared(d) => {
                names.insert(d.task, d.name.to_string());
                declared_in.insert(d.task, e_epoch);
                if let Some(p) = d.parent {
                    if declared.insert(d.task) {
                        spawns.push((p, d.task));
                    }
                }
            }
            Event::Adopted { record, .. } => {
                names.insert(record.task, record.name.to_string());
                declared_in.insert(record.task, e_epoch);
                adopted.insert(record.task);
            }
            Event::Started { task, .. } => {
                index.insert(*task, spans.len());
                spans.push(Span {
                    task: *task,
                    name: names.get(task).cloned().unwrap_or_default(),
                    start: at,
                    end: None,
                    adopted: adopted.contains(task),
                    restarts: 0,
                    recovered: declared_in.get(task).is_some_and(|&d| d < e_epoch),
                });
            }
            Event::Completed { task, .. } => match index.get(task) {
                Some(&i) => spans[i].end = Some(at),
                // Completed without Started in this log: a zero-length span.
                None => {
                    index.insert(*task, spans.len());
                    spans.push(Span {
                        task: *task,
                        name: names.get(task).cloned().unwrap_or_default(),
                        start: at,
                        end: Some(at),
                        adopted: adopted.contains(task),
                        restarts: 0,
                        recovered: declared_in.get(task).is_some_and(|&d| d < e_epoch),
                    });
                }
            },
            Event::Stolen { task, thief } => marks.push(Mark {
                at,
                kind: MarkKind::Stolen { thief: *thief },
                task: Some(*task),
            }),
            Event::Returned { .. } | Event::Input { .. } => {}
        }
    }
    for r in &log.repeats {
        if r.key.1 == EventKind::Started {
            let task = TaskId(r.key.0);
            if let Some(&i) = index.get(&task) {
                spans[i].restarts += 1;
                spans[i].recovered = true;
            }
            marks.push(Mark {
                at: r.at,
                kind: MarkKind::Restart,
                task: Some(task),
            });
        }
    }
    let events = log.events.len() as u64;
    if log.torn.is_some() {
        marks.push(Mark {
            at: events,
            kind: MarkKind::Torn,
            task: None,
        });
    }
    marks.sort_by_key(|m| m.at);
    VnodeTimeline {
        vnode: log.vnode,
        events,
        spans,
        marks,
    }
}

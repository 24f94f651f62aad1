//! The log writer's fold of a window of segments into a vnode's recovery state (rule 9 of
//! `log/mod.rs`): [`LogState::fold_window`].
//!
//! Folding every event as it is stored was half of the log's CPU per task (knary -n 9 -k 5,
//! 585,937 empty tasks on 2 threads: 0.92 µs a task of 2.5): each `Declared` decoded into a
//! record with its own vectors, moved into the map, and dropped by the next compaction a few
//! thousand tasks later, since most tasks complete soon after they are declared. The writer
//! now keeps a vnode's stored segments, a window at a time, and folds them together.
//!
//! Rules:
//!
//! 1. **The same state as event by event.** [`LogState::fold_window`] gives exactly the state
//!    that [`LogState::fold_encoded`] of each event in order, then [`LogState::compact`],
//!    gives (tested against it on arbitrary events).
//! 2. **What compaction would drop at once is never built.** A first pass reads each event's
//!    kind and ids without decoding it (`decode.rs` `peek_event`). A task is *settled* when,
//!    in the window, it is declared once before any other event of it (and was not known
//!    before), completed once, never stolen, its parent is not live at the window's end, and
//!    no other event writes its outputs' data: compaction drops it (`state.rs` rule 3), so its
//!    declaration is never decoded or stored. What it leaves is kept: its place in the
//!    declaration order, its count in `completed`, and the values its completion wrote that a
//!    remaining task names (decoded in a last pass). Every other event folds as before, in
//!    log order. A parent the first pass cannot judge (declared twice, adopted) counts as live.
//! 3. An event that is not the task path's in canonical form (`Stolen`, `Adopted`,
//!    `Returned`, `Input`) is decoded once, in the first pass, and folded from that decoding.

use super::decode::{decode_event, peek_event, Peeked};
use super::state::LogState;
use super::Event;
use crate::codec::{self, CodecError};
use crate::ids::{DataId, IdMap, IdSet, TaskId};

/// What the first pass learnt of one task in the window (rule 2).
#[derive(Clone, Copy, Default)]
struct Fate {
    parent: Option<TaskId>,
    /// Any event of it was met (a `Declared` after one makes it irregular).
    seen: bool,
    declared: bool,
    completed: bool,
    stolen: bool,
    /// Known before the window, declared or completed twice, adopted, or sharing an output
    /// with another event: folded event by event.
    irregular: bool,
    settled: bool,
}

/// No task: the writer of a value that a `Returned` or an `Input` wrote.
const NOBODY: u32 = u32::MAX;

/// An event of the window as the first pass read it (a task by its place in the fates).
enum Seen {
    Declared(u32),
    Started(u32),
    Completed(u32),
    /// Rule 3: decoded (boxed: most events are the three above, and an `Event` is large).
    Other(Box<Event>),
}

impl LogState {
    /// Folds `events` (encoded, in log order) and compacts: the state that folding each with
    /// [`LogState::fold_encoded`] and then compacting gives (rule 1 of `window.rs`), without
    /// building the tasks that compaction would drop at once (rule 2). Returns how many tasks
    /// were settled that way. On an error the state may hold part of the window.
    pub fn fold_window(&mut self, events: &[&[u8]]) -> Result<usize, CodecError> {
        // The window's tasks: their fates, and where each is in `fates` (the other passes
        // read a fate by its place, not by hashing its id again).
        let mut fates: Vec<Fate> = Vec::with_capacity(events.len() / 2);
        let mut index: IdMap<TaskId, u32> = IdMap::default();
        index.reserve(events.len() / 2);
        // The last task met: a task's `Started` and `Completed` usually follow each other.
        let mut last: Option<(TaskId, u32)> = None;
        let mut slot = |fates: &mut Vec<Fate>, task: TaskId| -> u32 {
            if let Some((t, i)) = last {
                if t == task {
                    return i;
                }
            }
            let i = *index.entry(task).or_insert_with(|| {
                fates.push(Fate::default());
                u32::try_from(fates.len() - 1).expect("fewer tasks than events in a window")
            });
            last = Some((task, i));
            i
        };
        // Who wrote each data id in the window (a place in `fates`; `NOBODY`: a `Returned` or
        // an `Input`).
        let mut written: IdMap<DataId, u32> = IdMap::default();
        written.reserve(events.len() / 3);
        let mut outputs = Vec::new();
        let mut seen = Vec::with_capacity(events.len());
        for bytes in events {
            let s = match peek_event(bytes, &mut outputs) {
                Some(Peeked::Declared(task, parent)) => {
                    let known = self.tasks.contains_key(&task) || self.adopted.contains(&task);
                    let i = slot(&mut fates, task);
                    let f = &mut fates[i as usize];
                    f.irregular |= f.seen || known;
                    (f.seen, f.declared, f.parent) = (true, true, parent);
                    Seen::Declared(i)
                }
                Some(Peeked::Started(task)) => {
                    let i = slot(&mut fates, task);
                    fates[i as usize].seen = true;
                    Seen::Started(i)
                }
                Some(Peeked::Completed(task)) => {
                    let i = slot(&mut fates, task);
                    let f = &mut fates[i as usize];
                    f.irregular |= f.completed;
                    (f.seen, f.completed) = (true, true);
                    for &d in &outputs {
                        self.written_by(&mut written, &mut fates, d, i);
                    }
                    Seen::Completed(i)
                }
                None => {
                    let event: Event = codec::decode(bytes)?;
                    let task = match &event {
                        Event::Stolen { task, .. } => Some(*task),
                        Event::Adopted { record, .. } => Some(record.task),
                        Event::Returned { output } | Event::Input { output } => {
                            self.written_by(&mut written, &mut fates, output.data, NOBODY);
                            None
                        }
                        // The task path in a form `peek_event` leaves to postcard.
                        Event::Declared(_) | Event::Started { .. } | Event::Completed { .. } => {
                            Some(TaskId(event.key().0))
                        }
                    };
                    if let Some(task) = task {
                        let i = slot(&mut fates, task);
                        let f = &mut fates[i as usize];
                        f.seen = true;
                        match &event {
                            Event::Stolen { .. } => f.stolen = true,
                            _ => f.irregular = true,
                        }
                    }
                    Seen::Other(Box::new(event))
                }
            };
            seen.push(s);
        }
        let mut settled = 0;
        for i in 0..fates.len() {
            let f = &fates[i];
            if f.declared
                && f.completed
                && !f.stolen
                && !f.irregular
                && f.parent
                    .is_some_and(|p| !self.live_at_end(&fates, &index, p))
            {
                fates[i].settled = true;
                settled += 1;
            }
        }
        // Second pass: everything but the settled tasks, in log order (rule 2).
        let mut deferred = Vec::new();
        for (s, bytes) in seen.into_iter().zip(events) {
            match s {
                Seen::Declared(i) if fates[i as usize].settled => self.next_order += 1,
                Seen::Started(i) if fates[i as usize].settled => {}
                Seen::Completed(i) if fates[i as usize].settled => {
                    self.completed += 1;
                    deferred.push(*bytes);
                }
                Seen::Declared(_) | Seen::Started(_) | Seen::Completed(_) => {
                    self.fold_encoded(bytes)?
                }
                Seen::Other(event) => self.fold(*event),
            }
        }
        // Last pass: the settled tasks' values that a remaining task or the terminal outputs
        // name (compaction decides which stay, as it would have).
        if !deferred.is_empty() {
            let mut named: IdSet<DataId> = self.pinned.iter().copied().collect();
            for t in self.tasks.values() {
                named.extend(t.record.inputs.iter().chain(&t.record.outputs).copied());
            }
            for bytes in deferred {
                peek_event(bytes, &mut outputs);
                if !outputs.iter().any(|d| named.contains(d)) {
                    continue;
                }
                if let Some(Event::Completed { outputs, .. }) = decode_event(bytes) {
                    for o in outputs.into_iter().filter(|o| named.contains(&o.data)) {
                        self.value(o, false);
                    }
                }
            }
        }
        self.compact();
        Ok(settled)
    }

    /// Notes that `writer` (a place in `fates`, or [`NOBODY`]) writes `d`; a second write of
    /// it in the window, or one known before, makes its writers irregular (rule 2: the log
    /// keeps the last write, so their order matters).
    fn written_by(
        &self,
        written: &mut IdMap<DataId, u32>,
        fates: &mut [Fate],
        d: DataId,
        writer: u32,
    ) {
        let earlier = written.insert(d, writer);
        if earlier.is_none() && !self.values.contains_key(&d) {
            return;
        }
        for i in [Some(writer), earlier].into_iter().flatten() {
            if let Some(f) = fates.get_mut(i as usize) {
                f.irregular = true;
            }
        }
    }

    /// Whether `p` is live once the window is folded (rule 2), by what the first pass saw;
    /// a task it cannot judge counts as live.
    fn live_at_end(&self, fates: &[Fate], index: &IdMap<TaskId, u32>, p: TaskId) -> bool {
        match index.get(&p).map(|&i| &fates[i as usize]) {
            Some(f) if f.irregular => true,
            Some(f) if f.completed || f.stolen => false,
            f => match self.tasks.get(&p) {
                Some(t) => t.live(),
                None => f.is_some_and(|f| f.declared),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::codec::Digest;
    use crate::log::encode::tests::events;
    use crate::log::{Declared, Output};

    /// A binary tree of tasks as a vnode logs it: each declared by its parent,
    /// then started and completed, writing its one output, level by level (`depth` levels).
    pub(super) fn tree(depth: u32) -> Vec<Event> {
        let mut out = Vec::new();
        let mut next = vec![(TaskId(1), None, DataId(1))];
        let mut id = 1u128;
        for _ in 0..depth {
            let mut below = Vec::new();
            for (task, parent, data) in next {
                out.push(Event::Declared(Declared {
                    task,
                    parent,
                    index: 0,
                    name: "node".into(),
                    args: vec![1].into(),
                    inputs: vec![],
                    outputs: vec![data],
                }));
                out.push(Event::Started {
                    task,
                    inputs: vec![],
                });
                let children: Vec<TaskId> = (0..2)
                    .map(|_| {
                        id += 1;
                        TaskId(id)
                    })
                    .collect();
                let value = vec![7u8];
                out.push(Event::Completed {
                    task,
                    outputs: vec![Output {
                        data,
                        digest: Digest::of(&value),
                        value: value.into(),
                    }],
                    children: children.clone(),
                });
                below.extend(children.into_iter().map(|c| (c, Some(task), DataId(c.0))));
            }
            next = below;
        }
        out
    }

    fn encoded(events: &[Event]) -> Vec<Vec<u8>> {
        events
            .iter()
            .map(|e| crate::codec::encode(e).unwrap())
            .collect()
    }

    /// Rule 1 on `events`, folded in windows of `window` events.
    fn agrees(start: &LogState, events: &[Event], window: usize) -> Result<usize, String> {
        let mut one_by_one = start.clone();
        let mut windowed = start.clone();
        let bytes = encoded(events);
        let mut settled = 0;
        for chunk in bytes.chunks(window.max(1)) {
            for b in chunk {
                one_by_one.fold_encoded(b).map_err(|e| e.to_string())?;
            }
            one_by_one.compact();
            let slices: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
            settled += windowed.fold_window(&slices).map_err(|e| e.to_string())?;
            if one_by_one != windowed {
                return Err(format!("{one_by_one:#?}\n!=\n{windowed:#?}"));
            }
        }
        Ok(settled)
    }

    /// Rule 2: a tree's finished tasks are settled (their declarations never built), the root
    /// and the frontier are not, and the state is the one event by event gives.
    #[test]
    fn a_finished_subtree_is_settled_without_building_it() {
        let events = tree(6);
        let mut cut = events.clone();
        cut.truncate(events.len() - 40);
        let settled = agrees(&LogState::new(vec![DataId(1)]), &cut, cut.len()).unwrap();
        // 63 tasks; the root (no parent) and the tasks whose parent is not completed stay.
        assert!(settled > 40, "{settled} settled");
        let settled = agrees(&LogState::new(vec![DataId(1)]), &events, 7).unwrap();
        assert!(settled > 0, "{settled} settled across windows");
    }

    /// A child whose parent is still live (declared, not completed) is kept, with its value.
    #[test]
    fn a_child_of_a_live_parent_is_kept() {
        let mut events = tree(2);
        // The root's completion (the 3rd event) moves to the end: its children finish first.
        let root_done = events.remove(2);
        events.push(root_done);
        let mut state = LogState::new(vec![]);
        let partial: Vec<Vec<u8>> = encoded(&events[..events.len() - 1]);
        let slices: Vec<&[u8]> = partial.iter().map(Vec::as_slice).collect();
        assert_eq!(state.fold_window(&slices).unwrap(), 0);
        assert_eq!(state.tasks.len(), 3, "the root and its two children");
        assert_eq!(state.values.len(), 2, "the children's outputs");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Rule 1 on arbitrary events of a small id space (repeats, steals, adoptions, values
        /// written twice), in windows of any size, from an empty state and from a state
        /// already holding some of them.
        #[test]
        fn a_window_folds_as_event_by_event(
            before in proptest::collection::vec(crate::log::tests::any_event(), 0..20),
            events in proptest::collection::vec(crate::log::tests::any_event(), 0..60),
            window in 1usize..70,
        ) {
            let mut start = LogState::new(vec![DataId(1)]);
            for e in before {
                start.fold(e);
            }
            start.compact();
            agrees(&start, &events, window).map_err(TestCaseError::fail)?;
        }

        /// Trees cut anywhere, in windows of any size (the path where tasks are settled).
        #[test]
        fn a_cut_tree_folds_as_event_by_event(cut in 0usize..190, window in 1usize..200) {
            let mut events = tree(6);
            events.truncate(cut);
            agrees(&LogState::new(vec![DataId(1)]), &events, window)
                .map_err(TestCaseError::fail)?;
        }

        /// `peek_event` reads what `decode_event` decodes, and refuses what it refuses, on
        /// task-path events and on damaged copies of them.
        #[test]
        fn peek_agrees_with_decode(e in events(false), at in any::<usize>(), byte in any::<u8>()) {
            let mut bytes = crate::codec::encode(&e).unwrap();
            for damaged in [false, true] {
                if damaged && !bytes.is_empty() {
                    let i = at % bytes.len();
                    bytes[i] = byte;
                }
                let mut outputs = Vec::new();
                let peeked = peek_event(&bytes, &mut outputs);
                let decoded = decode_event(&bytes);
                prop_assert_eq!(peeked.is_some(), decoded.is_some());
                let expected = decoded.map(|e| match e {
                    Event::Declared(d) => (Peeked::Declared(d.task, d.parent), vec![]),
                    Event::Started { task, .. } => (Peeked::Started(task), vec![]),
                    Event::Completed { task, outputs, .. } => {
                        (Peeked::Completed(task), outputs.iter().map(|o| o.data).collect())
                    }
                    other => panic!("decode_event gave {other:?}"),
                });
                prop_assert_eq!(peeked.map(|p| (p, outputs)), expected);
            }
        }
    }
}

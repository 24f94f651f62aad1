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
//! 4. **The first pass reads notes, not bytes.** A vnode notes each event's kind and ids
//!    ([`Peeks`]) as it appends it, from the [`Event`] in hand, and the writer hands the notes
//!    of a window with its bytes ([`LogState::fold_window_peeked`]): peeking every event again
//!    from its encoding (its varints, name and payload checked, its outputs walked) was a
//!    quarter of the writer's CPU. The notes are exactly what `peek_event` reads from the
//!    bytes (tested; every debug build checks it event by event), and a window whose notes
//!    are missing or do not count its events is peeked from its bytes as before.
//! 5. The first pass's tables ([`Scratch`]) live from one window to the next.

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

/// What the first pass reads of each event (rule 4), taken from the [`Event`] as the vnode
/// appends it: its kind and ids ([`Peeked`]; `None` off the task path) and, for a
/// `Completed`, its outputs' data ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Peeks {
    /// One per event.
    events: Vec<Note>,
    outputs: Vec<DataId>,
}

/// One event of [`Peeks`], [`Peeked`] in 40 bytes instead of 64 (ids as bytes, unaligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Note {
    kind: NoteKind,
    task: [u8; 16],
    parent: [u8; 16],
    /// Where its outputs end in [`Peeks::outputs`].
    end: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NoteKind {
    Other,
    Root,
    Declared,
    Started,
    Completed,
}

impl Peeks {
    /// Room for `events` events (a vnode's next batch holds about as many as its last).
    pub(crate) fn with_capacity(events: usize) -> Peeks {
        Peeks {
            events: Vec::with_capacity(events),
            outputs: Vec::with_capacity(events / 3),
        }
    }

    /// Notes `event`, appended after the ones noted so far: what `peek_event` reads from its
    /// encoding (`encode.rs` writes every task-path event in the canonical form it reads).
    pub(crate) fn push(&mut self, event: &Event) {
        let (kind, task, parent) = match event {
            Event::Declared(d) => return self.push_declared(d.task, d.parent),
            Event::Started { task, .. } => (NoteKind::Started, *task, TaskId(0)),
            Event::Completed { task, outputs, .. } => {
                self.outputs.extend(outputs.iter().map(|o| o.data));
                (NoteKind::Completed, *task, TaskId(0))
            }
            _ => (NoteKind::Other, TaskId(0), TaskId(0)),
        };
        self.note(kind, task, parent);
    }

    /// Notes an `Event::Declared` of `task` and `parent`.
    pub(crate) fn push_declared(&mut self, task: TaskId, parent: Option<TaskId>) {
        match parent {
            Some(p) => self.note(NoteKind::Declared, task, p),
            None => self.note(NoteKind::Root, task, TaskId(0)),
        }
    }

    fn note(&mut self, kind: NoteKind, task: TaskId, parent: TaskId) {
        self.events.push(Note {
            kind,
            task: task.0.to_le_bytes(),
            parent: parent.0.to_le_bytes(),
            end: u32::try_from(self.outputs.len()).unwrap_or(u32::MAX),
        });
    }

    /// Events noted.
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// Appends `other`'s events after these.
    pub(crate) fn extend(&mut self, other: &Peeks) {
        let base = u32::try_from(self.outputs.len()).unwrap_or(u32::MAX);
        self.outputs.extend_from_slice(&other.outputs);
        self.events.extend(other.events.iter().map(|&n| Note {
            end: n.end.saturating_add(base),
            ..n
        }));
    }

    /// Forgets every event (keeping the memory).
    pub(crate) fn clear(&mut self) {
        self.events.clear();
        self.outputs.clear();
    }

    /// Event `i`: what it is, its outputs' ids pushed to `outputs` (cleared first).
    fn get(&self, i: usize, outputs: &mut Vec<DataId>) -> Option<Peeked> {
        outputs.clear();
        let n = self.events[i];
        let task = TaskId(u128::from_le_bytes(n.task));
        Some(match n.kind {
            NoteKind::Other => return None,
            NoteKind::Root => Peeked::Declared(task, None),
            NoteKind::Declared => {
                Peeked::Declared(task, Some(TaskId(u128::from_le_bytes(n.parent))))
            }
            NoteKind::Started => Peeked::Started(task),
            NoteKind::Completed => {
                let start = match i {
                    0 => 0,
                    _ => self.events[i - 1].end as usize,
                };
                outputs.extend_from_slice(&self.outputs[start..n.end as usize]);
                Peeked::Completed(task)
            }
        })
    }
}

/// The first pass's tables, kept from one window to the next (rule 5): allocated afresh, a
/// window's tables (some 15,000 tasks of knary) were mapped, faulted in page by page and
/// unmapped again every window, a tenth of the writer's CPU.
#[derive(Default)]
pub(crate) struct Scratch {
    fates: Vec<Fate>,
    index: IdMap<TaskId, u32>,
    written: IdMap<DataId, u32>,
    outputs: Vec<DataId>,
    seen: Vec<Seen>,
    deferred: Vec<usize>,
}

impl Scratch {
    fn clear(&mut self) {
        self.fates.clear();
        self.index.clear();
        self.written.clear();
        self.outputs.clear();
        self.seen.clear();
        self.deferred.clear();
    }
}

impl LogState {
    /// Folds `events` (encoded, in log order) and compacts: the state that folding each with
    /// [`LogState::fold_encoded`] and then compacting gives (rule 1 of `window.rs`), without
    /// building the tasks that compaction would drop at once (rule 2). Returns how many tasks
    /// were settled that way. On an error the state may hold part of the window.
    pub fn fold_window(&mut self, events: &[&[u8]]) -> Result<usize, CodecError> {
        self.fold_window_with(
            events.len(),
            |i| events[i],
            |i, outputs| peek_event(events[i], outputs),
            &mut Scratch::default(),
        )
    }

    /// [`LogState::fold_window`] of `events`, each read through `peeks` (rule 4: what its
    /// vnode noted as it appended it), with the tables of `scratch` (rule 5).
    /// The events are `segments[s][a..b]` for each `(s, a, b)` of `events`.
    pub(crate) fn fold_window_peeked(
        &mut self,
        segments: &[Vec<u8>],
        events: &[(u32, u32, u32)],
        peeks: Option<&Peeks>,
        scratch: &mut Scratch,
    ) -> Result<usize, CodecError> {
        let event = |i: usize| {
            let (s, a, b) = events[i];
            &segments[s as usize][a as usize..b as usize]
        };
        let Some(peeks) = peeks.filter(|p| p.len() == events.len()) else {
            return self.fold_window_with(
                events.len(),
                event,
                |i, outputs| peek_event(event(i), outputs),
                scratch,
            );
        };
        self.fold_window_with(
            events.len(),
            event,
            |i, outputs| {
                let peeked = peeks.get(i, outputs);
                // Rule 4: the note is what the bytes say (every test run checks it).
                debug_assert_eq!(
                    (peeked, outputs.clone()),
                    {
                        let mut o = Vec::new();
                        (peek_event(event(i), &mut o), o)
                    },
                    "event {i} of the window noted wrongly"
                );
                peeked
            },
            scratch,
        )
    }

    /// The fold of rules 1-2, event `i`'s bytes from `event` and its kind and ids from
    /// `peek`.
    fn fold_window_with<'a>(
        &mut self,
        n: usize,
        event: impl Fn(usize) -> &'a [u8],
        mut peek: impl FnMut(usize, &mut Vec<DataId>) -> Option<Peeked>,
        scratch: &mut Scratch,
    ) -> Result<usize, CodecError> {
        scratch.clear();
        let Scratch {
            fates,
            index,
            written,
            outputs,
            seen,
            deferred,
        } = scratch;
        // The window's tasks: their fates, and where each is in `fates` (the other passes
        // read a fate by its place, not by hashing its id again).
        fates.reserve(n / 2);
        index.reserve(n / 2);
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
        written.reserve(n / 3);
        seen.reserve(n);
        for i in 0..n {
            let s = match peek(i, outputs) {
                Some(Peeked::Declared(task, parent)) => {
                    let known = self.tasks.contains_key(&task) || self.adopted.contains(&task);
                    let i = slot(fates, task);
                    let f = &mut fates[i as usize];
                    f.irregular |= f.seen || known;
                    (f.seen, f.declared, f.parent) = (true, true, parent);
                    Seen::Declared(i)
                }
                Some(Peeked::Started(task)) => {
                    let i = slot(fates, task);
                    fates[i as usize].seen = true;
                    Seen::Started(i)
                }
                Some(Peeked::Completed(task)) => {
                    let i = slot(fates, task);
                    let f = &mut fates[i as usize];
                    f.irregular |= f.completed;
                    (f.seen, f.completed) = (true, true);
                    for &d in outputs.iter() {
                        self.written_by(written, fates, d, i);
                    }
                    Seen::Completed(i)
                }
                None => {
                    let event: Event = codec::decode(event(i))?;
                    let task = match &event {
                        Event::Stolen { task, .. } => Some(*task),
                        Event::Adopted { record, .. } => Some(record.task),
                        Event::Returned { output } | Event::Input { output } => {
                            self.written_by(written, fates, output.data, NOBODY);
                            None
                        }
                        // The task path in a form `peek_event` leaves to postcard.
                        Event::Declared(_) | Event::Started { .. } | Event::Completed { .. } => {
                            Some(TaskId(event.key().0))
                        }
                    };
                    if let Some(task) = task {
                        let i = slot(fates, task);
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
                && f.parent.is_some_and(|p| !self.live_at_end(fates, index, p))
            {
                fates[i].settled = true;
                settled += 1;
            }
        }
        // Second pass: everything but the settled tasks, in log order (rule 2).
        for (i, s) in seen.drain(..).enumerate() {
            match s {
                Seen::Declared(f) if fates[f as usize].settled => self.next_order += 1,
                Seen::Started(f) if fates[f as usize].settled => {}
                Seen::Completed(f) if fates[f as usize].settled => {
                    self.completed += 1;
                    deferred.push(i);
                }
                Seen::Declared(_) | Seen::Started(_) | Seen::Completed(_) => {
                    self.fold_encoded(event(i))?
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
            for &i in deferred.iter() {
                peek(i, outputs);
                if !outputs.iter().any(|d| named.contains(d)) {
                    continue;
                }
                if let Some(Event::Completed { outputs, .. }) = decode_event(event(i)) {
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

    /// Rule 1 on `events`, folded in windows of `window` events: from their bytes
    /// ([`LogState::fold_window`]), and (rules 4-5) from their notes with one scratch for
    /// every window, the window's events split over segments of `per_segment` events.
    fn agrees(start: &LogState, events: &[Event], window: usize) -> Result<usize, String> {
        agrees_split(start, events, window, 3)
    }

    fn agrees_split(
        start: &LogState,
        events: &[Event],
        window: usize,
        per_segment: usize,
    ) -> Result<usize, String> {
        let mut one_by_one = start.clone();
        let mut windowed = start.clone();
        let mut noted = start.clone();
        let mut scratch = Scratch::default();
        let bytes = encoded(events);
        let mut settled = 0;
        for (chunk, evs) in bytes
            .chunks(window.max(1))
            .zip(events.chunks(window.max(1)))
        {
            for b in chunk {
                one_by_one.fold_encoded(b).map_err(|e| e.to_string())?;
            }
            one_by_one.compact();
            let slices: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
            let n = windowed.fold_window(&slices).map_err(|e| e.to_string())?;
            settled += n;
            if one_by_one != windowed {
                return Err(format!("{one_by_one:#?}\n!=\n{windowed:#?}"));
            }
            let (segments, places, peeks) = segments_of(chunk, evs, per_segment);
            let m = noted
                .fold_window_peeked(&segments, &places, Some(&peeks), &mut scratch)
                .map_err(|e| e.to_string())?;
            if one_by_one != noted || n != m {
                return Err(format!("from notes: {noted:#?}\n!=\n{one_by_one:#?}"));
            }
        }
        Ok(settled)
    }

    /// `chunk`'s events laid out in buffers of `per` events each (with a byte of padding
    /// before each event, as a segment's length prefix), where each is, and their notes.
    #[allow(clippy::type_complexity)]
    fn segments_of(
        chunk: &[Vec<u8>],
        events: &[Event],
        per: usize,
    ) -> (Vec<Vec<u8>>, Vec<(u32, u32, u32)>, Peeks) {
        let mut segments = Vec::new();
        let mut places = Vec::new();
        for (k, part) in chunk.chunks(per.max(1)).enumerate() {
            let mut seg = Vec::new();
            for e in part {
                seg.push(0xAA);
                let at = seg.len() as u32;
                seg.extend_from_slice(e);
                places.push((k as u32, at, seg.len() as u32));
            }
            segments.push(seg);
        }
        let mut peeks = Peeks::default();
        for e in events {
            peeks.push(e);
        }
        (segments, places, peeks)
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

        /// Rule 4: a note is what `peek_event` reads from the event's encoding, for events of
        /// every kind, noted one by one or appended from another list of notes.
        #[test]
        fn notes_are_what_peek_reads(
            first in proptest::collection::vec(crate::log::tests::any_event(), 0..8),
            then in proptest::collection::vec(events(true), 0..8),
        ) {
            let mut a = Peeks::default();
            first.iter().for_each(|e| a.push(e));
            let mut b = Peeks::with_capacity(2);
            then.iter().for_each(|e| b.push(e));
            a.extend(&b);
            prop_assert_eq!(a.len(), first.len() + then.len());
            let mut noted = Vec::new();
            for (i, e) in first.iter().chain(&then).enumerate() {
                let got = a.get(i, &mut noted);
                let mut read = Vec::new();
                let want = peek_event(&crate::codec::encode(e).unwrap(), &mut read);
                prop_assert_eq!((got, &noted), (want, &read), "event {}: {:?}", i, e);
            }
        }

        /// Rules 4-5 on trees split over segments of any size, with notes that do not count
        /// the window's events ignored (the window is peeked from its bytes).
        #[test]
        fn a_tree_folds_from_its_notes(cut in 0usize..190, window in 1usize..200, per in 1usize..9) {
            let mut events = tree(6);
            events.truncate(cut);
            agrees_split(&LogState::new(vec![DataId(1)]), &events, window, per)
                .map_err(TestCaseError::fail)?;
            let bytes = encoded(&events);
            let (segments, places, mut peeks) = segments_of(&bytes, &events, per);
            let mut want = LogState::new(vec![DataId(1)]);
            let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
            want.fold_window(&slices).unwrap();
            peeks.push(&Event::Started { task: TaskId(999), inputs: vec![] });
            let mut got = LogState::new(vec![DataId(1)]);
            got.fold_window_peeked(&segments, &places, Some(&peeks), &mut Scratch::default())
                .unwrap();
            prop_assert_eq!(&got, &want);
            let mut got = LogState::new(vec![DataId(1)]);
            got.fold_window_peeked(&segments, &places, None, &mut Scratch::default()).unwrap();
            prop_assert_eq!(got, want);
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

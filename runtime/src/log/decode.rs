//! The decoder of the events on the task path, `encode.rs` backwards: the reader's and the
//! writer's recovery fold's (`LogState::fold_encoded`).
//!
//! Rules:
//!
//! 1. [`decode_event`] gives exactly the [`Event`] postcard gives for the same bytes, or
//!    `None`, and then the caller asks postcard (`codec::decode`), which decides: it decodes
//!    only `Declared`, `Started` and `Completed` (rule 2 of `encode.rs`), only in canonical
//!    form (shortest varints, the bytes consumed exactly), and hands anything else back. So
//!    an accepted event is postcard's, and a refused one gets postcard's value or postcard's
//!    error. The property tests below hold it to postcard on arbitrary events and on their
//!    damaged copies.
//! 2. A length is checked against the bytes left before anything is allocated.
//! 3. A task name is shared, not copied: names that were met before are the same
//!    `&'static str` ([`intern`]), so a track of a million tasks of a few kinds holds a few
//!    names, not a million strings. At most [`MAX_NAMES`] names of at most [`MAX_NAME_LEN`]
//!    bytes are ever kept (a log of made-up names gets owned strings past that, never an
//!    unbounded table).
//! 4. [`view_event`] reads an event in place ([`EventView`]: ids, digests and values are
//!    slices of the encoded bytes), with exactly [`decode_event`]'s checks: it is the one
//!    decoder, and [`decode_event`] builds the owned event from its view. A reader that keeps
//!    only some fields (the certifier's columnar track) allocates nothing per event; the
//!    writer's window fold takes a `Completed`'s output ids in the same walk that checks them.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Mutex;

use crate::codec::Digest;
use crate::ids::{DataId, TaskId};

use super::event::{Declared, Event, Output, Payload};

/// Variant indices of [`Event`] and [`Payload`] (`encode.rs`).
const DECLARED: u8 = 0;
const STARTED: u8 = 1;
const COMPLETED: u8 = 2;
const INLINE: u8 = 0;
const STORED: u8 = 1;

/// Most task names kept for sharing (rule 3): far more kinds of task than a program has.
pub(crate) const MAX_NAMES: usize = 4096;
/// Longest task name kept for sharing (rule 3).
pub(crate) const MAX_NAME_LEN: usize = 256;

/// The event `bytes` hold, when rule 1 lets this decoder say; `None`: ask postcard.
pub(crate) fn decode_event(bytes: &[u8]) -> Option<Event> {
    view_event(bytes).map(|v| v.to_event())
}

/// A task-path event read in place (rule 4): its ids, digests and values are slices of the
/// encoded bytes, walked when asked for.
#[derive(Clone, Copy, Debug)]
pub enum EventView<'a> {
    /// [`Event::Declared`].
    Declared(DeclaredView<'a>),
    /// [`Event::Started`].
    Started {
        /// The task.
        task: TaskId,
        /// Digests of the input values read.
        inputs: Digests<'a>,
    },
    /// [`Event::Completed`].
    Completed {
        /// The task.
        task: TaskId,
        /// Values written by the task itself.
        outputs: Outputs<'a>,
        /// Children declared, in spawn order.
        children: Ids<'a>,
    },
}

/// [`Declared`] read in place.
#[derive(Clone, Copy, Debug)]
pub struct DeclaredView<'a> {
    /// The task.
    pub task: TaskId,
    /// Its parent; `None` for the root.
    pub parent: Option<TaskId>,
    /// Its spawn index in the parent.
    pub index: u32,
    /// Registered task name.
    pub name: &'a str,
    /// Encoded arguments.
    pub args: PayloadView<'a>,
    /// Data it reads, in order.
    pub inputs: Ids<'a>,
    /// Data it must write or delegate, in order.
    pub outputs: Ids<'a>,
}

/// [`Payload`] read in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadView<'a> {
    /// The bytes themselves.
    Inline(&'a [u8]),
    /// A reference into the value store.
    Stored {
        /// blake3 of the bytes.
        digest: Digest,
        /// Length of the bytes.
        len: u64,
    },
}

impl PayloadView<'_> {
    /// The owned payload.
    pub fn to_payload(self) -> Payload {
        match self {
            PayloadView::Inline(b) => Payload::Inline(b.to_vec()),
            PayloadView::Stored { digest, len } => Payload::Stored { digest, len },
        }
    }
}

impl<'a> From<&'a Payload> for PayloadView<'a> {
    fn from(p: &'a Payload) -> Self {
        match p {
            Payload::Inline(b) => PayloadView::Inline(b),
            Payload::Stored { digest, len } => PayloadView::Stored {
                digest: *digest,
                len: *len,
            },
        }
    }
}

/// Items of `N` bytes side by side, read in place: [`Ids`] or [`Digests`].
#[derive(Clone, Copy, Debug)]
pub struct Fixed<'a, const N: usize>(&'a [u8]);

/// 16-byte little-endian ids read in place.
pub type Ids<'a> = Fixed<'a, 16>;

/// 32-byte digests read in place.
pub type Digests<'a> = Fixed<'a, 32>;

impl<'a, const N: usize> Fixed<'a, N> {
    /// How many.
    pub fn len(&self) -> usize {
        self.0.len() / N
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The items' bytes, in order.
    fn items(&self) -> impl ExactSizeIterator<Item = [u8; N]> + 'a {
        self.0
            .chunks_exact(N)
            .map(|c| c.try_into().expect("chunks of N bytes"))
    }
}

impl<'a> Ids<'a> {
    /// The ids as numbers, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u128> + 'a {
        self.items().map(u128::from_le_bytes)
    }
}

impl<'a> Digests<'a> {
    /// The digests, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Digest> + 'a {
        self.items().map(Digest)
    }
}

/// A `Completed`'s outputs read in place, checked whole when the event was viewed.
#[derive(Clone, Copy, Debug)]
pub struct Outputs<'a> {
    bytes: &'a [u8],
    n: usize,
}

/// One output read in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputView<'a> {
    /// The data object.
    pub data: DataId,
    /// Its value.
    pub value: PayloadView<'a>,
    /// blake3 of the value's bytes.
    pub digest: Digest,
}

impl<'a> Outputs<'a> {
    /// How many.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The outputs, in order.
    pub fn iter(&self) -> impl Iterator<Item = OutputView<'a>> + 'a {
        let mut r = Bytes(self.bytes);
        // [`view_event`] read them all once: each reads again.
        (0..self.n).map_while(move |_| r.output())
    }
}

impl EventView<'_> {
    /// The owned event.
    pub fn to_event(&self) -> Event {
        match *self {
            EventView::Declared(d) => Event::Declared(d.to_declared()),
            EventView::Started { task, inputs } => Event::Started {
                task,
                inputs: inputs.iter().collect(),
            },
            EventView::Completed {
                task,
                outputs,
                children,
            } => Event::Completed {
                task,
                outputs: outputs
                    .iter()
                    .map(|o| Output {
                        data: o.data,
                        value: o.value.to_payload(),
                        digest: o.digest,
                    })
                    .collect(),
                children: children.iter().map(TaskId).collect(),
            },
        }
    }
}

impl DeclaredView<'_> {
    /// The owned record (its name shared, rule 3).
    pub fn to_declared(&self) -> Declared {
        Declared {
            task: self.task,
            parent: self.parent,
            index: self.index,
            name: intern(self.name),
            args: self.args.to_payload(),
            inputs: self.inputs.iter().map(DataId).collect(),
            outputs: self.outputs.iter().map(DataId).collect(),
        }
    }
}

/// The task-path event `bytes` hold, read in place, exactly when [`decode_event`] decodes it
/// (rule 4; `None`: ask postcard).
pub fn view_event(bytes: &[u8]) -> Option<EventView<'_>> {
    let mut r = Bytes(bytes);
    let event = match r.byte()? {
        DECLARED => EventView::Declared(r.declared()?),
        STARTED => {
            let task = r.task()?;
            let n = r.len(32)?;
            EventView::Started {
                task,
                inputs: Fixed(r.take(32 * n)?),
            }
        }
        COMPLETED => r.completed(|_| {})?,
        _ => return None,
    };
    r.0.is_empty().then_some(event)
}

/// The bytes not decoded yet.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn task(&mut self) -> Option<TaskId> {
        Some(TaskId(u128::from_le_bytes(self.array()?)))
    }

    fn data(&mut self) -> Option<DataId> {
        Some(DataId(u128::from_le_bytes(self.array()?)))
    }

    fn digest(&mut self) -> Option<Digest> {
        Some(Digest(self.array()?))
    }

    /// A canonical varint of at most `max_bytes` bytes (rule 1: the shortest form only,
    /// so that no value has two spellings here).
    fn varint(&mut self, max_bytes: usize) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..max_bytes {
            let b = self.byte()?;
            // The tenth byte of a u64 holds its top bit only (postcard refuses more).
            if i == 9 && b > 1 {
                return None;
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                // A last byte of 0 after others is a longer spelling of a shorter varint.
                return (i == 0 || b != 0).then_some(v);
            }
        }
        None
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.varint(5)?).ok()
    }

    /// A length of items of at least `each` bytes, checked against the bytes left (rule 2).
    fn len(&mut self, each: usize) -> Option<usize> {
        // A u64 varint is at most 10 bytes, but no length past the bytes left is real.
        let n = usize::try_from(self.varint(10)?).ok()?;
        (n.checked_mul(each)? <= self.0.len()).then_some(n)
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.len(1)?;
        self.take(n)
    }

    fn ids(&mut self) -> Option<Ids<'a>> {
        let n = self.len(16)?;
        Some(Fixed(self.take(16 * n)?))
    }

    fn declared(&mut self) -> Option<DeclaredView<'a>> {
        let task = self.task()?;
        let parent = match self.byte()? {
            0 => None,
            1 => Some(self.task()?),
            _ => return None,
        };
        let index = self.u32()?;
        let name = std::str::from_utf8(self.bytes()?).ok()?;
        let args = self.payload()?;
        let inputs = self.ids()?;
        let outputs = self.ids()?;
        Some(DeclaredView {
            task,
            parent,
            index,
            name,
            args,
            inputs,
            outputs,
        })
    }

    fn payload(&mut self) -> Option<PayloadView<'a>> {
        Some(match self.byte()? {
            INLINE => PayloadView::Inline(self.bytes()?),
            STORED => {
                let digest = self.digest()?;
                let len = self.varint(10)?;
                PayloadView::Stored { digest, len }
            }
            _ => return None,
        })
    }

    /// A `Completed` after its kind byte, each output handed to `each` as it is checked (the
    /// one walk over them: the window fold takes their ids there).
    fn completed(&mut self, mut each: impl FnMut(&OutputView<'a>)) -> Option<EventView<'a>> {
        let task = self.task()?;
        // An output takes at least 16 + 1 + 1 + 32 bytes.
        let n = self.len(50)?;
        let from = self.0;
        for _ in 0..n {
            each(&self.output()?);
        }
        let outputs = Outputs {
            bytes: &from[..from.len() - self.0.len()],
            n,
        };
        let children = self.ids()?;
        Some(EventView::Completed {
            task,
            outputs,
            children,
        })
    }

    fn output(&mut self) -> Option<OutputView<'a>> {
        let data = self.data()?;
        let value = self.payload()?;
        let digest = self.digest()?;
        Some(OutputView {
            data,
            value,
            digest,
        })
    }
}

/// A task-path event's kind and ids, read without decoding it (the writer's window fold,
/// `window.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peeked {
    /// `Declared`: the task and its parent.
    Declared(TaskId, Option<TaskId>),
    /// `Started`: the task.
    Started(TaskId),
    /// `Completed`: the task (its outputs' data ids go to the caller's list).
    Completed(TaskId),
}

/// What [`decode_event`] would decode, without building it: `Some` exactly when it gives
/// `Some` (the same checks, in the same order, allocating nothing; a `Completed`'s output data
/// ids are pushed to `outputs`, cleared first).
pub(crate) fn peek_event(bytes: &[u8], outputs: &mut Vec<DataId>) -> Option<Peeked> {
    outputs.clear();
    let mut r = Bytes(bytes);
    if bytes.first() == Some(&COMPLETED) {
        // Its outputs' ids taken in the walk that checks them, not in a second one.
        r.byte()?;
        let task = match r.completed(|o| outputs.push(o.data)) {
            Some(EventView::Completed { task, .. }) if r.0.is_empty() => task,
            _ => {
                outputs.clear();
                return None;
            }
        };
        return Some(Peeked::Completed(task));
    }
    Some(match view_event(bytes)? {
        EventView::Declared(d) => Peeked::Declared(d.task, d.parent),
        EventView::Started { task, .. } => Peeked::Started(task),
        EventView::Completed { task, .. } => Peeked::Completed(task),
    })
}

/// Every name shared so far (rule 3).
static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

thread_local! {
    /// This thread's names met last: a program has few, so a short list is searched first.
    static RECENT: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
}

/// Names a thread remembers without the lock.
const RECENT_NAMES: usize = 16;

/// `name` as a shared `&'static str` (rule 3), or owned once the table is full.
pub(crate) fn intern(name: &str) -> Cow<'static, str> {
    if name.len() > MAX_NAME_LEN {
        return Cow::Owned(name.to_string());
    }
    if let Some(s) = RECENT.with_borrow(|r| r.iter().find(|s| **s == name).copied()) {
        return Cow::Borrowed(s);
    }
    let shared = {
        // A poisoned table is still a set of leaked names: go on with it.
        let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
        let names = names.get_or_insert_with(HashSet::new);
        match names.get(name) {
            Some(s) => Some(*s),
            None if names.len() < MAX_NAMES => {
                let s: &'static str = Box::leak(name.to_string().into_boxed_str());
                names.insert(s);
                Some(s)
            }
            None => None,
        }
    };
    match shared {
        Some(s) => {
            RECENT.with_borrow_mut(|r| {
                if r.len() < RECENT_NAMES {
                    r.push(s);
                }
            });
            Cow::Borrowed(s)
        }
        None => Cow::Owned(name.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::log::encode::encode_event;

    /// The writer's test events, some with stored payloads (`encode.rs`).
    fn event() -> impl Strategy<Value = Event> {
        crate::log::encode::tests::events(true)
    }

    /// What the reader makes of `bytes`: this decoder, else postcard (rule 1).
    fn read(bytes: &[u8]) -> Result<Event, String> {
        match decode_event(bytes) {
            Some(e) => Ok(e),
            None => crate::codec::decode::<Event>(bytes).map_err(|e| e.to_string()),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Rule 1: every task event the writer encodes decodes here, to the same event as
        /// postcard's.
        #[test]
        fn task_events_decode_as_postcard(e in event()) {
            let bytes = postcard::to_stdvec(&e).unwrap();
            let mut mine = Vec::new();
            prop_assert!(encode_event(&e, &mut mine, usize::MAX, &mut Vec::new()));
            prop_assert_eq!(&mine, &bytes);
            prop_assert_eq!(decode_event(&bytes), Some(e));
        }

        /// Rule 1: a damaged event (a byte changed, bytes cut or added) gets what postcard
        /// makes of it whenever this decoder accepts it; else postcard decides.
        #[test]
        fn damaged_events_decode_as_postcard_or_not_at_all(
            e in event(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            how in 0..3u8,
        ) {
            let mut bytes = postcard::to_stdvec(&e).unwrap();
            let i = at.index(bytes.len());
            match how {
                0 => bytes[i] = byte,
                1 => bytes.truncate(i),
                _ => bytes.insert(i, byte),
            }
            if let Some(mine) = decode_event(&bytes) {
                let theirs: Event = crate::codec::decode(&bytes)
                    .map_err(|err| TestCaseError::fail(format!("postcard refuses it: {err}")))?;
                prop_assert_eq!(mine, theirs);
            }
            // Whatever decodes, decodes once: the reader's answer is postcard's.
            let theirs = crate::codec::decode::<Event>(&bytes).map_err(|e| e.to_string());
            prop_assert_eq!(read(&bytes), theirs);
        }
    }

    /// Rule 1: a varint spelled longer than it needs (postcard accepts it) and the events of
    /// other kinds are left to postcard.
    #[test]
    fn long_varints_and_other_events_are_left_to_postcard() {
        let e = Event::Started {
            task: TaskId(5),
            inputs: vec![],
        };
        let mut bytes = postcard::to_stdvec(&e).unwrap();
        assert_eq!(decode_event(&bytes), Some(e.clone()));
        // The inputs' count 0 spelled in two bytes.
        let last = bytes.len() - 1;
        bytes[last] = 0x80;
        bytes.push(0);
        assert_eq!(decode_event(&bytes), None);
        assert_eq!(read(&bytes), Ok(e));
        let stolen = Event::Stolen {
            task: TaskId(1),
            thief: crate::ids::VnodeId(2),
        };
        assert_eq!(decode_event(&postcard::to_stdvec(&stolen).unwrap()), None);
    }

    /// Rule 2: a length past the bytes left is refused before any allocation.
    #[test]
    fn a_huge_length_allocates_nothing() {
        let mut bytes = vec![STARTED];
        bytes.extend_from_slice(&[0u8; 16]);
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert_eq!(decode_event(&bytes), None);
        assert!(read(&bytes).is_err());
    }

    /// Rule 3: a name met twice is one string; too many names or too long a name is owned.
    #[test]
    fn names_are_shared_up_to_the_table_limit() {
        let (a, b) = (intern("decode_test_name"), intern("decode_test_name"));
        match (&a, &b) {
            (Cow::Borrowed(x), Cow::Borrowed(y)) => assert!(std::ptr::eq(*x, *y)),
            _ => panic!("not shared: {a:?} {b:?}"),
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(intern(&long), Cow::Owned(s) if s == long));
        for i in 0..MAX_NAMES + 1 {
            intern(&format!("decode_test_flood_{i}"));
        }
        assert!(matches!(intern("decode_test_one_too_many"), Cow::Owned(_)));
        assert_eq!(
            intern("decode_test_name"),
            Cow::Borrowed("decode_test_name")
        );
    }
}

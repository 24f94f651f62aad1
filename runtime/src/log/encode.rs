//! The writer's encoder of the events on the task path, byte for byte postcard's, and the
//! decoder its recovery fold reads them back with.
//!
//! Rules:
//!
//! 1. [`encode_event`] writes exactly the bytes `postcard` writes for the same [`Event`] (the
//!    log's format is postcard's, `codec.rs`; the reader decodes with postcard): a varint for
//!    the variant index, lengths and integers, a 0/1 byte for `Option`, and ids and digests as
//!    their fixed 16 and 32 bytes. The property test below holds it to postcard on arbitrary
//!    events.
//! 2. Only `Declared`, `Started` and `Completed` (three events a task, the hot path) are
//!    encoded here; every other event goes to postcard. Through serde, postcard writes a
//!    fixed-size id one byte at a time (a call and a capacity check per byte), which made the
//!    ids and digests the largest part of a logged task's encoding; here each is one copy.
//! 3. An output value of at least `stored_from` bytes is written as [`Payload::Stored`] (its
//!    digest and length) and its bytes are handed back for the value store (rule 10 of
//!    `log/mod.rs`): the same bytes postcard writes for the event with that value stored.
//! 4. [`decode_task_event`] reads those three events back as postcard would (for what it
//!    returns: a `Started` event's digests and a `Completed` event's children, which the
//!    recovery fold ignores, are skipped unread), and gives up (`None`) on anything else or on
//!    bytes it does not take for canonical; its caller then decodes with postcard, which says
//!    what is wrong. The writer folds every event it stores (rule 9 of `log/mod.rs`), and
//!    postcard's serde path reads an id one byte at a time too.

use crate::codec::Digest;
use crate::ids::{DataId, TaskId};

use super::event::{Declared, Event, Output, Payload};
use super::segment::SegmentValues;

/// Variant indices of [`Event`] (declaration order, as serde numbers them).
const DECLARED: u32 = 0;
const STARTED: u32 = 1;
const COMPLETED: u32 = 2;

/// Appends `event` to `buf` as postcard would (rule 1), its values of `stored_from` bytes or
/// more stored (rule 3: pushed to `values`); `false` (nothing written) for the events left to
/// postcard (rule 2).
pub(crate) fn encode_event(
    event: &Event,
    buf: &mut Vec<u8>,
    stored_from: usize,
    values: &mut SegmentValues,
) -> bool {
    match event {
        Event::Declared(d) => {
            varint(buf, u64::from(DECLARED));
            declared(buf, d);
        }
        Event::Started { task, inputs } => {
            varint(buf, u64::from(STARTED));
            task_id(buf, *task);
            len(buf, inputs.len());
            for d in inputs {
                digest(buf, d);
            }
        }
        Event::Completed {
            task,
            outputs,
            children,
        } => {
            varint(buf, u64::from(COMPLETED));
            task_id(buf, *task);
            len(buf, outputs.len());
            for o in outputs {
                output(buf, o, stored_from, values);
            }
            len(buf, children.len());
            for &c in children {
                task_id(buf, c);
            }
        }
        _ => return false,
    }
    true
}

fn declared(buf: &mut Vec<u8>, d: &Declared) {
    task_id(buf, d.task);
    match d.parent {
        None => buf.push(0),
        Some(p) => {
            buf.push(1);
            task_id(buf, p);
        }
    }
    varint(buf, u64::from(d.index));
    bytes(buf, d.name.as_bytes());
    bytes(buf, &d.args);
    for ids in [&d.inputs, &d.outputs] {
        len(buf, ids.len());
        for &id in ids {
            data_id(buf, id);
        }
    }
}

/// Variant indices of [`Payload`].
const INLINE: u32 = 0;
const STORED: u32 = 1;

fn output(buf: &mut Vec<u8>, o: &Output, stored_from: usize, values: &mut SegmentValues) {
    data_id(buf, o.data);
    match &o.value {
        Payload::Inline(b) if b.len() >= stored_from => {
            values.push((o.digest, b.clone()));
            varint(buf, u64::from(STORED));
            digest(buf, &o.digest);
            varint(buf, b.len() as u64);
        }
        Payload::Inline(b) => {
            varint(buf, u64::from(INLINE));
            bytes(buf, b);
        }
        Payload::Stored { digest: d, len } => {
            varint(buf, u64::from(STORED));
            digest(buf, d);
            varint(buf, *len);
        }
    }
    digest(buf, &o.digest);
}

fn task_id(buf: &mut Vec<u8>, id: TaskId) {
    buf.extend_from_slice(&id.0.to_le_bytes());
}

fn data_id(buf: &mut Vec<u8>, id: DataId) {
    buf.extend_from_slice(&id.0.to_le_bytes());
}

fn digest(buf: &mut Vec<u8>, d: &Digest) {
    buf.extend_from_slice(&d.0);
}

/// A length-prefixed byte string (`str`, `Vec<u8>`: postcard writes `Vec<u8>` as a sequence
/// of u8, which is the same bytes).
fn bytes(buf: &mut Vec<u8>, b: &[u8]) {
    len(buf, b.len());
    buf.extend_from_slice(b);
}

fn len(buf: &mut Vec<u8>, n: usize) {
    // usize is at most 64 bits on every target we build for.
    varint(buf, n as u64);
}

/// postcard's varint: 7 bits a byte, least significant first, high bit set on all but the
/// last.
fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// What the recovery fold reads of a task-path event (rule 4).
#[derive(Debug, PartialEq)]
pub(crate) enum TaskEvent {
    /// A whole `Declared` event.
    Declared(Declared),
    /// The task of a `Started` event.
    Started(TaskId),
    /// The task and outputs of a `Completed` event.
    Completed(TaskId, Vec<Output>),
}

/// Reads a `Declared`, `Started` or `Completed` event as [`encode_event`] wrote it (rule 4);
/// `None` for any other event, or bytes to leave to postcard.
pub(crate) fn decode_task_event(bytes: &[u8]) -> Option<TaskEvent> {
    let mut r = Reader(bytes);
    match r.varint()? {
        v if v == u64::from(DECLARED) => {
            let task = TaskId(r.id()?);
            let parent = match r.byte()? {
                0 => None,
                1 => Some(TaskId(r.id()?)),
                _ => return None,
            };
            let index = u32::try_from(r.varint()?).ok()?;
            let name = std::str::from_utf8(r.bytes()?).ok()?.to_string();
            let args = r.bytes()?.to_vec();
            let inputs = r.data_ids()?;
            let outputs = r.data_ids()?;
            if !r.0.is_empty() {
                return None; // postcard refuses trailing bytes, and says so
            }
            Some(TaskEvent::Declared(Declared {
                task,
                parent,
                index,
                name: name.into(),
                args,
                inputs,
                outputs,
            }))
        }
        v if v == u64::from(STARTED) => Some(TaskEvent::Started(TaskId(r.id()?))),
        v if v == u64::from(COMPLETED) => {
            let task = TaskId(r.id()?);
            let n = r.len()?;
            let mut outputs = Vec::with_capacity(n.min(r.0.len() / 49));
            for _ in 0..n {
                let data = DataId(r.id()?);
                let value = match r.varint()? {
                    v if v == u64::from(INLINE) => Payload::Inline(r.bytes()?.to_vec()),
                    v if v == u64::from(STORED) => Payload::Stored {
                        digest: r.digest()?,
                        len: r.varint()?,
                    },
                    _ => return None,
                };
                outputs.push(Output {
                    data,
                    value,
                    digest: r.digest()?,
                });
            }
            Some(TaskEvent::Completed(task, outputs))
        }
        _ => None,
    }
}

/// The bytes not read yet.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn id(&mut self) -> Option<u128> {
        Some(u128::from_le_bytes(self.take(16)?.try_into().ok()?))
    }

    fn digest(&mut self) -> Option<Digest> {
        Some(Digest(self.take(32)?.try_into().ok()?))
    }

    /// A varint of at most 9 bytes (63 bits; longer ones go to postcard).
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..63).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn len(&mut self) -> Option<usize> {
        usize::try_from(self.varint()?).ok()
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.len()?;
        self.take(n)
    }

    fn data_ids(&mut self) -> Option<Vec<DataId>> {
        let n = self.len()?;
        let raw = self.take(n.checked_mul(16)?)?;
        Some(
            raw.chunks_exact(16)
                .map(|c| DataId(u128::from_le_bytes(c.try_into().expect("16 bytes"))))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ids::VnodeId;

    fn digests() -> impl Strategy<Value = Vec<Digest>> {
        proptest::collection::vec(any::<[u8; 32]>().prop_map(Digest), 0..4)
    }

    /// Lengths around the varint's 1-2 byte boundary (127/128) and past 16 KiB (3 bytes).
    fn blob() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..4),
            proptest::collection::vec(any::<u8>(), 126..130),
            proptest::collection::vec(any::<u8>(), 16_384..16_386),
        ]
    }

    fn event() -> impl Strategy<Value = Event> {
        let ids = || proptest::collection::vec(any::<u128>().prop_map(DataId), 0..6);
        let declared = (
            any::<u128>(),
            proptest::option::of(any::<u128>()),
            any::<u32>(),
            "[a-z_]{0,20}",
            blob(),
            ids(),
            ids(),
        )
            .prop_map(|(t, p, index, name, args, inputs, outputs)| {
                Event::Declared(Declared {
                    task: TaskId(t),
                    parent: p.map(TaskId),
                    index,
                    name: name.into(),
                    args,
                    inputs,
                    outputs,
                })
            });
        let started = (any::<u128>(), digests()).prop_map(|(t, inputs)| Event::Started {
            task: TaskId(t),
            inputs,
        });
        let output = (any::<u128>(), blob(), any::<[u8; 32]>()).prop_map(|(d, value, g)| Output {
            data: DataId(d),
            value: value.into(),
            digest: Digest(g),
        });
        let completed = (
            any::<u128>(),
            proptest::collection::vec(output, 0..3),
            proptest::collection::vec(any::<u128>().prop_map(TaskId), 0..7),
        )
            .prop_map(|(t, outputs, children)| Event::Completed {
                task: TaskId(t),
                outputs,
                children,
            });
        prop_oneof![declared, started, completed]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Rule 1: the same bytes as postcard, after whatever the buffer held.
        #[test]
        fn task_events_encode_as_postcard(e in event(), before in blob()) {
            let mut buf = before.clone();
            let mut values = Vec::new();
            prop_assert!(encode_event(&e, &mut buf, usize::MAX, &mut values));
            prop_assert!(values.is_empty());
            let mut want = before;
            want.extend(postcard::to_stdvec(&e).unwrap());
            prop_assert_eq!(buf, want);
        }

        /// Rule 3: with values of 200 bytes or more stored, the bytes postcard writes for the
        /// event whose large values are references, and those values handed back.
        #[test]
        fn stored_values_encode_as_postcard(e in event()) {
            let mut buf = Vec::new();
            let mut values = Vec::new();
            prop_assert!(encode_event(&e, &mut buf, 200, &mut values));
            let mut want = e.clone();
            let mut expected = Vec::new();
            if let Event::Completed { outputs, .. } = &mut want {
                for o in outputs {
                    if o.value.len() >= 200 {
                        let b = o.value.inline().unwrap().to_vec();
                        o.value = Payload::Stored { digest: o.digest, len: b.len() as u64 };
                        expected.push((o.digest, b));
                    }
                }
            }
            prop_assert_eq!(buf, postcard::to_stdvec(&want).unwrap());
            prop_assert_eq!(values, expected);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Rule 4: what is read back is what was written (a `Started` event's task, a
        /// `Completed` event's task and outputs, the whole of a `Declared` event).
        #[test]
        fn task_events_decode_as_encoded(e in event()) {
            let bytes = postcard::to_stdvec(&e).unwrap();
            let want = match e {
                Event::Declared(d) => TaskEvent::Declared(d),
                Event::Started { task, .. } => TaskEvent::Started(task),
                Event::Completed { task, outputs, .. } => TaskEvent::Completed(task, outputs),
                _ => unreachable!("event() makes task events only"),
            };
            prop_assert_eq!(decode_task_event(&bytes), Some(want));
        }

        /// Rule 4: a cut `Declared` event, or one with a byte more, is left to postcard.
        #[test]
        fn damaged_declared_events_are_left_to_postcard(e in event(), cut in 1usize..8) {
            if matches!(e, Event::Declared(_)) {
                let bytes = postcard::to_stdvec(&e).unwrap();
                let mut longer = bytes.clone();
                longer.push(0);
                prop_assert_eq!(decode_task_event(&longer), None);
                let short = &bytes[..bytes.len().saturating_sub(cut)];
                prop_assert_eq!(decode_task_event(short), None);
            }
        }
    }

    /// Rule 4: the other events, and stored values, are read back or left to postcard.
    #[test]
    fn other_events_are_not_decoded_here_and_stored_values_are() {
        let stolen = Event::Stolen {
            task: TaskId(1),
            thief: VnodeId(2),
        };
        assert_eq!(
            decode_task_event(&postcard::to_stdvec(&stolen).unwrap()),
            None
        );
        assert_eq!(decode_task_event(&[]), None);
        let out = Output {
            data: DataId(3),
            value: Payload::Stored {
                digest: Digest([4; 32]),
                len: 1 << 40,
            },
            digest: Digest([4; 32]),
        };
        let completed = Event::Completed {
            task: TaskId(5),
            outputs: vec![out.clone()],
            children: vec![TaskId(6)],
        };
        assert_eq!(
            decode_task_event(&postcard::to_stdvec(&completed).unwrap()),
            Some(TaskEvent::Completed(TaskId(5), vec![out]))
        );
    }

    /// Rule 2: the other events are left to postcard, and nothing is written for them.
    #[test]
    fn other_events_are_left_to_postcard() {
        let mut buf = vec![7];
        let stolen = Event::Stolen {
            task: TaskId(1),
            thief: VnodeId(2),
        };
        assert!(!encode_event(&stolen, &mut buf, 0, &mut Vec::new()));
        assert_eq!(buf, [7]);
    }
}

//! The writer's encoder of the events on the task path, byte for byte postcard's (`decode.rs`
//! reads them back).
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
//! 3. An output value, or a declared task's arguments, of at least `stored_from` bytes is
//!    written as [`Payload::Stored`](super::Payload::Stored) (its digest and length) and its
//!    bytes are handed back for the value store (rule 10 of `log/mod.rs`): the same bytes
//!    postcard writes for the event with that value stored.
//! 4. A declaration is encoded from borrowed fields ([`DeclaredRef`], [`encode_declared`]):
//!    a vnode logs each task it declares from the task's own block, without first copying
//!    its input and output lists into a [`Declared`] (two allocations a task, and their
//!    frees); the bytes are those of `Event::Declared` of the same fields.

use crate::codec::Digest;
use crate::ids::{DataId, TaskId};

use super::decode::PayloadView;
use super::event::{Declared, Event, Output};
use super::segment::SegmentValues;

/// A [`Declared`] of borrowed fields (rule 4).
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeclaredRef<'a> {
    pub(crate) task: TaskId,
    pub(crate) parent: Option<TaskId>,
    pub(crate) index: u32,
    pub(crate) name: &'a str,
    pub(crate) args: PayloadView<'a>,
    pub(crate) inputs: &'a [DataId],
    pub(crate) outputs: &'a [DataId],
}

impl<'a> From<&'a Declared> for DeclaredRef<'a> {
    fn from(d: &'a Declared) -> Self {
        DeclaredRef {
            task: d.task,
            parent: d.parent,
            index: d.index,
            name: &d.name,
            args: PayloadView::from(&d.args),
            inputs: &d.inputs,
            outputs: &d.outputs,
        }
    }
}

/// Appends `Event::Declared` of `d`'s fields to `buf`, as [`encode_event`] would (rule 4).
pub(crate) fn encode_declared(
    buf: &mut Vec<u8>,
    d: &DeclaredRef<'_>,
    stored_from: usize,
    values: &mut SegmentValues,
) {
    varint(buf, u64::from(DECLARED));
    declared(buf, d, stored_from, values);
}

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
        Event::Declared(d) => encode_declared(buf, &d.into(), stored_from, values),
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

fn declared(
    buf: &mut Vec<u8>,
    d: &DeclaredRef<'_>,
    stored_from: usize,
    values: &mut SegmentValues,
) {
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
    payload(buf, d.args, None, stored_from, values);
    for ids in [d.inputs, d.outputs] {
        len(buf, ids.len());
        for &id in ids {
            data_id(buf, id);
        }
    }
}

/// Variant indices of [`Payload`](super::Payload).
const INLINE: u32 = 0;
const STORED: u32 = 1;

fn output(buf: &mut Vec<u8>, o: &Output, stored_from: usize, values: &mut SegmentValues) {
    data_id(buf, o.data);
    payload(buf, (&o.value).into(), Some(o.digest), stored_from, values);
    digest(buf, &o.digest);
}

/// A payload (rule 3), `known` its digest when the event carries it already.
fn payload(
    buf: &mut Vec<u8>,
    p: PayloadView<'_>,
    known: Option<Digest>,
    stored_from: usize,
    values: &mut SegmentValues,
) {
    match p {
        PayloadView::Inline(b) if b.len() >= stored_from => {
            let d = known.unwrap_or_else(|| Digest::of(b));
            values.push((d, b.to_vec()));
            varint(buf, u64::from(STORED));
            digest(buf, &d);
            varint(buf, b.len() as u64);
        }
        PayloadView::Inline(b) => {
            varint(buf, u64::from(INLINE));
            bytes(buf, b);
        }
        PayloadView::Stored { digest: d, len } => {
            varint(buf, u64::from(STORED));
            digest(buf, &d);
            varint(buf, len);
        }
    }
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

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ids::VnodeId;
    use crate::log::Payload;

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

    /// Arbitrary task-path events; with `stored`, some outputs already
    /// [`Payload::Stored`] (as the reader meets them: `decode.rs`'s tests).
    pub(crate) fn events(stored: bool) -> impl Strategy<Value = Event> {
        let ids = || proptest::collection::vec(any::<u128>().prop_map(DataId), 0..6);
        let inline = blob().prop_map(Payload::Inline);
        let payload = if stored {
            prop_oneof![
                inline,
                (any::<[u8; 32]>(), any::<u64>()).prop_map(|(d, len)| Payload::Stored {
                    digest: Digest(d),
                    len
                }),
            ]
            .boxed()
        } else {
            inline.boxed()
        };
        let declared = (
            any::<u128>(),
            proptest::option::of(any::<u128>()),
            any::<u32>(),
            "[a-z_]{0,20}",
            payload.clone(),
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
        let output = (any::<u128>(), payload, any::<[u8; 32]>()).prop_map(|(d, value, g)| Output {
            data: DataId(d),
            value,
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
        fn task_events_encode_as_postcard(e in events(false), before in blob()) {
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
        fn stored_values_encode_as_postcard(e in events(false)) {
            let mut buf = Vec::new();
            let mut values = Vec::new();
            prop_assert!(encode_event(&e, &mut buf, 200, &mut values));
            let mut want = e.clone();
            let mut expected = Vec::new();
            match &mut want {
                Event::Completed { outputs, .. } => {
                    for o in outputs {
                        if o.value.len() >= 200 {
                            let b = o.value.inline().unwrap().to_vec();
                            o.value = Payload::Stored { digest: o.digest, len: b.len() as u64 };
                            expected.push((o.digest, b));
                        }
                    }
                }
                Event::Declared(d) if d.args.len() >= 200 => {
                    let b = d.args.inline().unwrap().to_vec();
                    let digest = Digest::of(&b);
                    d.args = Payload::Stored { digest, len: b.len() as u64 };
                    expected.push((digest, b));
                }
                _ => {}
            }
            prop_assert_eq!(buf, postcard::to_stdvec(&want).unwrap());
            prop_assert_eq!(values, expected);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Rule 4: a declaration from borrowed fields is the bytes, and the stored values, of
        /// its event; in a segment, the same segment, and whether its arguments went out of
        /// line.
        #[test]
        fn a_borrowed_declaration_encodes_as_its_event(e in events(false), from in prop_oneof![Just(200usize), Just(usize::MAX)]) {
            let Event::Declared(d) = &e else { return Ok(()) };
            let (mut mine, mut theirs) = (vec![9], vec![9]);
            let (mut my_values, mut their_values) = (Vec::new(), Vec::new());
            encode_declared(&mut mine, &DeclaredRef::from(d), from, &mut my_values);
            prop_assert!(encode_event(&e, &mut theirs, from, &mut their_values));
            prop_assert_eq!(&mine, &theirs);
            prop_assert_eq!(&my_values, &their_values);
            let mut a = crate::log::segment::SegmentBuilder::storing_from(64, from);
            let mut b = crate::log::segment::SegmentBuilder::storing_from(64, from);
            let stored = a.push_declared(&DeclaredRef::from(d)).unwrap();
            b.push(&e).unwrap();
            prop_assert_eq!(stored, d.args.len() >= from as u64);
            prop_assert_eq!(a.value_bytes(), b.value_bytes());
            prop_assert_eq!(
                a.seal_with_values(VnodeId(1), 2, 3),
                b.seal_with_values(VnodeId(1), 2, 3)
            );
        }
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

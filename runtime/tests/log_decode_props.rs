//! Property tests of the log's decoders on outside bytes (issue 13 point 11): segments and the
//! manifest, from arbitrary bytes, from arbitrary payloads in a sound frame (what a writer with
//! access to the store could put there), and from damaged valid encodings. No panic; damage is
//! always an error (the frame's blake3 digest protects every byte); nothing is allocated beyond
//! what the input holds.

use proptest::prelude::*;
use veriflow_checkpoint::fuzzing::{damage, damages};
use veriflow_runtime::codec;
use veriflow_runtime::log::segment::{decode_segment, SegmentBuilder, SEGMENT_MAGIC};
use veriflow_runtime::log::{Declared, Event, Manifest, Output, RunStatus, MANIFEST_KEY};
use veriflow_runtime::{DataId, Digest, MemoryStore, Store, TaskId, VnodeId};

/// The manifest's frame magic (private to the log; written in its files).
const MANIFEST_MAGIC: [u8; 4] = *b"VFM4";

fn events() -> Vec<Event> {
    let root = TaskId::root("prog", b"args");
    let child = TaskId::child(root, 0);
    let value = vec![7u8; 33];
    vec![
        Event::Declared(Declared {
            task: root,
            parent: None,
            index: 0,
            name: "root".into(),
            args: b"args".to_vec().into(),
            inputs: vec![],
            outputs: vec![DataId::output(root, 0)],
        }),
        Event::Started {
            task: root,
            inputs: vec![Digest::of(b"x")],
        },
        Event::Completed {
            task: root,
            outputs: vec![Output {
                data: DataId::output(root, 0),
                digest: Digest::of(&value),
                value: value.into(),
            }],
            children: vec![child],
        },
        Event::Stolen {
            task: child,
            thief: VnodeId(3),
        },
    ]
}

fn valid_segment() -> Vec<u8> {
    let mut b = SegmentBuilder::new(1024);
    for e in events() {
        b.push(&e).unwrap();
    }
    b.seal(VnodeId(2), 5, 40)
}

fn manifest() -> Manifest {
    let root = TaskId::root("prog", b"args");
    Manifest {
        program: "prog".into(),
        root,
        root_name: "root".into(),
        root_args: b"args".to_vec(),
        inputs: vec![],
        terminal: vec![DataId::output(root, 0)],
        vnodes: 4,
        seed: 9,
        status: RunStatus::Finished,
        tool_version: "test".into(),
        generation: 0,
    }
}

/// Decodes `bytes` as a segment and checks what a success may hold.
fn check_segment(bytes: &[u8]) -> bool {
    match decode_segment(bytes) {
        Ok(seg) => {
            // Every event takes at least its 4-byte length: nothing was made from nothing.
            assert!(seg.events.len() * 4 <= bytes.len());
            assert!(seg.events.capacity() <= (1 << 16).max(2 * seg.events.len()));
            true
        }
        Err(_) => false,
    }
}

fn load_manifest(bytes: &[u8]) -> Option<Manifest> {
    let store = MemoryStore::default();
    store.put(MANIFEST_KEY, bytes).unwrap();
    Manifest::load(&store).ok().flatten()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_break_the_segment_decoder(data in prop::collection::vec(any::<u8>(), 0..512)) {
        check_segment(&data);
    }

    #[test]
    fn arbitrary_content_in_a_sound_frame_never_breaks_it(
        header in prop::collection::vec(any::<u8>(), 24),
        body in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        // A sound frame around a segment header (any counts) and arbitrary event bytes.
        let mut payload = header;
        payload.extend_from_slice(&body);
        check_segment(&codec::frame(SEGMENT_MAGIC, &payload));
    }

    #[test]
    fn a_damaged_segment_is_an_error(d in damages()) {
        let good = valid_segment();
        let seg = decode_segment(&good).unwrap();
        prop_assert_eq!(seg.events.len(), events().len());
        let bad = damage(&good, &d);
        if bad != good {
            prop_assert!(!check_segment(&bad), "a damaged segment decoded");
        }
    }

    #[test]
    fn arbitrary_bytes_never_break_the_manifest_reader(data in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = load_manifest(&data);
        let _ = load_manifest(&codec::frame(MANIFEST_MAGIC, &data));
    }

    #[test]
    fn a_damaged_manifest_is_an_error(d in damages()) {
        let store = MemoryStore::default();
        manifest().store(&store).unwrap();
        let good = store.get(MANIFEST_KEY).unwrap().unwrap();
        prop_assert_eq!(load_manifest(&good), Some(manifest()));
        let bad = damage(&good, &d);
        if bad != good {
            prop_assert_eq!(load_manifest(&bad), None, "a damaged manifest loaded");
        }
    }
}

//! Log generations: the certifier's corrections, written beside the run's own log.
//!
//! Rules:
//!
//! 1. Generation 0 is the run's own log (keys `seg/...`); generation g ≥ 1 lives under
//!    `gen/<g>/seg/...` (`segment::generation_prefix`). Older generations are never changed.
//! 2. A generation is written whole, flushed, and only then named current in the manifest: a
//!    crash while writing leaves the manifest on the previous generation, and the half-written
//!    one is cleared when it is written again.
//! 3. Each vnode of a generation gets its durable watermark (rule 8 of `log/mod.rs`) under the
//!    generation's prefix, so a gap or a lost tail in a generation is noticed as in the run's
//!    own log.
//! 4. Large values (the corrected outputs) go to the value store shared by every generation
//!    (rule 10 of `log/mod.rs`: `val/<digest>`, not under the generation's prefix), in the store
//!    batch of the segment that names them, before it. Events kept from the previous generation
//!    name values that are there already.

use veriflow_checkpoint::Store;

use super::segment::{self, SegmentBuilder};
use super::values::value_key;
use super::watermark::{LastSegment, Watermark};
use super::{Event, LogError, Manifest};
use crate::ids::VnodeId;

/// Events per store batch while writing a generation.
const SEGMENT_BYTES: usize = 64 << 10;

/// Writes `logs` (each vnode's events, in order) as generation `generation` of the log in
/// `store`, then makes it the current generation of `manifest` (rule 2).
pub fn write_generation(
    store: &dyn Store,
    manifest: &mut Manifest,
    generation: u32,
    logs: &[(VnodeId, Vec<Event>)],
) -> Result<(), LogError> {
    if generation == 0 {
        return Err(LogError::Encode(
            "generation 0 is the run's own log and is never rewritten".to_string(),
        ));
    }
    let prefix = segment::generation_prefix(generation);
    for (key, _) in store.scan_prefix(&prefix)? {
        store.delete(&key)?;
    }
    for (vnode, events) in logs {
        let mut batch = Vec::new();
        let mut seg = SegmentBuilder::new(SEGMENT_BYTES);
        let (mut segno, mut first, mut seq) = (0u64, 0u64, 0u64);
        for e in events {
            seg.push(e)
                .map_err(|err| LogError::Encode(err.to_string()))?;
            seq += 1;
            if seg.body_len() >= SEGMENT_BYTES {
                let full = std::mem::replace(&mut seg, SegmentBuilder::new(SEGMENT_BYTES));
                sealed(&mut batch, &prefix, *vnode, segno, first, full);
                segno += 1;
                first = seq;
            }
        }
        let mut last = None;
        if seg.count() > 0 {
            sealed(&mut batch, &prefix, *vnode, segno, first, seg);
            last = Some(LastSegment {
                segno,
                end_seq: seq,
            });
        } else if segno > 0 {
            last = Some(LastSegment {
                segno: segno - 1,
                end_seq: seq,
            });
        }
        // Rule 8 of `log/mod.rs`: the generation's watermark of every vnode, even an empty one.
        let wm = Watermark {
            vnode: *vnode,
            last,
        };
        let mut key = prefix.clone();
        key.extend_from_slice(&wm.key());
        batch.push((key, wm.encode()?));
        store.put_batch(&batch)?;
    }
    store.flush()?;
    manifest.generation = generation;
    manifest.store(store)
}

/// Pushes the segment's large values (rule 4), then the segment, to `batch`.
fn sealed(
    batch: &mut Vec<(Vec<u8>, Vec<u8>)>,
    prefix: &[u8],
    vnode: VnodeId,
    segno: u64,
    first: u64,
    seg: SegmentBuilder,
) {
    let mut key = prefix.to_vec();
    key.extend_from_slice(&segment::segment_key(vnode, segno));
    let (bytes, values) = seg.seal_with_values(vnode, segno, first);
    for (digest, value) in values {
        batch.push((value_key(&digest), value));
    }
    batch.push((key, bytes));
}

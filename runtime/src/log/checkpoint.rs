//! Recovery checkpoints: per vnode, the compacted [`LogState`] of its log up to a segment, so
//! that recovery reads it and the segments after it instead of the whole log (rule 9 of
//! `log/mod.rs`).
//!
//! Stored under `ck/<vnode, u32 BE>` (generation 0 only: the run's own log) as one framed record
//! (`codec.rs` rule 1): the vnode, the last segment it covers ([`LastSegment`]: segment number
//! and sequence end), how many segments the log holds up to it, and the state. The log writer puts it in the same store batch as the last
//! segment it covers and that segment's durable watermark, so the store never holds a
//! checkpoint ahead of its log, and a fenced zombie's checkpoint is refused with its segments
//! (rule 7). Each new checkpoint of a vnode replaces the previous one.
//!
//! A checkpoint that fails its checks (frame, digest, decoding, another vnode's, ahead of the
//! durable watermark) is never used: recovery reads the whole log instead, which is slower but
//! never wrong, and says so in a warning. A sound checkpoint whose segments are not all still
//! in the store (their keys are listed, not read: numbers in order, and as many as it counted)
//! is a log with a hole: recovery reports it as missing data, naming the vnode and segment,
//! as a reader of the whole log would.

use serde::{Deserialize, Serialize};

use super::state::LogState;
use super::watermark::LastSegment;
use super::LogError;
use crate::codec;
use crate::ids::VnodeId;

/// Magic of a checkpoint frame.
pub const CHECKPOINT_MAGIC: [u8; 4] = *b"VFCK";
/// Prefix of every checkpoint key.
pub const CHECKPOINT_PREFIX: &[u8] = b"ck/";
/// Largest checkpoint a reader accepts (checked before decoding): the state is the live
/// frontier, far below this; a header claiming more is damage. Same bound as a segment.
const MAX_CHECKPOINT_BYTES: u64 = 1 << 30;

/// Store key of `vnode`'s checkpoint.
pub fn checkpoint_key(vnode: VnodeId) -> Vec<u8> {
    let mut k = Vec::with_capacity(CHECKPOINT_PREFIX.len() + 4);
    k.extend_from_slice(CHECKPOINT_PREFIX);
    k.extend_from_slice(&vnode.0.to_be_bytes());
    k
}

/// The recovery state of a vnode's log up to a segment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The vnode.
    pub vnode: VnodeId,
    /// The last segment folded into `state` (every segment up to it, every event below its end).
    pub upto: LastSegment,
    /// How many segments the log holds up to `upto` (all epochs): recovery counts their keys,
    /// so a segment deleted before the checkpoint is noticed without reading it.
    pub segments: u64,
    /// The compacted state.
    pub state: LogState,
}

impl Checkpoint {
    /// The framed record.
    pub fn encode(&self) -> Result<Vec<u8>, LogError> {
        let bytes = codec::encode(self).map_err(|e| LogError::Encode(e.to_string()))?;
        Ok(codec::frame(CHECKPOINT_MAGIC, &bytes))
    }

    /// Decodes the record stored for `vnode`; an error names the vnode and what failed.
    pub fn decode(vnode: VnodeId, bytes: &[u8]) -> Result<Checkpoint, LogError> {
        let bad = |reason: String| LogError::Corrupt {
            vnode,
            segment: u64::MAX,
            offset: 0,
            reason: format!("its recovery checkpoint is damaged ({reason})"),
        };
        let payload = codec::unframe(CHECKPOINT_MAGIC, bytes, MAX_CHECKPOINT_BYTES)
            .map_err(|e| bad(e.to_string()))?;
        let ck: Checkpoint = codec::decode(payload).map_err(|e| bad(e.to_string()))?;
        if ck.vnode != vnode {
            return Err(bad(format!("it says it is {}'s", ck.vnode)));
        }
        Ok(ck)
    }
}

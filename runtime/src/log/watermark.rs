//! Durable watermarks: per vnode, the last segment a flush made durable (rule 8 of
//! `log/mod.rs`).
//!
//! Stored under `wm/<vnode, u32 BE><n, u64 BE>` (inside the generation's prefix) as one framed
//! record (`codec.rs` rule 1), where `n` is one more than the last segment's number (0 while
//! the vnode has logged nothing). The writer puts a vnode's watermark in the same store batch
//! as the segments it covers, so a store that applies batches atomically never holds one
//! without the other; a reader that finds fewer segments than the watermark names knows the
//! tail was lost.
//!
//! Each watermark is written once, under a key of its own, and the newest readable one is the
//! vnode's watermark; the writer deletes older ones once two newer ones are acknowledged, 32
//! at a time in one delete (`writer.rs`, `WATERMARK_DELETE_BATCH`). Never an overwrite in
//! place: an erasure-coded overwrite interrupted after it reached some servers can leave
//! neither the old version nor the new one on enough servers to be rebuilt (found by `chaos`:
//! ida:4,2 at a quorum, one server behind, a paused writer's last flush on two servers), while
//! a new key that reached too few servers only reads as absent (`strategy.rs` rule 6 of the
//! checkpoint crate) and leaves the one before it whole.

use serde::{Deserialize, Serialize};

use super::LogError;
use crate::codec;
use crate::ids::VnodeId;

/// Magic of a watermark frame.
pub const WATERMARK_MAGIC: [u8; 4] = *b"VFWM";
/// A watermark is a few dozen bytes; anything above this is not one (checked before decoding).
const MAX_WATERMARK_BYTES: u64 = 4 << 10;

/// The last segment of a vnode that a flush made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastSegment {
    /// Its segment number.
    pub segno: u64,
    /// The sequence number after its last event: events below it are durable.
    pub end_seq: u64,
}

/// What a vnode's log must hold at least (rule 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    /// The vnode.
    pub vnode: VnodeId,
    /// The last durable segment; `None` while the vnode has logged nothing.
    pub last: Option<LastSegment>,
}

/// Prefix of every watermark key of `vnode` (without a generation prefix); also the fence
/// scope of its watermarks (rule 7 of `log/mod.rs`).
pub fn watermark_prefix(vnode: VnodeId) -> Vec<u8> {
    let mut k = Vec::with_capacity(WATERMARK_PREFIX.len() + 4 + 8);
    k.extend_from_slice(WATERMARK_PREFIX);
    k.extend_from_slice(&vnode.0.to_be_bytes());
    k
}

/// Store key of `vnode`'s watermark naming `last` (without a generation prefix): keys of
/// newer watermarks sort after older ones.
pub fn watermark_key(vnode: VnodeId, last: Option<LastSegment>) -> Vec<u8> {
    let n = last.map_or(0, |l| l.segno.saturating_add(1));
    let mut k = watermark_prefix(vnode);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// Prefix of every watermark key.
pub const WATERMARK_PREFIX: &[u8] = b"wm/";

/// Splits a watermark key back into its vnode.
pub fn parse_watermark_key(key: &[u8]) -> Option<VnodeId> {
    let rest = key.strip_prefix(WATERMARK_PREFIX)?;
    if rest.len() != 4 + 8 {
        return None;
    }
    Some(VnodeId(u32::from_be_bytes(rest[..4].try_into().ok()?)))
}

impl Watermark {
    /// Its store key (without a generation prefix).
    pub fn key(&self) -> Vec<u8> {
        watermark_key(self.vnode, self.last)
    }

    /// The framed record.
    pub fn encode(&self) -> Result<Vec<u8>, LogError> {
        let bytes = codec::encode(self).map_err(|e| LogError::Encode(e.to_string()))?;
        Ok(codec::frame(WATERMARK_MAGIC, &bytes))
    }

    /// Decodes the record stored for `vnode`; an error names the vnode.
    pub fn decode(vnode: VnodeId, bytes: &[u8]) -> Result<Watermark, LogError> {
        let bad = |reason: String| LogError::Missing {
            vnode,
            segment: None,
            what: format!("its durable watermark record is damaged ({reason})"),
        };
        let payload = codec::unframe(WATERMARK_MAGIC, bytes, MAX_WATERMARK_BYTES)
            .map_err(|e| bad(e.to_string()))?;
        let wm: Watermark = codec::decode(payload).map_err(|e| bad(e.to_string()))?;
        if wm.vnode != vnode {
            return Err(bad(format!("it says it is {}'s", wm.vnode)));
        }
        Ok(wm)
    }
}

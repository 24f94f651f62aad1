//! The value store: large values, stored once under their content digest beside the segments
//! (rule 10 of `log/mod.rs`).
//!
//! A value whose encoded bytes are at least [`STORED_FROM`] bytes long is not copied into its
//! event: the segment holds [`Payload::Stored`] (digest and length) and the bytes go, raw, under
//! `val/<blake3 digest, 32 bytes>` in the same store, stored before the segment that names
//! them (by the writer's value threads as soon as that segment is sealed, `writer.rs`). The key is the check: a reader hashes what it gets back and
//! refuses a blob whose digest or length differs, or that is not there, with
//! [`LogError::Value`] naming the digest ([`load`]). A value written twice (the same vector
//! re-logged, or returned by a thief and logged by its victim) is one blob, handed to the
//! writer once: a log naming a digest handed already neither copies nor stores it again.

use veriflow_checkpoint::Store;

use super::event::Payload;
use super::LogError;
use crate::codec::Digest;

/// Values of at least this many encoded bytes go to the value store (rule 10 of `log/mod.rs`);
/// smaller ones stay inline in their event. 4 KiB: below it, the 32-byte digest and a store key
/// of their own cost more than the copy into the segment (most task values are a few bytes, and
/// a 64 KiB segment still holds 16 of the largest inline ones); above it, a copy into the
/// segment, its frame digest, and folding it back into recovery state are the log's cost.
pub const STORED_FROM: usize = 4 << 10;

/// Prefix of every value-store key.
pub const VALUE_PREFIX: &[u8] = b"val/";

/// Store key of the value whose digest is `digest`.
pub fn value_key(digest: &Digest) -> Vec<u8> {
    let mut k = Vec::with_capacity(VALUE_PREFIX.len() + 32);
    k.extend_from_slice(VALUE_PREFIX);
    k.extend_from_slice(&digest.0);
    k
}

/// The bytes of the stored value `digest` of `len` bytes, checked against both.
pub fn load(store: &dyn Store, digest: Digest, len: u64) -> Result<Vec<u8>, LogError> {
    let bad = |reason: String| LogError::Value { digest, reason };
    let bytes = store
        .get(&value_key(&digest))
        .map_err(|e| bad(format!("cannot be read: {e}")))?
        .ok_or_else(|| bad("is missing from the value store".to_string()))?;
    if bytes.len() as u64 != len {
        return Err(bad(format!(
            "is corrupt: {} bytes stored, the log says {len}",
            bytes.len()
        )));
    }
    let got = Digest::of(&bytes);
    if got != digest {
        return Err(bad(format!("is corrupt: its bytes hash to {got}")));
    }
    Ok(bytes)
}

/// The bytes of `payload`: its own, or loaded from the value store.
pub fn resolve(store: &dyn Store, payload: Payload) -> Result<Vec<u8>, LogError> {
    match payload {
        Payload::Inline(b) => Ok(b),
        Payload::Stored { digest, len } => load(store, digest, len),
    }
}

//! The one place where records are encoded and decoded (postcard + a framed header).
//!
//! Rules:
//!
//! 1. Every stored record is a *frame*: `magic (4) | version (u16 LE) | header check (u16 LE) |
//!    payload length (u32 LE) | blake3 digest (32) of everything before it and the payload |
//!    payload`. The header check (two bytes of blake3 over magic, version and length) lets a
//!    reader trust the length before it has the payload. [`unframe`] checks them in that order
//!    and says which failed.
//! 2. Lengths are checked against a limit and against the bytes actually there *before*
//!    anything is allocated; a payload shorter than a sound header says is
//!    [`FrameError::Truncated`] (a torn write), distinct from a damaged header or a digest
//!    mismatch (corruption).
//! 3. Values inside payloads are postcard (serde), whose format is stable and documented.
//!    Nothing else in the workspace calls postcard directly. A task's `Vec<f64>` (CG's
//!    vectors) is encoded and decoded in bulk ([`encode_value`], [`decode_value`]): the same
//!    bytes as postcard's (the length as a varint, then each number's 8 little-endian bytes),
//!    without serde's call per element, which was 18 % of a logged data-flow CG's CPU
//!    (`collect_seq` 10.5 %, `visit_seq` 7.3 %; perf, session 35).
//!
//! ```
//! use veriflow_runtime::codec;
//! let frame = codec::frame(*b"TEST", b"hello");
//! assert_eq!(codec::unframe(*b"TEST", &frame, 1 << 20).unwrap(), b"hello");
//! assert!(codec::unframe(*b"TEST", &frame[..frame.len() - 1], 1 << 20).is_err());
//! ```

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Current format version of every frame this build writes (rule 1).
pub const FORMAT_VERSION: u16 = 1;
/// Bytes of a frame header (rule 1).
pub const HEADER_LEN: usize = 4 + 2 + 2 + 4 + 32;

/// A blake3 digest of a value's encoded bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(*blake3::hash(bytes).as_bytes())
    }

    /// All 64 hex digits.
    pub fn to_hex(&self) -> String {
        veriflow_checkpoint::hex::encode(&self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex()[..16])
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{self}")
    }
}

/// Why a frame was refused (rule 1 order).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes than a header: a torn write.
    #[error("torn frame: {available} bytes, shorter than the {HEADER_LEN}-byte header")]
    TooShort {
        /// Bytes present.
        available: usize,
    },
    /// The first four bytes are not the expected magic: not a record of this kind.
    #[error("wrong magic {found:?} (expected {expected:?})")]
    BadMagic {
        /// Magic found.
        found: [u8; 4],
        /// Magic expected.
        expected: [u8; 4],
    },
    /// Written by a format version this build does not read.
    #[error("unsupported format version {found} (this build reads {FORMAT_VERSION})")]
    Version {
        /// Version found.
        found: u16,
    },
    /// The header declares a payload over the limit: refused before allocating.
    #[error("declared payload of {declared} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Declared length.
        declared: u64,
        /// The limit.
        limit: u64,
    },
    /// The header's own check fails: its length cannot be trusted (corruption, not a tear).
    #[error("header check mismatch (the frame header was corrupted)")]
    HeaderMismatch,
    /// Fewer payload bytes than declared: a torn write.
    #[error("torn frame: header declares {declared} payload bytes, {available} present")]
    Truncated {
        /// Declared length.
        declared: u64,
        /// Bytes present.
        available: u64,
    },
    /// The digest does not match: the bytes were changed after they were written.
    #[error("digest mismatch (the record was corrupted after it was written)")]
    DigestMismatch,
}

impl FrameError {
    /// Whether this is what a crash in the middle of a write leaves (rule 2).
    pub fn is_torn(&self) -> bool {
        matches!(
            self,
            FrameError::TooShort { .. } | FrameError::Truncated { .. }
        )
    }
}

/// Encoding or decoding a value failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(String);

impl CodecError {
    /// An error of the runtime's own, not of the codec (e.g. encoding a task that already ran).
    pub(crate) fn other(message: String) -> Self {
        CodecError(message)
    }
}

impl From<postcard::Error> for CodecError {
    fn from(e: postcard::Error) -> Self {
        CodecError(e.to_string())
    }
}

/// Frames `payload` under `magic` (rule 1).
pub fn frame(magic: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.resize(HEADER_LEN, 0);
    out.extend_from_slice(payload);
    seal_frame(magic, &mut out);
    out
}

/// Fills in the header of `buf`, whose first [`HEADER_LEN`] bytes were reserved and whose rest
/// is the payload. Lets a writer build a payload in place without copying it.
pub fn seal_frame(magic: [u8; 4], buf: &mut [u8]) {
    let payload_len = u32::try_from(buf.len() - HEADER_LEN).expect("frames are under 4 GiB");
    buf[0..4].copy_from_slice(&magic);
    buf[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    buf[8..12].copy_from_slice(&payload_len.to_le_bytes());
    let check = header_check(buf);
    buf[6..8].copy_from_slice(&check);
    let digest = frame_digest(&buf[..12], &buf[HEADER_LEN..]);
    buf[12..HEADER_LEN].copy_from_slice(&digest);
}

/// Rule 1: two bytes of blake3 over magic, version and length (bytes 0..6 and 8..12).
fn header_check(head: &[u8]) -> [u8; 2] {
    let mut h = blake3::Hasher::new();
    h.update(&head[0..6]);
    h.update(&head[8..12]);
    let d = h.finalize();
    [d.as_bytes()[0], d.as_bytes()[1]]
}

fn frame_digest(head: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(head);
    h.update(payload);
    *h.finalize().as_bytes()
}

/// Checks a frame (rules 1-2) and returns its payload.
pub fn unframe(magic: [u8; 4], bytes: &[u8], limit: u64) -> Result<&[u8], FrameError> {
    if bytes.len() < HEADER_LEN {
        // A torn header that still starts with a wrong magic is not ours at all.
        if bytes.len() >= 4 && bytes[..4] != magic {
            return Err(FrameError::BadMagic {
                found: first4(bytes),
                expected: magic,
            });
        }
        return Err(FrameError::TooShort {
            available: bytes.len(),
        });
    }
    if bytes[..4] != magic {
        return Err(FrameError::BadMagic {
            found: first4(bytes),
            expected: magic,
        });
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != FORMAT_VERSION {
        return Err(FrameError::Version { found: version });
    }
    if bytes[6..8] != header_check(bytes) {
        return Err(FrameError::HeaderMismatch);
    }
    let declared = u64::from(u32::from_le_bytes([
        bytes[8], bytes[9], bytes[10], bytes[11],
    ]));
    if declared > limit {
        return Err(FrameError::TooLarge { declared, limit });
    }
    let available = (bytes.len() - HEADER_LEN) as u64;
    if available < declared {
        return Err(FrameError::Truncated {
            declared,
            available,
        });
    }
    let end = HEADER_LEN + declared as usize;
    let digest = frame_digest(&bytes[..12], &bytes[HEADER_LEN..end]);
    if digest[..] != bytes[12..HEADER_LEN] || available != declared {
        return Err(FrameError::DigestMismatch);
    }
    Ok(&bytes[HEADER_LEN..end])
}

fn first4(bytes: &[u8]) -> [u8; 4] {
    let mut m = [0u8; 4];
    m.copy_from_slice(&bytes[..4]);
    m
}

/// Encodes a value (rule 3).
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(postcard::to_stdvec(value)?)
}

/// Appends a value's encoding to `buf` (rule 3).
pub fn encode_into<T: Serialize + ?Sized>(value: &T, buf: &mut Vec<u8>) -> Result<(), CodecError> {
    let taken = std::mem::take(buf);
    *buf = postcard::to_extend(value, taken)?;
    Ok(())
}

/// [`encode`] of a task's value, a `Vec<f64>` in bulk (rule 3).
pub fn encode_value<T: Serialize + 'static>(value: &T) -> Result<Vec<u8>, CodecError> {
    let Some(v) = (value as &dyn std::any::Any).downcast_ref::<Vec<f64>>() else {
        return encode(value);
    };
    let mut out = postcard::to_stdvec(&v.len())?;
    if cfg!(target_endian = "little") {
        // The numbers' memory is their little-endian bytes: one copy.
        out.extend_from_slice(bytemuck::cast_slice::<f64, u8>(v));
    } else {
        out.reserve_exact(v.len() * 8);
        for x in v {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    Ok(out)
}

/// The length of [`encode_value`]'s bytes when it is known without encoding: a `Vec<f64>`'s
/// (rule 3: its length's varint, then 8 bytes a number); `None` for other types.
pub fn encoded_value_len<T: 'static>(value: &T) -> Option<u64> {
    let v = (value as &dyn std::any::Any).downcast_ref::<Vec<f64>>()?;
    let n = v.len() as u64;
    // A postcard varint carries 7 bits a byte.
    let varint = (64 - n.leading_zeros()).div_ceil(7).max(1);
    Some(u64::from(varint) + 8 * n)
}

/// [`decode`] of a task's value, a `Vec<f64>` in bulk (rule 3).
pub fn decode_value<T: DeserializeOwned + 'static>(bytes: &[u8]) -> Result<T, CodecError> {
    if std::any::TypeId::of::<T>() != std::any::TypeId::of::<Vec<f64>>() {
        return decode(bytes);
    }
    let (len, rest) = postcard::take_from_bytes::<usize>(bytes)?;
    match len.checked_mul(8) {
        Some(n) if n == rest.len() => {}
        Some(n) if n < rest.len() => {
            return Err(CodecError(format!(
                "{} trailing bytes after the value",
                rest.len() - n
            )))
        }
        _ => return Err(CodecError::from(postcard::Error::DeserializeUnexpectedEnd)),
    }
    let v: Vec<f64> = if cfg!(target_endian = "little") {
        // Copied into the numbers' own (aligned) memory: `rest` may sit at any address.
        let mut v = vec![0.0f64; len];
        bytemuck::cast_slice_mut::<f64, u8>(&mut v).copy_from_slice(rest);
        v
    } else {
        rest.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    };
    let boxed: Box<dyn std::any::Any> = Box::new(v);
    boxed
        .downcast::<T>()
        .map(|t| *t)
        .map_err(|_| CodecError::other("a Vec<f64> that is not one".to_string()))
}

/// Decodes a value that must fill `bytes` exactly (rule 3).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (value, rest) = postcard::take_from_bytes(bytes)?;
    if !rest.is_empty() {
        return Err(CodecError(format!(
            "{} trailing bytes after the value",
            rest.len()
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: [u8; 4] = *b"TEST";

    #[test]
    fn frames_round_trip_and_each_fault_is_named() {
        let f = frame(M, b"payload bytes");
        assert_eq!(unframe(M, &f, 100).unwrap(), b"payload bytes");
        assert!(matches!(
            unframe(*b"XXXX", &f, 100),
            Err(FrameError::BadMagic { .. })
        ));
        assert!(matches!(
            unframe(M, &f, 5),
            Err(FrameError::TooLarge { .. })
        ));
        let torn = unframe(M, &f[..f.len() - 3], 100).unwrap_err();
        assert!(torn.is_torn(), "{torn}");
        assert!(unframe(M, &f[..10], 100).unwrap_err().is_torn());
        for i in 0..f.len() {
            if (4..6).contains(&i) {
                continue; // version bytes: a different error, checked below
            }
            let mut bad = f.clone();
            bad[i] ^= 0x40;
            let e = unframe(M, &bad, 1 << 20).unwrap_err();
            assert!(
                !e.is_torn(),
                "byte {i}: a flipped byte must not pass for a tear: {e}"
            );
        }
        let mut v2 = f.clone();
        v2[4] = 2;
        assert_eq!(unframe(M, &v2, 100), Err(FrameError::Version { found: 2 }));
        let mut longer = f.clone();
        longer.push(0);
        assert_eq!(unframe(M, &longer, 100), Err(FrameError::DigestMismatch));
    }

    #[test]
    fn decode_refuses_trailing_bytes_and_garbage() {
        let mut b = encode(&(7u64, "x".to_string())).unwrap();
        assert_eq!(decode::<(u64, String)>(&b).unwrap(), (7, "x".to_string()));
        b.push(1);
        assert!(decode::<(u64, String)>(&b).is_err());
        assert!(decode::<Vec<u64>>(&[0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }

    proptest::proptest! {
        /// Rule 3: a `Vec<f64>` in bulk is postcard's bytes, both ways, bit for bit.
        #[test]
        fn vectors_of_f64_in_bulk_are_postcards_bytes(
            bits in proptest::collection::vec(proptest::num::u64::ANY, 0..300),
        ) {
            let v: Vec<f64> = bits.iter().map(|&b| f64::from_bits(b)).collect();
            let bytes = encode(&v).unwrap();
            proptest::prop_assert_eq!(&encode_value(&v).unwrap(), &bytes);
            let back: Vec<f64> = decode_value(&bytes).unwrap();
            let back: Vec<u64> = back.iter().map(|x| x.to_bits()).collect();
            proptest::prop_assert_eq!(back, bits);
            // Cut short or followed by more: an error, as postcard's own decode gives.
            let mut longer = bytes.clone();
            longer.push(0);
            proptest::prop_assert!(decode_value::<Vec<f64>>(&longer).is_err());
            if bytes.len() > 1 {
                let short = &bytes[..bytes.len() - 1];
                proptest::prop_assert!(decode_value::<Vec<f64>>(short).is_err());
                proptest::prop_assert!(decode::<Vec<f64>>(short).is_err());
            }
        }
    }

    /// Rule 3: other types go through serde as before.
    #[test]
    fn other_values_are_encoded_by_serde() {
        let v = vec![1.5f32, -2.0];
        assert_eq!(encode_value(&v).unwrap(), encode(&v).unwrap());
        let pair = (3u64, vec![0.5f64]);
        let bytes = encode_value(&pair).unwrap();
        assert_eq!(bytes, encode(&pair).unwrap());
        assert_eq!(decode_value::<(u64, Vec<f64>)>(&bytes).unwrap(), pair);
        assert!(decode_value::<Vec<f64>>(&[
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
        ])
        .is_err());
    }
}

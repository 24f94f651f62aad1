//! Erasure coding of blobs into self-describing fragments (papers 003 and 002 §3.2).
//!
//! A [`Codec`] wraps one [`ErasureCode`] (replication, XOR parity or systematic Reed-Solomon)
//! and turns a blob into M + K fragments, and any M valid fragments back into the blob.
//!
//! Rules the code keeps:
//!
//! 1. **Layout.** The blob of L bytes is cut into M contiguous data pieces of `s = ceil(L / M)`
//!    bytes (the last one padded with zeros); the K parity pieces have the same length. Fragment
//!    `i` is a [`HEADER_LEN`]-byte header followed by piece `i`. For replication M = 1 and every
//!    fragment holds the whole blob.
//! 2. **Blocks.** Coding runs column by column over blocks: a block is the same `w` bytes of
//!    every piece, `w` a power of two of at least [`MIN_PIECE`] and at most
//!    [`STRIPE_BYTES`]` / M` bytes, so a block's inputs and outputs stay in cache. A block is
//!    copied, coded and hashed in one pass while its bytes are hot: each piece's blake3 digest is
//!    assembled from its blocks' subtree chaining values (blake3's tree: a power-of-two run of
//!    1 KiB chunks at a multiple of its length is a subtree), so it equals `blake3::hash` of the
//!    whole piece. Blocks are independent, so a piece of more than one block is coded on
//!    several threads: those of the caller's rayon pool when called on one of its threads
//!    (`ThreadPool::install` chooses), else the codec's own pool of one thread per core
//!    ([`coding_threads`]), so that a log writer's coding never queues behind a computation's
//!    jobs in rayon's global pool. One block runs on the calling thread. Decoding is one such
//!    pass too: the headers are read first, then the pieces of the version they name (rule 5,
//!    as if every digest matched) are hashed block by block and the data pieces among them
//!    copied into the blob while each block is hot, and lost data pieces rebuilt from them
//!    (reading the parity pieces in place) and hashed in the same pass; a wrong guess (a bad
//!    fragment changed the choice) copies and rebuilds from the chosen pieces again. The
//!    codes' inner loops read each input once per 64 bytes and write each output once: XOR
//!    parity in registers, Reed-Solomon with GFNI where the CPU has it (`gf.rs`). An encode or a
//!    decode hashing at most [`STRIPE_BYTES`] runs on the calling thread, where it takes less
//!    time and CPU than waking a pool: a log segment of 64 KiB written or read back through a
//!    replicated store. (Coded on the pool, the two pool threads' wake-ups and spinning took
//!    32-42 ms of CPU in one `paper cluster` S1 run, 1.5 µs a task; perf, session 35.)
//!    Fragments and blobs are written once, never zeroed first (`fill`, and `assume_init` of
//!    what it wrote: the module's only `unsafe`).
//! 3. **Header.** Every fragment says: magic `VFEC`, format version, code kind, M, K, its index,
//!    the blob length, a write stamp (chosen by the writer, larger for newer versions), the blob
//!    digest and its own digest. The blob digest is a blake3 root over L, the code and the
//!    blake3 digests of the M data pieces; the fragment digest is a blake3 hash of the header
//!    fields and the digest of its own piece. Both are derived-key hashes with their own context
//!    strings, so neither can be mistaken for the other.
//! 4. **A bad fragment counts as lost.** A fragment that is truncated, has a bad magic, an
//!    unknown version, a digest that does not match, or an index, M, K or kind other than
//!    expected for its slot is not used, and is reported for repair.
//! 5. **Versions are never mixed.** Valid fragments are grouped by (stamp, blob digest); the
//!    newest stamp wins. Fragments of other versions are reported for repair. If the newest
//!    version has fewer than M valid fragments the answer is
//!    [`ErasureError::TooFewFragments`], never an older version and never a guess.
//! 6. **End-to-end check.** Data pieces rebuilt from parity are hashed again and the blob digest
//!    recomputed; a mismatch is [`ErasureError::Inconsistent`], so decoding returns the exact
//!    bytes that were encoded or an error, never wrong data.
//!
//! ```
//! use veriflow_checkpoint::erasure::Codec;
//! let codec = Codec::ida(4, 2).unwrap();
//! let mut frags: Vec<Option<Vec<u8>>> = codec.encode(b"hello world", 1).into_iter().map(Some).collect();
//! frags[0] = None; // two servers lost
//! frags[3] = None;
//! let got = codec.decode(&frags).unwrap();
//! assert_eq!(got.blob, b"hello world");
//! assert_eq!(got.repair, vec![0, 3]);
//! ```

mod codes;
mod gf;
#[cfg(test)]
mod tests;

use std::fmt;
use std::mem::MaybeUninit;
use std::sync::{Arc, OnceLock};

use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, HasherExt, Mode};
use rayon::prelude::*;

pub use codes::{CodeKind, ErasureCode, ReedSolomonCode, Replication, XorParity};

/// Bytes of the fragment header (rule 3).
pub const HEADER_LEN: usize = 94;
/// Fragment format version written in every header.
pub const FORMAT_VERSION: u8 = 1;
/// At most this many fragments per blob: GF(2^8) has 256 elements, so Reed-Solomon over it
/// cannot have more distinct evaluation points.
pub const MAX_FRAGMENTS: usize = 256;
/// Bytes of blob per coding stripe (rule 2): 256 KiB of data plus its parity fits in the 1-2 MiB
/// L2 cache of current server cores.
pub const STRIPE_BYTES: usize = 256 * 1024;
/// Lower bound on a block's width (rule 2): blake3 hashes up to 16 of its 1 KiB chunks side by
/// side (AVX-512; 8 with AVX2), so a narrower block leaves SIMD lanes idle. Measured with AVX2 on
/// 2 cores: 4 KiB blocks hash at 0.6 times the rate of 8-32 KiB ones.
pub const MIN_PIECE: usize = 16 * 1024;

const MAGIC: &[u8; 4] = b"VFEC";

/// The codec's own pool (rule 2), built on first use; `None` if the system refused threads
/// (the codec then codes on whatever pool the calling thread reaches: rayon's global one).
fn own_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("erasure-{i}"))
            .build()
            .ok()
    })
    .as_ref()
}

/// Threads a codec called from this thread codes on (rule 2): the current rayon pool's on one
/// of its threads, else the codec's own pool's (one per core, or `RAYON_NUM_THREADS`).
pub fn coding_threads() -> usize {
    match (rayon::current_thread_index(), own_pool()) {
        (None, Some(pool)) => pool.current_num_threads(),
        _ => rayon::current_num_threads(),
    }
}

/// Whether a pass over `blocks` blocks that hashes `hashed` bytes goes to a pool (rule 2):
/// one block, or at most [`STRIPE_BYTES`] hashed, costs less on the calling thread.
fn on_pool(blocks: usize, hashed: usize) -> bool {
    blocks > 1 && hashed > STRIPE_BYTES
}

/// Runs `f`, whose parallel iterators run on [`coding_threads`]' pool (rule 2).
fn on_coding_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    #[cfg(test)]
    tests::bump(&tests::DISPATCHED);
    match (rayon::current_thread_index(), own_pool()) {
        (None, Some(pool)) => pool.install(f),
        _ => f(),
    }
}
const BLOB_CONTEXT: &str = "veriflow erasure blob digest v1";
const FRAGMENT_CONTEXT: &str = "veriflow erasure fragment digest v1";

/// Why coding or decoding failed, grouped by what the caller should do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ErasureError {
    /// Bad code parameters (M = 0, too many fragments, ...): fix the configuration.
    #[error("bad erasure code parameters: {0}")]
    BadParameters(String),
    /// The decoder was handed a number of fragment slots other than M + K: a caller bug.
    #[error("expected {expected} fragment slots, got {got}")]
    WrongFragmentCount {
        /// Slots given.
        got: usize,
        /// M + K.
        expected: usize,
    },
    /// Fewer than M valid fragments of the newest version: the data cannot be rebuilt from
    /// what is reachable; bring back servers holding the missing fragments.
    #[error(
        "only {have} valid fragments, {need} needed (corrupt: {corrupt:?}, missing: {missing:?})"
    )]
    TooFewFragments {
        /// Valid fragments of the newest version.
        have: usize,
        /// M.
        need: usize,
        /// Slots whose fragment failed its checks.
        corrupt: Vec<usize>,
        /// Slots with no fragment (or a fragment of an older version).
        missing: Vec<usize>,
    },
    /// Data rebuilt from valid fragments does not match the blob digest: a coder bug or a
    /// forged fragment. Nothing is returned; report it.
    #[error("rebuilt data does not match its digest: {0}")]
    Inconsistent(String),
}

/// Why one fragment is not usable (rule 4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FragmentError {
    /// Shorter than a header, or its piece has the wrong length for the blob length.
    #[error("fragment truncated or of the wrong length: {0}")]
    Length(String),
    /// Not a fragment of this format.
    #[error("not a fragment (bad magic or unknown version {0})")]
    Format(u8),
    /// The header fields are impossible or belong to another code or slot.
    #[error("fragment header does not fit: {0}")]
    Header(String),
    /// The digest does not match the content.
    #[error("fragment digest mismatch (corrupt)")]
    Digest,
}

/// A fragment's parsed header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FragmentHeader {
    /// The code.
    pub kind: CodeKind,
    /// Data fragments.
    pub m: usize,
    /// Redundant fragments.
    pub k: usize,
    /// This fragment's index in `0..m + k`.
    pub index: usize,
    /// Length of the blob.
    pub blob_len: u64,
    /// The writer's stamp: larger for newer versions.
    pub stamp: u64,
    /// The blob digest (rule 3).
    pub blob_digest: [u8; 32],
}

/// A decoded blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The exact bytes that were encoded.
    pub blob: Vec<u8>,
    /// The write stamp of this version.
    pub stamp: u64,
    /// Slots whose fragment is missing, corrupt or of another version: rewrite them with
    /// [`Codec::encode`]`(&blob, stamp)` to repair.
    pub repair: Vec<usize>,
    /// Of `repair`, the slots whose fragment was there but failed its checks.
    pub corrupt: Vec<usize>,
}

/// Data pieces rebuilt in the decoder's first pass (rule 2), guessing which pieces are valid.
struct Rebuilt {
    /// The pieces they were rebuilt from: used only if exactly these turn out chosen.
    from: Vec<bool>,
    /// Each rebuilt data piece's digest.
    digests: Vec<(usize, [u8; 32])>,
}

/// An erasure code plus the fragment framing (rules 1-6). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Codec {
    code: Arc<dyn ErasureCode>,
}

impl Codec {
    /// Wraps any code.
    pub fn new(code: Arc<dyn ErasureCode>) -> Self {
        Self { code }
    }

    /// R full copies.
    pub fn replicate(copies: usize) -> Result<Self, ErasureError> {
        Ok(Self::new(Arc::new(Replication::new(copies)?)))
    }

    /// M slices plus XOR parity.
    pub fn parity(m: usize) -> Result<Self, ErasureError> {
        Ok(Self::new(Arc::new(XorParity::new(m)?)))
    }

    /// Systematic Reed-Solomon: any M of M + K fragments rebuild.
    pub fn ida(m: usize, k: usize) -> Result<Self, ErasureError> {
        Ok(Self::new(Arc::new(ReedSolomonCode::new(m, k)?)))
    }

    /// The code underneath (benchmarks time it alone).
    pub fn code(&self) -> &Arc<dyn ErasureCode> {
        &self.code
    }

    /// The code kind.
    pub fn kind(&self) -> CodeKind {
        self.code.kind()
    }

    /// M: fragments needed to decode.
    pub fn data_fragments(&self) -> usize {
        self.code.data_pieces()
    }

    /// K: fragments that may be lost.
    pub fn parity_fragments(&self) -> usize {
        self.code.parity_pieces()
    }

    /// M + K.
    pub fn total_fragments(&self) -> usize {
        self.data_fragments() + self.parity_fragments()
    }

    fn piece_len(&self, blob_len: usize) -> usize {
        blob_len.div_ceil(self.data_fragments())
    }

    /// Block width for pieces of `s` bytes (rule 2): the largest power of two within the
    /// stripe, halved (down to [`MIN_PIECE`]) until every thread of the pool has two blocks.
    fn block_len(&self, s: usize) -> usize {
        let stripe = (STRIPE_BYTES / self.data_fragments()).max(MIN_PIECE);
        let mut w = 1 << stripe.ilog2();
        let tasks = 2 * coding_threads();
        while w > MIN_PIECE && s.div_ceil(w) < tasks {
            w /= 2;
        }
        w
    }

    /// Codes `blob` into M + K fragments, fragment `i` for slot `i` (rules 1-3).
    pub fn encode(&self, blob: &[u8], stamp: u64) -> Vec<Vec<u8>> {
        let m = self.data_fragments();
        let k = self.parity_fragments();
        let s = self.piece_len(blob.len());
        let w = self.block_len(s);
        let blocks = s.div_ceil(w);
        // Rule 2: every byte is written once, by the block pass or the header, never zeroed first.
        let mut frags: Vec<Box<[MaybeUninit<u8>]>> = (0..m + k)
            .map(|_| Box::new_uninit_slice(HEADER_LEN + s))
            .collect();
        // Block b of every fragment, in slot order: disjoint borrows, one set per task.
        let mut columns: Vec<Vec<&mut [MaybeUninit<u8>]>> =
            (0..blocks).map(|_| Vec::with_capacity(m + k)).collect();
        for f in frags.iter_mut() {
            for (col, part) in columns.iter_mut().zip(f[HEADER_LEN..].chunks_mut(w)) {
                col.push(part);
            }
        }
        let whole = blocks == 1;
        let encode_block = |(b, col): (usize, Vec<&mut [MaybeUninit<u8>]>)| -> Vec<[u8; 32]> {
            let off = b * w;
            // Data: the blob's bytes, zeros past its end; parity: zeros, then coded.
            let mut col: Vec<&mut [u8]> = col
                .into_iter()
                .enumerate()
                .map(|(i, dst)| {
                    let src = if i < m {
                        let start = (i * s + off).min(blob.len());
                        let end = (i * s + off + dst.len()).min(blob.len());
                        &blob[start..end]
                    } else {
                        &[][..]
                    };
                    fill(dst, src)
                })
                .collect();
            let (data, parity) = col.split_at_mut(m);
            let ins: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
            self.code.encode(&ins, parity);
            col.iter().map(|p| block_digest(p, off, whole)).collect()
        };
        let hashed = (m + k) * s;
        let digests: Vec<Vec<[u8; 32]>> = if on_pool(blocks, hashed) {
            on_coding_pool(|| {
                columns
                    .into_par_iter()
                    .enumerate()
                    .map(encode_block)
                    .collect()
            })
        } else {
            columns.into_iter().enumerate().map(encode_block).collect()
        };
        let piece_digests: Vec<[u8; 32]> = (0..m + k)
            .map(|i| piece_digest(digests.iter().map(|d| d[i]), blocks))
            .collect();
        let blob_digest = self.blob_digest(blob.len() as u64, &piece_digests[..m]);
        frags
            .into_iter()
            .enumerate()
            .map(|(i, mut f)| {
                let h = FragmentHeader {
                    kind: self.kind(),
                    m,
                    k,
                    index: i,
                    blob_len: blob.len() as u64,
                    stamp,
                    blob_digest,
                };
                write_header(fill(&mut f[..HEADER_LEN], &[]), &h, &piece_digests[i]);
                // SAFETY: every byte of `f` is initialised: its header just above, and its piece
                // by `fill` in the block pass, whose columns hold all `s.div_ceil(w)` chunks of
                // every piece (`chunks_mut(w)` yields exactly that many) and all ran.
                unsafe { f.assume_init() }.into_vec()
            })
            .collect()
    }

    fn blob_digest(&self, blob_len: u64, data_digests: &[[u8; 32]]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_derive_key(BLOB_CONTEXT);
        h.update(&blob_len.to_le_bytes());
        h.update(&[self.kind().to_byte()]);
        h.update(&(self.data_fragments() as u64).to_le_bytes());
        h.update(&(self.parity_fragments() as u64).to_le_bytes());
        for d in data_digests {
            h.update(d);
        }
        *h.finalize().as_bytes()
    }

    /// Checks one fragment for slot `slot` (rule 4): its header, its length and its digest.
    /// Returns the header and the digest of its piece.
    pub fn check_fragment(
        &self,
        slot: usize,
        bytes: &[u8],
    ) -> Result<(FragmentHeader, [u8; 32]), FragmentError> {
        let h = self.check_shape(slot, bytes)?;
        let piece_digest = *blake3::hash(&bytes[HEADER_LEN..]).as_bytes();
        check_digest(bytes, &piece_digest)?;
        Ok((h, piece_digest))
    }

    /// Rule 4 but the digest: the header of the fragment in slot `slot` if it parses, its
    /// payload has the length its blob length gives, and it was made by this code for this slot.
    fn check_shape(&self, slot: usize, bytes: &[u8]) -> Result<FragmentHeader, FragmentError> {
        let h = check_length(bytes)?;
        if h.kind != self.kind() || h.m != self.data_fragments() || h.k != self.parity_fragments() {
            return Err(FragmentError::Header(format!(
                "made by {}({},{}), expected {}({},{})",
                h.kind,
                h.m,
                h.k,
                self.kind(),
                self.data_fragments(),
                self.parity_fragments()
            )));
        }
        if h.index != slot {
            return Err(FragmentError::Header(format!(
                "fragment {} found in slot {slot}",
                h.index
            )));
        }
        Ok(h)
    }

    /// Rebuilds the blob from `fragments[i]` = what slot `i` holds (rules 4-6). Needs
    /// `fragments.len() == M + K` and at least M valid fragments of the newest version.
    ///
    /// One pass over the fragments (rule 2): the headers are read first, and the version they
    /// would choose if every digest matched is hashed block by block, its data pieces copied
    /// into the blob while each block is hot; then the digests decide. Only when a bad fragment
    /// changed the choice are the chosen pieces copied again.
    pub fn decode<F: AsRef<[u8]> + Sync>(
        &self,
        fragments: &[Option<F>],
    ) -> Result<Decoded, ErasureError> {
        let m = self.data_fragments();
        let n = self.total_fragments();
        if fragments.len() != n {
            return Err(ErasureError::WrongFragmentCount {
                got: fragments.len(),
                expected: n,
            });
        }
        let bytes = |i: usize| fragments[i].as_ref().map(AsRef::as_ref);
        // Rule 4 but the digests: what each slot's header says.
        let shapes: Vec<Option<Result<FragmentHeader, FragmentError>>> = (0..n)
            .map(|i| bytes(i).map(|b| self.check_shape(i, b)))
            .collect();
        let headers: Vec<Option<&FragmentHeader>> = shapes
            .iter()
            .map(|s| s.as_ref().and_then(|r| r.as_ref().ok()))
            .collect();
        let guess = newest(&headers);
        // The guessed version's pieces, hashed and copied block by block; any other piece whole.
        let (mut blob, mut piece_digests, rebuilt) = match guess {
            Some(((_, _, len), _)) => self.hash_and_copy(fragments, &headers, len)?,
            None => (Vec::new(), vec![None; n], None),
        };
        for (i, h) in headers.iter().enumerate() {
            if let (Some(_), None, Some(b)) = (h, piece_digests[i], bytes(i)) {
                piece_digests[i] = Some(*blake3::hash(&b[HEADER_LEN..]).as_bytes());
            }
        }
        // Rule 4: the digests.
        let mut corrupt = Vec::new();
        let mut valid: Vec<Option<(FragmentHeader, [u8; 32])>> = Vec::with_capacity(n);
        for (i, shape) in shapes.into_iter().enumerate() {
            let checked = match (shape, piece_digests[i], bytes(i)) {
                (None, _, _) | (_, _, None) => None,
                (Some(Err(_)), _, _) => Some(None),
                (Some(Ok(h)), Some(d), Some(b)) => Some(check_digest(b, &d).ok().map(|()| (h, d))),
                (Some(Ok(_)), None, Some(_)) => Some(None),
            };
            match checked {
                None => valid.push(None),
                Some(Some(v)) => valid.push(Some(v)),
                Some(None) => {
                    corrupt.push(i);
                    valid.push(None);
                }
            }
        }
        // Rule 5: the newest (stamp, digest, length) group; among equal stamps the larger group.
        let best = newest(
            &valid
                .iter()
                .map(|v| v.as_ref().map(|(h, _)| h))
                .collect::<Vec<_>>(),
        );
        let chosen: Vec<bool> = valid
            .iter()
            .map(|v| match (v, best) {
                (Some((h, _)), Some((id, _))) => version(h) == id,
                _ => false,
            })
            .collect();
        let have = chosen.iter().filter(|&&c| c).count();
        let repair: Vec<usize> = (0..n).filter(|&i| !chosen[i]).collect();
        if have < m {
            let missing = repair
                .iter()
                .copied()
                .filter(|i| !corrupt.contains(i))
                .collect();
            return Err(ErasureError::TooFewFragments {
                have,
                need: m,
                corrupt,
                missing,
            });
        }
        let Some((id @ (stamp, blob_digest, blob_len), _)) = best else {
            return Err(ErasureError::Inconsistent("no version chosen".into()));
        };
        let len = usize::try_from(blob_len)
            .map_err(|_| ErasureError::Inconsistent("blob length overflows".into()))?;
        let s = self.piece_len(len);
        let guessed = guess.map(|(g, _)| g) == Some(id);
        if !guessed {
            // A bad fragment made the guess wrong: copy the chosen version's data pieces now.
            blob = vec![0u8; m * s];
            for (i, piece) in blob.chunks_mut(s.max(1)).enumerate() {
                if let (true, Some(b)) = (chosen[i], bytes(i)) {
                    piece.copy_from_slice(&b[HEADER_LEN..]);
                }
            }
        }
        let mut digests: Vec<[u8; 32]> = (0..m)
            .map(|i| match (chosen[i], &valid[i]) {
                (true, Some((_, d))) => *d,
                _ => [0; 32],
            })
            .collect();
        let lost_data: Vec<usize> = (0..m).filter(|&i| !chosen[i]).collect();
        match rebuilt {
            // The pass above rebuilt the lost data pieces from exactly the chosen pieces.
            Some(r) if guessed && r.from == chosen => {
                for (i, d) in r.digests {
                    digests[i] = d;
                }
            }
            _ if !lost_data.is_empty() => {
                for (i, d) in self.rebuild(&mut blob, s, fragments, &chosen)? {
                    digests[i] = d;
                }
            }
            _ => {}
        }
        if self.blob_digest(blob_len, &digests) != blob_digest {
            return Err(ErasureError::Inconsistent(format!(
                "blob digest mismatch after rebuilding data fragments {lost_data:?}"
            )));
        }
        blob.truncate(len);
        corrupt.retain(|i| repair.contains(i));
        Ok(Decoded {
            blob,
            stamp,
            repair,
            corrupt,
        })
    }

    /// Rule 2 for decoding: the pieces of every fragment whose header passed and names blob
    /// length `len` (the version `newest` chose by the headers alone, and any other of that
    /// length) hashed block by block, the data pieces among them copied into an M-piece blob
    /// while each block is hot. If data pieces are missing and at least M pieces are at hand,
    /// the missing ones are rebuilt from those in the same pass (guessing, as for the copy, that
    /// every digest will match) and hashed; else zeros stand in. Returns the blob, each slot's
    /// piece digest (`None` for the slots not hashed here), and what was rebuilt.
    #[allow(clippy::type_complexity)]
    fn hash_and_copy<F: AsRef<[u8]> + Sync>(
        &self,
        fragments: &[Option<F>],
        headers: &[Option<&FragmentHeader>],
        len: u64,
    ) -> Result<(Vec<u8>, Vec<Option<[u8; 32]>>, Option<Rebuilt>), ErasureError> {
        let m = self.data_fragments();
        let n = self.total_fragments();
        let len = usize::try_from(len)
            .map_err(|_| ErasureError::Inconsistent("blob length overflows".into()))?;
        let s = self.piece_len(len);
        // Every fragment of this length: their payloads are `s` bytes (check_shape).
        let member: Vec<Option<&[u8]>> = (0..n)
            .map(|i| match (headers[i], &fragments[i]) {
                (Some(h), Some(f)) if h.blob_len == len as u64 => Some(&f.as_ref()[HEADER_LEN..]),
                _ => None,
            })
            .collect();
        let present = member.iter().flatten().count();
        let rebuild = s > 0 && present >= m && member[..m].iter().any(Option::is_none);
        let w = self.block_len(s);
        let blocks = s.div_ceil(w);
        let whole = blocks == 1;
        let mut blob: Box<[MaybeUninit<u8>]> = Box::new_uninit_slice(m * s);
        let mut columns: Vec<Vec<&mut [MaybeUninit<u8>]>> =
            (0..blocks).map(|_| Vec::with_capacity(m)).collect();
        if s > 0 {
            for piece in blob.chunks_mut(s) {
                for (col, part) in columns.iter_mut().zip(piece.chunks_mut(w)) {
                    col.push(part);
                }
            }
        }
        // Per block: each slot's digest, and whether the rebuild of its lost pieces failed.
        let block = |(b, col): (usize, Vec<&mut [MaybeUninit<u8>]>)| {
            let off = b * w;
            let mut out = vec![None; n];
            let mut copied: Vec<&mut [u8]> = Vec::with_capacity(m);
            for (i, dst) in col.into_iter().enumerate() {
                let src = member[i].map_or(&[][..], |p| &p[off..off + dst.len()]);
                let bytes = fill(dst, src);
                if member[i].is_some() {
                    out[i] = Some(block_digest(bytes, off, whole));
                }
                copied.push(bytes);
            }
            for (i, p) in member.iter().enumerate().skip(m) {
                if let Some(p) = p {
                    let end = (off + w).min(s);
                    out[i] = Some(block_digest(&p[off..end], off, whole));
                }
            }
            let mut failed = false;
            if rebuild {
                let end = (off + w).min(s);
                let mut pieces: Vec<Option<&[u8]>> = Vec::with_capacity(n);
                let mut lost: Vec<(usize, &mut [u8])> = Vec::new();
                for (i, p) in copied.iter_mut().enumerate() {
                    if member[i].is_some() {
                        pieces.push(Some(&**p));
                    } else {
                        pieces.push(None);
                        lost.push((i, &mut **p));
                    }
                }
                pieces.extend(member[m..].iter().map(|p| p.map(|p| &p[off..end])));
                failed = self.code.rebuild_data(&pieces, &mut lost).is_err();
                for (i, p) in lost {
                    out[i] = Some(block_digest(p, off, whole));
                }
            }
            (out, failed)
        };
        let hashed = present * s;
        let digests: Vec<(Vec<Option<[u8; 32]>>, bool)> = if on_pool(blocks, hashed) {
            on_coding_pool(|| columns.into_par_iter().enumerate().map(block).collect())
        } else {
            columns.into_iter().enumerate().map(block).collect()
        };
        let digest_of =
            |i: usize| piece_digest(digests.iter().map(|(d, _)| d[i].unwrap_or([0; 32])), blocks);
        let pieces = (0..n).map(|i| member[i].map(|_| digest_of(i))).collect();
        let rebuilt = (rebuild && !digests.iter().any(|(_, failed)| *failed)).then(|| Rebuilt {
            from: member.iter().map(Option::is_some).collect(),
            digests: (0..m)
                .filter(|&i| member[i].is_none())
                .map(|i| (i, digest_of(i)))
                .collect(),
        });
        // SAFETY: every byte of `blob` is initialised: its `m` pieces of `s` bytes are cut into
        // the columns' `s.div_ceil(w)` chunks each (all of them: `chunks_mut(w)` yields exactly
        // that many), and every column ran and wrote each of its chunks with `fill`.
        let blob = unsafe { blob.assume_init() }.into_vec();
        Ok((blob, pieces, rebuilt))
    }

    /// Rebuilds the lost data pieces of `blob` (M pieces of `s` bytes), block by block (rule
    /// 2), and returns the digest of each rebuilt piece, computed while its blocks are hot.
    fn rebuild<F: AsRef<[u8]> + Sync>(
        &self,
        blob: &mut [u8],
        s: usize,
        fragments: &[Option<F>],
        chosen: &[bool],
    ) -> Result<Vec<(usize, [u8; 32])>, ErasureError> {
        #[cfg(test)]
        tests::bump(&tests::REBUILD_PASSES);
        let m = self.data_fragments();
        let k = self.parity_fragments();
        if s == 0 {
            let empty = *blake3::hash(&[]).as_bytes();
            return Ok((0..m).filter(|&i| !chosen[i]).map(|i| (i, empty)).collect());
        }
        let w = self.block_len(s);
        let blocks = s.div_ceil(w);
        let whole = blocks == 1;
        let mut columns: Vec<Vec<&mut [u8]>> = (0..blocks).map(|_| Vec::with_capacity(m)).collect();
        for piece in blob.chunks_mut(s) {
            for (col, part) in columns.iter_mut().zip(piece.chunks_mut(w)) {
                col.push(part);
            }
        }
        let rebuild_block =
            |(b, mut col): (usize, Vec<&mut [u8]>)| -> Result<Vec<[u8; 32]>, ErasureError> {
                let off = b * w;
                let len = col[0].len();
                // The chosen pieces read in place (data from the blob, parity from its
                // fragment), the lost data pieces written.
                let mut pieces: Vec<Option<&[u8]>> = Vec::with_capacity(m + k);
                let mut lost: Vec<(usize, &mut [u8])> = Vec::new();
                for (i, p) in col.iter_mut().enumerate() {
                    if chosen[i] {
                        pieces.push(Some(&**p));
                    } else {
                        pieces.push(None);
                        lost.push((i, &mut **p));
                    }
                }
                for j in 0..k {
                    pieces.push(match (chosen[m + j], &fragments[m + j]) {
                        (true, Some(f)) => {
                            Some(&f.as_ref()[HEADER_LEN + off..HEADER_LEN + off + len])
                        }
                        _ => None,
                    });
                }
                self.code.rebuild_data(&pieces, &mut lost)?;
                Ok(lost
                    .iter()
                    .map(|(_, p)| block_digest(p, off, whole))
                    .collect())
            };
        let hashed = (m + k) * s;
        let digests: Vec<Vec<[u8; 32]>> = if on_pool(blocks, hashed) {
            on_coding_pool(|| {
                columns
                    .into_par_iter()
                    .enumerate()
                    .map(rebuild_block)
                    .collect::<Result<_, _>>()
            })?
        } else {
            columns
                .into_iter()
                .enumerate()
                .map(rebuild_block)
                .collect::<Result<_, _>>()?
        };
        Ok((0..m)
            .filter(|&i| !chosen[i])
            .enumerate()
            .map(|(j, i)| (i, piece_digest(digests.iter().map(|d| d[j]), blocks)))
            .collect())
    }
}

/// The blake3 digest of block `bytes` at offset `off` of its piece (rule 2): the root hash when
/// it is the `whole` piece, else its subtree's chaining value (`off` is a multiple of the
/// block's power-of-two width, so the block is a subtree of the piece's tree).
fn block_digest(bytes: &[u8], off: usize, whole: bool) -> [u8; 32] {
    if whole {
        *blake3::hash(bytes).as_bytes()
    } else {
        blake3::Hasher::new()
            .set_input_offset(off as u64)
            .update(bytes)
            .finalize_non_root()
    }
}

/// Writes `src` into the start of `dst` and zeros into the rest, and returns `dst` as bytes
/// (rule 2: output is written once, not zeroed and then overwritten). `src` longer than `dst`
/// is cut.
fn fill<'a>(dst: &'a mut [MaybeUninit<u8>], src: &[u8]) -> &'a mut [u8] {
    let n = src.len().min(dst.len());
    let p = dst.as_mut_ptr().cast::<u8>();
    // SAFETY: `p` is valid for `dst.len()` byte writes (an exclusive borrow), `src` is valid for
    // `n <= src.len()` reads and cannot overlap `dst` (a shared and an exclusive borrow); bytes
    // `0..n` are copied and `n..dst.len()` zeroed, so every byte of `dst` is initialised before
    // it is viewed as `[u8]` of the same length, for the same lifetime.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), p, n);
        std::ptr::write_bytes(p.add(n), 0, dst.len() - n);
        std::slice::from_raw_parts_mut(p, dst.len())
    }
}

/// A piece's digest from its `blocks` block digests ([`block_digest`]), in order: the empty
/// piece's hash for none, the root hash itself for one, else the chaining values merged as
/// blake3's left-balanced tree does (the left subtree takes the largest power of two of blocks
/// below their count, the blocks being of equal power-of-two width but the last).
fn piece_digest(digests: impl Iterator<Item = [u8; 32]>, blocks: usize) -> [u8; 32] {
    fn merge(cvs: &[[u8; 32]]) -> [u8; 32] {
        match cvs {
            [one] => *one,
            _ => {
                let left = 1 << (cvs.len() - 1).ilog2();
                merge_subtrees_non_root(&merge(&cvs[..left]), &merge(&cvs[left..]), Mode::Hash)
            }
        }
    }
    let cvs: Vec<[u8; 32]> = digests.collect();
    debug_assert_eq!(cvs.len(), blocks);
    match cvs.as_slice() {
        [] => *blake3::hash(&[]).as_bytes(),
        [root] => *root,
        _ => {
            let left = 1 << (cvs.len() - 1).ilog2();
            *merge_subtrees_root(&merge(&cvs[..left]), &merge(&cvs[left..]), Mode::Hash).as_bytes()
        }
    }
}

/// Rule 5: the newest version among `headers` (stamp, then the larger group among equal
/// stamps) and how many of them it has.
fn newest(headers: &[Option<&FragmentHeader>]) -> Option<(Version, usize)> {
    let mut best: Option<(Version, usize)> = None;
    for h in headers.iter().flatten() {
        let id = version(h);
        let count = headers
            .iter()
            .flatten()
            .filter(|o| version(o) == id)
            .count();
        let better = match best {
            None => true,
            Some(((s, _, _), c)) => h.stamp > s || (h.stamp == s && count > c),
        };
        if better {
            best = Some((id, count));
        }
    }
    best
}

/// What makes two fragments parts of one version (rule 5): stamp, blob digest, blob length.
type Version = (u64, [u8; 32], u64);

/// A fragment's [`Version`].
fn version(h: &FragmentHeader) -> Version {
    (h.stamp, h.blob_digest, h.blob_len)
}

fn fragment_digest(header_fields: &[u8], piece_digest: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(FRAGMENT_CONTEXT);
    h.update(header_fields);
    h.update(piece_digest);
    *h.finalize().as_bytes()
}

fn write_header(out: &mut [u8], h: &FragmentHeader, piece_digest: &[u8; 32]) {
    // Counts are at most MAX_FRAGMENTS = 256 (checked by every constructor), so u16 holds them.
    let u16le = |v: usize| u16::try_from(v).unwrap_or(u16::MAX).to_le_bytes();
    out[0..4].copy_from_slice(MAGIC);
    out[4] = FORMAT_VERSION;
    out[5] = h.kind.to_byte();
    out[6..8].copy_from_slice(&u16le(h.m));
    out[8..10].copy_from_slice(&u16le(h.k));
    out[10..12].copy_from_slice(&u16le(h.index));
    out[12..14].copy_from_slice(&[0, 0]);
    out[14..22].copy_from_slice(&h.blob_len.to_le_bytes());
    out[22..30].copy_from_slice(&h.stamp.to_le_bytes());
    out[30..62].copy_from_slice(&h.blob_digest);
    let d = fragment_digest(&out[..62], piece_digest);
    out[62..94].copy_from_slice(&d);
}

/// Checks a fragment on its own (rule 4, without a slot): header, length and digest. Returns its
/// header and the digest of its piece. Servers run this on every fragment they store or return.
pub fn verify_fragment(bytes: &[u8]) -> Result<(FragmentHeader, [u8; 32]), FragmentError> {
    let h = check_length(bytes)?;
    let piece_digest = *blake3::hash(&bytes[HEADER_LEN..]).as_bytes();
    check_digest(bytes, &piece_digest)?;
    Ok((h, piece_digest))
}

/// Parses a fragment's header and checks that its payload has the length the header's blob
/// length and M give (rule 4 but the digest and the slot).
fn check_length(bytes: &[u8]) -> Result<FragmentHeader, FragmentError> {
    let h = parse_header(bytes)?;
    let payload = &bytes[HEADER_LEN..];
    let expected = usize::try_from(h.blob_len)
        .ok()
        .map(|l| l.div_ceil(h.m))
        .filter(|&s| s == payload.len());
    if expected.is_none() {
        return Err(FragmentError::Length(format!(
            "{} payload bytes for a blob of {} bytes in {} pieces",
            payload.len(),
            h.blob_len,
            h.m
        )));
    }
    Ok(h)
}

/// Checks the stored digest of a fragment whose header parsed, given its piece's digest.
fn check_digest(bytes: &[u8], piece_digest: &[u8; 32]) -> Result<(), FragmentError> {
    let want = fragment_digest(&bytes[..HEADER_LEN - 32], piece_digest);
    let mut stored = [0u8; 32];
    stored.copy_from_slice(&bytes[HEADER_LEN - 32..HEADER_LEN]);
    // Constant-time comparison through blake3::Hash's PartialEq.
    if blake3::Hash::from(want) != blake3::Hash::from(stored) {
        return Err(FragmentError::Digest);
    }
    Ok(())
}

/// Parses (without checking the digest) a fragment header.
pub fn parse_header(bytes: &[u8]) -> Result<FragmentHeader, FragmentError> {
    if bytes.len() < HEADER_LEN {
        return Err(FragmentError::Length(format!(
            "{} bytes, shorter than the {HEADER_LEN}-byte header",
            bytes.len()
        )));
    }
    if &bytes[0..4] != MAGIC || bytes[4] != FORMAT_VERSION {
        return Err(FragmentError::Format(bytes[4]));
    }
    let u16at = |i: usize| usize::from(u16::from_le_bytes([bytes[i], bytes[i + 1]]));
    let u64at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let kind = CodeKind::from_byte(bytes[5])
        .ok_or_else(|| FragmentError::Header(format!("unknown code kind {}", bytes[5])))?;
    let (m, k, index) = (u16at(6), u16at(8), u16at(10));
    if m == 0 || m + k > MAX_FRAGMENTS || index >= m + k || bytes[12..14] != [0, 0] {
        return Err(FragmentError::Header(format!(
            "M = {m}, K = {k}, index = {index}"
        )));
    }
    let mut blob_digest = [0u8; 32];
    blob_digest.copy_from_slice(&bytes[30..62]);
    Ok(FragmentHeader {
        kind,
        m,
        k,
        index,
        blob_len: u64at(14),
        stamp: u64at(22),
        blob_digest,
    })
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            CodeKind::Replicate => write!(f, "replicate({})", self.total_fragments()),
            CodeKind::Parity => write!(f, "parity({})", self.data_fragments()),
            CodeKind::ReedSolomon => {
                write!(
                    f,
                    "ida({},{})",
                    self.data_fragments(),
                    self.parity_fragments()
                )
            }
        }
    }
}

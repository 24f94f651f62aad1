//! The coding itself: one small trait, [`ErasureCode`], over equal-length pieces, and its three
//! implementations (replication, XOR parity, systematic Reed-Solomon). Framing, digests and
//! striping live in `mod.rs`; the codes here only ever see one stripe of pieces at a time.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use reed_solomon_erasure::galois_8::ReedSolomon;

use super::gf::GfMatrix;
use super::ErasureError;

/// Which code a fragment was made with (stored in every fragment header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodeKind {
    /// Full copies: M = 1, any one of the 1 + K fragments is the blob.
    Replicate,
    /// M data pieces and one XOR parity piece (K = 1).
    Parity,
    /// Systematic Reed-Solomon over GF(2^8): any M of the M + K pieces rebuild the data.
    ReedSolomon,
}

impl CodeKind {
    pub(crate) fn to_byte(self) -> u8 {
        match self {
            CodeKind::Replicate => 0,
            CodeKind::Parity => 1,
            CodeKind::ReedSolomon => 2,
        }
    }

    pub(crate) fn from_byte(b: u8) -> Option<CodeKind> {
        match b {
            0 => Some(CodeKind::Replicate),
            1 => Some(CodeKind::Parity),
            2 => Some(CodeKind::ReedSolomon),
            _ => None,
        }
    }
}

impl fmt::Display for CodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CodeKind::Replicate => "replicate",
            CodeKind::Parity => "parity",
            CodeKind::ReedSolomon => "ida",
        })
    }
}

/// An erasure code over equal-length pieces: `data_pieces()` data pieces (M) and
/// `parity_pieces()` redundant ones (K); any M of the M + K pieces rebuild the others.
///
/// Implementations see one stripe at a time (a few KiB per piece), never a whole blob.
pub trait ErasureCode: Send + Sync + fmt::Debug {
    /// Which code this is.
    fn kind(&self) -> CodeKind;
    /// M: pieces that carry the data.
    fn data_pieces(&self) -> usize;
    /// K: redundant pieces; up to K lost pieces are recoverable.
    fn parity_pieces(&self) -> usize;
    /// Computes the K parity pieces from the M data pieces (all of one length).
    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]);
    /// Rebuilds, in place, the data pieces (indices `< M`) whose `present` flag is false, from at
    /// least M present pieces. Parity pieces are only read. Errors if fewer than M are present.
    fn reconstruct_data(
        &self,
        pieces: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), ErasureError>;
    /// Rebuilds the data pieces `lost` (pairs of index `< M` and output, in any order) from the
    /// pieces at hand, read in place: `pieces[i]` is piece `i` of the M + K if present. The
    /// codec's decoder calls this (no copy of the present pieces first); the default copies
    /// them into scratch pieces for [`ErasureCode::reconstruct_data`].
    fn rebuild_data(
        &self,
        pieces: &[Option<&[u8]>],
        lost: &mut [(usize, &mut [u8])],
    ) -> Result<(), ErasureError> {
        let len = lost.first().map_or(0, |(_, o)| o.len());
        let mut scratch: Vec<Vec<u8>> = pieces
            .iter()
            .map(|p| p.map_or_else(|| vec![0; len], <[u8]>::to_vec))
            .collect();
        let present: Vec<bool> = pieces.iter().map(Option::is_some).collect();
        let mut refs: Vec<&mut [u8]> = scratch.iter_mut().map(|p| &mut p[..]).collect();
        self.reconstruct_data(&mut refs, &present)?;
        for (i, out) in lost.iter_mut() {
            let src = scratch
                .get(*i)
                .filter(|s| s.len() == out.len())
                .ok_or_else(|| {
                    ErasureError::BadParameters(format!("no data piece {i} of {} bytes", out.len()))
                })?;
            out.copy_from_slice(src);
        }
        Ok(())
    }
}

fn too_few(have: usize, need: usize) -> ErasureError {
    ErasureError::TooFewFragments {
        have,
        need,
        corrupt: Vec::new(),
        missing: Vec::new(),
    }
}

/// Plain replication: M = 1 and K = R - 1 copies.
#[derive(Debug, Clone)]
pub struct Replication {
    copies: usize,
}

impl Replication {
    /// R full copies (R ≥ 1).
    pub fn new(copies: usize) -> Result<Self, ErasureError> {
        if copies == 0 || copies > super::MAX_FRAGMENTS {
            return Err(ErasureError::BadParameters(format!(
                "replication needs 1..={} copies, got {copies}",
                super::MAX_FRAGMENTS
            )));
        }
        Ok(Self { copies })
    }
}

impl ErasureCode for Replication {
    fn kind(&self) -> CodeKind {
        CodeKind::Replicate
    }
    fn data_pieces(&self) -> usize {
        1
    }
    fn parity_pieces(&self) -> usize {
        self.copies - 1
    }
    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        for p in parity.iter_mut() {
            p.copy_from_slice(data[0]);
        }
    }
    fn reconstruct_data(
        &self,
        pieces: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), ErasureError> {
        if present[0] {
            return Ok(());
        }
        let Some(src) = present.iter().position(|&p| p) else {
            return Err(too_few(0, 1));
        };
        let (first, rest) = pieces.split_at_mut(1);
        first[0].copy_from_slice(rest[src - 1]);
        Ok(())
    }
    fn rebuild_data(
        &self,
        pieces: &[Option<&[u8]>],
        lost: &mut [(usize, &mut [u8])],
    ) -> Result<(), ErasureError> {
        let Some(src) = pieces.iter().flatten().next() else {
            return Err(too_few(0, 1));
        };
        for (i, out) in lost.iter_mut() {
            if *i != 0 || out.len() != src.len() {
                return Err(ErasureError::BadParameters(format!(
                    "replication rebuilds piece 0 of {} bytes, asked for piece {i} of {}",
                    src.len(),
                    out.len()
                )));
            }
            out.copy_from_slice(src);
        }
        Ok(())
    }
}

/// XOR parity over M data pieces plus one parity piece (paper 003, "Parity").
#[derive(Debug, Clone)]
pub struct XorParity {
    m: usize,
}

impl XorParity {
    /// M data pieces (M ≥ 1) and one parity piece.
    pub fn new(m: usize) -> Result<Self, ErasureError> {
        if m == 0 || m + 1 > super::MAX_FRAGMENTS {
            return Err(ErasureError::BadParameters(format!(
                "parity needs 1..={} data slices, got {m}",
                super::MAX_FRAGMENTS - 1
            )));
        }
        Ok(Self { m })
    }
}

/// `dst ^= src`, eight bytes at a time (the compiler widens this to the vector width).
pub(crate) fn xor_into(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d8, s8) in d.by_ref().zip(s.by_ref()) {
        // Both chunks are exactly 8 bytes long (chunks_exact), so the conversions cannot fail.
        let x = u64::from_ne_bytes(d8.try_into().unwrap_or([0; 8]))
            ^ u64::from_ne_bytes(s8.try_into().unwrap_or([0; 8]));
        d8.copy_from_slice(&x.to_ne_bytes());
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a ^= *b;
    }
}

/// `out = ins[0] ^ ins[1] ^ ...` (zeros for no input) in one pass: 64 bytes of every input
/// XORed in registers, then stored once, rather than `out` read and written once per input.
/// Inputs must be `out`'s length (checked by the callers).
pub(crate) fn xor_all<'a>(ins: impl Iterator<Item = &'a [u8]> + Clone, out: &mut [u8]) {
    const STEP: usize = 64;
    let full = out.len() - out.len() % STEP;
    for (c, dst) in out[..full].chunks_exact_mut(STEP).enumerate() {
        let off = c * STEP;
        let mut acc = [0u64; STEP / 8];
        for input in ins.clone() {
            let src = &input[off..off + STEP];
            for (a, w) in acc.iter_mut().zip(src.chunks_exact(8)) {
                // Exactly 8 bytes (chunks_exact), so the conversion cannot fail.
                *a ^= u64::from_ne_bytes(w.try_into().unwrap_or([0; 8]));
            }
        }
        for (d, a) in dst.chunks_exact_mut(8).zip(acc) {
            d.copy_from_slice(&a.to_ne_bytes());
        }
    }
    for (b, d) in out[full..].iter_mut().enumerate() {
        *d = ins.clone().fold(0, |x, input| x ^ input[full + b]);
    }
}

impl ErasureCode for XorParity {
    fn kind(&self) -> CodeKind {
        CodeKind::Parity
    }
    fn data_pieces(&self) -> usize {
        self.m
    }
    fn parity_pieces(&self) -> usize {
        1
    }
    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        let p = &mut *parity[0];
        // Equal lengths are the caller's (mod.rs) to keep; a shorter piece would be a bug.
        debug_assert!(data.iter().all(|d| d.len() == p.len()));
        let len = p.len();
        xor_all(data.iter().copied().filter(|d| d.len() == len), p);
    }
    fn reconstruct_data(
        &self,
        pieces: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), ErasureError> {
        let have = present.iter().filter(|&&p| p).count();
        let lost: Vec<usize> = (0..self.m).filter(|&i| !present[i]).collect();
        match lost.as_slice() {
            [] => Ok(()),
            [j] if have >= self.m => {
                let j = *j;
                // The lost piece is the XOR of every other piece, parity included.
                let out = std::mem::take(&mut pieces[j]);
                out.fill(0);
                for (i, p) in pieces.iter().enumerate() {
                    if i != j {
                        xor_into(out, p);
                    }
                }
                pieces[j] = out;
                Ok(())
            }
            _ => Err(too_few(have, self.m)),
        }
    }
    fn rebuild_data(
        &self,
        pieces: &[Option<&[u8]>],
        lost: &mut [(usize, &mut [u8])],
    ) -> Result<(), ErasureError> {
        let have = pieces.iter().flatten().count();
        match lost {
            [] => Ok(()),
            // The lost piece is the XOR of every other piece, parity included, read in place.
            [(j, out)] if have >= self.m && pieces.get(*j).is_some_and(Option::is_none) => {
                if let Some(p) = pieces.iter().flatten().find(|p| p.len() != out.len()) {
                    return Err(ErasureError::BadParameters(format!(
                        "a piece of {} bytes, expected {}",
                        p.len(),
                        out.len()
                    )));
                }
                xor_all(pieces.iter().flatten().copied(), out);
                Ok(())
            }
            _ => Err(too_few(have, self.m)),
        }
    }
}

/// Systematic Reed-Solomon over GF(2^8) (paper 003's IDA with the Malluhi-Johnston
/// diagonalised matrix): the `reed-solomon-erasure` crate's matrix is a Vandermonde matrix with
/// distinct points multiplied by the inverse of its top M×M square, so its top is the identity
/// (data pieces are copied, not coded) and every M×M submatrix is invertible (MDS).
///
/// The K parity rows of that matrix are read off the crate once (encoding M one-byte unit
/// pieces), and encoding and rebuilding apply them, or the inverse of the rows of M present
/// pieces, with [`GfMatrix`] (`gf.rs`: GFNI when the CPU has it), so the bytes are the crate's.
pub struct ReedSolomonCode {
    m: usize,
    /// The K×M parity rows.
    parity: GfMatrix,
    /// The last rebuild's decoder (rebuilds come block by block with one pattern of present
    /// pieces): which pieces were present, the M it reads, and the rows giving each data piece.
    decoder: Mutex<Option<Arc<Decoder>>>,
}

/// How to rebuild data pieces from one pattern of present pieces.
#[derive(Debug)]
struct Decoder {
    present: Vec<bool>,
    /// The M present pieces read, in index order.
    sources: Vec<usize>,
    /// M×M: row `i` gives data piece `i` from `sources`.
    rows: GfMatrix,
    /// The data pieces not present, and their rows of `rows` (what a rebuild asks for).
    lost: Vec<usize>,
    lost_rows: GfMatrix,
}

impl fmt::Debug for ReedSolomonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReedSolomon({}, {})", self.m, self.parity.rows())
    }
}

impl ReedSolomonCode {
    /// M data and K parity pieces: M ≥ 1, K ≥ 1, M + K ≤ 256.
    pub fn new(m: usize, k: usize) -> Result<Self, ErasureError> {
        if m == 0 || k == 0 || m + k > super::MAX_FRAGMENTS {
            return Err(ErasureError::BadParameters(format!(
                "ida needs M ≥ 1, K ≥ 1 and M + K ≤ {}, got M = {m}, K = {k}",
                super::MAX_FRAGMENTS
            )));
        }
        let rs: ReedSolomon = ReedSolomon::new(m, k)
            .map_err(|e| ErasureError::BadParameters(format!("ida({m},{k}): {e:?}")))?;
        // Column j of the parity rows: the parity of data piece j = [1], the others [0].
        let mut coefs = vec![0u8; k * m];
        for j in 0..m {
            let data: Vec<[u8; 1]> = (0..m).map(|i| [u8::from(i == j)]).collect();
            let mut parity = vec![[0u8; 1]; k];
            rs.encode_sep(&data, &mut parity)
                .map_err(|e| ErasureError::BadParameters(format!("ida({m},{k}): {e:?}")))?;
            for (r, p) in parity.iter().enumerate() {
                coefs[r * m + j] = p[0];
            }
        }
        Ok(Self {
            m,
            parity: GfMatrix::new(k, m, coefs),
            decoder: Mutex::new(None),
        })
    }

    /// The decoder for `present` (cached for the next block), or too few pieces.
    fn decoder(&self, present: &[bool]) -> Result<Arc<Decoder>, ErasureError> {
        let mut cached = self.decoder.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(d) = cached.as_ref().filter(|d| d.present == present) {
            return Ok(Arc::clone(d));
        }
        let have = present.iter().filter(|&&p| p).count();
        if have < self.m || present.len() != self.m + self.parity.rows() {
            return Err(too_few(have, self.m));
        }
        let sources: Vec<usize> = (0..present.len())
            .filter(|&i| present[i])
            .take(self.m)
            .collect();
        // The rows of the whole matrix (identity on top, parity below) of the sources.
        let mut coefs = vec![0u8; self.m * self.m];
        for (t, &i) in sources.iter().enumerate() {
            let row = &mut coefs[t * self.m..(t + 1) * self.m];
            if i < self.m {
                row[i] = 1;
            } else {
                row.copy_from_slice(self.parity.row(i - self.m));
            }
        }
        let rows = GfMatrix::new(self.m, self.m, coefs)
            .inverse()
            .ok_or_else(|| {
                ErasureError::Inconsistent("a singular Reed-Solomon submatrix".into())
            })?;
        let lost: Vec<usize> = (0..self.m).filter(|&i| !present[i]).collect();
        let d = Arc::new(Decoder {
            present: present.to_vec(),
            sources,
            lost_rows: rows.select(&lost),
            lost,
            rows,
        });
        *cached = Some(Arc::clone(&d));
        Ok(d)
    }
}

impl ErasureCode for ReedSolomonCode {
    fn kind(&self) -> CodeKind {
        CodeKind::ReedSolomon
    }
    fn data_pieces(&self) -> usize {
        self.m
    }
    fn parity_pieces(&self) -> usize {
        self.parity.rows()
    }
    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        // Counts and lengths are fixed by the caller (mod.rs), so this cannot fail; a failure
        // would be a bug, and it shows up as a digest mismatch on decode, never as wrong data.
        let r = self.parity.mul_into(data, parity);
        debug_assert!(r.is_ok(), "{r:?}");
    }
    fn reconstruct_data(
        &self,
        pieces: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), ErasureError> {
        let mut ins: Vec<Option<&[u8]>> = Vec::with_capacity(pieces.len());
        let mut lost: Vec<(usize, &mut [u8])> = Vec::new();
        for (i, p) in pieces.iter_mut().enumerate() {
            if present.get(i).copied().unwrap_or(false) {
                ins.push(Some(&**p));
            } else {
                ins.push(None);
                if i < self.m {
                    lost.push((i, &mut **p));
                }
            }
        }
        self.rebuild_data(&ins, &mut lost)
    }
    fn rebuild_data(
        &self,
        pieces: &[Option<&[u8]>],
        lost: &mut [(usize, &mut [u8])],
    ) -> Result<(), ErasureError> {
        if lost.is_empty() {
            return Ok(());
        }
        let present: Vec<bool> = pieces.iter().map(Option::is_some).collect();
        let d = self.decoder(&present)?;
        let ins: Vec<&[u8]> = d.sources.iter().filter_map(|&i| pieces[i]).collect();
        let wanted: Vec<usize> = lost.iter().map(|(i, _)| *i).collect();
        if wanted.iter().any(|&i| i >= self.m) {
            return Err(ErasureError::BadParameters(format!(
                "only data pieces are rebuilt, asked for {wanted:?}"
            )));
        }
        let mut outs: Vec<&mut [u8]> = lost.iter_mut().map(|(_, o)| &mut **o).collect();
        if wanted == d.lost {
            d.lost_rows.mul_into(&ins, &mut outs)
        } else {
            d.rows.select(&wanted).mul_into(&ins, &mut outs)
        }
    }
}

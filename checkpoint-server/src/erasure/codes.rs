//! The coding itself: one small trait, [`ErasureCode`], over equal-length pieces, and its three
//! implementations (replication, XOR parity, systematic Reed-Solomon). Framing, digests and
//! striping live in `mod.rs`; the codes here only ever see one stripe of pieces at a time.

use std::fmt;

use reed_solomon_erasure::galois_8::ReedSolomon;

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
        p.copy_from_slice(data[0]);
        for d in &data[1..] {
            xor_into(p, d);
        }
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
}

/// Systematic Reed-Solomon over GF(2^8) (paper 003's IDA with the Malluhi-Johnston
/// diagonalised matrix): the `reed-solomon-erasure` crate's matrix is a Vandermonde matrix with
/// distinct points multiplied by the inverse of its top M×M square, so its top is the identity
/// (data pieces are copied, not coded) and every M×M submatrix is invertible (MDS).
pub struct ReedSolomonCode {
    rs: ReedSolomon,
}

impl fmt::Debug for ReedSolomonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ReedSolomon({}, {})",
            self.rs.data_shard_count(),
            self.rs.parity_shard_count()
        )
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
        let rs = ReedSolomon::new(m, k)
            .map_err(|e| ErasureError::BadParameters(format!("ida({m},{k}): {e:?}")))?;
        Ok(Self { rs })
    }
}

impl ErasureCode for ReedSolomonCode {
    fn kind(&self) -> CodeKind {
        CodeKind::ReedSolomon
    }
    fn data_pieces(&self) -> usize {
        self.rs.data_shard_count()
    }
    fn parity_pieces(&self) -> usize {
        self.rs.parity_shard_count()
    }
    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        // Counts and lengths are fixed by the caller (mod.rs), so this cannot fail; a failure
        // would be a bug, and it shows up as a digest mismatch on decode, never as wrong data.
        let r = self.rs.encode_sep(data, parity);
        debug_assert!(r.is_ok(), "{r:?}");
    }
    fn reconstruct_data(
        &self,
        pieces: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), ErasureError> {
        let have = present.iter().filter(|&&p| p).count();
        let need = self.data_pieces();
        if have < need {
            return Err(too_few(have, need));
        }
        let mut shards: Vec<(&mut [u8], bool)> = pieces
            .iter_mut()
            .zip(present)
            .map(|(p, &ok)| (&mut **p, ok))
            .collect();
        self.rs
            .reconstruct_data(&mut shards)
            .map_err(|e| ErasureError::BadParameters(format!("reconstruct: {e:?}")))
    }
}

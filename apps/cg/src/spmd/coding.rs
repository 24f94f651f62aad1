//! Encoding the workers' checkpoint pieces across the encoder vnodes (module rule 3), and
//! rebuilding lost pieces from the encoding plus the survivors' pieces (rule 6).
//!
//! Exact codes go through the checkpoint crate's [`ErasureCode`] trait (XOR parity, and
//! systematic Reed-Solomon over GF(2^8) wrapping `reed-solomon-erasure`): pieces are zero-padded
//! to the longest one and coded column stripe by column stripe ([`STRIPE`] bytes per piece), so
//! a stripe of every piece stays in cache. The floating-point checksum sums the workers' x, r,
//! p (zero-padded) in worker order, and rebuilds by subtraction: not exact.

use veriflow_checkpoint::erasure::ErasureCode;

use super::SpmdError;
use crate::kernel::BlockState;

/// Bytes per piece coded at a time: 64 KiB of each of a few pieces and their parity fit in L2.
pub(crate) const STRIPE: usize = 64 * 1024;

/// The K parity pieces of `pieces` (of any lengths, zero-padded to `len`).
pub(crate) fn encode_exact(code: &dyn ErasureCode, pieces: &[Vec<u8>], len: usize) -> Vec<Vec<u8>> {
    let k = code.parity_pieces();
    let mut parity = vec![vec![0u8; len]; k];
    let mut scratch: Vec<Vec<u8>> = pieces.iter().map(|_| Vec::new()).collect();
    let mut off = 0;
    while off < len {
        let end = (off + STRIPE).min(len);
        for (p, s) in pieces.iter().zip(scratch.iter_mut()) {
            if p.len() < end {
                // A short piece: its stripe, padded with zeros.
                s.clear();
                s.extend_from_slice(p.get(off..).unwrap_or(&[]));
                s.resize(end - off, 0);
            }
        }
        let data: Vec<&[u8]> = pieces
            .iter()
            .zip(&scratch)
            .map(|(p, s)| if p.len() >= end { &p[off..end] } else { &s[..] })
            .collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|q| &mut q[off..end]).collect();
        code.encode(&data, &mut outs);
        off = end;
    }
    parity
}

/// Rebuilds the pieces `pieces[i] == None` (data slots `0..M`) from the present ones and the
/// parity slots `parity[j]`; returns all M data pieces, each truncated to `lens[i]`.
pub(crate) fn rebuild_exact(
    code: &dyn ErasureCode,
    pieces: Vec<Option<Vec<u8>>>,
    parity: Vec<Option<Vec<u8>>>,
    lens: &[usize],
) -> Result<Vec<Vec<u8>>, SpmdError> {
    let len = lens.iter().copied().max().unwrap_or(0);
    let mut present = Vec::with_capacity(pieces.len() + parity.len());
    let mut all: Vec<Vec<u8>> = Vec::with_capacity(pieces.len() + parity.len());
    for (i, p) in pieces.into_iter().chain(parity).enumerate() {
        present.push(p.is_some());
        let mut v = p.unwrap_or_default();
        if v.len() > len {
            return Err(SpmdError::Protocol(format!(
                "piece {i} of {} bytes is longer than the {len} of the encoding",
                v.len()
            )));
        }
        v.resize(len, 0);
        all.push(v);
    }
    let mut refs: Vec<&mut [u8]> = all.iter_mut().map(|v| &mut v[..]).collect();
    code.reconstruct_data(&mut refs, &present)
        .map_err(|e| SpmdError::Decode(e.to_string()))?;
    all.truncate(lens.len());
    for (v, &l) in all.iter_mut().zip(lens) {
        v.truncate(l);
    }
    Ok(all)
}

/// The x, r, p of a block state's bytes (kernel rule 4 layout), as f64 words after the header.
fn vectors(piece: &[u8]) -> Result<(usize, &[u8]), SpmdError> {
    let rows = (piece.len().checked_sub(24))
        .filter(|l| l % 24 == 0)
        .map(|l| l / 24)
        .ok_or_else(|| SpmdError::Protocol(format!("a piece of {} bytes", piece.len())))?;
    Ok((rows, &piece[24..]))
}

fn word(b: &[u8], i: usize) -> f64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[8 * i..8 * i + 8]);
    f64::from_bits(u64::from_le_bytes(w))
}

/// The floating-point checksum: for each of x, r, p, the sum over workers in order of their
/// (zero-padded) vectors, `3 * max_rows` f64 as little-endian bytes.
pub(crate) fn encode_float_sum(pieces: &[Vec<u8>], max_rows: usize) -> Result<Vec<u8>, SpmdError> {
    let mut sum = vec![0.0f64; 3 * max_rows];
    for p in pieces {
        let (rows, v) = vectors(p)?;
        for t in 0..3 {
            for i in 0..rows {
                sum[t * max_rows + i] += word(v, t * rows + i);
            }
        }
    }
    Ok(super::wire::f64_bytes(&sum))
}

/// Rebuilds a lost piece of `rows` rows from the checksum `sum` and every other worker's piece
/// (`survivors`, in worker order): lost = sum - each survivor in order. The header (iteration,
/// rho: scalars) is copied from the first survivor.
pub(crate) fn rebuild_float_sum(
    sum: &[u8],
    survivors: &[Vec<u8>],
    rows: usize,
) -> Result<Vec<u8>, SpmdError> {
    let s = super::wire::bytes_f64(sum)?;
    if s.len() % 3 != 0 || s.len() / 3 < rows {
        return Err(SpmdError::Protocol(format!(
            "a checksum of {} values for a block of {rows} rows",
            s.len()
        )));
    }
    let max_rows = s.len() / 3;
    let head = survivors
        .first()
        .ok_or_else(|| SpmdError::Decode("no survivor holds the scalars".into()))?;
    let mut lost: Vec<f64> = (0..3)
        .flat_map(|t| s[t * max_rows..t * max_rows + rows].iter().copied())
        .collect();
    for p in survivors {
        let (prow, v) = vectors(p)?;
        for t in 0..3 {
            for i in 0..rows.min(prow) {
                lost[t * rows + i] -= word(v, t * prow + i);
            }
        }
    }
    let mut out = Vec::with_capacity(BlockState::encoded_len(rows));
    out.extend_from_slice(&head[..16]);
    out.extend_from_slice(&(rows as u64).to_le_bytes());
    out.extend_from_slice(&super::wire::f64_bytes(&lost));
    Ok(out)
}

/// ‖recovered − truth‖ / ‖truth‖ over x, r, p of two pieces of the same rows (0 when equal
/// bits; NaN when they do not parse).
pub(crate) fn relative_error(recovered: &[u8], truth: &[u8]) -> f64 {
    match (vectors(recovered), vectors(truth)) {
        (Ok((a, va)), Ok((b, vb))) if a == b => {
            let (mut d, mut t) = (0.0f64, 0.0f64);
            for i in 0..3 * a {
                let (x, y) = (word(va, i), word(vb, i));
                d += (x - y) * (x - y);
                t += y * y;
            }
            if t > 0.0 {
                (d / t).sqrt()
            } else {
                d.sqrt()
            }
        }
        _ => f64::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use veriflow_checkpoint::erasure::{ReedSolomonCode, XorParity};

    fn pieces() -> Vec<Vec<u8>> {
        [5usize, 3, 4]
            .iter()
            .enumerate()
            .map(|(w, &rows)| {
                let v = |s: f64| (0..rows).map(|i| s + i as f64 / 7.0).collect::<Vec<_>>();
                BlockState {
                    iteration: 9,
                    rho: 0.25,
                    x: v(w as f64),
                    r: v(1.0 / (w as f64 + 3.0)),
                    p: v(-2.5),
                }
                .to_bytes()
            })
            .collect()
    }

    #[test]
    fn exact_codes_rebuild_unequal_pieces_bit_for_bit() {
        let ps = pieces();
        let lens: Vec<usize> = ps.iter().map(Vec::len).collect();
        let len = *lens.iter().max().unwrap();
        let xor = XorParity::new(3).unwrap();
        let par = encode_exact(&xor, &ps, len);
        for lost in 0..3 {
            let mut have: Vec<Option<Vec<u8>>> = ps.iter().cloned().map(Some).collect();
            have[lost] = None;
            let got =
                rebuild_exact(&xor, have, par.iter().cloned().map(Some).collect(), &lens).unwrap();
            assert_eq!(got, ps);
        }
        let rs = ReedSolomonCode::new(3, 2).unwrap();
        let par = encode_exact(&rs, &ps, len);
        let mut have: Vec<Option<Vec<u8>>> = ps.iter().cloned().map(Some).collect();
        have[0] = None;
        have[2] = None;
        let got = rebuild_exact(
            &rs,
            have.clone(),
            par.iter().cloned().map(Some).collect(),
            &lens,
        )
        .unwrap();
        assert_eq!(got, ps);
        // Three lost of three + two: an error, not a guess.
        have[1] = None;
        assert!(rebuild_exact(&rs, have, par.into_iter().map(Some).collect(), &lens).is_err());
    }

    #[test]
    fn float_sum_rebuilds_approximately_with_the_scalars_copied() {
        let ps = pieces();
        let sum = encode_float_sum(&ps, 5).unwrap();
        let got = rebuild_float_sum(&sum, &[ps[0].clone(), ps[2].clone()], 3).unwrap();
        let a = BlockState::from_bytes(&got).unwrap();
        let b = BlockState::from_bytes(&ps[1]).unwrap();
        assert_eq!(
            (a.iteration, a.rho.to_bits()),
            (b.iteration, b.rho.to_bits())
        );
        let e = relative_error(&got, &ps[1]);
        assert!(e < 1e-14, "{e}");
        assert_eq!(relative_error(&ps[1], &ps[1]), 0.0);
        assert!(rebuild_float_sum(&sum[..8], &ps, 3).is_err());
    }
}

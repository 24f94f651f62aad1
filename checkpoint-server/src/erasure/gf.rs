//! Matrices over GF(2^8) applied to pieces: the inner loop of Reed-Solomon encoding and
//! rebuilding (`codes.rs`). `outs[r] = Σ_j c[r][j] · ins[j]`, byte by byte, in the field of
//! the `reed-solomon-erasure` crate (its `galois_8`: polynomial x^8 + x^4 + x^3 + x^2 + 1).
//!
//! Multiplying by a constant `c` is linear over GF(2), so it is an 8×8 bit matrix, and x86's
//! GFNI instruction `vgf2p8affineqb` applies such a matrix to 64 bytes at once. With AVX-512
//! and GFNI (checked at run time) every input byte is loaded once per 64-byte column and
//! multiplied into every output's accumulator in registers, and every output byte is stored
//! once; elsewhere the crate's `mul_slice` / `mul_slice_xor` run row by row. Both give the same
//! bytes (tested); the kernel is the module's one `unsafe` block besides `fill` in `mod.rs`.
//! Measured on the 2-core AVX-512 Xeon VM under load 5-9 (`paper storage`'s code alone,
//! median of 5 runs interleaved with the crate's): ida(8,2) encode 2.8-3.6x, rebuild 2.5-3.1x.

use reed_solomon_erasure::galois_8;

use super::ErasureError;

/// A `rows × cols` matrix over GF(2^8), with each coefficient's GFNI bit matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GfMatrix {
    rows: usize,
    cols: usize,
    /// Row-major coefficients.
    coefs: Vec<u8>,
    /// Row-major: the 8×8 bit matrix of multiplying by each coefficient ([`affine`]).
    affine: Vec<u64>,
}

impl GfMatrix {
    /// The matrix of `rows` rows of `cols` coefficients, row-major.
    pub(crate) fn new(rows: usize, cols: usize, coefs: Vec<u8>) -> Self {
        debug_assert_eq!(coefs.len(), rows * cols);
        let affine = coefs.iter().map(|&c| affine(c)).collect();
        Self {
            rows,
            cols,
            coefs,
            affine,
        }
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Row `r`'s coefficients.
    pub(crate) fn row(&self, r: usize) -> &[u8] {
        &self.coefs[r * self.cols..(r + 1) * self.cols]
    }

    fn at(&self, r: usize, c: usize) -> u8 {
        self.coefs[r * self.cols + c]
    }

    /// The matrix of rows `rows` of this one, in that order.
    pub(crate) fn select(&self, rows: &[usize]) -> Self {
        let coefs = rows
            .iter()
            .flat_map(|&r| {
                self.coefs[r * self.cols..(r + 1) * self.cols]
                    .iter()
                    .copied()
            })
            .collect();
        Self::new(rows.len(), self.cols, coefs)
    }

    /// The inverse of this square matrix (Gauss-Jordan), `None` if it is singular.
    pub(crate) fn inverse(&self) -> Option<Self> {
        let n = self.rows;
        if n != self.cols {
            return None;
        }
        // [A | I], reduced to [I | A^-1].
        let w = 2 * n;
        let mut a = vec![0u8; n * w];
        for r in 0..n {
            a[r * w..r * w + n].copy_from_slice(&self.coefs[r * n..(r + 1) * n]);
            a[r * w + n + r] = 1;
        }
        for col in 0..n {
            let pivot = (col..n).find(|&r| a[r * w + col] != 0)?;
            for c in 0..w {
                a.swap(col * w + c, pivot * w + c);
            }
            let p = a[col * w + col];
            for c in 0..w {
                a[col * w + c] = galois_8::div(a[col * w + c], p);
            }
            for r in (0..n).filter(|&r| r != col) {
                let f = a[r * w + col];
                if f != 0 {
                    for c in 0..w {
                        a[r * w + c] ^= galois_8::mul(f, a[col * w + c]);
                    }
                }
            }
        }
        let coefs = (0..n)
            .flat_map(|r| a[r * w + n..(r + 1) * w].to_vec())
            .collect();
        Some(Self::new(n, n, coefs))
    }

    /// `outs[r] = Σ_j self[r][j] · ins[j]` for every row `r`: one input per column, one output
    /// per row, all of one length (else [`ErasureError::BadParameters`], a caller bug).
    pub(crate) fn mul_into(
        &self,
        ins: &[&[u8]],
        outs: &mut [&mut [u8]],
    ) -> Result<(), ErasureError> {
        self.check(ins, outs)?;
        if simd() {
            self.mul_gfni(ins, outs);
        } else {
            self.mul_portable(ins, outs);
        }
        Ok(())
    }

    fn check(&self, ins: &[&[u8]], outs: &[&mut [u8]]) -> Result<(), ErasureError> {
        let len = outs.first().map_or(0, |o| o.len());
        if ins.len() != self.cols
            || outs.len() != self.rows
            || ins.iter().any(|i| i.len() != len)
            || outs.iter().any(|o| o.len() != len)
        {
            return Err(ErasureError::BadParameters(format!(
                "a {}x{} matrix applied to {} inputs and {} outputs of unequal lengths or counts",
                self.rows,
                self.cols,
                ins.len(),
                outs.len()
            )));
        }
        Ok(())
    }

    /// The crate's row-by-row products (any CPU).
    pub(crate) fn mul_portable(&self, ins: &[&[u8]], outs: &mut [&mut [u8]]) {
        // The crate's slice products index their first byte: nothing to do is done here.
        if outs.iter().all(|o| o.is_empty()) {
            return;
        }
        for (r, out) in outs.iter_mut().enumerate() {
            for (j, input) in ins.iter().enumerate() {
                if j == 0 {
                    galois_8::mul_slice(self.at(r, j), input, out);
                } else {
                    galois_8::mul_slice_xor(self.at(r, j), input, out);
                }
            }
            if ins.is_empty() {
                out.fill(0);
            }
        }
    }

    /// The GFNI kernel; the caller checked [`simd`] and the lengths ([`Self::check`]).
    #[cfg(target_arch = "x86_64")]
    fn mul_gfni(&self, ins: &[&[u8]], outs: &mut [&mut [u8]]) {
        // SAFETY: `simd()` returned true, so the CPU has AVX-512F, AVX-512BW and GFNI, the
        // features `kernel` is compiled for; `check` passed, so there is one input per column
        // and one output per row, all of one length, as `kernel` requires.
        unsafe { kernel(&self.affine, self.cols, ins, outs) }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn mul_gfni(&self, ins: &[&[u8]], outs: &mut [&mut [u8]]) {
        self.mul_portable(ins, outs);
    }
}

/// Whether the GFNI kernel runs on this CPU (checked once, then cached by `std`).
pub(crate) fn simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("gfni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The 8×8 bit matrix of `x ↦ c · x` in `vgf2p8affineqb`'s layout: byte `7 - i` is the row
/// giving bit `i` of the product, and its bit `j` is bit `i` of `c · 2^j`.
fn affine(c: u8) -> u64 {
    let mut m = 0u64;
    for i in 0..8 {
        let mut row = 0u8;
        for j in 0..8 {
            row |= ((galois_8::mul(c, 1 << j) >> i) & 1) << j;
        }
        m |= u64::from(row) << (8 * (7 - i));
    }
    m
}

/// Outputs accumulated side by side: each input column is loaded once per this many outputs.
#[cfg(target_arch = "x86_64")]
const OUTPUTS_PER_PASS: usize = 4;

/// `outs[r] = Σ_j affine[r·cols + j] · ins[j]`, 64 bytes at a time (a masked load and store
/// for the last, shorter column).
///
/// # Safety
///
/// The CPU supports AVX-512F, AVX-512BW and GFNI; `ins.len() == cols`,
/// `affine.len() == outs.len() * cols`, and every input and output has `outs[0]`'s length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,gfni")]
unsafe fn kernel(affine: &[u64], cols: usize, ins: &[&[u8]], outs: &mut [&mut [u8]]) {
    use std::arch::x86_64::*;
    let len = outs.first().map_or(0, |o| o.len());
    for (g, group) in outs.chunks_mut(OUTPUTS_PER_PASS).enumerate() {
        let base = g * OUTPUTS_PER_PASS;
        let mut off = 0;
        while off < len {
            let n = (len - off).min(64);
            let mask: u64 = if n == 64 { u64::MAX } else { (1 << n) - 1 };
            let mut acc = [_mm512_setzero_si512(); OUTPUTS_PER_PASS];
            for (j, input) in ins.iter().enumerate() {
                // SAFETY: `off + n <= len == input.len()`, and the mask only reads those
                // `n` bytes.
                let x = unsafe { _mm512_maskz_loadu_epi8(mask, input.as_ptr().add(off).cast()) };
                for (r, a) in acc.iter_mut().enumerate().take(group.len()) {
                    let m = _mm512_set1_epi64(affine[(base + r) * cols + j] as i64);
                    *a = _mm512_xor_si512(*a, _mm512_gf2p8affine_epi64_epi8::<0>(x, m));
                }
            }
            for (o, a) in group.iter_mut().zip(acc) {
                // SAFETY: `off + n <= len == o.len()`, an exclusive borrow; the mask writes
                // only those `n` bytes.
                unsafe { _mm512_mask_storeu_epi8(o.as_mut_ptr().add(off).cast(), mask, a) };
            }
            off += 64;
        }
    }
}

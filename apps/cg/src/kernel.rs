//! The numerical kernel: SpMV, dot products and conjugate gradient, laid out by row blocks so
//! that the sequential solver, the data-flow tasks and a worker owning one row block all run the
//! same code and get the same bits.
//!
//! Rules:
//!
//! 1. **Blocks.** [`Partition`] cuts n rows into B contiguous blocks, block b being rows
//!    `b*n/B .. (b+1)*n/B`. Everything per block works on a [`CsrRows`] view and slices of that
//!    block.
//! 2. **Fixed-order reductions.** A block's dot product accumulates in four lanes, element i
//!    (counted from the block's first row) into lane `i % 4`, and returns
//!    `(l0 + l1) + (l2 + l3)` ([`dot`]). A global dot product is the sum of the blocks' partials
//!    in block order, left to right ([`sum_ordered`]). The fused kernels ([`spmv_dot`],
//!    [`update`]) accumulate in the same lanes and order, so they equal the unfused ones bit for
//!    bit. No fused multiply-add: Rust never contracts `a * b + c`. Hence the result depends on
//!    B but not on who computes a block, when, or how many times.
//! 3. **Iteration** (Hestenes-Stiefel CG from x0 = 0, the form of
//!    `scipy.sparse.linalg.cg`): r0 = p0 = b, rho0 = r0.r0; at iteration k, stop if
//!    [`converged`]`(rho_k, rtol * |b|)` or k = max_iter; else q = A p, alpha = rho_k / p.q,
//!    x += alpha p, r -= alpha q, rho_{k+1} = r.r, beta = rho_{k+1} / rho_k, p = r + beta p.
//!    p.q <= 0 (or not finite) is a breakdown: A is not positive definite ([`CgError`]).
//! 4. **Block state.** [`BlockState`] is what a worker owning a block must keep between
//!    iterations: x, r, p of its rows, the global rho and the iteration number.
//!    [`BlockState::to_bytes`] is an exact, fixed layout (below), so a state can be XORed or
//!    Reed-Solomon coded with others and rebuilt bit for bit.
//! 5. **Rows.** Row i of A x is `0.0 + v0 x[c0] + v1 x[c1] + ...` in the row's stored column
//!    order, one accumulator, no reordering ([`spmv`], [`spmv_dot`] share one row loop). A row
//!    of 7 entries (a 7-point stencil's interior row: 94% of `poisson3d:100`'s) is added
//!    without a loop, which took 3-5% off an SpMV's CPU time there (session 34, interleaved
//!    with the plain loop); the order is the same, so the bits are (tested against the plain
//!    loop on random matrices).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::matrix::{Csr, CsrRows};

/// Contiguous row blocks (rule 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// Rows.
    pub n: usize,
    /// Blocks (at least 1).
    pub blocks: usize,
}

impl Partition {
    /// `blocks` blocks of `n` rows (a block count of 0 is taken as 1).
    pub fn new(n: usize, blocks: usize) -> Partition {
        Partition {
            n,
            blocks: blocks.max(1),
        }
    }

    /// Rows of block `b`.
    pub fn range(&self, b: usize) -> Range<usize> {
        let at = |b: usize| muldiv(b, self.n, self.blocks);
        at(b)..at(b + 1)
    }

    /// The block that holds row `row`.
    pub fn block_of(&self, row: usize) -> usize {
        // The first block whose end is past `row`; ranges are monotone, so a guess and a fix-up.
        let mut b = muldiv(row, self.blocks, self.n.max(1));
        b = b.min(self.blocks - 1);
        while b > 0 && self.range(b).start > row {
            b -= 1;
        }
        while b + 1 < self.blocks && self.range(b).end <= row {
            b += 1;
        }
        b
    }

    /// All blocks' ranges, in order.
    pub fn ranges(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..self.blocks).map(|b| self.range(b))
    }
}

/// `a * b / d` without overflow: in 64 bits when the product fits (every real matrix: a
/// 128-bit division is a library call, and `problem.rs` asks once per nonzero), else in 128.
fn muldiv(a: usize, b: usize, d: usize) -> usize {
    match (a as u64).checked_mul(b as u64) {
        Some(p) => (p / d as u64) as usize,
        None => (a as u128 * b as u128 / d as u128) as usize,
    }
}

/// Dot product of one block, in four lanes (rule 2).
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    let mut l = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        l[0] += x[0] * y[0];
        l[1] += x[1] * y[1];
        l[2] += x[2] * y[2];
        l[3] += x[3] * y[3];
    }
    for (i, (x, y)) in ta.iter().zip(tb).enumerate() {
        l[i] += x * y;
    }
    (l[0] + l[1]) + (l[2] + l[3])
}

/// Sum of partials in order, left to right (rule 2).
pub fn sum_ordered(partials: &[f64]) -> f64 {
    partials.iter().fold(0.0, |s, v| s + v)
}

/// Rule 3's stopping test: `sqrt(rho) <= threshold` (false for NaN).
pub fn converged(rho: f64, threshold: f64) -> bool {
    rho.sqrt() <= threshold
}

/// y = A x over the rows of `a`, where `x` holds columns `x_start .. x_start + x.len()`.
///
/// # Panics
/// If a column of `a` is outside that window or `y` is shorter than the rows (caller bugs).
pub fn spmv(a: CsrRows<'_>, x: &[f64], x_start: usize, y: &mut [f64]) {
    let rows = a.len();
    for (yi, span) in y[..rows].iter_mut().zip(a.row_ptr.windows(2)) {
        let (lo, hi) = (span[0] as usize, span[1] as usize);
        *yi = row_sum(&a.col[lo..hi], &a.val[lo..hi], x, x_start);
    }
}

/// q = A p over the rows of `a`, returning this block's partial p.q (rule 2: equal to
/// [`spmv`] then [`dot`] of the block's own p and q). `p` holds columns
/// `p_start .. p_start + p.len()`, which must include the block's own rows.
pub fn spmv_dot(a: CsrRows<'_>, p: &[f64], p_start: usize, q: &mut [f64]) -> f64 {
    let rows = a.len();
    let own = &p[a.first - p_start..][..rows];
    let mut l = [0.0f64; 4];
    let each = q[..rows].iter_mut().zip(a.row_ptr.windows(2)).zip(own);
    for (i, ((qi, span), pi)) in each.enumerate() {
        let (lo, hi) = (span[0] as usize, span[1] as usize);
        let s = row_sum(&a.col[lo..hi], &a.val[lo..hi], p, p_start);
        *qi = s;
        l[i % 4] += pi * s;
    }
    (l[0] + l[1]) + (l[2] + l[3])
}

/// Entries of the rows that [`row_sum`] unrolls whole: a 7-point stencil's interior row.
const UNROLLED: usize = 7;

/// One row of A x (rule 5): `0.0 + v0 x[c0] + v1 x[c1] + ...`, added left to right in the
/// row's column order; a row of [`UNROLLED`] entries without a loop.
#[inline(always)]
fn row_sum(col: &[u32], val: &[f64], x: &[f64], x_start: usize) -> f64 {
    let at = |c: u32| x[c as usize - x_start];
    let mut s = 0.0;
    if let (Ok(c), Ok(v)) = (
        <&[u32; UNROLLED]>::try_from(col),
        <&[f64; UNROLLED]>::try_from(val),
    ) {
        for k in 0..UNROLLED {
            s += v[k] * at(c[k]);
        }
    } else {
        for (c, v) in col.iter().zip(val) {
            s += v * at(*c);
        }
    }
    s
}

/// x += alpha p, r -= alpha q on one block, returning the block's partial r.r (rule 2).
pub fn update(x: &mut [f64], r: &mut [f64], p: &[f64], q: &[f64], alpha: f64) -> f64 {
    let n = x.len();
    let (r, p, q) = (&mut r[..n], &p[..n], &q[..n]);
    let mut l = [0.0f64; 4];
    for i in 0..n {
        x[i] += alpha * p[i];
        let ri = r[i] - alpha * q[i];
        r[i] = ri;
        l[i % 4] += ri * ri;
    }
    (l[0] + l[1]) + (l[2] + l[3])
}

/// p = r + beta p on one block.
pub fn direction(p: &mut [f64], r: &[f64], beta: f64) {
    for (pi, ri) in p.iter_mut().zip(r) {
        *pi = ri + beta * *pi;
    }
}

/// Why CG stopped short.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CgError {
    /// p.Ap <= 0 or not finite: the matrix is not symmetric positive definite (rule 3).
    #[error(
        "breakdown at iteration {iteration}: p.Ap = {pq:e}, so the matrix is not positive definite"
    )]
    Breakdown {
        /// Iteration at which it happened.
        iteration: u64,
        /// The offending p.Ap.
        pq: f64,
    },
    /// Sizes do not agree.
    #[error("dimension mismatch: {0}")]
    Dimension(String),
}

/// alpha = rho / pq, or the breakdown error (rule 3).
pub fn alpha(rho: f64, pq: f64, iteration: u64) -> Result<f64, CgError> {
    if pq > 0.0 && pq.is_finite() {
        Ok(rho / pq)
    } else {
        Err(CgError::Breakdown { iteration, pq })
    }
}

/// Parameters of a solve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CgOptions {
    /// Stop when |r| <= rtol |b|.
    pub rtol: f64,
    /// Stop after this many iterations at most.
    pub max_iter: u64,
    /// Row blocks of the reductions (rule 2): same blocks, same bits as the data-flow run.
    pub blocks: usize,
}

/// The result of a solve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CgOutcome {
    /// The solution.
    pub x: Vec<f64>,
    /// Iterations done.
    pub iterations: u64,
    /// Final rho = r.r.
    pub rho: f64,
    /// |b|.
    pub b_norm: f64,
    /// Whether |r| <= rtol |b| (else max_iter stopped it).
    pub converged: bool,
}

/// CG on the whole matrix `a` (rule 3), with the reductions of `opts.blocks` blocks (rule 2).
pub fn solve(a: &Csr, b: &[f64], opts: &CgOptions) -> Result<CgOutcome, CgError> {
    let n = a.n_rows;
    if a.first_row != 0 || a.n_cols != n || b.len() != n {
        return Err(CgError::Dimension(format!(
            "A is {} x {} (from row {}), b has {} entries",
            a.n_rows,
            a.n_cols,
            a.first_row,
            b.len()
        )));
    }
    let part = Partition::new(n, opts.blocks);
    let mut x = vec![0.0; n];
    let mut r = b.to_vec();
    let mut p = b.to_vec();
    let mut q = vec![0.0; n];
    let mut partials = vec![0.0; part.blocks];
    for (s, rows) in partials.iter_mut().zip(part.ranges()) {
        *s = dot(&b[rows.clone()], &b[rows]);
    }
    let mut rho = sum_ordered(&partials);
    let b_norm = rho.sqrt();
    let threshold = opts.rtol * b_norm;
    let mut k = 0;
    while !converged(rho, threshold) && k < opts.max_iter {
        for (s, rows) in partials.iter_mut().zip(part.ranges()) {
            *s = spmv_dot(a.rows(rows.clone()), &p, 0, &mut q[rows]);
        }
        let alpha = alpha(rho, sum_ordered(&partials), k)?;
        for (s, rows) in partials.iter_mut().zip(part.ranges()) {
            let rows2 = rows.clone();
            *s = update(
                &mut x[rows.clone()],
                &mut r[rows.clone()],
                &p[rows2.clone()],
                &q[rows2],
                alpha,
            );
        }
        let rho_next = sum_ordered(&partials);
        let beta = rho_next / rho;
        for rows in part.ranges() {
            direction(&mut p[rows.clone()], &r[rows], beta);
        }
        rho = rho_next;
        k += 1;
    }
    Ok(CgOutcome {
        x,
        iterations: k,
        rho,
        b_norm,
        converged: converged(rho, threshold),
    })
}

/// What a worker owning one row block keeps between iterations (rule 4).
///
/// Byte layout of [`BlockState::to_bytes`], all little-endian:
/// `iteration: u64 | rho: f64 bits | rows: u64 | x: rows f64 | r: rows f64 | p: rows f64`,
/// so `8 * (3 + 3 * rows)` bytes ([`BlockState::encoded_len`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockState {
    /// Iterations done.
    pub iteration: u64,
    /// Global rho = r.r at this iteration (the same on every block).
    pub rho: f64,
    /// This block's rows of x.
    pub x: Vec<f64>,
    /// This block's rows of r.
    pub r: Vec<f64>,
    /// This block's rows of p.
    pub p: Vec<f64>,
}

/// A byte string that is not a [`BlockState`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a block state of {rows} rows is {expected} bytes, got {got}")]
pub struct StateError {
    /// Rows read from the header (0 if it was cut).
    pub rows: u64,
    /// Bytes the header implies.
    pub expected: u64,
    /// Bytes given.
    pub got: usize,
}

impl BlockState {
    /// The state before iteration 0 of a block whose rows of b are `b`: x = 0, r = p = b.
    /// `rho` is the global b.b, the ordered sum of every block's [`BlockState::rr`].
    pub fn new(b: &[f64], rho: f64) -> BlockState {
        BlockState {
            iteration: 0,
            rho,
            x: vec![0.0; b.len()],
            r: b.to_vec(),
            p: b.to_vec(),
        }
    }

    /// Rows of the block.
    pub fn rows(&self) -> usize {
        self.x.len()
    }

    /// This block's partial r.r (rule 2).
    pub fn rr(&self) -> f64 {
        dot(&self.r, &self.r)
    }

    /// Step 1 of an iteration: q = A p for this block's rows `a`, given the p of the columns
    /// `p_start ..` it touches (its own included); returns the partial p.q.
    pub fn spmv(&self, a: CsrRows<'_>, p: &[f64], p_start: usize, q: &mut [f64]) -> f64 {
        spmv_dot(a, p, p_start, q)
    }

    /// Step 2, with the global p.q: x += alpha p, r -= alpha q; returns the partial new r.r.
    pub fn update(&mut self, q: &[f64], pq: f64) -> Result<f64, CgError> {
        let a = alpha(self.rho, pq, self.iteration)?;
        Ok(update(&mut self.x, &mut self.r, &self.p, q, a))
    }

    /// Step 3, with the global new r.r: p = r + beta p; the iteration is done.
    pub fn finish(&mut self, rho_next: f64) {
        direction(&mut self.p, &self.r, rho_next / self.rho);
        self.rho = rho_next;
        self.iteration += 1;
    }

    /// Bytes of a state of `rows` rows.
    pub fn encoded_len(rows: usize) -> usize {
        8 * (3 + 3 * rows)
    }

    /// The exact byte layout (rule 4).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::encoded_len(self.rows()));
        out.extend_from_slice(&self.iteration.to_le_bytes());
        out.extend_from_slice(&self.rho.to_bits().to_le_bytes());
        out.extend_from_slice(&(self.rows() as u64).to_le_bytes());
        for v in [&self.x, &self.r, &self.p] {
            for f in v.iter() {
                out.extend_from_slice(&f.to_bits().to_le_bytes());
            }
        }
        out
    }

    /// Reads [`BlockState::to_bytes`] back, bit for bit.
    pub fn from_bytes(bytes: &[u8]) -> Result<BlockState, StateError> {
        let word = |i: usize| -> Option<u64> {
            bytes
                .get(8 * i..8 * i + 8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
        };
        let cut = || StateError {
            rows: 0,
            expected: 24,
            got: bytes.len(),
        };
        let (iteration, rho, rows) = (
            word(0).ok_or_else(cut)?,
            f64::from_bits(word(1).ok_or_else(cut)?),
            word(2).ok_or_else(cut)?,
        );
        let expected = rows.checked_mul(24).and_then(|v| v.checked_add(24));
        if expected != Some(bytes.len() as u64) {
            return Err(StateError {
                rows,
                expected: expected.unwrap_or(u64::MAX),
                got: bytes.len(),
            });
        }
        let n = rows as usize; // the length check bounds it by the slice
        let vec = |k: usize| -> Vec<f64> {
            bytes[24 + 8 * n * k..24 + 8 * n * (k + 1)]
                .chunks_exact(8)
                .map(|w| f64::from_bits(u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))))
                .collect()
        };
        Ok(BlockState {
            iteration,
            rho,
            x: vec(0),
            r: vec(1),
            p: vec(2),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::poisson;
    use proptest::prelude::*;

    #[test]
    fn muldiv_is_exact_in_64_bits_and_past_them() {
        for (a, b, d) in [
            (0, 5, 3),
            (999_999, 16, 1_000_000),
            (usize::MAX / 2, 4, 8),
            (usize::MAX, usize::MAX, usize::MAX),
        ] {
            let want = (a as u128 * b as u128 / d as u128) as usize;
            assert_eq!(muldiv(a, b, d), want, "{a} * {b} / {d}");
        }
    }

    #[test]
    fn partitions_cover_in_order() {
        for (n, b) in [(10, 3), (7, 7), (1000, 16), (5, 1), (3, 5)] {
            let p = Partition::new(n, b);
            let mut next = 0;
            for k in 0..p.blocks {
                let r = p.range(k);
                assert_eq!(r.start, next);
                next = r.end;
                for row in r {
                    assert_eq!(p.block_of(row), k, "n {n} blocks {b} row {row}");
                }
            }
            assert_eq!(next, n);
        }
    }

    #[test]
    fn fused_kernels_equal_the_plain_ones_bit_for_bit() {
        let a = poisson::poisson2d(7);
        let n = a.n_rows;
        let p: Vec<f64> = (0..n).map(|i| ((i * 37 % 11) as f64 - 5.0) / 3.0).collect();
        let part = Partition::new(n, 3);
        for rows in part.ranges() {
            let v = a.rows(rows.clone());
            let mut q1 = vec![0.0; rows.len()];
            let mut q2 = vec![0.0; rows.len()];
            spmv(v, &p, 0, &mut q1);
            let pq = spmv_dot(v, &p, 0, &mut q2);
            assert_eq!(q1, q2);
            assert_eq!(pq.to_bits(), dot(&p[rows.clone()], &q1).to_bits());
            // A window of p that covers the block's columns gives the same bits.
            let lo = rows.start.saturating_sub(7);
            let hi = (rows.end + 7).min(n);
            let mut q3 = vec![0.0; rows.len()];
            assert_eq!(spmv_dot(v, &p[lo..hi], lo, &mut q3).to_bits(), pq.to_bits());
            assert_eq!(q3, q1);
            let (mut x, mut r) = (p[rows.clone()].to_vec(), q1.clone());
            let rr = update(&mut x, &mut r, &p[rows.clone()], &q1, 0.37);
            assert_eq!(rr.to_bits(), dot(&r, &r).to_bits());
        }
    }

    /// The plain row loop rule 5 keeps the bits of.
    fn plain_spmv(a: CsrRows<'_>, x: &[f64], x_start: usize) -> Vec<f64> {
        (0..a.len())
            .map(|i| {
                let mut s = 0.0;
                for k in a.span(i) {
                    s += a.val[k] * x[a.col[k] as usize - x_start];
                }
                s
            })
            .collect()
    }

    /// A random square matrix whose rows have 0..=10 entries, half of them 7 (the unrolled
    /// length), with values of both signs over many magnitudes, and zeros of both signs.
    fn random_csr() -> impl Strategy<Value = Csr> {
        (1usize..60).prop_flat_map(|n| {
            let row = (prop_oneof![Just(7usize), 0usize..=10], any::<u64>());
            proptest::collection::vec(row, n).prop_map(move |rows| {
                let mut csr = Csr {
                    first_row: 0,
                    n_rows: n,
                    n_cols: n,
                    row_ptr: vec![0],
                    col: Vec::new(),
                    val: Vec::new(),
                };
                for (len, seed) in rows {
                    let mut r = seed;
                    let mut next = || {
                        r = r
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        r >> 11
                    };
                    let mut cols: Vec<u32> = (0..len).map(|_| (next() % n as u64) as u32).collect();
                    cols.sort_unstable();
                    cols.dedup();
                    for c in cols {
                        let v = match next() % 8 {
                            0 => 0.0,
                            1 => -0.0,
                            k => {
                                let m = (next() % 1000) as f64 / 7.0 - 71.0;
                                m * 10f64.powi((k as i32 - 4) * 5)
                            }
                        };
                        csr.col.push(c);
                        csr.val.push(v);
                    }
                    csr.row_ptr.push(csr.col.len() as u32);
                }
                csr
            })
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        /// Rule 5: the kernels' rows are the plain loop's, bit for bit, whole or by blocks,
        /// with x given whole or as a window.
        #[test]
        fn rows_equal_the_plain_loop_bit_for_bit(
            a in random_csr(),
            blocks in 1usize..5,
            xs in proptest::collection::vec(-1e3f64..1e3, 60),
        ) {
            let n = a.n_rows;
            let x: Vec<f64> = xs[..n].iter().enumerate()
                .map(|(i, v)| if i % 11 == 3 { -0.0 } else { *v * 10f64.powi(i as i32 % 9 - 4) })
                .collect();
            let bits = |v: &[f64]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let want = plain_spmv(a.view(), &x, 0);
            let mut y = vec![0.0; n];
            spmv(a.view(), &x, 0, &mut y);
            proptest::prop_assert_eq!(bits(&y), bits(&want));
            for rows in Partition::new(n, blocks).ranges() {
                let v = a.rows(rows.clone());
                let mut q = vec![0.0; rows.len()];
                let pq = spmv_dot(v, &x, 0, &mut q);
                proptest::prop_assert_eq!(bits(&q), bits(&want[rows.clone()]));
                proptest::prop_assert_eq!(pq.to_bits(), dot(&x[rows.clone()], &q).to_bits());
                // x as the window of the block's columns (and its own rows).
                let cols = &v.col[v.row_ptr[0] as usize..v.row_ptr[v.len()] as usize];
                let lo = cols.iter().map(|&c| c as usize).fold(rows.start, usize::min);
                let hi = cols.iter().map(|&c| c as usize + 1).fold(rows.end, usize::max);
                let mut q2 = vec![0.0; rows.len()];
                let pq2 = spmv_dot(v, &x[lo..hi], lo, &mut q2);
                proptest::prop_assert_eq!(bits(&q2), bits(&q));
                proptest::prop_assert_eq!(pq2.to_bits(), pq.to_bits());
                let mut y2 = vec![0.0; rows.len()];
                spmv(v, &x[lo..hi], lo, &mut y2);
                proptest::prop_assert_eq!(bits(&y2), bits(&q));
            }
        }
    }

    #[test]
    fn block_states_round_trip_and_run_the_same_iterations() {
        let a = poisson::poisson2d(9);
        let n = a.n_rows;
        let l: Vec<f64> = (0..n).map(|i| 1.0 + (i % 5) as f64).collect();
        let b = a.mul_vec(&l);
        let opts = CgOptions {
            rtol: 1e-10,
            max_iter: 1000,
            blocks: 4,
        };
        let want = solve(&a, &b, &opts).unwrap();
        assert!(want.converged);
        // The same solve by four block states, exchanging only p and scalars.
        let part = Partition::new(n, 4);
        let rho0 = sum_ordered(
            &part
                .ranges()
                .map(|r| dot(&b[r.clone()], &b[r]))
                .collect::<Vec<_>>(),
        );
        let mut states: Vec<BlockState> = part
            .ranges()
            .map(|r| BlockState::new(&b[r], rho0))
            .collect();
        let threshold = opts.rtol * rho0.sqrt();
        while !converged(states[0].rho, threshold) {
            let p: Vec<f64> = states.iter().flat_map(|s| s.p.clone()).collect();
            let mut qs: Vec<Vec<f64>> = part.ranges().map(|r| vec![0.0; r.len()]).collect();
            let pq: Vec<f64> = states
                .iter()
                .zip(part.ranges())
                .zip(qs.iter_mut())
                .map(|((s, rows), q)| s.spmv(a.rows(rows), &p, 0, q))
                .collect();
            let pq = sum_ordered(&pq);
            let rr: Vec<f64> = states
                .iter_mut()
                .zip(&qs)
                .map(|(s, q)| s.update(q, pq).unwrap())
                .collect();
            let rho = sum_ordered(&rr);
            for s in &mut states {
                s.finish(rho);
                let bytes = s.to_bytes();
                assert_eq!(bytes.len(), BlockState::encoded_len(s.rows()));
                assert_eq!(&BlockState::from_bytes(&bytes).unwrap(), s);
            }
        }
        assert_eq!(states[0].iteration, want.iterations);
        let x: Vec<f64> = states.iter().flat_map(|s| s.x.clone()).collect();
        assert_eq!(x, want.x);
        let err = x
            .iter()
            .zip(&l)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(err < 1e-8, "{err}");
        assert!(BlockState::from_bytes(&[0; 23]).is_err());
        let mut bytes = states[0].to_bytes();
        bytes.pop();
        assert!(BlockState::from_bytes(&bytes).is_err());
    }

    #[test]
    fn breakdown_is_an_error() {
        // -I is negative definite.
        let a = Csr {
            first_row: 0,
            n_rows: 2,
            n_cols: 2,
            row_ptr: vec![0, 1, 2],
            col: vec![0, 1],
            val: vec![-1.0, -1.0],
        };
        let e = solve(
            &a,
            &[1.0, 1.0],
            &CgOptions {
                rtol: 1e-8,
                max_iter: 10,
                blocks: 1,
            },
        );
        assert!(
            matches!(e, Err(CgError::Breakdown { iteration: 0, .. })),
            "{e:?}"
        );
        // b = 0 converges at once to x = 0.
        let z = solve(
            &a,
            &[0.0, 0.0],
            &CgOptions {
                rtol: 1e-8,
                max_iter: 10,
                blocks: 1,
            },
        )
        .unwrap();
        assert_eq!((z.iterations, z.converged), (0, true));
    }
}

//! Generated Poisson matrices for large runs: the finite-difference Laplacian with Dirichlet
//! boundaries on an N x N grid (5-point, `poisson2d:N`, n = N^2) or an N x N x N grid (7-point,
//! `poisson3d:N`, n = N^3).
//!
//! Rules:
//!
//! 1. Unknown `i = x + N*y (+ N^2*z)`; row i has the diagonal 4 (2D) or 6 (3D) and -1 for each
//!    grid neighbour inside the grid, columns sorted. The matrix is symmetric positive
//!    definite.
//! 2. [`rows`] generates any row range alone, in O(rows) time and memory: a worker builds its
//!    own block without the rest, and the result equals that block of the whole matrix.

use std::ops::Range;

use super::Csr;

/// The largest grid generated: 2^27 unknowns (512^3; about 11 GB of CSR in 3D), so that a
/// mistyped side is an error, not an allocation that takes the machine down.
pub const MAX_UNKNOWNS: usize = 1 << 27;

/// A grid: 2D or 3D, N points per side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// N x N, 5-point stencil.
    D2(u32),
    /// N x N x N, 7-point stencil.
    D3(u32),
}

impl Grid {
    /// Unknowns (rows), or `None` past [`MAX_UNKNOWNS`].
    pub fn unknowns(self) -> Option<usize> {
        let n = match self {
            Grid::D2(s) => u64::from(s).checked_pow(2)?,
            Grid::D3(s) => u64::from(s).checked_pow(3)?,
        };
        usize::try_from(n).ok().filter(|&n| n <= MAX_UNKNOWNS)
    }

    /// Stored entries of row range `rows`.
    fn entries_bound(self, rows: usize) -> usize {
        match self {
            Grid::D2(_) => 5 * rows,
            Grid::D3(_) => 7 * rows,
        }
    }
}

/// The whole 2D matrix.
pub fn poisson2d(side: u32) -> Csr {
    let g = Grid::D2(side);
    rows(g, 0..g.unknowns().unwrap_or(0))
}

/// The whole 3D matrix.
pub fn poisson3d(side: u32) -> Csr {
    let g = Grid::D3(side);
    rows(g, 0..g.unknowns().unwrap_or(0))
}

/// Rows `range` of the matrix of `grid` (rule 2). Indices are bounded by [`Grid::unknowns`],
/// which the caller checked (an out-of-range range gives rows past the grid: empty of
/// neighbours, not a panic).
pub fn rows(grid: Grid, range: Range<usize>) -> Csr {
    let n = grid.unknowns().unwrap_or(0);
    let mut row_ptr = Vec::with_capacity(range.len() + 1);
    let mut col: Vec<u32> = Vec::with_capacity(grid.entries_bound(range.len()));
    let mut val = Vec::with_capacity(col.capacity());
    row_ptr.push(0);
    for i in range.clone() {
        // i < n <= MAX_UNKNOWNS < u32::MAX (Grid::unknowns).
        let c = i as u32;
        match grid {
            Grid::D2(s) => {
                let (x, y) = (c % s, c / s);
                let mut push = |j: u32, v: f64| {
                    col.push(j);
                    val.push(v);
                };
                if y > 0 {
                    push(c - s, -1.0);
                }
                if x > 0 {
                    push(c - 1, -1.0);
                }
                push(c, 4.0);
                if x + 1 < s {
                    push(c + 1, -1.0);
                }
                if y + 1 < s {
                    push(c + s, -1.0);
                }
            }
            Grid::D3(s) => {
                let s2 = s * s;
                let (x, y, z) = (c % s, (c / s) % s, c / s2);
                let mut push = |j: u32, v: f64| {
                    col.push(j);
                    val.push(v);
                };
                if z > 0 {
                    push(c - s2, -1.0);
                }
                if y > 0 {
                    push(c - s, -1.0);
                }
                if x > 0 {
                    push(c - 1, -1.0);
                }
                push(c, 6.0);
                if x + 1 < s {
                    push(c + 1, -1.0);
                }
                if y + 1 < s {
                    push(c + s, -1.0);
                }
                if z + 1 < s {
                    push(c + s2, -1.0);
                }
            }
        }
        // At most 7 * MAX_UNKNOWNS < u32::MAX entries.
        row_ptr.push(col.len() as u32);
    }
    Csr {
        first_row: range.start,
        n_rows: range.len(),
        n_cols: n,
        row_ptr,
        col,
        val,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stencils_are_symmetric_with_the_expected_counts() {
        let a = poisson2d(4);
        assert_eq!(a.n_rows, 16);
        // 5 n - 4 N boundary cuts.
        assert_eq!(a.nnz(), 5 * 16 - 4 * 4);
        assert!(a.is_symmetric());
        let b = poisson3d(5);
        assert_eq!(b.n_rows, 125);
        assert_eq!(b.nnz(), 7 * 125 - 6 * 25);
        assert!(b.is_symmetric());
        // A block generated alone is that block of the whole.
        assert_eq!(rows(Grid::D3(5), 30..77), b.slice_rows(30..77));
        assert_eq!(Grid::D3(2000).unknowns(), None);
        assert_eq!(Grid::D3(512).unknowns(), Some(MAX_UNKNOWNS));
        assert_eq!(Grid::D3(513).unknowns(), None);
    }
}

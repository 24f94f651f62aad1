//! Sparse matrices: compressed sparse rows of `f64` ([`Csr`]), row-block views ([`CsrRows`]),
//! and where they come from: Matrix Market files ([`mm`]), Harwell-Boeing files ([`hb`]) and
//! generated Poisson problems ([`poisson`]).
//!
//! Rules:
//!
//! 1. A [`Csr`] holds rows `first_row .. first_row + n_rows` of a matrix with `n_cols`
//!    columns; column indices are global, `u32` (half the memory traffic of `usize` in SpMV),
//!    sorted and unique within a row. Row offsets are `u32` as well (at most 2^32 - 1 entries,
//!    a 48 GB matrix): 4 bytes of index traffic per entry and per row, as scipy's int32 CSR
//!    (SpMV is memory-bound: `usize` offsets would add 4 MB to the ~100 MB one product of
//!    `poisson3d:100` moves). A whole
//!    matrix has `first_row = 0`; a worker that owns a row block holds just those rows
//!    ([`poisson::rows`], [`Csr::slice_rows`]).
//! 2. Readers expand what files leave implicit: a symmetric file stores one triangle and the
//!    other is its mirror; a skew-symmetric one stores the strict lower triangle and the upper
//!    is its mirror with the sign changed; a pattern file's entries are 1.0. Explicit zeros are
//!    kept (they are stored entries).
//! 3. An entry given twice (also: a symmetric file that stores both (i, j) and (j, i)) is an
//!    error naming both lines, never silently summed.
//! 4. Bad input is a [`MatrixError`] naming the file, the line and the field; readers never
//!    panic, and check counts before allocating from them: a file may declare at most
//!    [`DIM_PER_BYTE`] rows or columns per byte of its text (plus [`DIM_SLACK`]), and entry
//!    buffers grow with what is actually read.
//! 5. [`load`] tells the format from the content: a first line `%%MatrixMarket` is Matrix
//!    Market, anything else is read as Harwell-Boeing.

pub mod fortran;
pub mod hb;
pub mod mm;
pub mod poisson;

use std::ops::Range;
use std::path::Path;

/// Why a matrix could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    /// The file cannot be read at all.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The system's reason.
        source: std::io::Error,
    },
    /// A field of a line is wrong (bad number, blank, out of range, or the line is missing).
    #[error("{file}: line {line}, {field}: {message}")]
    Field {
        /// The file.
        file: String,
        /// 1-based line number.
        line: usize,
        /// Which field, with its columns where the format has them.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A file whose lines read but do not make a matrix (inconsistent counts or pointers).
    #[error("{file}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// What is inconsistent.
        message: String,
    },
    /// A well-formed file of a kind this reader does not handle (complex, elemental, ...).
    #[error("{file}: not supported: {message}")]
    Unsupported {
        /// The file.
        file: String,
        /// What is not supported.
        message: String,
    },
}

/// A matrix in compressed sparse rows (rule 1).
#[derive(Clone, Debug, PartialEq)]
pub struct Csr {
    /// Global index of the first row held.
    pub first_row: usize,
    /// Rows held.
    pub n_rows: usize,
    /// Columns of the whole matrix.
    pub n_cols: usize,
    /// Row i's entries are `row_ptr[i] .. row_ptr[i + 1]` (length `n_rows + 1`; `u32`, rule 1).
    pub row_ptr: Vec<u32>,
    /// Column of each entry (global).
    pub col: Vec<u32>,
    /// Value of each entry.
    pub val: Vec<f64>,
}

/// Rows `first .. first + row_ptr.len() - 1` of a CSR matrix, borrowed: the unit of work of a
/// worker that owns a contiguous row block. `row_ptr` holds offsets into `col` and `val`.
#[derive(Clone, Copy, Debug)]
pub struct CsrRows<'a> {
    /// Global index of the first row.
    pub first: usize,
    /// Offsets of each row's entries, one more than the rows.
    pub row_ptr: &'a [u32],
    /// Columns (global).
    pub col: &'a [u32],
    /// Values.
    pub val: &'a [f64],
}

impl CsrRows<'_> {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.row_ptr.len().saturating_sub(1)
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Global row range.
    pub fn range(&self) -> Range<usize> {
        self.first..self.first + self.len()
    }

    /// Positions in `col` and `val` of the entries of local row `i`.
    #[inline]
    pub fn span(&self, i: usize) -> Range<usize> {
        self.row_ptr[i] as usize..self.row_ptr[i + 1] as usize
    }
}

impl Csr {
    /// All rows held, as a view.
    pub fn view(&self) -> CsrRows<'_> {
        CsrRows {
            first: self.first_row,
            row_ptr: &self.row_ptr,
            col: &self.col,
            val: &self.val,
        }
    }

    /// Global rows `rows` (within those held), as a view.
    ///
    /// # Panics
    /// If `rows` is not within the rows held (a caller bug).
    pub fn rows(&self, rows: Range<usize>) -> CsrRows<'_> {
        let (a, b) = (rows.start - self.first_row, rows.end - self.first_row);
        CsrRows {
            first: rows.start,
            row_ptr: &self.row_ptr[a..=b],
            col: &self.col,
            val: &self.val,
        }
    }

    /// A copy of global rows `rows` as their own matrix (what a block's owner keeps).
    pub fn slice_rows(&self, rows: Range<usize>) -> Csr {
        let v = self.rows(rows.clone());
        let lo32 = v.row_ptr[0];
        let (lo, hi) = (lo32 as usize, v.row_ptr[v.len()] as usize);
        Csr {
            first_row: rows.start,
            n_rows: rows.len(),
            n_cols: self.n_cols,
            row_ptr: v.row_ptr.iter().map(|p| p - lo32).collect(),
            col: self.col[lo..hi].to_vec(),
            val: self.val[lo..hi].to_vec(),
        }
    }

    /// Stored entries.
    pub fn nnz(&self) -> usize {
        self.val.len()
    }

    /// The entry at global (row, col), if stored.
    pub fn get(&self, row: usize, col: usize) -> Option<f64> {
        let i = row
            .checked_sub(self.first_row)
            .filter(|&i| i < self.n_rows)?;
        let (a, b) = (self.row_ptr[i] as usize, self.row_ptr[i + 1] as usize);
        let c = u32::try_from(col).ok()?;
        self.col[a..b]
            .binary_search(&c)
            .ok()
            .map(|k| self.val[a + k])
    }

    /// Whether the (whole, square) matrix equals its transpose exactly, pattern and values.
    pub fn is_symmetric(&self) -> bool {
        if self.first_row != 0 || self.n_rows != self.n_cols {
            return false;
        }
        (0..self.n_rows).all(|i| {
            self.view().span(i).all(|k| {
                self.get(self.col[k] as usize, i)
                    .is_some_and(|v| v.to_bits() == self.val[k].to_bits())
            })
        })
    }

    /// y = A x for the rows held (x indexed by global column). Reference implementation; the
    /// fast one is [`crate::kernel::spmv`].
    pub fn mul_vec(&self, x: &[f64]) -> Vec<f64> {
        (0..self.n_rows)
            .map(|i| {
                self.view()
                    .span(i)
                    .map(|k| self.val[k] * x[self.col[k] as usize])
                    .sum()
            })
            .collect()
    }
}

/// Entries as read from a file, with the line each came from (for rule 3's message).
pub(crate) struct Triplets {
    pub(crate) file: String,
    pub(crate) n_rows: usize,
    pub(crate) n_cols: usize,
    /// (row, col, value, line), 0-based indices.
    pub(crate) entries: Vec<(u32, u32, f64, u32)>,
}

/// How the stored entries of a file relate to the whole matrix (rule 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Symmetry {
    /// Every entry is stored.
    General,
    /// One triangle stored; the other is its mirror.
    Symmetric,
    /// Strict lower triangle stored; the upper is its negated mirror, the diagonal is zero.
    SkewSymmetric,
}

/// Largest dimension accepted: column indices are `u32` (rule 1).
pub const MAX_DIM: usize = u32::MAX as usize;

/// Most stored entries: row offsets are `u32` (rule 1).
pub const MAX_NNZ: usize = u32::MAX as usize;

/// Rows or columns a file may declare beyond [`DIM_PER_BYTE`] per byte of the file.
pub const DIM_SLACK: usize = 1 << 20;
/// Rows or columns a file may declare per byte of its text (with [`DIM_SLACK`] more): a
/// corrupt header must not make the reader allocate row offsets for billions of empty rows
/// (rule 4). 64 per byte is far more than any real file needs: an entry takes several bytes.
pub const DIM_PER_BYTE: usize = 64;

/// The largest dimension a file of `bytes` bytes may declare (rule 4).
pub(crate) fn dim_limit(bytes: usize) -> usize {
    bytes
        .saturating_mul(DIM_PER_BYTE)
        .saturating_add(DIM_SLACK)
        .min(MAX_DIM)
}

impl Triplets {
    pub(crate) fn new(file: &str, n_rows: usize, n_cols: usize, capacity: usize) -> Triplets {
        Triplets {
            file: file.to_string(),
            n_rows,
            n_cols,
            entries: Vec::with_capacity(capacity),
        }
    }

    /// Adds the mirrored entries of a symmetric or skew-symmetric file (rule 2). Checks that a
    /// symmetric file stores a single triangle, and that a skew one has no diagonal.
    pub(crate) fn expand(&mut self, sym: Symmetry) -> Result<(), MatrixError> {
        if sym == Symmetry::General {
            return Ok(());
        }
        if self.n_rows != self.n_cols {
            return Err(MatrixError::Invalid {
                file: self.file.clone(),
                message: format!(
                    "a symmetric or skew-symmetric matrix is square, this one is {} x {}",
                    self.n_rows, self.n_cols
                ),
            });
        }
        let mut mirrored = Vec::new();
        for &(i, j, v, line) in &self.entries {
            if i == j {
                if sym == Symmetry::SkewSymmetric && v != 0.0 {
                    return Err(MatrixError::Field {
                        file: self.file.clone(),
                        line: line as usize,
                        field: format!("entry ({}, {})", i + 1, j + 1),
                        message: "a skew-symmetric matrix has a zero diagonal".to_string(),
                    });
                }
                continue;
            }
            let w = if sym == Symmetry::SkewSymmetric {
                -v
            } else {
                v
            };
            mirrored.push((j, i, w, line));
        }
        self.entries.extend(mirrored);
        Ok(())
    }

    /// Sorts into CSR; a duplicate entry is an error (rule 3).
    pub(crate) fn into_csr(mut self) -> Result<Csr, MatrixError> {
        self.entries
            .sort_unstable_by_key(|&(i, j, _, line)| (i, j, line));
        if self.entries.len() > MAX_NNZ {
            return Err(MatrixError::Invalid {
                file: self.file.clone(),
                message: format!(
                    "{} entries: row offsets are u32, at most {MAX_NNZ}",
                    self.entries.len()
                ),
            });
        }
        let mut row_ptr = vec![0u32; self.n_rows + 1];
        let mut col = Vec::with_capacity(self.entries.len());
        let mut val = Vec::with_capacity(self.entries.len());
        for (k, &(i, j, v, line)) in self.entries.iter().enumerate() {
            if k > 0 {
                let (pi, pj, _, pline) = self.entries[k - 1];
                if (pi, pj) == (i, j) {
                    return Err(MatrixError::Field {
                        file: self.file.clone(),
                        line: line as usize,
                        field: format!("entry ({}, {})", i + 1, j + 1),
                        message: format!(
                            "given twice (also on line {pline}; a symmetric file stores one \
                             triangle)"
                        ),
                    });
                }
            }
            row_ptr[i as usize + 1] += 1;
            col.push(j);
            val.push(v);
        }
        for i in 0..self.n_rows {
            row_ptr[i + 1] += row_ptr[i];
        }
        Ok(Csr {
            first_row: 0,
            n_rows: self.n_rows,
            n_cols: self.n_cols,
            row_ptr,
            col,
            val,
        })
    }
}

/// A matrix read from a file, with what the file says besides.
#[derive(Clone, Debug, PartialEq)]
pub struct FileMatrix {
    /// The matrix, expanded (rule 2).
    pub matrix: Csr,
    /// How the file stored it.
    pub symmetry: Symmetry,
    /// Right-hand sides stored in the file (Harwell-Boeing full storage), each of length
    /// `n_rows`.
    pub rhs: Vec<Vec<f64>>,
    /// Starting guesses stored in the file, if any.
    pub guesses: Vec<Vec<f64>>,
    /// Exact solutions stored in the file, if any.
    pub exact: Vec<Vec<f64>>,
    /// The title line (Harwell-Boeing) or the header (Matrix Market).
    pub title: String,
}

/// Reads a Matrix Market or Harwell-Boeing file (rule 5).
pub fn load(path: &Path) -> Result<FileMatrix, MatrixError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| MatrixError::Io {
        path: name.clone(),
        source,
    })?;
    parse(&name, &bytes)
}

/// Reads the bytes of a Matrix Market or Harwell-Boeing file named `name` (rule 5).
pub fn parse(name: &str, bytes: &[u8]) -> Result<FileMatrix, MatrixError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let line = 1 + bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        MatrixError::Field {
            file: name.to_string(),
            line,
            field: "text".to_string(),
            message: "not ASCII/UTF-8 text".to_string(),
        }
    })?;
    if text.trim_start().starts_with("%%MatrixMarket") {
        mm::parse(name, text)
    } else {
        hb::parse(name, text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_errors_and_csr_is_sorted() {
        let mut t = Triplets::new("t", 3, 3, 4);
        t.entries = vec![
            (2, 0, 1.0, 5),
            (0, 2, 2.0, 6),
            (0, 0, 3.0, 7),
            (1, 1, 4.0, 8),
        ];
        let a = t.into_csr().unwrap();
        assert_eq!(a.row_ptr, [0, 2, 3, 4]);
        assert_eq!(a.col, [0, 2, 1, 0]);
        assert_eq!(a.get(0, 2), Some(2.0));
        assert_eq!(a.get(1, 2), None);
        let mut t = Triplets::new("t", 3, 3, 4);
        t.entries = vec![(1, 0, 1.0, 5), (0, 1, 2.0, 6)];
        t.expand(Symmetry::Symmetric).unwrap();
        let e = t.into_csr().unwrap_err().to_string();
        assert!(
            e.contains("entry (1, 2)") && e.contains("given twice"),
            "{e}"
        );
    }

    #[test]
    fn slices_keep_global_columns() {
        let a = poisson::poisson2d(3);
        let s = a.slice_rows(3..6);
        assert_eq!(s.first_row, 3);
        assert_eq!(s.n_rows, 3);
        assert_eq!(s, poisson::rows(poisson::Grid::D2(3), 3..6));
        assert_eq!(a.slice_rows(4..4).nnz(), 0);
        let x: Vec<f64> = (0..9).map(f64::from).collect();
        assert_eq!(s.mul_vec(&x), a.mul_vec(&x)[3..6].to_vec());
    }
}

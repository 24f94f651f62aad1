//! The linear system A x = b of a run: where A comes from ([`Source`]), the known solution L and
//! b = A L ([`Rhs`]; paper 002 §4 Step 4: "We set b = A x L ... Finally, the result X = L is
//! obtained through the CG solver"), and the per-process cache that lets every task name the
//! matrix instead of carrying it.
//!
//! Rules:
//!
//! 1. A [`Source`] is small and serializable: a task argument names the matrix (a file by its
//!    absolute path and the blake3 digest of its bytes, or a generated Poisson grid), never
//!    holds it. Like paper 002's spare re-reading its rows from the file, any process (a
//!    worker, a recovering vnode, the certifier's oracle) rebuilds the same matrix from it.
//! 2. A file whose bytes no longer match the digest is an error ([`ProblemError::Changed`]),
//!    not a silent different matrix.
//! 3. [`problem`] loads each (source, rhs) once per process and shares it ([`Arc`]); loading is
//!    deterministic, so every process holds the same bits.
//! 4. L is all ones ([`Rhs::Ones`]) or, for [`Rhs::Random`], L_i = 2 u_i - 1 where u_i is the
//!    top 53 bits of the i-th 64-bit output of ChaCha8 seeded with the seed, over 2^53: uniform
//!    in [-1, 1) and computable for any row range alone ([`exact_solution`]).

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use rand::rngs::ChaCha8Rng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::kernel::Partition;
use crate::matrix::poisson::{self, Grid};
use crate::matrix::{self, Csr, MatrixError};

/// Why a problem could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ProblemError {
    /// The matrix file is unreadable or malformed.
    #[error(transparent)]
    Matrix(#[from] MatrixError),
    /// The file changed since the run named it (rule 2).
    #[error("{path} changed since the run started: blake3 {found}, the run has {expected}")]
    Changed {
        /// The file.
        path: String,
        /// Digest in the task's arguments.
        expected: String,
        /// Digest of the file now.
        found: String,
    },
    /// A `--matrix` or `--rhs` value that names nothing.
    #[error("{0}")]
    Syntax(String),
}

/// Where the matrix comes from (rule 1).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Source {
    /// A Matrix Market or Harwell-Boeing file.
    File {
        /// Absolute path.
        path: String,
        /// blake3 of its bytes, hex.
        digest: String,
    },
    /// The 5-point Laplacian on an N x N grid.
    Poisson2d(u32),
    /// The 7-point Laplacian on an N x N x N grid.
    Poisson3d(u32),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::File { path, .. } => f.write_str(path),
            Source::Poisson2d(n) => write!(f, "poisson2d:{n}"),
            Source::Poisson3d(n) => write!(f, "poisson3d:{n}"),
        }
    }
}

/// A per-process cache, created on first use (rule 3).
type Cache<K, V> = Mutex<Option<HashMap<K, Arc<V>>>>;

/// Matrices loaded in this process (rule 3).
static MATRICES: Cache<Source, Csr> = Mutex::new(None);
/// Problems set up in this process (rule 3).
static PROBLEMS: Cache<(Source, Rhs), Problem> = Mutex::new(None);

fn cached<K: Eq + std::hash::Hash + Clone, V>(
    cache: &Cache<K, V>,
    key: &K,
    make: impl FnOnce() -> Result<V, ProblemError>,
) -> Result<Arc<V>, ProblemError> {
    // A poisoned lock only means another thread panicked while holding it; the map is still
    // consistent (insertions are single calls).
    let mut guard = cache.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(v) = map.get(key) {
        return Ok(v.clone());
    }
    let v = Arc::new(make()?);
    map.insert(key.clone(), v.clone());
    Ok(v)
}

fn digest_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

impl Source {
    /// Parses `FILE`, `poisson2d:N` or `poisson3d:N`. A file is read, digested and parsed now
    /// (so a malformed file is reported before any run starts) and cached.
    pub fn parse(text: &str) -> Result<Source, ProblemError> {
        let grid = |n: &str, three: bool| -> Result<Source, ProblemError> {
            let side: u32 =
                n.parse().ok().filter(|&s| s >= 1).ok_or_else(|| {
                    ProblemError::Syntax(format!("{n:?} is not a grid side >= 1"))
                })?;
            let g = if three {
                Grid::D3(side)
            } else {
                Grid::D2(side)
            };
            g.unknowns().ok_or_else(|| {
                ProblemError::Syntax(format!(
                    "{text}: more than {} unknowns",
                    poisson::MAX_UNKNOWNS
                ))
            })?;
            Ok(if three {
                Source::Poisson3d(side)
            } else {
                Source::Poisson2d(side)
            })
        };
        if let Some(n) = text.strip_prefix("poisson2d:") {
            return grid(n, false);
        }
        if let Some(n) = text.strip_prefix("poisson3d:") {
            return grid(n, true);
        }
        let path = Path::new(text);
        let abs = std::fs::canonicalize(path).map_err(|source| MatrixError::Io {
            path: text.to_string(),
            source,
        })?;
        let (source, matrix) = read_file(&abs, None)?;
        let mut guard = MATRICES.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .get_or_insert_with(HashMap::new)
            .insert(source.clone(), Arc::new(matrix));
        Ok(source)
    }

    /// The matrix (cached, rule 3).
    pub fn matrix(&self) -> Result<Arc<Csr>, ProblemError> {
        cached(&MATRICES, self, || match self {
            Source::File { path, digest } => Ok(read_file(Path::new(path), Some(digest))?.1),
            Source::Poisson2d(n) => Ok(poisson::poisson2d(*n)),
            Source::Poisson3d(n) => Ok(poisson::poisson3d(*n)),
        })
    }
}

/// Reads, digests (checking `expected`, rule 2) and parses a matrix file.
fn read_file(path: &Path, expected: Option<&str>) -> Result<(Source, Csr), ProblemError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| MatrixError::Io {
        path: name.clone(),
        source,
    })?;
    let digest = digest_hex(&bytes);
    if let Some(e) = expected.filter(|e| **e != digest) {
        return Err(ProblemError::Changed {
            path: name,
            expected: e.to_string(),
            found: digest,
        });
    }
    let m = matrix::parse(&name, &bytes)?;
    Ok((
        Source::File {
            path: PathBuf::from(path).display().to_string(),
            digest,
        },
        m.matrix,
    ))
}

/// The known solution L (rule 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rhs {
    /// L = (1, ..., 1).
    Ones,
    /// L uniform in [-1, 1), from ChaCha8 with this seed.
    Random(u64),
}

impl FromStr for Rhs {
    type Err = ProblemError;
    fn from_str(s: &str) -> Result<Rhs, ProblemError> {
        if s == "ones" {
            return Ok(Rhs::Ones);
        }
        s.strip_prefix("random:")
            .and_then(|n| n.parse().ok())
            .map(Rhs::Random)
            .ok_or_else(|| ProblemError::Syntax(format!("{s:?}: expected ones or random:SEED")))
    }
}

impl fmt::Display for Rhs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rhs::Ones => f.write_str("ones"),
            Rhs::Random(s) => write!(f, "random:{s}"),
        }
    }
}

/// Rows `rows` of the known solution L (rule 4).
pub fn exact_solution(rhs: Rhs, rows: Range<usize>) -> Vec<f64> {
    match rhs {
        Rhs::Ones => vec![1.0; rows.len()],
        Rhs::Random(seed) => {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            // One u64 is two 32-bit words of the stream.
            rng.set_word_pos(2 * rows.start as u128);
            rows.map(|_| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                2.0 * u - 1.0
            })
            .collect()
        }
    }
}

/// A loaded system: A, L and b = A L.
#[derive(Debug)]
pub struct Problem {
    /// The matrix.
    pub a: Arc<Csr>,
    /// The known solution.
    pub l: Vec<f64>,
    /// b = A L.
    pub b: Vec<f64>,
    /// For each block count, which blocks of p each block's rows touch.
    needs: Mutex<HashMap<usize, Arc<Vec<Vec<u32>>>>>,
}

/// The problem of (source, rhs), loaded once per process (rule 3).
pub fn problem(source: &Source, rhs: Rhs) -> Result<Arc<Problem>, ProblemError> {
    cached(&PROBLEMS, &(source.clone(), rhs), || {
        let a = source.matrix()?;
        let l = exact_solution(rhs, 0..a.n_cols);
        let b = a.mul_vec(&l);
        Ok(Problem {
            a,
            l,
            b,
            needs: Mutex::new(HashMap::new()),
        })
    })
}

impl Problem {
    /// Unknowns.
    pub fn n(&self) -> usize {
        self.a.n_rows
    }

    /// For each block of `part`, the blocks whose rows are columns of its rows (its own
    /// always included), ascending: the p blocks its SpMV reads.
    pub fn needs(&self, part: Partition) -> Arc<Vec<Vec<u32>>> {
        let mut guard = self.needs.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .entry(part.blocks)
            .or_insert_with(|| {
                Arc::new(
                    (0..part.blocks)
                        .map(|b| {
                            let rows = part.range(b);
                            let v = self.a.rows(rows);
                            let mut seen = vec![false; part.blocks];
                            seen[b] = true;
                            let entries = v.row_ptr[0] as usize..v.row_ptr[v.len()] as usize;
                            for &c in &v.col[entries] {
                                seen[part.block_of(c as usize)] = true;
                            }
                            // Block indices are below `blocks`, a u32 on the command line.
                            (0..part.blocks)
                                .filter(|&c| seen[c])
                                .map(|c| c as u32)
                                .collect()
                        })
                        .collect(),
                )
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_solutions_are_seekable() {
        let all = exact_solution(Rhs::Random(7), 0..100);
        assert_eq!(exact_solution(Rhs::Random(7), 37..61), all[37..61].to_vec());
        assert!(all.iter().all(|v| (-1.0..1.0).contains(v)));
        assert_ne!(all, exact_solution(Rhs::Random(8), 0..100));
        assert_eq!("random:7".parse::<Rhs>().unwrap(), Rhs::Random(7));
        assert!("random:x".parse::<Rhs>().is_err());
    }

    #[test]
    fn sources_parse() {
        assert_eq!(Source::parse("poisson2d:5").unwrap(), Source::Poisson2d(5));
        assert_eq!(Source::parse("poisson3d:3").unwrap(), Source::Poisson3d(3));
        assert!(Source::parse("poisson3d:0").is_err());
        assert!(Source::parse("poisson3d:5000").is_err());
        assert!(Source::parse("/no/such/file.mtx")
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
        let p = problem(&Source::Poisson2d(6), Rhs::Ones).unwrap();
        let needs = p.needs(Partition::new(36, 4));
        assert_eq!(needs[0], [0, 1]);
        assert_eq!(needs[1], [0, 1, 2]);
        assert_eq!(needs[3], [2, 3]);
    }
}

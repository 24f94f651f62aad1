//! The `cg` program's command line: `cg run --matrix SOURCE [--mode dataflow] [--rhs ones|random:S]
//! [--rtol R] [--max-iter M] [--blocks B] [--batch S]`, plus everything [`veriflow::App`] gives
//! (vnodes, failures, logs, `inspect`, `certify`, `cluster`).

use std::fmt;
use std::str::FromStr;

use clap::Args;
use veriflow::{InvalidArgs, Program, Registry, RegistryError, WrongResult};

use crate::dataflow::{self, Solution, Start};
use crate::problem::{problem, Rhs, Source};

/// How the solve runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every iteration's blocks as tasks of the data-flow runtime ([`crate::dataflow`]).
    Dataflow,
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "dataflow" => Ok(Mode::Dataflow),
            "spmd" => Err(
                "spmd is not available yet (it runs on the iterative mode, still being built); \
                 use --mode dataflow"
                    .to_string(),
            ),
            other => Err(format!("{other:?} is not a mode: the mode is dataflow")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dataflow")
    }
}

/// The CG program and its command-line parameters.
#[derive(Args, Clone, Debug)]
pub struct Cg {
    /// How the solve runs: `dataflow` (iterations as logged, recoverable, certifiable tasks).
    #[arg(long, default_value = "dataflow", value_parser = Mode::from_str)]
    pub mode: Mode,
    /// The matrix: a Matrix Market (.mtx) or Harwell-Boeing (.rsa, .rua, ...) file, or a
    /// generated Poisson matrix poisson2d:N (N^2 unknowns) or poisson3d:N (N^3).
    #[arg(long, value_name = "FILE|poisson2d:N|poisson3d:N", value_parser = Source::parse)]
    pub matrix: Source,
    /// The known solution L, b = A L: `ones` or `random:SEED` (uniform in [-1, 1)).
    #[arg(long, value_name = "ones|random:SEED", default_value = "ones", value_parser = Rhs::from_str)]
    pub rhs: Rhs,
    /// Stop when |r| <= rtol |b|.
    #[arg(long, value_name = "R", default_value_t = 1e-8)]
    pub rtol: f64,
    /// Iteration cap [default: 10 n, as scipy].
    #[arg(long, value_name = "M")]
    pub max_iter: Option<u64>,
    /// Row blocks: the tasks of an iteration and the order of its reductions (results depend on
    /// it, never on vnodes or failures).
    #[arg(long, value_name = "B", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub blocks: u32,
    /// Iterations spawned per batch (dataflow: a batch boundary re-logs x, r, p).
    #[arg(long, value_name = "S", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch: u32,
}

impl Program for Cg {
    const NAME: &'static str = "cg";
    type Root = Start;

    fn register(registry: &mut Registry) -> Result<(), RegistryError> {
        dataflow::register(registry)
    }

    fn validate(&self) -> Result<(), InvalidArgs> {
        if !(self.rtol.is_finite() && self.rtol >= 0.0) {
            return Err(InvalidArgs(format!(
                "--rtol {}: a tolerance is a finite number >= 0",
                self.rtol
            )));
        }
        let p = problem(&self.matrix, self.rhs).map_err(|e| InvalidArgs(e.to_string()))?;
        let a = &p.a;
        if a.n_rows != a.n_cols {
            return Err(InvalidArgs(format!(
                "{}: CG needs a square matrix, this one is {} x {}",
                self.matrix, a.n_rows, a.n_cols
            )));
        }
        if !a.is_symmetric() {
            return Err(InvalidArgs(format!(
                "{}: CG needs a symmetric (positive definite) matrix, this one is not symmetric",
                self.matrix
            )));
        }
        if self.blocks as usize > a.n_rows {
            return Err(InvalidArgs(format!(
                "--blocks {}: the matrix has only {} rows",
                self.blocks, a.n_rows
            )));
        }
        Ok(())
    }

    fn root(&self) -> (Start, ()) {
        (
            Start {
                source: self.matrix.clone(),
                rhs: self.rhs,
                blocks: self.blocks,
                rtol: self.rtol,
                max_iter: self.max_iter,
                batch: self.batch,
            },
            (),
        )
    }

    fn check(&self, (sol,): &(Solution,)) -> Result<serde_json::Value, WrongResult> {
        let wrong = |got: String| WrongResult {
            expected: format!(
                "|r| <= {} |b| within the iteration cap, and x = L",
                self.rtol
            ),
            got,
        };
        let p = problem(&self.matrix, self.rhs).map_err(|e| wrong(e.to_string()))?;
        let report = Report::new(&p.a, &p.b, &p.l, sol);
        if sol.x.len() != p.n() || !sol.x.iter().all(|v| v.is_finite()) {
            return Err(wrong(format!(
                "x of {} entries, {} of them not finite",
                sol.x.len(),
                sol.x.iter().filter(|v| !v.is_finite()).count()
            )));
        }
        if !sol.converged {
            return Err(wrong(format!(
                "relative residual {:e} after {} iterations",
                report.rel_residual, sol.iterations
            )));
        }
        // The recursive residual (what CG tests) and the true one drift apart by rounding;
        // more than a factor 100 (plus a few ulps of |b|) means x is not what the iterations
        // computed.
        if report.true_rel_residual > 100.0 * self.rtol + 1e-12 {
            return Err(wrong(format!(
                "true relative residual |b - A x| / |b| = {:e}",
                report.true_rel_residual
            )));
        }
        Ok(report.to_json())
    }
}

/// How good a solution is: residuals and distance to the known L.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Iterations done.
    pub iterations: u64,
    /// Whether CG's own test passed.
    pub converged: bool,
    /// sqrt(rho) / |b| (CG's recursive residual).
    pub rel_residual: f64,
    /// |b - A x| / |b|.
    pub true_rel_residual: f64,
    /// |x - L| / |L|.
    pub rel_error: f64,
    /// max |x_i - L_i|.
    pub max_error: f64,
    /// |x - L|.
    pub error: f64,
    /// blake3 of x's little-endian bytes: equal digests, bit-identical solutions.
    pub x_digest: String,
    /// Unknowns.
    pub n: usize,
    /// Stored entries of A.
    pub nnz: usize,
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|a| a * a).sum::<f64>().sqrt()
}

impl Report {
    /// Measures `sol` against A, b and L.
    pub fn new(a: &crate::matrix::Csr, b: &[f64], l: &[f64], sol: &Solution) -> Report {
        let x = &sol.x;
        let b_norm = norm(b.iter().copied());
        let (true_res, error, max_error) = if x.len() == b.len() {
            let ax = a.mul_vec(x);
            (
                norm(b.iter().zip(&ax).map(|(b, y)| b - y)),
                norm(x.iter().zip(l).map(|(x, l)| x - l)),
                x.iter()
                    .zip(l)
                    .map(|(x, l)| (x - l).abs())
                    .fold(0.0, f64::max),
            )
        } else {
            (f64::NAN, f64::NAN, f64::NAN)
        };
        let mut bytes = Vec::with_capacity(8 * x.len());
        for v in x {
            bytes.extend_from_slice(&v.to_bits().to_le_bytes());
        }
        let rel = |v: f64, d: f64| if d > 0.0 { v / d } else { v };
        Report {
            iterations: sol.iterations,
            converged: sol.converged,
            rel_residual: rel(sol.rho.sqrt(), b_norm),
            true_rel_residual: rel(true_res, b_norm),
            rel_error: rel(error, norm(l.iter().copied())),
            max_error,
            error,
            x_digest: blake3::hash(&bytes).to_hex().to_string(),
            n: a.n_rows,
            nnz: a.nnz(),
        }
    }

    /// The JSON the run prints as its result.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "iterations": self.iterations,
            "converged": self.converged,
            "rel_residual": self.rel_residual,
            "true_rel_residual": self.true_rel_residual,
            "error": self.error,
            "rel_error": self.rel_error,
            "max_error": self.max_error,
            "x_digest": self.x_digest,
            "n": self.n,
            "nnz": self.nnz,
        })
    }
}

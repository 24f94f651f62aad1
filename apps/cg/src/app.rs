//! The `cg` program's command line: `cg run --matrix SOURCE [--mode dataflow] [--rhs ones|random:S]
//! [--rtol R] [--max-iter M] [--blocks B] [--batch S]`, plus everything [`veriflow::App`] gives
//! (vnodes, failures, logs, `inspect`, `certify`, `cluster`).
//!
//! `cg run --mode spmd ...` is dispatched before [`veriflow::App`] sees it ([`main_from`]): the
//! SPMD solver ([`crate::spmd`]) is not a data-flow program, so it has its own options
//! ([`SpmdArgs`]) next to the program's, and the same exit statuses (0 success, 1 failed or
//! wrong, 2 bad usage).

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use rand::{Rng, SeedableRng};
use veriflow::{InvalidArgs, Program, Registry, RegistryError, WrongResult};
use veriflow_checkpoint::{open_store, Key, StoreSpec};

use crate::dataflow::{self, Solution, Start};
use crate::kernel::{solve, CgOptions};
use crate::problem::{problem, Rhs, Source};
use crate::spmd::{self, Encoding, Kill, SpmdConfig, SpmdError, SpmdReport};

/// How the solve runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every iteration's blocks as tasks of the data-flow runtime ([`crate::dataflow`]).
    Dataflow,
    /// Paper 002's workers owning row blocks, with encoded diskless checkpoints
    /// ([`crate::spmd`]; `cg run` only).
    Spmd,
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "dataflow" => Ok(Mode::Dataflow),
            "spmd" => Ok(Mode::Spmd),
            other => Err(format!("{other:?} is not a mode: dataflow or spmd")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Dataflow => "dataflow",
            Mode::Spmd => "spmd",
        })
    }
}

/// The CG program and its command-line parameters.
#[derive(Args, Clone, Debug)]
pub struct Cg {
    /// How the solve runs: `dataflow` (iterations as logged, recoverable, certifiable tasks) or
    /// `spmd` (workers owning row blocks, encoded diskless checkpoints; `cg run` only).
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
    /// Check x = L: fail unless |x - L| <= T |L|. Without it x = L is not checked (and the
    /// summary says so): a small residual bounds the error only through A's condition number,
    /// which nothing here estimates (a singular A passes any residual test with x far from L).
    #[arg(long, value_name = "T")]
    pub x_tol: Option<f64>,
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

impl Cg {
    /// The checks of the problem both modes share: rtol, a square, symmetric matrix, B <= n.
    pub fn validate_problem(&self) -> Result<(), InvalidArgs> {
        if !(self.rtol.is_finite() && self.rtol >= 0.0) {
            return Err(InvalidArgs(format!(
                "--rtol {}: a tolerance is a finite number >= 0",
                self.rtol
            )));
        }
        if let Some(t) = self.x_tol {
            if !(t.is_finite() && t > 0.0) {
                return Err(InvalidArgs(format!(
                    "--x-tol {t}: a relative error bound is a finite number > 0"
                )));
            }
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
}

impl Program for Cg {
    const NAME: &'static str = "cg";
    const ABOUT: &'static str = env!("CARGO_PKG_DESCRIPTION");
    const RUN_AFTER_HELP: Option<&'static str> = Some(
        "With --mode spmd (workers owning row blocks, encoded diskless checkpoints), run takes \
         its own options (--checkpoint-every, --encoding, --kill-worker, ...): see `cg run \
         --mode spmd --help`.",
    );
    type Root = Start;

    fn register(registry: &mut Registry) -> Result<(), RegistryError> {
        dataflow::register(registry)
    }

    fn validate(&self) -> Result<(), InvalidArgs> {
        if self.mode == Mode::Spmd {
            return Err(InvalidArgs(
                "--mode spmd runs in this process only: use `cg run --mode spmd ...`".to_string(),
            ));
        }
        self.validate_problem()
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
            expected: match self.x_tol {
                Some(t) => format!(
                    "|r| <= {} |b| within the iteration cap, and |x - L| <= {t:e} |L|",
                    self.rtol
                ),
                None => format!("|r| <= {} |b| within the iteration cap", self.rtol),
            },
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
        let mut result = report.to_json();
        match self.x_tol {
            // NaN is never within a bound.
            Some(t) if report.rel_error.is_nan() || report.rel_error > t => {
                return Err(wrong(format!(
                    "|x - L| / |L| = {:e} (a small residual with x far from L: A singular or \
                     ill-conditioned)",
                    report.rel_error
                )))
            }
            Some(t) => result["x_tol"] = serde_json::json!(t),
            None => {
                result["not_checked"] = serde_json::json!(
                    "x = L (the residual bounds |x - L| only through A's condition number; \
                     give --x-tol T to check |x - L| <= T |L|)"
                )
            }
        }
        Ok(result)
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

/// The options of `cg run --mode spmd` next to the program's ([`crate::spmd`]).
#[derive(Args, Clone, Debug)]
pub struct SpmdArgs {
    /// Workers P: vnodes owning row blocks (1 <= P <= --blocks) [default: --blocks].
    #[arg(help_heading = "Runtime", long, value_name = "P", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub vnodes: Option<u32>,
    /// Iterations between checkpoints C (>= 1).
    #[arg(help_heading = "Checkpoints", long, value_name = "C", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: u64,
    /// How checkpoints are encoded: checksum (XOR on one extra vnode), rs:K (Reed-Solomon on K
    /// extra vnodes), float-sum (the paper's floating-point checksum), or none (a failure
    /// restarts the solve).
    #[arg(help_heading = "Checkpoints", long, value_name = "checksum|rs:K|float-sum|none", default_value = "checksum",
          value_parser = Encoding::from_str)]
    pub encoding: Encoding,
    /// Keep the encoding on a store instead of the extra vnodes' memory: local:DIR, memory, or
    /// checkpoint servers (central:ADDR, replicate:R:ADDR,..., parity:M:ADDR,..., ida:M,K:ADDR,...).
    #[arg(help_heading = "Checkpoints", long, value_name = "SPEC")]
    pub store: Option<StoreSpec>,
    /// Key file shared with the checkpoint servers (a remote --store needs it).
    #[arg(help_heading = "Checkpoints", long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Fault injection: worker W loses its state...; repeatable, paired in order with
    /// --kill-at-iteration.
    #[arg(help_heading = "Faults", long = "kill-worker", value_name = "W")]
    pub kill_worker: Vec<u32>,
    /// ... when it starts iteration I.
    #[arg(help_heading = "Faults", long = "kill-at-iteration", value_name = "I")]
    pub kill_at_iteration: Vec<u64>,
    /// Fault injection: N kills, workers and iterations drawn from --kill-seed among the
    /// iterations the solve reaches (found by a fault-free solve first, same bits).
    #[arg(
        help_heading = "Faults",
        long = "kill-random",
        value_name = "N",
        default_value_t = 0
    )]
    pub kill_random: u32,
    /// Seed of --kill-random.
    #[arg(
        help_heading = "Faults",
        long = "kill-seed",
        value_name = "S",
        default_value_t = 0
    )]
    pub kill_seed: u64,
    /// Print one JSON object instead of the human summary.
    #[arg(long, help_heading = "Runtime")]
    pub json: bool,
}

#[derive(Parser, Debug)]
#[command(name = "cg", bin_name = "cg")]
struct SpmdCli {
    #[command(subcommand)]
    command: SpmdCommand,
}

#[derive(Subcommand, Debug)]
enum SpmdCommand {
    /// Run CG with --mode spmd: workers owning row blocks, encoded diskless checkpoints.
    Run {
        #[command(flatten, next_help_heading = "Program")]
        program: Cg,
        #[command(flatten)]
        spmd: SpmdArgs,
    },
}

impl SpmdArgs {
    /// The kills: the explicit pairs, then `--kill-random` drawn from the seed among
    /// iterations 1..=`reached` (the last iteration the solve starts: a kill there lands, rule
    /// 4 of [`crate::spmd`]; issue 13 point 10, kills drawn up to 500 on solves of 137
    /// iterations killed nothing).
    pub fn kills(&self, workers: u32, reached: u64) -> Result<Vec<Kill>, String> {
        if self.kill_worker.len() != self.kill_at_iteration.len() {
            return Err(format!(
                "{} --kill-worker but {} --kill-at-iteration: give them in pairs",
                self.kill_worker.len(),
                self.kill_at_iteration.len()
            ));
        }
        let mut kills: Vec<Kill> = self
            .kill_worker
            .iter()
            .zip(&self.kill_at_iteration)
            .map(|(&worker, &iteration)| Kill { worker, iteration })
            .collect();
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(self.kill_seed);
        let horizon = reached.max(1);
        for _ in 0..self.kill_random {
            // Modulo bias is below 2^-50 for these ranges: irrelevant for fault injection.
            let worker = (rng.next_u64() % u64::from(workers.max(1))) as u32;
            let iteration = 1 + rng.next_u64() % horizon;
            kills.push(Kill { worker, iteration });
        }
        Ok(kills)
    }
}

/// The `cg` binary: `run --mode spmd` here, everything else through [`veriflow::App`].
pub fn main() -> ExitCode {
    main_from(std::env::args_os().collect())
}

/// [`main`] on given arguments (the first is the binary name).
pub fn main_from(args: Vec<OsString>) -> ExitCode {
    let text: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let spmd = text.get(1).is_some_and(|c| c == "run")
        && (text.windows(2).any(|w| w[0] == "--mode" && w[1] == "spmd")
            || text.iter().any(|a| a == "--mode=spmd"));
    if spmd {
        spmd_main(args)
    } else {
        veriflow::App::<Cg>::main_from(args)
    }
}

fn usage(msg: String) -> ExitCode {
    let mut cmd = SpmdCli::command();
    let err = match cmd.find_subcommand_mut("run") {
        Some(run) => run.error(clap::error::ErrorKind::ArgumentConflict, msg),
        None => cmd.error(clap::error::ErrorKind::ArgumentConflict, msg),
    };
    let _ = err.print();
    ExitCode::from(2)
}

fn spmd_main(args: Vec<OsString>) -> ExitCode {
    let parsed = SpmdCli::command()
        .try_get_matches_from(args)
        .and_then(|m| SpmdCli::from_arg_matches(&m));
    let SpmdCommand::Run {
        program,
        spmd: opts,
    } = match parsed {
        Ok(cli) => cli.command,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    if let Err(e) = program.validate_problem() {
        return usage(e.0);
    }
    let n = match problem(&program.matrix, program.rhs) {
        Ok(p) => p.n(),
        Err(e) => return usage(e.to_string()),
    };
    let workers = opts.vnodes.unwrap_or(program.blocks);
    let max_iter = program
        .max_iter
        .unwrap_or_else(|| 10u64.saturating_mul(n as u64));
    // The iterations the solve reaches: the same bits as the fault-free sequential solve with
    // the same blocks (rule 2 of `kernel.rs`), which only --kill-random needs.
    let reached = if opts.kill_random == 0 {
        max_iter
    } else {
        let solved = problem(&program.matrix, program.rhs).map(|p| {
            let opts = CgOptions {
                rtol: program.rtol,
                max_iter,
                blocks: program.blocks as usize,
            };
            solve(&p.a, &p.b, &opts)
        });
        match solved {
            Ok(Ok(out)) => out.iterations,
            Ok(Err(e)) => return fail(&e.to_string()),
            Err(e) => return usage(e.to_string()),
        }
    };
    let kills = match opts.kills(workers, reached) {
        Ok(k) => k,
        Err(e) => return usage(e),
    };
    let store = match &opts.store {
        None => None,
        Some(spec) => {
            let key = match (spec, &opts.key) {
                (StoreSpec::Remote(_), Some(k)) => match Key::load(k) {
                    Ok(k) => Some(k),
                    Err(e) => return fail(&format!("--key {}: {e}", k.display())),
                },
                _ => None,
            };
            match open_store(spec, key.as_ref()) {
                Ok(s) => Some(s),
                Err(e) => return fail(&format!("--store {spec}: {e}")),
            }
        }
    };
    let cfg = SpmdConfig {
        source: program.matrix.clone(),
        rhs: program.rhs,
        rtol: program.rtol,
        max_iter: program.max_iter,
        blocks: program.blocks,
        workers,
        checkpoint_every: opts.checkpoint_every,
        encoding: opts.encoding,
        store,
        kills,
    };
    let planned = cfg.kills.len() as u64;
    let report = match spmd::run(&cfg) {
        Ok(r) => r,
        Err(SpmdError::Config(m)) => return usage(m),
        Err(e) => return fail(&e.to_string()),
    };
    let checked = program.check(&(report.solution.clone(),));
    print_spmd(&program, &opts, &report, planned, &checked);
    match checked {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(&e.to_string()),
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("cg: error: {msg}");
    ExitCode::FAILURE
}

/// The summary of an SPMD run: the result as for data-flow runs, plus checkpoints and
/// recoveries.
/// `planned`: the kills asked for; those that did not happen (their iteration was never
/// started) are `faults_without_effect`.
pub fn spmd_json(
    opts: &SpmdArgs,
    report: &SpmdReport,
    planned: u64,
    checked: &Result<serde_json::Value, WrongResult>,
) -> serde_json::Value {
    serde_json::json!({
        "program": "cg",
        "mode": "spmd",
        "result": checked.as_ref().ok(),
        "correct": checked.is_ok(),
        "workers": report.workers,
        "encoders": report.encoders,
        "encoding": opts.encoding.to_string(),
        "checkpoint_every": opts.checkpoint_every,
        "store": opts.store.as_ref().map(|s| s.to_string()),
        "checkpoints": report.checkpoints,
        "checkpoint_s": report.checkpoint_s,
        "encode_s": report.encode_s,
        "encoding_bytes": report.encoding_bytes,
        "state_bytes": report.state_bytes,
        "kills": report.kills,
        "faults_injected": planned,
        "faults_without_effect": planned.saturating_sub(report.kills),
        "recoveries": report.recoveries,
        "recovery_s": report.recovery_s,
        "iterations_redone": report.iterations_redone,
        "recovery_error": report.recovery_error,
        "elapsed_s": report.elapsed_s,
    })
}

fn print_spmd(
    program: &Cg,
    opts: &SpmdArgs,
    report: &SpmdReport,
    planned: u64,
    checked: &Result<serde_json::Value, WrongResult>,
) {
    if opts.json {
        println!("{}", spmd_json(opts, report, planned, checked));
        return;
    }
    match checked {
        Ok(v) => println!("cg: result {v} {}", veriflow::checked_note(v)),
        Err(e) => println!("cg: {e}"),
    }
    println!(
        "spmd: {} iterations in {:.3} s on {} workers ({} blocks) + {} encoder vnode(s)",
        report.solution.iterations,
        report.elapsed_s,
        report.workers,
        program.blocks,
        report.encoders
    );
    println!(
        "checkpoints: {} ({}, every {} iterations{}), {:.3} s on the workers' path, {:.3} s \
         encoding; {} bytes of encoding for {} bytes of state",
        report.checkpoints,
        opts.encoding,
        opts.checkpoint_every,
        opts.store
            .as_ref()
            .map_or(", in memory".to_string(), |s| format!(", on {s}")),
        report.checkpoint_s,
        report.encode_s,
        report.encoding_bytes,
        report.state_bytes
    );
    if report.kills > 0 {
        println!(
            "recovery: {} worker(s) killed, {} recovery(ies) in {:.3} s, {} iterations redone{}",
            report.kills,
            report.recoveries,
            report.recovery_s,
            report.iterations_redone,
            report
                .recovery_error
                .map_or(String::new(), |e| format!(", recovery error {e:e}"))
        );
    }
    let missed = planned.saturating_sub(report.kills);
    if missed > 0 {
        println!(
            "faults: {missed} of the {planned} kill(s) asked for did not happen: the solve ended \
             before their iteration"
        );
    }
}

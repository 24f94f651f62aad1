//! [`App`]: the command line every application binary gets.
//!
//! ```text
//! APP run [program options] [--threads T] [--vnodes V] [--log-dir DIR] [--no-checkpoint]
//!         [--seed S] [--json]
//! APP inspect --log-dir DIR [--json] [--dot FILE]
//! ```
//!
//! Exit status: 0 on success, 1 when the run fails or its result is wrong, 2 on bad usage
//! (clap's own code for a bad flag, also used for invalid program options).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use veriflow_checkpoint::{SledStore, Store, StoreError};
use veriflow_runtime::log::{CommitPolicy, LogError};
use veriflow_runtime::{Kill, Registry, RegistryError, RunError, Runtime, Task, VnodeId};

use crate::inspect;

/// A program: its command-line parameters, its tasks and its root (implement this, then call
/// [`App::main`]).
pub trait Program: Args + Clone + Send + Sync + 'static {
    /// Program name: the binary's name and part of the root task's id.
    const NAME: &'static str;
    /// The root task.
    type Root: Task;
    /// Registers every task type the program spawns.
    fn register(registry: &mut Registry) -> Result<(), RegistryError>;
    /// Checks parameters that clap cannot check alone.
    fn validate(&self) -> Result<(), InvalidArgs> {
        Ok(())
    }
    /// The root task and the program inputs.
    fn root(&self) -> (Self::Root, <Self::Root as Task>::Inputs);
    /// Tasks the run will have, if known (for the progress bar).
    fn expected_tasks(&self) -> Option<u64> {
        None
    }
    /// Checks the terminal outputs and returns the result to report.
    fn check(
        &self,
        outputs: &<Self::Root as Task>::Outputs,
    ) -> Result<serde_json::Value, WrongResult>;
}

/// Program options that are invalid together (a usage error, exit status 2).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct InvalidArgs(pub String);

/// A run finished with a result its program says is wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[error("wrong result: expected {expected}, got {got}")]
pub struct WrongResult {
    /// What the program expected.
    pub expected: String,
    /// What the run produced.
    pub got: String,
}

/// Why a command failed (exit status 1).
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Wrong(#[from] WrongResult),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Parser, Debug)]
struct Cli<P: Program> {
    #[command(subcommand)]
    command: Command<P>,
}

#[derive(Subcommand, Debug)]
enum Command<P: Program> {
    /// Run the program on the embedded runtime (one process, no servers).
    Run(RunArgs<P>),
    /// Show what a run's logs hold.
    Inspect(InspectArgs),
}

#[derive(Args, Debug)]
struct RunArgs<P: Program> {
    #[command(flatten)]
    program: P,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

/// Options of every `run`.
#[derive(Args, Debug, Clone)]
struct RuntimeArgs {
    /// Worker threads [default: the machine's cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
    /// Virtual nodes [default: one per thread].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    vnodes: Option<u32>,
    /// Directory of the event logs (a sled store); must not hold a run yet
    /// [default: a fresh directory, printed].
    #[arg(long, value_name = "DIR", conflicts_with = "no_checkpoint")]
    log_dir: Option<PathBuf>,
    /// Log nothing (the S0 baseline of paper 001).
    #[arg(long)]
    no_checkpoint: bool,
    /// Finish an interrupted run from the logs in --log-dir (same program options and vnodes):
    /// completed tasks are not run again.
    #[arg(long, requires = "log_dir")]
    resume: bool,
    /// Seed of the vnodes' random choices.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Group commit: seal a log segment at this many KiB.
    #[arg(long, value_name = "KIB", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=65536))]
    commit_kib: u64,
    /// Group commit: seal a non-empty segment after this many ms.
    #[arg(long, value_name = "MS", default_value_t = 5)]
    commit_ms: u64,
    /// Fault injection: vnode V fails (all its memory lost) and is recovered from its log;
    /// repeatable, each paired in order with a --kill-after.
    #[arg(
        long = "kill-vnode",
        value_name = "V",
        conflicts_with = "no_checkpoint"
    )]
    kill_vnode: Vec<u32>,
    /// ... once N tasks have completed in the whole run.
    #[arg(long = "kill-after", value_name = "N")]
    kill_after: Vec<u64>,
    /// Fault injection: K failures of vnodes and at points drawn from --seed.
    #[arg(
        long = "kill-random",
        value_name = "K",
        default_value_t = 0,
        conflicts_with = "no_checkpoint"
    )]
    kill_random: u32,
    /// Print one JSON object instead of the human summary.
    #[arg(long)]
    json: bool,
}

impl RuntimeArgs {
    /// The failures to inject: the explicit ones, then `--kill-random` drawn from the seed
    /// (vnodes uniformly, points uniformly over the expected tasks, or the first 1000).
    fn kills(&self, vnodes: u32, expected_tasks: Option<u64>) -> Result<Vec<Kill>, InvalidArgs> {
        if self.kill_vnode.len() != self.kill_after.len() {
            return Err(InvalidArgs(format!(
                "{} --kill-vnode but {} --kill-after: give them in pairs",
                self.kill_vnode.len(),
                self.kill_after.len()
            )));
        }
        let mut kills = Vec::new();
        for (&v, &after) in self.kill_vnode.iter().zip(&self.kill_after) {
            if v >= vnodes {
                return Err(InvalidArgs(format!(
                    "--kill-vnode {v}: the run has {vnodes} vnodes"
                )));
            }
            kills.push(Kill {
                vnode: VnodeId(v),
                after,
            });
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0x6b69_6c6c); // "kill"
        let horizon = expected_tasks.unwrap_or(1000).max(1);
        for _ in 0..self.kill_random {
            let vnode = VnodeId(rng.gen_range(0..vnodes));
            kills.push(Kill {
                vnode,
                after: rng.gen_range(0..horizon),
            });
        }
        Ok(kills)
    }
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// Directory of the event logs.
    #[arg(long, value_name = "DIR")]
    log_dir: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Write the data-flow graph in graphviz dot to FILE.
    #[arg(long, value_name = "FILE")]
    dot: Option<PathBuf>,
}

/// The command line of an application (see the module docs).
#[derive(Debug)]
pub struct App<P: Program>(std::marker::PhantomData<P>);

impl<P: Program> App<P> {
    /// Parses `std::env::args` and runs the command.
    pub fn main() -> ExitCode {
        Self::main_from(std::env::args_os())
    }

    /// Parses `args` (the first is the binary name) and runs the command.
    pub fn main_from<I, T>(args: I) -> ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        init_tracing();
        let mut cmd = Cli::<P>::command().name(P::NAME).bin_name(P::NAME);
        let cli = match cmd
            .try_get_matches_from_mut(args)
            .and_then(|m| Cli::<P>::from_arg_matches(&m))
        {
            Ok(cli) => cli,
            Err(e) => {
                let _ = e.print();
                return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
            }
        };
        let result = match cli.command {
            Command::Run(args) => {
                let threads = args.runtime.threads.unwrap_or_else(|| {
                    std::thread::available_parallelism()
                        .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
                });
                let vnodes = args.runtime.vnodes.unwrap_or(threads);
                let checked = args
                    .program
                    .validate()
                    .and_then(|()| args.runtime.kills(vnodes, args.program.expected_tasks()));
                let kills = match checked {
                    Ok(kills) => kills,
                    Err(e) => {
                        let kind = clap::error::ErrorKind::ArgumentConflict;
                        let err = match cmd.find_subcommand_mut("run") {
                            Some(run) => run.error(kind, e.0),
                            None => cmd.error(kind, e.0),
                        };
                        let _ = err.print();
                        return ExitCode::from(2);
                    }
                };
                run::<P>(&args.program, &args.runtime, kills)
            }
            Command::Inspect(args) => inspect_cmd::<P>(&args),
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{}: error: {e}", P::NAME);
                ExitCode::FAILURE
            }
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VERIFLOW_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn registry<P: Program>() -> Result<Registry, RegistryError> {
    let mut r = Registry::new();
    P::register(&mut r)?;
    r.register::<P::Root>()?;
    Ok(r)
}

fn run<P: Program>(program: &P, rt: &RuntimeArgs, kills: Vec<Kill>) -> Result<(), CliError> {
    let log_dir = if rt.no_checkpoint {
        None
    } else {
        Some(match &rt.log_dir {
            Some(d) => d.clone(),
            None => tempfile::Builder::new()
                .prefix(&format!("veriflow-{}-", P::NAME))
                .tempdir()
                .map_err(|source| CliError::Io {
                    what: "cannot create a log directory in",
                    path: std::env::temp_dir(),
                    source,
                })?
                .keep(),
        })
    };
    let mut builder = Runtime::builder(registry::<P>()?)
        .program(P::NAME)
        .seed(rt.seed)
        .commit_policy(CommitPolicy {
            // Bounded to 64 MiB by the parser.
            max_bytes: usize::try_from(rt.commit_kib << 10).unwrap_or(usize::MAX),
            max_delay: Duration::from_millis(rt.commit_ms),
        });
    if let Some(t) = rt.threads {
        builder = builder.threads(t as usize);
    }
    if let Some(v) = rt.vnodes {
        builder = builder.vnodes(v);
    }
    if let Some(dir) = &log_dir {
        let store: Arc<dyn Store> = Arc::new(SledStore::open(dir)?);
        builder = builder.store(store);
    }
    builder = builder.kills(kills);
    let bar = progress_bar(rt.json, program.expected_tasks());
    if let Some(bar) = &bar {
        let bar = bar.clone();
        builder = builder.on_progress(Arc::new(move |n| bar.set_position(n)));
    }
    let runtime = builder.build()?;
    let (root, inputs) = program.root();
    let outcome = if rt.resume {
        runtime.resume(root, inputs)
    } else {
        runtime.run(root, inputs)
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let report = outcome?;
    let checked = program.check(&report.outputs);
    let secs = report.elapsed.as_secs_f64();
    let log_dir_text = log_dir.as_ref().map(|d| d.display().to_string());
    if rt.json {
        let summary = json!({
            "program": P::NAME,
            "result": checked.as_ref().ok(),
            "correct": checked.is_ok(),
            "tasks": report.tasks,
            "elapsed_s": secs,
            "tasks_per_s": report.tasks as f64 / secs.max(1e-9),
            "events": report.events,
            "log_dir": log_dir_text,
            "checkpoint": log_dir.is_some(),
            "threads": runtime.threads(),
            "vnodes": runtime.vnodes(),
            "seed": rt.seed,
            "root": format!("{:#}", report.root),
            "steals": report.vnodes.iter().map(|s| s.adopted).sum::<u64>(),
            "failures": report.vnodes.iter().map(|s| s.failures).sum::<u64>(),
            "recovered_tasks": report.vnodes.iter().map(|s| s.recovered_tasks).sum::<u64>(),
            "reused_tasks": report.vnodes.iter().map(|s| s.reused_tasks).sum::<u64>(),
            "per_vnode": report.vnodes,
        });
        println!("{summary}");
    } else {
        match &checked {
            Ok(v) => println!("{}: result {v} (checked)", P::NAME),
            Err(e) => println!("{}: {e}", P::NAME),
        }
        println!(
            "tasks: {} in {secs:.3} s ({:.0} tasks/s) on {} threads, {} vnodes, {} steals",
            report.tasks,
            report.tasks as f64 / secs.max(1e-9),
            runtime.threads(),
            runtime.vnodes(),
            report.vnodes.iter().map(|s| s.adopted).sum::<u64>(),
        );
        let failures: u64 = report.vnodes.iter().map(|s| s.failures).sum();
        let reused: u64 = report.vnodes.iter().map(|s| s.reused_tasks).sum();
        if failures > 0 || reused > 0 {
            println!(
                "recovery: {failures} vnode failure(s){}; {} tasks restarted from the logs, \
                 {reused} completed tasks reused",
                if rt.resume {
                    ", resumed from the logs"
                } else {
                    ""
                },
                report.vnodes.iter().map(|s| s.recovered_tasks).sum::<u64>(),
            );
        }
        match &log_dir_text {
            Some(d) => println!(
                "events: {} logged, all durable; log dir: {d}",
                report.events
            ),
            None => println!("events: none (--no-checkpoint)"),
        }
    }
    checked.map(drop).map_err(CliError::from)
}

fn progress_bar(json: bool, total: Option<u64>) -> Option<ProgressBar> {
    if json || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = match total {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} tasks ({per_sec}, eta {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    Some(bar)
}

fn inspect_cmd<P: Program>(args: &InspectArgs) -> Result<(), CliError> {
    let registry = registry::<P>()?;
    let store: Arc<dyn Store> = Arc::new(SledStore::open_existing(&args.log_dir)?);
    let report = inspect::inspect(store, &registry)?;
    if let Some(path) = &args.dot {
        std::fs::write(path, report.graph.to_dot()).map_err(|source| CliError::Io {
            what: "cannot write",
            path: path.clone(),
            source,
        })?;
    }
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
        if let Some(path) = &args.dot {
            println!("graph written to {}", path.display());
        }
    }
    Ok(())
}

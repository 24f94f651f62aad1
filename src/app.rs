//! [`App`]: the command line every application binary gets.
//!
//! ```text
//! APP run [program options] [--threads T] [--vnodes V] [--log-dir DIR | --store SPEC
//!         --key FILE | --no-checkpoint | --keep-log] [--resume] [--seed S] [--json]
//!         [fault and forgery injection] [--certify [--epsilon E] [--q Q]]
//! APP inspect (--log-dir DIR | --store SPEC --key FILE) [--json] [--dot FILE] [--html FILE]
//!         [--certificate CERT]
//! APP certify (--log-dir DIR | --store SPEC --key FILE) [--epsilon E] [--q Q] [--outputs all|ID,..] [--seed S] [--correct]
//!         [--full] [--out FILE] [--json] [--oracle-key FILE]
//! APP certify --verify CERT (--log-dir DIR | --store SPEC --key FILE)
//!         [--public-key PUB | --oracle-key FILE]
//! APP keygen FILE [--public PUB]
//! APP public-key [--oracle-key FILE] [--out PUB]
//! ```
//!
//! Certificates are signed with the oracle's Ed25519 key (`--oracle-key`, whose 32 bytes are
//! the Ed25519 secret key); `public-key` prints or writes its public key, which is all that
//! `certify --verify --public-key` needs. Old certificates sealed with a MAC (format 1) verify
//! with `--oracle-key` only (`veriflow_certifier::certificate`, rule 3).
//!
//! `run --help` shows what applies to the program: the iterative-only options (`--kill-every`,
//! `--loss`) only for programs with an iterative mode ([`Program::ITERATIVE`]), and they are a
//! usage error in a data-flow run; [`Program::RUN_AFTER_HELP`] points to other modes' options.
//! A short `-n` is always the problem's size n as its paper writes it (knary's depth, N-Queens'
//! board size).
//!
//! Exit status: 0 on success (and ACCEPT), 1 when the run fails, its result is wrong or the
//! certifier says REJECT, 2 on bad usage (clap's own code for a bad flag, also used for invalid
//! program options), 128 + the signal (130, 143) when SIGINT or SIGTERM stopped a run, which
//! `--resume` then finishes (`interrupt.rs`, which also says when `run` removes the log
//! directory it made).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use veriflow_certifier::{
    Certificate, CertifyError, Decision, OracleKey, OraclePublicKey, PublicKeyError, Track,
    VerifyError,
};
use veriflow_checkpoint::{
    open_store, Key, KeyError, MemoryStore, Namespaced, Store, StoreError, StoreSpec,
};
use veriflow_runtime::log::{
    CommitPolicy, LogError, CLUSTER_MAX_DELAY, DEFAULT_CHECKPOINT_BYTES, DEFAULT_MAX_DELAY,
};
use veriflow_runtime::{
    DataId, Forge, IdSet, Kill, Registry, RegistryError, RunError, Runtime, Task, TaskId, VnodeId,
};

use crate::inspect;

/// A program: its command-line parameters, its tasks and its root (implement this, then call
/// [`App::main`]).
pub trait Program: Args + Clone + Send + Sync + 'static {
    /// Program name: the binary's name and part of the root task's id.
    const NAME: &'static str;
    /// One line saying what the program computes: the first line of `--help`.
    const ABOUT: &'static str = "A veriflow program";
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
    /// Checks the terminal outputs and returns the result to report. A result object with a
    /// string `not_checked` says what the check could not verify: the summary prints it
    /// ([`checked_note`]) instead of a bare "(checked)".
    fn check(
        &self,
        outputs: &<Self::Root as Task>::Outputs,
    ) -> Result<serde_json::Value, WrongResult>;
    /// Whether some options select iterative mode ([`Program::iterative`]): `run --help` shows
    /// the iterative-only options (`--kill-every`, `--loss`) only for such programs.
    const ITERATIVE: bool = false;
    /// Said at the end of `run --help` (other modes' options, say).
    const RUN_AFTER_HELP: Option<&'static str> = None;
    /// Iterative mode (paper 000): `Some` when these options select it. Cluster members then
    /// run the blocks with `veriflow_runtime::iterative::run_member` instead of the data-flow
    /// runtime, and the job's result is [`Iterative::check`] of the final states.
    fn iterative(&self) -> Option<Iterative> {
        None
    }
}

/// The checker of an iterative run's final states.
pub type IterCheck = Arc<
    dyn Fn(&veriflow_runtime::iterative::IterReport) -> Result<serde_json::Value, WrongResult>
        + Send
        + Sync,
>;

/// An iterative run of a [`Program`]: its configuration, its blocks, and the check of its
/// result.
#[derive(Clone)]
pub struct Iterative {
    /// Mode, neighbours, tolerance, backups.
    pub config: veriflow_runtime::iterative::IterConfig,
    /// Makes each vnode's block.
    pub factory: veriflow_runtime::iterative::BlockFactory,
    /// Checks the final states (all vnodes, by vnode) and returns the result to report.
    pub check: IterCheck,
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
pub(crate) enum CliError {
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
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    PublicKey(#[from] PublicKeyError),
    #[error(transparent)]
    Certify(#[from] CertifyError),
    #[error("certificate {path}: {source}")]
    Verify { path: PathBuf, source: VerifyError },
    #[error(transparent)]
    Cluster(#[from] veriflow_cluster::ClusterError),
    #[error(transparent)]
    Alloc(#[from] veriflow_cluster::alloc::slurm::AllocError),
    #[error("{0}")]
    Invalid(String),
    /// The command line asks for something that cannot be done as asked: exit 2, as clap's
    /// own usage errors.
    #[error("{0}")]
    Usage(String),
    #[error("certification: REJECT")]
    Rejected,
    /// Stopped by a signal (`interrupt.rs` rule 2): exits with 128 + `signal`.
    #[error("interrupted by {}", crate::interrupt::signal_name(*signal))]
    Interrupted { signal: i32 },
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
    /// Certify a finished run: re-run randomly drawn tasks on the trusted oracle (paper 001 §V).
    Certify(CertifyArgs),
    /// Write a fresh 32-byte key to FILE (owner-only; never overwrites).
    Keygen(KeygenArgs),
    /// Print (or write) the oracle's Ed25519 public key, which verifies its certificates.
    PublicKey(PublicKeyArgs),
    /// Run the cluster's coordinator (the trusted fault-tolerance module).
    Coordinator(crate::cluster_cli::CoordinatorArgs),
    /// Run a worker that joins a coordinator and hosts vnodes of its jobs.
    Worker(crate::cluster_cli::WorkerArgs),
    /// Run the program on a cluster and print the same summary as `run`.
    Submit(crate::cluster_cli::SubmitArgs<P>),
    /// Show a coordinator's view of its cluster: its jobs, workers, vnode maps and failures.
    Status(crate::cluster_cli::StatusArgs),
    /// List a coordinator's jobs: queued, running, and the last ones ended.
    Jobs(crate::cluster_cli::JobsArgs),
    /// Act on one job of a coordinator (cancel it).
    Job(crate::cluster_cli::JobCmdArgs),
    /// Run the online oracle: certify a cluster's jobs while they run, have forgers evicted.
    Oracle(crate::cluster_cli::OracleArgs),
    /// Get workers from a resource manager (Slurm): submit, list and cancel allocations whose
    /// jobs run `worker`, and keep them allocated while the coordinator has work.
    Alloc(crate::alloc_cli::AllocArgs),
    /// Start a whole cluster on loopback (checkpoint servers, coordinator, workers), run the
    /// program on it, tear it down, and print the summary.
    Cluster(crate::cluster_cli::ClusterArgs<P>),
    /// Run jobs back to back on loopback clusters of real processes while a seeded schedule
    /// kills and pauses workers, checkpoint servers and coordinators; check and certify each.
    Chaos(crate::chaos::ChaosArgs),
}

/// The command line of program `P`: its name, its one-line description, the version, and
/// `run --help` in groups ([`run_heading`]).
fn command<P: Program>() -> clap::Command {
    Cli::<P>::command()
        .name(P::NAME)
        .bin_name(P::NAME)
        .about(P::ABOUT)
        .version(env!("CARGO_PKG_VERSION"))
        .mut_subcommand("run", |run| {
            let run = run.mut_args(|a| {
                let id = a.get_id().as_str();
                let hide = !P::ITERATIVE && ITERATIVE_ONLY.contains(&id);
                match run_heading(id) {
                    Some(heading) => a.help_heading(heading).hide(hide),
                    None => a,
                }
            });
            match P::RUN_AFTER_HELP {
                Some(text) => run.after_help(text),
                None => run,
            }
        })
}

/// `run` options of iterative mode only: hidden for programs without it, refused in a data-flow
/// run ([`RuntimeArgs::check_dataflow`]).
const ITERATIVE_ONLY: [&str; 2] = ["kill_every_ms", "loss"];

/// The group of a `run` option in `--help`: the program's own options first, then the
/// runtime, storage, faults and certification.
fn run_heading(id: &str) -> Option<&'static str> {
    Some(match id {
        "help" => return None,
        "threads" | "vnodes" | "seed" | "json" | "resume" => "Runtime",
        "log_dir" | "store" | "key" | "run" | "no_checkpoint" | "keep_log" | "commit_kib"
        | "commit_ms" | "checkpoint_kib" | "stored_from" => "Storage",
        "kill_vnode" | "kill_after" | "kill_random" | "kill_every_ms" | "loss" | "forge_vnode"
        | "forge_rate" | "forge_tasks" | "forge_seed" => "Faults",
        "certify" | "epsilon" | "q" | "oracle_key" | "cert_out" => "Certification",
        _ => "Program",
    })
}

/// Parses a job's command line (`submit ...` or `cluster ...`, as typed) for its job
/// arguments: every worker reads the program's options the way the client did.
pub(crate) fn parse_job_args<P: Program>(
    argv: &[String],
) -> Result<crate::cluster_cli::JobArgs<P>, String> {
    let cmd = command::<P>();
    let all = std::iter::once(P::NAME.to_string()).chain(argv.iter().cloned());
    let m = cmd.try_get_matches_from(all).map_err(|e| e.to_string())?;
    match Cli::<P>::from_arg_matches(&m)
        .map_err(|e| e.to_string())?
        .command
    {
        Command::Submit(a) => Ok(a.job),
        Command::Cluster(a) => Ok(a.job),
        _ => Err("a job's command line is `submit ...` or `cluster ...`".to_string()),
    }
}

#[derive(Args, Debug)]
struct KeygenArgs {
    /// Where to write the key.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Also write the key's Ed25519 public key to PUB (for an oracle key: what anyone needs to
    /// verify its certificates with `certify --verify CERT --public-key PUB`).
    #[arg(long, value_name = "PUB")]
    public: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct PublicKeyArgs {
    /// The oracle's key file [default: veriflow/oracle.key in the user's config directory,
    /// created with owner-only permissions on first use].
    #[arg(long = "oracle-key", value_name = "FILE")]
    oracle_key: Option<PathBuf>,
    /// Write the public key to PUB (never replacing another key) instead of printing it.
    #[arg(long, value_name = "PUB")]
    out: Option<PathBuf>,
}

/// Parameters of a certification, shared by `run --certify` and `certify`.
#[derive(Args, Debug, Clone)]
pub(crate) struct CertifyParams {
    /// Risk accepted of certifying a forged run.
    #[arg(long, value_name = "E", default_value_t = 0.05)]
    pub(crate) epsilon: f64,
    /// Assumed bound on the fraction of forged tasks.
    #[arg(long, value_name = "Q", default_value_t = 0.01)]
    pub(crate) q: f64,
    /// The oracle's key file (its Ed25519 secret key), which signs certificates [default:
    /// veriflow/oracle.key in the user's config directory, created with owner-only permissions
    /// on first use]. Keep it apart from the cluster's --key: workers hold that one, and must
    /// not sign certificates.
    #[arg(long = "oracle-key", value_name = "FILE")]
    pub(crate) oracle_key: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("where").required(true).args(["log_dir", "store"])))]
struct CertifyArgs {
    /// The run's logs.
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    params: CertifyParams,
    /// Terminal outputs to certify: `all`, or full data ids separated by commas.
    #[arg(long, value_name = "all|ID,..", default_value = "all")]
    outputs: String,
    /// Seed of the draw [default: derived from the digest of the log, and recorded].
    #[arg(long, value_name = "S")]
    seed: Option<u64>,
    /// Correct forged tasks (Algorithm 1): re-execute them and their successors, write the
    /// corrected log as a new generation (the original is kept), and certify again.
    #[arg(long)]
    correct: bool,
    /// Re-run every task of G_S (full duplication) instead of a sample.
    #[arg(long)]
    full: bool,
    /// Write the signed certificate (JSON) to FILE.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Print the certificate as JSON instead of the human summary.
    #[arg(long)]
    json: bool,
    /// Instead of certifying: check that certificate CERT is intact (its Ed25519 signature under
    /// --public-key, or under --oracle-key's public key) and belongs to the log in --log-dir.
    #[arg(long, value_name = "CERT", conflicts_with_all = ["correct", "full", "out", "seed"])]
    verify: Option<PathBuf>,
    /// With --verify: the oracle's public key file (`public-key --out PUB`): all anyone needs
    /// to verify its certificates. Old MAC certificates (format 1) need --oracle-key instead.
    #[arg(
        long = "public-key",
        value_name = "PUB",
        requires = "verify",
        conflicts_with = "oracle_key"
    )]
    public_key: Option<PathBuf>,
    /// Oracle threads [default: the machine's cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs<P: Program> {
    #[command(flatten)]
    pub(crate) program: P,
    #[command(flatten)]
    pub(crate) runtime: RuntimeArgs,
    #[command(flatten)]
    pub(crate) forge: ForgeArgs,
    /// Certify the run right after it (needs the log).
    #[arg(long, conflicts_with = "no_checkpoint")]
    pub(crate) certify: bool,
    #[command(flatten)]
    certify_params: CertifyParams,
    /// With --certify: write the signed certificate (JSON) to FILE.
    #[arg(long, value_name = "FILE", requires = "certify")]
    cert_out: Option<PathBuf>,
}

/// Forgery injection: lying vnodes, for tests and demos of the certifier.
#[derive(Args, Debug, Clone)]
pub(crate) struct ForgeArgs {
    /// Make vnode V lie: return and log wrong (plausible) outputs, each task with probability
    /// --forge-rate; repeatable.
    #[arg(long = "forge-vnode", value_name = "V", requires = "forge_rate")]
    pub(crate) forge_vnode: Vec<u32>,
    /// Probability that a task run on a --forge-vnode lies.
    #[arg(long = "forge-rate", value_name = "Q", requires = "forge_vnode")]
    pub(crate) forge_rate: Option<f64>,
    /// Make exactly N tasks lie, drawn at random among the tasks that write a value (a first,
    /// unlogged run finds them).
    #[arg(long = "forge-tasks", value_name = "N", conflicts_with = "forge_vnode")]
    pub(crate) forge_tasks: Option<u64>,
    /// Seed of the choice of lying tasks and of their wrong values.
    #[arg(long = "forge-seed", value_name = "S", default_value_t = 0)]
    forge_seed: u64,
}
/// Where a run's logs live: `--log-dir DIR` (short for `--store local:DIR`) or `--store SPEC`,
/// with `--key FILE` for checkpoint servers.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct StoreArgs {
    /// Directory of the event logs (a sled store; short for --store local:DIR).
    #[arg(long, value_name = "DIR", conflicts_with = "store")]
    log_dir: Option<PathBuf>,
    /// Where the event logs live: local:DIR (sled), redb:DIR, fjall:DIR, memory, central:ADDR, replicate:R:ADDR,...,
    /// parity:M:ADDR,... or ida:M,K:ADDR,... (checkpoint servers; add ,quorum after the
    /// numbers to acknowledge writes at M+1 servers).
    #[arg(long, value_name = "SPEC")]
    store: Option<StoreSpec>,
    /// Key file shared with the checkpoint servers (every remote --store needs it).
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// A named run in the store: its logs live under their own namespace, so that one directory
    /// or one set of checkpoint servers holds many runs (inspect and certify name it the same
    /// way).
    #[arg(long = "run", value_name = "NAME", value_parser = parse_run_name)]
    run: Option<String>,
}

fn parse_run_name(s: &str) -> Result<String, String> {
    veriflow_checkpoint::check_run_name(s)
        .map(|()| s.to_string())
        .map_err(|e| e.to_string())
}

impl StoreArgs {
    pub(crate) fn spec(&self) -> Option<StoreSpec> {
        match (&self.log_dir, &self.store) {
            (Some(d), _) => Some(StoreSpec::Local(d.clone())),
            (None, Some(s)) => Some(s.clone()),
            (None, None) => None,
        }
    }

    fn key(&self, spec: &StoreSpec) -> Result<Option<Key>, CliError> {
        match (spec, &self.key) {
            (StoreSpec::Remote(_), Some(k)) => Ok(Some(Key::load(k)?)),
            (StoreSpec::Remote(_), None) => Err(CliError::Usage(format!(
                "--store {spec} is on checkpoint servers: give their key with --key FILE"
            ))),
            _ => Ok(None),
        }
    }

    /// Opens the store to write a run into (created if local); with `--run NAME`, the run's
    /// namespace in it, registered (`store/namespace.rs`).
    pub(crate) fn open(&self, spec: &StoreSpec) -> Result<Arc<dyn Store>, CliError> {
        let store = open_store(spec, self.key(spec)?.as_ref())?;
        Ok(match &self.run {
            Some(name) => Arc::new(Namespaced::create(store, name)?),
            None => store,
        })
    }

    /// The run to read in `store`: with `--run NAME` its namespace, which must exist; without,
    /// the store's unnamed run, and a store that holds named runs only says which.
    fn existing_run(&self, store: Arc<dyn Store>) -> Result<Arc<dyn Store>, CliError> {
        match &self.run {
            Some(name) if Namespaced::exists(&*store, name)? => {
                return Ok(Arc::new(Namespaced::new(store, name)?));
            }
            None if store.get(veriflow_runtime::log::MANIFEST_KEY)?.is_some() => return Ok(store),
            _ => {}
        }
        let names = veriflow_checkpoint::run_names(&*store)?;
        match &self.run {
            Some(name) => Err(CliError::Usage(format!(
                "{} holds no run named {name} (named runs there: {})",
                store.describe(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ))),
            None if !names.is_empty() => Err(CliError::Usage(format!(
                "{} holds named runs only: choose one with --run NAME ({})",
                store.describe(),
                names.join(", ")
            ))),
            None => Ok(store),
        }
    }

    /// Opens the store of an existing run (a local directory must exist: a typo does not
    /// create an empty log). Readers (`inspect`, `certify` without `--correct`) open a local
    /// store read-only: on a copy, never running the engine's repair on the original (rule 1
    /// of `sled_store.rs`).
    fn open_existing(&self, write: bool) -> Result<Arc<dyn Store>, CliError> {
        let store: Arc<dyn Store> = match self.spec() {
            Some(StoreSpec::Memory) => {
                return Err(CliError::Usage(
                    "--store memory holds nothing once its run has ended: give the run's store"
                        .to_string(),
                ))
            }
            // local:, redb: and fjall: open their engine's way (read-only: never writing).
            Some(spec) => match spec.open_local_existing(write) {
                Some(local) => local?,
                None => open_store(&spec, self.key(&spec)?.as_ref())?,
            },
            None => {
                return Err(CliError::Usage(
                    "give --log-dir DIR or --store SPEC".to_string(),
                ))
            }
        };
        self.existing_run(store)
    }
}

/// Group commit of the event log, for `run` and for cluster jobs.
#[derive(Args, Debug, Clone)]
pub(crate) struct CommitArgs {
    /// Group commit: seal a log segment at this many KiB.
    #[arg(long, value_name = "KIB", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..=65536))]
    commit_kib: u64,
    /// Group commit: seal a non-empty segment after this many ms [default: 20 in a run, 100
    /// in a cluster job, whose flushes go over the network to a checkpoint server].
    #[arg(long, value_name = "MS")]
    commit_ms: Option<u64>,
    /// Recovery checkpoints: one per vnode every this many KiB of its log, so that recovery
    /// reads the checkpoint and the log after it; 0 writes none (recovery reads whole logs).
    #[arg(long, value_name = "KIB", default_value_t = DEFAULT_CHECKPOINT_BYTES >> 10,
          value_parser = clap::value_parser!(u64).range(0..=(1 << 30)))]
    checkpoint_kib: u64,
    /// Values of at least this many encoded bytes are logged once, by digest, in the log's
    /// value store instead of inside their event; smaller ones stay inline.
    #[arg(long, value_name = "BYTES", default_value_t = veriflow_runtime::log::STORED_FROM as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    stored_from: u64,
}

impl CommitArgs {
    /// The policy of a run in one process (`--commit-ms` defaults to [`DEFAULT_MAX_DELAY`]).
    pub(crate) fn policy(&self) -> CommitPolicy {
        self.policy_or(DEFAULT_MAX_DELAY)
    }

    /// The policy of a cluster job's members (`--commit-ms` defaults to
    /// [`CLUSTER_MAX_DELAY`]).
    pub(crate) fn cluster_policy(&self) -> CommitPolicy {
        self.policy_or(CLUSTER_MAX_DELAY)
    }

    fn policy_or(&self, max_delay: Duration) -> CommitPolicy {
        CommitPolicy {
            // Bounded to 64 MiB by the parser.
            max_bytes: usize::try_from(self.commit_kib << 10).unwrap_or(usize::MAX),
            max_delay: self.commit_ms.map_or(max_delay, Duration::from_millis),
            stored_from: usize::try_from(self.stored_from).unwrap_or(usize::MAX),
        }
    }

    /// Bytes of log between recovery checkpoints (0: none).
    pub(crate) fn checkpoint_every(&self) -> u64 {
        self.checkpoint_kib << 10
    }
}

/// Options of every `run`.
#[derive(Args, Debug, Clone)]
pub(crate) struct RuntimeArgs {
    /// Worker threads [default: the machine's cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) threads: Option<u32>,
    /// Virtual nodes [default: one per thread].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) vnodes: Option<u32>,
    /// Where the event logs go; must not hold a run yet [default: a fresh directory in the
    /// temporary directory, printed, and removed once the run finished right unless
    /// --keep-log].
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Log nothing (the S0 baseline of paper 001).
    #[arg(long, conflicts_with_all = ["log_dir", "store"])]
    pub(crate) no_checkpoint: bool,
    /// Keep the log directory made for this run (without --log-dir or --store) once it has
    /// finished; without it, that directory is removed after a run that finished right.
    #[arg(long, conflicts_with = "no_checkpoint")]
    pub(crate) keep_log: bool,
    /// Finish an interrupted run (a crash, Ctrl-C) from its logs in --log-dir or --store (same
    /// program options and vnodes): completed tasks are not run again.
    #[arg(long)]
    pub(crate) resume: bool,
    /// Seed of the vnodes' random choices.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    #[command(flatten)]
    commit: CommitArgs,
    /// Fault injection: vnode V fails (all its memory lost) and is recovered from its log;
    /// repeatable, each paired in order with a --kill-after.
    #[arg(
        long = "kill-vnode",
        value_name = "V",
        conflicts_with = "no_checkpoint"
    )]
    pub(crate) kill_vnode: Vec<u32>,
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
    pub(crate) kill_random: u32,
    /// Iterative runs: with --kill-random K, a vnode killed every MS milliseconds [default:
    /// 1000].
    #[arg(long = "kill-every", value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub(crate) kill_every_ms: Option<u64>,
    /// Iterative runs: fault injection, each message lost with probability P (0 <= P < 1)
    /// [default: 0].
    #[arg(long, value_name = "P")]
    pub(crate) loss: Option<f64>,
    /// Print one JSON object instead of the human summary.
    #[arg(long)]
    pub(crate) json: bool,
}

impl RuntimeArgs {
    /// The iterative-only options ([`ITERATIVE_ONLY`]) are usage errors in a data-flow run:
    /// they would be ignored.
    fn check_dataflow(&self) -> Result<(), InvalidArgs> {
        let given: Vec<&str> = [
            self.kill_every_ms.map(|_| "--kill-every"),
            self.loss.map(|_| "--loss"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if given.is_empty() {
            return Ok(());
        }
        Err(InvalidArgs(format!(
            "{} appl{} to iterative runs only, and this is a data-flow run",
            given.join(" and "),
            if given.len() == 1 { "ies" } else { "y" },
        )))
    }

    /// The failures to inject: the explicit ones, then `--kill-random` drawn from the seed
    /// (vnodes uniformly, points uniformly over the expected tasks, or the first 1000), each
    /// moved when due to a vnode holding work if its own holds none ([`Kill::retarget`]).
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
                retarget: false,
            });
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0x6b69_6c6c); // "kill"
        let horizon = expected_tasks.unwrap_or(1000).max(1);
        for _ in 0..self.kill_random {
            let vnode = VnodeId(rng.random_range(0..vnodes));
            kills.push(Kill {
                vnode,
                after: rng.random_range(0..horizon),
                // Issue 13 point 10: a kill drawn onto an idle vnode injects nothing.
                retarget: true,
            });
        }
        Ok(kills)
    }
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("where").required(true).args(["log_dir", "store"])))]
struct InspectArgs {
    /// The run's logs.
    #[command(flatten)]
    store: StoreArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Write the data-flow graph in graphviz dot to FILE: spawn edges dashed, tasks coloured
    /// by the vnode that ran them; summarised per vnode and spawn depth above 2,000 tasks.
    #[arg(long, value_name = "FILE")]
    dot: Option<PathBuf>,
    /// Write a self-contained HTML report to FILE: the task stream per vnode, failures and
    /// recoveries, the graph (small runs) and the certificate (--certificate).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// A certificate of this run (`certify --out CERT`) to show in --html and --dot: its
    /// verdict, and the tasks the oracle checked or found forged.
    #[arg(long, value_name = "CERT")]
    certificate: Option<PathBuf>,
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
        veriflow_checkpoint::logging::init_tracing();
        let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        // The command line as typed, to print the command that resumes a stopped run.
        let typed = args.clone();
        // The job's command line as typed, for the workers (`submit`, `cluster`).
        let argv: Vec<String> = args
            .iter()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let mut cmd = command::<P>();
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
                let mut iterative = None;
                let checked = args.program.validate().and_then(|()| {
                    iterative = args.program.iterative();
                    match &iterative {
                        Some(it) => crate::iterative_cli::check(&args, it).map(|()| Vec::new()),
                        None => args
                            .runtime
                            .check_dataflow()
                            .and_then(|()| args.forge.check(vnodes))
                            .and_then(|()| check_params(&args.certify_params))
                            .and_then(|()| {
                                args.runtime.kills(vnodes, args.program.expected_tasks())
                            }),
                    }
                });
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
                match iterative {
                    Some(it) => crate::iterative_cli::run::<P>(&args, it),
                    None => run::<P>(&args, kills, &typed),
                }
            }
            Command::Inspect(args) => inspect_cmd::<P>(&args),
            Command::Certify(args) => {
                if let Err(e) = check_params(&args.params) {
                    let err = match cmd.find_subcommand_mut("certify") {
                        Some(c) => c.error(clap::error::ErrorKind::ValueValidation, e.0),
                        None => cmd.error(clap::error::ErrorKind::ValueValidation, e.0),
                    };
                    let _ = err.print();
                    return ExitCode::from(2);
                }
                certify_cmd::<P>(&args)
            }
            Command::Coordinator(args) => crate::cluster_cli::coordinator_cmd(&args),
            Command::Worker(args) => crate::cluster_cli::worker_cmd::<P>(&args),
            Command::Submit(args) => match args.job.program.validate() {
                Ok(()) => crate::cluster_cli::submit_cmd::<P>(&args, argv),
                Err(e) => Err(CliError::Usage(e.0)),
            },
            Command::Status(args) => crate::cluster_cli::status_cmd(&args),
            Command::Jobs(args) => crate::cluster_cli::jobs_cmd(&args),
            Command::Job(args) => crate::cluster_cli::job_cmd(&args),
            Command::Oracle(args) => crate::cluster_cli::oracle_cmd::<P>(&args),
            Command::Alloc(args) => crate::alloc_cli::alloc_cmd(&args, P::NAME),
            Command::Cluster(args) => match args.job.program.validate() {
                Ok(()) => crate::cluster_cli::cluster_cmd::<P>(&args, argv),
                Err(e) => Err(CliError::Usage(e.0)),
            },
            Command::Chaos(args) => crate::chaos::chaos_cmd(&args, P::NAME),
            Command::Keygen(args) => keygen_cmd(&args),
            Command::PublicKey(args) => public_key_cmd(&args),
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            // Rule 2 of interrupt.rs: the message and the resume command are printed already.
            Err(CliError::Interrupted { signal }) => {
                ExitCode::from(crate::interrupt::exit_status(signal))
            }
            // A run's configuration the runtime refused (a log directory that holds a run
            // already, a thread count of 0) is a usage error too.
            Err(e @ (CliError::Usage(_) | CliError::Run(RunError::Config(_)))) => {
                eprintln!(
                    "{}: error: {e}\n\nFor more information, try '--help'.",
                    P::NAME
                );
                ExitCode::from(2)
            }
            Err(e) => {
                eprintln!("{}: error: {e}", P::NAME);
                ExitCode::FAILURE
            }
        }
    }
}

pub(crate) fn registry<P: Program>() -> Result<Registry, RegistryError> {
    let mut r = Registry::new();
    P::register(&mut r)?;
    r.register::<P::Root>()?;
    Ok(r)
}

fn run<P: Program>(
    args: &RunArgs<P>,
    kills: Vec<Kill>,
    typed: &[std::ffi::OsString],
) -> Result<(), CliError> {
    let (program, rt) = (&args.program, &args.runtime);
    if rt.resume && rt.store.spec().is_none() {
        return Err(CliError::Usage(
            "--resume needs the run's logs: give --log-dir DIR or --store SPEC".to_string(),
        ));
    }
    // Rule 6 of interrupt.rs: a directory made here is marked, and may be removed at the end.
    let mut made_dir = None;
    let spec = if rt.no_checkpoint {
        None
    } else {
        Some(match rt.store.spec() {
            Some(spec) => spec,
            None => {
                let dir =
                    crate::interrupt::make_log_dir(P::NAME).map_err(|source| CliError::Io {
                        what: "cannot create a log directory in",
                        path: std::env::temp_dir(),
                        source,
                    })?;
                made_dir = Some(dir.clone());
                StoreSpec::Local(dir)
            }
        })
    };
    let mut unstarted = crate::interrupt::Unstarted::new(made_dir.clone());
    let auto_dir = match &spec {
        Some(StoreSpec::Local(d)) if crate::interrupt::is_auto(d) => Some(d.clone()),
        _ => None,
    };
    let mut builder = Runtime::builder(registry::<P>()?)
        .program(P::NAME)
        .seed(rt.seed)
        .commit_policy(rt.commit.policy())
        .checkpoint_every(rt.commit.checkpoint_every());
    if let Some(t) = rt.threads {
        builder = builder.threads(t as usize);
    }
    if let Some(v) = rt.vnodes {
        builder = builder.vnodes(v);
    }
    let store: Option<Arc<dyn Store>> = match &spec {
        // Resuming needs the run's logs: a missing directory is a usage error, not a fresh
        // store; one that exists and cannot be opened is damage.
        Some(sp) if rt.resume => {
            let missing = sp.local_dir().is_some_and(|dir| !dir.exists());
            Some(rt.store.open_existing(true).map_err(|e| match e {
                CliError::Store(e @ StoreError::Open { .. }) if missing => {
                    CliError::Usage(format!("no run to resume: {e}"))
                }
                CliError::Store(e @ StoreError::Open { .. }) => {
                    CliError::Invalid(format!("no run to resume: {e}"))
                }
                other => other,
            })?)
        }
        Some(sp) => Some(rt.store.open(sp)?),
        None => None,
    };
    if let Some(store) = &store {
        builder = builder.store(store.clone());
    }
    builder = builder.kills(kills);
    if let Some(forge) = args.forge.plan::<P>(program, rt)? {
        builder = builder.forge(forge);
    }
    let bar = progress_bar(rt.json, program.expected_tasks());
    if let Some(bar) = &bar {
        let bar = bar.clone();
        builder = builder.on_progress(Arc::new(move |n| bar.set_position(n)));
    }
    let token = veriflow_runtime::StopToken::new();
    let runtime = builder.stop_token(token.clone()).build()?;
    let (root, inputs) = program.root();
    // interrupt.rs rules 1-4: where the log goes, and what a signal does to the run.
    let durable = spec.as_ref().filter(|sp| !matches!(sp, StoreSpec::Memory));
    let resume = durable.map(|_| crate::interrupt::resume_command(typed, made_dir.as_deref()));
    let on_exit = match &resume {
        Some(cmd) => format!(
            "exiting at once; the log holds what its last group commit made durable. Resume the \
             run with:\n  {cmd}\n"
        ),
        None => "exiting at once; nothing was logged durably, so there is nothing to resume\n"
            .to_string(),
    };
    let guard = crate::interrupt::Guard::start(P::NAME, token, on_exit);
    match (&spec, &auto_dir) {
        (Some(StoreSpec::Local(d)), Some(_)) if !rt.keep_log => eprintln!(
            "{}: log dir: {} (made for this run: removed once it finishes right; --keep-log \
             keeps it)",
            P::NAME,
            d.display()
        ),
        (Some(StoreSpec::Local(d)), _) => eprintln!("{}: log dir: {}", P::NAME, d.display()),
        (Some(sp), _) => eprintln!("{}: store: {sp}", P::NAME),
        (None, _) => {}
    }
    unstarted.started();
    let outcome = if rt.resume {
        runtime.resume(root, inputs)
    } else {
        runtime.run(root, inputs)
    };
    let signal = guard.signal();
    drop(guard);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if let (Err(RunError::Interrupted { completed }), Some(signal)) = (&outcome, signal) {
        return Err(stopped::<P>(
            signal,
            *completed,
            spec.as_ref(),
            resume.as_deref(),
            rt.json,
        ));
    }
    let report = outcome?;
    let checked = program.check(&report.outputs);
    let certificate = match (store, args.certify) {
        (Some(store), true) => {
            let opts = veriflow_certifier::Options {
                epsilon: args.certify_params.epsilon,
                q: args.certify_params.q,
                ..Default::default()
            };
            let (cert, key_path) =
                certify_signed::<P>(store, &opts, &args.certify_params, rt.json)?;
            if let Some(path) = &args.cert_out {
                write_file(path, &cert.to_json())?;
            }
            Some((cert, key_path))
        }
        _ => None,
    };
    let secs = report.elapsed.as_secs_f64();
    let log_dir_text = match &spec {
        Some(StoreSpec::Local(d)) => Some(d.display().to_string()),
        _ => None,
    };
    // Rule 6 of interrupt.rs: a directory made by `run` goes once its run finished right.
    let kept_because = match &auto_dir {
        None => None,
        Some(_) if rt.keep_log => Some("--keep-log"),
        Some(_) if args.cert_out.is_some() => {
            Some("its certificate (--cert-out) is verified against it")
        }
        Some(_) if checked.is_err() => Some("the result is wrong"),
        Some(_)
            if certificate
                .as_ref()
                .is_some_and(|(c, _)| c.decision == Decision::Reject) =>
        {
            Some("the certifier says REJECT")
        }
        Some(_) => None,
    };
    let remove = auto_dir.as_ref().filter(|_| kept_because.is_none());
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
            "log_dir_removed": remove.is_some(),
            "store": spec.as_ref().map(|sp| sp.to_string()),
            "run": rt.store.run,
            "checkpoint": spec.is_some(),
            "threads": runtime.threads(),
            "vnodes": runtime.vnodes(),
            "seed": rt.seed,
            "root": format!("{:#}", report.root),
            "steals": report.vnodes.iter().map(|s| s.adopted).sum::<u64>(),
            "failures": report.vnodes.iter().map(|s| s.failures).sum::<u64>(),
            "recovered_tasks": report.vnodes.iter().map(|s| s.recovered_tasks).sum::<u64>(),
            "reused_tasks": report.vnodes.iter().map(|s| s.reused_tasks).sum::<u64>(),
            "failures_without_effect": report.vnodes.iter().map(|s| s.failures_without_effect).sum::<u64>(),
            "per_vnode": report.vnodes,
            "forged": report.forged.iter().map(|(t, v)| json!({
                "task": format!("{t:#}"), "vnode": v.0,
            })).collect::<Vec<_>>(),
            "certificate": certificate.as_ref().map(|(c, _)| c),
        });
        println!("{summary}");
    } else {
        match &checked {
            Ok(v) => println!("{}: result {v} {}", P::NAME, checked_note(v)),
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
            let idle: u64 = report
                .vnodes
                .iter()
                .map(|s| s.failures_without_effect)
                .sum();
            if idle > 0 {
                println!(
                    "recovery: {idle} of the {failures} failure(s) hit a vnode holding no task: \
                     they injected nothing"
                );
            }
        }
        let named = match &rt.store.run {
            Some(name) => format!(" (run {name})"),
            None => String::new(),
        };
        match (&log_dir_text, &spec) {
            (Some(d), _) => println!(
                "events: {} logged, all durable; log dir: {d}{named}",
                report.events
            ),
            (None, Some(sp)) => {
                println!(
                    "events: {} logged, all durable; store: {sp}{named}",
                    report.events
                )
            }
            (None, None) => println!("events: none (--no-checkpoint)"),
        }
        match (remove, kept_because) {
            (Some(_), _) => println!(
                "log dir removed: it was made for this run, which finished (--keep-log keeps it)"
            ),
            (None, Some(why)) if !rt.keep_log => {
                println!("log dir kept ({why}): it was made for this run; remove it when done")
            }
            _ => {}
        }
        if !report.forged.is_empty() {
            println!(
                "forgery injection: {} task(s) lied, e.g. {} on {}",
                report.forged.len(),
                report.forged[0].0,
                report.forged[0].1
            );
        }
        if let Some((cert, key)) = &certificate {
            print!("{}", certificate_text(cert, args.cert_out.as_deref(), key));
        }
    }
    drop(runtime); // closes the store
    if let Some(dir) = remove {
        if let Err(e) = crate::interrupt::remove_log_dir(dir) {
            eprintln!(
                "{}: warning: cannot remove the log dir {}: {e}",
                P::NAME,
                dir.display()
            );
        }
    }
    checked.map(drop).map_err(CliError::from)?;
    match certificate {
        Some((c, _)) if c.decision == Decision::Reject => Err(CliError::Rejected),
        _ => Ok(()),
    }
}

/// Rules 2 and 4 of interrupt.rs: what a run stopped by `signal` says (on stderr, and as one
/// JSON object on stdout with `--json`), and the error that exits with 128 + `signal`.
fn stopped<P: Program>(
    signal: i32,
    completed: u64,
    spec: Option<&StoreSpec>,
    resume: Option<&str>,
    json: bool,
) -> CliError {
    let name = crate::interrupt::signal_name(signal);
    let place = match spec {
        Some(StoreSpec::Local(d)) => format!("log dir {}", d.display()),
        Some(sp) => format!("store {sp}"),
        None => String::new(),
    };
    match resume {
        Some(cmd) => eprintln!(
            "{}: {name}: stopped after {completed} tasks; every event logged is durable in the \
             {place}. Resume the run with:\n  {cmd}",
            P::NAME
        ),
        None => eprintln!(
            "{}: {name}: stopped after {completed} tasks; nothing was logged durably, so there \
             is nothing to resume",
            P::NAME
        ),
    }
    if json {
        println!(
            "{}",
            json!({
                "program": P::NAME,
                "interrupted": name,
                "completed_tasks": completed,
                "log_dir": match spec {
                    Some(StoreSpec::Local(d)) => Some(d.display().to_string()),
                    _ => None,
                },
                "store": spec.map(|sp| sp.to_string()),
                "resume": resume,
            })
        );
    }
    CliError::Interrupted { signal }
}

/// How a run's summary qualifies a result its check accepted: "(checked)", or "(checked; not
/// checked: WHAT)" when the result object carries a string `not_checked` ([`Program::check`]).
pub fn checked_note(result: &serde_json::Value) -> String {
    match result.get("not_checked").and_then(|v| v.as_str()) {
        Some(what) => format!("(checked; not checked: {what})"),
        None => "(checked)".to_string(),
    }
}

impl ForgeArgs {
    fn check(&self, vnodes: u32) -> Result<(), InvalidArgs> {
        if let Some(v) = self.forge_vnode.iter().find(|&&v| v >= vnodes) {
            return Err(InvalidArgs(format!(
                "--forge-vnode {v}: the run has {vnodes} vnodes"
            )));
        }
        if let Some(q) = self.forge_rate.filter(|q| !(0.0..=1.0).contains(q)) {
            return Err(InvalidArgs(format!(
                "--forge-rate {q}: a probability is between 0 and 1"
            )));
        }
        Ok(())
    }

    /// The forgery plan, if any. `--forge-tasks N` first runs the program without a log to
    /// learn which tasks write values, then draws N of them with the forge seed.
    fn plan<P: Program>(&self, program: &P, rt: &RuntimeArgs) -> Result<Option<Forge>, CliError> {
        if let Some(rate) = self.forge_rate {
            return Ok(Some(Forge {
                vnodes: self.forge_vnode.iter().map(|&v| VnodeId(v)).collect(),
                rate,
                seed: self.forge_seed,
                ..Forge::default()
            }));
        }
        let Some(n) = self.forge_tasks else {
            return Ok(None);
        };
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut b = Runtime::builder(registry::<P>()?)
            .program(P::NAME)
            .seed(rt.seed)
            .store(store.clone());
        if let Some(t) = rt.threads {
            b = b.threads(t as usize);
        }
        let (root, inputs) = program.root();
        b.build()?.run(root, inputs)?;
        let track = Track::load(store)?;
        let writers = track.writers();
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        if n > writers.len() {
            return Err(CliError::Usage(format!(
                "--forge-tasks {n}: the run has only {} tasks that write a value",
                writers.len()
            )));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(self.forge_seed);
        let tasks: IdSet<TaskId> = rand::seq::index::sample(&mut rng, writers.len(), n)
            .into_iter()
            .map(|i| writers[i])
            .collect();
        Ok(Some(Forge {
            tasks,
            seed: self.forge_seed,
            ..Forge::default()
        }))
    }
}

fn check_params(p: &CertifyParams) -> Result<(), InvalidArgs> {
    veriflow_certifier::sample::n_eps_q(p.epsilon, p.q)
        .map(drop)
        .map_err(|e| InvalidArgs(format!("{e} (--epsilon, --q)")))
}

fn write_file(path: &std::path::Path, text: &str) -> Result<(), CliError> {
    std::fs::write(path, text).map_err(|source| CliError::Io {
        what: "cannot write",
        path: path.to_path_buf(),
        source,
    })
}

/// Progress bars over the k checks and over the re-execution of G_F.
struct Bars {
    checks: ProgressBar,
    fix: ProgressBar,
}

impl Bars {
    fn new(quiet: bool) -> Option<Bars> {
        if quiet || !std::io::stderr().is_terminal() {
            return None;
        }
        let multi = indicatif::MultiProgress::new();
        let style = |what: &str| {
            ProgressStyle::with_template(&format!(
                "{{spinner}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {what} {{msg}}"
            ))
            .unwrap_or_else(|_| ProgressStyle::default_bar())
        };
        let checks = multi.add(ProgressBar::new(0).with_style(style("checks")));
        let fix = multi.add(ProgressBar::hidden().with_style(style("re-executed")));
        Some(Bars { checks, fix })
    }
}

impl veriflow_certifier::Progress for Bars {
    fn pass(&self, generation: u32, k: u64) {
        self.checks.reset();
        self.checks.set_length(k);
        self.checks
            .set_message(format!("(generation {generation})"));
    }
    fn checked(&self) {
        self.checks.inc(1);
    }
    fn correcting(&self, tasks: u64) {
        self.fix.reset();
        self.fix.set_length(tasks);
        self.fix
            .set_draw_target(indicatif::ProgressDrawTarget::stderr());
    }
    fn corrected(&self) {
        self.fix.inc(1);
    }
}

/// Certifies with a progress bar and signs with the oracle's key.
pub(crate) fn certify_signed<P: Program>(
    store: Arc<dyn Store>,
    opts: &veriflow_certifier::Options,
    params: &CertifyParams,
    quiet: bool,
) -> Result<(Certificate, PathBuf), CliError> {
    let (key, key_path) = Key::load_or_default(params.oracle_key.as_deref(), "oracle")?;
    let key = OracleKey::from(key);
    let registry = registry::<P>()?;
    let bars = Bars::new(quiet);
    let progress: &dyn veriflow_certifier::Progress = match &bars {
        Some(b) => b,
        None => &veriflow_certifier::NoProgress,
    };
    let mut cert = veriflow_certifier::certify(store, &registry, opts, progress)?;
    if let Some(b) = bars {
        b.checks.finish_and_clear();
        b.fix.finish_and_clear();
    }
    cert.sign(&key)
        .map_err(|e| CliError::Invalid(format!("cannot sign the certificate: {e}")))?;
    Ok((cert, key_path))
}

/// The human summary of a certificate.
pub(crate) fn certificate_text(
    cert: &Certificate,
    file: Option<&std::path::Path>,
    key: &std::path::Path,
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let what = if cert.full {
        "full duplication".to_string()
    } else {
        format!("epsilon {}, q {}", cert.epsilon, cert.q)
    };
    for c in &cert.corrections {
        let _ = writeln!(
            s,
            "certify: corrected {} forged task(s): {} task(s) invalidated, {} re-executed on the \
             oracle -> log generation {}",
            c.detected.len(),
            c.invalidated,
            c.re_executed,
            c.generation
        );
    }
    match cert.decision {
        Decision::Accept => {
            let _ = writeln!(
                s,
                "certify: ACCEPT ({what}): {} of {} tasks re-run on the oracle, none forged",
                cert.checked.len(),
                cert.n
            );
            if !cert.full {
                let _ = writeln!(
                    s,
                    "  fewer than {:.3}% of the tasks are forged, at confidence {}%",
                    cert.q_hat * 100.0,
                    (1.0 - cert.epsilon) * 100.0
                );
            }
        }
        Decision::Reject if !cert.structural.is_empty() => {
            let _ = writeln!(
                s,
                "certify: REJECT: the logs contradict each other ({} structural error(s))",
                cert.structural.len()
            );
            for e in cert.structural.iter().take(10) {
                let _ = writeln!(
                    s,
                    "  task {} ({}) on {}{}: {}",
                    e.task,
                    e.name.as_deref().unwrap_or("?"),
                    e.vnode.map_or("-".to_string(), |v| VnodeId(v).to_string()),
                    e.data
                        .as_ref()
                        .map_or(String::new(), |d| format!(", edge {d}")),
                    e.message
                );
            }
        }
        Decision::Reject => {
            let _ = writeln!(
                s,
                "certify: REJECT ({what}): {} forged task(s) among {} re-run on the oracle",
                cert.detections.len(),
                cert.checked.len()
            );
            for d in cert.detections.iter().take(10) {
                let _ = writeln!(
                    s,
                    "  task {} ({}) on {}: {}",
                    d.task,
                    d.name,
                    d.vnode.map_or("-".to_string(), |v| VnodeId(v).to_string()),
                    d.reason
                );
            }
        }
    }
    let drawn = match &cert.secret {
        Some(_) => "draw keyed by the online oracle's secret, committed to before the run and \
                    revealed here"
            .to_string(),
        None => format!("seed {} (from the {})", cert.seed, cert.seed_source),
    };
    let _ = writeln!(
        s,
        "  {drawn}, log generation {}, G_S Merkle root {}",
        cert.generation,
        &cert.merkle_root[..16]
    );
    let signer = cert
        .signer()
        .map_or_else(String::new, |k| format!(", public key {}", k.fingerprint()));
    match file {
        Some(f) => {
            let _ = writeln!(
                s,
                "  certificate: {} (signed with {}{signer})",
                f.display(),
                key.display()
            );
        }
        None => {
            let _ = writeln!(s, "  certificate signed with {}{signer}", key.display());
        }
    }
    s
}

fn certify_cmd<P: Program>(args: &CertifyArgs) -> Result<(), CliError> {
    // Only a correction writes (a new log generation).
    let store = args
        .store
        .open_existing(args.correct && args.verify.is_none())?;
    if let Some(path) = &args.verify {
        return verify_cmd(args, path, store);
    }
    let outputs = if args.outputs.trim() == "all" {
        None
    } else {
        Some(
            args.outputs
                .split(',')
                .map(|s| s.trim().parse::<DataId>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| CliError::Usage(format!("--outputs: {e}")))?,
        )
    };
    let opts = veriflow_certifier::Options {
        epsilon: args.params.epsilon,
        q: args.params.q,
        outputs,
        seed: args.seed,
        correct: args.correct,
        full: args.full,
        ..Default::default()
    };
    let work = || certify_signed::<P>(store.clone(), &opts, &args.params, args.json);
    let (cert, key_path) = match args.threads {
        Some(t) => rayon::ThreadPoolBuilder::new()
            .num_threads(t as usize)
            .build()
            .map_err(|e| CliError::Invalid(format!("cannot start {t} threads: {e}")))?
            .install(work)?,
        None => work()?,
    };
    if let Some(path) = &args.out {
        write_file(path, &cert.to_json())?;
    }
    if args.json {
        println!("{}", cert.to_json());
    } else {
        print!(
            "{}",
            certificate_text(&cert, args.out.as_deref(), &key_path)
        );
    }
    match cert.decision {
        Decision::Accept => Ok(()),
        Decision::Reject => Err(CliError::Rejected),
    }
}

/// `certify --verify CERT`: against `--public-key`, or the oracle's own key (rules 2-4 of
/// `veriflow_certifier::certificate`).
fn verify_cmd(
    args: &CertifyArgs,
    path: &std::path::Path,
    store: Arc<dyn Store>,
) -> Result<(), CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
        what: "cannot read",
        path: path.to_path_buf(),
        source,
    })?;
    let verify = |e| CliError::Verify {
        path: path.to_path_buf(),
        source: e,
    };
    let cert = Certificate::from_json(&text).map_err(verify)?;
    match &args.public_key {
        Some(pub_file) => {
            let trusted = OraclePublicKey::load(pub_file)?;
            cert.verify(&trusted, store).map_err(verify)?;
        }
        None => {
            let (key, _) = Key::load_or_default(args.params.oracle_key.as_deref(), "oracle")?;
            cert.verify_with_secret(&OracleKey::from(key), store)
                .map_err(verify)?;
        }
    }
    let signed_by = cert.signer().map(|k| k.fingerprint());
    if args.json {
        println!(
            "{}",
            json!({
                "valid": true,
                "decision": cert.decision,
                "generation": cert.generation,
                "format": cert.format,
                "signed_by": signed_by,
            })
        );
    } else {
        let seal = match &signed_by {
            Some(k) => format!("Ed25519 signature by {k}"),
            None => format!("{} MAC", cert.format),
        };
        println!(
            "certificate {}: valid ({seal} and G_S Merkle root match); it says {} for generation {} of this log",
            path.display(),
            cert.decision,
            cert.generation
        );
    }
    Ok(())
}

/// `keygen FILE [--public PUB]`.
fn keygen_cmd(args: &KeygenArgs) -> Result<(), CliError> {
    let key = Key::create(&args.file)?;
    println!(
        "wrote a new key to {} (owner-only); give it to every process with --key, or to the \
         certifier with --oracle-key",
        args.file.display()
    );
    if let Some(pub_file) = &args.public {
        let public = OracleKey::from(key).public();
        public.write(pub_file)?;
        println!(
            "wrote its public key {} to {}: with it, anyone can verify the certificates this \
             key signs as an oracle key",
            public.fingerprint(),
            pub_file.display()
        );
    }
    Ok(())
}

/// `public-key [--oracle-key FILE] [--out PUB]`.
fn public_key_cmd(args: &PublicKeyArgs) -> Result<(), CliError> {
    let (key, key_path) = Key::load_or_default(args.oracle_key.as_deref(), "oracle")?;
    let public = OracleKey::from(key).public();
    match &args.out {
        Some(pub_file) => {
            public.write(pub_file)?;
            println!(
                "wrote the public key {} of oracle key {} to {}",
                public.fingerprint(),
                key_path.display(),
                pub_file.display()
            );
        }
        None => println!("{public}"),
    }
    Ok(())
}

pub(crate) fn progress_bar(json: bool, total: Option<u64>) -> Option<ProgressBar> {
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

/// Moves `bar` to `n` tasks, never back: a cluster's count drops for a moment when a worker
/// is lost (its vnodes' tasks are counted again once their new host reports them), and a bar
/// that jumped back would also show a rate of 0/s.
pub(crate) fn advance(bar: &ProgressBar, n: u64) {
    if n > bar.position() {
        bar.set_position(n);
    }
}

fn inspect_cmd<P: Program>(args: &InspectArgs) -> Result<(), CliError> {
    let registry = registry::<P>()?;
    let cert = match &args.certificate {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| CliError::Io {
                what: "cannot read",
                path: path.clone(),
                source,
            })?;
            let cert = Certificate::from_json(&text).map_err(|source| CliError::Verify {
                path: path.clone(),
                source,
            })?;
            Some((cert, path.display().to_string()))
        }
        None => None,
    };
    let store = args.store.open_existing(false)?;
    let report = inspect::inspect(store.clone(), &registry)?;
    if let Some(why) = store.degraded() {
        eprintln!(
            "{}: warning: read through a degraded store {}: {why}",
            P::NAME,
            store.describe()
        );
    }
    if let Some((c, path)) = &cert {
        if c.program != report.manifest.program {
            return Err(CliError::Invalid(format!(
                "certificate {path} is for program {}, this log is of {}",
                c.program, report.manifest.program
            )));
        }
    }
    let write = |path: &PathBuf, text: String| {
        std::fs::write(path, text).map_err(|source| CliError::Io {
            what: "cannot write",
            path: path.clone(),
            source,
        })
    };
    if let Some(path) = &args.dot {
        let c = cert.as_ref().map(|c| &c.0);
        write(path, report.to_dot(c, inspect::DOT_MAX_TASKS))?;
    }
    if let Some(path) = &args.html {
        let c = cert.as_ref().map(|(c, p)| (c, p.as_str()));
        write(path, report.to_html(c, &inspect::HTML_LIMITS))?;
    }
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
        if let Some(path) = &args.dot {
            println!("graph written to {}", path.display());
        }
        if let Some(path) = &args.html {
            println!("report written to {}", path.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod progress_tests {
    #[test]
    fn a_bar_never_moves_back() {
        let bar = indicatif::ProgressBar::hidden();
        super::advance(&bar, 10);
        super::advance(&bar, 4);
        assert_eq!(bar.position(), 10);
        super::advance(&bar, 12);
        assert_eq!(bar.position(), 12);
    }
}

#[cfg(test)]
mod commit_tests {
    use clap::Parser;
    use std::time::Duration;
    use veriflow_runtime::log::{CLUSTER_MAX_DELAY, DEFAULT_MAX_DELAY};

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        commit: super::CommitArgs,
    }

    /// `--commit-ms` defaults by mode (20 ms in one process, 100 ms in a cluster job); given,
    /// it holds in both.
    #[test]
    fn the_commit_delay_defaults_by_mode_unless_given() {
        let a = Args::try_parse_from(["t"]).unwrap();
        assert_eq!(a.commit.policy().max_delay, DEFAULT_MAX_DELAY);
        assert_eq!(a.commit.cluster_policy().max_delay, CLUSTER_MAX_DELAY);
        assert_ne!(DEFAULT_MAX_DELAY, CLUSTER_MAX_DELAY);
        let a = Args::try_parse_from(["t", "--commit-ms", "7"]).unwrap();
        assert_eq!(a.commit.policy().max_delay, Duration::from_millis(7));
        assert_eq!(
            a.commit.cluster_policy().max_delay,
            Duration::from_millis(7)
        );
    }
}

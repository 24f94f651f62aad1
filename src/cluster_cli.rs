//! The cluster commands of [`App`](crate::App): `coordinator`, `worker`, `submit` and
//! `cluster` (a whole cluster on loopback for one job).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde_json::json;
use veriflow_checkpoint::server::Server;
use veriflow_checkpoint::{open_store, Key, StoreSpec};
use veriflow_runtime::{decode_outputs, Runtime, Task};

use veriflow_cluster::coordinator::{self, CoordinatorConfig};
use veriflow_cluster::protocol::{ClusterStatus, CoordCounters, JobSpec, ToSubmit, WorkerReport};
use veriflow_cluster::worker::{self, JobContext, WorkerConfig};

use crate::app::{registry, CertifyParams, CliError, Program};
use veriflow_runtime::detect::FdParams;

/// The failure detector's five parameters (paper 004 §4).
#[derive(Args, Debug, Clone)]
pub(crate) struct FdArgs {
    /// Heartbeat period T_interval, in ms.
    #[arg(long = "fd-interval-ms", value_name = "MS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    interval_ms: u64,
    /// T_timeout: a monitored process silent for T_interval + T_timeout is unreachable, in ms.
    #[arg(long = "fd-timeout-ms", value_name = "MS", default_value_t = 400,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    timeout_ms: u64,
    /// T_broken: unreachable this long more, a process is declared broken, in ms.
    #[arg(long = "fd-broken-ms", value_name = "MS", default_value_t = 400,
          value_parser = clap::value_parser!(u64).range(0..=600_000))]
    broken_ms: u64,
    /// T_insurance: period of the insurance heartbeats to every other connection, in ms.
    #[arg(long = "fd-insurance-ms", value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    insurance_ms: u64,
    /// k: peers each process sends heartbeats to every T_interval.
    #[arg(long = "fd-k", value_name = "K", default_value_t = 3,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    k: u64,
}

impl FdArgs {
    fn params(&self) -> Result<FdParams, CliError> {
        let p = FdParams {
            interval: Duration::from_millis(self.interval_ms),
            timeout: Duration::from_millis(self.timeout_ms),
            insurance: Duration::from_millis(self.insurance_ms),
            broken: Duration::from_millis(self.broken_ms),
            k: usize::try_from(self.k).unwrap_or(usize::MAX),
        };
        p.validate()
            .map_err(|e| CliError::Usage(format!("failure detector: {e}")))?;
        Ok(p)
    }

    fn to_args(&self) -> Vec<String> {
        vec![
            format!("--fd-interval-ms={}", self.interval_ms),
            format!("--fd-timeout-ms={}", self.timeout_ms),
            format!("--fd-broken-ms={}", self.broken_ms),
            format!("--fd-insurance-ms={}", self.insurance_ms),
            format!("--fd-k={}", self.k),
        ]
    }
}

#[derive(Args, Debug)]
pub(crate) struct CoordinatorArgs {
    /// Address to listen on (port 0: any free port; the bound address is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: String,
    /// The cluster's key file (workers, clients and checkpoint servers share it).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// Where every member logs: checkpoint servers every worker reaches (central:,
    /// replicate:, parity: or ida:; a local: directory is one process's only).
    #[arg(long, value_name = "SPEC")]
    store: StoreSpec,
    /// Stand by: take over when the active coordinator's lease in the store expires.
    #[arg(long)]
    standby: bool,
    /// The other coordinators' addresses, told to workers and clients.
    #[arg(long, value_name = "ADDR,...", value_delimiter = ',')]
    join_coordinators: Vec<String>,
    /// The active coordinator renews its lease in the store every quarter of this; a standby
    /// takes over when it has not moved for this long, in ms.
    #[arg(long, value_name = "MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(40..=600_000))]
    lease_ms: u64,
    /// Serve the read-only web dashboard and Prometheus /metrics on ADDR [default address:
    /// 127.0.0.1:0, any free port]; its address and access token are printed at start.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:0")]
    dashboard: Option<String>,
    /// Allow --dashboard on an address that is not loopback (anyone who reaches it and has the
    /// token sees the whole cluster).
    #[arg(long, requires = "dashboard")]
    dashboard_public: bool,
    #[command(flatten)]
    fd: FdArgs,
}

#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    /// The coordinators' addresses (the one holding the role answers).
    #[arg(long, value_name = "ADDR,...", value_delimiter = ',', required = true)]
    join: Vec<String>,
    /// How long to look for a coordinator after losing one before giving up, in seconds.
    #[arg(long, value_name = "S", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    rejoin_patience: u64,
    /// The cluster's key file.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// Worker threads [default: the machine's cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
    /// Wait idle until needed to host the vnodes of a lost worker.
    #[arg(long)]
    spare: bool,
    /// Address other workers reach this one at.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: String,
    /// Tests only (refused unless VERIFLOW_ALLOW_FORGERY=1): each task this worker runs lies
    /// with probability Q, sending and logging a wrong value (a machine that lies).
    #[arg(long, value_name = "Q", hide = true)]
    forge_rate: Option<f64>,
    /// Tests only: seed of which tasks lie.
    #[arg(
        long,
        value_name = "S",
        default_value_t = 0,
        hide = true,
        requires = "forge_rate"
    )]
    forge_seed: u64,
}

/// The environment variable that allows `worker --forge-rate` (tests and demos only).
pub(crate) const ALLOW_FORGERY: &str = "VERIFLOW_ALLOW_FORGERY";

#[derive(Args, Debug)]
pub(crate) struct OracleArgs {
    /// The coordinators' addresses (the one holding the role answers; after a takeover the
    /// oracle follows the job on its successor).
    #[arg(long, value_name = "ADDR,...", value_delimiter = ',', required = true)]
    coordinator: Vec<String>,
    /// The cluster's key file (the oracle reads the logs from the checkpoint servers).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    #[command(flatten)]
    params: CertifyParams,
    /// The lowest spot-check rate of any worker: each forged task is caught with at least
    /// this probability, whatever the worker did before.
    #[arg(long, value_name = "F", default_value_t = 0.02)]
    spot_floor: f64,
    /// At most this fraction of the completed tasks is re-run ahead for the final draw, smallest
    /// priority first; the final pass re-runs the rest of it. 1 checks every candidate at once:
    /// the most CPU, the shortest wait for the certificate, and liars forging rarely caught
    /// sooner (the checks ahead are uniform draws); 0.01 costs far less CPU and catches less.
    #[arg(long, value_name = "F", default_value_t = veriflow_certifier::online::DRAW_AHEAD)]
    draw_ahead: f64,
    /// How often the logs are read, in ms.
    #[arg(long, value_name = "MS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    poll_ms: u64,
    /// Save each job's certificate as DIR/job-<id>.json.
    #[arg(long, value_name = "DIR")]
    certificates: Option<PathBuf>,
    /// Stop after the first job followed is over (certified or not).
    #[arg(long)]
    once: bool,
}

/// What a job runs: the program and the run options a cluster honours.
#[derive(Args, Debug, Clone)]
pub(crate) struct JobArgs<P: Program> {
    #[command(flatten)]
    pub(crate) program: P,
    /// Virtual nodes [default: one per worker thread].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    vnodes: Option<u32>,
    /// Seed of the vnodes' random choices (and of `cluster --kill-random`).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    commit: crate::app::CommitArgs,
    /// Log nothing (the S0 baseline: a lost worker then cannot be recovered).
    #[arg(long, conflicts_with = "certify")]
    no_checkpoint: bool,
    /// Print one JSON object instead of the human summary.
    #[arg(long)]
    json: bool,
    /// Certify the run right after it.
    #[arg(long)]
    certify: bool,
    #[command(flatten)]
    certify_params: CertifyParams,
}

#[derive(Args, Debug)]
pub(crate) struct SubmitArgs<P: Program> {
    /// The coordinators' addresses (the one holding the role answers; after a takeover the
    /// job is followed on its successor).
    #[arg(long, value_name = "ADDR,...", value_delimiter = ',', required = true)]
    coordinator: Vec<String>,
    /// The cluster's key file.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    #[command(flatten)]
    pub(crate) job: JobArgs<P>,
}

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    ask: AskArgs,
    /// Ask again every second until interrupted.
    #[arg(long)]
    watch: bool,
}

/// Which coordinator `status` and `jobs` ask, and how they answer.
#[derive(Args, Debug)]
struct AskArgs {
    /// The coordinator to ask (a standby says so, and names the active one if it knows it).
    #[arg(long, value_name = "ADDR")]
    coordinator: String,
    /// The cluster's key file.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// Print JSON (one object a line with `status --watch`; `jobs`: one array) instead of the
    /// table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct JobsArgs {
    #[command(flatten)]
    ask: AskArgs,
}

#[derive(Args, Debug)]
pub(crate) struct JobCmdArgs {
    #[command(subcommand)]
    command: JobCommand,
}

#[derive(clap::Subcommand, Debug)]
enum JobCommand {
    /// Cancel a job: a queued one is dropped; a running one stops, keeps its logs under its
    /// run name, and is never recorded as finished. Its submitter exits with an error.
    Cancel(CancelArgs),
}

#[derive(Args, Debug)]
struct CancelArgs {
    /// The job's id (`jobs` lists them).
    #[arg(value_name = "ID")]
    id: u64,
    /// The coordinators' addresses (the one holding the role answers).
    #[arg(long, value_name = "ADDR,...", value_delimiter = ',', required = true)]
    coordinator: Vec<String>,
    /// The cluster's key file.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct ClusterArgs<P: Program> {
    /// Worker processes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    workers: u32,
    /// Spare worker processes (idle until needed for recovery).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=256))]
    spares: u32,
    /// Threads of each worker.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: u32,
    /// Checkpoint servers [default: as many as --store-strategy needs].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    checkpoint_servers: Option<u32>,
    /// How the logs are spread over the checkpoint servers: central, replicate:R, parity:M or
    /// ida:M,K (with ,quorum or ,quorum=W as in --store).
    #[arg(long, value_name = "STRATEGY", default_value = "central")]
    store_strategy: String,
    /// The store engine of the checkpoint servers: fjall, local (sled) or redb. fjall by
    /// default: a server answers many small flushes from many writers, and fjall takes a third
    /// of sled's CPU for them (checkpoint-server/src/store/mod.rs, "Choosing the engine").
    #[arg(long, value_name = "ENGINE", default_value = "fjall", value_parser = ["fjall", "local", "redb"])]
    server_engine: String,
    /// Kill K worker processes with SIGKILL at points drawn from --seed.
    #[arg(long, value_name = "K", default_value_t = 0)]
    kill_random: u32,
    /// With --kill-random K: kill one worker every MS ms of the running job (the victim drawn
    /// from --seed among the live workers) instead of at points of its progress; the kills
    /// stop when the job ends.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    kill_every: Option<u64>,
    /// Start a new worker in place of each one --kill-random kills (a spare for a spare): it
    /// joins the running job as a member hosting nothing and takes vnodes when the next worker
    /// is lost. Without it, at most --workers + --spares workers are killed.
    #[arg(long)]
    replace: bool,
    /// Coordinator processes: the first is active, the others stand by.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    coordinators: u32,
    /// Kill the active coordinator with SIGKILL at a point drawn from --seed (needs
    /// --coordinators 2 or more).
    #[arg(long, requires = "coordinators")]
    kill_coordinator: bool,
    /// Run an online oracle too: it certifies the job while it runs and has workers caught
    /// forging evicted; the summary shows its certificate.
    #[arg(long)]
    oracle: bool,
    /// Tests only (refused unless VERIFLOW_ALLOW_FORGERY=1): the first N workers lie at
    /// --forge-rate.
    #[arg(long, value_name = "N", default_value_t = 0, hide = true)]
    forge_workers: u32,
    /// Tests only: the rate at which the --forge-workers lie.
    #[arg(long, value_name = "Q", default_value_t = 0.05, hide = true)]
    forge_rate: f64,
    #[command(flatten)]
    fd: FdArgs,
    #[command(flatten)]
    pub(crate) job: JobArgs<P>,
}

/// `APP coordinator`: serves until killed.
pub(crate) fn coordinator_cmd(args: &CoordinatorArgs) -> Result<(), CliError> {
    reachable_listen(&args.listen, "a coordinator", "workers and standbys")?;
    let key = Key::load(&args.key)?;
    if args.store.local_dir().is_some() || matches!(args.store, StoreSpec::Memory) {
        // Issue 13: a local directory or this process's memory is one process's only; the
        // workers could never reach it.
        return Err(CliError::Usage(format!(
            "--store {}: a coordinator needs checkpoint servers every worker reaches \
             (central:, replicate:, parity: or ida:)",
            args.store
        )));
    }
    let dashboard = args
        .dashboard
        .as_deref()
        .map(|addr| veriflow_cluster::observe::Dashboard::bind(addr, args.dashboard_public))
        .transpose()
        .map_err(|e| CliError::Invalid(e.to_string()))?;
    let store = open_store(&args.store, Some(&key))?;
    let cfg = CoordinatorConfig {
        key,
        store_spec: args.store.to_string(),
        store: store.clone(),
        fd: args.fd.params()?,
        standby: args.standby,
        coordinators: args.join_coordinators.clone(),
        lease: coordinator::LeaseParams::with_expiry(Duration::from_millis(args.lease_ms)),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::Invalid(format!("cannot start the network: {e}")))?;
    let served = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .map_err(|e| CliError::Invalid(format!("cannot listen on {}: {e}", args.listen)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| CliError::Invalid(e.to_string()))?;
        // Printed for whoever started this process (`cluster` reads them); a reader that went
        // away is not an error of the coordinator's.
        use std::io::Write as _;
        let say = |line: String| {
            let mut out = std::io::stdout();
            let _ = writeln!(out, "{line}").and_then(|()| out.flush());
        };
        say(format!("coordinator listening on {addr}"));
        if let Some(d) = &dashboard {
            // On stderr: stdout's first lines are what `cluster` and scripts read.
            eprintln!("coordinator: dashboard at {}", d.url());
        }
        coordinator::serve_observed(listener, cfg, dashboard, || {
            say(format!("coordinator active at {addr}"))
        })
        .await
        .map_err(CliError::from)
    });
    // The store's client owns a runtime: its last handle is dropped on this thread, after the
    // network runtime's tasks (dropping a runtime inside another's context panics).
    drop(rt);
    drop(store);
    served
}

/// `APP oracle`: follows the cluster's jobs and certifies them (`veriflow_cluster::oracle`).
pub(crate) fn oracle_cmd<P: Program>(args: &OracleArgs) -> Result<(), CliError> {
    let key = Key::load(&args.key)?;
    let (oracle_key, key_path) = Key::load_or_default(args.params.oracle_key.as_deref(), "oracle")?;
    let oracle_key = veriflow_certifier::OracleKey::from(oracle_key);
    veriflow_certifier::sample::n_eps_q(args.params.epsilon, args.params.q)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    if !(args.spot_floor > 0.0 && args.spot_floor <= 1.0) {
        return Err(CliError::Usage(format!(
            "--spot-floor must be in (0, 1], not {}",
            args.spot_floor
        )));
    }
    if !(0.0..=1.0).contains(&args.draw_ahead) {
        return Err(CliError::Usage(format!(
            "--draw-ahead must be in [0, 1], not {}",
            args.draw_ahead
        )));
    }
    eprintln!(
        "oracle: signing with {} (public key {}): `{} public-key` prints it for verifiers",
        key_path.display(),
        oracle_key.public().fingerprint(),
        P::NAME
    );
    let cfg = veriflow_cluster::oracle::OracleConfig {
        program: P::NAME.to_string(),
        coordinators: args.coordinator.clone(),
        key,
        oracle_key,
        registry: Arc::new(registry::<P>()?),
        epsilon: args.params.epsilon,
        q: args.params.q,
        spot_floor: args.spot_floor,
        draw_ahead: args.draw_ahead,
        poll_every: Duration::from_millis(args.poll_ms),
        certificates: args.certificates.clone(),
        once: args.once,
    };
    veriflow_cluster::oracle::run_oracle(cfg, &mut |line| {
        eprintln!("{line}");
        // For whoever started this process (`cluster --oracle` waits for it).
        if let Some(addr) = line.strip_prefix("oracle: following the cluster at ") {
            use std::io::Write as _;
            let mut out = std::io::stdout();
            let _ = writeln!(out, "oracle following {addr}").and_then(|()| out.flush());
        }
    })?;
    Ok(())
}

/// A coordinator and a worker tell others the address they listen on: an unspecified one
/// (`0.0.0.0`, `[::]`) would send every peer to its own host. A usage error, before anything
/// starts.
fn reachable_listen(listen: &str, who: &str, told: &str) -> Result<(), CliError> {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => Err(CliError::Usage(format!(
            "--listen {listen}: {who} tells {told} the address it listens on, and {} reaches \
             nobody; listen on this host's address (e.g. --listen HOST:{})",
            a.ip(),
            a.port()
        ))),
        _ => Ok(()),
    }
}

/// `APP worker`: serves the coordinator's jobs until it goes away.
pub(crate) fn worker_cmd<P: Program>(args: &WorkerArgs) -> Result<(), CliError> {
    reachable_listen(&args.listen, "a worker", "its peers")?;
    let key = Key::load(&args.key)?;
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(1))
    });
    let forge = match args.forge_rate {
        None => None,
        Some(_) if std::env::var(ALLOW_FORGERY).as_deref() != Ok("1") => {
            return Err(CliError::Usage(format!(
                "--forge-rate makes this worker lie: it is for tests, and refused unless \
                 {ALLOW_FORGERY}=1"
            )))
        }
        Some(q) if !(0.0..=1.0).contains(&q) => {
            return Err(CliError::Usage(format!(
                "--forge-rate must be between 0 and 1, not {q}"
            )))
        }
        Some(rate) => Some(veriflow_runtime::Forge {
            rate,
            seed: args.forge_seed,
            ..veriflow_runtime::Forge::default()
        }),
    };
    let cfg = WorkerConfig {
        program: P::NAME.to_string(),
        join: args.join.clone(),
        rejoin_patience: Duration::from_secs(args.rejoin_patience),
        listen: args.listen.clone(),
        key,
        threads,
        spare: args.spare,
    };
    let run_job: worker::RunJob =
        Arc::new(move |ctx: JobContext| run_job::<P>(ctx, threads, forge.clone()));
    worker::run_worker(cfg, run_job).map_err(CliError::from)
}

/// The job arguments in a job's command line (`submit ...` or `cluster ...`).
fn parse_job<P: Program>(argv: &[String]) -> Result<JobArgs<P>, String> {
    crate::app::parse_job_args::<P>(argv)
}

fn run_job<P: Program>(
    ctx: JobContext,
    threads: u32,
    forge: Option<veriflow_runtime::Forge>,
) -> Result<WorkerReport, String> {
    let job = parse_job::<P>(&ctx.spec.argv)?;
    if let Some(it) = job.program.iterative() {
        let out = veriflow_runtime::iterative::run_member(it.config, it.factory, ctx.member)
            .map_err(|e| e.to_string())?;
        return Ok(WorkerReport {
            tasks: out.stats.iter().map(|(_, s)| s.iterations).sum(),
            states: out
                .states
                .into_iter()
                .map(|(v, steps, state)| (v.0, steps, state))
                .collect(),
            iter_stats: out.stats.into_iter().map(|(v, s)| (v.0, s)).collect(),
            ..WorkerReport::default()
        });
    }
    let registry = registry::<P>().map_err(|e| e.to_string())?;
    let mut builder = Runtime::builder(registry)
        .program(P::NAME)
        .threads(threads as usize)
        .vnodes(ctx.vnodes)
        .seed(job.seed)
        .timers(worker::member_timers())
        .store(ctx.store)
        .checkpoint(!job.no_checkpoint)
        .commit_policy(job.commit.cluster_policy())
        .checkpoint_every(job.commit.checkpoint_every());
    if let Some(f) = forge {
        builder = builder.forge(f);
    }
    let runtime = builder.build().map_err(|e| e.to_string())?;
    let (root, inputs) = job.program.root();
    let report = runtime
        .run_member(root, inputs, ctx.member)
        .map_err(|e| e.to_string())?;
    Ok(WorkerReport::from(report))
}

/// What a finished cluster job gives the summary.
struct Finished {
    outputs: Vec<Vec<u8>>,
    root: String,
    tasks: u64,
    events: u64,
    elapsed_s: f64,
    vnodes: Vec<veriflow_runtime::VnodeStats>,
    workers_lost: u32,
    workers: u32,
    store: String,
    /// The job's id: its logs are the run `job-ID` of `store` (`veriflow_cluster::job_store`).
    job: u64,
    states: Vec<(u32, u64, Vec<u8>)>,
    iter_stats: Vec<(u32, veriflow_runtime::iterative::NodeStats)>,
    /// The online oracle's signed certificate (JSON), if one followed the job.
    online: Option<String>,
    /// Why a job an oracle followed ended without its certificate.
    uncertified: Option<String>,
    /// Workers the online oracle had evicted, and when (seconds after the job was accepted).
    evictions: Vec<(u32, f64)>,
    /// The active coordinator's counters right after the job (`None`: it did not answer).
    coordinator: Option<CoordCounters>,
    /// Workers `cluster --kill-random` killed (`None` for `submit`).
    killed: Option<u32>,
}

/// The job spec of a job's command line: an iterative program's vnodes are its blocks.
fn job_spec<P: Program>(
    job: &JobArgs<P>,
    argv: Vec<String>,
    min_workers: u32,
) -> Result<JobSpec, CliError> {
    let mut spec = JobSpec {
        argv,
        vnodes: job.vnodes.unwrap_or(0),
        min_workers,
        iterative: false,
    };
    if let Some(it) = job.program.iterative() {
        let n = u32::try_from(it.config.neighbours.len()).unwrap_or(u32::MAX);
        if job.vnodes.is_some_and(|v| v != n) {
            return Err(CliError::Usage(format!(
                "this iterative run has {n} blocks, one per vnode: --vnodes must be {n} or left out"
            )));
        }
        if job.certify {
            return Err(CliError::Usage(
                "an iterative run keeps no task log: --certify needs a data-flow run".into(),
            ));
        }
        it.config
            .validate()
            .map_err(|e| CliError::Invalid(e.to_string()))?;
        spec.vnodes = n;
        spec.iterative = true;
    }
    Ok(spec)
}

/// Follows a job to its end, printing what happens on the way unless `--json`.
fn follow(
    addrs: &[String],
    key: &Key,
    program: &str,
    spec: JobSpec,
    json: bool,
    on_progress: &mut dyn FnMut(u64),
) -> Result<Finished, CliError> {
    let (mut workers, mut store, mut job_id) = (0, String::new(), 0);
    let mut accepted: Option<std::time::Instant> = None;
    let mut evictions: Vec<(u32, f64)> = Vec::new();
    let mut on_event = |m: &ToSubmit| match m {
        ToSubmit::Accepted {
            job,
            workers: w,
            spares,
            vnodes,
            store: s,
        } => {
            workers = *w;
            store = s.clone();
            job_id = *job;
            accepted.get_or_insert_with(std::time::Instant::now);
            if !json {
                eprintln!("cluster: {vnodes} vnodes on {w} workers ({spares} spare), logs in {s}");
            }
        }
        // On stderr even with --json, as a takeover: a job that waits is worth knowing.
        ToSubmit::Queued { job, ahead } => {
            job_id = *job;
            eprintln!(
                "cluster: job {job} queued behind {ahead} job(s) of this program: it starts \
                 when their workers are free (`job cancel {job}` drops it)"
            );
        }
        ToSubmit::Progress { completed } => on_progress(*completed),
        ToSubmit::Oracle { commitment } => {
            eprintln!(
                "cluster: an online oracle follows the job (commitment {}…, revealed in its \
                 certificate)",
                &commitment[..16.min(commitment.len())]
            );
        }
        // On stderr even with --json: a takeover is worth knowing, and stdout stays the JSON.
        ToSubmit::Takeover { coordinator } => {
            eprintln!("cluster: coordinator {coordinator} took the job over");
        }
        ToSubmit::WorkerLost {
            worker,
            reason,
            moved,
        } => {
            if reason.starts_with("evicted") {
                let at = accepted.map_or(0.0, |t| t.elapsed().as_secs_f64());
                evictions.push((*worker, at));
            }
            if json {
                return;
            }
            let to: Vec<String> = moved
                .iter()
                .map(|(v, w)| format!("v{v}->worker {w}"))
                .collect();
            eprintln!(
                "cluster: worker {worker} lost ({reason}); recovering {}",
                to.join(", ")
            );
        }
        _ => {}
    };
    match veriflow_cluster::submit(addrs, key, program, spec, &mut on_event)? {
        ToSubmit::Finished {
            outputs,
            root,
            tasks,
            events,
            elapsed_s,
            vnodes,
            workers_lost,
            states,
            iter_stats,
            certificate,
            uncertified,
        } => Ok(Finished {
            coordinator: coordinator_counters(addrs, key),
            killed: None,
            states,
            iter_stats,
            online: certificate,
            uncertified,
            evictions,
            outputs,
            root,
            tasks,
            events,
            elapsed_s,
            vnodes,
            workers_lost,
            workers,
            store,
            job: job_id,
        }),
        ToSubmit::Failed { error } => Err(CliError::Invalid(format!("the job failed: {error}"))),
        _ => Err(CliError::Invalid(
            "the coordinator ended the job without a result".into(),
        )),
    }
}

/// The counters of the coordinator of `addrs` that holds the role, asked once.
fn coordinator_counters(addrs: &[String], key: &Key) -> Option<CoordCounters> {
    addrs.iter().find_map(|a| {
        veriflow_cluster::status(a, key)
            .ok()
            .filter(|s| s.role == "active")
            .map(|s| s.counters)
    })
}

/// The coordinator's counters in a summary: its traffic and its termination test.
fn coordinator_json(c: &CoordCounters, elapsed_s: f64) -> serde_json::Value {
    let rounds = c.probe_rounds.max(1) as f64;
    json!({
        "messages_in": c.messages_in,
        "messages_out": c.messages_out,
        "heartbeats_in": c.heartbeats_in,
        "heartbeats_out": c.heartbeats_out,
        "worker_heartbeats": c.worker_heartbeats,
        "probe_rounds": c.probe_rounds,
        "probes_sent": c.probes_sent,
        "words_received": c.words_received,
        "probe_round_ms_mean": c.probe_round_us_sum as f64 / rounds / 1e3,
        "probe_round_ms_max": c.probe_round_us_max as f64 / 1e3,
        "probe_rounds_per_s": c.probe_rounds as f64 / elapsed_s.max(1e-9),
        "detection_ms": c.last_detection_us.map(|us| us as f64 / 1e3),
    })
}

/// Prints the summary of a finished job (the same fields as `run`) and checks the result.
fn summarize<P: Program>(job: &JobArgs<P>, done: &Finished, key: &Key) -> Result<(), CliError> {
    if let Some(it) = job.program.iterative() {
        return summarize_iterative::<P>(job, &it, done);
    }
    let outputs: <P::Root as Task>::Outputs = decode_outputs(done.outputs.clone())
        .map_err(|e| CliError::Invalid(format!("terminal output {}: {}", e.index, e.reason)))?;
    let checked = job.program.check(&outputs);
    let recovered: u64 = done.vnodes.iter().map(|s| s.recovered_tasks).sum();
    let reused: u64 = done.vnodes.iter().map(|s| s.reused_tasks).sum();
    let online = done
        .online
        .as_deref()
        .map(veriflow_certifier::Certificate::from_json)
        .transpose()
        .map_err(|e| CliError::Invalid(format!("the online oracle's certificate: {e}")))?;
    let certificate = if job.certify {
        let spec: StoreSpec = done.store.parse()?;
        let store = veriflow_cluster::job_store(&open_store(&spec, Some(key))?, done.job, false)?;
        let opts = veriflow_certifier::Options {
            epsilon: job.certify_params.epsilon,
            q: job.certify_params.q,
            ..Default::default()
        };
        Some(crate::app::certify_signed::<P>(
            store,
            &opts,
            &job.certify_params,
            job.json,
        )?)
    } else {
        None
    };
    let secs = done.elapsed_s;
    if job.json {
        println!(
            "{}",
            json!({
                "program": P::NAME,
                "result": checked.as_ref().ok(),
                "correct": checked.is_ok(),
                "tasks": done.tasks,
                "elapsed_s": secs,
                "tasks_per_s": done.tasks as f64 / secs.max(1e-9),
                "events": done.events,
                "store": done.store,
                "run": veriflow_cluster::job_run_name(done.job),
                "workers": done.workers,
                "vnodes": done.vnodes.len(),
                "root": done.root,
                "seed": job.seed,
                "steals": done.vnodes.iter().map(|s| s.adopted).sum::<u64>(),
                "failures": done.workers_lost,
                "recovered_tasks": recovered,
                "reused_tasks": reused,
                "per_vnode": done.vnodes,
                "certificate": certificate.as_ref().map(|(c, _)| c),
                "online_certificate": online,
                "uncertified": done.uncertified,
                "evictions": done.evictions.iter().map(|(w, at)| json!({"worker": w, "at_s": at})).collect::<Vec<_>>(),
                "coordinator": done.coordinator.as_ref().map(|c| coordinator_json(c, secs)),
                "killed": done.killed,
            })
        );
    } else {
        match &checked {
            Ok(v) => println!("{}: result {v} {}", P::NAME, crate::app::checked_note(v)),
            Err(e) => println!("{}: {e}", P::NAME),
        }
        println!(
            "tasks: {} in {secs:.3} s ({:.0} tasks/s) on {} workers, {} vnodes, {} steals",
            done.tasks,
            done.tasks as f64 / secs.max(1e-9),
            done.workers,
            done.vnodes.len(),
            done.vnodes.iter().map(|s| s.adopted).sum::<u64>(),
        );
        if done.workers_lost > 0 {
            println!(
                "recovery: {} worker(s) lost; {recovered} tasks restarted from the logs, \
                 {reused} completed tasks reused",
                done.workers_lost
            );
        }
        let run = veriflow_cluster::job_run_name(done.job);
        println!(
            "events: {} logged, all durable; store: {} (run {run}: inspect and certify it with \
             --run {run})",
            done.events, done.store
        );
        if let Some(c) = &done.coordinator {
            println!(
                "coordinator: {} heartbeats in, {} out ({} sent by the workers); {} probe \
                 rounds of {:.1} ms; the end seen {} after the work stopped",
                c.heartbeats_in,
                c.heartbeats_out,
                c.worker_heartbeats,
                c.probe_rounds,
                c.probe_round_us_sum as f64 / c.probe_rounds.max(1) as f64 / 1e3,
                c.last_detection_us.map_or_else(
                    || "?".to_string(),
                    |us| format!("{:.1} ms", us as f64 / 1e3)
                ),
            );
        }
        if let Some(cert) = &online {
            print!("{}", online_text(cert));
        }
        if let Some(why) = &done.uncertified {
            println!("online oracle: not certified: {why}");
        }
        if let Some((cert, key)) = &certificate {
            print!("{}", crate::app::certificate_text(cert, None, key));
        }
    }
    checked.map(drop).map_err(CliError::from)?;
    if online
        .as_ref()
        .is_some_and(|c| c.decision == veriflow_certifier::Decision::Reject)
    {
        return Err(CliError::Rejected);
    }
    match certificate {
        Some((c, _)) if c.decision == veriflow_certifier::Decision::Reject => {
            Err(CliError::Rejected)
        }
        _ => Ok(()),
    }
}

/// The online oracle's certificate in the summary: its verdict, and what it saw per worker.
fn online_text(cert: &veriflow_certifier::Certificate) -> String {
    use std::fmt::Write as _;
    let mut s =
        crate::app::certificate_text(cert, None, std::path::Path::new("the online oracle's key"));
    if let Some(o) = &cert.online {
        let _ = writeln!(
            s,
            "online oracle: {} task(s) checked while the run ran, {} forged; commitment {}…",
            o.checked,
            o.detections.len(),
            cert.commitment
                .as_deref()
                .map_or("-", |c| &c[..16.min(c.len())])
        );
        for w in &o.workers {
            let bound = if w.forged > 0 {
                "caught forging".to_string()
            } else {
                format!(
                    "its forgery rate < {:.2}% at confidence {}%",
                    w.q_hat * 100.0,
                    (1.0 - cert.epsilon) * 100.0
                )
            };
            let _ = writeln!(
                s,
                "  worker {}: {} tasks, {} checked, {} forged{}; {bound}",
                w.worker,
                w.tasks,
                w.checked,
                w.forged,
                if w.evicted { ", EVICTED" } else { "" },
            );
        }
    }
    s
}

/// The summary of a finished iterative job: its program's check of every vnode's final state.
fn summarize_iterative<P: Program>(
    job: &JobArgs<P>,
    it: &crate::app::Iterative,
    done: &Finished,
) -> Result<(), CliError> {
    use veriflow_runtime::iterative::{IterReport, NodeStats};
    let n = it.config.neighbours.len();
    let mut states: Vec<Option<Vec<u8>>> = vec![None; n];
    let mut steps = 0;
    for (v, st, state) in &done.states {
        if let Some(slot) = states.get_mut(*v as usize) {
            *slot = Some(state.clone());
            steps = steps.max(*st);
        }
    }
    let states = states
        .into_iter()
        .enumerate()
        .map(|(v, s)| {
            s.ok_or_else(|| {
                CliError::Invalid(format!(
                    "the final state of vnode {v} was lost with its worker as the job ended"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut vnodes = vec![NodeStats::default(); n];
    for (v, s) in &done.iter_stats {
        if let Some(slot) = vnodes.get_mut(*v as usize) {
            slot.add(s);
        }
    }
    let report = IterReport {
        states,
        steps,
        replacements: vnodes.iter().map(|s| s.restores).sum(),
        vnodes,
        elapsed_s: done.elapsed_s,
    };
    let checked = (it.check)(&report);
    crate::iterative_cli::print_summary::<P>(
        it,
        &report,
        &checked,
        job.json,
        &crate::iterative_cli::Where::Cluster {
            workers: done.workers,
            lost: done.workers_lost,
        },
    );
    checked.map(drop).map_err(CliError::from)
}

/// `APP submit`.
pub(crate) fn submit_cmd<P: Program>(
    args: &SubmitArgs<P>,
    argv: Vec<String>,
) -> Result<(), CliError> {
    let key = Key::load(&args.key)?;
    let spec = job_spec(&args.job, argv, 1)?;
    let bar = crate::app::progress_bar(args.job.json, args.job.program.expected_tasks());
    let mut progress = |n: u64| {
        if let Some(b) = &bar {
            crate::app::advance(b, n);
        }
    };
    let done = follow(
        &args.coordinator,
        &key,
        P::NAME,
        spec,
        args.job.json,
        &mut progress,
    );
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    summarize(&args.job, &done?, &key)
}

/// How often `status --watch` asks again.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// `APP status`: the coordinator's snapshot of its cluster, as a table or one JSON object;
/// with `--watch`, again every [`WATCH_EVERY`] until interrupted or an error.
pub(crate) fn status_cmd(args: &StatusArgs) -> Result<(), CliError> {
    let (ask, watch) = (&args.ask, args.watch);
    let key = Key::load(&ask.key)?;
    loop {
        let s = veriflow_cluster::status(&ask.coordinator, &key)?;
        let text = if ask.json {
            serde_json::to_string(&s)
                .map_err(|e| CliError::Invalid(format!("cannot print the status: {e}")))?
        } else {
            status_table(&s)
        };
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // A closed stdout (`| head`) ends the watch quietly.
            if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() || !watch {
                return Ok(());
            }
        }
        std::thread::sleep(WATCH_EVERY);
    }
}

/// `APP jobs`: a coordinator's jobs (`coordinator` rule 12).
pub(crate) fn jobs_cmd(args: &JobsArgs) -> Result<(), CliError> {
    let args = &args.ask;
    let key = Key::load(&args.key)?;
    let s = veriflow_cluster::status(&args.coordinator, &key)?;
    if s.role != "active" {
        return Err(CliError::Invalid(format!(
            "coordinator {} is a {}; ask the active one ({})",
            s.coordinator,
            s.role,
            s.active.as_deref().unwrap_or("unknown")
        )));
    }
    let text = if args.json {
        serde_json::to_string(&s.jobs)
            .map_err(|e| CliError::Invalid(format!("cannot print the jobs: {e}")))?
    } else {
        jobs_table(&s.jobs)
    };
    println!("{text}");
    Ok(())
}

/// The human form of a job list.
fn jobs_table(jobs: &[veriflow_cluster::protocol::JobStatus]) -> String {
    use std::fmt::Write;
    if jobs.is_empty() {
        return "no jobs".to_string();
    }
    let mut o = format!(
        "{:>5}  {:<10} {:<14} {:>12} {:>9}  {:<10} {}\n",
        "id", "program", "state", "tasks", "time (s)", "run", "command"
    );
    for j in jobs {
        let _ = writeln!(
            o,
            "{:>5}  {:<10} {:<14} {:>12} {:>9.1}  {:<10} {}{}",
            j.id,
            j.program,
            j.state,
            j.tasks_completed,
            j.elapsed_s,
            j.run,
            j.argv.join(" "),
            j.error
                .as_deref()
                .map(|e| format!("\n{:>7}{e}", ""))
                .unwrap_or_default()
        );
    }
    o.truncate(o.trim_end().len());
    o
}

/// `APP job cancel ID`.
pub(crate) fn job_cmd(args: &JobCmdArgs) -> Result<(), CliError> {
    match &args.command {
        JobCommand::Cancel(c) => {
            let key = Key::load(&c.key)?;
            let was = veriflow_cluster::cancel(&c.coordinator, &key, c.id)?;
            println!("job {} cancelled ({was})", c.id);
            Ok(())
        }
    }
}

/// The human form of a status snapshot.
fn status_table(s: &ClusterStatus) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    if s.role != "active" {
        let _ = writeln!(
            o,
            "coordinator {} is a {}; the active coordinator is {}",
            s.coordinator,
            s.role,
            s.active.as_deref().unwrap_or("unknown")
        );
        o.truncate(o.trim_end().len());
        return o;
    }
    let _ = writeln!(
        o,
        "coordinator {} (active, term {:#x}{}{})",
        s.coordinator,
        s.term,
        if s.took_over { ", took over" } else { "" },
        if s.recovering {
            ", waiting for members to come back"
        } else {
            ""
        },
    );
    if s.coordinators.len() > 1 {
        let _ = writeln!(o, "coordinators: {}", s.coordinators.join(", "));
    }
    if !s.absent.is_empty() {
        let _ = writeln!(o, "absent members: {:?}", s.absent);
    }
    let live: Vec<_> = s
        .jobs
        .iter()
        .filter(|j| !j.ended() && j.state != "queued")
        .collect();
    if live.is_empty() {
        let _ = writeln!(o, "job: none");
    }
    for j in &live {
        let _ = writeln!(
            o,
            "job {} ({}): {} ({}), {} vnodes, {} tasks completed ({:.0}/s), {:.1} s, {} \
             worker(s) lost",
            j.id,
            j.program,
            j.state,
            j.argv.join(" "),
            j.vnodes,
            j.tasks_completed,
            j.tasks_per_s,
            j.elapsed_s,
            j.workers_lost
        );
    }
    if s.waiting > 0 {
        let _ = writeln!(o, "jobs queued: {} (`jobs` lists them)", s.waiting);
    }
    let _ = writeln!(o, "workers: {}", s.workers.len());
    if !s.workers.is_empty() {
        let _ = writeln!(
            o,
            "  {:>4}  {:<10} {:>5}  {:<22} {:>7} {:>5} {:>6} {:>10}  detector",
            "id", "program", "job", "address", "threads", "spare", "vnodes", "heard"
        );
    }
    for w in &s.workers {
        let heard = w
            .last_heard_ago_s
            .map_or_else(|| "-".to_string(), |a| format!("{a:.1} s ago"));
        let _ = writeln!(
            o,
            "  {:>4}  {:<10} {:>5}  {:<22} {:>7} {:>5} {:>6} {:>10}  {}",
            w.id,
            w.program,
            w.job.map_or_else(|| "-".to_string(), |j| j.to_string()),
            w.addr,
            w.threads,
            if w.spare { "yes" } else { "no" },
            w.vnodes,
            heard,
            w.detector
        );
    }
    for j in &live {
        if !j.map.is_empty() {
            let _ = writeln!(o, "vnode map of job {} (vnode: worker@epoch):", j.id);
            for row in j.map.chunks(8) {
                let cells: Vec<String> = row
                    .iter()
                    .map(|v| format!("{:>4}: {}@{}", v.vnode, v.worker, v.epoch))
                    .collect();
                let _ = writeln!(o, " {}", cells.join("  "));
            }
        }
        let _ = writeln!(o, "failures in job {}: {}", j.id, j.failures.len());
        for f in &j.failures {
            let _ = writeln!(
                o,
                "  worker {} lost {:.1} s ago ({} vnode(s) moved): {}",
                f.worker, f.ago_s, f.moved, f.reason
            );
        }
    }
    if !s.gone.is_empty() {
        let _ = writeln!(o, "workers lost since start: {:?}", s.gone);
    }
    if let Some(l) = s.jobs.iter().rev().find(|j| j.ended()) {
        let _ = match &l.error {
            Some(e) => writeln!(
                o,
                "last job ended: {} ({}): {}: {e}",
                l.id, l.program, l.state
            ),
            None => writeln!(
                o,
                "last job ended: {} ({}): {}, {} tasks in {:.1} s, {} worker(s) lost",
                l.id, l.program, l.state, l.tasks_completed, l.elapsed_s, l.workers_lost
            ),
        };
    }
    o.truncate(o.trim_end().len());
    o
}

/// `cluster`'s worker processes, each with whether it is a spare.
#[derive(Default)]
struct Fleet {
    procs: Vec<(Proc, bool)>,
    killed: u32,
}

/// A child process killed (SIGKILL) and reaped when dropped.
struct Proc(Option<Child>);

impl Proc {
    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn_self(args: &[String], log: &std::path::Path) -> Result<Child, CliError> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Invalid(format!("cannot find this program's binary: {e}")))?;
    spawn(&exe, args, log)
}

/// Starts `bin args`, its stderr into `log` and its stdout piped (`chaos` and `cluster`).
pub(crate) fn spawn(
    bin: &std::path::Path,
    args: &[String],
    log: &std::path::Path,
) -> Result<Child, CliError> {
    let err = std::fs::File::create(log).map_err(|source| CliError::Io {
        what: "cannot write",
        path: log.to_path_buf(),
        source,
    })?;
    Process::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .map_err(|e| CliError::Invalid(format!("cannot start {}: {e}", bin.display())))
}

/// The address a coordinator process started by [`spawn`] listens on, read from its stdout;
/// with `active`, after it also said it took the role. Its log says why when it did not.
pub(crate) fn coordinator_started(
    child: &mut Child,
    log: &std::path::Path,
    active: bool,
) -> Result<String, CliError> {
    let mut lines = child.stdout.take().map(BufReader::new);
    let mut next = || {
        let mut line = String::new();
        if let Some(r) = lines.as_mut() {
            let _ = r.read_line(&mut line);
        }
        line.trim().to_string()
    };
    let why = |what: &str| {
        let log = std::fs::read_to_string(log).unwrap_or_default();
        CliError::Invalid(format!("{what}: {}", log.trim()))
    };
    let addr = next()
        .strip_prefix("coordinator listening on ")
        .map(str::to_string)
        .ok_or_else(|| why("a coordinator did not start"))?;
    if active && !next().starts_with("coordinator active") {
        return Err(why("the coordinator did not take the role"));
    }
    Ok(addr)
}

/// The limits of `cluster`'s checkpoint servers: each of its `processes` (and the oracle, the
/// submitting client, the certifier) holds a connection, all from 127.0.0.1, so the default
/// cap of 64 per peer address refused the 65th process of a 64-worker cluster (issue 16);
/// twice the processes leaves room for replacements whose predecessor's connection is not
/// closed yet.
fn loopback_server_config(processes: u32) -> veriflow_checkpoint::server::ServerConfig {
    let d = veriflow_checkpoint::server::ServerConfig::default();
    let per_peer = d.max_connections_per_peer.max(2 * processes as usize + 16);
    veriflow_checkpoint::server::ServerConfig {
        max_connections_per_peer: per_peer,
        max_connections: d.max_connections.max(per_peer),
        ..d
    }
}

/// `APP cluster`: checkpoint servers, a coordinator and workers on loopback, one job, then
/// everything torn down.
pub(crate) fn cluster_cmd<P: Program>(
    args: &ClusterArgs<P>,
    argv: Vec<String>,
) -> Result<(), CliError> {
    if args.kill_every.is_some() && args.kill_random == 0 {
        return Err(CliError::Usage(
            "--kill-every MS paces the kills of --kill-random K: give --kill-random too".into(),
        ));
    }
    let dir = tempfile::Builder::new()
        .prefix(&format!("veriflow-{}-cluster-", P::NAME))
        .tempdir()
        .map_err(|source| CliError::Io {
            what: "cannot create a directory in",
            path: std::env::temp_dir(),
            source,
        })?;
    let key_path = dir.path().join("cluster.key");
    let key = Key::create(&key_path)?;
    let kp = key_path.display().to_string();
    // Checkpoint servers, in this process (each its own sled directory).
    let strategy = args.store_strategy.trim().to_string();
    let needed = u32::try_from(StoreSpec::servers_for(&strategy)?).unwrap_or(u32::MAX);
    let servers = args.checkpoint_servers.unwrap_or(needed);
    if servers != needed {
        return Err(CliError::Usage(format!(
            "--store-strategy {strategy} needs {needed} checkpoint servers, --checkpoint-servers says {servers}"
        )));
    }
    // One network thread per server, at most two: a server answers each connection's requests
    // in order and commits on its own thread (checkpoint-server's server.rs rules 3 and 6), so a
    // second thread for one server only wakes up to look for work. (perf of `paper cluster`,
    // central, 3 runs each: the server's runtime threads took 44 ms of CPU a run more in S1
    // than in S0, 28 % of all the logging CPU, a fifth of it in the scheduler's wake-ups.)
    let net = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::try_from(servers).unwrap_or(2).clamp(1, 2))
        .enable_all()
        .build()
        .map_err(|e| CliError::Invalid(format!("cannot start the network: {e}")))?;
    let mut addrs = Vec::new();
    let config = loopback_server_config(args.workers + args.spares + args.coordinators);
    for i in 0..servers {
        let spec = StoreSpec::from_str(&format!(
            "{}:{}",
            args.server_engine,
            dir.path().join(format!("cs{i}")).display()
        ))?;
        let store = open_store(&spec, None)?;
        let server = net
            .block_on(Server::bind_with(
                "127.0.0.1:0",
                store,
                key.clone(),
                config.clone(),
            ))
            .map_err(|e| CliError::Invalid(format!("cannot start a checkpoint server: {e}")))?;
        addrs.push(
            server
                .local_addr()
                .map_err(|e| CliError::Invalid(e.to_string()))?
                .to_string(),
        );
        net.spawn(async move {
            let _ = server.run().await;
        });
    }
    let store_spec = format!("{strategy}:{}", addrs.join(","));
    // The coordinators: the first takes the role, the others stand by.
    let mut coordinators: Vec<Proc> = Vec::new();
    let mut caddrs: Vec<String> = Vec::new();
    for i in 0..args.coordinators {
        let mut coord_args = vec![
            "coordinator".to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--key".into(),
            kp.clone(),
            "--store".into(),
            store_spec.clone(),
        ];
        if i > 0 {
            coord_args.push("--standby".into());
            coord_args.push(format!("--join-coordinators={}", caddrs.join(",")));
        }
        coord_args.extend(args.fd.to_args());
        let log = dir.path().join(format!("coordinator{i}.log"));
        let mut child = spawn_self(&coord_args, &log)?;
        let addr = coordinator_started(&mut child, &log, i == 0);
        let proc = Proc(Some(child));
        let addr = addr?;
        caddrs.push(addr);
        coordinators.push(proc);
    }
    let caddr = caddrs.join(",");
    // The online oracle follows the cluster before the job is submitted.
    let _oracle = if args.oracle {
        let mut oa = vec![
            "oracle".to_string(),
            "--coordinator".into(),
            caddr.clone(),
            "--key".into(),
            kp.clone(),
            "--once".into(),
            format!("--epsilon={}", args.job.certify_params.epsilon),
            format!("--q={}", args.job.certify_params.q),
        ];
        if let Some(k) = &args.job.certify_params.oracle_key {
            oa.push("--oracle-key".into());
            oa.push(k.display().to_string());
        }
        let log = dir.path().join("oracle.log");
        let mut child = spawn_self(&oa, &log)?;
        let mut line = String::new();
        if let Some(out) = child.stdout.as_mut() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        if !line.starts_with("oracle following") {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(CliError::Invalid(format!(
                "the online oracle did not start: {}",
                log.trim()
            )));
        }
        Some(Proc(Some(child)))
    } else {
        None
    };
    // The workers.
    let worker_args = |i: u32, spare: bool| {
        let mut wa = vec![
            "worker".to_string(),
            "--join".into(),
            caddr.clone(),
            "--key".into(),
            kp.clone(),
            "--threads".into(),
            args.threads.to_string(),
        ];
        if spare {
            wa.push("--spare".into());
        }
        if i < args.forge_workers {
            wa.push(format!("--forge-rate={}", args.forge_rate));
            wa.push(format!(
                "--forge-seed={}",
                args.job.seed.wrapping_add(u64::from(i))
            ));
        }
        (wa, dir.path().join(format!("worker{i}.log")))
    };
    let mut fleet = Fleet::default();
    for i in 0..args.workers + args.spares {
        let spare = i >= args.workers;
        let (wa, log) = worker_args(i, spare);
        fleet
            .procs
            .push((Proc(Some(spawn_self(&wa, &log)?)), spare));
    }
    let fleet = std::sync::Mutex::new(fleet);
    // Kills the first live worker from index `draw` on and, with --replace, starts its
    // successor (a spare for a spare).
    let kill_one = |draw: usize| -> Result<(), CliError> {
        let mut f = fleet
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = f.procs.len();
        let Some(v) = (draw..draw + n)
            .map(|i| i % n)
            .find(|&i| f.procs[i].0 .0.is_some())
        else {
            return Ok(());
        };
        f.procs[v].0.kill();
        f.killed += 1;
        if args.replace {
            let spare = f.procs[v].1;
            let (wa, log) = worker_args(u32::try_from(n).unwrap_or(u32::MAX), spare);
            f.procs.push((Proc(Some(spawn_self(&wa, &log)?)), spare));
        }
        Ok(())
    };
    let total = if args.replace {
        args.kill_random
    } else {
        args.kill_random.min(args.workers + args.spares)
    };
    // Seeded kills: a worker at a fraction of the expected tasks (`kill_draws`, which `paper
    // cluster` reads too); --kill-every draws its victims from the same seed as it goes.
    let mut rng = ChaCha8Rng::seed_from_u64(args.job.seed ^ 0x6b69_6c6c); // "kill"
    let mut kills: Vec<(f64, usize)> = if args.kill_every.is_some() {
        Vec::new()
    } else {
        kill_draws(args.job.seed, total, args.workers + args.spares)
    };
    let expected = args.job.program.expected_tasks();
    let spec = job_spec(&args.job, argv, args.workers + args.spares)?;
    let bar = crate::app::progress_bar(args.job.json, expected);
    let started = std::time::Instant::now();
    // The active coordinator's kill, after the workers' first (or at a third of the run).
    let mut coord_kill = (args.kill_coordinator && args.coordinators > 1)
        .then(|| kills.first().map_or(0.33, |k| (k.0 + 0.05).min(0.8)));
    // --kill-every: a thread kills one worker every MS ms from the job's first progress
    // report (the job runs: every worker joined) until the job ends or K were killed.
    let running = std::sync::Mutex::new(None::<std::time::Instant>);
    let ended = std::sync::atomic::AtomicBool::new(false);
    let mut kill_error: Option<CliError> = None;
    let done = std::thread::scope(|scope| {
        if let Some(every) = args.kill_every {
            let every = Duration::from_millis(every);
            let (running, ended, kill_one, kill_error) =
                (&running, &ended, &kill_one, &mut kill_error);
            scope.spawn(move || {
                let mut n = 0;
                while n < total && !ended.load(std::sync::atomic::Ordering::Relaxed) {
                    // Ticks of 20 ms: a kill is at most this late, and the end is seen soon.
                    std::thread::sleep(Duration::from_millis(20));
                    let since = *running
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if since.is_none_or(|t0| t0.elapsed() < every * (n + 1)) {
                        continue;
                    }
                    if let Err(e) = kill_one(rng.random_range(0..usize::MAX)) {
                        *kill_error = Some(e);
                        return;
                    }
                    n += 1;
                }
            });
        }
        let mut seeded_error = None;
        let mut progress = |n: u64| {
            if let Some(b) = &bar {
                crate::app::advance(b, n);
            }
            running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get_or_insert_with(std::time::Instant::now);
            let frac = match expected {
                Some(t) if t > 0 => n as f64 / t as f64,
                _ => started.elapsed().as_secs_f64(), // no estimate: a kill per elapsed second
            };
            while let Some(&(at, w)) = kills.first() {
                if frac < at {
                    break;
                }
                kills.remove(0);
                if let Err(e) = kill_one(w) {
                    seeded_error.get_or_insert(e);
                }
            }
            if coord_kill.is_some_and(|at| frac >= at) {
                coord_kill = None;
                coordinators[0].kill();
            }
        };
        let done = follow(&caddrs, &key, P::NAME, spec, args.job.json, &mut progress);
        ended.store(true, std::sync::atomic::Ordering::Relaxed);
        match seeded_error {
            Some(e) => Err(e),
            None => done,
        }
    });
    let killed = fleet
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .killed;
    let done = match kill_error {
        Some(e) => Err(e),
        None => done.map(|d| Finished {
            killed: Some(killed),
            ..d
        }),
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let result = match done {
        Ok(d) => summarize(&args.job, &d, &key),
        Err(e) => Err(e),
    };
    drop(fleet);
    drop(coordinators);
    drop(net);
    if result.is_err() {
        eprintln!(
            "cluster: the processes' logs are in {}",
            dir.keep().display()
        );
    }
    result
}

/// `cluster --kill-random COUNT`'s kills of seed `seed` among `procs` worker processes (spares
/// last), in the order they happen: each a fraction of the expected tasks in [0.2, 0.7) and the
/// index of the worker process killed. `paper cluster` reads its kill point from here, so what
/// it reports is what the run does.
#[doc(hidden)]
pub fn kill_draws(seed: u64, count: u32, procs: u32) -> Vec<(f64, usize)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6b69_6c6c); // "kill"
    let procs = usize::try_from(procs).expect("a process count fits in usize");
    let mut kills: Vec<(f64, usize)> = (0..count)
        .map(|_| (rng.random_range(0.2..0.7), rng.random_range(0..procs)))
        .collect();
    kills.sort_by(|a, b| a.0.total_cmp(&b.0));
    kills
}

//! `paper detector`: the Phoenix failure detector (paper 004 §4) in cluster mode — how fast a
//! crashed or hung process is declared lost, how many heartbeats it costs, and what it costs
//! knary.
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- detector [--quick]
//!     [--processes N,N] [--kill-trials N] [--stop-trials N] [--sim-seconds S] [--runs N]
//!     [--workers W] [--depth D] [--fanout F] [--grain-us G] [--seed S] [--knary-bin PATH]
//!     [--out DIR] [--quiet-wait SECS] [--retries N] [--timeout SECS]
//!     [--skip-latency] [--skip-heartbeats] [--skip-slowdown]
//! ```
//!
//! Three measurements, one report (`detector.json`, `detector.md`, `detector_latency.svg` and
//! `.png`):
//!
//! 1. **Detection latency, real processes.** A `knary coordinator` (`--store memory`, nothing
//!    is logged) with T_interval = T_timeout = T_broken = 1 s, T_insurance = 5 s, k = 3, and
//!    `--processes` − 1 idle `knary worker --threads 1` processes, so that the coordinator's
//!    detector watches that many processes and the cluster has `--processes` detectors. A
//!    trial waits a seeded 0.3-1.3 s (so the signal lands at a random phase of the heartbeat
//!    rounds), signals a seeded random worker, and times from just before the signal until the
//!    coordinator's stderr line `coordinator: worker N lost: ...` arrives (read by a thread
//!    that stamps each line as it comes; the coordinator writes it unbuffered). SIGKILL is
//!    `Child::kill`; the kernel resets the dead process's connections, so the coordinator
//!    loses it at once (rule 7 of `detect/mod.rs`), bounded by T_broken + 0.1 s. SIGSTOP goes
//!    through the `kill` command (the bench has no libc binding; its own time is included, and
//!    reported): the process keeps its connections but stops sending, so the coordinator's
//!    detector must notice the silence: Unreachable after the promise (T_interval, the
//!    coordinator is the idle worker's only peer, hence its monitor) + T_timeout, Broken
//!    T_broken later, i.e. 2-3 s after the signal. After each trial the victim is SIGKILLed
//!    and reaped, and a new worker joins, so every trial sees the same cluster size. A "lost"
//!    line about any other worker is counted as a false suspicion.
//! 2. **Heartbeats per process per second**, by simulation: counting the real frames would
//!    need counters the cluster does not expose, so N real [`Detector`]s run on a virtual clock
//!    over FIFO links with 50-500 µs delays (a discrete-event loop like the detector's own
//!    tests), and their [`FdStats`] give the heartbeats sent (round + insurance) per process
//!    per second. Idle cluster: the workers are linked to the coordinator only, as in part 1;
//!    idle job: every process linked to every other, no messages; busy job: the same links,
//!    every process sending 100 application messages per second to random peers (every
//!    message counts as a heartbeat and postpones insurance, rule 5). Both the issue's
//!    parameters and the cluster command's defaults.
//! 3. **Slowdown**: `knary cluster --no-checkpoint` (S0, so that the detector is the only
//!    cost) on `--workers` workers, with the detector at the cluster's default parameters
//!    (T_interval 200 ms, T_timeout 400 ms, T_broken 400 ms, T_insurance 1 s, k = 3), at the
//!    issue's 1 s parameters, and practically silent (every period 600 s: one introduction and
//!    one round at start, then nothing for ten minutes; a reset connection is still seen at
//!    once), interleaved, `--runs` repetitions, medians of the coordinator's `elapsed_s`; a
//!    repetition disturbed by other processes is run again, as in `paper cluster`. A 1 % effect
//!    is below this machine's noise, so the detector's CPU is also measured apart: an idle
//!    cluster of the same processes per setting, the CPU of all their threads from the
//!    scheduler over 20 s; the difference to the silent setting, divided by the heartbeats
//!    sent (simulated for that topology), is the CPU per heartbeat, and at a busy job's
//!    heartbeat rate (part 2) it bounds the share of the cores the detector takes.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::{json, Value};
use veriflow::runtime::detect::{Action, Detector, FdParams, FdStats, Heartbeat, PeerId};

use crate::cluster::{cluster_run, rounds, ClusterRun, Plan, DEFAULT_DEPTH, DEFAULT_GRAIN_US};
use crate::harness::{
    cpu_text, knary_binary, plot, require_runs, CpuSnapshot, Figure, Guard, Plots, Quiet, Series,
    Session, Stats, COLORS,
};
use crate::{Setting, Shape};

/// Options of `paper detector`.
#[derive(clap::Args, Debug, Clone)]
pub struct DetectorArgs {
    /// Cluster sizes of the latency trials and the simulation: the coordinator plus
    /// N − 1 workers [default: 24,48; --quick: 8].
    #[arg(long, value_delimiter = ',', value_name = "N,N",
          value_parser = clap::value_parser!(u32).range(2..=256))]
    pub processes: Vec<u32>,
    /// SIGKILL trials per size [default: 40; --quick: 5].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub kill_trials: Option<u32>,
    /// SIGSTOP trials per size (about 3.5 s each) [default: 30; --quick: 3].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub stop_trials: Option<u32>,
    /// Simulated seconds per heartbeat-rate scenario [default: 600; --quick: 60].
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..=100_000))]
    pub sim_seconds: Option<u64>,
    /// Repetitions of the slowdown runs (each setting; at least 5 unless --quick)
    /// [default: 7; --quick: 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: Option<u32>,
    /// Worker processes of the slowdown runs (1 thread each).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Depth of the slowdown runs' knary tree [default: 7, as `paper cluster`; --quick: 5].
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=9))]
    pub depth: Option<u32>,
    /// Fanout of the slowdown runs' knary tree.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..=10))]
    pub fanout: u32,
    /// Busy loop of every node of the slowdown runs, in µs (as `paper cluster`).
    #[arg(long, default_value_t = DEFAULT_GRAIN_US,
          value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub grain_us: u64,
    /// Seed of the victims, the trials' phases and the simulation.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Small sizes, few trials and runs: a smoke run (writes detector-quick.* instead).
    #[arg(long)]
    pub quick: bool,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The `knary` binary [default: beside this binary, built first with `cargo build -p
    /// knary` in this binary's profile].
    #[arg(long, value_name = "PATH")]
    pub knary_bin: Option<PathBuf>,
    /// Before each latency series and each slowdown repetition, wait up to this many seconds
    /// for other processes to use less than a quarter of a core (0: do not wait).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub quiet_wait: u64,
    /// Slowdown repetitions disturbed by other processes are run again at most this many
    /// times (more than `paper cluster`'s 3: a 1 % effect drowns in any disturbance).
    #[arg(long, default_value_t = 8)]
    pub retries: u32,
    /// A slowdown run taking longer than this is killed and the command fails.
    #[arg(long, value_name = "SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
    /// Skip part 1 (detection latency).
    #[arg(long)]
    pub skip_latency: bool,
    /// Skip part 2 (heartbeat rates).
    #[arg(long)]
    pub skip_heartbeats: bool,
    /// Skip part 3 (slowdown).
    #[arg(long)]
    pub skip_slowdown: bool,
}

/// The issue's parameters for the latency targets: T_interval = T_timeout = T_broken = 1 s,
/// and `FdParams::default()`'s T_insurance = 5 s and k = 3.
fn issue_params() -> FdParams {
    FdParams::default()
}

/// The cluster command's defaults (`FdArgs` in `src/cluster_cli.rs`).
pub(crate) fn cluster_default_params() -> FdParams {
    FdParams {
        interval: Duration::from_millis(200),
        timeout: Duration::from_millis(400),
        insurance: Duration::from_millis(1000),
        broken: Duration::from_millis(400),
        k: 3,
    }
}

/// Whole milliseconds of `d`.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `params` as `knary` command-line options.
fn fd_argv(p: &FdParams) -> Vec<String> {
    vec![
        format!("--fd-interval-ms={}", ms(p.interval)),
        format!("--fd-timeout-ms={}", ms(p.timeout)),
        format!("--fd-broken-ms={}", ms(p.broken)),
        format!("--fd-insurance-ms={}", ms(p.insurance)),
        format!("--fd-k={}", p.k),
    ]
}

/// Targets of issue 6: a crashed process within T_broken + 0.1 s (p99), a hung one within
/// 3.5 s (p99), and at most 1 % slowdown.
const TARGET_KILL_SLACK: Duration = Duration::from_millis(100);
const TARGET_STOP_S: f64 = 3.5;
const TARGET_SLOWDOWN: f64 = 1.01;

/// Every period of the "silent" detector: ten minutes, the command line's largest value.
const SILENT_MS: u64 = 600_000;

/// Runs `paper detector` (module docs) and writes its results.
pub fn run(args: &DetectorArgs) -> Result<()> {
    if args.skip_latency && args.skip_heartbeats && args.skip_slowdown {
        bail!("--skip-latency, --skip-heartbeats and --skip-slowdown leave nothing to measure");
    }
    let runs = args.runs.unwrap_or(if args.quick { 2 } else { 7 });
    require_runs(runs, 5, args.quick || args.skip_slowdown)?;
    let sizes: Vec<u32> = if args.processes.is_empty() {
        if args.quick {
            vec![8]
        } else {
            vec![24, 48]
        }
    } else {
        args.processes.clone()
    };
    let session = Session::start(args.out.as_deref(), args.quick)?;
    let knary = if args.skip_latency && args.skip_slowdown {
        None
    } else {
        Some(knary_binary(args.knary_bin.as_deref())?)
    };
    let mut rng = SplitMix(args.seed ^ 0xde7e_c70a);

    let mut latency = Vec::new();
    if let (false, Some(knary)) = (args.skip_latency, &knary) {
        let kills = args.kill_trials.unwrap_or(if args.quick { 5 } else { 40 });
        let stops = args.stop_trials.unwrap_or(if args.quick { 3 } else { 30 });
        for &n in &sizes {
            latency.push(latency_series(
                knary,
                n,
                kills,
                stops,
                args.quiet_wait,
                &mut rng,
            )?);
        }
    }
    let mut heartbeats = Vec::new();
    if !args.skip_heartbeats {
        let secs = args
            .sim_seconds
            .unwrap_or(if args.quick { 60 } else { 600 });
        eprintln!("heartbeats: simulating {secs} s per scenario");
        for (name, params) in [
            ("issue (1 s)", issue_params()),
            ("cluster default", cluster_default_params()),
        ] {
            for &n in &sizes {
                for scenario in SCENARIOS {
                    let row = simulate(name, params, n as usize, scenario, secs, rng.next());
                    eprintln!(
                        "  {name}, {n} processes, {}: {:.2} heartbeats/s per process (max \
                         {:.2}, coordinator {:.2})",
                        scenario.name, row.mean_total, row.max_total, row.coordinator_total
                    );
                    heartbeats.push(row);
                }
            }
        }
    }
    let slowdown = match (&knary, args.skip_slowdown) {
        (Some(knary), false) => Some(slowdown_series(args, knary, runs as usize)?),
        _ => None,
    };

    let report = Report {
        seed: args.seed,
        latency,
        heartbeats,
        slowdown,
    };
    let stem = session.stem("detector");
    let plots = if report.latency.is_empty() {
        Plots::none()
    } else {
        session.plot(
            &format!("{stem}_latency"),
            &LatencyFigure::of(&report.latency),
        )
    };
    session.write(
        "detector",
        &stem,
        report.json(&plots),
        &report.markdown(&plots),
    )
}

// ---------------------------------------------------------------------------------------------
// Part 1: detection latency with real processes.

/// How long a coordinator or worker may take to start and join.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a trial waits for the verdict before calling the victim undetected.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A signal a trial sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
enum Signal {
    /// A crash: the kernel closes the process's sockets (connections reset).
    Sigkill,
    /// A hang: the process keeps its connections and says nothing.
    Sigstop,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Sigkill => "SIGKILL",
            Signal::Sigstop => "SIGSTOP",
        }
    }
}

/// A line of the coordinator's stderr that the trials care about.
#[derive(Debug, PartialEq, Eq)]
enum CoordLine<'a> {
    Joined(u32),
    Lost(u32, &'a str),
}

fn parse_line(line: &str) -> Option<CoordLine<'_>> {
    let rest = line.strip_prefix("coordinator: worker ")?;
    let (id, rest) = rest.split_once(' ')?;
    let id: u32 = id.parse().ok()?;
    if rest.starts_with("joined") {
        Some(CoordLine::Joined(id))
    } else {
        rest.strip_prefix("lost: ")
            .map(|reason| CoordLine::Lost(id, reason))
    }
}

/// A coordinator and its idle workers, every process killed when dropped.
struct LiveCluster {
    knary: PathBuf,
    dir: tempfile::TempDir,
    key: PathBuf,
    addr: String,
    /// The coordinator's stderr lines, stamped when read.
    lines: Receiver<(Instant, String)>,
    workers: BTreeMap<u32, Guard>,
    /// "lost" lines about workers no trial signalled.
    spurious: Vec<String>,
    spawned: usize,
    // Last, so that the workers go first (they would only retry to reach it).
    coordinator: Guard,
    _server: veriflow_checkpoint::launch::ServerProcess,
}

impl LiveCluster {
    /// A coordinator with `params` and `workers` idle workers, each joined.
    fn start(knary: &Path, params: &FdParams, workers: u32) -> Result<LiveCluster> {
        let dir = tempfile::Builder::new()
            .prefix("veriflow-bench-detector-")
            .tempdir()
            .context("cannot create a temporary directory")?;
        let key = dir.path().join("cluster.key");
        veriflow::Key::create(&key)
            .with_context(|| format!("cannot create the key {}", key.display()))?;
        // A coordinator needs a store every worker reaches: one checkpoint server in RAM.
        let server_bin = veriflow_checkpoint::launch::server_binary().context(
            "the checkpoint-server binary (build it: cargo build --release -p veriflow-checkpoint)",
        )?;
        let server = veriflow_checkpoint::launch::ServerProcess::start(
            &server_bin,
            "127.0.0.1:0",
            None,
            &key,
        )
        .context("cannot start a checkpoint server")?;
        let mut cmd = Command::new(knary);
        cmd.arg("coordinator")
            .arg("--listen=127.0.0.1:0")
            .arg("--key")
            .arg(&key)
            .arg(format!("--store=central:{}", server.addr))
            .args(fd_argv(params))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut coordinator = Guard::spawn(&mut cmd, false, "the coordinator")?;
        let child = coordinator
            .child_mut()
            .context("the coordinator exited at once")?;
        let stdout = child.stdout.take().context("the coordinator's stdout")?;
        let stderr = child.stderr.take().context("the coordinator's stderr")?;
        let (first_tx, first_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let r = BufReader::new(stdout).read_line(&mut line).map(|_| line);
            let _ = first_tx.send(r);
        });
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        let first = match first_rx.recv_timeout(START_TIMEOUT) {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => bail!("reading the coordinator's stdout: {e}"),
            Err(_) => {
                bail!("the coordinator did not say where it listens within {START_TIMEOUT:?}")
            }
        };
        let Some(addr) = first.trim().strip_prefix("coordinator listening on ") else {
            let said: Vec<String> = lines.try_iter().map(|(_, l)| l).collect();
            bail!(
                "the coordinator printed {:?} instead of `coordinator listening on ADDR`; \
                 its stderr: {}",
                first.trim(),
                said.join(" / ")
            );
        };
        let mut cluster = LiveCluster {
            _server: server,
            knary: knary.to_path_buf(),
            addr: addr.to_string(),
            key,
            dir,
            lines,
            workers: BTreeMap::new(),
            spurious: Vec::new(),
            spawned: 0,
            coordinator,
        };
        for _ in 0..workers {
            cluster.add_worker()?;
        }
        Ok(cluster)
    }

    /// Starts one idle worker and waits until the coordinator says it joined; its id.
    fn add_worker(&mut self) -> Result<u32> {
        let log = self.dir.path().join(format!("worker-{}.log", self.spawned));
        self.spawned += 1;
        let err = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = Command::new(&self.knary);
        cmd.arg("worker")
            .arg("--join")
            .arg(&self.addr)
            .arg("--key")
            .arg(&self.key)
            .arg("--threads=1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err);
        let guard = Guard::spawn(&mut cmd, false, "a worker")?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let (_, line) = self.next_line(deadline).with_context(|| {
                format!(
                    "a worker did not join within {START_TIMEOUT:?}; its stderr: {}",
                    std::fs::read_to_string(&log).unwrap_or_default().trim()
                )
            })?;
            match parse_line(&line) {
                Some(CoordLine::Joined(id)) => {
                    self.workers.insert(id, guard);
                    return Ok(id);
                }
                Some(CoordLine::Lost(..)) => self.spurious.push(line),
                None => {}
            }
        }
    }

    /// The coordinator's next stderr line, waiting until `deadline`.
    fn next_line(&self, deadline: Instant) -> Result<(Instant, String)> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(x) => Ok(x),
            Err(RecvTimeoutError::Timeout) => bail!("no line from the coordinator in time"),
            Err(RecvTimeoutError::Disconnected) => bail!("the coordinator exited"),
        }
    }

    /// Reads what the coordinator said meanwhile; any "lost" line is a false suspicion.
    fn drain(&mut self) {
        while let Ok((_, line)) = self.lines.try_recv() {
            if matches!(parse_line(&line), Some(CoordLine::Lost(..))) {
                self.spurious.push(line);
            }
        }
    }

    /// The process ids of the coordinator and every worker.
    fn pids(&self) -> Vec<u32> {
        self.coordinator
            .id()
            .into_iter()
            .chain(self.workers.values().filter_map(Guard::id))
            .collect()
    }

    /// One trial: `signal` to worker `victim`; the time until the coordinator loses it (None
    /// if not within the signal's timeout) and its reason, and how long the signal itself took
    /// to send. The victim is then killed, and a new worker joins.
    fn trial(&mut self, victim: u32, signal: Signal) -> Result<Trial> {
        self.drain();
        let guard = self
            .workers
            .get_mut(&victim)
            .with_context(|| format!("no worker {victim}"))?;
        let t0 = Instant::now();
        match signal {
            Signal::Sigkill => guard.sigkill()?,
            Signal::Sigstop => guard.signal("STOP")?,
        }
        let send_s = t0.elapsed().as_secs_f64();
        let deadline = t0
            + match signal {
                Signal::Sigkill => KILL_TIMEOUT,
                Signal::Sigstop => STOP_TIMEOUT,
            };
        let mut found = None;
        while let Ok((at, line)) = self.next_line(deadline) {
            match parse_line(&line) {
                Some(CoordLine::Lost(id, reason)) if id == victim => {
                    found = Some(((at - t0).as_secs_f64(), reason.to_string()));
                    break;
                }
                Some(CoordLine::Lost(..)) => self.spurious.push(line),
                _ => {}
            }
        }
        if let Some(mut g) = self.workers.remove(&victim) {
            g.kill();
        }
        self.add_worker()?;
        let (latency_s, reason) = found.map_or((None, None), |(l, r)| (Some(l), Some(r)));
        Ok(Trial {
            victim,
            latency_s,
            reason,
            send_s,
        })
    }
}

/// One signalled worker.
#[derive(Clone, Debug, serde::Serialize)]
struct Trial {
    victim: u32,
    /// From just before the signal to the coordinator's "lost" line; None if not seen in time.
    latency_s: Option<f64>,
    /// The coordinator's reason.
    reason: Option<String>,
    /// How long sending the signal took (a `kill` process for SIGSTOP).
    send_s: f64,
}

/// Percentiles of a latency sample, by nearest rank; undetected trials count as infinitely
/// late.
#[derive(Clone, Copy, Debug, serde::Serialize)]
struct Latency {
    trials: usize,
    undetected: usize,
    min_s: f64,
    p50_s: f64,
    p99_s: f64,
    max_s: f64,
    mean_s: Option<f64>,
}

impl Latency {
    fn of(trials: &[Trial]) -> Option<Latency> {
        if trials.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = trials
            .iter()
            .map(|t| t.latency_s.unwrap_or(f64::INFINITY))
            .collect();
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            // Nearest rank: the smallest value with at least p of the sample at or below it.
            let r = (p * v.len() as f64).ceil() as usize;
            v[r.clamp(1, v.len()) - 1]
        };
        let detected: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        Some(Latency {
            trials: v.len(),
            undetected: v.len() - detected.len(),
            min_s: v[0],
            p50_s: rank(0.50),
            p99_s: rank(0.99),
            max_s: v[v.len() - 1],
            mean_s: (!detected.is_empty())
                .then(|| detected.iter().sum::<f64>() / detected.len() as f64),
        })
    }
}

/// The trials of one cluster size.
struct LatencySeries {
    processes: u32,
    kill: Vec<Trial>,
    stop: Vec<Trial>,
    spurious: Vec<String>,
    /// CPU seconds other processes took per second of the series (the machine is shared).
    foreign_cores: Option<f64>,
    started_busy: bool,
    seconds: f64,
}

fn latency_series(
    knary: &Path,
    processes: u32,
    kills: u32,
    stops: u32,
    quiet_wait: u64,
    rng: &mut SplitMix,
) -> Result<LatencySeries> {
    let params = issue_params();
    let started_busy = !Quiet::secs(quiet_wait).wait();
    if started_busy {
        eprintln!("  (machine still busy after {quiet_wait} s: running anyway)");
    }
    let t0 = Instant::now();
    let before = CpuSnapshot::with_children();
    eprintln!(
        "latency: coordinator + {} idle workers, T_interval = T_timeout = T_broken = 1 s; \
         {kills} SIGKILL and {stops} SIGSTOP trials",
        processes - 1
    );
    let mut cluster = LiveCluster::start(knary, &params, processes - 1)?;
    // Let the first rounds and introductions pass.
    std::thread::sleep(params.interval * 2);
    let mut series = LatencySeries {
        processes,
        kill: Vec::new(),
        stop: Vec::new(),
        spurious: Vec::new(),
        foreign_cores: None,
        started_busy,
        seconds: 0.0,
    };
    let plan = std::iter::repeat_n(Signal::Sigkill, kills as usize)
        .chain(std::iter::repeat_n(Signal::Sigstop, stops as usize));
    for (i, signal) in plan.enumerate() {
        // A random phase against the heartbeat rounds, and time for the last newcomer.
        let pause = Duration::from_millis(300) + params.interval.mul_f64(rng.unit());
        std::thread::sleep(pause);
        let ids: Vec<u32> = cluster.workers.keys().copied().collect();
        let victim = ids[rng.below(ids.len())];
        let t = cluster.trial(victim, signal)?;
        eprintln!(
            "  {processes} processes, trial {}: {} worker {victim}: {}",
            i + 1,
            signal.name(),
            match (&t.latency_s, &t.reason) {
                (Some(l), Some(r)) => format!("lost after {:.1} ms ({r})", l * 1000.0),
                _ => "NOT DETECTED in time".to_string(),
            }
        );
        match signal {
            Signal::Sigkill => series.kill.push(t),
            Signal::Sigstop => series.stop.push(t),
        }
    }
    cluster.drain();
    series.spurious = std::mem::take(&mut cluster.spurious);
    drop(cluster);
    series.seconds = t0.elapsed().as_secs_f64();
    // The workers are reaped, so their CPU counts as ours.
    series.foreign_cores = CpuSnapshot::foreign_since(before).map(|f| f / series.seconds);
    Ok(series)
}

// ---------------------------------------------------------------------------------------------
// Part 2: heartbeats per process per second, simulated with the real detector.

/// Who is linked to whom, and what else travels on the links.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    name: &'static str,
    /// Workers linked to process 0 only (an idle cluster), or everyone to everyone (a job).
    star: bool,
    /// Application messages per process: one to a random peer every this often.
    traffic: Option<Duration>,
}

const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "idle cluster (workers linked to the coordinator only)",
        star: true,
        traffic: None,
    },
    Scenario {
        name: "idle job (all linked, no messages)",
        star: false,
        traffic: None,
    },
    Scenario {
        name: "busy job (all linked, 100 messages/s per process)",
        star: false,
        traffic: Some(Duration::from_millis(10)),
    },
];

/// The simulated warm-up left out of the rates (introductions, first rounds).
const SIM_WARMUP: Duration = Duration::from_secs(30);
/// Per-message delay of the simulated links, uniform in this range (loopback to LAN).
const SIM_DELAY_US: (u64, u64) = (50, 500);

/// A simulated event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum SimEv {
    /// A node's detector is due (stale unless `gen` is the node's current one).
    Tick { node: usize, gen: u64 },
    /// A heartbeat carrying `promise`, or an application message (`None`), arrives.
    Deliver {
        to: usize,
        from: usize,
        promise: Option<Duration>,
    },
    /// The node sends an application message and plans its next one.
    Traffic { node: usize },
}

/// N real detectors on a virtual clock over FIFO links (the idea of `detect/tests.rs`'s `Net`,
/// without failures).
struct Sim {
    now: Duration,
    dets: Vec<Detector>,
    links: Vec<Vec<usize>>,
    queue: BinaryHeap<Reverse<(Duration, u64, SimEv)>>,
    seq: u64,
    gen: Vec<u64>,
    tick_at: Vec<Option<Duration>>,
    rng: SplitMix,
    /// The last arrival on each (from, to) link: TCP is FIFO.
    tail: HashMap<(usize, usize), Duration>,
    traffic: Option<Duration>,
    /// Status changes reported (none expected: nobody fails).
    verdicts: u64,
}

impl Sim {
    fn new(n: usize, params: FdParams, scenario: Scenario, seed: u64) -> Sim {
        let links: Vec<Vec<usize>> = (0..n)
            .map(|i| match (scenario.star, i) {
                (true, 0) => (1..n).collect(),
                (true, _) => vec![0],
                (false, _) => (0..n).filter(|&j| j != i).collect(),
            })
            .collect();
        let dets = (0..n)
            .map(|i| {
                let mut d = Detector::new(peer(i), params, seed);
                for &j in &links[i] {
                    d.add_peer(peer(j), Duration::ZERO);
                }
                d
            })
            .collect();
        let mut sim = Sim {
            now: Duration::ZERO,
            dets,
            links,
            queue: BinaryHeap::new(),
            seq: 0,
            gen: vec![0; n],
            tick_at: vec![None; n],
            rng: SplitMix(seed),
            tail: HashMap::new(),
            traffic: scenario.traffic,
            verdicts: 0,
        };
        for node in 0..n {
            sim.schedule_tick(node);
            if let Some(period) = sim.traffic {
                let first = period.mul_f64(sim.rng.unit());
                sim.at(first, SimEv::Traffic { node });
            }
        }
        sim
    }

    fn at(&mut self, time: Duration, ev: SimEv) {
        self.seq += 1;
        self.queue.push(Reverse((time, self.seq, ev)));
    }

    /// Makes sure the node ticks no later than its detector asks.
    fn schedule_tick(&mut self, node: usize) {
        let due = self.dets[node].next_deadline().max(self.now);
        let sooner = match self.tick_at[node] {
            Some(t) => due < t,
            None => true,
        };
        if sooner {
            self.gen[node] += 1;
            self.tick_at[node] = Some(due);
            let gen = self.gen[node];
            self.at(due, SimEv::Tick { node, gen });
        }
    }

    fn send(&mut self, from: usize, to: usize, promise: Option<Duration>) {
        let (lo, hi) = SIM_DELAY_US;
        let delay = Duration::from_micros(lo + self.rng.below_u64(hi - lo + 1));
        let tail = self.tail.entry((from, to)).or_default();
        let arrival = (self.now + delay).max(*tail);
        *tail = arrival;
        self.at(arrival, SimEv::Deliver { to, from, promise });
    }

    fn run_until(&mut self, until: Duration) {
        while let Some(&Reverse((time, _, ev))) = self.queue.peek() {
            if time > until {
                break;
            }
            self.queue.pop();
            self.now = time;
            self.handle(ev);
        }
        self.now = until;
    }

    fn handle(&mut self, ev: SimEv) {
        let now = self.now;
        match ev {
            SimEv::Tick { node, gen } => {
                if gen != self.gen[node] {
                    return;
                }
                self.tick_at[node] = None;
                for action in self.dets[node].tick(now) {
                    match action {
                        Action::SendHeartbeat { to, heartbeat } => {
                            self.send(node, index(to), Some(heartbeat.interval));
                        }
                        _ => self.verdicts += 1,
                    }
                }
                self.schedule_tick(node);
            }
            SimEv::Deliver { to, from, promise } => {
                match promise {
                    Some(interval) => {
                        self.dets[to].on_heartbeat(peer(from), &Heartbeat { interval }, now);
                    }
                    None => self.dets[to].on_message(peer(from), now),
                }
                self.schedule_tick(to);
            }
            SimEv::Traffic { node } => {
                let to = self.links[node][self.rng.below(self.links[node].len())];
                self.dets[node].on_sent(peer(to), now);
                self.send(node, to, None);
                if let Some(period) = self.traffic {
                    self.at(now + period, SimEv::Traffic { node });
                }
                self.schedule_tick(node);
            }
        }
    }

    fn stats(&self) -> Vec<FdStats> {
        self.dets.iter().map(Detector::stats).collect()
    }
}

fn peer(i: usize) -> PeerId {
    PeerId::try_from(i).unwrap_or(PeerId::MAX)
}

fn index(p: PeerId) -> usize {
    usize::try_from(p).unwrap_or(usize::MAX)
}

/// Heartbeats per process per second in one simulated scenario.
#[derive(Clone, Debug, serde::Serialize)]
struct HeartbeatRow {
    params_name: &'static str,
    #[serde(serialize_with = "ser_params")]
    params: FdParams,
    processes: usize,
    scenario: &'static str,
    simulated_s: u64,
    /// Means over the processes, per second.
    mean_round: f64,
    mean_insurance: f64,
    mean_total: f64,
    /// The busiest process.
    max_total: f64,
    /// Process 0 (the coordinator in the idle cluster).
    coordinator_total: f64,
    /// The workers (processes 1..).
    worker_mean_total: f64,
    /// Bound of `detect/mod.rs` for an idle process: (k + 1) / T_interval + (n − 1 − k) /
    /// T_insurance (k when there is nobody to rotate in).
    idle_bound: f64,
    /// Status changes in the simulation (nobody fails: any is a false suspicion).
    verdicts: u64,
}

fn ser_params<S: serde::Serializer>(p: &FdParams, s: S) -> std::result::Result<S::Ok, S::Error> {
    serde::Serialize::serialize(
        &json!({
            "interval_ms": ms(p.interval),
            "timeout_ms": ms(p.timeout),
            "broken_ms": ms(p.broken),
            "insurance_ms": ms(p.insurance),
            "k": p.k,
        }),
        s,
    )
}

fn simulate(
    params_name: &'static str,
    params: FdParams,
    n: usize,
    scenario: Scenario,
    secs: u64,
    seed: u64,
) -> HeartbeatRow {
    let mut sim = Sim::new(n, params, scenario, seed);
    sim.run_until(SIM_WARMUP);
    let before = sim.stats();
    let end = SIM_WARMUP + Duration::from_secs(secs);
    sim.run_until(end);
    let after = sim.stats();
    let per_s = |b: &FdStats, a: &FdStats| {
        let round = (a.round_heartbeats - b.round_heartbeats) as f64 / secs as f64;
        let insurance = (a.insurance_heartbeats - b.insurance_heartbeats) as f64 / secs as f64;
        (round, insurance)
    };
    let rates: Vec<(f64, f64)> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| per_s(b, a))
        .collect();
    let nf = rates.len().max(1) as f64;
    let totals: Vec<f64> = rates.iter().map(|(r, i)| r + i).collect();
    let k = params.k;
    let others = n - 1;
    let idle_bound = if others > k {
        (k + 1) as f64 / params.interval.as_secs_f64()
            + (others - k) as f64 / params.insurance.as_secs_f64()
    } else {
        others as f64 / params.interval.as_secs_f64()
    };
    HeartbeatRow {
        params_name,
        params,
        processes: n,
        scenario: scenario.name,
        simulated_s: secs,
        mean_round: rates.iter().map(|r| r.0).sum::<f64>() / nf,
        mean_insurance: rates.iter().map(|r| r.1).sum::<f64>() / nf,
        mean_total: totals.iter().sum::<f64>() / nf,
        max_total: totals.iter().copied().fold(0.0, f64::max),
        coordinator_total: totals.first().copied().unwrap_or(0.0),
        worker_mean_total: totals.iter().skip(1).sum::<f64>() / (nf - 1.0).max(1.0),
        idle_bound,
        verdicts: sim.verdicts,
    }
}

// ---------------------------------------------------------------------------------------------
// Part 3: knary slowdown, detector on against off.

/// The detector settings of the slowdown runs: name, parameters.
fn slowdown_settings() -> [(&'static str, FdParams); 3] {
    let silent = Duration::from_millis(SILENT_MS);
    [
        (
            "off (every period 600 s)",
            FdParams {
                interval: silent,
                timeout: silent,
                insurance: silent,
                broken: silent,
                k: 3,
            },
        ),
        ("on, cluster default", cluster_default_params()),
        ("on, issue (1 s)", issue_params()),
    ]
}

struct Slowdown {
    plan: Plan,
    runs: usize,
    /// Kept runs per setting (in `slowdown_settings` order).
    series: Series<ClusterRun>,
    /// Per kept repetition: whether no run of it was disturbed.
    clean: Vec<bool>,
    time: Vec<Stats>,
    /// CPU the detector costs an idle cluster of the same processes, per setting.
    idle: Vec<IdleCpu>,
}

impl Slowdown {
    /// Median over the undisturbed repetitions of (setting i) / off, and how many there were.
    fn paired_clean(&self, i: usize) -> (f64, usize) {
        let r: Vec<f64> = self.series.kept[i]
            .iter()
            .zip(&self.series.kept[0])
            .zip(&self.clean)
            .filter(|(_, &clean)| clean)
            .map(|((on, off), _)| on.elapsed_s / off.elapsed_s)
            .collect();
        (Stats::of(&r).map_or(f64::NAN, |s| s.median), r.len())
    }

    /// Median over the repetitions of (setting i) / off.
    fn paired(&self, i: usize) -> f64 {
        let r: Vec<f64> = self.series.kept[i]
            .iter()
            .zip(&self.series.kept[0])
            .map(|(on, off)| on.elapsed_s / off.elapsed_s)
            .collect();
        Stats::of(&r).map_or(f64::NAN, |s| s.median)
    }

    fn ratio(&self, i: usize) -> f64 {
        self.time[i].median / self.time[0].median
    }

    /// From the idle cluster: the detector's CPU per heartbeat sent in setting i (µs), all
    /// processes' CPU above the silent setting divided by the simulated heartbeat rate.
    fn cpu_per_heartbeat_us(&self, i: usize) -> Option<f64> {
        let (on, off) = (self.idle.get(i)?, self.idle.first()?);
        (i > 0 && on.simulated_heartbeats_per_s > 0.0).then(|| {
            (on.cpu_s_per_s - off.cpu_s_per_s).max(0.0) / on.simulated_heartbeats_per_s * 1e6
        })
    }

    /// The share of the machine's cores the detector of setting i would take during a busy
    /// job: CPU per heartbeat × the busy job's simulated heartbeat rate (all processes linked,
    /// part 2) / cores. Its bound on the slowdown, as the runs are CPU-bound.
    fn projected_share(&self, i: usize) -> Option<f64> {
        let per_hb = self.cpu_per_heartbeat_us(i)? / 1e6;
        let (_, params) = slowdown_settings()[i];
        let n = self.idle.get(i)?.processes;
        let busy = simulate("busy", params, n, SCENARIOS[2], 120, 1);
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
        Some(per_hb * busy.mean_total * n as f64 / cores)
    }
}

fn slowdown_series(args: &DetectorArgs, knary: &Path, runs: usize) -> Result<Slowdown> {
    let plan = Plan {
        shape: Shape {
            depth: args
                .depth
                .unwrap_or(if args.quick { 5 } else { DEFAULT_DEPTH }),
            fanout: args.fanout,
            serial: 1,
            grain_us: args.grain_us,
        },
        workers: args.workers,
        spares: 0,
        threads: 1,
        seed: args.seed,
        grain_clock: knary::GrainClock::Wall,
    };
    let settings = slowdown_settings();
    let timeout = Duration::from_secs(args.timeout);
    eprintln!(
        "slowdown: knary {:?} S0 on {} workers, detector {}, {runs} repetitions",
        plan.shape,
        plan.workers,
        settings.map(|s| s.0).join(" / ")
    );
    let argv = |p: &FdParams| plan.argv(Setting::S0, &fd_argv(p));
    cluster_run(knary, &argv(&settings[0].1), &plan.env(), timeout)?
        .check(plan.shape, Setting::S0)
        .context("warm-up run")?;
    let rounds = rounds(runs, args.quiet_wait, args.retries);
    let series = rounds.run(
        settings.len(),
        |_, i| {
            let r = cluster_run(knary, &argv(&settings[i].1), &plan.env(), timeout)?;
            r.check(plan.shape, Setting::S0)?;
            Ok(r)
        },
        |i, r| format!("{} {:.3} s", settings[i].0, r.elapsed_s),
    )?;
    let clean = series.clean(&rounds.disturbed);
    let window = Duration::from_secs(if args.quick { 3 } else { IDLE_WINDOW_S });
    let mut idle = Vec::new();
    for (name, params) in &settings {
        let x = idle_cpu(knary, name, params, args.workers, window)?;
        eprintln!(
            "  idle cluster of {} processes, detector {name}: {:.3} ms of CPU per second (all \
             processes)",
            x.processes,
            x.cpu_s_per_s * 1000.0
        );
        idle.push(x);
    }
    let time = (0..settings.len())
        .map(|i| series.stats(i))
        .collect::<Result<Vec<_>>>()?;
    Ok(Slowdown {
        plan,
        runs,
        series,
        clean,
        idle,
        time,
    })
}

/// How long the idle-cluster CPU is measured per detector setting.
const IDLE_WINDOW_S: u64 = 20;

/// CPU an idle cluster (coordinator + workers, no job) uses with one detector setting: the
/// detector's cost with nothing else going on, measured by the scheduler (ns, per thread).
#[derive(Clone, Debug, serde::Serialize)]
struct IdleCpu {
    setting: String,
    processes: usize,
    window_s: f64,
    /// CPU seconds per second of all the cluster's processes together.
    cpu_s_per_s: f64,
    /// Heartbeats per second the cluster sends in this topology (simulated, see part 2).
    simulated_heartbeats_per_s: f64,
}

/// CPU time of every thread of `pid` so far, in ns (`/proc/PID/task/*/schedstat`, whose first
/// field is the time spent on a CPU), or None if the process is gone.
fn process_cpu_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    for t in tasks.flatten() {
        let text = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        total += text
            .split_whitespace()
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

fn idle_cpu(
    knary: &Path,
    name: &str,
    params: &FdParams,
    workers: u32,
    window: Duration,
) -> Result<IdleCpu> {
    let cluster = LiveCluster::start(knary, params, workers)?;
    // Past the introductions and the first rounds.
    std::thread::sleep(Duration::from_secs(2));
    let pids = cluster.pids();
    let sum = |pids: &[u32]| -> Result<u64> {
        pids.iter()
            .map(|&p| process_cpu_ns(p).with_context(|| format!("process {p} is gone")))
            .sum()
    };
    let before = sum(&pids)?;
    let t0 = Instant::now();
    std::thread::sleep(window);
    let after = sum(&pids)?;
    let secs = t0.elapsed().as_secs_f64();
    let processes = pids.len();
    let sim = simulate("idle", *params, processes, SCENARIOS[0], 120, 1);
    Ok(IdleCpu {
        setting: name.to_string(),
        processes,
        window_s: secs,
        cpu_s_per_s: after.saturating_sub(before) as f64 / 1e9 / secs,
        simulated_heartbeats_per_s: sim.mean_total * processes as f64,
    })
}

// ---------------------------------------------------------------------------------------------
// The report.

struct Report {
    seed: u64,
    latency: Vec<LatencySeries>,
    heartbeats: Vec<HeartbeatRow>,
    slowdown: Option<Slowdown>,
}

/// One target: what, the value, whether met.
struct Target {
    goal: String,
    measured: String,
    met: bool,
}

impl Report {
    fn targets(&self) -> Vec<Target> {
        let mut t = Vec::new();
        let kill_bound = issue_params().broken + TARGET_KILL_SLACK;
        for s in &self.latency {
            if let Some(l) = Latency::of(&s.kill) {
                t.push(Target {
                    goal: format!(
                        "crashed process (SIGKILL) lost within T_broken + 0.1 s = {:.1} s, p99, \
                         {} processes",
                        kill_bound.as_secs_f64(),
                        s.processes
                    ),
                    measured: format!("{:.1} ms", l.p99_s * 1000.0),
                    met: l.p99_s <= kill_bound.as_secs_f64(),
                });
            }
            if let Some(l) = Latency::of(&s.stop) {
                t.push(Target {
                    goal: format!(
                        "hung process (SIGSTOP) lost within {TARGET_STOP_S} s, p99, {} processes",
                        s.processes
                    ),
                    measured: format!("{:.3} s", l.p99_s),
                    met: l.p99_s <= TARGET_STOP_S,
                });
            }
        }
        if let Some(sd) = &self.slowdown {
            for (i, (name, _)) in slowdown_settings().iter().enumerate().skip(1) {
                t.push(Target {
                    goal: format!("knary slowdown, detector {name} vs off, <= 1 % (medians)"),
                    measured: format!(
                        "{:+.2} % (paired median {:+.2} %)",
                        (sd.ratio(i) - 1.0) * 100.0,
                        (sd.paired(i) - 1.0) * 100.0
                    ),
                    met: sd.ratio(i) <= TARGET_SLOWDOWN,
                });
                if let Some(share) = sd.projected_share(i) {
                    t.push(Target {
                        goal: format!(
                            "knary slowdown, detector {name}, <= 1 %, projected from its CPU \
                             (idle cluster, per heartbeat, at a busy job's heartbeat rate)"
                        ),
                        measured: format!("{:.3} %", share * 100.0),
                        met: share <= TARGET_SLOWDOWN - 1.0,
                    });
                }
            }
        }
        t
    }

    fn markdown(&self, plots: &Plots) -> String {
        let mut md = String::new();
        if !self.latency.is_empty() {
            let p = issue_params();
            let _ = writeln!(
                md,
                "**Detection latency** (real processes): a `knary coordinator` (T_interval = \
                 T_timeout = T_broken = {} s, T_insurance = {} s, k = {}) and N − 1 idle `knary \
                 worker --threads 1` processes on loopback; one worker signalled per trial (seeded \
                 victim and phase, seed {}), latency = from just before the signal to the \
                 coordinator's `worker N lost` line; the victim is then killed and replaced. \
                 Percentiles by nearest rank (with fewer than 100 trials, p99 is the maximum).\n",
                p.interval.as_secs_f64(),
                p.insurance.as_secs_f64(),
                p.k,
                self.seed,
            );
            md.push_str(
                "| processes | signal | trials | p50 | p99 | max | min | undetected | how it was \
                 lost | false suspicions | other CPU (cores) |\n\
                 |---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|\n",
            );
            for s in &self.latency {
                for (signal, trials) in [(Signal::Sigkill, &s.kill), (Signal::Sigstop, &s.stop)] {
                    let Some(l) = Latency::of(trials) else {
                        continue;
                    };
                    let unit = |x: f64| match signal {
                        Signal::Sigkill => format!("{:.1} ms", x * 1000.0),
                        Signal::Sigstop => format!("{x:.3} s"),
                    };
                    let _ = writeln!(
                        md,
                        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        s.processes,
                        signal.name(),
                        l.trials,
                        unit(l.p50_s),
                        unit(l.p99_s),
                        unit(l.max_s),
                        unit(l.min_s),
                        l.undetected,
                        reasons(trials),
                        s.spurious.len(),
                        s.foreign_cores
                            .map_or_else(|| "?".to_string(), |c| format!("{c:.2}")),
                    );
                }
            }
            let sends: Vec<f64> = self
                .latency
                .iter()
                .flat_map(|s| s.stop.iter().map(|t| t.send_s))
                .collect();
            if let Some(st) = Stats::of(&sends) {
                let _ = writeln!(
                    md,
                    "\nSIGSTOP is sent by running `kill -s STOP PID` (median {:.1} ms, max {:.1} \
                     ms, included in its latencies); SIGKILL by `Child::kill`.",
                    st.median * 1000.0,
                    st.max * 1000.0
                );
            }
            let _ = writeln!(md, "Plots: {}.\n", plots.markdown());
        }
        if !self.heartbeats.is_empty() {
            md.push_str(
                "**Heartbeats per process per second** (simulated: N real `Detector`s on a \
                 virtual clock, links with 50-500 µs delays; `FdStats` counts; real frames are \
                 not counted). Idle cluster = part 1's topology.\n\n\
                 | parameters | N | scenario | mean | of which round | of which insurance | \
                 max | coordinator | workers' mean | idle bound | false suspicions |\n\
                 |---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            );
            for r in &self.heartbeats {
                let _ = writeln!(
                    md,
                    "| {} ({}/{}/{}/{} ms, k {}) | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | \
                     {:.2} | {:.2} | {:.2} | {} |",
                    r.params_name,
                    r.params.interval.as_millis(),
                    r.params.timeout.as_millis(),
                    r.params.broken.as_millis(),
                    r.params.insurance.as_millis(),
                    r.params.k,
                    r.processes,
                    r.scenario,
                    r.mean_total,
                    r.mean_round,
                    r.mean_insurance,
                    r.max_total,
                    r.coordinator_total,
                    r.worker_mean_total,
                    r.idle_bound,
                    r.verdicts,
                );
            }
            md.push_str(
                "\n(Parameters as T_interval/T_timeout/T_broken/T_insurance. Idle bound: \
                 (k + 1)/T_interval + (N − 1 − k)/T_insurance, `detect/mod.rs` \"Bounds and \
                 cost\", for a process linked to all N − 1 others.)\n\n",
            );
        }
        if let Some(sd) = &self.slowdown {
            let s = sd.plan.shape;
            let _ = writeln!(
                md,
                "**Slowdown**: knary depth {} fanout {} serial {} grain {} µs ({} tasks), `knary \
                 cluster --no-checkpoint` on {} workers × 1 thread, no spare; median of {} \
                 repetitions (settings interleaved); times are the coordinator's `elapsed_s`; \
                 {} disturbed repetition(s) run again, {} kept; {} started on a busy machine.\n",
                s.depth,
                s.fanout,
                s.serial,
                s.grain_us,
                s.tasks().unwrap_or(0),
                sd.plan.workers,
                sd.runs,
                sd.series.rerun,
                sd.series.kept_disturbed,
                sd.series.not_quiet,
            );
            md.push_str(
                "| detector | median (s) | min–max (s) | /off (medians) | /off (paired median) | \
                 /off (paired, undisturbed repetitions) | other CPU, max (s) |\n\
                 |---|---:|---:|---:|---:|---:|---:|\n",
            );
            for (i, (name, _)) in slowdown_settings().iter().enumerate() {
                let t = &sd.time[i];
                let (clean, n) = sd.paired_clean(i);
                let other = sd.series.kept[i]
                    .iter()
                    .filter_map(|r| r.foreign_cpu_s)
                    .reduce(f64::max);
                let _ = writeln!(
                    md,
                    "| {name} | {:.3} | {:.3}–{:.3} | {:.4} | {:.4} | {clean:.4} (of {n}) | {} |",
                    t.median,
                    t.min,
                    t.max,
                    sd.ratio(i),
                    sd.paired(i),
                    cpu_text(other),
                );
            }
            if !sd.idle.is_empty() {
                let _ = writeln!(
                    md,
                    "\nThe detector's CPU, measured apart from the noise: an idle cluster of the \
                     same {} processes (coordinator + workers, no job) for {:.0} s per setting, \
                     CPU time of all their threads from the scheduler \
                     (`/proc/PID/task/*/schedstat`, ns); heartbeats per second from the \
                     simulation (part 2) for that topology and for a busy job (all linked, 100 \
                     messages/s per process); projected share = CPU per heartbeat × the busy \
                     job's rate / {} cores.\n",
                    sd.idle[0].processes,
                    sd.idle[0].window_s,
                    std::thread::available_parallelism().map_or(1, |c| c.get()),
                );
                md.push_str(
                    "| detector | idle cluster CPU (ms/s, all processes) | above off (ms/s) | \
                     heartbeats/s (idle, simulated) | CPU per heartbeat (µs) | projected share \
                     of the cores in a busy job |\n|---|---:|---:|---:|---:|---:|\n",
                );
                for (i, x) in sd.idle.iter().enumerate() {
                    let above = (x.cpu_s_per_s - sd.idle[0].cpu_s_per_s) * 1000.0;
                    let _ = writeln!(
                        md,
                        "| {} | {:.3} | {} | {:.1} | {} | {} |",
                        x.setting,
                        x.cpu_s_per_s * 1000.0,
                        if i == 0 {
                            "–".to_string()
                        } else {
                            format!("{above:+.3}")
                        },
                        x.simulated_heartbeats_per_s,
                        sd.cpu_per_heartbeat_us(i)
                            .map_or_else(|| "–".to_string(), |c| format!("{c:.1}")),
                        sd.projected_share(i)
                            .map_or_else(|| "–".to_string(), |c| format!("{:.3} %", c * 100.0)),
                    );
                }
            }
            md.push('\n');
        }
        md.push_str("| target | measured | met |\n|---|---:|---|\n");
        for t in self.targets() {
            let _ = writeln!(
                md,
                "| {} | {} | {} |",
                t.goal,
                t.measured,
                if t.met { "yes" } else { "**no**" }
            );
        }
        md
    }

    fn json(&self, plots: &Plots) -> Value {
        let p = issue_params();
        let latency: Vec<Value> = self
            .latency
            .iter()
            .map(|s| {
                json!({
                    "processes": s.processes,
                    "workers": s.processes - 1,
                    "sigkill": { "latency": Latency::of(&s.kill), "trials": s.kill },
                    "sigstop": { "latency": Latency::of(&s.stop), "trials": s.stop },
                    "false_suspicions": s.spurious,
                    "other_processes_cores": s.foreign_cores,
                    "started_on_a_busy_machine": s.started_busy,
                    "seconds": s.seconds,
                })
            })
            .collect();
        let slowdown = self.slowdown.as_ref().map(|sd| {
            let settings: Vec<Value> = slowdown_settings()
                .iter()
                .enumerate()
                .map(|(i, (name, params))| {
                    json!({
                        "name": name,
                        "argv": sd.plan.argv(Setting::S0, &fd_argv(params)),
                        "elapsed_s": sd.series.kept[i].iter().map(|r| r.elapsed_s).collect::<Vec<_>>(),
                        "median_s": sd.time[i].median,
                        "min_s": sd.time[i].min,
                        "max_s": sd.time[i].max,
                        "ratio_to_off": sd.ratio(i),
                        "paired_ratio_to_off_median": sd.paired(i),
                        "paired_ratio_to_off_median_undisturbed": sd.paired_clean(i).0,
                        "undisturbed_repetitions": sd.paired_clean(i).1,
                        "idle_cluster_cpu": sd.idle.get(i),
                        "cpu_per_heartbeat_us": sd.cpu_per_heartbeat_us(i),
                        "projected_busy_job_core_share": sd.projected_share(i),
                        "runs": sd.series.kept[i],
                    })
                })
                .collect();
            json!({
                "tree": sd.plan.shape,
                "tasks": sd.plan.shape.tasks().ok(),
                "workers": sd.plan.workers,
                "runs": sd.runs,
                "order": "off, on (cluster default), on (1 s), ... (interleaved)",
                "settings": settings,
                "discarded_disturbed_repetitions": sd.series.rerun,
                "kept_disturbed_repetitions": sd.series.kept_disturbed,
                "repetitions_started_on_a_busy_machine": sd.series.not_quiet,
                "repetition_undisturbed": sd.clean,
            })
        });
        json!({
            "seed": self.seed,
            "latency": {
                "parameters": {
                    "interval_ms": ms(p.interval),
                    "timeout_ms": ms(p.timeout),
                    "broken_ms": ms(p.broken),
                    "insurance_ms": ms(p.insurance),
                    "k": p.k,
                },
                "how": "knary coordinator --store memory + idle knary worker --threads 1 \
                        processes on loopback; latency from just before the signal to the \
                        coordinator's stderr line `worker N lost`; percentiles by nearest rank",
                "sizes": latency,
                "plots": plots.json(),
            },
            "heartbeats": {
                "how": "simulation: real Detectors on a virtual clock, FIFO links with \
                        50-500 µs delays; FdStats round + insurance heartbeats per process per \
                        simulated second after a 30 s warm-up",
                "rows": self.heartbeats,
            },
            "slowdown": slowdown,
            "targets": self.targets().iter().map(|t| json!({
                "goal": t.goal, "measured": t.measured, "met": t.met,
            })).collect::<Vec<_>>(),
        })
    }
}

/// The coordinator's reasons for a series of trials, counted.
fn reasons(trials: &[Trial]) -> String {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for t in trials {
        let r = t.reason.as_deref().unwrap_or("not detected");
        *count.entry(r).or_default() += 1;
    }
    count
        .iter()
        .map(|(r, n)| format!("{n}× {r}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What `detector_latency.png` shows: per series, its trials' latencies (`None`: undetected).
pub(crate) struct LatencyFigure {
    series: Vec<(String, Vec<Option<f64>>)>,
}

impl LatencyFigure {
    fn of(series: &[LatencySeries]) -> LatencyFigure {
        let mut out = Vec::new();
        for s in series {
            for (signal, trials) in [(Signal::Sigkill, &s.kill), (Signal::Sigstop, &s.stop)] {
                if !trials.is_empty() {
                    out.push((
                        format!("{}, {} processes", signal.name(), s.processes),
                        trials.iter().map(|t| t.latency_s).collect(),
                    ));
                }
            }
        }
        LatencyFigure { series: out }
    }

    /// The figure of a `detector.json` (`paper replot`).
    pub(crate) fn from_json(j: &Value) -> anyhow::Result<LatencyFigure> {
        let mut out = Vec::new();
        for size in j["latency"]["sizes"]
            .as_array()
            .context("no latency.sizes")?
        {
            let processes = size["processes"].as_u64().context("no processes")?;
            for (signal, key) in [(Signal::Sigkill, "sigkill"), (Signal::Sigstop, "sigstop")] {
                let Some(trials) = size[key]["trials"].as_array() else {
                    continue;
                };
                if !trials.is_empty() {
                    out.push((
                        format!("{}, {processes} processes", signal.name()),
                        trials.iter().map(|t| t["latency_s"].as_f64()).collect(),
                    ));
                }
            }
        }
        Ok(LatencyFigure { series: out })
    }
}

/// The latencies' distribution functions, on a log time axis. The legend sits in the empty
/// middle of the plot (between the crash and the hang curves), and the two targets are drawn
/// in colours of their own and labelled where they stand (issue 18 point 8: one grey for both,
/// and a legend over the crash curves).
impl Figure for LatencyFigure {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String> {
        let f = self;

        let all = f
            .series
            .iter()
            .flat_map(|(_, v)| v.iter().flatten().copied());
        let lo = all.clone().fold(f64::INFINITY, f64::min).clamp(1e-5, 0.1) / 2.0;
        // Room right of the hang target for its label.
        let hi = (all.fold(0.0, f64::max) * 1.3).max(TARGET_STOP_S * 4.5);
        root.fill(&WHITE).map_err(plot::err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Time until the coordinator declares a worker lost (T_interval = T_timeout = \
             T_broken = 1 s)",
                ("sans-serif", 20),
            )
            .margin(15)
            .margin_right(30)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
            .map_err(plot::err)?;
        chart
            .configure_mesh()
            .x_desc("seconds from the signal (log scale)")
            .y_desc("fraction of the trials detected")
            .axis_desc_style(("sans-serif", 15))
            .draw()
            .map_err(plot::err)?;
        for (c, (label, latencies)) in f.series.iter().enumerate() {
            let mut v: Vec<f64> = latencies.iter().flatten().copied().collect();
            v.sort_by(f64::total_cmp);
            let n = latencies.len() as f64;
            let color = COLORS[c % COLORS.len()];
            let mut points = Vec::new();
            for (i, &x) in v.iter().enumerate() {
                points.push((x, i as f64 / n));
                points.push((x, (i + 1) as f64 / n));
            }
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(plot::err)?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        let crash = (issue_params().broken + TARGET_KILL_SLACK).as_secs_f64();
        for (x, label, color, right) in [
            (
                crash,
                format!("crash target {crash:.1} s"),
                RGBColor(128, 0, 0),
                false,
            ),
            (
                TARGET_STOP_S,
                format!("hang target {TARGET_STOP_S:.1} s"),
                RGBColor(90, 60, 150),
                true,
            ),
        ] {
            chart
                .draw_series(DashedLineSeries::new(
                    [(x, 0.0), (x, 1.0)],
                    8,
                    5,
                    color.stroke_width(2),
                ))
                .map_err(plot::err)?
                .label(label.clone())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
            // The label beside its line: left of the crash target, right of the hang target.
            let style = ("sans-serif", 14).into_font().color(&color);
            let (at, anchor) = if right {
                (x * 1.04, Pos::new(HPos::Left, VPos::Center))
            } else {
                (x / 1.04, Pos::new(HPos::Right, VPos::Center))
            };
            chart
                .draw_series(std::iter::once(Text::new(
                    label,
                    (at, 0.5),
                    style.pos(anchor),
                )))
                .map_err(plot::err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::MiddleMiddle)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.95))
            .border_style(BLACK)
            .draw()
            .map_err(plot::err)?;
        root.present().map_err(plot::err)
    }
}

/// A small seeded generator (splitmix64): the victims, phases and simulated delays.
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        // The top 53 bits: every double in [0, 1) with that spacing.
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n > 0; slightly biased for huge n, irrelevant here).
    pub(crate) fn below_u64(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.below_u64(u64::try_from(n).unwrap_or(u64::MAX))).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinator_lines_parse() {
        assert_eq!(
            parse_line("coordinator: worker 12 joined (127.0.0.1:5, 1 threads)"),
            Some(CoordLine::Joined(12))
        );
        assert_eq!(
            parse_line("coordinator: worker 3 lost: connection reset by peer"),
            Some(CoordLine::Lost(3, "connection reset by peer"))
        );
        assert_eq!(parse_line("coordinator: job 1 over in 2.000 s"), None);
        assert_eq!(parse_line("worker 3: joined 127.0.0.1:1"), None);
    }

    fn trial(latency_s: Option<f64>) -> Trial {
        Trial {
            victim: 1,
            latency_s,
            reason: None,
            send_s: 0.0,
        }
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let trials: Vec<Trial> = (1..=100).map(|i| trial(Some(f64::from(i)))).collect();
        let l = Latency::of(&trials).unwrap();
        assert_eq!(
            (l.p50_s, l.p99_s, l.max_s, l.min_s),
            (50.0, 99.0, 100.0, 1.0)
        );
        let few: Vec<Trial> = [3.0, 1.0, 2.0].iter().map(|&x| trial(Some(x))).collect();
        let l = Latency::of(&few).unwrap();
        assert_eq!((l.p50_s, l.p99_s), (2.0, 3.0));
        let missed = vec![trial(Some(1.0)), trial(None)];
        let l = Latency::of(&missed).unwrap();
        assert_eq!(l.undetected, 1);
        assert!(l.p99_s.is_infinite());
        assert_eq!(l.mean_s, Some(1.0));
        assert!(Latency::of(&[]).is_none());
    }

    /// The simulation reproduces the detector's documented costs: k + 1 round heartbeats per
    /// round, insurance within its bound, and no false suspicion.
    #[test]
    fn simulated_rates_match_the_bounds() {
        let p = issue_params();
        for scenario in SCENARIOS {
            let row = simulate("issue", p, 12, scenario, 120, 5);
            assert_eq!(row.verdicts, 0, "{scenario:?}");
            assert!(row.mean_total <= row.idle_bound + 0.05, "{row:?}");
            if !scenario.star {
                assert!((row.mean_round - 4.0).abs() < 0.05, "{row:?}");
            }
        }
        // Idle star: a worker's only peer is the coordinator, its monitor: 1 per second.
        let star = simulate("issue", p, 12, SCENARIOS[0], 120, 5);
        assert!((star.worker_mean_total - 1.0).abs() < 0.05, "{star:?}");
        // Traffic on every link removes (almost) all insurance heartbeats.
        let busy = simulate("issue", p, 12, SCENARIOS[2], 120, 5);
        assert!(busy.mean_insurance < 0.1, "{busy:?}");
    }

    #[test]
    fn splitmix_is_uniform_enough() {
        let mut r = SplitMix(7);
        let mut counts = [0u32; 4];
        for _ in 0..4000 {
            counts[r.below(4)] += 1;
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}

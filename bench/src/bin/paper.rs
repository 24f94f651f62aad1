//! `paper`: the measurements of the paper, one subcommand each.
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- overhead|recovery [--runs N]
//!     [--threads T] [--quick] [--out DIR] [--scratch DIR] [--quiet-wait SECS] [--retries N]
//! ```
//!
//! `overhead` runs knary at grains 0, 10 µs, 100 µs and 1 ms in S0 (no log) and S1 (durable
//! log), interleaved S0, S1, S0, S1, ... so that noise hits both alike, then the empty-task
//! throughput of a big tree against rayon's `scope.spawn`. It prints a table and writes
//! `overhead.json` (every raw time, medians, ratios, targets) and `overhead.md` in `--out`.
//!
//! `recovery` runs knary at grains 100 µs and 1 ms in S0, S1 and S2 (S1 with vnode 1 failing
//! when half the tasks have completed, recovered from its log), interleaved S0, S1, S2, ...,
//! and writes `recovery.json` and `recovery.md` likewise.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use veriflow_bench::harness::{
    cpu_text, merge, require_runs, scratch_dir, thousands, Disturbed, Quiet, Redo, Rounds, Series,
    Session, Timed,
};
use veriflow_bench::{
    rayon_tree, run_knary, KnaryRun, RayonRun, Setting, Shape, Stats, S2_FAILING_VNODE,
};

/// Grains of the overhead series, in µs.
const GRAINS_US: [u64; 4] = [0, 10, 100, 1000];

/// Targets of the issue on this machine.
const TARGET_TASKS_PER_S: f64 = 1_000_000.0;
const TARGET_US_PER_TASK: f64 = 5.0;
const TARGET_RATIO_1MS: f64 = 1.01;
const TARGET_RATIO_100US: f64 = 1.05;
/// Issue 17 target 4: veriflow S0's cost per node at most this many times rayon's.
const TARGET_COST_VS_RAYON: f64 = 2.5;
/// Issue 17 target 4: the log's CPU per task on the empty-task tree, half of the 1.25 µs
/// measured before it.
const TARGET_LOG_CPU_US_PER_TASK: f64 = 0.625;

/// Grains of the recovery series, in µs.
const RECOVERY_GRAINS_US: [u64; 2] = [100, 1000];

/// Target of the recovery issue: S2/S0 at 1 ms grain (paper 001 measured 1.01).
const TARGET_RECOVERY_RATIO_1MS: f64 = 1.02;

#[derive(Parser, Debug)]
#[command(name = "paper", about = "veriflow's paper measurements")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Cost of the durable log (S1 against S0) on knary, and empty-task throughput vs rayon.
    Overhead(RunArgs),
    /// Cost of one vnode failing half-way (S2) against S0 and S1 on knary.
    Recovery(RunArgs),
    /// Checkpoint storage strategies (paper 003): coding throughput, run-time and storage
    /// overhead on a logged matrix product with real checkpoint servers.
    Storage(veriflow_bench::storage::StorageArgs),
    /// The certifier: Fig. 4 (k against n), Fig. 7 (full vs partial duplication) and the
    /// throughput of its linear phases.
    Certify(veriflow_bench::certify::CertifyArgs),
    /// knary in cluster mode (worker processes): S0, S1 and S2 (one worker SIGKILLed
    /// half-way).
    Cluster(veriflow_bench::cluster::ClusterArgs),
    /// knary in cluster mode across hosts (network namespaces with latency and loss): S0, S1
    /// and S2 against the one-way latency (root only).
    Netns(veriflow_bench::netns::NetnsArgs),
    /// The online oracle: time to detection against the forgery rate, and the cost of
    /// following an honest run.
    Online(veriflow_bench::online::OnlineArgs),
    /// The failure detector: detection latency of crashed and hung processes, heartbeats per
    /// process, and knary's slowdown with the detector on.
    Detector(veriflow_bench::detector::DetectorArgs),
    /// N-Queens (paper 004 Table 2): plain (no log, no detector) against fault-tolerant
    /// (cluster, log and detector) on 1-8 workers, n = 16 and 17.
    Nqueens(veriflow_bench::nqueens::NQueensArgs),
    /// CG (paper 002): the sequential SpMV and CG iteration on a 1M-unknown 3D Poisson matrix
    /// against scipy.
    Cg(veriflow_bench::cg::CgArgs),
    /// transport3d in iterative mode (paper 000 Table 1): time with a random vnode killed every
    /// n seconds, async vs sync vs dataflow, on a 64^3 mesh and 8 vnodes.
    Transport(veriflow_bench::transport::TransportArgs),
    /// The cluster simulator over many seeds (`--seeds N`: faults per kind, invariants,
    /// failures with their replay lines), or the failure detector's heartbeats and detection
    /// times at N simulated processes (`--nodes N`).
    Sim(veriflow_bench::sim::SimArgs),
    /// Issue 13's damage campaign: seeded random damages of a finished and an interrupted
    /// knary run's stores, judged by inspect, certify and run --resume.
    Damage(veriflow_bench::damage::DamageArgs),
    /// Issue 13 point 8: peak RSS and the recovery time of one vnode against tasks run, with
    /// recovery checkpoints and from the whole log.
    Memory(veriflow_bench::memory::MemoryArgs),
    /// Issue 18 point 7: sled against redb and fjall as the log's store (CPU, wall, memory,
    /// disk, read-back and recovery time).
    StoreEngines(veriflow_bench::store_engines::StoreEnginesArgs),
    /// knary in cluster mode at size (issue 16.4): 8-64 one-thread worker processes, 1,000
    /// vnodes, a worker killed and replaced every 5 s; memory, coordinator CPU, heartbeats and
    /// the termination test per member, and what would limit 1,000 hosts.
    Scale(veriflow_bench::scale::ScaleArgs),
    /// Draw every figure again from its JSON results in `--dir` (nothing is run).
    Replot(veriflow_bench::replot::ReplotArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Runs per setting and grain (medians are taken over them; at least 5 unless --quick).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// Worker threads of veriflow and of the rayon pool.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: u32,
    /// Small trees, for a smoke run (writes <command>-quick.json/.md instead).
    #[arg(long)]
    quick: bool,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Where the S1/S2 runs' fresh log directories go [default: the system's temp directory].
    #[arg(long, value_name = "DIR")]
    scratch: Option<PathBuf>,
    /// Before each S0/S1(/S2) repetition, wait up to this many seconds for other processes to use less
    /// than a quarter of a core (0: do not wait). The machine is shared: a concurrent build
    /// takes half of its 2 cores.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    quiet_wait: u64,
    /// Repetitions (S0, S1[, S2]) that other processes disturbed (more than 0.05 CPU-s + 5 %
    /// of the threads' CPU time during a run) are discarded and run again, at most this many times per grain (and for the throughput
    /// comparison); past that, disturbed repetitions are kept and counted.
    #[arg(long, default_value_t = 3)]
    retries: u32,
    /// `overhead` only: skip the grain series, run only the empty-task comparison (S0, rayon,
    /// S1) and write `overhead-empty.*` (a few minutes).
    #[arg(long)]
    empty_only: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Overhead(args) => overhead(&args),
        Command::Recovery(args) => recovery(&args),
        Command::Certify(args) => veriflow_bench::certify::run(&args),
        Command::Storage(args) => veriflow_bench::storage::run(&args),
        Command::Cluster(args) => veriflow_bench::cluster::run(&args),
        Command::Netns(args) => veriflow_bench::netns::run(&args),
        Command::Online(args) => veriflow_bench::online::run(&args),
        Command::Detector(args) => veriflow_bench::detector::run(&args),
        Command::Nqueens(args) => veriflow_bench::nqueens::run(&args),
        Command::Cg(args) => veriflow_bench::cg::run(&args),
        Command::Transport(args) => veriflow_bench::transport::run(&args),
        Command::Sim(args) => veriflow_bench::sim::run(&args),
        Command::Damage(args) => veriflow_bench::damage::run(&args),
        Command::Memory(args) => veriflow_bench::memory::run(&args),
        Command::StoreEngines(args) => veriflow_bench::store_engines::run(&args),
        Command::Scale(args) => veriflow_bench::scale::run(&args),
        Command::Replot(args) => veriflow_bench::replot::run(&args),
    }
}

/// One invocation's common state: options, the scratch directory, the report's session, and
/// how a series is repeated.
struct Bench {
    session: Session,
    runs: usize,
    threads: usize,
    scratch: PathBuf,
    rounds: Rounds,
    /// Repetitions that started although the machine was not quiet (every series).
    not_quiet: u32,
}

/// Kept and discarded runs of one shape, interleaved over settings.
struct Interleaved {
    shape: Shape,
    series: Series<KnaryRun>,
}

impl Bench {
    fn start(args: &RunArgs) -> Result<Bench> {
        require_runs(args.runs, 5, args.quick)?;
        let runs = args.runs as usize;
        let threads = args.threads as usize;
        Ok(Bench {
            // Before the runs: the commit measured is the one checked out now.
            session: Session::start(args.out.as_deref(), args.quick)?,
            runs,
            threads,
            scratch: scratch_dir(args.scratch.as_deref())?,
            // A disturbed repetition is run again whole: its settings' times pair.
            rounds: Rounds {
                runs,
                quiet: Quiet::secs(args.quiet_wait),
                retries: args.retries,
                disturbed: Disturbed::threads(threads),
                redo: Redo::Round,
                label: String::new(),
            },
            not_quiet: 0,
        })
    }

    /// One knary run of this invocation.
    fn run(&self, shape: Shape, setting: Setting) -> Result<KnaryRun> {
        run_knary(shape, setting, self.threads, &self.scratch)
    }

    /// `--runs` repetitions of `settings` in turn on `shape` (S0, S1, ..., S0, S1, ...),
    /// harness rules 1-3.
    fn interleaved(&mut self, shape: Shape, settings: &[Setting]) -> Result<Interleaved> {
        let rounds = Rounds {
            label: format!("grain {:>4} µs", shape.grain_us),
            ..self.rounds.clone()
        };
        let series = rounds.run(
            settings.len(),
            |_, i| self.run(shape, settings[i]),
            |i, r| {
                let mut line = format!("{:?} {:.4} s", settings[i], r.elapsed.as_secs_f64());
                if r.events > 0 {
                    let _ = write!(line, " ({} events)", r.events);
                }
                if r.failures > 0 {
                    let _ = write!(
                        line,
                        " ({} failure, {} tasks restarted, {} reused)",
                        r.failures, r.recovered_tasks, r.reused_tasks
                    );
                }
                line
            },
        )?;
        self.not_quiet += series.not_quiet;
        Ok(Interleaved { shape, series })
    }

    /// The first paragraph of the markdown reports after the session's.
    fn header(&self) -> String {
        format!(
            "{} threads, median of {} runs per setting.\n\n",
            self.threads, self.runs
        )
    }

    /// The fields every JSON report of this binary has besides the session's.
    fn json(&self) -> serde_json::Map<String, Value> {
        json_map(json!({ "pairs_started_on_a_busy_machine": self.not_quiet }))
    }

    /// The parameters every JSON report of this binary shares.
    fn json_parameters(&self) -> serde_json::Map<String, Value> {
        json_map(merge(
            json!({
                "runs": self.runs,
                "threads": self.threads,
                "timing": "RunReport::elapsed (from the root's declaration until every event is \
                           durable; runtime build and store open excluded); rayon: wall time of \
                           pool.install",
                "store": "fresh SledStore in a new temporary directory per S1/S2 run, default \
                          CommitPolicy (64 KiB / 5 ms)",
            }),
            self.rounds.parameters(),
        ))
    }

    /// Writes `<name>.json` and `<name>.md` (`<name>-quick.*` with `--quick`).
    fn write(&self, name: &str, json: serde_json::Map<String, Value>, md: &str) -> Result<()> {
        self.session
            .write(name, &self.session.stem(name), Value::Object(json), md)
    }
}

/// The raw runs of one setting, and their time statistics, as JSON.
fn runs_json(runs: &[KnaryRun], time: &Stats) -> Value {
    json!({
        "seconds": secs(runs),
        "tasks": runs.iter().map(|r| r.tasks).collect::<Vec<_>>(),
        "events": runs.iter().map(|r| r.events).collect::<Vec<_>>(),
        "steals": runs.iter().map(|r| r.steals).collect::<Vec<_>>(),
        "failures": runs.iter().map(|r| r.failures).collect::<Vec<_>>(),
        "recovered_tasks": runs.iter().map(|r| r.recovered_tasks).collect::<Vec<_>>(),
        "reused_tasks": runs.iter().map(|r| r.reused_tasks).collect::<Vec<_>>(),
        "other_processes_cpu_s": foreign(runs),
        "cpu_s": cpu(runs),
        "median_s": time.median, "min_s": time.min, "max_s": time.max,
    })
}

/// The trees of one invocation.
struct Plan {
    /// Tree of the grain series.
    grain_tree: (u32, u32, u32),
    /// Tree of the empty-task throughput.
    big_tree: (u32, u32, u32),
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                grain_tree: (5, 5, 1),
                big_tree: (7, 5, 0),
            }
        } else {
            // 23,437 tasks (19,531 nodes); 585,937 tasks (488,281 nodes).
            Plan {
                grain_tree: (7, 5, 1),
                big_tree: (9, 5, 0),
            }
        }
    }

    fn grain(&self, grain_us: u64) -> Shape {
        let (depth, fanout, serial) = self.grain_tree;
        Shape {
            depth,
            fanout,
            serial,
            grain_us,
        }
    }

    fn big(&self) -> Shape {
        let (depth, fanout, serial) = self.big_tree;
        Shape {
            depth,
            fanout,
            serial,
            grain_us: 0,
        }
    }
}

/// Raw runs of one grain.
struct GrainRuns {
    shape: Shape,
    s0: Vec<KnaryRun>,
    s1: Vec<KnaryRun>,
    /// Disturbed pairs that were run again.
    discarded: Vec<(KnaryRun, KnaryRun)>,
    /// Disturbed pairs kept because no retry was left.
    kept_disturbed: u32,
}

impl From<Interleaved> for GrainRuns {
    /// The runs of `Bench::interleaved` over `[S0, S1]`.
    fn from(i: Interleaved) -> GrainRuns {
        let discarded = i
            .series
            .discarded_rounds()
            .into_iter()
            .filter_map(|rep| match rep[..] {
                [a, b] => Some((*a, *b)),
                _ => None,
            })
            .collect();
        let mut runs = i.series.kept.into_iter();
        GrainRuns {
            shape: i.shape,
            s0: runs.next().unwrap_or_default(),
            s1: runs.next().unwrap_or_default(),
            discarded,
            kept_disturbed: i.series.kept_disturbed,
        }
    }
}

/// Raw runs of the throughput comparison.
struct ThroughputRuns {
    shape: Shape,
    s0: Vec<KnaryRun>,
    s1: Vec<KnaryRun>,
    rayon: Vec<RayonRun>,
    /// Disturbed triples (S0, rayon, S1) that were run again.
    discarded: Vec<(KnaryRun, RayonRun, KnaryRun)>,
    /// Disturbed triples kept because no retry was left.
    kept_disturbed: u32,
}

fn secs(runs: &[KnaryRun]) -> Vec<f64> {
    runs.iter().map(|r| r.elapsed.as_secs_f64()).collect()
}

fn foreign(runs: &[KnaryRun]) -> Vec<Option<f64>> {
    runs.iter().map(|r| r.foreign_cpu_s).collect()
}

/// Most CPU seconds other processes used during one of `runs`.
fn max_foreign<'a>(runs: impl Iterator<Item = &'a KnaryRun>) -> Option<f64> {
    runs.filter_map(|r| r.foreign_cpu_s).reduce(f64::max)
}

fn cpu(runs: &[KnaryRun]) -> Vec<Option<f64>> {
    runs.iter().map(|r| r.cpu_s).collect()
}

fn median_cpu(runs: &[KnaryRun]) -> Option<f64> {
    let v: Vec<f64> = runs.iter().filter_map(|r| r.cpu_s).collect();
    Stats::of(&v).map(|s| s.median)
}

fn median_steals(runs: &[KnaryRun]) -> String {
    let v: Vec<f64> = runs.iter().map(|r| r.steals as f64).collect();
    Stats::of(&v).map_or_else(|| "?".to_string(), |s| format!("{}", s.median))
}

fn stats(values: &[f64]) -> Result<Stats> {
    Stats::require(values)
}

/// A run of the throughput comparison: veriflow's or rayon's.
#[derive(Clone, Copy, Debug)]
enum TpRun {
    Veriflow(KnaryRun),
    Rayon(RayonRun),
}

impl Timed for TpRun {
    fn seconds(&self) -> f64 {
        match self {
            TpRun::Veriflow(r) => r.seconds(),
            TpRun::Rayon(r) => r.seconds(),
        }
    }
    fn foreign_cpu_s(&self) -> Option<f64> {
        match self {
            TpRun::Veriflow(r) => r.foreign_cpu_s,
            TpRun::Rayon(r) => r.foreign_cpu_s,
        }
    }
}

impl TpRun {
    fn veriflow(&self) -> Option<KnaryRun> {
        match self {
            TpRun::Veriflow(r) => Some(*r),
            TpRun::Rayon(_) => None,
        }
    }
    fn rayon(&self) -> Option<RayonRun> {
        match self {
            TpRun::Rayon(r) => Some(*r),
            TpRun::Veriflow(_) => None,
        }
    }
}

fn overhead(args: &RunArgs) -> Result<()> {
    let mut bench = Bench::start(args)?;
    let plan = Plan::new(args.quick);
    let (threads, runs) = (bench.threads, bench.runs);
    eprintln!(
        "overhead: {runs} runs per setting, {threads} threads, grain tree {:?} ({} tasks), \
         big tree {:?} ({} tasks), logs in {}",
        plan.grain_tree,
        plan.grain(0).tasks()?,
        plan.big_tree,
        plan.big().tasks()?,
        bench.scratch.display()
    );

    // Warm up (page cache, allocator, sled's first files): not counted.
    bench.run(plan.grain(0), Setting::S0)?;
    bench.run(plan.grain(0), Setting::S1)?;

    let mut grains = Vec::new();
    let grains_us: &[u64] = if args.empty_only { &[] } else { &GRAINS_US };
    for &grain_us in grains_us {
        let series = bench.interleaved(plan.grain(grain_us), &[Setting::S0, Setting::S1])?;
        grains.push(GrainRuns::from(series));
    }

    let big = plan.big();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("cannot start the rayon pool")?;
    let nodes = big.nodes()?;
    // Warm up both.
    bench.run(big, Setting::S0)?;
    let warm = rayon_tree(&pool, big).nodes;
    if warm != nodes {
        bail!("rayon counted {warm} nodes, expected {nodes}");
    }
    // S0, rayon, S1 in turn; a disturbed triple is run again whole.
    let rounds = Rounds {
        label: "empty tasks".into(),
        ..bench.rounds.clone()
    };
    let series = rounds.run(
        3,
        |_, i| match i {
            1 => {
                let r = rayon_tree(&pool, big);
                if r.nodes != nodes {
                    bail!("rayon counted {} nodes, expected {nodes}", r.nodes);
                }
                Ok(TpRun::Rayon(r))
            }
            0 => Ok(TpRun::Veriflow(bench.run(big, Setting::S0)?)),
            _ => Ok(TpRun::Veriflow(bench.run(big, Setting::S1)?)),
        },
        |i, r| {
            let name = ["veriflow S0", "rayon", "veriflow S1"][i];
            format!("{name} {:.4} s", r.seconds())
        },
    )?;
    bench.not_quiet += series.not_quiet;
    let veriflow = |i: usize| series.kept[i].iter().filter_map(TpRun::veriflow).collect();
    let tp = ThroughputRuns {
        shape: big,
        s0: veriflow(0),
        s1: veriflow(2),
        rayon: series.kept[1].iter().filter_map(TpRun::rayon).collect(),
        discarded: series
            .discarded_rounds()
            .into_iter()
            .filter_map(|rep| match rep[..] {
                [a, r, b] => Some((a.veriflow()?, r.rayon()?, b.veriflow()?)),
                _ => None,
            })
            .collect(),
        kept_disturbed: series.kept_disturbed,
    };
    let report = Report::new(&bench, &plan, grains, tp)?;
    let name = if args.empty_only {
        "overhead-empty"
    } else {
        "overhead"
    };
    bench.write(name, report.json(&bench), &report.markdown(&bench))
}

/// One grain's summary.
struct GrainSummary {
    runs: GrainRuns,
    s0: Stats,
    s1: Stats,
    ratio: f64,
    us_per_task: f64,
    /// Median over runs of (S1_i - S0_i) / tasks, in µs (paired by interleaving).
    paired_us_per_task: f64,
    events: Stats,
}

/// The throughput summary.
struct ThroughputSummary {
    runs: ThroughputRuns,
    tasks: u64,
    nodes: u64,
    s0: Stats,
    s1: Stats,
    rayon: Stats,
}

impl ThroughputSummary {
    fn s0_tasks_per_s(&self) -> f64 {
        self.tasks as f64 / self.s0.median
    }
    fn s0_nodes_per_s(&self) -> f64 {
        self.nodes as f64 / self.s0.median
    }
    fn s1_tasks_per_s(&self) -> f64 {
        self.tasks as f64 / self.s1.median
    }
    fn s1_nodes_per_s(&self) -> f64 {
        self.nodes as f64 / self.s1.median
    }
    fn rayon_nodes_per_s(&self) -> f64 {
        self.nodes as f64 / self.rayon.median
    }
    /// How many times rayon's cost per node veriflow S0's is (wall time, same process).
    fn s0_cost_vs_rayon(&self) -> f64 {
        self.rayon_nodes_per_s() / self.s0_nodes_per_s()
    }
    /// The log's CPU per task: (median CPU of S1 - median CPU of S0) / tasks, in µs.
    fn log_cpu_us_per_task(&self) -> Option<f64> {
        let (s0, s1) = (median_cpu(&self.runs.s0)?, median_cpu(&self.runs.s1)?);
        Some((s1 - s0) / self.tasks as f64 * 1e6)
    }
}

/// A target of the issue and what was measured.
struct Target {
    name: String,
    goal: String,
    measured: f64,
    unit: &'static str,
    met: bool,
}

struct Report {
    grain_tree: Shape,
    grains: Vec<GrainSummary>,
    throughput: ThroughputSummary,
    targets: Vec<Target>,
}

impl Report {
    fn new(
        _bench: &Bench,
        plan: &Plan,
        grains: Vec<GrainRuns>,
        tp: ThroughputRuns,
    ) -> Result<Report> {
        let mut summaries = Vec::new();
        for g in grains {
            let tasks = g.shape.tasks()? as f64;
            let s0 = stats(&secs(&g.s0))?;
            let s1 = stats(&secs(&g.s1))?;
            let paired: Vec<f64> =
                g.s0.iter()
                    .zip(&g.s1)
                    .map(|(a, b)| (b.elapsed.as_secs_f64() - a.elapsed.as_secs_f64()) / tasks * 1e6)
                    .collect();
            let events: Vec<f64> = g.s1.iter().map(|r| r.events as f64).collect();
            summaries.push(GrainSummary {
                ratio: s1.median / s0.median,
                us_per_task: (s1.median - s0.median) / tasks * 1e6,
                paired_us_per_task: stats(&paired)?.median,
                events: stats(&events)?,
                s0,
                s1,
                runs: g,
            });
        }
        let rayon_secs: Vec<f64> = tp.rayon.iter().map(|r| r.elapsed.as_secs_f64()).collect();
        let throughput = ThroughputSummary {
            tasks: tp.shape.tasks()?,
            nodes: tp.shape.nodes()?,
            s0: stats(&secs(&tp.s0))?,
            s1: stats(&secs(&tp.s1))?,
            rayon: stats(&rayon_secs)?,
            runs: tp,
        };

        let mut targets = vec![
            Target {
                name: "empty_tasks_per_s".to_string(),
                goal: format!(">= {TARGET_TASKS_PER_S:.0} empty tasks/s without checkpoint"),
                measured: throughput.s0_tasks_per_s(),
                unit: "tasks/s",
                met: throughput.s0_tasks_per_s() >= TARGET_TASKS_PER_S,
            },
            Target {
                name: "s0_cost_per_node_vs_rayon".to_string(),
                goal: format!("veriflow S0's time per node <= {TARGET_COST_VS_RAYON} x rayon's"),
                measured: throughput.s0_cost_vs_rayon(),
                unit: "x",
                met: throughput.s0_cost_vs_rayon() <= TARGET_COST_VS_RAYON,
            },
        ];
        if let Some(cpu) = throughput.log_cpu_us_per_task() {
            targets.push(Target {
                name: "log_cpu_us_per_task_empty".to_string(),
                goal: format!(
                    "log CPU per empty task (CPU S1 - CPU S0) <= {TARGET_LOG_CPU_US_PER_TASK} µs"
                ),
                measured: cpu,
                unit: "µs/task",
                met: cpu <= TARGET_LOG_CPU_US_PER_TASK,
            });
        }
        for g in &summaries {
            let grain = g.runs.shape.grain_us;
            targets.push(Target {
                name: format!("log_cost_us_per_task_grain_{grain}us"),
                goal: format!("(S1 - S0)/#tasks <= {TARGET_US_PER_TASK} µs at grain {grain} µs"),
                measured: g.us_per_task,
                unit: "µs/task",
                met: g.us_per_task <= TARGET_US_PER_TASK,
            });
        }
        for (grain, limit) in [(1000, TARGET_RATIO_1MS), (100, TARGET_RATIO_100US)] {
            if let Some(g) = summaries.iter().find(|g| g.runs.shape.grain_us == grain) {
                targets.push(Target {
                    name: format!("ratio_s1_s0_grain_{grain}us"),
                    goal: format!("S1/S0 <= {limit} at grain {grain} µs"),
                    measured: g.ratio,
                    unit: "",
                    met: g.ratio <= limit,
                });
            }
        }
        Ok(Report {
            grain_tree: plan.grain(0),
            grains: summaries,
            throughput,
            targets,
        })
    }

    fn markdown(&self, bench: &Bench) -> String {
        let mut s = String::new();
        let t = &self.grain_tree;
        s.push_str(&bench.header());
        if !self.grains.is_empty() {
            let _ = writeln!(
                s,
                "Logging overhead: knary depth {} fanout {} serial {} ({} nodes, {} tasks), S0 = no \
                 log, S1 = durable log (sled, group commit); times are `RunReport::elapsed`; \
                 \"other CPU\" is the most CPU time other processes took during one run of the row \
                 (the machine is shared); {} pair(s) of runs started on a busy machine.\n",
                t.depth,
                t.fanout,
                t.serial,
                t.nodes().unwrap_or(0),
                t.tasks().unwrap_or(0),
                bench.not_quiet,
            );
            s.push_str(
                "| grain | S0 median (s) | S1 median (s) | S1/S0 | (S1−S0)/task (µs) | \
                 paired (µs) | events | S0 min–max (s) | S1 min–max (s) |\n",
            );
            s.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
            for g in &self.grains {
                let _ = writeln!(
                    s,
                    "| {} | {:.4} | {:.4} | {:.4} | {:.2} | {:.2} | {:.0} | {:.4}–{:.4} | {:.4}–{:.4} |",
                    grain_text(g.runs.shape.grain_us),
                    g.s0.median,
                    g.s1.median,
                    g.ratio,
                    g.us_per_task,
                    g.paired_us_per_task,
                    g.events.median,
                    g.s0.min,
                    g.s0.max,
                    g.s1.min,
                    g.s1.max,
                );
            }
            s.push_str(
                "\nSame runs, diagnostics (medians): CPU time the process used (workers, log writer, \
                 sled), steals, most CPU time other processes took during one kept run, and pairs \
                 discarded and run again because other processes disturbed them (or kept, no retry \
                 left).\n\n| grain | CPU S0 (s) | CPU S1 (s) | steals S0 | steals S1 | other CPU (s) | \
                 rerun / kept disturbed |\n|---:|---:|---:|---:|---:|---:|---:|\n",
            );
            for g in &self.grains {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} / {} |",
                    grain_text(g.runs.shape.grain_us),
                    cpu_text(median_cpu(&g.runs.s0)),
                    cpu_text(median_cpu(&g.runs.s1)),
                    median_steals(&g.runs.s0),
                    median_steals(&g.runs.s1),
                    cpu_text(max_foreign(g.runs.s0.iter().chain(&g.runs.s1))),
                    g.runs.discarded.len(),
                    g.runs.kept_disturbed,
                );
            }
        }
        let tp = &self.throughput;
        let b = tp.runs.shape;
        let _ = writeln!(
            s,
            "\nEmpty tasks: knary depth {} fanout {} serial {} grain 0 ({} nodes; veriflow runs \
             {} tasks = nodes + one Sum per internal node; rayon runs one `scope.spawn` per \
             node).\n",
            b.depth, b.fanout, b.serial, tp.nodes, tp.tasks
        );
        s.push_str("| system | median (s) | min–max (s) | tasks/s | nodes/s |\n");
        s.push_str("|---|---:|---:|---:|---:|\n");
        let rows = [
            (
                "veriflow S0 (no log)",
                &tp.s0,
                tp.s0_tasks_per_s(),
                tp.s0_nodes_per_s(),
            ),
            (
                "veriflow S1 (durable log)",
                &tp.s1,
                tp.s1_tasks_per_s(),
                tp.s1_nodes_per_s(),
            ),
            // rayon runs one task per node.
            (
                "rayon `scope.spawn`",
                &tp.rayon,
                tp.rayon_nodes_per_s(),
                tp.rayon_nodes_per_s(),
            ),
        ];
        for (name, t, tasks_per_s, nodes_per_s) in rows {
            let _ = writeln!(
                s,
                "| {name} | {:.4} | {:.4}–{:.4} | {} | {} |",
                t.median,
                t.min,
                t.max,
                thousands(tasks_per_s),
                thousands(nodes_per_s)
            );
        }
        let _ = writeln!(
            s,
            "\nveriflow S0 / rayon, nodes/s: {:.3} (rayon is {:.1}x faster per node); {} \
             disturbed triple(s) run again, {} kept.\n",
            tp.s0_nodes_per_s() / tp.rayon_nodes_per_s(),
            tp.rayon_nodes_per_s() / tp.s0_nodes_per_s(),
            tp.runs.discarded.len(),
            tp.runs.kept_disturbed,
        );
        let _ = writeln!(
            s,
            "CPU time of the process (medians): S0 {} s, S1 {} s, so the log costs {} µs of CPU \
             per task.\n",
            cpu_text(median_cpu(&tp.runs.s0)),
            cpu_text(median_cpu(&tp.runs.s1)),
            tp.log_cpu_us_per_task()
                .map_or_else(|| "?".to_string(), |c| format!("{c:.3}")),
        );
        s.push_str(&targets_markdown(&self.targets));
        s
    }

    fn json(&self, bench: &Bench) -> serde_json::Map<String, Value> {
        let grains: Vec<Value> = self
            .grains
            .iter()
            .map(|g| {
                json!({
                    "grain_us": g.runs.shape.grain_us,
                    "shape": g.runs.shape,
                    "nodes": g.runs.shape.nodes().ok(),
                    "tasks": g.runs.shape.tasks().ok(),
                    "s0": runs_json(&g.runs.s0, &g.s0),
                    "s1": runs_json(&g.runs.s1, &g.s1),
                    "events_median": g.events.median,
                    "ratio_s1_s0": g.ratio,
                    "log_cost_us_per_task": g.us_per_task,
                    "log_cost_us_per_task_paired_median": g.paired_us_per_task,
                    "discarded_disturbed_pairs": g.runs.discarded.iter().map(|(a, b)| json!({
                        "s0_s": a.elapsed.as_secs_f64(),
                        "s0_other_processes_cpu_s": a.foreign_cpu_s,
                        "s1_s": b.elapsed.as_secs_f64(),
                        "s1_other_processes_cpu_s": b.foreign_cpu_s,
                    })).collect::<Vec<_>>(),
                    "kept_disturbed_pairs": g.runs.kept_disturbed,
                })
            })
            .collect();
        let tp = &self.throughput;
        let throughput = json!({
            "shape": tp.runs.shape,
            "nodes": tp.nodes,
            "veriflow_tasks": tp.tasks,
            "veriflow_s0": {
                "seconds": secs(&tp.runs.s0),
                "other_processes_cpu_s": foreign(&tp.runs.s0),
                "cpu_s": cpu(&tp.runs.s0),
                "median_s": tp.s0.median, "min_s": tp.s0.min, "max_s": tp.s0.max,
                "tasks_per_s": tp.s0_tasks_per_s(),
                "nodes_per_s": tp.s0_nodes_per_s(),
            },
            "veriflow_s1": {
                "seconds": secs(&tp.runs.s1),
                "other_processes_cpu_s": foreign(&tp.runs.s1),
                "cpu_s": cpu(&tp.runs.s1),
                "events": tp.runs.s1.iter().map(|r| r.events).collect::<Vec<_>>(),
                "median_s": tp.s1.median, "min_s": tp.s1.min, "max_s": tp.s1.max,
                "tasks_per_s": tp.s1_tasks_per_s(),
                "nodes_per_s": tp.s1_nodes_per_s(),
            },
            "rayon_scope_spawn": {
                "seconds": tp.runs.rayon.iter().map(|r| r.elapsed.as_secs_f64()).collect::<Vec<_>>(),
                "other_processes_cpu_s": tp.runs.rayon.iter().map(|r| r.foreign_cpu_s).collect::<Vec<_>>(),
                "median_s": tp.rayon.median, "min_s": tp.rayon.min, "max_s": tp.rayon.max,
                "tasks_per_s": tp.rayon_nodes_per_s(),
                "nodes_per_s": tp.rayon_nodes_per_s(),
                "note": "one scope.spawn per node; its tasks are its nodes",
            },
            "veriflow_s0_over_rayon_nodes_per_s": tp.s0_nodes_per_s() / tp.rayon_nodes_per_s(),
            "discarded_disturbed_triples": tp.runs.discarded.iter().map(|(a, r, b)| json!({
                "s0_s": a.elapsed.as_secs_f64(),
                "s0_other_processes_cpu_s": a.foreign_cpu_s,
                "rayon_s": r.elapsed.as_secs_f64(),
                "rayon_other_processes_cpu_s": r.foreign_cpu_s,
                "s1_s": b.elapsed.as_secs_f64(),
                "s1_other_processes_cpu_s": b.foreign_cpu_s,
            })).collect::<Vec<_>>(),
            "kept_disturbed_triples": tp.runs.kept_disturbed,
        });
        let mut report = bench.json();
        let mut parameters = bench.json_parameters();
        parameters.extend(json_map(json!({
            "grains_us": GRAINS_US,
            "grain_tree": self.grain_tree,
            "throughput_tree": tp.runs.shape,
            "order": "per grain: S0, S1, S0, S1, ... (interleaved); throughput: S0, rayon, S1, ...",
        })));
        report.extend(json_map(json!({
            "parameters": parameters,
            "grains": grains,
            "empty_task_throughput": throughput,
            "targets": targets_json(&self.targets),
        })));
        report
    }
}

/// The targets as a markdown table.
fn targets_markdown(targets: &[Target]) -> String {
    let mut s = String::from("| target | measured | met |\n|---|---:|---|\n");
    for t in targets {
        let measured = if t.unit == "tasks/s" {
            format!("{} {}", thousands(t.measured), t.unit)
        } else if t.unit.is_empty() {
            format!("{:.4}", t.measured)
        } else {
            format!("{:.2} {}", t.measured, t.unit)
        };
        let _ = writeln!(
            s,
            "| {} | {measured} | {} |",
            t.goal,
            if t.met { "yes" } else { "**no**" }
        );
    }
    s
}

fn targets_json(targets: &[Target]) -> Vec<Value> {
    targets
        .iter()
        .map(|t| {
            json!({
                "name": t.name, "goal": t.goal, "measured": t.measured, "unit": t.unit,
                "met": t.met,
            })
        })
        .collect()
}

/// The fields of a JSON object (`json!({...})`).
fn json_map(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(map) => map,
        other => {
            let mut map = serde_json::Map::new();
            map.insert("value".to_string(), other);
            map
        }
    }
}

fn recovery(args: &RunArgs) -> Result<()> {
    if args.empty_only {
        bail!("--empty-only is an option of `paper overhead`, not of `paper recovery`");
    }
    let mut bench = Bench::start(args)?;
    let plan = Plan::new(args.quick);
    let settings = [Setting::S0, Setting::S1, Setting::S2];
    eprintln!(
        "recovery: {} runs per setting, {} threads, tree {:?} ({} tasks), vnode \
         {S2_FAILING_VNODE} failing after {} tasks in S2, logs in {}",
        bench.runs,
        bench.threads,
        plan.grain_tree,
        plan.grain(0).tasks()?,
        plan.grain(0).tasks()? / 2,
        bench.scratch.display()
    );
    // Warm up (page cache, allocator, sled's first files): not counted.
    for setting in settings {
        bench.run(plan.grain(0), setting)?;
    }
    let mut grains = Vec::new();
    for grain_us in RECOVERY_GRAINS_US {
        let series = bench.interleaved(plan.grain(grain_us), &settings)?;
        grains.push(RecoverySummary::new(series)?);
    }
    let targets: Vec<Target> = grains
        .iter()
        .filter(|g| g.series.shape.grain_us == 1000)
        .map(|g| Target {
            name: "ratio_s2_s0_grain_1000us".to_string(),
            goal: format!("S2/S0 <= {TARGET_RECOVERY_RATIO_1MS} at grain 1000 µs"),
            measured: g.s2_s0(),
            unit: "",
            met: g.s2_s0() <= TARGET_RECOVERY_RATIO_1MS,
        })
        .collect();
    let md = recovery_markdown(&bench, &plan, &grains, &targets);
    let mut report = bench.json();
    let mut parameters = bench.json_parameters();
    parameters.extend(json_map(json!({
        "grains_us": RECOVERY_GRAINS_US,
        "tree": plan.grain(0),
        "vnodes": bench.threads,
        "failing_vnode": S2_FAILING_VNODE,
        "fails_after_tasks": plan.grain(0).tasks()? / 2,
        "order": "per grain: S0, S1, S2, S0, S1, S2, ... (interleaved)",
        "settings": {
            "s0": "no log",
            "s1": "durable log",
            "s2": "durable log, vnode 1 fails (all its memory lost) once half the tasks have \
                   completed and is recovered from its log",
        },
    })));
    report.extend(json_map(json!({
        "parameters": parameters,
        "grains": grains.iter().map(RecoverySummary::json).collect::<Vec<_>>(),
        "targets": targets_json(&targets),
    })));
    bench.write("recovery", report, &md)
}

/// One grain of the recovery series.
struct RecoverySummary {
    series: Interleaved,
    /// Time statistics of S0, S1, S2.
    time: [Stats; 3],
    /// Medians over the S2 runs.
    recovered_tasks: f64,
    reused_tasks: f64,
    /// Failures over all kept S2 runs (each run is checked to fail exactly once).
    failures: u64,
}

impl RecoverySummary {
    fn new(series: Interleaved) -> Result<RecoverySummary> {
        let runs = &series.series;
        let time = [runs.stats(0)?, runs.stats(1)?, runs.stats(2)?];
        let s2 = &runs.kept[2];
        let median_of = |f: fn(&KnaryRun) -> u64| -> Result<f64> {
            let v: Vec<f64> = s2.iter().map(|r| f(r) as f64).collect();
            Ok(stats(&v)?.median)
        };
        Ok(RecoverySummary {
            recovered_tasks: median_of(|r| r.recovered_tasks)?,
            reused_tasks: median_of(|r| r.reused_tasks)?,
            failures: s2.iter().map(|r| r.failures).sum(),
            time,
            series,
        })
    }

    fn s1_s0(&self) -> f64 {
        self.time[1].median / self.time[0].median
    }

    fn s2_s0(&self) -> f64 {
        self.time[2].median / self.time[0].median
    }

    fn json(&self) -> Value {
        let shape = self.series.shape;
        json!({
            "grain_us": shape.grain_us,
            "shape": shape,
            "nodes": shape.nodes().ok(),
            "tasks": shape.tasks().ok(),
            "s0": runs_json(&self.series.series.kept[0], &self.time[0]),
            "s1": runs_json(&self.series.series.kept[1], &self.time[1]),
            "s2": runs_json(&self.series.series.kept[2], &self.time[2]),
            "ratio_s1_s0": self.s1_s0(),
            "ratio_s2_s0": self.s2_s0(),
            "recovered_tasks_median": self.recovered_tasks,
            "reused_tasks_median": self.reused_tasks,
            "failures_total": self.failures,
            "s2_runs": self.series.series.kept[2].len(),
            "discarded_disturbed_repetitions": self.series.series.discarded_rounds().iter()
                .map(|rep| json!({
                    "seconds": rep.iter().map(|r| r.seconds()).collect::<Vec<_>>(),
                    "other_processes_cpu_s": rep.iter().map(|r| r.foreign_cpu_s).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            "kept_disturbed_repetitions": self.series.series.kept_disturbed,
        })
    }
}

fn recovery_markdown(
    bench: &Bench,
    plan: &Plan,
    grains: &[RecoverySummary],
    targets: &[Target],
) -> String {
    let mut s = bench.header();
    let t = plan.grain(0);
    let tasks = t.tasks().unwrap_or(0);
    let _ = writeln!(
        s,
        "Recovery: knary depth {} fanout {} serial {} ({} nodes, {tasks} tasks), {} threads and \
         as many vnodes; S0 = no log, S1 = durable log (sled, group commit), S2 = S1 with vnode \
         {S2_FAILING_VNODE} failing (all its memory lost) once {} tasks have completed, then \
         recovered from its log; times are `RunReport::elapsed`; \"restarted\" are the tasks \
         the recovery ran again (declared, not completed at the failure), \"reused\" those \
         completed before it and not run again (medians over the S2 runs); every run's result is \
         checked, and every S2 run must fail exactly once; {} repetition(s) started on a busy \
         machine.\n",
        t.depth,
        t.fanout,
        t.serial,
        t.nodes().unwrap_or(0),
        bench.threads,
        tasks / 2,
        bench.not_quiet,
    );
    s.push_str(
        "| grain | S0 median (s) | S1 median (s) | S2 median (s) | S1/S0 | S2/S0 | restarted \
         tasks | reused tasks | failures | S2 min–max (s) | other CPU (s) | rerun / kept \
         disturbed |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for g in grains {
        let runs = &g.series.series;
        let _ = writeln!(
            s,
            "| {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} | {:.0} | {:.0} | {} in {} runs | \
             {:.4}–{:.4} | {} | {} / {} |",
            grain_text(g.series.shape.grain_us),
            g.time[0].median,
            g.time[1].median,
            g.time[2].median,
            g.s1_s0(),
            g.s2_s0(),
            g.recovered_tasks,
            g.reused_tasks,
            g.failures,
            runs.kept[2].len(),
            g.time[2].min,
            g.time[2].max,
            cpu_text(runs.max_foreign()),
            runs.rerun,
            runs.kept_disturbed,
        );
    }
    s.push('\n');
    s.push_str(&targets_markdown(targets));
    s
}

fn grain_text(us: u64) -> String {
    match us {
        0 => "0".to_string(),
        us if us >= 1000 && us % 1000 == 0 => format!("{} ms", us / 1000),
        us => format!("{us} µs"),
    }
}

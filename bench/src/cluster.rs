//! `paper cluster`: what logging and one lost worker cost knary in cluster mode (S0 / S1 / S2
//! across OS processes).
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- cluster [--runs N] [--quick]
//!     [--workers W] [--spares S] [--threads T] [--depth D] [--fanout F] [--grain-us G]
//!     [--seed S] [--knary-bin PATH] [--out DIR] [--quiet-wait SECS] [--retries N]
//!     [--timeout SECS]
//! ```
//!
//! Every run is one `knary cluster ... --json` process (README.md "Run a cluster"): it starts a
//! checkpoint server inside itself (on fjall, `--server-engine`'s default), a coordinator and `--workers` worker processes (plus
//! `--spares` idle spares) on loopback, runs the job, tears everything down and prints the
//! summary, whose `elapsed_s` (the job's time as the coordinator measures it, from its start
//! to the last member's report; process start-up and teardown excluded) is the time reported
//! here. Per repetition, in this order (interleaved, so that slow drifts hit all alike):
//!
//! - S0: `--no-checkpoint`, the members log nothing;
//! - S1: every task's events logged to the central checkpoint server, with group commit;
//! - S2: S1 plus `--kill-random 1 --seed S`: one worker is SIGKILLed when the coordinator's
//!   progress report first passes the fraction drawn from the seed ([`KILL_SEED`]: 49.8 % of
//!   the tasks), its connection resets, the coordinator moves its vnode to the spare at a new
//!   epoch and the spare rebuilds it from its log while the others go on.
//!
//! Every run's result is checked: the node count is right (`correct`), `tasks` equals
//! `knary::expected_tasks` (so no completed task ran twice: a task re-run after the failure
//! would count twice), S0 logs nothing, S1 and S2 log, and exactly the S2 runs lose one
//! worker. A repetition during which other processes (not this one, not its descendants) took
//! more than 0.05 CPU-s + 5 % of the machine's cores × the run's time is run again, up to
//! `--retries` times, as in `paper overhead`. Results: `cluster.json`, `cluster.md` and
//! `cluster.svg` (+ `cluster.png` when fonts are found: every run's time) in `--out` (`cluster-quick.*` with `--quick`).
//!
//! [`cluster_run`], [`Plan`] and [`ClusterRun`] are shared with [`crate::detector`],
//! [`crate::nqueens`] and [`crate::netns`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::{json, Value};

use crate::harness::{
    cpu_text, knary_binary, merge, plot, require_runs, CpuSnapshot, Disturbed, Figure, Guard,
    Plots, Quiet, Redo, Rounds, Series, Session, Stats, Timed, COLORS,
};
use crate::{Setting, Shape};

/// Options of `paper cluster`.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Repetitions of S0, S1, S2 (medians over them; at least 5 unless --quick).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// Worker processes that host the vnodes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Idle spare worker processes (the lost worker's vnode goes to one in S2); in every
    /// setting, so that S0, S1 and S2 start the same processes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub spares: u32,
    /// Threads of each worker (one vnode per thread).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: u32,
    /// Depth of the knary tree [default: 7; --quick: 5].
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=9))]
    pub depth: Option<u32>,
    /// Fanout of the knary tree.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..=10))]
    pub fanout: u32,
    /// Busy loop of every node, in µs (300 µs: a run of the default tree takes about 3 s on the
    /// 2-core machine).
    #[arg(long, default_value_t = DEFAULT_GRAIN_US,
          value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub grain_us: u64,
    /// The grain's clock (knary's KNARY_GRAIN_CLOCK): `wall`, or `cpu` (every node spins that
    /// much of its thread's CPU, so the cluster's CPU beyond the grains is the runtime's own;
    /// writes cluster-cpu.* instead).
    #[arg(long, default_value = "wall", value_parser = knary::GrainClock::parse)]
    pub grain_clock: knary::GrainClock,
    /// The job's seed, which also draws S2's kill (see `KILL_SEED`; another seed kills at
    /// another point, or the spare).
    #[arg(long, default_value_t = KILL_SEED)]
    pub seed: u64,
    /// Small tree and few runs: a smoke run (writes cluster-quick.* instead).
    #[arg(long)]
    pub quick: bool,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The `knary` binary [default: beside this binary, built first with `cargo build -p
    /// knary` in this binary's profile].
    #[arg(long, value_name = "PATH")]
    pub knary_bin: Option<PathBuf>,
    /// Before each repetition, wait up to this many seconds for other processes to use less
    /// than a quarter of a core (0: do not wait).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub quiet_wait: u64,
    /// Repetitions disturbed by other processes are run again at most this many times; past
    /// that they are kept and counted.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// A run taking longer than this is killed (with every process it started) and the
    /// command fails.
    #[arg(long, value_name = "SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
}

/// The default seed of the job, chosen for its kill: `knary cluster` draws its kills with
/// `veriflow::kill_draws` (a fraction of the expected tasks in [0.2, 0.7), then a victim among
/// the worker processes). Seed 109 draws 0.4977 and victim 3, a non-spare worker with 4 or 5
/// worker processes; no seed below 200 draws closer to 0.5 with a non-spare victim for both
/// (searched with rand 0.10; under rand 0.8 it was seed 82, whose victim is now the spare).
pub const KILL_SEED: u64 = 109;

/// The default tree: knary depth 7, fanout 5, serial 1 (19,531 nodes, 23,437 tasks: paper 001's
/// Fig. 6 shape, as `paper recovery`) at a 300 µs grain, about 3 s a run with four workers on
/// two cores. Coarser grains make S1/S0 and S2/S0 worse here, not better (bench/README.md).
pub(crate) const DEFAULT_DEPTH: u32 = 7;
pub(crate) const DEFAULT_GRAIN_US: u64 = 300;

/// Target of issues 6 and 17: S2/S0 on the medians.
const TARGET_S2_S0: f64 = 1.05;
/// Target of issue 17 (target 2): S1/S0 on the medians.
const TARGET_S1_S0: f64 = 1.03;
/// Target of issue 17 (target 2): the cluster's CPU for logging, per task, in µs (median CPU
/// of S1 minus that of S0, over the tasks).
const TARGET_LOG_CPU_US: f64 = 5.0;

/// The repetition of `paper cluster` and `paper detector`'s slowdown: rounds of every
/// setting, a disturbed round run again whole (harness rule 3), every core counted (a
/// cluster run uses them all).
pub(crate) fn rounds(runs: usize, quiet_wait: u64, retries: u32) -> Rounds {
    Rounds {
        runs,
        quiet: Quiet::secs(quiet_wait),
        retries,
        disturbed: Disturbed::cores(),
        redo: Redo::Round,
        label: String::new(),
    }
}

/// What `paper cluster` runs: the tree and the cluster's shape.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub(crate) shape: Shape,
    pub(crate) workers: u32,
    pub(crate) spares: u32,
    pub(crate) threads: u32,
    pub(crate) seed: u64,
    pub(crate) grain_clock: knary::GrainClock,
}

impl Plan {
    /// The `knary cluster` arguments of one run in `setting` (S2 adds the kill), with `extra`
    /// (failure-detector options) at the end.
    pub(crate) fn argv(&self, setting: Setting, extra: &[String]) -> Vec<String> {
        let s = self.shape;
        let mut v: Vec<String> = vec![
            "cluster".into(),
            format!("--workers={}", self.workers),
            format!("--spares={}", self.spares),
            format!("--threads={}", self.threads),
            format!("--depth={}", s.depth),
            format!("--fanout={}", s.fanout),
            format!("--serial={}", s.serial),
            format!("--grain-us={}", s.grain_us),
            format!("--seed={}", self.seed),
            "--json".into(),
        ];
        match setting {
            Setting::S0 => v.push("--no-checkpoint".into()),
            Setting::S1 => {}
            Setting::S2 => v.push("--kill-random=1".into()),
        }
        v.extend(extra.iter().cloned());
        v
    }

    /// The environment of every `knary cluster` run (its grain clock).
    pub(crate) fn env(&self) -> [(&'static str, &'static str); 1] {
        [(knary::GRAIN_CLOCK_ENV, self.grain_clock.name())]
    }

    /// The fraction of the tasks at which S2 kills, and the victim, unless it is a spare.
    fn kill_point(&self) -> Option<(f64, u32)> {
        let procs = self.workers + self.spares;
        let (at, victim) = *veriflow::kill_draws(self.seed, 1, procs).first()?;
        let victim = u32::try_from(victim).ok()?;
        (victim < self.workers).then_some((at, victim))
    }
}

/// What one `knary cluster --json` run reported, and what it cost the machine.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct ClusterRun {
    /// The job's time as the coordinator measures it.
    pub(crate) elapsed_s: f64,
    /// The whole command: start-up, job, teardown.
    pub(crate) wall_s: f64,
    pub(crate) tasks: u64,
    pub(crate) events: u64,
    pub(crate) steals: u64,
    /// Workers lost.
    pub(crate) failures: u64,
    pub(crate) recovered_tasks: u64,
    pub(crate) reused_tasks: u64,
    pub(crate) correct: bool,
    /// CPU seconds of this process's descendants (the cluster's processes) during the run.
    pub(crate) cpu_s: Option<f64>,
    /// CPU seconds other processes took during the run.
    pub(crate) foreign_cpu_s: Option<f64>,
}

impl Timed for ClusterRun {
    fn seconds(&self) -> f64 {
        self.elapsed_s
    }
    fn foreign_cpu_s(&self) -> Option<f64> {
        self.foreign_cpu_s
    }
}

impl ClusterRun {
    /// Fails unless the run is correct, ran every task exactly once, logged as `setting`
    /// says, and lost exactly the workers `setting` kills.
    pub(crate) fn check(&self, shape: Shape, setting: Setting) -> Result<()> {
        if !self.correct {
            bail!("{setting:?}: knary {shape:?} counted a wrong number of nodes");
        }
        let expected = shape.tasks()?;
        if self.tasks != expected {
            bail!(
                "{setting:?}: {} tasks completed, expected {expected}: a completed task ran \
                 twice, or one is missing",
                self.tasks
            );
        }
        if setting.logs() != (self.events > 0) {
            bail!("{setting:?}: {} events logged", self.events);
        }
        let lost = u64::from(setting == Setting::S2);
        if self.failures != lost {
            bail!(
                "{setting:?}: {} workers lost, expected {lost}",
                self.failures
            );
        }
        Ok(())
    }
}

/// Runs `knary <argv>` (a `cluster ... --json` command) with `env` added to its environment to
/// its end, at most `timeout`, and parses its summary. The command and every process it started
/// are killed on timeout.
pub(crate) fn cluster_run(
    knary: &Path,
    argv: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Result<ClusterRun> {
    let logs = tempfile::Builder::new()
        .prefix("veriflow-bench-cluster-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let out_path = logs.path().join("stdout");
    let err_path = logs.path().join("stderr");
    let stdout = std::fs::File::create(&out_path)
        .with_context(|| format!("cannot create {}", out_path.display()))?;
    let stderr = std::fs::File::create(&err_path)
        .with_context(|| format!("cannot create {}", err_path.display()))?;
    let mut cmd = Command::new(knary);
    cmd.args(argv)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    let before = CpuSnapshot::with_children();
    let t0 = Instant::now();
    let mut child = Guard::spawn(&mut cmd, true, "knary cluster")?;
    let status = child.wait_timeout(timeout)?;
    let wall_s = t0.elapsed().as_secs_f64();
    let (cpu_s, foreign_cpu_s) = CpuSnapshot::since(before);
    let err = || {
        std::fs::read_to_string(&err_path)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let Some(status) = status else {
        child.kill();
        bail!(
            "`knary {}` did not finish within {timeout:?} (killed with every process it \
             started); its stderr: {}",
            argv.join(" "),
            err()
        );
    };
    let text = std::fs::read_to_string(&out_path)
        .with_context(|| format!("cannot read {}", out_path.display()))?;
    if !status.success() {
        bail!(
            "`knary {}` failed ({status}); its stderr: {}; its stdout: {}",
            argv.join(" "),
            err(),
            text.trim()
        );
    }
    let v: Value = serde_json::from_str(text.trim()).with_context(|| {
        format!(
            "`knary {}` printed no JSON summary: {:?}",
            argv.join(" "),
            text.trim()
        )
    })?;
    let num = |k: &str| -> Result<u64> {
        v.get(k)
            .and_then(Value::as_u64)
            .with_context(|| format!("the summary has no integer {k:?}: {text}"))
    };
    Ok(ClusterRun {
        elapsed_s: v
            .get("elapsed_s")
            .and_then(Value::as_f64)
            .with_context(|| format!("the summary has no elapsed_s: {text}"))?,
        wall_s,
        tasks: num("tasks")?,
        events: num("events")?,
        steals: num("steals")?,
        failures: num("failures")?,
        recovered_tasks: num("recovered_tasks")?,
        reused_tasks: num("reused_tasks")?,
        correct: v.get("correct").and_then(Value::as_bool) == Some(true),
        cpu_s,
        foreign_cpu_s,
    })
}

/// Runs `paper cluster` (module docs) and writes its results.
pub fn run(args: &ClusterArgs) -> Result<()> {
    require_runs(args.runs, 5, args.quick)?;
    let session = Session::start(args.out.as_deref(), args.quick)?;
    let knary = knary_binary(args.knary_bin.as_deref())?;
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
        spares: args.spares,
        threads: args.threads,
        seed: args.seed,
        grain_clock: args.grain_clock,
    };
    let runs = if args.quick {
        args.runs.min(2)
    } else {
        args.runs
    } as usize;
    let timeout = Duration::from_secs(args.timeout);
    let tasks = plan.shape.tasks()?;
    eprintln!(
        "cluster: knary {:?} ({tasks} tasks) on {} workers x {} thread(s) + {} spare(s), {runs} \
         repetitions of S0, S1, S2; {}",
        plan.shape,
        plan.workers,
        plan.threads,
        plan.spares,
        match plan.kill_point() {
            Some((at, v)) => format!(
                "S2 kills worker {v} once {:.1} % of the tasks are done",
                at * 100.0
            ),
            None => format!(
                "S2 kills the spare at a point drawn from seed {} (use {KILL_SEED})",
                plan.seed
            ),
        }
    );
    // Warm-up (binary and libraries in the page cache): not counted.
    cluster_run(&knary, &plan.argv(Setting::S0, &[]), &plan.env(), timeout)?
        .check(plan.shape, Setting::S0)
        .context("warm-up run")?;

    let settings = [Setting::S0, Setting::S1, Setting::S2];
    let rounds = rounds(runs, args.quiet_wait, args.retries);
    let series = rounds.run(
        settings.len(),
        |_, i| {
            let r = cluster_run(&knary, &plan.argv(settings[i], &[]), &plan.env(), timeout)?;
            r.check(plan.shape, settings[i])?;
            Ok(r)
        },
        |i, r| {
            let mut s = format!("{:?} {:.3} s", settings[i], r.elapsed_s);
            if r.failures > 0 {
                let _ = write!(
                    s,
                    " ({} lost, {} restarted, {} reused)",
                    r.failures, r.recovered_tasks, r.reused_tasks
                );
            }
            s
        },
    )?;
    let report = Report {
        plan,
        runs,
        time: [series.stats(0)?, series.stats(1)?, series.stats(2)?],
        series,
        rounds,
    };
    let stem = session.stem(match plan.grain_clock {
        knary::GrainClock::Wall => "cluster",
        knary::GrainClock::Cpu => "cluster-cpu",
    });
    let plots = session.plot(&stem, &RunsFigure::of(&report));
    session.write(
        "cluster",
        &stem,
        report.json(&plots),
        &report.markdown(&plots),
    )
}

struct Report {
    plan: Plan,
    runs: usize,
    rounds: Rounds,
    /// Time statistics of S0, S1, S2 (`elapsed_s`).
    time: [Stats; 3],
    /// Kept runs of S0, S1, S2, and the disturbed rounds run again.
    series: Series<ClusterRun>,
}

impl Report {
    fn s1_s0(&self) -> f64 {
        self.time[1].median / self.time[0].median
    }

    fn s2_s0(&self) -> f64 {
        self.time[2].median / self.time[0].median
    }

    /// Median CPU of the cluster in setting `i`, when measured.
    fn cpu_median(&self, i: usize) -> Option<f64> {
        let v: Vec<f64> = self.series.kept[i].iter().filter_map(|r| r.cpu_s).collect();
        Stats::of(&v).map(|s| s.median)
    }

    /// The cluster's CPU for logging per task, in µs: median CPU of S1 minus that of S0.
    fn log_cpu_us_per_task(&self) -> Option<f64> {
        let tasks = self.plan.shape.tasks().ok()? as f64;
        Some((self.cpu_median(1)? - self.cpu_median(0)?) / tasks * 1e6)
    }

    /// (name, goal, measured, met) of every target of this table.
    fn targets(&self) -> Vec<(&'static str, String, Option<f64>, bool)> {
        let log = self.log_cpu_us_per_task();
        vec![
            (
                "ratio_s1_s0",
                format!("S1/S0 <= {TARGET_S1_S0}"),
                Some(self.s1_s0()),
                self.s1_s0() <= TARGET_S1_S0,
            ),
            (
                "ratio_s2_s0",
                format!("S2/S0 <= {TARGET_S2_S0}"),
                Some(self.s2_s0()),
                self.s2_s0() <= TARGET_S2_S0,
            ),
            (
                "log_cpu_us_per_task",
                format!(
                    "CPU of the cluster for logging (S1 - S0) <= {TARGET_LOG_CPU_US} µs per task"
                ),
                log,
                log.is_some_and(|l| l <= TARGET_LOG_CPU_US),
            ),
        ]
    }

    /// Median over the S2 runs of a counter.
    fn s2_median(&self, f: fn(&ClusterRun) -> u64) -> f64 {
        let v: Vec<f64> = self.series.kept[2].iter().map(|r| f(r) as f64).collect();
        Stats::of(&v).map_or(0.0, |s| s.median)
    }

    fn markdown(&self, plots: &Plots) -> String {
        let p = &self.plan;
        let s = p.shape;
        let mut md = String::new();
        let _ = writeln!(
            md,
            "knary depth {} fanout {} serial {} grain {} µs on the {} clock ({} nodes, {} \
             tasks) in cluster mode: `knary cluster` with {} worker process(es) × {} thread(s) (one vnode per \
             thread) and {} idle spare(s), a central checkpoint server (fjall), all on loopback; \
             median of {} repetitions (S0, S1, S2 interleaved); times are the job's \
             `elapsed_s` as the coordinator measures it (process start-up and teardown \
             excluded). S0 = `--no-checkpoint`; S1 = events logged to the checkpoint server; \
             S2 = S1 + `--kill-random 1 --seed {}`: {}; {} repetition(s) started on a busy \
             machine.\n",
            s.depth,
            s.fanout,
            s.serial,
            s.grain_us,
            match p.grain_clock {
                knary::GrainClock::Wall => "wall",
                knary::GrainClock::Cpu => "thread's CPU",
            },
            s.nodes().unwrap_or(0),
            s.tasks().unwrap_or(0),
            p.workers,
            p.threads,
            p.spares,
            self.runs,
            p.seed,
            match p.kill_point() {
                Some((at, v)) => format!(
                    "worker {v} SIGKILLed at the first progress report past {:.1} % of the \
                     tasks (reports come every 200 ms or more), its vnode moved to the spare \
                     and rebuilt from its log",
                    at * 100.0
                ),
                None => "one worker SIGKILLed at a point drawn from the seed".to_string(),
            },
            self.series.not_quiet,
        );
        md.push_str(
            "| setting | median (s) | min–max (s) | /S0 | whole command, median (s) | tasks | \
             events (median) | workers lost | CPU of the cluster (s) | other CPU, max (s) \
             |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for (i, name) in ["S0 (no log)", "S1 (log)", "S2 (log + 1 kill)"]
            .iter()
            .enumerate()
        {
            let runs = &self.series.kept[i];
            let t = &self.time[i];
            let med = |f: fn(&ClusterRun) -> f64| {
                Stats::of(&runs.iter().map(f).collect::<Vec<_>>()).map_or(0.0, |s| s.median)
            };
            let tasks: Vec<u64> = runs.iter().map(|r| r.tasks).collect();
            let tasks_text = if tasks.iter().all(|&t| Some(t) == tasks.first().copied()) {
                tasks.first().map_or_else(String::new, u64::to_string)
            } else {
                format!("{tasks:?}")
            };
            let cpu = Stats::of(&runs.iter().filter_map(|r| r.cpu_s).collect::<Vec<_>>())
                .map(|s| s.median);
            let other = runs.iter().filter_map(|r| r.foreign_cpu_s).reduce(f64::max);
            let _ = writeln!(
                md,
                "| {name} | {:.3} | {:.3}–{:.3} | {:.4} | {:.3} | {tasks_text} (all) | {:.0} | \
                 {} | {} | {} |",
                t.median,
                t.min,
                t.max,
                t.median / self.time[0].median,
                med(|r| r.wall_s),
                med(|r| r.events as f64),
                runs.iter().map(|r| r.failures).sum::<u64>(),
                cpu_text(cpu),
                cpu_text(other),
            );
        }
        let _ = writeln!(
            md,
            "\nS1/S0 = {:.4}, S2/S0 = {:.4} (on the medians). S2 runs: median {:.0} tasks \
             restarted by the recovery (in flight on the lost vnode) and {:.0} reused (completed \
             before the kill, not run again). Every run's result was right and completed exactly \
             {} tasks (= `knary::expected_tasks`: no completed task ran twice). {} disturbed \
             repetition(s) run again, {} kept.\n",
            self.s1_s0(),
            self.s2_s0(),
            self.s2_median(|r| r.recovered_tasks),
            self.s2_median(|r| r.reused_tasks),
            p.shape.tasks().unwrap_or(0),
            self.series.rerun,
            self.series.kept_disturbed,
        );
        let _ = writeln!(
            md,
            "CPU of the cluster for logging: {} µs per task (median CPU of S1 minus that of \
             S0, over the {} tasks). The workers outnumber the cores, so a run keeps every \
             core busy: CPU taken by logging (writers, checkpoint server) is CPU the compute \
             threads do not get, and shows as time. {}\n",
            self.log_cpu_us_per_task()
                .map_or_else(|| "unmeasured".to_string(), |l| format!("{l:.1}")),
            p.shape.tasks().unwrap_or(0),
            match p.grain_clock {
                knary::GrainClock::Wall => {
                    "The grain is a busy loop on the wall clock: a node preempted while it \
                     spins does less work, so CPU that logging takes from the spinning nodes \
                     does not show in this difference (`--grain-clock cpu` measures it)."
                }
                knary::GrainClock::Cpu => {
                    "The grain is a busy loop on the node thread's CPU clock: every node spins \
                     the same CPU in S0 and S1, so this difference is the log's CPU alone."
                }
            },
        );
        md.push_str("| target | measured | met |\n|---|---:|---|\n");
        for (_, goal, measured, met) in self.targets() {
            let _ = writeln!(
                md,
                "| {goal} | {} | {} |",
                measured.map_or_else(|| "unmeasured".to_string(), |m| format!("{m:.4}")),
                if met { "yes" } else { "**no**" }
            );
        }
        let _ = writeln!(md, "\nPlots: {}.", plots.markdown());
        md
    }

    fn json(&self, plots: &Plots) -> Value {
        let p = &self.plan;
        let setting = |i: usize| {
            let runs = &self.series.kept[i];
            json!({
                "elapsed_s": elapsed(runs),
                "median_s": self.time[i].median,
                "min_s": self.time[i].min,
                "max_s": self.time[i].max,
                "runs": runs,
            })
        };
        let parameters = json!({
                "runs": self.runs,
                "tree": p.shape,
                "nodes": p.shape.nodes().ok(),
                "tasks": p.shape.tasks().ok(),
                "workers": p.workers,
                "spares": p.spares,
                "threads_per_worker": p.threads,
                "seed": p.seed,
                "grain_clock": p.grain_clock.name(),
                "kill": p.kill_point().map(|(at, v)| json!({
                    "fraction_of_tasks": at,
                    "victim_worker_index": v,
                    "how": "knary cluster --kill-random 1: SIGKILL at the first progress \
                            report (every >= 200 ms) past the fraction",
                })),
                "store": "central checkpoint server (in the knary cluster process), fjall",
                "timing": "elapsed_s of the knary cluster --json summary: the job's time as \
                           the coordinator measures it",
                "order": "S0, S1, S2, S0, S1, S2, ... (interleaved)",
                "argv": {
                    "s0": p.argv(Setting::S0, &[]),
                    "s1": p.argv(Setting::S1, &[]),
                    "s2": p.argv(Setting::S2, &[]),
                },
        });
        json!({
            "repetitions_started_on_a_busy_machine": self.series.not_quiet,
            "parameters": merge(parameters, self.rounds.parameters()),
            "s0": setting(0),
            "s1": setting(1),
            "s2": setting(2),
            "ratio_s1_s0": self.s1_s0(),
            "ratio_s2_s0": self.s2_s0(),
            "s2_recovered_tasks_median": self.s2_median(|r| r.recovered_tasks),
            "s2_reused_tasks_median": self.s2_median(|r| r.reused_tasks),
            "checks": "every run: correct result, tasks == knary::expected_tasks, S0 logs \
                       nothing, S1/S2 log, S2 loses exactly one worker and S0/S1 none",
            "discarded_disturbed_repetitions": self.series.discarded_rounds(),
            "kept_disturbed_repetitions": self.series.kept_disturbed,
            "plots": plots.json(),
            "log_cpu_us_per_task": self.log_cpu_us_per_task(),
            "targets": self.targets().into_iter().map(|(name, goal, measured, met)| json!({
                "name": name,
                "goal": goal,
                "measured": measured,
                "met": met,
            })).collect::<Vec<_>>(),
        })
    }
}

fn elapsed(runs: &[ClusterRun]) -> Vec<f64> {
    runs.iter().map(|r| r.elapsed_s).collect()
}

/// What `cluster.png` shows: every run's time per setting, and the medians.
pub(crate) struct RunsFigure {
    caption: String,
    /// Per setting: its label and every kept run's time (s).
    settings: Vec<(String, Vec<f64>)>,
}

const SETTING_LABELS: [&str; 3] = ["S0 (no log)", "S1 (log)", "S2 (log + 1 kill)"];

impl RunsFigure {
    fn caption(depth: u64, fanout: u64, grain_us: u64, workers: u64) -> String {
        format!(
            "knary d{depth} k{fanout} {grain_us} µs in cluster mode, {workers} workers: runs \
             (dots), medians (bars)"
        )
    }

    fn of(r: &Report) -> RunsFigure {
        let s = r.plan.shape;
        RunsFigure {
            caption: Self::caption(
                u64::from(s.depth),
                u64::from(s.fanout),
                s.grain_us,
                u64::from(r.plan.workers),
            ),
            settings: SETTING_LABELS
                .iter()
                .zip(&r.series.kept)
                .map(|(l, runs)| (l.to_string(), elapsed(runs)))
                .collect(),
        }
    }

    /// The figure of a `cluster.json` (`paper replot`).
    pub(crate) fn from_json(j: &Value) -> Result<RunsFigure> {
        let p = &j["parameters"];
        let num = |v: &Value, what: &str| v.as_u64().with_context(|| format!("no {what}"));
        let tree = &p["tree"];
        let caption = Self::caption(
            num(&tree["depth"], "parameters.tree.depth")?,
            num(&tree["fanout"], "parameters.tree.fanout")?,
            num(&tree["grain_us"], "parameters.tree.grain_us")?,
            num(&p["workers"], "parameters.workers")?,
        );
        let settings = ["s0", "s1", "s2"]
            .iter()
            .zip(SETTING_LABELS)
            .map(|(k, l)| {
                let runs = j[*k]["elapsed_s"]
                    .as_array()
                    .with_context(|| format!("no {k}.elapsed_s"))?
                    .iter()
                    .filter_map(Value::as_f64)
                    .collect();
                Ok((l.to_string(), runs))
            })
            .collect::<Result<_>>()?;
        Ok(RunsFigure { caption, settings })
    }
}

/// Every run's time per setting (dots), with the medians (bars). The time axis starts at 0, so
/// that the bars' heights compare as ratios (issue 18 point 8: a truncated axis made a 9 %
/// difference look like a factor of 3).
impl Figure for RunsFigure {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String> {
        let f = self;

        let top = f
            .settings
            .iter()
            .flat_map(|(_, r)| r.iter().copied())
            .fold(0.0, f64::max)
            * 1.1;
        let top = if top > 0.0 { top } else { 1.0 };
        root.fill(&WHITE).map_err(plot::err)?;
        let n = f.settings.len().max(1);
        let mut chart = ChartBuilder::on(&root)
            .caption(&f.caption, ("sans-serif", 20))
            .margin(15)
            .margin_left(20)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..n as f64, 0.0..top)
            .map_err(plot::err)?;
        let labels: Vec<&str> = f.settings.iter().map(|(l, _)| l.as_str()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * n + 1)
            .x_label_formatter(&|x: &f64| {
                let i = x.floor();
                if (x - i - 0.5).abs() < 1e-6 && i >= 0.0 {
                    labels
                        .get(i as usize)
                        .map_or_else(String::new, |s| s.to_string())
                } else {
                    String::new()
                }
            })
            .x_label_style(("sans-serif", 15))
            .y_label_style(("sans-serif", 14))
            .y_desc("job time (s)")
            .axis_desc_style(("sans-serif", 16))
            .draw()
            .map_err(plot::err)?;
        for (i, (_, runs)) in f.settings.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let k = runs.len().max(1) as f64;
            chart
                .draw_series(runs.iter().enumerate().map(|(j, &x)| {
                    let pos = i as f64 + 0.25 + 0.5 * (j as f64 + 0.5) / k;
                    Circle::new((pos, x), 5, c.filled())
                }))
                .map_err(plot::err)?;
            let m = Stats::of(runs).map_or(f64::NAN, |s| s.median);
            chart
                .draw_series(LineSeries::new(
                    [(i as f64 + 0.15, m), (i as f64 + 0.85, m)],
                    c.stroke_width(3),
                ))
                .map_err(plot::err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("{m:.2} s"),
                    (i as f64 + 0.4, m + top * 0.04),
                    ("sans-serif", 15).into_font().color(&c),
                )))
                .map_err(plot::err)?;
        }
        root.present().map_err(plot::err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            shape: Shape {
                depth: 3,
                fanout: 3,
                serial: 1,
                grain_us: 0,
            },
            workers: 4,
            spares: 1,
            threads: 1,
            seed: KILL_SEED,
            grain_clock: knary::GrainClock::Wall,
        }
    }

    #[test]
    fn argv_per_setting() {
        let p = plan();
        let s0 = p.argv(Setting::S0, &[]);
        assert!(s0.contains(&"--no-checkpoint".to_string()));
        assert!(!s0.iter().any(|a| a.starts_with("--kill-random")));
        let s2 = p.argv(Setting::S2, &["--fd-k=2".to_string()]);
        assert!(s2.contains(&"--kill-random=1".to_string()));
        assert!(!s2.contains(&"--no-checkpoint".to_string()));
        assert_eq!(s2.last().map(String::as_str), Some("--fd-k=2"));
        let (at, victim) = p.kill_point().expect("KILL_SEED kills a non-spare worker");
        assert!((at - 0.4977).abs() < 5e-5, "{at}");
        assert_eq!(victim, 3);
        let four = Plan { spares: 0, ..p };
        assert_eq!(four.kill_point(), Some((at, victim)));
        // Seed 82 (rand 0.8's choice) now draws the spare: no kill point to state.
        let other = Plan { seed: 82, ..p };
        assert_eq!(other.kill_point(), None);
        assert_eq!(p.env(), [("KNARY_GRAIN_CLOCK", "wall")]);
        let cpu = Plan {
            grain_clock: knary::GrainClock::Cpu,
            ..p
        };
        assert_eq!(cpu.env(), [("KNARY_GRAIN_CLOCK", "cpu")]);
    }

    #[test]
    fn checks_catch_a_task_run_twice_and_a_missing_kill() {
        let p = plan();
        let tasks = p.shape.tasks().unwrap();
        let ok = ClusterRun {
            elapsed_s: 1.0,
            wall_s: 1.5,
            tasks,
            events: 10,
            steals: 0,
            failures: 1,
            recovered_tasks: 1,
            reused_tasks: 1,
            correct: true,
            cpu_s: None,
            foreign_cpu_s: None,
        };
        ok.check(p.shape, Setting::S2).unwrap();
        assert!(ok.check(p.shape, Setting::S1).is_err());
        let twice = ClusterRun {
            tasks: tasks + 1,
            ..ok.clone()
        };
        assert!(twice.check(p.shape, Setting::S2).is_err());
        let logged = ClusterRun {
            failures: 0,
            ..ok.clone()
        };
        assert!(logged.check(p.shape, Setting::S0).is_err());
        logged.check(p.shape, Setting::S1).unwrap();
    }
}

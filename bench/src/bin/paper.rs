//! `paper`: the measurements of the paper, one subcommand each.
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- overhead [--runs N] [--threads T]
//!     [--quick] [--out DIR] [--scratch DIR]
//! ```
//!
//! `overhead` runs knary at grains 0, 10 µs, 100 µs and 1 ms in S0 (no log) and S1 (durable
//! log), interleaved S0, S1, S0, S1, ... so that noise hits both alike, then the empty-task
//! throughput of a big tree against rayon's `scope.spawn`. It prints a table and writes
//! `overhead.json` (every raw time, medians, ratios, targets) and `overhead.md` in `--out`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use veriflow_bench::{
    rayon_tree, run_knary, wait_for_quiet, KnaryRun, RayonRun, Setting, Shape, Stats,
};

/// Grains of the overhead series, in µs.
const GRAINS_US: [u64; 4] = [0, 10, 100, 1000];

/// Targets of the issue on this machine.
const TARGET_TASKS_PER_S: f64 = 1_000_000.0;
const TARGET_US_PER_TASK: f64 = 5.0;
const TARGET_RATIO_1MS: f64 = 1.01;
const TARGET_RATIO_100US: f64 = 1.05;

#[derive(Parser, Debug)]
#[command(name = "paper", about = "veriflow's paper measurements")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Cost of the durable log (S1 against S0) on knary, and empty-task throughput vs rayon.
    Overhead(OverheadArgs),
}

#[derive(Args, Debug)]
struct OverheadArgs {
    /// Runs per setting and grain (medians are taken over them; at least 5 unless --quick).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// Worker threads of veriflow and of the rayon pool.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: u32,
    /// Small trees, for a smoke run (writes overhead-quick.json/.md instead).
    #[arg(long)]
    quick: bool,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Where the S1 runs' fresh log directories go [default: the system's temp directory].
    #[arg(long, value_name = "DIR")]
    scratch: Option<PathBuf>,
    /// Before each S0/S1 pair, wait up to this many seconds for other processes to use less
    /// than a quarter of a core (0: do not wait). The machine is shared: a concurrent build
    /// takes half of its 2 cores.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    quiet_wait: u64,
    /// Pairs of runs that other processes disturbed (see `DISTURBED_SHARE`) are discarded and
    /// run again, at most this many times per grain (and for the throughput comparison); past
    /// that, disturbed pairs are kept and counted.
    #[arg(long, default_value_t = 3)]
    retries: u32,
}

/// Other processes may use up to this many cores before a pair of runs starts.
const QUIET_CORES: f64 = 0.25;

/// A run is disturbed when other processes took more than 0.05 CPU-s plus this share of the
/// CPU time the run's threads could use; its pair is then run again (up to `--retries`).
const DISTURBED_SHARE: f64 = 0.05;

fn disturbed(foreign_cpu_s: Option<f64>, elapsed: Duration, threads: usize) -> bool {
    foreign_cpu_s
        .is_some_and(|f| f > 0.05 + DISTURBED_SHARE * threads as f64 * elapsed.as_secs_f64())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Overhead(args) => overhead(&args),
    }
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

fn cpu_text(s: Option<f64>) -> String {
    s.map_or_else(|| "?".to_string(), |s| format!("{s:.2}"))
}

fn stats(values: &[f64]) -> Result<Stats> {
    Stats::of(values).context("no runs")
}

fn overhead(args: &OverheadArgs) -> Result<()> {
    if args.runs < 5 && !args.quick {
        bail!("--runs must be at least 5 (medians of >= 5 runs); use --quick for a smoke run");
    }
    let runs = args.runs as usize;
    let threads = args.threads as usize;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("results"));
    let scratch = args.scratch.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&scratch)
        .with_context(|| format!("cannot create the scratch directory {}", scratch.display()))?;
    std::fs::create_dir_all(&out)
        .with_context(|| format!("cannot create the output directory {}", out.display()))?;
    let plan = Plan::new(args.quick);
    let started = Instant::now();
    let mut not_quiet = 0u32;
    let mut quiet = || {
        if args.quiet_wait > 0 && !wait_for_quiet(Duration::from_secs(args.quiet_wait), QUIET_CORES)
        {
            not_quiet += 1;
            eprintln!(
                "  (machine still busy after {} s: running anyway)",
                args.quiet_wait
            );
        }
    };
    let date = utc_now();
    let load_before = loadavg();
    // Before the runs: the commit measured is the one checked out now.
    let machine = machine();

    eprintln!(
        "overhead: {runs} runs per setting, {threads} threads, grain tree {:?} ({} tasks), \
         big tree {:?} ({} tasks), logs in {}",
        plan.grain_tree,
        plan.grain(0).tasks()?,
        plan.big_tree,
        plan.big().tasks()?,
        scratch.display()
    );

    // Warm up (page cache, allocator, sled's first files): not counted.
    run_knary(plan.grain(0), Setting::S0, threads, &scratch)?;
    run_knary(plan.grain(0), Setting::S1, threads, &scratch)?;

    let mut grains = Vec::new();
    for grain_us in GRAINS_US {
        let shape = plan.grain(grain_us);
        let mut g = GrainRuns {
            shape,
            s0: Vec::new(),
            s1: Vec::new(),
            discarded: Vec::new(),
            kept_disturbed: 0,
        };
        let mut retries = args.retries;
        while g.s0.len() < runs {
            quiet();
            let s0 = run_knary(shape, Setting::S0, threads, &scratch)?;
            let s1 = run_knary(shape, Setting::S1, threads, &scratch)?;
            let bad = disturbed(s0.foreign_cpu_s, s0.elapsed, threads)
                || disturbed(s1.foreign_cpu_s, s1.elapsed, threads);
            eprintln!(
                "  grain {grain_us:>4} µs run {}/{runs}: S0 {:.4} s, S1 {:.4} s ({} events); \
                 other processes' CPU {} s / {} s{}",
                g.s0.len() + 1,
                s0.elapsed.as_secs_f64(),
                s1.elapsed.as_secs_f64(),
                s1.events,
                cpu_text(s0.foreign_cpu_s),
                cpu_text(s1.foreign_cpu_s),
                match (bad, retries > 0) {
                    (false, _) => "",
                    (true, true) => " -- disturbed, run again",
                    (true, false) => " -- disturbed, kept (no retry left)",
                }
            );
            if bad && retries > 0 {
                retries -= 1;
                g.discarded.push((s0, s1));
                continue;
            }
            g.kept_disturbed += u32::from(bad);
            g.s0.push(s0);
            g.s1.push(s1);
        }
        grains.push(g);
    }

    let big = plan.big();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("cannot start the rayon pool")?;
    let nodes = big.nodes()?;
    // Warm up both.
    run_knary(big, Setting::S0, threads, &scratch)?;
    let warm = rayon_tree(&pool, big).nodes;
    if warm != nodes {
        bail!("rayon counted {warm} nodes, expected {nodes}");
    }
    let mut tp = ThroughputRuns {
        shape: big,
        s0: Vec::new(),
        s1: Vec::new(),
        rayon: Vec::new(),
        discarded: Vec::new(),
        kept_disturbed: 0,
    };
    let mut retries = args.retries;
    while tp.s0.len() < runs {
        quiet();
        let s0 = run_knary(big, Setting::S0, threads, &scratch)?;
        let r = rayon_tree(&pool, big);
        if r.nodes != nodes {
            bail!("rayon counted {} nodes, expected {nodes}", r.nodes);
        }
        let s1 = run_knary(big, Setting::S1, threads, &scratch)?;
        let bad = disturbed(s0.foreign_cpu_s, s0.elapsed, threads)
            || disturbed(r.foreign_cpu_s, r.elapsed, threads)
            || disturbed(s1.foreign_cpu_s, s1.elapsed, threads);
        eprintln!(
            "  empty tasks run {}/{runs}: veriflow S0 {:.4} s, rayon {:.4} s, veriflow S1 {:.4} s{}",
            tp.s0.len() + 1,
            s0.elapsed.as_secs_f64(),
            r.elapsed.as_secs_f64(),
            s1.elapsed.as_secs_f64(),
            match (bad, retries > 0) {
                (false, _) => "",
                (true, true) => " -- disturbed, run again",
                (true, false) => " -- disturbed, kept (no retry left)",
            }
        );
        if bad && retries > 0 {
            retries -= 1;
            tp.discarded.push((s0, r, s1));
            continue;
        }
        tp.kept_disturbed += u32::from(bad);
        tp.s0.push(s0);
        tp.rayon.push(r);
        tp.s1.push(s1);
    }
    let total = started.elapsed();
    let load = [load_before, loadavg()];

    let measured = Measured {
        machine,
        grains,
        throughput: tp,
        total,
        date,
        load,
        not_quiet,
    };
    let report = Report::new(args, &plan, measured)?;
    let md = report.markdown();
    let json = report.json();
    let (json_name, md_name) = if args.quick {
        ("overhead-quick.json", "overhead-quick.md")
    } else {
        ("overhead.json", "overhead.md")
    };
    let json_path = out.join(json_name);
    let md_path = out.join(md_name);
    let text = serde_json::to_string_pretty(&json).context("encoding the results")?;
    std::fs::write(&json_path, text + "\n")
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    std::fs::write(&md_path, &md).with_context(|| format!("cannot write {}", md_path.display()))?;
    println!("{md}");
    println!("written: {} and {}", json_path.display(), md_path.display());
    Ok(())
}

/// Everything one invocation measured, raw.
struct Measured {
    machine: Machine,
    grains: Vec<GrainRuns>,
    throughput: ThroughputRuns,
    total: Duration,
    date: String,
    /// `/proc/loadavg` before and after.
    load: [Option<String>; 2],
    /// Pairs of runs that started although the machine was not quiet.
    not_quiet: u32,
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
    runs: usize,
    threads: usize,
    quick: bool,
    date: String,
    total: Duration,
    /// `/proc/loadavg` before and after: other work on the machine skews the times.
    load: [Option<String>; 2],
    /// Pairs of runs that started although the machine was not quiet.
    not_quiet: u32,
    quiet_wait: u64,
    retries: u32,
    machine: Machine,
    grain_tree: Shape,
    grains: Vec<GrainSummary>,
    throughput: ThroughputSummary,
    targets: Vec<Target>,
}

impl Report {
    fn new(args: &OverheadArgs, plan: &Plan, measured: Measured) -> Result<Report> {
        let Measured {
            machine,
            grains,
            throughput: tp,
            total,
            date,
            load,
            not_quiet,
        } = measured;
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

        let mut targets = vec![Target {
            name: "empty_tasks_per_s".to_string(),
            goal: format!(">= {TARGET_TASKS_PER_S:.0} empty tasks/s without checkpoint"),
            measured: throughput.s0_tasks_per_s(),
            unit: "tasks/s",
            met: throughput.s0_tasks_per_s() >= TARGET_TASKS_PER_S,
        }];
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
            runs: args.runs as usize,
            threads: args.threads as usize,
            quick: args.quick,
            date,
            total,
            load,
            not_quiet,
            quiet_wait: args.quiet_wait,
            machine,
            retries: args.retries,
            grain_tree: plan.grain(0),
            grains: summaries,
            throughput,
            targets,
        })
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        let t = &self.grain_tree;
        let m = &self.machine;
        let _ = writeln!(
            s,
            "Measured {} at commit {} on {} ({} cores available), {} threads, median of {} \
             runs per setting{}; whole command {:.0} s; load average before/after: {} / {}.\n",
            self.date,
            m.git
                .as_deref()
                .map_or_else(|| "?".to_string(), short_commit),
            m.cpu.as_deref().unwrap_or("unknown CPU"),
            m.cores,
            self.threads,
            self.runs,
            if self.quick {
                " (--quick: small trees, not the real measurement)"
            } else {
                ""
            },
            self.total.as_secs_f64(),
            self.load[0].as_deref().unwrap_or("?"),
            self.load[1].as_deref().unwrap_or("?"),
        );
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
            self.not_quiet,
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
        let _ = writeln!(
            s,
            "| veriflow S0 (no log) | {:.4} | {:.4}–{:.4} | {} | {} |",
            tp.s0.median,
            tp.s0.min,
            tp.s0.max,
            thousands(tp.s0_tasks_per_s()),
            thousands(tp.s0_nodes_per_s())
        );
        let _ = writeln!(
            s,
            "| veriflow S1 (durable log) | {:.4} | {:.4}–{:.4} | {} | {} |",
            tp.s1.median,
            tp.s1.min,
            tp.s1.max,
            thousands(tp.s1_tasks_per_s()),
            thousands(tp.s1_nodes_per_s())
        );
        let _ = writeln!(
            s,
            "| rayon `scope.spawn` | {:.4} | {:.4}–{:.4} | {} | {} |",
            tp.rayon.median,
            tp.rayon.min,
            tp.rayon.max,
            thousands(tp.rayon_nodes_per_s()),
            thousands(tp.rayon_nodes_per_s())
        );
        let _ = writeln!(
            s,
            "\nveriflow S0 / rayon, nodes/s: {:.3} (rayon is {:.1}x faster per node); {} \
             disturbed triple(s) run again, {} kept.\n",
            tp.s0_nodes_per_s() / tp.rayon_nodes_per_s(),
            tp.rayon_nodes_per_s() / tp.s0_nodes_per_s(),
            tp.runs.discarded.len(),
            tp.runs.kept_disturbed,
        );
        s.push_str("| target | measured | met |\n|---|---:|---|\n");
        for t in &self.targets {
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

    fn json(&self) -> Value {
        let m = &self.machine;
        let grains: Vec<Value> = self
            .grains
            .iter()
            .map(|g| {
                json!({
                    "grain_us": g.runs.shape.grain_us,
                    "shape": g.runs.shape,
                    "nodes": g.runs.shape.nodes().ok(),
                    "tasks": g.runs.shape.tasks().ok(),
                    "s0": {
                        "seconds": secs(&g.runs.s0),
                        "tasks": g.runs.s0.iter().map(|r| r.tasks).collect::<Vec<_>>(),
                        "steals": g.runs.s0.iter().map(|r| r.steals).collect::<Vec<_>>(),
                        "other_processes_cpu_s": foreign(&g.runs.s0),
                        "cpu_s": cpu(&g.runs.s0),
                        "median_s": g.s0.median, "min_s": g.s0.min, "max_s": g.s0.max,
                    },
                    "s1": {
                        "seconds": secs(&g.runs.s1),
                        "tasks": g.runs.s1.iter().map(|r| r.tasks).collect::<Vec<_>>(),
                        "steals": g.runs.s1.iter().map(|r| r.steals).collect::<Vec<_>>(),
                        "other_processes_cpu_s": foreign(&g.runs.s1),
                        "cpu_s": cpu(&g.runs.s1),
                        "events": g.runs.s1.iter().map(|r| r.events).collect::<Vec<_>>(),
                        "median_s": g.s1.median, "min_s": g.s1.min, "max_s": g.s1.max,
                    },
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
        let targets: Vec<Value> = self
            .targets
            .iter()
            .map(|t| {
                json!({
                    "name": t.name, "goal": t.goal, "measured": t.measured, "unit": t.unit,
                    "met": t.met,
                })
            })
            .collect();
        json!({
            "benchmark": "overhead",
            "date_utc": self.date,
            "quick": self.quick,
            "machine": {
                "cores": m.cores,
                "cpu_model": m.cpu,
                "os": std::env::consts::OS,
                "arch": std::env::consts::ARCH,
                "kernel": m.kernel,
                "rustc": m.rustc,
                "git_commit": m.git,
            },
            "parameters": {
                "runs": self.runs,
                "threads": self.threads,
                "grains_us": GRAINS_US,
                "grain_tree": self.grain_tree,
                "throughput_tree": tp.runs.shape,
                "order": "per grain: S0, S1, S0, S1, ... (interleaved); throughput: S0, rayon, S1, ...",
                "timing": "RunReport::elapsed (from the root's declaration until every event is \
                           durable; runtime build and store open excluded); rayon: wall time of \
                           pool.install",
                "quiet_wait_s": self.quiet_wait,
                "quiet_cores": QUIET_CORES,
                "retries": self.retries,
                "disturbed": format!("a run whose other processes took more than 0.05 CPU-s + \
                                      {DISTURBED_SHARE} x threads x its wall time"),
                "store": "fresh SledStore in a new temporary directory per S1 run, default \
                          CommitPolicy (64 KiB / 5 ms)",
            },
            "total_seconds": self.total.as_secs_f64(),
            "pairs_started_on_a_busy_machine": self.not_quiet,
            "loadavg_before": self.load[0],
            "loadavg_after": self.load[1],
            "grains": grains,
            "empty_task_throughput": throughput,
            "targets": targets,
        })
    }
}

fn grain_text(us: u64) -> String {
    match us {
        0 => "0".to_string(),
        us if us >= 1000 && us % 1000 == 0 => format!("{} ms", us / 1000),
        us => format!("{us} µs"),
    }
}

/// `1234567.8` as `1,234,568`.
fn thousands(x: f64) -> String {
    let n = x.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `abcdef0123` (the first 10 hex digits), keeping a ` (dirty)` mark.
fn short_commit(git: &str) -> String {
    let (hash, rest) = git.split_at(git.find(' ').unwrap_or(git.len()));
    format!("{}{rest}", hash.get(..10).unwrap_or(hash))
}

/// What we know of the machine.
struct Machine {
    cores: usize,
    cpu: Option<String>,
    kernel: Option<String>,
    rustc: Option<String>,
    /// `git rev-parse HEAD` of the workspace, with ` (dirty)` when tracked files differ.
    git: Option<String>,
}

fn machine() -> Machine {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string());
    let rustc =
        std::process::Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let git_out = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let git = git_out(&["rev-parse", "HEAD"]).map(|head| {
        match git_out(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if changes.is_empty() => head,
            Some(_) => format!("{head} (dirty)"),
            None => head,
        }
    });
    Machine {
        git,
        cores,
        cpu,
        kernel,
        rustc,
    }
}

/// The 1, 5 and 15 minute load averages, if readable.
fn loadavg() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The current time in UTC, `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

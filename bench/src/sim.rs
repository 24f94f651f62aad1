//! `paper sim`: the cluster simulator over many seeds, and the failure detector's heartbeats at
//! 10,000 processes (issue 14, point 4).
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- sim --seeds N [--first S]
//!     [--threads T] [--out DIR]
//! cargo run --release -p veriflow-bench --bin paper -- sim --nodes N [--k K] [--dial D]
//!     [--seconds S] [--kill-fraction F] [--params paper|cluster|both] [--seed S] [--out DIR]
//! ```
//!
//! **`--seeds N`** runs `veriflow_cluster::sim::run(&SimConfig::from_seed(s))` for s in
//! S..S+N on `--threads` threads (seeds are independent; results are kept in seed order), and writes `sim.json` and `sim.md`: seeds run, the failures with the line that
//! replays each (from [`SimFailure`]'s message; a panic is caught and reported the same way),
//! faults injected per kind (totals, and min/median/max per seed), invariants checked,
//! simulated time, wall time, seeds per second, the machine; `sim.json` also holds one row per
//! seed (its trace hash among them, so that two runs can be compared seed by seed). A failing
//! seed does not stop the others, and the command still writes its report, then fails.
//!
//! **`--nodes N`** simulates N processes, each a real `Detector`, exchanging heartbeats on
//! simulated time ([`nodes`] states the model), once with paper 004's parameters and once with
//! the cluster command's defaults (`--params`), kills `--kill-fraction` of them, and writes
//! `sim_nodes.json` and `sim_nodes.md`: heartbeats per process per second (mean, max), the
//! detection time of the victims (min/median/p99/max, never detected), false verdicts, and the
//! wall time and peak memory of the command. It fails if a live process was accused, a
//! process was watched by fewer than k, or a victim was never found.

pub mod nodes;

use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use veriflow::cluster::sim::{self, FaultCounts, SimConfig, SimFailure, SimOutcome};
use veriflow::runtime::detect::FdParams;

use crate::harness::{merge, peak_rss_mib, write_files, Session, Stats};
use nodes::{NodesConfig, NodesOutcome, Summary};

/// Options of `paper sim`.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["seeds", "nodes"])))]
pub struct SimArgs {
    /// Run the cluster simulator on this many seeds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub seeds: Option<u64>,
    /// The first seed [default: 0].
    #[arg(long, requires = "seeds")]
    pub first: Option<u64>,
    /// Threads running seeds [default: the cores available].
    #[arg(long, requires = "seeds", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,
    /// Simulate the heartbeats of this many processes.
    #[arg(long, value_parser = clap::value_parser!(u32).range(3..=10_000_000))]
    pub nodes: Option<u32>,
    /// Monitors per process, k, in every parameter set [default: each set's own: paper 004's
    /// 2, the cluster's 3].
    #[arg(long, requires = "nodes", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub k: Option<u32>,
    /// Connections each process opens (it has these plus those others open to it)
    /// [default: k + 2].
    #[arg(long, requires = "nodes", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub dial: Option<u32>,
    /// Simulated seconds over which heartbeats are counted, after the warm-up and before the
    /// kill [default: max(2 T_insurance, 50 T_interval) of each set].
    #[arg(long, requires = "nodes")]
    pub seconds: Option<f64>,
    /// Share of the processes killed (silently) after the counting window [default: 0.01].
    #[arg(long, requires = "nodes")]
    pub kill_fraction: Option<f64>,
    /// Parameter sets to simulate [default: both].
    #[arg(long, value_enum, requires = "nodes")]
    pub params: Option<ParamSet>,
    /// Seed of the node simulation (connections, starts, delays, victims) [default: 1].
    #[arg(long, requires = "nodes")]
    pub seed: Option<u64>,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Which detector parameters `--nodes` simulates.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamSet {
    /// Paper 004 Table 1: k = 2, T_interval 5 s, T_timeout 5 s, T_insurance 200 s, T_broken 5 s.
    Paper,
    /// The cluster command's defaults: k = 3, 200 ms, 400 ms, 1 s, 400 ms.
    Cluster,
    /// Both, paper first.
    Both,
}

/// Runs `paper sim`.
pub fn run(args: &SimArgs) -> Result<()> {
    if args.seeds.is_some() == args.nodes.is_some() {
        bail!("paper sim: give either --seeds N or --nodes N");
    }
    let session = Session::start(args.out.as_deref(), false)?;
    match (args.seeds, args.nodes) {
        (Some(n), None) => seeds_command(args, n, &session),
        (None, Some(n)) => nodes_command(args, n, &session),
        _ => bail!("paper sim: give either --seeds N or --nodes N"),
    }
}

// ---------------------------------------------------------------------------------------------
// Part 1: seeds of the cluster simulator.

/// One seed's run.
#[derive(Debug)]
pub struct SeedRun {
    /// The seed.
    pub seed: u64,
    /// Wall time of `sim::run`.
    pub wall: Duration,
    /// What it did, or why it failed.
    pub result: Result<SimOutcome, SimFailure>,
}

/// Runs seeds `first..first + count` on `threads` threads, in seed order.
///
/// Plain threads taking the next seed from a counter, not rayon: a seed builds runtimes whose
/// own rayon pools are entered with `install`, and a rayon worker waiting there steals other
/// seeds' jobs onto its stack, nesting seeds inside each other (and their wall times).
pub fn run_seeds(first: u64, count: u64, threads: usize) -> Result<Vec<SeedRun>> {
    let count = usize::try_from(count).context("too many seeds for this machine")?;
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let started = Instant::now();
    let step = (count / 100).max(1);
    let worker = || {
        let mut mine = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= count {
                return mine;
            }
            let seed = first.wrapping_add(u64::try_from(i).unwrap_or(u64::MAX));
            let run = run_seed(seed);
            if let Err(e) = &run.result {
                eprintln!("  FAILED {e}");
            }
            mine.push((i, run));
            let d = done.fetch_add(1, Ordering::Relaxed) + 1;
            if d.is_multiple_of(step) || d == count {
                let s = started.elapsed().as_secs_f64();
                eprintln!(
                    "  {d}/{count} seeds, {s:.0} s, {:.1} seeds/s",
                    d as f64 / s.max(1e-9)
                );
            }
        }
    };
    let mut runs: Vec<(usize, SeedRun)> = std::thread::scope(|scope| {
        let handles = (0..threads.max(1))
            .map(|t| {
                std::thread::Builder::new()
                    .name(format!("sim-{t}"))
                    // As the main thread's: a seed runs a whole cluster on this stack.
                    .stack_size(8 << 20)
                    .spawn_scoped(scope, worker)
                    .context("starting a seed thread")
            })
            .collect::<Result<Vec<_>>>()?;
        let mut all = Vec::with_capacity(count);
        for h in handles {
            // run_seed catches the seeds' panics: one here is a bug of this loop.
            all.extend(
                h.join()
                    .map_err(|_| anyhow::anyhow!("a seed thread panicked"))?,
            );
        }
        Ok::<_, anyhow::Error>(all)
    })?;
    runs.sort_by_key(|(i, _)| *i);
    Ok(runs.into_iter().map(|(_, r)| r).collect())
}

/// Runs one seed; a panic becomes a failure of that seed.
pub fn run_seed(seed: u64) -> SeedRun {
    let cfg = SimConfig::from_seed(seed);
    let t0 = Instant::now();
    let result =
        std::panic::catch_unwind(AssertUnwindSafe(|| sim::run(&cfg))).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_else(|| "a panic without a message".to_string());
            Err(SimFailure {
                seed,
                what: format!("panicked: {what}"),
                config: format!("{cfg:?}"),
            })
        });
    SeedRun {
        seed,
        wall: t0.elapsed(),
        result,
    }
}

/// The command that replays a failure: the `replay:` line of its message.
pub fn replay_line(f: &SimFailure) -> String {
    let text = f.to_string();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("replay:"))
        .map_or_else(
            || format!("(no replay line in: {text})"),
            |l| l.trim().to_string(),
        )
}

/// The fault kinds of [`FaultCounts`], with what each counts. Destructured, so that a kind
/// added to the simulator fails to compile here instead of going unreported.
fn fault_kinds(f: &FaultCounts) -> [(&'static str, &'static str, u64); 16] {
    let FaultCounts {
        crashes,
        resets,
        restarts,
        pauses,
        zombies,
        partitions,
        clogs,
        lost,
        duplicated,
        writes_lost,
        server_crashes,
        server_writes_lost,
        coord_crashes,
        coord_pauses,
        coord_zombies,
        takeovers,
    } = *f;
    [
        ("crashes", "workers crashed", crashes),
        ("resets", "of which the connection reset", resets),
        ("restarts", "new processes joined after a crash", restarts),
        ("pauses", "workers paused", pauses),
        ("zombies", "of which past the detector's bound", zombies),
        ("partitions", "partitions (one way or both)", partitions),
        (
            "clogs",
            "links to the coordinator clogged, then restored",
            clogs,
        ),
        ("lost", "peer frames lost", lost),
        ("duplicated", "peer frames duplicated", duplicated),
        (
            "writes_lost",
            "sealed log writes lost in a crash",
            writes_lost,
        ),
        (
            "server_crashes",
            "checkpoint servers crashed",
            server_crashes,
        ),
        (
            "server_writes_lost",
            "of which in the flush of a write, lost",
            server_writes_lost,
        ),
        (
            "coord_crashes",
            "coordinators crashed (also right after a journal write)",
            coord_crashes,
        ),
        ("coord_pauses", "coordinators paused", coord_pauses),
        (
            "coord_zombies",
            "of which past the lease (woke deposed)",
            coord_zombies,
        ),
        (
            "takeovers",
            "standbys that took over from the journal",
            takeovers,
        ),
    ]
}

/// The issue's budget: at least this many faults per seed.
const FAULTS_PER_SEED: u64 = 20;

fn u64_stats(v: impl Iterator<Item = u64>) -> Value {
    let v: Vec<f64> = v.map(|x| x as f64).collect();
    match Stats::of(&v) {
        Some(s) => json!({
            "total": v.iter().sum::<f64>(),
            "min": s.min, "median": s.median, "max": s.max,
            "mean": v.iter().sum::<f64>() / v.len() as f64,
        }),
        None => Value::Null,
    }
}

fn seeds_command(args: &SimArgs, count: u64, session: &Session) -> Result<()> {
    let first = args.first.unwrap_or(0);
    let threads = args
        .threads
        .map_or(session.machine.cores, |t| usize::try_from(t).unwrap_or(1));
    eprintln!(
        "paper sim: seeds {first}..{} on {threads} threads",
        first.saturating_add(count)
    );
    let t0 = Instant::now();
    let runs = run_seeds(first, count, threads)?;
    let wall = t0.elapsed();
    let ((summary, rows), md) = seeds_report(&runs, first, threads, wall);
    let summary = merge(Value::Object(session.head("sim")), summary);
    let md = session.with_header(&md);
    write_files(&session.out, "sim", &json_with_rows(&summary, &rows)?, &md)?;
    let failed = runs.iter().filter(|r| r.result.is_err()).count();
    if failed > 0 {
        bail!("{failed} of {} seeds failed (listed in sim.md)", runs.len());
    }
    Ok(())
}

/// The per-seed rows' columns in `sim.json`.
const ROW_COLUMNS: [&str; 9] = [
    "seed",
    "ok",
    "trace",
    "faults",
    "checks",
    "simulated_ms",
    "tasks",
    "workers_lost",
    "wall_ms",
];

/// The summary (JSON, per-seed rows) and markdown of a seed run.
fn seeds_report(
    runs: &[SeedRun],
    first: u64,
    threads: usize,
    wall: Duration,
) -> ((Value, Vec<Value>), String) {
    let ok: Vec<&SimOutcome> = runs.iter().filter_map(|r| r.result.as_ref().ok()).collect();
    let failures: Vec<&SimFailure> = runs
        .iter()
        .filter_map(|r| r.result.as_ref().err())
        .collect();
    let mut total = FaultCounts::default();
    for o in &ok {
        total.add(&o.faults);
    }
    let kinds = fault_kinds(&total);
    let per_kind: Vec<Vec<u64>> = (0..kinds.len())
        .map(|i| ok.iter().map(|o| fault_kinds(&o.faults)[i].2).collect())
        .collect();
    let totals: Vec<u64> = ok.iter().map(|o| o.faults.total()).collect();
    let below_budget = totals.iter().filter(|&&t| t < FAULTS_PER_SEED).count();
    // Machines that lie (rule 3 of the simulator): a vnode forging a share of its tasks.
    let forging = ok.iter().filter(|o| o.config.forge.is_some()).count();
    let checks: u64 = ok.iter().map(|o| o.checks).sum();
    let simulated: Vec<f64> = ok.iter().map(|o| o.finished_at.as_secs_f64()).collect();
    let walls: Vec<f64> = runs.iter().map(|r| r.wall.as_secs_f64()).collect();
    let wall_s = wall.as_secs_f64();
    let seeds_per_s = runs.len() as f64 / wall_s.max(1e-9);

    let mut faults = serde_json::Map::new();
    for ((name, what, _), values) in kinds.iter().zip(&per_kind) {
        let mut v = u64_stats(values.iter().copied());
        if let Some(m) = v.as_object_mut() {
            m.insert("what".into(), json!(what));
            m.insert(
                "seeds_with_any".into(),
                json!(values.iter().filter(|&&x| x > 0).count()),
            );
        }
        faults.insert((*name).to_string(), v);
    }
    faults.insert("total".into(), u64_stats(totals.iter().copied()));
    let failures_json: Vec<Value> = failures
        .iter()
        .map(|f| {
            json!({
                "seed": f.seed,
                "what": f.what,
                "replay": replay_line(f),
                "config": f.config,
            })
        })
        .collect();
    let last = first.saturating_add(u64::try_from(runs.len()).unwrap_or(u64::MAX));
    let summary = json!({
        "command": format!("paper sim --seeds {} --first {first} --threads {threads}", runs.len()),
        "seeds": { "first": first, "count": runs.len(), "end_exclusive": last },
        "threads": threads,
        "passed": ok.len(),
        "failed": failures.len(),
        "failures": failures_json,
        "faults_per_kind": faults,
        "faults_total_counts": "FaultCounts::total (resets, restarts, zombies, \
                                server_writes_lost, coord_zombies and takeovers are \
                                sub-counts or consequences of crashes and pauses, not added)",
        "seeds_with_a_forging_vnode": forging,
        "seeds_below_budget": { "faults": FAULTS_PER_SEED, "seeds": below_budget },
        "invariants_checked": u64_stats(ok.iter().map(|o| o.checks)),
        "tasks": u64_stats(ok.iter().map(|o| o.tasks)),
        "workers_lost": u64_stats(ok.iter().map(|o| u64::from(o.workers_lost))),
        "simulated_s": Stats::of(&simulated).map(|s| json!({
            "total": simulated.iter().sum::<f64>(),
            "min": s.min, "median": s.median, "max": s.max,
        })),
        "wall_s": wall_s,
        "seeds_per_s": seeds_per_s,
        "seed_wall_s": Stats::of(&walls),
        "per_seed_columns": ROW_COLUMNS,
    });
    let rows: Vec<Value> = runs
        .iter()
        .map(|r| {
            let wall_ms = (r.wall.as_secs_f64() * 1e4).round() / 10.0;
            match &r.result {
                Ok(o) => json!([
                    r.seed,
                    true,
                    format!("{:016x}", o.trace),
                    o.faults.total(),
                    o.checks,
                    u64::try_from(o.finished_at.as_millis()).unwrap_or(u64::MAX),
                    o.tasks,
                    o.workers_lost,
                    wall_ms
                ]),
                Err(_) => json!([r.seed, false, null, null, null, null, null, null, wall_ms]),
            }
        })
        .collect();

    // Markdown.
    let mut md = String::from("# `paper sim --seeds`: the cluster simulator over many seeds\n\n");
    let _ = writeln!(
        md,
        "Seeds {first}..{last} (`SimConfig::from_seed`), {threads} threads: **{} run, {} \
         passed, {} failed**. Wall time {wall_s:.1} s, **{seeds_per_s:.1} seeds/s** ({:.2} s \
         per seed per thread; seed wall time median {:.3} s, max {:.3} s).\n",
        runs.len(),
        ok.len(),
        failures.len(),
        wall_s * threads as f64 / runs.len().max(1) as f64,
        Stats::of(&walls).map_or(0.0, |s| s.median),
        Stats::of(&walls).map_or(0.0, |s| s.max),
    );
    if let Some(s) = Stats::of(&simulated) {
        let _ = writeln!(
            md,
            "Simulated time: {:.1} s in all; per seed min {:.3} s, median {:.3} s, max {:.3} s \
             (each seed's job until it finished).\n",
            simulated.iter().sum::<f64>(),
            s.min,
            s.median,
            s.max
        );
    }
    let check_stats: Vec<f64> = ok.iter().map(|o| o.checks as f64).collect();
    if let Some(s) = Stats::of(&check_stats) {
        let _ = writeln!(
            md,
            "Invariants checked (`SimOutcome::checks`: outputs against the reference, each \
             task once in the final log, acknowledged segments readable, ...): **{checks}** in \
             all; per seed min {:.0}, median {:.0}, max {:.0}.\n",
            s.min, s.median, s.max
        );
    }
    md.push_str("Faults injected, by kind (passed seeds):\n\n");
    md.push_str("| kind | what | total | per seed min | median | max | seeds with any |\n");
    md.push_str("|---|---|---:|---:|---:|---:|---:|\n");
    for ((name, what, sum), values) in kinds.iter().zip(&per_kind) {
        let v: Vec<f64> = values.iter().map(|&x| x as f64).collect();
        if let Some(s) = Stats::of(&v) {
            let _ = writeln!(
                md,
                "| {name} | {what} | {sum} | {:.0} | {} | {:.0} | {} |",
                s.min,
                s.median,
                s.max,
                values.iter().filter(|&&x| x > 0).count()
            );
        }
    }
    let t: Vec<f64> = totals.iter().map(|&x| x as f64).collect();
    if let Some(s) = Stats::of(&t) {
        let _ = writeln!(
            md,
            "| **total** | `FaultCounts::total` (without the sub-counts resets, restarts, \
             zombies, server_writes_lost, coord_zombies, takeovers) | {} | {:.0} | {} | {:.0} | {} |",
            totals.iter().sum::<u64>(),
            s.min,
            s.median,
            s.max,
            totals.iter().filter(|&&x| x > 0).count()
        );
    }
    let _ = writeln!(
        md,
        "\nSeeds with a forging vnode (certified with full checking and correction): \
         {forging}. Seeds with fewer than {FAULTS_PER_SEED} faults (the issue's budget per \
         seed): {below_budget}. Workers the coordinator lost: {} in all.\n",
        ok.iter().map(|o| u64::from(o.workers_lost)).sum::<u64>()
    );
    if failures.is_empty() {
        md.push_str("Failures: none.\n");
    } else {
        let _ = writeln!(md, "Failures ({}):\n", failures.len());
        for f in &failures {
            let what = f.what.lines().next().unwrap_or("");
            let _ = writeln!(md, "- seed {}: {what}\n  `{}`", f.seed, replay_line(f));
        }
    }
    let mut slow: Vec<&SeedRun> = runs.iter().collect();
    slow.sort_by_key(|r| std::cmp::Reverse(r.wall));
    md.push_str("\nSlowest seeds: ");
    let slow: Vec<String> = slow
        .iter()
        .take(5)
        .map(|r| format!("{} ({:.2} s)", r.seed, r.wall.as_secs_f64()))
        .collect();
    md.push_str(&slow.join(", "));
    md.push_str(".\n");
    ((summary, rows), md)
}

/// `summary` pretty-printed, plus `"per_seed": rows`, one row per line (pretty-printing would
/// put every number of 10,000 rows on a line of its own).
fn json_with_rows(summary: &Value, rows: &[Value]) -> Result<String> {
    let pretty = serde_json::to_string_pretty(summary).context("encoding the results")?;
    let Some(body) = pretty.strip_suffix('}') else {
        bail!("the summary is not a JSON object");
    };
    let mut text = body.trim_end().to_string();
    text.push_str(",\n  \"per_seed\": [\n");
    for (i, row) in rows.iter().enumerate() {
        text.push_str("    ");
        text.push_str(&serde_json::to_string(row).context("encoding a seed's row")?);
        text.push_str(if i + 1 < rows.len() { ",\n" } else { "\n" });
    }
    text.push_str("  ]\n}\n");
    Ok(text)
}

// ---------------------------------------------------------------------------------------------
// Part 2: heartbeats of N processes.

/// Paper 004 Table 1 (§6.1): k = 2, T_interval 5 s, T_timeout 5 s, T_insurance 200 s,
/// T_broken 5 s. Simulated time costs nothing, so they are used as they are, not scaled.
pub fn paper_params() -> FdParams {
    FdParams {
        interval: Duration::from_secs(5),
        timeout: Duration::from_secs(5),
        insurance: Duration::from_secs(200),
        broken: Duration::from_secs(5),
        k: 2,
    }
}

/// The parameter sets `--params` selects, named.
pub fn param_sets(which: ParamSet) -> Vec<(&'static str, FdParams)> {
    let paper = ("paper 004", paper_params());
    let cluster = ("cluster default", crate::detector::cluster_default_params());
    match which {
        ParamSet::Paper => vec![paper],
        ParamSet::Cluster => vec![cluster],
        ParamSet::Both => vec![paper, cluster],
    }
}

/// The configurations `--nodes` runs, from the options.
pub fn nodes_configs(args: &SimArgs, nodes: u32) -> Result<Vec<NodesConfig>> {
    let kill_fraction = args.kill_fraction.unwrap_or(0.01);
    if !(0.0..1.0).contains(&kill_fraction) {
        bail!("--kill-fraction {kill_fraction} must be in [0, 1)");
    }
    if let Some(s) = args.seconds {
        if !(s.is_finite() && s > 0.0) {
            bail!("--seconds {s} must be positive");
        }
    }
    let mut configs = Vec::new();
    for (name, mut params) in param_sets(args.params.unwrap_or(ParamSet::Both)) {
        if let Some(k) = args.k {
            params.k = usize::try_from(k).unwrap_or(usize::MAX);
        }
        // k + 2 connections opened, 2 (k + 2) peers on average: k monitors, one rotating in
        // per round (rule 3) with a choice, and k left after a peer or two is lost.
        let k32 = u32::try_from(params.k).unwrap_or(u32::MAX);
        let dial = args.dial.unwrap_or(k32.saturating_add(2));
        let window = match args.seconds {
            Some(s) => Duration::from_secs_f64(s),
            None => (2 * params.insurance).max(50 * params.interval),
        };
        configs.push(NodesConfig {
            name: name.to_string(),
            nodes,
            params,
            dial,
            window,
            kill_fraction,
            seed: args.seed.unwrap_or(1),
        });
    }
    Ok(configs)
}

/// What must hold of every node simulation; the problems found.
pub fn nodes_problems(o: &NodesOutcome) -> Vec<String> {
    let mut problems = Vec::new();
    if o.false_unreachable + o.false_broken > 0 {
        problems.push(format!(
            "{}: {} Unreachable and {} Broken verdicts about live processes",
            o.name, o.false_unreachable, o.false_broken
        ));
    }
    if o.under_watched > 0 {
        problems.push(format!(
            "{}: {} processes watched closely by fewer than k = {}",
            o.name, o.under_watched, o.k
        ));
    }
    if o.never_detected > 0 {
        problems.push(format!(
            "{}: {} of {} victims never declared Broken",
            o.name, o.never_detected, o.victims
        ));
    }
    if o.late_detections > 0 {
        problems.push(format!(
            "{}: {} victims with a live monitor found later than T_interval + T_timeout + \
             T_broken + the largest delay",
            o.name, o.late_detections
        ));
    }
    problems
}

fn nodes_command(args: &SimArgs, nodes: u32, session: &Session) -> Result<()> {
    let configs = nodes_configs(args, nodes)?;
    let t0 = Instant::now();
    let mut outcomes = Vec::new();
    for cfg in &configs {
        eprintln!(
            "paper sim: {} processes, {} (k = {}, {} connections opened each), {:.0} s counted",
            cfg.nodes,
            cfg.name,
            cfg.params.k,
            cfg.dial,
            cfg.window.as_secs_f64()
        );
        let o = nodes::simulate(cfg)?;
        eprintln!(
            "  {:.1} s wall, {} messages, peak memory {:.0} MiB",
            o.wall_s,
            o.delivered + o.dropped,
            peak_rss_mib().unwrap_or(f64::NAN)
        );
        outcomes.push(o);
    }
    let wall = t0.elapsed();
    let peak = peak_rss_mib();
    let json = json!({
        "delay_us": [nodes::DELAY_US.0, nodes::DELAY_US.1],
        "runs": outcomes,
        "wall_s": wall.as_secs_f64(),
        "peak_rss_mib": peak,
    });
    let md = nodes_markdown(&outcomes, peak);
    session.write("sim_nodes", "sim_nodes", json, &md)?;
    let problems: Vec<String> = outcomes.iter().flat_map(nodes_problems).collect();
    if !problems.is_empty() {
        bail!("paper sim --nodes: {}", problems.join("; "));
    }
    Ok(())
}

fn fmt_summary(s: &Summary, digits: usize) -> String {
    format!(
        "{:.d$} / {:.d$} / {:.d$} / {:.d$} / {:.d$}",
        s.min,
        s.median,
        s.mean,
        s.p99,
        s.max,
        d = digits
    )
}

fn nodes_markdown(outcomes: &[NodesOutcome], peak: Option<f64>) -> String {
    let mut md =
        String::from("# `paper sim --nodes`: the failure detector's heartbeats at scale\n\n");
    let _ = writeln!(
        md,
        "Each process is one `Detector` on simulated time, one thread; every message is a \
         heartbeat, delayed {}-{} µs (seeded), FIFO per link; model in \
         `bench/src/sim/nodes.rs`. Peak memory of the command (VmHWM): {}.\n",
        nodes::DELAY_US.0,
        nodes::DELAY_US.1,
        peak.map_or_else(|| "?".to_string(), |m| format!("{m:.0} MiB"))
    );
    md.push_str(
        "| parameters | processes | k | T_interval / T_timeout / T_insurance / T_broken (s) | \
         peers per process (min / median / max) | counted (s) | sent per process per s: mean \
         (max) | received: mean (max) | per T_interval: sent / received | paper's k/T_int + \
         (c−k)/T_ins | bound (k+1)/T_int + (c−k)/T_ins | wall (s) |\n",
    );
    md.push_str("|---|---:|---:|---|---|---:|---|---|---|---:|---:|---:|\n");
    for o in outcomes {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} / {} / {} / {} | {:.0} / {:.0} / {:.0} | {:.0} | {:.3} ({:.3}) \
             | {:.3} ({:.3}) | {:.2} / {:.2} | {:.3} | {:.3} | {:.1} |",
            o.name,
            o.nodes,
            o.k,
            o.interval_s,
            o.timeout_s,
            o.insurance_s,
            o.broken_s,
            o.degree.min,
            o.degree.median,
            o.degree.max,
            o.kill_at_s - o.warmup_s,
            o.sent_per_s.mean,
            o.sent_per_s.max,
            o.received_per_s.mean,
            o.received_per_s.max,
            o.sent_per_interval,
            o.received_per_interval,
            o.paper_estimate_per_s,
            o.bound_per_s,
            o.wall_s,
        );
    }
    md.push_str(
        "\nDetection after the kill (seconds from the kill to the first Broken verdict by any \
         live process):\n\n",
    );
    md.push_str(
        "| parameters | victims | min / median / mean / p99 / max (s) | first found by a monitor \
         | victims with no live monitor | never detected | false Unreachable / Broken | \
         under-watched processes | monitoring load per process (mean / max) |\n",
    );
    md.push_str("|---|---:|---|---:|---:|---:|---|---:|---|\n");
    for o in outcomes {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} / {} | {} | {:.2} / {:.0} |",
            o.name,
            o.victims,
            o.detection_s
                .as_ref()
                .map_or_else(|| "-".to_string(), |s| fmt_summary(s, 3)),
            o.detected_by_monitor,
            o.victims_without_live_monitor,
            o.never_detected,
            o.false_unreachable,
            o.false_broken,
            o.under_watched,
            o.watching.mean,
            o.watching.max,
        );
    }
    md.push_str(
        "\nAgainst paper 004. It claims ~k heartbeats per process per T_interval when \
         T_insurance ≫ T_interval (§4.2.3: (k n) / T_interval messages per unit time; Fig. 2 \
         counted ~2 received per process per 5 s with k = 2), and its Table 1 parameters \
         give a mean detection of T_interval / 2 + T_timeout + T_broken = 12.5 s (a \
         monitor's last heartbeat came uniformly 0 to T_interval before the failure).\n\n",
    );
    for o in outcomes {
        let expected_mean = o.interval_s / 2.0 + o.timeout_s + o.broken_s;
        let _ = writeln!(
            md,
            "- **{}**: {:.2} heartbeats sent and {:.2} received per process per T_interval \
             (k = {}): the rounds send k + 1 ({:.3} per s: the monitor rotating out gets a \
             last heartbeat carrying T_insurance, rule 3 of `detect/mod.rs`) and insurance \
             {:.3} per s (each round draws one of the c − k other peers as a monitor, which \
             renews its promise, so a peer waits (c − k) rounds on average: insurance fires \
             often when (c − k) T_interval is near T_insurance or above, rarely when far \
             below). Mean detection {} s against T_interval / 2 + T_timeout + T_broken \
             = {expected_mean:.2} s.",
            o.name,
            o.sent_per_interval,
            o.received_per_interval,
            o.k,
            o.round_per_s,
            o.insurance_per_s,
            o.detection_s
                .as_ref()
                .map_or_else(|| "-".to_string(), |s| format!("{:.3}", s.mean)),
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replay_line_is_found() {
        let f = SimFailure {
            seed: 42,
            what: "boom".into(),
            config: "cfg".into(),
        };
        let line = replay_line(&f);
        assert!(line.starts_with("VERIFLOW_SIM_SEED=42 "), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn rows_make_valid_json() {
        let rows = vec![json!([1, true, "ab"]), json!([2, false, null])];
        let text = json_with_rows(&json!({"a": 1, "b": [1, 2]}), &rows).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["a"], 1);
        assert_eq!(v["per_seed"][1][0], 2);
        assert_eq!(text.lines().filter(|l| l.starts_with("    [")).count(), 2);
    }
}

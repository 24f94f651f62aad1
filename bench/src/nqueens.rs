//! `paper nqueens`: paper 004's Table 2 here — N-Queens without fault tolerance against
//! N-Queens with it, on 1 to 8 workers, for n = 16 and 17.
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- nqueens [--runs N] [--quick]
//!     [--sizes 16,17] [--workers 1,2,4,8] [--nqueens-bin PATH] [--out DIR]
//!     [--quiet-wait SECS] [--retries N] [--timeout SECS]
//! ```
//!
//! For each n, per repetition, in this order (interleaved, so that slow drifts of a shared
//! machine hit every configuration alike):
//!
//! 1. **seq**: the plain sequential bitmask solver [`nqueens::solve`] (no runtime, no tasks,
//!    compiled into this binary), timed around the call;
//! 2. **plain P** for every P of `--workers`: the N-Queens tasks on the embedded runtime with
//!    P threads and P vnodes and no log (`RuntimeBuilder::checkpoint(false)`, the S0 setting
//!    of `paper overhead`): no log, no failure detector, one process — paper 004's "Normal";
//!    timed by `RunReport::elapsed`;
//! 3. **FT P** for every P: `nqueens cluster --workers P --threads 1 --json`: P worker
//!    processes, every task's events logged to a checkpoint server (group commit), the Phoenix
//!    failure detector between all processes (the app's default parameters), a coordinator —
//!    paper 004's "FT"; timed by the summary's `elapsed_s` (the coordinator's job time;
//!    process start-up and teardown excluded).
//!
//! The first rows are split into tasks by recursive spawning (the app's defaults: the root
//! spawns the first-row boards, each spawns its second-row boards, ...; module docs of
//! `apps/nqueens`, rules 3-4): 2 rows for P <= 4 and 3 rows above, the same for plain and FT. Every run's count is checked against OEIS A000170 (n = 16:
//! 14,772,512; n = 17: 95,815,104) and its task count against `nqueens::expected_tasks`; an FT
//! run must log and lose no worker. A run during which other processes took more than
//! 0.05 CPU-s + 5 % of the machine's cores × its time is run again at once, up to `--retries`
//! times per n (the rule of `paper cluster`).
//!
//! Reported, on medians: relative performance plain / FT per P (paper 004: 98.9-102.4 %;
//! target >= 99 %), single-core speed seq / plain 1 (the tasks against the sequential solver),
//! speed-up FT 1 / FT 2 (target >= 1.9, issue 17 target 5) and plain 1 / plain 2. Results: `nqueens.json` and
//! `nqueens.md` in `--out` (`nqueens-quick.*` with `--quick`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use veriflow::{Program, Registry, Runtime};

use crate::cluster::cluster_run;
use crate::harness::{
    app_binary, merge, require_runs, CpuSnapshot, Disturbed, Quiet, Redo, Rounds, Series, Session,
    Stats, Timed,
};

/// Targets of issue 8.
const TARGET_RELATIVE: f64 = 0.99;
/// Issue 17 target 5 (issue 8 asked 1.8).
const TARGET_SPEEDUP_2: f64 = 1.9;

/// Options of `paper nqueens`.
#[derive(clap::Args, Debug, Clone)]
pub struct NQueensArgs {
    /// Repetitions of every configuration (medians over them; at least 3 unless --quick).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// Board sizes [default: 16,17; --quick: 12,13].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(4..=20))]
    pub sizes: Vec<u32>,
    /// Worker counts P (threads of plain, worker processes of FT) [default: 1,2,4,8; --quick:
    /// 1,2].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: Vec<u32>,
    /// Small boards, one run each: a smoke run (writes nqueens-quick.* instead).
    #[arg(long)]
    pub quick: bool,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The `nqueens` binary [default: beside this binary, built first with `cargo build -p
    /// nqueens` in this binary's profile].
    #[arg(long, value_name = "PATH")]
    pub nqueens_bin: Option<PathBuf>,
    /// Before each repetition, wait up to this many seconds for other processes to use less
    /// than a quarter of a core (0: do not wait).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub quiet_wait: u64,
    /// Disturbed runs are run again at most this many times per board size; past that they
    /// are kept and counted.
    #[arg(long, default_value_t = 6)]
    pub retries: u32,
    /// An FT run taking longer than this is killed (with every process it started) and the
    /// command fails.
    #[arg(long, value_name = "SECS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
}

/// One configuration of a repetition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
enum Config {
    /// The sequential solver.
    Seq,
    /// Embedded runtime, no log, P threads and vnodes.
    Plain(u32),
    /// Cluster of P worker processes with log and detector.
    Ft(u32),
}

impl Config {
    fn label(self) -> String {
        match self {
            Config::Seq => "seq".to_string(),
            Config::Plain(p) => format!("plain {p}"),
            Config::Ft(p) => format!("FT {p}"),
        }
    }
}

/// The split rows for P workers (2 rows, 3 for more vnodes: issue 8).
fn split_rows(workers: u32) -> u32 {
    if workers <= 4 {
        2
    } else {
        3
    }
}

fn program(n: u32, workers: u32) -> nqueens::NQueens {
    nqueens::NQueens {
        n,
        split_rows: Some(split_rows(workers)),
        cutoff_row: None,
        no_mirror: false,
    }
}

/// What one run measured.
#[derive(Clone, Debug, serde::Serialize)]
struct Run {
    seconds: f64,
    tasks: u64,
    events: u64,
    steals: u64,
    /// CPU seconds other processes took during the run.
    foreign_cpu_s: Option<f64>,
}

impl Timed for Run {
    fn seconds(&self) -> f64 {
        self.seconds
    }
    fn foreign_cpu_s(&self) -> Option<f64> {
        self.foreign_cpu_s
    }
}

/// The expected count for `n` (A000170), failing for an unknown `n`.
fn expected(n: u32) -> Result<u64> {
    nqueens::known_count(n).with_context(|| format!("no known count for n = {n}"))
}

fn registry() -> Result<Registry> {
    let mut r = Registry::new();
    nqueens::NQueens::register(&mut r).context("registering nqueens' tasks")?;
    r.register::<nqueens::Queens>()
        .context("registering nqueens' root")?;
    Ok(r)
}

fn run_seq(n: u32) -> Result<Run> {
    let before = CpuSnapshot::with_children();
    let t0 = Instant::now();
    let count = std::hint::black_box(nqueens::solve(std::hint::black_box(n)));
    let seconds = t0.elapsed().as_secs_f64();
    let foreign_cpu_s = CpuSnapshot::foreign_since(before);
    if count != expected(n)? {
        bail!(
            "seq n = {n}: counted {count}, A000170 says {}",
            expected(n)?
        );
    }
    Ok(Run {
        seconds,
        tasks: 0,
        events: 0,
        steals: 0,
        foreign_cpu_s,
    })
}

fn run_plain(n: u32, p: u32) -> Result<Run> {
    let prog = program(n, p);
    let rt = Runtime::builder(registry()?)
        .program(nqueens::NQueens::NAME)
        .threads(p as usize)
        .vnodes(p)
        .checkpoint(false)
        .build()
        .context("building the runtime")?;
    let (root, inputs) = prog.root();
    let before = CpuSnapshot::with_children();
    let report = rt
        .run(root, inputs)
        .with_context(|| format!("plain {p}, n = {n}"))?;
    let foreign_cpu_s = CpuSnapshot::foreign_since(before);
    let want_tasks = prog.expected_tasks().context("task count")?;
    if report.outputs.0 != expected(n)? || report.tasks != want_tasks || report.events != 0 {
        bail!(
            "plain {p}, n = {n}: count {} tasks {} events {} (want {}, {want_tasks}, 0)",
            report.outputs.0,
            report.tasks,
            report.events,
            expected(n)?
        );
    }
    Ok(Run {
        seconds: report.elapsed.as_secs_f64(),
        tasks: report.tasks,
        events: 0,
        steals: report.vnodes.iter().map(|v| v.adopted).sum(),
        foreign_cpu_s,
    })
}

fn ft_argv(n: u32, p: u32) -> Vec<String> {
    vec![
        "cluster".into(),
        format!("--workers={p}"),
        "--threads=1".into(),
        format!("--n={n}"),
        format!("--split-rows={}", split_rows(p)),
        "--json".into(),
    ]
}

fn run_ft(bin: &Path, n: u32, p: u32, timeout: Duration) -> Result<Run> {
    let r = cluster_run(bin, &ft_argv(n, p), &[], timeout)?;
    let want_tasks = program(n, p).expected_tasks().context("task count")?;
    if !r.correct || r.tasks != want_tasks || r.events == 0 || r.failures != 0 {
        bail!(
            "FT {p}, n = {n}: correct {} tasks {} events {} workers lost {} (want true, \
             {want_tasks}, > 0, 0)",
            r.correct,
            r.tasks,
            r.events,
            r.failures
        );
    }
    Ok(Run {
        seconds: r.elapsed_s,
        tasks: r.tasks,
        events: r.events,
        steals: r.steals,
        foreign_cpu_s: r.foreign_cpu_s,
    })
}

/// Every configuration's kept runs for one board size.
struct Size {
    n: u32,
    configs: Vec<Config>,
    /// Kept runs per configuration, and the disturbed runs run again.
    series: Series<Run>,
}

impl Size {
    fn stats(&self, c: Config) -> Option<Stats> {
        let i = self.configs.iter().position(|&x| x == c)?;
        self.series.stats(i).ok()
    }

    fn ratio(&self, num: Config, den: Config) -> Option<f64> {
        Some(self.stats(num)?.median / self.stats(den)?.median)
    }
}

/// Runs `paper nqueens` (module docs) and writes its results.
pub fn run(args: &NQueensArgs) -> Result<()> {
    require_runs(args.runs, 3, args.quick)?;
    let session = Session::start(args.out.as_deref(), args.quick)?;
    let bin = app_binary(
        "nqueens",
        "nqueens",
        "--nqueens-bin",
        args.nqueens_bin.as_deref(),
    )?;
    let sizes = match (&args.sizes[..], args.quick) {
        ([], false) => vec![16, 17],
        ([], true) => vec![12, 13],
        (s, _) => s.to_vec(),
    };
    let workers = match (&args.workers[..], args.quick) {
        ([], false) => vec![1, 2, 4, 8],
        ([], true) => vec![1, 2],
        (w, _) => w.to_vec(),
    };
    for &n in &sizes {
        expected(n)?;
    }
    let runs = if args.quick { 1 } else { args.runs as usize };
    let timeout = Duration::from_secs(args.timeout);
    let mut configs = vec![Config::Seq];
    configs.extend(workers.iter().map(|&p| Config::Plain(p)));
    configs.extend(workers.iter().map(|&p| Config::Ft(p)));
    eprintln!(
        "nqueens: n = {sizes:?}, P = {workers:?}, {runs} repetitions of {}",
        configs
            .iter()
            .map(|c| c.label())
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Warm-up (binaries and libraries in the page cache): not counted.
    run_ft(&bin, 8, 1, timeout).context("warm-up run")?;
    // A disturbed run is run again at once, alone (its configuration's neighbours in the
    // round are not: the ratios compare configurations' medians, not pairs).
    let mut rounds = Rounds {
        runs,
        quiet: Quiet::secs(args.quiet_wait),
        retries: args.retries,
        disturbed: Disturbed::cores(),
        redo: Redo::Run { quiet_first: false },
        label: String::new(),
    };
    let mut results = Vec::new();
    for &n in &sizes {
        rounds.label = format!("n = {n}");
        let series = rounds.run(
            configs.len(),
            |_, i| match configs[i] {
                Config::Seq => run_seq(n),
                Config::Plain(p) => run_plain(n, p),
                Config::Ft(p) => run_ft(&bin, n, p, timeout),
            },
            |i, r| format!("{} {:.3} s", configs[i].label(), r.seconds),
        )?;
        results.push(Size {
            n,
            configs: configs.clone(),
            series,
        });
    }
    let not_quiet: u32 = results.iter().map(|s| s.series.not_quiet).sum();
    let parameters = json!({
        "runs": runs,
        "sizes": sizes,
        "workers": workers,
        "split_rows": "2 for P <= 4, 3 above",
        "order": "per n and repetition: seq, plain P..., FT P... (interleaved)",
        "seq": "nqueens::solve(n): sequential bitmask backtracking with the mirror \
                symmetry, in this process; wall time of the call",
        "plain": "embedded runtime, P threads and P vnodes, checkpoint(false): no log, no \
                  failure detector; RunReport::elapsed",
        "ft": "`nqueens cluster --workers P --threads 1`: P worker processes, events logged \
               to a central checkpoint server (group commit 64 KiB / 5 ms), failure \
               detector with the app's defaults (T_interval 200 ms, T_timeout 400 ms, \
               T_broken 400 ms, T_insurance 1 s, k 3); the summary's elapsed_s",
        "retries_per_size": args.retries,
    });
    let report = json!({
        "repetitions_started_on_a_busy_machine": not_quiet,
        "parameters": merge(parameters, rounds.parameters()),
        "sizes": results.iter().map(|s| size_json(s, &workers)).collect::<Vec<_>>(),
        "targets": targets_json(&results, &workers),
    });
    let md = markdown(&results, &workers, runs, not_quiet);
    session.write("nqueens", &session.stem("nqueens"), report, &md)
}

fn runs_json(runs: &[Run], st: Option<Stats>) -> Value {
    json!({
        "median_s": st.map(|s| s.median),
        "min_s": st.map(|s| s.min),
        "max_s": st.map(|s| s.max),
        "seconds": runs.iter().map(|r| r.seconds).collect::<Vec<_>>(),
        "tasks": runs.first().map(|r| r.tasks),
        "events": runs.iter().map(|r| r.events).collect::<Vec<_>>(),
        "steals": runs.iter().map(|r| r.steals).collect::<Vec<_>>(),
        "other_processes_cpu_s": runs.iter().map(|r| r.foreign_cpu_s).collect::<Vec<_>>(),
    })
}

fn size_json(s: &Size, workers: &[u32]) -> Value {
    let per_p: Vec<Value> = workers
        .iter()
        .map(|&p| {
            let (pi, fi) = (
                s.configs.iter().position(|&c| c == Config::Plain(p)),
                s.configs.iter().position(|&c| c == Config::Ft(p)),
            );
            json!({
                "workers": p,
                "split_rows": split_rows(p),
                "plain": pi.map(|i| runs_json(&s.series.kept[i], s.stats(Config::Plain(p)))),
                "ft": fi.map(|i| runs_json(&s.series.kept[i], s.stats(Config::Ft(p)))),
                "relative_performance_plain_over_ft": s.ratio(Config::Plain(p), Config::Ft(p)),
            })
        })
        .collect();
    json!({
        "n": s.n,
        "count": nqueens::known_count(s.n),
        "count_verified_every_run": true,
        "seq": runs_json(&s.series.kept[0], s.stats(Config::Seq)),
        "per_workers": per_p,
        "single_core_seq_over_plain_1": s.ratio(Config::Seq, Config::Plain(1)),
        "speedup_ft_1_over_ft_2": s.ratio(Config::Ft(1), Config::Ft(2)),
        "speedup_plain_1_over_plain_2": s.ratio(Config::Plain(1), Config::Plain(2)),
        "discarded_disturbed_runs": s.series.discarded.iter().map(|(i, r)| json!({
            "config": s.configs[*i].label(), "seconds": r.seconds,
            "other_processes_cpu_s": r.foreign_cpu_s,
        })).collect::<Vec<_>>(),
        "kept_disturbed_runs": s.series.kept_disturbed,
    })
}

/// (name, measured, target, met) of every target.
fn targets(results: &[Size], workers: &[u32]) -> Vec<(String, Option<f64>, String, bool)> {
    let mut t = Vec::new();
    for s in results {
        for &p in workers {
            let r = s.ratio(Config::Plain(p), Config::Ft(p));
            t.push((
                format!("relative performance plain/FT, n = {}, P = {p}", s.n),
                r,
                format!(">= {TARGET_RELATIVE}"),
                r.is_some_and(|r| r >= TARGET_RELATIVE),
            ));
        }
        let r = s.ratio(Config::Ft(1), Config::Ft(2));
        t.push((
            format!("speed-up FT 1 / FT 2, n = {}", s.n),
            r,
            format!(">= {TARGET_SPEEDUP_2}"),
            r.is_some_and(|r| r >= TARGET_SPEEDUP_2),
        ));
    }
    t
}

fn targets_json(results: &[Size], workers: &[u32]) -> Value {
    Value::Array(
        targets(results, workers)
            .into_iter()
            .map(|(name, v, target, met)| {
                json!({ "name": name, "measured": v, "target": target, "met": met })
            })
            .collect(),
    )
}

fn fmt_s(st: Option<Stats>) -> String {
    st.map_or_else(|| "–".to_string(), |s| format!("{:.3}", s.median))
}

fn fmt_ratio(r: Option<f64>, percent: bool) -> String {
    match (r, percent) {
        (None, _) => "–".to_string(),
        (Some(r), true) => format!("{:.1} %", r * 100.0),
        (Some(r), false) => format!("{r:.3}"),
    }
}

fn markdown(results: &[Size], workers: &[u32], runs: usize, not_quiet: u32) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "N-Queens, paper 004 Table 2 analog: **plain** = the tasks on the embedded runtime with \
         P threads and vnodes, no log, no failure detector (paper 004's Normal); **FT** = \
         `nqueens cluster --workers P`: P worker processes, every event logged to a checkpoint \
         server, the failure detector on (paper 004's FT); **seq** = the plain sequential \
         bitmask solver compiled into the same binary. Medians of {runs} interleaved runs; \
         split 2 rows for P <= 4, 3 above; every count checked against OEIS A000170; {not_quiet} \
         repetition(s) started on a busy machine. Relative performance = plain / FT (paper \
         004: 98.9-102.4 %).\n"
    );
    s.push_str(
        "| n | P | plain (s) | FT (s) | perf. plain/FT | tasks | FT events |\n\
         |---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in results {
        for &p in workers {
            let fi = r.configs.iter().position(|&c| c == Config::Ft(p));
            let ft_runs = fi.map(|i| &r.series.kept[i]);
            let _ = writeln!(
                s,
                "| {} | {p} | {} | {} | {} | {} | {} |",
                r.n,
                fmt_s(r.stats(Config::Plain(p))),
                fmt_s(r.stats(Config::Ft(p))),
                fmt_ratio(r.ratio(Config::Plain(p), Config::Ft(p)), true),
                ft_runs
                    .and_then(|v| v.first())
                    .map_or_else(|| "–".to_string(), |x| x.tasks.to_string()),
                ft_runs
                    .and_then(|v| v.first())
                    .map_or_else(|| "–".to_string(), |x| x.events.to_string()),
            );
        }
    }
    s.push_str(
        "\n| n | count | seq (s) | plain 1 (s) | single core seq/plain 1 | speed-up FT 1/FT 2 | \
         speed-up plain 1/plain 2 | rerun / kept disturbed |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in results {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} |",
            r.n,
            nqueens::known_count(r.n).unwrap_or(0),
            fmt_s(r.stats(Config::Seq)),
            fmt_s(r.stats(Config::Plain(1))),
            fmt_ratio(r.ratio(Config::Seq, Config::Plain(1)), false),
            fmt_ratio(r.ratio(Config::Ft(1), Config::Ft(2)), false),
            fmt_ratio(r.ratio(Config::Plain(1), Config::Plain(2)), false),
            r.series.rerun,
            r.series.kept_disturbed,
        );
    }
    s.push_str("\n| target | measured | wanted | met |\n|---|---:|---:|:-:|\n");
    for (name, v, target, met) in targets(results, workers) {
        let _ = writeln!(
            s,
            "| {name} | {} | {target} | {} |",
            v.map_or_else(|| "–".to_string(), |v| format!("{v:.3}")),
            if met { "yes" } else { "**no**" }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_and_split() {
        let a = ft_argv(16, 8);
        assert!(a.contains(&"--split-rows=3".to_string()));
        assert!(a.contains(&"--workers=8".to_string()));
        assert_eq!(split_rows(2), 2);
        assert_eq!(program(16, 2).split(), 2);
    }

    #[test]
    fn a_seq_and_a_plain_run_check_their_counts() {
        run_seq(8).unwrap();
        let r = run_plain(9, 2).unwrap();
        assert_eq!(r.tasks, program(9, 2).expected_tasks().unwrap());
    }
}

//! `paper online`: the online oracle (issue 20) on loopback clusters of real processes.
//!
//! 1. **Time to detection against the forgery rate.** For each rate Q, `knary cluster --oracle
//!    --workers 4` with one worker lying at Q (the test-only `--forge-workers 1`), seeds 1..=R:
//!    when the liar was evicted (seconds after the job was accepted), how many tasks it had
//!    completed by then, and whether the run ended right and certified ACCEPT. The theory
//!    beside it: the oracle's own sampling rule (`veriflow_certifier::online` rules 2 and 4:
//!    every task checked while fewer than 2N have completed cluster-wide, then at the larger of
//!    the uniform rate 2N/m and the liar's spot-check rate max(f, 1/(1 + c))), run as a
//!    Monte-Carlo of 10,000 liars with the liar completing a quarter of the tasks: the expected
//!    number of tasks it completes before its first forged task is checked. The measured count
//!    is larger by what the liar completes while the oracle waits for the logs to be durable,
//!    reads them and re-runs the task (detection latency), which the seconds column shows.
//! 2. **The cost of following an honest run.** `knary cluster --workers 4` with and without
//!    `--oracle`, interleaved, R runs each: the median job time of each and their ratio (goal
//!    ≤ 1.03). The oracle is a fifth process on the same two cores.
//!
//! Results go to `online.md` and `online.json` in bench/results (or `--out`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};

use crate::harness::{
    knary_binary, loadavg, require_runs, CpuSnapshot, Disturbed, Quiet, Redo, Rounds, Session,
    Stats, Timed,
};

/// `paper online` options.
#[derive(clap::Args, Debug)]
pub struct OnlineArgs {
    /// Runs per rate, and per setting of the slowdown (medians).
    #[arg(long, default_value_t = 5)]
    pub runs: u32,
    /// Measure only the cost of following an honest run (part 2); part 1 keeps its section of
    /// an existing online.json.
    #[arg(long)]
    pub honest_only: bool,
    /// Wait up to this many seconds for other processes to use less than a quarter of a core
    /// before each round of part 2.
    #[arg(long, default_value_t = 0)]
    pub quiet_wait: u64,
    /// Depth of the knary tree (fanout 4).
    #[arg(long, default_value_t = 8)]
    pub depth: u32,
    /// Busy loop of every task, in µs.
    #[arg(long, default_value_t = 100)]
    pub grain_us: u64,
    /// Forgery rates of the lying worker.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.005,0.01,0.02,0.05,0.1"
    )]
    pub rates: Vec<f64>,
    /// A small, fast run (fewer rates, depth 7), for smoke tests.
    #[arg(long)]
    pub quick: bool,
    /// Where results go [default: bench/results].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The knary binary [default: built beside this one].
    #[arg(long)]
    pub knary_bin: Option<PathBuf>,
}

/// N_{ε,q} at the oracle's defaults (ε = 5 %, q = 1 %), and its spot-check floor.
const N_EPS_Q: f64 = 298.07;
const SPOT_FLOOR: f64 = 0.02;

/// One `knary cluster ... --json` run: its summary.
fn run_json(knary: &Path, argv: &[String]) -> Result<Value> {
    let out = std::process::Command::new(knary)
        .args(argv)
        .env("VERIFLOW_ALLOW_FORGERY", "1")
        .output()
        .with_context(|| format!("cannot run {}", knary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "`knary {}` failed ({}): {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_str(text.trim())
        .with_context(|| format!("`knary {}` printed no JSON: {text}", argv.join(" ")))
}

fn argv(depth: u32, grain_us: u64, seed: u64, extra: &[String]) -> Vec<String> {
    let mut v: Vec<String> = [
        "cluster",
        "--workers",
        "4",
        "--depth",
        &depth.to_string(),
        "--fanout",
        "4",
        "--grain-us",
        &grain_us.to_string(),
        "--seed",
        &seed.to_string(),
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().cloned());
    v
}

/// The theory of part 1: the expected tasks a liar completes before its first forged task is
/// checked, under the oracle's sampling rule (module docs), by Monte-Carlo.
fn theory_tasks(q: f64, liar_share: f64) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(0x0ac1e);
    let trials = 10_000;
    let mut total = 0u64;
    for _ in 0..trials {
        let (mut done, mut clean) = (0u64, 0u64);
        loop {
            done += 1;
            let m = done as f64 / liar_share;
            let uniform = (2.0 * N_EPS_Q / m).min(1.0);
            let spot = (1.0 / (1.0 + clean as f64)).max(SPOT_FLOOR);
            let forged = rng.random_bool(q);
            let checked = rng.random_bool(uniform) || rng.random_bool(spot);
            if checked && forged {
                break;
            }
            if checked {
                clean += 1;
            }
            if done > 10_000_000 {
                break;
            }
        }
        total += done;
    }
    total as f64 / f64::from(trials)
}

/// Runs `paper online` (module docs) and writes its results.
pub fn run(args: &OnlineArgs) -> Result<()> {
    require_runs(args.runs, 5, args.quick)?;
    let session = Session::start(args.out.as_deref(), args.quick)?;
    let knary = knary_binary(args.knary_bin.as_deref())?;
    let (depth, rates, runs) = if args.quick {
        (7, vec![0.02, 0.1], args.runs.min(2))
    } else {
        (args.depth, args.rates.clone(), args.runs)
    };
    // Part 1 (or its section of an earlier report).
    let mut detection = Vec::new();
    if args.honest_only {
        let earlier = session.out.join("online.json");
        detection = std::fs::read_to_string(&earlier)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["detection"].as_array().cloned())
            .with_context(|| format!("--honest-only keeps part 1 of {}", earlier.display()))?;
    }
    for &q in rates.iter().filter(|_| !args.honest_only) {
        let mut at = Vec::new();
        let mut tasks = Vec::new();
        let mut rows = Vec::new();
        for seed in 1..=u64::from(runs) {
            let extra = [
                "--oracle".to_string(),
                "--forge-workers".into(),
                "1".into(),
                format!("--forge-rate={q}"),
            ];
            let v = run_json(&knary, &argv(depth, args.grain_us, seed, &extra))?;
            let cert = &v["online_certificate"];
            let evicted = cert["online"]["workers"]
                .as_array()
                .and_then(|w| w.iter().find(|w| w["evicted"] == true))
                .cloned();
            let when = v["evictions"][0]["at_s"].as_f64();
            if let (Some(w), Some(t)) = (&evicted, when) {
                at.push(t);
                tasks.push(w["tasks"].as_f64().unwrap_or(0.0));
            }
            rows.push(json!({
                "seed": seed,
                "correct": v["correct"],
                "decision": cert["decision"],
                "generation": cert["generation"],
                "evicted_at_s": when,
                "liar_tasks": evicted.as_ref().map(|w| w["tasks"].clone()),
                "liar_forged_found": evicted.as_ref().map(|w| w["forged"].clone()),
                "elapsed_s": v["elapsed_s"],
            }));
            eprintln!(
                "online: q {q} seed {seed}: evicted at {when:?} s, {}",
                v["correct"]
            );
        }
        let theory = theory_tasks(q, 0.25);
        detection.push(json!({
            "q": q,
            "runs": rows,
            "caught_during_run": at.len(),
            "evicted_at_s": Stats::of(&at).map(|s| s.median),
            "liar_tasks_median": Stats::of(&tasks).map(|s| s.median),
            "theory_liar_tasks": theory,
            "floor_bound_liar_tasks": 1.0 / (q * SPOT_FLOOR),
        }));
    }
    // Part 2: honest runs, without and with the oracle, interleaved (seed = round + 1).
    let honest = Rounds {
        runs: runs as usize,
        quiet: Quiet::secs(args.quiet_wait),
        retries: 0,
        disturbed: Disturbed::cores(),
        redo: Redo::Round,
        label: "honest".into(),
    }
    .run(
        2,
        |round, oracle| {
            let extra: Vec<String> = if oracle == 1 {
                vec!["--oracle".into()]
            } else {
                vec![]
            };
            let seed = round as u64 + 1;
            let before = CpuSnapshot::with_children();
            let v = run_json(&knary, &argv(depth, args.grain_us, seed, &extra))?;
            let (cpu_s, foreign_cpu_s) = CpuSnapshot::since(before);
            if v["correct"] != true {
                bail!("an honest run was wrong: {v}");
            }
            Ok(Honest {
                elapsed_s: v["elapsed_s"].as_f64().context("no elapsed_s")?,
                cpu_s,
                foreign_cpu_s,
            })
        },
        |oracle, r| {
            format!(
                "{} {:.3} s, CPU {}",
                ["without", "with the oracle"][oracle],
                r.elapsed_s,
                r.cpu_s.map_or("?".into(), |c| format!("{c:.2} s"))
            )
        },
    )?;
    let (p, f) = (honest.stats(0)?, honest.stats(1)?);
    let times = |i: usize| -> Vec<f64> { honest.kept[i].iter().map(|r| r.elapsed_s).collect() };
    let cpus = |i: usize| -> Vec<f64> { honest.kept[i].iter().filter_map(|r| r.cpu_s).collect() };
    let (plain, followed) = (times(0), times(1));
    let cpu = (Stats::of(&cpus(0)), Stats::of(&cpus(1)));
    let cpu_ratio = match cpu {
        (Some(a), Some(b)) => Some(b.median / a.median),
        _ => None,
    };
    let ratio = f.median / p.median;
    let summary = json!({
        // The names this report had before the harness's `date_utc` and `loadavg_after`.
        "started": session.date,
        "load_after": loadavg(),
        "depth": depth,
        "fanout": 4,
        "grain_us": args.grain_us,
        "workers": 4,
        "runs": runs,
        "detection": detection,
        "honest": {
            "without_oracle_s": plain,
            "with_oracle_s": followed,
            "median_without_s": p.median,
            "median_with_s": f.median,
            "slowdown": ratio,
            "goal": 1.03,
            "cpu_without_s": cpus(0),
            "cpu_with_s": cpus(1),
            "cpu_ratio": cpu_ratio,
            "not_quiet_rounds": honest.not_quiet,
        },
    });
    let md = markdown(&detection, (p.median, f.median, ratio), cpu, cpu_ratio);
    session.write("online", &session.stem("online"), summary, &md)
}

/// One honest run of part 2: the job's time and the CPU of all its processes.
struct Honest {
    elapsed_s: f64,
    cpu_s: Option<f64>,
    foreign_cpu_s: Option<f64>,
}

impl Timed for Honest {
    fn seconds(&self) -> f64 {
        self.elapsed_s
    }
    fn foreign_cpu_s(&self) -> Option<f64> {
        self.foreign_cpu_s
    }
}

fn markdown(
    detection: &[Value],
    honest: (f64, f64, f64),
    cpu: (Option<Stats>, Option<Stats>),
    cpu_ratio: Option<f64>,
) -> String {
    let mut md = String::from(
        "The online oracle (`paper online`): loopback clusters of real processes: `knary cluster --workers 4 --oracle`, one worker \
         lying at rate q (the test-only `--forge-workers 1 --forge-rate q`).\n\n\
         | q | caught during the run | evicted at (median, s) | liar's tasks by then (median) | theory: tasks to its first checked lie | bound at the spot floor alone (1/(q·f)) |\n\
         |---|---|---|---|---|---|\n",
    );
    for d in detection {
        let f = |k: &str| d[k].as_f64().map_or("-".to_string(), |x| format!("{x:.2}"));
        md.push_str(&format!(
            "| {} | {}/{} | {} | {} | {} | {} |\n",
            d["q"],
            d["caught_during_run"],
            d["runs"].as_array().map_or(0, Vec::len),
            f("evicted_at_s"),
            f("liar_tasks_median"),
            f("theory_liar_tasks"),
            f("floor_bound_liar_tasks"),
        ));
    }
    md.push_str(&format!(
        "\nAn honest run, with and without the oracle following it (interleaved, medians): \
         {:.3} s without, {:.3} s with: slowdown {:.3} (goal ≤ 1.03). CPU of all the run's \
         processes (the oracle's included): {} without, {} with: {}.\n\n\
         Machine and parameters: `online.json`. Command: `cargo run --release -p \
         veriflow-bench --bin paper -- online`.\n",
        honest.0,
        honest.1,
        honest.2,
        cpu.0.map_or("?".into(), |c| format!("{:.2} s", c.median)),
        cpu.1.map_or("?".into(), |c| format!("{:.2} s", c.median)),
        cpu_ratio.map_or("?".into(), |r| format!("{r:.3}x")),
    ));
    md
}

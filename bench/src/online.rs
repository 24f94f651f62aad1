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
//!    ≤ 1.03), in two placements, interleaved in the same rounds:
//!    - *shared*: the oracle is a fifth process on the same two cores, so its re-runs (the
//!      spot checks and the final draw's candidates checked ahead, about a tenth of the tasks
//!      at these sizes) take the workers' CPU;
//!    - *own core*: paper 001's placement, the trusted oracle on a machine of its own. Every
//!      process of the job is bound to core 0 (with and without the oracle) and the oracle
//!      process, found by its command line among the launcher's children, to core 1 (every
//!      thread, as they appear). What is left of the slowdown is what following costs the job
//!      itself: the log reads its checkpoint server serves, and the eviction protocol.
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
    run_placed(knary, argv, None)
}

/// Where the processes of a run go (part 2, *own core*).
#[derive(Clone, Copy, Debug)]
struct Placement {
    /// The core of the launcher and of every process it starts.
    job: usize,
    /// The core the oracle process is moved to.
    oracle: usize,
}

/// Binds thread (or process) `tid` to `core`.
fn bind(tid: libc::pid_t, core: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set, CPU_SET writes inside it, and
    // sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The pid of `parent`'s child whose command line's first argument is `oracle`.
fn oracle_child(parent: u32) -> Option<libc::pid_t> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The fields after the command name, which is in parentheses: state, ppid, ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.split(|&b| b == 0).nth(1) == Some(b"oracle".as_slice()) {
            return Some(pid);
        }
    }
    None
}

/// Moves the oracle child of `parent` to `core`, each of its threads as it appears, until
/// `done`; how many threads it moved.
fn follow_oracle(parent: u32, core: usize, done: &std::sync::atomic::AtomicBool) -> usize {
    use std::sync::atomic::Ordering;
    // This watcher runs beside the oracle, never on the job's core, where its polling would
    // be a cost the runs without the oracle do not have.
    let _ = bind(0, core);
    let mut bound = std::collections::HashSet::new();
    let mut oracle = None;
    while !done.load(Ordering::Relaxed) {
        if oracle.is_none() {
            oracle = oracle_child(parent);
        }
        if let Some(pid) = oracle {
            if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                for t in tasks.flatten() {
                    if let Some(tid) = t.file_name().to_str().and_then(|n| n.parse().ok()) {
                        if !bound.contains(&tid) && bind(tid, core).is_ok() {
                            bound.insert(tid);
                        }
                    }
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    bound.len()
}

/// [`run_json`], with the processes placed as `place` says.
fn run_placed(knary: &Path, argv: &[String], place: Option<Placement>) -> Result<Value> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(knary);
    cmd.args(argv)
        .env("VERIFLOW_ALLOW_FORGERY", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(p) = place {
        // SAFETY: only an async-signal-safe system call between fork and exec.
        unsafe {
            cmd.pre_exec(move || bind(0, p.job));
        }
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot run {}", knary.display()))?;
    let done = std::sync::atomic::AtomicBool::new(false);
    let want_oracle = argv.iter().any(|a| a == "--oracle");
    let parent = child.id();
    let (out, moved) = std::thread::scope(|s| {
        let done = &done;
        let mover = place
            .filter(|_| want_oracle)
            .map(|p| s.spawn(move || follow_oracle(parent, p.oracle, done)));
        let out = child.wait_with_output();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (out, mover.map(|m| m.join().unwrap_or(0)))
    });
    let out = out.with_context(|| format!("cannot run {}", knary.display()))?;
    if moved == Some(0) {
        bail!(
            "`knary {}`: no oracle process was found to move to its core",
            argv.join(" ")
        );
    }
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
    // Part 2: honest runs, without and with the oracle, shared and on its own core,
    // interleaved (seed = round + 1).
    let own_core = (std::thread::available_parallelism().map_or(1, |c| c.get()) >= 2)
        .then_some(Placement { job: 0, oracle: 1 });
    let settings = if own_core.is_some() { 4 } else { 2 };
    let honest = Rounds {
        runs: runs as usize,
        quiet: Quiet::secs(args.quiet_wait),
        retries: 0,
        disturbed: Disturbed::cores(),
        redo: Redo::Round,
        label: "honest".into(),
    }
    .run(
        settings,
        |round, setting| {
            let extra: Vec<String> = if setting % 2 == 1 {
                vec!["--oracle".into()]
            } else {
                vec![]
            };
            let place = if setting >= 2 { own_core } else { None };
            let seed = round as u64 + 1;
            let before = CpuSnapshot::with_children();
            let v = run_placed(&knary, &argv(depth, args.grain_us, seed, &extra), place)?;
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
        |setting, r| {
            format!(
                "{} {:.3} s, CPU {}",
                [
                    "without",
                    "with the oracle",
                    "own core: without",
                    "own core: with the oracle"
                ][setting],
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
    let own = if settings == 4 {
        let (p, f) = (honest.stats(2)?, honest.stats(3)?);
        Some((p.median, f.median, f.median / p.median))
    } else {
        None
    };
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
        "honest_own_core": own.map(|(p, f, r)| json!({
            "placement": "job on core 0, oracle on core 1",
            "without_oracle_s": times(2),
            "with_oracle_s": times(3),
            "median_without_s": p,
            "median_with_s": f,
            "slowdown": r,
            "goal": 1.03,
        })),
    });
    let md = markdown(&detection, (p.median, f.median, ratio), cpu, cpu_ratio, own);
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
    own_core: Option<(f64, f64, f64)>,
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
        "\nAn honest run, with and without the oracle following it (interleaved, medians), \
         the oracle on the workers' two cores: {:.3} s without, {:.3} s with: slowdown {:.3} \
         (goal ≤ 1.03). CPU of all the run's processes (the oracle's included): {} without, {} \
         with: {}.\n",
        honest.0,
        honest.1,
        honest.2,
        cpu.0.map_or("?".into(), |c| format!("{:.2} s", c.median)),
        cpu.1.map_or("?".into(), |c| format!("{:.2} s", c.median)),
        cpu_ratio.map_or("?".into(), |r| format!("{r:.3}x")),
    ));
    if let Some((p, f, r)) = own_core {
        md.push_str(&format!(
            "\nThe oracle on a core of its own (paper 001's trusted machine: the job's processes \
             on core 0 with and without the oracle, the oracle on core 1), in the same rounds: \
             {p:.3} s without, {f:.3} s with: slowdown **{r:.3}** (goal ≤ 1.03: {}).\n",
            if r <= 1.03 { "met" } else { "missed" }
        ));
    }
    md.push_str(
        "\nMachine and parameters: `online.json`. Command: `cargo run --release -p \
         veriflow-bench --bin paper -- online`.\n",
    );
    md
}

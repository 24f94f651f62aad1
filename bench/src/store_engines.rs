//! `paper store-engines`: issue 18 point 7, sled against redb and fjall as the log's store.
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- store-engines [--tasks 1000000]
//!     [--recovery-tasks 3000000] [--reps 3] [--threads 2] [--vnodes 2] [--scratch /tmp]
//!     [--out bench/results]
//! ```
//!
//! The log's own workload: a knary tree of tiny tasks (grain 0) run with its durable log
//! through each engine (`RuntimeBuilder::store`, group commit as in every run), each run in a
//! child process (this binary again, so that its peak RSS is the run's alone), interleaved
//! (no log, sled, redb, fjall, then again) so that the machine's load falls on all alike.
//! Each child reports:
//!
//! - **run**: wall time and this process's CPU seconds of the run, against the same run
//!   without a log (S0): CPU per task of logging is (CPU − CPU of S0) / tasks, and wall S1/S0;
//!   peak RSS (VmHWM); bytes of the store's directory once the run is durable; then the time
//!   to open the store read-only (the engine's copy or read-only mode, as `inspect` does) and
//!   to read every pair back in pages as the log reader does (`scan_page`);
//! - **recovery** (`--recovery-tasks`): vnode 1 fails once 90 % of the tasks completed and is
//!   rebuilt from its log (`exec/recover.rs`, the code `run --resume` runs): the recovery time
//!   and the run's peak RSS.
//!
//! Medians over `--reps`; the load average before and after, and the CPU other processes
//! used during each run, are recorded (the machine is shared). Results: `store_engines.json`
//! and `store_engines.md`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::json;
use veriflow::runtime::Kill;
use veriflow::{Program, Runtime, VnodeId};
use veriflow_checkpoint::{FjallStore, PageLimit, RedbStore, SledStore, Store};

use crate::harness::{dir_bytes, loadavg, status_mib, utc_now, Machine};
use crate::{knary_registry, CpuSnapshot, Shape};

/// The engines, in the order runs interleave ("none" is S0: no log).
const ENGINES: [&str; 4] = ["none", "sled", "redb", "fjall"];
/// The failing vnode of a recovery run, and when it fails (as `paper memory`).
const FAILING_VNODE: u32 = 1;
const FAIL_AT: f64 = 0.9;
/// Pages of the read-back scan: the log reader's tail page (`log/reader.rs`, TAIL_PAGE).
const READ_PAGE: PageLimit = PageLimit {
    max_keys: 256,
    max_bytes: 16 << 20,
};

/// Options of `paper store-engines`.
#[derive(Args, Debug)]
pub struct StoreEnginesArgs {
    /// Tasks of a run (the knary tree closest to it).
    #[arg(long, default_value_t = 1_000_000)]
    pub tasks: u64,
    /// Tasks of a recovery run (0: none).
    #[arg(long, default_value_t = 3_000_000)]
    pub recovery_tasks: u64,
    /// Repetitions of each run, interleaved across engines.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Vnodes.
    #[arg(long, default_value_t = 2)]
    pub vnodes: u32,
    /// Where the runs' stores go (each removed after its run) [default: the system's
    /// temporary directory].
    #[arg(long)]
    pub scratch: Option<PathBuf>,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// (internal) Run one child: `ENGINE:MODE` (mode `run` or `recovery`).
    #[arg(long, hide = true)]
    pub child: Option<String>,
    /// (internal) The child's store directory.
    #[arg(long, hide = true)]
    pub child_dir: Option<PathBuf>,
}

/// What one child measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measure {
    /// "none", "sled", "redb" or "fjall".
    pub engine: String,
    /// "run" or "recovery".
    pub mode: String,
    /// Tasks completed.
    pub tasks: u64,
    /// Events logged.
    pub events: u64,
    /// Wall time of the run, s.
    pub elapsed_s: f64,
    /// CPU seconds of this process during the run.
    pub cpu_s: f64,
    /// CPU seconds other processes used during the run.
    pub foreign_cpu_s: f64,
    /// Peak RSS (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// Bytes of the store's directory after the run.
    pub disk_bytes: u64,
    /// Opening the store read-only, s (run mode).
    pub read_open_s: f64,
    /// Reading every pair back in pages, s (run mode).
    pub read_scan_s: f64,
    /// Pairs read back.
    pub read_pairs: u64,
    /// Rebuilding the failed vnode from its log, ms (recovery mode).
    pub recovery_ms: f64,
    /// Log events the recovery decoded.
    pub recovery_events: u64,
}

fn open(engine: &str, dir: &Path) -> Result<Arc<dyn Store>> {
    Ok(match engine {
        "sled" | "none" => Arc::new(SledStore::open(dir)?),
        "redb" => Arc::new(RedbStore::open(dir)?),
        "fjall" => Arc::new(FjallStore::open(dir)?),
        other => bail!("unknown engine {other}"),
    })
}

fn open_read_only(engine: &str, dir: &Path) -> Result<Arc<dyn Store>> {
    Ok(match engine {
        "sled" => Arc::new(SledStore::open_read_only(dir)?),
        "redb" => Arc::new(RedbStore::open_read_only(dir)?),
        "fjall" => Arc::new(FjallStore::open_read_only(dir)?),
        other => bail!("unknown engine {other}"),
    })
}

/// The child: one run, printed as JSON on stdout.
fn child(args: &StoreEnginesArgs, spec: &str) -> Result<()> {
    let (engine, mode) = spec.split_once(':').context("--child ENGINE:MODE")?;
    let dir = args.child_dir.as_deref().context("--child-dir")?;
    let recovery = mode == "recovery";
    let tasks = if recovery {
        args.recovery_tasks
    } else {
        args.tasks
    };
    let shape = Shape::about(tasks)?;
    let expected = shape.tasks()?;
    let logs = engine != "none";
    let mut builder = Runtime::builder(knary_registry()?)
        .program(<knary::Knary as Program>::NAME)
        .threads(args.threads)
        .vnodes(args.vnodes)
        .checkpoint(logs);
    if logs {
        builder = builder.store(open(engine, dir)?);
    }
    if recovery {
        builder = builder.kills(vec![Kill {
            vnode: VnodeId(FAILING_VNODE),
            after: (expected as f64 * FAIL_AT) as u64,
            retarget: false,
        }]);
    }
    let runtime = builder.build().context("building the runtime")?;
    let (root, inputs) = shape.program().root();
    let before = CpuSnapshot::now();
    let t0 = Instant::now();
    let r = runtime
        .run(root, inputs)
        .with_context(|| format!("knary {shape:?} on {engine}"))?;
    let elapsed_s = t0.elapsed().as_secs_f64();
    let cpu_s = CpuSnapshot::own_since(before).unwrap_or(f64::NAN);
    let foreign_cpu_s = CpuSnapshot::foreign_since(before).unwrap_or(f64::NAN);
    if r.outputs.0 != shape.nodes()? {
        bail!("knary {shape:?} on {engine}: counted {} nodes", r.outputs.0);
    }
    let failed = &r.vnodes[FAILING_VNODE as usize];
    if failed.failures != u64::from(recovery) {
        bail!("vnode {FAILING_VNODE} failed {} times", failed.failures);
    }
    drop(runtime);
    let peak_rss_mib = status_mib("VmHWM:").unwrap_or(f64::NAN);
    let disk_bytes = dir_bytes(dir);
    let (mut read_open_s, mut read_scan_s, mut read_pairs) = (0.0, 0.0, 0);
    if logs && !recovery {
        let t = Instant::now();
        let store = open_read_only(engine, dir)?;
        read_open_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = store.scan_page(b"", after.as_deref(), READ_PAGE)?;
            read_pairs += page.pairs.len() as u64;
            after = page.pairs.last().map(|(k, _)| k.clone());
            if !page.more || after.is_none() {
                break;
            }
        }
        read_scan_s = t.elapsed().as_secs_f64();
    }
    let m = Measure {
        engine: engine.to_string(),
        mode: mode.to_string(),
        tasks: r.tasks,
        events: r.events,
        elapsed_s,
        cpu_s,
        foreign_cpu_s,
        peak_rss_mib,
        disk_bytes,
        read_open_s,
        read_scan_s,
        read_pairs,
        recovery_ms: failed.recovery_micros as f64 / 1e3,
        recovery_events: failed.recovery_log_events,
    };
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &m)?;
    writeln!(out)?;
    Ok(())
}

/// Runs one child in a fresh store directory under `scratch`, removed afterwards.
fn measure(args: &StoreEnginesArgs, scratch: &Path, engine: &str, mode: &str) -> Result<Measure> {
    let dir = tempfile::Builder::new()
        .prefix("veriflow-engines-")
        .tempdir_in(scratch)
        .with_context(|| format!("creating a store directory in {}", scratch.display()))?;
    let exe = std::env::current_exe().context("finding this binary")?;
    let out = Command::new(exe)
        .args(["store-engines", "--child", &format!("{engine}:{mode}")])
        .arg("--child-dir")
        .arg(dir.path())
        .args(["--tasks", &args.tasks.to_string()])
        .args(["--recovery-tasks", &args.recovery_tasks.to_string()])
        .args(["--threads", &args.threads.to_string()])
        .args(["--vnodes", &args.vnodes.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running a child")?;
    let path = dir.path().to_path_buf();
    dir.close()
        .with_context(|| format!("removing {}", path.display()))?;
    if !out.status.success() {
        bail!("the child {engine}:{mode} failed: {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().context("the child printed nothing")?;
    serde_json::from_str(line).with_context(|| format!("the child's answer: {line}"))
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.retain(|x| x.is_finite());
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Medians of one engine and mode.
#[derive(Debug, Clone, Serialize)]
struct Summary {
    engine: String,
    mode: String,
    runs: usize,
    tasks: u64,
    elapsed_s: f64,
    wall_over_s0: f64,
    cpu_s: f64,
    logging_cpu_us_per_task: f64,
    peak_rss_mib: f64,
    disk_mib: f64,
    disk_bytes_per_task: f64,
    read_open_s: f64,
    read_scan_s: f64,
    recovery_ms: f64,
    foreign_cpu_s: f64,
}

fn summarize(all: &[Measure], engine: &str, mode: &str) -> Option<Summary> {
    let ms: Vec<&Measure> = all
        .iter()
        .filter(|m| m.engine == engine && m.mode == mode)
        .collect();
    if ms.is_empty() {
        return None;
    }
    let med = |f: fn(&Measure) -> f64| median(ms.iter().map(|m| f(m)).collect());
    let s0: Vec<&Measure> = all
        .iter()
        .filter(|m| m.engine == "none" && m.mode == "run")
        .collect();
    let s0_elapsed = median(s0.iter().map(|m| m.elapsed_s).collect());
    let s0_cpu = median(s0.iter().map(|m| m.cpu_s).collect());
    let tasks = ms[0].tasks;
    let disk = med(|m| m.disk_bytes as f64);
    Some(Summary {
        engine: engine.to_string(),
        mode: mode.to_string(),
        runs: ms.len(),
        tasks,
        elapsed_s: med(|m| m.elapsed_s),
        wall_over_s0: if mode == "run" {
            med(|m| m.elapsed_s) / s0_elapsed
        } else {
            f64::NAN
        },
        cpu_s: med(|m| m.cpu_s),
        logging_cpu_us_per_task: if mode == "run" {
            (med(|m| m.cpu_s) - s0_cpu) / tasks as f64 * 1e6
        } else {
            f64::NAN
        },
        peak_rss_mib: med(|m| m.peak_rss_mib),
        disk_mib: disk / (1u64 << 20) as f64,
        disk_bytes_per_task: disk / tasks as f64,
        read_open_s: med(|m| m.read_open_s),
        read_scan_s: med(|m| m.read_scan_s),
        recovery_ms: med(|m| m.recovery_ms),
        foreign_cpu_s: med(|m| m.foreign_cpu_s),
    })
}

/// Runs `paper store-engines` (module docs) and writes its results.
pub fn run(args: &StoreEnginesArgs) -> Result<()> {
    if let Some(spec) = &args.child {
        return child(args, spec);
    }
    let scratch = args.scratch.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let machine = Machine::now();
    let started = utc_now();
    let load_before = loadavg();
    let mut all = Vec::new();
    for rep in 0..args.reps {
        for engine in ENGINES {
            let m = measure(args, &scratch, engine, "run")?;
            eprintln!(
                "rep {rep} {engine} run: {:.2} s, {:.2} CPU s, {:.0} MiB peak, {:.1} MiB on disk \
                 (others used {:.1} CPU s)",
                m.elapsed_s,
                m.cpu_s,
                m.peak_rss_mib,
                m.disk_bytes as f64 / (1u64 << 20) as f64,
                m.foreign_cpu_s
            );
            all.push(m);
        }
        if args.recovery_tasks > 0 {
            for engine in &ENGINES[1..] {
                let m = measure(args, &scratch, engine, "recovery")?;
                eprintln!(
                    "rep {rep} {engine} recovery: {:.0} ms, run {:.1} s, {:.0} MiB peak",
                    m.recovery_ms, m.elapsed_s, m.peak_rss_mib
                );
                all.push(m);
            }
        }
    }
    let load_after = loadavg();
    let summaries: Vec<Summary> = ["run", "recovery"]
        .iter()
        .flat_map(|mode| ENGINES.iter().filter_map(|e| summarize(&all, e, mode)))
        .collect();
    let command = format!(
        "cargo run --release -p veriflow-bench --bin paper -- store-engines --tasks {} \
         --recovery-tasks {} --reps {} --threads {} --vnodes {}",
        args.tasks, args.recovery_tasks, args.reps, args.threads, args.vnodes
    );
    let header = format!(
        "{started}, {} cores ({}), git {}, load average {} before and {} after. {command}",
        machine.cores,
        machine.cpu.as_deref().unwrap_or("?"),
        machine.git.as_deref().unwrap_or("?"),
        load_before.as_deref().unwrap_or("?"),
        load_after.as_deref().unwrap_or("?"),
    );
    let json = json!({
        "experiment": "store-engines",
        "issue": "18.7",
        "when": started,
        "machine": {
            "cores": machine.cores,
            "cpu": machine.cpu,
            "kernel": machine.kernel,
            "rustc": machine.rustc,
            "git": machine.git,
            "load_before": load_before,
            "load_after": load_after,
        },
        "command": command,
        "summaries": summaries,
        "runs": all,
    });
    let json_path = args.out.join("store_engines.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    let mut md = String::new();
    md.push_str("# The log's store: sled against redb and fjall (issue 18 point 7)\n\n");
    md.push_str(&header);
    md.push_str(
        "\n\nknary, grain 0, the log through each engine with group commit (one `put_batch` \
         of ~64 KiB segments + watermark keys, then `flush`). Medians; \"none\" is S0 (no \
         log). Logging CPU per task is (CPU − CPU of S0) / tasks. Read-back: opening the store \
         read-only (as `inspect`) and reading every pair in pages (as the log reader). \
         Recovery: vnode 1 fails at 90 % of the tasks and is rebuilt from its log.\n\n",
    );
    md.push_str(
        "| engine | mode | runs | tasks | wall (s) | wall / S0 | CPU (s) | logging CPU (µs/task) \
         | peak RSS (MiB) | disk (MiB) | disk (B/task) | read-only open (s) | read back (s) \
         | recovery (ms) | others' CPU (s) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let f = |x: f64, p: usize| {
        if x.is_finite() {
            format!("{x:.p$}")
        } else {
            "-".to_string()
        }
    };
    for s in &summaries {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            s.engine,
            s.mode,
            s.runs,
            s.tasks,
            f(s.elapsed_s, 2),
            f(s.wall_over_s0, 2),
            f(s.cpu_s, 2),
            f(s.logging_cpu_us_per_task, 2),
            f(s.peak_rss_mib, 0),
            f(s.disk_mib, 1),
            f(s.disk_bytes_per_task, 0),
            f(s.read_open_s, 2),
            f(s.read_scan_s, 2),
            f(s.recovery_ms, 0),
            f(s.foreign_cpu_s, 1),
        ));
    }
    let md_path = args.out.join("store_engines.md");
    std::fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    Ok(())
}

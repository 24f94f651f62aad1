//! `paper memory`: issue 13 point 8, memory and recovery time against tasks run.
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- memory [--tasks 1000000,3000000,...]
//!     [--whole-log-max N] [--threads 2] [--vnodes 2] [--max-log-gib 5] [--scratch DIR]
//!     [--out DIR]
//! ```
//!
//! For each size, a child process (this binary again, so that its peak RSS is the run's alone)
//! runs a knary tree of about that many tiny tasks (grain 0) with a durable log in a fresh sled
//! store, and makes vnode 1 fail once 90 % of the tasks have completed: it is rebuilt from its
//! log (`exec/recover.rs`), the same code that `run --resume` and a cluster take-over run. The
//! child reports its peak RSS (`VmHWM` of /proc/self/status), its RSS sampled against tasks
//! completed (about every 100 ms), the recovery time and the log events it decoded, the
//! largest graph a vnode held, and the bytes of log written. Two settings:
//!
//! - **checkpoints** (the default, `log/mod.rs` rule 9): the log writer keeps each vnode's
//!   compacted recovery state and stores it every 32 MiB of log; recovery reads it and the log
//!   after it;
//! - **whole log** (`RuntimeBuilder::checkpoint_every(0)`): no checkpoint, recovery folds the
//!   whole log of the vnode (the behaviour before issue 13 point 8), up to `--whole-log-max`
//!   tasks;
//! - **no log** (`checkpoint(false)`, no failure): the runtime alone, without the store.
//!
//! The log costs about 300 bytes per knary task on disk, so a size whose log would pass
//! `--max-log-gib` is skipped and said so (the machine's disk is shared). `--child sled
//! --tasks N` (a diagnostic) writes N 64 KiB values into a sled store and prints its RSS: sled
//! 0.34's memory grows with what it wrote, whatever its cache capacity, up to a ceiling (about
//! 447 MiB, reached after 1 GiB written and unchanged at 3 GiB). Results:
//! `memory.json`, `memory.md`, `memory.svg`/`memory.png`.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::json;
use veriflow::runtime::Kill;
use veriflow::{Program, Runtime, VnodeId};
use veriflow_checkpoint::{SledStore, Store};

use crate::harness::{dir_bytes, plot, scratch_dir, status_mib, Figure, Plots, Session, COLORS};
use crate::{knary_registry, Shape};

/// Bytes of sled directory per knary task assumed before a size is run (measured: ~300 at
/// fanout 3, sled's own overhead included), to skip sizes that would not fit `--max-log-gib`.
const LOG_BYTES_PER_TASK: f64 = 300.0;
/// The failing vnode fails once this share of the tasks has completed: late, so that its log
/// is nearly the whole run's share.
const FAIL_AT: f64 = 0.9;
/// The failing vnode.
const FAILING_VNODE: u32 = 1;

/// Options of `paper memory`.
#[derive(Args, Debug)]
pub struct MemoryArgs {
    /// Tasks per run (comma-separated): each becomes the knary tree closest to it.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000_000u64, 3_000_000, 10_000_000, 30_000_000, 100_000_000])]
    pub tasks: Vec<u64>,
    /// Largest size also run without checkpoints (recovery from the whole log: its memory
    /// grows with the log, so it is kept within the machine's).
    #[arg(long, default_value_t = 10_000_000)]
    pub whole_log_max: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Vnodes.
    #[arg(long, default_value_t = 2)]
    pub vnodes: u32,
    /// Skip sizes whose log would exceed this (GiB, estimated at 300 bytes per task).
    #[arg(long, default_value_t = 3.5)]
    pub max_log_gib: f64,
    /// Where the runs' log directories go (each removed after its run) [default: the system's
    /// temporary directory].
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// (internal) Run one measurement in this process and print it as JSON: `on` with
    /// checkpoints, `off` without.
    #[arg(long, hide = true)]
    pub child: Option<String>,
    /// (internal) The child's log directory.
    #[arg(long, hide = true)]
    pub child_dir: Option<PathBuf>,
}

/// What one child measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Measure {
    /// `checkpoints` or `whole log`.
    pub setting: String,
    /// The knary tree.
    pub depth: u32,
    /// Its fanout.
    pub fanout: u32,
    /// Tasks run.
    pub tasks: u64,
    /// Events logged.
    pub events: u64,
    /// Bytes of the sled directory after the run.
    pub log_bytes: u64,
    /// Wall time of the run, s.
    pub elapsed_s: f64,
    /// Peak RSS of the process (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// RSS (MiB) against tasks completed, sampled about every 100 ms.
    pub rss_samples: Vec<(u64, f64)>,
    /// Time to rebuild the failed vnode, ms.
    pub recovery_ms: f64,
    /// Log events the recovery decoded.
    pub recovery_events: u64,
    /// Whether the recovery started from a checkpoint.
    pub from_checkpoint: bool,
    /// Tasks the recovery reused and restarted.
    pub reused: u64,
    /// Tasks restarted.
    pub restarted: u64,
    /// Largest graph (tasks and data entries) a vnode held.
    pub peak_graph: u64,
}

/// The child: one run, printed as JSON on stdout.
fn child(args: &MemoryArgs, setting: &str) -> Result<()> {
    let tasks = *args.tasks.first().context("the child needs --tasks")?;
    let dir = args
        .child_dir
        .as_deref()
        .context("the child needs --child-dir")?;
    if setting == "sled" {
        let store = SledStore::open(dir)?;
        let value = vec![7u8; 64 << 10];
        for i in 0..tasks {
            let key = format!("seg/{i:012}");
            store.put_batch(&[(key.into_bytes(), value.clone())])?;
            if i % 16 == 15 {
                store.flush()?;
            }
            if i % 1000 == 0 {
                eprintln!(
                    "{} MiB written: RSS {:?}",
                    (i * 64) >> 10,
                    status_mib("VmRSS:")
                );
            }
        }
        return Ok(());
    }
    let shape = Shape::about(tasks)?;
    let expected = shape.tasks()?;
    let checkpoints = match setting {
        "on" => veriflow::DEFAULT_CHECKPOINT_BYTES,
        "off" | "nolog" => 0,
        other => bail!("unknown child setting {other}"),
    };
    let store: Arc<dyn Store> = Arc::new(
        SledStore::open(dir)
            .with_context(|| format!("opening a sled store in {}", dir.display()))?,
    );
    let logs = setting != "nolog";
    let samples: Arc<Mutex<Vec<(u64, f64)>>> = Arc::default();
    let s = samples.clone();
    // About 200 points over the run, whatever its size.
    let step = (expected / 200).max(1);
    let runtime = Runtime::builder(knary_registry()?)
        .program(<knary::Knary as Program>::NAME)
        .threads(args.threads)
        .vnodes(args.vnodes)
        .store(store)
        .checkpoint(logs)
        .checkpoint_every(checkpoints)
        .kills(if logs {
            vec![Kill {
                vnode: VnodeId(FAILING_VNODE),
                after: (expected as f64 * FAIL_AT) as u64,
                retarget: false,
            }]
        } else {
            Vec::new()
        })
        .on_progress(Arc::new(move |done| {
            let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
            if s.last().is_none_or(|&(d, _)| done >= d + step) {
                if let Some(rss) = status_mib("VmRSS:") {
                    s.push((done, rss));
                }
            }
        }))
        .build()
        .context("building the runtime")?;
    let (root, inputs) = shape.program().root();
    let t0 = Instant::now();
    let r = runtime
        .run(root, inputs)
        .with_context(|| format!("knary {shape:?}"))?;
    let elapsed_s = t0.elapsed().as_secs_f64();
    if r.outputs.0 != shape.nodes()? {
        bail!("knary {shape:?}: counted {} nodes", r.outputs.0);
    }
    let failed = &r.vnodes[FAILING_VNODE as usize];
    if failed.failures != u64::from(logs) {
        bail!(
            "vnode {FAILING_VNODE} failed {} times, not once",
            failed.failures
        );
    }
    drop(runtime);
    let m = Measure {
        setting: match setting {
            "on" => "checkpoints",
            "off" => "whole log",
            _ => "no log",
        }
        .to_string(),
        depth: shape.depth,
        fanout: shape.fanout,
        tasks: r.tasks,
        events: r.events,
        log_bytes: dir_bytes(dir),
        elapsed_s,
        peak_rss_mib: status_mib("VmHWM:").unwrap_or(f64::NAN),
        rss_samples: std::mem::take(&mut *samples.lock().unwrap_or_else(|p| p.into_inner())),
        recovery_ms: failed.recovery_micros as f64 / 1e3,
        recovery_events: failed.recovery_log_events,
        from_checkpoint: failed.checkpoint_recoveries > 0,
        reused: failed.reused_tasks,
        restarted: failed.recovered_tasks,
        peak_graph: r.vnodes.iter().map(|s| s.peak_graph).max().unwrap_or(0),
    };
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &m)?;
    writeln!(out)?;
    Ok(())
}

/// Runs one child and removes its log directory.
fn measure(args: &MemoryArgs, scratch: &Path, tasks: u64, setting: &str) -> Result<Measure> {
    let dir = tempfile::Builder::new()
        .prefix("veriflow-memory-")
        .tempdir_in(scratch)
        .with_context(|| format!("creating a log directory in {}", scratch.display()))?;
    let exe = std::env::current_exe().context("finding this binary")?;
    let out = Command::new(exe)
        .args(["memory", "--child", setting, "--child-dir"])
        .arg(dir.path())
        .args(["--tasks", &tasks.to_string()])
        .args(["--threads", &args.threads.to_string()])
        .args(["--vnodes", &args.vnodes.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running a child")?;
    let path = dir.path().to_path_buf();
    dir.close()
        .with_context(|| format!("removing {}", path.display()))?;
    if !out.status.success() {
        bail!(
            "the child for {tasks} tasks ({setting}) failed: {}",
            out.status
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().context("the child printed nothing")?;
    serde_json::from_str(line).with_context(|| format!("the child's answer: {line}"))
}

/// Runs `paper memory` (module docs) and writes its results.
pub fn run(args: &MemoryArgs) -> Result<()> {
    if let Some(setting) = &args.child {
        return child(args, setting);
    }
    let session = Session::start(args.out.as_deref(), false)?;
    let scratch = scratch_dir(args.scratch.as_deref())?;
    let mut measures: Vec<Measure> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for &tasks in &args.tasks {
        let shape = Shape::about(tasks)?;
        let actual = shape.tasks()?;
        let gib = actual as f64 * LOG_BYTES_PER_TASK / f64::from(1u32 << 30);
        if gib > args.max_log_gib {
            let why = format!(
                "{actual} tasks (knary d{} k{}): its log would take about {gib:.1} GiB, above \
                 --max-log-gib {}",
                shape.depth, shape.fanout, args.max_log_gib
            );
            eprintln!("memory: skipping {why}");
            skipped.push(why);
            continue;
        }
        for setting in ["on", "off", "nolog"] {
            if setting == "off" && tasks > args.whole_log_max {
                continue;
            }
            eprintln!(
                "memory: {actual} tasks (knary d{} k{}), checkpoints {setting}",
                shape.depth, shape.fanout
            );
            let m = measure(args, &scratch, tasks, setting)?;
            eprintln!(
                "  {:.1} s, peak RSS {:.0} MiB, recovery {:.0} ms ({} events decoded{}), log {:.2} GiB, peak graph {}",
                m.elapsed_s,
                m.peak_rss_mib,
                m.recovery_ms,
                m.recovery_events,
                if m.from_checkpoint { ", from a checkpoint" } else { "" },
                m.log_bytes as f64 / f64::from(1u32 << 30),
                m.peak_graph
            );
            measures.push(m);
        }
    }
    let figure = MemoryFigure(measures);
    let plots = session.plot("memory", &figure);
    let measures = figure.0;
    let report = json!({
        "experiment": "memory",
        "date": session.date,
        // This report's own machine block, as before the harness.
        "machine": {
            "cores": session.machine.cores, "cpu": session.machine.cpu,
            "kernel": session.machine.kernel, "rustc": session.machine.rustc,
            "git": session.machine.git, "load_before": session.loadavg_before(),
        },
        "settings": {
            "threads": args.threads, "vnodes": args.vnodes, "failing_vnode": FAILING_VNODE,
            "fails_at": FAIL_AT, "grain_us": 0,
            "checkpoint_every_bytes": veriflow::DEFAULT_CHECKPOINT_BYTES,
            "max_log_gib": args.max_log_gib, "whole_log_max": args.whole_log_max,
        },
        "runs": measures,
        "skipped": skipped,
        "plots": plots.json(),
    });
    let md = markdown(args, &measures, &skipped, &plots);
    session.write("memory", "memory", report, &md)
}

fn markdown(args: &MemoryArgs, measures: &[Measure], skipped: &[String], plots: &Plots) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Memory and recovery time against tasks run (issue 13 point 8)\n"
    );
    let _ = writeln!(
        s,
        "knary, grain 0, {} threads, {} vnodes, sled store; \
         vnode {FAILING_VNODE} fails once {:.0} % of the tasks completed and is rebuilt from \
         its log. Peak RSS is the child process's VmHWM; recovery is the time to rebuild the \
         failed vnode from the store. Checkpoints every {} MiB of log (`log/mod.rs` rule 9); \
         \"whole log\" is `checkpoint_every(0)`. Command: `cargo run --release -p \
         veriflow-bench --bin paper -- memory --tasks {}`.\n",
        args.threads,
        args.vnodes,
        FAIL_AT * 100.0,
        veriflow::DEFAULT_CHECKPOINT_BYTES >> 20,
        args.tasks
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    let _ = writeln!(
        s,
        "| setting | tasks | tree | log (GiB) | bytes/task | run (s) | peak RSS (MiB) | recovery (ms) | events decoded | reused / restarted | peak graph |"
    );
    let _ = writeln!(s, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for m in measures {
        let _ = writeln!(
            s,
            "| {} | {} | d{} k{} | {:.2} | {:.0} | {:.1} | {:.0} | {:.0} | {} | {} / {} | {} |",
            m.setting,
            m.tasks,
            m.depth,
            m.fanout,
            m.log_bytes as f64 / f64::from(1u32 << 30),
            m.log_bytes as f64 / m.tasks.max(1) as f64,
            m.elapsed_s,
            m.peak_rss_mib,
            m.recovery_ms,
            m.recovery_events,
            m.reused,
            m.restarted,
            m.peak_graph
        );
    }
    if !skipped.is_empty() {
        let _ = writeln!(s, "\nNot run (disk):\n");
        for w in skipped {
            let _ = writeln!(s, "- {w}");
        }
    }
    let _ = writeln!(s, "\nPlots: {}.", plots.markdown());
    s
}

/// `memory.png`: every run's measure.
pub(crate) struct MemoryFigure(pub(crate) Vec<Measure>);

impl MemoryFigure {
    /// The figure of a `memory.json` (`paper replot`).
    pub(crate) fn from_json(j: &serde_json::Value) -> anyhow::Result<MemoryFigure> {
        let runs = j.get("runs").context("no runs")?;
        Ok(MemoryFigure(
            serde_json::from_value(runs.clone())
                .context("runs are not the runs of paper memory")?,
        ))
    }
}

/// Left: peak RSS against tasks run; right: recovery time against tasks run (log scales).
impl Figure for MemoryFigure {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String> {
        let f = self;
        let measures = &f.0;
        root.fill(&WHITE).map_err(plot::err)?;
        let (left, right) = root.split_horizontally(PLOT_HALF);
        let tasks = |m: &Measure| m.tasks as f64;
        let (lo, hi) = measures
            .iter()
            .map(tasks)
            .fold((f64::MAX, 0.0f64), |(a, b), t| (a.min(t), b.max(t)));
        let (lo, hi) = if lo < hi {
            (lo / 1.5, hi * 1.5)
        } else {
            (1e5, 1e8)
        };
        let series = |setting: &str| -> Vec<&Measure> {
            measures.iter().filter(|m| m.setting == setting).collect()
        };
        for (area, title, value, unit) in [
            (
                left,
                "peak RSS",
                (|m: &Measure| m.peak_rss_mib) as fn(&Measure) -> f64,
                "MiB",
            ),
            (
                right,
                "recovery of one vnode",
                |m: &Measure| m.recovery_ms.max(0.1),
                "ms",
            ),
        ] {
            // No run without a log fails: it has no recovery to draw.
            let drawn = |m: &&Measure| !(title.starts_with("recovery") && m.setting == "no log");
            let top = measures
                .iter()
                .filter(drawn)
                .map(value)
                .fold(1.0f64, f64::max)
                * 2.0;
            let bottom = measures
                .iter()
                .filter(drawn)
                .map(value)
                .fold(f64::MAX, f64::min)
                .min(top / 4.0)
                / 2.0;
            let mut chart = ChartBuilder::on(&area)
                .caption(
                    format!("{title} vs tasks run (knary, grain 0)"),
                    ("sans-serif", 18),
                )
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d((lo..hi).log_scale(), (bottom.max(0.01)..top).log_scale())
                .map_err(plot::err)?;
            chart
                .configure_mesh()
                .x_desc("tasks run")
                .y_desc(unit)
                .draw()
                .map_err(plot::err)?;
            for (i, setting) in ["checkpoints", "whole log", "no log"].iter().enumerate() {
                let points: Vec<(f64, f64)> = series(setting)
                    .into_iter()
                    .filter(drawn)
                    .map(|m| (tasks(m), value(m)))
                    .collect();
                if points.is_empty() {
                    continue;
                }
                let c = COLORS[i];
                chart
                    .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
                    .map_err(plot::err)?
                    .label(*setting)
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2))
                    });
                chart
                    .draw_series(points.into_iter().map(|p| Circle::new(p, 4, c.filled())))
                    .map_err(plot::err)?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(plot::err)?;
        }
        root.present().map_err(plot::err)
    }
}

/// Half the plot's width, for the two panels.
const PLOT_HALF: u32 = 480;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_are_close_to_the_sizes_asked() {
        for tasks in [1_000_000u64, 10_000_000, 100_000_000] {
            let t = Shape::about(tasks).unwrap().tasks().unwrap();
            let off = t.abs_diff(tasks) as f64 / tasks as f64;
            assert!(off < 0.2, "{tasks}: {t}");
        }
    }
}

//! `paper certify`: the certifier's figures (paper 001 §V Fig. 4, §VI Fig. 7) and the
//! throughput of its linear phases.
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- certify [--runs N] [--grain-us G]
//!     [--store sled|memory] [--depths D,..] [--quick] [--out DIR] [--scratch DIR]
//!     [--quiet-wait SECS] [--retries N] [--linear]
//! ```
//!
//! `--linear` (about 2 minutes at depths 6 and 7 on 2 cores): the linear phases, the floor and
//! the end-to-end partial `certify` with its peak memory only (no full duplication, no plots),
//! written as `certify-linear.*`.
//!
//! What it measures, in order:
//!
//! 1. **Fig. 4** (no run needed): k = min(⌈f_{ε,q}(n)⌉, n) for ε ∈ {0.1, 0.05, 0.01} and
//!    q ∈ {0.01, 0.05}, n from 1 to 10⁶ (a 1-2-5 table; a log-spaced curve in the plot),
//!    straight from `certifier::sample`.
//! 2. **Logs**: for each size, knary of fanout [`FANOUT`] and depth 3..=7 (122 to 1,222,222
//!    tasks, or `--depths`; every node spins `--grain-us`, the `Sum` tasks do not) runs once on a 2-thread
//!    runtime into a fresh store in a temporary directory under `--scratch`. A sled store is
//!    then closed and opened again, as a separate `knary certify` process would.
//! 3. **Phases** (the linear part of any certification) on that log, `--runs` times: every
//!    segment read with its frame checked and its events walked undecoded (scan + frame, what
//!    any decoder pays), the same segments decoded into `Event`s and dropped (decode into
//!    events), reading and decoding the vnodes' segments alone (`LogReader::read_vnode` on
//!    every vnode, in parallel, as `Track::load` does), then the whole `Track::load` (read + decode + merge into G), G_S
//!    (`terminal_subgraph`), the structural check, the Merkle root of G_S and the log digest
//!    (the Merkle root over G, which `certify` computes too). The target is on
//!    load + G_S + structural check, in tasks per second, with the CPU seconds this process
//!    took for them (wall times mislead on a busy machine).
//!    Then the **floor**: every byte of the store read back (a sled store's files, a memory
//!    store's pairs) and hashed with blake3 (multithreaded), which no certifier can beat.
//! 4. **Fig. 7**: `certify` at ε = 0.1, q = 0.01 with a given seed, partial (k tasks) and full
//!    (`Options { full: true }`, every task of G_S re-run), `--runs` times each, interleaved;
//!    every certificate must ACCEPT (the runs are honest) and name n = the run's tasks. The
//!    partial one is the end-to-end time set against the floor; its peak memory is this
//!    process's `VmHWM` after a reset (`/proc/self/clear_refs`) just before it, set against the
//!    store's size (it counts what the process held before: the logs' runs, G of rule 3).
//! 5. **`knary certify` in a process of its own** (sled stores only), `--runs` times,
//!    interleaved with rule 4's partial runs: the CLI over the same store with the same ε, q
//!    and seed, signing with a key made for this run (`--knary-bin`, or the `knary` beside this
//!    binary, built first). Its wall time, its CPU (user + system of `wait4`) and its peak
//!    resident memory (its `VmHWM`, read every 5 ms while it runs: its `ru_maxrss` would count
//!    this process's memory at the fork): what a user's certification costs, opening the store
//!    included. The peak target (≤ the store's size) is judged on this peak.
//!
//! Times are wall clock around the library call (`Instant`), with rayon's global pool (one
//! thread per core) doing the parallel parts. Every timed call records the CPU time other
//! processes took meanwhile; a disturbed call is run again up to `--retries` times per size.
//! Results: `certify.json`, `certify.md`, `certify_fig4.svg` (+ `.png` when fonts are found)
//! and `certify_fig7.svg` in `--out` (`certify-quick*` with `--quick`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use plotters::coord::Shift;
use plotters::prelude::*;
use rayon::prelude::*;
use serde_json::{json, Value};
use veriflow::certifier::{sample, NoProgress, Options, Track};
use veriflow::runtime::log::segment;
use veriflow::{certify, Decision, LogReader, MemoryStore, Program, Runtime, SledStore, Store};
use veriflow_checkpoint::PageLimit;

use crate::harness::{
    dir_bytes, knary_binary, peak_rss_mib, plot, require_runs, scratch_dir, status_mib, thousands,
    CpuSnapshot, Disturbed, Figure, Plots, Quiet, Retries, Session, Stats, COLORS,
};
use crate::{knary_registry, Shape};

/// Fig. 4's parameters: every ε with every q.
const FIG4_EPSILONS: [f64; 3] = [0.1, 0.05, 0.01];
const FIG4_QS: [f64; 2] = [0.01, 0.05];

/// Fig. 4's largest n.
const FIG4_MAX_N: u64 = 1_000_000;

/// Fig. 7's parameters (paper 001 §VI: ε = 0.1, q = 0.01, so N = 229.1 and k ≤ 230).
const FIG7_EPSILON: f64 = 0.1;
const FIG7_Q: f64 = 0.01;

/// The knary trees of Fig. 7: fanout 10, depths 3..=7, i.e. 122, 1,222, 12,222, 122,222 and
/// 1,222,222 tasks (nodes plus one `Sum` per internal node); `--quick` stops at depth 5.
pub const FANOUT: u32 = 10;
const DEPTHS: std::ops::RangeInclusive<u32> = 3..=7;
const QUICK_DEPTHS: std::ops::RangeInclusive<u32> = 3..=5;

/// Target of the issue on this 2-core machine: G load + G_S + structural check.
const TARGET_TASKS_PER_S: f64 = 1_000_000.0;
/// Issue 17 target 1: end-to-end `certify` at most this many times the floor...
const TARGET_FLOOR_RATIO: f64 = 5.0;
/// ... and peak memory at most this many times the log's size.
const TARGET_MEMORY_RATIO: f64 = 1.0;
/// `--linear`'s depths: 12,222 to 1,222,222 tasks.
const LINEAR_DEPTHS: std::ops::RangeInclusive<u32> = 6..=7;

/// Fig. 4's and Fig. 7's colours, in the order they were first drawn with (tab10's blue,
/// orange, green, red, ...).
fn color(i: usize) -> RGBColor {
    COLORS[[0, 3, 1, 2, 4, 5][i % COLORS.len()]]
}

/// Where the logs are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// A durable sled store in a temporary directory (closed and opened again before
    /// certifying).
    Sled,
    /// In memory (no disk, no decoding of sled pages).
    Memory,
}

/// Options of `paper certify`.
#[derive(Args, Debug)]
pub struct CertifyArgs {
    /// Timed runs of every measurement per size (medians are taken; at least 3 unless --quick).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// Busy loop of every knary node, in µs: what re-running a node costs the oracle.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    grain_us: u64,
    /// Worker threads of the knary runs that write the logs.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: u32,
    /// Store of the logs.
    #[arg(long, value_enum, default_value_t = StoreKind::Sled)]
    store: StoreKind,
    /// Trees up to 12,222 tasks, for a smoke run (writes certify-quick.* instead).
    #[arg(long)]
    quick: bool,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Where the logs' temporary directories go [default: the system's temp directory].
    #[arg(long, value_name = "DIR")]
    scratch: Option<PathBuf>,
    /// Before each size, wait up to this many seconds for other processes to use less than a
    /// quarter of a core (0: do not wait).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    quiet_wait: u64,
    /// Timed calls that other processes disturbed are run again, at most this many times per
    /// size (of 3 × --runs calls); past that they are kept and counted.
    #[arg(long, default_value_t = 5)]
    retries: u32,
    /// Depths of the knary trees, comma-separated [default: 3,4,5,6,7; --quick: 3,4,5]
    /// (depth d has (10^d − 1)/9 + (10^(d−1) − 1)/9 tasks).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=7))]
    depths: Vec<u32>,
    /// Only the linear phases, the floor and end-to-end partial certification with its peak
    /// memory (no full duplication, no plots; default depths 6,7); writes certify-linear.*.
    #[arg(long)]
    linear: bool,
    /// The `knary` binary whose `certify` runs in a process of its own over each sled log
    /// [default: beside this binary, built first with `cargo build -p knary` in this binary's
    /// profile].
    #[arg(long, value_name = "PATH")]
    knary_bin: Option<PathBuf>,
}

/// Runs `paper certify` (module docs) and writes its results.
pub fn run(args: &CertifyArgs) -> Result<()> {
    require_runs(args.runs, 3, args.quick)?;
    let session = Session::start(args.out.as_deref(), args.quick)?;
    let scratch = scratch_dir(args.scratch.as_deref())?;
    let stem = session.stem(if args.linear {
        "certify-linear"
    } else {
        "certify"
    });

    eprintln!("Fig. 4: k against n");
    let fig4 = Fig4::compute()?;
    let fig4_plots = if args.linear {
        Plots::default()
    } else {
        session.plot(&format!("{stem}_fig4"), &fig4)
    };

    let depths: Vec<u32> = match (&args.depths[..], args.quick, args.linear) {
        ([], true, _) => QUICK_DEPTHS.collect(),
        ([], false, true) => LINEAR_DEPTHS.collect(),
        ([], false, false) => DEPTHS.collect(),
        (given, _, _) => given.to_vec(),
    };
    // Rule 5: `knary certify` runs over each sled log in a process of its own, signing with a
    // key of this run's (never the user's).
    let keys = tempfile::Builder::new()
        .prefix("veriflow-bench-certify-key-")
        .tempdir_in(&scratch)
        .with_context(|| format!("cannot create a key directory in {}", scratch.display()))?;
    let child = match args.store {
        StoreKind::Sled => {
            let key = keys.path().join("oracle.key");
            veriflow_checkpoint::Key::create(&key)
                .map_err(|e| anyhow::anyhow!("cannot create an oracle key: {e}"))?;
            Some((knary_binary(args.knary_bin.as_deref())?, key))
        }
        StoreKind::Memory => None,
    };
    let mut sizes = Vec::new();
    for depth in depths {
        let shape = Shape {
            depth,
            fanout: FANOUT,
            serial: 0,
            grain_us: args.grain_us,
        };
        eprintln!(
            "knary depth {depth} fanout {FANOUT}: {} tasks",
            shape.tasks()?
        );
        let child = child.as_ref().map(|(k, key)| (k.as_path(), key.as_path()));
        sizes.push(measure_size(args, shape, &scratch, child)?);
    }
    let fig7_plots = if args.linear {
        Plots::default()
    } else {
        session.plot(&format!("{stem}_fig7"), &Fig7::of(&sizes))
    };

    let report = Report {
        args,
        fig4,
        fig4_plots,
        fig7_plots,
        sizes,
    };
    session.write("certify", &stem, report.json(), &report.markdown())
}

// ---------------------------------------------------------------------------------------------
// Fig. 4

/// k against n for every (ε, q) of Fig. 4.
pub(crate) struct Fig4 {
    /// (ε, q, N_{ε,q}) in column order.
    pairs: Vec<(f64, f64, f64)>,
    /// n of the table: 1, 2, 5, 10, ..., 10⁶.
    table_n: Vec<u64>,
    /// k per row of `table_n`, one per pair.
    table_k: Vec<Vec<u64>>,
    /// n of the plot: log-spaced, 50 per decade.
    plot_n: Vec<u64>,
    /// k per pair, per `plot_n`.
    plot_k: Vec<Vec<u64>>,
}

impl Fig4 {
    pub(crate) fn compute() -> Result<Fig4> {
        let mut pairs = Vec::new();
        for eps in FIG4_EPSILONS {
            for q in FIG4_QS {
                pairs.push((eps, q, sample::n_eps_q(eps, q)?));
            }
        }
        let mut table_n = Vec::new();
        let mut decade = 1u64;
        while decade <= FIG4_MAX_N {
            table_n.extend(
                [decade, 2 * decade, 5 * decade]
                    .iter()
                    .filter(|&&n| n <= FIG4_MAX_N),
            );
            decade *= 10;
        }
        let mut plot_n: Vec<u64> = (0..=300)
            .map(|i| 10f64.powf(f64::from(i) / 50.0).round() as u64)
            .collect();
        plot_n.dedup();
        let ks = |ns: &[u64], eps: f64, q: f64| -> Result<Vec<u64>> {
            ns.iter()
                .map(|&n| Ok(sample::sample_size(eps, q, n)?))
                .collect()
        };
        let table_k = table_n
            .iter()
            .map(|&n| {
                pairs
                    .iter()
                    .map(|&(eps, q, _)| Ok(sample::sample_size(eps, q, n)?))
                    .collect::<Result<Vec<u64>>>()
            })
            .collect::<Result<_>>()?;
        let plot_k = pairs
            .iter()
            .map(|&(eps, q, _)| ks(&plot_n, eps, q))
            .collect::<Result<_>>()?;
        Ok(Fig4 {
            pairs,
            table_n,
            table_k,
            plot_n,
            plot_k,
        })
    }
}

impl Figure for Fig4 {
    fn size(&self) -> (u32, u32) {
        (960, 640)
    }

    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String> {
        let f = self;

        root.fill(&WHITE).map_err(plot::err)?;
        let y_max = f.pairs.iter().map(|p| p.2).fold(0.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Fig. 4: tasks to check, k = min(⌈f(n)⌉, n), for β ≤ ε",
                ("sans-serif", 22),
            )
            .margin(15)
            .margin_right(45)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d((1f64..FIG4_MAX_N as f64).log_scale(), 0f64..y_max)
            .map_err(plot::err)?;
        chart
            .configure_mesh()
            .x_desc("n, tasks in G_S (log scale)")
            .y_desc("k, tasks re-run by the oracle")
            .x_label_formatter(&|x| thousands(*x))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()
            .map_err(plot::err)?;
        let grey = BLACK.mix(0.35);
        chart
            .draw_series(LineSeries::new(
                f.plot_n
                    .iter()
                    .map(|&n| n as f64)
                    .filter(|&n| n <= y_max)
                    .map(|n| (n, n)),
                grey.stroke_width(1),
            ))
            .map_err(plot::err)?
            .label("k = n (check every task)")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(1))
            });
        for (i, (&(eps, q, big_n), ks)) in f.pairs.iter().zip(&f.plot_k).enumerate() {
            let color = color(i);
            chart
                .draw_series(LineSeries::new(
                    f.plot_n.iter().zip(ks).map(|(&n, &k)| (n as f64, k as f64)),
                    color.stroke_width(2),
                ))
                .map_err(plot::err)?
                .label(format!("ε = {eps}, q = {q}: N = {big_n:.1}"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(plot::err)?;
        root.present().map_err(plot::err)
    }
}

// ---------------------------------------------------------------------------------------------
// Logs, phases and Fig. 7

/// One timed call: wall time, the CPU this process took and the CPU other processes took
/// meanwhile.
#[derive(Clone, Copy, Debug, serde::Serialize)]
struct Timed {
    seconds: f64,
    own_cpu_s: Option<f64>,
    foreign_cpu_s: Option<f64>,
}

/// The linear phases of one certification, timed once.
#[derive(Clone, Copy, Debug, serde::Serialize)]
struct Phases {
    /// Every segment read from the store, its frame checked and its events walked undecoded
    /// (`segment::for_each_encoded_event`, pages in parallel): what any decoder pays.
    scan_frame: f64,
    /// The same segments decoded into `Event`s (`segment::decode_segment`) and dropped: no
    /// de-duplication, no merging.
    decode_events: f64,
    /// `read_vnode` on every vnode (segments read from the store and decoded), in parallel.
    read_decode: f64,
    /// `Track::load`: the above, plus merging the events into G.
    load: f64,
    /// `terminal_subgraph`.
    gs: f64,
    /// `structural_check` over G_S.
    structural: f64,
    /// `merkle_root` over G_S.
    merkle: f64,
    /// `log_digest` (Merkle root over G).
    log_digest: f64,
    /// The floor: the store's bytes read and hashed with blake3.
    floor: f64,
    /// CPU seconds this process took for load + G_S + structural check (`None` where `/proc`
    /// cannot tell).
    load_gs_structural_cpu: Option<f64>,
    /// Most CPU seconds other processes took during one of the phases.
    foreign_cpu_s: Option<f64>,
}

impl Phases {
    /// What the target is on.
    fn load_gs_structural(&self) -> f64 {
        self.load + self.gs + self.structural
    }

    /// Everything certify does that does not depend on k.
    fn linear_total(&self) -> f64 {
        self.load_gs_structural() + self.merkle + self.log_digest
    }
}

/// Everything measured on one size.
struct SizeResult {
    shape: Shape,
    tasks: u64,
    events: u64,
    create_seconds: f64,
    store_bytes: Option<u64>,
    /// k, checks counted and n of the partial certificates (the same for every seed).
    k: u64,
    checked_partial: u64,
    n: u64,
    phases: Vec<Phases>,
    partial: Vec<Timed>,
    /// Peak resident memory (MiB) during each partial certification, and the resident memory
    /// just before it.
    partial_peak_mib: Vec<(f64, f64)>,
    /// `knary certify` in a process of its own (rule 5; sled stores only).
    child: Vec<ChildRun>,
    full: Vec<Timed>,
    /// Calls that were disturbed and run again / kept.
    rerun: u32,
    kept_disturbed: u32,
    not_quiet: bool,
}

impl SizeResult {
    fn phase_stats(&self, f: impl Fn(&Phases) -> f64) -> Result<Stats> {
        stats(&self.phases.iter().map(f).collect::<Vec<_>>())
    }

    fn partial_stats(&self) -> Result<Stats> {
        stats(&self.partial.iter().map(|t| t.seconds).collect::<Vec<_>>())
    }

    fn full_stats(&self) -> Result<Stats> {
        stats(&self.full.iter().map(|t| t.seconds).collect::<Vec<_>>())
    }

    /// Medians of the end-to-end partial certification over the floor, and of its peak memory
    /// (MiB); then that peak over the store's size.
    fn against_floor(&self) -> Option<(f64, f64, f64, Option<f64>)> {
        let floor = self.phase_stats(|p| p.floor).ok()?.median;
        let e2e = self.partial_stats().ok()?.median;
        let peaks: Vec<f64> = self.partial_peak_mib.iter().map(|p| p.0).collect();
        let peak = stats(&peaks).ok()?.median;
        let of_log = self.store_bytes.map(|b| peak * 1048576.0 / b as f64);
        Some((floor, e2e / floor, peak, of_log))
    }

    /// Medians of `knary certify` in a process of its own (rule 5): wall time, CPU, peak
    /// memory (MiB) and that peak over the store's size.
    fn child_medians(&self) -> Option<(f64, f64, f64, Option<f64>)> {
        let med = |f: &dyn Fn(&ChildRun) -> f64| {
            stats(&self.child.iter().map(f).collect::<Vec<_>>())
                .ok()
                .map(|s| s.median)
        };
        let peak = med(&|c| c.peak_mib)?;
        Some((
            med(&|c| c.timed.seconds)?,
            med(&|c| c.timed.own_cpu_s.unwrap_or(f64::NAN))?,
            peak,
            self.store_bytes.map(|b| peak * 1048576.0 / b as f64),
        ))
    }

    /// The store's size in MB ("-" for a memory store).
    fn store_mb(&self) -> String {
        self.store_bytes
            .map_or_else(|| "-".to_string(), |b| format!("{:.0}", b as f64 / 1e6))
    }

    /// Peak memory over the store's size that the target is judged on: `knary certify`'s own
    /// process where it ran (rule 5), else this process's.
    fn peak_over_store(&self) -> Option<f64> {
        match self.child_medians() {
            Some((_, _, _, of_log)) => of_log,
            None => self.against_floor()?.3,
        }
    }
}

/// A ratio to two decimals, "-" where there is none.
fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{r:.2}"))
}

fn stats(values: &[f64]) -> Result<Stats> {
    Stats::require(values)
}

/// Every core counted: the certifier's parallel phases run on rayon's global pool.
fn disturbed(foreign_cpu_s: Option<f64>, seconds: f64) -> bool {
    Disturbed::cores().is(foreign_cpu_s, seconds)
}

/// Opens the store of a log directory.
fn open_store(kind: StoreKind, dir: &Path) -> Result<Arc<dyn Store>> {
    Ok(match kind {
        StoreKind::Sled => Arc::new(
            SledStore::open(dir)
                .with_context(|| format!("cannot open a sled store in {}", dir.display()))?,
        ),
        StoreKind::Memory => Arc::new(MemoryStore::default()),
    })
}

/// Rules 2-4 of the module docs on one tree.
/// `child`: the `knary` binary and the oracle key of rule 5 (a sled store only).
fn measure_size(
    args: &CertifyArgs,
    shape: Shape,
    scratch: &Path,
    child: Option<(&Path, &Path)>,
) -> Result<SizeResult> {
    let child = child.filter(|_| args.store == StoreKind::Sled);
    let dir = tempfile::Builder::new()
        .prefix("veriflow-bench-certify-")
        .tempdir_in(scratch)
        .with_context(|| format!("cannot create a log directory in {}", scratch.display()))?;
    let mut store = open_store(args.store, dir.path())?;
    let runtime = Runtime::builder(knary_registry()?)
        .program(<knary::Knary as Program>::NAME)
        .threads(args.threads as usize)
        .store(store.clone())
        .checkpoint(true)
        .build()
        .context("building the runtime")?;
    let (root, inputs) = shape.program().root();
    let report = runtime
        .run(root, inputs)
        .with_context(|| format!("knary run {shape:?}"))?;
    drop(runtime);
    if report.outputs.0 != shape.nodes()? {
        bail!(
            "knary {shape:?}: counted {} nodes, expected {}",
            report.outputs.0,
            shape.nodes()?
        );
    }
    eprintln!(
        "  log written: {} tasks, {} events in {:.2} s",
        report.tasks,
        report.events,
        report.elapsed.as_secs_f64()
    );
    if args.store == StoreKind::Sled {
        // As a separate `knary certify` would: the store closed, then opened again.
        drop(store);
        store = open_store(args.store, dir.path())?;
    }
    let store_bytes = match args.store {
        StoreKind::Sled => Some(dir_bytes(dir.path())),
        StoreKind::Memory => None,
    };
    let mut size = SizeResult {
        shape,
        tasks: report.tasks,
        events: report.events,
        create_seconds: report.elapsed.as_secs_f64(),
        store_bytes,
        k: 0,
        checked_partial: 0,
        n: 0,
        phases: Vec::new(),
        partial: Vec::new(),
        partial_peak_mib: Vec::new(),
        child: Vec::new(),
        full: Vec::new(),
        rerun: 0,
        kept_disturbed: 0,
        not_quiet: false,
    };
    let quiet = Quiet::secs(args.quiet_wait);
    {
        size.not_quiet = !quiet.wait();
        if size.not_quiet {
            eprintln!(
                "  (machine still busy after {} s: measuring anyway)",
                args.quiet_wait
            );
        }
    }
    let registry = knary_registry()?;
    // One budget for the size's 3 x --runs calls; a retry waits for a quiet machine first.
    let mut retries = Retries::new(args.retries);
    let keep = |retries: &mut Retries, bad: bool| {
        let kept = retries.keep(bad);
        if !kept {
            quiet.wait();
        }
        kept
    };
    let runs = args.runs as usize;
    while size.phases.len() < runs {
        let p = phases(&store, dir.path(), report.tasks)?;
        let bad = disturbed(p.foreign_cpu_s, p.linear_total());
        eprintln!(
            "  phases {}/{runs}: scan+frame {:.4} s, decode events {:.4} s, read+decode {:.4} s, \
             load {:.4} s, G_S {:.4} s, structural {:.4} s (CPU {:.2} s), merkle {:.4} s, log \
             digest {:.4} s, floor {:.4} s{}",
            size.phases.len() + 1,
            p.scan_frame,
            p.decode_events,
            p.read_decode,
            p.load,
            p.gs,
            p.structural,
            p.load_gs_structural_cpu.unwrap_or(f64::NAN),
            p.merkle,
            p.log_digest,
            p.floor,
            retries.note(bad)
        );
        if keep(&mut retries, bad) {
            size.phases.push(p);
        }
    }
    // Fig. 7: partial and full interleaved, a different draw seed per run; then (rule 5) the
    // same partial certification by `knary certify` in a process of its own.
    let mut seed = 0u64;
    let full_runs = if args.linear { 0 } else { runs };
    let child_runs = if child.is_some() { runs } else { 0 };
    while size.partial.len() < runs || size.full.len() < full_runs || size.child.len() < child_runs
    {
        if let Some((knary, key)) = child.filter(|_| size.child.len() < child_runs) {
            let c = certify_child(knary, dir.path(), key, seed + 1, report.tasks)?;
            let bad = disturbed(c.timed.foreign_cpu_s, c.timed.seconds);
            eprintln!(
                "  knary certify (own process): {:.4} s, CPU {:.2} s, peak {:.0} MiB{}",
                c.timed.seconds,
                c.timed.own_cpu_s.unwrap_or(f64::NAN),
                c.peak_mib,
                retries.note(bad)
            );
            if keep(&mut retries, bad) {
                size.child.push(c);
            }
        }
        for full in [false, true] {
            let done = if full { &size.full } else { &size.partial };
            if done.len() >= if full { full_runs } else { runs } {
                continue;
            }
            seed += 1;
            let before_mib = reset_peak_rss();
            let (t, cert) = certify_once(&store, &registry, full, seed)?;
            let peak_mib = peak_rss_mib().unwrap_or(f64::NAN);
            if cert.n != report.tasks {
                bail!(
                    "knary {shape:?}: G_S has {} tasks, the run {}",
                    cert.n,
                    report.tasks
                );
            }
            let bad = disturbed(t.foreign_cpu_s, t.seconds);
            eprintln!(
                "  {} certification: {:.4} s, {} of {} tasks re-run, peak {:.0} MiB (from {:.0}){}",
                if full { "full" } else { "partial" },
                t.seconds,
                cert.checked.len(),
                cert.n,
                peak_mib,
                before_mib,
                retries.note(bad)
            );
            if !keep(&mut retries, bad) {
                continue;
            }
            if full {
                size.full.push(t);
            } else {
                size.k = cert.k;
                size.checked_partial = cert.checked.len() as u64;
                size.n = cert.n;
                size.partial.push(t);
                size.partial_peak_mib.push((peak_mib, before_mib));
            }
        }
    }
    size.rerun = retries.rerun;
    size.kept_disturbed = retries.kept_disturbed;
    drop(store);
    let path = dir.path().to_path_buf();
    dir.close()
        .with_context(|| format!("cannot remove the log directory {}", path.display()))?;
    Ok(size)
}

/// One `knary certify` in a process of its own (rule 5 of the module docs).
#[derive(Clone, Copy, Debug, serde::Serialize)]
struct ChildRun {
    /// Wall time, the child's CPU (user + system, from `wait4`) and what other processes
    /// took meanwhile.
    timed: Timed,
    /// The child's peak resident memory (its `VmHWM`, read while it runs), MiB.
    peak_mib: f64,
}

/// Runs `knary certify` over the sled log in `dir` at Fig. 7's ε and q with draw seed `seed`,
/// signing with the oracle key `key`, in a process of its own: what a user's `knary certify`
/// costs, from opening the store (a copy, `sled_store.rs` rule 1) to the signed certificate.
/// Its certificate must ACCEPT and name `tasks` tasks.
fn certify_child(knary: &Path, dir: &Path, key: &Path, seed: u64, tasks: u64) -> Result<ChildRun> {
    let out = tempfile::NamedTempFile::new().context("a temporary file for certify's output")?;
    let err = tempfile::NamedTempFile::new().context("a temporary file for certify's errors")?;
    let mut cmd = std::process::Command::new(knary);
    cmd.arg("certify")
        .arg("--log-dir")
        .arg(dir)
        .args([
            "--epsilon",
            &FIG7_EPSILON.to_string(),
            "--q",
            &FIG7_Q.to_string(),
        ])
        .args(["--seed", &seed.to_string(), "--json", "--oracle-key"])
        .arg(key)
        .stdout(out.reopen()?)
        .stderr(err.reopen()?);
    let (status, run) = run_measured(&mut cmd)?;
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        let text = std::fs::read_to_string(err.path()).unwrap_or_default();
        bail!(
            "knary certify failed (status {status}) on an honest run: {}",
            text.trim()
        );
    }
    let text = std::fs::read_to_string(out.path())?;
    let cert = veriflow::certifier::Certificate::from_json(&text)
        .map_err(|e| anyhow::anyhow!("knary certify's certificate: {e:?}"))?;
    if cert.decision != Decision::Accept || cert.n != tasks {
        bail!(
            "knary certify: {:?} with n = {}, the run has {tasks} tasks",
            cert.decision,
            cert.n
        );
    }
    Ok(run)
}

/// Runs `cmd` to its end: its wait status, and its wall time, CPU (user + system, from
/// `wait4`), the CPU other processes took meanwhile and its own peak resident memory.
fn run_measured(cmd: &mut std::process::Command) -> Result<(i32, ChildRun)> {
    let before = CpuSnapshot::with_children();
    let t0 = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    let pid = libc::pid_t::try_from(child.id()).context("a pid out of range")?;
    let status_file = format!("/proc/{pid}/status");
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut peak_kib = 0u64;
    let r = loop {
        // The child's VmHWM, read while it runs: its `ru_maxrss` would count this process's
        // resident memory at the fork (Linux takes the old address space's peak at exec).
        if let Some(kib) = std::fs::read_to_string(&status_file)
            .ok()
            .and_then(|text| status_kib(&text, "VmHWM:"))
        {
            peak_kib = peak_kib.max(kib);
        }
        // SAFETY: `pid` is our child, not yet reaped (std's `Child` is never waited on here);
        // `status` and `usage` are valid for writes.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r != 0 {
            break r;
        }
        std::thread::sleep(PEAK_POLL);
    };
    let seconds = t0.elapsed().as_secs_f64();
    if r != pid {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    let run = ChildRun {
        timed: Timed {
            seconds,
            own_cpu_s: Some(tv(usage.ru_utime) + tv(usage.ru_stime)),
            foreign_cpu_s: CpuSnapshot::foreign_since(before),
        },
        peak_mib: peak_kib as f64 / 1024.0,
    };
    Ok((status, run))
}

/// How often [`certify_child`] reads the child's peak resident memory (`VmHWM` only grows, so
/// only growth in the child's last interval before it exits is missed).
const PEAK_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Field `field` (given in kB) of a `/proc/<pid>/status` text.
fn status_kib(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

/// Times `f`, with the CPU this process and other processes took meanwhile.
fn time<T>(f: impl FnOnce() -> T) -> (T, Timed) {
    let before = CpuSnapshot::now();
    let t0 = Instant::now();
    let out = f();
    let seconds = t0.elapsed().as_secs_f64();
    let timed = Timed {
        seconds,
        own_cpu_s: CpuSnapshot::own_since(before),
        foreign_cpu_s: CpuSnapshot::foreign_since(before),
    };
    (out, timed)
}

/// Resets this process's peak resident memory to what it holds now (Linux: `5` written to
/// `/proc/self/clear_refs`), and returns that (MiB; NaN where `/proc` cannot tell).
fn reset_peak_rss() -> f64 {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        eprintln!("  (cannot reset the peak memory: {e}; the peak is the process's)");
    }
    status_mib("VmRSS:").unwrap_or(f64::NAN)
}

/// The floor of rule 3: every byte of the store read and hashed with blake3 on rayon's pool
/// (the files of `dir` for a sled store; a memory store's pairs, already in memory).
fn floor(store: &Arc<dyn Store>, dir: &Path) -> Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    if std::fs::read_dir(dir)?.next().is_none() {
        for (k, v) in store.scan_prefix(b"")? {
            h.update(&k);
            h.update_rayon(&v);
        }
        return Ok(*h.finalize().as_bytes());
    }
    let mut files = vec![dir.to_path_buf()];
    let mut buf = vec![0u8; 16 << 20];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                files.push(entry?.path());
            }
            continue;
        }
        let mut f = std::fs::File::open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        loop {
            let n = std::io::Read::read(&mut f, &mut buf)?;
            if n == 0 {
                break;
            }
            h.update_rayon(&buf[..n]);
        }
    }
    Ok(*h.finalize().as_bytes())
}

/// Every segment of the log `reader` reads, page by page (as the reader pages it), each page's
/// segments handed to `each` in parallel; the sum of what it returns.
fn segments_pass(reader: &LogReader, each: &(dyn Fn(&[u8]) -> Result<u64> + Sync)) -> Result<u64> {
    let mut total = 0;
    for v in reader.vnodes()? {
        let mut prefix = segment::generation_prefix(reader.generation());
        prefix.extend(segment::vnode_prefix(v));
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = reader
                .store()
                .scan_page(&prefix, after.as_deref(), SEGMENT_PAGE)?;
            after = page.pairs.last().map(|(k, _)| k.clone());
            total += page
                .pairs
                .par_iter()
                .map(|(_, value)| each(value))
                .sum::<Result<u64>>()?;
            if !page.more || after.is_none() {
                break;
            }
        }
    }
    Ok(total)
}

/// The reader's page of segments (`log/reader.rs`, rule 1).
const SEGMENT_PAGE: PageLimit = PageLimit {
    max_keys: 64,
    max_bytes: 16 << 20,
};

/// Rule 3 of the module docs, once.
fn phases(store: &Arc<dyn Store>, dir: &Path, tasks: u64) -> Result<Phases> {
    let reader = LogReader::latest(store.clone()).context("reading the log's manifest")?;
    let (walked, scan_frame) = time(|| {
        segments_pass(&reader, &|value| {
            let mut n = 0u64;
            segment::for_each_encoded_event(value, |_| {
                n += 1;
                Ok(())
            })
            .map_err(|e| anyhow::anyhow!("a damaged segment: {e:?}"))?;
            Ok(n)
        })
    });
    let (decoded, decode_events) = time(|| {
        segments_pass(&reader, &|value| {
            let seg = segment::decode_segment(value)
                .map_err(|e| anyhow::anyhow!("a damaged segment: {e:?}"))?;
            Ok(seg.events.len() as u64)
        })
    });
    let (walked, decoded) = (walked?, decoded?);
    if walked != decoded {
        bail!("{walked} events walked, {decoded} decoded");
    }
    let (logs, read) = time(|| {
        reader
            .vnodes()?
            .into_par_iter()
            .map(|v| reader.read_vnode(v))
            .collect::<Result<Vec<_>, _>>()
    });
    let logs = logs.context("reading the logs")?;
    if logs.iter().map(|l| l.events.len()).sum::<usize>() == 0 {
        bail!("the log holds no events");
    }
    drop(logs);
    let (track, load) = time(|| Track::load(store.clone()));
    let track = track.context("loading G from the logs")?;
    let outputs = track.terminal().to_vec();
    let ((gs, mut errors), gs_t) = time(|| track.terminal_subgraph(&outputs));
    let (structural, st) = time(|| track.structural_check(&gs));
    errors.extend(structural);
    let (_, merkle) = time(|| track.merkle_root(&gs));
    let (_, digest) = time(|| track.log_digest());
    if !errors.is_empty() {
        bail!(
            "the honest run's log fails the structural check: {:?}",
            errors[0]
        );
    }
    if gs.len() as u64 != tasks {
        bail!("G_S has {} tasks, the run {tasks}", gs.len());
    }
    drop(track);
    let (hashed, floor_t) = time(|| floor(store, dir));
    hashed.context("reading the store's bytes")?;
    let foreign = [
        scan_frame,
        decode_events,
        read,
        load,
        gs_t,
        st,
        merkle,
        digest,
        floor_t,
    ]
    .iter()
    .filter_map(|t| t.foreign_cpu_s)
    .fold(None, |m: Option<f64>, f| Some(m.map_or(f, |m| m.max(f))));
    let load_gs_structural_cpu = [load, gs_t, st]
        .iter()
        .map(|t| t.own_cpu_s)
        .sum::<Option<f64>>();
    Ok(Phases {
        scan_frame: scan_frame.seconds,
        decode_events: decode_events.seconds,
        read_decode: read.seconds,
        load: load.seconds,
        gs: gs_t.seconds,
        structural: st.seconds,
        merkle: merkle.seconds,
        log_digest: digest.seconds,
        floor: floor_t.seconds,
        load_gs_structural_cpu,
        foreign_cpu_s: foreign,
    })
}

/// Rule 4 of the module docs, once: `certify` at Fig. 7's ε and q.
fn certify_once(
    store: &Arc<dyn Store>,
    registry: &veriflow::Registry,
    full: bool,
    seed: u64,
) -> Result<(Timed, veriflow::Certificate)> {
    let opts = Options {
        epsilon: FIG7_EPSILON,
        q: FIG7_Q,
        seed: Some(seed),
        full,
        ..Options::default()
    };
    let (cert, t) = time(|| certify(store.clone(), registry, &opts, &NoProgress));
    let cert = cert.context("certifying")?;
    if cert.decision != Decision::Accept {
        bail!(
            "an honest run was rejected: {:?} {:?}",
            cert.detections.first(),
            cert.structural.first()
        );
    }
    Ok((t, cert))
}

/// Fig. 7: per size, its tasks n and the medians of full, partial and the linear phases (s).
pub(crate) struct Fig7 {
    ns: Vec<f64>,
    times: [Vec<f64>; 3],
}

impl Fig7 {
    fn of(sizes: &[SizeResult]) -> Fig7 {
        let mut fig = Fig7 {
            ns: Vec::new(),
            times: Default::default(),
        };
        for s in sizes {
            // A size without a measurement has no point.
            let (Ok(f), Ok(p), Ok(l)) = (
                s.full_stats(),
                s.partial_stats(),
                s.phase_stats(Phases::linear_total),
            ) else {
                continue;
            };
            fig.ns.push(s.tasks as f64);
            for (series, t) in fig.times.iter_mut().zip([f.median, p.median, l.median]) {
                series.push(t);
            }
        }
        fig
    }

    /// The figure of a `certify.json` (`paper replot`).
    pub(crate) fn from_json(j: &Value) -> Result<Fig7> {
        let mut fig = Fig7 {
            ns: Vec::new(),
            times: Default::default(),
        };
        for s in j["fig7"]["sizes"].as_array().context("no fig7.sizes")? {
            let median = |v: &Value, what: &str| {
                v["median"]
                    .as_f64()
                    .with_context(|| format!("a size without {what}.median"))
            };
            fig.ns
                .push(s["tasks"].as_f64().context("a size without tasks")?);
            let t = [
                median(&s["full"]["seconds"], "full.seconds")?,
                median(&s["partial"]["seconds"], "partial.seconds")?,
                median(&s["phases"]["linear_total"], "phases.linear_total")?,
            ];
            for (series, t) in fig.times.iter_mut().zip(t) {
                series.push(t);
            }
        }
        Ok(fig)
    }
}

impl Figure for Fig7 {
    fn size(&self) -> (u32, u32) {
        (960, 640)
    }

    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String> {
        let (ns, times) = (&self.ns, &self.times);
        let (Some(x_min), Some(x_max)) = (
            ns.iter().copied().reduce(f64::min),
            ns.iter().copied().reduce(f64::max),
        ) else {
            return Err("nothing to plot".to_string());
        };
        let all = times.iter().flatten().copied();
        let y_min = all.clone().fold(f64::INFINITY, f64::min).max(1e-5) / 2.0;
        let y_max = all.fold(0.0, f64::max) * 2.0;
        root.fill(&WHITE).map_err(plot::err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                "Fig. 7: certification time, full vs partial (ε = {FIG7_EPSILON}, q = {FIG7_Q})"
            ),
                ("sans-serif", 22),
            )
            .margin(15)
            .margin_right(45)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x_min / 2.0..x_max * 2.0).log_scale(),
                (y_min..y_max).log_scale(),
            )
            .map_err(plot::err)?;
        chart
            .configure_mesh()
            .x_desc("n, tasks of the run (knary fanout 10; log scale)")
            .y_desc("seconds (median; log scale)")
            .x_label_formatter(&|x| thousands(*x))
            .draw()
            .map_err(plot::err)?;
        let labels = [
            ("full duplication: every task re-run", color(3)),
            ("partial: k = min(⌈f(n)⌉, n) tasks re-run", color(0)),
            ("load + G_S + structural + Merkle roots", color(2)),
        ];
        for ((label, color), series) in labels.into_iter().zip(times.iter()) {
            let pts: Vec<(f64, f64)> = ns.iter().copied().zip(series.iter().copied()).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(plot::err)?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
                .map_err(plot::err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(plot::err)?;
        root.present().map_err(plot::err)
    }
}

// ---------------------------------------------------------------------------------------------
// Report

struct Report<'a> {
    args: &'a CertifyArgs,
    fig4: Fig4,
    fig4_plots: Plots,
    fig7_plots: Plots,
    sizes: Vec<SizeResult>,
}

impl Report<'_> {
    /// The size the target is measured at: the largest.
    fn largest(&self) -> Option<&SizeResult> {
        self.sizes.iter().max_by_key(|s| s.tasks)
    }

    fn target(&self) -> Option<(f64, bool)> {
        let s = self.largest()?;
        let t = s.phase_stats(Phases::load_gs_structural).ok()?.median;
        let rate = s.tasks as f64 / t;
        Some((rate, rate >= TARGET_TASKS_PER_S))
    }

    fn markdown(&self) -> String {
        let mut md = String::new();
        if !self.args.linear {
            self.figures_markdown(&mut md);
        }
        self.linear_markdown(&mut md);
        md
    }

    /// Fig. 4 and Fig. 7.
    fn figures_markdown(&self, md: &mut String) {
        // Fig. 4.
        let _ = writeln!(
            md,
            "Fig. 4: tasks to check k = min(⌈f_ε,q(n)⌉, n) so that β ≤ ε (`certifier::sample`); \
             the last row is N_ε,q = ln ε / ln(1 − q). Plot: {}.\n",
            self.fig4_plots.markdown()
        );
        md.push_str("| n |");
        for &(eps, q, _) in &self.fig4.pairs {
            let _ = write!(md, " ε {eps}, q {q} |");
        }
        md.push_str("\n|---:|");
        md.push_str(&"---:|".repeat(self.fig4.pairs.len()));
        md.push('\n');
        for (n, ks) in self.fig4.table_n.iter().zip(&self.fig4.table_k) {
            let _ = write!(md, "| {} |", thousands(*n as f64));
            for k in ks {
                let _ = write!(md, " {k} |");
            }
            md.push('\n');
        }
        md.push_str("| N |");
        for &(_, _, big_n) in &self.fig4.pairs {
            let _ = write!(md, " {big_n:.2} |");
        }
        md.push_str("\n\n");
        // Fig. 7.
        let _ = writeln!(
            md,
            "Fig. 7: `certify` at ε = {FIG7_EPSILON}, q = {FIG7_Q}, partial (k tasks re-run) \
             against full duplication (`Options {{ full: true }}`: every task re-run), on honest \
             knary logs (fanout {FANOUT}, grain {} µs per node, `Sum` tasks none; {} store, \
             written by a {}-thread run, {}); medians of {} runs each, rayon's global pool of {} \
             threads. Plot: {}.\n",
            self.args.grain_us,
            match self.args.store {
                StoreKind::Sled => "sled",
                StoreKind::Memory => "memory",
            },
            self.args.threads,
            match self.args.store {
                StoreKind::Sled => "closed and opened again before certifying",
                StoreKind::Memory => "kept open",
            },
            self.args.runs,
            rayon::current_num_threads(),
            self.fig7_plots.markdown()
        );
        md.push_str(
            "| tasks n | depth | k | re-run (partial) | partial median (s) | full median (s) | \
             full / partial | partial min–max (s) | full min–max (s) | log written in (s) | \
             store (MB) |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for s in &self.sizes {
            let (Ok(p), Ok(f)) = (s.partial_stats(), s.full_stats()) else {
                continue;
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.1} % | {:.4} | {:.4} | {:.1} | {:.4}–{:.4} | {:.4}–{:.4} | \
                 {:.2} | {} |",
                thousands(s.tasks as f64),
                s.shape.depth,
                s.k,
                100.0 * s.checked_partial as f64 / s.n.max(1) as f64,
                p.median,
                f.median,
                f.median / p.median,
                p.min,
                p.max,
                f.min,
                f.max,
                s.create_seconds,
                s.store_bytes
                    .map_or_else(|| "-".to_string(), |b| format!("{:.0}", b as f64 / 1e6)),
            );
        }
        md.push('\n');
    }

    /// The linear phases, and end to end against the floor.
    fn linear_markdown(&self, md: &mut String) {
        // Phases.
        md.push_str(
            "Linear phases of a certification (medians over the runs; tasks/s = n / time): \
             read + decode is `LogReader::read_vnode` on every vnode alone, load is the whole \
             `Track::load` (read + decode + merge into G), then G_S, the structural check, the \
             Merkle root of G_S and the log digest (Merkle root over G). Target: load + G_S + \
             structural ≥ 1,000,000 tasks/s.\n\n",
        );
        md.push_str(
            "| tasks n | events | read + decode (s) | load (s) | G_S (s) | structural (s) | \
             Merkle G_S (s) | log digest (s) | load + G_S + structural (s) | tasks/s | all \
             linear (s) | tasks/s |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for s in &self.sizes {
            let get = |f: fn(&Phases) -> f64| s.phase_stats(f).map(|st| st.median).unwrap_or(0.0);
            let lgs = get(Phases::load_gs_structural);
            let all = get(Phases::linear_total);
            let _ = writeln!(
                md,
                "| {} | {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} | {} | {:.4} | \
                 {} |",
                thousands(s.tasks as f64),
                thousands(s.events as f64),
                get(|p| p.read_decode),
                get(|p| p.load),
                get(|p| p.gs),
                get(|p| p.structural),
                get(|p| p.merkle),
                get(|p| p.log_digest),
                lgs,
                thousands(s.tasks as f64 / lgs),
                all,
                thousands(s.tasks as f64 / all),
            );
        }
        md.push('\n');
        md.push_str(
            "Where the floor of load is (medians): scan + frame check reads every segment and \
             walks its events undecoded (what any decoder pays); decode into events also \
             builds each `Event` (and drops it); read + decode adds the reader's checks and \
             de-duplication; load adds the merge into G. CPU is this process's, for load + G_S \
             + structural.\n\n| tasks n | scan + frame check (s) | decode into events (s) | \
             read + decode (s) | load (s) | load + G_S + structural CPU (s) | CPU per task (µs) \
             |\n|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for s in &self.sizes {
            let get = |f: fn(&Phases) -> f64| s.phase_stats(f).map(|st| st.median).unwrap_or(0.0);
            let cpu: Vec<f64> = s
                .phases
                .iter()
                .filter_map(|p| p.load_gs_structural_cpu)
                .collect();
            let cpu = stats(&cpu).map_or(f64::NAN, |st| st.median);
            let _ = writeln!(
                md,
                "| {} | {:.4} | {:.4} | {:.4} | {:.4} | {cpu:.2} | {:.2} |",
                thousands(s.tasks as f64),
                get(|p| p.scan_frame),
                get(|p| p.decode_events),
                get(|p| p.read_decode),
                get(|p| p.load),
                cpu * 1e6 / s.tasks.max(1) as f64,
            );
        }
        md.push('\n');
        let _ = writeln!(
            md,
            "End to end against the floor (medians): the floor reads every byte of the store \
             (the {} store's {}) and hashes it with blake3 on rayon's pool; end to end is \
             `certify` at ε = {FIG7_EPSILON}, q = {FIG7_Q} (k tasks re-run, store already \
             open); its peak is this process's VmHWM, reset just before the call (so it counts \
             what the process held then: RSS before). Targets: end to end ≤ {TARGET_FLOOR_RATIO}× \
             the floor, peak ≤ {TARGET_MEMORY_RATIO}× the store's size.\n",
            match self.args.store {
                StoreKind::Sled => "sled",
                StoreKind::Memory => "memory",
            },
            match self.args.store {
                StoreKind::Sled => "files",
                StoreKind::Memory => "pairs",
            },
        );
        md.push_str(
            "| tasks n | store (MB) | floor (s) | certify (s) | certify / floor | peak (MiB) | \
             RSS before (MiB) | peak − before (MiB) | peak / store |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for s in &self.sizes {
            let Some((floor, ratio, peak, of_log)) = s.against_floor() else {
                continue;
            };
            let before: Vec<f64> = s.partial_peak_mib.iter().map(|p| p.1).collect();
            let added: Vec<f64> = s.partial_peak_mib.iter().map(|p| p.0 - p.1).collect();
            let _ = writeln!(
                md,
                "| {} | {} | {floor:.4} | {:.4} | {ratio:.1} | {peak:.0} | {:.0} | {:.0} | {} |",
                thousands(s.tasks as f64),
                s.store_mb(),
                floor * ratio,
                stats(&before).map_or(f64::NAN, |st| st.median),
                stats(&added).map_or(f64::NAN, |st| st.median),
                ratio_text(of_log),
            );
        }
        md.push('\n');
        if self.sizes.iter().any(|s| !s.child.is_empty()) {
            md.push_str(
                "`knary certify` in a process of its own (medians), as a user runs it over the \
                 same store: from opening it (a copy of its sled files in the temporary \
                 directory, `sled_store.rs` rule 1) to the signed certificate; CPU is the \
                 child's user + system time, peak its `VmHWM` read every 5 ms while it runs. \
                 The peak target is judged on this peak.\n\n\
                 | tasks n | store (MB) | certify (s) | CPU (s) | peak (MiB) | peak / store |\n\
                 |---:|---:|---:|---:|---:|---:|\n",
            );
            for s in &self.sizes {
                let Some((wall, cpu, peak, of_log)) = s.child_medians() else {
                    continue;
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {wall:.4} | {cpu:.2} | {peak:.0} | {} |",
                    thousands(s.tasks as f64),
                    s.store_mb(),
                    ratio_text(of_log),
                );
            }
            md.push('\n');
        }
        let disturbed: u32 = self.sizes.iter().map(|s| s.rerun).sum();
        let kept: u32 = self.sizes.iter().map(|s| s.kept_disturbed).sum();
        let busy = self.sizes.iter().filter(|s| s.not_quiet).count();
        let _ = writeln!(
            md,
            "Timed calls disturbed by other processes: {disturbed} run again, {kept} kept; \
             {busy} size(s) started on a busy machine.\n"
        );
        if let (Some((rate, met)), Some(s)) = (self.target(), self.largest()) {
            let _ = writeln!(
                md,
                "| target | measured | met |\n|---|---:|---|\n| load + G_S + structural check \
                 ≥ {} tasks/s at {} tasks | {} tasks/s | {} |",
                thousands(TARGET_TASKS_PER_S),
                thousands(s.tasks as f64),
                thousands(rate),
                if met { "yes" } else { "**no**" }
            );
            if let Some((_, ratio, _, _)) = s.against_floor() {
                let yes = |met: bool| if met { "yes" } else { "**no**" };
                let _ = writeln!(
                    md,
                    "| end-to-end certify ≤ {TARGET_FLOOR_RATIO}× the floor | {ratio:.1}× | {} |",
                    yes(ratio <= TARGET_FLOOR_RATIO)
                );
                if let Some(r) = s.peak_over_store() {
                    let _ = writeln!(
                        md,
                        "| peak memory ≤ {TARGET_MEMORY_RATIO}× the store's size ({}) | {r:.2}× | {} |",
                        if s.child.is_empty() { "this process" } else { "knary certify's process" },
                        yes(r <= TARGET_MEMORY_RATIO)
                    );
                }
            }
        }
    }

    fn json(&self) -> Value {
        let fig4_rows: Vec<Value> = self
            .fig4
            .table_n
            .iter()
            .zip(&self.fig4.table_k)
            .map(|(n, ks)| json!({ "n": n, "k": ks }))
            .collect();
        let fig4_curves: Vec<Value> = self
            .fig4
            .pairs
            .iter()
            .zip(&self.fig4.plot_k)
            .map(|(&(eps, q, big_n), ks)| {
                json!({ "epsilon": eps, "q": q, "n_eps_q": big_n,
                        "points": self.fig4.plot_n.iter().zip(ks)
                            .map(|(n, k)| json!([n, k])).collect::<Vec<_>>() })
            })
            .collect();
        let sizes: Vec<Value> = self
            .sizes
            .iter()
            .map(|s| {
                let stat = |f: fn(&Phases) -> f64| s.phase_stats(f).ok();
                json!({
                    "shape": s.shape,
                    "tasks": s.tasks,
                    "events": s.events,
                    "log_written_seconds": s.create_seconds,
                    "store_bytes": s.store_bytes,
                    "n": s.n,
                    "k": s.k,
                    "checked_partial": s.checked_partial,
                    "fraction_rerun_partial": s.checked_partial as f64 / s.n.max(1) as f64,
                    "partial": { "runs": s.partial, "seconds": s.partial_stats().ok(),
                                 "peak_and_before_mib": s.partial_peak_mib },
                    "against_floor": s.against_floor().map(|(floor, ratio, peak, of_log)| json!({
                        "floor_seconds": floor,
                        "certify_over_floor": ratio,
                        "peak_mib": peak,
                        "peak_over_store": of_log,
                    })),
                    "own_process": {
                        "runs": s.child,
                        "medians": s.child_medians().map(|(wall, cpu, peak, of_log)| json!({
                            "seconds": wall,
                            "cpu_seconds": cpu,
                            "peak_mib": peak,
                            "peak_over_store": of_log,
                        })),
                    },
                    "peak_over_store": s.peak_over_store(),
                    "full": { "runs": s.full, "seconds": s.full_stats().ok() },
                    "phases": {
                        "runs": s.phases,
                        "scan_frame": stat(|p| p.scan_frame),
                        "decode_events": stat(|p| p.decode_events),
                        "read_decode": stat(|p| p.read_decode),
                        "load": stat(|p| p.load),
                        "gs": stat(|p| p.gs),
                        "structural": stat(|p| p.structural),
                        "merkle": stat(|p| p.merkle),
                        "log_digest": stat(|p| p.log_digest),
                        "floor": stat(|p| p.floor),
                        "load_gs_structural": stat(Phases::load_gs_structural),
                        "load_gs_structural_cpu": stats(&s.phases.iter()
                            .filter_map(|p| p.load_gs_structural_cpu).collect::<Vec<_>>()).ok(),
                        "linear_total": stat(Phases::linear_total),
                        "load_gs_structural_tasks_per_s": stat(Phases::load_gs_structural)
                            .map(|st| s.tasks as f64 / st.median),
                    },
                    "disturbed_rerun": s.rerun,
                    "disturbed_kept": s.kept_disturbed,
                    "started_on_busy_machine": s.not_quiet,
                })
            })
            .collect();
        let target = self.target().map(|(rate, met)| {
            json!({
                "what": "Track::load + terminal_subgraph + structural_check at the largest size",
                "target_tasks_per_s": TARGET_TASKS_PER_S,
                "measured_tasks_per_s": rate,
                "met": met,
            })
        });
        json!({
            "parameters": {
                "runs": self.args.runs,
                "linear_only": self.args.linear,
                "grain_us": self.args.grain_us,
                "threads_of_the_run": self.args.threads,
                "certifier_threads": rayon::current_num_threads(),
                "store": self.args.store,
                "fanout": FANOUT,
                "timing": "wall clock (Instant) around each library call; a sled store is \
                           closed and opened again after the run, before any measurement",
                "quiet_wait_s": self.args.quiet_wait,
                "retries": self.args.retries,
                "disturbed": Disturbed::cores().text(),
            },
            "fig4": {
                "what": "k = min(ceil(f_{eps,q}(n)), n), sample::sample_size",
                "pairs": self.fig4.pairs.iter()
                    .map(|&(eps, q, n)| json!({ "epsilon": eps, "q": q, "n_eps_q": n }))
                    .collect::<Vec<_>>(),
                "table": fig4_rows,
                "curves": fig4_curves,
                "plots": self.fig4_plots.json(),
            },
            "fig7": {
                "epsilon": FIG7_EPSILON,
                "q": FIG7_Q,
                "plots": self.fig7_plots.json(),
                "sizes": sizes,
            },
            "target": target,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fig4_matches_the_paper() {
        let f = Fig4::compute().unwrap();
        let col = f
            .pairs
            .iter()
            .position(|&(eps, q, _)| eps == 0.05 && q == 0.01)
            .unwrap();
        let row = f.table_n.iter().position(|&n| n == 1_000_000).unwrap();
        // ln 0.05 / ln 0.99 = 298.07 (paper: "≃ 298").
        assert_eq!(f.table_k[row][col], 299);
        assert_eq!(f.table_k[0], vec![1; f.pairs.len()]);
        assert_eq!(f.table_n.len(), 19);
        assert_eq!(*f.plot_n.last().unwrap(), FIG4_MAX_N);
    }

    #[test]
    fn a_small_size_is_measured() {
        let scratch = tempfile::tempdir().unwrap();
        let args = CertifyArgs {
            runs: 1,
            grain_us: 0,
            threads: 2,
            store: StoreKind::Memory,
            quick: true,
            out: None,
            scratch: None,
            quiet_wait: 0,
            retries: 0,
            depths: Vec::new(),
            linear: false,
            knary_bin: None,
        };
        let shape = Shape {
            depth: 3,
            fanout: FANOUT,
            serial: 0,
            grain_us: 0,
        };
        let s = measure_size(&args, shape, scratch.path(), None).unwrap();
        assert_eq!(s.tasks, 122);
        assert_eq!(s.n, 122);
        assert_eq!(s.k, sample::sample_size(FIG7_EPSILON, FIG7_Q, 122).unwrap());
        assert_eq!((s.partial.len(), s.full.len(), s.phases.len()), (1, 1, 1));
        assert!(s.phases[0].floor > 0.0);
        // The decoder's floor walked the log's events (phases() holds the two passes' counts
        // equal), and this process's CPU was read.
        assert!(s.phases[0].scan_frame > 0.0 && s.phases[0].decode_events > 0.0);
        assert!(s.phases[0].load_gs_structural_cpu.is_some());
        assert!(s.against_floor().is_some());
    }

    #[test]
    fn a_childs_peak_is_its_own() {
        // This process holds 256 MiB, touched; a child that holds little must not report it
        // (its ru_maxrss would: Linux counts the parent's pages at the fork).
        let held = vec![1u8; 256 << 20];
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "sleep 0.2"]);
        let (status, run) = run_measured(&mut cmd).unwrap();
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert!(
            run.peak_mib > 0.0 && run.peak_mib < 64.0,
            "{}",
            run.peak_mib
        );
        assert!(run.timed.seconds >= 0.2 && run.timed.own_cpu_s.is_some());
        std::hint::black_box(held);
        let status = "Name:\tx\nVmHWM:\t  123456 kB\nVmRSS:\t 42 kB\n";
        assert_eq!(status_kib(status, "VmHWM:"), Some(123456));
        assert_eq!(status_kib(status, "VmSwap:"), None);
    }
}

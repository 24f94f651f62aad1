//! veriflow-bench: the measurements behind the numbers in the papers.
//!
//! - the `paper` binary (`cargo run --release -p veriflow-bench --bin paper -- overhead`)
//!   measures the cost of the durable event log on knary (S1 against the S0 baseline without a
//!   log) and the empty-task throughput against rayon; `paper recovery` adds S2, a run in which
//!   one vnode fails half-way and is recovered from its log;
//! - `paper storage` ([`storage`]) measures the checkpoint storage strategies: coding
//!   throughput, and run-time and storage overhead on a logged matrix product (paper 003);
//! - `paper sim` ([`sim`]) runs the cluster simulator over many seeds, and simulates the failure
//!   detector's heartbeats at 10,000 processes;
//! - the `micro` criterion bench measures hot paths (id derivation, codec, a small run).
//!
//! This library holds what both share: one knary run on a fresh runtime ([`run_knary`]), the
//! same tree built with `rayon::scope` ([`rayon_tree`]); and the [`harness`] every experiment
//! runs on (interleaving, quiet waits, retries, medians, reports, figures).

pub mod storage;

pub mod certify;
pub mod harness;

pub mod cluster;
pub mod netns;
pub mod scale;

pub mod detector;

pub mod nqueens;

pub mod cg;
pub mod cg_dataflow;
pub mod cg_spmd;

pub mod damage;
pub mod memory;
pub mod store_engines;

pub mod transport;

pub mod online;

pub mod sim;

pub mod replot;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
pub use harness::{CpuSnapshot, Stats};
use veriflow::runtime::Kill;
use veriflow::{Program, Registry, Runtime, SledStore, Store, VnodeId};

/// The shape of a knary tree (the program's parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    /// Depth n (1 = a single leaf).
    pub depth: u32,
    /// Branching factor k.
    pub fanout: u32,
    /// Children of every node that run one after the other.
    pub serial: u32,
    /// Busy loop of every node, in µs.
    pub grain_us: u64,
}

impl Shape {
    /// The knary tree of about `tasks` tasks (fanout 2 to 16), of grain 0.
    pub fn about(tasks: u64) -> Result<Shape> {
        let mut best: Option<(u64, Shape)> = None;
        for fanout in 2..=16u32 {
            for depth in 2..=40u32 {
                let Some(t) = knary::expected_tasks(depth, fanout) else {
                    break;
                };
                let off = t.abs_diff(tasks);
                if best.as_ref().is_none_or(|(b, _)| off < *b) {
                    best = Some((
                        off,
                        Shape {
                            depth,
                            fanout,
                            serial: 0,
                            grain_us: 0,
                        },
                    ));
                }
                if t > tasks {
                    break;
                }
            }
        }
        best.map(|(_, s)| s)
            .with_context(|| format!("no knary tree of about {tasks} tasks"))
    }

    /// The knary program with these parameters.
    pub fn program(&self) -> knary::Knary {
        knary::Knary {
            depth: self.depth,
            fanout: self.fanout,
            serial: self.serial,
            grain_us: self.grain_us,
        }
    }

    /// Nodes of the tree.
    pub fn nodes(&self) -> Result<u64> {
        knary::expected_nodes(self.depth, self.fanout)
            .with_context(|| format!("tree too big: {self:?}"))
    }

    /// Tasks of a veriflow run: nodes plus one `Sum` per internal node.
    pub fn tasks(&self) -> Result<u64> {
        knary::expected_tasks(self.depth, self.fanout)
            .with_context(|| format!("tree too big: {self:?}"))
    }
}

/// Whether a run logs, and whether a vnode fails: the settings paper 001 compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Setting {
    /// S0: no log at all (`--no-checkpoint`).
    S0,
    /// S1: every task's events logged durably in a fresh sled store, with group commit.
    S1,
    /// S2: logged like S1, and vnode [`S2_FAILING_VNODE`] fails (all its memory lost) once half
    /// of the run's tasks have completed, then is recovered from its log.
    S2,
}

impl Setting {
    /// Whether the run logs to a store (S1, S2).
    pub fn logs(self) -> bool {
        self != Setting::S0
    }
}

/// The vnode that fails in [`Setting::S2`] (of the default 2 vnodes with 2 threads).
pub const S2_FAILING_VNODE: u32 = 1;

/// What one knary run measured.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct KnaryRun {
    /// Wall time of `Runtime::run`, as the runtime reports it: from the root's declaration
    /// until every event is durable (building the runtime and opening the store excluded).
    pub elapsed: Duration,
    /// Tasks completed.
    pub tasks: u64,
    /// Events logged (0 in S0).
    pub events: u64,
    /// Steals (tasks adopted from another vnode).
    pub steals: u64,
    /// CPU seconds that other processes used on the machine during the run (see
    /// [`CpuSnapshot`]); `None` where `/proc` is not readable.
    pub foreign_cpu_s: Option<f64>,
    /// CPU seconds this process used during the run (workers, log writer, sled).
    pub cpu_s: Option<f64>,
    /// Vnode failures injected and recovered (1 in S2, 0 otherwise).
    pub failures: u64,
    /// Tasks restarted by the recoveries (declared, not completed at the failure).
    pub recovered_tasks: u64,
    /// Tasks completed before a failure, reused and not run again.
    pub reused_tasks: u64,
}

/// The registry of the knary program.
pub fn knary_registry() -> Result<Registry> {
    let mut registry = Registry::new();
    <knary::Knary as Program>::register(&mut registry).context("registering knary's tasks")?;
    Ok(registry)
}

/// Runs knary once on a fresh runtime of `threads` threads; in [`Setting::S1`] and
/// [`Setting::S2`] the log goes to a fresh sled store in a new temporary directory under
/// `scratch` (removed afterwards). Fails if the result is not the tree's node count, or if an S2
/// run did not fail exactly once.
pub fn run_knary(
    shape: Shape,
    setting: Setting,
    threads: usize,
    scratch: &Path,
) -> Result<KnaryRun> {
    let mut builder = Runtime::builder(knary_registry()?)
        .program(<knary::Knary as Program>::NAME)
        .threads(threads);
    // Kept alive until the run is over, then removed.
    let mut dir = None;
    if setting == Setting::S0 {
        builder = builder.checkpoint(false);
    } else {
        let d = tempfile::Builder::new()
            .prefix("veriflow-bench-")
            .tempdir_in(scratch)
            .with_context(|| format!("cannot create a log directory in {}", scratch.display()))?;
        let store: Arc<dyn Store> = Arc::new(
            SledStore::open(d.path())
                .with_context(|| format!("cannot open a sled store in {}", d.path().display()))?,
        );
        builder = builder.store(store).checkpoint(true);
        dir = Some(d);
    }
    if setting == Setting::S2 {
        builder = builder.kills(vec![Kill {
            vnode: VnodeId(S2_FAILING_VNODE),
            after: shape.tasks()? / 2,
            retarget: false,
        }]);
    }
    let runtime = builder.build().context("building the runtime")?;
    let (root, inputs) = shape.program().root();
    let before = CpuSnapshot::now();
    let report = runtime.run(root, inputs);
    let foreign_cpu_s = CpuSnapshot::foreign_since(before);
    let cpu_s = CpuSnapshot::own_since(before);
    let report = report.with_context(|| format!("knary run {shape:?} {setting:?}"))?;
    let expected = shape.nodes()?;
    if report.outputs.0 != expected {
        bail!(
            "knary {shape:?} {setting:?}: counted {} nodes, expected {expected}",
            report.outputs.0
        );
    }
    if setting.logs() && report.events == 0 {
        bail!("knary {shape:?} in {setting:?} logged no events");
    }
    let failures = report.vnodes.iter().map(|s| s.failures).sum();
    let expected_failures = u64::from(setting == Setting::S2);
    if failures != expected_failures {
        bail!("knary {shape:?} {setting:?}: {failures} vnode failure(s), expected {expected_failures}");
    }
    drop(runtime);
    if let Some(d) = dir {
        let path = d.path().to_path_buf();
        d.close()
            .with_context(|| format!("cannot remove the log directory {}", path.display()))?;
    }
    Ok(KnaryRun {
        elapsed: report.elapsed,
        tasks: report.tasks,
        events: report.events,
        steals: report.vnodes.iter().map(|s| s.adopted).sum(),
        foreign_cpu_s,
        cpu_s,
        failures,
        recovered_tasks: report.vnodes.iter().map(|s| s.recovered_tasks).sum(),
        reused_tasks: report.vnodes.iter().map(|s| s.reused_tasks).sum(),
    })
}

/// One node of the rayon tree: spawns its `fanout` children with `scope.spawn` in a scope of
/// its own, waits for them, and returns the nodes of its subtree (like knary's `Node` + `Sum`).
fn rayon_node(depth: u32, fanout: u32, grain: Duration) -> u64 {
    knary::spin(grain);
    if depth <= 1 {
        return 1;
    }
    let sum = AtomicU64::new(1);
    rayon::scope(|s| {
        for _ in 0..fanout {
            let sum = &sum;
            s.spawn(move |_| {
                sum.fetch_add(rayon_node(depth - 1, fanout, grain), Ordering::Relaxed);
            });
        }
    });
    sum.into_inner()
}

/// What one rayon run measured.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct RayonRun {
    /// Nodes counted.
    pub nodes: u64,
    /// Wall time of `pool.install`.
    pub elapsed: Duration,
    /// CPU seconds other processes used during the run (see [`CpuSnapshot`]).
    pub foreign_cpu_s: Option<f64>,
}

/// Builds the knary tree `shape` (serial children ignored: all run in parallel) on `pool` with
/// one `rayon::scope` + `spawn` per child, each node spinning its grain.
pub fn rayon_tree(pool: &rayon::ThreadPool, shape: Shape) -> RayonRun {
    let grain = Duration::from_micros(shape.grain_us);
    let before = CpuSnapshot::now();
    let t0 = Instant::now();
    let nodes = pool.install(|| rayon_node(shape.depth, shape.fanout, grain));
    let elapsed = t0.elapsed();
    RayonRun {
        nodes,
        elapsed,
        foreign_cpu_s: CpuSnapshot::foreign_since(before),
    }
}

impl harness::Timed for KnaryRun {
    fn seconds(&self) -> f64 {
        self.elapsed.as_secs_f64()
    }
    fn foreign_cpu_s(&self) -> Option<f64> {
        self.foreign_cpu_s
    }
}

impl harness::Timed for RayonRun {
    fn seconds(&self) -> f64 {
        self.elapsed.as_secs_f64()
    }
    fn foreign_cpu_s(&self) -> Option<f64> {
        self.foreign_cpu_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rayon_counts_the_knary_nodes() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let shape = Shape {
            depth: 4,
            fanout: 3,
            serial: 0,
            grain_us: 0,
        };
        assert_eq!(rayon_tree(&pool, shape).nodes, shape.nodes().unwrap());
    }

    #[test]
    fn both_settings_run() {
        let scratch = tempfile::tempdir().unwrap();
        // The failure must come well after the first group commit (`CommitPolicy::max_delay`,
        // 20 ms): before it, the failing vnode's completions are all in its lost open batch and
        // nothing can be reused. 485 tasks of 0.5 ms on 2 threads fail it after ~60 ms.
        let shape = Shape {
            depth: 6,
            fanout: 3,
            serial: 1,
            grain_us: 500,
        };
        let s0 = run_knary(shape, Setting::S0, 2, scratch.path()).unwrap();
        let s1 = run_knary(shape, Setting::S1, 2, scratch.path()).unwrap();
        assert_eq!(s0.tasks, shape.tasks().unwrap());
        assert_eq!(s1.tasks, shape.tasks().unwrap());
        assert_eq!(s0.events, 0);
        assert!(s1.events >= 3 * s1.tasks);
        let s2 = run_knary(shape, Setting::S2, 2, scratch.path()).unwrap();
        assert_eq!((s0.failures, s1.failures, s2.failures), (0, 0, 1));
        assert!(s2.reused_tasks > 0);
    }
}

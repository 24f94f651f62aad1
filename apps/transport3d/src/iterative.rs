//! Iterative mode (paper 000, JaceP2P-V2): the z slabs as blocks of veriflow's asynchronous or
//! synchronous iterations (`veriflow::runtime::iterative`), and the check of such a run.
//!
//! `transport3d run --mode async|sync` runs them in this process (on min(cores, vnodes) threads, with
//! `--kill-random`, `--kill-every`, `--loss`, `--seed` and `--store`, see [`veriflow::App`]);
//! `transport3d cluster|submit --mode async|sync` in cluster mode. [`iterative`] is what both
//! use; [`config`], [`factory`] and [`check`] are its parts.
//!
//! # Rules
//!
//! 1. **Vnodes are slabs.** Vnode v owns block v ([`Problem::block`]); the data neighbours are
//!    the chain v-1, v+1 ([`IterConfig::chain`]). A neighbour's side is found by comparing
//!    indices: v-1 is [`Side::Lower`], v+1 is [`Side::Upper`]; any other vnode is not a
//!    neighbour.
//! 2. **Halos** are `[sender's step: u64][boundary plane][accepted boundary plane]`: the
//!    boundary plane facing the receiver (`block.rs` rule 2) and, for rule 4, the same plane of
//!    the sender's accepted state (the iterate it accepted when it ended its last step), each
//!    `2 nx ny` f64, all little-endian. A halo of another length, or from a vnode that is not a
//!    neighbour, is refused with a [`BlockError`](veriflow::runtime::iterative::BlockError);
//!    bytes never panic. (`halo_for` a vnode that is not a neighbour is empty, which its
//!    receiver refuses.)
//! 3. **Iterations.** One iteration is one outer iteration of the block ([`Block::outer_iteration`]:
//!    the block's system solved with its halos held fixed); its residual is the scaled change of
//!    the block's state, which the runtime's local and global convergence rules compare with
//!    `tol`. Each vnode may do at most [`ITERATION_SLACK`] `× max_outer` iterations per step
//!    with a change at or above `tol` (a vnode of an asynchronous run may iterate on stale
//!    halos; iterations below `tol`, on news while detection runs, do not count).
//! 4. **Step records, bounded.** When a step ends ([`Block::advance`]) a block records what it
//!    needs to compute the true residual of the accepted iterate: the scaled max-norm of `F`
//!    over its planes whose equations involve no halo (one number) and, for each plane next to
//!    a neighbour, `F` there with the halos taken as zero (`F` is linear in a halo plane, so
//!    the neighbour's accepted plane completes it exactly). The neighbours' accepted planes
//!    arrive with their halos of the next step (rule 2; the runtime's verification makes every
//!    vnode install a halo of every neighbour before a step ends, so they always come, the
//!    newest incarnation's last); when the block ends that next step it *closes* the record:
//!    computes its residual and folds it into a [`Summary`] (steps closed, the largest residual
//!    and its step, the last [`RECENT_STEPS`] residuals). So the block's state ([`IterBlock`]'s
//!    `save`, what backups carry) holds the state to resume, one record and a fixed-size
//!    summary: its size does not grow with the steps taken. A step closed without a
//!    neighbour's plane is recorded as unchecked, never as fine.
//! 5. **Check** ([`check`]): every vnode's final state decodes, is at `t_end`, has closed every
//!    step but the last and holds the last one's record; the last step's true global residual
//!    is computed from the records and accepted states of all blocks (every halo taken from the
//!    neighbour's accepted plane, as [`Problem::global_residual`] does), the others are the
//!    worst of the blocks' closed residuals. A run whose largest residual exceeds
//!    [`residual_bound`] was declared converged falsely: its result is wrong; a run with an
//!    unchecked step is not checked, an error too.
//!
//! ```
//! use transport3d::iterative::{check, config, factory, residual_bound};
//! use transport3d::{Model, Params, Problem};
//! use veriflow::runtime::iterative::{run_embedded, Embedded, Mode};
//!
//! let mut p = Params::new(Model::Diurnal);
//! (p.nx, p.ny, p.nz, p.blocks, p.dt, p.t_end) = (6, 3, 6, 3, 120.0, 240.0);
//! (p.tol, p.inner_tol) = (1e-8, 1e-9);
//! let problem = Problem::new(p.clone()).unwrap();
//! let report = run_embedded(config(&p, Mode::Async), factory(&problem), &Embedded::default()).unwrap();
//! let checked = check(&problem, &report.states).unwrap();
//! assert_eq!((checked.steps, checked.residuals.len()), (2, 2));
//! assert!(checked.max_global_residual < residual_bound(&problem));
//! ```

use std::sync::Arc;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use serde_json::json;
use veriflow::runtime::iterative::{
    self as it, BlockFactory, IterConfig, IterReport, Mode as IterMode,
};
use veriflow::runtime::VnodeId;
use veriflow::{Iterative, WrongResult};

use crate::block::{Block, BlockState, Side};
use crate::grid::{ParamError, Params, Problem};
use crate::solution::{AssembleError, Solution};

/// Iterations a vnode may do per step, in units of `max_outer` (rule 3): an asynchronous
/// vnode whose halos are not fresh iterates once more on what it has (its change is then below
/// `tol` and it waits), so it does at most about twice the outer iterations of a synchronous
/// one per news; 4 leaves room for a replacement that restarts a step from an older backup.
pub const ITERATION_SLACK: u64 = 4;

/// Iterations between a vnode's data backups in [`config`] (`--backup-every`; the runtime's
/// default is 10). `paper transport` (64³, 8 vnodes, a vnode killed every 6 % of the run)
/// measured it: with 10, a replacement restarts from up to 10 iterations back and the run took
/// 1.20 × the crash-free time; with 2, 1.03 ×, and the crash-free times were within the noise
/// (7.20 s vs 7.18 s): a backup is one copy of the slab to a neighbour, a tenth of an outer
/// iteration's work.
pub const BACKUP_EVERY: u64 = 2;

/// Margin of [`residual_bound`] (rule 5).
pub const FALSE_CONVERGENCE: f64 = 10.0;

/// The largest true global residual (scaled max-norm of `F`) an accepted iterate may have
/// (rule 5): `FALSE_CONVERGENCE × tol × (1 + dt max_k K_k / dz²)`. Why: a step ends when every
/// block changed by less than `tol` over its last counted outer iterations with fresh halos, so
/// the halo a block used differs from its neighbour's accepted plane by less than about `tol`
/// (scaled), and `F` is linear in the halo with the coefficient `dt K_{k±1/2} / dz²`; the inner
/// solve leaves far less (its Newton steps converge fast: the runs of `tests/iterative.rs` and
/// block Jacobi in `tests/blocks.rs` stay under `1e-3 tol`). A step ended before its halos
/// settled leaves about the first outer iterations' changes times that coefficient
/// (`the_global_residual_sees_stale_halos`: above 1e-6 with tol = 1e-9).
pub fn residual_bound(problem: &Problem) -> f64 {
    let inner = &problem.inner;
    let z = inner
        .z
        .lo
        .iter()
        .chain(&inner.z.up)
        .fold(0.0f64, |m, c| m.max(c.abs()));
    let dt = inner.params.dt.min(inner.params.t_end);
    FALSE_CONVERGENCE * inner.params.tol * (1.0 + dt * z)
}

/// How `transport3d run` computes (`--mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum RunMode {
    /// Every (step, outer iteration, block) a task of the data-flow runtime: logged,
    /// recoverable and certifiable.
    #[default]
    Dataflow,
    /// Iterative mode, asynchronous: a vnode never waits for its neighbours.
    Async,
    /// Iterative mode, synchronous: every iteration waits for fresh halos.
    Sync,
}

impl RunMode {
    /// The iterative mode, or `None` for `dataflow`.
    pub fn iterative(self) -> Option<IterMode> {
        match self {
            RunMode::Dataflow => None,
            RunMode::Async => Some(IterMode::Async),
            RunMode::Sync => Some(IterMode::Sync),
        }
    }
}

/// Steps whose true global residuals a block keeps one by one (rule 4); older steps are
/// summarised by their count and their largest residual. 32 × 8 bytes: the last steps of a run
/// stay visible in `--json` while the state stays proportional to the block, not the run.
pub const RECENT_STEPS: usize = 32;

/// What a block keeps of the last step it ended (rule 4): enough to compute the true residual
/// of that step's accepted iterate once the neighbours' accepted planes are known.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step (0-based: the iterate is the state at `t_{step+1}`).
    pub step: u64,
    /// Scaled max-norm of `F` over the planes whose equations involve no halo.
    pub interior: f64,
    /// The planes next to a neighbour.
    pub edges: Vec<Edge>,
    /// The lower neighbour's accepted top plane of that step, once received (rule 4).
    pub lower: Option<Vec<f64>>,
    /// The upper neighbour's accepted bottom plane of that step, once received (rule 4).
    pub upper: Option<Vec<f64>>,
}

/// An own plane next to a neighbour, in a [`StepRecord`]; its accepted values are the block's
/// accepted state ([`Block::accepted`]) while the record is the last one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Edge {
    /// Own plane, 1-based (1: the lowest).
    pub plane: u32,
    /// `F` on it, unscaled, with both halo planes zero.
    pub f0: Vec<f64>,
}

/// The true residuals of the steps a block has closed (rule 4): bounded, whatever the run's
/// length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Steps closed: 0..closed.
    pub closed: u64,
    /// The largest residual of a closed step (infinity for a NaN), and its step.
    pub max: f64,
    /// The step of `max`.
    pub worst_step: u64,
    /// The residuals of the last closed steps (at most [`RECENT_STEPS`]), oldest first.
    pub recent: Vec<f64>,
    /// The first step closed without a neighbour's accepted plane: its residual is unknown.
    pub unchecked: Option<u64>,
}

impl Summary {
    fn new() -> Self {
        Summary {
            closed: 0,
            max: 0.0,
            worst_step: 0,
            recent: Vec::new(),
            unchecked: None,
        }
    }

    /// Closes step `closed` with its residual (`None`: unknown).
    fn close(&mut self, r: Option<f64>) {
        let step = self.closed;
        self.closed += 1;
        let Some(r) = r else {
            self.unchecked.get_or_insert(step);
            self.recent.push(f64::INFINITY);
            self.trim();
            return;
        };
        let r = if r.is_nan() { f64::INFINITY } else { r };
        if r > self.max {
            self.max = r;
            self.worst_step = step;
        }
        self.recent.push(r);
        self.trim();
    }

    fn trim(&mut self) {
        if self.recent.len() > RECENT_STEPS {
            let extra = self.recent.len() - RECENT_STEPS;
            self.recent.drain(..extra);
        }
    }

    /// Whether it fits a block at `step` (bytes from elsewhere never panic later).
    fn fits(&self, step: u64) -> bool {
        self.closed == step.saturating_sub(1)
            && self.recent.len() <= RECENT_STEPS
            && self.recent.len() as u64 <= self.closed
            && (self.closed == 0 || self.worst_step < self.closed)
            && self.unchecked.is_none_or(|s| s < self.closed)
    }
}

/// The bytes of [`IterBlock`]'s `save` (rule 4): proportional to the block, not the run.
#[derive(Serialize, Deserialize)]
struct Saved {
    block: BlockState,
    summary: Summary,
    last: Option<StepRecord>,
}

/// A transport3d [`Block`] as a block of iterative mode (rules 1-4).
#[derive(Debug)]
pub struct IterBlock {
    block: Block,
    summary: Summary,
    last: Option<StepRecord>,
}

impl IterBlock {
    /// Wraps a block at step 0.
    pub fn new(block: Block) -> Self {
        IterBlock {
            block,
            summary: Summary::new(),
            last: None,
        }
    }

    /// The block.
    pub fn block(&self) -> &Block {
        &self.block
    }

    /// The residuals of the steps it has closed (rule 4).
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// The record of the last step it ended, not closed yet (rule 4).
    pub fn last(&self) -> Option<&StepRecord> {
        self.last.as_ref()
    }

    /// Rule 1: the side of vnode `v`, if it is a neighbour.
    fn side_of(&self, v: VnodeId) -> Option<Side> {
        let me = self.block.index();
        let v = v.0 as usize;
        let side = if v + 1 == me {
            Side::Lower
        } else if v == me + 1 {
            Side::Upper
        } else {
            return None;
        };
        self.block.neighbour(side).map(|_| side)
    }

    fn record(&self) -> StepRecord {
        let (interior, planes) = self.block.residual_parts();
        StepRecord {
            step: self.block.step(),
            interior,
            edges: planes
                .into_iter()
                .map(|(p, f0)| Edge {
                    // p <= nzl <= MAX_AXIS.
                    plane: p as u32,
                    f0,
                })
                .collect(),
            lower: None,
            upper: None,
        }
    }

    /// The own accepted plane facing `side` (rule 2's second part).
    fn accepted_plane(&self, side: Side) -> &[f64] {
        let ps = self.block.halo_len();
        let p = match side {
            Side::Lower => 1,
            Side::Upper => self.block.planes().len(),
        };
        &self.block.accepted()[(p - 1) * ps..p * ps]
    }
}

fn err(m: impl std::fmt::Display) -> it::BlockError {
    it::BlockError(m.to_string())
}

/// Rule 4: the true residual of block `b`'s record `rec` with its neighbours' accepted planes
/// `lower` and `upper` (each needed when the block has that neighbour) and its own accepted
/// state `values`. `Ok(None)`: a needed plane is missing; `Err(())`: the record does not fit.
fn record_residual(
    problem: &Problem,
    b: usize,
    rec: &StepRecord,
    values: &[f64],
    lower: Option<&[f64]>,
    upper: Option<&[f64]>,
) -> Result<Option<f64>, ()> {
    let inner = &problem.inner;
    let n = problem.params().blocks;
    let ps = inner.plane_len();
    let planes = problem.planes(b);
    let nzl = planes.len();
    let (has_lower, has_upper) = (b > 0, b + 1 < n);
    let want = usize::from(has_lower) + usize::from(has_upper)
        - usize::from(has_lower && has_upper && nzl == 1);
    if rec.edges.len() != want || values.len() != nzl * ps {
        return Err(());
    }
    if [lower, upper].iter().flatten().any(|p| p.len() != ps) {
        return Err(());
    }
    if (has_lower && lower.is_none()) || (has_upper && upper.is_none()) {
        return Ok(None);
    }
    let dt = inner.dt_of(rec.step);
    let floor = inner.floor;
    let mut worst = nan_max(0.0, rec.interior);
    for e in &rec.edges {
        let p = e.plane as usize;
        if e.f0.len() != ps || p == 0 || p > nzl {
            return Err(());
        }
        let kg = planes.start + p - 1;
        let lo = lower
            .filter(|_| has_lower && p == 1)
            .map(|h| (dt * inner.z.lo[kg], h));
        let up = upper
            .filter(|_| has_upper && p == nzl)
            .map(|h| (dt * inner.z.up[kg], h));
        let v = &values[(p - 1) * ps..p * ps];
        for idx in 0..ps {
            let mut f = e.f0[idx];
            if let Some((a, h)) = lo {
                f -= a * h[idx];
            }
            if let Some((a, h)) = up {
                f -= a * h[idx];
            }
            let x = f.abs() / (v[idx].abs() + floor[idx & 1]);
            worst = nan_max(worst, x);
        }
    }
    Ok(Some(worst))
}

impl it::Block for IterBlock {
    /// Rule 2: `[sender's step: u64][its current boundary plane][its accepted boundary plane]`.
    fn halo_for(&self, to: VnodeId) -> Vec<u8> {
        match self.side_of(to) {
            Some(side) => {
                let mut out = Vec::with_capacity(8 + 16 * self.block.halo_len());
                out.extend_from_slice(&self.block.step().to_le_bytes());
                for v in self
                    .block
                    .halo_slice(side)
                    .iter()
                    .chain(self.accepted_plane(side))
                {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out
            }
            None => Vec::new(),
        }
    }

    fn set_halo(&mut self, from: VnodeId, halo: &[u8]) -> Result<(), it::BlockError> {
        let me = self.block.index();
        let side = self
            .side_of(from)
            .ok_or_else(|| err(format!("block {me}: {from} is not a neighbour")))?;
        let ps = self.block.halo_len();
        if halo.len() != 8 + 16 * ps {
            return Err(err(format!(
                "block {me}: a halo from {from} has {} bytes, want {} (u64 + f64 x {})",
                halo.len(),
                8 + 16 * ps,
                2 * ps
            )));
        }
        let step = u64::from_le_bytes(halo[..8].try_into().expect("8 bytes"));
        let mut values = halo[8..]
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]));
        let plane: Vec<f64> = values.by_ref().take(ps).collect();
        self.block.set_halo(side, &plane).map_err(err)?;
        // Rule 4: the sender's accepted plane of the step this block's last record is about.
        if let Some(rec) = &mut self.last {
            if step == rec.step + 1 && step == self.block.step() {
                let accepted = Some(values.collect());
                match side {
                    Side::Lower => rec.lower = accepted,
                    Side::Upper => rec.upper = accepted,
                }
            }
        }
        Ok(())
    }

    fn iterate(&mut self) -> f64 {
        self.block.outer_iteration()
    }

    fn advance(&mut self) -> bool {
        if self.block.finished() {
            return false;
        }
        // Rule 4: close the previous step with the accepted planes its neighbours sent.
        if let Some(rec) = self.last.take() {
            let r = record_residual(
                self.block.problem(),
                self.block.index(),
                &rec,
                self.block.accepted(),
                rec.lower.as_deref(),
                rec.upper.as_deref(),
            )
            // Made by this block for its own mesh: it fits; if not, the step is unchecked.
            .unwrap_or(None);
            self.summary.close(r);
        }
        self.last = Some(self.record());
        self.block.advance()
    }

    fn save(&self) -> Vec<u8> {
        let saved = Saved {
            block: self.block.state(),
            summary: self.summary.clone(),
            last: self.last.clone(),
        };
        // Plain numbers and vectors into a Vec: cannot fail.
        postcard::to_stdvec(&saved).unwrap_or_default()
    }

    fn restore(&mut self, state: &[u8]) -> Result<(), it::BlockError> {
        let saved: Saved = postcard::from_bytes(state).map_err(|e| err(format!("{e}")))?;
        let me = self.block.index();
        if saved.block.index as usize != me {
            return Err(err(format!(
                "block {me}: a state of block {}",
                saved.block.index
            )));
        }
        let step = saved.block.step;
        let last_fits = match &saved.last {
            None => step == 0,
            Some(r) => step > 0 && r.step + 1 == step,
        };
        if !last_fits || !saved.summary.fits(step) {
            return Err(err(format!(
                "block {me}: a state at step {step} whose step records do not fit it"
            )));
        }
        self.block = self
            .block
            .problem()
            .block_from_state(saved.block)
            .map_err(err)?;
        self.summary = saved.summary;
        self.last = saved.last;
        Ok(())
    }
}

/// The configuration of an iterative run of `params` (rules 1 and 3): the chain of
/// `params.blocks` vnodes, `tol`, and the runtime's defaults for the rest.
pub fn config(params: &Params, mode: IterMode) -> IterConfig {
    // blocks <= nz <= MAX_AXIS.
    let mut cfg = IterConfig::new(mode, IterConfig::chain(params.blocks as u32), params.tol);
    cfg.max_iterations = u64::from(params.max_outer) * ITERATION_SLACK;
    cfg.backup_every = BACKUP_EVERY;
    cfg
}

/// The blocks of `problem` at t = 0, vnode v making block v (rule 1).
pub fn factory(problem: &Problem) -> BlockFactory {
    let problem = problem.clone();
    Arc::new(move |v: VnodeId| {
        let b = v.0 as usize;
        let n = problem.params().blocks;
        if b >= n {
            return Err(err(format!("{v}: the problem has {n} blocks")));
        }
        Ok(Box::new(IterBlock::new(problem.block(b))) as Box<dyn it::Block>)
    })
}

/// Final states that are not a finished run of the problem (rule 5).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CheckError {
    /// Not one state per block.
    #[error("{got} final states for {want} blocks")]
    Count {
        /// Blocks.
        want: usize,
        /// States.
        got: usize,
    },
    /// A state does not decode or does not fit.
    #[error("v{vnode}: {message}")]
    State {
        /// Whose.
        vnode: usize,
        /// What is wrong.
        message: String,
    },
    /// A block is not at `t_end`, or its records do not cover every step.
    #[error("v{vnode}: at step {step} with {records} steps recorded, want {want} of each")]
    Steps {
        /// Whose.
        vnode: usize,
        /// Its step.
        step: u64,
        /// Steps its records cover (closed, and the last one).
        records: u64,
        /// Steps of the problem.
        want: u64,
    },
    /// A record does not have the planes its block needs.
    #[error("v{vnode}: the record of step {step} does not fit the mesh")]
    Record {
        /// Whose.
        vnode: usize,
        /// Which step.
        step: u64,
    },
    /// A block ended a step without a neighbour's accepted plane: that step's residual is
    /// unknown, so the run cannot be checked.
    #[error("v{vnode}: step {step} ended without a neighbour's accepted plane: its true residual is unknown (not checked)")]
    Unchecked {
        /// Whose.
        vnode: usize,
        /// Which step.
        step: u64,
    },
    /// The blocks do not assemble.
    #[error(transparent)]
    Assemble(#[from] AssembleError),
}

/// What [`check`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    /// The final concentrations (at `t_end`).
    pub solution: Solution,
    /// Steps whose true global residual was computed: all of them.
    pub steps: u64,
    /// The true global residuals of the last steps (at most [`RECENT_STEPS`], rule 4), oldest
    /// first; the first is that of step `first_step`.
    pub residuals: Vec<f64>,
    /// The step of `residuals[0]`.
    pub first_step: u64,
    /// The largest true global residual of all steps (infinity for a NaN).
    pub max_global_residual: f64,
    /// Its step.
    pub worst_step: u64,
}

impl Checked {
    /// The worst step if its residual exceeds `bound`: a false convergence (rule 5).
    pub fn false_convergence(&self, bound: f64) -> Option<(u64, f64)> {
        // NaN is never below a bound (and was made infinity).
        (self.max_global_residual.is_nan() || self.max_global_residual > bound)
            .then_some((self.worst_step, self.max_global_residual))
    }

    /// The summary `run --json` reports: steps, time, residuals, digest, mass and the values
    /// at three mesh points (the corners and the centre, as the dataflow check).
    pub fn to_json(&self, problem: &Problem) -> serde_json::Value {
        let s = &self.solution;
        let points = sample_points(problem);
        let samples: Vec<_> = points
            .iter()
            .map(|&(i, j, k)| json!({"at": [i, j, k], "c": s.at(i, j, k)}))
            .collect();
        json!({
            "steps": s.step,
            "time": s.time,
            "max_global_residual": self.max_global_residual,
            "worst_step": self.worst_step,
            "global_residuals": self.residuals,
            "global_residuals_from_step": self.first_step,
            "digest": s.digest(),
            "mass": s.mass(problem),
            "samples": samples,
        })
    }
}

/// The mesh points `to_json` samples: (0,0,0), the centre, the far corner.
pub fn sample_points(problem: &Problem) -> [(usize, usize, usize); 3] {
    let p = problem.params();
    [
        (0, 0, 0),
        (p.nx / 2, p.ny / 2, p.nz / 2),
        (p.nx - 1, p.ny - 1, p.nz - 1),
    ]
}

/// Rule 5: the final solution and the true global residual of every step, from the final
/// states of an iterative run (by vnode, as [`IterReport::states`]): the steps the blocks
/// closed during the run from their summaries, the last one from their last records.
pub fn check(problem: &Problem, states: &[Vec<u8>]) -> Result<Checked, CheckError> {
    let n = problem.params().blocks;
    if states.len() != n {
        return Err(CheckError::Count {
            want: n,
            got: states.len(),
        });
    }
    let steps = problem.steps();
    let mut blocks = Vec::with_capacity(n);
    let mut saves = Vec::with_capacity(n);
    for (v, bytes) in states.iter().enumerate() {
        let bad = |message: String| CheckError::State { vnode: v, message };
        let saved: Saved = postcard::from_bytes(bytes).map_err(|e| bad(e.to_string()))?;
        if saved.block.index as usize != v {
            return Err(bad(format!("the state of block {}", saved.block.index)));
        }
        let block = problem
            .block_from_state(saved.block)
            .map_err(|e| bad(e.to_string()))?;
        let last_step = saved.last.as_ref().map(|r| r.step);
        let records = saved.summary.closed + u64::from(last_step.is_some());
        if block.step() != steps
            || steps == 0
            || last_step != Some(steps - 1)
            || !saved.summary.fits(steps)
        {
            return Err(CheckError::Steps {
                vnode: v,
                step: block.step(),
                records,
                want: steps,
            });
        }
        if let Some(step) = saved.summary.unchecked {
            return Err(CheckError::Unchecked { vnode: v, step });
        }
        blocks.push(block);
        saves.push((saved.summary, saved.last.expect("checked above")));
    }
    let solution = problem.assemble_accepted(&blocks)?;
    // The last step: every block's record with its neighbours' accepted planes.
    let ps = problem.inner.plane_len();
    let plane = |b: usize, side: Side| -> &[f64] {
        let nzl = problem.planes(b).len();
        let p = if side == Side::Lower { 1 } else { nzl };
        &blocks[b].accepted()[(p - 1) * ps..p * ps]
    };
    let mut last = 0.0;
    for (b, (_, rec)) in saves.iter().enumerate() {
        let lower = (b > 0).then(|| plane(b - 1, Side::Upper));
        let upper = (b + 1 < n).then(|| plane(b + 1, Side::Lower));
        let r = record_residual(problem, b, rec, blocks[b].accepted(), lower, upper)
            .ok()
            .flatten()
            .ok_or(CheckError::Record {
                vnode: b,
                step: rec.step,
            })?;
        last = nan_max(last, r);
    }
    // The closed steps: the worst of every block's, step by step for the recent ones.
    let (mut max_global_residual, mut worst_step) = (0.0, 0);
    for (summary, _) in &saves {
        if summary.closed > 0 && summary.max > max_global_residual {
            (max_global_residual, worst_step) = (summary.max, summary.worst_step);
        }
    }
    if last.is_nan() || last > max_global_residual || steps == 1 {
        (max_global_residual, worst_step) = (nan_max(last, max_global_residual), steps - 1);
    }
    let kept = saves.iter().map(|(s, _)| s.recent.len()).min().unwrap_or(0);
    let mut residuals: Vec<f64> = (0..kept)
        .map(|i| {
            saves
                .iter()
                .map(|(s, _)| s.recent[s.recent.len() - kept + i])
                .fold(0.0, nan_max)
        })
        .collect();
    residuals.push(last);
    if residuals.len() > RECENT_STEPS {
        residuals.remove(0);
    }
    let first_step = steps - residuals.len() as u64;
    Ok(Checked {
        solution,
        steps,
        residuals,
        first_step,
        max_global_residual,
        worst_step,
    })
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::INFINITY
    } else {
        a.max(b)
    }
}

/// An iterative run of `params` in `mode` for [`veriflow::App`] and cluster mode: [`config`],
/// [`factory`] and, as the result, [`check`] with rule 5's bound (a false convergence or
/// unusable final states are a wrong result), reported as [`Checked::to_json`].
pub fn iterative(params: &Params, mode: IterMode) -> Result<Iterative, ParamError> {
    let problem = Problem::new(params.clone())?;
    let bound = residual_bound(&problem);
    let p2 = problem.clone();
    let check = Arc::new(move |report: &IterReport| {
        let checked = check(&p2, &report.states).map_err(|e| WrongResult {
            expected: "every block's final state at t_end with its step records".into(),
            got: e.to_string(),
        })?;
        if let Some((step, r)) = checked.false_convergence(bound) {
            return Err(WrongResult {
                expected: format!("a true global residual <= {bound:e} at every step"),
                got: format!("{r:e} at step {step} (false convergence)"),
            });
        }
        if let Some(bad) = checked.solution.c.iter().find(|v| !v.is_finite()) {
            return Err(WrongResult {
                expected: "finite concentrations".into(),
                got: bad.to_string(),
            });
        }
        Ok(checked.to_json(&p2))
    });
    Ok(Iterative {
        config: config(params, mode),
        factory: factory(&problem),
        check,
    })
}

//! Iterative mode (paper 000, JaceP2P-V2): the z slabs as blocks of veriflow's asynchronous or
//! synchronous iterations (`veriflow::runtime::iterative`), and the check of such a run.
//!
//! `transport3d run --mode async|sync` runs them in this process (one thread per vnode, with
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
//! 2. **Halos** are the boundary plane facing the receiver (`block.rs` rule 2) as `2 nx ny`
//!    f64 little-endian. A halo of another length, or from a vnode that is not a neighbour, is
//!    refused with a [`BlockError`](veriflow::runtime::iterative::BlockError); bytes never
//!    panic. (`halo_for` a vnode that is not a neighbour is empty, which its receiver refuses.)
//! 3. **Iterations.** One iteration is one outer iteration of the block ([`Block::outer_iteration`]:
//!    the block's system solved with its halos held fixed); its residual is the scaled change of
//!    the block's state, which the runtime's local and global convergence rules compare with
//!    `tol`. Each vnode may do at most [`ITERATION_SLACK`] `× max_outer` iterations per step
//!    with a change at or above `tol` (a vnode of an asynchronous run may iterate on stale
//!    halos; iterations below `tol`, on news while detection runs, do not count).
//! 4. **Step records.** When a step ends ([`Block::advance`]) a block records what the check
//!    needs to compute the true residual of the accepted iterate later, and nothing more: the
//!    scaled max-norm of `F` over its planes whose equations involve no halo (one number), and,
//!    for each plane next to a neighbour, `F` there with the halos taken as zero and the plane's
//!    values — at most 4 planes per step however thick the slab (`F` is linear in a halo plane,
//!    so the neighbour's accepted plane completes it exactly). The records travel in the
//!    block's state ([`IterBlock`]'s `save`), so a replacement restored from a backup carries
//!    them, and the steps it ends again are recorded from the iterate it really accepted.
//! 5. **Check** ([`check`]): every vnode's final state decodes, is at `t_end` and holds one
//!    record per step; the true global residual of every step's accepted iterate is computed
//!    from the records of all blocks (every halo taken from the neighbour's accepted plane, as
//!    [`Problem::global_residual`] does). A run whose residual at some step exceeds
//!    [`residual_bound`] was declared converged falsely: its result is wrong.
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
//! assert_eq!(checked.residuals.len(), 2);
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

/// What a block keeps of one step's accepted iterate (rule 4).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step (0-based: the iterate is the state at `t_{step+1}`).
    pub step: u64,
    /// Scaled max-norm of `F` over the planes whose equations involve no halo.
    pub interior: f64,
    /// The planes next to a neighbour.
    pub edges: Vec<Edge>,
}

/// An own plane next to a neighbour, in a [`StepRecord`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Edge {
    /// Own plane, 1-based (1: the lowest).
    pub plane: u32,
    /// `F` on it, unscaled, with both halo planes zero.
    pub f0: Vec<f64>,
    /// The accepted values on it.
    pub values: Vec<f64>,
}

/// The bytes of [`IterBlock`]'s `save` (rule 4).
#[derive(Serialize, Deserialize)]
struct Saved {
    block: BlockState,
    history: Vec<StepRecord>,
}

/// A transport3d [`Block`] as a block of iterative mode (rules 1-4).
#[derive(Debug)]
pub struct IterBlock {
    block: Block,
    history: Vec<StepRecord>,
}

impl IterBlock {
    /// Wraps a block (at any step; its earlier steps have no records).
    pub fn new(block: Block) -> Self {
        IterBlock {
            block,
            history: Vec::new(),
        }
    }

    /// The block.
    pub fn block(&self) -> &Block {
        &self.block
    }

    /// The records of the steps it ended (rule 4).
    pub fn history(&self) -> &[StepRecord] {
        &self.history
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
        let ps = self.block.halo_len();
        let values = self.block.values();
        StepRecord {
            step: self.block.step(),
            interior,
            edges: planes
                .into_iter()
                .map(|(p, f0)| Edge {
                    // p <= nzl <= MAX_AXIS.
                    plane: p as u32,
                    f0,
                    values: values[(p - 1) * ps..p * ps].to_vec(),
                })
                .collect(),
        }
    }
}

fn err(m: impl std::fmt::Display) -> it::BlockError {
    it::BlockError(m.to_string())
}

impl it::Block for IterBlock {
    fn halo_for(&self, to: VnodeId) -> Vec<u8> {
        match self.side_of(to) {
            Some(side) => self
                .block
                .halo_slice(side)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            None => Vec::new(),
        }
    }

    fn set_halo(&mut self, from: VnodeId, halo: &[u8]) -> Result<(), it::BlockError> {
        let me = self.block.index();
        let side = self
            .side_of(from)
            .ok_or_else(|| err(format!("block {me}: {from} is not a neighbour")))?;
        let want = self.block.halo_len();
        if halo.len() != 8 * want {
            return Err(err(format!(
                "block {me}: a halo from {from} has {} bytes, want {} (f64 x {want})",
                halo.len(),
                8 * want
            )));
        }
        let plane: Vec<f64> = halo
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        self.block.set_halo(side, &plane).map_err(err)
    }

    fn iterate(&mut self) -> f64 {
        self.block.outer_iteration()
    }

    fn advance(&mut self) -> bool {
        if self.block.finished() {
            return false;
        }
        let r = self.record();
        self.history.push(r);
        self.block.advance()
    }

    fn save(&self) -> Vec<u8> {
        let saved = Saved {
            block: self.block.state(),
            history: self.history.clone(),
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
        if saved.history.len() as u64 != saved.block.step
            || saved
                .history
                .iter()
                .enumerate()
                .any(|(s, r)| r.step != s as u64)
        {
            return Err(err(format!(
                "block {me}: a state at step {} with {} step records",
                saved.block.step,
                saved.history.len()
            )));
        }
        self.block = self
            .block
            .problem()
            .block_from_state(saved.block)
            .map_err(err)?;
        self.history = saved.history;
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
    /// A block is not at `t_end`, or its records are not one per step.
    #[error("v{vnode}: at step {step} with {records} step records, want {want} of each")]
    Steps {
        /// Whose.
        vnode: usize,
        /// Its step.
        step: u64,
        /// Its records.
        records: usize,
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
    /// The blocks do not assemble.
    #[error(transparent)]
    Assemble(#[from] AssembleError),
}

/// What [`check`] found.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    /// The final concentrations (at `t_end`).
    pub solution: Solution,
    /// The true global residual of each step's accepted iterate (rule 5).
    pub residuals: Vec<f64>,
    /// Their largest.
    pub max_global_residual: f64,
}

impl Checked {
    /// The first step whose residual exceeds `bound`: a false convergence (rule 5).
    pub fn false_convergence(&self, bound: f64) -> Option<(u64, f64)> {
        self.residuals
            .iter()
            .enumerate()
            // NaN is never below a bound.
            .find(|(_, r)| r.is_nan() || **r > bound)
            .map(|(s, r)| (s as u64, *r))
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
            "global_residuals": self.residuals,
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
/// states of an iterative run (by vnode, as [`IterReport::states`]).
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
    let mut histories = Vec::with_capacity(n);
    for (v, bytes) in states.iter().enumerate() {
        let bad = |message: String| CheckError::State { vnode: v, message };
        let saved: Saved = postcard::from_bytes(bytes).map_err(|e| bad(e.to_string()))?;
        if saved.block.index as usize != v {
            return Err(bad(format!("the state of block {}", saved.block.index)));
        }
        let block = problem
            .block_from_state(saved.block)
            .map_err(|e| bad(e.to_string()))?;
        if block.step() != steps
            || saved.history.len() as u64 != steps
            || saved
                .history
                .iter()
                .enumerate()
                .any(|(s, r)| r.step != s as u64)
        {
            return Err(CheckError::Steps {
                vnode: v,
                step: block.step(),
                records: saved.history.len(),
                want: steps,
            });
        }
        blocks.push(block);
        histories.push(saved.history);
    }
    let solution = problem.assemble_accepted(&blocks)?;
    let residuals = (0..steps)
        .map(|s| step_residual(problem, &histories, s))
        .collect::<Result<Vec<f64>, CheckError>>()?;
    let max_global_residual = residuals.iter().copied().fold(0.0, nan_max);
    Ok(Checked {
        solution,
        residuals,
        max_global_residual,
    })
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::INFINITY
    } else {
        a.max(b)
    }
}

/// Rule 5 for one step: every block's `F` with its neighbours' accepted planes as halos.
fn step_residual(
    problem: &Problem,
    histories: &[Vec<StepRecord>],
    s: u64,
) -> Result<f64, CheckError> {
    let inner = &problem.inner;
    let n = histories.len();
    let ps = inner.plane_len();
    let dt = inner.dt_of(s);
    let floor = inner.floor;
    let rec = |b: usize| &histories[b][s as usize];
    let nzl = |b: usize| problem.planes(b).len();
    // The accepted values of block b's own plane p (1-based).
    let plane = |b: usize, p: usize| -> Result<&[f64], CheckError> {
        rec(b)
            .edges
            .iter()
            .find(|e| e.plane as usize == p && e.values.len() == ps)
            .map(|e| e.values.as_slice())
            .ok_or(CheckError::Record { vnode: b, step: s })
    };
    let mut worst = 0.0;
    for b in 0..n {
        let r = rec(b);
        worst = nan_max(worst, r.interior);
        let lower = if b > 0 {
            Some(plane(b - 1, nzl(b - 1))?)
        } else {
            None
        };
        let upper = if b + 1 < n {
            Some(plane(b + 1, 1)?)
        } else {
            None
        };
        let want = usize::from(lower.is_some()) + usize::from(upper.is_some())
            - usize::from(lower.is_some() && upper.is_some() && nzl(b) == 1);
        if r.edges.len() != want {
            return Err(CheckError::Record { vnode: b, step: s });
        }
        for e in &r.edges {
            let p = e.plane as usize;
            if e.f0.len() != ps || e.values.len() != ps || p == 0 || p > nzl(b) {
                return Err(CheckError::Record { vnode: b, step: s });
            }
            let kg = problem.planes(b).start + p - 1;
            let lo = lower.filter(|_| p == 1).map(|h| (dt * inner.z.lo[kg], h));
            let up = upper
                .filter(|_| p == nzl(b))
                .map(|h| (dt * inner.z.up[kg], h));
            for idx in 0..ps {
                let mut f = e.f0[idx];
                if let Some((a, h)) = lo {
                    f -= a * h[idx];
                }
                if let Some((a, h)) = up {
                    f -= a * h[idx];
                }
                let x = f.abs() / (e.values[idx].abs() + floor[idx & 1]);
                worst = nan_max(worst, x);
            }
        }
    }
    Ok(worst)
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

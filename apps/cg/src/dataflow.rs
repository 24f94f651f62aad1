//! `cg run --mode dataflow`: every iteration of CG as tasks of the data-flow runtime, per row
//! block, logged, recoverable and certifiable.
//!
//! One iteration k, for blocks b = 0..B (the kernel rules 1-3, so the bits equal
//! [`crate::kernel::solve`] with the same B):
//!
//! ```text
//!  p_c (c in needs(b)) ──> Spmv_b ──> q_b, pq_b ──> Sum ──> pq
//!  x_b, r_b, p_b, q_b, rho_k, pq ──> Update_b ──> x'_b, r'_b, rr_b ──> Sum ──> rho_{k+1}
//!  r'_b, p_b, rho_k, rho_{k+1} ──> Direction_b ──> p'_b
//! ```
//!
//! Rules:
//!
//! 1. **The matrix is named, not carried.** Tasks carry a [`Cfg`] (the matrix [`Source`], the
//!    rhs, B, the threshold); each process loads the matrix once (problem rule 3) and a task
//!    takes its rows from it. Vectors are data objects, one per block; a block's SpMV reads only
//!    the p blocks its rows touch ([`Problem::needs`]).
//! 2. **Fixed-order reductions.** [`Sum`] adds the partials in block order (kernel rule 2), so x
//!    and the iteration count are the same bits on any number of vnodes, with or without
//!    failures, and equal to the sequential solver's.
//! 3. **Batches.** A task cannot hand a child a data object it did not create, so the chain of
//!    iterations is spawned in batches: [`Start`] (then each [`Step`]) spawns `batch`
//!    iterations and the next [`Step`], which reads the batch's x, r, p blocks and its rho
//!    history. If CG converged in the batch (or hit max_iter), that Step writes the
//!    [`Solution`]; otherwise it re-injects the state through [`Seed`] tasks (which log x, r, p
//!    once more: a cost of 6n values per batch, against 4n per iteration) and spawns the next
//!    batch. Every Step's output is the run's output, delegated down the chain.
//! 4. **Convergence inside a batch.** Iterations after convergence are spawned already; they pass
//!    their state through unchanged (Update and Direction test `converged(rho_k)`), so
//!    rho stays put and the Step finds the first converged iteration in the history.
//! 5. Every failure is a task error naming the task: a matrix that cannot be loaded, blocks of
//!    the wrong length, a breakdown (p.Ap <= 0). No task panics.

use serde::{Deserialize, Serialize};
use veriflow::{Ctx, Read, Task, TaskError, TaskResult, Write, Writes};

use crate::kernel::{self, Partition};
use crate::problem::{problem, Problem, Rhs, Source};

/// What every task of a run carries (rule 1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cfg {
    /// The matrix.
    pub source: Source,
    /// The known solution L (b = A L).
    pub rhs: Rhs,
    /// Row blocks B.
    pub blocks: u32,
    /// Iteration cap.
    pub max_iter: u64,
    /// Iterations per batch (rule 3).
    pub batch: u32,
    /// rtol * |b|: converged when sqrt(rho) <= this.
    pub threshold: f64,
}

impl Cfg {
    fn load(&self) -> Result<std::sync::Arc<Problem>, TaskError> {
        Ok(problem(&self.source, self.rhs)?)
    }

    fn part(&self, p: &Problem) -> Partition {
        Partition::new(p.n(), self.blocks as usize)
    }
}

/// The run's result: x, and how it got there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Solution {
    /// The solution.
    pub x: Vec<f64>,
    /// Iterations done.
    pub iterations: u64,
    /// Final r.r.
    pub rho: f64,
    /// Whether |r| <= rtol |b|.
    pub converged: bool,
}

/// The root: loads the problem, computes |b| and the threshold, spawns the blocks' initial
/// state and the first batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Start {
    /// The matrix.
    pub source: Source,
    /// The known solution.
    pub rhs: Rhs,
    /// Row blocks.
    pub blocks: u32,
    /// Relative tolerance on |r| / |b|.
    pub rtol: f64,
    /// Iteration cap [default 10 n, as scipy].
    pub max_iter: Option<u64>,
    /// Iterations per batch.
    pub batch: u32,
}

impl Task for Start {
    const NAME: &'static str = "cg.start";
    type Inputs = ();
    type Outputs = (Solution,);

    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        let p = problem(&self.source, self.rhs)?;
        let n = p.n();
        let part = Partition::new(n, self.blocks as usize);
        let partials: Vec<f64> = part
            .ranges()
            .map(|r| kernel::dot(&p.b[r.clone()], &p.b[r]))
            .collect();
        let rho0 = kernel::sum_ordered(&partials);
        let cfg = Cfg {
            source: self.source,
            rhs: self.rhs,
            blocks: self.blocks,
            max_iter: self
                .max_iter
                .unwrap_or_else(|| 10u64.saturating_mul(n as u64)),
            batch: self.batch.max(1),
            threshold: self.rtol * rho0.sqrt(),
        };
        if kernel::converged(rho0, cfg.threshold) || cfg.max_iter == 0 {
            ctx.write(
                out,
                Solution {
                    x: vec![0.0; n],
                    iterations: 0,
                    rho: rho0,
                    converged: kernel::converged(rho0, cfg.threshold),
                },
            );
            return Ok(());
        }
        let (mut xs, mut rs, mut ps, mut rrs) = (vec![], vec![], vec![], vec![]);
        for b in 0..self.blocks {
            let (x, r, pb, rr) = ctx.spawn(
                Init {
                    cfg: cfg.clone(),
                    block: b,
                },
                (),
            );
            xs.push(x);
            rs.push(r);
            ps.push(pb);
            rrs.push(rr);
        }
        let (rho,) = ctx.spawn(Sum, rrs);
        spawn_batch(ctx, &cfg, &p, 0, State { xs, rs, ps, rho }, out);
        Ok(())
    }
}

/// Handles to the state at the start of an iteration.
struct State {
    xs: Vec<Read<Vec<f64>>>,
    rs: Vec<Read<Vec<f64>>>,
    ps: Vec<Read<Vec<f64>>>,
    rho: Read<f64>,
}

/// Spawns iterations `k0 .. k0 + batch` (capped at max_iter) and the [`Step`] after them,
/// which takes over `out` (rule 3).
fn spawn_batch(
    ctx: &mut Ctx<'_>,
    cfg: &Cfg,
    p: &Problem,
    k0: u64,
    mut s: State,
    out: Write<Solution>,
) {
    let needs = p.needs(cfg.part(p));
    let count = u64::from(cfg.batch)
        .min(cfg.max_iter.saturating_sub(k0))
        .max(1);
    let mut history = vec![s.rho];
    for k in k0..k0 + count {
        let (mut qs, mut pqs) = (vec![], vec![]);
        for b in 0..cfg.blocks {
            let reads = needs[b as usize]
                .iter()
                .map(|&c| s.ps[c as usize])
                .collect();
            let (q, pq) = ctx.spawn(
                Spmv {
                    cfg: cfg.clone(),
                    block: b,
                    k,
                },
                reads,
            );
            qs.push(q);
            pqs.push(pq);
        }
        let (pq,) = ctx.spawn(Sum, pqs);
        let (mut xs, mut rs, mut rrs) = (vec![], vec![], vec![]);
        for (b, &q) in qs.iter().enumerate() {
            let (x, r, rr) = ctx.spawn(
                Update {
                    cfg: cfg.clone(),
                    block: b as u32,
                    k,
                },
                (s.xs[b], s.rs[b], s.ps[b], q, s.rho, pq),
            );
            xs.push(x);
            rs.push(r);
            rrs.push(rr);
        }
        let (rho,) = ctx.spawn(Sum, rrs);
        let mut ps = vec![];
        for (b, &r) in rs.iter().enumerate() {
            let (pn,) = ctx.spawn(
                Direction {
                    cfg: cfg.clone(),
                    block: b as u32,
                    k,
                },
                (r, s.ps[b], s.rho, rho),
            );
            ps.push(pn);
        }
        history.push(rho);
        s = State { xs, rs, ps, rho };
    }
    let (hist,) = ctx.spawn(History, history);
    let mut reads = s.xs;
    reads.extend(s.rs);
    reads.extend(s.ps);
    reads.push(hist);
    ctx.spawn_delegate(
        Step {
            cfg: cfg.clone(),
            k: k0 + count,
        },
        reads,
        (out,),
    );
}

fn check_len(what: &str, block: u32, got: usize, want: usize) -> TaskResult {
    if got == want {
        Ok(())
    } else {
        Err(TaskError::msg(format!(
            "block {block}: {what} has {got} entries, the block has {want} rows"
        )))
    }
}

/// The initial state of a block: x = 0, r = p = b, and its partial b.b.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Init {
    /// The run.
    pub cfg: Cfg,
    /// Which block.
    pub block: u32,
}

impl Task for Init {
    const NAME: &'static str = "cg.init";
    type Inputs = ();
    type Outputs = (Vec<f64>, Vec<f64>, Vec<f64>, f64);

    fn run(self, ctx: &mut Ctx<'_>, (): (), (x, r, p, rr): Writes<Self>) -> TaskResult {
        let prob = self.cfg.load()?;
        let rows = self.cfg.part(&prob).range(self.block as usize);
        let b = prob.b[rows].to_vec();
        ctx.write(rr, kernel::dot(&b, &b));
        ctx.write(x, vec![0.0; b.len()]);
        ctx.write(r, b.clone());
        ctx.write(p, b);
        Ok(())
    }
}

/// Sum of partials in input (block) order (rule 2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sum;

impl Task for Sum {
    const NAME: &'static str = "cg.sum";
    type Inputs = Vec<f64>;
    type Outputs = (f64,);

    fn run(self, ctx: &mut Ctx<'_>, parts: Vec<f64>, (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, kernel::sum_ordered(&parts));
        Ok(())
    }
}

/// q_b = A_b p and the partial p_b.q_b; reads the p blocks of `needs(block)` in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spmv {
    /// The run.
    pub cfg: Cfg,
    /// Which block.
    pub block: u32,
    /// Iteration (for the reader of logs).
    pub k: u64,
}

impl Task for Spmv {
    const NAME: &'static str = "cg.spmv";
    type Inputs = Vec<Vec<f64>>;
    type Outputs = (Vec<f64>, f64);

    fn run(self, ctx: &mut Ctx<'_>, p_blocks: Vec<Vec<f64>>, (q, pq): Writes<Self>) -> TaskResult {
        let prob = self.cfg.load()?;
        let part = self.cfg.part(&prob);
        let needs = prob.needs(part);
        let need = &needs[self.block as usize];
        if need.len() != p_blocks.len() {
            return Err(TaskError::msg(format!(
                "block {}: {} p blocks given, its rows touch {}",
                self.block,
                p_blocks.len(),
                need.len()
            )));
        }
        // A window of p from the first to the last block needed; blocks in between that the
        // rows do not touch stay zero.
        let lo = part.range(need[0] as usize).start;
        let hi = part.range(need[need.len() - 1] as usize).end;
        let mut window = vec![0.0; hi - lo];
        for (&c, pc) in need.iter().zip(&p_blocks) {
            let rows = part.range(c as usize);
            check_len("p", c, pc.len(), rows.len())?;
            window[rows.start - lo..rows.end - lo].copy_from_slice(pc);
        }
        let rows = part.range(self.block as usize);
        let mut qb = vec![0.0; rows.len()];
        let partial = kernel::spmv_dot(prob.a.rows(rows), &window, lo, &mut qb);
        ctx.write(q, qb);
        ctx.write(pq, partial);
        Ok(())
    }
}

/// x += alpha p, r -= alpha q on a block, and its partial r.r; passes through once converged
/// (rule 4).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Update {
    /// The run.
    pub cfg: Cfg,
    /// Which block.
    pub block: u32,
    /// Iteration.
    pub k: u64,
}

impl Task for Update {
    const NAME: &'static str = "cg.update";
    type Inputs = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, f64, f64);
    type Outputs = (Vec<f64>, Vec<f64>, f64);

    fn run(
        self,
        ctx: &mut Ctx<'_>,
        (mut x, mut r, p, q, rho, pq): Self::Inputs,
        (xo, ro, rr): Writes<Self>,
    ) -> TaskResult {
        let n = x.len();
        for (what, len) in [("r", r.len()), ("p", p.len()), ("q", q.len())] {
            check_len(what, self.block, len, n)?;
        }
        let partial = if kernel::converged(rho, self.cfg.threshold) {
            kernel::dot(&r, &r)
        } else {
            let alpha = kernel::alpha(rho, pq, self.k)?;
            kernel::update(&mut x, &mut r, &p, &q, alpha)
        };
        ctx.write(xo, x);
        ctx.write(ro, r);
        ctx.write(rr, partial);
        Ok(())
    }
}

/// p = r + beta p on a block, beta = rho_{k+1} / rho_k; passes through once converged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Direction {
    /// The run.
    pub cfg: Cfg,
    /// Which block.
    pub block: u32,
    /// Iteration.
    pub k: u64,
}

impl Task for Direction {
    const NAME: &'static str = "cg.direction";
    type Inputs = (Vec<f64>, Vec<f64>, f64, f64);
    type Outputs = (Vec<f64>,);

    fn run(
        self,
        ctx: &mut Ctx<'_>,
        (r, mut p, rho, rho_next): Self::Inputs,
        (po,): Writes<Self>,
    ) -> TaskResult {
        check_len("r", self.block, r.len(), p.len())?;
        if !kernel::converged(rho, self.cfg.threshold) {
            kernel::direction(&mut p, &r, rho_next / rho);
        }
        ctx.write(po, p);
        Ok(())
    }
}

/// Gathers a batch's rho values into one object for the [`Step`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct History;

impl Task for History {
    const NAME: &'static str = "cg.history";
    type Inputs = Vec<f64>;
    type Outputs = (Vec<f64>,);

    fn run(self, ctx: &mut Ctx<'_>, rhos: Vec<f64>, (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, rhos);
        Ok(())
    }
}

/// After a batch that ends at iteration `k`: finish, or re-inject the state and go on (rule 3).
/// Reads x_0..x_B, r_0..r_B, p_0..p_B, then the history rho_{k-S} ..= rho_k.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The run.
    pub cfg: Cfg,
    /// Iterations done by the batches before.
    pub k: u64,
}

impl Task for Step {
    const NAME: &'static str = "cg.step";
    type Inputs = Vec<Vec<f64>>;
    type Outputs = (Solution,);

    fn run(self, ctx: &mut Ctx<'_>, mut inputs: Vec<Vec<f64>>, (out,): Writes<Self>) -> TaskResult {
        let blocks = self.cfg.blocks as usize;
        if inputs.len() != 3 * blocks + 1 {
            return Err(TaskError::msg(format!(
                "{} inputs, expected 3 x {blocks} blocks + the history",
                inputs.len()
            )));
        }
        let history = inputs.pop().unwrap_or_default();
        let span = history.len().saturating_sub(1) as u64;
        let first = self.k.checked_sub(span).ok_or_else(|| {
            TaskError::msg(format!(
                "a history of {span} iterations ending at {}",
                self.k
            ))
        })?;
        let done = history
            .iter()
            .position(|&rho| kernel::converged(rho, self.cfg.threshold));
        let (iterations, rho, converged) = match done {
            Some(j) => (first + j as u64, history[j], true),
            None if self.k >= self.cfg.max_iter => {
                (self.k, history.last().copied().unwrap_or(f64::NAN), false)
            }
            None => {
                let prob = self.cfg.load()?;
                let part = self.cfg.part(&prob);
                let ps = inputs.split_off(2 * blocks);
                let rs = inputs.split_off(blocks);
                let mut state = State {
                    xs: vec![],
                    rs: vec![],
                    ps: vec![],
                    rho: ctx
                        .spawn(
                            Const {
                                value: history.last().copied().unwrap_or(f64::NAN),
                            },
                            (),
                        )
                        .0,
                };
                for (b, ((x, r), p)) in inputs.into_iter().zip(rs).zip(ps).enumerate() {
                    let n = part.range(b).len();
                    for (what, v) in [("x", &x), ("r", &r), ("p", &p)] {
                        check_len(what, b as u32, v.len(), n)?;
                    }
                    let (xh, rh, ph) = ctx.spawn(Seed { x, r, p }, ());
                    state.xs.push(xh);
                    state.rs.push(rh);
                    state.ps.push(ph);
                }
                spawn_batch(ctx, &self.cfg, &prob, self.k, state, out);
                return Ok(());
            }
        };
        inputs.truncate(blocks);
        let x: Vec<f64> = inputs.concat();
        ctx.write(
            out,
            Solution {
                x,
                iterations,
                rho,
                converged,
            },
        );
        Ok(())
    }
}

/// Re-injects a block's state at a batch boundary (rule 3): its arguments are its outputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Seed {
    /// x of the block.
    pub x: Vec<f64>,
    /// r of the block.
    pub r: Vec<f64>,
    /// p of the block.
    pub p: Vec<f64>,
}

impl Task for Seed {
    const NAME: &'static str = "cg.seed";
    type Inputs = ();
    type Outputs = (Vec<f64>, Vec<f64>, Vec<f64>);

    fn run(self, ctx: &mut Ctx<'_>, (): (), (x, r, p): Writes<Self>) -> TaskResult {
        ctx.write(x, self.x);
        ctx.write(r, self.r);
        ctx.write(p, self.p);
        Ok(())
    }
}

/// Re-injects a scalar at a batch boundary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Const {
    /// The value.
    pub value: f64,
}

impl Task for Const {
    const NAME: &'static str = "cg.const";
    type Inputs = ();
    type Outputs = (f64,);

    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, self.value);
        Ok(())
    }
}

/// Registers every task of the data-flow mode.
pub fn register(r: &mut veriflow::Registry) -> Result<(), veriflow::RegistryError> {
    r.register::<Init>()?;
    r.register::<Sum>()?;
    r.register::<Spmv>()?;
    r.register::<Update>()?;
    r.register::<Direction>()?;
    r.register::<History>()?;
    r.register::<Step>()?;
    r.register::<Seed>()?;
    r.register::<Const>()
}

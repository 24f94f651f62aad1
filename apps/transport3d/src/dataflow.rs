//! Dataflow mode: the outer iteration as tasks of the data-flow runtime (paper 001), so a run
//! is logged, recoverable and certifiable.
//!
//! # Rules
//!
//! 1. **Tasks.** [`Start`] (the root) makes the blocks at t = 0 and spawns the first round.
//!    A round is one outer iteration of one time step: a [`BlockTask`] per block, which runs
//!    [`Block::outer_iteration`] on the state (iterate, halos, `c^n`) it was given and writes the
//!    new state with its residual, and one [`Check`] that reads every new state.
//! 2. **Check.** If every residual is below `tol` the step has converged: the check advances
//!    every block ([`Block::advance`]) and spawns the first round of the next step, or, at
//!    `t_end`, writes the [`Outcome`]. Otherwise it spawns the next round of the same step, or
//!    fails after `max_outer` rounds. Before spawning it copies each block's boundary planes into
//!    its neighbours' halos, so a block task iterates with its neighbours' states of the
//!    previous round (block Jacobi).
//! 3. **Why the check reads the states, not only the residuals.** A task can hand a child only
//!    the data its parent spawned (the runtime's `Read` handles are not arguments), and the check
//!    that decides the next round did not spawn the block tasks of this one. So the check reads
//!    the states and passes them on as the next block tasks' arguments: every round logs each
//!    state twice (as a block task's argument and as its output).
//! 4. **Output.** The root's single output is the [`Outcome`]: the final block states, the
//!    number of steps and rounds, and the largest true residual ([`Problem::global_residual`])
//!    seen when a step was declared converged. `check` reports a digest, samples and the masses.
//! 5. Every task is deterministic (same arguments and inputs, same bits): recovery may re-run
//!    any of them and the certifier re-runs drawn ones.

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::json;
use veriflow::{
    Ctx, InvalidArgs, Iterative, Program, Registry, RegistryError, Task, TaskError, TaskResult,
    Write, Writes, WrongResult,
};

use crate::block::{Block, BlockState};
use crate::grid::{Params, Problem};
use crate::iterative::RunMode;
use crate::model::{Manufactured, Model, Puff};
use crate::solution::Solution;

/// The models on the command line (`--model`), with their default parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum ModelName {
    /// Issue 7's diurnal kinetics in 3D.
    Diurnal,
    /// The same with no y-variation (cvDiurnal_kry's 2D problem for any ny).
    DiurnalFlatY,
    /// Pure transport with zero-flux walls.
    Transport,
    /// A Gaussian puff with decay.
    Puff,
    /// A steady manufactured solution.
    Manufactured,
}

impl ModelName {
    /// The model with its default parameters.
    pub fn model(self) -> Model {
        match self {
            ModelName::Diurnal => Model::Diurnal,
            ModelName::DiurnalFlatY => Model::DiurnalFlatY,
            ModelName::Transport => Model::Transport,
            ModelName::Puff => Model::Puff(Puff::default()),
            ModelName::Manufactured => Model::Manufactured(Manufactured::default()),
        }
    }
}

/// The transport3d program and its command-line parameters.
#[derive(Args, Clone, Debug, Serialize, Deserialize)]
pub struct Transport3d {
    /// How the run computes: `dataflow` (every step, outer iteration and block a task: logged,
    /// recoverable, certifiable), or iterative mode (paper 000), `async` (vnodes never wait) or
    /// `sync` (every iteration waits for fresh halos) with --kill-random K --kill-every MS,
    /// --loss P, --seed S and --store SPEC for the data backups.
    #[arg(long, value_enum, default_value_t = RunMode::Dataflow)]
    #[serde(default)]
    pub mode: RunMode,
    /// Mesh nodes in x (>= 3).
    #[arg(long, default_value_t = 16)]
    pub nx: usize,
    /// Mesh nodes in y (1 = no y-direction, or >= 3).
    #[arg(long, default_value_t = 16)]
    pub ny: usize,
    /// Mesh nodes in z (>= 3, and >= --blocks).
    #[arg(long, default_value_t = 16)]
    pub nz: usize,
    /// Time step (s).
    #[arg(long, default_value_t = 60.0)]
    pub dt: f64,
    /// End time (s).
    #[arg(long, default_value_t = 600.0)]
    pub t_end: f64,
    /// Number of z slabs.
    #[arg(long, default_value_t = 4)]
    pub blocks: usize,
    /// The equations.
    #[arg(long, value_enum, default_value_t = ModelName::Diurnal)]
    pub model: ModelName,
    /// Outer tolerance (scaled max-norm change of a block over an outer iteration).
    #[arg(long, default_value_t = 1e-6)]
    pub tol: f64,
    /// Inner tolerance of a block's Gauss-Seidel-Newton sweeps [default: tol / 10].
    #[arg(long)]
    pub inner_tol: Option<f64>,
    /// Most sweep pairs per outer iteration.
    #[arg(long, default_value_t = 500)]
    pub max_sweeps: u32,
    /// Most outer iterations per time step.
    #[arg(long, default_value_t = 1000)]
    pub max_outer: u32,
    /// Iterative mode: outer iterations between a vnode's data backups on a neighbour (or
    /// `--store`).
    #[arg(long, default_value_t = crate::iterative::BACKUP_EVERY,
          value_parser = clap::value_parser!(u64).range(1..))]
    #[serde(default = "default_backup_every")]
    pub backup_every: u64,
}

fn default_backup_every() -> u64 {
    crate::iterative::BACKUP_EVERY
}

impl Transport3d {
    /// The parameters these options describe.
    pub fn params(&self) -> Params {
        Params {
            nx: self.nx,
            ny: self.ny,
            nz: self.nz,
            dt: self.dt,
            t_end: self.t_end,
            blocks: self.blocks,
            model: self.model.model(),
            tol: self.tol,
            inner_tol: self.inner_tol.unwrap_or(self.tol / 10.0),
            max_sweeps: self.max_sweeps,
            max_outer: self.max_outer,
        }
    }
}

/// The result of a dataflow run (rule 4).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Time steps done.
    pub steps: u64,
    /// Final time.
    pub time: f64,
    /// Outer iterations (rounds) over all steps.
    pub rounds: u64,
    /// Largest true global residual when a step was declared converged.
    pub worst_global_residual: f64,
    /// The final block states.
    pub blocks: Vec<BlockState>,
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Outcome {{ steps: {}, time: {}, rounds: {}, worst_global_residual: {:e}, {} blocks }}",
            self.steps,
            self.time,
            self.rounds,
            self.worst_global_residual,
            self.blocks.len()
        )
    }
}

impl Outcome {
    /// The final concentrations.
    pub fn solution(&self, problem: &Problem) -> Result<Solution, TaskError> {
        let blocks = states_to_blocks(problem, self.blocks.clone())?;
        Ok(problem.assemble_accepted(&blocks)?)
    }
}

fn states_to_blocks(problem: &Problem, states: Vec<BlockState>) -> Result<Vec<Block>, TaskError> {
    states
        .into_iter()
        .map(|s| problem.block_from_state(s).map_err(TaskError::from))
        .collect()
}

/// Spawns one round (rule 1) on `blocks`, after the halo exchange of rule 2.
fn spawn_round(
    ctx: &mut Ctx<'_>,
    params: &Params,
    mut blocks: Vec<Block>,
    round: Check,
    out: Write<Outcome>,
) {
    Problem::exchange_halos(&mut blocks);
    let mut reads = Vec::with_capacity(blocks.len());
    for b in &blocks {
        let task = BlockTask {
            params: params.clone(),
            state: b.state(),
        };
        let (r,) = ctx.spawn(task, ());
        reads.push(r);
    }
    ctx.spawn_delegate(round, reads, (out,));
}

/// The root: the blocks at t = 0 and the first round.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Start {
    /// The run's parameters.
    pub params: Params,
}

impl Task for Start {
    const NAME: &'static str = "transport3d.start";
    type Inputs = ();
    type Outputs = (Outcome,);

    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        let problem = Problem::new(self.params.clone())?;
        let check = Check {
            params: self.params.clone(),
            round: 0,
            rounds: 0,
            worst_global_residual: 0.0,
        };
        spawn_round(ctx, &self.params, problem.blocks(), check, out);
        Ok(())
    }
}

/// One block's outer iteration (rule 1).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BlockTask {
    /// The run's parameters.
    pub params: Params,
    /// The block's state with its halos.
    pub state: BlockState,
}

impl Task for BlockTask {
    const NAME: &'static str = "transport3d.block";
    type Inputs = ();
    type Outputs = (BlockState,);

    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        let problem = Problem::new(self.params)?;
        let mut block = problem.block_from_state(self.state)?;
        block.outer_iteration();
        ctx.write(out, block.state());
        Ok(())
    }
}

/// The convergence check of one round (rule 2).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Check {
    /// The run's parameters.
    pub params: Params,
    /// Round within the current step (0 = first).
    pub round: u32,
    /// Rounds done before this one, over all steps.
    pub rounds: u64,
    /// Largest true residual at the steps converged so far.
    pub worst_global_residual: f64,
}

impl Task for Check {
    const NAME: &'static str = "transport3d.check";
    type Inputs = Vec<BlockState>;
    type Outputs = (Outcome,);

    fn run(self, ctx: &mut Ctx<'_>, states: Vec<BlockState>, (out,): Writes<Self>) -> TaskResult {
        let problem = Problem::new(self.params.clone())?;
        let mut blocks = states_to_blocks(&problem, states)?;
        let residual = blocks.iter().map(Block::residual).fold(0.0, f64::max);
        let rounds = self.rounds + 1;
        if residual < self.params.tol {
            let global = problem.global_residual(&blocks)?;
            let worst = self.worst_global_residual.max(global);
            let mut more = false;
            for b in &mut blocks {
                more = b.advance();
            }
            if !more {
                let outcome = Outcome {
                    steps: blocks[0].step(),
                    time: blocks[0].time(),
                    rounds,
                    worst_global_residual: worst,
                    blocks: blocks.iter().map(Block::state).collect(),
                };
                ctx.write(out, outcome);
                return Ok(());
            }
            let next = Check {
                round: 0,
                rounds,
                worst_global_residual: worst,
                ..self
            };
            spawn_round(ctx, &next.params.clone(), blocks, next, out);
            return Ok(());
        }
        if self.round + 1 >= self.params.max_outer {
            return Err(TaskError::msg(format!(
                "step {}: no convergence in {} outer iterations (residual {residual:e} >= tol {:e})",
                blocks[0].step() + 1,
                self.round + 1,
                self.params.tol
            )));
        }
        let next = Check {
            round: self.round + 1,
            rounds,
            ..self
        };
        spawn_round(ctx, &next.params.clone(), blocks, next, out);
        Ok(())
    }
}

impl Program for Transport3d {
    const NAME: &'static str = "transport3d";
    const ABOUT: &'static str = env!("CARGO_PKG_DESCRIPTION");
    const ITERATIVE: bool = true;
    type Root = Start;

    fn register(registry: &mut Registry) -> Result<(), RegistryError> {
        registry.register::<Start>()?;
        registry.register::<BlockTask>()?;
        registry.register::<Check>()
    }

    fn validate(&self) -> Result<(), InvalidArgs> {
        Problem::new(self.params())
            .map(|_| ())
            .map_err(|e| InvalidArgs(e.to_string()))
    }

    fn iterative(&self) -> Option<Iterative> {
        let mode = self.mode.iterative()?;
        // validate() runs first and refuses what Problem::new refuses; were it skipped, the
        // check of a run that cannot start says why.
        let mut it = crate::iterative::iterative(&self.params(), mode);
        if let Ok(it) = &mut it {
            it.config.backup_every = self.backup_every;
        }
        Some(it.unwrap_or_else(|e| {
            let msg = e.to_string();
            Iterative {
                config: veriflow::runtime::iterative::IterConfig::new(mode, Vec::new(), 1.0),
                factory: std::sync::Arc::new(move |_| {
                    Err(veriflow::runtime::iterative::BlockError(msg.clone()))
                }),
                check: std::sync::Arc::new(|_| {
                    Err(WrongResult {
                        expected: "valid parameters".into(),
                        got: "none".into(),
                    })
                }),
            }
        }))
    }

    fn root(&self) -> (Start, ()) {
        (
            Start {
                params: self.params(),
            },
            (),
        )
    }

    fn check(&self, (outcome,): &(Outcome,)) -> Result<serde_json::Value, WrongResult> {
        let wrong = |expected: String, got: String| Err(WrongResult { expected, got });
        let problem = match Problem::new(self.params()) {
            Ok(p) => p,
            Err(e) => return wrong("valid parameters".into(), e.to_string()),
        };
        if outcome.steps != problem.steps() {
            return wrong(
                format!("{} steps", problem.steps()),
                format!("{}", outcome.steps),
            );
        }
        let s = match outcome.solution(&problem) {
            Ok(s) => s,
            Err(e) => return wrong("the final block states".into(), e.to_string()),
        };
        if let Some(bad) = s.c.iter().find(|v| !v.is_finite()) {
            return wrong("finite concentrations".into(), bad.to_string());
        }
        // The true global residual of every accepted step, as iterative mode checks it (it was
        // reported and never compared with anything).
        let bound = crate::iterative::residual_bound(&problem);
        // NaN is never within a bound.
        if outcome.worst_global_residual.is_nan() || outcome.worst_global_residual > bound {
            return wrong(
                format!("a true global residual <= {bound:e} at every step"),
                format!("{:e} (false convergence)", outcome.worst_global_residual),
            );
        }
        let p = problem.params();
        let corners = [
            (0, 0, 0),
            (p.nx / 2, p.ny / 2, p.nz / 2),
            (p.nx - 1, p.ny - 1, p.nz - 1),
        ];
        let samples: Vec<_> = corners
            .iter()
            .map(|&(i, j, k)| json!({"at": [i, j, k], "c": s.at(i, j, k)}))
            .collect();
        Ok(json!({
            "steps": outcome.steps,
            "time": outcome.time,
            "rounds": outcome.rounds,
            "worst_global_residual": outcome.worst_global_residual,
            "digest": s.digest(),
            "mass": s.mass(&problem),
            "samples": samples,
        }))
    }
}

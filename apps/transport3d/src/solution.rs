//! Whole-mesh results: assembling blocks, the true residual of the coupled system, the
//! sequential reference and a synchronous block-Jacobi driver.

use serde::{Deserialize, Serialize};

use crate::block::{Block, Side};
use crate::grid::{Params, Problem};

/// The concentrations on the whole mesh at one time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Solution {
    /// Nodes in x.
    pub nx: usize,
    /// Nodes in y.
    pub ny: usize,
    /// Nodes in z.
    pub nz: usize,
    /// Completed steps.
    pub step: u64,
    /// Time.
    pub time: f64,
    /// Values, species interleaved: index `2 ((k ny + j) nx + i) + s`.
    pub c: Vec<f64>,
}

/// Blocks that do not make one problem's state.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AssembleError {
    /// Not one block per slab, in order.
    #[error("expected blocks 0..{want} in order, got {got:?}")]
    Blocks {
        /// Block count of the problem.
        want: usize,
        /// Indices given.
        got: Vec<usize>,
    },
    /// The blocks are at different steps.
    #[error("blocks at different steps: {0:?}")]
    Steps(Vec<u64>),
}

/// A block-Jacobi run that did not converge.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("step {step}: no convergence in {iterations} outer iterations (residual {residual:e})")]
pub struct NoConvergence {
    /// The step being solved.
    pub step: u64,
    /// Outer iterations done.
    pub iterations: u32,
    /// Last largest outer residual.
    pub residual: f64,
}

/// What a synchronous block-Jacobi run did.
#[derive(Clone, Debug, PartialEq)]
pub struct JacobiRun {
    /// The final state.
    pub solution: Solution,
    /// Outer iterations per step.
    pub iterations: Vec<u32>,
    /// Largest true residual ([`Problem::global_residual`]) seen when a step was declared
    /// converged.
    pub worst_global_residual: f64,
}

impl Solution {
    /// Both species at node (i, j, k).
    pub fn at(&self, i: usize, j: usize, k: usize) -> [f64; 2] {
        let o = 2 * ((k * self.ny + j) * self.nx + i);
        [self.c[o], self.c[o + 1]]
    }

    /// The largest scaled difference `|a - b| / (|b| + floor_s)` from `reference`.
    pub fn max_scaled_diff(&self, reference: &Solution, floor: [f64; 2]) -> f64 {
        self.c
            .iter()
            .zip(&reference.c)
            .enumerate()
            .map(|(n, (a, b))| (a - b).abs() / (b.abs() + floor[n & 1]))
            .fold(0.0, f64::max)
    }

    /// The largest absolute difference per species.
    pub fn max_abs_diff(&self, other: &Solution) -> [f64; 2] {
        let mut m = [0.0f64; 2];
        for (n, (a, b)) in self.c.iter().zip(&other.c).enumerate() {
            m[n & 1] = m[n & 1].max((a - b).abs());
        }
        m
    }

    /// The mass of each species: the sum of nodal values with trapezoid weights (½ per wall a
    /// node lies on), times the cell volume; conserved exactly by the zero-flux transport
    /// (`grid.rs` rule 4).
    pub fn mass(&self, problem: &Problem) -> [f64; 2] {
        let (dx, dy, dz) = problem.spacing();
        let w = |i: usize, n: usize| {
            if n > 1 && (i == 0 || i == n - 1) {
                0.5
            } else {
                1.0
            }
        };
        let mut m = [0.0; 2];
        for k in 0..self.nz {
            for j in 0..self.ny {
                for i in 0..self.nx {
                    let wt = w(i, self.nx) * w(j, self.ny) * w(k, self.nz);
                    let c = self.at(i, j, k);
                    m[0] += wt * c[0];
                    m[1] += wt * c[1];
                }
            }
        }
        let vol = dx * if self.ny > 1 { dy } else { 1.0 } * dz;
        m.map(|x| x * vol)
    }

    /// A digest of the values (blake3 of their little-endian bytes), hex.
    pub fn digest(&self) -> String {
        let mut h = blake3::Hasher::new();
        for v in &self.c {
            h.update(&v.to_le_bytes());
        }
        h.finalize().to_hex().to_string()
    }

    /// The largest absolute difference per species from the model's exact solution at this
    /// time, if it has one.
    pub fn error_vs_exact(&self, problem: &Problem) -> Option<[f64; 2]> {
        let inner = &problem.inner;
        let mut worst = [0.0f64; 2];
        for k in 0..self.nz {
            for j in 0..self.ny {
                for i in 0..self.nx {
                    let (x, y, z) = inner.coords(i, j, k);
                    let e = inner
                        .params
                        .model
                        .exact(x, y, z, self.time, inner.has_y())?;
                    let c = self.at(i, j, k);
                    for s in 0..2 {
                        worst[s] = worst[s].max((c[s] - e[s]).abs());
                    }
                }
            }
        }
        Some(worst)
    }

    /// The largest absolute value per species.
    pub fn peak(&self) -> [f64; 2] {
        let mut m = [0.0f64; 2];
        for (n, v) in self.c.iter().enumerate() {
            m[n & 1] = m[n & 1].max(v.abs());
        }
        m
    }
}

impl Problem {
    fn check_blocks(&self, blocks: &[Block]) -> Result<(), AssembleError> {
        let want = self.params().blocks;
        if blocks.len() != want || blocks.iter().enumerate().any(|(b, x)| x.index() != b) {
            return Err(AssembleError::Blocks {
                want,
                got: blocks.iter().map(Block::index).collect(),
            });
        }
        if blocks.iter().any(|b| b.step() != blocks[0].step()) {
            return Err(AssembleError::Steps(
                blocks.iter().map(Block::step).collect(),
            ));
        }
        Ok(())
    }

    /// The blocks' current iterates as one solution, labelled with the step and time the
    /// iterate approximates (`step + 1`, unless the run is finished).
    pub fn assemble(&self, blocks: &[Block]) -> Result<Solution, AssembleError> {
        self.check_blocks(blocks)?;
        let p = self.params();
        let mut c = Vec::with_capacity(2 * p.nx * p.ny * p.nz);
        for b in blocks {
            c.extend_from_slice(b.values());
        }
        let step = blocks[0].step();
        let step = if blocks[0].finished() { step } else { step + 1 };
        Ok(Solution {
            nx: p.nx,
            ny: p.ny,
            nz: p.nz,
            step,
            time: self.time_at(step),
            c,
        })
    }

    /// The blocks' accepted states (at `time()`) as one solution.
    pub fn assemble_accepted(&self, blocks: &[Block]) -> Result<Solution, AssembleError> {
        self.check_blocks(blocks)?;
        let p = self.params();
        let mut c = Vec::with_capacity(2 * p.nx * p.ny * p.nz);
        for b in blocks {
            c.extend_from_slice(b.accepted());
        }
        Ok(Solution {
            nx: p.nx,
            ny: p.ny,
            nz: p.nz,
            step: blocks[0].step(),
            time: blocks[0].time(),
            c,
        })
    }

    /// The true residual of the coupled implicit system of the current step at the blocks'
    /// iterates: the scaled max-norm of `F` (`grid.rs` rules 5 and 7) with every halo taken
    /// from the neighbour block itself, not from what the block last received.
    pub fn global_residual(&self, blocks: &[Block]) -> Result<f64, AssembleError> {
        self.check_blocks(blocks)?;
        if blocks[0].finished() {
            return Ok(0.0);
        }
        let mut worst: f64 = 0.0;
        for (b, block) in blocks.iter().enumerate() {
            let lower = b.checked_sub(1).map(|n| blocks[n].halo_slice(Side::Upper));
            let upper = blocks.get(b + 1).map(|n| n.halo_slice(Side::Lower));
            worst = worst.max(block.residual_with(lower, upper));
        }
        Ok(worst)
    }

    /// Copies every block's boundary planes into its neighbours' halos.
    pub fn exchange_halos(blocks: &mut [Block]) {
        for b in 0..blocks.len() {
            if b + 1 < blocks.len() {
                let up = blocks[b].halo(Side::Upper);
                let low = blocks[b + 1].halo(Side::Lower);
                // Lengths come from the same problem: these cannot fail.
                let _ = blocks[b + 1].set_halo(Side::Lower, &up);
                let _ = blocks[b].set_halo(Side::Upper, &low);
            }
        }
    }

    /// Synchronous block-Jacobi to t_end: every outer iteration all blocks iterate with the
    /// halos of the previous one; a step ends when every outer residual is below `tol`.
    pub fn solve_jacobi(&self) -> Result<JacobiRun, NoConvergence> {
        let mut blocks = self.blocks();
        let mut iterations = Vec::new();
        let mut worst_global: f64 = 0.0;
        let max_outer = self.params().max_outer;
        let tol = self.params().tol;
        while !blocks[0].finished() {
            let mut it = 0;
            loop {
                let r = blocks
                    .iter_mut()
                    .map(Block::outer_iteration)
                    .fold(0.0, f64::max);
                it += 1;
                Problem::exchange_halos(&mut blocks);
                if r < tol {
                    break;
                }
                if it >= max_outer {
                    return Err(NoConvergence {
                        step: blocks[0].step(),
                        iterations: it,
                        residual: r,
                    });
                }
            }
            worst_global = worst_global.max(self.global_residual(&blocks).unwrap_or(f64::NAN));
            iterations.push(it);
            for b in &mut blocks {
                b.advance();
            }
        }
        let solution = self
            .assemble_accepted(&blocks)
            .expect("the blocks come from this problem");
        Ok(JacobiRun {
            solution,
            iterations,
            worst_global_residual: worst_global,
        })
    }

    /// The reference: the same problem as one block, each step solved to `inner_tol`.
    pub fn solve_sequential(&self) -> Result<Solution, NoConvergence> {
        let params = Params {
            blocks: 1,
            ..self.params().clone()
        };
        let one = Problem::new(params).expect("one block is always valid when B blocks are");
        Ok(one.solve_jacobi()?.solution)
    }
}

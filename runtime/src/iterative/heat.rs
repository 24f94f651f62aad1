//! The smallest [`Block`]: the implicit heat equation u_t = u_xx on (0, 1) with zero
//! Dirichlet boundaries, one implicit-Euler step per step of the run, the unknowns split into
//! contiguous blocks of a chain of vnodes. Each block solves its tridiagonal system exactly with
//! the halos held fixed (block Jacobi), so the iterations converge to the global implicit-Euler
//! solution, which [`reference`] computes by a direct solve. Tests and the facade's examples use
//! it; read it as a template for a block of your own.

use serde::{Deserialize, Serialize};

use super::{Block, BlockError, BlockFactory};
use crate::ids::VnodeId;

/// One block of the heat equation (its whole state is serializable: [`Block::save`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heat {
    /// First global index of the block.
    pub start: usize,
    /// The current iterate.
    pub u: Vec<f64>,
    /// The previous step's solution (the right-hand side).
    pub prev: Vec<f64>,
    left: f64,
    right: f64,
    r: f64,
    step: u64,
    steps: u64,
    /// The iterate accepted at the end of each step (to check every detection).
    pub accepted: Vec<Vec<f64>>,
    has_left: bool,
    has_right: bool,
}

/// The initial condition at the n interior points: sin(pi x) + sin(3 pi x) / 2.
pub fn initial(n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let x = (i + 1) as f64 / (n + 1) as f64;
            (std::f64::consts::PI * x).sin() + 0.5 * (3.0 * std::f64::consts::PI * x).sin()
        })
        .collect()
}

fn ranges(n: usize, blocks: usize) -> Vec<(usize, usize)> {
    (0..blocks)
        .map(|b| (b * n / blocks, (b + 1) * n / blocks))
        .collect()
}

/// Solves (1 + 2r) u_i - r u_{i-1} - r u_{i+1} = rhs_i with u_{-1} = left, u_n = right.
pub fn thomas(r: f64, rhs: &[f64], left: f64, right: f64) -> Vec<f64> {
    let n = rhs.len();
    let (a, b) = (-r, 1.0 + 2.0 * r);
    let mut c = vec![0.0; n];
    let mut d = vec![0.0; n];
    for i in 0..n {
        let mut rhs_i = rhs[i];
        if i == 0 {
            rhs_i -= a * left;
        }
        if i == n - 1 {
            rhs_i -= a * right;
        }
        let m = if i == 0 { b } else { b - a * c[i - 1] };
        c[i] = a / m;
        d[i] = if i == 0 {
            rhs_i / m
        } else {
            (rhs_i - a * d[i - 1]) / m
        };
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        x[i] = if i == n - 1 {
            d[i]
        } else {
            d[i] - c[i] * x[i + 1]
        };
    }
    x
}

impl Block for Heat {
    fn halo_for(&self, _to: VnodeId) -> Vec<u8> {
        // Both ends and where the block starts: the receiver picks the end that faces it.
        let v = [self.u[0], self.u[self.u.len() - 1], self.start as f64];
        postcard::to_stdvec(&v).expect("three floats encode")
    }
    fn set_halo(&mut self, _from: VnodeId, halo: &[u8]) -> Result<(), BlockError> {
        let [first, last, start]: [f64; 3] =
            postcard::from_bytes(halo).map_err(|e| BlockError(format!("bad halo: {e}")))?;
        if (start as usize) < self.start {
            self.left = last;
        } else {
            self.right = first;
        }
        Ok(())
    }
    fn iterate(&mut self) -> f64 {
        let left = if self.has_left { self.left } else { 0.0 };
        let right = if self.has_right { self.right } else { 0.0 };
        let new = thomas(self.r, &self.prev, left, right);
        let change = new
            .iter()
            .zip(&self.u)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        self.u = new;
        change
    }
    fn advance(&mut self) -> bool {
        self.accepted.push(self.u.clone());
        self.prev = self.u.clone();
        self.step += 1;
        self.step < self.steps
    }
    fn save(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a block encodes")
    }
    fn restore(&mut self, state: &[u8]) -> Result<(), BlockError> {
        *self = postcard::from_bytes(state).map_err(|e| BlockError(e.to_string()))?;
        Ok(())
    }
}

/// The blocks of `n` unknowns split over `blocks` vnodes (at least one unknown each), for
/// `steps` steps of ratio `r` = dt / dx^2.
pub fn factory(n: usize, blocks: usize, r: f64, steps: u64) -> BlockFactory {
    let u0 = initial(n);
    let rs = ranges(n, blocks);
    std::sync::Arc::new(move |v: VnodeId| {
        let &(a, b) = rs
            .get(v.0 as usize)
            .ok_or_else(|| BlockError(format!("{v}: there are {} blocks", rs.len())))?;
        if a == b {
            return Err(BlockError(format!("{v}: an empty block")));
        }
        Ok(Box::new(Heat {
            start: a,
            u: u0[a..b].to_vec(),
            prev: u0[a..b].to_vec(),
            left: 0.0,
            right: 0.0,
            r,
            step: 0,
            steps,
            accepted: Vec::new(),
            has_left: a > 0,
            has_right: b < n,
        }) as Box<dyn Block>)
    })
}

/// The implicit-Euler solution after each step, by direct solve.
pub fn reference(n: usize, r: f64, steps: u64) -> Vec<Vec<f64>> {
    let mut u = initial(n);
    let mut out = Vec::new();
    for _ in 0..steps {
        u = thomas(r, &u, 0.0, 0.0);
        out.push(u.clone());
    }
    out
}

/// Max-norm residual of the global system of one step: iterate `u`, previous solution `prev`.
pub fn global_residual(u: &[f64], prev: &[f64], r: f64) -> f64 {
    let n = u.len();
    (0..n)
        .map(|i| {
            let l = if i > 0 { u[i - 1] } else { 0.0 };
            let rr = if i + 1 < n { u[i + 1] } else { 0.0 };
            ((1.0 + 2.0 * r) * u[i] - r * l - r * rr - prev[i]).abs()
        })
        .fold(0.0, f64::max)
}

//! One z slab and its solver: the block API of the outer (block-Jacobi / multisplitting)
//! iteration.
//!
//! # Rules
//!
//! 1. **State.** A block holds the iterate `c` of its own planes plus one halo plane per side
//!    (a zero plane where the side is a wall), and `c^n`, its accepted state at `time()`, after
//!    `step()` completed steps. The iterate approximates the solution at `t_{step+1}`.
//! 2. **Halos.** `halo(side)` is the block's own boundary plane on that side (both species, x
//!    fastest, then species-interleaved: index `2 (j nx + i) + s`); the neighbour on that side
//!    installs it with `set_halo(opposite side, ..)`. A wrong length or a side without a
//!    neighbour is a [`HaloError`].
//! 3. **Outer iteration.** `outer_iteration()` solves the block's implicit-Euler system
//!    `F(c) = 0` (`grid.rs` rule 5) with the halo planes held fixed, by symmetric point-block
//!    line Gauss-Seidel-Newton sweeps (below) until one sweep pair changes the state by less than
//!    `inner_tol` or `max_sweeps` pairs ran. It returns the **outer residual**: the scaled
//!    max-norm (`grid.rs` rule 7) of the change of the block's state over this outer iteration.
//!    When every block's change is zero the halos are consistent and every block solves its
//!    part of the coupled system: the outer residual goes to zero exactly when the block-Jacobi
//!    iteration converges. (A non-finite change is reported as infinity.)
//! 4. **Advance.** `advance()` accepts the iterate as the state at `t_{step+1}` and starts the
//!    next step from it (the iterate is the initial guess); it returns `false`, and changes
//!    nothing, once `t_end` is reached.
//! 5. **Backups.** `save()` / `restore()` (postcard of [`BlockState`]) carry the whole state
//!    (iterate with halos, `c^n`, step, outer iterations and last residual); the rest (stencils,
//!    sources) is rebuilt from the [`Problem`].
//!
//! # The inner solver: x-line Gauss-Seidel-Newton
//!
//! The only nonlinearity is the reaction, which couples the two species of one point; the
//! transport is linear and couples the points. A sweep visits the x-lines (fixed y and z) in
//! order and replaces the 2 nx unknowns of a line by one Newton step on that line's equations
//! with the y and z neighbours at their latest values (a line variant of Ortega and
//! Rheinboldt's Gauss-Seidel-Newton method). The line system is block tridiagonal: 2x2
//! diagonal blocks `(1 - dt L_pp) I - dt dR/dc` (the stiff diurnal kinetics, q1 c3 = 6 s⁻¹,
//! are solved implicitly at each point) and scalar x couplings; the block Thomas algorithm
//! solves it exactly in O(nx), with pivots that only grow for centred advection (the product
//! of the two off-diagonals is negative when the cell Péclet number exceeds 2).
//!
//! Why lines in x: the centred advection lives in x and makes the point-block matrix lose
//! diagonal dominance once `dt V / dx` exceeds about 1 (at 64³, dt > 300 s), where point
//! Gauss-Seidel diverges; solved exactly along x, what is left between lines is the symmetric
//! y and z diffusion, for which Gauss-Seidel converges at any dt. Why not BiCGSTAB: it needs
//! two stencil applications, several vectors and global dot products per iteration, and
//! Newton's linear systems here are well conditioned once x is solved directly.
//! Its fixed point is the implicit-Euler solution; near it the iteration is line Gauss-Seidel
//! on the Newton system, so it is Newton with the linear solves folded into the sweeps: no
//! Jacobian or correction vector is stored, a sweep is one pass over the state with constant
//! stencil coefficients (per axis index) and a 6 nx scratch line allocated with the block;
//! nothing is allocated per iteration. Forward-then-backward sweeps make it symmetric.

use serde::{Deserialize, Serialize};

use crate::grid::{Inner, Problem};
use crate::model::{diurnal, diurnal_rates, Reaction};

/// A side of a slab: towards lower or higher z.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Side {
    /// Towards z = 30 (the block before).
    Lower,
    /// Towards z = 50 (the block after).
    Upper,
}

impl Side {
    /// The other side.
    pub fn opposite(self) -> Side {
        match self {
            Side::Lower => Side::Upper,
            Side::Upper => Side::Lower,
        }
    }
}

/// A halo that cannot be installed (rule 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HaloError {
    /// The halo does not have one value per species and point of a plane.
    #[error("block {block}: a halo plane has {want} values, got {got}")]
    Length {
        /// The block.
        block: usize,
        /// Expected length.
        want: usize,
        /// Given length.
        got: usize,
    },
    /// That side is a wall.
    #[error("block {block} has no neighbour on its {side:?} side")]
    NoNeighbour {
        /// The block.
        block: usize,
        /// The side.
        side: Side,
    },
}

/// A saved block state that does not fit the problem (rule 5).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BlockError {
    /// Undecodable bytes.
    #[error("block state does not decode: {0}")]
    Decode(String),
    /// The state belongs to another block or another mesh.
    #[error(
        "block state of block {index} (step {step}, {len} values) does not fit this problem: {why}"
    )]
    Mismatch {
        /// Block index in the state.
        index: usize,
        /// Step in the state.
        step: u64,
        /// Iterate length in the state.
        len: usize,
        /// What does not fit.
        why: &'static str,
    },
}

/// The serializable state of a block (rule 5).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockState {
    /// Block index.
    pub index: u32,
    /// Completed time steps.
    pub step: u64,
    /// Outer iterations done in the current step.
    pub iterations: u64,
    /// Residual of the last outer iteration (infinity before the first).
    pub residual: f64,
    /// The iterate with its halo planes.
    pub c: Vec<f64>,
    /// The accepted state `c^n` (own planes).
    pub old: Vec<f64>,
}

impl std::fmt::Debug for BlockState {
    /// A summary: the values would fill pages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BlockState {{ index: {}, step: {}, iterations: {}, residual: {:e}, {} values }}",
            self.index,
            self.step,
            self.iterations,
            self.residual,
            self.c.len()
        )
    }
}

/// One z slab of the problem (module rules).
#[derive(Clone, Debug)]
pub struct Block {
    problem: Problem,
    index: usize,
    /// First global z plane.
    k0: usize,
    /// Own planes.
    nzl: usize,
    step: u64,
    iterations: u64,
    residual: f64,
    /// (nzl + 2) planes: halo, own..., halo.
    c: Vec<f64>,
    /// c^n, nzl planes.
    old: Vec<f64>,
    /// Scratch: the iterate at the start of an outer iteration.
    prev: Vec<f64>,
    /// dt S(t_{n+1}) on own planes (manufactured model only; empty otherwise).
    src: Vec<f64>,
    /// Scratch of the line solver (6 nx values).
    line: Vec<f64>,
}

impl Problem {
    /// Block `b` at t = 0 (its halo planes hold the neighbours' initial planes). Panics if
    /// `b >= blocks`, like slice indexing.
    pub fn block(&self, b: usize) -> Block {
        let mut block = self.zero_block(b);
        let inner = &self.inner;
        let (nx, ny, ps, nzl) = (
            inner.params.nx,
            inner.params.ny,
            inner.plane_len(),
            block.nzl,
        );
        let last = inner.params.blocks - 1;
        for p in 0..nzl + 2 {
            // Halo planes hold the neighbours' planes; at walls they stay zero.
            if (p == 0 && b == 0) || (p == nzl + 1 && b == last) {
                continue;
            }
            let k = block.k0 + p - 1;
            for j in 0..ny {
                for i in 0..nx {
                    let v = inner.initial(i, j, k);
                    let o = p * ps + 2 * (j * nx + i);
                    block.c[o] = v[0];
                    block.c[o + 1] = v[1];
                }
            }
        }
        block.old.copy_from_slice(&block.c[ps..(nzl + 1) * ps]);
        block.refresh_source();
        block
    }

    /// Block `b` with every value zero.
    fn zero_block(&self, b: usize) -> Block {
        assert!(
            b < self.params().blocks,
            "block {b} of {}",
            self.params().blocks
        );
        let planes = self.planes(b);
        let nzl = planes.len();
        let ps = self.inner.plane_len();
        Block {
            problem: self.clone(),
            index: b,
            k0: planes.start,
            nzl,
            step: 0,
            iterations: 0,
            residual: f64::INFINITY,
            c: vec![0.0; (nzl + 2) * ps],
            old: vec![0.0; nzl * ps],
            prev: vec![0.0; nzl * ps],
            src: Vec::new(),
            line: vec![0.0; 6 * self.params().nx],
        }
    }

    /// Every block at t = 0.
    pub fn blocks(&self) -> Vec<Block> {
        (0..self.params().blocks).map(|b| self.block(b)).collect()
    }

    /// Rebuilds a block from its state (rule 5).
    pub fn block_from_state(&self, state: BlockState) -> Result<Block, BlockError> {
        let index = state.index as usize;
        let bad = |why| {
            Err(BlockError::Mismatch {
                index,
                step: state.step,
                len: state.c.len(),
                why,
            })
        };
        if index >= self.params().blocks {
            return bad("no such block");
        }
        let mut block = self.zero_block(index);
        if state.c.len() != block.c.len() || state.old.len() != block.old.len() {
            return bad("wrong number of values");
        }
        if state.step > self.steps() {
            return bad("step beyond t_end");
        }
        block.step = state.step;
        block.iterations = state.iterations;
        block.residual = state.residual;
        block.c = state.c;
        block.old = state.old;
        block.refresh_source();
        Ok(block)
    }
}

/// The reaction at one point: R and dR/dc.
trait Kinetics: Copy {
    fn eval(self, c1: f64, c2: f64) -> ([f64; 2], [[f64; 2]; 2]);
}

#[derive(Clone, Copy)]
struct NoReaction;
impl Kinetics for NoReaction {
    #[inline(always)]
    fn eval(self, _: f64, _: f64) -> ([f64; 2], [[f64; 2]; 2]) {
        ([0.0; 2], [[0.0; 2]; 2])
    }
}

#[derive(Clone, Copy)]
struct Decay([f64; 2]);
impl Kinetics for Decay {
    #[inline(always)]
    fn eval(self, c1: f64, c2: f64) -> ([f64; 2], [[f64; 2]; 2]) {
        let [k1, k2] = self.0;
        ([-k1 * c1, -k2 * c2], [[-k1, 0.0], [0.0, -k2]])
    }
}

/// cvDiurnal's kinetics at a fixed time: q3 and q4 frozen.
#[derive(Clone, Copy)]
struct Diurnal {
    q3: f64,
    q4: f64,
}
impl Kinetics for Diurnal {
    #[inline(always)]
    fn eval(self, c1: f64, c2: f64) -> ([f64; 2], [[f64; 2]; 2]) {
        use diurnal::{C3, Q1, Q2};
        let qq1 = Q1 * C3 * c1;
        let qq2 = Q2 * c1 * c2;
        let qq3 = self.q3 * C3;
        let qq4 = self.q4 * c2;
        (
            [-qq1 - qq2 + 2.0 * qq3 + qq4, qq1 - qq2 - qq4],
            [
                [-Q1 * C3 - Q2 * c2, -Q2 * c1 + self.q4],
                [Q1 * C3 - Q2 * c2, -Q2 * c1 - self.q4],
            ],
        )
    }
}

/// Neighbour offsets and stencil coefficients of one point.
struct Point {
    /// Offsets of the x, y, z lower and upper neighbours (a wall points at the point itself,
    /// with a zero coefficient).
    off: [usize; 6],
    coef: [f64; 6],
    /// Transport diagonal L_pp.
    diag: f64,
}

impl Block {
    /// This block's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The problem this block belongs to.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }

    /// Global z planes `[first, end)` this block owns.
    pub fn planes(&self) -> std::ops::Range<usize> {
        self.k0..self.k0 + self.nzl
    }

    /// The neighbour on `side`, if that side is not a wall.
    pub fn neighbour(&self, side: Side) -> Option<usize> {
        match side {
            Side::Lower => self.index.checked_sub(1),
            Side::Upper => Some(self.index + 1).filter(|&b| b < self.problem.params().blocks),
        }
    }

    /// The (lower, upper) neighbours.
    pub fn neighbours(&self) -> [Option<usize>; 2] {
        [self.neighbour(Side::Lower), self.neighbour(Side::Upper)]
    }

    /// Length of a halo plane: 2 nx ny.
    pub fn halo_len(&self) -> usize {
        self.problem.inner.plane_len()
    }

    /// The plane the neighbour on `side` needs (rule 2).
    pub fn halo(&self, side: Side) -> Vec<f64> {
        self.halo_slice(side).to_vec()
    }

    /// [`Block::halo`] without a copy.
    pub fn halo_slice(&self, side: Side) -> &[f64] {
        let ps = self.halo_len();
        let p = match side {
            Side::Lower => 1,
            Side::Upper => self.nzl,
        };
        &self.c[p * ps..(p + 1) * ps]
    }

    /// Installs the plane received from the neighbour on `side` (rule 2).
    pub fn set_halo(&mut self, side: Side, plane: &[f64]) -> Result<(), HaloError> {
        let ps = self.halo_len();
        if self.neighbour(side).is_none() {
            return Err(HaloError::NoNeighbour {
                block: self.index,
                side,
            });
        }
        if plane.len() != ps {
            return Err(HaloError::Length {
                block: self.index,
                want: ps,
                got: plane.len(),
            });
        }
        let p = match side {
            Side::Lower => 0,
            Side::Upper => self.nzl + 1,
        };
        self.c[p * ps..(p + 1) * ps].copy_from_slice(plane);
        Ok(())
    }

    /// Completed time steps.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Time of the accepted state (after `step()` steps).
    pub fn time(&self) -> f64 {
        self.problem.time_at(self.step)
    }

    /// Whether `t_end` has been reached.
    pub fn finished(&self) -> bool {
        self.step >= self.problem.steps()
    }

    /// Outer iterations done in the current step.
    pub fn iterations(&self) -> u64 {
        self.iterations
    }

    /// Residual of the last outer iteration (infinity before the first of a step).
    pub fn residual(&self) -> f64 {
        self.residual
    }

    /// The iterate on the own planes (species interleaved, x fastest, then y, then z).
    pub fn values(&self) -> &[f64] {
        let ps = self.halo_len();
        &self.c[ps..(self.nzl + 1) * ps]
    }

    /// The accepted state `c^n` on the own planes.
    pub fn accepted(&self) -> &[f64] {
        &self.old
    }

    /// One outer iteration (rule 3); returns the outer residual.
    pub fn outer_iteration(&mut self) -> f64 {
        if self.finished() {
            return 0.0;
        }
        let ps = self.halo_len();
        let own = ps..(self.nzl + 1) * ps;
        self.prev.copy_from_slice(&self.c[own.clone()]);
        let inner = self.problem.inner.clone();
        let dt = inner.dt_of(self.step);
        let t1 = inner.time_at(self.step + 1);
        let tol = inner.params.inner_tol;
        for _ in 0..inner.params.max_sweeps {
            let change = match inner.params.model.reaction() {
                Reaction::None => self.sweep_pair(&inner, NoReaction, dt),
                Reaction::Decay(k) => self.sweep_pair(&inner, Decay(k), dt),
                Reaction::Diurnal => {
                    let (q3, q4) = diurnal_rates(t1);
                    self.sweep_pair(&inner, Diurnal { q3, q4 }, dt)
                }
            };
            if change < tol || !change.is_finite() {
                break;
            }
        }
        let floor = inner.floor;
        let mut worst: f64 = 0.0;
        for (n, (a, b)) in self.c[own].iter().zip(&self.prev).enumerate() {
            let d = (a - b).abs() / (a.abs() + floor[n & 1]);
            // NaN never compares greater: catch it explicitly.
            if d.is_nan() {
                worst = f64::INFINITY;
                break;
            }
            worst = worst.max(d);
        }
        self.iterations += 1;
        self.residual = worst;
        worst
    }

    /// Accepts the iterate (rule 4); `false` once t_end is reached.
    pub fn advance(&mut self) -> bool {
        if self.finished() {
            return false;
        }
        let ps = self.halo_len();
        self.old.copy_from_slice(&self.c[ps..(self.nzl + 1) * ps]);
        self.step += 1;
        self.iterations = 0;
        self.residual = f64::INFINITY;
        self.refresh_source();
        !self.finished()
    }

    /// The whole state (rule 5).
    pub fn state(&self) -> BlockState {
        BlockState {
            // Blocks <= nz <= MAX_AXIS.
            index: self.index as u32,
            step: self.step,
            iterations: self.iterations,
            residual: self.residual,
            c: self.c.clone(),
            old: self.old.clone(),
        }
    }

    /// The state as bytes (rule 5).
    pub fn save(&self) -> Vec<u8> {
        // Encoding plain numbers and vectors into a Vec cannot fail.
        postcard::to_stdvec(&self.state()).unwrap_or_default()
    }

    /// Replaces the state with one [`Block::save`] produced for the same block (rule 5).
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), BlockError> {
        let state: BlockState =
            postcard::from_bytes(bytes).map_err(|e| BlockError::Decode(e.to_string()))?;
        if state.index as usize != self.index {
            return Err(BlockError::Mismatch {
                index: state.index as usize,
                step: state.step,
                len: state.c.len(),
                why: "another block's state",
            });
        }
        *self = self.problem.block_from_state(state)?;
        Ok(())
    }

    /// The scaled max-norm of F (`grid.rs` rule 5) over the own points with the halo planes
    /// `lower` and `upper` in place of the stored ones (None: the stored one).
    pub(crate) fn residual_with(&self, lower: Option<&[f64]>, upper: Option<&[f64]>) -> f64 {
        let inner = self.problem.inner.clone();
        let ps = self.halo_len();
        let mut c = self.c.clone();
        if let Some(l) = lower {
            c[..ps].copy_from_slice(l);
        }
        if let Some(u) = upper {
            c[(self.nzl + 1) * ps..].copy_from_slice(u);
        }
        let dt = inner.dt_of(self.step);
        let t1 = inner.time_at(self.step + 1);
        match inner.params.model.reaction() {
            Reaction::None => self.residual_of(&inner, &c, NoReaction, dt),
            Reaction::Decay(k) => self.residual_of(&inner, &c, Decay(k), dt),
            Reaction::Diurnal => {
                let (q3, q4) = diurnal_rates(t1);
                self.residual_of(&inner, &c, Diurnal { q3, q4 }, dt)
            }
        }
    }

    /// For iterative mode's check (`iterative.rs` rule 4): the scaled max-norm of `F` over the
    /// own planes whose equations involve no halo plane, and, for each own plane that does
    /// (plane 1 with a lower neighbour, plane nzl with an upper one; one entry when they are the
    /// same plane), its index (1-based) and `F` there, unscaled, with both halo planes taken as
    /// zero. `F` is linear in a halo plane with the coefficient `-dt z.lo[k]` (lower) or
    /// `-dt z.up[k]` (upper), so the true `F` of such a plane follows from the neighbour's plane.
    pub(crate) fn residual_parts(&self) -> (f64, Vec<(usize, Vec<f64>)>) {
        let inner = self.problem.inner.clone();
        let ps = self.halo_len();
        let mut c = self.c.clone();
        c[..ps].fill(0.0);
        c[(self.nzl + 1) * ps..].fill(0.0);
        let [lower, upper] = self.neighbours().map(|n| n.is_some());
        let mut edges: Vec<usize> = Vec::new();
        if lower {
            edges.push(1);
        }
        if upper && !edges.contains(&self.nzl) {
            edges.push(self.nzl);
        }
        let dt = inner.dt_of(self.step);
        let t1 = inner.time_at(self.step + 1);
        let run = |kin: &dyn Fn(f64, f64) -> [f64; 2]| {
            let mut interior: f64 = 0.0;
            let mut planes = Vec::new();
            for p in 1..=self.nzl {
                let edge = edges.contains(&p);
                let mut f = Vec::with_capacity(if edge { ps } else { 0 });
                self.plane_f(&inner, &c, kin, dt, p, |v, cv, s| {
                    if edge {
                        f.push(v);
                    } else {
                        let x = v.abs() / (cv.abs() + inner.floor[s]);
                        interior = if x.is_nan() {
                            f64::INFINITY
                        } else {
                            interior.max(x)
                        };
                    }
                });
                if edge {
                    planes.push((p, f));
                }
            }
            (interior, planes)
        };
        match inner.params.model.reaction() {
            Reaction::None => run(&|a, b| NoReaction.eval(a, b).0),
            Reaction::Decay(k) => run(&|a, b| Decay(k).eval(a, b).0),
            Reaction::Diurnal => {
                let (q3, q4) = diurnal_rates(t1);
                run(&|a, b| Diurnal { q3, q4 }.eval(a, b).0)
            }
        }
    }

    /// `F` (unscaled) at every point and species of own plane `p` of `c`, in plane order: calls
    /// `out(F, c, species)`.
    fn plane_f(
        &self,
        inner: &Inner,
        c: &[f64],
        kin: &dyn Fn(f64, f64) -> [f64; 2],
        dt: f64,
        p: usize,
        mut out: impl FnMut(f64, f64, usize),
    ) {
        let (nx, ny) = (inner.params.nx, inner.params.ny);
        let (rs, ps) = (2 * nx, 2 * nx * ny);
        let has_src = !self.src.is_empty();
        let kg = self.k0 + p - 1;
        for j in 0..ny {
            for i in 0..nx {
                let pt = Self::point(inner, kg, j, i);
                let d = 1.0 - dt * pt.diag;
                let o = p * ps + j * rs + 2 * i;
                let q = o - ps;
                let r = kin(c[o], c[o + 1]);
                for s in 0..2 {
                    let rhs = self.old[q + s] + if has_src { self.src[q + s] } else { 0.0 };
                    let f = Self::linear_part(c, o + s, &pt, d, rhs, dt) - dt * r[s];
                    out(f, c[o + s], s);
                }
            }
        }
    }

    fn refresh_source(&mut self) {
        let inner = self.problem.inner.clone();
        if !inner.params.model.has_source() || self.finished() {
            self.src.clear();
            return;
        }
        let dt = inner.dt_of(self.step);
        let t1 = inner.time_at(self.step + 1);
        let (nx, ny) = (inner.params.nx, inner.params.ny);
        self.src.resize(self.nzl * inner.plane_len(), 0.0);
        let mut o = 0;
        for k in self.planes() {
            for j in 0..ny {
                for i in 0..nx {
                    let (x, y, z) = inner.coords(i, j, k);
                    let s = inner.params.model.source(x, y, z, t1, inner.has_y());
                    self.src[o] = dt * s[0];
                    self.src[o + 1] = dt * s[1];
                    o += 2;
                }
            }
        }
    }

    /// The stencil of own plane p (1..=nzl), row j, column i.
    #[inline(always)]
    fn point(inner: &Inner, kg: usize, j: usize, i: usize) -> Point {
        let (nx, ny) = (inner.params.nx, inner.params.ny);
        let (rs, ps) = (2 * nx, 2 * nx * ny);
        let (x, y, z) = (&inner.x, &inner.y, &inner.z);
        // Offsets are relative to the point; walls point back at the point (coefficient 0).
        Point {
            off: [
                if i > 0 { 2 } else { 0 },
                if i + 1 < nx { 2 } else { 0 },
                if j > 0 { rs } else { 0 },
                if j + 1 < ny { rs } else { 0 },
                ps,
                ps,
            ],
            coef: [x.lo[i], x.up[i], y.lo[j], y.up[j], z.lo[kg], z.up[kg]],
            diag: x.di[i] + y.di[j] + z.di[kg],
        }
    }

    /// `d c_s - c^n_s - dt (neighbours) - dt S_s` at index `o` of `c` (F without R).
    #[inline(always)]
    fn linear_part(c: &[f64], o: usize, pt: &Point, d: f64, rhs: f64, dt: f64) -> f64 {
        let nb = pt.coef[0] * c[o - pt.off[0]]
            + pt.coef[1] * c[o + pt.off[1]]
            + pt.coef[2] * c[o - pt.off[2]]
            + pt.coef[3] * c[o + pt.off[3]]
            + pt.coef[4] * c[o - pt.off[4]]
            + pt.coef[5] * c[o + pt.off[5]];
        d * c[o] - rhs - dt * nb
    }

    /// A forward then a backward Gauss-Seidel-Newton sweep; returns the largest scaled change.
    fn sweep_pair<K: Kinetics>(&mut self, inner: &Inner, kin: K, dt: f64) -> f64 {
        let a = self.sweep(inner, kin, dt, true);
        let b = self.sweep(inner, kin, dt, false);
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    }

    /// One Gauss-Seidel sweep over the x-lines, in order (`forward`) or reversed: each line is
    /// one Newton step on its 2 nx equations with the y and z neighbours at their latest values,
    /// solved exactly by the block Thomas algorithm (2x2 diagonal blocks, scalar off-diagonal
    /// x couplings). Returns the largest scaled change.
    fn sweep<K: Kinetics>(&mut self, inner: &Inner, kin: K, dt: f64, forward: bool) -> f64 {
        let (nx, ny) = (inner.params.nx, inner.params.ny);
        let (rs, ps) = (2 * nx, 2 * nx * ny);
        let floor = inner.floor;
        let has_src = !self.src.is_empty();
        let x = &inner.x;
        let mut worst: f64 = 0.0;
        let mut nan = false;
        let order = |n: usize, m: usize| if forward { m } else { n - 1 - m };
        // Scratch of the Thomas algorithm, sized once per block (rule: no allocation per
        // sweep): inverses of the eliminated diagonal blocks and the eliminated right sides.
        let mut line = std::mem::take(&mut self.line);
        line.resize(6 * nx, 0.0);
        for pp in 0..self.nzl {
            let p = 1 + order(self.nzl, pp);
            let kg = self.k0 + p - 1;
            for jj in 0..ny {
                let j = order(ny, jj);
                let row = p * ps + j * rs;
                // Forward elimination.
                for i in 0..nx {
                    let pt = Self::point(inner, kg, j, i);
                    let d = 1.0 - dt * pt.diag;
                    let o = row + 2 * i;
                    let q = o - ps; // into old / src
                    let (r1, r2) = if has_src {
                        (self.old[q] + self.src[q], self.old[q + 1] + self.src[q + 1])
                    } else {
                        (self.old[q], self.old[q + 1])
                    };
                    let (c1, c2) = (self.c[o], self.c[o + 1]);
                    let (r, jr) = kin.eval(c1, c2);
                    let mut f1 = -(Self::linear_part(&self.c, o, &pt, d, r1, dt) - dt * r[0]);
                    let mut f2 = -(Self::linear_part(&self.c, o + 1, &pt, d, r2, dt) - dt * r[1]);
                    let mut b11 = d - dt * jr[0][0];
                    let mut b12 = -dt * jr[0][1];
                    let mut b21 = -dt * jr[1][0];
                    let mut b22 = d - dt * jr[1][1];
                    if i > 0 {
                        // Row i: a_i delta_{i-1} + B_i delta_i + c_i delta_{i+1} = f_i, with
                        // a_i = -dt lo_i, c_{i-1} = -dt up_{i-1}.
                        let a = -dt * x.lo[i];
                        let cm = -dt * x.up[i - 1];
                        let s = &line[6 * (i - 1)..6 * i];
                        let ac = a * cm;
                        b11 -= ac * s[0];
                        b12 -= ac * s[1];
                        b21 -= ac * s[2];
                        b22 -= ac * s[3];
                        f1 -= a * (s[0] * s[4] + s[1] * s[5]);
                        f2 -= a * (s[2] * s[4] + s[3] * s[5]);
                    }
                    let det = b11 * b22 - b12 * b21;
                    let s = &mut line[6 * i..6 * i + 6];
                    s[0] = b22 / det;
                    s[1] = -b12 / det;
                    s[2] = -b21 / det;
                    s[3] = b11 / det;
                    s[4] = f1;
                    s[5] = f2;
                }
                // Back substitution: delta_i = B_i^-1 (f_i - c_i delta_{i+1}).
                let (mut n1, mut n2) = (0.0, 0.0);
                for i in (0..nx).rev() {
                    let s = &line[6 * i..6 * i + 6];
                    let cu = -dt * x.up[i];
                    let (g1, g2) = (s[4] - cu * n1, s[5] - cu * n2);
                    let d1 = s[0] * g1 + s[1] * g2;
                    let d2 = s[2] * g1 + s[3] * g2;
                    let o = row + 2 * i;
                    let (v1, v2) = (self.c[o] + d1, self.c[o + 1] + d2);
                    self.c[o] = v1;
                    self.c[o + 1] = v2;
                    let s1 = d1.abs() / (v1.abs() + floor[0]);
                    let s2 = d2.abs() / (v2.abs() + floor[1]);
                    nan |= s1.is_nan() | s2.is_nan();
                    worst = worst.max(s1).max(s2);
                    (n1, n2) = (d1, d2);
                }
            }
        }
        self.line = line;
        if nan {
            f64::NAN
        } else {
            worst
        }
    }

    fn residual_of<K: Kinetics>(&self, inner: &Inner, c: &[f64], kin: K, dt: f64) -> f64 {
        let (nx, ny) = (inner.params.nx, inner.params.ny);
        let (rs, ps) = (2 * nx, 2 * nx * ny);
        let floor = inner.floor;
        let has_src = !self.src.is_empty();
        let mut worst: f64 = 0.0;
        for p in 1..=self.nzl {
            let kg = self.k0 + p - 1;
            for j in 0..ny {
                for i in 0..nx {
                    let pt = Self::point(inner, kg, j, i);
                    let d = 1.0 - dt * pt.diag;
                    let o = p * ps + j * rs + 2 * i;
                    let q = o - ps;
                    let (r, _) = kin.eval(c[o], c[o + 1]);
                    for s in 0..2 {
                        let rhs = self.old[q + s] + if has_src { self.src[q + s] } else { 0.0 };
                        let f = Self::linear_part(c, o + s, &pt, d, rhs, dt) - dt * r[s];
                        let v = f.abs() / (c[o + s].abs() + floor[s]);
                        if v.is_nan() {
                            return f64::INFINITY;
                        }
                        worst = worst.max(v);
                    }
                }
            }
        }
        worst
    }
}

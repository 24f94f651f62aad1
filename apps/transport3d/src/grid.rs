//! The discretization: parameters, the mesh, the stencils and the split into blocks.
//!
//! # Rules
//!
//! 1. **Mesh.** Node-centred, walls included (cvDiurnal_kry's mesh): `x_i = i dx`,
//!    `dx = 20 / (nx - 1)`, the same for y and `z_k = 30 + k dz`. `nx, nz >= 3`; `ny = 1`
//!    means no y-direction (the single node at y = 10, no y terms: cvDiurnal's 2D problem),
//!    else `ny >= 3`.
//! 2. **Interior stencils** (second order): `K_h (c_{i+1} - 2 c_i + c_{i-1}) / dx²` in x and y,
//!    centred advection `V (c_{i+1} - c_{i-1}) / (2 dx)` in x, and
//!    `(K_{k+1/2} (c_{k+1} - c_k) - K_{k-1/2} (c_k - c_{k-1})) / dz²` in z with K_v at the half
//!    points `z_k ± dz/2` (cvDiurnal's form). Written as a flux difference
//!    `(G_{i+1/2} - G_{i-1/2}) / dx` with `G = K (c_{i+1} - c_i) / dx + V (c_i + c_{i+1}) / 2`.
//! 3. **Neumann walls** ([`Walls::Neumann`], cvDiurnal's): the ghost node outside a wall is the
//!    mirror of the first inner node (`c_{-1} = c_1`), so advection vanishes on the walls and
//!    the z stencil at k = 0 is `(K_{1/2} + K_{-1/2}) (c_1 - c_0) / dz²`, K_{-1/2} taken at
//!    `z_min - dz/2` as cvDiurnal does. Second order for a solution with zero normal derivative.
//! 4. **Zero-flux walls** ([`Walls::ZeroFlux`]): a wall node owns a half cell and the flux G
//!    through the wall is zero, so at i = 0: `dc_0/dt = 2 G_{1/2} / dx`. The sum of the nodal
//!    values with trapezoid weights (½ on wall nodes) is then conserved exactly by the transport
//!    operator, advection included ([`crate::Solution::mass`]).
//! 5. **Time.** Implicit Euler: at step n+1, `F(c) = c - c^n - dt (L c + R(c, t_{n+1}) +
//!    S(t_{n+1})) = 0`. The last step is shortened to land on `t_end`:
//!    [`Problem::steps`] `= ceil(t_end / dt)`.
//! 6. **Blocks.** Slabs of whole z planes: nz planes split as evenly as possible in order
//!    (the first `nz mod blocks` blocks get one plane more). Each block holds one halo plane per
//!    side that has a neighbour; both species of a point are on the same block.
//! 7. **Scales.** Residuals and changes are measured in the scaled max-norm
//!    `max |d c_s| / (|c_s| + a_s)`, with the floor `a_s = 1e-4 max |c_s(t = 0)|` (for the
//!    diurnal c1 this is cvDiurnal's FLOOR = 100).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::{Model, Walls, X_MAX, Y_MAX, Z_MAX, Z_MIN};

/// Largest number of nodes on one axis (a bound checked before any allocation).
pub const MAX_AXIS: usize = 4096;
/// Largest mesh (points): 2^27 points are 2 GiB per copy of the state.
pub const MAX_POINTS: usize = 1 << 27;
/// Relative floor of the scaled norm (rule 7).
pub const FLOOR: f64 = 1e-4;

/// Everything that defines a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Nodes in x (>= 3).
    pub nx: usize,
    /// Nodes in y (1, or >= 3).
    pub ny: usize,
    /// Nodes in z (>= 3, >= blocks).
    pub nz: usize,
    /// Time step (s).
    pub dt: f64,
    /// End time (s).
    pub t_end: f64,
    /// Number of z slabs.
    pub blocks: usize,
    /// The equations.
    pub model: Model,
    /// Outer tolerance: a step has converged when every block's outer residual is below it.
    pub tol: f64,
    /// Inner tolerance: a block's solve stops when a Gauss-Seidel sweep changes its state by
    /// less than this (scaled max-norm). Must be below `tol`.
    pub inner_tol: f64,
    /// Most symmetric Gauss-Seidel sweeps per outer iteration.
    pub max_sweeps: u32,
    /// Most outer iterations per time step before a driver gives up.
    pub max_outer: u32,
}

impl Params {
    /// Defaults: the diurnal model on a 16³ mesh in 4 blocks, dt = 60 s to t = 600 s,
    /// tolerance 1e-6 (inner 1e-7).
    pub fn new(model: Model) -> Params {
        Params {
            nx: 16,
            ny: 16,
            nz: 16,
            dt: 60.0,
            t_end: 600.0,
            blocks: 4,
            model,
            tol: 1e-6,
            inner_tol: 1e-7,
            max_sweeps: 500,
            max_outer: 1000,
        }
    }
}

/// Parameters that cannot make a problem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamError {
    /// A mesh axis has too few or too many nodes.
    #[error("{axis} = {n}: {rule}")]
    Grid {
        /// Which axis.
        axis: &'static str,
        /// Its node count.
        n: usize,
        /// What it must be.
        rule: &'static str,
    },
    /// The mesh has more points than [`MAX_POINTS`].
    #[error("a {nx} x {ny} x {nz} mesh has more than {MAX_POINTS} points")]
    TooLarge {
        /// Nodes in x.
        nx: usize,
        /// Nodes in y.
        ny: usize,
        /// Nodes in z.
        nz: usize,
    },
    /// The block count is 0 or larger than the number of z planes.
    #[error("{blocks} blocks for {nz} z planes: need 1 <= blocks <= nz")]
    Blocks {
        /// Blocks asked for.
        blocks: usize,
        /// z planes.
        nz: usize,
    },
    /// A time parameter is not a positive finite number.
    #[error("{name} = {value}: must be positive and finite")]
    Time {
        /// Which one.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// Tolerances out of range.
    #[error("tolerances tol = {tol}, inner_tol = {inner_tol}: need 0 < inner_tol < tol")]
    Tolerance {
        /// Outer.
        tol: f64,
        /// Inner.
        inner_tol: f64,
    },
    /// An iteration limit is zero.
    #[error("{0} must be at least 1")]
    Limit(&'static str),
    /// Too many time steps (more than 2^32).
    #[error("t_end / dt = {0} steps is too many")]
    Steps(f64),
    /// The model's own parameters are invalid.
    #[error("model: {0}")]
    Model(String),
}

/// Coefficients of one axis of the transport operator: node i gets
/// `lo[i] c_{i-1} + di[i] c_i + up[i] c_{i+1}` (lo[0] = up[n-1] = 0: walls are folded in).
#[derive(Clone, Debug, Default)]
pub(crate) struct Axis {
    pub(crate) lo: Vec<f64>,
    pub(crate) di: Vec<f64>,
    pub(crate) up: Vec<f64>,
}

impl Axis {
    /// Rules 2-4 for an axis of n nodes spacing h with diffusivity `k(position of the half
    /// point)` and wind v.
    fn new(n: usize, h: f64, origin: f64, k: impl Fn(f64) -> f64, v: f64, walls: Walls) -> Axis {
        let mut a = Axis {
            lo: vec![0.0; n],
            di: vec![0.0; n],
            up: vec![0.0; n],
        };
        if n == 1 {
            return a;
        }
        let ha = v / (2.0 * h);
        let kd = |i: f64| k(origin + i * h) / (h * h); // i: a half index, e.g. 0.5
        for i in 0..n {
            let fi = i as f64;
            let (kdn, kup) = (kd(fi - 0.5), kd(fi + 0.5));
            let (mut lo, mut di, mut up) = (kdn - ha, -(kdn + kup), kup + ha);
            if i == 0 {
                match walls {
                    Walls::Neumann => {
                        up += lo;
                    }
                    Walls::ZeroFlux => {
                        // 2 G_{1/2} / h with G_{1/2} = K (c1 - c0)/h + V (c0 + c1)/2.
                        up = 2.0 * (kup + ha);
                        di = 2.0 * (-kup + ha);
                    }
                }
                lo = 0.0;
            }
            if i == n - 1 {
                match walls {
                    Walls::Neumann => {
                        lo += up;
                    }
                    Walls::ZeroFlux => {
                        // -2 G_{n-3/2} / h.
                        lo = 2.0 * (kdn - ha);
                        di = -2.0 * (kdn + ha);
                    }
                }
                up = 0.0;
            }
            a.lo[i] = lo;
            a.di[i] = di;
            a.up[i] = up;
        }
        a
    }
}

/// The shared, immutable part of a problem.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) params: Params,
    pub(crate) dx: f64,
    pub(crate) dy: f64,
    pub(crate) dz: f64,
    pub(crate) x: Axis,
    pub(crate) y: Axis,
    pub(crate) z: Axis,
    /// First z plane of each block, and nz at the end.
    pub(crate) starts: Vec<usize>,
    /// Floors a_s of the scaled norm (rule 7).
    pub(crate) floor: [f64; 2],
    pub(crate) steps: u64,
}

/// A validated problem: mesh, stencils and blocks. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Problem {
    pub(crate) inner: Arc<Inner>,
}

impl Problem {
    /// Checks `params` and builds the stencils.
    pub fn new(params: Params) -> Result<Problem, ParamError> {
        let p = &params;
        let axis = |axis, n: usize, one_ok: bool| {
            let rule = if one_ok {
                "need 1 or 3..=4096 nodes"
            } else {
                "need 3..=4096 nodes"
            };
            let ok = (n >= 3 || (one_ok && n == 1)) && n <= MAX_AXIS;
            if ok {
                Ok(())
            } else {
                Err(ParamError::Grid { axis, n, rule })
            }
        };
        axis("nx", p.nx, false)?;
        axis("ny", p.ny, true)?;
        axis("nz", p.nz, false)?;
        if p.nx * p.ny * p.nz > MAX_POINTS {
            return Err(ParamError::TooLarge {
                nx: p.nx,
                ny: p.ny,
                nz: p.nz,
            });
        }
        if p.blocks == 0 || p.blocks > p.nz {
            return Err(ParamError::Blocks {
                blocks: p.blocks,
                nz: p.nz,
            });
        }
        for (name, value) in [("dt", p.dt), ("t_end", p.t_end)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ParamError::Time { name, value });
            }
        }
        if !(p.inner_tol.is_finite()
            && p.tol.is_finite()
            && 0.0 < p.inner_tol
            && p.inner_tol < p.tol)
        {
            return Err(ParamError::Tolerance {
                tol: p.tol,
                inner_tol: p.inner_tol,
            });
        }
        if p.max_sweeps == 0 {
            return Err(ParamError::Limit("max_sweeps"));
        }
        if p.max_outer == 0 {
            return Err(ParamError::Limit("max_outer"));
        }
        p.model.check().map_err(ParamError::Model)?;
        // Rule 5; the 1e-9 keeps t_end = 10 dt from becoming 11 steps through rounding.
        let ratio = p.t_end / p.dt;
        if ratio > f64::from(u32::MAX) {
            return Err(ParamError::Steps(ratio));
        }
        // Bounded by u32::MAX just above.
        let steps = ((ratio - 1e-9).ceil().max(1.0)) as u64;

        let coeffs = p.model.coeffs();
        let walls = p.model.walls();
        let dx = X_MAX / (p.nx - 1) as f64;
        let dy = if p.ny > 1 {
            Y_MAX / (p.ny - 1) as f64
        } else {
            0.0
        };
        let dz = (Z_MAX - Z_MIN) / (p.nz - 1) as f64;
        let x = Axis::new(p.nx, dx, 0.0, |_| coeffs.kh, coeffs.v, walls);
        let y = Axis::new(p.ny, dy, 0.0, |_| coeffs.kh, 0.0, walls);
        let z = Axis::new(p.nz, dz, Z_MIN, |z| coeffs.kv(z), 0.0, walls);
        let (base, extra) = (p.nz / p.blocks, p.nz % p.blocks);
        let mut starts = Vec::with_capacity(p.blocks + 1);
        let mut s = 0;
        for b in 0..p.blocks {
            starts.push(s);
            s += base + usize::from(b < extra);
        }
        starts.push(s);
        let mut inner = Inner {
            params,
            dx,
            dy,
            dz,
            x,
            y,
            z,
            starts,
            floor: [0.0; 2],
            steps,
        };
        let mut peak = [0.0f64; 2];
        for k in 0..inner.params.nz {
            for j in 0..inner.params.ny {
                for i in 0..inner.params.nx {
                    let c = inner.initial(i, j, k);
                    peak[0] = peak[0].max(c[0].abs());
                    peak[1] = peak[1].max(c[1].abs());
                }
            }
        }
        // A species that starts at zero everywhere gets an absolute floor of FLOOR.
        inner.floor = peak.map(|m| if m > 0.0 { FLOOR * m } else { FLOOR });
        Ok(Problem {
            inner: Arc::new(inner),
        })
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        &self.inner.params
    }

    /// Number of time steps (rule 5).
    pub fn steps(&self) -> u64 {
        self.inner.steps
    }

    /// Time after `step` steps.
    pub fn time_at(&self, step: u64) -> f64 {
        self.inner.time_at(step)
    }

    /// The z planes `[first, end)` of block `b`.
    pub fn planes(&self, b: usize) -> std::ops::Range<usize> {
        self.inner.starts[b]..self.inner.starts[b + 1]
    }

    /// Mesh spacings (dx, dy, dz); dy is 0 when ny = 1.
    pub fn spacing(&self) -> (f64, f64, f64) {
        (self.inner.dx, self.inner.dy, self.inner.dz)
    }

    /// Coordinates of node (i, j, k).
    pub fn coords(&self, i: usize, j: usize, k: usize) -> (f64, f64, f64) {
        self.inner.coords(i, j, k)
    }

    /// Floors a_s of the scaled norm (rule 7).
    pub fn floor(&self) -> [f64; 2] {
        self.inner.floor
    }
}

impl Inner {
    pub(crate) fn has_y(&self) -> bool {
        self.params.ny > 1
    }

    pub(crate) fn coords(&self, i: usize, j: usize, k: usize) -> (f64, f64, f64) {
        let y = if self.has_y() {
            j as f64 * self.dy
        } else {
            Y_MAX / 2.0
        };
        (i as f64 * self.dx, y, Z_MIN + k as f64 * self.dz)
    }

    pub(crate) fn initial(&self, i: usize, j: usize, k: usize) -> [f64; 2] {
        let (x, y, z) = self.coords(i, j, k);
        self.params.model.initial(x, y, z, self.has_y())
    }

    pub(crate) fn time_at(&self, step: u64) -> f64 {
        if step >= self.steps {
            self.params.t_end
        } else {
            step as f64 * self.params.dt
        }
    }

    /// Length of step `n + 1` (from t_n).
    pub(crate) fn dt_of(&self, n: u64) -> f64 {
        self.time_at(n + 1) - self.time_at(n)
    }

    pub(crate) fn plane_len(&self) -> usize {
        2 * self.params.nx * self.params.ny
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_flux_columns_sum_to_zero_with_trapezoid_weights() {
        // Rule 4: sum_i w_i L_ij = 0 for every j, so the weighted sum of c is conserved.
        for (v, k) in [(0.0, 0.1), (0.3, 0.01), (-0.2, 0.5)] {
            let n = 7;
            let a = Axis::new(n, 0.5, 30.0, |z| k * (0.1 * z).exp(), v, Walls::ZeroFlux);
            let w = |i: usize| if i == 0 || i == n - 1 { 0.5 } else { 1.0 };
            for j in 0..n {
                let mut col = w(j) * a.di[j];
                if j > 0 {
                    col += w(j - 1) * a.up[j - 1];
                }
                if j + 1 < n {
                    col += w(j + 1) * a.lo[j + 1];
                }
                assert!(col.abs() < 1e-12, "v {v} k {k} column {j}: {col}");
            }
        }
    }

    #[test]
    fn neumann_walls_mirror() {
        let a = Axis::new(5, 2.0, 0.0, |_| 4.0, 2.0, Walls::Neumann);
        // Interior: K/h² = 1, V/2h = 0.5.
        assert_eq!((a.lo[2], a.di[2], a.up[2]), (0.5, -2.0, 1.5));
        // Walls: the mirror makes advection vanish.
        assert_eq!((a.lo[0], a.di[0], a.up[0]), (0.0, -2.0, 2.0));
        assert_eq!((a.lo[4], a.di[4], a.up[4]), (2.0, -2.0, 0.0));
    }

    #[test]
    fn blocks_split_planes_evenly() {
        let mut p = Params::new(Model::Diurnal);
        p.nz = 10;
        p.blocks = 4;
        let pr = Problem::new(p).unwrap();
        let sizes: Vec<usize> = (0..4).map(|b| pr.planes(b).len()).collect();
        assert_eq!(sizes, [3, 3, 2, 2]);
        assert_eq!(pr.planes(3).end, 10);
    }

    #[test]
    fn steps_land_on_t_end() {
        let mut p = Params::new(Model::Diurnal);
        p.dt = 60.0;
        p.t_end = 600.0;
        assert_eq!(Problem::new(p.clone()).unwrap().steps(), 10);
        p.t_end = 610.0;
        let pr = Problem::new(p.clone()).unwrap();
        assert_eq!(pr.steps(), 11);
        assert_eq!(pr.time_at(11), 610.0);
        assert!((pr.inner.dt_of(10) - 10.0).abs() < 1e-12);
        p.dt = 1000.0;
        assert_eq!(Problem::new(p).unwrap().steps(), 1);
    }
}

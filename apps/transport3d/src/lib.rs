//! 3D two-species advection-diffusion-reaction (paper 000's test problem) on veriflow.
//!
//! JaceP2P-V2 (paper 000) is evaluated on "a system of 3D advection-diffusion-reaction
//! equations" with two chemical species, the model of its ref. [14] (Bahi, Couturier, Mazouzi,
//! Salomon 2006), whose exact kinetics are not published in a form we can use. Our stand-in is
//! the two-species diurnal kinetics problem of SUNDIALS' `cvDiurnal_kry` example, extended to
//! 3D (issue 7 point 4): for i = 1, 2 on x, y in [0, 20], z in [30, 50] (km),
//!
//! ```text
//! dc_i/dt = K_h (d2/dx2 + d2/dy2) c_i + V dc_i/dx + d/dz (K_v(z) dc_i/dz) + R_i(c1, c2, t)
//! R_1 = -q1 c1 c3 - q2 c1 c2 + 2 q3(t) c3 + q4(t) c2,   R_2 = q1 c1 c3 - q2 c1 c2 - q4(t) c2
//! K_h = 4e-6, V = 1e-3, K_v = 1e-8 exp(z / 5), q1 = 1.63e-16, q2 = 4.66e-16, c3 = 3.7e16,
//! q3 = exp(-22.62 / sin wt), q4 = exp(-7.601 / sin wt) while sin wt > 0 (else 0), w = pi/43200
//! c1(0) = 1e6 a(x) b(y) g(z), c2(0) = 1e12 a b g, a = 1 - s² + s⁴/2 with s = 0.1 (x - 10)
//! (b: s = 0.1 (y - 10), g: s = 0.1 (z - 40)), homogeneous Neumann walls.
//! ```
//!
//! Verification variants ([`Model`]) switch the reaction to a first-order decay (a Gaussian
//! puff with a closed form), switch it off (pure transport with zero-flux walls: mass is
//! conserved) or add a manufactured source.
//!
//! - `grid.rs`: the mesh, the stencils (second order in space, centred advection), the walls,
//!   implicit Euler, the z slabs; [`Params`] and [`Problem`].
//! - `block.rs`: the block API of the outer iteration ([`Block`]) and its inner solver
//!   (x-line Gauss-Seidel-Newton).
//! - `solution.rs`: assembling blocks, the true global residual, the sequential reference and a
//!   synchronous block-Jacobi driver.
//! - `dataflow.rs`: the [`Transport3d`] program: every (time step, outer iteration, block) is a
//!   task of the data-flow runtime, so a run is logged, recoverable and certifiable.
//! - [`iterative`]: the slabs as blocks of veriflow's iterative mode (paper 000: asynchronous
//!   or synchronous iterations, decentralized convergence detection), `run --mode async|sync`.
//!
//! ```
//! use transport3d::{Model, Params, Problem};
//!
//! let mut p = Params::new(Model::Diurnal);
//! (p.nx, p.ny, p.nz, p.blocks, p.t_end) = (8, 3, 8, 2, 120.0);
//! let problem = Problem::new(p).unwrap();
//! let mut blocks = problem.blocks();
//! while !blocks[0].finished() {
//!     loop {
//!         let r = blocks.iter_mut().map(|b| b.outer_iteration()).fold(0.0, f64::max);
//!         Problem::exchange_halos(&mut blocks);
//!         if r < problem.params().tol {
//!             break;
//!         }
//!     }
//!     assert!(problem.global_residual(&blocks).unwrap() < 1e-4);
//!     for b in &mut blocks {
//!         b.advance();
//!     }
//! }
//! let s = problem.assemble_accepted(&blocks).unwrap();
//! assert_eq!(s.time, 120.0);
//! ```

mod block;
mod dataflow;
mod grid;
pub mod iterative;
mod model;
mod solution;

pub use block::{Block, BlockError, BlockState, HaloError, Side};
pub use dataflow::{BlockTask, Check, ModelName, Outcome, Start, Transport3d};
pub use grid::{ParamError, Params, Problem, FLOOR, MAX_AXIS, MAX_POINTS};
pub use iterative::RunMode;
pub use model::{
    bump, diurnal, diurnal_rates, Coeffs, Manufactured, Model, Puff, Walls, MANUFACTURED_SCALE,
    PUFF_AMPLITUDE, X_MAX, Y_MAX, Z_MAX, Z_MIN,
};
pub use solution::{AssembleError, JacobiRun, NoConvergence, Solution};

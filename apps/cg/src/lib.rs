//! Fault-tolerant conjugate gradient on veriflow (paper 002, Zhang and He, *Fault Tolerance for
//! Conjugate Gradient Solver Based on FT-MPI*).
//!
//! The paper's solver reads a sparse matrix from a Harwell-Boeing file, sets b = A L for a known
//! L so that x = L verifies the result, and runs CG on workers that own row blocks. Here:
//!
//! - [`matrix`]: Matrix Market and Harwell-Boeing readers (line-and-field errors, the Fortran
//!   format rules), generated 2D/3D Poisson matrices, CSR storage and row-block views;
//! - [`problem`]: the system A x = b named by a small [`Source`] (a task argument), b = A L,
//!   and the per-process cache that lets a task name the matrix instead of carrying it;
//! - [`kernel`]: SpMV, dot products in a fixed order, CG, and the per-block state
//!   ([`BlockState`]) a worker that owns a row block keeps, with its exact byte layout;
//! - [`dataflow`]: `cg run --mode dataflow`, every iteration's blocks as tasks of the data-flow
//!   runtime (logged, recoverable, certifiable), bit-identical to [`kernel::solve`] with the same
//!   blocks, on any number of vnodes and failures;
//! - [`spmd`]: `cg run --mode spmd`, paper 002's model: workers owning row blocks in lock step,
//!   checkpoints encoded across extra vnodes (XOR, Reed-Solomon or the floating-point
//!   checksum), killed workers replaced by spares that rebuild their state from the encoding;
//! - [`Cg`]: the command line, run through [`veriflow::App`] (and [`app::main`] for spmd).

pub mod app;
pub mod dataflow;
pub mod kernel;
pub mod matrix;
pub mod problem;
pub mod spmd;

pub use app::{Cg, Mode, Report};
pub use dataflow::Solution;
pub use kernel::{
    dot, solve, spmv, spmv_dot, sum_ordered, BlockState, CgError, CgOptions, CgOutcome, Partition,
};
pub use matrix::{Csr, CsrRows, FileMatrix, MatrixError};
pub use problem::{exact_solution, problem, Problem, ProblemError, Rhs, Source};
pub use spmd::{Encoding, Kill, SpmdConfig, SpmdError, SpmdReport};

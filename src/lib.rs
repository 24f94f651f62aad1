//! veriflow: run macro data-flow programs on machines that crash and machines that lie.
//!
//! This is the crate users depend on. It re-exports the programming model and the runtime
//! (from `veriflow-runtime`), the certifier (from `veriflow-certifier`) and the stores (from
//! `veriflow-checkpoint`), and gives every
//! application binary the same command line through [`App`]: implement [`Program`] for your
//! parameters and call `App::<YourProgram>::main()`.
//!
//! A complete example, that `cargo test` compiles, is in README.md ("Write your own app").

mod alloc_cli;
mod app;
mod chaos;
mod cluster_cli;
mod inspect;
mod interrupt;
mod iterative_cli;

pub use app::{checked_note, App, InvalidArgs, IterCheck, Iterative, Program, WrongResult};
#[doc(hidden)]
pub use cluster_cli::kill_draws;
pub use inspect::{
    inspect, timeline, HtmlLimits, Inspection, TerminalValue, VnodeSummary, DOT_MAX_TASKS,
    HTML_LIMITS,
};

pub use veriflow_checkpoint::{MemoryStore, SledStore, Store, StoreError};
pub use veriflow_runtime::graph::FlowGraph;
pub use veriflow_runtime::log::{
    CommitPolicy, Event, EventKind, LogError, LogReader, Manifest, RunStatus,
    DEFAULT_CHECKPOINT_BYTES,
};
pub use veriflow_runtime::{
    Ctx, Data, DataId, Digest, InputSet, OutputReads, OutputSet, Read, Reads, Registry,
    RegistryError, RunError, RunReport, Runtime, RuntimeBuilder, Task, TaskError, TaskId,
    TaskResult, VnodeId, VnodeStats, Write, Writes,
};

/// The runtime crate, for what the facade does not re-export.
pub use veriflow_runtime as runtime;

/// The cluster crate: coordinator and worker state machines, their drivers, the simulator.
pub use veriflow_cluster as cluster;

/// The certifier crate (paper 001 §V): sample sizes, the oracle, Algorithm 1, certificates.
pub use veriflow_certifier as certifier;
pub use veriflow_certifier::{certify, Certificate, Decision};
pub use veriflow_checkpoint::Key;
pub use veriflow_runtime::{Forge, ForgeMode};

/// README.md's examples, compiled as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

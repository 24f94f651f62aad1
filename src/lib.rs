//! veriflow: run macro data-flow programs on machines that crash and machines that lie.
//!
//! This is the crate users depend on. It re-exports the programming model and the runtime
//! (from `veriflow-runtime`) and the stores (from `veriflow-checkpoint`), and gives every
//! application binary the same command line through [`App`]: implement [`Program`] for your
//! parameters and call `App::<YourProgram>::main()`.
//!
//! ```no_run
//! use clap::Args;
//! use serde::{Deserialize, Serialize};
//! use veriflow::{App, Ctx, Program, Registry, RegistryError, Task, TaskResult, WrongResult, Writes};
//!
//! /// Sum of 1..=n, split in halves down to single numbers.
//! #[derive(Serialize, Deserialize)]
//! struct Range { lo: u64, hi: u64 }
//!
//! impl Task for Range {
//!     const NAME: &'static str = "sum.range";
//!     type Inputs = ();
//!     type Outputs = (u64,);
//!     fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
//!         if self.hi - self.lo < 2 {
//!             ctx.write(out, (self.lo..self.hi).sum());
//!         } else {
//!             let mid = self.lo + (self.hi - self.lo) / 2;
//!             let (a,) = ctx.spawn(Range { lo: self.lo, hi: mid }, ());
//!             let (b,) = ctx.spawn(Range { lo: mid, hi: self.hi }, ());
//!             ctx.spawn_delegate(Add, (a, b), (out,));
//!         }
//!         Ok(())
//!     }
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Add;
//!
//! impl Task for Add {
//!     const NAME: &'static str = "sum.add";
//!     type Inputs = (u64, u64);
//!     type Outputs = (u64,);
//!     fn run(self, ctx: &mut Ctx<'_>, (a, b): (u64, u64), (out,): Writes<Self>) -> TaskResult {
//!         ctx.write(out, a + b);
//!         Ok(())
//!     }
//! }
//!
//! /// The command-line parameters of the program.
//! #[derive(Args, Clone, Debug)]
//! struct SumTo {
//!     /// Sum 1..=n.
//!     #[arg(long)]
//!     n: u64,
//! }
//!
//! impl Program for SumTo {
//!     const NAME: &'static str = "sumto";
//!     type Root = Range;
//!     fn register(r: &mut Registry) -> Result<(), RegistryError> {
//!         r.register::<Range>()?;
//!         r.register::<Add>()
//!     }
//!     fn root(&self) -> (Range, ()) {
//!         (Range { lo: 1, hi: self.n + 1 }, ())
//!     }
//!     fn check(&self, (sum,): &(u64,)) -> Result<serde_json::Value, WrongResult> {
//!         let want = self.n * (self.n + 1) / 2;
//!         if *sum == want {
//!             Ok(serde_json::json!(sum))
//!         } else {
//!             Err(WrongResult { expected: want.to_string(), got: sum.to_string() })
//!         }
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     App::<SumTo>::main() // `sumto run --n 1000`, `sumto inspect --log-dir DIR`
//! }
//! ```

mod app;
mod inspect;

pub use app::{App, InvalidArgs, Program, WrongResult};
pub use inspect::{inspect, Inspection, TerminalValue, VnodeSummary};

pub use veriflow_checkpoint::{MemoryStore, SledStore, Store, StoreError};
pub use veriflow_runtime::graph::FlowGraph;
pub use veriflow_runtime::log::{
    CommitPolicy, Event, EventKind, LogError, LogReader, Manifest, RunStatus,
};
pub use veriflow_runtime::{
    Ctx, Data, DataId, Digest, InputSet, OutputReads, OutputSet, Read, Reads, Registry,
    RegistryError, RunError, RunReport, Runtime, RuntimeBuilder, Task, TaskError, TaskId,
    TaskResult, VnodeId, VnodeStats, Write, Writes,
};

/// The runtime crate, for what the facade does not re-export.
pub use veriflow_runtime as runtime;

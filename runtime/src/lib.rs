//! veriflow-runtime: typed macro data-flow tasks on virtual nodes, with a per-vnode event log.
//!
//! The pieces, each with its rules in its module docs:
//!
//! - [`task`]: the programming model (paper 001 §III): [`Task`], [`Ctx`], typed [`Read`] and
//!   [`Write`] handles, the [`Registry`];
//! - [`exec`]: the [`Runtime`]: vnodes on a rayon pool, dependency counters, random stealing
//!   between vnodes, termination;
//! - [`log`]: the event log SC_v of each vnode, group commit, reader;
//! - [`codec`]: the one place where bytes are encoded and checked;
//! - [`transport`]: messages between vnodes;
//! - [`detect`]: the Phoenix failure detector (paper 004 §4): heartbeats, broken peers and vnodes;
//! - [`graph`]: the data-flow graph G rebuilt from logs (petgraph);
//! - [`iterative`]: iterative mode (paper 000): asynchronous block iterations with halo
//!   exchange, decentralized global convergence detection and backups on neighbours;
//! - [`replay`]: one task re-run alone from its logged record (the certifier's oracle).
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use veriflow_runtime::{Ctx, Registry, Runtime, Task, TaskResult, Writes};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Square(u64);
//!
//! impl Task for Square {
//!     const NAME: &'static str = "square";
//!     type Inputs = ();
//!     type Outputs = (u64,);
//!     fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
//!         ctx.write(out, self.0 * self.0);
//!         Ok(())
//!     }
//! }
//!
//! let registry = Registry::new().with::<Square>().unwrap();
//! let rt = Runtime::builder(registry).threads(2).build().unwrap();
//! let report = rt.run(Square(7), ()).unwrap();
//! assert_eq!(report.outputs, (49,));
//! ```

pub mod clock;
pub mod codec;
pub mod detect;
mod error;
pub mod exec;
pub mod graph;
mod ids;
pub mod iterative;
pub mod log;
pub mod metrics;
pub mod replay;
pub mod task;
pub mod transport;
mod util;

pub use clock::{Clock, ManualClock, SystemClock};
pub use codec::Digest;
pub use error::RunError;
pub use exec::{
    Control, Forge, ForgeMode, Kill, Member, MemberReport, MemberStatus, ProgressFn, RunReport,
    Runtime, RuntimeBuilder, Stall, SteppedMember, StopToken, Timers, TransportFactory, VnodeStats,
    VnodeWaits,
};
pub use ids::{ChildIds, DataId, Epoch, IdHasher, IdMap, IdSet, ParseIdError, TaskId, VnodeId};
pub use task::{
    decode_outputs, Ctx, Data, InputSet, OutputReads, OutputSet, Read, Reads, Registry,
    RegistryError, Task, TaskError, TaskKind, TaskResult, Write, Writes,
};
pub use veriflow_checkpoint::{MemoryStore, SledStore, Store, StoreError};

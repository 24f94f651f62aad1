//! The programming model (paper 001 §III, Athapascan in Rust).
//!
//! Rules:
//!
//! 1. A task type implements [`Task`]: a unique [`Task::NAME`], its fields are its serializable
//!    arguments, [`Task::Inputs`] is the tuple of values it reads and [`Task::Outputs`] the
//!    tuple of values it must produce.
//! 2. [`Ctx::spawn`] declares a child and returns at once (H2) with [`Read`] handles to the
//!    child's outputs; the child runs when every input it reads has been written. A task never
//!    waits for a child.
//! 3. A task finishes each of its outputs exactly once: by [`Ctx::write`] or by handing its
//!    [`Write`] handles to a child with [`Ctx::spawn_delegate`] (Athapascan's `Shared_w` passed
//!    to a forked task). [`Write`] is not `Clone`, so writing twice does not compile; a handle
//!    dropped unused fails the run with an error naming the task and output.
//! 4. Handles are typed: giving a `Read<String>` where a `Read<u64>` is expected does not
//!    compile.
//! 5. Tasks are deterministic (H3): same arguments and inputs, same outputs and same children.
//!    This is what lets recovery re-run a task and the certifier check one.
//! 6. Every task type a program spawns is registered in a [`Registry`], so that any vnode, and
//!    the oracle, can rebuild it from its logged record (name, argument bytes, inputs).
//! 7. A task that returns an error or panics fails the run with that error as a value
//!    ([`RunError::TaskFailed`](crate::RunError::TaskFailed),
//!    [`RunError::TaskPanicked`](crate::RunError::TaskPanicked)); the pool lives on.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use veriflow_runtime::{Ctx, Task, TaskResult, Writes};
//!
//! /// Fibonacci, the data-flow way: two children and a sum that writes our output.
//! #[derive(Serialize, Deserialize)]
//! struct Fib(u32);
//!
//! impl Task for Fib {
//!     const NAME: &'static str = "fib";
//!     type Inputs = ();
//!     type Outputs = (u64,);
//!     fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
//!         if self.0 < 2 {
//!             ctx.write(out, u64::from(self.0));
//!         } else {
//!             let (a,) = ctx.spawn(Fib(self.0 - 1), ());
//!             let (b,) = ctx.spawn(Fib(self.0 - 2), ());
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
//!     const NAME: &'static str = "add";
//!     type Inputs = (u64, u64);
//!     type Outputs = (u64,);
//!     fn run(self, ctx: &mut Ctx<'_>, (a, b): (u64, u64), (out,): Writes<Self>) -> TaskResult {
//!         ctx.write(out, a + b);
//!         Ok(())
//!     }
//! }
//! ```
//!
//! Rule 3, writing twice does not compile:
//!
//! ```compile_fail
//! # use serde::{Deserialize, Serialize};
//! # use veriflow_runtime::{Ctx, Task, TaskResult, Writes};
//! #[derive(Serialize, Deserialize)]
//! struct Twice;
//! impl Task for Twice {
//!     const NAME: &'static str = "twice";
//!     type Inputs = ();
//!     type Outputs = (u64,);
//!     fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
//!         ctx.write(out, 1);
//!         ctx.write(out, 2); // error: use of moved value `out`
//!         Ok(())
//!     }
//! }
//! ```
//!
//! Rule 4, a wrongly typed handle does not compile:
//!
//! ```compile_fail
//! # use serde::{Deserialize, Serialize};
//! # use veriflow_runtime::{Ctx, Task, TaskResult, Writes};
//! #[derive(Serialize, Deserialize)]
//! struct Name;
//! impl Task for Name {
//!     const NAME: &'static str = "name";
//!     type Inputs = ();
//!     type Outputs = (String,);
//!     fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
//!         ctx.write(out, "x".to_string());
//!         Ok(())
//!     }
//! }
//! #[derive(Serialize, Deserialize)]
//! struct Double;
//! impl Task for Double {
//!     const NAME: &'static str = "double";
//!     type Inputs = (u64,);
//!     type Outputs = (u64,);
//!     fn run(self, ctx: &mut Ctx<'_>, (x,): (u64,), (out,): Writes<Self>) -> TaskResult {
//!         let (s,) = ctx.spawn(Name, ());
//!         let (_,) = ctx.spawn(Double, (s,)); // error: expected `Read<u64>`, found `Read<String>`
//!         ctx.write(out, 2 * x);
//!         Ok(())
//!     }
//! }
//! ```
//!
//! Rule 3, writing an output of the wrong type does not compile either:
//!
//! ```compile_fail
//! # use serde::{Deserialize, Serialize};
//! # use veriflow_runtime::{Ctx, Task, TaskResult, Writes};
//! #[derive(Serialize, Deserialize)]
//! struct Wrong;
//! impl Task for Wrong {
//!     const NAME: &'static str = "wrong";
//!     type Inputs = ();
//!     type Outputs = (u64,);
//!     fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
//!         ctx.write(out, "seven".to_string()); // error: expected `u64`
//!         Ok(())
//!     }
//! }
//! ```

mod ctx;
mod registry;
mod sets;
#[doc(hidden)]
pub mod value;

use std::fmt;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use ctx::Ctx;
pub(crate) use ctx::Host;
pub use registry::{Registry, RegistryError, TaskKind};
pub use sets::{IdList, InputSet, OutputSet, ValueError};

use crate::codec::CodecError;
use crate::error::RunError;
use crate::ids::DataId;
use value::Value;

/// Decodes a task's outputs from their encoded values (as a cluster client receives the
/// terminal outputs).
pub fn decode_outputs<O: OutputSet>(encoded: Vec<Vec<u8>>) -> Result<O, ValueError> {
    O::from_values(encoded.into_iter().map(Value::bytes).collect())
}

/// A value that can flow along the graph: serializable (to be logged, sent and checked),
/// cloneable (several tasks may read it), printable (for `inspect`).
pub trait Data: Serialize + DeserializeOwned + Clone + fmt::Debug + Send + Sync + 'static {}
impl<T> Data for T where T: Serialize + DeserializeOwned + Clone + fmt::Debug + Send + Sync + 'static
{}

/// A handle to read a data object of type `T`: pass it to [`Ctx::spawn`] as a child's input.
pub struct Read<T> {
    pub(crate) id: DataId,
    pub(crate) _t: PhantomData<fn() -> T>,
}

impl<T> Read<T> {
    /// The data object's id.
    pub fn id(&self) -> DataId {
        self.id
    }
}

impl<T> Clone for Read<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Read<T> {}

impl<T> fmt::Debug for Read<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Read({})", self.id)
    }
}

/// The obligation to write a data object of type `T` (rule 3): consumed by [`Ctx::write`] or
/// [`Ctx::spawn_delegate`].
pub struct Write<T> {
    pub(crate) id: DataId,
    pub(crate) _t: PhantomData<fn(T)>,
}

impl<T> Write<T> {
    /// The data object's id.
    pub fn id(&self) -> DataId {
        self.id
    }
}

impl<T> fmt::Debug for Write<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Write({})", self.id)
    }
}

/// The write handles a task of type `T` receives.
pub type Writes<T> = <<T as Task>::Outputs as OutputSet>::Writes;
/// The read handles `spawn` takes for a task of type `T`'s inputs.
pub type Reads<T> = <<T as Task>::Inputs as InputSet>::Reads;
/// The read handles `spawn` returns for a task of type `T`'s outputs.
pub type OutputReads<T> = <<T as Task>::Outputs as OutputSet>::Reads;

/// A task (rule 1).
pub trait Task: Serialize + DeserializeOwned + Send + 'static {
    /// Unique name in the program's registry; it is what the log records.
    const NAME: &'static str;
    /// Values read, e.g. `(u64, Vec<f64>)` or `Vec<u64>`.
    type Inputs: InputSet;
    /// Values produced, e.g. `(u64,)`.
    type Outputs: OutputSet;
    /// The body: reads `inputs`, may spawn children, finishes every handle in `outputs`.
    fn run(self, ctx: &mut Ctx<'_>, inputs: Self::Inputs, outputs: Writes<Self>) -> TaskResult;
}

/// What a task body returns.
pub type TaskResult = Result<(), TaskError>;

/// An error returned by a task body; fails the run (rule 7).
pub struct TaskError(Box<dyn std::error::Error + Send + Sync>);

impl TaskError {
    /// An error with just a message.
    pub fn msg(message: impl fmt::Display) -> TaskError {
        TaskError(message.to_string().into())
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for TaskError {
    fn from(e: E) -> Self {
        TaskError(Box::new(e))
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// A task with its type erased, as the scheduler holds it: in place, at the end of the heap
/// block of its declaration (`exec/core.rs` rule 7), so running it takes the task out of the
/// block instead of consuming a box of its own.
pub(crate) trait ErasedTask: Send {
    fn name(&self) -> &'static str;
    fn encode_args(&self) -> Result<Vec<u8>, CodecError>;
    /// Runs the task; it is gone afterwards (a second call is an error, never a second run).
    fn run(&mut self, ctx: &mut Ctx<'_>, inputs: Vec<Value>) -> Result<(), RunError>;
}

/// A typed task behind [`ErasedTask`]; `None` once it has run.
pub(crate) struct Boxed<T>(pub(crate) Option<T>);

impl<T> Boxed<T> {
    pub(crate) fn new(task: T) -> Self {
        Boxed(Some(task))
    }
}

/// Bodies decoded by the registry (recovery, steals, replay) are boxed already.
impl ErasedTask for Box<dyn ErasedTask> {
    fn name(&self) -> &'static str {
        (**self).name()
    }

    fn encode_args(&self) -> Result<Vec<u8>, CodecError> {
        (**self).encode_args()
    }

    fn run(&mut self, ctx: &mut Ctx<'_>, inputs: Vec<Value>) -> Result<(), RunError> {
        (**self).run(ctx, inputs)
    }
}

impl<T: Task> ErasedTask for Boxed<T> {
    fn name(&self) -> &'static str {
        T::NAME
    }

    fn encode_args(&self) -> Result<Vec<u8>, CodecError> {
        match &self.0 {
            Some(task) => crate::codec::encode(task),
            None => Err(CodecError::other(format!(
                "task {} has run: no arguments left",
                T::NAME
            ))),
        }
    }

    fn run(&mut self, ctx: &mut Ctx<'_>, inputs: Vec<Value>) -> Result<(), RunError> {
        let Some(task) = self.0.take() else {
            return Err(RunError::TaskFailed {
                task: T::NAME.to_string(),
                id: ctx.task_id(),
                message: "it was run a second time".to_string(),
            });
        };
        let inputs = T::Inputs::from_values(inputs).map_err(|e| RunError::InputDecode {
            task: T::NAME.to_string(),
            id: ctx.task_id(),
            input: e.index,
            reason: e.reason,
        })?;
        let writes = T::Outputs::make_writes(ctx.outputs);
        task.run(ctx, inputs, writes)
            .map_err(|e| RunError::TaskFailed {
                task: T::NAME.to_string(),
                id: ctx.task_id(),
                message: e.to_string(),
            })
    }
}

//! Errors of a run, grouped by what the caller should do.

use crate::ids::{DataId, TaskId, VnodeId};
use crate::log::LogError;

/// Why a run failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RunError {
    // --- The program is wrong: fix the task code or the registry. ---
    /// A task body returned an error.
    #[error("task {task} ({id}) failed: {message}")]
    TaskFailed {
        /// Task name.
        task: String,
        /// Task id.
        id: TaskId,
        /// The error it returned.
        message: String,
    },
    /// A task body panicked.
    #[error("task {task} ({id}) panicked: {message}")]
    TaskPanicked {
        /// Task name.
        task: String,
        /// Task id.
        id: TaskId,
        /// The panic message.
        message: String,
    },
    /// A task finished without writing or delegating an output.
    #[error("task {task} ({id}) finished without writing or delegating output {output}")]
    OutputNotWritten {
        /// Task name.
        task: String,
        /// Task id.
        id: TaskId,
        /// Output index.
        output: usize,
    },
    /// A task wrote (or delegated) an output twice.
    #[error("task {task} ({id}) wrote output {output} twice")]
    OutputWrittenTwice {
        /// Task name.
        task: String,
        /// Task id.
        id: TaskId,
        /// Output index.
        output: usize,
    },
    /// A task wrote a data object that is not one of its outputs.
    #[error("task {task} ({id}) wrote {data}, which is not one of its outputs")]
    ForeignWrite {
        /// Task name.
        task: String,
        /// Task id.
        id: TaskId,
        /// The data object.
        data: DataId,
    },
    /// A task spawned a task type missing from the registry.
    #[error("task type {name:?} is spawned but not registered (add it to the registry)")]
    UnregisteredTask {
        /// Task name.
        name: String,
    },
    /// A record (log or message) names a task the registry does not know.
    #[error("unknown task name {name:?} in {context}")]
    UnknownTaskName {
        /// The unknown name.
        name: String,
        /// Where it was found.
        context: String,
    },
    /// An input value did not decode as the type the task declares.
    #[error("task {task} ({id}): input {input} is not of the declared type: {reason}")]
    InputDecode {
        /// Task name.
        task: String,
        /// Task id.
        id: TaskId,
        /// Input index.
        input: usize,
        /// What failed.
        reason: String,
    },
    /// Arguments or values that the codec refuses.
    #[error("cannot encode {what}: {reason}")]
    Encode {
        /// What was being encoded.
        what: String,
        /// What failed.
        reason: String,
    },

    // --- The setup is wrong: fix the configuration. ---
    /// Invalid runtime configuration.
    #[error("invalid configuration: {0}")]
    Config(String),

    // --- Storage failed: the run stops; what was flushed is intact. ---
    /// The event log failed.
    #[error(transparent)]
    Log(#[from] LogError),

    // --- The run stopped progressing: a lost peer, a partition, or a bug. ---
    /// No task completed for `after`: the run waits for something that does not come
    /// (`exec/waits.rs`).
    #[error("no task completed for {after:?}: the run is stalled; {}", waits.iter().map(|w| w.to_string()).collect::<Vec<_>>().join(" | "))]
    Stalled {
        /// How long nothing completed.
        after: std::time::Duration,
        /// What each vnode of the reporting driver waits for.
        waits: Vec<crate::exec::VnodeWaits>,
    },

    // --- Stopped on request: resume it. ---
    /// The caller stopped the run early (a `StopToken`, e.g. on Ctrl-C; rule 7 of
    /// `exec/mod.rs`): its log is durable and `Runtime::resume` finishes it.
    #[error("the run was stopped on request after {completed} tasks completed; its log is durable: resume it to finish")]
    Interrupted {
        /// Tasks completed (this process's count, resumed ones included).
        completed: u64,
    },

    // --- A bug in veriflow: please report. ---
    /// An invariant of the runtime broke.
    #[error("internal error on {vnode}: {message} (a veriflow bug: please report it)")]
    Internal {
        /// Where.
        vnode: VnodeId,
        /// What.
        message: String,
    },
}

/// Turns a caught panic payload into its message.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

//! The event log of each vnode (SC_v, paper 001 §III; DESIGN.md "The event log").
//!
//! Rules the code keeps:
//!
//! 1. **Set semantics.** Every event has a key (id, kind) ([`Event::key`]). Logging an event
//!    twice changes nothing: a duplicate is dropped inside the open batch at once, and
//!    duplicates that reached different segments are dropped when segments are read back, so
//!    every reader sees each event once and only once.
//! 2. **Group commit.** A vnode appends events to an open batch in memory (microseconds per
//!    task). The batch is sealed into one *segment* when it reaches [`CommitPolicy::max_bytes`],
//!    when it is older than [`CommitPolicy::max_delay`] ([`DEFAULT_MAX_DELAY`] in one process,
//!    [`CLUSTER_MAX_DELAY`] in a cluster job), when the vnode goes idle, or when someone
//!    waits for durability (`exec/vnode.rs` rule 6). One background writer thread puts every
//!    sealed segment in the store and then calls the store's flush explicitly (sled's timer
//!    is off), many segments per flush. Only after the flush returns does it raise each
//!    vnode's *durable watermark*: events with a sequence number at or below it are on stable
//!    storage. A vnode that seals while 64 MiB of segments wait for the writer waits too, so
//!    the backlog, and the memory it takes, stays bounded however long the run.
//! 3. **Segments are framed records** (`codec.rs` rule 1) under key (vnode, segment number),
//!    with the vnode, number, first sequence number and event count inside (`segment.rs`).
//! 4. **Reading never panics.** A segment that fails its checks is an error naming the vnode,
//!    the segment and the byte offset — except a *torn* last segment (shorter than its header
//!    says), which is what a crash mid-write leaves: it is reported in
//!    [`VnodeEvents::torn`] and skipped.
//! 5. **Generations.** The run writes generation 0; the certifier's corrections are written as
//!    later generations beside it (`generation.rs`), and the manifest names the current one.
//! 6. A store error in the writer is kept and returned by every later call: nothing that was
//!    flushed before is lost, and nothing after it is claimed durable.
//! 7. **Fences.** A vnode's log written by incarnation `e` (`LogWriter::vnode_log_at`) first
//!    raises the store's fence for that log to `e`, then reads it; every segment write carries
//!    its incarnation's epoch and a store that keeps fences refuses an older one
//!    (`StoreError::Fenced`), so a zombie can never add to a successor's log.
//! 8. **A gap is corruption.** Segment numbers of a vnode are contiguous (0, 1, 2, ...; a
//!    cluster incarnation at epoch e starts a new run at `e << 40`, [`segment::EPOCH_SHIFT`]),
//!    and so are sequence numbers: each segment's `first_seq` is the end of the one before it
//!    (or below it: overlapping events are duplicates, not a gap). To notice a lost *tail*,
//!    each vnode has a *durable watermark* record (`watermark.rs`): the writer puts it in the
//!    same store batch as the segments it covers (last segment number and sequence end), so it
//!    costs one small record per vnode per flush, not per task. Each watermark is written
//!    once under a key of its own (`wm/<vnode><last segment + 1>`), never overwritten: the
//!    newest readable one counts, and the writer deletes all but the newest two once they are
//!    acknowledged, 32 at a time in one delete (an erasure-coded overwrite cut short can
//!    leave no version readable). A new run writes an empty one for every vnode the manifest
//!    lists ([`Manifest::store_new`]). A reader reports as [`LogError::Missing`], naming vnode
//!    and segment: a missing segment number or sequence range, a log that stops short of its
//!    watermark, a torn segment the watermark covers (it was flushed whole: only a segment
//!    written after the last flush may be torn, rule 4), and a vnode the manifest lists with
//!    no watermark record.
//! 9. **Recovery checkpoints.** Certification needs the whole log, recovery does not: the
//!    writer folds each vnode's segments into its recovery state (`state.rs`: live tasks, the
//!    values they need, counts) and compacts it to the live frontier. It keeps the segments it
//!    stored and folds them a window at a time (4 MiB, or sooner when a checkpoint is due:
//!    [`LogState::fold_window`], `window.rs`), so that a task declared, run and completed
//!    inside one window, which compaction would drop at once, is never built; the other events
//!    are read straight from their encoding by the task path's own decoder (`decode.rs`).
//!    Which task each event is of, the fold learns from notes its vnode took as it appended
//!    it (`window.rs` rule 4), not by reading the bytes again; a stored segment is kept for
//!    its window in its own buffer, not copied.
//!    Every [`LogWriter::set_checkpoint_every`] bytes of segments
//!    (default [`DEFAULT_CHECKPOINT_BYTES`]) stores it as the vnode's checkpoint
//!    (`checkpoint.rs`) in the same store batch as the last segment it covers and that
//!    segment's watermark (so rules 7 and 8 hold for it too). Recovery ([`LogReader::recover_vnode`]) reads the checkpoint and
//!    only the segments after it, checked by rules 4 and 8; a damaged checkpoint, or one ahead
//!    of the watermark, is not used: the whole log is read instead, never a wrong state. So is
//!    one the store cannot rebuild (`StoreError::Unrecoverable`: it is overwritten in place,
//!    and a write of it cut short can leave no version whole).
//! 10. **Large values out of line** (`values.rs`). A value (an output, a program input, an
//!     adopted task's input, a declared task's arguments) of at least [`CommitPolicy::stored_from`] encoded bytes (default
//!     [`STORED_FROM`], 4 KiB) is not copied into its event: the segment holds its digest and
//!     length ([`Payload::Stored`]) and the bytes go once, keyed by their blake3 digest, to the
//!     value store `val/<digest>` of the same store, before the segment, so a durable segment
//!     never names a value that is not durable. A thread's writer streams them: when a vnode
//!     seals the segment that first names a value, the value goes to the writer's value
//!     threads (`writer.rs`, [`VnodeLog::append`]), which store each on its own, several at
//!     once, while vnodes compute and the writer stores and flushes segments; the writer puts
//!     a segment's batch only once the values it awaits are stored (a value file is durable
//!     then, `value_files.rs` rule 2; in any other store, by that batch's flush), and a value
//!     the store refuses stops the log (rule 6). A manual writer stores them in the segment's
//!     own batch, before it. Each value is handed once per process: a vnode that logs a value
//!     handed already (a victim logging what its thief returned, a thief the inputs it
//!     adopted, the same vector written again) names it by digest and length without copying
//!     it, and its segment, sealed later, is stored after it. A task's outputs are encoded and
//!     hashed once, and their bytes moved, not copied, into the log
//!     ([`VnodeLog::append_outlined`]). Values are
//!     put content-addressed ([`veriflow_checkpoint::Store::put_batch_fenced_content`]):
//!     a writer that stores one again (another worker re-running a task) and dies half-way
//!     cannot make the copy already stored unreadable. Smaller values
//!     stay inline ([`Payload::Inline`]). Recovery state, checkpoints and the certifier's track
//!     hold only the reference, and load the bytes when a task needs them; a blob that is
//!     missing, or whose bytes do not hash to its digest, is [`LogError::Value`] naming the
//!     digest. Logs written before values were stored apart (manifest magic `VFM2`), or
//!     before arguments were (`VFM3`), are refused by name.
//!
//! ```
//! use std::sync::Arc;
//! use veriflow_runtime::log::{Event, LogReader, LogWriter, CommitPolicy};
//! use veriflow_runtime::{TaskId, VnodeId, MemoryStore};
//!
//! let store = Arc::new(MemoryStore::default());
//! let writer = LogWriter::start(store.clone(), 1, CommitPolicy::default()).unwrap();
//! let mut log = writer.vnode_log(VnodeId(0)).unwrap();
//! let e = Event::Started { task: TaskId(7), inputs: vec![] };
//! log.append(&e).unwrap();
//! log.append(&e).unwrap(); // a no-op (rule 1)
//! log.sync().unwrap();
//! assert_eq!(log.durable(), 1);
//! writer.shutdown().unwrap();
//! let read = LogReader::new(store).read_vnode(VnodeId(0)).unwrap();
//! assert_eq!(read.events.len(), 1);
//! ```

pub mod checkpoint;
mod decode;
mod encode;
mod event;
mod generation;
mod manifest;
mod outputs;
mod reader;
pub mod segment;
pub mod state;
pub mod values;
pub mod watermark;
mod window;
mod writer;

pub use decode::{
    view_event, DeclaredView, Digests, EventView, Fixed, Ids, OutputView, Outputs, PayloadView,
};
pub(crate) use encode::DeclaredRef;
pub use event::{Declared, Event, EventKey, EventKind, Output, Payload};
pub use generation::write_generation;
pub use manifest::{Manifest, RunStatus, MANIFEST_KEY};
pub use outputs::terminal_outputs;
pub use reader::{
    EncodedSink, LogReader, LogTail, LoggedEvent, RecoveredLog, Repeat, StreamedVnode, TornTail,
    VnodeEvents, MAX_REPEATS,
};
pub use state::LogState;
pub use values::STORED_FROM;
pub use writer::{
    CommitPolicy, LogWriter, VnodeLog, CLUSTER_MAX_DELAY, DEFAULT_CHECKPOINT_BYTES,
    DEFAULT_MAX_DELAY,
};

use crate::ids::VnodeId;
use veriflow_checkpoint::StoreError;

/// Errors of the event log, grouped by what the caller should do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// The store failed (I/O, cannot open). Fatal for this run; flushed data is intact.
    #[error("log store: {0}")]
    Store(String),
    /// A segment failed its checks (rule 4): the log was changed after it was written.
    #[error("log of {vnode} is corrupt in segment {segment} at byte {offset}: {reason}")]
    Corrupt {
        /// The vnode whose log it is.
        vnode: VnodeId,
        /// Segment number.
        segment: u64,
        /// Byte offset inside the segment.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// Part of a vnode's log is missing (rule 8): a gap in its segments, a tail lost below its
    /// durable watermark, or a vnode the manifest lists without a sound watermark record.
    #[error("log of {vnode} is corrupt: {what}")]
    Missing {
        /// The vnode whose log it is.
        vnode: VnodeId,
        /// The first segment known to be missing, when it can be named.
        segment: Option<u64>,
        /// What is missing (naming the segment when known), and what is there around it.
        what: String,
    },
    /// A value the log names is not in the value store, or its bytes do not hash to its digest
    /// (rule 10).
    #[error("logged value {digest} {reason}")]
    Value {
        /// The value's digest (its key in the value store).
        digest: crate::codec::Digest,
        /// What is wrong with it.
        reason: String,
    },
    /// The directory holds no veriflow run (no manifest).
    #[error("no veriflow run here: {0}")]
    NotALog(String),
    /// An event could not be encoded (a value that serde/postcard refuses).
    #[error("cannot encode an event: {0}")]
    Encode(String),
    /// The log writer has stopped (after an error or shutdown).
    #[error("log writer stopped: {0}")]
    Stopped(String),
}

impl From<StoreError> for LogError {
    fn from(e: StoreError) -> Self {
        LogError::Store(e.to_string())
    }
}

#[cfg(test)]
mod tests;

//! The events of a vnode's log (DESIGN.md, "The event log"; paper 001 Fig. 2-3).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::codec::Digest;
use crate::ids::{DataId, TaskId, VnodeId};

/// A task as its parent declared it: everything needed to re-run it from the log, given its
/// input values (the registry maps `name` to code, `args` are its encoded arguments).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Declared {
    /// The task.
    pub task: TaskId,
    /// Its parent; `None` for the root.
    pub parent: Option<TaskId>,
    /// Its spawn index in the parent (0 for the root).
    pub index: u32,
    /// Registered task name.
    pub name: Cow<'static, str>,
    /// Encoded arguments (in memory and in messages always [`Payload::Inline`]; read back
    /// from a log, [`Payload::Stored`] when they went to the value store, rule 10 of
    /// `log/mod.rs`: a task whose arguments carry a large value, such as CG's batch seeds).
    pub args: Payload,
    /// Data it reads, in order.
    pub inputs: Vec<DataId>,
    /// Data it must write or delegate, in order.
    pub outputs: Vec<DataId>,
}

/// A value written to a data object, with the digest of its encoded bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    /// The data object.
    pub data: DataId,
    /// Its encoded value (in memory and in messages always [`Payload::Inline`]; read back
    /// from a log, [`Payload::Stored`] when it went to the value store, rule 10 of `log/mod.rs`).
    pub value: Payload,
    /// blake3 of the value's bytes.
    pub digest: Digest,
}

/// The bytes of a logged value, or where they are (rule 10 of `log/mod.rs`).
///
/// Two payloads are equal when they hold the same bytes wherever those are: inline bytes equal
/// a stored reference whose length and digest are theirs (a task's record read back from a log
/// names its arguments by digest; the oracle's re-run declares them inline).
#[derive(Clone, Serialize, Deserialize)]
pub enum Payload {
    /// The bytes themselves (a small value in a segment; every value in memory).
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A large value: its bytes are in the value store under its digest (`values.rs`).
    Stored {
        /// blake3 of the bytes: the value store's key.
        digest: Digest,
        /// Length of the bytes.
        len: u64,
    },
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Payload::Inline(b) if b.len() <= 32 => write!(f, "Inline({b:?})"),
            Payload::Inline(b) => write!(f, "Inline({} bytes)", b.len()),
            Payload::Stored { digest, len } => write!(f, "Stored({len} bytes, {digest})"),
        }
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Payload::Inline(a), Payload::Inline(b)) => a == b,
            (Payload::Inline(b), Payload::Stored { digest, len })
            | (Payload::Stored { digest, len }, Payload::Inline(b)) => {
                b.len() as u64 == *len && Digest::of(b) == *digest
            }
            (Payload::Stored { digest: a, len: m }, Payload::Stored { digest: b, len: n }) => {
                a == b && m == n
            }
        }
    }
}

impl Eq for Payload {}

impl Payload {
    /// The bytes, when they are here.
    pub fn inline(&self) -> Option<&[u8]> {
        match self {
            Payload::Inline(b) => Some(b),
            Payload::Stored { .. } => None,
        }
    }

    /// The bytes, when they are here (moved out).
    pub fn into_inline(self) -> Option<Vec<u8>> {
        match self {
            Payload::Inline(b) => Some(b),
            Payload::Stored { .. } => None,
        }
    }

    /// Length of the value's bytes.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Inline(b) => b.len() as u64,
            Payload::Stored { len, .. } => *len,
        }
    }

    /// Whether the value has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// blake3 of the value's bytes (hashed when inline).
    pub fn digest(&self) -> Digest {
        match self {
            Payload::Inline(b) => Digest::of(b),
            Payload::Stored { digest, .. } => *digest,
        }
    }

    /// Whether the bytes are in the value store.
    pub fn is_stored(&self) -> bool {
        matches!(self, Payload::Stored { .. })
    }
}

impl From<Vec<u8>> for Payload {
    fn from(b: Vec<u8>) -> Self {
        Payload::Inline(b)
    }
}

/// One event of a vnode's log. Its [`Event::key`] gives the log set semantics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A task was declared (spawned) on this vnode.
    Declared(Declared),
    /// A task started, having read inputs with these digests (in input order).
    Started {
        /// The task.
        task: TaskId,
        /// Digests of the input values read.
        inputs: Vec<Digest>,
    },
    /// A task completed: the outputs it wrote itself and every child it declared (outputs it
    /// delegated are written by a descendant and logged there).
    Completed {
        /// The task.
        task: TaskId,
        /// Values written by the task itself.
        outputs: Vec<Output>,
        /// Children declared, in spawn order.
        children: Vec<TaskId>,
    },
    /// (victim) A ready task was given to `thief`.
    Stolen {
        /// The task.
        task: TaskId,
        /// Where it went.
        thief: VnodeId,
    },
    /// (thief) A task was taken from `victim`, with its input values: this log can re-run it.
    Adopted {
        /// Where it came from.
        victim: VnodeId,
        /// The task's declaration.
        record: Declared,
        /// Encoded input values, in input order.
        inputs: Vec<Payload>,
    },
    /// (victim) An output of a stolen task came back from its thief.
    Returned {
        /// The value.
        output: Output,
    },
    /// A program input, written by the driver before the root ran.
    Input {
        /// The value.
        output: Output,
    },
}

/// The kind of an event: with an id, the key of the log's set semantics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EventKind {
    /// [`Event::Declared`]
    Declared,
    /// [`Event::Started`]
    Started,
    /// [`Event::Completed`]
    Completed,
    /// [`Event::Stolen`]
    Stolen,
    /// [`Event::Adopted`]
    Adopted,
    /// [`Event::Returned`]
    Returned,
    /// [`Event::Input`]
    Input,
}

/// Hashed as one byte: the derived hash writes the variant as an `isize`, which the id hasher
/// (`ids.rs`) mixes in a byte at a time, and every event a vnode logs is hashed once (the
/// open batch's duplicate check, rule 1 of `log/mod.rs`).
impl std::hash::Hash for EventKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u8(*self as u8);
    }
}

/// The key of an event: (task or data id, kind).
pub type EventKey = (u128, EventKind);

impl Event {
    /// The key under which the log stores this event once and only once.
    pub fn key(&self) -> EventKey {
        match self {
            Event::Declared(d) => (d.task.0, EventKind::Declared),
            Event::Started { task, .. } => (task.0, EventKind::Started),
            Event::Completed { task, .. } => (task.0, EventKind::Completed),
            Event::Stolen { task, .. } => (task.0, EventKind::Stolen),
            Event::Adopted { record, .. } => (record.task.0, EventKind::Adopted),
            Event::Returned { output } => (output.data.0, EventKind::Returned),
            Event::Input { output } => (output.data.0, EventKind::Input),
        }
    }

    /// The event's kind.
    pub fn kind(&self) -> EventKind {
        self.key().1
    }
}

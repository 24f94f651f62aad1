//! The checkpoint server's request and response messages (carried by [`crate::wire`]).
//!
//! Rules:
//!
//! 1. Every value a server stores is a fragment ([`crate::erasure`] rule 3); a `Put` or `Batch`
//!    holding anything else is refused whole, so a server never stores bytes it cannot check.
//! 2. A write (`Put`, `Batch`, `Delete`) is answered `Done` only after the server's store has
//!    flushed it to stable storage (for a `--memory` server: after it is in RAM).
//! 3. A `Batch` is applied atomically: after a crash either all of its pairs are there or none.
//! 4. Every fragment returned is checked first; one that fails is returned as `Corrupt`, never as
//!    bytes, so the client counts it as lost and repairs it.
//! 5. `Scan` pages: pairs with keys strictly after `after`, in key order, until the page holds
//!    `max_bytes` or the server's own page limits (pairs and bytes; at least one pair when
//!    there is one); `more` says whether another page may follow (it may be empty). A client
//!    reads a prefix by asking again after the last key until `more` is false or a page is
//!    empty; the server reads only the page from its store.
//! 6. **Versions.** A client opens with `Hello` and needs [`PROTOCOL_VERSION`] or newer: a
//!    server of protocol 1 (before epoch fences) cannot decode it and closes the connection,
//!    which the client reports as an older server (`client.rs` rule 5), never as a crash.
//!    New variants are only ever appended, so an older client's requests still decode.
//! 7. **Fences** (`store/fence.rs` rules 1-2, kept by the server's own store in a key space no
//!    client key reaches, and flushed like any write): `RaiseFence` raises a scope's newest
//!    epoch; `FencedBatch` is a `Batch` applied only if each (scope, epoch) is at or above its
//!    scope's fence, checked and written under one lock so that no fence moves in between,
//!    else refused whole with `Fenced`.
//! 8. **Deletes in one request** (protocol 3): `DeleteBatch` removes every key it names and
//!    is answered `Done` once that is durable (rule 2), one flush for all of them: the log
//!    writer deletes its old watermarks so, not one request and one flush per key.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// The checkpoint protocol's version (rule 6): 2 added `Hello`, `RaiseFence` and `FencedBatch`;
/// 3 added `DeleteBatch` (rule 8).
pub const PROTOCOL_VERSION: u32 = 3;

/// A request from a client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Request {
    /// Liveness check; answered `Done`.
    Ping,
    /// Store one fragment.
    Put { key: ByteBuf, value: ByteBuf },
    /// Store many fragments atomically (rule 3).
    Batch(Vec<(ByteBuf, ByteBuf)>),
    /// Read one fragment.
    Get { key: ByteBuf },
    /// Read a page of fragments under a prefix (rule 5).
    Scan {
        prefix: ByteBuf,
        after: Option<ByteBuf>,
        max_bytes: u64,
    },
    /// Remove one key.
    Delete { key: ByteBuf },
    // --- protocol 2 (rule 6): appended, so protocol-1 requests keep their encoding ---
    /// The client's protocol version; answered `Hello` with the server's.
    Hello { version: u32 },
    /// Raise the fence of `scope` to `epoch` (rule 7); answered `Done` once durable.
    RaiseFence { scope: ByteBuf, epoch: u64 },
    /// A `Batch` applied only if every (scope, epoch) passes its fence (rule 7).
    FencedBatch {
        fences: Vec<(ByteBuf, u64)>,
        pairs: Vec<(ByteBuf, ByteBuf)>,
    },
    // --- protocol 3 (rule 6) ---
    /// Remove every key named (rule 8); answered `Done` once durable.
    DeleteBatch { keys: Vec<ByteBuf> },
}

/// A stored fragment as a server reports it (rule 4).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Slot {
    /// The fragment, checked.
    Present(ByteBuf),
    /// The stored bytes failed their check; why.
    Corrupt(String),
}

/// A server's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Response {
    /// The write is durable (rule 2), or the ping is answered.
    Done,
    /// The fragment under the key, if any.
    Value(Option<Slot>),
    /// A page of a scan.
    Page {
        entries: Vec<(ByteBuf, Slot)>,
        more: bool,
    },
    /// The request was refused or failed on the server; nothing was written.
    Refused(String),
    /// The server's store failed (I/O); the request may or may not have been applied, but
    /// nothing flushed before is lost.
    Failed(String),
    // --- protocol 2 ---
    /// The server's protocol version.
    Hello { version: u32 },
    /// A `FencedBatch` carried an epoch older than its scope's fence; nothing was written.
    Fenced {
        scope: ByteBuf,
        epoch: u64,
        newest: u64,
    },
}

/// One request to a checkpoint server, as a [`crate::strategy::ServerLink`] carries it
/// (opaque outside this crate).
#[derive(Debug, Clone)]
pub struct ServerCall(pub(crate) Request);

/// A checkpoint server's answer to a [`ServerCall`] (opaque outside this crate).
#[derive(Debug, Clone)]
pub struct ServerAnswer(pub(crate) Response);

//! Stable storage for veriflow (papers 003 and 002 §3.2).
//!
//! This crate stores opaque byte records under byte keys and knows nothing of tasks: the
//! runtime's event log encodes its own records (with magic, version and digest) and hands the
//! bytes here. It has:
//!
//! - the [`Store`] trait and its stores: [`SledStore`] (`local:DIR`, the embedded default),
//!   [`MemoryStore`] (`memory`) and [`RemoteStore`] (values coded across checkpoint servers:
//!   `central:`, `replicate:`, `parity:`, `ida:`), all opened from one [`StoreSpec`] by
//!   [`open_store`] (syntax in [`strategy`]);
//! - [`erasure`]: replication, XOR parity and systematic Reed-Solomon behind one small trait,
//!   with self-describing, digested fragments;
//! - [`wire`]: length-limited, encrypted frames (a Noise NNpsk0 handshake on the shared
//!   [`Key`], then ChaCha20-Poly1305 with a nonce per message), generic over the message type,
//!   for the servers here and the cluster transport;
//! - [`hex`]: the workspace's one hex encoder and decoder (keys, digests, signatures);
//! - [`server`] and [`client`]: the `checkpoint-server` process and the blocking client the
//!   remote stores use.
//!
//! Rules every store keeps:
//!
//! 1. `put` and `put_batch` make a value visible to `get`/`scan_prefix` at once, but durable only
//!    after the next successful [`Store::flush`]. A batch is atomic: after a crash either all of
//!    it is there or none. (A [`RemoteStore`] write is durable when it returns: servers flush
//!    before they acknowledge; its `flush` has nothing left to do.)
//! 2. `flush` returns only when everything put before it is on stable storage. Nothing relies on
//!    a background flush (sled's 500 ms timer is switched off).
//! 3. Errors are values: an unreadable directory, a locked database, an I/O failure, an
//!    unreachable or wrongly keyed server is a [`StoreError`], never a panic, and a failed call
//!    loses nothing that was already durable.
//! 4. A read returns the exact bytes written or an error, never other bytes: every fragment is
//!    digested, checked by the server that returns it and again by the reader, and fragments of
//!    different versions are never mixed (erasure rules 4-6).
//! 5. A remote store reads from any M of its M + K servers, names the unreachable servers and
//!    how many it needs when it cannot, and rewrites the fragments it found missing or corrupt
//!    (strategy rules 5-6); `checkpoint-server scrub` does the same for every key.
//! 6. Stores that several processes write keep **epoch fences** (`store/fence.rs`): a write
//!    carrying an epoch older than its scope's newest is refused whole
//!    ([`StoreError::Fenced`]). Sled stores and checkpoint servers keep them durably, out of
//!    every scan; a [`RemoteStore`] raises them on its servers and seals the scope so that a
//!    zombie's write can never become readable in its successor's log (strategy rules 10-11,
//!    with the argument).

pub mod client;
pub mod erasure;
#[doc(hidden)]
pub mod fuzzing;
pub mod hex;
pub mod key;
pub mod launch;
pub mod logging;
mod protocol;
pub mod server;
mod store;
pub mod strategy;
pub mod wire;

pub use key::{Key, KeyError};
pub use protocol::{ServerAnswer, ServerCall, PROTOCOL_VERSION};
pub use store::{
    check_run_name, fill_page, page_start, run_names, Fences, FjallStore, MemoryStore, Namespaced,
    Page, PageLimit, Pair, Pairs, RedbStore, SledStore, Store, StoreError, MAX_RUN_NAME,
};
pub use strategy::{
    open_store, Ack, Layout, RemoteSpec, RemoteStore, ScrubReport, ServerLink, StoreSpec,
};

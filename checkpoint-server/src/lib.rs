//! Stable storage for veriflow.
//!
//! This crate stores opaque byte records under byte keys and knows nothing of tasks: the
//! runtime's event log encodes its own records (with magic, version and digest) and hands the
//! bytes here. For now it holds the [`Store`] trait and two stores:
//!
//! - [`SledStore`]: one sled database in a directory, the embedded default (`local:DIR`);
//! - [`MemoryStore`]: a map in RAM, for tests and for runs that need no durability.
//!
//! Rules every store keeps:
//!
//! 1. `put` and `put_batch` make a value visible to `get`/`scan_prefix` at once, but durable only
//!    after the next successful [`Store::flush`]. A batch is atomic: after a crash either all of
//!    it is there or none.
//! 2. `flush` returns only when everything put before it is on stable storage. Nothing relies on
//!    a background flush (sled's 500 ms timer is switched off).
//! 3. Errors are values: an unreadable directory, a locked database or an I/O failure is a
//!    [`StoreError`], never a panic, and a failed call loses nothing that was already durable.

pub mod client;
pub mod erasure;
pub mod key;
mod protocol;
pub mod server;
mod store;
pub mod strategy;
pub mod wire;

pub use key::{Key, KeyError};
pub use store::{MemoryStore, Pairs, SledStore, Store, StoreError};
pub use strategy::{open_store, Ack, Layout, RemoteSpec, RemoteStore, ScrubReport, StoreSpec};

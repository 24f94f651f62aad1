//! The [`Store`] trait and its implementations (rules in the crate docs).

mod fence;
mod memory;
mod sled_store;

pub use fence::Fences;
pub use memory::MemoryStore;
pub use sled_store::SledStore;

use std::path::PathBuf;

/// What can go wrong in a store, grouped by what the caller should do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    // --- fix the configuration ---
    /// A `--store` spec that does not parse or does not add up (see [`crate::StoreSpec`]).
    #[error("bad store spec: {0}")]
    BadSpec(String),
    /// A checkpoint server refused us: it does not share our key, or it broke the protocol.
    #[error("{0}")]
    Refused(String),
    // --- retry later, when servers are back ---
    /// Too many checkpoint servers are unreachable for this operation.
    #[error("cannot {op}: {} of {total} checkpoint servers unreachable ({}); {need} must be reachable (restart them, then retry)", unreachable.len(), unreachable.join(", "))]
    Unavailable {
        /// What was attempted ("read", "write", ...).
        op: String,
        /// The servers that did not answer, each with why.
        unreachable: Vec<String>,
        /// How many servers the operation needs.
        need: usize,
        /// How many servers the strategy has.
        total: usize,
    },
    // --- data lost beyond what the code can rebuild ---
    /// Every server answered, but fewer than M valid fragments of the newest version exist.
    #[error("value under {key} cannot be rebuilt: {reason}")]
    Unrecoverable {
        /// The key (lossy UTF-8).
        key: String,
        /// What was found.
        reason: String,
    },
    /// The store's directory could not be opened (missing, not a store, locked by another
    /// process, or unreadable). Fatal for this run; nothing was written.
    #[error("cannot open store at {path}: {reason}")]
    Open {
        /// The directory that was asked for.
        path: PathBuf,
        /// What the underlying engine said.
        reason: String,
    },
    /// A read or write failed at the I/O level. Data flushed before is still there.
    #[error("store I/O error: {0}")]
    Io(String),
    /// The engine found its own files corrupt.
    #[error("store is corrupt: {0}")]
    Corruption(String),
    // --- this writer is deposed ---
    /// A write carried an epoch older than its scope's fence: the writer is an incarnation
    /// declared dead (a zombie) and must stop (`store/fence.rs`).
    #[error("write refused: {scope} is at epoch {newest}, this writer is at epoch {epoch} (declared dead)")]
    Fenced {
        /// The scope (a vnode's log prefix, lossy UTF-8).
        scope: String,
        /// The writer's epoch.
        epoch: u64,
        /// The scope's newest epoch.
        newest: u64,
    },
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        match e {
            sled::Error::Corruption { .. } => StoreError::Corruption(e.to_string()),
            other => StoreError::Io(other.to_string()),
        }
    }
}

/// Key-value pairs, as returned by [`Store::scan_prefix`].
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A key-value store of opaque byte records (rules 1-3 in the crate docs).
pub trait Store: Send + Sync + 'static {
    /// Stores `value` under `key`, replacing any previous value; durable after [`Store::flush`].
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError>;
    /// Stores all pairs atomically; durable after [`Store::flush`].
    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError>;
    /// The value under `key`, if any.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Every pair whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError>;
    /// Removes `key`; durable after [`Store::flush`].
    fn delete(&self, key: &[u8]) -> Result<(), StoreError>;
    /// Returns once everything written before is on stable storage.
    fn flush(&self) -> Result<(), StoreError>;
    /// A short human description ("local:/tmp/x", "memory").
    fn describe(&self) -> String;
    /// Raises the epoch fence of `scope` to `epoch` (`store/fence.rs` rule 1): later
    /// [`Store::put_batch_fenced`] writes with an older epoch for it are refused. A store that
    /// one process alone writes keeps no fence (the default): an incarnation there is replaced
    /// only after its thread stopped. A store several processes share must keep them.
    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        let _ = (scope, epoch);
        Ok(())
    }
    /// Stores all pairs atomically if every (scope, epoch) in `fences` is at or above its
    /// scope's fence, else refuses them all with [`StoreError::Fenced`] (rule 2).
    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        let _ = fences;
        self.put_batch(pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(store: &dyn Store) {
        store.put(b"a/1", b"one").unwrap();
        store
            .put_batch(&[
                (b"a/2".to_vec(), b"two".to_vec()),
                (b"b/1".to_vec(), b"x".to_vec()),
            ])
            .unwrap();
        store.flush().unwrap();
        assert_eq!(store.get(b"a/1").unwrap().as_deref(), Some(&b"one"[..]));
        let a = store.scan_prefix(b"a/").unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[1], (b"a/2".to_vec(), b"two".to_vec()));
        store.delete(b"a/1").unwrap();
        assert_eq!(store.get(b"a/1").unwrap(), None);
        assert_eq!(store.scan_prefix(b"a/").unwrap().len(), 1);
    }

    #[test]
    fn memory_store_keeps_rules() {
        exercise(&MemoryStore::default());
    }

    #[test]
    fn sled_store_keeps_rules_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SledStore::open(dir.path()).unwrap();
            exercise(&s);
        }
        let s = SledStore::open(dir.path()).unwrap();
        assert_eq!(s.get(b"a/2").unwrap().as_deref(), Some(&b"two"[..]));
        assert_eq!(s.get(b"a/1").unwrap(), None);
    }

    #[test]
    fn opening_a_file_as_a_store_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("plain");
        std::fs::write(&f, b"not a database").unwrap();
        let err = SledStore::open(&f).expect_err("must fail");
        assert!(matches!(err, StoreError::Open { .. }), "{err}");
    }
}

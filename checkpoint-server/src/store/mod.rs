//! The [`Store`] trait and its implementations (rules in the crate docs).
//!
//! # Choosing the engine (issue 18 point 7)
//!
//! Three engines keep the same rules behind [`Store`]: [`SledStore`] (`local:DIR`, the
//! default), [`RedbStore`] (`redb:DIR`) and [`FjallStore`] (`fjall:DIR`). They were judged
//! with the log's own workload and crash tests; **sled stays the default**, because neither
//! other engine is clearly better for the log:
//!
//! - **CPU and time** (`paper store-engines`, bench/results/store_engines.md; 2 shared cores,
//!   load average ~10-16, medians of 3 interleaved knary runs of 436,906 tasks): logging costs
//!   5.15 µs/task with sled, 5.22 with redb, 5.26 with fjall (the log's own encoding dominates;
//!   the differences are below the noise); wall S1/S0 6.2 (sled), 7.3 (redb), 6.9 (fjall).
//! - **Memory**: peak RSS 159 MiB (sled), 135 (redb), 123 (fjall); with a recovery at 1.06 M
//!   tasks 432, 412, 395 MiB. fjall is lighter, by less than a fifth.
//! - **Disk**: 309 bytes/task (sled), 470 (redb: copy-on-write pages, non-durable commits
//!   keep freed pages until a durable one), 207 (fjall: LZ4 and blob files).
//! - **Reading back**: all read the log in ~0.3 s; opening read-only costs sled a copy
//!   (0.35 s), fjall a copy and a journal replay (1.0 s), redb nothing (a real read-only
//!   mode). Recovery of one vnode at 1.06 M tasks: 669 ms (sled), 2010 (redb), 1379 (fjall),
//!   medians of runs that varied 5x under the load.
//! - **Crashes** (`tests/store_engines_crash.rs`: 20 seeded SIGKILLs per engine of a child
//!   writing log-shaped batches): every flushed batch was found whole on all three. Damage
//!   (`engine_tests.rs`: each file truncated or one byte flipped): no engine panics through
//!   the guard, but **redb returned a flipped byte of a value as data** (its page checksums
//!   are checked only by `check_integrity`, not on read); the log's blake3 per record still
//!   catches it, sled and fjall report it themselves. fjall's journal recovery, like sled's,
//!   cuts at the first bad entry, so both need the flush record (`engine.rs` rule 3).
//!
//! fjall would be the candidate (less disk and memory, maintained, an LSM made for appends);
//! switching needs a gain that shows above this machine's noise, and every place that names
//! [`SledStore`] (the embedded default in `src/app.rs`, the bench and test helpers) to take
//! the spec's engine instead.
//!
//! **A checkpoint server is where the gain shows** (session 35). Its load is many small
//! flushes from many writers: in a `paper cluster` S1 run (4 workers, each sealing ~60
//! segments, mostly for output commit and the 100 ms delay: ~300 flushes in 3 s), sled's
//! flush hands each write to its thread pool, whose `notify_all` wakes every idle pool
//! thread. The server's committer and sled's threads took 81-108 ms of CPU a run on sled,
//! 31-36 on fjall, 65-92 on redb (perf at 1999 Hz over the job, 3 interleaved runs each, load
//! 6-7). So `checkpoint-server --data` takes `fjall:DIR` and `redb:DIR` beside a plain (sled)
//! `DIR`, and `cluster` starts its servers on fjall (`--server-engine`).

mod engine;
#[cfg(test)]
mod engine_tests;
mod fence;
mod fjall_store;
mod memory;
mod namespace;
mod redb_store;
mod sled_store;
mod value_files;

pub use fence::Fences;
pub use fjall_store::FjallStore;
pub use memory::MemoryStore;
pub use namespace::{check_run_name, run_names, Namespaced, MAX_RUN_NAME};
pub use redb_store::RedbStore;
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
    /// A write to a store opened read-only (`inspect`, `certify`: a bug of the caller).
    #[error("store at {} was opened read-only", .0.display())]
    ReadOnly(PathBuf),
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
pub type Pairs = Vec<Pair>;
/// One key and its value.
pub type Pair = (Vec<u8>, Vec<u8>);

/// How much one page of [`Store::scan_page`] may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLimit {
    /// At most this many pairs (at least 1 is used).
    pub max_keys: usize,
    /// At most this many bytes of keys and values, except that a page holds at least one pair
    /// when there is one, however large.
    pub max_bytes: u64,
}

/// One page of a prefix scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// Pairs in key order.
    pub pairs: Pairs,
    /// Whether pairs may follow the last one (ask again with it as `after`). A page cut at
    /// `max_keys` says `true` without looking further, so the next page may be empty.
    pub more: bool,
}

/// Fills a page from pairs in key order that all start with the prefix and follow `after`
/// (the shared part of every [`Store::scan_page`]): reads one pair past the page at most.
pub fn fill_page(
    pairs: impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>>,
    limit: PageLimit,
) -> Result<Page, StoreError> {
    let max_keys = limit.max_keys.max(1);
    let mut page = Page::default();
    let mut bytes = 0u64;
    for pair in pairs {
        let (k, v) = pair?;
        let len = (k.len() + v.len()) as u64;
        if !page.pairs.is_empty() && bytes.saturating_add(len) > limit.max_bytes {
            page.more = true;
            break;
        }
        bytes = bytes.saturating_add(len);
        page.pairs.push((k, v));
        if page.pairs.len() >= max_keys {
            page.more = true;
            break;
        }
    }
    Ok(page)
}

/// Where a page's range starts: keys strictly after `after`, or from `prefix` if `after` sorts
/// before it.
pub fn page_start<'a>(prefix: &'a [u8], after: Option<&'a [u8]>) -> std::ops::Bound<&'a [u8]> {
    match after {
        Some(a) if a >= prefix => std::ops::Bound::Excluded(a),
        _ => std::ops::Bound::Included(prefix),
    }
}

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
    /// One page of [`Store::scan_prefix`]: the pairs under `prefix` with keys strictly after
    /// `after`, in key order, within `limit`. The default filters a whole `scan_prefix`;
    /// [`SledStore`] and [`MemoryStore`] read only the page (and one pair past it at most), which
    /// is what a checkpoint server serves scans with.
    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: PageLimit,
    ) -> Result<Page, StoreError> {
        let all = self.scan_prefix(prefix)?;
        fill_page(
            all.into_iter()
                .filter(|(k, _)| after.is_none_or(|a| k.as_slice() > a))
                .map(Ok),
            limit,
        )
    }
    /// The keys under `prefix` strictly after `after`, in key order, at most `max_keys` (at
    /// least 1), and whether more may follow. The default reads pages of pairs and drops the
    /// values; [`SledStore`] and [`MemoryStore`] copy keys only.
    fn scan_keys(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        max_keys: usize,
    ) -> Result<(Vec<Vec<u8>>, bool), StoreError> {
        let page = self.scan_page(
            prefix,
            after,
            PageLimit {
                max_keys,
                max_bytes: 64 << 20,
            },
        )?;
        Ok((page.pairs.into_iter().map(|(k, _)| k).collect(), page.more))
    }
    /// The pair with the greatest key under `prefix` that reads (a key that reads as absent
    /// is passed over), if any. The default takes the last pair of [`Store::scan_prefix`]; a
    /// store that decodes each value ([`crate::RemoteStore`]) decodes from the greatest key
    /// down and stops at the first that reads, so an older key it cannot read now (too few of
    /// its servers reachable) is no error.
    fn last_under(&self, prefix: &[u8]) -> Result<Option<Pair>, StoreError> {
        Ok(self.scan_prefix(prefix)?.pop())
    }
    /// Removes `key`; durable after [`Store::flush`].
    fn delete(&self, key: &[u8]) -> Result<(), StoreError>;
    /// Removes every key of `keys` (not atomically: after a crash some may remain); durable
    /// after [`Store::flush`]. The default deletes them one by one; a remote store sends each
    /// server one request for all of them (protocol rule 8), answered after one flush.
    fn delete_batch(&self, keys: &[Vec<u8>]) -> Result<(), StoreError> {
        keys.iter().try_for_each(|k| self.delete(k))
    }
    /// Returns once everything written before is on stable storage.
    fn flush(&self) -> Result<(), StoreError>;
    /// A short human description ("local:/tmp/x", "memory").
    fn describe(&self) -> String;
    /// What a reader should know when values came back from fewer than all their copies or
    /// fragments (a remote strategy with servers down or fragments missing: still whole, but
    /// one fault nearer to losing data); `None` for a store that keeps one copy, or when every
    /// read was whole.
    fn degraded(&self) -> Option<String> {
        None
    }
    /// Raises the epoch fence of `scope` to `epoch` (`store/fence.rs` rule 1): later
    /// [`Store::put_batch_fenced`] writes with an older epoch for it are refused. A store that
    /// one process alone writes keeps no fence (the default): an incarnation there is replaced
    /// only after its thread stopped. A store several processes share must keep them.
    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        let _ = (scope, epoch);
        Ok(())
    }
    /// Whether this store keeps fences (`store/fence.rs`); a checkpoint server refuses fence
    /// requests over a store that does not, rather than accept every write.
    fn keeps_fences(&self) -> bool {
        false
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
    /// [`Store::put_batch_fenced`] of `pairs` whose first `content` pairs are
    /// content-addressed: each key is derived from its value's bytes (the log's value store),
    /// so any number of writers may write it again, and one that dies half-way through must
    /// not leave a copy stored before unreadable. A store whose writes of one key can differ
    /// makes these byte for byte the same every time (the remote strategies: `strategy.rs`
    /// rule 13); one that replaces a value atomically needs nothing more.
    fn put_batch_fenced_content(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
        content: usize,
    ) -> Result<(), StoreError> {
        let _ = content;
        self.put_batch_fenced(fences, pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn exercise(store: &dyn Store) {
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

    /// Pages through `prefix` and checks the pages join up to `scan_prefix`.
    fn pages_join_up(store: &dyn Store, prefix: &[u8], limit: PageLimit) -> usize {
        let mut got = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        let mut pages = 0;
        loop {
            let page = store.scan_page(prefix, after.as_deref(), limit).unwrap();
            pages += 1;
            assert!(page.pairs.len() <= limit.max_keys.max(1));
            let bytes: usize = page.pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
            assert!(page.pairs.len() <= 1 || bytes as u64 <= limit.max_bytes);
            after = page.pairs.last().map(|(k, _)| k.clone());
            got.extend(page.pairs);
            if !page.more || after.is_none() {
                break;
            }
        }
        assert_eq!(got, store.scan_prefix(prefix).unwrap());
        pages
    }

    pub(super) fn exercise_pages(store: &dyn Store) {
        for i in 0u32..50 {
            store
                .put(
                    &[b"p/", &i.to_be_bytes()[..]].concat(),
                    &vec![7; i as usize * 10],
                )
                .unwrap();
        }
        store.put(b"a", b"before").unwrap();
        store.put(b"q", b"after").unwrap();
        for limit in [
            PageLimit {
                max_keys: 1,
                max_bytes: u64::MAX,
            },
            PageLimit {
                max_keys: 7,
                max_bytes: u64::MAX,
            },
            PageLimit {
                max_keys: 1000,
                max_bytes: 100,
            },
            PageLimit {
                max_keys: 0,
                max_bytes: 0,
            },
        ] {
            assert!(pages_join_up(store, b"p/", limit) > 1, "{limit:?}");
            pages_join_up(store, b"", limit);
            pages_join_up(store, b"none", limit);
        }
        // Key pages join up to the keys of the scan, whatever the page size.
        for prefix in [&b"p/"[..], b"", b"none"] {
            for max in [0, 1, 7, 1000] {
                let mut got = Vec::new();
                let mut after: Option<Vec<u8>> = None;
                loop {
                    let (keys, more) = store.scan_keys(prefix, after.as_deref(), max).unwrap();
                    assert!(keys.len() <= max.max(1));
                    after = keys.last().cloned();
                    got.extend(keys);
                    if !more || after.is_none() {
                        break;
                    }
                }
                let want: Vec<Vec<u8>> = store
                    .scan_prefix(prefix)
                    .unwrap()
                    .into_iter()
                    .map(|(k, _)| k)
                    .collect();
                assert_eq!(got, want, "prefix {prefix:?}, {max} keys a page");
            }
        }
        // `after` before the prefix starts at the prefix; after it, nothing.
        let l = PageLimit {
            max_keys: 1,
            max_bytes: u64::MAX,
        };
        assert_eq!(
            store.scan_page(b"p/", Some(b"a"), l).unwrap().pairs[0].0,
            [b"p/", &0u32.to_be_bytes()[..]].concat()
        );
        assert!(store
            .scan_page(b"p/", Some(b"p0"), l)
            .unwrap()
            .pairs
            .is_empty());
    }

    #[test]
    fn memory_store_keeps_rules() {
        exercise(&MemoryStore::default());
        exercise_pages(&MemoryStore::default());
    }

    #[test]
    fn sled_store_pages_join_up() {
        let dir = tempfile::tempdir().unwrap();
        exercise_pages(&SledStore::open(dir.path()).unwrap());
    }

    /// A store with only the trait's default `scan_page`.
    struct Plain(MemoryStore);
    impl Store for Plain {
        fn put(&self, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
            self.0.put(k, v)
        }
        fn put_batch(&self, p: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
            self.0.put_batch(p)
        }
        fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
            self.0.get(k)
        }
        fn scan_prefix(&self, p: &[u8]) -> Result<Pairs, StoreError> {
            self.0.scan_prefix(p)
        }
        fn delete(&self, k: &[u8]) -> Result<(), StoreError> {
            self.0.delete(k)
        }
        fn flush(&self) -> Result<(), StoreError> {
            Ok(())
        }
        fn describe(&self) -> String {
            "plain".into()
        }
    }

    #[test]
    fn the_default_scan_page_agrees() {
        exercise_pages(&Plain(MemoryStore::default()));
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

    /// Rule 2 of `sled_store.rs`: a database holding fewer flushes than its flush record says
    /// lost flushed writes (what sled's recovery does after a damaged record) and is corrupt,
    /// for a writer and a reader alike; a missing flush record beside a flushed database too.
    #[test]
    fn a_sled_store_that_lost_flushed_writes_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join(SledStore::FLUSH_FILE);
        let first = {
            let s = SledStore::open(dir.path()).unwrap();
            s.put(b"k", b"v").unwrap();
            s.flush().unwrap();
            std::fs::read(&record).unwrap()
        };
        {
            let s = SledStore::open(dir.path()).unwrap();
            s.flush().unwrap();
        }
        assert_ne!(
            std::fs::read(&record).unwrap(),
            first,
            "each flush is recorded"
        );
        assert!(SledStore::open_read_only(dir.path()).is_ok());
        // A damaged record.
        let mut bumped = first.clone();
        bumped[4] = bumped[4].wrapping_add(1);
        std::fs::write(&record, &bumped).unwrap();
        for open in [SledStore::open_read_only, SledStore::open] {
            let err = open(dir.path()).expect_err("a damaged flush record");
            assert!(matches!(err, StoreError::Corruption(_)), "{err}");
        }
        // A sound record of more flushes than the database holds: what is left after sled's
        // recovery dropped the writes that followed a damaged record.
        std::fs::write(&record, encode_for_test(1000)).unwrap();
        for open in [SledStore::open_read_only, SledStore::open] {
            let err = open(dir.path()).expect_err("flushed writes lost");
            assert!(err.to_string().contains("lost writes"), "{err}");
        }
        std::fs::remove_file(&record).unwrap();
        let err = SledStore::open_read_only(dir.path()).expect_err("record missing");
        assert!(err.to_string().contains("missing"), "{err}");
    }

    /// Rule 1 of `sled_store.rs`: a read-only store reads a copy, refuses writes, and leaves
    /// the directory as it was.
    #[test]
    fn a_read_only_sled_store_never_writes() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = SledStore::open(dir.path()).unwrap();
            exercise(&s);
        }
        let before = snapshot(dir.path());
        {
            let s = SledStore::open_read_only(dir.path()).unwrap();
            assert_eq!(s.get(b"a/2").unwrap().as_deref(), Some(&b"two"[..]));
            assert!(matches!(s.put(b"x", b"y"), Err(StoreError::ReadOnly(_))));
            assert!(matches!(s.delete(b"a/2"), Err(StoreError::ReadOnly(_))));
            s.flush().unwrap();
        }
        assert_eq!(snapshot(dir.path()), before);
        let missing = dir.path().join("nope");
        assert!(SledStore::open_read_only(&missing).is_err());
        assert!(SledStore::open_existing(&missing).is_err());
        assert!(!missing.exists());
    }

    pub(super) fn snapshot(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    out.push((e.path(), std::fs::read(e.path()).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    pub(super) fn encode_for_test(n: u64) -> Vec<u8> {
        let mut out = b"VFFL".to_vec();
        out.extend_from_slice(&n.to_le_bytes());
        let digest = blake3::hash(&out);
        out.extend_from_slice(&digest.as_bytes()[..8]);
        out
    }
}

//! A store in one fjall database (`fjall:DIR`): an LSM tree with a write-ahead journal, its
//! files in `DIR/fjall/`, judged against sled in mod.rs ("Choosing the engine").
//!
//! Rules this file keeps (sled_store.rs's, where they apply; rules 1-3 of `engine.rs` too):
//!
//! 1. **Durability only at `flush`.** The database is opened with `manual_journal_persist`:
//!    a batch is one journal entry (atomic: a torn entry is dropped at recovery) written to a
//!    buffer, and only `flush` (`persist(SyncAll)`: write out and fsync the journal) makes it
//!    durable.
//! 2. **Readers open a copy.** fjall has no read-only mode (an open takes a lock file and
//!    replays the journal, writing tables), so [`FjallStore::open_read_only`] copies the
//!    directory as sled_store.rs rule 1 does and opens the copy.
//! 3. **Fences persist** in the keyspace `veriflow.fences`, apart from the data keyspace every
//!    scan reads; a fenced batch checks them under the lock every raise takes.
//! 4. The data keyspace separates values of 1 KiB and more into blob files (fjall's key-value
//!    separation): the log's values are ~64 KiB segments, which compaction then never rewrites.
//! 5. **The journal is not compressed.** fjall compresses journal entries of 4 KiB and more
//!    with lz4 by default; a log segment is mostly 16-byte ids and 32-byte digests, and that
//!    compression was ~9 % of the committer's CPU in `paper cluster` (perf, 3 runs). Entries
//!    carry their own compression tag, so journals written compressed still read.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use fjall::{KeyspaceCreateOptions, KvSeparationOptions, PersistMode};

use super::engine::{self, guarded, FlushRecord, Poison};
use super::fence::admit_one;
use super::sled_store::copy_store;
use super::{fill_page, page_start, Page, PageLimit, Pairs, Store, StoreError};

/// The engine's folder inside the store's directory.
pub(super) const FJALL_DIR: &str = "fjall";
pub(super) const DATA: &str = "data";
const META: &str = "veriflow.meta";
const FENCES: &str = "veriflow.fences";
const FLUSHES_KEY: &[u8] = b"flushes";
/// fjall's block cache, 64 MiB as sled_store.rs's, for the same reason.
const CACHE_BYTES: u64 = 64 << 20;
const ENGINE: &str = "fjall";

/// A fjall database in one directory.
#[derive(Clone)]
pub struct FjallStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FjallStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

struct Inner {
    db: fjall::Database,
    data: fjall::Keyspace,
    meta: fjall::Keyspace,
    fences: fjall::Keyspace,
    path: PathBuf,
    /// `None` for a read-only store.
    flushes: Option<Mutex<FlushRecord>>,
    /// The copy a read-only store reads (rule 2), removed after the database is closed
    /// (fields drop in order).
    _copy: Option<tempfile::TempDir>,
    poison: Poison,
    fence_lock: Mutex<()>,
}

fn ferr(e: impl Into<fjall::Error>) -> StoreError {
    match e.into() {
        e @ (fjall::Error::JournalRecovery(_)
        | fjall::Error::InvalidTrailer
        | fjall::Error::InvalidTag(_)
        | fjall::Error::Decompress(_)
        | fjall::Error::InvalidVersion(_)
        | fjall::Error::Unrecoverable) => StoreError::Corruption(format!("fjall: {e}")),
        fjall::Error::Storage(lsm_err) => match lsm_err {
            fjall::LsmError::Io(io) => StoreError::Io(format!("fjall: {io}")),
            other => StoreError::Corruption(format!("fjall: {other}")),
        },
        other => StoreError::Io(format!("fjall: {other}")),
    }
}

fn open_err(path: &Path, reason: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn require_store(path: &Path) -> Result<(), StoreError> {
    if !path.join(FJALL_DIR).is_dir() {
        return Err(open_err(
            path,
            if path.exists() {
                format!("no fjall store here (no {FJALL_DIR}/)")
            } else {
                "no store here (no such directory)".to_string()
            },
        ));
    }
    Ok(())
}

/// Opens the database in `dir` (the store's directory or its copy); `shown` is the path named
/// in errors.
fn open_db(
    dir: &Path,
    shown: &Path,
) -> Result<(fjall::Database, [fjall::Keyspace; 3]), StoreError> {
    guarded(ENGINE, "open", || {
        let db = fjall::Database::builder(dir.join(FJALL_DIR))
            .manual_journal_persist(true)
            .journal_compression(fjall::CompressionType::None)
            .cache_size(CACHE_BYTES)
            .open()
            .map_err(|e| match ferr(e) {
                StoreError::Corruption(m) => {
                    StoreError::Corruption(format!("{}: {m}", shown.display()))
                }
                other => open_err(shown, other),
            })?;
        let data = db
            .keyspace(DATA, || {
                KeyspaceCreateOptions::default()
                    .with_kv_separation(Some(KvSeparationOptions::default()))
            })
            .map_err(ferr)?;
        let meta = db
            .keyspace(META, KeyspaceCreateOptions::default)
            .map_err(ferr)?;
        let fences = db
            .keyspace(FENCES, KeyspaceCreateOptions::default)
            .map_err(ferr)?;
        Ok((db, [data, meta, fences]))
    })
}

fn counter(meta: &fjall::Keyspace) -> Result<u64, StoreError> {
    guarded(ENGINE, "read", || {
        let v = meta.get(FLUSHES_KEY).map_err(ferr)?;
        engine::decode_counter(v.as_deref())
    })
}

impl FjallStore {
    /// Opens (or creates) the store in directory `path` for writing.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if path.exists() && !path.is_dir() {
            return Err(open_err(path, "not a directory"));
        }
        std::fs::create_dir_all(path).map_err(|e| open_err(path, e))?;
        let (db, [data, meta, fences]) = open_db(path, path)?;
        let record = FlushRecord::open(path, || counter(&meta))?;
        Ok(Self::wrap(
            db,
            [data, meta, fences],
            path,
            Some(record),
            None,
        ))
    }

    /// Opens an existing store for writing (`--resume`), and fails if there is none. A copy is
    /// checked first, so damage is reported before fjall's recovery touches the original.
    pub fn open_existing(path: &Path) -> Result<Self, StoreError> {
        require_store(path)?;
        drop(Self::open_read_only(path)?);
        Self::open(path)
    }

    /// Opens an existing store for reading only, on a copy (rule 2).
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        require_store(path)?;
        let copy = copy_store(path)?;
        let (db, [data, meta, fences]) = open_db(copy.path(), path)?;
        engine::check(copy.path(), || counter(&meta)).map_err(|e| match e {
            StoreError::Corruption(m) => StoreError::Corruption(m.replace(
                &copy.path().display().to_string(),
                &path.display().to_string(),
            )),
            other => other,
        })?;
        Ok(Self::wrap(db, [data, meta, fences], path, None, Some(copy)))
    }

    fn wrap(
        db: fjall::Database,
        [data, meta, fences]: [fjall::Keyspace; 3],
        path: &Path,
        flushes: Option<FlushRecord>,
        copy: Option<tempfile::TempDir>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
                data,
                meta,
                fences,
                path: path.to_path_buf(),
                flushes: flushes.map(Mutex::new),
                _copy: copy,
                poison: Poison::default(),
                fence_lock: Mutex::new(()),
            }),
        }
    }

    /// The directory of this store.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn write<T>(
        &self,
        what: &str,
        f: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if self.inner.flushes.is_none() {
            return Err(StoreError::ReadOnly(self.inner.path.clone()));
        }
        self.inner
            .poison
            .write(&self.inner.path, || guarded(ENGINE, what, f))
    }

    fn fence_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .fence_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn fence_of(&self, scope: &[u8]) -> Result<Option<u64>, StoreError> {
        match self.inner.fences.get(scope).map_err(ferr)? {
            Some(v) => Ok(Some(engine::decode_fence(scope, &v)?)),
            None => Ok(None),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.poison.is_poisoned() {
            return;
        }
        // fjall persists on drop; a read-only copy is thrown away, so spare it the fsync.
        let _ = guarded(ENGINE, "close", || {
            if self.flushes.is_some() {
                self.db.persist(PersistMode::SyncAll).map_err(ferr)?;
            }
            Ok(())
        });
    }
}

fn pairs_of(
    iter: fjall::Iter,
    prefix: &[u8],
) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + '_ {
    iter.map(|g| {
        g.into_inner()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .map_err(ferr)
    })
    .take_while(move |r| r.as_ref().map_or(true, |(k, _)| k.starts_with(prefix)))
}

impl Store for FjallStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.put_batch(&[(key.to_vec(), value.to_vec())])
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        self.write("put_batch", || {
            let mut batch = self.inner.db.batch().durability(None);
            for (k, v) in pairs {
                batch.insert(&self.inner.data, k.as_slice(), v.as_slice());
            }
            batch.commit().map_err(ferr)
        })
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        guarded(ENGINE, "get", || {
            Ok(self.inner.data.get(key).map_err(ferr)?.map(|v| v.to_vec()))
        })
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        guarded(ENGINE, "scan_prefix", || {
            pairs_of(self.inner.data.prefix(prefix), prefix).collect()
        })
    }

    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: PageLimit,
    ) -> Result<Page, StoreError> {
        let range = (page_start(prefix, after), Bound::Unbounded);
        guarded(ENGINE, "scan_page", || {
            fill_page(
                pairs_of(self.inner.data.range::<&[u8], _>(range), prefix),
                limit,
            )
        })
    }

    fn scan_keys(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        max_keys: usize,
    ) -> Result<(Vec<Vec<u8>>, bool), StoreError> {
        let range = (page_start(prefix, after), Bound::Unbounded);
        let max = max_keys.max(1);
        guarded(ENGINE, "scan_keys", || {
            let mut keys = Vec::new();
            for g in self.inner.data.range::<&[u8], _>(range) {
                let k = g.key().map_err(ferr)?;
                if !k.starts_with(prefix) {
                    return Ok((keys, false));
                }
                keys.push(k.to_vec());
                if keys.len() >= max {
                    return Ok((keys, true));
                }
            }
            Ok((keys, false))
        })
    }

    fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        self.write("remove", || {
            let mut batch = self.inner.db.batch().durability(None);
            batch.remove(&self.inner.data, key);
            batch.commit().map_err(ferr)
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        let Some(flushes) = &self.inner.flushes else {
            return Ok(());
        };
        let mut record = flushes.lock().unwrap_or_else(|p| p.into_inner());
        let next = record.count + 1;
        self.write("flush", || {
            let mut batch = self.inner.db.batch().durability(None);
            batch.insert(&self.inner.meta, FLUSHES_KEY, &next.to_le_bytes()[..]);
            batch.commit().map_err(ferr)?;
            self.inner.db.persist(PersistMode::SyncAll).map_err(ferr)?;
            record.record(next)
        })
    }

    fn describe(&self) -> String {
        format!("fjall:{}", self.inner.path.display())
    }

    fn keeps_fences(&self) -> bool {
        true
    }

    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        let _held = self.fence_lock();
        self.write("raise_fence", || {
            if self.fence_of(scope)?.is_none_or(|n| epoch > n) {
                let mut batch = self.inner.db.batch().durability(None);
                batch.insert(&self.inner.fences, scope, &epoch.to_le_bytes()[..]);
                batch.commit().map_err(ferr)?;
            }
            Ok(())
        })
    }

    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        if self.inner.flushes.is_none() {
            return Err(StoreError::ReadOnly(self.inner.path.clone()));
        }
        self.inner.poison.check(&self.inner.path)?;
        let _held = self.fence_lock(); // rule 3: from the check to the write
        guarded(ENGINE, "check fences", || {
            for (scope, epoch) in fences {
                admit_one(scope, *epoch, self.fence_of(scope)?)?;
            }
            Ok(())
        })?;
        self.put_batch(pairs)
    }
}

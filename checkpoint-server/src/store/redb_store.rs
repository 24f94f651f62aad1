//! A store in one redb file (`redb:DIR`): the file `DIR/veriflow.redb`, a B-tree with
//! copy-on-write pages and checksums, judged against sled in mod.rs ("Choosing the engine").
//!
//! Rules this file keeps (sled_store.rs's, where they apply; rules 1-3 of `engine.rs` too):
//!
//! 1. **Durability only at `flush`.** `put`, `put_batch` and `delete` commit a write
//!    transaction with `Durability::None` (visible at once, atomic, not synced); `flush`
//!    commits one with `Durability::Immediate`, which makes every earlier commit durable (redb's
//!    docs: a `None` commit "will not be persisted to disk unless followed by a commit with
//!    `Durability::Immediate`"). After a crash the file is as of the last flush: a batch is all
//!    there or not at all.
//! 2. **Readers never write.** redb has a real read-only mode: [`RedbStore::open_read_only`]
//!    opens the file with `O_RDONLY` (a shared lock) and reads it in place. That mode refuses
//!    a file that needs recovery (its writer was killed) rather than repair it, and a file a
//!    writer has open: writers use `ConcurrencyMode::ExclusiveWriter`, because redb refuses
//!    non-durable commits (rule 1) in the modes that let readers follow a writer. In those two
//!    cases, and only then, the directory is copied to a temporary directory and the copy is
//!    opened and repaired there, as sled_store.rs rule 1 does always (a copy taken while a
//!    writer commits is what a crash at that moment leaves, which redb recovers).
//! 3. **Fences persist** in the table `veriflow.fences`, apart from the data table every scan
//!    reads; a fenced batch checks them in the same write transaction that writes it.
//! 4. Every call runs under `engine::guarded` (redb's debug builds panic on damaged pages),
//!    and the first failed write poisons the store.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use redb::{Durability, ReadableDatabase as _, ReadableTable as _, TableDefinition, TableError};

use super::engine::{self, guarded, FlushRecord, Poison};
use super::fence::admit_one;
use super::sled_store::copy_store;
use super::{fill_page, page_start, Page, PageLimit, Pairs, Store, StoreError};

/// The file inside the store's directory.
pub(super) const REDB_FILE: &str = "veriflow.redb";
const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("data");
const META: TableDefinition<&[u8], &[u8]> = TableDefinition::new("veriflow.meta");
const FENCES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("veriflow.fences");
const FLUSHES_KEY: &[u8] = b"flushes";
/// redb's page cache; its default is 1 GiB. 64 MiB as sled_store.rs's, for the same reason
/// (a log is written once and read back once).
const CACHE_BYTES: usize = 64 << 20;
const ENGINE: &str = "redb";

/// A redb database in one directory.
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

enum Db {
    Write(redb::Database),
    Read(redb::ReadOnlyDatabase),
}

struct Inner {
    db: Db,
    path: PathBuf,
    /// `None` for a read-only store.
    flushes: Option<Mutex<FlushRecord>>,
    /// The repaired copy a read-only store reads (rule 2), if it needed one.
    _copy: Option<tempfile::TempDir>,
    poison: Poison,
    fence_lock: Mutex<()>,
}

fn rerr(e: impl Into<redb::Error>) -> StoreError {
    match e.into() {
        redb::Error::Corrupted(m) => StoreError::Corruption(format!("redb: {m}")),
        other => StoreError::Io(format!("redb: {other}")),
    }
}

fn builder() -> redb::Builder {
    let mut b = redb::Builder::new();
    b.set_cache_size(CACHE_BYTES)
        .set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter);
    b
}

fn open_err(path: &Path, reason: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn require_store(path: &Path) -> Result<(), StoreError> {
    if !path.join(REDB_FILE).is_file() {
        return Err(open_err(
            path,
            if path.exists() {
                format!("no redb store here (no {REDB_FILE})")
            } else {
                "no store here (no such directory)".to_string()
            },
        ));
    }
    Ok(())
}

/// Maps an open error: a damaged file is corruption, anything else an open error.
fn open_failed(path: &Path, e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(m)) => StoreError::Corruption(
            format!("{}: redb found its file corrupt: {m}", path.display()),
        ),
        other => open_err(path, other),
    }
}

impl RedbStore {
    /// Opens (or creates) the store in directory `path` for writing.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if path.exists() && !path.is_dir() {
            return Err(open_err(path, "not a directory"));
        }
        std::fs::create_dir_all(path).map_err(|e| open_err(path, e))?;
        let db = guarded(ENGINE, "open", || {
            builder()
                .create(path.join(REDB_FILE))
                .map_err(|e| open_failed(path, e))
        })?;
        // The tables exist from the first open on, so readers need not tell "absent" apart.
        let in_db = guarded(ENGINE, "open", || {
            let mut txn = db.begin_write().map_err(rerr)?;
            txn.set_durability(Durability::None).map_err(rerr)?;
            let n = {
                txn.open_table(DATA).map_err(rerr)?;
                txn.open_table(FENCES).map_err(rerr)?;
                let meta = txn.open_table(META).map_err(rerr)?;
                let v = meta.get(FLUSHES_KEY).map_err(rerr)?;
                engine::decode_counter(v.as_ref().map(|g| g.value()))?
            };
            txn.commit().map_err(rerr)?;
            Ok(n)
        })?;
        let record = FlushRecord::open(path, || Ok(in_db))?;
        Ok(Self::wrap(Db::Write(db), path, Some(record), None))
    }

    /// Opens an existing store for writing (`--resume`), and fails if there is none.
    pub fn open_existing(path: &Path) -> Result<Self, StoreError> {
        require_store(path)?;
        Self::open(path)
    }

    /// Opens an existing store for reading only (rule 2): never writes to `path`.
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        require_store(path)?;
        let direct = guarded(ENGINE, "open", || {
            Ok(builder().open_read_only(path.join(REDB_FILE)))
        })?;
        let (db, copy) = match direct {
            Ok(db) => (Db::Read(db), None),
            // Needs recovery (a killed writer) or a writer has it: read a copy instead.
            Err(redb::DatabaseError::RepairAborted | redb::DatabaseError::DatabaseAlreadyOpen) => {
                let copy = copy_store(path)?;
                let db = guarded(ENGINE, "open", || {
                    builder()
                        .open(copy.path().join(REDB_FILE))
                        .map_err(|e| open_failed(path, e))
                })?;
                (Db::Write(db), Some(copy))
            }
            Err(e) => return Err(open_failed(path, e)),
        };
        let dir = copy.as_ref().map_or(path, |c| c.path());
        engine::check(dir, || counter(&db))?;
        Ok(Self::wrap(db, path, None, copy))
    }

    fn wrap(
        db: Db,
        path: &Path,
        flushes: Option<FlushRecord>,
        copy: Option<tempfile::TempDir>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                db,
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

    fn read<T>(
        &self,
        table: TableDefinition<&[u8], &[u8]>,
        what: &str,
        f: impl FnOnce(&redb::ReadOnlyTable<&'static [u8], &'static [u8]>) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        read_db(&self.inner.db, table, what, f)
    }

    /// Runs `f` in a write transaction committed with `durability` (rule 1), poisoning the
    /// store on an error.
    fn write<T>(
        &self,
        what: &str,
        durability: Durability,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if self.inner.flushes.is_none() {
            return Err(StoreError::ReadOnly(self.inner.path.clone()));
        }
        let Db::Write(db) = &self.inner.db else {
            return Err(StoreError::ReadOnly(self.inner.path.clone()));
        };
        self.inner.poison.write(&self.inner.path, || {
            guarded(ENGINE, what, || {
                let mut txn = db.begin_write().map_err(rerr)?;
                txn.set_durability(durability).map_err(rerr)?;
                let out = f(&txn)?;
                txn.commit().map_err(rerr)?;
                Ok(out)
            })
        })
    }

    fn fence_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .fence_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs `f` on `table` in a read transaction; `None` if the table does not exist.
fn read_db<T>(
    db: &Db,
    table: TableDefinition<&[u8], &[u8]>,
    what: &str,
    f: impl FnOnce(&redb::ReadOnlyTable<&'static [u8], &'static [u8]>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    guarded(ENGINE, what, || {
        let txn = match db {
            Db::Write(db) => db.begin_read(),
            Db::Read(db) => db.begin_read(),
        }
        .map_err(rerr)?;
        let t = match txn.open_table(table) {
            Ok(t) => t,
            Err(TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(rerr(e)),
        };
        f(&t).map(Some)
    })
}

/// The flush counter in the database (engine.rs rule 3).
fn counter(db: &Db) -> Result<u64, StoreError> {
    Ok(read_db(db, META, "read", |t| {
        let v = t.get(FLUSHES_KEY).map_err(rerr)?;
        engine::decode_counter(v.as_ref().map(|g| g.value()))
    })?
    .unwrap_or(0))
}

fn pairs_from<'a>(
    iter: impl Iterator<
            Item = Result<
                (
                    redb::AccessGuard<'a, &'static [u8]>,
                    redb::AccessGuard<'a, &'static [u8]>,
                ),
                redb::StorageError,
            >,
        > + 'a,
    prefix: &'a [u8],
) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + 'a {
    iter.map(|r| {
        r.map(|(k, v)| (k.value().to_vec(), v.value().to_vec()))
            .map_err(rerr)
    })
    .take_while(move |r| r.as_ref().map_or(true, |(k, _)| k.starts_with(prefix)))
}

fn put_all(txn: &redb::WriteTransaction, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
    let mut t = txn.open_table(DATA).map_err(rerr)?;
    for (k, v) in pairs {
        t.insert(k.as_slice(), v.as_slice()).map_err(rerr)?;
    }
    Ok(())
}

impl Store for RedbStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.write("insert", Durability::None, |txn| {
            put_all(txn, &[(key.to_vec(), value.to_vec())])
        })
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        self.write("put_batch", Durability::None, |txn| put_all(txn, pairs))
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .read(DATA, "get", |t| {
                Ok(t.get(key).map_err(rerr)?.map(|v| v.value().to_vec()))
            })?
            .flatten())
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        Ok(self
            .read(DATA, "scan_prefix", |t| {
                let range = t
                    .range::<&[u8]>((Bound::Included(prefix), Bound::Unbounded))
                    .map_err(rerr)?;
                pairs_from(range, prefix).collect()
            })?
            .unwrap_or_default())
    }

    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: PageLimit,
    ) -> Result<Page, StoreError> {
        Ok(self
            .read(DATA, "scan_page", |t| {
                let range = t
                    .range::<&[u8]>((page_start(prefix, after), Bound::Unbounded))
                    .map_err(rerr)?;
                fill_page(pairs_from(range, prefix), limit)
            })?
            .unwrap_or_default())
    }

    fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        self.write("remove", Durability::None, |txn| {
            txn.open_table(DATA)
                .map_err(rerr)?
                .remove(key)
                .map_err(rerr)?;
            Ok(())
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        let Some(flushes) = &self.inner.flushes else {
            return Ok(());
        };
        let mut record = flushes.lock().unwrap_or_else(|p| p.into_inner());
        let next = record.count + 1;
        self.write("flush", Durability::Immediate, |txn| {
            txn.open_table(META)
                .map_err(rerr)?
                .insert(FLUSHES_KEY, &next.to_le_bytes()[..])
                .map_err(rerr)?;
            Ok(())
        })?;
        self.inner
            .poison
            .write(&self.inner.path, || record.record(next))
    }

    fn describe(&self) -> String {
        format!("redb:{}", self.inner.path.display())
    }

    fn keeps_fences(&self) -> bool {
        true
    }

    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        let _held = self.fence_lock();
        self.write("raise_fence", Durability::None, |txn| {
            let mut t = txn.open_table(FENCES).map_err(rerr)?;
            let newest = match t.get(scope).map_err(rerr)? {
                Some(v) => Some(engine::decode_fence(scope, v.value())?),
                None => None,
            };
            if newest.is_none_or(|n| epoch > n) {
                t.insert(scope, &epoch.to_le_bytes()[..]).map_err(rerr)?;
            }
            Ok(())
        })
    }

    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        let _held = self.fence_lock();
        // Rule 3: fences are checked and the batch written under the lock every raise takes;
        // a refusal is no write failure, so it does not poison.
        if self.inner.flushes.is_none() {
            return Err(StoreError::ReadOnly(self.inner.path.clone()));
        }
        self.inner.poison.check(&self.inner.path)?;
        self.read(FENCES, "check fences", |t| {
            for (scope, epoch) in fences {
                let newest = match t.get(scope.as_slice()).map_err(rerr)? {
                    Some(v) => Some(engine::decode_fence(scope, v.value())?),
                    None => None,
                };
                admit_one(scope, *epoch, newest)?;
            }
            Ok(())
        })?;
        self.put_batch(pairs)
    }
}

//! The local store: one sled database in a directory (`local:DIR`, the embedded default).
//!
//! sled's background flush is switched off (`flush_every_ms(None)`): durability comes only from
//! our explicit [`Store::flush`], which the log's group-commit writer calls once per batch of
//! segments (rule 2 in the crate docs).
//!
//! Rules this file keeps on top of sled (issue 13 point 2: "readers never write"):
//!
//! 1. **Readers open a copy.** sled 0.34 has no working read-only mode (its `read_only` option
//!    fails with EINVAL or panics: sled issues #914, #1054), and opening a database runs sled's
//!    recovery, which *writes*: at a damaged record it takes everything after as a torn tail,
//!    zeroes it and deletes the blob files written after it. So [`SledStore::open_read_only`]
//!    copies the directory (the flush record first, then `conf`, snapshots, `db`, `blobs/`)
//!    into a fresh temporary directory and opens sled there; the original is never opened for
//!    writing, which also makes a read-only directory, a full disk, or a run still writing its
//!    log readable. The copy goes to the system's temporary directory, or to `/dev/shm` when
//!    that fails (a full disk), and is removed when the store is dropped. It costs one copy of
//!    the store per `inspect` or `certify`: reading the whole log costs about as much anyway.
//! 2. **sled's repair never passes silently.** Each [`Store::flush`] bumps a counter kept inside
//!    the database (its own sled tree, invisible to scans) *and then*, once sled's flush has
//!    returned, writes it to the file `veriflow.flushes` beside sled's files (one `pwrite`, no
//!    extra fsync: it is written after sled's own fsync, so after any crash it is at most the
//!    durable counter). Every open compares the two: a database whose counter is below the
//!    file's lost writes that were flushed (sled's recovery dropped what followed a damaged
//!    record), and is [`StoreError::Corruption`]. A missing or damaged flush file beside a
//!    database that has flushed is corruption too.
//! 3. **A panic in sled is an error.** Every call into sled runs under `catch_unwind` and a
//!    panic becomes [`StoreError::Corruption`] (a deleted blob file makes sled 0.34 panic on
//!    read); dropping the database is guarded the same way.
//! 4. A writer that resumes a run ([`SledStore::open_existing`]) first checks a copy as in rule
//!    1, so damage is reported before sled's recovery touches the original.
//! 5. **A failed write poisons the store** (issue 13 point 7: a full disk). sled 0.34 leaves the
//!    log slot of a write that failed (ENOSPC on a blob file) neither completed nor marked
//!    failed, so every later flush, and the flush in sled's own `Drop`, waits for it forever.
//!    After the first error of a write or flush, every later write and flush returns that error
//!    without calling sled, and the database is leaked instead of dropped (its files closed by
//!    the process's exit). Nothing acknowledged is lost: an acknowledged write is one whose
//!    flush returned `Ok`, and sled recovers that durable prefix at the next open.
//! 6. **Fences persist** (`store/fence.rs`): each scope's newest epoch is a record of the sled
//!    tree `veriflow.fences` (never seen by a scan, so no key collides with it), durable with
//!    the next flush. A fenced batch reads the fences and applies the batch under one lock
//!    that every raise takes too, so no fence moves between the check and the write.
//! 7. **Content-addressed values are files** (`value_files.rs`), not sled records: the pairs a
//!    [`Store::put_batch_fenced_content`] marks content-addressed (the log's value store) go
//!    to `values/<shard>/<key in hex>`, durable before the rest of the batch is given to sled, so no
//!    segment sled writes can name a value that is not on disk. sled 0.34 keeps every value a
//!    process wrote in memory whatever its cache (below), which for a logged CG of 10^6
//!    unknowns was 8 GiB; as files they leave memory once durable. Reads, scans and deletes
//!    see one store: a key is in sled or a file, never both. Readers read the files in place
//!    (rule 1's copy leaves them out: once named they never change).

use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::fence::admit_one;
use super::value_files::{ValueFiles, VALUE_DIR};
use super::{fill_page, page_start, Page, PageLimit, Pairs, Store, StoreError};

/// Retries of [`SledStore::open`] while the lock is still held: 20 × 50 ms = 1 s, far above
/// the few milliseconds seen, far below a user's patience.
const LOCK_RETRIES: u32 = 20;
const LOCK_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// The file beside sled's own that records the last flush (rule 2).
pub(super) const FLUSH_FILE: &str = "veriflow.flushes";
/// sled tree of the flush counter (rule 2): a tree of its own, so no scan of the store sees it.
const META_TREE: &[u8] = b"veriflow.meta";
const FLUSHES_KEY: &[u8] = b"flushes";
/// sled tree of the epoch fences (rule 6): scope -> newest epoch (u64 LE).
const FENCE_TREE: &[u8] = b"veriflow.fences";
/// Flush file layout: magic, counter (u64 LE), first 8 bytes of blake3(magic ‖ counter).
const FLUSH_MAGIC: [u8; 4] = *b"VFFL";
const FLUSH_FILE_LEN: usize = 4 + 8 + 8;

/// A sled database in one directory.
#[derive(Debug, Clone)]
pub struct SledStore {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    /// The database, its flush-counter tree and its fence tree; `None` only while dropping.
    engine: Option<(sled::Db, sled::Tree, sled::Tree)>,
    /// Held by a fence raise and by a fenced batch from its check to its write (rule 6).
    fence_lock: Mutex<()>,
    /// The directory asked for (not the copy).
    path: PathBuf,
    /// The flush counter and the open flush file (rule 2); `None` for a read-only copy.
    flushes: Option<Mutex<(u64, std::fs::File)>>,
    /// The copy a read-only store reads (rule 1), removed after the database is closed.
    pub(super) copy: Option<tempfile::TempDir>,
    /// The first write or flush error (rule 5).
    poisoned: super::engine::Poison,
    /// Content-addressed values (rule 7): in the original directory, also for a read-only copy.
    files: ValueFiles,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.poisoned.is_poisoned() {
            // Rule 5: sled's drop would wait forever for the failed write's slot.
            std::mem::forget(self.engine.take());
            return;
        }
        // Rule 3: sled flushes on drop and may panic on a damaged store.
        if let Some(engine) = self.engine.take() {
            let _ = guarded("close", move || {
                drop(engine);
                Ok(())
            });
        }
    }
}

/// Runs `f` (a call into sled), turning a panic into an error (rule 3; `engine.rs` rule 1).
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    super::engine::guarded("sled", what, f)
}

impl SledStore {
    /// Refuses the write unless every fence admits its epoch (rule 6: under the fence lock).
    fn check_fences(&self, fences: &[(Vec<u8>, u64)]) -> Result<(), StoreError> {
        guarded("check fences", || {
            let tree = &self.engine().2;
            for (scope, epoch) in fences {
                admit_one(scope, *epoch, read_fence(tree, scope)?)?;
            }
            Ok(())
        })
    }

    /// Name of the file beside sled's own that records the last flush (rule 2).
    pub const FLUSH_FILE: &'static str = FLUSH_FILE;
    /// Name of the directory beside sled's files that holds content-addressed values (rule 7).
    pub const VALUE_DIR: &'static str = VALUE_DIR;

    /// Opens (or creates) the store in `path` for writing.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let open_err = |reason: String| StoreError::Open {
            path: path.to_path_buf(),
            reason,
        };
        if path.exists() && !path.is_dir() {
            return Err(open_err("not a directory".to_string()));
        }
        let db = open_db(path)?;
        let meta = guarded("open", || Ok(db.open_tree(META_TREE)?))?;
        let fences = guarded("open", || Ok(db.open_tree(FENCE_TREE)?))?;
        let durable = check_flushes(path, &meta)?;
        let files = ValueFiles::open(path, true)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path.join(FLUSH_FILE))
            .map_err(|e| open_err(format!("cannot open {FLUSH_FILE}: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                engine: Some((db, meta, fences)),
                fence_lock: Mutex::new(()),
                path: path.to_path_buf(),
                flushes: Some(Mutex::new((durable, file))),
                copy: None,
                poisoned: super::engine::Poison::default(),
                files,
            }),
        })
    }

    /// Opens an existing store in `path` for writing, and fails if there is none (for
    /// `--resume`), so that a typo does not silently create an empty log. A copy is checked
    /// first (rule 4).
    pub fn open_existing(path: &Path) -> Result<Self, StoreError> {
        require_store(path)?;
        drop(Self::open_read_only(path)?);
        Self::open(path)
    }

    /// Opens an existing store in `path` for reading only (`inspect`, `certify`): on a copy,
    /// checked against its flush record (rules 1-3). Writes through it are refused.
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        require_store(path)?;
        let copy = copy_store(path)?;
        let db = open_db(copy.path())?;
        let meta = guarded("open", || Ok(db.open_tree(META_TREE)?))?;
        let fences = guarded("open", || Ok(db.open_tree(FENCE_TREE)?))?;
        check_flushes(copy.path(), &meta).map_err(|e| match e {
            StoreError::Corruption(m) => StoreError::Corruption(format!("{}: {m}", path.display())),
            other => other,
        })?;
        let files = ValueFiles::open(path, false)?;
        Ok(Self {
            inner: Arc::new(Inner {
                engine: Some((db, meta, fences)),
                fence_lock: Mutex::new(()),
                path: path.to_path_buf(),
                flushes: None,
                copy: Some(copy),
                poisoned: super::engine::Poison::default(),
                files,
            }),
        })
    }

    /// The directory of this store (the original, also for a read-only copy).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub(super) fn db(&self) -> &sled::Db {
        &self.engine().0
    }

    fn engine(&self) -> &(sled::Db, sled::Tree, sled::Tree) {
        self.inner
            .engine
            .as_ref()
            .expect("the database is open until drop")
    }

    fn writable(&self) -> Result<(), StoreError> {
        if self.inner.copy.is_some() {
            return Err(StoreError::ReadOnly(self.inner.path.clone()));
        }
        self.inner.poisoned.check(&self.inner.path)
    }

    /// Rule 5: runs a write or flush, and poisons the store on its first error.
    fn write<T>(&self, f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.writable()?;
        self.inner.poisoned.write(&self.inner.path, f)
    }
}

/// The directory must hold a sled store (conf and db), or it is an `Open` error.
fn require_store(path: &Path) -> Result<(), StoreError> {
    if !path.join("conf").is_file() || !path.join("db").is_file() {
        return Err(StoreError::Open {
            path: path.to_path_buf(),
            reason: if path.exists() {
                "no store here (missing sled files `conf` and `db`)".to_string()
            } else {
                "no store here (no such directory)".to_string()
            },
        });
    }
    Ok(())
}

/// sled's page cache. Its default (1 GiB) keeps what was written: a run's memory grew with its
/// log until the cache was full (issue 13 point 8, `paper memory`). Logs are written once and
/// read back only by recovery and certification, which read each record once in key order, so
/// the cache needs to hold little more than the tree's index pages and the leaf being read:
/// 8 MiB (it counts bytes as laid out in sled's log, not as held in memory).
///
/// This does not bound what sled holds while a log is *written*: sled 0.34 keeps the values
/// written in this process in memory whatever the capacity (issue 17 target 4, measured with
/// 4,000 values of 64 KiB, the log's segment size, put 16 to a batch with a flush after each:
/// peak RSS 260-263 MB at capacities of 256 bytes, 64 KiB, 1, 8 and 64 MiB, and 269-272 MB
/// with 8 MiB sled segments, where the values are not blobs). A logged 2.9 M-task knary run
/// peaks at 577 MB on sled against 113 MB on redb and 197 MB on fjall (`knary run -n 10 -k 5
/// --checkpoint-kib 0`, 2 threads).
const SLED_CACHE_BYTES: u64 = 8 << 20;

fn open_db(path: &Path) -> Result<sled::Db, StoreError> {
    let open_err = |reason: String| StoreError::Open {
        path: path.to_path_buf(),
        reason,
    };
    let config = sled::Config::new()
        .path(path)
        .flush_every_ms(None)
        .cache_capacity(SLED_CACHE_BYTES)
        .mode(sled::Mode::HighThroughput);
    // sled's file lock can outlive the last handle by a moment (its background thread lets
    // go of the database last), so reopening right after a drop may briefly find it held.
    let mut tries = 0;
    loop {
        match guarded("open", || Ok(config.open())) {
            Ok(Ok(db)) => return Ok(db),
            Ok(Err(e)) if tries < LOCK_RETRIES && e.to_string().contains("lock") => {
                tries += 1;
                std::thread::sleep(LOCK_RETRY_DELAY);
            }
            Ok(Err(sled::Error::Corruption { at, .. })) => {
                return Err(StoreError::Corruption(format!(
                    "{}: sled found its files corrupt at {at:?}",
                    path.display()
                )))
            }
            Ok(Err(e)) => return Err(open_err(e.to_string())),
            Err(e) => return Err(e),
        }
    }
}

/// Rule 2: the database's flush counter must reach the flush file's. Returns the counter.
fn check_flushes(dir: &Path, meta: &sled::Tree) -> Result<u64, StoreError> {
    let stored = guarded("read", || Ok(meta.get(FLUSHES_KEY)?))?;
    let in_db = match stored {
        None => 0,
        Some(v) => u64::from_le_bytes(v.as_ref().try_into().map_err(|_| {
            StoreError::Corruption(format!("the flush counter is {} bytes, not 8", v.len()))
        })?),
    };
    let file = dir.join(FLUSH_FILE);
    let recorded = match std::fs::read(&file) {
        // Created at open, and its first write failed (a full disk): it records no flush,
        // which is at most the database's counter, as rule 2 requires.
        Ok(bytes) if bytes.is_empty() => 0,
        Ok(bytes) => decode_flushes(&bytes).ok_or_else(|| {
            StoreError::Corruption(format!(
                "{FLUSH_FILE} is damaged ({} bytes, not a flush record)",
                bytes.len()
            ))
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && in_db == 0 => 0,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StoreError::Corruption(format!(
                "{FLUSH_FILE} is missing, though the database was flushed {in_db} times"
            )))
        }
        Err(e) => {
            return Err(StoreError::Io(format!(
                "cannot read {}: {e}",
                file.display()
            )))
        }
    };
    if in_db < recorded {
        return Err(StoreError::Corruption(format!(
            "the database lost writes it had flushed: its files hold flush {in_db} of the {recorded} \
             recorded in {FLUSH_FILE} (a damaged file, after which the store engine's recovery \
             dropped everything)"
        )));
    }
    Ok(in_db)
}

pub(super) fn encode_flushes(n: u64) -> [u8; FLUSH_FILE_LEN] {
    let mut out = [0u8; FLUSH_FILE_LEN];
    out[..4].copy_from_slice(&FLUSH_MAGIC);
    out[4..12].copy_from_slice(&n.to_le_bytes());
    let digest = blake3::hash(&out[..12]);
    out[12..].copy_from_slice(&digest.as_bytes()[..8]);
    out
}

pub(super) fn decode_flushes(bytes: &[u8]) -> Option<u64> {
    if bytes.len() != FLUSH_FILE_LEN || bytes[..4] != FLUSH_MAGIC {
        return None;
    }
    let n = u64::from_le_bytes(bytes[4..12].try_into().ok()?);
    (encode_flushes(n)[..] == *bytes).then_some(n)
}

/// Rule 1: copies the store at `from` into a fresh temporary directory, the flush file first,
/// without its value files (rule 7: read in place).
pub(super) fn copy_store(from: &Path) -> Result<tempfile::TempDir, StoreError> {
    let mut last_err = None;
    let mut places = vec![std::env::temp_dir()];
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        places.push(shm.to_path_buf());
    }
    for place in places {
        let attempt = tempfile::Builder::new()
            .prefix("veriflow-read-")
            .tempdir_in(&place)
            .and_then(|dir| copy_tree(from, dir.path(), true).map(|()| dir));
        match attempt {
            Ok(dir) => return Ok(dir),
            Err(e) => last_err = Some(format!("{}: {e}", place.display())),
        }
    }
    Err(StoreError::Open {
        path: from.to_path_buf(),
        reason: format!(
            "cannot copy it to read it without writing to it: {}",
            last_err.unwrap_or_default()
        ),
    })
}

fn copy_tree(from: &Path, to: &Path, top: bool) -> std::io::Result<()> {
    let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(from)?.collect::<Result<_, _>>()?;
    // The flush record before the files it vouches for (a writer may be running).
    entries.sort_by_key(|e| (e.file_name() != FLUSH_FILE, e.file_name()));
    for e in entries {
        let kind = e.file_type()?;
        let target = to.join(e.file_name());
        if top && e.file_name() == VALUE_DIR {
            continue;
        }
        if kind.is_dir() {
            std::fs::create_dir(&target)?;
            copy_tree(&e.path(), &target, false)?;
        } else if kind.is_file() {
            std::fs::copy(e.path(), &target)?;
        }
    }
    Ok(())
}

impl Store for SledStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.write(|| {
            self.inner.files.remove(key)?; // rule 7: one place per key
            guarded("insert", || {
                self.db().insert(key, value)?;
                Ok(())
            })
        })
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for (k, v) in pairs {
            batch.insert(k.as_slice(), v.as_slice());
        }
        self.write(|| {
            for (k, _) in pairs {
                self.inner.files.remove(k)?; // rule 7: one place per key
            }
            guarded("apply_batch", || {
                self.db().apply_batch(batch)?;
                Ok(())
            })
        })
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if self.inner.files.contains(key) {
            return self.inner.files.get(key); // rule 7
        }
        guarded("get", || Ok(self.db().get(key)?.map(|v| v.to_vec())))
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        guarded("scan_prefix", || {
            let engine = self.db().scan_prefix(prefix).map(|r| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(StoreError::from)
            });
            self.inner
                .files
                .merge(engine, prefix, std::ops::Bound::Included(prefix))
                .collect()
        })
    }

    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: PageLimit,
    ) -> Result<Page, StoreError> {
        let start = page_start(prefix, after);
        let range = (start, std::ops::Bound::Unbounded);
        guarded("scan_page", || {
            let engine = self
                .db()
                .range::<&[u8], _>(range)
                .take_while(|r| r.as_ref().map_or(true, |(k, _)| k.starts_with(prefix)))
                .map(|r| {
                    r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                        .map_err(StoreError::from)
                });
            fill_page(self.inner.files.merge(engine, prefix, start), limit)
        })
    }

    fn scan_keys(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        max_keys: usize,
    ) -> Result<(Vec<Vec<u8>>, bool), StoreError> {
        let start = page_start(prefix, after);
        let range = (start, std::ops::Bound::Unbounded);
        let max = max_keys.max(1);
        let engine = guarded("scan_keys", || {
            let mut keys = Vec::new();
            for k in self.db().range::<&[u8], _>(range).keys() {
                let k = k?;
                if !k.starts_with(prefix) {
                    return Ok((keys, false));
                }
                keys.push(k.to_vec());
                if keys.len() >= max {
                    return Ok((keys, true));
                }
            }
            Ok((keys, false))
        })?;
        Ok(self.inner.files.merge_keys(engine, prefix, start, max))
    }

    fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        self.write(|| {
            self.inner.files.remove(key)?;
            guarded("remove", || {
                self.db().remove(key)?;
                Ok(())
            })
        })
    }

    fn flush(&self) -> Result<(), StoreError> {
        let Some(flushes) = &self.inner.flushes else {
            return Ok(()); // a read-only copy has nothing of its own to make durable
        };
        self.write(|| {
            // Rule 2: counter into the database, sled's flush, then the file.
            let mut state = flushes.lock().unwrap_or_else(|p| p.into_inner());
            self.inner.files.sync()?; // rule 7: value files removed since the last flush
            let next = state.0 + 1;
            guarded("flush", || {
                self.engine().1.insert(FLUSHES_KEY, &next.to_le_bytes())?;
                self.db().flush()?;
                Ok(())
            })?;
            state
                .1
                .write_all_at(&encode_flushes(next), 0)
                .and_then(|()| state.1.flush())
                .map_err(|e| StoreError::Io(format!("cannot write {FLUSH_FILE}: {e}")))?;
            state.0 = next;
            Ok(())
        })
    }

    fn describe(&self) -> String {
        format!("local:{}", self.inner.path.display())
    }

    fn keeps_fences(&self) -> bool {
        true
    }

    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        let _held = self.fence_lock();
        self.write(|| {
            guarded("raise_fence", || {
                let tree = &self.engine().2;
                if read_fence(tree, scope)?.is_none_or(|newest| epoch > newest) {
                    tree.insert(scope, &epoch.to_le_bytes())?;
                }
                Ok(())
            })
        })
    }

    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        self.writable()?;
        let _held = self.fence_lock(); // rule 6: from the check to the write
        self.check_fences(fences)?;
        self.put_batch(pairs)
    }

    fn put_batch_fenced_content(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
        content: usize,
    ) -> Result<(), StoreError> {
        self.writable()?;
        let _held = self.fence_lock(); // rule 6: from the check to the write
        self.check_fences(fences)?;
        let (values, rest) = pairs.split_at(content.min(pairs.len()));
        // Rule 7: the values durable as files before sled sees the records naming them; a
        // key sled held before (a plain write) goes from sled in the same batch.
        self.write(|| {
            self.inner.files.write(values)?;
            let mut batch = sled::Batch::default();
            for (k, _) in values {
                if guarded("get", || Ok(self.db().contains_key(k)?))? {
                    batch.remove(k.as_slice());
                }
            }
            for (k, v) in rest {
                self.inner.files.remove(k)?;
                batch.insert(k.as_slice(), v.as_slice());
            }
            guarded("apply_batch", || {
                self.db().apply_batch(batch)?;
                Ok(())
            })
        })
    }
}

impl SledStore {
    fn fence_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .fence_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// The fence of `scope` in the fence tree (rule 6).
fn read_fence(tree: &sled::Tree, scope: &[u8]) -> Result<Option<u64>, StoreError> {
    match tree.get(scope)? {
        None => Ok(None),
        Some(v) => Ok(Some(u64::from_le_bytes(v.as_ref().try_into().map_err(
            |_| {
                StoreError::Corruption(format!(
                    "the fence of {} is {} bytes, not 8",
                    String::from_utf8_lossy(scope),
                    v.len()
                ))
            },
        )?))),
    }
}

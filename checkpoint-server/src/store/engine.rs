//! What the redb and fjall stores share: sled_store.rs's rules 2, 3 and 5 written once, for an
//! engine named at each call.
//!
//! Rules:
//!
//! 1. **A panic in the engine is an error** ([`guarded`]): redb's debug builds panic on a file
//!    they did not write ("a plain open may panic", its docs); fjall asserts on names. A caught
//!    panic is [`StoreError::Corruption`] naming the engine and the call.
//! 2. **A failed write poisons** ([`Poison`]): after the first error of a write or flush, every
//!    later write and flush returns it without calling the engine (fjall poisons itself the
//!    same way; redb after a failed fsync may not; one rule for both).
//! 3. **Lost flushed writes are corruption** ([`FlushRecord`]): each flush puts a counter into
//!    the engine (a table or keyspace no scan sees) before the engine's durable commit, then
//!    writes it to `veriflow.flushes` beside the engine's files; an open finding the engine's
//!    counter below the file's says so. (fjall's journal recovery cuts the journal at the first
//!    bad entry, as sled's did: without the record, a bit flip in the middle of a journal would
//!    pass as a shorter log.)

use std::os::unix::fs::FileExt as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Mutex;

use super::sled_store::{decode_flushes, encode_flushes, FLUSH_FILE};
use super::StoreError;

thread_local! {
    /// Set while this thread is inside a guarded engine call (rule 1).
    static IN_ENGINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn quiet_engine_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_ENGINE.with(|f| f.get()) {
                tracing::debug!("the store engine panicked: {info}");
            } else {
                previous(info);
            }
        }));
    });
}

/// Rule 1: runs `f` (a call into `engine`), turning a panic into an error.
pub(super) fn guarded<T>(
    engine: &str,
    what: &str,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    quiet_engine_panics();
    let outer = IN_ENGINE.with(|flag| flag.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    IN_ENGINE.with(|flag| flag.set(outer));
    match result {
        Ok(r) => r,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            Err(StoreError::Corruption(format!(
                "the store engine ({engine}) crashed in {what} (a panic, caught): {msg}"
            )))
        }
    }
}

/// Rule 2: the first write or flush error of a store.
#[derive(Debug, Default)]
pub(super) struct Poison(Mutex<Option<String>>);

impl Poison {
    /// `Ok` while no write failed.
    pub(super) fn check(&self, path: &Path) -> Result<(), StoreError> {
        match &*self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Ok(()),
            Some(first) => Err(StoreError::Io(format!(
                "{}: the store takes no more writes after an earlier failure ({first})",
                path.display()
            ))),
        }
    }

    /// Runs a write, and poisons on its first error.
    pub(super) fn write<T>(
        &self,
        path: &Path,
        f: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.check(path)?;
        let r = f();
        if let Err(e) = &r {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| e.to_string());
        }
        r
    }

    /// Whether a write failed.
    pub(super) fn is_poisoned(&self) -> bool {
        self.0.lock().map_or(true, |p| p.is_some())
    }
}

/// Rule 3: the flush counter and the open `veriflow.flushes` of a writable store.
#[derive(Debug)]
pub(super) struct FlushRecord {
    /// The last durable flush.
    pub(super) count: u64,
    file: std::fs::File,
}

impl FlushRecord {
    /// Compares the engine's counter `in_db` with the record in `dir` (rule 3) and opens the
    /// record for writing. Returns the counter.
    pub(super) fn open(
        dir: &Path,
        in_db: impl FnOnce() -> Result<u64, StoreError>,
    ) -> Result<Self, StoreError> {
        let count = check(dir, in_db)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(FLUSH_FILE))
            .map_err(|e| StoreError::Open {
                path: dir.to_path_buf(),
                reason: format!("cannot open {FLUSH_FILE}: {e}"),
            })?;
        Ok(Self { count, file })
    }

    /// Records flush `n`, which the engine has made durable.
    pub(super) fn record(&mut self, n: u64) -> Result<(), StoreError> {
        self.file
            .write_all_at(&encode_flushes(n), 0)
            .map_err(|e| StoreError::Io(format!("cannot write {FLUSH_FILE}: {e}")))?;
        self.count = n;
        Ok(())
    }
}

/// The engine's counter as stored (8 bytes LE, absent: 0).
pub(super) fn decode_counter(stored: Option<&[u8]>) -> Result<u64, StoreError> {
    match stored {
        None => Ok(0),
        Some(v) => Ok(u64::from_le_bytes(v.try_into().map_err(|_| {
            StoreError::Corruption(format!("the flush counter is {} bytes, not 8", v.len()))
        })?)),
    }
}

/// A fence as stored (8 bytes LE).
pub(super) fn decode_fence(scope: &[u8], v: &[u8]) -> Result<u64, StoreError> {
    Ok(u64::from_le_bytes(v.try_into().map_err(|_| {
        StoreError::Corruption(format!(
            "the fence of {} is {} bytes, not 8",
            String::from_utf8_lossy(scope),
            v.len()
        ))
    })?))
}

/// Rule 3: the engine's counter (`in_db`, read after the record, so that a writer running
/// beside a reader can only have moved it past the record) must reach the record in `dir`.
/// Returns the counter.
pub(super) fn check(
    dir: &Path,
    in_db: impl FnOnce() -> Result<u64, StoreError>,
) -> Result<u64, StoreError> {
    let file = dir.join(FLUSH_FILE);
    let read = std::fs::read(&file);
    let in_db = in_db()?;
    let recorded = match read {
        Ok(bytes) if bytes.is_empty() => 0,
        Ok(bytes) => decode_flushes(&bytes).ok_or_else(|| {
            StoreError::Corruption(format!(
                "{}: {FLUSH_FILE} is damaged ({} bytes, not a flush record)",
                dir.display(),
                bytes.len()
            ))
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && in_db == 0 => 0,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StoreError::Corruption(format!(
                "{}: {FLUSH_FILE} is missing, though the database was flushed {in_db} times",
                dir.display()
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
            "{}: the database lost writes it had flushed: its files hold flush {in_db} of the \
             {recorded} recorded in {FLUSH_FILE} (a damaged file, after which the store engine's \
             recovery dropped everything)",
            dir.display()
        )));
    }
    Ok(in_db)
}

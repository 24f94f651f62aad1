//! Content-addressed values as files beside a local engine's own (rule 7 of `sled_store.rs`):
//! one file per key under `values/<last byte of the key in hex>/`, named by the key in hex (256
//! directories: creating a file in a directory of ext2/3 without an index scans it, which was
//! 17 % of a logged CG's CPU with one directory of a few hundred files).
//!
//! Rules:
//!
//! 1. **Only content-addressed pairs** ([`super::Store::put_batch_fenced_content`]: the log's
//!    value store, rule 10 of the runtime's `log/mod.rs`) become files; every other write goes
//!    to the engine. A key lives in one place: a plain write or a delete of a key held as a
//!    file removes the file, and [`ValueFiles::write`] skips a key it holds already (its bytes
//!    are the same by contract).
//! 2. **Durable before it is written down.** [`ValueFiles::write`] writes each new value to
//!    `<name>.tmp`, starts its writeback at once (`sync_file_range`), then `fdatasync`s every
//!    one, renames each to its name and `fsync`s the directory, all before it returns: so the
//!    engine's batch that names them (the segments, written after) can never be on disk
//!    without them, even if the engine writes ahead of its flush. A crash leaves at most some
//!    `.tmp` files, removed by the next writable open and ignored by readers; a named file is
//!    whole. The files of one batch are synced together (on up to 8 threads), so that the file
//!    system can commit them in one journal commit. Removals are made durable by the store's next flush ([`ValueFiles::sync`]).
//! 3. **Out of memory once durable.** The bytes are handed to the kernel and dropped from its
//!    page cache once on disk (`posix_fadvise(DONTNEED)`): a run that logs gigabytes of vectors
//!    keeps neither them (sled 0.34 kept every value a process wrote, issue 17 target 8) nor a
//!    page cache of them.
//! 4. **Readers never write** (`sled_store.rs` rule 1): a read-only store reads the original
//!    directory's value files in place (never renamed, rewritten or truncated once named, so
//!    there is nothing to copy), and a missing or unreadable one is absent or an I/O error
//!    naming the file, never a panic; the log checks each value's digest and length itself.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write as _;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::StoreError;

/// The directory of value files inside a store's directory.
pub(super) const VALUE_DIR: &str = "values";
/// Suffix of a value file being written (rule 2).
const TMP: &str = ".tmp";
/// The most threads that sync one batch's files together (rule 2).
const SYNC_THREADS: usize = 8;

/// The value files of one store (module docs).
#[derive(Debug)]
pub(super) struct ValueFiles {
    dir: PathBuf,
    /// Keys held as files, in key order (scans merge them with the engine's).
    keys: Mutex<BTreeSet<Vec<u8>>>,
    /// Directories a file was removed from since the last [`ValueFiles::sync`].
    removed: Mutex<BTreeSet<PathBuf>>,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |e| StoreError::Io(format!("{what}: {e}"))
}

/// `key` as a file name: lower-case hex.
fn file_name(key: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(key.len() * 2);
    for b in key {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
    s
}

/// The key a file name holds, if it is one.
fn parse_name(name: &str) -> Option<Vec<u8>> {
    if name.is_empty() || !name.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    name.as_bytes()
        .chunks(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

impl ValueFiles {
    /// The value files of the store in `store_dir`. A writable store creates the directory and
    /// removes the `.tmp` files a crash left (rule 2); a read-only one finds what is there
    /// (none when there is no directory: a store that never held a value file).
    pub(super) fn open(store_dir: &Path, writable: bool) -> Result<Self, StoreError> {
        let dir = store_dir.join(VALUE_DIR);
        if writable {
            std::fs::create_dir_all(&dir).map_err(|e| StoreError::Open {
                path: store_dir.to_path_buf(),
                reason: format!("cannot create {VALUE_DIR}/: {e}"),
            })?;
        }
        let mut keys = BTreeSet::new();
        for b in 0..=255u8 {
            let shard = dir.join(file_name(&[b]));
            if writable {
                std::fs::create_dir_all(&shard).map_err(|e| StoreError::Open {
                    path: store_dir.to_path_buf(),
                    reason: format!("cannot create {}: {e}", shard.display()),
                })?;
            }
            let entries = match std::fs::read_dir(&shard) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !writable => continue,
                Err(e) => return Err(io(format!("cannot list {}", shard.display()))(e)),
            };
            for e in entries {
                let e = e.map_err(io(format!("cannot list {}", shard.display())))?;
                let name = e.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.ends_with(TMP) {
                    if writable {
                        std::fs::remove_file(e.path())
                            .map_err(io(format!("cannot remove {}", e.path().display())))?;
                    }
                } else if let Some(key) = parse_name(name).filter(|k| k.last() == Some(&b)) {
                    keys.insert(key);
                }
            }
        }
        Ok(Self {
            dir,
            keys: Mutex::new(keys),
            removed: Mutex::default(),
        })
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, BTreeSet<Vec<u8>>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The directory of `key`'s file.
    fn shard(&self, key: &[u8]) -> PathBuf {
        self.dir
            .join(file_name(&key[key.len().saturating_sub(1)..]))
    }

    fn path(&self, key: &[u8]) -> PathBuf {
        self.shard(key).join(file_name(key))
    }

    /// Whether `key` is held as a file.
    pub(super) fn contains(&self, key: &[u8]) -> bool {
        let keys = self.keys();
        !keys.is_empty() && keys.contains(key)
    }

    /// The bytes of `key`'s file: `None` when it holds no file for it, or the file is gone.
    pub(super) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if !self.contains(key) {
            return Ok(None);
        }
        self.read(key)
    }

    fn read(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path(key);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(format!("cannot read value file {}", path.display()))(e)),
        }
    }

    /// Rule 2: stores every pair whose key it does not hold yet as a file, durable on return.
    /// Returns the keys written.
    pub(super) fn write(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<usize, StoreError> {
        let mut fresh: Vec<(&[u8], &[u8])> = Vec::new();
        {
            let keys = self.keys();
            let mut seen: BTreeSet<&[u8]> = BTreeSet::new();
            for (k, v) in pairs {
                if !keys.contains(k) && seen.insert(k) {
                    fresh.push((k, v));
                }
            }
        }
        if fresh.is_empty() {
            return Ok(0);
        }
        let mut open = Vec::with_capacity(fresh.len());
        for (key, value) in &fresh {
            let tmp = self.shard(key).join(format!("{}{TMP}", file_name(key)));
            let mut f =
                File::create(&tmp).map_err(io(format!("cannot create {}", tmp.display())))?;
            f.write_all(value)
                .map_err(io(format!("cannot write {}", tmp.display())))?;
            start_writeback(&f);
            open.push((tmp, f));
        }
        // The syncs wait together, on up to SYNC_THREADS threads (this one among them): the
        // file system commits syncs that wait together in one journal commit, where one after
        // another each waits for its own; a batch of many values starts no more threads.
        let sync = |group: &[(PathBuf, File)]| -> Result<(), StoreError> {
            for (tmp, f) in group {
                f.sync_data()
                    .map_err(io(format!("cannot sync {}", tmp.display())))?;
                drop_cached(f);
            }
            Ok(())
        };
        let per = open.len().div_ceil(SYNC_THREADS);
        std::thread::scope(|scope| {
            let mut groups = open.chunks(per);
            let first = groups.next().expect("at least one fresh value");
            let others: Vec<_> = groups.map(|g| scope.spawn(move || sync(g))).collect();
            let mut result = sync(first);
            for t in others {
                let r = t.join().unwrap_or_else(|_| {
                    Err(StoreError::Io("a value file's sync panicked".to_string()))
                });
                result = result.and(r);
            }
            result
        })?;
        for ((tmp, _), (key, _)) in open.iter().zip(&fresh) {
            let to = self.path(key);
            std::fs::rename(tmp, &to).map_err(io(format!("cannot name {}", to.display())))?;
        }
        let mut shards: Vec<PathBuf> = fresh.iter().map(|(k, _)| self.shard(k)).collect();
        shards.sort();
        shards.dedup();
        for shard in &shards {
            sync_dir(shard)?;
        }
        let mut keys = self.keys();
        for (key, _) in &fresh {
            keys.insert(key.to_vec());
        }
        Ok(fresh.len())
    }

    /// Removes `key`'s file if it holds one (durable after [`ValueFiles::sync`]).
    pub(super) fn remove(&self, key: &[u8]) -> Result<(), StoreError> {
        if !self.keys().remove(key) {
            return Ok(());
        }
        self.removed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(self.shard(key));
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(format!("cannot remove {}", path.display()))(e)),
        }
    }

    /// Makes the removals so far durable (the store's flush calls it).
    pub(super) fn sync(&self) -> Result<(), StoreError> {
        let removed = std::mem::take(&mut *self.removed.lock().unwrap_or_else(|p| p.into_inner()));
        removed.iter().try_for_each(|d| sync_dir(d))
    }

    /// Keys held as files under `prefix` from `start` on, in key order, at most `max`.
    pub(super) fn keys_from(&self, prefix: &[u8], start: Bound<&[u8]>, max: usize) -> Vec<Vec<u8>> {
        let keys = self.keys();
        if keys.is_empty() {
            return Vec::new();
        }
        keys.range::<[u8], _>((start, Bound::Unbounded))
            .take_while(|k| k.starts_with(prefix))
            .take(max)
            .cloned()
            .collect()
    }

    /// Merges the engine's pairs under `prefix` from `start` (in key order) with the value
    /// files there, reading each file when its turn comes; a file gone since is passed over.
    pub(super) fn merge<'a>(
        &'a self,
        engine: impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + 'a,
        prefix: &[u8],
        start: Bound<&[u8]>,
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + 'a {
        let files = self.keys_from(prefix, start, usize::MAX);
        Merge {
            engine: engine.peekable(),
            files: files.into_iter().peekable(),
            store: self,
        }
    }

    /// Merges the engine's keys (in key order) with the value files' keys from `start` under
    /// `prefix`: at most `max`, and whether more may follow.
    pub(super) fn merge_keys(
        &self,
        engine: (Vec<Vec<u8>>, bool),
        prefix: &[u8],
        start: Bound<&[u8]>,
        max: usize,
    ) -> (Vec<Vec<u8>>, bool) {
        let files = self.keys_from(prefix, start, max.saturating_add(1));
        if files.is_empty() {
            return engine;
        }
        let (theirs, more) = engine;
        // The engine's page stops at its own last key: file keys past it wait for the next page.
        let limit = more.then(|| theirs.last().cloned()).flatten();
        let mut all: Vec<Vec<u8>> = theirs;
        all.extend(
            files
                .into_iter()
                .filter(|k| limit.as_ref().is_none_or(|l| k < l)),
        );
        all.sort();
        all.dedup();
        let more = more || all.len() > max;
        all.truncate(max);
        (all, more)
    }
}

struct Merge<'a, E: Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>>> {
    engine: std::iter::Peekable<E>,
    files: std::iter::Peekable<std::vec::IntoIter<Vec<u8>>>,
    store: &'a ValueFiles,
}

impl<E: Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>>> Iterator for Merge<'_, E> {
    type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let file_first = match (self.files.peek(), self.engine.peek()) {
                (None, _) => return self.engine.next(),
                (Some(_), None) | (Some(_), Some(Err(_))) => true,
                (Some(f), Some(Ok((k, _)))) => f <= k,
            };
            if !file_first {
                return self.engine.next();
            }
            let key = self.files.next()?;
            if self
                .engine
                .peek()
                .is_some_and(|e| e.as_ref().is_ok_and(|(k, _)| *k == key))
            {
                self.engine.next(); // one place per key (rule 1): the file wins
            }
            match self.store.read(&key) {
                Ok(Some(v)) => return Some(Ok((key, v))),
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// Starts writing `f`'s dirty pages now, without waiting (rule 2): by the `fdatasync` most are
/// on their way.
fn start_writeback(f: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd as _;
        // SAFETY: a valid open descriptor; the call only schedules writeback. Its failure is
        // harmless: the fdatasync after it writes and reports.
        unsafe {
            libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = f;
}

/// Drops `f`'s pages, durable already, from the page cache (rule 3).
fn drop_cached(f: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd as _;
        // SAFETY: a valid open descriptor; the call is advice only.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = f;
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("cannot sync {}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::super::{PageLimit, SledStore, Store};
    use super::*;

    fn value_key(i: u8) -> Vec<u8> {
        [&b"val/"[..], &[i; 32]].concat()
    }

    fn files_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join(VALUE_DIR))
            .unwrap()
            .flat_map(|shard| std::fs::read_dir(shard.unwrap().path()).unwrap())
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Rule 2: a batch of more values than sync threads, one of them twice, is every value
    /// once as a whole file, each read back as written.
    #[test]
    fn a_batch_of_many_values_is_synced_in_groups_and_each_is_whole() {
        let dir = tempfile::tempdir().unwrap();
        let s = SledStore::open(dir.path()).unwrap();
        let n = 3 * SYNC_THREADS as u8 + 1;
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> =
            (1..=n).map(|i| (value_key(i), vec![i; 5_000])).collect();
        pairs.push(pairs[0].clone());
        s.put_batch_fenced_content(&[], &pairs, pairs.len())
            .unwrap();
        assert_eq!(files_in(dir.path()).len(), usize::from(n));
        assert!(files_in(dir.path()).iter().all(|f| !f.ends_with(TMP)));
        for i in 1..=n {
            assert_eq!(
                s.get(&value_key(i)).unwrap(),
                Some(vec![i; 5_000]),
                "value {i}"
            );
        }
    }

    /// `sled_store.rs` rule 7: content-addressed pairs are files (and not in sled's scan of
    /// its own records), the rest of the batch is sled's; reads, scans, pages and key pages
    /// see one store in key order; a plain write or delete of a file's key removes the file;
    /// a writer's reopen removes a crash's `.tmp`; a read-only store reads the files in place
    /// and its copy holds none.
    #[test]
    fn content_addressed_values_are_files_and_the_store_stays_one_store() {
        let dir = tempfile::tempdir().unwrap();
        let big = |i: u8| vec![i; 10_000 + usize::from(i)];
        {
            let s = SledStore::open(dir.path()).unwrap();
            s.put(b"val/", b"before the values").unwrap();
            let mut pairs: Vec<(Vec<u8>, Vec<u8>)> =
                (1..=5).map(|i| (value_key(i), big(i))).collect();
            pairs.push((b"seg/1".to_vec(), b"names them".to_vec()));
            pairs.push((b"x".to_vec(), b"after".to_vec()));
            s.put_batch_fenced_content(&[], &pairs, 5).unwrap();
            // Written again (another writer re-running a task): nothing changes.
            s.put_batch_fenced_content(&[], &pairs[..2], 2).unwrap();
            s.flush().unwrap();
            assert_eq!(files_in(dir.path()).len(), 5);
            assert_eq!(
                files_in(dir.path())[0],
                file_name(&value_key(1)),
                "named by the key in hex"
            );
            for i in 1..=5 {
                assert_eq!(s.get(&value_key(i)).unwrap(), Some(big(i)));
                let raw = s.db().get(value_key(i)).unwrap();
                assert!(raw.is_none(), "value {i} is in sled too");
            }
            let all = s.scan_prefix(b"").unwrap();
            let keys: Vec<&[u8]> = all.iter().map(|(k, _)| k.as_slice()).collect();
            let mut want: Vec<Vec<u8>> = vec![b"seg/1".to_vec(), b"val/".to_vec(), b"x".to_vec()];
            want.extend((1..=5).map(value_key));
            want.sort();
            assert_eq!(keys, want);
            super::super::tests::exercise_pages(&s);
            // Pages of one pair at a time and key pages cross from sled to files and back.
            let mut after: Option<Vec<u8>> = None;
            let mut paged = Vec::new();
            let one = PageLimit {
                max_keys: 1,
                max_bytes: u64::MAX,
            };
            loop {
                let page = s.scan_page(b"val/", after.as_deref(), one).unwrap();
                after = page.pairs.last().map(|(k, _)| k.clone());
                paged.extend(page.pairs);
                if !page.more || after.is_none() {
                    break;
                }
            }
            assert_eq!(paged, s.scan_prefix(b"val/").unwrap());
            assert_eq!(paged.len(), 6);
            let (keys, more) = s.scan_keys(b"val/", None, 3).unwrap();
            assert_eq!((keys.len(), more), (3, true));
            let (rest, more) = s
                .scan_keys(b"val/", keys.last().map(|k| k.as_slice()), 9)
                .unwrap();
            assert_eq!((rest.len(), more), (3, false));
            // A plain write of a value's key replaces the file; a delete removes it.
            s.put(&value_key(1), b"plain").unwrap();
            assert_eq!(
                s.get(&value_key(1)).unwrap().as_deref(),
                Some(&b"plain"[..])
            );
            s.delete(&value_key(2)).unwrap();
            assert_eq!(s.get(&value_key(2)).unwrap(), None);
            s.flush().unwrap();
            assert_eq!(files_in(dir.path()).len(), 3);
            // And content written over a plain record takes its place.
            s.put_batch_fenced_content(&[], &[(value_key(1), big(1))], 1)
                .unwrap();
            assert_eq!(s.get(&value_key(1)).unwrap(), Some(big(1)));
            assert!(s.db().get(value_key(1)).unwrap().is_none());
            s.flush().unwrap();
        }
        // What a crash in the middle of a write leaves.
        let tmp = dir
            .path()
            .join(VALUE_DIR)
            .join("09")
            .join(format!("{}{TMP}", file_name(&value_key(9))));
        std::fs::write(&tmp, b"half").unwrap();
        {
            let r = SledStore::open_read_only(dir.path()).unwrap();
            assert_eq!(r.get(&value_key(3)).unwrap(), Some(big(3)));
            assert_eq!(r.get(&value_key(9)).unwrap(), None, "a .tmp is no value");
            // "val/" in sled, and the files of values 1, 3, 4 and 5.
            assert_eq!(r.scan_prefix(b"val/").unwrap().len(), 5);
            let copy = r.inner.copy.as_ref().unwrap().path();
            assert!(
                !copy.join(VALUE_DIR).exists(),
                "the copy holds no value files"
            );
            assert!(tmp.exists(), "a reader removes nothing");
        }
        let s = SledStore::open(dir.path()).unwrap();
        assert!(!tmp.exists(), "a writer's open removes a crash's .tmp");
        assert_eq!(s.get(&value_key(5)).unwrap(), Some(big(5)));
        // A file deleted behind the store's back reads as missing, in a get and in a scan.
        std::fs::remove_file(
            dir.path()
                .join(VALUE_DIR)
                .join("04")
                .join(file_name(&value_key(4))),
        )
        .unwrap();
        assert_eq!(s.get(&value_key(4)).unwrap(), None);
        assert_eq!(s.scan_prefix(b"val/").unwrap().len(), 4);
    }

    #[test]
    fn names_round_trip() {
        for key in [&b"val/"[..], &[0, 255, 16, 1], b"run/x/val/\x7f"] {
            assert_eq!(parse_name(&file_name(key)).as_deref(), Some(key));
        }
        for bad in ["", "abc", "zz", "ABCD", "ab.tmp"] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }
}

//! The local store: one sled database in a directory (`local:DIR`, the embedded default).
//!
//! sled's background flush is switched off (`flush_every_ms(None)`): durability comes only from
//! our explicit [`Store::flush`], which the log's group-commit writer calls once per batch of
//! segments (rule 2 in the crate docs).

use std::path::{Path, PathBuf};

use super::{fill_page, page_start, Page, PageLimit, Pairs, Store, StoreError};

/// Retries of [`SledStore::open`] while the lock is still held: 20 × 50 ms = 1 s, far above
/// the few milliseconds seen, far below a user's patience.
const LOCK_RETRIES: u32 = 20;
const LOCK_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// A sled database in one directory.
#[derive(Debug, Clone)]
pub struct SledStore {
    db: sled::Db,
    path: PathBuf,
}

impl SledStore {
    /// Opens (or creates) the store in `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let open_err = |reason: String| StoreError::Open {
            path: path.to_path_buf(),
            reason,
        };
        if path.exists() && !path.is_dir() {
            return Err(open_err("not a directory".to_string()));
        }
        let config = sled::Config::new()
            .path(path)
            .flush_every_ms(None)
            .mode(sled::Mode::HighThroughput);
        // sled's file lock can outlive the last handle by a moment (its background thread lets
        // go of the database last), so reopening right after a drop may briefly find it held.
        let mut tries = 0;
        loop {
            match config.open() {
                Ok(db) => {
                    return Ok(Self {
                        db,
                        path: path.to_path_buf(),
                    })
                }
                Err(e) if tries < LOCK_RETRIES && e.to_string().contains("lock") => {
                    tries += 1;
                    std::thread::sleep(LOCK_RETRY_DELAY);
                }
                Err(e) => return Err(open_err(e.to_string())),
            }
        }
    }

    /// Opens an existing store in `path` and fails if there is none (for readers: `inspect`,
    /// `certify`, `--resume`), so that a typo does not silently create an empty log.
    pub fn open_existing(path: &Path) -> Result<Self, StoreError> {
        if !path.join("conf").is_file() || !path.join("db").is_file() {
            return Err(StoreError::Open {
                path: path.to_path_buf(),
                reason: "no store here (missing sled files `conf` and `db`)".to_string(),
            });
        }
        Self::open(path)
    }

    /// The directory of this store.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Store for SledStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.db.insert(key, value)?;
        Ok(())
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for (k, v) in pairs {
            batch.insert(k.as_slice(), v.as_slice());
        }
        self.db.apply_batch(batch)?;
        Ok(())
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.db.get(key)?.map(|v| v.to_vec()))
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        self.db
            .scan_prefix(prefix)
            .map(|r| {
                r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(StoreError::from)
            })
            .collect()
    }

    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: PageLimit,
    ) -> Result<Page, StoreError> {
        let range = (page_start(prefix, after), std::ops::Bound::Unbounded);
        fill_page(
            self.db
                .range::<&[u8], _>(range)
                .take_while(|r| r.as_ref().map_or(true, |(k, _)| k.starts_with(prefix)))
                .map(|r| {
                    r.map(|(k, v)| (k.to_vec(), v.to_vec()))
                        .map_err(StoreError::from)
                }),
            limit,
        )
    }

    fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        self.db.remove(key)?;
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    fn describe(&self) -> String {
        format!("local:{}", self.path.display())
    }
}

//! Named runs in one store (issue 18 point 1): [`Namespaced`] is a view of a store in which
//! every key lives under `run/NAME/`, so that any number of runs (and a cluster's jobs) share
//! one directory or one set of checkpoint servers without seeing each other's logs.
//!
//! Rules:
//!
//! 1. **A view, not a copy.** Every key a caller gives is stored as `run/NAME/` ‖ key, and every
//!    key a scan returns has that prefix taken off again; fences are scoped the same way. The
//!    log, the certifier and the coordinator's journal run unchanged over the view.
//! 2. **Names are plain.** 1 to 64 characters of `A-Z a-z 0-9 . _ -`, not starting with `.`:
//!    a name can neither hold `/` (and so reach into another run's keys) nor be empty.
//! 3. **The unnamed run stays where it was.** A store's own run (no name) keeps its keys at the
//!    top (`manifest`, `seg/`, `wm/`, ...); no such key starts with `run/` or `runs/`, so
//!    named runs never appear in its scans.
//! 4. **Runs are listed by a register.** Opening a view to write registers its name under
//!    `runs/NAME` (durable with the next flush); [`run_names`] reads that register, a few
//!    keys, instead of walking every run's segments.

use std::sync::Arc;

use super::{Page, PageLimit, Pair, Pairs, Store, StoreError};

/// Where named runs keep their keys (rule 1).
const RUN_PREFIX: &[u8] = b"run/";
/// The register of named runs (rule 4).
const REGISTER_PREFIX: &[u8] = b"runs/";
/// Longest run name (rule 2).
pub const MAX_RUN_NAME: usize = 64;

/// Checks a run name (rule 2).
pub fn check_run_name(name: &str) -> Result<(), StoreError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > MAX_RUN_NAME || name.starts_with('.') {
        return Err(StoreError::BadSpec(format!(
            "run name {name:?}: 1 to {MAX_RUN_NAME} characters, not starting with '.'"
        )));
    }
    if let Some(c) = name.chars().find(|&c| !ok_char(c)) {
        return Err(StoreError::BadSpec(format!(
            "run name {name:?}: {c:?} is not allowed (letters, digits, '.', '_' and '-')"
        )));
    }
    Ok(())
}

/// The names of the runs registered in `store` (rule 4), in order.
pub fn run_names(store: &dyn Store) -> Result<Vec<String>, StoreError> {
    let mut names = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let (keys, more) = store.scan_keys(REGISTER_PREFIX, after.as_deref(), 1024)?;
        for k in &keys {
            let name = &k[REGISTER_PREFIX.len()..];
            names.push(String::from_utf8_lossy(name).into_owned());
        }
        match (more, keys.last()) {
            (true, Some(last)) => after = Some(last.clone()),
            _ => return Ok(names),
        }
    }
}

/// A view of a store that holds one named run (rules 1-4).
pub struct Namespaced {
    inner: Arc<dyn Store>,
    name: String,
    prefix: Vec<u8>,
}

impl std::fmt::Debug for Namespaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespaced")
            .field("store", &self.inner.describe())
            .field("run", &self.name)
            .finish()
    }
}

impl Namespaced {
    /// The view of run `name` in `inner`, to read (nothing is written).
    pub fn new(inner: Arc<dyn Store>, name: &str) -> Result<Self, StoreError> {
        check_run_name(name)?;
        let mut prefix = RUN_PREFIX.to_vec();
        prefix.extend_from_slice(name.as_bytes());
        prefix.push(b'/');
        Ok(Self {
            inner,
            name: name.to_string(),
            prefix,
        })
    }

    /// The view of run `name` in `inner`, registered (rule 4) so that [`run_names`] lists it.
    pub fn create(inner: Arc<dyn Store>, name: &str) -> Result<Self, StoreError> {
        let view = Self::new(inner, name)?;
        let mut key = REGISTER_PREFIX.to_vec();
        key.extend_from_slice(name.as_bytes());
        view.inner.put(&key, &[])?;
        Ok(view)
    }

    /// Whether run `name` is registered in `inner`.
    pub fn exists(inner: &dyn Store, name: &str) -> Result<bool, StoreError> {
        check_run_name(name)?;
        let mut key = REGISTER_PREFIX.to_vec();
        key.extend_from_slice(name.as_bytes());
        Ok(inner.get(&key)?.is_some())
    }

    /// The run's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        k
    }

    fn strip(&self, mut key: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        if !key.starts_with(&self.prefix) {
            return Err(StoreError::Corruption(format!(
                "a scan of run {} returned a key outside it ({} bytes)",
                self.name,
                key.len()
            )));
        }
        key.drain(..self.prefix.len());
        Ok(key)
    }

    fn strip_pairs(&self, pairs: Pairs) -> Result<Pairs, StoreError> {
        pairs
            .into_iter()
            .map(|(k, v)| Ok((self.strip(k)?, v)))
            .collect()
    }

    fn pairs(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| (self.key(k), v.clone()))
            .collect()
    }
}

impl Store for Namespaced {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.inner.put(&self.key(key), value)
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        self.inner.put_batch(&self.pairs(pairs))
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(&self.key(key))
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        self.strip_pairs(self.inner.scan_prefix(&self.key(prefix))?)
    }

    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: PageLimit,
    ) -> Result<Page, StoreError> {
        let after = after.map(|a| self.key(a));
        let page = self
            .inner
            .scan_page(&self.key(prefix), after.as_deref(), limit)?;
        Ok(Page {
            pairs: self.strip_pairs(page.pairs)?,
            more: page.more,
        })
    }

    fn scan_keys(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        max_keys: usize,
    ) -> Result<(Vec<Vec<u8>>, bool), StoreError> {
        let after = after.map(|a| self.key(a));
        let (keys, more) = self
            .inner
            .scan_keys(&self.key(prefix), after.as_deref(), max_keys)?;
        let keys = keys
            .into_iter()
            .map(|k| self.strip(k))
            .collect::<Result<_, _>>()?;
        Ok((keys, more))
    }

    fn last_under(&self, prefix: &[u8]) -> Result<Option<Pair>, StoreError> {
        match self.inner.last_under(&self.key(prefix))? {
            Some((k, v)) => Ok(Some((self.strip(k)?, v))),
            None => Ok(None),
        }
    }

    fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        self.inner.delete(&self.key(key))
    }

    fn delete_batch(&self, keys: &[Vec<u8>]) -> Result<(), StoreError> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| self.key(k)).collect();
        self.inner.delete_batch(&keys)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    fn describe(&self) -> String {
        format!("{} (run {})", self.inner.describe(), self.name)
    }

    fn degraded(&self) -> Option<String> {
        self.inner.degraded()
    }

    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        self.inner.raise_fence(&self.key(scope), epoch)
    }

    fn keeps_fences(&self) -> bool {
        self.inner.keeps_fences()
    }

    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        let fences: Vec<(Vec<u8>, u64)> = fences.iter().map(|(s, e)| (self.key(s), *e)).collect();
        self.inner.put_batch_fenced(&fences, &self.pairs(pairs))
    }

    fn put_batch_fenced_content(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
        content: usize,
    ) -> Result<(), StoreError> {
        let fences: Vec<(Vec<u8>, u64)> = fences.iter().map(|(s, e)| (self.key(s), *e)).collect();
        self.inner
            .put_batch_fenced_content(&fences, &self.pairs(pairs), content)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn view(inner: &Arc<dyn Store>, name: &str) -> Namespaced {
        Namespaced::create(inner.clone(), name).unwrap()
    }

    #[test]
    fn a_view_keeps_the_store_rules() {
        let inner: Arc<dyn Store> = Arc::new(MemoryStore::default());
        super::super::tests::exercise(&view(&inner, "a"));
        super::super::tests::exercise_pages(&view(&inner, "b"));
    }

    #[test]
    fn runs_do_not_see_each_other_nor_the_unnamed_run() {
        let inner: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let (a, b) = (view(&inner, "a"), view(&inner, "a-2"));
        inner.put(b"manifest", b"top").unwrap();
        a.put(b"manifest", b"A").unwrap();
        b.put_batch(&[(b"manifest".to_vec(), b"B".to_vec())])
            .unwrap();
        a.put(b"seg/1", b"a1").unwrap();
        b.put(b"seg/1", b"b1").unwrap();
        assert_eq!(a.get(b"manifest").unwrap().unwrap(), b"A");
        assert_eq!(b.get(b"manifest").unwrap().unwrap(), b"B");
        assert_eq!(inner.get(b"manifest").unwrap().unwrap(), b"top");
        // "a" is a prefix of "a-2" as a string: the '/' after the name keeps them apart.
        assert_eq!(
            a.scan_prefix(b"").unwrap(),
            vec![
                (b"manifest".to_vec(), b"A".to_vec()),
                (b"seg/1".to_vec(), b"a1".to_vec())
            ]
        );
        assert_eq!(a.last_under(b"seg/").unwrap().unwrap().1, b"a1");
        let (keys, more) = b.scan_keys(b"", None, 10).unwrap();
        assert_eq!(keys, vec![b"manifest".to_vec(), b"seg/1".to_vec()]);
        assert!(!more);
        // The unnamed run's own prefixes never reach into named runs (rule 3).
        for p in [&b"seg/"[..], b"wm/", b"ck/", b"manifest", b"coord"] {
            assert!(inner
                .scan_prefix(p)
                .unwrap()
                .iter()
                .all(|(k, _)| !k.starts_with(RUN_PREFIX) && !k.starts_with(REGISTER_PREFIX)));
        }
        assert_eq!(run_names(&*inner).unwrap(), vec!["a", "a-2"]);
        assert!(Namespaced::exists(&*inner, "a").unwrap());
        assert!(!Namespaced::exists(&*inner, "c").unwrap());
    }

    #[test]
    fn fences_are_per_run() {
        let inner: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let (a, b) = (view(&inner, "a"), view(&inner, "b"));
        a.raise_fence(b"v0", 5).unwrap();
        let batch = [(b"seg/1".to_vec(), b"x".to_vec())];
        assert!(matches!(
            a.put_batch_fenced(&[(b"v0".to_vec(), 4)], &batch),
            Err(StoreError::Fenced { .. })
        ));
        // The same scope in another run is not fenced.
        b.put_batch_fenced(&[(b"v0".to_vec(), 1)], &batch).unwrap();
        assert_eq!(b.get(b"seg/1").unwrap().unwrap(), b"x");
        assert_eq!(a.get(b"seg/1").unwrap(), None);
    }

    #[test]
    fn names_that_could_escape_or_confuse_are_refused() {
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", "é", &"x".repeat(65)] {
            assert!(check_run_name(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "nightly-2026.11.26", "job_12", &"x".repeat(64)] {
            check_run_name(good).unwrap();
        }
    }
}

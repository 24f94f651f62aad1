//! An in-memory store: a sorted map behind a mutex. Durable for the life of the process only.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{fill_page, page_start, Fences, Page, PageLimit, Pairs, Store, StoreError};

/// A store in RAM (tests, and runs with nothing to survive). It keeps epoch fences: the
/// cluster simulator shares one among all its simulated processes.
#[derive(Debug, Default)]
pub struct MemoryStore {
    map: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    fences: Fences,
}

impl MemoryStore {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        // A poisoned lock only means another thread panicked mid-call; the map itself is
        // always left consistent (each call does one insert/remove), so keep going.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemoryStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.map().insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        let mut m = self.map();
        for (k, v) in pairs {
            m.insert(k.clone(), v.clone());
        }
        Ok(())
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.map().get(key).cloned())
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        let m = self.map();
        Ok(m.range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: PageLimit,
    ) -> Result<Page, StoreError> {
        let m = self.map();
        let range = (page_start(prefix, after), std::ops::Bound::Unbounded);
        fill_page(
            m.range::<[u8], _>(range)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| Ok((k.clone(), v.clone()))),
            limit,
        )
    }

    fn scan_keys(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        max_keys: usize,
    ) -> Result<(Vec<Vec<u8>>, bool), StoreError> {
        let m = self.map();
        let range = (page_start(prefix, after), std::ops::Bound::Unbounded);
        let mut keys: Vec<Vec<u8>> = m
            .range::<[u8], _>(range)
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(prefix))
            .take(max_keys.max(1) + 1)
            .cloned()
            .collect();
        let more = keys.len() > max_keys.max(1);
        keys.truncate(max_keys.max(1));
        Ok((keys, more))
    }

    fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        self.map().remove(key);
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }

    fn keeps_fences(&self) -> bool {
        true
    }

    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        self.fences.raise(scope, epoch);
        Ok(())
    }

    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        self.fences.admit(fences, || self.put_batch(pairs))
    }
}

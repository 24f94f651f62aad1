//! Epoch fences (DESIGN.md "Cluster mode as state machines"): a scope (a vnode's log) has a
//! newest epoch, raised by each new incarnation before it reads the scope; a write carrying
//! an older epoch is refused, so a zombie (an incarnation declared dead that still runs) can
//! never leave a stale segment in the middle of its successor's log.
//!
//! Rules:
//!
//! 1. [`Fences::raise`] sets a scope's epoch to at least the one given, and refuses nothing
//!    itself: a deposed incarnation raising an older epoch leaves the fence where it is, and
//!    its later writes are refused.
//! 2. [`Fences::admit`] checks every (scope, epoch) of a batch before any of it is written:
//!    the whole batch is refused if one of them is older than its scope's fence.
//! 3. Where fences live: [`Fences`] in RAM for [`super::MemoryStore`] (they last as long as
//!    its data); a sled tree of their own for [`super::SledStore`] (invisible to every scan,
//!    so no client key can collide with them, durable with the next flush like any write); on
//!    every checkpoint server for [`crate::RemoteStore`] (strategy rules 10-11).

use std::collections::HashMap;
use std::sync::Mutex;

use super::StoreError;

/// The newest epoch of each scope (rules 1-2).
#[derive(Debug, Default)]
pub struct Fences {
    newest: Mutex<HashMap<Vec<u8>, u64>>,
}

impl Fences {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, u64>> {
        self.newest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rule 1.
    pub fn raise(&self, scope: &[u8], epoch: u64) {
        let mut m = self.map();
        let e = m.entry(scope.to_vec()).or_insert(epoch);
        *e = (*e).max(epoch);
    }

    /// Rule 2: Ok if every (scope, epoch) is at or above its scope's fence. Holds the lock
    /// through `then`, so that no fence moves between the check and the write.
    pub fn admit<T>(
        &self,
        fences: &[(Vec<u8>, u64)],
        then: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let m = self.map();
        for (scope, epoch) in fences {
            admit_one(scope, *epoch, m.get(scope).copied())?;
        }
        then()
    }
}

/// Rule 2 for one (scope, epoch) against the scope's fence `newest` (none: never raised).
pub(crate) fn admit_one(scope: &[u8], epoch: u64, newest: Option<u64>) -> Result<(), StoreError> {
    match newest {
        Some(newest) if epoch < newest => Err(StoreError::Fenced {
            scope: String::from_utf8_lossy(scope).into_owned(),
            epoch,
            newest,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_epoch_is_refused_once_a_newer_one_is_raised_and_raising_back_does_nothing() {
        let f = Fences::default();
        let ok = || Ok(());
        f.admit(&[(b"v1".to_vec(), 0)], ok).unwrap();
        f.raise(b"v1", 2);
        f.raise(b"v1", 1); // a deposed incarnation cannot lower it
        let err = f.admit(&[(b"v1".to_vec(), 1)], ok).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Fenced {
                    epoch: 1,
                    newest: 2,
                    ..
                }
            ),
            "{err}"
        );
        f.admit(&[(b"v1".to_vec(), 2), (b"v2".to_vec(), 0)], ok)
            .unwrap();
        // One stale scope refuses the whole batch before anything is written.
        let mut wrote = false;
        let r = f.admit(&[(b"v2".to_vec(), 0), (b"v1".to_vec(), 0)], || {
            wrote = true;
            Ok(())
        });
        assert!(r.is_err() && !wrote);
    }
}

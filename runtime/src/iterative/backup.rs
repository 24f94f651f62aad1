//! Data backups on a store (rule 5 with [`IterConfig::store`](super::IterConfig::store)):
//! one live copy per vnode, whatever the run's length.
//!
//! # Rules
//!
//! 1. **Pieces.** A backup is stored as pieces of at most `PIECE` bytes under
//!    `iter/{v}/data/{generation:016x}/{piece:08x}`, then a head under `iter/{v}/data` naming
//!    the generation, the step, the iteration, the length, the piece count and the blake3
//!    digest of the state. Pieces and head go in one batch, then one flush for a backup that
//!    must be durable (a forced one, rule 5 of the module docs): the head is never durable
//!    without its pieces. A round-robin backup is not flushed (as a round-robin backup to a
//!    neighbour is not acknowledged): the next flush makes it durable, and until then the
//!    store's log order (sled: a durable prefix) keeps the head and its pieces together.
//! 2. **Replace, then reclaim.** Each backup is a new generation; once it is flushed, the
//!    pieces of the previous generation are deleted (made durable by the next flush). So the
//!    store holds one backup, two while one is written: disk use stays within twice the live
//!    state plus what the store engine keeps (below).
//! 3. **Read.** The head is read, then its pieces; a missing piece, a wrong length or a digest
//!    mismatch is a [`IterError::Store`] naming the vnode. Pieces of other generations (left by
//!    a crash between rules 1 and 2) are deleted by the replacement that reads the backup.
//! 4. **Fences.** Every batch is written fenced by the writer's epoch under the scope
//!    `iter/{v}/`, and a replacement raises the fence to its epoch before it reads. So once a
//!    replacement has read the backup, an incarnation declared dead that still runs (a zombie,
//!    back from a pause) can no longer replace it, nor delete the pieces it names: its write
//!    is refused ([`IterError::Superseded`]) and it stops.
//!
//! Why pieces: sled 0.34 (the `local:` store and the checkpoint servers' fragments) writes a
//! page larger than a quarter of its 512 KiB log segment to a blob file of its own and never
//! deletes the blob files of pages it replaced (sled issue 786). A page is a tree leaf of up
//! to 16 entries (sled's `Node::should_split`), so the pieces must keep 16 of them under
//! 128 KiB. Measured on this machine, 400 overwrites of one 200 KB value left 80 MB; the same
//! overwrites as 4 KiB pieces stayed under 3.2 MB, because the leaves live in the log
//! segments, which sled's cleaner rewrites and frees. `transport3d run --mode async --nx 24
//! --ny 24 --nz 24 --blocks 2 --dt 60 --t-end 1800 --store local:DIR` left 183 MB before,
//! 6.2 MB with 32 KiB pieces (leaves of 16 pieces went to blob files), and see PIECE.

use veriflow_checkpoint::{Store, StoreError};

use super::IterError;
use crate::ids::VnodeId;

/// Largest piece: 4 KiB, so that a sled leaf of 16 pieces (64 KiB with keys) stays under
/// sled's blob threshold (128 KiB less a header, at its default 512 KiB segments).
pub(crate) const PIECE: usize = 4 * 1024;

/// "IB1\0": iterative backup head, format 1.
const MAGIC: [u8; 4] = *b"IB1\0";
/// magic, generation, step, iteration, length, pieces, digest.
const HEAD_LEN: usize = 4 + 8 * 4 + 4 + 32;

/// The newest backup a vnode stored: (generation, pieces), and the epoch of the incarnation
/// that writes (rule 4).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StoreBackup {
    head: Option<(u64, u32)>,
    epoch: u64,
}

fn head_key(v: VnodeId) -> Vec<u8> {
    format!("iter/{}/data", v.0).into_bytes()
}

fn pieces_prefix(v: VnodeId) -> Vec<u8> {
    format!("iter/{}/data/", v.0).into_bytes()
}

fn piece_key(v: VnodeId, generation: u64, piece: u32) -> Vec<u8> {
    format!("iter/{}/data/{generation:016x}/{piece:08x}", v.0).into_bytes()
}

/// The fence scope of vnode `v`'s backups (rule 4).
fn fence_scope(v: VnodeId) -> Vec<u8> {
    format!("iter/{}/", v.0).into_bytes()
}

fn store_err(v: VnodeId) -> impl Fn(StoreError) -> IterError {
    move |e| match e {
        // Rule 4: a newer incarnation of the vnode has read the backups.
        StoreError::Fenced { epoch, newest, .. } => IterError::Superseded {
            vnode: v,
            epoch,
            newest,
        },
        e => IterError::Store {
            vnode: v,
            message: e.to_string(),
        },
    }
}

impl StoreBackup {
    /// The backups of the incarnation at `epoch`.
    pub(crate) fn new(epoch: crate::ids::Epoch) -> Self {
        StoreBackup {
            head: None,
            epoch: epoch.0,
        }
    }

    /// Rules 1-2: stores `state` of step `step`, iteration `iter` as vnode `v`'s backup,
    /// flushed if `durable`.
    pub(crate) fn put(
        &mut self,
        store: &dyn Store,
        v: VnodeId,
        (step, iter): (u64, u64),
        state: &[u8],
        durable: bool,
    ) -> Result<(), IterError> {
        let err = store_err(v);
        let generation = self.head.map_or(0, |(g, _)| g + 1);
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = state
            .chunks(PIECE)
            .enumerate()
            // A state of 2^32 pieces (128 TiB) cannot be in memory.
            .map(|(i, p)| (piece_key(v, generation, i as u32), p.to_vec()))
            .collect();
        let pieces = u32::try_from(pairs.len()).map_err(|_| IterError::Store {
            vnode: v,
            message: format!("a state of {} bytes is too large", state.len()),
        })?;
        let mut head = Vec::with_capacity(HEAD_LEN);
        head.extend_from_slice(&MAGIC);
        for x in [generation, step, iter, state.len() as u64] {
            head.extend_from_slice(&x.to_le_bytes());
        }
        head.extend_from_slice(&pieces.to_le_bytes());
        head.extend_from_slice(blake3::hash(state).as_bytes());
        pairs.push((head_key(v), head));
        store
            .put_batch_fenced(&[(fence_scope(v), self.epoch)], &pairs)
            .map_err(&err)?;
        if durable {
            store.flush().map_err(&err)?;
        }
        if let Some((old, n)) = self.head.replace((generation, pieces)) {
            for i in 0..n {
                store.delete(&piece_key(v, old, i)).map_err(&err)?;
            }
        }
        Ok(())
    }

    /// Rule 3: vnode `v`'s backup, if it has one: (step, iteration, state); then the pieces
    /// of other generations are deleted, and the next backup follows this one.
    pub(crate) fn get(
        &mut self,
        store: &dyn Store,
        v: VnodeId,
    ) -> Result<Option<(u64, u64, Vec<u8>)>, IterError> {
        // Rule 4: from now on, the incarnations before this one write nothing more.
        store
            .raise_fence(&fence_scope(v), self.epoch)
            .map_err(store_err(v))?;
        let Some((generation, pieces, found)) = read(store, v)? else {
            return Ok(None);
        };
        self.head = Some((generation, pieces));
        // Rule 3: pieces of other generations are garbage of a crash between rules 1 and 2.
        let own = piece_key(v, generation, 0);
        let own = &own[..own.len() - 8];
        for (key, _) in store.scan_prefix(&pieces_prefix(v)).map_err(store_err(v))? {
            if !key.starts_with(own) {
                store.delete(&key).map_err(store_err(v))?;
            }
        }
        Ok(Some(found))
    }
}

/// A backup as read: generation, pieces, and (step, iteration, state).
type Read = (u64, u32, (u64, u64, Vec<u8>));

/// Rule 3 without writing anything: vnode `v`'s backup, if it has one.
pub(crate) fn read(store: &dyn Store, v: VnodeId) -> Result<Option<Read>, IterError> {
    let err = store_err(v);
    let bad = |message: String| IterError::Store { vnode: v, message };
    let Some(head) = store.get(&head_key(v)).map_err(&err)? else {
        return Ok(None);
    };
    if head.len() != HEAD_LEN || head[..4] != MAGIC {
        return Err(bad(format!(
            "the data backup's head ({} bytes) is not one",
            head.len()
        )));
    }
    let word = |i: usize| {
        let at = 4 + 8 * i;
        u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"))
    };
    let (generation, step, iter, len) = (word(0), word(1), word(2), word(3));
    let pieces = u32::from_le_bytes(head[36..40].try_into().expect("4 bytes"));
    let digest = &head[40..72];
    // The length must be what the pieces can hold, before anything is allocated for it.
    if len.div_ceil(PIECE as u64) != u64::from(pieces) {
        return Err(bad(format!(
            "the data backup's head says {len} bytes in {pieces} pieces"
        )));
    }
    let mut state = Vec::new();
    for i in 0..pieces {
        let piece = store
            .get(&piece_key(v, generation, i))
            .map_err(&err)?
            .ok_or_else(|| {
                bad(format!(
                    "piece {i} of {pieces} of the data backup (generation {generation}) is missing"
                ))
            })?;
        state.extend_from_slice(&piece);
    }
    if state.len() as u64 != len || blake3::hash(&state).as_bytes() != digest {
        return Err(bad(format!(
            "the data backup (generation {generation}, {len} bytes) does not match its digest"
        )));
    }
    Ok(Some((generation, pieces, (step, iter, state))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use veriflow_checkpoint::MemoryStore;

    #[test]
    fn a_backup_replaces_the_previous_one_and_reads_back() {
        let store = MemoryStore::default();
        let v = VnodeId(3);
        let mut b = StoreBackup::default();
        for (step, size) in [(0u64, 10usize), (1, 3 * PIECE + 7), (2, PIECE), (3, 0)] {
            let state: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
            b.put(&store, v, (step, 5), &state, step % 2 == 0).unwrap();
            let mut fresh = StoreBackup::new(crate::ids::Epoch(0));
            assert_eq!(fresh.get(&store, v).unwrap(), Some((step, 5, state)));
            // One generation's pieces, nothing else.
            let keys = store.scan_prefix(&pieces_prefix(v)).unwrap();
            assert_eq!(keys.len(), size.div_ceil(PIECE), "step {step}");
        }
        assert_eq!(
            StoreBackup::new(crate::ids::Epoch(0))
                .get(&store, VnodeId(4))
                .unwrap(),
            None
        );
    }

    #[test]
    fn damaged_backups_are_errors() {
        let store = MemoryStore::default();
        let v = VnodeId(0);
        let state = vec![7u8; 2 * PIECE + 1];
        StoreBackup::new(crate::ids::Epoch(0))
            .put(&store, v, (1, 2), &state, true)
            .unwrap();
        // A piece changed, a piece missing, a head cut.
        store.put(&piece_key(v, 0, 1), b"x").unwrap();
        let e = StoreBackup::new(crate::ids::Epoch(0))
            .get(&store, v)
            .unwrap_err();
        assert!(e.to_string().contains("digest"), "{e}");
        store.delete(&piece_key(v, 0, 1)).unwrap();
        let e = StoreBackup::new(crate::ids::Epoch(0))
            .get(&store, v)
            .unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        store.put(&head_key(v), b"IB1\0short").unwrap();
        let e = StoreBackup::new(crate::ids::Epoch(0))
            .get(&store, v)
            .unwrap_err();
        assert!(e.to_string().contains("v0"), "{e}");
    }

    #[test]
    fn a_zombie_cannot_replace_the_backup_its_replacement_read() {
        let store = MemoryStore::default();
        let v = VnodeId(2);
        let mut zombie = StoreBackup::new(crate::ids::Epoch(0));
        zombie.put(&store, v, (0, 10), &[1u8; 50], true).unwrap();
        let mut replacement = StoreBackup::new(crate::ids::Epoch(1));
        assert_eq!(
            replacement.get(&store, v).unwrap().unwrap().2,
            vec![1u8; 50]
        );
        let e = zombie
            .put(&store, v, (0, 20), &[9u8; 50], true)
            .unwrap_err();
        assert!(matches!(e, IterError::Superseded { .. }), "{e}");
        // The replacement's backup is whole, and it goes on writing.
        replacement
            .put(&store, v, (0, 11), &[2u8; 50], true)
            .unwrap();
        let got = StoreBackup::new(crate::ids::Epoch(1))
            .get(&store, v)
            .unwrap();
        assert_eq!(got, Some((0, 11, vec![2u8; 50])));
    }

    #[test]
    fn a_replacement_removes_pieces_a_crash_left() {
        let store = MemoryStore::default();
        let v = VnodeId(1);
        let mut b = StoreBackup::default();
        b.put(&store, v, (0, 1), &[1u8; 100], true).unwrap();
        // A crash after writing generation 1's pieces' batch but before deleting generation 0:
        // simulated by an orphan piece of another generation.
        store.put(&piece_key(v, 9, 0), b"orphan").unwrap();
        let mut r = StoreBackup::new(crate::ids::Epoch(0));
        assert_eq!(r.get(&store, v).unwrap().unwrap().2, vec![1u8; 100]);
        assert_eq!(store.scan_prefix(&pieces_prefix(v)).unwrap().len(), 1);
        // And goes on from the generation it read.
        r.put(&store, v, (1, 1), &[2u8; 10], true).unwrap();
        assert_eq!(store.scan_prefix(&pieces_prefix(v)).unwrap().len(), 1);
    }
}

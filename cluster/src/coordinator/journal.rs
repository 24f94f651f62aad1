//! The coordinator's journal and lease on the checkpoint store (issue 15: no single point of
//! failure). Both are ordinary store values, so they get the same replication, parity or IDA
//! as the logs, and both are written under the store's epoch fence of scope [`FENCE_SCOPE`]
//! at the writer's term, so a deposed coordinator's writes are refused.
//!
//! Rules:
//!
//! 1. **Terms.** Every coordinator that becomes active takes a term larger than every term it
//!    has seen in the store: `(round + 1) << 16 | tag`, where `round` is the old term's upper
//!    bits and `tag` 16 bits of its own address's hash. Two candidates racing for one round get
//!    different terms, so the store's fence (which admits equal epochs) separates them: the
//!    smaller term's next write is refused.
//! 2. **Takeover.** A candidate raises the fence of [`FENCE_SCOPE`] to its term, writes the
//!    lease at that term, and reads the lease back: a lease of another holder means a larger
//!    term won, and the candidate stays a standby. Only then does it read the journal.
//! 3. **Write-ahead.** The coordinator journals its state (members, the job's map and epochs,
//!    whether the job is stopping, its summary once finished) *before* it sends the orders that
//!    follow from it (`coordinator` rule 9), so a successor never knows less than any worker
//!    was told. A refused write ([`StoreError::Fenced`]) means a successor exists: the writer
//!    steps down at once without sending anything more.
//! 4. **Lease.** The active coordinator rewrites the lease every [`LeaseParams::renew`] with
//!    a beat counter. A standby reads it as often and takes over when the beat has not moved
//!    for [`LeaseParams::expiry`] of its own clock: no clocks are compared across machines.
//!    A writer that finds a lease of a newer term before it writes steps down too: stores that
//!    keep no fences (`local:`, which a coordinator refuses anyway) still stop a woken one.
//! 5. **Damage.** Both records are framed with a digest (`veriflow_runtime::codec`); a
//!    damaged or unreadable record is an error naming it, never an empty state.
//! 6. **Written once.** Each lease and each journal is written under a key of its own,
//!    `coord/lease/<term><beat>` and `coord/journal/<term><seq>` (big-endian, so newer keys
//!    sort after older ones), and read as the newest key that can be read
//!    ([`Store::last_under`]). A key's bytes follow from the key (one writer per term, one
//!    record per beat or sequence number; a retry writes the same record again), so the
//!    writes carry the store's content stamp and a retry is the same fragments again
//!    (`strategy.rs` rule 13 of the checkpoint crate). Every [`TIDY_EVERY`] writes, the
//!    writer deletes the keys older than the one before its last; a failed delete is left
//!    for the next. Never an overwrite in place: found by `knary chaos` (ida:4,2), a
//!    coordinator whose journal overwrite straddled its successor's fence raise left the new
//!    journal on three servers and the old one on three, neither readable, and the successor
//!    stood by for ever while no coordinator was active. A write-once key that reached too
//!    few servers reads as absent (the seal of the fence raise deletes it where it can) and
//!    leaves the one before it whole; and the proof of the checkpoint crate's fences, which
//!    needs every key under a fence scope written once, now holds for this scope too.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use veriflow_checkpoint::{Store, StoreError};
use veriflow_runtime::codec;

use crate::protocol::{Hosting, JobSpec, ToSubmit, WorkerId};

/// The fence scope of the coordinator's records (rule 1).
pub const FENCE_SCOPE: &[u8] = b"coord";
/// Prefix of the lease's keys (rules 4 and 6).
pub const LEASE_PREFIX: &[u8] = b"coord/lease/";
/// Prefix of the journal's keys (rules 3 and 6).
pub const JOURNAL_PREFIX: &[u8] = b"coord/journal/";
/// The one journal key of formats 1 and 2, overwritten in place (before rule 6): refused by
/// name.
const OLD_JOURNAL_KEY: &[u8] = b"coord/journal";
/// A writer deletes its older records after every this many writes (rule 6).
const TIDY_EVERY: u64 = 16;

const LEASE_MAGIC: [u8; 4] = *b"VFCL";
/// Format 2 (many jobs: running, queued and ended ones).
const JOURNAL_MAGIC: [u8; 4] = *b"VFC2";
/// Largest journal accepted: 4,096 vnodes and a few thousand members fit many times.
const JOURNAL_LIMIT: u64 = 64 << 20;

/// How often the lease is renewed and when a standby takes over (rule 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseParams {
    /// The active coordinator renews this often; a standby reads this often.
    pub renew: Duration,
    /// A lease whose beat has not moved for this long is expired.
    pub expiry: Duration,
}

impl LeaseParams {
    /// Renewal at a quarter of `expiry`.
    pub fn with_expiry(expiry: Duration) -> LeaseParams {
        LeaseParams {
            renew: (expiry / 4).max(Duration::from_millis(10)),
            expiry,
        }
    }
}

impl Default for LeaseParams {
    fn default() -> Self {
        LeaseParams::with_expiry(Duration::from_secs(2))
    }
}

/// Who holds the coordinator role, and a beat that moves while it lives (rule 4).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The holder's term (rule 1).
    pub term: u64,
    /// Where workers and clients reach the holder.
    pub holder: String,
    /// Renewals so far.
    pub beat: u64,
}

/// A worker admitted by a coordinator, as its successor needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// The program (app) it runs.
    pub program: String,
    /// Where its peers reach it.
    pub peer_addr: String,
    /// Its threads.
    pub threads: u32,
    /// Whether it joined as a spare.
    pub spare: bool,
    /// Its Ed25519 public key: a rejoin proves the matching secret key (`coordinator` rule 10).
    pub public_key: [u8; 32],
}

/// A running job, as its coordinator's successor needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job's id.
    pub id: u64,
    /// The program (app) it runs.
    pub program: String,
    /// What was submitted.
    pub spec: JobSpec,
    /// Host of each vnode.
    pub host: Vec<WorkerId>,
    /// Epoch of each vnode.
    pub epoch: Vec<u64>,
    /// The job's live members.
    pub members: Vec<WorkerId>,
    /// The coordinator decided the run is over (or was cancelled) and told the members to stop.
    pub stopping: bool,
    /// A client cancelled it (`coordinator` rule 12).
    pub cancelled: bool,
    /// Workers lost so far.
    pub lost: u32,
    /// Seconds the job had run when this was written.
    pub elapsed_s: f64,
    /// UNIX time the job started at, in seconds (0: the writer's clock did not know it); a
    /// successor measures the job's time from it (`elapsed_s` would miss the time between the
    /// last write and the takeover).
    pub started_unix_s: f64,
    /// The online oracle follows the job (`coordinator` rule 11).
    pub followed: Option<Followed>,
}

/// What a job the online oracle follows keeps (`coordinator` rule 11).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Followed {
    /// The oracle's commitment, once it sent it.
    pub commitment: Option<[u8; 32]>,
    /// Every incarnation of the job so far: (vnode, epoch, host).
    pub hosts: Vec<Hosting>,
    /// Workers evicted for forging, with their public keys (refused for the rest of the job).
    pub evicted: Vec<(WorkerId, [u8; 32])>,
}

/// A job waiting in the queue (`coordinator` rule 12).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuedRecord {
    /// The id it was given at submission.
    pub id: u64,
    /// The program (app) it runs.
    pub program: String,
    /// What was submitted.
    pub spec: JobSpec,
}

/// A job that ended (`coordinator` rule 12).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EndedRecord {
    /// Its id.
    pub id: u64,
    /// The program (app) it ran.
    pub program: String,
    /// The submit command line.
    pub argv: Vec<String>,
    /// Whether it was cancelled (its end is then `Failed`).
    pub cancelled: bool,
    /// Its end: `Finished` or `Failed`.
    pub end: ToSubmit,
}

/// Everything a successor needs (rule 3).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Journal {
    /// The writer's term.
    pub term: u64,
    /// The next worker id to give.
    pub next_worker: WorkerId,
    /// The next job id to give.
    pub next_job: u64,
    /// Admitted workers, not lost.
    pub members: BTreeMap<WorkerId, MemberRecord>,
    /// Lost workers: never admitted again (`coordinator` rule 5).
    pub gone: BTreeSet<WorkerId>,
    /// The running jobs, by id.
    pub jobs: Vec<JobRecord>,
    /// The queued jobs, in submission order: a successor keeps them (`coordinator` rule 12).
    pub queue: Vec<QueuedRecord>,
    /// The last jobs' ends (at most [`crate::protocol::ENDED_KEPT`], oldest first), for
    /// `APP jobs` and a client that reattaches after its job ended.
    pub ended: Vec<EndedRecord>,
    /// Every coordinator address known (the active one first): workers and clients learn them.
    pub coordinators: Vec<String>,
}

/// A journal or lease operation failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A coordinator of a larger term exists: step down (rule 3).
    #[error("deposed: a coordinator of a newer term took over ({0})")]
    Deposed(StoreError),
    /// The store failed.
    #[error("the store failed: {0}")]
    Store(StoreError),
    /// A record is damaged (rule 5).
    #[error("the coordinator's {what} in the store is damaged: {reason}")]
    Damaged {
        /// Which record.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

impl From<StoreError> for JournalError {
    fn from(e: StoreError) -> Self {
        match e {
            e @ StoreError::Fenced { .. } => JournalError::Deposed(e),
            e => JournalError::Store(e),
        }
    }
}

/// The term a candidate at `addr` takes after having seen `seen` (rule 1).
pub fn next_term(seen: u64, addr: &str) -> u64 {
    let tag = u64::from(u16::from_le_bytes(
        blake3::hash(addr.as_bytes()).as_bytes()[..2]
            .try_into()
            .unwrap_or_default(),
    ));
    (((seen >> 16) + 1) << 16) | tag
}

/// The key of a record written once (rule 6): `prefix`, the writer's term, then `n`.
fn record_key(prefix: &[u8], term: u64, n: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + 16);
    k.extend_from_slice(prefix);
    k.extend_from_slice(&term.to_be_bytes());
    k.extend_from_slice(&n.to_be_bytes());
    k
}

/// Writes `value` once under `record_key(prefix, term, n)`, fenced at `term` (rules 1 and 6),
/// then tidies every [`TIDY_EVERY`] writes.
fn put_record(
    store: &dyn Store,
    prefix: &[u8],
    term: u64,
    n: u64,
    value: Vec<u8>,
) -> Result<(), JournalError> {
    let key = record_key(prefix, term, n);
    store.put_batch_fenced_content(&[(FENCE_SCOPE.to_vec(), term)], &[(key, value)], 1)?;
    if n % TIDY_EVERY == 1 {
        tidy(store, prefix, &record_key(prefix, term, n - 1));
    }
    Ok(())
}

/// Rule 6: deletes the keys under `prefix` older than `keep`, best effort (a failure is
/// retried by the next tidy; leftovers only cost a listing).
fn tidy(store: &dyn Store, prefix: &[u8], keep: &[u8]) {
    let old = match store.scan_keys(prefix, None, 1024) {
        Ok((keys, _)) => keys
            .into_iter()
            .filter(|k| k.as_slice() < keep)
            .collect::<Vec<_>>(),
        Err(e) => {
            tracing::debug!(error = %e, "coordinator records not listed for tidying");
            return;
        }
    };
    if let Err(e) = store.delete_batch(&old) {
        tracing::debug!(error = %e, keys = old.len(), "old coordinator records not deleted");
    }
}

/// The newest record under `prefix` that reads (rule 6).
fn newest_record(store: &dyn Store, prefix: &[u8]) -> Result<Option<Vec<u8>>, JournalError> {
    Ok(store.last_under(prefix)?.map(|(_, v)| v))
}

/// The lease, if any coordinator ever took the role here.
pub fn read_lease(store: &dyn Store) -> Result<Option<Lease>, JournalError> {
    let Some(bytes) = newest_record(store, LEASE_PREFIX)? else {
        return Ok(None);
    };
    let damaged = |reason: String| JournalError::Damaged {
        what: "lease",
        reason,
    };
    let payload =
        codec::unframe(LEASE_MAGIC, &bytes, 1 << 16).map_err(|e| damaged(e.to_string()))?;
    codec::decode(payload)
        .map(Some)
        .map_err(|e| damaged(e.to_string()))
}

/// Renews `lease` (rule 4): a lease of a newer term in the store deposes this holder.
pub fn renew_lease(store: &dyn Store, lease: &Lease) -> Result<(), JournalError> {
    if let Some(l) = read_lease(store)? {
        if l.term > lease.term {
            return Err(JournalError::Deposed(StoreError::Fenced {
                scope: String::from_utf8_lossy(FENCE_SCOPE).into_owned(),
                epoch: lease.term,
                newest: l.term,
            }));
        }
    }
    write_lease(store, lease)
}

/// Writes `lease` under its own key, `(term, beat)` (rule 6).
pub fn write_lease(store: &dyn Store, lease: &Lease) -> Result<(), JournalError> {
    let bytes = codec::encode(lease).map_err(|e| JournalError::Damaged {
        what: "lease",
        reason: e.to_string(),
    })?;
    put_record(
        store,
        LEASE_PREFIX,
        lease.term,
        lease.beat,
        codec::frame(LEASE_MAGIC, &bytes),
    )
}

/// The newest journal, if any coordinator wrote one here.
pub fn read_journal(store: &dyn Store) -> Result<Option<Journal>, JournalError> {
    let damaged = |reason: String| JournalError::Damaged {
        what: "journal",
        reason,
    };
    let Some(bytes) = newest_record(store, JOURNAL_PREFIX)? else {
        if store.get(OLD_JOURNAL_KEY)?.is_some() {
            return Err(damaged(
                "it was written by an older veriflow (one record overwritten in place): finish \
                 its jobs with that version, or start the coordinators on a fresh store"
                    .to_string(),
            ));
        }
        return Ok(None);
    };
    let payload =
        codec::unframe(JOURNAL_MAGIC, &bytes, JOURNAL_LIMIT).map_err(|e| damaged(e.to_string()))?;
    codec::decode(payload)
        .map(Some)
        .map_err(|e| damaged(e.to_string()))
}

/// Writes `journal` as its writer's record number `seq` (rule 6: one number per record; a
/// retry of one record keeps its number), unless a lease of a newer term is found (rule 4).
pub fn write_journal(store: &dyn Store, journal: &Journal, seq: u64) -> Result<(), JournalError> {
    if let Some(l) = read_lease(store)? {
        if l.term > journal.term {
            return Err(JournalError::Deposed(StoreError::Fenced {
                scope: String::from_utf8_lossy(FENCE_SCOPE).into_owned(),
                epoch: journal.term,
                newest: l.term,
            }));
        }
    }
    let bytes = codec::encode(journal).map_err(|e| JournalError::Damaged {
        what: "journal",
        reason: e.to_string(),
    })?;
    put_record(
        store,
        JOURNAL_PREFIX,
        journal.term,
        seq,
        codec::frame(JOURNAL_MAGIC, &bytes),
    )
}

/// Rule 2: takes the coordinator role at `term` for `holder`. `Ok(false)` when a larger term
/// won the race.
pub fn take_over(store: &dyn Store, term: u64, holder: &str) -> Result<bool, JournalError> {
    store.raise_fence(FENCE_SCOPE, term)?;
    let lease = Lease {
        term,
        holder: holder.to_string(),
        beat: 0,
    };
    match write_lease(store, &lease) {
        Ok(()) => {}
        Err(JournalError::Deposed(_)) => return Ok(false),
        Err(e) => return Err(e),
    }
    Ok(read_lease(store)?.is_some_and(|l| l.term == term && l.holder == holder))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;
    use veriflow_checkpoint::client::ClientError;
    use veriflow_checkpoint::{
        Ack, Layout, MemoryStore, RemoteStore, ServerAnswer, ServerCall, ServerLink,
    };

    #[test]
    fn terms_grow_and_two_candidates_of_one_round_differ() {
        let a = next_term(0, "127.0.0.1:1");
        let b = next_term(0, "127.0.0.1:2");
        assert_ne!(a, b);
        assert!(a > 0xffff && b > 0xffff);
        assert!(next_term(a.max(b), "127.0.0.1:1") > a.max(b));
    }

    #[test]
    fn a_deposed_coordinator_cannot_write() {
        let store = MemoryStore::default();
        let old = next_term(0, "a");
        assert!(take_over(&store, old, "a").unwrap());
        let j = Journal {
            term: old,
            next_worker: 3,
            ..Journal::default()
        };
        write_journal(&store, &j, 0).unwrap();
        let new = next_term(old, "b");
        assert!(take_over(&store, new, "b").unwrap());
        assert_eq!(read_journal(&store).unwrap().unwrap().next_worker, 3);
        // The old holder's journal and lease writes are refused.
        let err = write_journal(
            &store,
            &Journal {
                next_worker: 9,
                ..j.clone()
            },
            1,
        )
        .unwrap_err();
        assert!(matches!(err, JournalError::Deposed(_)), "{err}");
        assert!(!take_over(&store, old, "a").unwrap());
        assert_eq!(read_lease(&store).unwrap().unwrap().holder, "b");
        assert_eq!(read_journal(&store).unwrap().unwrap().next_worker, 3);
    }

    #[test]
    fn a_damaged_journal_is_an_error_not_an_empty_state() {
        let store = MemoryStore::default();
        store
            .put(&record_key(JOURNAL_PREFIX, 5, 0), b"VFC2 not a journal")
            .unwrap();
        let err = read_journal(&store).unwrap_err();
        assert!(
            err.to_string().contains("journal in the store is damaged"),
            "{err}"
        );
        store.put(&record_key(LEASE_PREFIX, 5, 0), b"x").unwrap();
        assert!(read_lease(&store).is_err());
        // A journal of an older veriflow, overwritten in place under one key, is refused by
        // name rather than taken for an empty store.
        let store = MemoryStore::default();
        store.put(OLD_JOURNAL_KEY, b"VFCJ a journal").unwrap();
        let err = read_journal(&store).unwrap_err().to_string();
        assert!(err.contains("older veriflow"), "{err}");
    }

    /// A checkpoint server in a test: the real request handler over a memory store, which can
    /// be taken down.
    #[derive(Debug, Default)]
    struct Server {
        store: MemoryStore,
        down: AtomicBool,
    }

    impl ServerLink for Server {
        fn call(&self, call: ServerCall) -> Result<ServerAnswer, ClientError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(ClientError::Unreachable {
                    addr: "test".into(),
                    reason: "down".into(),
                });
            }
            Ok(veriflow_checkpoint::server::serve(&self.store, call))
        }
    }

    /// ida:4,2 at a quorum of 5 on six test servers, as `knary chaos` runs.
    fn ida_4_2() -> (RemoteStore, Vec<Arc<Server>>) {
        let servers: Vec<Arc<Server>> = (0..6).map(|_| Arc::new(Server::default())).collect();
        let links = servers
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("test:{i}"), s.clone() as Arc<dyn ServerLink>))
            .collect();
        let store =
            RemoteStore::with_links(Layout::Ida { m: 4, k: 2 }, Ack::Quorum, links).unwrap();
        (store, servers)
    }

    /// Rule 6, found by `knary chaos`: a coordinator's journal write straddled its successor's
    /// fence raise, landing on three servers and refused by the three the raise had reached.
    /// Overwritten in place, the journal was then three fragments of each version, four
    /// needed: unreadable, and the successor stood by for ever. Written once, the cut write
    /// reads as absent and the journal before it is whole.
    #[test]
    fn a_journal_write_cut_by_a_successors_fence_leaves_the_one_before_it() {
        let (store, servers) = ida_4_2();
        let a = next_term(0, "a");
        assert!(take_over(&store, a, "a").unwrap());
        let j = |next_worker| Journal {
            term: a,
            next_worker,
            ..Journal::default()
        };
        write_journal(&store, &j(3), 0).unwrap();
        let b = next_term(a, "b");
        for i in [0, 3, 4] {
            servers[i].store.raise_fence(FENCE_SCOPE, b).unwrap();
        }
        let err = write_journal(&store, &j(4), 1).unwrap_err();
        assert!(matches!(err, JournalError::Deposed(_)), "{err}");
        let landed = servers
            .iter()
            .filter(|s| {
                s.store
                    .get(&record_key(JOURNAL_PREFIX, a, 1))
                    .unwrap()
                    .is_some()
            })
            .count();
        assert_eq!(
            landed, 3,
            "the cut write is on the three servers without the fence"
        );
        assert_eq!(read_journal(&store).unwrap().unwrap().next_worker, 3);
        // The successor takes over (its seal deletes the cut write), reads the same journal,
        // and its own records come after the predecessor's.
        assert!(take_over(&store, b, "b").unwrap());
        assert_eq!(read_journal(&store).unwrap().unwrap().next_worker, 3);
        let nb = Journal {
            term: b,
            next_worker: 7,
            ..Journal::default()
        };
        write_journal(&store, &nb, 0).unwrap();
        assert_eq!(read_journal(&store).unwrap().unwrap().next_worker, 7);
    }

    /// Rule 6 for the lease: a holder killed while its renewal reached three of six servers
    /// leaves the beat before it readable, so a standby sees the beat stop and takes over
    /// (overwritten in place, the lease was unreadable and the standby retried for ever).
    #[test]
    fn a_renewal_cut_half_way_leaves_the_beat_before_it() {
        let (store, servers) = ida_4_2();
        let t = next_term(0, "a");
        assert!(take_over(&store, t, "a").unwrap());
        let lease = |beat| Lease {
            term: t,
            holder: "a".into(),
            beat,
        };
        renew_lease(&store, &lease(1)).unwrap();
        // Beat 2's fragments, as its write put them, reach servers 1, 2 and 5 before the
        // holder dies.
        let bytes = codec::frame(LEASE_MAGIC, &codec::encode(&lease(2)).unwrap());
        let frags = Layout::Ida { m: 4, k: 2 }
            .codec()
            .unwrap()
            .encode(&bytes, veriflow_checkpoint::strategy::CONTENT_STAMP);
        for i in [1, 2, 5] {
            servers[i]
                .store
                .put(&record_key(LEASE_PREFIX, t, 2), &frags[i])
                .unwrap();
        }
        assert_eq!(read_lease(&store).unwrap().unwrap().beat, 1);
        let b = next_term(t, "b");
        assert!(take_over(&store, b, "b").unwrap());
        assert_eq!(read_lease(&store).unwrap().unwrap().holder, "b");
    }

    /// Rule 6: old records are deleted as new ones are written, a predecessor's too, and a
    /// retried record is the same fragments again (never an overwrite).
    #[test]
    fn writers_delete_their_old_records_and_a_retry_rewrites_the_same_record() {
        let (store, _servers) = ida_4_2();
        let a = next_term(0, "a");
        assert!(take_over(&store, a, "a").unwrap());
        for seq in 0..40 {
            let j = Journal {
                term: a,
                next_worker: u32::try_from(seq).unwrap(),
                ..Journal::default()
            };
            write_journal(&store, &j, seq).unwrap();
            write_journal(&store, &j, seq).unwrap();
        }
        let keys = |p| store.scan_keys(p, None, 1000).unwrap().0.len();
        assert!(
            keys(JOURNAL_PREFIX) <= 1 + TIDY_EVERY as usize,
            "{}",
            keys(JOURNAL_PREFIX)
        );
        assert_eq!(read_journal(&store).unwrap().unwrap().next_worker, 39);
        let b = next_term(a, "b");
        assert!(take_over(&store, b, "b").unwrap());
        for seq in 0..2 {
            let j = Journal {
                term: b,
                ..Journal::default()
            };
            write_journal(&store, &j, seq).unwrap();
        }
        renew_lease(
            &store,
            &Lease {
                term: b,
                holder: "b".into(),
                beat: 1,
            },
        )
        .unwrap();
        assert_eq!(
            keys(JOURNAL_PREFIX),
            2,
            "the predecessor's journals are gone"
        );
        assert_eq!(keys(LEASE_PREFIX), 2, "the predecessor's leases are gone");
    }
}

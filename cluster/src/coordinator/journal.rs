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

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use veriflow_checkpoint::{Store, StoreError};
use veriflow_runtime::codec;

use crate::protocol::{Hosting, JobSpec, ToSubmit, WorkerId};

/// The fence scope of the coordinator's records (rule 1).
pub const FENCE_SCOPE: &[u8] = b"coord";
/// Key of the lease (rule 4).
pub const LEASE_KEY: &[u8] = b"coord/lease";
/// Key of the journal (rule 3).
pub const JOURNAL_KEY: &[u8] = b"coord/journal";

const LEASE_MAGIC: [u8; 4] = *b"VFCL";
/// Format 2 (many jobs: running, queued and ended ones).
const JOURNAL_MAGIC: [u8; 4] = *b"VFC2";
/// Format 1 (one job), written before issue 18: refused by name.
const JOURNAL_MAGIC_1: [u8; 4] = *b"VFCJ";
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

fn fenced_put(
    store: &dyn Store,
    term: u64,
    key: &[u8],
    value: Vec<u8>,
) -> Result<(), JournalError> {
    store.put_batch_fenced(&[(FENCE_SCOPE.to_vec(), term)], &[(key.to_vec(), value)])?;
    Ok(())
}

/// Reads the lease, if one was ever written.
pub fn read_lease(store: &dyn Store) -> Result<Option<Lease>, JournalError> {
    let Some(bytes) = store.get(LEASE_KEY)? else {
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

/// Renews the lease at its term (rule 4): a lease of a newer term found first deposes the
/// writer (the same guard as [`write_journal`]'s).
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

/// Writes the lease at its term (rules 2 and 4).
pub fn write_lease(store: &dyn Store, lease: &Lease) -> Result<(), JournalError> {
    let bytes = codec::encode(lease).map_err(|e| JournalError::Damaged {
        what: "lease",
        reason: e.to_string(),
    })?;
    fenced_put(
        store,
        lease.term,
        LEASE_KEY,
        codec::frame(LEASE_MAGIC, &bytes),
    )
}

/// Reads the journal, if one was ever written.
pub fn read_journal(store: &dyn Store) -> Result<Option<Journal>, JournalError> {
    let Some(bytes) = store.get(JOURNAL_KEY)? else {
        return Ok(None);
    };
    let damaged = |reason: String| JournalError::Damaged {
        what: "journal",
        reason,
    };
    if bytes.starts_with(&JOURNAL_MAGIC_1) {
        return Err(damaged(
            "it is in format 1 (one job per coordinator), written by an older veriflow: finish \
             its job with that version, or start the coordinators on a fresh store"
                .to_string(),
        ));
    }
    let payload =
        codec::unframe(JOURNAL_MAGIC, &bytes, JOURNAL_LIMIT).map_err(|e| damaged(e.to_string()))?;
    codec::decode(payload)
        .map(Some)
        .map_err(|e| damaged(e.to_string()))
}

/// Writes the journal at its term (rule 3). A lease of a newer term deposes the writer even
/// on a store that keeps no fences (checked first; the fence is the guarantee, this the guard
/// of a coordinator that wakes from a pause on such a store).
pub fn write_journal(store: &dyn Store, journal: &Journal) -> Result<(), JournalError> {
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
    fenced_put(
        store,
        journal.term,
        JOURNAL_KEY,
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
    use super::*;
    use veriflow_checkpoint::MemoryStore;

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
        write_journal(&store, &j).unwrap();
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
        store.put(JOURNAL_KEY, b"VFCJ not a journal").unwrap();
        let err = read_journal(&store).unwrap_err();
        assert!(
            err.to_string().contains("journal in the store is damaged"),
            "{err}"
        );
        store.put(LEASE_KEY, b"x").unwrap();
        assert!(read_lease(&store).is_err());
    }
}

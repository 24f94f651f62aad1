//! Storage strategies (paper 003): where and how a value is stored, chosen by one `--store`
//! spec used by every command.
//!
//! ```text
//! local:DIR                      one sled directory on this machine (the embedded default)
//! redb:DIR, fjall:DIR            one directory on this machine, in redb or fjall (judged
//!                                against sled in store/mod.rs, "Choosing the engine")
//! memory                         RAM of this process only (tests; nothing survives)
//! central:ADDR                   one checkpoint server holds every value
//! replicate:R:ADDR,...           R full copies on R servers (any 1 rebuilds)
//! parity:M:ADDR,...              M slices + XOR parity on M + 1 servers (any M rebuild)
//! ida:M,K:ADDR,...               systematic Reed-Solomon on M + K servers (any M rebuild)
//! ```
//!
//! `replicate`, `parity` and `ida` accept `,quorum` after their numbers
//! (`ida:4,2,quorum:ADDR,...`) to acknowledge writes at a quorum instead of on every server,
//! or `,quorum=W` for an explicit write quorum W between M and M + K (rule 3).
//!
//! Paper 003's replication keeps "a copy locally and another remotely": here every copy lives
//! on a checkpoint server, and "local" means a server on the writer's own machine: list it
//! first (e.g. `replicate:2:127.0.0.1:7000,node2:7000`). That keeps one code path, one digest
//! check and one repair for every copy, and the local copy still survives the writer's crash.
//!
//! Rules the remote strategies keep:
//!
//! 1. **Placement.** Fragment `i` of every value goes to server `i` of the spec, so the M + K
//!    fragments of one value are on M + K distinct servers (duplicate addresses are refused).
//! 2. **Batches.** `put_batch` codes every value, then sends each server its fragments of all
//!    values as one atomic server batch (protocol rule 3): a server killed mid-batch holds all of
//!    its fragments of the batch or none, so no value is half-visible on it.
//! 3. **Acknowledgement.** A write returns `Ok` when every server has flushed its fragments
//!    (`ack=all`, the default) or, with `quorum`, when at least `min(M + 1, M + K)` have: one
//!    more than decoding needs, so a value survives one further loss right after its write;
//!    with `quorum=W`, when W have (W = M keeps a run writing with K servers down, at the price
//!    of no margin until they are back and scrubbed). A
//!    delete needs `min(K + 1, M + K)` servers under a quorum so that at most M - 1 fragments
//!    of it can remain. Fragments not written are rebuilt by read repair or `scrub`.
//! 4. **Stamps.** Each write carries a stamp larger than every earlier stamp of this process
//!    (nanoseconds since the epoch, bumped past the last); reading picks the newest version and
//!    never mixes versions (erasure rule 5).
//! 5. **Reading** asks every server and decodes from any M valid fragments. A missing, corrupt
//!    or stale fragment on a server that answered is rebuilt and rewritten (read repair; best
//!    effort: a failed repair is left for `scrub`).
//! 6. **Absent keys.** A key is absent when no server holds a valid fragment of it, or when at
//!    least K + 1 answering servers do not hold it (fewer than M fragments can then be left,
//!    e.g. after a delete acknowledged at a quorum). Otherwise too few fragments is an error:
//!    [`StoreError::Unavailable`] naming the unreachable servers and how many are needed, or
//!    [`StoreError::Unrecoverable`] when every server answered.
//! 7. **Wrong key.** A server that fails the handshake is a [`StoreError::Refused`] naming it,
//!    at open and on every call; it is never counted as merely unreachable.
//! 8. **Limits.** One server batch is one frame: the fragments a batch puts on one server must
//!    fit in [`crate::wire::DEFAULT_MAX_FRAME`].
//! 9. **Interrupted overwrites.** A writer that dies mid-overwrite can leave the new version on
//!    fewer than M servers. When more than K answering servers do not hold the newest version,
//!    it reached at most M - 1 of them and was never acknowledged: the key reads as the newest
//!    version that can be rebuilt (and read repair rewrites it everywhere). Found by `chaos`: a
//!    worker SIGKILLed while it rewrote a watermark record left `wm/...` with one fragment of
//!    the new version and five of the old, and the next host of its vnode could not start.
//!    This is best effort, not a guarantee: the overwrite replaced the old version on the
//!    servers it reached, so the old one is left on at least M only if it was on at least M
//!    plus those. With M > K + 1 (ida:4,2) a cut at M - 1 servers leaves K + 1 < M of a version
//!    written everywhere, and fewer of one acknowledged at a quorum while a server was behind
//!    (`chaos` again: ida:4,2 at a quorum of 5, one server restarted behind, a paused writer's
//!    overwrite on two servers: the acknowledged watermark on three, and no version readable,
//!    [`StoreError::Unrecoverable`]). A value that must survive its writer's crash is never
//!    overwritten: it is written once under a new key, and old keys are deleted only after
//!    newer ones are acknowledged (the log's watermarks, `runtime/src/log/watermark.rs`).
//! 10. **Fence raise** (`store/fence.rs`; each server keeps its fences durably, protocol rule
//!     7). [`Store::raise_fence`] sends the raise to every server, then *seals* the scope: it
//!     lists the scope's keys on every server and deletes, on the servers that took the raise,
//!     every key no reader can decode (fragments of a write that reached fewer than M servers:
//!     a crash's or a zombie's leftover, which rule 6 already reads as absent). It succeeds
//!     when at least **K + 1** servers took the raise, answered the listing and took those
//!     deletes (the *sealed* servers); else it is [`StoreError::Unavailable`] and the caller
//!     retries when servers are back. For replication (M = 1) K + 1 is every server, and
//!     there is no seal: every fragment is a whole copy, so a write that reached any server
//!     decodes, and a key whose every copy is damaged is no reader's to delete (reading it is
//!     [`StoreError::Unrecoverable`], as before the raise). Listing the scope with its values
//!     was a second read of a recovering vnode's whole log, for nothing.
//! 11. **Fenced write.** [`Store::put_batch_fenced`] sends each server its fragments with the
//!     fences; a server checks them and writes under one lock. If **any** server refuses with
//!     `Fenced`, the write is [`StoreError::Fenced`] whatever the others did (the writer is a
//!     zombie and must stop); otherwise it is acknowledged as in rule 3.
//! 12. **Paged scans.** [`Store::scan_page`] asks every server for one page after the same
//!     key (each its share of the byte budget). A server that says more may follow has listed
//!     its keys completely only up to its last one, so the page ends at the smallest such last
//!     key; keys up to there are resolved as rule 5-6 read them (and repaired) and the page
//!     says more may follow. A follower of a growing log reads only what is new: a page costs
//!     one `Scan` per server, never the whole prefix.
//! 13. **Content-addressed values** ([`Store::put_batch_fenced_content`]: the log's value
//!     store, a key derived from the value's bytes). They carry the fixed stamp
//!     [`CONTENT_STAMP`] instead of rule 4's, so every write of one is byte for byte the same
//!     fragments: another writer writing it again (a replacement re-running a task, a thief's
//!     victim) can never turn it into rule 9's interrupted overwrite. Found by `chaos`
//!     (`chaos_with_a_short_budget_loses_nothing`, cg, ida:4,2 at a quorum of 5): a logged
//!     vector written again by a worker killed half-way was left with three fragments of each
//!     version, four needed, and the job failed.
//!
//! Why a zombie can never leave a segment readable in the middle of its successor's log
//! (rules 10-11). The successor raises the fence, then reads the log. Take any value X a
//! zombie writes under the scope. A sealed server refuses X from its raise on, and held no
//! undecodable X after the seal; so once the raise returns, fragments of X can come into
//! being only on servers that are not sealed, which are at most N - (K + 1) = M - 1. Hence:
//! if X was decodable when the seal listed the scope, it was so before the successor read
//! the log, and the successor read it like any segment its predecessor wrote; if it was not,
//! the seal deleted it on the sealed servers, and the at most M - 1 fragments that can exist
//! later can never be decoded (erasure rule 5), while the K + 1 sealed servers answer that
//! they do not hold X, so readers take it as absent (rule 6) or report too few servers,
//! never its bytes. This needs every key under the scope to be written once (a zombie's
//! fragments overwriting a key its successor wrote would destroy it, rule 9): the log's
//! segments are. A key the zombie writes outside the scope in the same batch (the log's
//! watermarks, each written once under a key of its own) is refused with it by every sealed
//! server, so it is never more readable than the segments beside it were, except that the
//! seal does not delete its undecodable leftovers: at worst a watermark naming a segment
//! the seal deleted, which readers report as a log short of its watermark, never as data.
//! Why not fewer than K + 1: with replication, one copy on a server that missed the raise
//! would be readable. Why not more: a takeover must go on while up to K servers are down
//! (with `quorum`); with `ack=all` every write needs every server anyway.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_bytes::ByteBuf;

use crate::client::{Client, ClientConfig, ClientError};
use crate::erasure::{Codec, ErasureError};
use crate::key::Key;
use crate::protocol::{Request, Response, ServerAnswer, ServerCall, Slot};
use crate::store::{
    FjallStore, MemoryStore, Page, PageLimit, Pair, Pairs, RedbStore, SledStore, Store, StoreError,
};

/// The stamp of every content-addressed value (rule 13): below every stamp of rule 4, and the
/// same for every writer.
pub const CONTENT_STAMP: u64 = 1;

/// How many fragments a remote strategy makes, and which code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One server, one copy.
    Central,
    /// R full copies.
    Replicate {
        /// R.
        copies: usize,
    },
    /// M slices plus XOR parity.
    Parity {
        /// M.
        m: usize,
    },
    /// Systematic Reed-Solomon, any M of M + K.
    Ida {
        /// M.
        m: usize,
        /// K.
        k: usize,
    },
}

impl Layout {
    /// The codec for this layout.
    pub fn codec(&self) -> Result<Codec, ErasureError> {
        match *self {
            Layout::Central => Codec::replicate(1),
            Layout::Replicate { copies } => Codec::replicate(copies),
            Layout::Parity { m } => Codec::parity(m),
            Layout::Ida { m, k } => Codec::ida(m, k),
        }
    }

    /// Servers this layout needs (M + K).
    pub fn servers(&self) -> usize {
        match *self {
            Layout::Central => 1,
            Layout::Replicate { copies } => copies,
            Layout::Parity { m } => m + 1,
            Layout::Ida { m, k } => m + k,
        }
    }

    /// Fragments needed to read a value (M).
    pub fn needed(&self) -> usize {
        match *self {
            Layout::Central | Layout::Replicate { .. } => 1,
            Layout::Parity { m } => m,
            Layout::Ida { m, .. } => m,
        }
    }
}

/// When a write is acknowledged (rule 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ack {
    /// Every server flushed its fragments.
    #[default]
    All,
    /// At least M + 1 servers did.
    Quorum,
    /// At least this many servers did (M ≤ W ≤ M + K; `,quorum=W`). W = M keeps writing
    /// with K servers down, with no margin left until they are back and scrubbed.
    AtLeast(usize),
}

/// A remote strategy: its layout, its servers in slot order, and its acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpec {
    /// Fragments and code.
    pub layout: Layout,
    /// `HOST:PORT` of each server; fragment `i` goes to `addrs[i]`.
    pub addrs: Vec<String>,
    /// Acknowledgement policy.
    pub ack: Ack,
}

/// A parsed `--store` spec (syntax in the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// `local:DIR`: sled.
    Local(PathBuf),
    /// `redb:DIR`.
    Redb(PathBuf),
    /// `fjall:DIR`.
    Fjall(PathBuf),
    /// `memory`.
    Memory,
    /// `central:`, `replicate:`, `parity:` or `ida:`.
    Remote(RemoteSpec),
}

fn bad(msg: impl Into<String>) -> StoreError {
    StoreError::BadSpec(msg.into())
}

const SYNTAX: &str =
    "expected local:DIR, redb:DIR, fjall:DIR, memory, central:ADDR, replicate:R:ADDR,..., \
                      parity:M:ADDR,... or ida:M,K:ADDR,... (ADDR = HOST:PORT)";

fn parse_count(what: &str, s: &str) -> Result<usize, StoreError> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| bad(format!("{what} must be a number, got {s:?}")))?;
    if n == 0 {
        return Err(bad(format!("{what} must be at least 1")));
    }
    Ok(n)
}

fn parse_addrs(s: &str) -> Result<Vec<String>, StoreError> {
    let addrs: Vec<String> = s.split(',').map(|a| a.trim().to_string()).collect();
    let mut seen = BTreeSet::new();
    for a in &addrs {
        let port = a.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
        match port {
            Some((h, Ok(_))) if !h.is_empty() => {}
            _ => return Err(bad(format!("{a:?} is not HOST:PORT"))),
        }
        if !seen.insert(a.as_str()) {
            return Err(bad(format!(
                "{a} is listed twice; the fragments of a value must go to distinct servers"
            )));
        }
    }
    Ok(addrs)
}

/// Splits `"4,2,quorum"` into numbers and the ack policy.
fn parse_params(s: &str) -> Result<(Vec<&str>, Ack), StoreError> {
    let mut parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let last = parts.last().copied().unwrap_or_default();
    let ack = if last == "quorum" {
        parts.pop();
        Ack::Quorum
    } else if let Some(w) = last.strip_prefix("quorum=") {
        parts.pop();
        Ack::AtLeast(parse_count("the write quorum W", w)?)
    } else {
        Ack::All
    };
    Ok((parts, ack))
}

/// The layout and acknowledgement of `scheme` with `params` (`"4,2,quorum"`); `s` is the whole
/// spec, for messages.
fn parse_layout(s: &str, scheme: &str, params: &str) -> Result<(Layout, Ack), StoreError> {
    let (nums, ack) = parse_params(params)?;
    let layout = match (scheme, nums.as_slice()) {
        ("replicate", [r]) => Layout::Replicate {
            copies: parse_count("R (copies)", r)?,
        },
        ("parity", [m]) => Layout::Parity {
            m: parse_count("M (slices)", m)?,
        },
        ("ida", [m, k]) => Layout::Ida {
            m: parse_count("M (fragments needed)", m)?,
            k: parse_count("K (fragments that may be lost)", k)?,
        },
        _ => return Err(bad(format!("{s:?}: wrong parameters {params:?}; {SYNTAX}"))),
    };
    layout.codec().map_err(|e| bad(format!("{s:?}: {e}")))?;
    if let Ack::AtLeast(w) = ack {
        let (m, n) = (layout.needed(), layout.servers());
        if w < m || w > n {
            return Err(bad(format!(
                "{s:?}: the write quorum must be between {m} (fragments needed to read) and \
                 {n} (servers), not {w}"
            )));
        }
    }
    Ok((layout, ack))
}

impl StoreSpec {
    /// The directory of a store on this machine (`local:`, `redb:`, `fjall:`).
    pub fn local_dir(&self) -> Option<&std::path::Path> {
        match self {
            StoreSpec::Local(d) | StoreSpec::Redb(d) | StoreSpec::Fjall(d) => Some(d),
            StoreSpec::Memory | StoreSpec::Remote(_) => None,
        }
    }

    /// Opens an existing store on this machine: for writing (`--resume`; a missing store is
    /// an error, not a new one) or read-only (never writing to it); `None` for other specs.
    pub fn open_local_existing(&self, write: bool) -> Option<Result<Arc<dyn Store>, StoreError>> {
        fn arc<S: Store>(r: Result<S, StoreError>) -> Result<Arc<dyn Store>, StoreError> {
            r.map(|s| Arc::new(s) as Arc<dyn Store>)
        }
        Some(match (self, write) {
            (StoreSpec::Local(d), true) => arc(SledStore::open_existing(d)),
            (StoreSpec::Local(d), false) => arc(SledStore::open_read_only(d)),
            (StoreSpec::Redb(d), true) => arc(RedbStore::open_existing(d)),
            (StoreSpec::Redb(d), false) => arc(RedbStore::open_read_only(d)),
            (StoreSpec::Fjall(d), true) => arc(FjallStore::open_existing(d)),
            (StoreSpec::Fjall(d), false) => arc(FjallStore::open_read_only(d)),
            (StoreSpec::Memory | StoreSpec::Remote(_), _) => return None,
        })
    }

    /// How many servers a strategy without its addresses needs: `central`, `replicate:R`,
    /// `parity:M` or `ida:M,K` (with `,quorum` or `,quorum=W`), as `APP cluster` takes it.
    pub fn servers_for(strategy: &str) -> Result<usize, StoreError> {
        let strategy = strategy.trim();
        match strategy.split_once(':') {
            None if strategy == "central" => Ok(1),
            Some((scheme @ ("replicate" | "parity" | "ida"), params)) => {
                Ok(parse_layout(strategy, scheme, params)?.0.servers())
            }
            _ => Err(bad(format!(
                "{strategy:?}: expected central, replicate:R, parity:M or ida:M,K"
            ))),
        }
    }
}

impl FromStr for StoreSpec {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s == "memory" {
            return Ok(StoreSpec::Memory);
        }
        let Some((scheme, rest)) = s.split_once(':') else {
            return Err(bad(format!("{s:?}: {SYNTAX}")));
        };
        let need_addrs = |rest: &str| -> Result<(String, String), StoreError> {
            rest.split_once(':')
                .map(|(p, a)| (p.to_string(), a.to_string()))
                .ok_or_else(|| bad(format!("{s:?}: missing the server list; {SYNTAX}")))
        };
        let check_count = |layout: Layout, addrs: &[String]| -> Result<(), StoreError> {
            if addrs.len() != layout.servers() {
                return Err(bad(format!(
                    "{s:?}: this layout needs exactly {} servers, {} given",
                    layout.servers(),
                    addrs.len()
                )));
            }
            Ok(())
        };
        let spec = match scheme {
            "local" if !rest.is_empty() => return Ok(StoreSpec::Local(PathBuf::from(rest))),
            "local" => return Err(bad("local: needs a directory (local:DIR)")),
            "redb" if !rest.is_empty() => return Ok(StoreSpec::Redb(PathBuf::from(rest))),
            "fjall" if !rest.is_empty() => return Ok(StoreSpec::Fjall(PathBuf::from(rest))),
            "redb" | "fjall" => {
                return Err(bad(format!("{scheme}: needs a directory ({scheme}:DIR)")))
            }
            "central" => {
                let addrs = parse_addrs(rest)?;
                RemoteSpec {
                    layout: Layout::Central,
                    addrs,
                    ack: Ack::All,
                }
            }
            "replicate" | "parity" | "ida" => {
                let (params, addrs) = need_addrs(rest)?;
                let (layout, ack) = parse_layout(s, scheme, &params)?;
                RemoteSpec {
                    layout,
                    addrs: parse_addrs(&addrs)?,
                    ack,
                }
            }
            other => return Err(bad(format!("unknown strategy {other:?}; {SYNTAX}"))),
        };
        check_count(spec.layout, &spec.addrs)?;
        Ok(StoreSpec::Remote(spec))
    }
}

impl fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreSpec::Local(p) => write!(f, "local:{}", p.display()),
            StoreSpec::Redb(p) => write!(f, "redb:{}", p.display()),
            StoreSpec::Fjall(p) => write!(f, "fjall:{}", p.display()),
            StoreSpec::Memory => f.write_str("memory"),
            StoreSpec::Remote(r) => {
                let q = match r.ack {
                    Ack::All => String::new(),
                    Ack::Quorum => ",quorum".to_string(),
                    Ack::AtLeast(w) => format!(",quorum={w}"),
                };
                let a = r.addrs.join(",");
                match r.layout {
                    Layout::Central => write!(f, "central:{a}"),
                    Layout::Replicate { copies } => write!(f, "replicate:{copies}{q}:{a}"),
                    Layout::Parity { m } => write!(f, "parity:{m}{q}:{a}"),
                    Layout::Ida { m, k } => write!(f, "ida:{m},{k}{q}:{a}"),
                }
            }
        }
    }
}

/// Opens the store a spec names. Remote strategies need `key` and check at once that every
/// reachable server shares it (rule 7).
pub fn open_store(spec: &StoreSpec, key: Option<&Key>) -> Result<Arc<dyn Store>, StoreError> {
    match spec {
        StoreSpec::Local(dir) => Ok(Arc::new(SledStore::open(dir)?)),
        StoreSpec::Redb(dir) => Ok(Arc::new(RedbStore::open(dir)?)),
        StoreSpec::Fjall(dir) => Ok(Arc::new(FjallStore::open(dir)?)),
        StoreSpec::Memory => Ok(Arc::new(MemoryStore::default())),
        StoreSpec::Remote(r) => {
            let key = key.ok_or_else(|| {
                bad(format!(
                    "{spec} talks to checkpoint servers and needs their key (--key FILE)"
                ))
            })?;
            Ok(Arc::new(RemoteStore::open(
                r.clone(),
                key.clone(),
                ClientConfig::default(),
            )?))
        }
    }
}

/// What one server said about one key.
#[derive(Debug)]
enum Seen {
    Present(Vec<u8>),
    Corrupt,
    Absent,
    Unreachable(String),
}

/// Every key found under a prefix, with what each server holds.
type Keys = BTreeMap<Vec<u8>, Vec<Seen>>;

/// What one server listed in a scan, or why it did not answer.
type Listing = Result<Vec<(Vec<u8>, Slot)>, String>;

/// What every server holds of each key some server listed: `Absent` where a server that
/// answered did not list it, `Unreachable` where a server did not answer.
fn merge_listings(per_server: Vec<Listing>) -> Keys {
    let mut keys: Keys = BTreeMap::new();
    for (k, _) in per_server.iter().flatten().flatten() {
        keys.entry(k.clone()).or_insert_with(|| {
            per_server
                .iter()
                .map(|r| match r {
                    Ok(_) => Seen::Absent,
                    Err(e) => Seen::Unreachable(e.clone()),
                })
                .collect()
        });
    }
    for (i, r) in per_server.into_iter().enumerate() {
        if let Ok(list) = r {
            for (k, s) in list {
                if let Some(v) = keys.get_mut(&k) {
                    v[i] = match s {
                        Slot::Present(b) => Seen::Present(b.into_vec()),
                        Slot::Corrupt(_) => Seen::Corrupt,
                    };
                }
            }
        }
    }
    keys
}

/// What reading one key found and did.
#[derive(Debug, Default)]
struct Resolved {
    value: Option<Vec<u8>>,
    ok: usize,
    /// Fragments to rewrite: (slot, fragment).
    repairs: Vec<(usize, Vec<u8>)>,
    /// Fragments that need a rewrite but whose server did not answer.
    unrepairable: usize,
}

/// Counts from [`RemoteStore::scrub`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScrubReport {
    /// The strategy scrubbed.
    pub store: String,
    /// Keys found on any server.
    pub keys: usize,
    /// Fragments present and valid.
    pub fragments_ok: usize,
    /// Fragments missing, corrupt or stale that were rebuilt and rewritten.
    pub fragments_repaired: usize,
    /// Fragments that need a rewrite but whose server is unreachable or refused it.
    pub fragments_missing: usize,
    /// Keys whose value cannot be rebuilt (lossy UTF-8).
    pub unrecoverable: Vec<String>,
    /// Servers that did not answer, with why.
    pub unreachable: Vec<String>,
}

impl ScrubReport {
    /// Whether every value can still be read (exit status of `scrub`).
    pub fn is_healthy(&self) -> bool {
        self.unrecoverable.is_empty()
    }
}

/// How a [`RemoteStore`] reaches one checkpoint server without the network: the cluster
/// simulator's in-process servers ([`crate::server::serve`] over a store of their own). Coding,
/// placement, quorums, fences and read repair are the same code as over [`Client`].
pub trait ServerLink: Send + Sync + fmt::Debug {
    /// Sends one request and waits for the answer; an unreachable server is
    /// [`ClientError::Unreachable`].
    fn call(&self, call: ServerCall) -> Result<ServerAnswer, ClientError>;
}

/// How a [`RemoteStore`] reaches its servers.
#[derive(Debug)]
enum Reach {
    /// Over TCP, in parallel.
    Net(Client),
    /// In process, one after the other in slot order (deterministic).
    Links(Vec<Arc<dyn ServerLink>>),
}

impl Reach {
    fn call_all(&self, reqs: Vec<(usize, Request)>) -> Vec<(usize, Result<Response, ClientError>)> {
        match self {
            Reach::Net(c) => c.call_all(reqs),
            Reach::Links(links) => reqs
                .into_iter()
                .map(|(i, req)| (i, links[i].call(ServerCall(req)).map(|a| a.0)))
                .collect(),
        }
    }

    /// Protocol versions of every server (client rule 5).
    fn hello_all(&self) -> Vec<Result<(), ClientError>> {
        match self {
            Reach::Net(c) => c.hello_all(),
            Reach::Links(_) => Vec::new(), // same build: same protocol
        }
    }
}

/// A store whose values are coded across checkpoint servers (rules 1-11).
#[derive(Debug)]
pub struct RemoteStore {
    spec: RemoteSpec,
    codec: Codec,
    client: Reach,
    last_stamp: AtomicU64,
    /// Values read from fewer than all their fragments ([`Store::degraded`]).
    degraded_reads: AtomicU64,
}

fn lossy(key: &[u8]) -> String {
    // Printable ASCII as is, any other byte as \xNN: a value-store key ends in a raw digest,
    // which replacement characters made unreadable in error messages.
    key.escape_ascii().to_string()
}

impl RemoteStore {
    /// Connects to the servers of `spec` (rule 7: a server with another key is an error; up to
    /// K unreachable servers are allowed, more is [`StoreError::Unavailable`]).
    pub fn open(spec: RemoteSpec, key: Key, config: ClientConfig) -> Result<Self, StoreError> {
        let codec = spec.layout.codec().map_err(|e| bad(e.to_string()))?;
        if spec.addrs.len() != codec.total_fragments() {
            return Err(bad(format!(
                "{} needs {} servers, {} given",
                codec,
                codec.total_fragments(),
                spec.addrs.len()
            )));
        }
        let client = Client::new(&spec.addrs, key, config)
            .map_err(|e| StoreError::Io(format!("cannot start the client runtime: {e}")))?;
        let store = RemoteStore {
            spec,
            codec,
            client: Reach::Net(client),
            last_stamp: AtomicU64::new(0),
            degraded_reads: AtomicU64::new(0),
        };
        let mut unreachable = Vec::new();
        for r in store.client.hello_all() {
            match r {
                Ok(()) => {}
                Err(
                    e @ (ClientError::WrongKey { .. }
                    | ClientError::WrongServer { .. }
                    | ClientError::Protocol { .. }),
                ) => return Err(StoreError::Refused(e.to_string())),
                Err(e) => unreachable.push(e.to_string()),
            }
        }
        store.check_reachable("open the store", &unreachable, store.m())?;
        Ok(store)
    }

    /// A store over servers reached through `links` (one per server, in slot order; their
    /// names stand in for addresses in messages): the simulator's seam.
    pub fn with_links(
        layout: Layout,
        ack: Ack,
        links: Vec<(String, Arc<dyn ServerLink>)>,
    ) -> Result<Self, StoreError> {
        let codec = layout.codec().map_err(|e| bad(e.to_string()))?;
        if links.len() != codec.total_fragments() {
            return Err(bad(format!(
                "{} needs {} servers, {} given",
                codec,
                codec.total_fragments(),
                links.len()
            )));
        }
        let (addrs, links): (Vec<String>, Vec<Arc<dyn ServerLink>>) = links.into_iter().unzip();
        Ok(RemoteStore {
            spec: RemoteSpec { layout, addrs, ack },
            codec,
            client: Reach::Links(links),
            last_stamp: AtomicU64::new(0),
            degraded_reads: AtomicU64::new(0),
        })
    }

    fn m(&self) -> usize {
        self.codec.data_fragments()
    }

    fn n(&self) -> usize {
        self.codec.total_fragments()
    }

    fn k(&self) -> usize {
        self.codec.parity_fragments()
    }

    fn check_reachable(
        &self,
        op: &str,
        unreachable: &[String],
        need: usize,
    ) -> Result<(), StoreError> {
        if self.n() - unreachable.len() < need {
            return Err(StoreError::Unavailable {
                op: op.to_string(),
                unreachable: unreachable.to_vec(),
                need,
                total: self.n(),
            });
        }
        Ok(())
    }

    /// Rule 4.
    fn next_stamp(&self) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let prev = self
            .last_stamp
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| {
                Some(now.max(l.saturating_add(1)))
            })
            .unwrap_or(0);
        now.max(prev.saturating_add(1))
    }

    /// Sends one request per server and checks the acknowledgements (rule 3).
    fn write_all(
        &self,
        op: &str,
        reqs: Vec<(usize, Request)>,
        need: usize,
    ) -> Result<(), StoreError> {
        let answers = self.client.call_all(reqs);
        // Rule 11: one server's refusal refuses the write, whatever the others did.
        for (_, r) in &answers {
            if let Ok(Response::Fenced {
                scope,
                epoch,
                newest,
            }) = r
            {
                return Err(StoreError::Fenced {
                    scope: lossy(scope),
                    epoch: *epoch,
                    newest: *newest,
                });
            }
        }
        let mut failed = Vec::new();
        for (i, r) in answers {
            match r {
                Ok(Response::Done) => {}
                Ok(Response::Refused(why)) => {
                    return Err(StoreError::Refused(format!(
                        "checkpoint server {} refused the {op}: {why}",
                        self.spec.addrs[i]
                    )))
                }
                Ok(Response::Failed(why)) => failed.push(format!("{}: {why}", self.spec.addrs[i])),
                Ok(other) => {
                    return Err(StoreError::Refused(format!(
                        "checkpoint server {} answered a {op} with {other:?}",
                        self.spec.addrs[i]
                    )))
                }
                Err(
                    e @ (ClientError::WrongKey { .. }
                    | ClientError::WrongServer { .. }
                    | ClientError::Protocol { .. }),
                ) => return Err(StoreError::Refused(e.to_string())),
                Err(e) => failed.push(e.to_string()),
            }
        }
        self.check_reachable(op, &failed, need)
    }

    /// Rule 3: a delete is acknowledged by every server, or under a quorum by K + 1.
    fn delete_need(&self) -> usize {
        match self.spec.ack {
            Ack::All => self.n(),
            Ack::Quorum | Ack::AtLeast(_) => (self.k() + 1).min(self.n()),
        }
    }

    fn write_need(&self) -> usize {
        match self.spec.ack {
            Ack::All => self.n(),
            Ack::Quorum => (self.m() + 1).min(self.n()),
            Ack::AtLeast(w) => w.min(self.n()),
        }
    }

    /// Decides one key from what every server said (rules 5-6).
    fn resolve(&self, key: &[u8], seen: Vec<Seen>) -> Result<Resolved, StoreError> {
        let absent = seen.iter().filter(|s| matches!(s, Seen::Absent)).count();
        let unreachable: Vec<String> = seen
            .iter()
            .filter_map(|s| match s {
                Seen::Unreachable(e) => Some(e.clone()),
                _ => None,
            })
            .collect();
        let answered: Vec<bool> = seen
            .iter()
            .map(|s| !matches!(s, Seen::Unreachable(_)))
            .collect();
        let any = seen
            .iter()
            .any(|s| matches!(s, Seen::Present(_) | Seen::Corrupt));
        if !any && (absent > self.k() || unreachable.is_empty()) {
            return Ok(Resolved::default());
        }
        let mut slots: Vec<Option<Vec<u8>>> = seen
            .into_iter()
            .map(|s| match s {
                Seen::Present(b) => Some(b),
                _ => None,
            })
            .collect();
        let mut decoded = self.codec.decode(&slots);
        // Rule 9: an overwrite interrupted before its acknowledgement reads as the version
        // before it. More than K answering servers without the newest version prove that it
        // reached at most M - 1 servers, so it was never acknowledged.
        while let Err(ErasureError::TooFewFragments {
            corrupt, missing, ..
        }) = &decoded
        {
            let without = missing.iter().filter(|&&i| answered[i]).count();
            let newest: Vec<usize> = (0..slots.len())
                .filter(|i| slots[*i].is_some() && !missing.contains(i) && !corrupt.contains(i))
                .collect();
            if without <= self.k() || newest.is_empty() {
                break;
            }
            for i in newest {
                slots[i] = None;
            }
            if slots.iter().all(Option::is_none) {
                break;
            }
            decoded = self.codec.decode(&slots);
        }
        match decoded {
            Ok(d) => {
                if !d.repair.is_empty() {
                    self.degraded_reads.fetch_add(1, Ordering::Relaxed);
                }
                let mut out = Resolved {
                    ok: self.n() - d.repair.len(),
                    ..Resolved::default()
                };
                if !d.repair.is_empty() {
                    let mut frags = self.codec.encode(&d.blob, d.stamp);
                    for &slot in d.repair.iter().rev() {
                        let f = std::mem::take(&mut frags[slot]);
                        if answered[slot] {
                            out.repairs.push((slot, f));
                        } else {
                            out.unrepairable += 1;
                        }
                    }
                }
                out.value = Some(d.blob);
                Ok(out)
            }
            Err(ErasureError::TooFewFragments { .. }) if absent > self.k() => {
                Ok(Resolved::default())
            }
            Err(ErasureError::TooFewFragments { have, need, .. }) if !unreachable.is_empty() => {
                Err(StoreError::Unavailable {
                    op: format!(
                        "read {} (only {have} valid fragments reachable, {need} needed)",
                        lossy(key)
                    ),
                    unreachable,
                    need,
                    total: self.n(),
                })
            }
            Err(e) => Err(StoreError::Unrecoverable {
                key: lossy(key),
                reason: e.to_string(),
            }),
        }
    }

    /// Rewrites repaired fragments, one batch per server; returns how many were written.
    fn repair(&self, repairs: Vec<(usize, Vec<u8>, Vec<u8>)>) -> (usize, usize) {
        let mut per: BTreeMap<usize, Vec<(ByteBuf, ByteBuf)>> = BTreeMap::new();
        for (slot, key, frag) in repairs {
            per.entry(slot)
                .or_default()
                .push((ByteBuf::from(key), ByteBuf::from(frag)));
        }
        let counts: BTreeMap<usize, usize> = per.iter().map(|(s, v)| (*s, v.len())).collect();
        let reqs = per
            .into_iter()
            .map(|(s, v)| (s, Request::Batch(v)))
            .collect();
        let (mut done, mut failed) = (0, 0);
        for (slot, r) in self.client.call_all(reqs) {
            let n = counts.get(&slot).copied().unwrap_or(0);
            match r {
                Ok(Response::Done) => done += n,
                other => {
                    tracing::warn!("repair on {} failed: {other:?}", self.spec.addrs[slot]);
                    failed += n;
                }
            }
        }
        (done, failed)
    }

    /// Every key under `prefix` with what each server holds (paged scans, rule 5).
    fn gather(&self, prefix: &[u8]) -> Result<BTreeMap<Vec<u8>, Vec<Seen>>, StoreError> {
        Ok(self.gather_answered(prefix)?.0)
    }

    /// [`RemoteStore::gather`], and which servers answered every page.
    fn gather_answered(&self, prefix: &[u8]) -> Result<(Keys, Vec<bool>), StoreError> {
        let n = self.n();
        let mut per_server: Vec<Listing> = (0..n).map(|_| Ok(Vec::new())).collect();
        let mut cursor: Vec<Option<Option<ByteBuf>>> = vec![Some(None); n];
        // Pages of half a frame leave room for the framing and postcard's length prefixes.
        let page = (self.client_max_frame() / 2) as u64;
        loop {
            let reqs: Vec<(usize, Request)> = cursor
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    c.as_ref().map(|after| {
                        (
                            i,
                            Request::Scan {
                                prefix: ByteBuf::from(prefix.to_vec()),
                                after: after.clone(),
                                max_bytes: page,
                            },
                        )
                    })
                })
                .collect();
            if reqs.is_empty() {
                break;
            }
            for (i, r) in self.client.call_all(reqs) {
                match self.scan_answer(i, r)? {
                    Ok((entries, more)) => {
                        let last = entries.last().map(|(k, _)| ByteBuf::from(k.clone()));
                        if let Ok(list) = per_server[i].as_mut() {
                            list.extend(entries);
                        }
                        cursor[i] = if more && last.is_some() {
                            Some(last)
                        } else {
                            None
                        };
                    }
                    Err(why) => {
                        per_server[i] = Err(why);
                        cursor[i] = None;
                    }
                }
            }
        }
        let unreachable: Vec<String> = per_server
            .iter()
            .filter_map(|r| r.as_ref().err().cloned())
            .collect();
        self.check_reachable("list keys", &unreachable, self.m())?;
        let answered: Vec<bool> = per_server.iter().map(Result::is_ok).collect();
        Ok((merge_listings(per_server), answered))
    }

    /// Resolves listed keys in key order (rules 5-6), repairing what it can; absent values
    /// are left out.
    fn resolve_all(&self, keys: Keys) -> Result<Pairs, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        let mut repairs = Vec::new();
        for (key, seen) in keys {
            let r = self.resolve(&key, seen)?;
            repairs.extend(r.repairs.into_iter().map(|(s, f)| (s, key.clone(), f)));
            if let Some(v) = r.value {
                out.push((key, v));
            }
        }
        if !repairs.is_empty() {
            self.repair(repairs);
        }
        Ok(out)
    }

    /// Server `i`'s answer to a `Scan`: its page and whether more may follow, or why it did not
    /// answer (it counts as unreachable); a wrong key or a protocol violation fails the scan.
    #[allow(clippy::type_complexity)]
    fn scan_answer(
        &self,
        i: usize,
        r: Result<Response, ClientError>,
    ) -> Result<Result<(Vec<(Vec<u8>, Slot)>, bool), String>, StoreError> {
        match r {
            Ok(Response::Page { entries, more }) => Ok(Ok((
                entries
                    .into_iter()
                    .map(|(k, s)| (k.into_vec(), s))
                    .collect(),
                more,
            ))),
            Ok(Response::Failed(why)) => Ok(Err(format!("{}: {why}", self.spec.addrs[i]))),
            Ok(other) => Err(StoreError::Refused(format!(
                "checkpoint server {} answered a scan with {other:?}",
                self.spec.addrs[i]
            ))),
            Err(
                e @ (ClientError::WrongKey { .. }
                | ClientError::WrongServer { .. }
                | ClientError::Protocol { .. }),
            ) => Err(StoreError::Refused(e.to_string())),
            Err(e) => Ok(Err(e.to_string())),
        }
    }

    /// Rule 12: one `Scan` page from every server after `after`; the keys every answering
    /// server has listed completely, with what each server holds, and the bound they were
    /// listed up to if keys may follow it (the smallest last key of a server with more to say).
    fn gather_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: PageLimit,
    ) -> Result<(Keys, Option<Vec<u8>>), StoreError> {
        let n = self.n();
        // A fragment is about 1/M of its value: ask each server for its share of the page.
        let frame = (self.client_max_frame() / 2) as u64;
        let share = (limit.max_bytes / self.m() as u64).clamp(1, frame);
        let reqs: Vec<(usize, Request)> = (0..n)
            .map(|i| {
                (
                    i,
                    Request::Scan {
                        prefix: ByteBuf::from(prefix.to_vec()),
                        after: after.map(|a| ByteBuf::from(a.to_vec())),
                        max_bytes: share,
                    },
                )
            })
            .collect();
        let mut per_server: Vec<Listing> = (0..n).map(|_| Ok(Vec::new())).collect();
        let mut bound: Option<Vec<u8>> = None;
        for (i, r) in self.client.call_all(reqs) {
            per_server[i] = self.scan_answer(i, r)?.map(|(entries, more)| {
                if more {
                    if let Some((last, _)) = entries.last() {
                        if bound.as_ref().is_none_or(|b| last < b) {
                            bound = Some(last.clone());
                        }
                    }
                }
                entries
            });
        }
        let unreachable: Vec<String> = per_server
            .iter()
            .filter_map(|r| r.as_ref().err().cloned())
            .collect();
        self.check_reachable("list keys", &unreachable, self.m())?;
        // Past the bound, a server that stopped short may hold keys it has not listed yet.
        if let Some(b) = &bound {
            for list in per_server.iter_mut().flatten() {
                list.retain(|(k, _)| k.as_slice() <= b.as_slice());
            }
        }
        Ok((merge_listings(per_server), bound))
    }

    /// Rule 10: the fence raise and the seal.
    fn raise_and_seal(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        let n = self.n();
        let need = self.k() + 1;
        let op = format!("raise the epoch fence of {} to {epoch}", lossy(scope));
        let reqs = (0..n)
            .map(|i| {
                (
                    i,
                    Request::RaiseFence {
                        scope: ByteBuf::from(scope.to_vec()),
                        epoch,
                    },
                )
            })
            .collect();
        let mut sealed = vec![false; n];
        let mut unreachable = Vec::new();
        for (i, r) in self.client.call_all(reqs) {
            match r {
                Ok(Response::Done) => sealed[i] = true,
                Ok(Response::Failed(why)) => {
                    unreachable.push(format!("{}: {why}", self.spec.addrs[i]))
                }
                Ok(other) => {
                    return Err(StoreError::Refused(format!(
                        "checkpoint server {} answered a fence raise with {other:?}",
                        self.spec.addrs[i]
                    )))
                }
                Err(
                    e @ (ClientError::WrongKey { .. }
                    | ClientError::WrongServer { .. }
                    | ClientError::Protocol { .. }),
                ) => return Err(StoreError::Refused(e.to_string())),
                Err(e) => unreachable.push(e.to_string()),
            }
        }
        self.check_reachable(&op, &unreachable, need)?;
        if self.m() == 1 {
            // Rule 10: with M = 1 every fragment is a whole copy, so there is nothing to seal.
            return Ok(());
        }
        // The seal: keys under the scope that no reader can decode, deleted on the servers
        // that took the raise.
        let (keys, answered) = self.gather_answered(scope)?;
        for (i, a) in answered.iter().enumerate() {
            if !a && sealed[i] {
                sealed[i] = false;
                unreachable.push(format!(
                    "{}: did not list {}",
                    self.spec.addrs[i],
                    lossy(scope)
                ));
            }
        }
        let mut deletes = Vec::new();
        for (key, seen) in keys {
            let holders: Vec<usize> = seen
                .iter()
                .enumerate()
                .filter(|(_, s)| matches!(s, Seen::Present(_) | Seen::Corrupt))
                .map(|(i, _)| i)
                .collect();
            if self.resolve(&key, seen)?.value.is_none() {
                deletes.extend(
                    holders
                        .into_iter()
                        .filter(|&i| sealed[i])
                        .map(|i| (i, key.clone())),
                );
            }
        }
        if !deletes.is_empty() {
            tracing::info!(
                "sealing {}: deleting {} fragments of writes no reader can decode",
                lossy(scope),
                deletes.len()
            );
            let reqs = deletes
                .into_iter()
                .map(|(i, key)| {
                    (
                        i,
                        Request::Delete {
                            key: ByteBuf::from(key),
                        },
                    )
                })
                .collect();
            for (i, r) in self.client.call_all(reqs) {
                if !matches!(r, Ok(Response::Done)) && sealed[i] {
                    sealed[i] = false;
                    unreachable.push(format!("{}: seal delete failed: {r:?}", self.spec.addrs[i]));
                }
            }
        }
        let unsealed: Vec<String> = unreachable;
        if sealed.iter().filter(|&&s| s).count() < need {
            return Err(StoreError::Unavailable {
                op,
                unreachable: unsealed,
                need,
                total: n,
            });
        }
        Ok(())
    }

    /// Codes `pairs` and sends each server its fragments, as `Batch` or, with `fences`, as
    /// `FencedBatch` (rules 2-3, 11); the first `content` pairs are content-addressed and
    /// carry [`CONTENT_STAMP`] (rule 13).
    fn put_coded(
        &self,
        fences: Option<&[(Vec<u8>, u64)]>,
        pairs: &[(Vec<u8>, Vec<u8>)],
        content: usize,
    ) -> Result<(), StoreError> {
        if pairs.is_empty() {
            return Ok(());
        }
        let stamp = self.next_stamp();
        let mut per: Vec<Vec<(ByteBuf, ByteBuf)>> = (0..self.n()).map(|_| Vec::new()).collect();
        for (j, (k, v)) in pairs.iter().enumerate() {
            let stamp = if j < content { CONTENT_STAMP } else { stamp };
            for (i, f) in self.codec.encode(v, stamp).into_iter().enumerate() {
                per[i].push((ByteBuf::from(k.clone()), ByteBuf::from(f)));
            }
        }
        let fences: Option<Vec<(ByteBuf, u64)>> = fences.map(|f| {
            f.iter()
                .map(|(s, e)| (ByteBuf::from(s.clone()), *e))
                .collect()
        });
        let reqs = per
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                let req = match &fences {
                    None => Request::Batch(b),
                    Some(f) => Request::FencedBatch {
                        fences: f.clone(),
                        pairs: b,
                    },
                };
                (i, req)
            })
            .collect();
        self.write_all("write", reqs, self.write_need())
    }

    fn client_max_frame(&self) -> usize {
        crate::wire::DEFAULT_MAX_FRAME
    }

    /// Reads every key through the strategy, checks every fragment, rebuilds and rewrites the
    /// missing, corrupt or stale ones on servers that answer, and counts what it found.
    pub fn scrub(&self) -> Result<ScrubReport, StoreError> {
        let keys = self.gather(b"")?;
        let mut report = ScrubReport {
            store: StoreSpec::Remote(self.spec.clone()).to_string(),
            keys: keys.len(),
            ..ScrubReport::default()
        };
        let mut unreachable = BTreeSet::new();
        let mut repairs = Vec::new();
        for (key, seen) in keys {
            for s in &seen {
                if let Seen::Unreachable(e) = s {
                    unreachable.insert(e.clone());
                }
            }
            match self.resolve(&key, seen) {
                Ok(r) => {
                    report.fragments_ok += r.ok;
                    report.fragments_missing += r.unrepairable;
                    repairs.extend(r.repairs.into_iter().map(|(s, f)| (s, key.clone(), f)));
                }
                Err(_) => report.unrecoverable.push(lossy(&key)),
            }
        }
        let (done, failed) = self.repair(repairs);
        report.fragments_repaired = done;
        report.fragments_missing += failed;
        report.unreachable = unreachable.into_iter().collect();
        Ok(report)
    }
}

impl Store for RemoteStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.put_batch(&[(key.to_vec(), value.to_vec())])
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        self.put_coded(None, pairs, 0)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let reqs = (0..self.n())
            .map(|i| {
                (
                    i,
                    Request::Get {
                        key: ByteBuf::from(key.to_vec()),
                    },
                )
            })
            .collect();
        let mut seen = Vec::with_capacity(self.n());
        for (_, r) in self.client.call_all(reqs) {
            seen.push(match r {
                Ok(Response::Value(None)) => Seen::Absent,
                Ok(Response::Value(Some(Slot::Present(b)))) => Seen::Present(b.into_vec()),
                Ok(Response::Value(Some(Slot::Corrupt(_)))) => Seen::Corrupt,
                Ok(Response::Failed(why)) => Seen::Unreachable(why),
                Ok(other) => Seen::Unreachable(format!("unexpected answer {other:?}")),
                Err(
                    e @ (ClientError::WrongKey { .. }
                    | ClientError::WrongServer { .. }
                    | ClientError::Protocol { .. }),
                ) => return Err(StoreError::Refused(e.to_string())),
                Err(e) => Seen::Unreachable(e.to_string()),
            });
        }
        let r = self.resolve(key, seen)?;
        if !r.repairs.is_empty() {
            self.repair(
                r.repairs
                    .into_iter()
                    .map(|(s, f)| (s, key.to_vec(), f))
                    .collect(),
            );
        }
        Ok(r.value)
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        let keys = self.gather(prefix)?;
        self.resolve_all(keys)
    }

    /// Rule 12: one page, read from one page of every server.
    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: PageLimit,
    ) -> Result<Page, StoreError> {
        let mut from = after.map(<[u8]>::to_vec);
        let (mut pairs, more) = loop {
            let (keys, bound) = self.gather_page(prefix, from.as_deref(), limit)?;
            let pairs = self.resolve_all(keys)?;
            match bound {
                // Every key listed read as absent (leftovers rule 6 ignores): a page is never
                // empty while keys may follow, so go on after them.
                Some(b) if pairs.is_empty() => from = Some(b),
                _ => break (pairs, bound.is_some()),
            }
        };
        let max_keys = limit.max_keys.max(1);
        let mut cut = false;
        if pairs.len() > max_keys {
            pairs.truncate(max_keys);
            cut = true;
        }
        let mut bytes = 0u64;
        let mut keep = 0;
        for (k, v) in &pairs {
            let len = (k.len() + v.len()) as u64;
            if keep > 0 && bytes.saturating_add(len) > limit.max_bytes {
                break;
            }
            bytes = bytes.saturating_add(len);
            keep += 1;
        }
        if keep < pairs.len() {
            pairs.truncate(keep);
            cut = true;
        }
        Ok(Page {
            pairs,
            more: more || cut,
        })
    }

    fn last_under(&self, prefix: &[u8]) -> Result<Option<Pair>, StoreError> {
        for (key, seen) in self.gather(prefix)?.into_iter().rev() {
            let r = self.resolve(&key, seen)?;
            if !r.repairs.is_empty() {
                self.repair(
                    r.repairs
                        .into_iter()
                        .map(|(s, f)| (s, key.clone(), f))
                        .collect(),
                );
            }
            if let Some(v) = r.value {
                return Ok(Some((key, v)));
            }
        }
        Ok(None)
    }

    fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        let reqs = (0..self.n())
            .map(|i| {
                (
                    i,
                    Request::Delete {
                        key: ByteBuf::from(key.to_vec()),
                    },
                )
            })
            .collect();
        self.write_all("delete", reqs, self.delete_need())
    }

    fn delete_batch(&self, keys: &[Vec<u8>]) -> Result<(), StoreError> {
        match keys {
            [] => Ok(()),
            [key] => self.delete(key),
            _ => {
                // Protocol rule 8: one request per server for every key, one flush there.
                let keys: Vec<ByteBuf> = keys.iter().map(|k| ByteBuf::from(k.clone())).collect();
                let reqs = (0..self.n())
                    .map(|i| (i, Request::DeleteBatch { keys: keys.clone() }))
                    .collect();
                self.write_all("delete", reqs, self.delete_need())
            }
        }
    }

    fn flush(&self) -> Result<(), StoreError> {
        // Writes are durable when acknowledged (protocol rule 2): nothing is pending here.
        Ok(())
    }

    fn describe(&self) -> String {
        StoreSpec::Remote(self.spec.clone()).to_string()
    }

    fn degraded(&self) -> Option<String> {
        let n = self.degraded_reads.load(Ordering::Relaxed);
        (n > 0).then(|| {
            format!(
                "{n} values were rebuilt from fewer than all {} of their fragments (servers \
                 down, or fragments missing or damaged); run `checkpoint-server scrub` once the \
                 servers are back",
                self.n()
            )
        })
    }

    fn keeps_fences(&self) -> bool {
        true
    }

    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        self.raise_and_seal(scope, epoch)
    }

    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        self.put_coded(Some(fences), pairs, 0)
    }

    fn put_batch_fenced_content(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
        content: usize,
    ) -> Result<(), StoreError> {
        self.put_coded(Some(fences), pairs, content)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<StoreSpec, StoreError> {
        s.parse()
    }

    #[test]
    fn a_strategy_says_how_many_servers_it_needs() {
        assert_eq!(StoreSpec::servers_for("central").unwrap(), 1);
        assert_eq!(StoreSpec::servers_for("replicate:3").unwrap(), 3);
        assert_eq!(StoreSpec::servers_for("parity:4").unwrap(), 5);
        assert_eq!(StoreSpec::servers_for("ida:4,2,quorum=4").unwrap(), 6);
        for bad in ["ida:4", "ida:0,2", "nope", "central:x", "ida:4,2,quorum=9"] {
            assert!(StoreSpec::servers_for(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn specs_parse_and_print_back() {
        for s in [
            "local:/tmp/x",
            "memory",
            "central:127.0.0.1:7000",
            "replicate:2:a:1,b:2",
            "parity:3:a:1,b:1,c:1,d:1",
            "ida:2,1:a:1,b:1,c:1",
            "ida:2,1,quorum:a:1,b:1,c:1",
            "ida:2,1,quorum=2:a:1,b:1,c:1",
            "parity:2,quorum=3:a:1,b:1,c:1",
            "ida:1,1:[::1]:5,[::1]:6",
        ] {
            let spec = p(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(spec.to_string(), s);
        }
        assert_eq!(
            p("ida:4,2,quorum:a:1,b:1,c:1,d:1,e:1,f:1").unwrap(),
            StoreSpec::Remote(RemoteSpec {
                layout: Layout::Ida { m: 4, k: 2 },
                addrs: "a:1,b:1,c:1,d:1,e:1,f:1"
                    .split(',')
                    .map(String::from)
                    .collect(),
                ack: Ack::Quorum,
            })
        );
        for bad_w in [
            "ida:4,2,quorum=3:a:1,b:1,c:1,d:1,e:1,f:1",
            "ida:4,2,quorum=7:a:1,b:1,c:1,d:1,e:1,f:1",
        ] {
            let e = p(bad_w).expect_err(bad_w).to_string();
            assert!(e.contains("between 4") && e.contains("and 6"), "{e}");
        }
    }

    #[test]
    fn malformed_specs_say_what_is_wrong() {
        for (s, says) in [
            ("", "expected"),
            ("nfs:/x", "unknown strategy"),
            ("local:", "directory"),
            ("ida:4,2:a:1,b:1,c:1", "exactly 6 servers, 3 given"),
            ("ida:0,2:a:1,b:1", "at least 1"),
            ("ida:2,0:a:1,b:1", "at least 1"),
            ("ida:4:a:1", "wrong parameters"),
            ("ida:x,1:a:1,b:1", "must be a number"),
            ("ida:200,100:a:1", "M + K"),
            ("parity:2:a:1,b:1", "exactly 3 servers"),
            ("parity:2:a:1,a:1,b:1", "distinct servers"),
            ("replicate:2:a:1", "exactly 2 servers"),
            ("replicate:2", "missing the server list"),
            ("central:nohost", "HOST:PORT"),
            ("central:a:1,b:2", "exactly 1 servers"),
            ("central:a:99999", "HOST:PORT"),
        ] {
            let e = p(s).expect_err(s).to_string();
            assert!(
                e.contains(says),
                "{s:?} gave {e:?}, expected it to mention {says:?}"
            );
        }
    }

    /// An in-process server for [`RemoteStore::with_links`]: a memory store behind
    /// [`crate::server::serve`], which can be down or lose fence raises on the way.
    #[derive(Debug, Default)]
    struct TestLink {
        store: MemoryStore,
        down: std::sync::atomic::AtomicBool,
        drop_raises: std::sync::atomic::AtomicBool,
        scans: std::sync::atomic::AtomicUsize,
    }

    impl ServerLink for TestLink {
        fn call(&self, call: ServerCall) -> Result<ServerAnswer, ClientError> {
            let lost = self.down.load(Ordering::SeqCst)
                || (matches!(call.0, Request::RaiseFence { .. })
                    && self.drop_raises.load(Ordering::SeqCst));
            if lost {
                return Err(ClientError::Unreachable {
                    addr: "test".into(),
                    reason: "down".into(),
                });
            }
            if matches!(call.0, Request::Scan { .. }) {
                self.scans.fetch_add(1, Ordering::SeqCst);
            }
            Ok(crate::server::serve(&self.store, call))
        }
    }

    fn linked(layout: Layout, ack: Ack) -> (RemoteStore, Vec<Arc<TestLink>>) {
        let links: Vec<Arc<TestLink>> = (0..layout.servers())
            .map(|_| Arc::new(TestLink::default()))
            .collect();
        let named = links
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("test:{i}"), l.clone() as Arc<dyn ServerLink>))
            .collect();
        (RemoteStore::with_links(layout, ack, named).unwrap(), links)
    }

    /// Rule 10's seal, and why it is there. A zombie's write straddles its successor's raise:
    /// fragment 0 lands before it, fragment 3 after it on the one server that missed the raise
    /// (ida:2,2: M = 2, so two fragments would decode). With the seal, fragment 0 is deleted
    /// and the late one alone is never readable. With the fence raised on the same servers but
    /// no seal, the two fragments decode: the zombie's value appears in the successor's log.
    #[test]
    fn the_seal_keeps_a_zombies_straddling_write_unreadable() {
        let layout = Layout::Ida { m: 2, k: 2 };
        let scope = b"seg/\x00\x00\x00\x01".to_vec();
        let x = [&scope[..], b"/zombie"].concat();
        for seal in [true, false] {
            let (store, links) = linked(layout, Ack::Quorum);
            let frags = layout.codec().unwrap().encode(b"a stale segment", 77);
            links[0].store.put(&x, &frags[0]).unwrap(); // before the raise
            links[3].drop_raises.store(true, Ordering::SeqCst);
            if seal {
                store.raise_fence(&scope, 2).unwrap();
            } else {
                for l in &links[..3] {
                    l.store.raise_fence(&scope, 2).unwrap();
                }
            }
            // The zombie's late fragment, on the server that missed the raise: accepted.
            let late = Request::FencedBatch {
                fences: vec![(ByteBuf::from(scope.clone()), 1)],
                pairs: vec![(ByteBuf::from(x.clone()), ByteBuf::from(frags[3].clone()))],
            };
            assert!(matches!(
                links[3].call(ServerCall(late)).unwrap().0,
                Response::Done
            ));
            let got = store.get(&x).unwrap();
            if seal {
                assert_eq!(got, None, "sealed: the zombie's write is never readable");
                assert_eq!(store.scan_prefix(&scope).unwrap(), Vec::new());
            } else {
                assert_eq!(got.as_deref(), Some(&b"a stale segment"[..]), "unsealed");
            }
        }
    }

    /// Rule 10 without a seal when M = 1: a raise over copies lists nothing (it used to read the
    /// scope's every value back), and what was written before it stays readable. With M = 2
    /// the seal lists the scope on every server.
    #[test]
    fn a_raise_over_copies_does_not_list_the_scope() {
        let scope = b"seg/\x00\x00\x00\x02".to_vec();
        let key = [&scope[..], b"/1"].concat();
        for (layout, sealed) in [
            (Layout::Central, false),
            (Layout::Replicate { copies: 3 }, false),
            (Layout::Ida { m: 2, k: 1 }, true),
        ] {
            let (store, links) = linked(layout, Ack::All);
            store.put(&key, b"a segment").unwrap();
            store.raise_fence(&scope, 1).unwrap();
            let scans: usize = links.iter().map(|l| l.scans.load(Ordering::SeqCst)).sum();
            if sealed {
                assert!(scans >= layout.servers(), "{layout:?}: {scans} scans");
            } else {
                assert_eq!(scans, 0, "{layout:?}");
            }
            assert_eq!(store.get(&key).unwrap().as_deref(), Some(&b"a segment"[..]));
        }
    }

    /// Rule 9's limit, as `chaos` met it (ida:4,2 at a quorum): "b" acknowledged by five
    /// servers while server 3 was behind, then an overwrite cut short on servers 0 and 1. No
    /// version is on four servers: the read is `Unrecoverable`, never the older "a" (server
    /// 3's) and never the unacknowledged "c". Hence values that must survive are never
    /// overwritten (the log's watermarks).
    #[test]
    fn an_overwrite_cut_short_can_leave_no_version_and_never_an_older_one() {
        let (store, links) = linked(Layout::Ida { m: 4, k: 2 }, Ack::Quorum);
        let down = |which: &[usize], yes: bool| {
            for &i in which {
                links[i].down.store(yes, Ordering::SeqCst);
            }
        };
        store.put(b"wm/0", b"a").unwrap();
        down(&[3], true);
        store.put(b"wm/0", b"b").unwrap();
        down(&[3], false);
        down(&[2, 3, 4, 5], true);
        store
            .put(b"wm/0", b"c")
            .expect_err("two servers of five needed");
        down(&[2, 3, 4, 5], false);
        let err = store.get(b"wm/0").expect_err("no version on four servers");
        assert!(matches!(err, StoreError::Unrecoverable { .. }), "{err}");
    }

    /// `last_under` decodes from the greatest key down and stops at the first that reads:
    /// an older key left on one server (a delete's leftover) while another server is down
    /// fails a whole scan, but not the newest key's read.
    #[test]
    fn last_under_reads_the_newest_key_and_passes_over_older_undecidable_ones() {
        let layout = Layout::Ida { m: 2, k: 1 };
        let (store, links) = linked(layout, Ack::Quorum);
        store.put(b"w/2", b"newest").unwrap();
        let frags = layout.codec().unwrap().encode(b"old", 5);
        links[0].store.put(b"w/1", &frags[0]).unwrap(); // a delete's leftover
        assert_eq!(
            store.last_under(b"w/").unwrap(),
            Some((b"w/2".to_vec(), b"newest".to_vec()))
        );
        links[2].down.store(true, Ordering::SeqCst);
        assert!(matches!(
            store.scan_prefix(b"w/"),
            Err(StoreError::Unavailable { .. })
        ));
        assert_eq!(
            store.last_under(b"w/").unwrap(),
            Some((b"w/2".to_vec(), b"newest".to_vec()))
        );
    }

    /// Rules 10-11 through links: a raise needs K + 1 servers; a write refused by one server
    /// is `Fenced` even when a write quorum took it.
    #[test]
    fn a_raise_needs_k_plus_1_servers_and_one_refusal_fences_a_write() {
        let layout = Layout::Ida { m: 2, k: 2 };
        let scope = b"seg/9".to_vec();
        let (store, links) = linked(layout, Ack::Quorum);
        links[0].down.store(true, Ordering::SeqCst);
        links[1].down.store(true, Ordering::SeqCst);
        let err = store.raise_fence(&scope, 1).expect_err("2 of 4 < K + 1");
        assert!(
            matches!(err, StoreError::Unavailable { need: 3, .. }),
            "{err}"
        );
        links[1].down.store(false, Ordering::SeqCst);
        store.raise_fence(&scope, 1).unwrap();
        links[0].down.store(false, Ordering::SeqCst);
        // Server 0 missed the raise: a write at epoch 0 is taken there only, and refused.
        let err = store
            .put_batch_fenced(
                &[(scope.clone(), 0)],
                &[(b"seg/9/a".to_vec(), b"v".to_vec())],
            )
            .expect_err("refused by three servers");
        assert!(matches!(err, StoreError::Fenced { newest: 1, .. }), "{err}");
        store
            .put_batch_fenced(
                &[(scope.clone(), 1)],
                &[(b"seg/9/b".to_vec(), b"w".to_vec())],
            )
            .unwrap();
        assert_eq!(store.get(b"seg/9/b").unwrap().as_deref(), Some(&b"w"[..]));
        assert_eq!(store.get(b"seg/9/a").unwrap(), None);
    }

    fn layouts() -> impl proptest::strategy::Strategy<Value = Layout> {
        use proptest::prelude::*;
        prop_oneof![
            (1usize..=4).prop_map(|copies| Layout::Replicate { copies }),
            (1usize..=4).prop_map(|m| Layout::Parity { m }),
            (1usize..=4, 1usize..=3).prop_map(|(m, k)| Layout::Ida { m, k }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        /// Rules 10-11 against the counting argument in the module docs, over every layout: a
        /// zombie's value whose fragments reached servers `pre` before the raise (some of
        /// which, `missed`, never got the raise) and servers `post` after it is readable
        /// afterwards exactly when it was decodable before the raise; a fragment sent after
        /// the raise to a server that took it is refused.
        #[test]
        fn a_zombies_value_is_readable_after_a_raise_only_if_it_was_before(
            layout in layouts(),
            pre in proptest::collection::vec(proptest::bool::ANY, 7),
            missed in proptest::collection::vec(proptest::bool::ANY, 7),
            post in proptest::collection::vec(proptest::bool::ANY, 7),
        ) {
            let n = layout.servers();
            let scope = b"seg/p".to_vec();
            let x = b"seg/p/x".to_vec();
            let (store, links) = linked(layout, Ack::Quorum);
            let frags = layout.codec().unwrap().encode(b"zombie bytes", 5);
            for i in (0..n).filter(|&i| pre[i]) {
                links[i].store.put(&x, &frags[i]).unwrap();
            }
            for i in (0..n).filter(|&i| missed[i]) {
                links[i].drop_raises.store(true, Ordering::SeqCst);
            }
            let took = (0..n).filter(|&i| !missed[i]).count();
            match store.raise_fence(&scope, 2) {
                Ok(()) => proptest::prop_assert!(took > layout.servers() - layout.needed()),
                Err(StoreError::Unavailable { .. }) => {
                    proptest::prop_assert!(took <= layout.servers() - layout.needed());
                    return Ok(());
                }
                Err(e) => return Err(proptest::test_runner::TestCaseError::fail(e.to_string())),
            }
            for i in (0..n).filter(|&i| post[i]) {
                let late = Request::FencedBatch {
                    fences: vec![(ByteBuf::from(scope.clone()), 1)],
                    pairs: vec![(ByteBuf::from(x.clone()), ByteBuf::from(frags[i].clone()))],
                };
                let answer = links[i].call(ServerCall(late)).unwrap().0;
                proptest::prop_assert_eq!(
                    matches!(answer, Response::Done),
                    missed[i],
                    "server {} answered {:?}", i, answer
                );
            }
            let before = (0..n).filter(|&i| pre[i]).count() >= layout.needed();
            let got = store.get(&x).unwrap();
            proptest::prop_assert_eq!(got.is_some(), before);
        }
    }

    #[test]
    fn remote_needs_a_key() {
        let e = open_store(&p("central:127.0.0.1:1").unwrap(), None)
            .err()
            .expect("no key must fail")
            .to_string();
        assert!(e.contains("--key"), "{e}");
    }
}

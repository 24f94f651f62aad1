//! The simulator's checkpoint servers (rule 8 of `sim/mod.rs`): S in-process servers behind
//! the real [`RemoteStore`] strategy code (coding, placement, quorums, fences, seals, read
//! repair, scrub), each answering with the real request handler
//! ([`veriflow_checkpoint::server::serve`]) over a [`Disk`] of its own.
//!
//! Rules:
//!
//! 1. A [`Disk`] makes a write visible at once and durable at the next flush; a crash rolls
//!    back every write since the last flush (the server flushes before it answers, protocol
//!    rule 2, so what a crash loses is the request it was serving: the *dying* crash).
//! 2. A crashed server is down: every request to it is `Unreachable`, as a dead process is.
//!    It restarts with its disk and is scrubbed at once (`checkpoint-server scrub`, as an
//!    operator runs it), so that the values written while it was down have all their
//!    fragments again before another server may crash.
//! 3. At most one server is down or dying at a time, and only in a layout that survives it:
//!    writes need W ≤ S - 1, a fence raise K + 1 ≤ S - 1 (strategy rule 10), reads M ≤ S - 1.
//!    A seed whose layout does not tolerate one crash still runs on its servers, without
//!    server crashes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::ChaCha8Rng;
use rand::RngExt;
use veriflow_checkpoint::client::ClientError;
use veriflow_checkpoint::{
    Ack, Layout, Page, PageLimit, Pairs, RemoteStore, ServerAnswer, ServerCall, ServerLink, Store,
    StoreError,
};

/// The store layout of one seed and its servers' crash rate (rule 3).
#[derive(Debug, Clone, PartialEq)]
pub struct StoreLayout {
    /// Fragments and code.
    pub layout: Layout,
    /// When a write is acknowledged.
    pub ack: Ack,
    /// Server crashes per simulated second (0 when the layout tolerates none, rule 3).
    pub crash: f64,
}

impl StoreLayout {
    /// A layout drawn from `rng`: 3 to 6 servers under replication, parity or IDA, with every
    /// acknowledgement policy.
    pub fn draw(rng: &mut ChaCha8Rng) -> StoreLayout {
        let s = rng.random_range(3..=6usize);
        // Replication 20 %, parity 30 %, IDA 50 %; `ack=all` 20 %, `quorum` 40 %,
        // `quorum=M` 40 %: about half the seeds have a layout that survives a server crash.
        let layout = match rng.random_range(0..10) {
            0..=1 => Layout::Replicate { copies: s },
            2..=4 => Layout::Parity { m: s - 1 },
            _ => {
                let k = rng.random_range(1..=s - 2);
                Layout::Ida { m: s - k, k }
            }
        };
        let ack = match rng.random_range(0..5) {
            0 => Ack::All,
            1..=2 => Ack::Quorum,
            _ => Ack::AtLeast(layout.needed()),
        };
        // A safety phase lasts 0.1-0.7 simulated seconds: 20-80 crashes a second give a few
        // per seed, one at a time.
        let crash = if tolerates_one_down(layout, ack) {
            rng.random_range(20.0..80.0)
        } else {
            0.0
        };
        StoreLayout { layout, ack, crash }
    }

    /// One in-process server holding everything, never crashing (fault-free runs).
    pub fn central() -> StoreLayout {
        StoreLayout {
            layout: Layout::Central,
            ack: Ack::All,
            crash: 0.0,
        }
    }
}

/// Rule 3: whether every operation still has its servers with one of them down.
pub fn tolerates_one_down(layout: Layout, ack: Ack) -> bool {
    let n = layout.servers();
    let (m, k) = (layout.needed(), n - layout.needed());
    let w = match ack {
        Ack::All => n,
        Ack::Quorum => (m + 1).min(n),
        Ack::AtLeast(w) => w.min(n),
    };
    n >= 2 && w < n && k + 1 < n && m < n
}

#[derive(Debug, Default)]
struct DiskState {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    fences: HashMap<Vec<u8>, u64>,
    /// What to put back at a crash, newest last (rule 1).
    undo: Vec<Undo>,
}

#[derive(Debug)]
enum Undo {
    Key(Vec<u8>, Option<Vec<u8>>),
    Fence(Vec<u8>, Option<u64>),
}

/// A server's disk (rule 1).
#[derive(Debug, Default)]
pub(super) struct Disk {
    state: Mutex<DiskState>,
    /// The next flush fails: the server dies in it.
    dying: AtomicBool,
    /// Set by a flush that failed because the server died.
    died: AtomicBool,
}

impl Disk {
    fn state(&self) -> std::sync::MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(st: &mut DiskState, key: &[u8], value: Option<Vec<u8>>) {
        let old = match value {
            Some(v) => st.map.insert(key.to_vec(), v),
            None => st.map.remove(key),
        };
        st.undo.push(Undo::Key(key.to_vec(), old));
    }

    /// Rule 1: what was not flushed is gone.
    fn crash(&self) {
        let mut st = self.state();
        while let Some(u) = st.undo.pop() {
            match u {
                Undo::Key(k, Some(v)) => {
                    st.map.insert(k, v);
                }
                Undo::Key(k, None) => {
                    st.map.remove(&k);
                }
                Undo::Fence(s, Some(e)) => {
                    st.fences.insert(s, e);
                }
                Undo::Fence(s, None) => {
                    st.fences.remove(&s);
                }
            }
        }
    }
}

impl Store for Disk {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        Disk::set(&mut self.state(), key, Some(value.to_vec()));
        Ok(())
    }

    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        let mut st = self.state();
        for (k, v) in pairs {
            Disk::set(&mut st, k, Some(v.clone()));
        }
        Ok(())
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.state().map.get(key).cloned())
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        let st = self.state();
        Ok(st
            .map
            .range(prefix.to_vec()..)
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
        let st = self.state();
        veriflow_checkpoint::fill_page(
            st.map
                .range::<[u8], _>((
                    veriflow_checkpoint::page_start(prefix, after),
                    std::ops::Bound::Unbounded,
                ))
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| Ok((k.clone(), v.clone()))),
            limit,
        )
    }

    fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        Disk::set(&mut self.state(), key, None);
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        if self.dying.swap(false, Ordering::SeqCst) {
            self.died.store(true, Ordering::SeqCst);
            return Err(StoreError::Io("the server crashed in its flush".into()));
        }
        self.state().undo.clear();
        Ok(())
    }

    fn describe(&self) -> String {
        "a simulated server's disk".into()
    }

    fn keeps_fences(&self) -> bool {
        true
    }

    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        let mut st = self.state();
        let old = st.fences.get(scope).copied();
        if old.is_none_or(|o| epoch > o) {
            st.fences.insert(scope.to_vec(), epoch);
            st.undo.push(Undo::Fence(scope.to_vec(), old));
        }
        Ok(())
    }

    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        // One lock from the check to the write (protocol rule 7).
        let mut st = self.state();
        for (scope, epoch) in fences {
            if let Some(&newest) = st.fences.get(scope) {
                if *epoch < newest {
                    return Err(StoreError::Fenced {
                        scope: String::from_utf8_lossy(scope).into_owned(),
                        epoch: *epoch,
                        newest,
                    });
                }
            }
        }
        for (k, v) in pairs {
            Disk::set(&mut st, k, Some(v.clone()));
        }
        Ok(())
    }
}

/// One simulated server: its disk and whether it runs (rule 2).
#[derive(Debug)]
pub(super) struct SimServer {
    name: String,
    disk: Disk,
    down: AtomicBool,
    /// Requests lost in a crash (the dying crash of rule 1).
    writes_lost: AtomicU64,
}

impl ServerLink for SimServer {
    fn call(&self, call: ServerCall) -> Result<ServerAnswer, ClientError> {
        let unreachable = || ClientError::Unreachable {
            addr: self.name.clone(),
            reason: "the server crashed (simulated)".into(),
        };
        if self.down.load(Ordering::SeqCst) {
            return Err(unreachable());
        }
        let answer = veriflow_checkpoint::server::serve(&self.disk, call);
        if self.disk.died.swap(false, Ordering::SeqCst) {
            self.disk.crash();
            self.down.store(true, Ordering::SeqCst);
            self.writes_lost.fetch_add(1, Ordering::SeqCst);
            return Err(unreachable());
        }
        Ok(answer)
    }
}

/// The S servers of a seed and the store over them.
pub(super) struct Servers {
    servers: Vec<Arc<SimServer>>,
    store: Arc<RemoteStore>,
}

impl Servers {
    pub(super) fn new(layout: &StoreLayout) -> Result<Servers, String> {
        let servers: Vec<Arc<SimServer>> = (0..layout.layout.servers())
            .map(|i| {
                Arc::new(SimServer {
                    name: format!("sim-server-{i}"),
                    disk: Disk::default(),
                    down: AtomicBool::new(false),
                    writes_lost: AtomicU64::new(0),
                })
            })
            .collect();
        let links = servers
            .iter()
            .map(|s| (s.name.clone(), s.clone() as Arc<dyn ServerLink>))
            .collect();
        let store = RemoteStore::with_links(layout.layout, layout.ack, links)
            .map_err(|e| format!("the simulated store: {e}"))?;
        Ok(Servers {
            servers,
            store: Arc::new(store),
        })
    }

    /// The store the run writes through.
    pub(super) fn store(&self) -> Arc<RemoteStore> {
        self.store.clone()
    }

    /// How many servers there are.
    pub(super) fn len(&self) -> usize {
        self.servers.len()
    }

    /// Whether a server is down or about to die (rule 3 allows one at a time).
    pub(super) fn any_unwell(&self) -> bool {
        self.servers
            .iter()
            .any(|s| s.down.load(Ordering::SeqCst) || s.disk.dying.load(Ordering::SeqCst))
    }

    /// Crashes server `i` now, or (`in_flush`) in the flush of the next write it serves.
    pub(super) fn crash(&self, i: usize, in_flush: bool) {
        let s = &self.servers[i];
        if in_flush {
            s.disk.dying.store(true, Ordering::SeqCst);
        } else {
            s.disk.crash();
            s.down.store(true, Ordering::SeqCst);
        }
    }

    /// Restarts server `i` (a dying one that served no write lives on) and scrubs the store
    /// (rule 2); returns the fragments the scrub rewrote.
    pub(super) fn restart(&self, i: usize) -> Result<usize, String> {
        let s = &self.servers[i];
        s.disk.dying.store(false, Ordering::SeqCst);
        s.down.store(false, Ordering::SeqCst);
        let report = self
            .store
            .scrub()
            .map_err(|e| format!("scrub after restarting {}: {e}", s.name))?;
        Ok(report.fragments_repaired)
    }

    /// Requests lost in crashes so far.
    pub(super) fn writes_lost(&self) -> u64 {
        self.servers
            .iter()
            .map(|s| s.writes_lost.load(Ordering::SeqCst))
            .sum()
    }
}

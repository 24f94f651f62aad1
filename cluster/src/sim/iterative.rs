//! Iterative mode (paper 000, `veriflow_runtime::iterative`) under the deterministic
//! simulator: P processes host the V vnodes of an iterative run of the heat equation, a
//! supervisor plays the coordinator's part (failure detection by heartbeats, replacements at
//! a new epoch), all on one thread on simulated time, with faults drawn from one seed.
//!
//! The nodes are the runtime's own ([`SteppedNode`]): the code the threads of cluster and
//! embedded mode loop around, stepped here instead. So a bug a seed finds is a bug of the real
//! iterative mode, and the seed replays it:
//! `VERIFLOW_SIM_SEED=N cargo test -p veriflow-cluster --test sim_iterative`.
//!
//! Rules (the numbers of `sim/mod.rs` where they are the same):
//!
//! 1. Time moves in quanta of [`QUANTUM`]. In each quantum, in this order: faults due are
//!    injected (safety phase only), replacement processes due start, frames due arrive,
//!    the supervisor runs its detector, and every running process (in an order drawn from the
//!    seed) reads what arrived, sends its heartbeat when due, steps each of its nodes once
//!    (in a drawn order), and with probability `pump` flushes its store writes.
//! 2. Links with the supervisor are TCP streams: in order, never lost, delayed by up to
//!    `delay`, held while a partition cuts them. Links between processes lose, duplicate,
//!    delay and reorder frames at the seed's rates; a message between two vnodes of one
//!    process never leaves it. A frame goes to the process that hosts its vnode in the
//!    supervisor's map when it is sent.
//! 3. The supervisor declares a process dead when it has heard nothing from it for
//!    [`BOUND`] (every frame counts, heartbeats go every [`HEARTBEAT`]) or at once when its
//!    connection resets. It then tells the process to exit (a zombie reads that late: after a
//!    partition heals, or a drawn lag after a pause, while its nodes run on), and hosts its
//!    vnodes at the next epoch on a new process, started 5-50 ms later, whose nodes restore
//!    from their backups (`iterative` rule 6).
//! 4. Faults of the safety phase, each at its own rate per simulated second: a process
//!    crashes (its memory is lost, and its store writes not flushed yet but a drawn prefix of
//!    them, as sled keeps a durable prefix of its log; half the time its connection resets); a process pauses, half of the time past [`BOUND`] (a zombie that
//!    comes back); a partition cuts two processes (one way or both, for 1-80 ms) or a process
//!    from the supervisor (past [`BOUND`]: another zombie). The faults that end in a
//!    declaration strike only a whole run (every vnode hosted, restored and holding fresh
//!    backups of the vnodes it backs up: one failure at a time, as `iterative` rule 6 needs);
//!    short pauses and clogs of a supervisor link stay well under [`BOUND`].
//! 5. The safety phase lasts a drawn share of the fault-free run and until `min_faults`
//!    faults; a seed behind that pace is forced one fault per quantum (a crash, a pause or a
//!    partition if the run is whole, else a lost frame). Then the liveness phase: no new
//!    crashes, pauses or partitions (the links keep their loss, duplication and delay), and
//!    the run must keep ending steps: a seed in which no step ends for `liveness` (10 s), or
//!    that has not ended [`LIMIT`] after the safety phase, fails as a hang with what every
//!    node waits for. (Synchronous iterations over a link losing 30 % of the frames take
//!    seconds per step: an end-to-end deadline would call them hangs.)
//! 6. Checkers after every seed: every vnode's final state ends the same number of steps;
//!    every step's accepted iterate has a global residual within the tolerance's bound (no
//!    false convergence) and is within 1e-8 of the direct solve and of the fault-free run; no
//!    node accepted a message of an incarnation older than one it had seen (the simulator's
//!    own count of such messages equals the node's [`NodeStats::fenced`]); the supervisor
//!    took final states of current incarnations only; every data backup on the store reads
//!    back and matches its digest.
//! 7. Everything observable (faults, declarations, frames delivered, final states) is folded
//!    into a trace hash: one seed run twice gives the same hash.

use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use veriflow_checkpoint::{MemoryStore, Pairs, Store, StoreError};
use veriflow_runtime::iterative::{
    heat, stored_backup, IterConfig, IterError, IterMsg, Mode, NodeStats, Stepped, SteppedNode,
    SteppedRun,
};
use veriflow_runtime::transport::{Endpoint, Envelope, Message, TransportError};
use veriflow_runtime::{Epoch, VnodeId};

use super::{FaultCounts, Faults, QUANTUM};

/// Heartbeat period of a process to the supervisor (rule 3).
pub const HEARTBEAT: Duration = Duration::from_millis(5);

/// Silence after which the supervisor declares a process dead (rule 3): five heartbeats,
/// paper 004's interval + timeout at the simulator's scale.
pub const BOUND: Duration = Duration::from_millis(25);

/// Longest pause or supervisor clog that must not end in a declaration (rule 4): with a
/// heartbeat period and the largest frame delay (3 ms) it stays under [`BOUND`].
const SHORT: Duration = Duration::from_millis(10);

/// Longest simulated run after the safety phase (rule 5).
const LIMIT: Duration = Duration::from_secs(120);

/// Tolerance of the blocks' residual (as the runtime's iterative tests).
const TOL: f64 = 1e-10;

/// Largest error of an accepted step against the direct solve and the fault-free run (as the
/// runtime's iterative tests, whose tolerance it is).
const ERR: f64 = 1e-8;

/// One simulated iterative run.
#[derive(Debug, Clone)]
pub struct IterSimConfig {
    /// The seed everything is drawn from.
    pub seed: u64,
    /// Processes hosting vnodes at the start (round-robin).
    pub procs: u32,
    /// Vnodes (blocks of the heat equation), a multiple of `procs` so that no vnode shares a
    /// process with a backup neighbour.
    pub vnodes: u32,
    /// Unknowns of the heat equation.
    pub n: usize,
    /// dt / dx^2.
    pub r: f64,
    /// Time steps (steps of the run).
    pub steps: u64,
    /// Asynchronous or synchronous iterations.
    pub mode: Mode,
    /// Data backups on the store (else on backup neighbours).
    pub store: bool,
    /// Iterations between data backups.
    pub backup_every: u64,
    /// Resend period of the nodes.
    pub resend: Duration,
    /// Fault rates (rule 4).
    pub faults: Faults,
    /// Share of the fault-free run the safety phase lasts at least (rule 5).
    pub safety_share: f64,
    /// Faults the safety phase injects at least (issue 14: 20 per seed).
    pub min_faults: u64,
    /// After the faults stop, a run in which no step ends for this long is a hang (rule 5).
    pub liveness: Duration,
    /// Whether the store keeps epoch fences (`StoreError::Fenced`).
    pub fences: bool,
}

impl IterSimConfig {
    /// The configuration of seed `seed`: sizes and fault rates drawn from it.
    pub fn from_seed(seed: u64) -> IterSimConfig {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x17e4_a71e);
        let procs = rng.random_range(2..=4);
        let vnodes = procs * rng.random_range(1..=2);
        let n = vnodes as usize * rng.random_range(4..=16);
        IterSimConfig {
            seed,
            procs,
            vnodes,
            n,
            r: rng.random_range(0.5..4.0),
            // A fault-free run of 0.2-1.5 simulated seconds, so that a seed sees several
            // crashes and zombies.
            steps: rng.random_range(8..=30),
            // One seed in four iterates synchronously.
            mode: if rng.random_bool(0.25) {
                Mode::Sync
            } else {
                Mode::Async
            },
            store: rng.random_bool(0.5),
            backup_every: rng.random_range(2..=10),
            resend: Duration::from_micros(rng.random_range(1500..6000)),
            faults: Faults::draw(&mut rng),
            safety_share: rng.random_range(0.4..0.9),
            min_faults: 20,
            liveness: Duration::from_secs(10),
            fences: true,
        }
    }

    fn iter_config(&self) -> IterConfig {
        let mut cfg = IterConfig::new(self.mode, IterConfig::chain(self.vnodes), TOL);
        cfg.backup_every = self.backup_every;
        cfg.resend = self.resend;
        cfg
    }
}

/// What a seed did.
#[derive(Debug, Clone)]
pub struct IterSimOutcome {
    /// The configuration.
    pub config: IterSimConfig,
    /// Faults injected.
    pub faults: FaultCounts,
    /// Messages of dead incarnations the nodes dropped (`iterative` rule 8).
    pub fenced: u64,
    /// Writes of zombies the store refused (`backup.rs` rule 4).
    pub superseded: u64,
    /// Hash of everything observable (rule 7).
    pub trace: u64,
    /// Simulated time at which the run ended.
    pub finished_at: Duration,
    /// The fault-free run's end.
    pub reference_at: Duration,
    /// Node replacements (declarations' vnodes).
    pub replacements: u64,
    /// Invariants checked.
    pub checks: u64,
}

/// Why a seed failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("seed {seed}: {what}\n  replay: VERIFLOW_SIM_SEED={seed} cargo test -p veriflow-cluster --test sim_iterative\n  config: {config}")]
pub struct IterSimFailure {
    /// The seed.
    pub seed: u64,
    /// What went wrong.
    pub what: String,
    /// The configuration, for the message.
    pub config: String,
}

/// Runs one seed and checks it (rules 1-7): first without faults (the reference), then with.
pub fn run(cfg: &IterSimConfig) -> Result<IterSimOutcome, IterSimFailure> {
    let fail = |what: String| IterSimFailure {
        seed: cfg.seed,
        what,
        config: format!("{cfg:?}"),
    };
    let quiet = IterSimConfig {
        faults: Faults::none(),
        min_faults: 0,
        ..cfg.clone()
    };
    let mut reference = World::new(&quiet, None).map_err(fail)?;
    let ref_states = reference
        .run()
        .map_err(|e| fail(format!("the fault-free run: {e}")))?;
    let reference_at = reference.now;
    let faultless = cfg.faults == Faults::none() && cfg.min_faults == 0;
    let safety = (!faultless).then(|| reference_at.mul_f64(cfg.safety_share));
    let mut w = World::new(cfg, safety).map_err(fail)?;
    let states = w.run().map_err(fail)?;
    let checks = check(cfg, &states, &ref_states, &w).map_err(fail)?;
    let trace = {
        let mut t = w.trace.clone();
        for s in &states {
            t.update(s);
        }
        u64::from_le_bytes(t.finalize().as_bytes()[..8].try_into().unwrap_or_default())
    };
    Ok(IterSimOutcome {
        config: cfg.clone(),
        faults: w.faults.clone(),
        fenced: w.fenced_total(),
        superseded: w.superseded,
        trace,
        finished_at: w.now,
        reference_at,
        replacements: w.replacements,
        checks,
    })
}

/// Rule 6.
fn check(
    cfg: &IterSimConfig,
    states: &[Vec<u8>],
    reference: &[Vec<u8>],
    w: &World,
) -> Result<u64, String> {
    let mut checks = 0u64;
    let decode = |states: &[Vec<u8>]| -> Result<Vec<heat::Heat>, String> {
        states
            .iter()
            .enumerate()
            .map(|(v, s)| {
                postcard::from_bytes::<heat::Heat>(s)
                    .map_err(|e| format!("v{v}'s final state does not decode: {e}"))
            })
            .collect()
    };
    let got = decode(states)?;
    let want = decode(reference)?;
    let exact = heat::reference(cfg.n, cfg.r, cfg.steps);
    let mut prev = heat::initial(cfg.n);
    for (s, exact) in exact.iter().enumerate() {
        let step = |blocks: &[heat::Heat]| -> Result<Vec<f64>, String> {
            let mut u = Vec::with_capacity(cfg.n);
            for (v, b) in blocks.iter().enumerate() {
                let a = b.accepted.get(s).ok_or_else(|| {
                    format!(
                        "v{v} ended {} steps, the run has {}",
                        b.accepted.len(),
                        cfg.steps
                    )
                })?;
                u.extend_from_slice(a);
            }
            Ok(u)
        };
        let u = step(&got)?;
        let u_ref = step(&want)?;
        if u.len() != cfg.n {
            return Err(format!("step {s}: {} unknowns, not {}", u.len(), cfg.n));
        }
        // No false convergence: block Jacobi with exact local solves, a halo change below TOL
        // moves the residual by at most 2 r TOL per halo (the runtime's iterative tests).
        let res = heat::global_residual(&u, &prev, cfg.r);
        if res > 4.0 * cfg.r * TOL {
            return Err(format!(
                "step {s}: false convergence: global residual {res:e} > {:e}",
                4.0 * cfg.r * TOL
            ));
        }
        let dist = |a: &[f64], b: &[f64]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max)
        };
        let e = dist(&u, exact);
        if e > ERR {
            return Err(format!("step {s}: error {e:e} against the direct solve"));
        }
        let e = dist(&u, &u_ref);
        if e > ERR {
            return Err(format!("step {s}: {e:e} away from the fault-free run"));
        }
        checks += 4;
        prev = u;
    }
    if got.iter().any(|b| b.accepted.len() as u64 != cfg.steps) {
        return Err("a vnode ended another number of steps".into());
    }
    checks += 1;
    // No message of a dead incarnation accepted (the count is checked after every step; here
    // the stale Done reports).
    if let Some(e) = &w.stale_accepted {
        return Err(e.clone());
    }
    checks += w.fence_checks;
    // Every data backup on the store reads back.
    if cfg.store {
        for v in 0..cfg.vnodes {
            stored_backup(&*w.store, VnodeId(v))
                .map_err(|e| format!("the data backup of v{v} is unreadable: {e}"))?;
            checks += 1;
        }
    }
    Ok(checks)
}

/// Who a frame goes between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    Sup,
    Proc(u32),
}

#[derive(Debug)]
enum Frame {
    /// Between vnodes of two processes.
    Peer {
        to_proc: u32,
        to: VnodeId,
        env: Envelope,
    },
    /// To the supervisor: alive.
    Heartbeat(u32),
    /// To the supervisor: a vnode's final state.
    Done {
        proc: u32,
        vnode: VnodeId,
        epoch: Epoch,
        steps: u64,
        state: Vec<u8>,
    },
    /// To the supervisor: the process's connection reset.
    Closed(u32),
    /// To a process: you were declared dead; exit.
    Exit(u32),
}

type InFlight = super::net::InFlight<Frame>;

/// What a node pulled from its endpoint, for the dead-incarnation checker (rule 6): the
/// newest epoch seen per sender and how many messages were older.
#[derive(Default)]
struct Seen {
    newest: BTreeMap<VnodeId, Epoch>,
    stale: u64,
}

type Outbox = Arc<Mutex<Vec<(VnodeId, Envelope)>>>;
type Inbox = Arc<Mutex<VecDeque<Envelope>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A node's endpoint: an inbox the process fills and an outbox it empties (rule 2).
struct SimEndpoint {
    me: VnodeId,
    epoch: Epoch,
    inbox: Inbox,
    outbox: Outbox,
    seen: Arc<Mutex<Seen>>,
}

impl Endpoint for SimEndpoint {
    fn send(&mut self, to: VnodeId, msg: Message) -> Result<(), TransportError> {
        let env = Envelope {
            from: self.me,
            epoch: self.epoch,
            msg,
        };
        lock(&self.outbox).push((to, env));
        Ok(())
    }
    fn try_recv(&mut self) -> Option<Envelope> {
        let env = lock(&self.inbox).pop_front()?;
        let mut seen = lock(&self.seen);
        let newest = seen.newest.entry(env.from).or_insert(env.epoch);
        if env.epoch < *newest {
            seen.stale += 1;
        } else {
            *newest = env.epoch;
        }
        Some(env)
    }
    fn recv_timeout(&mut self, _timeout: Duration) -> Option<Envelope> {
        // Never called by a stepped node; never blocks (rule 1).
        self.try_recv()
    }
    fn set_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
    }
}

/// A process's handle on the shared store: its writes since its last flush are undone if it
/// crashes (rule 4: an unflushed write dies with the process, as with sled).
struct ProcStore {
    inner: Arc<MemoryStore>,
    fences: bool,
    /// Unflushed writes, batch by batch: (key, value before, value written).
    pending: Mutex<Vec<Vec<Undo>>>,
}

/// How to undo one write: (key, value before, value written).
type Undo = (Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>);

impl ProcStore {
    fn record(&self, pairs: &[(Vec<u8>, Vec<u8>)], before: Vec<Option<Vec<u8>>>) {
        let batch = pairs
            .iter()
            .zip(before)
            .map(|((k, v), old)| (k.clone(), old, Some(v.clone())))
            .collect();
        lock(&self.pending).push(batch);
    }

    fn before(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        pairs.iter().map(|(k, _)| self.inner.get(k)).collect()
    }

    /// The crash: a prefix of the unflushed batches, `keep` of them, survives (sled's log is
    /// a durable prefix, a batch all or nothing); the others are undone, newest first, where
    /// no later write replaced them. Returns how many batches were lost.
    fn crash(&self, keep: usize) -> u64 {
        let mut pending = std::mem::take(&mut *lock(&self.pending));
        let lost_batches = pending.split_off(keep.min(pending.len()));
        let lost = lost_batches.len() as u64;
        for (key, old, new) in lost_batches.into_iter().flatten().rev() {
            if self.inner.get(&key).ok().flatten() == new {
                let _ = match old {
                    Some(v) => self.inner.put(&key, &v),
                    None => self.inner.delete(&key),
                };
            }
        }
        lost
    }
}

impl Store for ProcStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let pairs = [(key.to_vec(), value.to_vec())];
        let before = self.before(&pairs)?;
        self.inner.put(key, value)?;
        self.record(&pairs, before);
        Ok(())
    }
    fn put_batch(&self, pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        let before = self.before(pairs)?;
        self.inner.put_batch(pairs)?;
        self.record(pairs, before);
        Ok(())
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key)
    }
    fn scan_prefix(&self, prefix: &[u8]) -> Result<Pairs, StoreError> {
        self.inner.scan_prefix(prefix)
    }
    fn last_under(&self, prefix: &[u8]) -> Result<Option<veriflow_checkpoint::Pair>, StoreError> {
        self.inner.last_under(prefix)
    }
    fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        let old = self.inner.get(key)?;
        self.inner.delete(key)?;
        lock(&self.pending).push(vec![(key.to_vec(), old, None)]);
        Ok(())
    }
    fn flush(&self) -> Result<(), StoreError> {
        lock(&self.pending).clear();
        Ok(())
    }
    fn describe(&self) -> String {
        "the iterative simulator's store".to_string()
    }
    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        if !self.fences {
            return Ok(());
        }
        self.inner.raise_fence(scope, epoch)
    }
    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        let before = self.before(pairs)?;
        if self.fences {
            self.inner.put_batch_fenced(fences, pairs)?;
        } else {
            self.inner.put_batch(pairs)?;
        }
        self.record(pairs, before);
        Ok(())
    }
}

/// One incarnation of a vnode on a process.
struct Hosted {
    node: SteppedNode,
    epoch: Epoch,
    inbox: Inbox,
    seen: Arc<Mutex<Seen>>,
    /// Its final state went to the supervisor.
    reported: bool,
}

struct Proc {
    id: u32,
    /// Vnodes it hosts, with their epochs (its nodes exist once started).
    vnodes: Vec<(VnodeId, Epoch)>,
    start_at: Duration,
    started: bool,
    nodes: Vec<Hosted>,
    outbox: Outbox,
    /// Frames arrived from other processes, not yet read.
    peer_in: VecDeque<(VnodeId, Envelope)>,
    /// Frames arrived from the supervisor, not yet read.
    sup_in: VecDeque<Frame>,
    /// Supervisor frames are not read before this (a resumed zombie's nodes run first).
    deaf_until: Duration,
    paused_until: Option<Duration>,
    dead: bool,
    /// The supervisor declared it dead (it may not know yet).
    declared: bool,
    store: Arc<ProcStore>,
    last_heartbeat: Option<Duration>,
}

struct World {
    cfg: IterSimConfig,
    run: SteppedRun,
    now: Duration,
    rng: ChaCha8Rng,
    procs: BTreeMap<u32, Proc>,
    next_id: u32,
    net: BinaryHeap<InFlight>,
    seq: u64,
    link_last: BTreeMap<(Node, Node), Duration>,
    cuts: BTreeMap<(Node, Node), Duration>,
    store: Arc<MemoryStore>,
    /// The supervisor's map: vnode -> (process, epoch).
    map: Vec<(u32, Epoch)>,
    /// The supervisor's last hearing of each process.
    heard: BTreeMap<u32, Duration>,
    /// Final states of current incarnations.
    done: BTreeMap<VnodeId, (Epoch, u64, Vec<u8>)>,
    faults: FaultCounts,
    trace: blake3::Hasher,
    /// Planned end of the safety phase (None: no faults at all).
    safety: Option<Duration>,
    force_loss: bool,
    replacements: u64,
    superseded: u64,
    /// Fenced counts of nodes gone (crashed, superseded, stopped).
    fenced_gone: u64,
    fence_checks: u64,
    stale_accepted: Option<String>,
    /// `VERIFLOW_SIM_TRACE=2`: print every frame between processes.
    verbose: bool,
}

impl World {
    fn new(cfg: &IterSimConfig, safety: Option<Duration>) -> Result<World, String> {
        let run = SteppedRun::new(
            cfg.iter_config(),
            heat::factory(cfg.n, cfg.vnodes as usize, cfg.r, cfg.steps),
        )
        .map_err(|e| e.to_string())?;
        let mut w = World {
            cfg: cfg.clone(),
            run,
            now: Duration::ZERO,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            procs: BTreeMap::new(),
            next_id: 0,
            net: BinaryHeap::new(),
            seq: 0,
            link_last: BTreeMap::new(),
            cuts: BTreeMap::new(),
            store: Arc::new(MemoryStore::default()),
            map: Vec::new(),
            heard: BTreeMap::new(),
            done: BTreeMap::new(),
            faults: FaultCounts::default(),
            trace: blake3::Hasher::new(),
            safety,
            force_loss: false,
            replacements: 0,
            superseded: 0,
            fenced_gone: 0,
            fence_checks: 0,
            stale_accepted: None,
            verbose: std::env::var("VERIFLOW_SIM_TRACE").is_ok_and(|v| v == "2" || v == "3"),
        };
        let mut layout: BTreeMap<u32, Vec<(VnodeId, Epoch)>> = BTreeMap::new();
        for v in 0..cfg.vnodes {
            let p = v % cfg.procs;
            layout.entry(p).or_default().push((VnodeId(v), Epoch(0)));
            w.map.push((p, Epoch(0)));
        }
        for (_, vnodes) in layout {
            w.spawn(vnodes, Duration::ZERO);
        }
        Ok(w)
    }

    fn note(&mut self, line: &str) {
        self.trace.update(&self.now.as_nanos().to_le_bytes());
        self.trace.update(line.as_bytes());
        if std::env::var_os("VERIFLOW_SIM_TRACE").is_some() {
            eprintln!("[{:>9.3} ms] {line}", self.now.as_secs_f64() * 1e3);
        }
    }

    fn fenced_total(&self) -> u64 {
        self.fenced_gone
            + self
                .procs
                .values()
                .flat_map(|p| &p.nodes)
                .map(|h| h.node.stats().fenced)
                .sum::<u64>()
    }

    /// A process for `vnodes`, up at `start_at`.
    fn spawn(&mut self, vnodes: Vec<(VnodeId, Epoch)>, start_at: Duration) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.procs.insert(
            id,
            Proc {
                id,
                vnodes,
                start_at,
                started: false,
                nodes: Vec::new(),
                outbox: Outbox::default(),
                peer_in: VecDeque::new(),
                sup_in: VecDeque::new(),
                deaf_until: Duration::ZERO,
                paused_until: None,
                dead: false,
                declared: false,
                store: Arc::new(ProcStore {
                    inner: self.store.clone(),
                    fences: self.cfg.fences,
                    pending: Mutex::default(),
                }),
                last_heartbeat: None,
            },
        );
        id
    }

    /// Starts process `id`'s nodes (a replacement's restore: `iterative` rule 6).
    fn start(&mut self, id: u32) -> Result<(), String> {
        let now = self.now;
        let Some(p) = self.procs.get_mut(&id) else {
            return Ok(());
        };
        let mut cfg = self.run.config().clone();
        if self.cfg.store {
            cfg.store = Some(p.store.clone());
        }
        let run = self.run.with_config(cfg).map_err(|e| e.to_string())?;
        for &(v, epoch) in &p.vnodes {
            let inbox = Inbox::default();
            let seen = Arc::new(Mutex::new(Seen::default()));
            let ep = SimEndpoint {
                me: v,
                epoch,
                inbox: inbox.clone(),
                outbox: p.outbox.clone(),
                seen: seen.clone(),
            };
            let node = run
                .node(v, epoch, epoch.0 > 0, Box::new(ep), now)
                .map_err(|e| format!("p{id}: cannot start {v}: {e}"))?;
            p.nodes.push(Hosted {
                node,
                epoch,
                inbox,
                seen,
                reported: false,
            });
        }
        p.started = true;
        let line = format!("p{id} starts {:?}", p.vnodes);
        self.heard.insert(id, now);
        self.note(&line);
        Ok(())
    }

    fn send(&mut self, from: Node, to: Node, frame: Frame, ordered: bool) {
        let delay = Duration::from_nanos(
            self.rng
                .random_range(0..=u64::try_from(self.cfg.faults.delay.as_nanos()).unwrap_or(0)),
        );
        let mut at = self.now + QUANTUM.min(delay.max(Duration::from_micros(1))) + delay;
        if let Some(&heal) = self.cuts.get(&(from, to)) {
            at = at.max(heal);
        }
        if ordered {
            let last = self.link_last.entry((from, to)).or_default();
            at = at.max(*last);
            *last = at;
        }
        self.seq += 1;
        self.net.push(InFlight {
            at,
            seq: self.seq,
            frame,
        });
    }

    fn running(&self, p: &Proc) -> bool {
        p.started && !p.dead && p.paused_until.is_none_or(|t| self.now >= t)
    }

    /// Every vnode hosted by a started, undeclared process whose nodes are all ready, no
    /// process paused, no supervisor link cut (rule 4: one failure at a time).
    fn whole(&self) -> bool {
        let sup_cut = self
            .cuts
            .keys()
            .any(|(a, b)| *a == Node::Sup || *b == Node::Sup);
        !sup_cut
            && self.procs.values().all(|p| {
                p.dead
                    || p.declared
                    || (p.started
                        && p.paused_until.is_none_or(|t| self.now >= t)
                        && p.nodes.iter().all(|h| h.node.ready()))
            })
            && self
                .map
                .iter()
                .all(|(p, _)| self.procs.get(p).is_some_and(|p| p.started && !p.dead))
    }

    /// Live, undeclared, running processes.
    fn live(&self) -> Vec<u32> {
        self.procs
            .values()
            .filter(|p| self.running(p) && !p.declared)
            .map(|p| p.id)
            .collect()
    }

    /// Rule 4.
    fn inject_faults(&mut self, safety_end: Duration) {
        let q = QUANTUM.as_secs_f64();
        let f = self.cfg.faults.clone();
        let live = self.live();
        if live.is_empty() {
            return;
        }
        let due = (self.cfg.min_faults as f64 * self.now.as_secs_f64()
            / safety_end.as_secs_f64().max(1e-9)) as u64;
        let forced = (self.faults.total() < due).then(|| self.rng.random_range(0..3));
        if forced.is_some() {
            // When the run is not whole, the next peer frame is lost instead.
            self.force_loss = true;
        }
        if (forced == Some(0) || self.rng.random_bool((f.crash * q).min(1.0))) && self.whole() {
            let v = live[self.rng.random_range(0..live.len())];
            let reset = self.rng.random_bool(0.5);
            self.faults.crashes += 1;
            if reset {
                self.faults.resets += 1;
            }
            self.note(&format!(
                "fault: crash p{v} ({})",
                if reset { "reset" } else { "silent" }
            ));
            self.crash(v, reset);
        }
        if forced == Some(1) || self.rng.random_bool((f.pause * q).min(1.0)) {
            let v = live[self.rng.random_range(0..live.len())];
            let long = self.rng.random_bool(0.5);
            let cut = self
                .cuts
                .keys()
                .any(|(a, b)| *a == Node::Proc(v) || *b == Node::Proc(v));
            let len = if long && self.whole() {
                Some(BOUND * 2 + Duration::from_millis(self.rng.random_range(0..50)))
            } else if !cut {
                Some(Duration::from_micros(
                    self.rng.random_range(500..=SHORT.as_micros() as u64),
                ))
            } else {
                None
            };
            if let Some(len) = len {
                self.faults.pauses += 1;
                if len > BOUND {
                    self.faults.zombies += 1;
                }
                self.note(&format!("fault: pause p{v} for {len:?}"));
                if let Some(p) = self.procs.get_mut(&v) {
                    p.paused_until = Some(self.now + len);
                    // Back from the pause, its nodes run before it reads the supervisor.
                    p.deaf_until =
                        self.now + len + Duration::from_micros(self.rng.random_range(0..10_000));
                }
            }
        }
        if forced == Some(2) || self.rng.random_bool((f.partition * q).min(1.0)) {
            let a = live[self.rng.random_range(0..live.len())];
            let to_sup = self.rng.random_bool(0.5);
            let paused = self
                .procs
                .get(&a)
                .is_some_and(|p| p.paused_until.is_some_and(|t| t > self.now));
            let other = if to_sup {
                Node::Sup
            } else {
                Node::Proc(live[self.rng.random_range(0..live.len())])
            };
            // A cut from the supervisor past the bound is a declaration: only in a whole run.
            let len = if other == Node::Sup {
                if self.whole() && self.rng.random_bool(0.5) {
                    Some(BOUND + Duration::from_millis(self.rng.random_range(5..55)))
                } else if !paused {
                    Some(Duration::from_micros(
                        self.rng.random_range(500..=SHORT.as_micros() as u64),
                    ))
                } else {
                    None
                }
            } else if other != Node::Proc(a) {
                Some(Duration::from_millis(self.rng.random_range(1..80)))
            } else {
                None
            };
            if let Some(len) = len {
                let heal = self.now + len;
                let dir = self.rng.random_range(0..3);
                for (x, y, on) in [
                    (Node::Proc(a), other, dir != 1),
                    (other, Node::Proc(a), dir != 0),
                ] {
                    if on {
                        let e = self.cuts.entry((x, y)).or_insert(heal);
                        *e = (*e).max(heal);
                    }
                }
                if other == Node::Sup && len <= SHORT {
                    self.faults.clogs += 1;
                    self.note(&format!(
                        "fault: clog p{a} / supervisor ({dir}) for {len:?}"
                    ));
                } else {
                    self.faults.partitions += 1;
                    self.note(&format!(
                        "fault: partition p{a} / {other:?} ({dir}) for {len:?}"
                    ));
                }
            }
        }
    }

    /// A process dies: its nodes' memory and its unflushed writes are gone (rule 4).
    fn crash(&mut self, id: u32, reset: bool) {
        let Some(p) = self.procs.get_mut(&id) else {
            return;
        };
        if p.dead {
            return;
        }
        p.dead = true;
        let fenced: u64 = p.nodes.iter().map(|h| h.node.stats().fenced).sum();
        p.nodes.clear();
        p.peer_in.clear();
        p.sup_in.clear();
        let unflushed = lock(&p.store.pending).len();
        let keep = self.rng.random_range(0..=unflushed);
        let lost = p.store.crash(keep);
        self.fenced_gone += fenced;
        if lost > 0 {
            self.faults.writes_lost += lost;
            self.note(&format!("p{id}: {lost} unflushed store writes lost"));
        }
        if reset {
            self.send(Node::Proc(id), Node::Sup, Frame::Closed(id), true);
        }
    }

    /// Rule 3: the supervisor declares process `id` dead and hosts its vnodes anew.
    fn declare(&mut self, id: u32, why: &str) {
        let Some(p) = self.procs.get_mut(&id) else {
            return;
        };
        if p.declared {
            return;
        }
        p.declared = true;
        let vnodes: Vec<(VnodeId, Epoch)> =
            p.vnodes.iter().map(|&(v, e)| (v, Epoch(e.0 + 1))).collect();
        self.send(Node::Sup, Node::Proc(id), Frame::Exit(id), true);
        let start_at = self.now + Duration::from_millis(self.rng.random_range(5..50));
        let new = self.spawn(vnodes.clone(), start_at);
        for &(v, e) in &vnodes {
            self.map[v.0 as usize] = (new, e);
            self.done.remove(&v);
        }
        self.replacements += vnodes.len() as u64;
        self.note(&format!(
            "supervisor: p{id} declared dead ({why}); {vnodes:?} to p{new}"
        ));
    }

    fn sup_receive(&mut self, f: Frame) {
        match f {
            Frame::Heartbeat(p) => {
                if !self.procs.get(&p).is_some_and(|p| p.declared) {
                    self.heard.insert(p, self.now);
                }
            }
            Frame::Closed(p) => self.declare(p, "connection reset"),
            Frame::Done {
                proc,
                vnode,
                epoch,
                steps,
                state,
            } => {
                if !self.procs.get(&proc).is_some_and(|p| p.declared) {
                    self.heard.insert(proc, self.now);
                }
                let current = self.map.get(vnode.0 as usize).map(|&(_, e)| e);
                if current == Some(epoch) {
                    self.note(&format!(
                        "supervisor: {vnode}@{} done, {steps} steps",
                        epoch.0
                    ));
                    self.done.insert(vnode, (epoch, steps, state));
                } else {
                    // A dead incarnation's report is not taken (rule 6).
                    self.note(&format!("supervisor: drops {vnode}@{}'s report", epoch.0));
                }
            }
            Frame::Peer { .. } | Frame::Exit(_) => {}
        }
    }

    /// Rule 3's detector.
    fn detect(&mut self) {
        let silent: Vec<u32> = self
            .procs
            .values()
            .filter(|p| p.started && !p.declared)
            .filter(|p| {
                self.heard
                    .get(&p.id)
                    .is_some_and(|&t| self.now.saturating_sub(t) > BOUND)
            })
            .map(|p| p.id)
            .collect();
        for id in silent {
            self.declare(id, "silent");
        }
    }

    /// Routes what process `id`'s nodes sent (rule 2).
    fn route(&mut self, id: u32) {
        let Some(p) = self.procs.get(&id) else {
            return;
        };
        let out = std::mem::take(&mut *lock(&p.outbox));
        for (to, env) in out {
            let local = self
                .procs
                .get(&id)
                .and_then(|p| p.nodes.iter().find(|h| h.node.vnode() == to))
                .map(|h| h.inbox.clone());
            if let Some(inbox) = local {
                lock(&inbox).push_back(env);
                continue;
            }
            let Some(&(host, _)) = self.map.get(to.0 as usize) else {
                continue;
            };
            if std::mem::take(&mut self.force_loss) || self.rng.random_bool(self.cfg.faults.loss) {
                self.faults.lost += 1;
                continue;
            }
            let copies = if self.rng.random_bool(self.cfg.faults.dup) {
                self.faults.duplicated += 1;
                2
            } else {
                1
            };
            for _ in 0..copies {
                self.send(
                    Node::Proc(id),
                    Node::Proc(host),
                    Frame::Peer {
                        to_proc: host,
                        to,
                        env: env.clone(),
                    },
                    false,
                );
            }
        }
    }

    /// One quantum of process `id` (rule 1).
    fn step_proc(&mut self, id: u32) -> Result<(), String> {
        let now = self.now;
        let deaf = self.procs.get(&id).is_some_and(|p| now < p.deaf_until);
        if !deaf {
            let exit = self
                .procs
                .get_mut(&id)
                .is_some_and(|p| p.sup_in.drain(..).any(|f| matches!(f, Frame::Exit(_))));
            if exit {
                self.note(&format!("p{id} reads its exit"));
                self.crash(id, false);
                return Ok(());
            }
        }
        let Some(p) = self.procs.get_mut(&id) else {
            return Ok(());
        };
        for (to, env) in std::mem::take(&mut p.peer_in) {
            // A frame for a vnode not hosted here (any more) is lost (rule 2).
            if let Some(h) = p.nodes.iter().find(|h| h.node.vnode() == to) {
                lock(&h.inbox).push_back(env);
            }
        }
        if p.last_heartbeat
            .is_none_or(|t| now.saturating_sub(t) >= HEARTBEAT)
        {
            p.last_heartbeat = Some(now);
            self.send(Node::Proc(id), Node::Sup, Frame::Heartbeat(id), true);
        }
        let count = self.procs.get(&id).map_or(0, |p| p.nodes.len());
        let mut order: Vec<usize> = (0..count).collect();
        for i in (1..order.len()).rev() {
            let j = self.rng.random_range(0..=i);
            order.swap(i, j);
        }
        let mut gone = Vec::new();
        let mut reports = Vec::new();
        if let Some(p) = self.procs.get_mut(&id) {
            for i in order {
                let h = &mut p.nodes[i];
                let r = h.node.step(now);
                // Rule 6: every message older than one seen was dropped, none accepted.
                let stale = lock(&h.seen).stale;
                if h.node.stats().fenced != stale {
                    self.stale_accepted.get_or_insert_with(|| {
                        format!(
                            "p{id}: {}@{} accepted a message of a dead incarnation: {} older \
                             than one seen, {} dropped",
                            h.node.vnode(),
                            h.epoch.0,
                            stale,
                            h.node.stats().fenced
                        )
                    });
                }
                self.fence_checks += 1;
                match r {
                    Ok(Stepped::Busy | Stepped::Idle(_)) => {}
                    Err(IterError::Superseded { .. }) => gone.push(i),
                    Err(e) => return Err(format!("p{id}: {e}")),
                }
                if !h.reported {
                    if let Some((steps, state)) = h.node.finished() {
                        h.reported = true;
                        reports.push((h.node.vnode(), h.epoch, *steps, state.clone()));
                    }
                }
            }
            gone.sort_unstable();
            for i in gone.into_iter().rev() {
                let h = p.nodes.remove(i);
                self.fenced_gone += h.node.stats().fenced;
                self.superseded += 1;
            }
        }
        for (vnode, epoch, steps, state) in reports {
            self.send(
                Node::Proc(id),
                Node::Sup,
                Frame::Done {
                    proc: id,
                    vnode,
                    epoch,
                    steps,
                    state,
                },
                true,
            );
        }
        self.route(id);
        if self.rng.random_bool(self.cfg.faults.pump) {
            if let Some(p) = self.procs.get(&id) {
                let _ = p.store.flush();
            }
        }
        Ok(())
    }

    /// Rules 1 and 5; returns the final states, by vnode.
    fn run(&mut self) -> Result<Vec<Vec<u8>>, String> {
        let mut safety = self.safety.is_some();
        let safety_end = self.safety.unwrap_or_default();
        // However slow (synchronous iterations over a lossy network are), a run ends within
        // this; a seed past it fails as a hang.
        let limit = safety_end + LIMIT;
        let mut progress = (0u64, Duration::ZERO);
        loop {
            if safety && self.now >= safety_end && self.faults.total() >= self.cfg.min_faults {
                safety = false;
                progress.1 = self.now;
                self.note("liveness phase");
            }
            if safety {
                self.inject_faults(safety_end);
            }
            let now = self.now;
            self.cuts.retain(|_, heal| *heal > now);
            let due: Vec<u32> = self
                .procs
                .values()
                .filter(|p| !p.started && !p.dead && p.start_at <= now)
                .map(|p| p.id)
                .collect();
            for id in due {
                if self
                    .procs
                    .get(&id)
                    .is_some_and(|p| p.vnodes.iter().any(|(_, e)| e.0 > 0))
                {
                    self.faults.restarts += 1;
                }
                self.start(id)?;
            }
            while let Some(top) = self.net.peek() {
                if top.at > now {
                    break;
                }
                let f = self.net.pop().expect("peeked").frame;
                match f {
                    Frame::Peer { to_proc, to, env } => {
                        self.trace.update(&now.as_nanos().to_le_bytes());
                        self.trace.update(&[
                            u8::try_from(to.0).unwrap_or(u8::MAX),
                            u8::try_from(env.from.0).unwrap_or(u8::MAX),
                            u8::try_from(env.epoch.0).unwrap_or(u8::MAX),
                            msg_kind(&env.msg),
                        ]);
                        if self.verbose {
                            self.print_frame(to_proc, to, &env);
                        }
                        if let Some(p) = self.procs.get_mut(&to_proc).filter(|p| !p.dead) {
                            p.peer_in.push_back((to, env));
                        }
                    }
                    Frame::Exit(p) => {
                        if let Some(p) = self.procs.get_mut(&p).filter(|p| !p.dead) {
                            p.sup_in.push_back(Frame::Exit(p.id));
                        }
                    }
                    other => self.sup_receive(other),
                }
            }
            self.detect();
            let mut ids: Vec<u32> = self.procs.keys().copied().collect();
            for i in (1..ids.len()).rev() {
                let j = self.rng.random_range(0..=i);
                ids.swap(i, j);
            }
            for id in ids {
                if self.procs.get(&id).is_some_and(|p| self.running(p)) {
                    self.step_proc(id)?;
                }
            }
            if self.done.len() == self.map.len() {
                self.note("every vnode finished");
                return Ok(self.done.values().map(|(_, _, s)| s.clone()).collect());
            }
            let steps = self.progress();
            if steps != progress.0 {
                progress = (steps, self.now);
            }
            let stuck = !safety && self.now.saturating_sub(progress.1) >= self.cfg.liveness;
            if stuck || self.now >= limit {
                return Err(format!(
                    "{} (hang); waiting: {}",
                    if stuck {
                        format!(
                            "no step ended for {:?} after the faults stopped",
                            self.cfg.liveness
                        )
                    } else {
                        format!("no end within {LIMIT:?} after the safety phase")
                    },
                    self.diagnose()
                ));
            }
            self.now += QUANTUM;
        }
    }

    /// `VERIFLOW_SIM_TRACE=2`: a frame between processes, as it arrives (not hashed).
    fn print_frame(&self, to_proc: u32, to: VnodeId, env: &Envelope) {
        let Message::Iter(m) = &env.msg else { return };
        let what = match m {
            IterMsg::Halo { step, iter, .. } => format!("halo s{step} i{iter}"),
            IterMsg::Conv { tag, kind } => format!("conv {kind:?} {}.{}", tag.step, tag.round),
            IterMsg::ConvAck { tag, kind } => {
                format!("ack {kind:?} {}.{}", tag.step, tag.round)
            }
            IterMsg::Status { version, .. } => format!("status v{version}"),
            IterMsg::StatusAck { version } => format!("status ack v{version}"),
            IterMsg::Data {
                step, iter, ack, ..
            } => format!("data s{step} i{iter} ack {ack}"),
            IterMsg::DataAck { step, iter } => format!("data ack s{step} i{iter}"),
            IterMsg::Backups { status, data, lost } => format!(
                "backups status {:?} data {:?} lost {lost}",
                status.as_ref().map(|s| s.0),
                data.as_ref().map(|d| (d.0, d.1))
            ),
            IterMsg::Ward { status, data } => format!(
                "ward status v{} data {:?}",
                status.0,
                data.as_ref().map(|d| (d.0, d.1))
            ),
            other => format!("{other:?}"),
        };
        if matches!(m, IterMsg::Halo { .. })
            && std::env::var("VERIFLOW_SIM_TRACE").as_deref() != Ok("3")
        {
            return;
        }
        eprintln!(
            "[{:>9.3} ms]   {}@{} -> {to}@p{to_proc}: {what}",
            self.now.as_secs_f64() * 1e3,
            env.from,
            env.epoch.0
        );
    }

    /// Steps ended by the current incarnations, and final states taken: what a live run
    /// raises (rule 5).
    fn progress(&self) -> u64 {
        let steps: u64 = self
            .procs
            .values()
            .filter(|p| !p.dead && !p.declared)
            .flat_map(|p| &p.nodes)
            .map(|h| h.node.steps_ended())
            .sum();
        steps + self.done.len() as u64
    }

    /// What a run that does not end waits for.
    fn diagnose(&self) -> String {
        let mut parts = Vec::new();
        for p in self.procs.values() {
            if p.dead {
                continue;
            }
            let nodes: Vec<String> = p
                .nodes
                .iter()
                .map(|h| {
                    let s: &NodeStats = h.node.stats();
                    format!(
                        "{}@{} ready {} finished {} iterations {} [{}]",
                        h.node.vnode(),
                        h.epoch.0,
                        h.node.ready(),
                        h.node.finished().is_some(),
                        s.iterations,
                        h.node.waits()
                    )
                })
                .collect();
            parts.push(format!(
                "p{}{}{}: {}",
                p.id,
                if p.declared { " (declared dead)" } else { "" },
                if p.started { "" } else { " (not started)" },
                nodes.join("; ")
            ));
        }
        let done: Vec<String> = self.done.keys().map(ToString::to_string).collect();
        format!(
            "map {:?}; done [{}]; {}",
            self.map,
            done.join(" "),
            parts.join(" | ")
        )
    }
}

/// A byte naming a message's kind, for the trace (rule 7).
fn msg_kind(m: &Message) -> u8 {
    match m {
        Message::Iter(m) => match m {
            IterMsg::Halo { .. } => 1,
            IterMsg::HaloRequest => 2,
            IterMsg::Conv { .. } => 3,
            IterMsg::ConvAck { .. } => 4,
            IterMsg::Status { .. } => 5,
            IterMsg::StatusAck { .. } => 6,
            IterMsg::Data { .. } => 7,
            IterMsg::DataAck { .. } => 8,
            IterMsg::Fetch => 9,
            IterMsg::Rebackup => 10,
            IterMsg::Ward { .. } => 11,
            IterMsg::Backups { .. } => 12,
        },
        _ => 0,
    }
}

//! The deterministic simulator: a coordinator, W workers hosting V vnodes, their store and
//! a client, all on one thread on simulated time, with faults drawn from one seed
//! (FoundationDB's simulation, TigerBeetle's VOPR).
//!
//! The same state machines as the real cluster run here ([`Coordinator`], [`WorkerCore`], and
//! the runtime's vnodes through [`SteppedMember`]); only the drivers differ. So a bug found by
//! a seed is a bug of the real cluster, and the seed replays it:
//! `VERIFLOW_SIM_SEED=N cargo test -p veriflow-cluster --test sim`.
//!
//! Rules:
//!
//! 1. Time moves in quanta of [`QUANTUM`]. In each quantum, in this order: faults due are
//!    injected (safety phase only), messages due are delivered, timers due run, every live and
//!    running worker steps its vnodes once (in an order drawn from the seed), and each
//!    worker's log writer is pumped with probability `pump` (a write not pumped before a
//!    crash is lost, as an unflushed write is).
//! 2. Links with the coordinator are TCP streams: in order, never lost, delayed by up to
//!    `delay`, and held while a partition cuts them. Peer links lose, duplicate, delay and
//!    reorder frames at the seed's rates (the vnode protocol resends what matters).
//! 3. Faults of the safety phase, each at its own rate per simulated second: a worker
//!    crashes (its connection resets, or it falls silent) and a new process joins later; a
//!    worker pauses, sometimes past the detector's bound, and comes back as a zombie; a
//!    partition cuts a worker from the coordinator or two workers from each other, one way or
//!    both, and heals. At least one worker that can carry the job (a host, or any worker the
//!    coordinator admitted) is always left alive, unpaused and not cut off. In
//!    one seed in five, a vnode forges a share of its tasks (a wrong value, plausibly so).
//! 4. The safety phase lasts at least `safety` and until `min_faults` faults were injected;
//!    a seed behind that budget is forced one fault per quantum (a crash, pause or partition
//!    if a member can be spared, else a lost peer frame or a link to the coordinator clogged
//!    for less than the detector's bound).
//! 5. Then the liveness phase: no new faults; partitions heal and pauses end at their own
//!    (bounded) times; the job must finish within `liveness`, else the seed fails as a hang
//!    with what every vnode waits for (`VnodeWaits`).
//! 6. Checkers after every seed ([`check`]): the outputs are the bits of a single-vnode
//!    reference run; every task is declared, started and completed in exactly one vnode's log,
//!    and completed exactly once counting duplicates (a task completed before a failure is
//!    never run again); every segment the store acknowledged is still there and decodes. A
//!    run with forgeries is certified with full checking and correction (paper 001 Algorithm
//!    1): the corrected outputs must be the reference bits.
//! 7. Everything observable (deliveries, notes, faults) is folded into a trace hash: one seed
//!    run twice gives the same hash.
//! 8. The store is S checkpoint servers (`servers.rs`) behind the real `RemoteStore` strategy,
//!    its layout drawn per seed (replication, parity or IDA on 3-6 servers, every
//!    acknowledgement policy). In the safety phase a server crashes at the seed's rate, now or
//!    in the flush of the next write it serves (losing that write), and restarts 2-30 ms
//!    later, then is scrubbed; never more than one at a time, and only where the layout
//!    survives it (`servers.rs` rule 3). Zombies meet the servers' epoch fences.
//! 9. Coordinators fail too (issue 15). In the safety phase the active coordinator, one fault
//!    at a time, crashes (its connections reset, or fall silent as with a lost host), crashes
//!    right after its next journal write (between the write-ahead and the orders it covers),
//!    or pauses, shortly or past its lease. A standby takes the role after the lease expires
//!    (`journal` rule 2) and continues from the journal (`coordinator` rule 10); the workers
//!    look for it and rejoin with signed claims, the client attaches to its job again (or
//!    submits again if it was never accepted), and a paused coordinator that wakes deposed
//!    steps down at its lease renewal or its first journal write. Every journal write the
//!    store accepts has a term at least that of every earlier one (checked as it happens).
//!
//! 10. The online oracle (issue 20), when [`SimConfig::oracle`] is set: a
//!     [`Follower`](veriflow_certifier::online::Follower) reads the store every
//!     [`ORACLE_EVERY`] of simulated time, with the incarnations of the coordinator holding
//!     the highest term, while crashes, zombies, takeovers and server faults go on. Naming
//!     any incarnation of a vnode that does not forge fails the seed; after the run, the log
//!     is certified with what it learned (every task checked, forged ones corrected) and must
//!     give the reference's outputs.
//!
//! Iterative mode (paper 000) has its own world in [`iterative`], over the same fault rates
//! ([`Faults`]), counts ([`FaultCounts`]) and quantum, with its rules there; it runs and
//! replays with `VERIFLOW_SIM_SEED=N cargo test -p veriflow-cluster --test sim_iterative`.

mod check;
pub mod iterative;
mod net;
pub mod program;
mod servers;

pub use servers::{tolerates_one_down, StoreLayout};

use std::collections::{BTreeMap, BinaryHeap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use veriflow_checkpoint::Store;
use veriflow_runtime::detect::FdParams;
use veriflow_runtime::log::{CommitPolicy, Manifest};
use veriflow_runtime::transport::{Envelope, Router};
use veriflow_runtime::{Control, Forge, ForgeMode, ManualClock, Runtime, SteppedMember, VnodeId};

pub use check::Violation;

use crate::coordinator::{self, journal, ClientId, ConnId, Coordinator, Joining};
use crate::protocol::{JobSpec, Peer, Rejoin, ToCoord, ToSubmit, ToWorker, WorkerId, WorkerReport};
use crate::worker::{self, WorkerCore};

/// One step of simulated time (rule 1).
pub const QUANTUM: Duration = Duration::from_micros(500);

/// Tasks a vnode runs per step: one task costs a vnode one quantum of simulated time, so a
/// run lasts long enough for the faults to land in it.
const STEP_BUDGET: usize = 1;

/// Fault rates of one seed (rule 3).
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    /// Worker crashes per simulated second.
    pub crash: f64,
    /// Pauses per simulated second.
    pub pause: f64,
    /// Partitions per simulated second.
    pub partition: f64,
    /// Peer frames lost.
    pub loss: f64,
    /// Peer frames duplicated.
    pub dup: f64,
    /// Largest delay of a frame.
    pub delay: Duration,
    /// Probability per quantum that a worker's writes reach the store.
    pub pump: f64,
    /// Coordinator faults (crashes and pauses) per simulated second (rule 9).
    pub coord: f64,
}

impl Faults {
    /// Rates drawn from `rng`: each seed its own mix (TigerBeetle's VOPR).
    pub fn draw(rng: &mut ChaCha8Rng) -> Faults {
        Faults {
            crash: rng.random_range(5.0..30.0),
            pause: rng.random_range(5.0..30.0),
            partition: rng.random_range(5.0..30.0),
            loss: rng.random_range(0.02..0.3),
            dup: rng.random_range(0.02..0.3),
            delay: Duration::from_micros(rng.random_range(100..3000)),
            pump: rng.random_range(0.2..1.0),
            coord: rng.random_range(2.0..15.0),
        }
    }

    /// No faults at all.
    pub fn none() -> Faults {
        Faults {
            crash: 0.0,
            pause: 0.0,
            partition: 0.0,
            loss: 0.0,
            dup: 0.0,
            delay: Duration::from_micros(200),
            pump: 1.0,
            coord: 0.0,
        }
    }
}

/// One simulated run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The seed everything is drawn from.
    pub seed: u64,
    /// Workers that host vnodes at the start.
    pub workers: u32,
    /// Spare workers.
    pub spares: u32,
    /// Vnodes of the job.
    pub vnodes: u32,
    /// Depth of the program's tree.
    pub depth: u32,
    /// Its fanout.
    pub fanout: u32,
    /// Fault rates.
    pub faults: Faults,
    /// Length of the safety phase (rules 3-4); it goes on past this until `min_faults` faults
    /// were injected (or the job ends).
    pub safety: Duration,
    /// Faults the safety phase injects at least (issue 14: 20 per seed).
    pub min_faults: u64,
    /// Whether the store keeps epoch fences (`StoreError::Fenced`); off only to show what
    /// zombies do without them.
    pub fences: bool,
    /// A vnode that lies, and the share of its tasks it forges (rule 3: machines that lie).
    pub forge: Option<(u32, f64)>,
    /// The checkpoint servers: layout, acknowledgement and crash rate (rule 8).
    pub store: StoreLayout,
    /// Time the job has to finish after it (rule 5).
    pub liveness: Duration,
    /// An online oracle follows the run (rule 10).
    pub oracle: bool,
}

impl SimConfig {
    /// The configuration of seed `seed`: sizes and fault rates drawn from it.
    pub fn from_seed(seed: u64) -> SimConfig {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5111_c0de);
        let workers = rng.random_range(2..=5);
        let vnodes = rng.random_range(workers..=8);
        // Trees of 485 to 1,706 tasks.
        let (depth, fanout) = [(5, 3), (6, 3), (4, 4), (5, 4), (4, 5)][rng.random_range(0..5)];
        // The safety phase covers 40-90 % of a fault-free run (a task per quantum per vnode).
        let run = QUANTUM
            * u32::try_from(program::tasks(depth, fanout) / u64::from(vnodes)).unwrap_or(u32::MAX);
        SimConfig {
            seed,
            workers,
            spares: rng.random_range(1..=2),
            vnodes,
            depth,
            fanout,
            faults: Faults::draw(&mut rng),
            safety: run.mul_f64(rng.random_range(0.4..0.9)),
            min_faults: 20,
            fences: true,
            // One seed in five has a vnode that forges 2-20 % of its tasks.
            forge: rng
                .random_bool(0.2)
                .then(|| (rng.random_range(0..vnodes), rng.random_range(0.02..0.2))),
            liveness: Duration::from_secs(20),
            store: StoreLayout::draw(&mut rng),
            oracle: false,
        }
    }
}

/// Counts of faults injected, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Workers crashed.
    pub crashes: u64,
    /// Crashes that reset the connection (the others fell silent).
    pub resets: u64,
    /// New processes joined after a crash.
    pub restarts: u64,
    /// Pauses.
    pub pauses: u64,
    /// Pauses longer than the detector's bound (the worker was declared lost).
    pub zombies: u64,
    /// Partitions (worker-coordinator or worker-worker, one way or both).
    pub partitions: u64,
    /// Links with the coordinator clogged for less than the detector's bound, then restored.
    pub clogs: u64,
    /// Peer frames lost.
    pub lost: u64,
    /// Peer frames duplicated.
    pub duplicated: u64,
    /// Sealed log writes lost in a crash.
    pub writes_lost: u64,
    /// Checkpoint servers crashed (rule 8).
    pub server_crashes: u64,
    /// Of which in the flush of a write they were serving, which was lost.
    pub server_writes_lost: u64,
    /// Coordinators crashed (rule 9), right after a journal write or at any other moment.
    pub coord_crashes: u64,
    /// Coordinators paused.
    pub coord_pauses: u64,
    /// Of which past their lease: a successor took over, and the paused one woke deposed.
    pub coord_zombies: u64,
    /// Successors that took a coordinator's role from the journal.
    pub takeovers: u64,
}

impl FaultCounts {
    /// All faults injected.
    pub fn total(&self) -> u64 {
        self.crashes
            + self.pauses
            + self.partitions
            + self.clogs
            + self.lost
            + self.duplicated
            + self.writes_lost
            + self.server_crashes
            + self.coord_crashes
            + self.coord_pauses
    }

    /// Adds `o` to these counts.
    pub fn add(&mut self, o: &FaultCounts) {
        self.crashes += o.crashes;
        self.resets += o.resets;
        self.restarts += o.restarts;
        self.pauses += o.pauses;
        self.zombies += o.zombies;
        self.partitions += o.partitions;
        self.clogs += o.clogs;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.writes_lost += o.writes_lost;
        self.server_crashes += o.server_crashes;
        self.server_writes_lost += o.server_writes_lost;
        self.coord_crashes += o.coord_crashes;
        self.coord_pauses += o.coord_pauses;
        self.coord_zombies += o.coord_zombies;
        self.takeovers += o.takeovers;
    }
}

/// What a seed did.
#[derive(Debug, Clone)]
pub struct SimOutcome {
    /// The configuration.
    pub config: SimConfig,
    /// Faults injected.
    pub faults: FaultCounts,
    /// Hash of everything observable (rule 7).
    pub trace: u64,
    /// Simulated time at which the job finished.
    pub finished_at: Duration,
    /// Tasks of the program.
    pub tasks: u64,
    /// Workers the coordinator lost.
    pub workers_lost: u32,
    /// Invariants checked.
    pub checks: u64,
    /// Forging incarnations the online oracle named during the run (rule 10).
    pub oracle_named: u64,
}

/// Why a seed failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("seed {seed}: {what}\n  replay: VERIFLOW_SIM_SEED={seed} cargo test -p veriflow-cluster --test sim\n  config: {config}")]
pub struct SimFailure {
    /// The seed.
    pub seed: u64,
    /// What went wrong.
    pub what: String,
    /// The configuration, for the message.
    pub config: String,
}

/// A simulated worker process, numbered by the simulator (its [`WorkerId`] is the one a
/// coordinator gives it when it joins).
type Pid = u32;

/// A coordinator process: the first is 0, each successor the next (rule 9).
type Gen = u32;

/// Who a frame goes between: the network position, whichever coordinator process runs there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    Coord,
    Client,
    Proc(Pid),
}

/// What reaches a coordinator on one of its connections.
#[derive(Debug)]
enum CoordIn {
    Hello(Joining),
    Rejoin(Box<Rejoin>, [u8; 32]),
    Msg(ToCoord),
    /// The other end closed or reset the connection.
    Closed(&'static str),
    Submit(JobSpec),
    Attach(u64),
}

#[derive(Debug)]
enum Frame {
    /// To coordinator `gen` on connection `conn` (a worker's, or a client's).
    ToCoord {
        gen: Gen,
        conn: ConnId,
        what: CoordIn,
    },
    /// From coordinator `gen` to process `pid` on connection `conn`.
    ToProc {
        gen: Gen,
        conn: ConnId,
        pid: Pid,
        msg: ToWorker,
    },
    /// Coordinator `gen` closed connection `conn` of process `pid`, or died.
    CoordClosed { gen: Gen, conn: ConnId, pid: Pid },
    ToClient {
        gen: Gen,
        client: ClientId,
        msg: ToSubmit,
    },
    /// The client's connection with coordinator `gen` ended.
    ClientClosed { gen: Gen, client: ClientId },
    Peer {
        from: WorkerId,
        to: Pid,
        frame: Peer,
    },
}

type InFlight = net::InFlight<Frame>;

type Outbox = Arc<Mutex<Vec<(u32, Envelope)>>>;

struct Proc {
    pid: Pid,
    spare: bool,
    /// The key it joins with and signs its rejoin claims with (`coordinator` rule 10).
    key: ed25519_dalek::SigningKey,
    /// None until welcomed.
    core: Option<WorkerCore>,
    member: Option<(u64, SteppedMember, Router)>,
    outbox: Outbox,
    /// Frames arrived and not yet read (the socket buffers).
    inbox: std::collections::VecDeque<Frame>,
    paused_until: Option<Duration>,
    /// Set when the process exited or crashed.
    dead: bool,
    /// Its connection with a coordinator, answered or not.
    conn: Option<(Gen, ConnId)>,
    /// The connection it gave up on, kept open until a coordinator takes it back (`worker`
    /// driver: its close must come after the new connection's claim).
    old_conn: Option<(Gen, ConnId)>,
    /// Since when it looks for a coordinator (`worker` rule 1), and when it tries next.
    seeking: Option<Duration>,
    next_try: Duration,
}

impl Proc {
    fn worker(&self) -> Option<WorkerId> {
        self.core.as_ref().map(WorkerCore::id)
    }
}

/// A coordinator process (rule 9).
struct CoordProc {
    core: Coordinator,
    dead: bool,
    paused_until: Option<Duration>,
    inbox: std::collections::VecDeque<(ConnId, CoordIn)>,
    /// Its workers' connections, both ways.
    admitted: BTreeMap<ConnId, WorkerId>,
    conn_of: BTreeMap<WorkerId, ConnId>,
    /// Crash right after the next journal write (the write-ahead window).
    crash_after_journal: bool,
    /// When it renews its lease next (`journal` rule 4).
    next_renew: Duration,
    /// Its next journal record's number (`journal` rule 6).
    journal_seq: u64,
    /// Its lease's last beat (0 at the takeover, `journal` rule 2).
    beat: u64,
}

/// The submitting client (rule 9): it submits, follows its job, and after losing its
/// coordinator attaches to the successor (or submits again if no coordinator accepted it).
#[derive(Default)]
struct Client {
    conn: Option<(Gen, ClientId)>,
    accepted: Option<u64>,
    next_try: Duration,
    next_id: ClientId,
}

struct Recording {
    inner: Arc<dyn Store>,
    fences: bool,
    pending: Mutex<Vec<Vec<u8>>>,
    acked: Mutex<std::collections::BTreeSet<Vec<u8>>>,
}

impl Store for Recording {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), veriflow_checkpoint::StoreError> {
        self.inner.put(key, value)?;
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(key.to_vec());
        Ok(())
    }
    fn put_batch(
        &self,
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), veriflow_checkpoint::StoreError> {
        self.inner.put_batch(pairs)?;
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        p.extend(pairs.iter().map(|(k, _)| k.clone()));
        Ok(())
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, veriflow_checkpoint::StoreError> {
        self.inner.get(key)
    }
    fn scan_prefix(
        &self,
        prefix: &[u8],
    ) -> Result<veriflow_checkpoint::Pairs, veriflow_checkpoint::StoreError> {
        self.inner.scan_prefix(prefix)
    }
    fn last_under(
        &self,
        prefix: &[u8],
    ) -> Result<Option<veriflow_checkpoint::Pair>, veriflow_checkpoint::StoreError> {
        self.inner.last_under(prefix)
    }
    fn delete(&self, key: &[u8]) -> Result<(), veriflow_checkpoint::StoreError> {
        self.inner.delete(key)?;
        // A key deleted on purpose (the log's old watermarks) is no longer owed.
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k| k != key);
        self.acked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        Ok(())
    }
    fn flush(&self) -> Result<(), veriflow_checkpoint::StoreError> {
        self.inner.flush()?;
        let done = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        self.acked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(done);
        Ok(())
    }
    fn describe(&self) -> String {
        format!("the simulator's store ({})", self.inner.describe())
    }
    fn keeps_fences(&self) -> bool {
        self.fences && self.inner.keeps_fences()
    }
    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), veriflow_checkpoint::StoreError> {
        if !self.fences {
            return Ok(());
        }
        self.inner.raise_fence(scope, epoch)
    }
    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), veriflow_checkpoint::StoreError> {
        if self.fences {
            self.inner.put_batch_fenced(fences, pairs)?;
        } else {
            self.inner.put_batch(pairs)?;
        }
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        p.extend(pairs.iter().map(|(k, _)| k.clone()));
        Ok(())
    }
}

struct World {
    cfg: SimConfig,
    now: Duration,
    clock: Arc<ManualClock>,
    rng: ChaCha8Rng,
    /// Every coordinator process so far; the last is the newest (rule 9).
    coords: Vec<CoordProc>,
    /// What a coordinator process starts with; each takes its own term and address.
    coord_cfg: coordinator::Config,
    /// When a standby takes over from a dead or paused coordinator (rule 9).
    successor_due: Option<Duration>,
    /// The largest term whose journal write the store accepted.
    journal_term: u64,
    procs: BTreeMap<Pid, Proc>,
    /// Which process opened a connection.
    conn_pid: BTreeMap<ConnId, Pid>,
    next_pid: Pid,
    next_conn: ConnId,
    client: Client,
    job: JobSpec,
    net: BinaryHeap<InFlight>,
    seq: u64,
    /// Last delivery time per ordered link (rule 2: TCP keeps order).
    link_last: BTreeMap<(Node, Node), Duration>,
    /// Cut links (from, to) and when they heal.
    cuts: BTreeMap<(Node, Node), Duration>,
    store: Arc<Recording>,
    servers: servers::Servers,
    /// Servers to restart, and when (rule 8).
    server_restarts: Vec<(Duration, usize)>,
    rt: Arc<Runtime>,
    fd: FdParams,
    result: Option<ToSubmit>,
    faults: FaultCounts,
    trace: blake3::Hasher,
    restarts_due: Vec<Duration>,
    /// Lose the next peer frame (rule 4).
    force_loss: bool,
    /// The online oracle (rule 10), its secret, when it reads next, and whom it named.
    oracle: Option<(veriflow_certifier::online::Follower, [u8; 32])>,
    next_follow: Duration,
    oracle_named: u64,
}

/// The detector's parameters in the simulation: paper 004's shape, scaled to simulated
/// milliseconds so that a seed sees several detections.
fn sim_fd() -> FdParams {
    FdParams {
        interval: Duration::from_millis(10),
        timeout: Duration::from_millis(20),
        insurance: Duration::from_millis(40),
        broken: Duration::from_millis(20),
        k: 2,
    }
}

/// A coordinator's lease expires after this (rule 9). Shorter than a worker's detection of a
/// silent coordinator (`sim_fd`: 50 ms), as the real defaults are (2 s against 3 s), so a
/// successor is usually there by the time the workers look for one.
const LEASE: Duration = Duration::from_millis(30);

/// How often the online oracle reads the store (rule 10).
pub const ORACLE_EVERY: Duration = Duration::from_millis(5);

/// How long a worker looks for a coordinator before it gives up (`worker` rule 1).
const WORKER_PATIENCE: Duration = Duration::from_secs(2);

/// How often workers and the client try again to reach a coordinator.
const RETRY: Duration = Duration::from_millis(5);

/// The simulated job: the only one submitted, so the first id a coordinator gives.
const JOB: u64 = 1;

/// Runs one seed and checks it (rules 1-6).
pub fn run(cfg: &SimConfig) -> Result<SimOutcome, SimFailure> {
    let fail = |what: String| SimFailure {
        seed: cfg.seed,
        what,
        config: format!("{cfg:?}"),
    };
    let reference = check::reference(cfg).map_err(fail)?;
    let mut w = World::new(cfg).map_err(fail)?;
    let outcome = w.run().map_err(fail)?;
    w.restart_servers(None).map_err(fail)?;
    w.faults.server_writes_lost = w.servers.writes_lost();
    let mut checks = check::check(
        cfg,
        &*w.store,
        &w.store
            .acked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect::<Vec<_>>(),
        &reference,
        &outcome,
    )
    .map_err(|v| fail(v.to_string()))?;
    if let Some((f, secret)) = &w.oracle {
        // Rule 10: the final certification starts from what the oracle learned.
        checks +=
            check::certify_and_correct(w.store.clone(), &reference, &f.prior(), Some(*secret))
                .map_err(|v| fail(v.to_string()))?;
    }
    let trace = {
        let mut t = w.trace.clone();
        t.update(&outcome.0.concat());
        u64::from_le_bytes(t.finalize().as_bytes()[..8].try_into().unwrap_or_default())
    };
    Ok(SimOutcome {
        config: cfg.clone(),
        faults: w.faults.clone(),
        trace,
        finished_at: w.now,
        tasks: program::tasks(cfg.depth, cfg.fanout),
        workers_lost: outcome.1,
        checks,
        oracle_named: w.oracle_named,
    })
}

impl World {
    fn new(cfg: &SimConfig) -> Result<World, String> {
        let clock = Arc::new(ManualClock::default());
        let servers = servers::Servers::new(&cfg.store)?;
        let store = Arc::new(Recording {
            inner: servers.store(),
            fences: cfg.fences,
            pending: Mutex::default(),
            acked: Mutex::default(),
        });
        let rt = Runtime::builder(program::registry().map_err(|e| e.to_string())?)
            .program("sim")
            .threads(1)
            .vnodes(cfg.vnodes)
            .seed(cfg.seed)
            .store(store.clone())
            .clock(clock.clone())
            .commit_policy(CommitPolicy {
                max_bytes: 4 << 10,
                max_delay: Duration::from_millis(1),
                ..CommitPolicy::default()
            })
            // A recovery checkpoint every two segments or so (`log/mod.rs` rule 9): most
            // take-overs in the simulator start from one, and from the log after it.
            .checkpoint_every(8 << 10);
        let rt = match cfg.forge {
            Some((v, rate)) => rt.forge(Forge {
                vnodes: vec![VnodeId(v)],
                rate,
                seed: cfg.seed,
                tasks: Default::default(),
                mode: ForgeMode::Consistent,
            }),
            None => rt,
        };
        let rt = rt.build().map_err(|e| format!("runtime: {e}"))?;
        let fd = sim_fd();
        let mut coord_cfg = coordinator::Config::new("sim:store", fd, [0x5e; 32]);
        coord_cfg.seed = cfg.seed;
        // A successor waits for the members about as long as a real one does, in detector
        // periods (`coordinator::Config::new`).
        coord_cfg.rejoin_patience = (fd.interval + fd.timeout + fd.insurance + fd.broken) * 3;
        let mut w = World {
            cfg: cfg.clone(),
            now: Duration::ZERO,
            clock,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            coords: Vec::new(),
            coord_cfg,
            successor_due: None,
            journal_term: 0,
            procs: BTreeMap::new(),
            conn_pid: BTreeMap::new(),
            next_pid: 1,
            next_conn: 1,
            client: Client::default(),
            job: JobSpec {
                argv: Vec::new(),
                vnodes: cfg.vnodes,
                min_workers: cfg.workers + cfg.spares,
                iterative: false,
            },
            net: BinaryHeap::new(),
            seq: 0,
            link_last: BTreeMap::new(),
            cuts: BTreeMap::new(),
            store,
            servers,
            server_restarts: Vec::new(),
            rt: Arc::new(rt),
            fd,
            result: None,
            faults: FaultCounts::default(),
            trace: blake3::Hasher::new(),
            restarts_due: Vec::new(),
            force_loss: false,
            oracle: None,
            next_follow: Duration::ZERO,
            oracle_named: 0,
        };
        if cfg.oracle {
            let secret = *blake3::hash(&cfg.seed.to_le_bytes()).as_bytes();
            let registry = Arc::new(program::registry().map_err(|e| e.to_string())?);
            let store: Arc<dyn Store> = w.store.clone();
            let f = veriflow_certifier::online::Follower::new(
                store, registry, &secret, 0.05, 0.01, 0.02,
            )
            .map_err(|e| e.to_string())?;
            w.oracle = Some((f, secret));
        }
        if !w.start_coordinator()? {
            return Err("the first coordinator could not take its role".into());
        }
        for i in 0..cfg.workers + cfg.spares {
            w.spawn_proc(i >= cfg.workers);
        }
        Ok(w)
    }

    /// Rule 10: the online oracle reads what became durable and checks what it drew.
    fn follow(&mut self) -> Result<(), String> {
        if self.oracle.is_none() || self.now < self.next_follow {
            return Ok(());
        }
        self.next_follow = self.now + ORACLE_EVERY;
        let holder = self
            .coords
            .iter()
            .filter(|c| !c.dead && c.paused_until.is_none())
            .max_by_key(|c| c.core.config().term);
        let map = holder.and_then(|c| c.core.map(JOB)).unwrap_or_default();
        let Some((f, _)) = self.oracle.as_mut() else {
            return Ok(());
        };
        for (v, (w, e)) in map.into_iter().enumerate() {
            f.hosted(u32::try_from(v).unwrap_or(u32::MAX), e, w);
        }
        // A read the servers cannot answer now (one down) is tried again at the next turn.
        let Ok(polled) = f.poll() else { return Ok(()) };
        let forger = self.cfg.forge.map(|(v, _)| v);
        for finding in polled.findings {
            let (vnode, epoch) = finding.incarnation;
            if Some(vnode) != forger {
                return Err(format!(
                    "the online oracle named vnode {vnode} at epoch {epoch} (worker {:?}), \
                     which does not forge: {} {}",
                    finding.worker, finding.detection.task, finding.detection.reason
                ));
            }
            self.oracle_named += 1;
            self.note(&format!(
                "oracle: v{vnode} epoch {epoch} forged {}",
                finding.detection.task
            ));
        }
        Ok(())
    }

    fn note(&mut self, line: &str) {
        self.trace.update(&self.now.as_nanos().to_le_bytes());
        self.trace.update(line.as_bytes());
        if std::env::var_os("VERIFLOW_SIM_TRACE").is_some() {
            eprintln!("[{:>9.3} ms] {line}", self.now.as_secs_f64() * 1e3);
        }
    }

    /// Rule 9: a coordinator process takes the role through the store's lease (`journal`
    /// rule 2) and, unless it is the first, continues from its predecessor's journal.
    /// `Ok(false)`: the store cannot be read now (a server down); it tries again later.
    fn start_coordinator(&mut self) -> Result<bool, String> {
        let gen = Gen::try_from(self.coords.len()).unwrap_or(Gen::MAX);
        let addr = format!("sim:c{gen}");
        let taken = (|| {
            let lease = journal::read_lease(&*self.store)?;
            let found = journal::read_journal(&*self.store)?;
            let seen = lease.map_or(0, |l| l.term).max(found.map_or(0, |j| j.term));
            let term = journal::next_term(seen, &addr);
            if !journal::take_over(&*self.store, term, &addr)? {
                return Ok(None);
            }
            Ok::<_, journal::JournalError>(Some((term, journal::read_journal(&*self.store)?)))
        })();
        let (term, found) = match taken {
            Ok(Some(t)) => t,
            Ok(None) => return Err(format!("coordinator c{gen} lost the lease to nobody")),
            Err(e) => {
                self.note(&format!("c{gen} cannot take the role yet: {e}"));
                return Ok(false);
            }
        };
        let mut cfg = self.coord_cfg.clone();
        cfg.term = term;
        cfg.advertise = addr;
        let core = if gen == 0 {
            Coordinator::new(cfg)
        } else {
            self.faults.takeovers += 1;
            Coordinator::recover(cfg, found.unwrap_or_default(), self.now)
        };
        self.note(&format!("c{gen} active at term {term:#x}"));
        self.coords.push(CoordProc {
            core,
            dead: false,
            paused_until: None,
            inbox: std::collections::VecDeque::new(),
            admitted: BTreeMap::new(),
            conn_of: BTreeMap::new(),
            crash_after_journal: false,
            next_renew: self.now + LEASE / 4,
            journal_seq: 0,
            beat: 0,
        });
        self.coord_event(gen, coordinator::Event::Tick)?;
        Ok(true)
    }

    /// The coordinator a worker or the client reaches now: the newest, if it is alive and
    /// not paused (a paused one does not answer a hello in time).
    fn reachable(&self) -> Option<Gen> {
        let c = self.coords.last()?;
        (!c.dead && c.paused_until.is_none()).then(|| Gen::try_from(self.coords.len() - 1).ok())?
    }

    /// Coordinator `gen` ends (a crash, or it stepped down): its connections close, reset or
    /// silently (a lost host), and a standby takes over after the lease expires (rule 9).
    fn coord_dies(&mut self, gen: Gen, reset: bool, why: &str) {
        let Some(c) = self.coords.get_mut(gen as usize).filter(|c| !c.dead) else {
            return;
        };
        c.dead = true;
        c.inbox.clear();
        self.note(&format!("c{gen} ends: {why}"));
        let conns: Vec<(Pid, ConnId, bool)> = self
            .procs
            .values()
            .filter(|p| !p.dead)
            .filter_map(|p| match p.conn {
                Some((g, conn)) if g == gen => Some((
                    p.pid,
                    conn,
                    p.core.as_ref().is_none_or(|c| !c.coordinated()),
                )),
                _ => None,
            })
            .collect();
        for (pid, conn, answered_not) in conns {
            // A hello not answered yet ends too: the worker tries the next address.
            if reset || answered_not {
                self.send(
                    Node::Coord,
                    Node::Proc(pid),
                    Frame::CoordClosed { gen, conn, pid },
                    true,
                );
            }
        }
        if let Some((g, client)) = self.client.conn {
            if g == gen {
                self.send(
                    Node::Coord,
                    Node::Client,
                    Frame::ClientClosed { gen, client },
                    true,
                );
            }
        }
        if gen as usize + 1 == self.coords.len() && self.successor_due.is_none() {
            let jitter = Duration::from_micros(self.rng.random_range(0..10_000));
            self.successor_due = Some(self.now + LEASE + jitter);
        }
    }

    /// A new worker process starts and looks for a coordinator.
    fn spawn_proc(&mut self, spare: bool) {
        let pid = self.next_pid;
        self.next_pid += 1;
        let key = ed25519_dalek::SigningKey::from_bytes(&self.rng.random::<[u8; 32]>());
        self.procs.insert(
            pid,
            Proc {
                pid,
                spare,
                key,
                core: None,
                member: None,
                outbox: Outbox::default(),
                inbox: std::collections::VecDeque::new(),
                paused_until: None,
                dead: false,
                conn: None,
                old_conn: None,
                seeking: Some(self.now),
                next_try: self.now,
            },
        );
    }

    /// `worker` rule 1: a process without a coordinator says hello to the one that holds the
    /// role (a rejoin claim, signed, if it was admitted before), or gives up.
    fn seek(&mut self, pid: Pid) {
        let now = self.now;
        let Some(p) = self.procs.get(&pid) else {
            return;
        };
        let Some(since) = p.seeking else {
            return;
        };
        if p.conn.is_some() || now < p.next_try {
            return;
        }
        if now.saturating_sub(since) > WORKER_PATIENCE {
            self.note(&format!(
                "p{pid} exits: no coordinator took it within {WORKER_PATIENCE:?}"
            ));
            self.kill(pid, false);
            return;
        }
        let Some(gen) = self.reachable() else {
            if let Some(p) = self.procs.get_mut(&pid) {
                p.next_try = now + RETRY;
            }
            return;
        };
        let conn = self.next_conn;
        self.next_conn += 1;
        self.conn_pid.insert(conn, pid);
        let binding: [u8; 32] = self.rng.random();
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.conn = Some((gen, conn));
        let what = match &p.core {
            None => CoordIn::Hello(Joining {
                program: "sim".into(),
                peer_addr: format!("sim:{pid}"),
                threads: 1,
                spare: p.spare,
                public_key: p.key.verifying_key().to_bytes(),
            }),
            Some(core) => {
                use ed25519_dalek::Signer as _;
                let id = core.id();
                let (job, report) = core.rejoin_claim();
                CoordIn::Rejoin(
                    Box::new(Rejoin {
                        id,
                        program: "sim".into(),
                        peer_addr: format!("sim:{pid}"),
                        threads: 1,
                        spare: p.spare,
                        signature: p
                            .key
                            .sign(&crate::protocol::rejoin_message(&binding, id))
                            .to_bytes()
                            .to_vec(),
                        job,
                        report,
                    }),
                    binding,
                )
            }
        };
        self.send(
            Node::Proc(pid),
            Node::Coord,
            Frame::ToCoord { gen, conn, what },
            true,
        );
    }

    /// The client (rule 9): submits, or attaches to its accepted job after a takeover.
    fn client_tick(&mut self) {
        if self.client.conn.is_some() || self.now < self.client.next_try {
            return;
        }
        let Some(gen) = self.reachable() else {
            self.client.next_try = self.now + RETRY;
            return;
        };
        self.client.next_id += 1;
        let client = self.client.next_id;
        self.client.conn = Some((gen, client));
        let what = match self.client.accepted {
            Some(job) => CoordIn::Attach(job),
            None => CoordIn::Submit(self.job.clone()),
        };
        self.send(
            Node::Client,
            Node::Coord,
            Frame::ToCoord {
                gen,
                conn: client,
                what,
            },
            true,
        );
    }

    fn send(&mut self, from: Node, to: Node, frame: Frame, ordered: bool) {
        let delay = Duration::from_nanos(
            self.rng
                .random_range(0..=self.cfg.faults.delay.as_nanos() as u64),
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

    /// What coordinator `gen` reads on connection `conn`.
    fn coord_input(&mut self, gen: Gen, conn: ConnId, what: CoordIn) -> Result<(), String> {
        let Some(c) = self.coords.get_mut(gen as usize) else {
            return Ok(());
        };
        let ev = match what {
            CoordIn::Hello(hello) => coordinator::Event::Joined { conn, hello },
            CoordIn::Rejoin(claim, binding) => coordinator::Event::Rejoined {
                conn,
                claim,
                binding,
            },
            CoordIn::Msg(msg) => {
                let Some(&worker) = c.admitted.get(&conn) else {
                    return Ok(());
                };
                if !matches!(msg, ToCoord::Heartbeat(_)) {
                    self.note(&format!("w{worker} -> c{gen}: {}", coord_line(&msg)));
                }
                coordinator::Event::FromWorker { worker, msg }
            }
            CoordIn::Closed(reason) => {
                let Some(worker) = c.admitted.remove(&conn) else {
                    return Ok(());
                };
                if c.conn_of.get(&worker) == Some(&conn) {
                    c.conn_of.remove(&worker);
                }
                coordinator::Event::Closed {
                    worker,
                    reason: reason.into(),
                }
            }
            CoordIn::Submit(job) => coordinator::Event::Submit {
                client: conn,
                program: "sim".into(),
                job,
            },
            CoordIn::Attach(job) => coordinator::Event::Attach { client: conn, job },
        };
        self.coord_event(gen, ev)
    }

    fn coord_event(&mut self, gen: Gen, ev: coordinator::Event) -> Result<(), String> {
        let now = self.now;
        let Some(c) = self.coords.get_mut(gen as usize).filter(|c| !c.dead) else {
            return Ok(());
        };
        let actions = c.core.on_event(now, ev);
        for a in actions {
            if self.coords[gen as usize].dead {
                break; // rule 9: a coordinator that stepped down acts no further
            }
            self.coord_action(gen, a)?;
        }
        Ok(())
    }

    fn coord_action(&mut self, gen: Gen, a: coordinator::Action) -> Result<(), String> {
        let conn_of = |w: &World, worker: WorkerId| -> Option<(ConnId, Pid)> {
            let conn = *w.coords[gen as usize].conn_of.get(&worker)?;
            Some((conn, *w.conn_pid.get(&conn)?))
        };
        match a {
            coordinator::Action::Admit { conn, worker } => {
                let c = &mut self.coords[gen as usize];
                c.admitted.insert(conn, worker);
                if let Some(old) = c.conn_of.insert(worker, conn) {
                    c.admitted.remove(&old);
                }
            }
            coordinator::Action::Refuse { conn, msg } => {
                if let Some(&pid) = self.conn_pid.get(&conn) {
                    self.send_to_proc(gen, conn, pid, msg);
                    self.send(
                        Node::Coord,
                        Node::Proc(pid),
                        Frame::CoordClosed { gen, conn, pid },
                        true,
                    );
                }
            }
            coordinator::Action::Journal(j) => {
                let seq = self.coords[gen as usize].journal_seq;
                self.coords[gen as usize].journal_seq += 1;
                match coordinator::journal::write_journal(&*self.store, &j, seq) {
                    Ok(()) => {
                        if j.term < self.journal_term {
                            return Err(format!(
                                "the store accepted a journal write of term {:#x} (c{gen}) after \
                                 one of term {:#x}: a deposed coordinator wrote",
                                j.term, self.journal_term
                            ));
                        }
                        self.journal_term = j.term;
                        if std::mem::take(&mut self.coords[gen as usize].crash_after_journal) {
                            self.faults.coord_crashes += 1;
                            self.coord_dies(gen, true, "crashed right after a journal write");
                        }
                    }
                    Err(e) => self.coord_dies(gen, true, &format!("stepped down: {e}")),
                }
            }
            coordinator::Action::ToWorker { worker, msg } => {
                if let Some((conn, pid)) = conn_of(self, worker) {
                    self.send_to_proc(gen, conn, pid, msg);
                }
            }
            coordinator::Action::Disconnect { worker } => {
                if let Some((conn, pid)) = conn_of(self, worker) {
                    let c = &mut self.coords[gen as usize];
                    c.conn_of.remove(&worker);
                    c.admitted.remove(&conn);
                    self.send(
                        Node::Coord,
                        Node::Proc(pid),
                        Frame::CoordClosed { gen, conn, pid },
                        true,
                    );
                }
            }
            coordinator::Action::ToClient { client, msg } => self.send(
                Node::Coord,
                Node::Client,
                Frame::ToClient { gen, client, msg },
                true,
            ),
            // The simulator's one job logs at the store's top: the per-job namespace of the
            // real drivers (`crate::job_store`) is a view that changes no message.
            coordinator::Action::CheckStore { job } => {
                let result = Manifest::load(&*self.store)
                    .map(|m| m.is_some())
                    .map_err(|e| e.to_string());
                self.coord_event(gen, coordinator::Event::StoreChecked { job, result })?;
            }
            coordinator::Action::ReadOutputs { job } => {
                let result = coordinator::read_outputs(self.store.clone());
                self.coord_event(gen, coordinator::Event::OutputsRead { job, result })?;
            }
            coordinator::Action::RecordFinished { job } => {
                let result = coordinator::record_finished(&*self.store);
                self.coord_event(gen, coordinator::Event::Recorded { job, result })?;
            }
            coordinator::Action::Note(line) => self.note(&format!("c{gen}: {line}")),
            // The main simulation runs no online oracle (`sim_oracle` tests model one).
            coordinator::Action::ToOracle { .. } => {}
        }
        Ok(())
    }

    /// Coordinator `gen` sends `msg` on connection `conn` of process `pid`.
    fn send_to_proc(&mut self, gen: Gen, conn: ConnId, pid: Pid, msg: ToWorker) {
        self.send(
            Node::Coord,
            Node::Proc(pid),
            Frame::ToProc {
                gen,
                conn,
                pid,
                msg,
            },
            true,
        );
    }

    fn worker_event(&mut self, pid: Pid, ev: worker::Event) -> Result<(), String> {
        let now = self.now;
        let Some(p) = self.procs.get_mut(&pid) else {
            return Ok(());
        };
        if p.dead {
            return Ok(());
        }
        let Some(core) = p.core.as_mut() else {
            return Ok(());
        };
        let actions = core.on_event(now, ev);
        for a in actions {
            self.worker_action(pid, a)?;
        }
        Ok(())
    }

    /// Sends `msg` on the process's connection with its coordinator, if it has one.
    fn send_to_coord(&mut self, pid: Pid, what: CoordIn) {
        if let Some((gen, conn)) = self.procs.get(&pid).and_then(|p| p.conn) {
            self.send(
                Node::Proc(pid),
                Node::Coord,
                Frame::ToCoord { gen, conn, what },
                true,
            );
        }
    }

    fn worker_action(&mut self, pid: Pid, a: worker::Action) -> Result<(), String> {
        match a {
            worker::Action::ToCoord(m) => self.send_to_coord(pid, CoordIn::Msg(m)),
            worker::Action::ToPeer { addr, frame, .. } => {
                let Some(to) = addr
                    .strip_prefix("sim:")
                    .and_then(|p| p.parse::<Pid>().ok())
                else {
                    return Err(format!("p{pid} was told of peer address {addr}"));
                };
                let Some(from) = self.procs.get(&pid).and_then(Proc::worker) else {
                    return Ok(());
                };
                if std::mem::take(&mut self.force_loss)
                    || self.rng.random_bool(self.cfg.faults.loss)
                {
                    self.faults.lost += 1;
                    return Ok(());
                }
                let copies = if self.rng.random_bool(self.cfg.faults.dup) {
                    self.faults.duplicated += 1;
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    self.send(
                        Node::Proc(pid),
                        Node::Proc(to),
                        Frame::Peer {
                            from,
                            to,
                            frame: frame.clone(),
                        },
                        false,
                    );
                }
            }
            worker::Action::Deliver { to, env } => {
                if let Some((_, _, router)) = self.procs.get(&pid).and_then(|p| p.member.as_ref()) {
                    router.deliver(VnodeId(to), env);
                }
            }
            worker::Action::StartJob {
                job,
                hosted,
                starts,
                ..
            } => {
                let Some(p) = self.procs.get_mut(&pid) else {
                    return Ok(());
                };
                let sink = p.outbox.clone();
                let router = Router::new(Arc::new(move |to: VnodeId, env| {
                    sink.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((to.0, env));
                }));
                let depth = self.cfg.depth;
                let fanout = self.cfg.fanout;
                let member = self
                    .rt
                    .stepped_member(
                        program::Node {
                            depth,
                            fanout,
                            path: 1,
                        },
                        (),
                        &hosted,
                        starts,
                        Arc::new(router.clone()),
                    )
                    .map_err(|e| format!("p{pid}: cannot start the member: {e}"))?;
                p.member = Some((job, member, router));
            }
            worker::Action::Control { job, order } => {
                let stop = order == Control::Stop;
                let Some(p) = self.procs.get_mut(&pid) else {
                    return Ok(());
                };
                let Some((j, member, _)) = p.member.as_mut() else {
                    return Ok(());
                };
                if *j != job {
                    return Ok(());
                }
                if let Err(e) = member.control(order) {
                    let (job, _, _) = p.member.take().expect("checked above");
                    return self.worker_event(
                        pid,
                        worker::Event::JobEnded {
                            job,
                            result: Err(e.to_string()),
                        },
                    );
                }
                if stop {
                    let (job, member, _) = p.member.take().expect("checked above");
                    let result = member
                        .finish()
                        .map(WorkerReport::from)
                        .map_err(|e| e.to_string());
                    return self.worker_event(pid, worker::Event::JobEnded { job, result });
                }
            }
            worker::Action::AnswerProbe { job, round } => {
                let status = self
                    .procs
                    .get(&pid)
                    .and_then(|p| p.member.as_ref())
                    .filter(|(j, _, _)| *j == job)
                    .map(|(_, m, _)| &**m.status());
                let msg = ToCoord::status(job, round, status);
                self.send_to_coord(pid, CoordIn::Msg(msg));
            }
            worker::Action::Exit(reason) => {
                self.note(&format!("p{pid} exits: {reason}"));
                self.kill(pid, true);
            }
            worker::Action::Reconnect(reason) => {
                // `worker` rule 1: it drops its connection and looks for the coordinator
                // that holds the role; its vnodes go on meanwhile.
                self.note(&format!("p{pid} leaves its coordinator: {reason}"));
                self.worker_event(pid, worker::Event::CoordLost)?;
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.old_conn = p.conn.take().or(p.old_conn);
                    p.seeking.get_or_insert(self.now);
                    p.next_try = self.now;
                }
            }
            worker::Action::Note(line) => self.note(&format!("p{pid}: {line}")),
        }
        Ok(())
    }

    /// A process ends: its memory is gone, and so are writes it had not pumped (rule 1). A
    /// killed process's connections reset; a lost host's fall silent.
    fn kill(&mut self, pid: Pid, reset: bool) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if p.dead {
            return;
        }
        p.dead = true;
        p.core = None;
        p.inbox.clear();
        if p.member.take().is_some() {
            self.faults.writes_lost += 1;
        }
        if reset {
            self.send_to_coord(pid, CoordIn::Closed("connection reset"));
            self.close_old_conn(pid, "connection reset");
        }
    }

    /// The connection the process gave up on closes.
    fn close_old_conn(&mut self, pid: Pid, why: &'static str) {
        if let Some((gen, conn)) = self.procs.get_mut(&pid).and_then(|p| p.old_conn.take()) {
            self.send(
                Node::Proc(pid),
                Node::Coord,
                Frame::ToCoord {
                    gen,
                    conn,
                    what: CoordIn::Closed(why),
                },
                true,
            );
        }
    }

    /// A frame a worker process reads.
    fn deliver(&mut self, f: Frame) -> Result<(), String> {
        match f {
            Frame::ToProc {
                gen,
                conn,
                pid,
                msg,
            } => {
                let Some(p) = self.procs.get_mut(&pid) else {
                    return Ok(());
                };
                if p.conn != Some((gen, conn)) {
                    return Ok(()); // a connection it closed
                }
                let now = self.now;
                match &msg {
                    ToWorker::Welcome { id, fd, .. } => {
                        p.seeking = None;
                        if p.core.is_none() {
                            p.core = Some(WorkerCore::new(*id, *fd, now));
                        } else {
                            self.note(&format!("c{gen} took p{pid} back"));
                            self.worker_event(pid, worker::Event::CoordBack)?;
                            self.close_old_conn(pid, "the worker left");
                        }
                    }
                    ToWorker::Refused { reason } if p.core.is_none() => {
                        self.note(&format!("p{pid} exits: refused: {reason}"));
                        self.kill(pid, false);
                        return Ok(());
                    }
                    _ => {}
                }
                self.note(&format!("c{gen} -> p{pid}: {}", worker_line(&msg)));
                self.worker_event(pid, worker::Event::FromCoord(msg))?;
            }
            Frame::CoordClosed { gen, conn, pid } => {
                let Some(p) = self.procs.get_mut(&pid) else {
                    return Ok(());
                };
                if p.old_conn == Some((gen, conn)) {
                    p.old_conn = None;
                }
                if p.conn != Some((gen, conn)) {
                    return Ok(());
                }
                p.conn = None;
                p.seeking.get_or_insert(self.now);
                p.next_try = self.now;
                self.note(&format!("c{gen} closed p{pid}"));
                self.worker_event(pid, worker::Event::CoordLost)?;
            }
            Frame::Peer { from, to, frame } => {
                self.worker_event(to, worker::Event::FromPeer { from, frame })?;
            }
            Frame::ToCoord { .. } | Frame::ToClient { .. } | Frame::ClientClosed { .. } => {}
        }
        Ok(())
    }

    /// A frame the client reads (rule 9).
    fn client_reads(&mut self, f: Frame) {
        match f {
            Frame::ToClient { gen, client, msg } if self.client.conn == Some((gen, client)) => {
                self.note(&format!("client: {}", client_line(&msg)));
                match msg {
                    ToSubmit::Accepted { job, .. } => self.client.accepted = Some(job),
                    ToSubmit::Standby { .. } => {
                        self.client.conn = None;
                        self.client.next_try = self.now + RETRY;
                    }
                    ToSubmit::Finished { .. } | ToSubmit::Failed { .. } => self.result = Some(msg),
                    _ => {}
                }
            }
            Frame::ClientClosed { gen, client } if self.client.conn == Some((gen, client)) => {
                self.note(&format!("client: lost c{gen}"));
                self.client.conn = None;
                self.client.next_try = self.now;
            }
            _ => {}
        }
    }

    fn running(&self, p: &Proc) -> bool {
        !p.dead && p.paused_until.is_none_or(|t| self.now >= t)
    }

    /// The processes that can carry the job, alive, not paused and not cut off (rule 3 keeps
    /// one): the hosts of its vnodes, and every worker the newest coordinator has admitted
    /// (a member hosting nothing, or one that joined during a takeover: it becomes a member
    /// when the takeover ends, `coordinator` rule 10). So every host may fail at once while
    /// one such worker stands by.
    fn healthy_members(&self) -> Vec<Pid> {
        let newest = self.coords.last();
        let map = newest.and_then(|c| c.core.map(JOB)).unwrap_or_default();
        let admitted = newest.map(|c| c.core.workers()).unwrap_or_default();
        let mut members: Vec<Pid> = map
            .iter()
            .map(|(w, _)| *w)
            .chain(admitted)
            .filter_map(|w| {
                self.procs
                    .values()
                    .find(|p| p.worker() == Some(w))
                    .map(|p| p.pid)
            })
            .collect();
        members.sort_unstable();
        members.dedup();
        let cut = |p: &Pid| {
            self.cuts
                .keys()
                .any(|(a, b)| *a == Node::Proc(*p) || *b == Node::Proc(*p))
        };
        members
            .into_iter()
            .filter(|p| self.procs.get(p).is_some_and(|q| self.running(q)) && !cut(p))
            .collect()
    }

    /// Rule 9: the newest coordinator crashes (its sockets reset, or its host is lost), crashes
    /// right after its next journal write, or pauses (past its lease: a zombie that wakes after
    /// a successor took over). One such fault at a time, at any moment: before the job is
    /// accepted too (the client then submits again).
    fn coordinator_fault(&mut self) {
        let gen = Gen::try_from(self.coords.len() - 1).unwrap_or(Gen::MAX);
        let Some(c) = self.coords.last() else {
            return;
        };
        let quiet = !c.dead
            && c.paused_until.is_none()
            && !c.crash_after_journal
            && !c.core.recovering()
            && self.successor_due.is_none()
            && self.coords.iter().filter(|c| !c.dead).count() == 1;
        if !quiet {
            return;
        }
        match self.rng.random_range(0..4) {
            kind @ (0 | 1) => {
                self.faults.coord_crashes += 1;
                let reset = kind == 0;
                self.note(&format!(
                    "fault: crash c{gen} ({})",
                    if reset { "reset" } else { "silent" }
                ));
                self.coord_dies(gen, reset, "crashed");
            }
            2 => {
                // Counted when it lands (a journal write may not come before the liveness
                // phase, which clears it).
                self.note(&format!("fault: crash c{gen} after its next journal write"));
                if let Some(c) = self.coords.last_mut() {
                    c.crash_after_journal = true;
                }
            }
            _ => {
                let zombie = self.rng.random_bool(0.5);
                let len = if zombie {
                    LEASE * 2 + Duration::from_millis(self.rng.random_range(0..60))
                } else {
                    Duration::from_micros(
                        self.rng.random_range(500..(LEASE.as_micros() as u64 / 2)),
                    )
                };
                self.faults.coord_pauses += 1;
                if zombie {
                    self.faults.coord_zombies += 1;
                    let jitter = Duration::from_micros(self.rng.random_range(0..10_000));
                    self.successor_due = Some(self.now + LEASE + jitter);
                }
                self.note(&format!("fault: pause c{gen} for {len:?}"));
                if let Some(c) = self.coords.last_mut() {
                    c.paused_until = Some(self.now + len);
                }
            }
        }
    }

    fn inject_faults(&mut self) {
        let q = QUANTUM.as_secs_f64();
        let f = self.cfg.faults.clone();
        // Rule 8: a checkpoint server crashes, one at a time, where the layout survives it.
        let rate = self.cfg.store.crash;
        if rate > 0.0 && !self.servers.any_unwell() && self.rng.random_bool((rate * q).min(1.0)) {
            let i = self.rng.random_range(0..self.servers.len());
            let in_flush = self.rng.random_bool(0.5);
            let back = self.now + Duration::from_millis(self.rng.random_range(2..30));
            self.faults.server_crashes += 1;
            self.note(&format!(
                "fault: crash server {i}{}",
                if in_flush { " in its next flush" } else { "" }
            ));
            self.servers.crash(i, in_flush);
            self.server_restarts.push((back, i));
        }
        if f.coord > 0.0 && self.rng.random_bool((f.coord * q).min(1.0)) {
            self.coordinator_fault();
        }
        let live: Vec<Pid> = self
            .procs
            .values()
            .filter(|p| self.running(p) && p.core.is_some())
            .map(|p| p.pid)
            .collect();
        if live.is_empty() {
            return;
        }
        // A victim may be any live worker as long as another member stays healthy (rule 3),
        // judged after the faults already injected in this quantum.
        let pick = |w: &mut World, live: &[Pid]| -> Option<Pid> {
            let v = live[w.rng.random_range(0..live.len())];
            w.healthy_members().iter().any(|&h| h != v).then_some(v)
        };
        // Behind the budget of `min_faults` over the planned safety phase: force one fault of
        // a kind drawn from the seed this quantum, so that a short run still meets it.
        let due = (self.cfg.min_faults as f64 * self.now.as_secs_f64()
            / self.cfg.safety.as_secs_f64().max(1e-9)) as u64;
        let forced = (self.faults.total() < due).then(|| self.rng.random_range(0..3));
        if forced.is_some() {
            // When no victim can be spared, the next peer frame is lost instead.
            self.force_loss = true;
        }
        if forced == Some(0) || self.rng.random_bool((f.crash * q).min(1.0)) {
            if let Some(v) = pick(self, &live) {
                let reset = self.rng.random_bool(0.5);
                self.faults.crashes += 1;
                if reset {
                    self.faults.resets += 1;
                }
                self.note(&format!(
                    "fault: crash p{v} ({})",
                    if reset { "reset" } else { "silent" }
                ));
                self.kill(v, reset);
                let back = self.now + Duration::from_millis(self.rng.random_range(5..50));
                self.restarts_due.push(back);
            }
        }
        if forced == Some(1) || self.rng.random_bool((f.pause * q).min(1.0)) {
            if let Some(v) = pick(self, &live) {
                // Half of the pauses outlast the detector's bound: zombies.
                let bound = self.fd.interval + self.fd.timeout + self.fd.broken;
                let len = if self.rng.random_bool(0.5) {
                    bound * 2 + Duration::from_millis(self.rng.random_range(0..50))
                } else {
                    Duration::from_millis(self.rng.random_range(1..10))
                };
                self.faults.pauses += 1;
                if len > bound {
                    self.faults.zombies += 1;
                }
                self.note(&format!("fault: pause p{v} for {len:?}"));
                if let Some(p) = self.procs.get_mut(&v) {
                    p.paused_until = Some(self.now + len);
                }
            }
        }
        if forced == Some(2) || self.rng.random_bool((f.partition * q).min(1.0)) {
            if let Some(a) = pick(self, &live) {
                let other = if self.rng.random_bool(0.5) {
                    Node::Coord
                } else {
                    Node::Proc(live[self.rng.random_range(0..live.len())])
                };
                if other != Node::Proc(a) {
                    let len = Duration::from_millis(self.rng.random_range(1..80));
                    let heal = self.now + len;
                    let dir = self.rng.random_range(0..3);
                    if dir != 1 {
                        self.cuts.insert((Node::Proc(a), other), heal);
                    }
                    if dir != 0 {
                        self.cuts.insert((other, Node::Proc(a)), heal);
                    }
                    self.faults.partitions += 1;
                    self.note(&format!(
                        "fault: partition p{a} / {other:?} ({dir}) for {len:?}"
                    ));
                }
            }
        }
        if forced.is_some() && self.faults.total() < due {
            // No victim could be spared: clog one worker's link with the coordinator for less
            // than the detector's bound (a clogged link, restored), which any worker survives.
            let w = live[self.rng.random_range(0..live.len())];
            let len = Duration::from_micros(
                self.rng
                    .random_range(500..(self.fd.interval + self.fd.timeout).as_micros() as u64 / 2),
            );
            let (from, to) = if self.rng.random_bool(0.5) {
                (Node::Proc(w), Node::Coord)
            } else {
                (Node::Coord, Node::Proc(w))
            };
            let heal = self.now + len;
            let e = self.cuts.entry((from, to)).or_insert(heal);
            *e = (*e).max(heal);
            self.faults.clogs += 1;
            self.note(&format!("fault: clog {from:?} -> {to:?} for {len:?}"));
        }
    }

    fn run(&mut self) -> Result<(Vec<Vec<u8>>, u32), String> {
        let mut safety = true;
        let mut deadline = Duration::MAX;
        loop {
            if safety && self.now >= self.cfg.safety && self.faults.total() >= self.cfg.min_faults {
                // Rule 5: the liveness phase begins: no new faults; partitions and pauses run
                // out at their own (bounded) ends, so frames they held keep their order.
                safety = false;
                deadline = self.now + self.cfg.liveness;
                for c in &mut self.coords {
                    c.crash_after_journal = false;
                }
                self.note("liveness phase");
            }
            if safety {
                self.inject_faults();
            }
            let now = self.now;
            self.cuts.retain(|_, heal| *heal > now);
            let due: Vec<Duration> = self
                .restarts_due
                .iter()
                .copied()
                .filter(|t| *t <= now)
                .collect();
            self.restarts_due.retain(|t| *t > now);
            for _ in due {
                self.faults.restarts += 1;
                self.spawn_proc(true);
            }
            self.restart_servers(Some(now))?;
            if self.successor_due.is_some_and(|t| t <= now) {
                self.successor_due = None;
                if !self.start_coordinator()? {
                    self.successor_due = Some(now + RETRY);
                }
            }
            self.wake_coordinators();
            // Deliveries due: into the socket buffers of the processes, which read them while
            // running, so a paused process reads its frames later and in their order (rule 2).
            while let Some(top) = self.net.peek() {
                if top.at > self.now {
                    break;
                }
                let f = self.net.pop().expect("peeked");
                match f.frame {
                    Frame::ToCoord { gen, conn, what } => {
                        if let Some(c) = self.coords.get_mut(gen as usize).filter(|c| !c.dead) {
                            c.inbox.push_back((conn, what));
                        }
                    }
                    Frame::ToProc { pid, .. }
                    | Frame::CoordClosed { pid, .. }
                    | Frame::Peer { to: pid, .. } => {
                        if let Some(p) = self.procs.get_mut(&pid).filter(|p| !p.dead) {
                            p.inbox.push_back(f.frame);
                        }
                    }
                    Frame::ToClient { .. } | Frame::ClientClosed { .. } => {
                        self.client_reads(f.frame)
                    }
                }
            }
            for gen in 0..self.coords.len() {
                while self.coords[gen].paused_until.is_none() {
                    let Some((conn, what)) = self.coords[gen].inbox.pop_front() else {
                        break;
                    };
                    self.coord_input(gen as Gen, conn, what)?;
                }
            }
            let pids: Vec<Pid> = self.procs.keys().copied().collect();
            for pid in pids {
                while self.procs.get(&pid).is_some_and(|p| self.running(p)) {
                    let Some(frame) = self.procs.get_mut(&pid).and_then(|p| p.inbox.pop_front())
                    else {
                        break;
                    };
                    self.deliver(frame)?;
                }
            }
            for gen in 0..self.coords.len() {
                let c = &self.coords[gen];
                if !c.dead && c.paused_until.is_none() && now >= c.core.next_deadline() {
                    self.coord_event(gen as Gen, coordinator::Event::Tick)?;
                }
                let c = &self.coords[gen];
                if !c.dead && c.paused_until.is_none() && now >= c.next_renew {
                    self.renew(gen as Gen);
                }
            }
            self.client_tick();
            self.follow()?;
            // Workers in an order drawn from the seed.
            let mut pids: Vec<Pid> = self.procs.keys().copied().collect();
            for i in (1..pids.len()).rev() {
                let j = self.rng.random_range(0..=i);
                pids.swap(i, j);
            }
            for pid in pids {
                let (running, due) = match self.procs.get(&pid) {
                    Some(p) => (
                        self.running(p),
                        p.core.as_ref().is_some_and(|c| now >= c.next_deadline()),
                    ),
                    None => continue,
                };
                if !running {
                    continue;
                }
                self.seek(pid);
                if due {
                    self.worker_event(pid, worker::Event::Tick)?;
                }
                self.step_member(pid)?;
            }
            if let Some(r) = self.result.take() {
                return match r {
                    ToSubmit::Finished {
                        outputs,
                        workers_lost,
                        ..
                    } => Ok((outputs, workers_lost)),
                    ToSubmit::Failed { error } => Err(format!("the job failed: {error}")),
                    _ => Err("the job ended without a result".into()),
                };
            }
            if self.now >= deadline || (safety && self.now >= self.cfg.safety + self.cfg.liveness) {
                return Err(format!(
                    "no end {:?} after the faults stopped (hang); waiting: {}",
                    self.cfg.liveness,
                    self.diagnose()
                ));
            }
            self.now += QUANTUM;
            self.clock.advance(QUANTUM);
        }
    }

    /// Coordinators whose pause ended run again. A zombie's lease renewal (its own timer, due
    /// during the pause) runs before or after the frames and timers it finds waiting; the
    /// renewal's refusal, or its first journal write's, makes it step down (`journal` rules
    /// 3-4).
    fn wake_coordinators(&mut self) {
        for gen in 0..self.coords.len() {
            let c = &mut self.coords[gen];
            if c.dead || c.paused_until.is_none_or(|t| t > self.now) {
                continue;
            }
            c.paused_until = None;
            self.note(&format!("c{gen} wakes"));
            if self.rng.random_bool(0.5) {
                self.renew(gen as Gen);
            }
        }
    }

    /// Coordinator `gen` renews its lease (`journal` rule 4); a refusal deposes it.
    fn renew(&mut self, gen: Gen) {
        let c = &mut self.coords[gen as usize];
        c.next_renew = self.now + LEASE / 4;
        c.beat += 1;
        let lease = journal::Lease {
            term: c.core.config().term,
            holder: c.core.config().advertise.clone(),
            beat: c.beat,
        };
        if let Err(e) = journal::renew_lease(&*self.store, &lease) {
            self.coord_dies(gen, true, &format!("stepped down: {e}"));
        }
    }

    /// Restarts the servers due by `by` (every one if `None`) and scrubs (rule 8).
    fn restart_servers(&mut self, by: Option<Duration>) -> Result<(), String> {
        let due: Vec<usize> = self
            .server_restarts
            .iter()
            .filter(|(t, _)| by.is_none_or(|by| *t <= by))
            .map(|&(_, i)| i)
            .collect();
        self.server_restarts
            .retain(|(t, _)| by.is_some_and(|by| *t > by));
        for i in due {
            let repaired = self.servers.restart(i)?;
            self.note(&format!(
                "server {i} restarts; the scrub rewrote {repaired} fragments"
            ));
        }
        Ok(())
    }

    fn step_member(&mut self, pid: Pid) -> Result<(), String> {
        let pump = self.rng.random_bool(self.cfg.faults.pump);
        let Some(p) = self.procs.get_mut(&pid) else {
            return Ok(());
        };
        let Some((job, m, _)) = p.member.as_mut() else {
            return Ok(());
        };
        let job = *job;
        let step = m
            .step(STEP_BUDGET)
            .and_then(|_| if pump { m.pump() } else { Ok(()) });
        let out: Vec<(u32, Envelope)> =
            std::mem::take(&mut *p.outbox.lock().unwrap_or_else(|p| p.into_inner()));
        if let Err(e) = step {
            p.member = None;
            return self.worker_event(
                pid,
                worker::Event::JobEnded {
                    job,
                    result: Err(e.to_string()),
                },
            );
        }
        for (to, env) in out {
            self.worker_event(pid, worker::Event::Outbound { to, env })?;
        }
        Ok(())
    }

    /// What a run that does not end waits for: the coordinators, and each process's hosted
    /// vnodes and their work.
    fn diagnose(&self) -> String {
        let mut parts = Vec::new();
        for (gen, c) in self.coords.iter().enumerate() {
            let state = if c.dead {
                "dead"
            } else if c.paused_until.is_some() {
                "paused"
            } else if c.core.recovering() {
                "waiting for its members"
            } else {
                "active"
            };
            parts.push(format!("c{gen} {state}"));
        }
        for p in self.procs.values() {
            let state = if p.dead {
                "dead".to_string()
            } else if let Some((_, m, _)) = &p.member {
                let waits: Vec<String> = m.waits().iter().map(ToString::to_string).collect();
                format!("hosts [{}]", waits.join(" | "))
            } else {
                "idle".to_string()
            };
            let id = p.worker().map(|w| format!(" (w{w})")).unwrap_or_default();
            parts.push(format!("p{}{id} {state}", p.pid));
        }
        format!(
            "map {:?}; {}",
            self.coords.last().and_then(|c| c.core.map(JOB)),
            parts.join("; ")
        )
    }
}

fn client_line(m: &ToSubmit) -> String {
    match m {
        ToSubmit::Accepted { vnodes, .. } => format!("accepted ({vnodes} vnodes)"),
        ToSubmit::Progress { completed } => format!("progress {completed}"),
        ToSubmit::Queued { job, ahead } => format!("j{job} queued (+{ahead})"),
        ToSubmit::Cancelled { job, was } => format!("cancelled j{job} ({was})"),
        ToSubmit::WorkerLost { worker, moved, .. } => format!("lost w{worker}, moved {moved:?}"),
        ToSubmit::Finished { tasks, .. } => format!("finished ({tasks} tasks)"),
        ToSubmit::Failed { error } => format!("failed: {error}"),
        ToSubmit::Takeover { coordinator } => format!("takeover by {coordinator}"),
        ToSubmit::Standby { .. } => "standby".into(),
        ToSubmit::Status(_) => "status".into(),
        ToSubmit::Oracle { commitment } => format!("oracle committed to {commitment}"),
    }
}

fn coord_line(m: &ToCoord) -> String {
    match m {
        ToCoord::Status { round, work, .. } => format!("status r{round} {work:?}"),
        ToCoord::Done { job, .. } => format!("done j{job}"),
        ToCoord::Failed { error, .. } => format!("failed: {error}"),
        ToCoord::Heartbeat(_) => "heartbeat".into(),
        ToCoord::Broken { worker } => format!("broken w{worker}"),
        ToCoord::Metrics(_) => "metrics".into(),
    }
}

fn worker_line(m: &ToWorker) -> String {
    match m {
        ToWorker::Welcome { id, .. } => format!("welcome {id}"),
        ToWorker::Refused { reason } => format!("refused: {reason}"),
        ToWorker::Heartbeat(_) => "heartbeat".into(),
        ToWorker::Start { hosted, .. } => format!("start {hosted:?}"),
        ToWorker::Map { map, .. } => format!("map {map:?}"),
        ToWorker::Host { vnode, epoch, .. } => format!("host v{vnode}@{epoch}"),
        ToWorker::Probe { round, .. } => format!("probe r{round}"),
        ToWorker::Stop { .. } => "stop".into(),
        ToWorker::Standby { .. } => "standby".into(),
    }
}

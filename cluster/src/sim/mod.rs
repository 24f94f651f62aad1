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
//!    both, and heals. At least one member of the job is always left alive and unpaused. In
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

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use veriflow_checkpoint::Store;
use veriflow_runtime::detect::FdParams;
use veriflow_runtime::log::{CommitPolicy, Manifest};
use veriflow_runtime::transport::{Envelope, Router};
use veriflow_runtime::{Control, Forge, ForgeMode, ManualClock, Runtime, SteppedMember, VnodeId};

pub use check::Violation;

use crate::coordinator::{self, Coordinator, Joining};
use crate::protocol::{JobSpec, Peer, ToCoord, ToSubmit, ToWorker, WorkerId, WorkerReport};
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
}

impl Faults {
    /// Rates drawn from `rng`: each seed its own mix (TigerBeetle's VOPR).
    pub fn draw(rng: &mut ChaCha8Rng) -> Faults {
        Faults {
            crash: rng.gen_range(5.0..30.0),
            pause: rng.gen_range(5.0..30.0),
            partition: rng.gen_range(5.0..30.0),
            loss: rng.gen_range(0.02..0.3),
            dup: rng.gen_range(0.02..0.3),
            delay: Duration::from_micros(rng.gen_range(100..3000)),
            pump: rng.gen_range(0.2..1.0),
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
}

impl SimConfig {
    /// The configuration of seed `seed`: sizes and fault rates drawn from it.
    pub fn from_seed(seed: u64) -> SimConfig {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5111_c0de);
        let workers = rng.gen_range(2..=5);
        let vnodes = rng.gen_range(workers..=8);
        // Trees of 485 to 1,706 tasks.
        let (depth, fanout) = [(5, 3), (6, 3), (4, 4), (5, 4), (4, 5)][rng.gen_range(0..5)];
        // The safety phase covers 40-90 % of a fault-free run (a task per quantum per vnode).
        let run = QUANTUM
            * u32::try_from(program::tasks(depth, fanout) / u64::from(vnodes)).unwrap_or(u32::MAX);
        SimConfig {
            seed,
            workers,
            spares: rng.gen_range(1..=2),
            vnodes,
            depth,
            fanout,
            faults: Faults::draw(&mut rng),
            safety: run.mul_f64(rng.gen_range(0.4..0.9)),
            min_faults: 20,
            fences: true,
            // One seed in five has a vnode that forges 2-20 % of its tasks.
            forge: rng
                .gen_bool(0.2)
                .then(|| (rng.gen_range(0..vnodes), rng.gen_range(0.02..0.2))),
            liveness: Duration::from_secs(20),
            store: StoreLayout::draw(&mut rng),
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

/// Who a frame goes between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    Coord,
    Worker(WorkerId),
}

#[derive(Debug)]
enum Frame {
    ToCoord(WorkerId, ToCoord),
    ToWorker(WorkerId, ToWorker),
    /// The coordinator closed its connection to the worker.
    CoordClosed(WorkerId),
    /// The worker's connection reset (as seen by the coordinator).
    WorkerClosed(WorkerId),
    Peer(WorkerId, WorkerId, Peer),
}

type InFlight = net::InFlight<Frame>;

type Outbox = Arc<Mutex<Vec<(u32, Envelope)>>>;

struct Proc {
    id: WorkerId,
    /// None until welcomed.
    core: Option<WorkerCore>,
    member: Option<(u64, SteppedMember, Router)>,
    outbox: Outbox,
    /// Frames arrived and not yet read (the socket buffer).
    inbox: std::collections::VecDeque<Frame>,
    paused_until: Option<Duration>,
    /// Set when the process exited or crashed.
    dead: bool,
}

/// A store that remembers every segment key it acknowledged (a flush after the put).
struct Recording {
    inner: Arc<dyn Store>,
    fences: bool,
    pending: Mutex<Vec<Vec<u8>>>,
    acked: Mutex<Vec<Vec<u8>>>,
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
    fn delete(&self, key: &[u8]) -> Result<(), veriflow_checkpoint::StoreError> {
        self.inner.delete(key)
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
    coord: Coordinator,
    procs: BTreeMap<WorkerId, Proc>,
    next_id: WorkerId,
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
    let checks = check::check(
        cfg,
        &*w.store,
        &w.store.acked.lock().unwrap_or_else(|p| p.into_inner()),
        &reference,
        &outcome,
    )
    .map_err(|v| fail(v.to_string()))?;
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
        let mut ccfg = coordinator::Config::new("sim", "sim:store", fd, [0x5e; 32]);
        ccfg.seed = cfg.seed;
        let mut w = World {
            cfg: cfg.clone(),
            now: Duration::ZERO,
            clock,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            coord: Coordinator::new(ccfg),
            procs: BTreeMap::new(),
            next_id: 1,
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
        };
        for i in 0..cfg.workers + cfg.spares {
            w.join(i >= cfg.workers);
        }
        let job = JobSpec {
            argv: Vec::new(),
            vnodes: cfg.vnodes,
            min_workers: cfg.workers + cfg.spares,
            iterative: false,
        };
        w.coord_event(coordinator::Event::Submit {
            client: 1,
            program: "sim".into(),
            job,
        });
        Ok(w)
    }

    fn note(&mut self, line: &str) {
        self.trace.update(&self.now.as_nanos().to_le_bytes());
        self.trace.update(line.as_bytes());
        if std::env::var_os("VERIFLOW_SIM_TRACE").is_some() {
            eprintln!("[{:>9.3} ms] {line}", self.now.as_secs_f64() * 1e3);
        }
    }

    /// A new worker process connects.
    fn join(&mut self, spare: bool) {
        let id = self.next_id;
        self.next_id += 1;
        self.procs.insert(
            id,
            Proc {
                id,
                core: None,
                member: None,
                outbox: Outbox::default(),
                inbox: std::collections::VecDeque::new(),
                paused_until: None,
                dead: false,
            },
        );
        self.coord_event(coordinator::Event::Joined {
            conn: u64::from(id),
            hello: Joining {
                program: "sim".into(),
                peer_addr: format!("sim:{id}"),
                threads: 1,
                spare,
                public_key: [0; 32],
            },
        });
    }

    fn send(&mut self, from: Node, to: Node, frame: Frame, ordered: bool) {
        let delay = Duration::from_nanos(
            self.rng
                .gen_range(0..=self.cfg.faults.delay.as_nanos() as u64),
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

    fn coord_event(&mut self, ev: coordinator::Event) {
        let actions = self.coord.on_event(self.now, ev);
        for a in actions {
            match a {
                coordinator::Action::Admit { conn, worker } => {
                    // The simulator numbers its processes as the coordinator numbers workers.
                    if conn != u64::from(worker) {
                        self.note(&format!(
                            "coordinator admitted connection {conn} as w{worker}"
                        ));
                    }
                }
                coordinator::Action::Refuse { conn, msg } => {
                    let worker = WorkerId::try_from(conn).unwrap_or(WorkerId::MAX);
                    self.send(
                        Node::Coord,
                        Node::Worker(worker),
                        Frame::ToWorker(worker, msg),
                        true,
                    );
                    self.send(
                        Node::Coord,
                        Node::Worker(worker),
                        Frame::CoordClosed(worker),
                        true,
                    );
                }
                coordinator::Action::Journal(j) => {
                    if let Err(e) = coordinator::journal::write_journal(&*self.store, &j) {
                        self.note(&format!("coordinator: journal write failed: {e}"));
                    }
                }
                coordinator::Action::ToWorker { worker, msg } => self.send(
                    Node::Coord,
                    Node::Worker(worker),
                    Frame::ToWorker(worker, msg),
                    true,
                ),
                coordinator::Action::Disconnect { worker } => self.send(
                    Node::Coord,
                    Node::Worker(worker),
                    Frame::CoordClosed(worker),
                    true,
                ),
                coordinator::Action::ToClient { msg, .. } => {
                    self.note(&format!("client: {}", client_line(&msg)));
                    if matches!(msg, ToSubmit::Finished { .. } | ToSubmit::Failed { .. }) {
                        self.result = Some(msg);
                    }
                }
                coordinator::Action::CheckStore { job } => {
                    let result = Manifest::load(&*self.store)
                        .map(|m| m.is_some())
                        .map_err(|e| e.to_string());
                    self.coord_event(coordinator::Event::StoreChecked { job, result });
                }
                coordinator::Action::ReadOutputs { job } => {
                    let result = coordinator::read_outputs(self.store.clone());
                    self.coord_event(coordinator::Event::OutputsRead { job, result });
                }
                coordinator::Action::RecordFinished { job } => {
                    let result = coordinator::record_finished(&*self.store);
                    self.coord_event(coordinator::Event::Recorded { job, result });
                }
                coordinator::Action::Note(line) => self.note(&format!("coordinator: {line}")),
            }
        }
    }

    fn worker_event(&mut self, id: WorkerId, ev: worker::Event) -> Result<(), String> {
        let now = self.now;
        let Some(p) = self.procs.get_mut(&id) else {
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
            self.worker_action(id, a)?;
        }
        Ok(())
    }

    fn worker_action(&mut self, id: WorkerId, a: worker::Action) -> Result<(), String> {
        match a {
            worker::Action::ToCoord(m) => {
                self.send(Node::Worker(id), Node::Coord, Frame::ToCoord(id, m), true)
            }
            worker::Action::ToPeer { worker, frame, .. } => {
                if std::mem::take(&mut self.force_loss) || self.rng.gen_bool(self.cfg.faults.loss) {
                    self.faults.lost += 1;
                    return Ok(());
                }
                let copies = if self.rng.gen_bool(self.cfg.faults.dup) {
                    self.faults.duplicated += 1;
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    self.send(
                        Node::Worker(id),
                        Node::Worker(worker),
                        Frame::Peer(id, worker, frame.clone()),
                        false,
                    );
                }
            }
            worker::Action::Deliver { to, env } => {
                if let Some((_, _, router)) = self.procs.get(&id).and_then(|p| p.member.as_ref()) {
                    router.deliver(VnodeId(to), env);
                }
            }
            worker::Action::StartJob {
                job,
                hosted,
                starts,
                ..
            } => {
                let Some(p) = self.procs.get_mut(&id) else {
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
                    .map_err(|e| format!("worker {id}: cannot start the member: {e}"))?;
                p.member = Some((job, member, router));
            }
            worker::Action::Control { job, order } => {
                let stop = order == Control::Stop;
                let Some(p) = self.procs.get_mut(&id) else {
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
                        id,
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
                    return self.worker_event(id, worker::Event::JobEnded { job, result });
                }
            }
            worker::Action::AnswerProbe { job, round } => {
                let status = self
                    .procs
                    .get(&id)
                    .and_then(|p| p.member.as_ref())
                    .filter(|(j, _, _)| *j == job)
                    .map(|(_, m, _)| &**m.status());
                let msg = ToCoord::status(job, round, status);
                self.send(Node::Worker(id), Node::Coord, Frame::ToCoord(id, msg), true);
            }
            worker::Action::Exit(reason) => {
                self.note(&format!("worker {id} exits: {reason}"));
                self.kill(id, false);
            }
            worker::Action::Reconnect(reason) => {
                // The worker drops its coordinator; with no other coordinator here, the one
                // it knows refuses its rejoin (it was lost), so it ends as it would.
                self.note(&format!("worker {id} leaves the coordinator: {reason}"));
                self.kill(id, true);
            }
            worker::Action::Note(line) => self.note(&format!("worker {id}: {line}")),
        }
        Ok(())
    }

    /// A process ends: its memory is gone, and so are writes it had not pumped (rule 1).
    fn kill(&mut self, id: WorkerId, reset: bool) {
        let Some(p) = self.procs.get_mut(&id) else {
            return;
        };
        if p.dead {
            return;
        }
        p.dead = true;
        p.core = None;
        if p.member.take().is_some() {
            self.faults.writes_lost += 1;
        }
        if reset {
            self.send(Node::Worker(id), Node::Coord, Frame::WorkerClosed(id), true);
        }
    }

    fn deliver(&mut self, f: Frame) -> Result<(), String> {
        match f {
            Frame::ToCoord(from, msg) => {
                if self.procs.get(&from).is_some_and(|p| !p.dead)
                    || !matches!(msg, ToCoord::Heartbeat(_))
                {
                    self.note(&format!("w{from} -> c: {}", coord_line(&msg)));
                }
                self.coord_event(coordinator::Event::FromWorker { worker: from, msg });
            }
            Frame::WorkerClosed(w) => self.coord_event(coordinator::Event::Closed {
                worker: w,
                reason: "connection reset".into(),
            }),
            Frame::ToWorker(to, msg) => {
                if let ToWorker::Welcome { id, fd, .. } = &msg {
                    if let Some(p) = self.procs.get_mut(&to).filter(|p| !p.dead) {
                        p.core = Some(WorkerCore::new(*id, *fd, self.now));
                    }
                }
                self.note(&format!("c -> w{to}: {}", worker_line(&msg)));
                self.worker_event(to, worker::Event::FromCoord(msg))?;
            }
            Frame::CoordClosed(to) => {
                self.note(&format!("c closed w{to}"));
                if self.procs.get(&to).is_some_and(|p| !p.dead) {
                    self.kill(to, false);
                }
            }
            Frame::Peer(from, to, frame) => {
                self.worker_event(to, worker::Event::FromPeer { from, frame })?;
            }
        }
        Ok(())
    }

    fn running(&self, p: &Proc) -> bool {
        !p.dead && p.paused_until.map_or(true, |t| self.now >= t)
    }

    /// The members of the job alive and not paused (rule 3 keeps one).
    fn healthy_members(&self) -> Vec<WorkerId> {
        let members: Vec<WorkerId> = self
            .coord
            .map()
            .map(|m| {
                let mut h: Vec<WorkerId> = m.iter().map(|&(w, _)| w).collect();
                h.sort_unstable();
                h.dedup();
                h
            })
            .unwrap_or_default();
        let cut = |w: &WorkerId| {
            self.cuts
                .keys()
                .any(|(a, b)| *a == Node::Worker(*w) || *b == Node::Worker(*w))
        };
        members
            .into_iter()
            .filter(|w| self.procs.get(w).is_some_and(|p| self.running(p)) && !cut(w))
            .collect()
    }

    fn inject_faults(&mut self) {
        let q = QUANTUM.as_secs_f64();
        let f = self.cfg.faults.clone();
        // Rule 8: a checkpoint server crashes, one at a time, where the layout survives it.
        let rate = self.cfg.store.crash;
        if rate > 0.0 && !self.servers.any_unwell() && self.rng.gen_bool((rate * q).min(1.0)) {
            let i = self.rng.gen_range(0..self.servers.len());
            let in_flush = self.rng.gen_bool(0.5);
            let back = self.now + Duration::from_millis(self.rng.gen_range(2..30));
            self.faults.server_crashes += 1;
            self.note(&format!(
                "fault: crash server {i}{}",
                if in_flush { " in its next flush" } else { "" }
            ));
            self.servers.crash(i, in_flush);
            self.server_restarts.push((back, i));
        }
        let live: Vec<WorkerId> = self
            .procs
            .values()
            .filter(|p| self.running(p) && p.core.is_some())
            .map(|p| p.id)
            .collect();
        if live.is_empty() {
            return;
        }
        // A victim may be any live worker as long as another member stays healthy (rule 3),
        // judged after the faults already injected in this quantum.
        let pick = |w: &mut World, live: &[WorkerId]| -> Option<WorkerId> {
            let v = live[w.rng.gen_range(0..live.len())];
            w.healthy_members().iter().any(|&h| h != v).then_some(v)
        };
        // Behind the budget of `min_faults` over the planned safety phase: force one fault of
        // a kind drawn from the seed this quantum, so that a short run still meets it.
        let due = (self.cfg.min_faults as f64 * self.now.as_secs_f64()
            / self.cfg.safety.as_secs_f64().max(1e-9)) as u64;
        let forced = (self.faults.total() < due).then(|| self.rng.gen_range(0..3));
        if forced.is_some() {
            // When no victim can be spared, the next peer frame is lost instead.
            self.force_loss = true;
        }
        if forced == Some(0) || self.rng.gen_bool((f.crash * q).min(1.0)) {
            if let Some(v) = pick(self, &live) {
                let reset = self.rng.gen_bool(0.5);
                self.faults.crashes += 1;
                if reset {
                    self.faults.resets += 1;
                }
                self.note(&format!(
                    "fault: crash w{v} ({})",
                    if reset { "reset" } else { "silent" }
                ));
                self.kill(v, reset);
                let back = self.now + Duration::from_millis(self.rng.gen_range(5..50));
                self.restarts_due.push(back);
            }
        }
        if forced == Some(1) || self.rng.gen_bool((f.pause * q).min(1.0)) {
            if let Some(v) = pick(self, &live) {
                // Half of the pauses outlast the detector's bound: zombies.
                let bound = self.fd.interval + self.fd.timeout + self.fd.broken;
                let len = if self.rng.gen_bool(0.5) {
                    bound * 2 + Duration::from_millis(self.rng.gen_range(0..50))
                } else {
                    Duration::from_millis(self.rng.gen_range(1..10))
                };
                self.faults.pauses += 1;
                if len > bound {
                    self.faults.zombies += 1;
                }
                self.note(&format!("fault: pause w{v} for {len:?}"));
                if let Some(p) = self.procs.get_mut(&v) {
                    p.paused_until = Some(self.now + len);
                }
            }
        }
        if forced == Some(2) || self.rng.gen_bool((f.partition * q).min(1.0)) {
            if let Some(a) = pick(self, &live) {
                let other = if self.rng.gen_bool(0.5) {
                    Node::Coord
                } else {
                    Node::Worker(live[self.rng.gen_range(0..live.len())])
                };
                if other != Node::Worker(a) {
                    let len = Duration::from_millis(self.rng.gen_range(1..80));
                    let heal = self.now + len;
                    let dir = self.rng.gen_range(0..3);
                    if dir != 1 {
                        self.cuts.insert((Node::Worker(a), other), heal);
                    }
                    if dir != 0 {
                        self.cuts.insert((other, Node::Worker(a)), heal);
                    }
                    self.faults.partitions += 1;
                    self.note(&format!(
                        "fault: partition w{a} / {other:?} ({dir}) for {len:?}"
                    ));
                }
            }
        }
        if forced.is_some() && self.faults.total() < due {
            // No victim could be spared: clog one worker's link with the coordinator for less
            // than the detector's bound (a clogged link, restored), which any worker survives.
            let w = live[self.rng.gen_range(0..live.len())];
            let len = Duration::from_micros(
                self.rng
                    .gen_range(500..(self.fd.interval + self.fd.timeout).as_micros() as u64 / 2),
            );
            let (from, to) = if self.rng.gen_bool(0.5) {
                (Node::Worker(w), Node::Coord)
            } else {
                (Node::Coord, Node::Worker(w))
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
                self.join(true);
            }
            self.restart_servers(Some(now))?;
            // Deliveries due: to the coordinator at once; to a worker into its socket buffer,
            // which it reads while running, so a paused worker reads its frames later and in
            // their order (rule 2).
            while let Some(top) = self.net.peek() {
                if top.at > self.now {
                    break;
                }
                let f = self.net.pop().expect("peeked");
                let to = match &f.frame {
                    Frame::ToWorker(w, _) | Frame::CoordClosed(w) | Frame::Peer(_, w, _) => {
                        Some(*w)
                    }
                    _ => None,
                };
                match to.and_then(|w| self.procs.get_mut(&w)) {
                    Some(p) if !p.dead => p.inbox.push_back(f.frame),
                    Some(_) => {}
                    None => self.deliver(f.frame)?,
                }
            }
            let ids: Vec<WorkerId> = self.procs.keys().copied().collect();
            for id in ids {
                while self.procs.get(&id).is_some_and(|p| self.running(p)) {
                    let Some(frame) = self.procs.get_mut(&id).and_then(|p| p.inbox.pop_front())
                    else {
                        break;
                    };
                    self.deliver(frame)?;
                }
            }
            if now >= self.coord.next_deadline() {
                self.coord_event(coordinator::Event::Tick);
            }
            // Workers in an order drawn from the seed.
            let mut ids: Vec<WorkerId> = self.procs.keys().copied().collect();
            for i in (1..ids.len()).rev() {
                let j = self.rng.gen_range(0..=i);
                ids.swap(i, j);
            }
            for id in ids {
                let (running, due) = match self.procs.get(&id) {
                    Some(p) => (
                        self.running(p),
                        p.core.as_ref().is_some_and(|c| now >= c.next_deadline()),
                    ),
                    None => continue,
                };
                if !running {
                    continue;
                }
                if due {
                    self.worker_event(id, worker::Event::Tick)?;
                }
                self.step_member(id)?;
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

    /// Restarts the servers due by `by` (every one if `None`) and scrubs (rule 8).
    fn restart_servers(&mut self, by: Option<Duration>) -> Result<(), String> {
        let due: Vec<usize> = self
            .server_restarts
            .iter()
            .filter(|(t, _)| by.map_or(true, |by| *t <= by))
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

    fn step_member(&mut self, id: WorkerId) -> Result<(), String> {
        let pump = self.rng.gen_bool(self.cfg.faults.pump);
        let Some(p) = self.procs.get_mut(&id) else {
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
                id,
                worker::Event::JobEnded {
                    job,
                    result: Err(e.to_string()),
                },
            );
        }
        for (to, env) in out {
            self.worker_event(id, worker::Event::Outbound { to, env })?;
        }
        Ok(())
    }

    /// What a run that does not end waits for: each member's hosted vnodes and their work.
    fn diagnose(&self) -> String {
        let mut parts = Vec::new();
        for p in self.procs.values() {
            let state = if p.dead {
                "dead".to_string()
            } else if let Some((_, m, _)) = &p.member {
                let waits: Vec<String> = m.waits().iter().map(ToString::to_string).collect();
                format!("hosts [{}]", waits.join(" | "))
            } else {
                "idle".to_string()
            };
            parts.push(format!("w{} {state}", p.id));
        }
        format!("map {:?}; {}", self.coord.map(), parts.join("; "))
    }
}

fn client_line(m: &ToSubmit) -> String {
    match m {
        ToSubmit::Accepted { vnodes, .. } => format!("accepted ({vnodes} vnodes)"),
        ToSubmit::Progress { completed } => format!("progress {completed}"),
        ToSubmit::WorkerLost { worker, moved, .. } => format!("lost w{worker}, moved {moved:?}"),
        ToSubmit::Finished { tasks, .. } => format!("finished ({tasks} tasks)"),
        ToSubmit::Failed { error } => format!("failed: {error}"),
        ToSubmit::Takeover { coordinator } => format!("takeover by {coordinator}"),
        ToSubmit::Standby { .. } => "standby".into(),
    }
}

fn coord_line(m: &ToCoord) -> String {
    match m {
        ToCoord::Status { round, work, .. } => format!("status r{round} {work:?}"),
        ToCoord::Done { job, .. } => format!("done j{job}"),
        ToCoord::Failed { error, .. } => format!("failed: {error}"),
        ToCoord::Heartbeat(_) => "heartbeat".into(),
        ToCoord::Broken { worker } => format!("broken w{worker}"),
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

//! `cg run --mode spmd`: paper 002's model. P worker vnodes own row blocks and iterate in lock
//! step, exchanging what SpMV needs and reducing dot products; every C iterations their state
//! (x, r, p and the scalars) is encoded across K extra vnodes, in memory (diskless) or on a
//! store; a killed worker is replaced by a spare that re-reads its rows from the matrix source
//! and rebuilds its state from the encoding and the surviving workers' copies; all roll back to
//! that checkpoint and the solve goes on.
//!
//! What it reuses from the runtime: the transport (`InProcTransport`, `Endpoint`; SPMD messages
//! ride as bytes in `IterMsg::Halo`, see [`wire`]), [`VnodeId`](veriflow::VnodeId)s, and the
//! supervision pattern of iterative mode's embedded runner (`runtime/src/iterative/embedded.rs`:
//! one thread per vnode, a killed thread hands back its endpoint, whose inbox survives, and a
//! replacement takes it over with the next generation). Not iterative mode's `Block` trait: it
//! is made for halo iterations with local residuals and decentralized convergence detection,
//! while CG needs two global reductions per iteration and stops on a global test, so the
//! synchronous loop lives here.
//!
//! Vnodes: workers `0..P`, encoders `P..P+K`, the master (paper 002's master node: it commits
//! checkpoints and runs recoveries) `P+K`.
//!
//! Rules:
//!
//! 1. **Same bits as the other modes.** The rows are cut into B blocks ([`Partition`], kernel
//!    rule 1, `--blocks`), and worker w owns the contiguous blocks `Partition::new(B, P)
//!    .range(w)`. Every worker computes its blocks' partials with the kernel's lanes and every
//!    reduction is the ordered sum of all B partials (kernel rule 2), after an allgather of
//!    partials. So x and the iteration count are bit-identical to `kernel::solve` and to
//!    `--mode dataflow` with the same B, for any P ≤ B, with or without failures under an exact
//!    encoding.
//! 2. **SpMV exchange.** Each worker's *window* is the column range its rows touch (its own rows
//!    included); workers send the master their windows once, the master sends everyone the
//!    table, and at each iteration a worker sends each other worker the part of its p inside
//!    that worker's window. p lives in the window buffer, so no p is copied but halos.
//! 3. **Checkpoints.** At iterations C, 2C, ... (`--checkpoint-every C`), each worker writes its
//!    state in the kernel's exact layout ([`BlockState::to_bytes`]), keeps it (its *copy*), and
//!    sends it to every encoder. An encoder holds the parity of all P pieces (zero-padded to
//!    the longest): `checksum` XOR parity on one encoder, `rs:K` Reed-Solomon over GF(2^8) on K
//!    encoders (encoder j keeps parity piece j), `float-sum` the sum of the vectors on one
//!    encoder; in memory, or on `--store` (then its memory holds nothing). It reports to the
//!    master, which *commits* the checkpoint when all K have it; only then do workers and
//!    encoders drop the previous one. The initial state (iteration 0) needs no encoding: every
//!    worker rebuilds it from the matrix source.
//! 4. **Faults.** A kill (`--kill-worker W --kill-at-iteration I`, or seeded `--kill-random`)
//!    happens when worker W starts iteration I: its thread returns and all its memory is gone.
//!    Fault injection alone keeps aside the killed worker's copies, to measure the recovery
//!    error; recovery never reads them.
//! 5. **Generations.** The master, told of a death, starts generation g+1: it sends `Abort` to
//!    every live vnode and waits until each answered `Halted` or died too. Every message carries
//!    its generation; older ones are dropped. Messages between two vnodes arrive in order, and
//!    a vnode's inbox is one queue, so whatever was sent before the master's `Abort` (e.g. the
//!    last checkpoint's pieces) is handled first: a checkpoint whose pieces were all sent before
//!    a death is committed before the rollback is decided.
//! 6. **Recovery.** The lost workers are the dead ones and any replacement not yet rebuilt. If
//!    a checkpoint is committed and more are lost than the encoding rebuilds (checksum and
//!    float-sum: 1, rs:K: K), the run fails with [`SpmdError::TooManyFailures`]. Otherwise the
//!    master sends `Rollback` to the live vnodes and starts a spare per dead worker on its
//!    endpoint. Survivors restore their copy; a spare re-reads its rows from the source, fetches
//!    the survivors' copies and the encoders' parity, decodes its piece, keeps it as its copy,
//!    and reports `Recovered`. With no checkpoint committed yet, everyone restarts from the
//!    initial state (`--encoding none`: always).
//! 7. **End.** A worker whose CG test passes (or that reaches max_iter) sends the master its x
//!    and its last checkpoint; with all P in the same generation and that checkpoint committed
//!    (so the count of checkpoints does not depend on timing), the master stops every vnode. A breakdown or any
//!    protocol or store error is fatal and named.

pub(crate) mod coding;
mod encoder;
pub(crate) mod wire;
mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use veriflow::runtime::transport::{Endpoint, InProcTransport, Transport};
use veriflow::{Store, VnodeId};
use veriflow_checkpoint::erasure::{ErasureCode, ReedSolomonCode, XorParity};

use crate::dataflow::Solution;
use crate::kernel::{BlockState, CgError, Partition};
use crate::problem::{ProblemError, Rhs, Source};
use wire::Wire;

/// How checkpoints are encoded across the extra vnodes (rule 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// No checkpoints: a failure restarts the solve (rule 6).
    None,
    /// XOR parity on one extra vnode: exact, one loss.
    Checksum,
    /// Reed-Solomon over GF(2^8) on K extra vnodes: exact, K losses.
    ReedSolomon(u32),
    /// The sum of the vectors on one extra vnode, rebuilt by subtraction: one loss, not exact.
    FloatSum,
}

impl Encoding {
    /// Extra vnodes holding the encoding.
    pub fn encoders(self) -> usize {
        match self {
            Encoding::None => 0,
            Encoding::Checksum | Encoding::FloatSum => 1,
            Encoding::ReedSolomon(k) => k as usize,
        }
    }

    /// Workers lost at once that it rebuilds.
    pub fn tolerates(self) -> usize {
        self.encoders()
    }

    /// Whether a rebuilt state has the bits of the lost one.
    pub fn exact(self) -> bool {
        matches!(self, Encoding::Checksum | Encoding::ReedSolomon(_))
    }

    /// The erasure code of an exact encoding over `workers` pieces.
    pub(crate) fn code(self, workers: usize) -> Result<Option<Arc<dyn ErasureCode>>, SpmdError> {
        let bad = |e: veriflow_checkpoint::erasure::ErasureError| SpmdError::Config(e.to_string());
        Ok(match self {
            Encoding::Checksum => Some(Arc::new(XorParity::new(workers).map_err(bad)?)),
            Encoding::ReedSolomon(k) => Some(Arc::new(
                ReedSolomonCode::new(workers, k as usize).map_err(bad)?,
            )),
            Encoding::None | Encoding::FloatSum => None,
        })
    }
}

impl FromStr for Encoding {
    type Err = String;
    fn from_str(s: &str) -> Result<Encoding, String> {
        match s {
            "none" => Ok(Encoding::None),
            "checksum" => Ok(Encoding::Checksum),
            "float-sum" => Ok(Encoding::FloatSum),
            _ => match s.strip_prefix("rs:").map(str::parse::<u32>) {
                Some(Ok(k)) if (1..=255).contains(&k) => Ok(Encoding::ReedSolomon(k)),
                Some(_) => Err(format!("{s:?}: rs:K needs 1 <= K <= 255 extra vnodes")),
                None => Err(format!(
                    "{s:?} is not an encoding: checksum, rs:K, float-sum or none"
                )),
            },
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Encoding::None => f.write_str("none"),
            Encoding::Checksum => f.write_str("checksum"),
            Encoding::ReedSolomon(k) => write!(f, "rs:{k}"),
            Encoding::FloatSum => f.write_str("float-sum"),
        }
    }
}

/// A worker killed when it starts an iteration (rule 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kill {
    /// The worker.
    pub worker: u32,
    /// The iteration it is about to start.
    pub iteration: u64,
}

/// Parameters of an SPMD run.
#[derive(Clone)]
pub struct SpmdConfig {
    /// The matrix.
    pub source: Source,
    /// The known solution.
    pub rhs: Rhs,
    /// Stop when |r| <= rtol |b|.
    pub rtol: f64,
    /// Iteration cap [default 10 n].
    pub max_iter: Option<u64>,
    /// Row blocks B (rule 1).
    pub blocks: u32,
    /// Workers P (1 ≤ P ≤ B).
    pub workers: u32,
    /// Iterations between checkpoints (≥ 1; ignored with [`Encoding::None`]).
    pub checkpoint_every: u64,
    /// The encoding.
    pub encoding: Encoding,
    /// Where encoders keep their encoding (rule 3) instead of their memory.
    pub store: Option<Arc<dyn Store>>,
    /// Fault injection.
    pub kills: Vec<Kill>,
}

/// Why an SPMD run failed, grouped by what the caller should do.
#[derive(Debug, thiserror::Error)]
pub enum SpmdError {
    /// Bad parameters: fix the command line.
    #[error("{0}")]
    Config(String),
    /// The matrix could not be read (also by a spare).
    #[error(transparent)]
    Problem(#[from] ProblemError),
    /// CG broke down: the matrix is not SPD.
    #[error(transparent)]
    Cg(#[from] CgError),
    /// Rule 6: more workers lost at once than the encoding rebuilds.
    #[error(
        "{} workers lost at once ({lost:?}) but {encoding} rebuilds at most {tolerates}: \
         the checkpoint is gone and the run cannot go on",
        lost.len()
    )]
    TooManyFailures {
        /// The lost workers.
        lost: Vec<u32>,
        /// The encoding.
        encoding: Encoding,
        /// What it rebuilds.
        tolerates: usize,
    },
    /// The encoding could not be decoded.
    #[error("rebuilding a lost worker: {0}")]
    Decode(String),
    /// The store that holds the encoding failed.
    #[error("checkpoint store: {0}")]
    Store(String),
    /// A vnode reported a fatal error.
    #[error("{vnode}: {message}")]
    Remote {
        /// Who.
        vnode: VnodeId,
        /// What.
        message: String,
    },
    /// A message that does not fit the protocol, or a thread that could not start: a bug.
    #[error("spmd protocol: {0}")]
    Protocol(String),
}

/// What an SPMD run did.
#[derive(Clone, Debug)]
pub struct SpmdReport {
    /// The solution.
    pub solution: Solution,
    /// Workers P.
    pub workers: usize,
    /// Encoder vnodes K.
    pub encoders: usize,
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// The longest time a worker spent taking checkpoints (the run's path), seconds.
    pub checkpoint_s: f64,
    /// Time the encoders spent encoding (and storing), all summed, seconds.
    pub encode_s: f64,
    /// Bytes of one checkpoint's encoding, all encoders.
    pub encoding_bytes: u64,
    /// Bytes of one checkpoint's copies, all workers.
    pub state_bytes: u64,
    /// Workers killed.
    pub kills: u64,
    /// Recoveries done.
    pub recoveries: u64,
    /// From each death's notice to every lost state rebuilt, summed, seconds.
    pub recovery_s: f64,
    /// Iterations done again after rollbacks.
    pub iterations_redone: u64,
    /// Largest ‖rebuilt − lost‖ / ‖lost‖ over rebuilt states (0 for exact encodings).
    pub recovery_error: Option<f64>,
    /// Wall time, seconds.
    pub elapsed_s: f64,
}

/// What every vnode of a run knows.
pub(crate) struct Plan {
    pub(crate) source: Source,
    pub(crate) rhs: Rhs,
    pub(crate) rtol: f64,
    pub(crate) max_iter: u64,
    pub(crate) n: usize,
    pub(crate) blocks: Partition,
    pub(crate) owners: Partition,
    pub(crate) workers: usize,
    pub(crate) encoders: usize,
    pub(crate) master: usize,
    pub(crate) encoding: Encoding,
    pub(crate) code: Option<Arc<dyn ErasureCode>>,
    pub(crate) every: u64,
    pub(crate) store: Option<Arc<dyn Store>>,
}

impl Plan {
    /// Blocks of worker `w` (rule 1).
    pub(crate) fn blocks_of(&self, w: usize) -> Range<usize> {
        self.owners.range(w)
    }

    /// Rows of worker `w`.
    pub(crate) fn rows_of(&self, w: usize) -> Range<usize> {
        let b = self.blocks_of(w);
        self.blocks.range(b.start).start..self.blocks.range(b.end - 1).end
    }

    /// Bytes of worker `w`'s piece.
    pub(crate) fn piece_len(&self, w: usize) -> usize {
        BlockState::encoded_len(self.rows_of(w).len())
    }

    /// Rows of the largest block of rows.
    pub(crate) fn max_rows(&self) -> usize {
        (0..self.workers)
            .map(|w| self.rows_of(w).len())
            .max()
            .unwrap_or(0)
    }

    pub(crate) fn workers_and_encoders(&self) -> Range<usize> {
        0..self.workers + self.encoders
    }
}

/// How a vnode thread ended.
pub(crate) enum Exit {
    Stopped,
    /// Rule 4: killed at `at`; `copies` only for measuring the recovery error.
    Killed {
        at: u64,
        copies: Vec<(u64, Vec<u8>)>,
    },
    Failed(SpmdError),
}

type ExitMsg = (usize, Exit, Option<Box<dyn Endpoint>>);

fn unknowns(source: &Source) -> Result<usize, SpmdError> {
    use crate::matrix::poisson::Grid;
    let grid = match source {
        Source::Poisson2d(s) => Some(Grid::D2(*s)),
        Source::Poisson3d(s) => Some(Grid::D3(*s)),
        Source::File { .. } => None,
    };
    match grid {
        Some(g) => g
            .unknowns()
            .ok_or_else(|| SpmdError::Config(format!("{source}: too many unknowns"))),
        None => {
            let a = source.matrix()?;
            if a.n_rows != a.n_cols {
                return Err(SpmdError::Config(format!(
                    "{source}: CG needs a square matrix"
                )));
            }
            Ok(a.n_rows)
        }
    }
}

impl SpmdConfig {
    fn plan(&self) -> Result<Plan, SpmdError> {
        let n = unknowns(&self.source)?;
        let (b, p) = (self.blocks as usize, self.workers as usize);
        if p == 0 || p > b {
            return Err(SpmdError::Config(format!(
                "{p} workers for {b} blocks: each worker owns at least one block, so give \
                 --vnodes P with 1 <= P <= --blocks"
            )));
        }
        if b > n {
            return Err(SpmdError::Config(format!(
                "--blocks {b}: the matrix has only {n} rows"
            )));
        }
        if self.encoding != Encoding::None && self.checkpoint_every == 0 {
            return Err(SpmdError::Config(
                "--checkpoint-every must be at least 1".into(),
            ));
        }
        if !(self.rtol.is_finite() && self.rtol >= 0.0) {
            return Err(SpmdError::Config(format!(
                "--rtol {}: a tolerance is a finite number >= 0",
                self.rtol
            )));
        }
        if let Some(k) = self.kills.iter().find(|k| k.worker as usize >= p) {
            return Err(SpmdError::Config(format!(
                "--kill-worker {}: the run has {p} workers",
                k.worker
            )));
        }
        let encoders = self.encoding.encoders();
        if p + encoders + 1 > u32::MAX as usize {
            return Err(SpmdError::Config("too many vnodes".into()));
        }
        Ok(Plan {
            source: self.source.clone(),
            rhs: self.rhs,
            rtol: self.rtol,
            max_iter: self
                .max_iter
                .unwrap_or_else(|| 10u64.saturating_mul(n as u64)),
            n,
            blocks: Partition::new(n, b),
            owners: Partition::new(b, p),
            workers: p,
            encoders,
            master: p + encoders,
            encoding: self.encoding,
            code: self.encoding.code(p)?,
            every: if self.encoding == Encoding::None {
                0
            } else {
                self.checkpoint_every
            },
            store: self.store.clone(),
        })
    }
}

/// Where the master is in rule 5-6's cycle.
#[derive(Debug, PartialEq)]
enum Phase {
    /// Waiting for every worker's window.
    Starting,
    Running,
    /// Abort sent; waiting for these vnodes to answer or die.
    Halting(BTreeSet<usize>),
    /// Rollback sent; waiting for the lost workers' Recovered.
    Recovering,
}

struct Finished {
    k: u64,
    rho: f64,
    converged: bool,
    x: Vec<f64>,
    checkpoint_ns: u64,
    last_stamp: u64,
}

/// The master vnode (rules 3, 5-7).
struct Master {
    plan: Arc<Plan>,
    ep: Box<dyn Endpoint>,
    exit_tx: mpsc::Sender<ExitMsg>,
    handles: Vec<JoinHandle<()>>,
    g: u64,
    phase: Phase,
    windows: Vec<Option<(u64, u64)>>,
    table: Vec<(u64, u64)>,
    alive: Vec<bool>,
    dead: BTreeSet<usize>,
    unrecovered: BTreeSet<usize>,
    endpoints: HashMap<usize, Box<dyn Endpoint>>,
    truth: HashMap<usize, Vec<(u64, Vec<u8>)>>,
    kills_left: Vec<Vec<u64>>,
    committed: u64,
    encoded: BTreeMap<u64, (usize, u64)>,
    done: BTreeMap<usize, Finished>,
    fail: Option<(Instant, u64)>,
    threads: usize,
    report: SpmdReport,
}

/// Runs the solve (module rules 1-7).
pub fn run(cfg: &SpmdConfig) -> Result<SpmdReport, SpmdError> {
    let plan = Arc::new(cfg.plan()?);
    let total = plan.workers + plan.encoders + 1;
    let transport = InProcTransport::new(total as u32);
    let ep = |v: usize| {
        transport
            .endpoint(VnodeId(v as u32))
            .map_err(|e| SpmdError::Protocol(e.to_string()))
    };
    let (exit_tx, exit_rx) = mpsc::channel::<ExitMsg>();
    let mut kills_left = vec![Vec::new(); plan.workers];
    for k in &cfg.kills {
        kills_left[k.worker as usize].push(k.iteration);
    }
    let start = Instant::now();
    let mut m = Master {
        plan: plan.clone(),
        ep: ep(plan.master)?,
        exit_tx,
        handles: Vec::new(),
        g: 0,
        phase: Phase::Starting,
        windows: vec![None; plan.workers],
        table: Vec::new(),
        alive: vec![false; plan.workers + plan.encoders],
        dead: BTreeSet::new(),
        unrecovered: BTreeSet::new(),
        endpoints: HashMap::new(),
        truth: HashMap::new(),
        kills_left,
        committed: 0,
        encoded: BTreeMap::new(),
        done: BTreeMap::new(),
        fail: None,
        threads: 0,
        report: SpmdReport {
            solution: Solution {
                x: Vec::new(),
                iterations: 0,
                rho: 0.0,
                converged: false,
            },
            workers: plan.workers,
            encoders: plan.encoders,
            checkpoints: 0,
            checkpoint_s: 0.0,
            encode_s: 0.0,
            encoding_bytes: 0,
            state_bytes: (0..plan.workers).map(|w| plan.piece_len(w) as u64).sum(),
            kills: 0,
            recoveries: 0,
            recovery_s: 0.0,
            iterations_redone: 0,
            recovery_error: None,
            elapsed_s: 0.0,
        },
    };
    let mut outcome = Ok(());
    for w in 0..plan.workers {
        let e = ep(w);
        outcome = outcome.and_then(|()| m.spawn_worker(w, worker::Start::Fresh, e?));
    }
    for j in 0..plan.encoders {
        let v = plan.workers + j;
        let e = ep(v);
        outcome = outcome.and_then(|()| m.spawn_encoder(v, e?));
    }
    let outcome = outcome.and_then(|()| m.drive(&exit_rx));
    // Stop everything still running, whatever happened.
    for v in plan.workers_and_encoders() {
        if m.alive[v] {
            let _ = wire::send(&mut *m.ep, v, &Wire::Stop, Vec::new());
        }
    }
    while m.threads > 0 {
        match exit_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(_) => m.threads -= 1,
            Err(_) => break,
        }
    }
    let panicked = m
        .handles
        .drain(..)
        .map(JoinHandle::join)
        .filter(Result::is_err)
        .count();
    outcome?;
    if panicked > 0 {
        return Err(SpmdError::Protocol(format!(
            "{panicked} vnode thread(s) panicked"
        )));
    }
    m.report.elapsed_s = start.elapsed().as_secs_f64();
    Ok(m.report)
}

impl Master {
    fn spawn_worker(
        &mut self,
        w: usize,
        start: worker::Start,
        ep: Box<dyn Endpoint>,
    ) -> Result<(), SpmdError> {
        let (plan, tx, kills) = (
            self.plan.clone(),
            self.exit_tx.clone(),
            self.kills_left[w].clone(),
        );
        self.spawn(format!("cg-spmd-w{w}"), w, move || {
            let (exit, ep) = worker::run(plan, w, start, kills, ep);
            let _ = tx.send((w, exit, ep));
        })
    }

    fn spawn_encoder(&mut self, v: usize, ep: Box<dyn Endpoint>) -> Result<(), SpmdError> {
        let (plan, tx) = (self.plan.clone(), self.exit_tx.clone());
        self.spawn(format!("cg-spmd-e{v}"), v, move || {
            let (exit, ep) = encoder::run(plan, v, ep);
            let _ = tx.send((v, exit, ep));
        })
    }

    fn spawn(
        &mut self,
        name: String,
        v: usize,
        body: impl FnOnce() + Send + 'static,
    ) -> Result<(), SpmdError> {
        let tx = self.exit_tx.clone();
        let h = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                // A panic is a bug; the master must still hear of the thread's end.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
                    let _ = tx.send((
                        v,
                        Exit::Failed(SpmdError::Protocol(format!("v{v} panicked"))),
                        None,
                    ));
                }
            })
            .map_err(|e| SpmdError::Protocol(format!("cannot start a thread: {e}")))?;
        self.handles.push(h);
        self.threads += 1;
        self.alive[v] = true;
        Ok(())
    }

    fn send(&mut self, to: usize, w: &Wire) -> Result<(), SpmdError> {
        wire::send(&mut *self.ep, to, w, Vec::new())
    }

    fn send_live(&mut self, w: &Wire, workers_only: bool) -> Result<(), SpmdError> {
        let n = if workers_only {
            self.plan.workers
        } else {
            self.plan.workers + self.plan.encoders
        };
        for v in 0..n {
            if self.alive[v] {
                self.send(v, w)?;
            }
        }
        Ok(())
    }

    fn drive(&mut self, exits: &mpsc::Receiver<ExitMsg>) -> Result<(), SpmdError> {
        loop {
            while let Ok((v, exit, ep)) = exits.try_recv() {
                self.threads -= 1;
                self.on_exit(v, exit, ep)?;
            }
            if let Some(msg) = wire::recv(&mut *self.ep, Duration::from_millis(2)) {
                let (from, w, bulk) = msg?;
                self.on_msg(from, w, bulk)?;
            }
            if matches!(&self.phase, Phase::Halting(w) if w.is_empty()) {
                self.recover()?;
            }
            let last = self.done.values().map(|f| f.last_stamp).max().unwrap_or(0);
            if self.phase == Phase::Running
                && self.done.len() == self.plan.workers
                && self.committed >= last
            {
                return self.finish();
            }
            if self.threads == 0 {
                return Err(SpmdError::Protocol("every vnode thread has ended".into()));
            }
        }
    }

    fn on_exit(
        &mut self,
        v: usize,
        exit: Exit,
        ep: Option<Box<dyn Endpoint>>,
    ) -> Result<(), SpmdError> {
        self.alive[v] = false;
        match exit {
            Exit::Stopped => Err(SpmdError::Protocol(format!("v{v} stopped early"))),
            Exit::Failed(e) => Err(e),
            Exit::Killed { at, copies } => {
                let ep = ep.ok_or_else(|| SpmdError::Protocol("a lost endpoint".into()))?;
                self.endpoints.insert(v, ep);
                if let Some(i) = self.kills_left[v].iter().position(|&k| k == at) {
                    self.kills_left[v].remove(i);
                }
                self.report.kills += 1;
                self.truth.insert(v, copies);
                self.dead.insert(v);
                self.unrecovered.remove(&v);
                let now = Instant::now();
                self.fail = Some(match self.fail {
                    Some((t, i)) => (t, i.max(at)),
                    None => (now, at),
                });
                self.halt()
            }
        }
    }

    /// Rule 5.
    fn halt(&mut self) -> Result<(), SpmdError> {
        if let Phase::Halting(waiting) = &mut self.phase {
            for d in &self.dead {
                waiting.remove(d);
            }
            return Ok(());
        }
        self.g += 1;
        self.done.clear();
        let g = self.g;
        self.send_live(&Wire::Abort { g }, false)?;
        let waiting = self
            .plan
            .workers_and_encoders()
            .filter(|&v| self.alive[v])
            .collect();
        self.phase = Phase::Halting(waiting);
        Ok(())
    }

    /// Rule 6.
    fn recover(&mut self) -> Result<(), SpmdError> {
        let stamp = self.committed;
        let lost: BTreeSet<usize> = self.dead.union(&self.unrecovered).copied().collect();
        let lost_ids: Vec<u32> = lost.iter().map(|&w| w as u32).collect();
        if stamp > 0 && lost.len() > self.plan.encoding.tolerates() {
            return Err(SpmdError::TooManyFailures {
                lost: lost_ids,
                encoding: self.plan.encoding,
                tolerates: self.plan.encoding.tolerates(),
            });
        }
        if let Some((_, at)) = self.fail {
            self.report.iterations_redone += at.saturating_sub(stamp);
        }
        let g = self.g;
        self.send_live(
            &Wire::Rollback {
                g,
                stamp,
                lost: lost_ids.clone(),
            },
            false,
        )?;
        let dead: Vec<usize> = self.dead.iter().copied().collect();
        for w in dead {
            let ep = self
                .endpoints
                .remove(&w)
                .ok_or_else(|| SpmdError::Protocol(format!("no endpoint for w{w}")))?;
            let start = worker::Start::Spare {
                g,
                stamp,
                lost: lost_ids.clone(),
                table: self.table.clone(),
            };
            self.spawn_worker(w, start, ep)?;
        }
        self.dead.clear();
        self.unrecovered = lost;
        self.phase = Phase::Recovering;
        Ok(())
    }

    fn on_msg(&mut self, from: usize, w: Wire, bulk: Vec<u8>) -> Result<(), SpmdError> {
        match w {
            Wire::Window { lo, hi } if from < self.plan.workers => {
                self.windows[from] = Some((lo, hi));
                if self.phase == Phase::Starting && self.windows.iter().all(Option::is_some) {
                    self.table = self.windows.iter().flatten().copied().collect();
                    let t = Wire::Table {
                        windows: self.table.clone(),
                    };
                    self.send_live(&t, true)?;
                    self.phase = Phase::Running;
                }
            }
            Wire::Encoded {
                g,
                stamp,
                bytes,
                encode_ns,
            } => {
                // Rule 5: an encoding finished before the Abort still counts.
                let current =
                    g == self.g || (matches!(self.phase, Phase::Halting(_)) && g + 1 == self.g);
                self.report.encode_s += encode_ns as f64 * 1e-9;
                if current && stamp > self.committed {
                    let e = self.encoded.entry(stamp).or_insert((0, 0));
                    e.0 += 1;
                    e.1 += bytes;
                    if e.0 == self.plan.encoders {
                        self.report.encoding_bytes = e.1;
                        self.committed = stamp;
                        self.report.checkpoints += 1;
                        self.encoded = self.encoded.split_off(&(stamp + 1));
                        self.send_live(&Wire::Commit { stamp }, false)?;
                    }
                }
            }
            Wire::Halted { g } => {
                if let Phase::Halting(waiting) = &mut self.phase {
                    if g == self.g {
                        waiting.remove(&from);
                    }
                }
            }
            Wire::Recovered { g, stamp } if g == self.g => {
                if let Some(copies) = self.truth.get(&from) {
                    if let Some((_, t)) = copies.iter().find(|(s, _)| *s == stamp) {
                        let e = coding::relative_error(&bulk, t);
                        let worst = self.report.recovery_error.map_or(e, |w| w.max(e));
                        self.report.recovery_error = Some(worst);
                    }
                }
                self.unrecovered.remove(&from);
                if self.unrecovered.is_empty() && self.phase == Phase::Recovering {
                    if let Some((t, _)) = self.fail.take() {
                        self.report.recovery_s += t.elapsed().as_secs_f64();
                    }
                    self.report.recoveries += 1;
                    self.truth.clear();
                    self.phase = Phase::Running;
                }
            }
            Wire::Done {
                g,
                k,
                rho,
                converged,
                checkpoint_ns,
                last_stamp,
            } if g == self.g && from < self.plan.workers => {
                let x = wire::bytes_f64(&bulk)?;
                self.done.insert(
                    from,
                    Finished {
                        k,
                        rho,
                        converged,
                        x,
                        checkpoint_ns,
                        last_stamp,
                    },
                );
            }
            Wire::Failed { message } => {
                return Err(SpmdError::Remote {
                    vnode: VnodeId(from as u32),
                    message,
                })
            }
            // Stale generations, late answers: nothing to do.
            _ => {}
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SpmdError> {
        let first = self
            .done
            .values()
            .next()
            .ok_or_else(|| SpmdError::Protocol("no worker finished".into()))?;
        let (k, rho) = (first.k, first.rho);
        let mut x = Vec::with_capacity(self.plan.n);
        let mut ckpt = 0u64;
        for (w, f) in &self.done {
            if f.k != k
                || f.rho.to_bits() != rho.to_bits()
                || f.x.len() != self.plan.rows_of(*w).len()
            {
                return Err(SpmdError::Protocol(format!(
                    "w{w} finished at iteration {} with rho {:e} and {} rows; w0 at {k} with {rho:e}",
                    f.k,
                    f.rho,
                    f.x.len()
                )));
            }
            x.extend_from_slice(&f.x);
            ckpt = ckpt.max(f.checkpoint_ns);
        }
        let converged = self.done.values().all(|f| f.converged);
        self.report.solution = Solution {
            x,
            iterations: k,
            rho,
            converged,
        };
        self.report.checkpoint_s = ckpt as f64 * 1e-9;
        Ok(())
    }
}

//! Running a program: the [`Runtime`], its builder, and the drivers that step the vnodes.
//!
//! Rules:
//!
//! 1. A run has V vnodes (default: one per thread) and a rayon pool of T threads. Each of
//!    min(T, V) drivers owns a fixed share of the vnodes (vnode v goes to driver v mod T) and
//!    steps them in turn, so a vnode is only ever touched by one thread and its graph needs no
//!    lock. Threads beyond V stay in the pool for rayon work inside task bodies. A driver lets
//!    a vnode steal (idle, or asking ahead before its last ready task) only when none of its
//!    other vnodes has a ready task (`vnode.rs` rule 2: the thread is the capacity, not the
//!    vnode).
//! 2. The root task is declared on vnode 0 by the program (parent `None`), after the program
//!    inputs are logged there as `Input` events. Its outputs are the terminal outputs S, pinned
//!    on vnode 0; any vnode may steal the root, and its outputs then come home as `Returned`.
//! 3. Vnodes talk only through the [`Transport`](crate::transport::Transport); each has its
//!    own seeded RNG (from the run seed and its id) and reads time from the run's
//!    [`Clock`](crate::Clock).
//! 4. The run ends when every task has completed: each vnode keeps a work counter (live tasks
//!    plus obligations: grants not yet acknowledged, outputs not yet returned or acknowledged,
//!    events logged and not durable yet: `vnode.rs` rule 7),
//!    raised before the matching decrease happens anywhere. An idle driver scans all counters
//!    twice; all zero and unchanged means the run is over (`shared.rs`). A vnode lowers its
//!    own completions late, never early: by the end of its step (`core.rs` rule 8), so a
//!    counter is never below its vnode's work.
//! 5. The first error (a task's, the log's, or an internal one) stops every driver; the run
//!    returns it. A panic in a task is caught where it runs (rayon's pool stays healthy); a
//!    panic in the runtime itself is caught per driver and reported as an internal error.
//! 6. At the end every vnode's log is synced, so the log holds every event of the run, and the
//!    manifest records the outcome.
//! 7. A [`StopToken`] given to the builder stops the run early when stopped: each driver
//!    finishes the step it is in (at most `STEP_BUDGET` tasks per vnode; a running task is
//!    never cut) and starts no more; the logs are synced as in rule 6, so their durable
//!    watermarks cover every event logged; the manifest says `Interrupted`, and the run returns
//!    [`RunError::Interrupted`]. `Runtime::resume` finishes it from the logs as it would after a
//!    crash. A token stopped once the run is over changes nothing.

pub(crate) mod core;
pub(crate) mod forge;
mod member;
mod recover;
mod shared;
mod vnode;
mod waits;
mod worth;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::ChaCha8Rng;
use rand::SeedableRng;
use veriflow_checkpoint::Store;

use self::core::Core;
pub use self::forge::{Forge, ForgeMode};
pub use self::member::{Control, Member, MemberReport, MemberStatus, SteppedMember};
use self::recover::{plant_root, RecoveryContext, RootSetup};
use self::shared::RunShared;
pub use self::shared::{work_units, Kill, StopToken};
use self::vnode::Vnode;
pub use self::vnode::{Timers, VnodeStats, STEAL_BACKOFF_SCALE_MAX};
pub use self::waits::{Stall, VnodeWaits};
use crate::clock::{Clock, SystemClock};
use crate::codec;
use crate::error::{panic_message, RunError};
use crate::ids::{DataId, TaskId, VnodeId};
use crate::log::{CommitPolicy, LogWriter, Manifest, RunStatus, DEFAULT_CHECKPOINT_BYTES};
use crate::task::{InputSet, OutputSet, Registry, Task};
use crate::transport::{InProcTransport, Transport};

/// Tasks a vnode runs before its driver looks at its other vnodes, the termination test and a
/// request to stop (rule 7).
const STEP_BUDGET: usize = 256;
/// How long an idle driver with one vnode blocks on its inbox before looking again.
const IDLE_WAIT: Duration = Duration::from_millis(1);
/// How long an idle driver with several vnodes sleeps: it cannot block on one inbox.
const IDLE_WAIT_SHARED: Duration = Duration::from_micros(50);
/// Most vnodes a run may have: far above any useful count in one process, low enough that a
/// typo (`--vnodes 1000000`) is an error instead of a memory hog.
pub const MAX_VNODES: u32 = 4096;

/// Progress callback: called with the number of tasks completed so far.
pub type ProgressFn = Arc<dyn Fn(u64) + Send + Sync>;

/// Builds a [`Runtime`] (validated by [`RuntimeBuilder::build`]).
pub struct RuntimeBuilder {
    registry: Registry,
    program: String,
    threads: Option<usize>,
    vnodes: Option<u32>,
    seed: u64,
    store: Option<Arc<dyn Store>>,
    checkpoint: bool,
    policy: CommitPolicy,
    clock: Option<Arc<dyn Clock>>,
    progress: Option<ProgressFn>,
    transport: Option<TransportFactory>,
    timers: Timers,
    kills: Vec<Kill>,
    forge: Option<Forge>,
    stall: Stall,
    checkpoint_every: u64,
    stop: Option<StopToken>,
}

/// Makes the transport of one run for a number of vnodes (each run needs fresh endpoints).
pub type TransportFactory = Arc<dyn Fn(u32) -> Box<dyn Transport> + Send + Sync>;

impl RuntimeBuilder {
    /// A builder for programs made of the tasks in `registry`.
    pub fn new(registry: Registry) -> Self {
        RuntimeBuilder {
            registry,
            program: "veriflow".to_string(),
            threads: None,
            vnodes: None,
            seed: 0,
            store: None,
            checkpoint: true,
            policy: CommitPolicy::default(),
            clock: None,
            progress: None,
            transport: None,
            timers: Timers::default(),
            kills: Vec::new(),
            forge: None,
            stall: Stall::default(),
            checkpoint_every: DEFAULT_CHECKPOINT_BYTES,
            stop: None,
        }
    }

    /// Lets `token` stop the runs of this runtime early (rule 7): a command line stops on
    /// Ctrl-C this way, with a log that `resume` finishes.
    pub fn stop_token(mut self, token: StopToken) -> Self {
        self.stop = Some(token);
        self
    }

    /// Bytes of log between two recovery checkpoints of a vnode (`log/mod.rs` rule 9; default
    /// [`DEFAULT_CHECKPOINT_BYTES`]). 0 writes none: recovery then reads whole logs (for
    /// comparison: memory and recovery time then grow with the log).
    pub fn checkpoint_every(mut self, bytes: u64) -> Self {
        self.checkpoint_every = bytes;
        self
    }

    /// When a run that stops progressing reports what its vnodes wait for, and whether that
    /// ends it (`waits.rs` rule 1; default: a warning after 30 s).
    pub fn stall(mut self, stall: Stall) -> Self {
        self.stall = stall;
        self
    }

    /// Fault injection: each `Kill` makes a vnode fail (all its memory lost) once that many
    /// tasks have completed in the run; it is then recovered from its log (`recover.rs`).
    /// A failure that is due is always injected before the run ends, even on an idle vnode;
    /// one planned beyond the run's last task never happens. Needs a store.
    pub fn kills(mut self, kills: Vec<Kill>) -> Self {
        self.kills = kills;
        self
    }

    /// Makes some tasks lie (forgery injection, `forge.rs`): for the certifier's tests and
    /// demos.
    pub fn forge(mut self, forge: Forge) -> Self {
        self.forge = Some(forge);
        self
    }

    /// The transport between vnodes (default: in-process channels). Tests use it to lose,
    /// delay and duplicate messages.
    pub fn transport(mut self, factory: TransportFactory) -> Self {
        self.transport = Some(factory);
        self
    }

    /// The protocol's timers.
    pub fn timers(mut self, timers: Timers) -> Self {
        self.timers = timers;
        self
    }

    /// Program name (part of the root's id and of the manifest).
    pub fn program(mut self, name: impl Into<String>) -> Self {
        self.program = name.into();
        self
    }

    /// Worker threads (default: available parallelism).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n);
        self
    }

    /// Virtual nodes (default: one per thread).
    pub fn vnodes(mut self, n: u32) -> Self {
        self.vnodes = Some(n);
        self
    }

    /// Seed of the vnodes' RNGs (victim choice).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Stable storage for the event logs. Without one, nothing is logged.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Whether to log at all (`false`: the S0 baseline, even with a store).
    pub fn checkpoint(mut self, on: bool) -> Self {
        self.checkpoint = on;
        self
    }

    /// Group-commit policy of the logs.
    pub fn commit_policy(mut self, policy: CommitPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The clock (default: the system's monotonic clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Called about every 100 ms during a run with the tasks completed so far.
    pub fn on_progress(mut self, f: ProgressFn) -> Self {
        self.progress = Some(f);
        self
    }

    /// Checks the settings and starts the thread pool.
    pub fn build(self) -> Result<Runtime, RunError> {
        let threads = match self.threads {
            Some(0) => return Err(RunError::Config("threads must be at least 1".to_string())),
            Some(t) => t,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let vnodes = match self.vnodes {
            Some(0) => return Err(RunError::Config("vnodes must be at least 1".to_string())),
            Some(v) if v > MAX_VNODES => {
                return Err(RunError::Config(format!(
                    "vnodes must be at most {MAX_VNODES}"
                )))
            }
            Some(v) => v,
            None => u32::try_from(threads).unwrap_or(MAX_VNODES).min(MAX_VNODES),
        };
        if !self.kills.is_empty() && (self.store.is_none() || !self.checkpoint) {
            return Err(RunError::Config(
                "failures can only be injected into a run that logs (it recovers from the log)"
                    .to_string(),
            ));
        }
        if let Some(k) = self.kills.iter().find(|k| k.vnode.0 >= vnodes) {
            return Err(RunError::Config(format!(
                "cannot fail {}: the run has {vnodes} vnodes",
                k.vnode
            )));
        }
        if let Some(f) = &self.forge {
            if !(0.0..=1.0).contains(&f.rate) {
                return Err(RunError::Config(format!(
                    "forgery rate must be between 0 and 1, not {}",
                    f.rate
                )));
            }
            if let Some(v) = f.vnodes.iter().find(|v| v.0 >= vnodes) {
                return Err(RunError::Config(format!(
                    "cannot make {v} lie: the run has {vnodes} vnodes"
                )));
            }
        }
        if self.policy.max_bytes == 0 {
            return Err(RunError::Config(
                "commit batch size must be positive".to_string(),
            ));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("veriflow-{i}"))
            .build()
            .map_err(|e| RunError::Config(format!("cannot start {threads} threads: {e}")))?;
        Ok(Runtime {
            registry: Arc::new(self.registry),
            program: self.program,
            threads,
            vnodes,
            seed: self.seed,
            store: if self.checkpoint { self.store } else { None },
            policy: self.policy,
            clock: self
                .clock
                .unwrap_or_else(|| Arc::new(SystemClock::default())),
            progress: self.progress,
            transport: self.transport,
            timers: self.timers,
            kills: self.kills,
            forge: self.forge,
            stall: self.stall,
            checkpoint_every: self.checkpoint_every,
            stop: self.stop,
            pool,
        })
    }
}

/// What a finished run produced.
#[derive(Debug, Clone)]
pub struct RunReport<O> {
    /// The root's outputs: the terminal outputs S.
    pub outputs: O,
    /// Root task id.
    pub root: TaskId,
    /// Ids of the terminal outputs.
    pub terminal: Vec<DataId>,
    /// Tasks completed.
    pub tasks: u64,
    /// Events logged (0 without a log).
    pub events: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Per-vnode counts.
    pub vnodes: Vec<VnodeStats>,
    /// Tasks that lied (forgery injection), with the vnode that ran them, in completion order.
    pub forged: Vec<(TaskId, VnodeId)>,
}

/// A configured runtime: runs programs, one at a time.
pub struct Runtime {
    registry: Arc<Registry>,
    program: String,
    threads: usize,
    vnodes: u32,
    seed: u64,
    store: Option<Arc<dyn Store>>,
    policy: CommitPolicy,
    clock: Arc<dyn Clock>,
    progress: Option<ProgressFn>,
    transport: Option<TransportFactory>,
    timers: Timers,
    kills: Vec<Kill>,
    forge: Option<Forge>,
    stall: Stall,
    checkpoint_every: u64,
    stop: Option<StopToken>,
    pool: rayon::ThreadPool,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("program", &self.program)
            .field("threads", &self.threads)
            .field("vnodes", &self.vnodes)
            .field("store", &self.store.as_ref().map(|s| s.describe()))
            .finish()
    }
}

impl Runtime {
    /// A builder.
    pub fn builder(registry: Registry) -> RuntimeBuilder {
        RuntimeBuilder::new(registry)
    }

    /// Number of vnodes.
    pub fn vnodes(&self) -> u32 {
        self.vnodes
    }

    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Runs `root` on `inputs` to completion and returns its outputs (rules 2-6).
    pub fn run<T: Task>(
        &self,
        root: T,
        inputs: T::Inputs,
    ) -> Result<RunReport<T::Outputs>, RunError> {
        self.start(root, inputs, false)
    }

    /// Finishes a run whose process died, from the logs in the store (`recover.rs`): every
    /// vnode is rebuilt from its log, completed tasks are not run again. `root` and `inputs`
    /// must be those of the interrupted run (checked against its manifest).
    pub fn resume<T: Task>(
        &self,
        root: T,
        inputs: T::Inputs,
    ) -> Result<RunReport<T::Outputs>, RunError> {
        self.start(root, inputs, true)
    }

    /// The root, its inputs and terminal outputs with their ids, and the run's manifest.
    fn prepare<T: Task>(
        &self,
        root: T,
        inputs: T::Inputs,
    ) -> Result<(RootSetup, Manifest), RunError> {
        if !self.registry.contains::<T>() {
            return Err(RunError::UnregisteredTask {
                name: T::NAME.to_string(),
            });
        }
        let root_args = codec::encode(&root).map_err(|e| RunError::Encode {
            what: format!("arguments of root task {}", T::NAME),
            reason: e.to_string(),
        })?;
        let root_id = TaskId::root(&self.program, &root_args);
        let input_values = inputs.into_values();
        let input_ids: Vec<DataId> = (0..input_values.len())
            .map(|i| DataId::program_input(root_id, index_u32(i)))
            .collect();
        let terminal: Vec<DataId> = (0..T::Outputs::LEN)
            .map(|i| DataId::output(root_id, index_u32(i)))
            .collect();
        let manifest = Manifest {
            program: self.program.clone(),
            root: root_id,
            root_name: T::NAME.to_string(),
            root_args: root_args.clone(),
            inputs: input_ids.clone(),
            terminal: terminal.clone(),
            vnodes: self.vnodes,
            seed: self.seed,
            status: RunStatus::Running,
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            generation: 0,
        };
        let setup = RootSetup {
            id: root_id,
            name: T::NAME.to_string(),
            args: root_args,
            inputs: input_ids.into_iter().zip(input_values).collect(),
            terminal,
        };
        Ok((setup, manifest))
    }

    fn start<T: Task>(
        &self,
        root: T,
        inputs: T::Inputs,
        resume: bool,
    ) -> Result<RunReport<T::Outputs>, RunError> {
        let started = Instant::now();
        let (setup, mut manifest) = self.prepare(root, inputs)?;
        let root_id = setup.id;
        let terminal = setup.terminal.clone();
        let writer = match &self.store {
            Some(store) => {
                match (Manifest::load(&**store)?, resume) {
                    (Some(_), false) => {
                        return Err(RunError::Config(format!(
                            "{} already holds a run: give a fresh log directory (or resume it)",
                            store.describe()
                        )))
                    }
                    (None, true) => {
                        // A log whose manifest is gone is damage, not a directory without a
                        // run: resuming it is refused as such (found by the damage campaign,
                        // `delete-key` of a finished run's manifest).
                        let limit = veriflow_checkpoint::PageLimit {
                            max_keys: 1,
                            max_bytes: u64::MAX,
                        };
                        let page = store
                            .scan_page(b"seg/", None, limit)
                            .map_err(crate::log::LogError::from)?;
                        if !page.pairs.is_empty() {
                            return Err(RunError::Log(crate::log::LogError::NotALog(format!(
                                "{} holds a log but no run manifest: the manifest is missing \
                                 (the store is damaged), so the run cannot be resumed",
                                store.describe()
                            ))));
                        }
                        return Err(RunError::Config(format!(
                            "{} holds no run to resume",
                            store.describe()
                        )));
                    }
                    (Some(old), true) if old.root != root_id || old.vnodes != self.vnodes => {
                        return Err(RunError::Config(format!(
                            "{} holds another run (root {}, {} vnodes): resume it with the \
                             same program options and vnodes",
                            store.describe(),
                            old.root,
                            old.vnodes
                        )))
                    }
                    (Some(old), true) if old.status == RunStatus::Finished => {
                        return Err(RunError::Config(format!(
                            "{} holds a finished run: nothing to resume",
                            store.describe()
                        )))
                    }
                    _ => {}
                }
                if resume {
                    manifest.store(&**store)?;
                } else {
                    manifest.store_new(&**store)?;
                }
                let w = LogWriter::start(store.clone(), self.vnodes, self.policy)?;
                w.set_checkpoint_every(self.checkpoint_every);
                Some(w)
            }
            None if resume => {
                return Err(RunError::Config(
                    "resuming needs the run's store".to_string(),
                ))
            }
            None => None,
        };

        let shared =
            Arc::new(RunShared::new(self.vnodes, self.forge.clone()).with_token(self.stop.clone()));
        let transport: Box<dyn Transport> = match &self.transport {
            Some(make) => make(self.vnodes),
            None => Box::new(InProcTransport::new(self.vnodes)),
        };
        let mut vnodes = Vec::with_capacity(self.vnodes as usize);
        for v in 0..self.vnodes {
            let id = VnodeId(v);
            let log = writer.as_ref().map(|w| w.vnode_log(id)).transpose()?;
            let core = Core::new(id, self.registry.clone(), log, shared.clone());
            let endpoint = transport.endpoint(id).map_err(|e| RunError::Internal {
                vnode: id,
                message: e.to_string(),
            })?;
            let rng = ChaCha8Rng::seed_from_u64(
                self.seed ^ u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            );
            let clock = self.clock.clone();
            vnodes.push(Vnode::new(
                core,
                endpoint,
                clock,
                rng,
                self.vnodes,
                self.timers.per_thread(self.vnodes as usize, self.threads),
            ));
        }

        // Rule 2: program inputs, then the root, on vnode 0.
        match &writer {
            Some(_) if resume => {
                for v in &mut vnodes {
                    let r = v.resume_from_log(&setup)?;
                    v.stats.recovered_tasks += r.restarted;
                    v.stats.reused_tasks += r.reused;
                }
            }
            _ => plant_root(&mut vnodes[0].core, &setup)?,
        }
        shared.set_kills(self.kills.clone());
        let rc = RecoveryContext {
            writer: writer.as_ref(),
            root: &setup,
        };
        self.drive(&mut vnodes, &shared, &rc);

        let mut error = shared.take_error();
        if error.is_none() && !shared.finished() && shared.stop_requested() {
            // Rule 7: stopped on request before the end.
            error = Some(RunError::Interrupted {
                completed: shared.completed(),
            });
        }
        let mut stats = Vec::with_capacity(vnodes.len());
        for v in &mut vnodes {
            // Rule 6, after a failure too: what was logged stays (best effort then).
            let synced = v.finish();
            if let (None, Err(e)) = (&error, synced) {
                error = Some(e);
            }
            stats.push(v.stats.clone());
        }
        let mut outputs = Vec::with_capacity(terminal.len());
        if error.is_none() {
            for &o in &terminal {
                match vnodes[0].core.value(o) {
                    Some(v) => outputs.push(v.clone()),
                    None => {
                        error = Some(RunError::Internal {
                            vnode: VnodeId(0),
                            message: format!("run ended without terminal output {o}"),
                        });
                        break;
                    }
                }
            }
        }
        drop(vnodes);
        if let Some(w) = writer {
            if let Err(e) = w.shutdown() {
                error.get_or_insert(RunError::Log(e));
            }
        }
        if let Some(store) = &self.store {
            manifest.status = match &error {
                None => RunStatus::Finished,
                Some(RunError::Interrupted { .. }) => RunStatus::Interrupted,
                Some(e) => RunStatus::Failed(e.to_string()),
            };
            let stored = manifest.store(&**store);
            if let (None, Err(e)) = (&error, stored) {
                error = Some(RunError::Log(e));
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        let outputs = T::Outputs::from_values(outputs).map_err(|e| RunError::InputDecode {
            task: T::NAME.to_string(),
            id: root_id,
            input: e.index,
            reason: format!("terminal output: {}", e.reason),
        })?;
        Ok(RunReport {
            outputs,
            root: root_id,
            terminal,
            tasks: stats.iter().map(|s| s.tasks).sum(),
            events: stats.iter().map(|s| s.events).sum(),
            elapsed: started.elapsed(),
            vnodes: stats,
            forged: shared.take_forged(),
        })
    }

    /// Rule 1: min(T, V) drivers on the pool, plus the progress reporter. Returns when the run
    /// stops (then everything is stopped) or, in a member run, when interrupted.
    fn drive(&self, vnodes: &mut [Vnode], shared: &Arc<RunShared>, rc: &RecoveryContext<'_>) {
        if vnodes.is_empty() {
            // A member hosting nothing (a spare): wait for work or the end.
            while !shared.stopped() && !shared.interrupted() {
                std::thread::sleep(IDLE_WAIT);
            }
            return;
        }
        let drivers = self.threads.min(vnodes.len());
        let mut shares: Vec<Vec<&mut Vnode>> = (0..drivers).map(|_| Vec::new()).collect();
        for (i, v) in vnodes.iter_mut().enumerate() {
            shares[i % drivers].push(v);
        }
        let reporter = self.progress.clone().map(|f| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                while !shared.stopped() && !shared.interrupted() {
                    f(shared.completed());
                    std::thread::sleep(Duration::from_millis(100));
                }
                f(shared.completed());
            })
        });
        self.pool.scope(|s| {
            for share in shares {
                s.spawn(move |_| {
                    let stall = self.stall;
                    let result =
                        catch_unwind(AssertUnwindSafe(|| drive_share(share, shared, rc, stall)));
                    if let Err(payload) = result {
                        shared.fail(RunError::Internal {
                            vnode: VnodeId(u32::MAX),
                            message: format!("driver panicked: {}", panic_message(&*payload)),
                        });
                    }
                });
            }
        });
        if !shared.distributed() || !shared.interrupted() {
            shared.stop();
        }
        if let Some(r) = reporter {
            let _ = r.join();
        }
    }
}

fn drive_share(
    mut share: Vec<&mut Vnode>,
    shared: &RunShared,
    rc: &RecoveryContext<'_>,
    stall: Stall,
) {
    let mine: Vec<VnodeId> = share.iter().map(|v| v.core.vnode).collect();
    // waits.rs rule 1: when a task last completed anywhere in the run, as this driver saw it.
    let mut last = (
        shared.completed(),
        share.first().map_or(Duration::ZERO, |v| v.now()),
    );
    let mut reported = false;
    while !shared.stopped() && !shared.interrupted() {
        while let Some(dead) = shared.due_kill(&mine) {
            if let Some(v) = share.iter_mut().find(|v| v.core.vnode == dead) {
                match v.fail_and_recover(rc) {
                    Ok(r) => {
                        v.stats.failures += 1;
                        v.stats.recovered_tasks += r.restarted;
                        v.stats.reused_tasks += r.reused;
                        v.stats.failures_without_effect +=
                            u64::from(r.restarted == 0 && r.reused == 0);
                    }
                    Err(e) => {
                        shared.fail(e);
                        return;
                    }
                }
            }
        }
        let mut worked = false;
        // Rule 1: no vnode of this thread steals while another of them has a ready task (its
        // own ready tasks it checks itself: `vnode.rs` rule 2).
        let ready = share.iter().filter(|v| v.has_ready()).count();
        for v in share.iter_mut() {
            v.steal_ok = ready <= usize::from(v.has_ready());
            match v.step(STEP_BUDGET) {
                Ok(w) => worked |= w,
                Err(e) => {
                    shared.fail(e);
                    return;
                }
            }
        }
        if !worked {
            if !shared.distributed() && shared.quiescent() && !shared.kill_due() {
                shared.finish();
                return;
            }
            let (done, now) = (
                shared.completed(),
                share.first().map_or(Duration::ZERO, |v| v.now()),
            );
            if done != last.0 {
                last = (done, now);
                reported = false;
            } else if !reported && now.saturating_sub(last.1) >= stall.after {
                reported = true;
                let waits: Vec<VnodeWaits> = share.iter().map(|v| v.waits()).collect();
                if stall.fail {
                    shared.fail(waits::stalled(stall.after, waits));
                    return;
                }
                for w in &waits {
                    tracing::warn!("stalled {:?}: {w}", stall.after);
                    eprintln!("veriflow: no task completed for {:?}; {w}", stall.after);
                }
            }
            if share.len() == 1 {
                share[0].wait(IDLE_WAIT);
            } else {
                std::thread::sleep(IDLE_WAIT_SHARED);
            }
        }
    }
}

fn index_u32(i: usize) -> u32 {
    u32::try_from(i).expect("fewer than 2^32 inputs and outputs")
}

#[cfg(test)]
mod tests;

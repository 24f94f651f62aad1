//! The coordinator: paper 001's fault-tolerance module. It admits workers, maps vnodes onto
//! them, runs the termination test, reacts to failures, and holds no per-task state.
//!
//! [`Coordinator`] is an I/O-free state machine (HyperQueue's reactor): the caller feeds it
//! [`Event`]s stamped with the time, and carries out the [`Action`]s it returns. The tokio
//! driver ([`serve`]) turns actions into frames on TCP connections and store calls on a
//! blocking thread; the simulator (`crate::sim`) turns them into deliveries on one thread.
//!
//! Rules:
//!
//! 1. One state machine owns all state; events are handled one at a time, in the order the
//!    caller gives them, and the actions of one event are carried out in order.
//! 2. Jobs and programs. A worker runs one program (its hello says which) and serves one job
//!    at a time; the coordinator serves any number of programs and jobs. A job of program P
//!    starts when it is the first waiting job of P and at least its `min_workers` workers of
//!    P are free (in no job); it takes every free worker of P: it maps its V vnodes
//!    round-robin onto the non-spare ones, and the spares are members hosting nothing. So
//!    jobs of different programs run at once on their own workers, and jobs of one program
//!    run one after another in submission order (or at once, as workers free up or join). A
//!    job waiting behind a job of its program is queued ([`ToSubmit::Queued`]) and its
//!    `join_patience` counts only from when no job of its program runs. The host of vnode 0
//!    starts the run (manifest and root). Each job logs under its own namespace of the
//!    store, `job-N` ([`crate::job_store`]), so one store holds every job; before it starts,
//!    that namespace is checked ([`Action::CheckStore`]): one that holds a run already (a
//!    journal lost) is refused. A worker that joins while a job of its program runs (not
//!    stopping, no job of its program waiting) becomes a member of the oldest such job,
//!    hosting nothing: it is started with an empty share, probed from the round under way,
//!    and is a candidate when a lost member's vnodes move (rule 5). One that joins while a
//!    takeover waits for the members (rule 10) becomes a member when the wait ends. Rules 3-6
//!    hold per job.
//! 3. Termination: the coordinator probes every member for the work words of the vnodes it
//!    hosts; when two complete rounds in a row cover all V vnodes, every word has no work
//!    outstanding and no word changed, the run is over (the two-scan test of the runtime's
//!    `exec/mod.rs` rule 4 across processes) and every member is told to stop. Rounds start
//!    [`Config::probe_every`] apart; after a round in which every vnode was busy the period
//!    doubles, up to [`Config::probe_max`], and it is back to `probe_every` after a round in
//!    which any vnode was idle or missing: answering probes was most of the traffic of a
//!    busy run (`nqueens cluster`: 160 rounds a second, 5 % of a core in the coordinator),
//!    and the end, which comes after vnodes go idle, is still seen within two fast rounds.
//! 4. A worker is lost when its connection to the coordinator closes or resets (at once), or
//!    when the coordinator's own failure detector (`veriflow_runtime::detect`, paper 004 §4)
//!    declares it broken. A worker's report that another is broken is a suspicion only: it is
//!    acted on when the coordinator's detector does not see the suspect alive (it is
//!    Unreachable or Broken here) or when `k` distinct members (paper 004's k, at most the
//!    other live members) suspect it within one detection period of each other (older
//!    reports are unrelated misses on lossy links, and expire); a report from a worker about
//!    itself or about a stranger is refused and noted. Every message counts as a heartbeat; a coordinator that was itself
//!    stalled accuses nobody when it wakes (the detector's rule 9).
//! 5. A lost worker's vnodes move, each at a new epoch, to a spare if one is idle, else to the
//!    live member with the fewest vnodes (a member still absent after a takeover only when no
//!    member is here); when the lost worker was the job's last member, a free worker of its
//!    program (kept for a job waiting behind it) takes its place, and the job fails only if
//!    there is none. The new host rebuilds them from their logs and every
//!    member learns the new map and epochs (so late messages of the lost incarnation are
//!    dropped). The termination test starts over. A lost member of a job is never admitted
//!    again under its id; its messages are ignored. A worker lost while in no job (it hosts
//!    nothing: waiting for a job to gather, or between jobs) is only absent, as after a
//!    takeover (rule 10): nothing of it moved, so it may come back under its id. Under load
//!    a worker that joined early can fall silent before its job gathers; evicting it for
//!    ever left the job short of workers ("45 worker(s) joined within 30s, the job asks for
//!    66", with 66 one-thread workers on a 2-core machine three times over).
//! 6. The job ends when every live member has reported; the coordinator then records the run
//!    as finished in the manifest ([`Action::RecordFinished`]) and sends the summary to the
//!    client. If the member holding vnode 0 was lost after the run ended (or every member
//!    was), the terminal outputs are read from the logs ([`Action::ReadOutputs`]):
//!    termination means they are durable (a vnode keeps work while its log is not:
//!    `exec/vnode.rs` rule 7). An iterative job (`Program::iterative`, paper 000) keeps no log: its work words
//!    say which vnodes have finished their last step, a moved vnode restores from its
//!    neighbours' backups instead of a log, and its result is the final states all members
//!    returned.
//! 7. Everything a key holder sends is bounded before it is used (issue 13: workers are
//!    untrusted): job sizes ([`Limits`]), thread counts, names and addresses. A refused hello
//!    closes its connection with a note; the cluster goes on.
//! 8. Members authenticate each other with pairwise link keys the coordinator derives from its
//!    own secret ([`link_key`]) and hands to the two ends only, in `Start` and `Map`: a key
//!    holder can no longer claim to be another worker on a peer link (`worker` rule 5).
//! 9. Write-ahead ([`journal`] rule 3): the coordinator's state (its members with their public
//!    keys, the job's map, epochs and members, whether it stops, the last job's end) is
//!    journaled in the store ([`Action::Journal`]) before any order that follows from it. The
//!    driver carries the write out before the next action; a refused write means a coordinator
//!    of a newer term exists, and the driver stops this one without acting further. So a
//!    deposed coordinator (paused, cut off) can neither move a vnode nor stop a job.
//! 10. Takeover ([`Coordinator::recover`]): a successor starts from the journal. Its members
//!     come back with [`Event::Rejoined`], each proving its identity with an Ed25519 signature
//!     of the connection's channel binding under the key it joined with, and saying which
//!     vnodes it hosts at which epochs and how its part of the last job ended. Probes wait until
//!     every member of the job is back or `rejoin_patience` has passed; then members of the
//!     job still absent are lost (rule 5; workers outside the job may come back any time,
//!     as nothing of theirs moved), every member gets the whole map with fresh link keys (the
//!     predecessor's secret died with it), a member that never heard of the job (the
//!     predecessor died between journaling it and starting it there) is started with no
//!     vnodes, hosts missing a vnode they should host are told to host it (rebuilt from its
//!     log), and a job that was stopping is stopped again. A client follows its job again
//!     with [`Event::Attach`] (or reads its end from the journal). A worker this coordinator
//!     still counts may rejoin too (its detector gave up on the coordinator, under load or a
//!     cut): the new connection replaces the old, whose close then accuses nobody, and the
//!     worker hears the job's map, its host orders and the stop or probe of the moment again.
//! 11. **The online oracle** (`crate::oracle`). One oracle connection at a time; another is
//!     refused while it lasts. A job started while an oracle is connected is *followed* (and
//!     stays so across takeovers: it is journaled): the oracle hears every incarnation
//!     (vnode, epoch, host) as the map is made and changed, and the job's end waits for its
//!     certificate. `Forged` names an incarnation; its host is evicted as a lost worker is
//!     (rule 5: its vnodes move at new epochs), journaled first, and its public key is refused
//!     for the rest of the job (its id, as every lost id, for ever); the cluster key stays
//!     valid. When the run is recorded finished the oracle is told (`Ended`) and the summary
//!     waits for `Certified`: the outputs become those of the generation it certified
//!     (corrected, if anything was forged) and the signed certificate goes with the summary.
//!     An oracle that fails, or is away for `oracle_patience` while the summary waits, lets
//!     the job end with the members' outputs and `uncertified` saying why. An oracle that
//!     comes back (`following` the job, after a takeover or a restart) hears `Follow` again,
//!     and `Ended` if the summary waits. The oracle runs one program and follows one job at a
//!     time: a job of its program that starts while no other is followed.
//! 12. **The job list and cancel.** A job gets its id when it is submitted; the queue is
//!     journaled (rule 9), so a successor keeps queued jobs and their clients attach by id.
//!     The last [`crate::protocol::ENDED_KEPT`] ended jobs are kept for `APP jobs` and for
//!     clients that attach late. `Cancel` drops a queued job, or stops a running one (rule 3's
//!     stop, journaled first) and ends it `Failed` as cancelled when its members have reported:
//!     a cancelled run is never recorded as finished (its manifest stays `Running`, its logs
//!     stay in its namespace). A job already recording its end is not cancelled.

pub(crate) mod driver;
pub mod journal;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use veriflow_runtime::detect::{Action as FdAction, Detector, FdParams, Status};
use veriflow_runtime::exec::{work_units, MAX_VNODES};
use veriflow_runtime::iterative::NodeStats;

pub(crate) use driver::{read_outputs, record_finished};
pub use driver::{serve, serve_observed, CoordinatorConfig};
pub use journal::{Journal, LeaseParams};

use crate::protocol::{
    rejoin_message, ClusterStatus, CoordCounters, FailureStatus, FromOracle, Hosting, JobSpec,
    JobStatus, PeerInfo, Rejoin, ToCoord, ToOracle, ToSubmit, ToWorker, VnodeStatus, WorkerId,
    WorkerReport, WorkerStatus, ENDED_KEPT,
};
use journal::{EndedRecord, Followed, JobRecord, MemberRecord, QueuedRecord};

/// A submitting client's connection, numbered by the driver.
pub type ClientId = u64;

/// A worker's connection before it is admitted, numbered by the driver.
pub type ConnId = u64;

/// Bounds on what a key holder may ask of the coordinator (rule 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most vnodes a job may have (the runtime's own bound).
    pub max_vnodes: u32,
    /// Most threads a worker may claim.
    pub max_threads: u32,
    /// Most workers a job may wait for.
    pub max_min_workers: u32,
    /// Most bytes of a job's command line, all arguments together.
    pub max_argv_bytes: usize,
    /// Most arguments in a job's command line.
    pub max_argv: usize,
    /// Longest program name or peer address.
    pub max_name: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_vnodes: MAX_VNODES,
            // The command line's own bound on `--threads`.
            max_threads: 1024,
            max_min_workers: 4096,
            // A command line of 64 KiB is far above any real one (the kernel's own limit for
            // one argument is 128 KiB), and small enough to hold for every waiting job.
            max_argv_bytes: 64 << 10,
            max_argv: 1024,
            max_name: 256,
        }
    }
}

/// How a coordinator behaves (its I/O-free part).
#[derive(Debug, Clone)]
pub struct Config {
    /// The store every member logs into, as a spec the workers open.
    pub store_spec: String,
    /// The failure detector's parameters (paper 004 §4), sent to every worker too.
    pub fd: FdParams,
    /// Seed of the detector's monitor choices.
    pub seed: u64,
    /// Secret the pairwise link keys are derived from (rule 8).
    pub secret: [u8; 32],
    /// Probe rounds start at most this often: the end of a run is seen within about two
    /// rounds, and the members are not kept busy answering.
    pub probe_every: Duration,
    /// While every vnode is busy, the period between rounds doubles from `probe_every` up to
    /// this (rule 3): answering probes is most of the members' and the coordinator's traffic.
    pub probe_max: Duration,
    /// How long a submission waits for the workers it asks for.
    pub join_patience: Duration,
    /// How often the client hears of progress.
    pub progress_every: Duration,
    /// Bounds on what clients and workers send (rule 7).
    pub limits: Limits,
    /// Where workers and clients reach this coordinator (rule 10).
    pub advertise: String,
    /// Other coordinators' addresses, told to workers and clients (rule 10).
    pub coordinators: Vec<String>,
    /// This coordinator's term ([`journal`] rule 1): every journal write carries it.
    pub term: u64,
    /// How long a successor waits for the job's members to come back (rule 10).
    pub rejoin_patience: Duration,
    /// UNIX time of the driver clock's zero (`Duration::ZERO`: unknown), so that a job's
    /// elapsed time survives a takeover.
    pub wall_zero: Duration,
    /// How long a followed job's summary waits for an absent oracle (rule 11).
    pub oracle_patience: Duration,
}

impl Config {
    /// A configuration with the defaults of a real coordinator.
    pub fn new(store_spec: &str, fd: FdParams, secret: [u8; 32]) -> Config {
        Config {
            store_spec: store_spec.to_string(),
            fd,
            seed: u64::from_le_bytes(secret[..8].try_into().unwrap_or_default()),
            secret,
            probe_every: Duration::from_millis(5),
            probe_max: Duration::from_millis(20),
            join_patience: Duration::from_secs(30),
            progress_every: Duration::from_millis(200),
            limits: Limits::default(),
            advertise: String::new(),
            coordinators: Vec::new(),
            term: 0,
            // Longer than a worker's detection of a silent coordinator plus its first retries.
            rejoin_patience: Duration::from_secs(10)
                .max((fd.interval + fd.timeout + fd.insurance + fd.broken) * 3),
            wall_zero: Duration::ZERO,
            oracle_patience: Duration::from_secs(30),
        }
    }
}

/// What a worker says when it joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joining {
    /// Program (app) it runs: it serves jobs of that program (rule 2).
    pub program: String,
    /// Where its peers reach it.
    pub peer_addr: String,
    /// Its threads.
    pub threads: u32,
    /// Whether it waits idle until needed for recovery.
    pub spare: bool,
    /// Its Ed25519 public key (rule 10).
    pub public_key: [u8; 32],
}

/// What happens to a coordinator.
#[derive(Debug, Clone)]
pub enum Event {
    /// A worker said hello on a new connection, which the driver numbered `conn`.
    Joined {
        /// The connection.
        conn: ConnId,
        /// Its hello.
        hello: Joining,
    },
    /// A worker of a predecessor came back on connection `conn` (rule 10).
    Rejoined {
        /// The connection.
        conn: ConnId,
        /// Its claim.
        claim: Box<Rejoin>,
        /// The connection's channel binding, which the claim's signature covers.
        binding: [u8; 32],
    },
    /// A worker sent a message.
    FromWorker {
        /// The worker.
        worker: WorkerId,
        /// The message.
        msg: ToCoord,
    },
    /// A worker's connection closed or reset (rule 4).
    Closed {
        /// The worker.
        worker: WorkerId,
        /// Why, as the driver saw it.
        reason: String,
    },
    /// A client submitted a job on a new connection, numbered `client`.
    Submit {
        /// The client.
        client: ClientId,
        /// The program the client runs.
        program: String,
        /// The job.
        job: JobSpec,
    },
    /// A client cancels job `job` on a new connection, numbered `client` (rule 12).
    Cancel {
        /// The client.
        client: ClientId,
        /// The job.
        job: u64,
    },
    /// A client follows job `job` again on a new connection (rule 10).
    Attach {
        /// The client.
        client: ClientId,
        /// The job.
        job: u64,
    },
    /// The store was checked for a run already there ([`Action::CheckStore`]).
    StoreChecked {
        /// The job it was checked for.
        job: u64,
        /// Whether it holds a run; or why it cannot be read.
        result: Result<bool, String>,
    },
    /// The terminal outputs were read from the logs ([`Action::ReadOutputs`]).
    OutputsRead {
        /// The job.
        job: u64,
        /// The outputs, `None` if the logs do not hold them all, or why they cannot be read.
        result: Result<Option<Vec<Vec<u8>>>, String>,
    },
    /// The run was recorded as finished ([`Action::RecordFinished`]).
    Recorded {
        /// The job.
        job: u64,
        /// The run's root task id (empty without a log), or why it could not be recorded.
        result: Result<String, String>,
    },
    /// The online oracle said hello on connection `client` (rule 11).
    OracleJoined {
        /// Its connection.
        client: ClientId,
        /// The program it re-runs tasks of.
        program: String,
        /// Its certificate-signing public key.
        public_key: [u8; 32],
        /// The job it followed before, if any.
        following: Option<u64>,
    },
    /// The online oracle sent a message.
    FromOracle {
        /// Its connection.
        client: ClientId,
        /// The message.
        msg: FromOracle,
    },
    /// The online oracle's connection closed.
    OracleClosed {
        /// Its connection.
        client: ClientId,
        /// Why, as the driver saw it.
        reason: String,
    },
    /// Time passed: run the timers due (probes, the detector, deadlines).
    Tick,
}

/// What the coordinator asks of its driver.
#[derive(Debug, Clone)]
pub enum Action {
    /// Connection `conn` is worker `worker` from now on: its frames are the worker's.
    Admit {
        /// The connection.
        conn: ConnId,
        /// The worker.
        worker: WorkerId,
    },
    /// Send `msg` on connection `conn` (not admitted), then close it.
    Refuse {
        /// The connection.
        conn: ConnId,
        /// The refusal.
        msg: ToWorker,
    },
    /// Write the journal, and carry out no further action until it is durable; a refused
    /// write deposes this coordinator (rule 9).
    Journal(Box<Journal>),
    /// Send `msg` to `worker`.
    ToWorker {
        /// The worker.
        worker: WorkerId,
        /// The message.
        msg: ToWorker,
    },
    /// Close the connection of `worker` (a refused hello).
    Disconnect {
        /// The worker's connection.
        worker: WorkerId,
    },
    /// Send `msg` to a client; `Finished` and `Failed` are its last message.
    ToClient {
        /// The client.
        client: ClientId,
        /// The message.
        msg: ToSubmit,
    },
    /// Read the store's manifest and answer [`Event::StoreChecked`].
    CheckStore {
        /// The job.
        job: u64,
    },
    /// Read the run's terminal outputs from its logs and answer [`Event::OutputsRead`]
    /// (rule 6: the member holding vnode 0 was lost as the job ended).
    ReadOutputs {
        /// The job.
        job: u64,
    },
    /// Record the run as finished in the store's manifest and answer [`Event::Recorded`].
    RecordFinished {
        /// The job.
        job: u64,
    },
    /// Send `msg` to the online oracle on connection `client`; `Refused` is its last.
    ToOracle {
        /// Its connection.
        client: ClientId,
        /// The message.
        msg: ToOracle,
    },
    /// A line for the coordinator's log (joins, losses, refusals, job start and end).
    Note(String),
}

/// The pairwise key of the link between workers `a` and `b` (rule 8): only the coordinator
/// and the two ends know it.
pub fn link_key(secret: &[u8; 32], a: WorkerId, b: WorkerId) -> [u8; 32] {
    let (lo, hi) = (a.min(b), a.max(b));
    let mut h = blake3::Hasher::new_keyed(secret);
    h.update(b"veriflow link key v1");
    h.update(&lo.to_le_bytes());
    h.update(&hi.to_le_bytes());
    *h.finalize().as_bytes()
}

struct Worker {
    program: String,
    peer_addr: String,
    threads: u32,
    spare: bool,
    public_key: [u8; 32],
}

impl Worker {
    fn record(&self) -> MemberRecord {
        MemberRecord {
            program: self.program.clone(),
            peer_addr: self.peer_addr.clone(),
            threads: self.threads,
            spare: self.spare,
            public_key: self.public_key,
        }
    }
}

/// A submission waiting for its workers.
struct Waiting {
    id: u64,
    /// Its client; none after a takeover until it attaches (rule 12).
    client: Option<ClientId>,
    program: String,
    spec: JobSpec,
    /// Until when it waits for its workers (from when no job of its program runs).
    deadline: Duration,
    /// Queued behind a job of its program (rule 2): its deadline starts once none runs.
    queued: bool,
}

impl Waiting {
    fn record(&self) -> QueuedRecord {
        QueuedRecord {
            id: self.id,
            program: self.program.clone(),
            spec: self.spec.clone(),
        }
    }
}

struct Job {
    id: u64,
    program: String,
    /// A client cancelled it (rule 12): it stops, and ends `Failed` without being recorded.
    cancelled: bool,
    /// The following client; none after a takeover until it attaches (rule 10).
    client: Option<ClientId>,
    spec: JobSpec,
    /// Before the store check answers, the job has no map yet.
    running: bool,
    host: Vec<WorkerId>,
    epoch: Vec<u64>,
    members: Vec<WorkerId>,
    round: u64,
    /// A probe round is in flight.
    outstanding: bool,
    /// When the last round started.
    last_round: Duration,
    /// The period before the next round (rule 3): `probe_every`, doubled after every round
    /// that found every vnode busy, up to `probe_max`.
    probe_period: Duration,
    statuses: BTreeMap<WorkerId, Vec<(u32, u64)>>,
    completed: BTreeMap<WorkerId, u64>,
    last_words: Option<Vec<u64>>,
    /// When the round that found every word idle and set `last_words` started: the
    /// termination test's detection time is counted from there.
    idle_since: Option<Duration>,
    stopping: bool,
    /// The manifest is being recorded (or the outputs read): the summary waits for it.
    recording: bool,
    /// Terminal outputs read from the logs (rule 6), when no member returned them.
    outputs: Option<Vec<Vec<u8>>>,
    done: BTreeMap<WorkerId, WorkerReport>,
    error: Option<String>,
    started: Duration,
    /// Time the job ran before `started` (under a predecessor: rule 10).
    carried: Duration,
    lost: u32,
    /// Workers lost in this job under this coordinator: who, why, when, vnodes moved.
    failures: Vec<(WorkerId, String, Duration, u32)>,
    last_progress: Duration,
    /// The online oracle follows this job (rule 11).
    followed: Option<Followed>,
    /// The summary, waiting for the oracle's certificate (rule 11), and since when no oracle
    /// is connected to give it.
    awaiting: Option<(ToSubmit, Option<Duration>)>,
}

impl Job {
    fn record(&self, now: Duration, wall_zero: Duration) -> JobRecord {
        JobRecord {
            id: self.id,
            program: self.program.clone(),
            cancelled: self.cancelled,
            spec: self.spec.clone(),
            host: self.host.clone(),
            epoch: self.epoch.clone(),
            members: self.members.clone(),
            stopping: self.stopping,
            lost: self.lost,
            elapsed_s: self.elapsed(now).as_secs_f64(),
            followed: self.followed.clone(),
            started_unix_s: if wall_zero.is_zero() {
                0.0
            } else {
                (wall_zero + self.started).as_secs_f64() - self.carried.as_secs_f64()
            },
        }
    }

    /// Each vnode with its host and epoch.
    fn full_map(&self) -> Vec<(u32, WorkerId, u64)> {
        self.host
            .iter()
            .zip(&self.epoch)
            .enumerate()
            .map(|(v, (&h, &e))| (u32::try_from(v).unwrap_or(u32::MAX), h, e))
            .collect()
    }

    /// How long the job has run, a predecessor's time included.
    fn elapsed(&self, now: Duration) -> Duration {
        self.carried + now.saturating_sub(self.started)
    }

    /// A job given its id at submission, before its store check (rule 2).
    fn new(w: Waiting, now: Duration) -> Job {
        Job {
            id: w.id,
            program: w.program,
            cancelled: false,
            client: w.client,
            spec: w.spec,
            running: false,
            host: Vec::new(),
            epoch: Vec::new(),
            members: Vec::new(),
            round: 0,
            outstanding: false,
            last_round: now,
            probe_period: Duration::ZERO,
            statuses: BTreeMap::new(),
            completed: BTreeMap::new(),
            last_words: None,
            idle_since: None,
            stopping: false,
            recording: false,
            outputs: None,
            done: BTreeMap::new(),
            error: None,
            started: now,
            carried: Duration::ZERO,
            lost: 0,
            failures: Vec::new(),
            last_progress: now,
            followed: None,
            awaiting: None,
        }
    }

    /// Its state in [`JobStatus`].
    fn state(&self) -> &'static str {
        if !self.running {
            "checking store"
        } else if self.recording {
            "recording"
        } else if self.cancelled {
            "cancelling"
        } else if self.stopping {
            "stopping"
        } else {
            "running"
        }
    }
}

/// A successor waiting for the job's members (rule 10).
struct Recovery {
    deadline: Duration,
    /// What each member that came back hosts, at which epochs.
    hosted: BTreeMap<WorkerId, Vec<(u32, u64)>>,
    /// Members that came back without the job and without a report of it: the predecessor
    /// died between journaling the job and starting them.
    unstarted: BTreeSet<WorkerId>,
}

/// The coordinator's state machine (rules 1-8).
pub struct Coordinator {
    cfg: Config,
    workers: BTreeMap<WorkerId, Worker>,
    /// Ids of workers lost: never admitted again (rule 5).
    gone: BTreeSet<WorkerId>,
    /// Jobs started (checking the store, running, ending), by id (rule 2).
    jobs: BTreeMap<u64, Job>,
    next_job: u64,
    /// Jobs waiting for their workers, in submission order (rule 2).
    waiting: Vec<Waiting>,
    /// The last jobs ended, oldest first (rule 12).
    ended: std::collections::VecDeque<EndedRecord>,
    detector: Detector,
    /// Who suspects whom (rule 4).
    suspicions: BTreeMap<WorkerId, BTreeMap<WorkerId, Duration>>,
    /// Connections of workers and the ids they were admitted as.
    next_worker: WorkerId,
    /// Members of a predecessor that have not come back yet (rule 10).
    absent: BTreeMap<WorkerId, MemberRecord>,
    recovery: Option<Recovery>,
    /// Whether this coordinator started from a predecessor's journal (rule 10).
    took_over: bool,
    /// The online oracle's connection, public key and program (rule 11).
    oracle: Option<(ClientId, [u8; 32], String)>,
    /// Traffic and termination-test counts (`APP status`).
    counters: CoordCounters,
    /// Heartbeats each worker said it sent, lost ones' last counts kept.
    worker_heartbeats: BTreeMap<WorkerId, u64>,
    out: Vec<Action>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("workers", &self.workers.keys().collect::<Vec<_>>())
            .field("jobs", &self.jobs.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Coordinator {
    /// A coordinator with no workers and no job.
    pub fn new(cfg: Config) -> Coordinator {
        let detector = Detector::new(0, cfg.fd, cfg.seed);
        Coordinator {
            cfg,
            workers: BTreeMap::new(),
            gone: BTreeSet::new(),
            jobs: BTreeMap::new(),
            next_job: 1,
            waiting: Vec::new(),
            ended: std::collections::VecDeque::new(),
            detector,
            suspicions: BTreeMap::new(),
            next_worker: 1,
            absent: BTreeMap::new(),
            recovery: None,
            took_over: false,
            oracle: None,
            counters: CoordCounters::default(),
            worker_heartbeats: BTreeMap::new(),
            out: Vec::new(),
        }
    }

    /// A successor of the coordinator that wrote `journal` (rule 10): it waits for the
    /// journal's members to come back, then continues the job.
    pub fn recover(cfg: Config, journal: Journal, now: Duration) -> Coordinator {
        let mut c = Coordinator::new(cfg);
        c.next_worker = journal.next_worker.max(1);
        c.next_job = journal.next_job.max(1);
        c.gone = journal.gone;
        c.absent = journal.members;
        c.ended = journal.ended.into_iter().collect();
        c.took_over = true;
        for a in journal.coordinators {
            if a != c.cfg.advertise && !c.cfg.coordinators.contains(&a) {
                c.cfg.coordinators.push(a);
            }
        }
        // Rule 12: queued jobs wait again; their clients attach by id.
        c.waiting = journal
            .queue
            .into_iter()
            .map(|q| Waiting {
                id: q.id,
                client: None,
                program: q.program,
                spec: q.spec,
                deadline: now + c.cfg.join_patience,
                queued: true,
            })
            .collect();
        for r in journal.jobs {
            // The job's time so far: from its start on the wall clock when both clocks know
            // it, else what was journaled last.
            let wall_now = (c.cfg.wall_zero + now).as_secs_f64();
            let elapsed = if r.started_unix_s > 0.0 && !c.cfg.wall_zero.is_zero() {
                (wall_now - r.started_unix_s).max(r.elapsed_s)
            } else {
                r.elapsed_s
            };
            let carried = Duration::from_secs_f64(elapsed.clamp(0.0, 1e12));
            let mut j = Job::new(
                Waiting {
                    id: r.id,
                    client: None,
                    program: r.program,
                    spec: r.spec,
                    deadline: now,
                    queued: false,
                },
                now,
            );
            j.cancelled = r.cancelled;
            j.running = true;
            j.host = r.host;
            j.epoch = r.epoch;
            j.members = r.members;
            j.stopping = r.stopping;
            j.carried = carried;
            j.lost = r.lost;
            j.followed = r.followed;
            c.jobs.insert(j.id, j);
        }
        c.recovery = Some(Recovery {
            deadline: now + c.cfg.rejoin_patience,
            hosted: BTreeMap::new(),
            unstarted: BTreeSet::new(),
        });
        tracing::info!(
            term = c.cfg.term,
            members = c.absent.len(),
            jobs = c.jobs.len(),
            queued = c.waiting.len(),
            "takeover: waiting for the predecessor's members"
        );
        let jobs: Vec<String> = c.jobs.keys().map(u64::to_string).collect();
        c.note(format!(
            "took over at term {:#x}: {} member(s) to come back{}{}",
            c.cfg.term,
            c.absent.len(),
            if jobs.is_empty() {
                String::new()
            } else {
                format!(", job(s) {} to continue", jobs.join(", "))
            },
            if c.waiting.is_empty() {
                String::new()
            } else {
                format!(", {} queued", c.waiting.len())
            }
        ));
        c.journal(now);
        c
    }

    /// Whether the coordinator still waits for a predecessor's members (rule 10).
    pub fn recovering(&self) -> bool {
        self.recovery.is_some()
    }

    /// Every coordinator address known, this one first.
    fn coordinators(&self) -> Vec<String> {
        let mut all = vec![self.cfg.advertise.clone()];
        all.extend(self.cfg.coordinators.iter().cloned());
        all.retain(|a| !a.is_empty());
        all.dedup();
        all
    }

    /// Rule 9: the journal of the state as it is now, written before what follows.
    fn journal(&mut self, now: Duration) {
        let mut members: BTreeMap<WorkerId, MemberRecord> = self.absent.clone();
        for (&id, w) in &self.workers {
            members.insert(id, w.record());
        }
        let j = Journal {
            term: self.cfg.term,
            next_worker: self.next_worker,
            next_job: self.next_job,
            members,
            gone: self.gone.clone(),
            jobs: self
                .jobs
                .values()
                .filter(|j| j.running)
                .map(|j| j.record(now, self.cfg.wall_zero))
                .collect(),
            // A job checking its store is queued still: its check is repeated.
            queue: self
                .jobs
                .values()
                .filter(|j| !j.running)
                .map(|j| QueuedRecord {
                    id: j.id,
                    program: j.program.clone(),
                    spec: j.spec.clone(),
                })
                .chain(self.waiting.iter().map(Waiting::record))
                .collect(),
            ended: self.ended.iter().cloned().collect(),
            coordinators: self.coordinators(),
        };
        self.out.push(Action::Journal(Box::new(j)));
    }

    /// Its configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// When [`Event::Tick`] is due next.
    pub fn next_deadline(&self) -> Duration {
        let mut due = self.detector.next_deadline();
        for j in self.jobs.values() {
            if j.running && !j.stopping && !j.outstanding {
                due = due.min(j.last_round + j.probe_period.max(self.cfg.probe_every));
            }
            if let Some((_, Some(since))) = &j.awaiting {
                due = due.min(*since + self.cfg.oracle_patience);
            }
        }
        for w in self.waiting.iter().filter(|w| !w.queued) {
            due = due.min(w.deadline);
        }
        if let Some(r) = &self.recovery {
            due = due.min(r.deadline);
        }
        due
    }

    /// The workers admitted and not lost.
    pub fn workers(&self) -> Vec<WorkerId> {
        self.workers.keys().copied().collect()
    }

    /// The current map of running job `job`: each vnode's host and epoch.
    pub fn map(&self, job: u64) -> Option<Vec<(WorkerId, u64)>> {
        let j = self.jobs.get(&job).filter(|j| j.running)?;
        Some(
            j.host
                .iter()
                .copied()
                .zip(j.epoch.iter().copied())
                .collect(),
        )
    }

    /// The cluster as this coordinator sees it at `now` (`APP status`, `APP jobs`): read-only,
    /// so a client asking changes nothing (rule 1 holds: the driver calls it between events).
    pub fn status(&self, now: Duration) -> ClusterStatus {
        let ago = |t: Duration| now.saturating_sub(t).as_secs_f64();
        let job_of = |id: WorkerId| self.job_of(id).and_then(|j| self.jobs.get(&j));
        let workers = self
            .workers
            .iter()
            .map(|(&id, w)| {
                let job = job_of(id);
                WorkerStatus {
                    id,
                    program: w.program.clone(),
                    job: job.map(|j| j.id),
                    addr: w.peer_addr.clone(),
                    threads: w.threads,
                    spare: w.spare,
                    vnodes: job.map_or(0, |j| {
                        u32::try_from(j.host.iter().filter(|&&h| h == id).count())
                            .unwrap_or(u32::MAX)
                    }),
                    last_heard_ago_s: self.detector.last_heard(id).map(ago),
                    detector: match self.detector.status(id) {
                        Some(Status::Alive) => "alive",
                        Some(Status::Unreachable) => "unreachable",
                        Some(Status::Broken) => "broken",
                        None => "unknown",
                    }
                    .to_string(),
                    tasks_completed: job.and_then(|j| j.completed.get(&id).copied()).unwrap_or(0),
                }
            })
            .collect();
        let mut jobs: Vec<JobStatus> = self.ended.iter().map(ended_status).collect();
        jobs.extend(self.jobs.values().map(|j| {
            let tasks_completed: u64 = j.completed.values().sum();
            let elapsed = j.elapsed(now).as_secs_f64();
            JobStatus {
                id: j.id,
                program: j.program.clone(),
                argv: j.spec.argv.clone(),
                state: j.state().to_string(),
                vnodes: u32::try_from(j.host.len()).unwrap_or(u32::MAX),
                members: j.members.clone(),
                tasks_completed,
                tasks_per_s: if elapsed > 0.0 {
                    // Exact up to 2^53 tasks, far beyond any job.
                    tasks_completed as f64 / elapsed
                } else {
                    0.0
                },
                elapsed_s: elapsed,
                workers_lost: j.lost,
                map: if j.running {
                    j.full_map()
                        .into_iter()
                        .map(|(vnode, worker, epoch)| VnodeStatus {
                            vnode,
                            worker,
                            epoch,
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                failures: j
                    .failures
                    .iter()
                    .map(|(worker, reason, at, moved)| FailureStatus {
                        worker: *worker,
                        reason: reason.clone(),
                        ago_s: ago(*at),
                        moved: *moved,
                    })
                    .collect(),
                error: j.error.clone(),
                run: crate::job_run_name(j.id),
            }
        }));
        jobs.extend(self.waiting.iter().map(|w| JobStatus {
            id: w.id,
            program: w.program.clone(),
            argv: w.spec.argv.clone(),
            state: "queued".to_string(),
            vnodes: w.spec.vnodes,
            run: crate::job_run_name(w.id),
            ..JobStatus::default()
        }));
        jobs.sort_by_key(|j| j.id);
        ClusterStatus {
            coordinator: self.cfg.advertise.clone(),
            role: "active".to_string(),
            active: Some(self.cfg.advertise.clone()).filter(|a| !a.is_empty()),
            coordinators: self.coordinators(),
            term: self.cfg.term,
            took_over: self.took_over,
            recovering: self.recovery.is_some(),
            absent: self.absent.keys().copied().collect(),
            waiting: u32::try_from(self.waiting.len()).unwrap_or(u32::MAX),
            jobs,
            workers,
            gone: self.gone.iter().copied().collect(),
            counters: CoordCounters {
                worker_heartbeats: self.worker_heartbeats.values().sum(),
                ..self.counters.clone()
            },
        }
    }

    /// The started job worker `id` is a member of (a worker serves one job at a time).
    fn job_of(&self, id: WorkerId) -> Option<u64> {
        self.jobs
            .values()
            .find(|j| j.running && j.members.contains(&id))
            .map(|j| j.id)
    }

    /// Workers of `program` in no job (rule 2).
    fn free_workers(&self, program: &str) -> Vec<WorkerId> {
        self.workers
            .iter()
            .filter(|(&id, w)| w.program == program && self.job_of(id).is_none())
            .map(|(&id, _)| id)
            .collect()
    }

    /// Handles `event` at `now` and returns what to do, in order (rule 1).
    #[must_use = "the actions must be carried out"]
    pub fn on_event(&mut self, now: Duration, event: Event) -> Vec<Action> {
        match event {
            Event::Joined { conn, hello } => self.on_joined(now, conn, hello),
            Event::Rejoined {
                conn,
                claim,
                binding,
            } => self.on_rejoined(now, conn, *claim, &binding),
            Event::Attach { client, job } => self.on_attach(client, job),
            Event::Cancel { client, job } => self.on_cancel(now, client, job),
            Event::FromWorker { worker, msg } => self.on_worker(now, worker, msg),
            Event::Closed { worker, reason } => {
                self.detector.on_closed(worker, now);
                self.lose(now, worker, reason);
            }
            Event::Submit {
                client,
                program,
                job,
            } => self.on_submit(now, client, program, job),
            Event::StoreChecked { job, result } => self.on_store_checked(now, job, result),
            Event::OutputsRead { job, result } => self.on_outputs_read(now, job, result),
            Event::Recorded { job, result } => self.on_recorded(now, job, result),
            Event::OracleJoined {
                client,
                program,
                public_key,
                following,
            } => self.on_oracle_joined(now, client, program, public_key, following),
            Event::FromOracle { client, msg } => self.on_oracle(now, client, msg),
            Event::OracleClosed { client, reason } => self.on_oracle_closed(now, client, reason),
            Event::Tick => {}
        }
        self.timers(now);
        std::mem::take(&mut self.out)
    }

    fn note(&mut self, line: String) {
        self.out.push(Action::Note(line));
    }

    fn send(&mut self, worker: WorkerId, msg: ToWorker) {
        self.counters.messages_out += 1;
        self.out.push(Action::ToWorker { worker, msg });
    }

    fn tell_client(&mut self, client: Option<ClientId>, msg: ToSubmit) {
        if let Some(client) = client {
            self.out.push(Action::ToClient { client, msg });
        }
    }

    /// Rule 7: what a joining worker says is bounded.
    fn refuse_hello(&self, hello: &Joining) -> Option<String> {
        let l = &self.cfg.limits;
        if hello.program.is_empty() || hello.program.len() > l.max_name {
            return Some(format!(
                "its program's name has {} bytes (1..={} allowed)",
                hello.program.len(),
                l.max_name
            ));
        }
        if hello.threads == 0 || hello.threads > l.max_threads {
            return Some(format!(
                "it claims {} threads (1..={} allowed)",
                hello.threads, l.max_threads
            ));
        }
        if hello.peer_addr.is_empty() || hello.peer_addr.len() > l.max_name {
            return Some(format!(
                "its peer address has {} bytes (1..={} allowed)",
                hello.peer_addr.len(),
                l.max_name
            ));
        }
        // Rule 11: an evicted worker's key is refused for the rest of the job.
        for j in self.jobs.values() {
            if let Some((w, _)) = j
                .followed
                .as_ref()
                .and_then(|f| f.evicted.iter().find(|(_, k)| *k == hello.public_key))
            {
                return Some(format!(
                    "its key was evicted from job {} for forging (as worker {w}): it may join \
                     again after the job",
                    j.id
                ));
            }
        }
        None
    }

    fn refuse(&mut self, conn: ConnId, who: &str, why: String) {
        self.note(format!("refused {who}: {why}"));
        self.out.push(Action::Refuse {
            conn,
            msg: ToWorker::Refused { reason: why },
        });
    }

    fn on_joined(&mut self, now: Duration, conn: ConnId, hello: Joining) {
        if let Some(why) = self.refuse_hello(&hello) {
            self.refuse(conn, &format!("a worker on connection {conn}"), why);
            return;
        }
        let id = self.next_worker;
        self.next_worker = self.next_worker.saturating_add(1);
        self.note(format!(
            "worker {id} joined ({}, {}, {} threads{})",
            hello.program,
            hello.peer_addr,
            hello.threads,
            if hello.spare { ", spare" } else { "" }
        ));
        // Rule 2: a worker that joins while a job of its program runs becomes a member of the
        // oldest one, hosting nothing until a lost member's vnodes move to it (rule 5), unless
        // a job of its program waits (it stays free for that job). Journaled with its
        // admission, before it hears of the job (rule 9).
        let joins_job = if self.recovery.is_some() {
            None
        } else {
            self.job_to_join(&hello.program)
        };
        if let Some(j) = joins_job.and_then(|j| self.jobs.get_mut(&j)) {
            j.members.push(id);
        }
        self.admit(
            now,
            conn,
            id,
            Worker {
                program: hello.program,
                peer_addr: hello.peer_addr,
                threads: hello.threads,
                spare: hello.spare,
                public_key: hello.public_key,
            },
        );
        if let Some(job) = joins_job {
            self.note(format!(
                "worker {id} joins running job {job}, hosting nothing yet"
            ));
            self.catch_up(id, &[], true);
        }
    }

    /// Rule 2: the running job a free worker of `program` joins: the oldest one not stopping,
    /// unless a job of the program waits (the worker stays free for it).
    fn job_to_join(&self, program: &str) -> Option<u64> {
        if self.waiting.iter().any(|w| w.program == program) {
            return None;
        }
        self.jobs
            .values()
            .find(|j| j.program == program && j.running && !j.stopping)
            .map(|j| j.id)
    }

    /// Rule 2 at the end of a takeover (rule 10): every free worker joins the job it would have
    /// joined had no takeover been under way. Returns them; the caller journals and starts
    /// them.
    fn enlist_joiners(&mut self) -> Vec<WorkerId> {
        let free: Vec<(WorkerId, String)> = self
            .workers
            .iter()
            .filter(|(&id, _)| self.job_of(id).is_none())
            .map(|(&id, w)| (id, w.program.clone()))
            .collect();
        let mut enlisted = Vec::new();
        for (id, program) in free {
            let Some(j) = self
                .job_to_join(&program)
                .and_then(|j| self.jobs.get_mut(&j))
            else {
                continue;
            };
            j.members.push(id);
            let job = j.id;
            self.note(format!(
                "worker {id} joins running job {job}, hosting nothing yet"
            ));
            enlisted.push(id);
        }
        enlisted
    }

    /// Admits connection `conn` as worker `id`, journaled before it is welcomed (rule 9).
    fn admit(&mut self, now: Duration, conn: ConnId, id: WorkerId, w: Worker) {
        self.out.push(Action::Admit { conn, worker: id });
        self.detector.add_peer(id, now);
        self.workers.insert(id, w);
        self.journal(now);
        self.welcome(id);
    }

    fn welcome(&mut self, id: WorkerId) {
        self.send(
            id,
            ToWorker::Welcome {
                id,
                store: self.cfg.store_spec.clone(),
                fd: self.cfg.fd,
                coordinators: self.coordinators(),
            },
        );
    }

    /// Rule 10: what member `m` must hear to be in step with the running job: the whole map
    /// with fresh link keys (a start hosting nothing if it never heard of the job), and an
    /// order to host each vnode it should host and does not report hosting (rebuilt from its
    /// log; vnode 0 plants the root if its log has none: the runtime's `exec/member.rs` rule
    /// 4).
    fn resync(&mut self, m: WorkerId, hosted: &[(u32, u64)], unstarted: bool) {
        let Some(j) = self.job_of(m).and_then(|j| self.jobs.get(&j)) else {
            return;
        };
        let (job, stopping, spec) = (j.id, j.stopping, j.spec.clone());
        let map = j.full_map();
        let peers = self.peers_for(m, job);
        let msg = if unstarted && !stopping {
            ToWorker::Start {
                job,
                spec,
                vnodes: u32::try_from(map.len()).unwrap_or(u32::MAX),
                hosted: Vec::new(),
                starts: false,
                map: map.clone(),
                peers,
            }
        } else {
            ToWorker::Map {
                job,
                map: map.clone(),
                peers,
            }
        };
        self.send(m, msg);
        if stopping {
            return;
        }
        for (vnode, host, epoch) in map {
            if host == m && !hosted.contains(&(vnode, epoch)) {
                self.send(m, ToWorker::Host { job, vnode, epoch });
            }
        }
    }

    /// Rule 10: a member that reconnected hears the job again, and the order of the moment
    /// (stop, or the probe of the round it has not answered).
    fn catch_up(&mut self, m: WorkerId, hosted: &[(u32, u64)], unstarted: bool) {
        let Some(j) = self.job_of(m).and_then(|j| self.jobs.get(&j)) else {
            return;
        };
        let (job, stopping, round) = (j.id, j.stopping, j.round);
        let probe = j.outstanding && !j.statuses.contains_key(&m);
        self.resync(m, hosted, unstarted);
        if stopping {
            self.send(m, ToWorker::Stop { job });
        } else if probe {
            self.send(m, ToWorker::Probe { job, round });
        }
    }

    /// Rule 10: a predecessor's member comes back.
    fn on_rejoined(&mut self, now: Duration, conn: ConnId, claim: Rejoin, binding: &[u8; 32]) {
        let id = claim.id;
        let who = format!("worker {id}'s rejoin");
        let hello = Joining {
            program: claim.program.clone(),
            peer_addr: claim.peer_addr.clone(),
            threads: claim.threads,
            spare: claim.spare,
            public_key: [0; 32],
        };
        if let Some(why) = self.refuse_hello(&hello) {
            self.refuse(conn, &who, why);
            return;
        }
        // The key it joined with: a connected worker's (it reconnects: its detector gave up on
        // this coordinator, under load or a cut, while this one still counts it), or an absent
        // member's (it comes back to a successor).
        let connected = self.workers.get(&id).map(|w| w.public_key);
        let Some(public_key) = connected.or_else(|| self.absent.get(&id).map(|r| r.public_key))
        else {
            let why = if self.gone.contains(&id) {
                "it was lost earlier and its vnodes moved".to_string()
            } else {
                "no such worker in this coordinator's journal".to_string()
            };
            self.refuse(conn, &who, why);
            return;
        };
        if !verify_rejoin(&public_key, binding, id, &claim.signature) {
            self.refuse(
                conn,
                &who,
                "its signature does not match the key it joined with".to_string(),
            );
            return;
        }
        if connected.is_some() {
            // Rule 10: the new connection replaces the old one (whose close counts no more).
            self.note(format!("worker {id} reconnected ({})", claim.peer_addr));
            self.out.push(Action::Admit { conn, worker: id });
            self.detector.on_message(id, now);
            self.welcome(id);
        } else {
            let Some(record) = self.absent.remove(&id) else {
                return;
            };
            self.note(format!("worker {id} came back ({})", claim.peer_addr));
            self.admit(
                now,
                conn,
                id,
                Worker {
                    program: record.program,
                    peer_addr: claim.peer_addr.clone(),
                    threads: claim.threads,
                    spare: record.spare,
                    public_key: record.public_key,
                },
            );
        }
        let job_id = self.job_of(id);
        let reported = claim
            .report
            .as_ref()
            .is_some_and(|(j, _)| Some(*j) == job_id);
        let hosted = claim.job.clone().filter(|(j, _)| Some(*j) == job_id);
        let unstarted = hosted.is_none() && !reported;
        let hosted = hosted.map(|(_, h)| h).unwrap_or_default();
        match self.recovery.as_mut() {
            Some(r) => {
                if unstarted {
                    r.unstarted.insert(id);
                }
                r.hosted.insert(id, hosted);
            }
            // A reconnected member missed what was sent on its old connection: it hears the
            // job's state again, and the probe or stop it may have missed.
            None if connected.is_some() => self.catch_up(id, &hosted, unstarted),
            None => {}
        }
        if let Some((job, report)) = claim.report {
            if Some(job) == job_id {
                let msg = match report {
                    Ok(report) => ToCoord::Done { job, report },
                    Err(error) => ToCoord::Failed { job, error },
                };
                self.on_worker(now, id, msg);
            }
        }
        self.maybe_recovered(now);
    }

    /// Rule 10: recovery ends when every member of every job is back, or at its deadline.
    fn maybe_recovered(&mut self, now: Duration) {
        let Some(r) = self.recovery.as_ref() else {
            return;
        };
        // Members of the jobs: a worker outside them stays absent and is taken back whenever
        // it comes (nothing of its moves).
        let members: BTreeSet<WorkerId> = self
            .jobs
            .values()
            .flat_map(|j| j.members.iter().copied())
            .collect();
        let waiting_for = members
            .iter()
            .filter(|m| self.absent.contains_key(m))
            .count();
        if waiting_for > 0 && now < r.deadline {
            return;
        }
        let Some(mut r) = self.recovery.take() else {
            return;
        };
        // Rule 2, held back while the takeover waited: workers that joined meanwhile become
        // members hosting nothing, so the vnodes of members that did not come back have
        // somewhere to move (they are started with the others, below).
        r.unstarted.extend(self.enlist_joiners());
        let absent: Vec<WorkerId> = self
            .absent
            .keys()
            .copied()
            .filter(|id| members.contains(id))
            .collect();
        tracing::info!(
            term = self.cfg.term,
            lost = absent.len(),
            "takeover: recovery ended"
        );
        for id in absent {
            self.absent.remove(&id);
            let reason = format!(
                "it did not come back to the new coordinator within {:?}",
                self.cfg.rejoin_patience
            );
            self.note(format!("worker {id} lost: {reason}"));
            self.drop_member(now, id, reason);
        }
        self.journal(now);
        if self.jobs.is_empty() {
            self.note("recovered: no job was running".to_string());
            return;
        }
        let jobs: Vec<u64> = self.jobs.keys().copied().collect();
        for job in jobs {
            let Some(j) = self.jobs.get(&job) else {
                continue;
            };
            let (members, stopping) = (j.members.clone(), j.stopping);
            let vnodes = j.host.len();
            for &m in &members {
                let hosted = r.hosted.get(&m).cloned().unwrap_or_default();
                self.resync(m, &hosted, r.unstarted.contains(&m));
            }
            if stopping {
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.stopping = false;
                }
                self.stop_all(now, job);
            }
            tracing::info!(
                term = self.cfg.term,
                job,
                members = members.len(),
                "takeover: the job continues"
            );
            self.note(format!(
                "recovered job {job}: {} member(s), {vnodes} vnodes",
                members.len()
            ));
            self.maybe_finish(now, job);
        }
    }

    /// Rule 10: a client follows its job again (a queued one too: rule 12).
    fn on_attach(&mut self, client: ClientId, job: u64) {
        let me = self.cfg.advertise.clone();
        if let Some(j) = self.jobs.get_mut(&job) {
            j.client = Some(client);
            self.tell_client(Some(client), ToSubmit::Takeover { coordinator: me });
            return;
        }
        if let Some(at) = self.waiting.iter().position(|w| w.id == job) {
            self.waiting[at].client = Some(client);
            let ahead = self.ahead_of(at);
            self.tell_client(Some(client), ToSubmit::Takeover { coordinator: me });
            self.tell_client(Some(client), ToSubmit::Queued { job, ahead });
            return;
        }
        match self
            .ended
            .iter()
            .find(|e| e.id == job)
            .map(|e| e.end.clone())
        {
            Some(msg) => {
                self.tell_client(Some(client), ToSubmit::Takeover { coordinator: me });
                self.tell_client(Some(client), msg);
            }
            None => self.tell_client(
                Some(client),
                ToSubmit::Failed {
                    error: format!("coordinator {me} knows no job {job}"),
                },
            ),
        }
    }

    /// How many jobs of its program run or wait before waiting job number `at` (rule 2).
    fn ahead_of(&self, at: usize) -> u32 {
        let program = &self.waiting[at].program;
        let n = self.jobs.values().filter(|j| &j.program == program).count()
            + self.waiting[..at]
                .iter()
                .filter(|w| &w.program == program)
                .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Rule 12: a client cancels job `job`.
    fn on_cancel(&mut self, now: Duration, client: ClientId, job: u64) {
        let refuse = |error: String| ToSubmit::Failed { error };
        if let Some(at) = self.waiting.iter().position(|w| w.id == job) {
            let w = self.waiting.remove(at);
            let error = format!("job {job} was cancelled while queued");
            self.note(error.clone());
            self.tell_client(
                w.client,
                ToSubmit::Failed {
                    error: error.clone(),
                },
            );
            self.remember(EndedRecord {
                id: job,
                program: w.program,
                argv: w.spec.argv,
                cancelled: true,
                end: ToSubmit::Failed { error },
            });
            self.journal(now);
            self.tell_client(
                Some(client),
                ToSubmit::Cancelled {
                    job,
                    was: "queued".to_string(),
                },
            );
            return;
        }
        let Some(j) = self.jobs.get_mut(&job) else {
            let msg = match self.ended.iter().find(|e| e.id == job) {
                Some(e) => refuse(format!(
                    "job {job} has ended already ({})",
                    ended_status(e).state
                )),
                None => refuse(format!("this coordinator knows no job {job}")),
            };
            self.tell_client(Some(client), msg);
            return;
        };
        if j.recording || j.awaiting.is_some() {
            let msg = refuse(format!(
                "job {job} has finished and is being recorded: too late to cancel"
            ));
            self.tell_client(Some(client), msg);
            return;
        }
        let was = j.state().to_string();
        if j.cancelled {
            self.tell_client(Some(client), ToSubmit::Cancelled { job, was });
            return;
        }
        j.cancelled = true;
        j.error = Some(format!("job {job} was cancelled by a client"));
        let running = j.running;
        self.note(format!("job {job} cancelled ({was})"));
        if running {
            // Rule 3's stop, journaled first (rule 9); the end waits for the members.
            if let Some(j) = self.jobs.get_mut(&job) {
                j.stopping = false;
            }
            self.stop_all(now, job);
            self.maybe_finish(now, job);
        } else {
            // Its store check is under way: nothing started.
            let error = format!("job {job} was cancelled by a client");
            self.end_job(now, job, ToSubmit::Failed { error });
        }
        self.tell_client(Some(client), ToSubmit::Cancelled { job, was });
    }

    /// Rule 12: keeps an ended job, the last [`ENDED_KEPT`] only.
    fn remember(&mut self, e: EndedRecord) {
        self.ended.push_back(e);
        while self.ended.len() > ENDED_KEPT {
            self.ended.pop_front();
        }
    }

    fn on_worker(&mut self, now: Duration, id: WorkerId, msg: ToCoord) {
        if !self.workers.contains_key(&id) {
            return; // lost, or never admitted (rule 5)
        }
        self.counters.messages_in += 1;
        match msg {
            ToCoord::Heartbeat(hb) => {
                self.counters.heartbeats_in += 1;
                self.detector.on_heartbeat(id, &hb, now);
                return;
            }
            _ => self.detector.on_message(id, now),
        }
        match msg {
            ToCoord::Heartbeat(_) => {}
            ToCoord::Broken { worker } => self.on_suspicion(now, id, worker),
            // For the driver's observers (`observe` rule 2), and the heartbeat count.
            ToCoord::Metrics(m) => {
                self.worker_heartbeats.insert(id, m.heartbeats);
            }
            ToCoord::Status {
                job,
                round,
                work,
                completed,
                started,
            } => self.on_status(now, id, job, round, work, completed, started),
            ToCoord::Done { job, report } => {
                let Some(j) = self.member_job(id, job) else {
                    return;
                };
                j.done.insert(id, report);
                self.maybe_finish(now, job);
            }
            ToCoord::Failed { job, error } => {
                let Some(j) = self.member_job(id, job) else {
                    return;
                };
                j.error.get_or_insert(format!("worker {id}: {error}"));
                j.done.insert(id, WorkerReport::default());
                self.stop_all(now, job);
                self.maybe_finish(now, job);
            }
        }
    }

    /// The running job `job`, if `id` is one of its members.
    fn member_job(&mut self, id: WorkerId, job: u64) -> Option<&mut Job> {
        self.jobs
            .get_mut(&job)
            .filter(|j| j.running && j.members.contains(&id))
    }

    /// Rule 4: a worker's report that `suspect` is broken.
    fn on_suspicion(&mut self, now: Duration, reporter: WorkerId, suspect: WorkerId) {
        if suspect == reporter || !self.workers.contains_key(&suspect) {
            if !self.gone.contains(&suspect) {
                self.note(format!(
                    "refused worker {reporter}'s report that worker {suspect} is broken: {}",
                    if suspect == reporter {
                        "it reports itself"
                    } else {
                        "no such worker"
                    }
                ));
            }
            return;
        }
        let window = self.suspicion_window();
        let by = self.suspicions.entry(suspect).or_default();
        by.insert(reporter, now);
        by.retain(|_, at| now.saturating_sub(*at) <= window);
        let reporters = by.len();
        let others = self.workers.len().saturating_sub(1).max(1);
        let quorum = self.cfg.fd.k.clamp(1, others);
        let here = self.detector.status(suspect);
        tracing::info!(
            reporter,
            suspect,
            reporters,
            quorum,
            here = ?here,
            "suspicion reported"
        );
        if here != Some(Status::Alive) {
            let reason = format!(
                "declared broken by worker {reporter}'s failure detector, and silent here too"
            );
            self.lose(now, suspect, reason);
        } else if reporters >= quorum {
            let reason = format!("declared broken by {reporters} workers' failure detectors");
            self.lose(now, suspect, reason);
        } else {
            self.note(format!(
                "worker {reporter} suspects worker {suspect} ({reporters} of {quorum} needed; \
                 it is alive here)"
            ));
        }
    }

    /// Rule 4: how long a worker's report that another is broken counts. Every detector of a
    /// process that died declares it broken within about this of the others (the longest
    /// promise, T_insurance, plus the slack and T_broken): reports further apart are unrelated
    /// misses (a lost heartbeat here, a late one there), not agreement.
    fn suspicion_window(&self) -> Duration {
        let fd = &self.cfg.fd;
        fd.insurance + fd.interval + fd.timeout + fd.broken
    }

    #[allow(clippy::too_many_arguments)]
    fn on_status(
        &mut self,
        now: Duration,
        id: WorkerId,
        job: u64,
        round: u64,
        work: Vec<(u32, u64)>,
        completed: u64,
        started: bool,
    ) {
        let Some(j) = self.member_job(id, job) else {
            return;
        };
        if round != j.round || j.stopping {
            return;
        }
        j.completed.insert(id, completed);
        if !started {
            j.last_words = None;
        }
        j.statuses.insert(id, work);
        if j.statuses.len() == j.members.len() {
            j.outstanding = false;
            let took =
                u64::try_from(now.saturating_sub(j.last_round).as_micros()).unwrap_or(u64::MAX);
            let words: u64 = j.statuses.values().map(|w| w.len() as u64).sum();
            let c = &mut self.counters;
            c.probe_rounds += 1;
            c.probe_round_us_sum = c.probe_round_us_sum.saturating_add(took);
            c.probe_round_us_max = c.probe_round_us_max.max(took);
            c.words_received += words;
            self.check_termination(now, job);
        }
    }

    fn on_submit(&mut self, now: Duration, client: ClientId, program: String, spec: JobSpec) {
        if program.is_empty() || program.len() > self.cfg.limits.max_name {
            let error = format!(
                "the program's name has {} bytes (1..={} allowed)",
                program.len(),
                self.cfg.limits.max_name
            );
            self.tell_client(Some(client), ToSubmit::Failed { error });
            return;
        }
        if let Err(error) = check_spec(&spec, &self.cfg.limits) {
            self.note(format!("refused a job: {error}"));
            self.tell_client(Some(client), ToSubmit::Failed { error });
            return;
        }
        // Rule 10: a coordinator that journaled a job and died before accepting it leaves a
        // client that submits again; the successor's job with no client and the same program
        // and spec is that job (a job's result is a function of its spec: any identical
        // submission may follow it).
        let store = self.cfg.store_spec.clone();
        if let Some(j) = self
            .jobs
            .values_mut()
            .find(|j| j.client.is_none() && j.program == program && j.spec == spec)
        {
            j.client = Some(client);
            if !j.running {
                // Its store is being checked: it is accepted (or fails) when the check
                // answers, and this client hears it then.
                let id = j.id;
                self.note(format!(
                    "a submission was job {id}, whose store is being checked: it follows it"
                ));
                return;
            }
            // Its hosts now, and the other members (spares).
            let hosts: BTreeSet<WorkerId> = j.host.iter().copied().collect();
            let workers = u32::try_from(hosts.len()).unwrap_or(u32::MAX);
            let members = u32::try_from(j.members.len()).unwrap_or(u32::MAX);
            let msg = ToSubmit::Accepted {
                job: j.id,
                workers,
                spares: members.saturating_sub(workers),
                vnodes: u32::try_from(j.host.len()).unwrap_or(u32::MAX),
                store,
            };
            let id = j.id;
            self.note(format!(
                "a submission was job {id}, which runs already: it follows it"
            ));
            self.tell_client(Some(client), msg);
            return;
        }
        if let Some(w) = self
            .waiting
            .iter_mut()
            .find(|w| w.client.is_none() && w.program == program && w.spec == spec)
        {
            // Likewise for a job queued by a predecessor (rule 12).
            w.client = Some(client);
            let job = w.id;
            self.note(format!(
                "a submission was job {job}, queued already: it follows it"
            ));
            return;
        }
        let id = self.next_job;
        self.next_job += 1;
        self.waiting.push(Waiting {
            id,
            client: Some(client),
            program,
            deadline: now + self.cfg.join_patience,
            spec,
            queued: false,
        });
        // Rule 12: the queue is durable before the client hears of its job.
        self.journal(now);
        self.queue_marks(now);
        // Rule 2: behind a job of its program, a submission waits its turn.
        let at = self.waiting.len() - 1;
        if self.waiting[at].queued {
            let ahead = self.ahead_of(at);
            self.note(format!(
                "job {id} ({}) was queued behind {ahead} job(s) of its program",
                self.waiting[at].program
            ));
            self.tell_client(Some(client), ToSubmit::Queued { job: id, ahead });
        }
    }

    /// Rule 2: marks the waiting jobs queued behind a job of their program; a job that
    /// reaches the front of its program's queue starts its deadline.
    fn queue_marks(&mut self, now: Duration) {
        let mut seen: BTreeSet<String> = self.jobs.values().map(|j| j.program.clone()).collect();
        for w in &mut self.waiting {
            let queued = !seen.insert(w.program.clone());
            if w.queued && !queued {
                w.deadline = now + self.cfg.join_patience;
            }
            w.queued = queued;
        }
    }

    /// Runs what is due at `now`: the detector, waiting submissions, probes.
    fn timers(&mut self, now: Duration) {
        if now >= self.detector.next_deadline() {
            for a in self.detector.tick(now) {
                match a {
                    FdAction::SendHeartbeat { to, heartbeat } => {
                        if self.workers.contains_key(&to) {
                            self.counters.heartbeats_out += 1;
                            self.send(to, ToWorker::Heartbeat(heartbeat));
                        }
                    }
                    FdAction::Broken { peer } => self.lose(
                        now,
                        peer,
                        "declared broken by the coordinator's failure detector (silent: hung or \
                         cut off)"
                            .to_string(),
                    ),
                    FdAction::Unreachable { peer } => {
                        // Rule 4: a suspicion reported earlier is now confirmed here.
                        let window = self.suspicion_window();
                        let reporters = self.suspicions.get(&peer).map_or(0, |by| {
                            by.values()
                                .filter(|at| now.saturating_sub(**at) <= window)
                                .count()
                        });
                        if reporters > 0 {
                            self.lose(
                                now,
                                peer,
                                format!(
                                    "declared broken by {reporters} worker(s) and silent here too"
                                ),
                            );
                        }
                    }
                    FdAction::Reachable { .. } => {}
                }
            }
        }
        self.maybe_recovered(now);
        self.start_waiting(now);
        self.probe(now);
        let patience = self.cfg.oracle_patience;
        let overdue: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| {
                j.awaiting
                    .as_ref()
                    .is_some_and(|(_, since)| since.is_some_and(|s| now >= s + patience))
            })
            .map(|j| j.id)
            .collect();
        for job in overdue {
            self.end_uncertified(
                now,
                job,
                format!(
                    "the online oracle was away for {patience:?} when the run ended: certify \
                     the log offline with `certify --store SPEC --run {}`",
                    crate::job_run_name(job)
                ),
            );
        }
    }

    /// Submissions whose workers are free start (or fail at their deadline): the first
    /// waiting job of each program only (rule 2).
    fn start_waiting(&mut self, now: Duration) {
        if self.recovery.is_some() {
            return; // rule 10: the members of the jobs are not all back yet
        }
        self.queue_marks(now);
        let waiting = std::mem::take(&mut self.waiting);
        let mut blocked: BTreeSet<String> = self
            .jobs
            .values()
            .filter(|j| !j.running)
            .map(|j| j.program.clone())
            .collect();
        let mut failed = false;
        for w in waiting {
            if !blocked.insert(w.program.clone()) {
                self.waiting.push(w);
                continue;
            }
            let wanted = w.spec.min_workers.max(1) as usize;
            let free = self.free_workers(&w.program).len();
            if free < wanted && (w.queued || now < w.deadline) {
                self.waiting.push(w);
                continue;
            }
            if free < wanted {
                let of = self
                    .workers
                    .values()
                    .filter(|x| x.program == w.program)
                    .count();
                let error = format!(
                    "{of} worker(s) of {} joined this coordinator within {:?}, the job asks \
                     for {wanted}",
                    w.program, self.cfg.join_patience
                );
                self.note(format!("job {} failed: {error}", w.id));
                self.tell_client(
                    w.client,
                    ToSubmit::Failed {
                        error: error.clone(),
                    },
                );
                self.remember(EndedRecord {
                    id: w.id,
                    program: w.program,
                    argv: w.spec.argv,
                    cancelled: false,
                    end: ToSubmit::Failed { error },
                });
                failed = true;
                continue;
            }
            let id = w.id;
            self.jobs.insert(id, Job::new(w, now));
            self.out.push(Action::CheckStore { job: id });
        }
        if failed {
            self.journal(now);
        }
    }

    fn on_store_checked(&mut self, now: Duration, job: u64, result: Result<bool, String>) {
        if self.jobs.get(&job).is_none_or(|j| j.running) {
            return;
        }
        let error = match result {
            Ok(false) => None,
            Ok(true) => Some(format!(
                "the store {} already holds a run named {} (a coordinator's journal that \
                 was lost or replaced?): start the coordinator on a fresh store",
                self.cfg.store_spec,
                crate::job_run_name(job)
            )),
            Err(e) => Some(format!("cannot read the store: {e}")),
        };
        if let Some(error) = error {
            self.end_job(now, job, ToSubmit::Failed { error });
            return;
        }
        self.start_job(now, job);
    }

    /// Rule 2: maps the job's vnodes onto the free workers of its program and starts them.
    fn start_job(&mut self, now: Duration, job: u64) {
        let Some(program) = self.jobs.get(&job).map(|j| j.program.clone()) else {
            return;
        };
        let free = self.free_workers(&program);
        let mut active: Vec<WorkerId> = free
            .iter()
            .copied()
            .filter(|id| !self.workers[id].spare)
            .collect();
        if active.is_empty() {
            active.clone_from(&free);
        }
        if active.is_empty() {
            let error = format!("every worker of {program} left before the job started");
            self.end_job(now, job, ToSubmit::Failed { error });
            return;
        }
        let vnodes = match self.jobs.get(&job) {
            Some(j) if j.spec.vnodes > 0 => j.spec.vnodes,
            _ => {
                let sum: u64 = active
                    .iter()
                    .map(|w| u64::from(self.workers[w].threads.max(1)))
                    .sum();
                u32::try_from(sum.min(u64::from(self.cfg.limits.max_vnodes))).unwrap_or(1)
            }
        };
        let follows = matches!(&self.oracle, Some((_, _, p)) if *p == program)
            && !self.jobs.values().any(|j| j.followed.is_some());
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        j.host = (0..vnodes as usize)
            .map(|v| active[v % active.len()])
            .collect();
        j.epoch = vec![0; vnodes as usize];
        j.members = free;
        j.running = true;
        j.started = now;
        j.last_round = now;
        j.last_progress = now;
        if follows {
            j.followed = Some(Followed {
                hosts: (0..vnodes).map(|v| (v, 0, j.host[v as usize])).collect(),
                ..Followed::default()
            });
        }
        let (spec, client) = (j.spec.clone(), j.client);
        let map: Vec<(u32, WorkerId, u64)> =
            (0..vnodes).map(|v| (v, j.host[v as usize], 0)).collect();
        let members = j.members.clone();
        let host = j.host.clone();
        // Rule 9: the map is durable before any member starts.
        self.journal(now);
        for &m in &members {
            let hosted: Vec<(u32, u64)> = (0..vnodes)
                .filter(|&v| host[v as usize] == m)
                .map(|v| (v, 0))
                .collect();
            let peers = self.peers_for(m, job);
            self.send(
                m,
                ToWorker::Start {
                    job,
                    spec: spec.clone(),
                    vnodes,
                    hosted,
                    starts: host[0] == m,
                    map: map.clone(),
                    peers,
                },
            );
        }
        let spares = u32::try_from(members.len() - active.len()).unwrap_or(u32::MAX);
        let workers = u32::try_from(active.len()).unwrap_or(u32::MAX);
        self.tell_client(
            client,
            ToSubmit::Accepted {
                job,
                workers,
                spares,
                vnodes,
                store: self.cfg.store_spec.clone(),
            },
        );
        tracing::info!(job, %program, vnodes, workers, spares, "job started");
        self.note(format!(
            "job {job} ({program}) started: {vnodes} vnodes on {workers} workers ({spares} spare)"
        ));
        self.follow(now);
    }

    /// The other members of `job` that `me` may talk to, with their link keys (rule 8).
    fn peers_for(&self, me: WorkerId, job: u64) -> Vec<PeerInfo> {
        let Some(j) = self.jobs.get(&job) else {
            return Vec::new();
        };
        j.members
            .iter()
            .filter(|&&id| id != me)
            .filter_map(|&id| {
                self.workers.get(&id).map(|w| PeerInfo {
                    id,
                    addr: w.peer_addr.clone(),
                    link_key: link_key(&self.cfg.secret, me, id),
                })
            })
            .collect()
    }

    /// Rule 3: starts a probe round in each running job whose previous one is complete.
    fn probe(&mut self, now: Duration) {
        let every = self.cfg.probe_every;
        if self.recovery.is_some() {
            return; // rule 10: not before the members are back
        }
        let mut sends = Vec::new();
        for j in self.jobs.values_mut() {
            if !j.running
                || j.stopping
                || j.outstanding
                || now < j.last_round + j.probe_period.max(every)
            {
                continue;
            }
            j.outstanding = true;
            j.last_round = now;
            j.round += 1;
            j.statuses.clear();
            sends.push((j.id, j.round, j.members.clone()));
        }
        for (job, round, members) in sends {
            self.counters.probes_sent += members.len() as u64;
            for m in members {
                self.send(m, ToWorker::Probe { job, round });
            }
        }
    }

    fn stop_all(&mut self, now: Duration, job: u64) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.stopping {
            return;
        }
        j.stopping = true;
        let members = j.members.clone();
        // Rule 9: a deposed coordinator stops nothing.
        self.journal(now);
        for m in members {
            self.send(m, ToWorker::Stop { job });
        }
    }

    fn check_termination(&mut self, now: Duration, job: u64) {
        let every = self.cfg.progress_every;
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let v = j.host.len();
        let mut words: Vec<Option<u64>> = vec![None; v];
        for (w, list) in &j.statuses {
            for &(vn, word) in list {
                // Only the current host speaks for a vnode.
                if let Some(slot) = words.get_mut(vn as usize) {
                    if j.host[vn as usize] == *w {
                        *slot = Some(word);
                    }
                }
            }
        }
        let total: u64 = j.completed.values().sum();
        if now >= j.last_progress + every {
            j.last_progress = now;
            let client = j.client;
            self.tell_client(client, ToSubmit::Progress { completed: total });
        }
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let Some(words) = words.into_iter().collect::<Option<Vec<u64>>>() else {
            j.last_words = None;
            j.probe_period = self.cfg.probe_every;
            return;
        };
        let idle = words.iter().all(|&w| work_units(w) == 0);
        // Rule 3: rounds slow down while every vnode is busy, and go back to the fastest
        // pace as soon as one is idle (the end is near) or a word is missing.
        j.probe_period = if words.iter().all(|&w| work_units(w) != 0) {
            (j.probe_period * 2).clamp(
                self.cfg.probe_every,
                self.cfg.probe_max.max(self.cfg.probe_every),
            )
        } else {
            self.cfg.probe_every
        };
        if idle && j.last_words.as_ref() == Some(&words) {
            let since = j.idle_since.unwrap_or(j.last_round);
            self.counters.last_detection_us =
                Some(u64::try_from(now.saturating_sub(since).as_micros()).unwrap_or(u64::MAX));
            self.stop_all(now, job);
        } else {
            j.last_words = Some(words);
            j.idle_since = idle.then_some(j.last_round);
        }
    }

    /// Rule 6: when every live member has reported, records the run, then answers the client
    /// (a cancelled run is not recorded: rule 12).
    fn maybe_finish(&mut self, now: Duration, job: u64) {
        if self.recovery.is_some() {
            return; // the members that are not back yet have not reported (rule 10)
        }
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.recording || !j.members.iter().all(|m| j.done.contains_key(m)) {
            return;
        }
        if let Some(error) = j.error.clone() {
            self.end_job(now, job, ToSubmit::Failed { error });
            return;
        }
        j.recording = true;
        let has_outputs = j.spec.iterative || j.done.values().any(|r| r.outputs.is_some());
        // Rule 6: the host of vnode 0 was lost as the job ended; its outputs are in the logs.
        self.out.push(if has_outputs {
            Action::RecordFinished { job }
        } else {
            Action::ReadOutputs { job }
        });
    }

    fn on_outputs_read(
        &mut self,
        now: Duration,
        job: u64,
        result: Result<Option<Vec<Vec<u8>>>, String>,
    ) {
        let Some(j) = self.jobs.get_mut(&job).filter(|j| j.recording) else {
            return;
        };
        match result {
            Ok(Some(outputs)) => {
                j.outputs = Some(outputs);
                self.out.push(Action::RecordFinished { job });
            }
            Ok(None) => self.end_job(
                now,
                job,
                ToSubmit::Failed {
                    error: "the host of vnode 0 was lost as the job ended, and the logs do not \
                            hold the terminal outputs"
                        .to_string(),
                },
            ),
            Err(e) => self.end_job(
                now,
                job,
                ToSubmit::Failed {
                    error: format!(
                        "the host of vnode 0 was lost as the job ended, and the logs cannot be \
                         read: {e}"
                    ),
                },
            ),
        }
    }

    fn on_recorded(&mut self, now: Duration, job: u64, result: Result<String, String>) {
        let Some(j) = self.jobs.get_mut(&job).filter(|j| j.recording) else {
            return;
        };
        let msg = match result {
            Err(error) => ToSubmit::Failed { error },
            Ok(root) => {
                let outputs = if j.spec.iterative {
                    Vec::new()
                } else {
                    j.done
                        .values()
                        .find_map(|r| r.outputs.clone())
                        .or_else(|| j.outputs.clone())
                        .unwrap_or_default()
                };
                let mut states: BTreeMap<u32, (u64, Vec<u8>)> = BTreeMap::new();
                let mut iter_stats: BTreeMap<u32, NodeStats> = BTreeMap::new();
                for r in j.done.values() {
                    for (v, steps, state) in &r.states {
                        states.insert(*v, (*steps, state.clone()));
                    }
                    for (v, s) in &r.iter_stats {
                        iter_stats.entry(*v).or_default().add(s);
                    }
                }
                let mut vnodes: Vec<_> = j.done.values().flat_map(|r| r.vnodes.clone()).collect();
                vnodes.sort_by_key(|s| s.vnode);
                ToSubmit::Finished {
                    outputs,
                    root,
                    tasks: j.done.values().map(|r| r.tasks).sum(),
                    events: j.done.values().map(|r| r.events).sum(),
                    elapsed_s: j.elapsed(now).as_secs_f64(),
                    vnodes,
                    workers_lost: j.lost,
                    states: states.into_iter().map(|(v, (n, s))| (v, n, s)).collect(),
                    iter_stats: iter_stats.into_iter().collect(),
                    certificate: None,
                    uncertified: None,
                }
            }
        };
        // Rule 11: a followed job's summary waits for the oracle's certificate.
        if j.followed.is_some() && matches!(msg, ToSubmit::Finished { .. }) && !j.spec.iterative {
            let since = match &self.oracle {
                Some((client, _, _)) => {
                    self.out.push(Action::ToOracle {
                        client: *client,
                        msg: ToOracle::Ended { job },
                    });
                    None
                }
                None => Some(now),
            };
            j.awaiting = Some((msg, since));
            self.note(format!(
                "job {job} ended: waiting for the oracle's certificate"
            ));
            return;
        }
        self.end_job(now, job, msg);
    }

    fn end_job(&mut self, now: Duration, job: u64, msg: ToSubmit) {
        let Some(j) = self.jobs.remove(&job) else {
            return;
        };
        if let (Some(_), Some((client, _, _))) = (&j.followed, &self.oracle) {
            self.out.push(Action::ToOracle {
                client: *client,
                msg: ToOracle::Closed { job },
            });
        }
        let elapsed = j.elapsed(now).as_secs_f64();
        tracing::info!(
            job,
            elapsed_s = elapsed,
            failed = matches!(msg, ToSubmit::Failed { .. }),
            cancelled = j.cancelled,
            "job over"
        );
        self.note(format!(
            "job {job} {} in {elapsed:.3} s",
            if j.cancelled { "cancelled" } else { "over" }
        ));
        // Rules 10 and 12: a client that reattaches later, and `APP jobs`, read the end from
        // the journal.
        self.remember(EndedRecord {
            id: job,
            program: j.program,
            argv: j.spec.argv,
            cancelled: j.cancelled,
            end: msg.clone(),
        });
        self.journal(now);
        // Its workers are free: the next job of its program starts at the timers (rule 2).
        self.tell_client(j.client, msg);
    }

    /// Rule 5.
    fn lose(&mut self, now: Duration, id: WorkerId, reason: String) {
        let Some(w) = self.disconnect(id) else {
            return;
        };
        if self.job_of(id).is_some() {
            tracing::info!(worker = id, %reason, "worker lost");
            self.note(format!("worker {id} lost: {reason}"));
            self.drop_member(now, id, reason);
        } else {
            // Rule 5: in no job, nothing of it moves; it may come back (rule 10).
            tracing::info!(worker = id, %reason, "worker absent");
            self.note(format!(
                "worker {id} absent: {reason} (in no job: it may come back)"
            ));
            self.forget_suspicions(id);
            self.absent.insert(id, w.record());
            self.journal(now);
        }
    }

    /// Rule 11: a forger is lost for ever, in a job or not.
    fn lose_for_ever(&mut self, now: Duration, id: WorkerId, reason: String) {
        if self.disconnect(id).is_some() {
            tracing::info!(worker = id, %reason, "worker lost");
            self.note(format!("worker {id} lost: {reason}"));
            self.drop_member(now, id, reason);
        }
    }

    /// A connected worker's connection and detector entry go; returns what it was.
    fn disconnect(&mut self, id: WorkerId) -> Option<Worker> {
        let w = self.workers.remove(&id)?;
        self.detector.remove_peer(id);
        self.out.push(Action::Disconnect { worker: id });
        Some(w)
    }

    fn forget_suspicions(&mut self, id: WorkerId) {
        self.suspicions.remove(&id);
        for by in self.suspicions.values_mut() {
            by.remove(&id);
        }
    }

    /// Rule 5: worker `id` is gone; its vnodes move, journaled first (rule 9).
    fn drop_member(&mut self, now: Duration, id: WorkerId, reason: String) {
        self.gone.insert(id);
        self.forget_suspicions(id);
        let Some(j) = self.job_of(id).and_then(|j| self.jobs.get_mut(&j)) else {
            self.journal(now);
            return;
        };
        let job = j.id;
        j.members.retain(|&m| m != id);
        j.lost += 1;
        let moved_away = j.host.iter().filter(|&&h| h == id).count();
        j.failures.push((
            id,
            reason.clone(),
            now,
            u32::try_from(moved_away).unwrap_or(u32::MAX),
        ));
        if j.members.is_empty() && !j.stopping {
            // The last member: a free worker of the program (kept free for a job waiting
            // behind this one, rule 2) carries the job rather than let it fail.
            let program = j.program.clone();
            if let Some(&w) = self.free_workers(&program).first() {
                if let Some(j) = self.jobs.get_mut(&job) {
                    j.members.push(w);
                }
                self.note(format!(
                    "worker {w} joins running job {job} in place of its last member"
                ));
                // Rule 9: its membership is durable before it hears of the job. (No takeover
                // waits here: while one does, a member is still absent, so none is the last.)
                self.journal(now);
                self.catch_up(w, &[], true);
            }
        }
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.members.is_empty() && !j.stopping {
            let error = j.error.clone().filter(|_| j.cancelled).unwrap_or_else(|| {
                format!("every worker was lost (the last: worker {id}, {reason})")
            });
            self.end_job(now, job, ToSubmit::Failed { error });
            return;
        }
        if j.stopping {
            // A member lost while the job ends: if it was the recording's only wait, the
            // others' reports decide (rule 6); with none left, the run is over all the same
            // and its outputs are read from the logs.
            let recording = j.recording;
            self.journal(now);
            if !recording {
                self.maybe_finish(now, job);
            }
            return;
        }
        // Members still absent after a takeover (rule 10) host only if no member is here: a
        // vnode moved to one would move again if it does not come back.
        let here: Vec<WorkerId> = j
            .members
            .iter()
            .copied()
            .filter(|m| self.workers.contains_key(m))
            .collect();
        let candidates = if here.is_empty() { &j.members } else { &here };
        let mut moved = Vec::new();
        for v in 0..j.host.len() {
            if j.host[v] != id {
                continue;
            }
            let load = |w: &WorkerId| j.host.iter().filter(|h| *h == w).count();
            let idle_spare = candidates
                .iter()
                .copied()
                .find(|m| self.workers.get(m).is_some_and(|w| w.spare) && load(m) == 0);
            let Some(target) =
                idle_spare.or_else(|| candidates.iter().copied().min_by_key(|m| (load(m), *m)))
            else {
                break;
            };
            j.host[v] = target;
            j.epoch[v] += 1;
            tracing::info!(
                job = j.id,
                vnode = v,
                epoch = j.epoch[v],
                from = id,
                to = target,
                "vnode moved to a new epoch"
            );
            moved.push((u32::try_from(v).unwrap_or(u32::MAX), target, j.epoch[v]));
        }
        if let Some(f) = j.followed.as_mut() {
            f.hosts.extend(moved.iter().map(|&(v, w, e)| (v, e, w)));
        }
        // The termination test starts over (rule 5).
        j.round += 1;
        j.outstanding = false;
        j.probe_period = self.cfg.probe_every;
        j.statuses.clear();
        j.last_words = None;
        j.completed.remove(&id);
        let (client, members, followed) = (j.client, j.members.clone(), j.followed.is_some());
        // Rule 9: the new map is durable before anyone hears of it.
        self.journal(now);
        for m in members {
            let peers = self.peers_for(m, job);
            self.send(
                m,
                ToWorker::Map {
                    job,
                    map: moved.clone(),
                    peers,
                },
            );
        }
        for &(vnode, target, epoch) in &moved {
            self.send(target, ToWorker::Host { job, vnode, epoch });
        }
        if let (Some((oracle, _, _)), true) = (&self.oracle, followed) {
            let hosts: Vec<Hosting> = moved.iter().map(|&(v, w, e)| (v, e, w)).collect();
            self.out.push(Action::ToOracle {
                client: *oracle,
                msg: ToOracle::Hosts { job, hosts },
            });
        }
        self.tell_client(
            client,
            ToSubmit::WorkerLost {
                worker: id,
                reason,
                moved: moved.iter().map(|&(v, t, _)| (v, t)).collect(),
            },
        );
    }
}

impl Coordinator {
    /// The job the oracle follows, if any (rule 11: one at a time).
    fn followed_job(&self) -> Option<u64> {
        self.jobs
            .values()
            .find(|j| j.running && j.followed.is_some())
            .map(|j| j.id)
    }

    /// Rule 11: tells the connected oracle to follow the followed job, if one runs.
    fn follow(&mut self, _now: Duration) {
        let Some((client, _, _)) = &self.oracle else {
            return;
        };
        let client = *client;
        let Some(j) = self.followed_job().and_then(|j| self.jobs.get(&j)) else {
            return;
        };
        let Some(f) = &j.followed else { return };
        let (job, argv, vnodes, hosts) = (
            j.id,
            j.spec.argv.clone(),
            u32::try_from(j.host.len()).unwrap_or(u32::MAX),
            f.hosts.clone(),
        );
        let waits = j.awaiting.is_some();
        self.out.push(Action::ToOracle {
            client,
            msg: ToOracle::Follow {
                job,
                argv,
                vnodes,
                hosts,
            },
        });
        if waits {
            self.out.push(Action::ToOracle {
                client,
                msg: ToOracle::Ended { job },
            });
        }
    }

    fn on_oracle_joined(
        &mut self,
        now: Duration,
        client: ClientId,
        program: String,
        public_key: [u8; 32],
        following: Option<u64>,
    ) {
        let refusal = if let Some((other, _, _)) = &self.oracle {
            Some(format!(
                "an online oracle already follows this cluster (connection {other}); one at a time"
            ))
        } else if program.is_empty() || program.len() > self.cfg.limits.max_name {
            Some(format!(
                "its program's name has {} bytes (1..={} allowed)",
                program.len(),
                self.cfg.limits.max_name
            ))
        } else {
            self.followed_job()
                .and_then(|j| self.jobs.get(&j))
                .filter(|j| j.program != program)
                .map(|j| {
                    format!(
                        "it runs {}, and job {} that an oracle followed runs {}",
                        clip(&program, self.cfg.limits.max_name),
                        j.id,
                        j.program
                    )
                })
        };
        if let Some(reason) = refusal {
            self.note(format!(
                "refused an oracle on connection {client}: {reason}"
            ));
            self.out.push(Action::ToOracle {
                client,
                msg: ToOracle::Refused { reason },
            });
            return;
        }
        self.note(format!(
            "online oracle of {program} joined on connection {client}{}",
            following
                .map(|j| format!(" (it followed job {j})"))
                .unwrap_or_default()
        ));
        self.out.push(Action::ToOracle {
            client,
            msg: ToOracle::Welcome {
                store: self.cfg.store_spec.clone(),
                program: program.clone(),
                coordinators: self.coordinators(),
            },
        });
        self.oracle = Some((client, public_key, program));
        if let Some(j) = self.followed_job().and_then(|j| self.jobs.get_mut(&j)) {
            if let Some((_, since)) = j.awaiting.as_mut() {
                *since = None;
            }
        }
        self.follow(now);
    }

    fn on_oracle_closed(&mut self, now: Duration, client: ClientId, reason: String) {
        if self.oracle.as_ref().map(|(c, _, _)| *c) != Some(client) {
            return;
        }
        self.oracle = None;
        self.note(format!("online oracle lost: {reason}"));
        for j in self.jobs.values_mut() {
            if let Some((_, since)) = j.awaiting.as_mut() {
                *since = Some(now);
            }
        }
    }

    fn on_oracle(&mut self, now: Duration, client: ClientId, msg: FromOracle) {
        if self.oracle.as_ref().map(|(c, _, _)| *c) != Some(client) {
            return;
        }
        let followed = |job: u64, jobs: &BTreeMap<u64, Job>| {
            jobs.get(&job).is_some_and(|j| j.followed.is_some())
        };
        match msg {
            FromOracle::Committed { job, commitment } => {
                if !followed(job, &self.jobs) {
                    return;
                }
                let Some(j) = self.jobs.get_mut(&job) else {
                    return;
                };
                if let Some(f) = j.followed.as_mut() {
                    f.commitment = Some(commitment);
                }
                let c = j.client;
                self.journal(now);
                let hex = veriflow_checkpoint::hex::encode(&commitment);
                self.note(format!("job {job}: the oracle committed to {hex}"));
                self.tell_client(c, ToSubmit::Oracle { commitment: hex });
            }
            FromOracle::Forged {
                job,
                vnode,
                epoch,
                task,
                reason,
            } => {
                if !followed(job, &self.jobs) {
                    return;
                }
                self.evict(now, job, vnode, epoch, &task, &reason);
            }
            FromOracle::Certified {
                job,
                decision,
                certificate,
                outputs,
            } => {
                let Some(j) = self.jobs.get_mut(&job) else {
                    return;
                };
                let Some((mut msg, _)) = j.awaiting.take() else {
                    return;
                };
                if let ToSubmit::Finished {
                    outputs: o,
                    certificate: c,
                    ..
                } = &mut msg
                {
                    *o = outputs;
                    *c = Some(certificate);
                }
                self.note(format!("job {job} certified online: {decision}"));
                self.end_job(now, job, msg);
            }
            FromOracle::Failed { job, error } => {
                if self.jobs.get(&job).is_some_and(|j| j.awaiting.is_some()) {
                    self.end_uncertified(now, job, format!("the online oracle failed: {error}"));
                } else {
                    self.note(format!("the online oracle failed on job {job}: {error}"));
                }
            }
            // For the driver's observers only (`observe` rule 2).
            FromOracle::Checked { .. } => {}
        }
    }

    /// Rule 11: the host of incarnation (vnode, epoch) of `job` is evicted.
    fn evict(&mut self, now: Duration, job: u64, vnode: u32, epoch: u64, task: &str, why: &str) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let Some(f) = j.followed.as_mut() else { return };
        let Some(&(_, _, w)) = f.hosts.iter().find(|&&(v, e, _)| v == vnode && e == epoch) else {
            self.note(format!(
                "the oracle named vnode {vnode} at epoch {epoch}, which job {job} never had"
            ));
            return;
        };
        if f.evicted.iter().any(|(e, _)| *e == w) {
            return;
        }
        let key = self
            .workers
            .get(&w)
            .map(|x| x.public_key)
            .or_else(|| self.absent.get(&w).map(|m| m.public_key))
            .unwrap_or_default();
        f.evicted.push((w, key));
        tracing::warn!(
            job,
            worker = w,
            vnode,
            epoch,
            task,
            why,
            "worker evicted: the oracle caught it forging"
        );
        let reason = format!("evicted: the online oracle found task {task} forged ({why})");
        if self.workers.contains_key(&w) {
            self.lose_for_ever(now, w, reason);
        } else {
            if self.absent.remove(&w).is_some() {
                self.drop_member(now, w, reason);
            }
            self.journal(now);
        }
        if let Some((client, _, _)) = &self.oracle {
            self.out.push(Action::ToOracle {
                client: *client,
                msg: ToOracle::Evicted { job, worker: w },
            });
        }
    }

    /// Rule 11: the waiting summary of `job` goes out without a certificate.
    fn end_uncertified(&mut self, now: Duration, job: u64, why: String) {
        let Some((mut msg, _)) = self.jobs.get_mut(&job).and_then(|j| j.awaiting.take()) else {
            return;
        };
        if let ToSubmit::Finished { uncertified, .. } = &mut msg {
            *uncertified = Some(why.clone());
        }
        self.note(format!("job {job} ends uncertified: {why}"));
        self.end_job(now, job, msg);
    }
}

/// Rule 10: whether `signature` is worker `id`'s Ed25519 signature of this connection's
/// channel binding under `public_key`.
pub fn verify_rejoin(
    public_key: &[u8; 32],
    binding: &[u8; 32],
    id: WorkerId,
    signature: &[u8],
) -> bool {
    let Ok(key) = ed25519_dalek::VerifyingKey::from_bytes(public_key) else {
        return false;
    };
    let Ok(sig) = ed25519_dalek::Signature::from_slice(signature) else {
        return false;
    };
    key.verify_strict(&rejoin_message(binding, id), &sig)
        .is_ok()
}

/// Rule 7: a job's spec within the limits.
fn check_spec(spec: &JobSpec, l: &Limits) -> Result<(), String> {
    if spec.vnodes > l.max_vnodes {
        return Err(format!(
            "the job asks for {} vnodes; at most {} are allowed",
            spec.vnodes, l.max_vnodes
        ));
    }
    if spec.min_workers > l.max_min_workers {
        return Err(format!(
            "the job waits for {} workers; at most {} are allowed",
            spec.min_workers, l.max_min_workers
        ));
    }
    let bytes: usize = spec.argv.iter().map(String::len).sum();
    if spec.argv.len() > l.max_argv || bytes > l.max_argv_bytes {
        return Err(format!(
            "the job's command line has {} arguments and {bytes} bytes; at most {} and {} are \
             allowed",
            spec.argv.len(),
            l.max_argv,
            l.max_argv_bytes
        ));
    }
    Ok(())
}

/// An ended job in a [`ClusterStatus`] (rule 12).
fn ended_status(e: &EndedRecord) -> JobStatus {
    let mut st = JobStatus {
        id: e.id,
        program: e.program.clone(),
        argv: e.argv.clone(),
        run: crate::job_run_name(e.id),
        ..JobStatus::default()
    };
    match &e.end {
        ToSubmit::Finished {
            tasks,
            elapsed_s,
            workers_lost,
            vnodes,
            ..
        } => {
            st.state = "finished".to_string();
            st.tasks_completed = *tasks;
            st.elapsed_s = *elapsed_s;
            st.workers_lost = *workers_lost;
            st.vnodes = u32::try_from(vnodes.len()).unwrap_or(u32::MAX);
            if *elapsed_s > 0.0 {
                st.tasks_per_s = *tasks as f64 / elapsed_s;
            }
        }
        ToSubmit::Failed { error } => {
            st.state = if e.cancelled { "cancelled" } else { "failed" }.to_string();
            st.error = Some(error.clone());
        }
        _ => st.state = "unknown".to_string(),
    }
    st
}

/// At most `max` bytes of `s`, for messages that quote what a peer sent.
fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests;

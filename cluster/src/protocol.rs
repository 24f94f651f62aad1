//! The messages between a coordinator, its workers and a submitting client, and between
//! workers (all carried in encrypted, authenticated frames: `veriflow_checkpoint::wire`).
#![allow(missing_docs)] // fields are named for what they carry; variants say the rest

use serde::{Deserialize, Serialize};
use veriflow_runtime::detect::{FdParams, Heartbeat};
use veriflow_runtime::iterative::NodeStats;
use veriflow_runtime::transport::Envelope;
use veriflow_runtime::VnodeStats;

/// A worker process, numbered by the coordinator from 1 in order of joining.
pub type WorkerId = u32;

/// The first message on a connection to the coordinator.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Hello {
    /// A worker joins.
    Worker {
        /// Program (app) it runs: it serves jobs of that program only (`coordinator` rule 2).
        program: String,
        /// Where its peers reach it.
        peer_addr: String,
        /// Its threads.
        threads: u32,
        /// Whether it waits idle until needed for recovery.
        spare: bool,
        /// Its Ed25519 public key (`coordinator` rule 10).
        public_key: [u8; 32],
    },
    /// A worker admitted by an earlier coordinator comes back to its successor
    /// (`coordinator` rule 10).
    Rejoin(Box<Rejoin>),
    /// A client submits a job.
    Submit {
        /// Program (app) of the job.
        program: String,
        /// The job.
        job: JobSpec,
    },
    /// A client follows job `job` again after its coordinator was replaced.
    Attach {
        /// The job's id.
        job: u64,
    },
    /// A client asks for the cluster's status ([`ToSubmit::Status`]); read-only, the
    /// connection closes after the answer.
    Status,
    /// A client cancels job `job` (`coordinator` rule 12): [`ToSubmit::Cancelled`] or
    /// [`ToSubmit::Failed`] answers, and the connection closes.
    Cancel {
        /// The job's id.
        job: u64,
    },
    /// The online oracle (`oracle` rules) follows the cluster's jobs.
    Oracle {
        /// The program whose tasks it can re-run: it follows jobs of that program only.
        program: String,
        /// Its Ed25519 public key, which signs its certificates.
        public_key: [u8; 32],
        /// The job it was following when its coordinator was replaced, if any.
        following: Option<u64>,
    },
}

/// A vnode incarnation and its host: (vnode, epoch, worker).
pub type Hosting = (u32, u64, WorkerId);

/// Coordinator to the online oracle.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToOracle {
    /// Admitted: the store the job logs into, and every coordinator address known.
    Welcome {
        store: String,
        program: String,
        coordinators: Vec<String>,
    },
    /// This coordinator is a standby: try the others (`active` if it knows it).
    Standby { active: Option<String> },
    /// The hello was refused; the connection closes next.
    Refused { reason: String },
    /// Follow job `job`: every incarnation so far and its host.
    Follow {
        job: u64,
        argv: Vec<String>,
        vnodes: u32,
        hosts: Vec<Hosting>,
    },
    /// New incarnations (vnodes moved).
    Hosts { job: u64, hosts: Vec<Hosting> },
    /// The worker was evicted for forging: its vnodes moved.
    Evicted { job: u64, worker: WorkerId },
    /// The run is over and recorded as finished: certify it now.
    Ended { job: u64 },
    /// The job's end was sent to its client with the oracle's certificate: it is over.
    Closed { job: u64 },
}

/// The online oracle to its coordinator.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromOracle {
    /// The commitment (blake3 of the secret draw seed) published before any task of `job` is
    /// checked.
    Committed { job: u64, commitment: [u8; 32] },
    /// A completed task of incarnation (vnode, epoch) is forged: evict its worker.
    Forged {
        job: u64,
        vnode: u32,
        epoch: u64,
        task: String,
        reason: String,
    },
    /// The certificate of `job` (signed JSON), its decision, and the terminal outputs of the
    /// generation it certified (corrected if anything was forged).
    Certified {
        job: u64,
        decision: String,
        certificate: String,
        outputs: Vec<Vec<u8>>,
    },
    /// The oracle could not certify `job`.
    Failed { job: u64, error: String },
    /// The oracle checked `tasks` more completed tasks of `job` (for the observers: the
    /// dashboard and `/metrics`; the state machine ignores it).
    Checked { job: u64, tasks: u64 },
}

/// A worker's claim when it comes back to a new coordinator (`coordinator` rule 10).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rejoin {
    /// Its id.
    pub id: WorkerId,
    /// Program (app) it runs.
    pub program: String,
    /// Where its peers reach it.
    pub peer_addr: String,
    /// Its threads.
    pub threads: u32,
    /// Whether it joined as a spare.
    pub spare: bool,
    /// Ed25519 signature of [`rejoin_message`] with the key it joined with.
    pub signature: Vec<u8>,
    /// The job it runs, and the vnodes it hosts there at their epochs.
    pub job: Option<(u64, Vec<(u32, u64)>)>,
    /// Its part of the last job, if that ended here (kept until the next job starts).
    pub report: Option<(u64, Result<WorkerReport, String>)>,
}

/// What a rejoining worker signs: the connection's channel binding, so a signature cannot be
/// replayed on another connection.
pub fn rejoin_message(binding: &[u8; 32], id: WorkerId) -> Vec<u8> {
    let mut m = b"veriflow rejoin v1".to_vec();
    m.extend_from_slice(binding);
    m.extend_from_slice(&id.to_le_bytes());
    m
}

/// A job: the submit command's own arguments (each worker parses them with the same command
/// line), and the run options the coordinator needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// `submit` and its arguments, as typed.
    pub argv: Vec<String>,
    /// Vnodes (0: one per worker thread).
    pub vnodes: u32,
    /// Wait until this many workers have joined (up to a deadline) before starting.
    pub min_workers: u32,
    /// An iterative run (`Program::iterative`): the result is every vnode's final state.
    pub iterative: bool,
}

/// Coordinator to worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToWorker {
    /// Admitted: its id, the store every member logs into, and the failure detector's
    /// parameters.
    Welcome {
        id: WorkerId,
        store: String,
        fd: FdParams,
        /// Every coordinator address known, the active one first (`coordinator` rule 10).
        coordinators: Vec<String>,
    },
    /// This coordinator is a standby: try the others (`active` if it knows it).
    Standby { active: Option<String> },
    /// A heartbeat of the coordinator's failure detector.
    Heartbeat(Heartbeat),
    /// The hello was refused (rule 7 of `coordinator`): the connection closes next.
    Refused { reason: String },
    /// Start job `job`: host these vnodes (at these epochs); `map` gives every vnode's host.
    Start {
        job: u64,
        spec: JobSpec,
        vnodes: u32,
        hosted: Vec<(u32, u64)>,
        starts: bool,
        map: Vec<(u32, WorkerId, u64)>,
        peers: Vec<PeerInfo>,
    },
    /// Vnodes moved (their host died): new hosts and epochs.
    Map {
        job: u64,
        map: Vec<(u32, WorkerId, u64)>,
        peers: Vec<PeerInfo>,
    },
    /// Host `vnode` from now on, rebuilt from its log, at `epoch`.
    Host { job: u64, vnode: u32, epoch: u64 },
    /// Report the work words of the hosted vnodes (termination test).
    Probe { job: u64, round: u64 },
    /// The job is over: finish and report.
    Stop { job: u64 },
}

/// Worker to coordinator.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToCoord {
    /// Answer to a probe.
    Status {
        job: u64,
        round: u64,
        work: Vec<(u32, u64)>,
        completed: u64,
        started: bool,
    },
    /// The worker's part of the job is over.
    Done { job: u64, report: WorkerReport },
    /// The worker's part of the job failed.
    Failed { job: u64, error: String },
    /// A heartbeat of the worker's failure detector (every message counts as one).
    Heartbeat(Heartbeat),
    /// The worker's failure detector declared another worker broken.
    Broken { worker: WorkerId },
    /// The worker's runtime counters (`veriflow_runtime::metrics`), sent after each probe
    /// answer; only the driver's observers read them (`observe` rule 2).
    Metrics(veriflow_runtime::metrics::RuntimeMetrics),
}

/// What a worker did in a job.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    pub outputs: Option<Vec<Vec<u8>>>,
    /// Iterative runs: final states of the vnodes that finished here (vnode, steps, state).
    pub states: Vec<(u32, u64, Vec<u8>)>,
    /// Iterative runs: counters of the vnodes' incarnations that ran here.
    pub iter_stats: Vec<(u32, NodeStats)>,
    pub tasks: u64,
    pub events: u64,
    pub vnodes: Vec<VnodeStats>,
}

/// Coordinator to a submitting client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToSubmit {
    /// The job runs on these workers.
    Accepted {
        job: u64,
        workers: u32,
        spares: u32,
        vnodes: u32,
        store: String,
    },
    /// The job `job` waits in the coordinator's queue: `ahead` jobs of its program run or wait
    /// before it, and it starts when their workers are free (`Accepted` then).
    Queued { job: u64, ahead: u32 },
    /// The answer to [`Hello::Cancel`]: job `job` was cancelled in state `was` (`queued` or
    /// `running`); its own client hears `Failed`.
    Cancelled { job: u64, was: String },
    /// Tasks completed so far.
    Progress { completed: u64 },
    /// The coordinator at `coordinator` took over the job (its predecessor was lost).
    Takeover { coordinator: String },
    /// This coordinator is a standby: try the others (`active` if it knows it).
    Standby { active: Option<String> },
    /// An online oracle follows the job; `commitment` is blake3 of its secret draw seed,
    /// revealed in the final certificate.
    Oracle { commitment: String },
    /// A worker was lost; its vnodes moved.
    WorkerLost {
        worker: WorkerId,
        reason: String,
        moved: Vec<(u32, WorkerId)>,
    },
    /// The job finished.
    Finished {
        outputs: Vec<Vec<u8>>,
        root: String,
        tasks: u64,
        events: u64,
        elapsed_s: f64,
        vnodes: Vec<VnodeStats>,
        workers_lost: u32,
        /// Iterative runs: every vnode's final state (vnode, steps, state).
        states: Vec<(u32, u64, Vec<u8>)>,
        /// Iterative runs: per-vnode counters, summed over incarnations.
        iter_stats: Vec<(u32, NodeStats)>,
        /// The online oracle's signed certificate (JSON), if one followed the job.
        certificate: Option<String>,
        /// Why a job an oracle followed ends without its certificate.
        uncertified: Option<String>,
    },
    /// The job failed.
    Failed { error: String },
    /// The answer to [`Hello::Status`].
    Status(Box<ClusterStatus>),
}

/// A coordinator's view of its cluster (`APP status`): a snapshot, built by
/// `Coordinator::status` without changing anything. Times are seconds; `*_ago_s` count back
/// from the snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The coordinator asked.
    pub coordinator: String,
    /// `active`, or `standby` (then only `active` is filled in).
    pub role: String,
    /// The active coordinator, if known.
    pub active: Option<String>,
    /// Every coordinator address known, this one first.
    pub coordinators: Vec<String>,
    /// This coordinator's term (`journal` rule 1).
    pub term: u64,
    /// Whether this coordinator took over from a predecessor's journal (rule 10).
    pub took_over: bool,
    /// Whether it still waits for the predecessor's members to come back (rule 10).
    pub recovering: bool,
    /// Members of a predecessor that have not come back yet.
    pub absent: Vec<WorkerId>,
    /// Submissions waiting for their workers.
    pub waiting: u32,
    /// Every job this coordinator knows, by id: queued, running, and the last ones ended
    /// (`coordinator` rule 12 keeps [`ENDED_KEPT`]).
    pub jobs: Vec<JobStatus>,
    /// The workers admitted and not lost, by id.
    pub workers: Vec<WorkerStatus>,
    /// Ids of every worker lost since the cluster started (never admitted again).
    pub gone: Vec<WorkerId>,
    /// What this coordinator did since it started: the per-member costs that bound a
    /// cluster's size (`paper scale`).
    #[serde(default)]
    pub counters: CoordCounters,
}

/// The coordinator's own traffic and its termination test, counted over its life (they only
/// grow; lost workers' last reports are kept). In a [`ClusterStatus`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CoordCounters {
    /// Messages received from workers, heartbeats included.
    pub messages_in: u64,
    /// Messages sent to workers, heartbeats included.
    pub messages_out: u64,
    /// Failure-detector heartbeats received from workers.
    pub heartbeats_in: u64,
    /// Failure-detector heartbeats sent to workers.
    pub heartbeats_out: u64,
    /// Heartbeats the workers sent (to the coordinator and to each other), as each worker's
    /// last counters said (`ToCoord::Metrics`).
    pub worker_heartbeats: u64,
    /// Probe rounds of the termination test that every member answered.
    pub probe_rounds: u64,
    /// Probes sent (one per member per round).
    pub probes_sent: u64,
    /// Vnode work words those rounds' answers carried (V per complete round).
    pub words_received: u64,
    /// Time of the complete rounds, from the probes to the last answer, summed, in µs.
    pub probe_round_us_sum: u64,
    /// The longest of them, in µs.
    pub probe_round_us_max: u64,
    /// The last run's end as the termination test saw it: from the start of the first of the
    /// two idle rounds that ended it to the stop, in µs.
    pub last_detection_us: Option<u64>,
}

/// How many ended jobs a coordinator keeps for `APP jobs` and for clients that attach after
/// the end (`coordinator` rule 12).
pub const ENDED_KEPT: usize = 64;

/// A job in a [`ClusterStatus`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    pub id: u64,
    /// The program (app) it runs.
    pub program: String,
    /// The submit command line, as typed.
    pub argv: Vec<String>,
    /// `queued`, `checking store`, `running`, `stopping`, `cancelling`, `recording`, then
    /// `finished`, `failed` or `cancelled`.
    pub state: String,
    pub vnodes: u32,
    pub members: Vec<WorkerId>,
    /// Tasks completed: as the last probe answers say while it runs, the total once finished.
    pub tasks_completed: u64,
    pub tasks_per_s: f64,
    /// Time the job has run, a predecessor's included.
    pub elapsed_s: f64,
    /// Workers lost in this job.
    pub workers_lost: u32,
    /// Its map while it runs: every vnode's host and epoch.
    pub map: Vec<VnodeStatus>,
    /// Workers lost in it under this coordinator (the count in `workers_lost` includes a
    /// predecessor's losses).
    pub failures: Vec<FailureStatus>,
    /// Why it failed or was cancelled.
    pub error: Option<String>,
    /// Its logs' namespace in the store (`certify --store SPEC --run NAME`).
    pub run: String,
}

impl JobStatus {
    /// Whether it has ended (finished, failed or cancelled).
    pub fn ended(&self) -> bool {
        matches!(self.state.as_str(), "finished" | "failed" | "cancelled")
    }
}

/// A worker in a [`ClusterStatus`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub id: WorkerId,
    /// The program (app) it runs.
    pub program: String,
    /// The job it is a member of, if any (a worker serves one job at a time).
    pub job: Option<u64>,
    /// Where its peers reach it.
    pub addr: String,
    pub threads: u32,
    pub spare: bool,
    /// Vnodes it hosts in its job.
    pub vnodes: u32,
    /// Since the coordinator's detector last heard from it.
    pub last_heard_ago_s: Option<f64>,
    /// The coordinator's detector's verdict: `alive`, `unreachable` or `broken`.
    pub detector: String,
    /// Tasks it completed in its job, as its last probe answer says.
    #[serde(default)]
    pub tasks_completed: u64,
}

/// A vnode in a [`ClusterStatus`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VnodeStatus {
    pub vnode: u32,
    pub worker: WorkerId,
    pub epoch: u64,
}

/// A worker lost in a job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FailureStatus {
    pub worker: WorkerId,
    pub reason: String,
    /// When, counted back from the snapshot.
    pub ago_s: f64,
    /// Vnodes that moved away from it.
    pub moved: u32,
}

/// Another worker as the coordinator introduces it (rule 8 of `coordinator`).
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PeerInfo {
    /// Its id.
    pub id: WorkerId,
    /// Where it listens for peers.
    pub addr: String,
    /// The key of the link between it and the receiver of this message.
    pub link_key: [u8; 32],
}

impl std::fmt::Debug for PeerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The link key is a secret: never in a log line.
        f.debug_struct("PeerInfo")
            .field("id", &self.id)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Worker to worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)] // nearly every frame is a `Msg`
pub enum Peer {
    /// First frame: who is calling, proved with the link key over the connection's channel
    /// binding (rule 5 of `worker`).
    Hello {
        from: WorkerId,
        to: WorkerId,
        proof: [u8; 32],
    },
    /// A vnode message.
    Msg { to: u32, env: Envelope },
    /// A heartbeat of the sender's failure detector.
    Heartbeat(Heartbeat),
}

impl From<veriflow_runtime::MemberReport> for WorkerReport {
    /// What a data-flow member did, as the coordinator hears it.
    fn from(r: veriflow_runtime::MemberReport) -> Self {
        WorkerReport {
            outputs: r.outputs,
            tasks: r.tasks,
            events: r.events,
            vnodes: r.vnodes,
            ..WorkerReport::default()
        }
    }
}

impl ToCoord {
    /// The answer to probe `round` of `job` from the member's shared status (`worker` rule 4);
    /// `None` when no member of that job runs here.
    pub fn status(
        job: u64,
        round: u64,
        status: Option<&veriflow_runtime::MemberStatus>,
    ) -> ToCoord {
        let (work, completed, started) = match status.and_then(|s| s.work().map(|w| (w, s))) {
            Some((w, s)) => (w, s.completed(), true),
            None => (Vec::new(), 0, false),
        };
        ToCoord::Status {
            job,
            round,
            work: work.into_iter().map(|(v, w)| (v.0, w)).collect(),
            completed,
            started,
        }
    }
}

//! A worker: joins a coordinator, hosts vnodes of the jobs it is given, and carries their
//! messages to the other workers.
//!
//! [`WorkerCore`] is the worker's I/O-free state machine: routes, held messages, the failure
//! detector and the coordinator's orders. The job's vnodes themselves (the runtime's
//! [`Member`](veriflow_runtime::Member)) run beside it: the tokio driver ([`run_worker`]) runs
//! them on threads, the simulator (`crate::sim`) steps them on its one thread.
//!
//! Rules:
//!
//! 1. A worker that cannot reach a coordinator retries every address it knows with backoff,
//!    then stops with an error naming them. A worker that loses its coordinator (the
//!    connection ends, or its detector declares the coordinator broken) keeps its vnodes
//!    running, stops talking to it ([`Event::CoordLost`]: no heartbeats, reports or
//!    suspicions), and comes back to whichever coordinator holds the role
//!    ([`Event::CoordBack`]), with a claim ([`WorkerCore::rejoin_claim`]) of the vnodes it hosts
//!    at which epochs and how its part of the last job ended (`coordinator` rule 10). A worker
//!    no coordinator takes back within its patience stops its job and exits with an error.
//! 2. Vnode messages travel worker to worker on authenticated links, opened on first use and
//!    dropped on the first error (the vnode protocol resends what matters). A message for a
//!    vnode with no known host is held and sent when the coordinator maps it (paper 004); one
//!    that reaches a worker not hosting its vnode is forwarded by the current map.
//! 3. The failure detector (`veriflow_runtime::detect`, paper 004 §4) watches the coordinator
//!    (peer 0) and the other workers: heartbeats to k random peers on the same links as the
//!    messages, every frame received counts, a closed link is broken at once; a worker it
//!    declares broken is reported to the coordinator, which decides (`coordinator` rule 4).
//!    The driver runs the detector's timers on a thread of their own, which sleeps until
//!    [`WorkerCore::next_deadline`] and is woken when an event brings that deadline earlier.
//! 4. Every order of the coordinator about vnodes (new hosts, epochs, hosting one here) goes to
//!    the member at once; probes are answered from the member's shared status without waiting
//!    for its compute threads.
//! 5. A peer link starts with `Peer::Hello { from, to, proof }`, the proof a keyed blake3 of
//!    the connection's channel binding under the link key of `from` and `to`, which only the
//!    coordinator and those two workers know (`coordinator` rule 8). A link whose hello does
//!    not prove its claim is refused and noted; nothing it carries counts, and its closing
//!    accuses nobody.

pub(crate) mod driver;

use std::collections::BTreeMap;
use std::time::Duration;

use veriflow_runtime::detect::{Action as FdAction, Detector, FdParams};
use veriflow_runtime::transport::Envelope;
use veriflow_runtime::{Control, Epoch, VnodeId};

pub use driver::{run_worker, JobContext, RunJob, WorkerConfig};

/// The vnode timers of a cluster member: an idle vnode's steal back-off grows to 20 ms per
/// vnode a thread (the runtime's `Timers::per_thread`) instead of the 2 ms of one process. A
/// steal request between processes costs about 100 µs of CPU for it and its refusal (measured
/// on loopback with 16 workers on 2 cores: 430,000 messages for 48 CPU-s), against about 1 µs
/// in-process; at 2 ms an idle thread spent ~10 % of a core asking, at 20 ms ~1 %. With 64
/// one-thread workers on 2 cores, 2 ms made 64,000 messages a second and the failure
/// detectors' heartbeats came late enough to evict live workers (issue 16).
pub fn member_timers() -> veriflow_runtime::Timers {
    veriflow_runtime::Timers {
        steal_backoff_max: std::time::Duration::from_millis(20),
        ..veriflow_runtime::Timers::default()
    }
}

use crate::protocol::{JobSpec, Peer, PeerInfo, ToCoord, ToWorker, WorkerId, WorkerReport};

/// The proof of a peer hello (rule 5).
pub fn hello_proof(
    link_key: &[u8; 32],
    binding: &[u8; 32],
    from: WorkerId,
    to: WorkerId,
) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(link_key);
    h.update(b"veriflow peer hello v1");
    h.update(binding);
    h.update(&from.to_le_bytes());
    h.update(&to.to_le_bytes());
    *h.finalize().as_bytes()
}

/// What happens to a worker.
#[derive(Debug, Clone)]
pub enum Event {
    /// The coordinator sent `msg`.
    FromCoord(ToWorker),
    /// A frame arrived on an authenticated peer link from `from` (rule 5: the driver passes
    /// only frames of links whose hello [`WorkerCore::check_hello`] accepted).
    FromPeer {
        /// The worker at the other end.
        from: WorkerId,
        /// The frame.
        frame: Peer,
    },
    /// A link with `peer` closed or reset (either direction).
    PeerClosed {
        /// The worker.
        peer: WorkerId,
    },
    /// A vnode hosted here sends `env` to vnode `to`.
    Outbound {
        /// The receiving vnode.
        to: u32,
        /// The message.
        env: Envelope,
    },
    /// The job's member ended.
    JobEnded {
        /// The job.
        job: u64,
        /// Its report, or why it failed.
        result: Result<crate::protocol::WorkerReport, String>,
    },
    /// The coordinator is gone: the driver looks for its successor (rule 1).
    CoordLost,
    /// A coordinator took this worker back (rule 1).
    CoordBack,
    /// Time passed: run the detector's timers.
    Tick,
}

/// What the worker asks of its driver.
#[derive(Debug, Clone)]
pub enum Action {
    /// Send `msg` to the coordinator.
    ToCoord(ToCoord),
    /// Send `frame` to worker `worker` at `addr`, on the link opened on first use (its hello
    /// proved with `link_key`, rule 5).
    ToPeer {
        /// The worker.
        worker: WorkerId,
        /// Where it listens.
        addr: String,
        /// Our link key with it.
        link_key: [u8; 32],
        /// The frame.
        frame: Peer,
    },
    /// Deliver `env` to hosted vnode `to`.
    Deliver {
        /// The vnode.
        to: u32,
        /// The message.
        env: Envelope,
    },
    /// Start the member of job `job` with these vnodes.
    StartJob {
        /// The job.
        job: u64,
        /// Its spec (the command line every member parses).
        spec: JobSpec,
        /// Vnodes of the run.
        vnodes: u32,
        /// Vnodes hosted here from the start, with their epochs.
        hosted: Vec<(VnodeId, Epoch)>,
        /// Whether this member starts the run.
        starts: bool,
    },
    /// Pass an order to the member of job `job`.
    Control {
        /// The job.
        job: u64,
        /// The order.
        order: Control,
    },
    /// Answer a probe from the member's status (rule 4).
    AnswerProbe {
        /// The job.
        job: u64,
        /// The round.
        round: u64,
    },
    /// The coordinator refused us: stop the job and exit with this error (rule 1).
    Exit(String),
    /// The coordinator fell silent: drop its connection and find its successor (rule 1).
    Reconnect(String),
    /// A line for the worker's log.
    Note(String),
}

/// The worker's state machine (rules 1-5).
pub struct WorkerCore {
    me: WorkerId,
    map: BTreeMap<u32, WorkerId>,
    peers: BTreeMap<WorkerId, PeerInfo>,
    held: BTreeMap<u32, Vec<Envelope>>,
    /// Vnodes hosted here, at their epochs.
    hosted: BTreeMap<u32, u64>,
    job: Option<u64>,
    /// How this worker's part of the last job ended, kept until the next job (rule 1).
    last_report: Option<(u64, Result<WorkerReport, String>)>,
    /// Whether a coordinator holds this worker now (rule 1).
    coord_up: bool,
    detector: Detector,
    out: Vec<Action>,
}

impl std::fmt::Debug for WorkerCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerCore")
            .field("me", &self.me)
            .field("job", &self.job)
            .field("hosted", &self.hosted)
            .finish_non_exhaustive()
    }
}

/// Most messages held for vnodes with no known host: the vnode protocol resends what
/// matters, so beyond this the oldest are dropped instead of growing without bound.
const MAX_HELD: usize = 1 << 16;

impl WorkerCore {
    /// The state of worker `me`, admitted with these detector parameters, at `now`.
    pub fn new(me: WorkerId, fd: FdParams, now: Duration) -> WorkerCore {
        let mut detector = Detector::new(me, fd, u64::from(me));
        detector.add_peer(0, now);
        WorkerCore {
            me,
            map: BTreeMap::new(),
            peers: BTreeMap::new(),
            held: BTreeMap::new(),
            hosted: BTreeMap::new(),
            job: None,
            last_report: None,
            coord_up: true,
            detector,
            out: Vec::new(),
        }
    }

    /// What this worker tells a new coordinator (rule 1, `coordinator` rule 10): its job with
    /// the vnodes it hosts at their epochs, and how its part of the last job ended.
    #[allow(clippy::type_complexity)]
    pub fn rejoin_claim(
        &self,
    ) -> (
        Option<(u64, Vec<(u32, u64)>)>,
        Option<(u64, Result<WorkerReport, String>)>,
    ) {
        let job = self
            .job
            .map(|j| (j, self.hosted.iter().map(|(&v, &e)| (v, e)).collect()));
        (job, self.last_report.clone())
    }

    /// Whether a coordinator holds this worker now.
    pub fn coordinated(&self) -> bool {
        self.coord_up
    }

    /// This worker's id.
    pub fn id(&self) -> WorkerId {
        self.me
    }

    /// The job running here, if any.
    pub fn job(&self) -> Option<u64> {
        self.job
    }

    /// When [`Event::Tick`] is due next.
    pub fn next_deadline(&self) -> Duration {
        self.detector.next_deadline()
    }

    /// Rule 5: whether a peer hello proves that worker `from` opened this link (with channel
    /// binding `binding`). A refusal is noted in the returned text.
    pub fn check_hello(
        &self,
        from: WorkerId,
        to: WorkerId,
        proof: &[u8; 32],
        binding: &[u8; 32],
    ) -> Result<(), String> {
        if to != self.me {
            return Err(format!(
                "it addressed worker {to}, this is worker {}",
                self.me
            ));
        }
        let Some(info) = self.peers.get(&from) else {
            return Err(format!(
                "it claims to be worker {from}, which is not a known peer"
            ));
        };
        // blake3::Hash compares in constant time.
        let want = blake3::Hash::from(hello_proof(&info.link_key, binding, from, to));
        if want != blake3::Hash::from(*proof) {
            return Err(format!(
                "it claims to be worker {from} without its link key"
            ));
        }
        Ok(())
    }

    /// Handles `event` at `now` and returns what to do, in order.
    #[must_use = "the actions must be carried out"]
    pub fn on_event(&mut self, now: Duration, event: Event) -> Vec<Action> {
        match event {
            Event::FromCoord(msg) => self.on_coord(now, msg),
            Event::FromPeer { from, frame } => match frame {
                Peer::Msg { to, env } => {
                    self.detector.on_message(from, now);
                    self.arrive(to, env);
                }
                Peer::Heartbeat(hb) => self.detector.on_heartbeat(from, &hb, now),
                Peer::Hello { .. } => {}
            },
            Event::PeerClosed { peer } => self.detector.on_closed(peer, now),
            Event::Outbound { to, env } => self.send(now, to, env),
            Event::JobEnded { job, result } => {
                if self.job == Some(job) {
                    self.job = None;
                    self.hosted.clear();
                }
                self.last_report = Some((job, result.clone()));
                let msg = match result {
                    Ok(report) => ToCoord::Done { job, report },
                    Err(error) => {
                        // Said here too: a coordinator that no longer counts this worker
                        // (it was declared dead: a zombie fenced at the store) ignores it.
                        self.out
                            .push(Action::Note(format!("job {job} failed here: {error}")));
                        ToCoord::Failed { job, error }
                    }
                };
                self.out.push(Action::ToCoord(msg));
            }
            Event::CoordLost => {
                if self.coord_up {
                    self.coord_up = false;
                    self.detector.remove_peer(0);
                    self.out.push(Action::Note(
                        "lost the coordinator: the vnodes go on while a successor is sought"
                            .to_string(),
                    ));
                }
            }
            Event::CoordBack => {
                if !self.coord_up {
                    self.coord_up = true;
                    self.detector.add_peer(0, now);
                }
            }
            Event::Tick => {}
        }
        if now >= self.detector.next_deadline() {
            for a in self.detector.tick(now) {
                match a {
                    FdAction::SendHeartbeat { to: 0, heartbeat } => {
                        self.out
                            .push(Action::ToCoord(ToCoord::Heartbeat(heartbeat)));
                    }
                    FdAction::SendHeartbeat { to, heartbeat } => {
                        self.send_peer(to, Peer::Heartbeat(heartbeat));
                    }
                    FdAction::Broken { peer: 0 } => {
                        self.out.push(Action::Reconnect(
                            "the failure detector declared the coordinator broken (silent: hung \
                             or cut off)"
                                .to_string(),
                        ));
                    }
                    FdAction::Broken { peer } => {
                        self.out
                            .push(Action::ToCoord(ToCoord::Broken { worker: peer }));
                    }
                    _ => {}
                }
            }
        }
        if !self.coord_up {
            // Rule 1: nothing goes to a coordinator that is gone; a report is kept in
            // `last_report` and goes with the rejoin claim.
            self.out.retain(|a| !matches!(a, Action::ToCoord(_)));
        }
        std::mem::take(&mut self.out)
    }

    fn on_coord(&mut self, now: Duration, msg: ToWorker) {
        self.detector.on_message(0, now);
        match msg {
            ToWorker::Welcome { .. } | ToWorker::Standby { .. } => {}
            ToWorker::Refused { reason } => {
                self.out.push(Action::Exit(format!(
                    "the coordinator refused this worker: {reason}"
                )));
            }
            ToWorker::Heartbeat(hb) => self.detector.on_heartbeat(0, &hb, now),
            ToWorker::Start {
                job,
                spec,
                vnodes,
                hosted,
                starts,
                map,
                peers,
            } => {
                self.map.clear();
                self.held.clear();
                self.job = Some(job);
                self.last_report = None;
                self.hosted = hosted.iter().copied().collect();
                self.remap(now, &map, peers);
                self.out.push(Action::StartJob {
                    job,
                    spec,
                    vnodes,
                    hosted: hosted
                        .into_iter()
                        .map(|(v, e)| (VnodeId(v), Epoch(e)))
                        .collect(),
                    starts,
                });
            }
            ToWorker::Map { job, map, peers } => {
                self.remap(now, &map, peers);
                if self.job == Some(job) {
                    for &(v, host, e) in &map {
                        tracing::debug!(
                            me = self.me,
                            job,
                            vnode = v,
                            epoch = e,
                            host,
                            "vnode epoch"
                        );
                        if host == self.me {
                            if let Some(he) = self.hosted.get_mut(&v) {
                                *he = (*he).max(e);
                            }
                        }
                        self.out.push(Action::Control {
                            job,
                            order: Control::Epoch(VnodeId(v), Epoch(e)),
                        });
                    }
                }
            }
            ToWorker::Host { job, vnode, epoch } => {
                if self.job == Some(job) {
                    tracing::info!(me = self.me, job, vnode, epoch, "ordered to host a vnode");
                    self.map.insert(vnode, self.me);
                    self.hosted.insert(vnode, epoch);
                    self.out.push(Action::Control {
                        job,
                        order: Control::Host(VnodeId(vnode), Epoch(epoch)),
                    });
                }
            }
            ToWorker::Probe { job, round } => {
                self.out.push(Action::AnswerProbe { job, round });
            }
            ToWorker::Stop { job } => {
                if self.job == Some(job) {
                    self.out.push(Action::Control {
                        job,
                        order: Control::Stop,
                    });
                }
            }
        }
    }

    /// Rule 2: sends `env` toward the host of `to`.
    fn send(&mut self, now: Duration, to: u32, env: Envelope) {
        match self.map.get(&to) {
            None => self.hold(to, env),
            Some(&host) if host == self.me => {
                if self.hosted.contains_key(&to) {
                    self.out.push(Action::Deliver { to, env });
                }
            }
            Some(&host) => {
                self.detector.on_sent(host, now);
                self.send_peer(host, Peer::Msg { to, env });
            }
        }
    }

    fn hold(&mut self, to: u32, env: Envelope) {
        let total: usize = self.held.values().map(Vec::len).sum();
        if total >= MAX_HELD {
            return; // the vnode protocol resends what matters (rule 2)
        }
        self.held.entry(to).or_default().push(env);
    }

    fn send_peer(&mut self, host: WorkerId, frame: Peer) {
        let Some(info) = self.peers.get(&host) else {
            if let Peer::Msg { to, env } = frame {
                self.hold(to, env);
            }
            return;
        };
        self.out.push(Action::ToPeer {
            worker: host,
            addr: info.addr.clone(),
            link_key: info.link_key,
            frame,
        });
    }

    /// A vnode message from the network (rule 2).
    fn arrive(&mut self, to: u32, env: Envelope) {
        if self.job.is_none() {
            return; // no job: nothing to deliver to
        }
        if self.hosted.contains_key(&to) && self.map.get(&to).is_none_or(|&h| h == self.me) {
            self.out.push(Action::Deliver { to, env });
            return;
        }
        match self.map.get(&to) {
            Some(&h) if h != self.me => self.send_peer(h, Peer::Msg { to, env }),
            Some(_) => {}
            None => self.hold(to, env),
        }
    }

    /// New hosts for some vnodes: remember them and send what was held for them.
    fn remap(&mut self, now: Duration, map: &[(u32, WorkerId, u64)], peers: Vec<PeerInfo>) {
        for p in peers {
            if p.id != self.me {
                self.detector.add_peer(p.id, now);
                self.peers.insert(p.id, p);
            }
        }
        for &(v, host, _) in map {
            self.map.insert(v, host);
            if host != self.me {
                self.hosted.remove(&v);
            }
        }
        for &(v, _, _) in map {
            if let Some(envs) = self.held.remove(&v) {
                for env in envs {
                    self.send(now, v, env);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

//! The coordinator: paper 001's fault-tolerance module as a process. It admits workers, maps
//! vnodes onto them, runs the termination test, reacts to failures, and holds no per-task
//! state.
//!
//! Rules:
//!
//! 1. One actor owns all state; connections only forward what they read to it, so there are
//!    no locks and events are handled in one order.
//! 2. A job maps its V vnodes round-robin onto the non-spare workers; every worker, spares too,
//!    is a member of the job. The host of vnode 0 starts the run (manifest and root).
//! 3. Termination: the coordinator probes every member for the work words of the vnodes it
//!    hosts; when two complete rounds in a row cover all V vnodes, every word has no work
//!    outstanding and no word changed, the run is over (the two-scan test of `exec/mod.rs`
//!    rule 4 across processes) and every member is told to stop.
//! 4. A worker is lost when its connection closes or resets (at once), when the coordinator's
//!    failure detector (`veriflow_runtime::detect`, paper 004 §4, on its own thread) declares
//!    it broken, or when a worker's detector does. Every message counts as a heartbeat; a
//!    coordinator that was itself stalled accuses nobody when it wakes.
//! 5. A lost worker's vnodes move, each at a new epoch, to a spare if one is idle, else to the
//!    live member with the fewest vnodes; the new host rebuilds them from their logs and every
//!    member learns the new map and epochs (so late messages of the lost incarnation are
//!    dropped). The termination test starts over.
//! 6. The job ends when every live member has reported; the coordinator then records the run
//!    as finished in the manifest and sends the summary to the client. An iterative job
//!    (`Program::iterative`, paper 000) keeps no log: its work words say which vnodes have
//!    finished their last step, a moved vnode restores from its neighbours' backups instead of
//!    a log, and its result is the final states all members returned.
//! 7. A connection that fails the handshake (no key, wrong key, replayed or malformed frame)
//!    is logged and closed; the cluster goes on.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use veriflow_checkpoint::wire::{Connection, DEFAULT_MAX_FRAME};
use veriflow_checkpoint::{Key, Store};
use veriflow_runtime::detect::{Detector, DetectorHandle, DetectorThread, FdParams, Status};
use veriflow_runtime::iterative::NodeStats;
use veriflow_runtime::log::{Manifest, RunStatus};
use veriflow_runtime::SystemClock;

use super::protocol::{Hello, JobSpec, ToCoord, ToSubmit, ToWorker, WorkerId, WorkerReport};

/// Probe rounds start at most this often: the end of a run is seen within about two rounds,
/// and the members are not kept busy answering.
const PROBE_EVERY: Duration = Duration::from_millis(5);

/// How long a submission waits for the workers it asks for.
const JOIN_PATIENCE: Duration = Duration::from_secs(30);

/// How a coordinator runs.
#[derive(Clone)]
pub(crate) struct CoordinatorConfig {
    pub(crate) program: &'static str,
    pub(crate) key: Key,
    pub(crate) store_spec: String,
    pub(crate) store: Arc<dyn Store>,
    /// The failure detector's parameters (paper 004 §4), sent to every worker too.
    pub(crate) fd: FdParams,
}

enum Ev {
    Joined {
        id: WorkerId,
        peer_addr: String,
        threads: u32,
        spare: bool,
        tx: UnboundedSender<ToWorker>,
    },
    From(WorkerId, ToCoord),
    Lost(WorkerId, String),
    Submit(JobSpec, UnboundedSender<ToSubmit>),
}

struct Worker {
    peer_addr: String,
    threads: u32,
    spare: bool,
    tx: UnboundedSender<ToWorker>,
}

/// The writers of the workers' connections, for the detector's heartbeats.
type Writers = Arc<std::sync::Mutex<HashMap<WorkerId, UnboundedSender<ToWorker>>>>;

struct Job {
    id: u64,
    iterative: bool,
    host: Vec<WorkerId>,
    epoch: Vec<u64>,
    members: Vec<WorkerId>,
    submit: UnboundedSender<ToSubmit>,
    round: u64,
    /// A probe round is in flight.
    outstanding: bool,
    /// When the last round started.
    last_round: Instant,
    statuses: HashMap<WorkerId, Vec<(u32, u64)>>,
    completed: HashMap<WorkerId, u64>,
    last_words: Option<Vec<u64>>,
    stopping: bool,
    done: HashMap<WorkerId, WorkerReport>,
    error: Option<String>,
    started: Instant,
    lost: u32,
    last_progress: Instant,
}

/// Serves forever on `listener` (rules 1-7).
pub(crate) async fn serve(listener: TcpListener, cfg: CoordinatorConfig) -> std::io::Result<()> {
    let (tx, rx) = unbounded_channel();
    // Rule 4: the coordinator's failure detector (peer 0), on its own thread.
    let writers: Writers = Arc::default();
    let sink_writers = writers.clone();
    let lost = tx.clone();
    let detector = DetectorThread::spawn(
        Detector::new(0, cfg.fd, 0),
        Arc::new(SystemClock::default()),
        move |to: WorkerId, hb| {
            let w = sink_writers.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(tx) = w.get(&to) {
                let _ = tx.send(ToWorker::Heartbeat(hb));
            }
        },
        move |peer, status| {
            if status == Status::Broken {
                let _ = lost.send(Ev::Lost(
                    peer,
                    "declared broken by the coordinator's failure detector (silent: hung or cut off)"
                        .to_string(),
                ));
            }
        },
    )?;
    let fd = detector.handle().clone();
    tokio::spawn(actor(rx, cfg.clone()));
    let mut next_id: WorkerId = 1;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        tokio::spawn(connection(
            stream,
            peer.to_string(),
            id,
            cfg.clone(),
            tx.clone(),
            fd.clone(),
            writers.clone(),
        ));
    }
}

async fn connection(
    stream: TcpStream,
    peer: String,
    id: WorkerId,
    cfg: CoordinatorConfig,
    events: UnboundedSender<Ev>,
    fd: DetectorHandle,
    writers: Writers,
) {
    let conn = match Connection::server(stream, &cfg.key, DEFAULT_MAX_FRAME).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("refused a connection from {peer}: {e}");
            eprintln!("coordinator: refused a connection from {peer}: {e}");
            return;
        }
    };
    let (mut reader, mut writer) = conn.into_split();
    let hello: Hello = match reader.recv().await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("coordinator: dropped {peer}: {e}");
            return;
        }
    };
    match hello {
        Hello::Worker {
            program,
            peer_addr,
            threads,
            spare,
        } => {
            if program != cfg.program {
                let _ = writer.send(&ToWorker::Stop { job: u64::MAX }).await;
                eprintln!(
                    "coordinator: refused worker {peer}: it runs {program}, this cluster runs {}",
                    cfg.program
                );
                return;
            }
            let (tx, mut rx) = unbounded_channel::<ToWorker>();
            let welcome = ToWorker::Welcome {
                id,
                store: cfg.store_spec.clone(),
                fd: cfg.fd,
            };
            if writer.send(&welcome).await.is_err() {
                return;
            }
            writers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, tx.clone());
            fd.joined(id);
            let _ = events.send(Ev::Joined {
                id,
                peer_addr,
                threads,
                spare,
                tx,
            });
            let writing = tokio::spawn(async move {
                while let Some(m) = rx.recv().await {
                    if writer.send(&m).await.is_err() {
                        break;
                    }
                }
            });
            let reason = loop {
                match reader.recv::<ToCoord>().await {
                    Ok(ToCoord::Heartbeat(hb)) => fd.heartbeat(id, hb),
                    Ok(m) => {
                        fd.message(id);
                        if events.send(Ev::From(id, m)).is_err() {
                            break "coordinator stopping".to_string();
                        }
                    }
                    Err(e) => break e.to_string(),
                }
            };
            // Rule 4: a closed or reset connection is a failure at once. The actor hears the
            // real reason first; the detector's own report of it then finds nobody to lose.
            let _ = events.send(Ev::Lost(id, reason));
            fd.closed(id);
            writing.abort();
            writers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
        }
        Hello::Submit { program, job } => {
            let (tx, mut rx) = unbounded_channel::<ToSubmit>();
            if program != cfg.program {
                let _ = writer
                    .send(&ToSubmit::Failed {
                        error: format!("this coordinator runs {}, not {program}", cfg.program),
                    })
                    .await;
                return;
            }
            let _ = events.send(Ev::Submit(job, tx));
            while let Some(m) = rx.recv().await {
                let last = matches!(m, ToSubmit::Finished { .. } | ToSubmit::Failed { .. });
                if writer.send(&m).await.is_err() || last {
                    break;
                }
            }
        }
    }
}

async fn actor(mut rx: UnboundedReceiver<Ev>, cfg: CoordinatorConfig) {
    let mut workers: BTreeMap<WorkerId, Worker> = BTreeMap::new();
    let mut job: Option<Job> = None;
    let mut next_job = 1u64;
    // Submissions waiting for enough workers, with their deadline.
    let mut waiting: Vec<(JobSpec, UnboundedSender<ToSubmit>, Instant)> = Vec::new();
    let tick = Duration::from_millis(2);
    loop {
        let ev = match tokio::time::timeout(tick, rx.recv()).await {
            Ok(Some(ev)) => Some(ev),
            Ok(None) => return,
            Err(_) => None,
        };
        let now = Instant::now();
        match ev {
            None => {}
            Some(Ev::Joined {
                id,
                peer_addr,
                threads,
                spare,
                tx,
            }) => {
                eprintln!(
                    "coordinator: worker {id} joined ({peer_addr}, {threads} threads{})",
                    if spare { ", spare" } else { "" }
                );
                workers.insert(
                    id,
                    Worker {
                        peer_addr,
                        threads,
                        spare,
                        tx,
                    },
                );
            }
            Some(Ev::From(id, ToCoord::Broken { worker })) if workers.contains_key(&id) => {
                let reason = format!("declared broken by worker {id}'s failure detector");
                lose(&mut workers, &mut job, worker, reason, &cfg);
            }
            Some(Ev::From(id, msg)) => {
                // Messages of a worker that was declared lost are ignored (rule 5).
                if let Some(j) = job.as_mut().filter(|j| j.members.contains(&id)) {
                    if on_message(j, &workers, id, msg, &cfg) {
                        job = None;
                    }
                }
            }
            Some(Ev::Lost(id, reason)) => {
                lose(&mut workers, &mut job, id, reason, &cfg);
            }
            Some(Ev::Submit(spec, tx)) => {
                waiting.push((spec, tx, now + JOIN_PATIENCE));
            }
        }
        // Submissions whose workers have joined start (or fail at their deadline).
        let mut still = Vec::new();
        for (spec, tx, deadline) in waiting.drain(..) {
            let ready = workers.len() >= spec.min_workers.max(1) as usize;
            if !ready && now < deadline {
                still.push((spec, tx, deadline));
                continue;
            }
            if job.is_some() {
                let _ = tx.send(ToSubmit::Failed {
                    error: "the cluster is running another job".to_string(),
                });
                continue;
            }
            match start_job(next_job, spec, &workers, tx.clone(), &cfg) {
                Ok(j) => {
                    next_job += 1;
                    job = Some(j);
                }
                Err(error) => {
                    let _ = tx.send(ToSubmit::Failed { error });
                }
            }
        }
        waiting = still;
        if let Some(j) = job.as_mut() {
            probe(j, &workers);
        }
    }
}

fn start_job(
    id: u64,
    spec: JobSpec,
    workers: &BTreeMap<WorkerId, Worker>,
    submit: UnboundedSender<ToSubmit>,
    cfg: &CoordinatorConfig,
) -> Result<Job, String> {
    if workers.len() < spec.min_workers.max(1) as usize {
        return Err(format!(
            "{} worker(s) joined this coordinator within {JOIN_PATIENCE:?}, the job asks for {}",
            workers.len(),
            spec.min_workers.max(1)
        ));
    }
    // The store's client blocks (it has its own runtime): step out of ours meanwhile.
    match tokio::task::block_in_place(|| Manifest::load(&*cfg.store)) {
        Ok(None) => {}
        Ok(Some(_)) => {
            return Err(format!(
                "the store {} already holds a run: start the coordinator on a fresh store",
                cfg.store_spec
            ))
        }
        Err(e) => return Err(format!("cannot read the store: {e}")),
    }
    let mut active: Vec<WorkerId> = workers
        .iter()
        .filter(|(_, w)| !w.spare)
        .map(|(&id, _)| id)
        .collect();
    if active.is_empty() {
        active = workers.keys().copied().collect();
    }
    let vnodes = if spec.vnodes > 0 {
        spec.vnodes
    } else {
        active.iter().map(|w| workers[w].threads.max(1)).sum()
    };
    let host: Vec<WorkerId> = (0..vnodes as usize)
        .map(|v| active[v % active.len()])
        .collect();
    let epoch = vec![0u64; vnodes as usize];
    let members: Vec<WorkerId> = workers.keys().copied().collect();
    let map: Vec<(u32, WorkerId, u64)> = (0..vnodes).map(|v| (v, host[v as usize], 0)).collect();
    let peers: Vec<(WorkerId, String)> = workers
        .iter()
        .map(|(&id, w)| (id, w.peer_addr.clone()))
        .collect();
    for &m in &members {
        let hosted: Vec<(u32, u64)> = (0..vnodes)
            .filter(|&v| host[v as usize] == m)
            .map(|v| (v, 0))
            .collect();
        let _ = workers[&m].tx.send(ToWorker::Start {
            job: id,
            spec: spec.clone(),
            vnodes,
            hosted,
            starts: host[0] == m,
            map: map.clone(),
            peers: peers.clone(),
        });
    }
    let spares = workers.len() as u32 - active.len() as u32;
    let _ = submit.send(ToSubmit::Accepted {
        workers: active.len() as u32,
        spares,
        vnodes,
        store: cfg.store_spec.clone(),
    });
    eprintln!(
        "coordinator: job {id} started: {vnodes} vnodes on {} workers ({spares} spare)",
        active.len()
    );
    let now = Instant::now();
    Ok(Job {
        id,
        iterative: spec.iterative,
        host,
        epoch,
        members,
        submit,
        round: 0,
        outstanding: false,
        last_round: now,
        statuses: HashMap::new(),
        completed: HashMap::new(),
        last_words: None,
        stopping: false,
        done: HashMap::new(),
        error: None,
        started: now,
        lost: 0,
        last_progress: now,
    })
}

/// Rule 3: starts a probe round when the previous one is complete.
fn probe(j: &mut Job, workers: &BTreeMap<WorkerId, Worker>) {
    if j.stopping || j.outstanding || j.last_round.elapsed() < PROBE_EVERY {
        return;
    }
    j.outstanding = true;
    j.last_round = Instant::now();
    j.round += 1;
    j.statuses.clear();
    for m in &j.members {
        if let Some(w) = workers.get(m) {
            let _ = w.tx.send(ToWorker::Probe {
                job: j.id,
                round: j.round,
            });
        }
    }
}

/// Handles a worker's message; returns true when the job is over.
fn on_message(
    j: &mut Job,
    workers: &BTreeMap<WorkerId, Worker>,
    id: WorkerId,
    msg: ToCoord,
    cfg: &CoordinatorConfig,
) -> bool {
    match msg {
        ToCoord::Heartbeat(_) | ToCoord::Broken { .. } => false,
        ToCoord::Status {
            job,
            round,
            work,
            completed,
            started,
        } => {
            if job != j.id || round != j.round || j.stopping {
                return false;
            }
            j.completed.insert(id, completed);
            if !started {
                j.last_words = None;
            }
            j.statuses.insert(id, work);
            if j.statuses.len() == j.members.len() {
                j.outstanding = false;
                check_termination(j, workers);
            }
            false
        }
        ToCoord::Done { job, report } => {
            if job != j.id {
                return false;
            }
            j.done.insert(id, report);
            maybe_finish(j, cfg)
        }
        ToCoord::Failed { job, error } => {
            if job != j.id {
                return false;
            }
            j.error.get_or_insert(format!("worker {id}: {error}"));
            j.done.insert(id, WorkerReport::default());
            stop_all(j, workers);
            maybe_finish(j, cfg)
        }
    }
}

fn stop_all(j: &mut Job, workers: &BTreeMap<WorkerId, Worker>) {
    if j.stopping {
        return;
    }
    j.stopping = true;
    for m in &j.members {
        if let Some(w) = workers.get(m) {
            let _ = w.tx.send(ToWorker::Stop { job: j.id });
        }
    }
}

fn check_termination(j: &mut Job, workers: &BTreeMap<WorkerId, Worker>) {
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
    if j.last_progress.elapsed() > Duration::from_millis(200) {
        j.last_progress = Instant::now();
        let _ = j.submit.send(ToSubmit::Progress { completed: total });
    }
    let Some(words) = words.into_iter().collect::<Option<Vec<u64>>>() else {
        j.last_words = None;
        return;
    };
    let idle = words.iter().all(|w| w & 0xffff_ffff == 0);
    if idle && j.last_words.as_ref() == Some(&words) {
        stop_all(j, workers);
    } else {
        j.last_words = Some(words);
    }
}

/// Records the run as finished in the manifest (rule 6) and returns its root; a run without a
/// log (`--no-checkpoint`) has no manifest and no root. A store that cannot record it fails the
/// job: a log left `Running` would refuse `certify` later.
fn record_finished(cfg: &CoordinatorConfig) -> Result<String, String> {
    // The store's client blocks (it has its own runtime): step out of ours meanwhile.
    tokio::task::block_in_place(|| match Manifest::load(&*cfg.store) {
        Ok(Some(mut m)) => {
            m.status = RunStatus::Finished;
            m.store(&*cfg.store)
                .map(|()| format!("{:#}", m.root))
                .map_err(|e| format!("the job finished but the store did not record it: {e}"))
        }
        Ok(None) => Ok(String::new()),
        Err(e) => Err(format!(
            "the job finished but its manifest cannot be read: {e}"
        )),
    })
}

fn maybe_finish(j: &mut Job, cfg: &CoordinatorConfig) -> bool {
    if !j.members.iter().all(|m| j.done.contains_key(m)) {
        return false;
    }
    let elapsed_s = j.started.elapsed().as_secs_f64();
    // An iterative run's result is the final states every member returns (rule 6).
    let outputs = if j.iterative {
        Some(Vec::new())
    } else {
        j.done.values().find_map(|r| r.outputs.clone())
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
    let msg = match (&j.error, outputs) {
        (Some(e), _) => ToSubmit::Failed { error: e.clone() },
        (None, None) => ToSubmit::Failed {
            error: "no member returned the terminal outputs (the host of vnode 0 was lost \
                    while the job finished)"
                .to_string(),
        },
        (None, Some(outputs)) => match record_finished(cfg) {
            Err(error) => ToSubmit::Failed { error },
            Ok(root) => {
                let mut vnodes: Vec<_> = j.done.values().flat_map(|r| r.vnodes.clone()).collect();
                vnodes.sort_by_key(|s| s.vnode);
                ToSubmit::Finished {
                    outputs,
                    root,
                    tasks: j.done.values().map(|r| r.tasks).sum(),
                    events: j.done.values().map(|r| r.events).sum(),
                    elapsed_s,
                    vnodes,
                    workers_lost: j.lost,
                    states: states.into_iter().map(|(v, (n, s))| (v, n, s)).collect(),
                    iter_stats: iter_stats.into_iter().collect(),
                }
            }
        },
    };
    eprintln!("coordinator: job {} over in {elapsed_s:.3} s", j.id);
    let _ = j.submit.send(msg);
    true
}

/// Rule 5.
fn lose(
    workers: &mut BTreeMap<WorkerId, Worker>,
    job: &mut Option<Job>,
    id: WorkerId,
    reason: String,
    cfg: &CoordinatorConfig,
) {
    if workers.remove(&id).is_none() {
        return;
    }
    eprintln!("coordinator: worker {id} lost: {reason}");
    let Some(j) = job.as_mut() else { return };
    if !j.members.contains(&id) {
        return;
    }
    j.members.retain(|&m| m != id);
    j.lost += 1;
    if j.members.is_empty() {
        let _ = j.submit.send(ToSubmit::Failed {
            error: format!("every worker was lost (the last: worker {id}, {reason})"),
        });
        *job = None;
        return;
    }
    if j.stopping {
        if maybe_finish(j, cfg) {
            *job = None;
        }
        return;
    }
    let mut moved = Vec::new();
    for v in 0..j.host.len() {
        if j.host[v] != id {
            continue;
        }
        let load = |w: &WorkerId| j.host.iter().filter(|h| *h == w).count();
        let idle_spare = j
            .members
            .iter()
            .copied()
            .find(|m| workers.get(m).is_some_and(|w| w.spare) && load(m) == 0);
        let target = idle_spare.unwrap_or_else(|| {
            *j.members
                .iter()
                .min_by_key(|m| (load(m), **m))
                .expect("members is not empty")
        });
        j.host[v] = target;
        j.epoch[v] += 1;
        moved.push((v as u32, target, j.epoch[v]));
    }
    let peers: Vec<(WorkerId, String)> = workers
        .iter()
        .map(|(&w, x)| (w, x.peer_addr.clone()))
        .collect();
    for m in &j.members {
        if let Some(w) = workers.get(m) {
            let _ = w.tx.send(ToWorker::Map {
                job: j.id,
                map: moved.clone(),
                peers: peers.clone(),
            });
        }
    }
    for &(v, target, epoch) in &moved {
        if let Some(w) = workers.get(&target) {
            let _ = w.tx.send(ToWorker::Host {
                job: j.id,
                vnode: v,
                epoch,
            });
        }
    }
    // The termination test starts over (rule 5).
    j.round += 1;
    j.outstanding = false;
    j.statuses.clear();
    j.last_words = None;
    j.completed.remove(&id);
    let _ = j.submit.send(ToSubmit::WorkerLost {
        worker: id,
        reason,
        moved: moved.iter().map(|&(v, t, _)| (v, t)).collect(),
    });
}

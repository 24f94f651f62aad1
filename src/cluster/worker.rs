//! A worker process: joins a coordinator, hosts vnodes of the jobs it is given, and carries
//! their messages to the other workers.
//!
//! Rules:
//!
//! 1. A worker that cannot reach its coordinator retries with backoff, then stops with an
//!    error naming it; a worker that loses its coordinator stops its job and exits (a job
//!    without its fault-tolerance module cannot end well).
//! 2. Vnode messages travel worker to worker on authenticated links, opened on first use and
//!    dropped on the first error (the vnode protocol resends what matters). A message for a
//!    vnode with no known host is held and sent when the coordinator maps it (paper 004); one
//!    that reaches a worker not hosting its vnode is forwarded by the current map.
//! 3. The failure detector (`veriflow_runtime::detect`, paper 004 §4) runs on its own thread
//!    so that compute load does not delay it: heartbeats to k random peers (the coordinator is
//!    peer 0) on the same links as the messages, every frame received counts, a closed link
//!    is broken at once; a worker it declares broken is reported to the coordinator.
//! 4. Every order of the coordinator about vnodes (new hosts, epochs, hosting one here) goes to
//!    the member run at once; probes are answered from its shared status without waiting for
//!    the compute threads.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use veriflow_checkpoint::wire::{Connection, DEFAULT_MAX_FRAME};
use veriflow_checkpoint::{open_store, Key, Store, StoreSpec};
use veriflow_runtime::detect::{Detector, DetectorHandle, DetectorThread, Heartbeat, Status};
use veriflow_runtime::transport::{Envelope, Router};
use veriflow_runtime::{Control, Epoch, Member, MemberStatus, SystemClock, VnodeId};

use super::protocol::{Hello, JobSpec, Peer, ToCoord, ToWorker, WorkerId, WorkerReport};

/// What a worker needs to run a job's member: given the job's command line, the store and the
/// member, run it to the end.
pub(crate) type RunJob =
    Arc<dyn Fn(JobContext) -> Result<WorkerReport, String> + Send + Sync + 'static>;

/// One job as the worker's program sees it.
pub(crate) struct JobContext {
    pub(crate) spec: JobSpec,
    pub(crate) vnodes: u32,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) member: Member,
}

/// How a worker runs.
pub(crate) struct WorkerConfig {
    pub(crate) program: &'static str,
    pub(crate) join: String,
    pub(crate) listen: String,
    pub(crate) key: Key,
    pub(crate) threads: u32,
    pub(crate) spare: bool,
}

#[derive(Default)]
struct Routes {
    me: WorkerId,
    map: HashMap<u32, WorkerId>,
    peers: HashMap<WorkerId, String>,
    links: HashMap<WorkerId, UnboundedSender<Peer>>,
    held: HashMap<u32, Vec<Envelope>>,
    router: Option<Router>,
}

struct Net {
    key: Key,
    routes: Mutex<Routes>,
    rt: tokio::runtime::Handle,
    fd: std::sync::OnceLock<DetectorHandle>,
}

impl Net {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rule 2: sends `env` toward the host of `to`.
    fn send(self: &Arc<Self>, to: u32, env: Envelope) {
        let mut r = self.routes();
        let Some(&host) = r.map.get(&to) else {
            r.held.entry(to).or_default().push(env);
            return;
        };
        if host == r.me {
            if let Some(router) = &r.router {
                router.deliver(VnodeId(to), env);
            }
            return;
        }
        drop(r);
        self.to_peer(host, Peer::Msg { to, env });
    }

    /// Sends a frame to worker `host` on our link to it, opened on first use (rule 2).
    fn to_peer(self: &Arc<Self>, host: WorkerId, frame: Peer) {
        let mut r = self.routes();
        let link = match r.links.get(&host) {
            Some(l) if !l.is_closed() => l.clone(),
            _ => {
                let Some(addr) = r.peers.get(&host).cloned() else {
                    if let Peer::Msg { to, env } = frame {
                        r.held.entry(to).or_default().push(env);
                    }
                    return;
                };
                let (tx, rx) = unbounded_channel::<Peer>();
                r.links.insert(host, tx.clone());
                let me = r.me;
                let net = self.clone();
                self.rt.spawn(async move {
                    if let Err(e) = link(addr.clone(), me, &net.key, rx).await {
                        tracing::debug!("link to worker {host} ({addr}) dropped: {e}");
                    }
                });
                tx
            }
        };
        let _ = link.send(frame);
        if let Some(fd) = self.fd.get() {
            fd.sent(host);
        }
    }

    /// A vnode message from the network (rule 2).
    fn arrive(self: &Arc<Self>, to: u32, env: Envelope) {
        let here = {
            let r = self.routes();
            let hosted_here = r.map.get(&to) == Some(&r.me);
            match &r.router {
                Some(router) if hosted_here || router.hosts(VnodeId(to)) => {
                    router.deliver(VnodeId(to), env);
                    return;
                }
                Some(_) => false,
                None => return, // no job: nothing to deliver to
            }
        };
        if !here {
            self.send(to, env);
        }
    }

    /// New hosts for some vnodes: remember them and send what was held for them.
    fn remap(self: &Arc<Self>, map: &[(u32, WorkerId, u64)], peers: &[(WorkerId, String)]) {
        let held: Vec<(u32, Vec<Envelope>)> = {
            let mut r = self.routes();
            for (w, a) in peers {
                r.peers.insert(*w, a.clone());
                if *w != r.me {
                    if let Some(fd) = self.fd.get() {
                        fd.joined(*w);
                    }
                }
            }
            for &(v, host, _) in map {
                r.map.insert(v, host);
            }
            map.iter()
                .filter_map(|&(v, _, _)| r.held.remove(&v).map(|h| (v, h)))
                .collect()
        };
        for (v, envs) in held {
            for env in envs {
                self.send(v, env);
            }
        }
    }
}

async fn link(
    addr: String,
    me: WorkerId,
    key: &Key,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Peer>,
) -> Result<(), String> {
    let stream = TcpStream::connect(&addr).await.map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let conn = Connection::client(stream, key, DEFAULT_MAX_FRAME)
        .await
        .map_err(|e| e.to_string())?;
    let (_r, mut w) = conn.into_split();
    w.send(&Peer::Hello { from: me })
        .await
        .map_err(|e| e.to_string())?;
    while let Some(m) = rx.recv().await {
        w.send(&m).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn peer_listener(listener: TcpListener, net: Arc<Net>) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let net = net.clone();
        tokio::spawn(async move {
            let conn = match Connection::server(stream, &net.key, DEFAULT_MAX_FRAME).await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("worker: refused a peer connection from {peer}: {e}");
                    return;
                }
            };
            let (mut r, _w) = conn.into_split();
            let mut from: Option<WorkerId> = None;
            loop {
                let frame = r.recv::<Peer>().await;
                if let (Some(f), Some(fd), Ok(_)) = (from, net.fd.get(), &frame) {
                    fd.message(f);
                }
                match frame {
                    Ok(Peer::Msg { to, env }) => net.arrive(to, env),
                    Ok(Peer::Hello { from: f }) => from = Some(f),
                    Ok(Peer::Heartbeat(hb)) => {
                        if let (Some(f), Some(fd)) = (from, net.fd.get()) {
                            fd.heartbeat(f, hb);
                        }
                    }
                    Err(e) => {
                        tracing::debug!("peer {peer}: {e}");
                        // A closed or reset link: the detector's rule, broken at once.
                        if let (Some(f), Some(fd)) = (from, net.fd.get()) {
                            fd.closed(f);
                        }
                        return;
                    }
                }
            }
        });
    }
}

/// Connects to the coordinator with retries and backoff (rule 1).
async fn connect(addr: &str, key: &Key) -> Result<Connection<TcpStream>, String> {
    let mut delay = Duration::from_millis(100);
    let tries = 8;
    let mut last = String::new();
    for i in 0..tries {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                match Connection::client(s, key, DEFAULT_MAX_FRAME).await {
                    Ok(c) => return Ok(c),
                    Err(e) if e.is_transient() => last = e.to_string(),
                    Err(e) => return Err(format!("coordinator {addr} refused us: {e}")),
                }
            }
            Err(e) => last = e.to_string(),
        }
        if i + 1 < tries {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }
    Err(format!(
        "coordinator {addr} unreachable after {tries} tries ({last}); is it running, and is the address right?"
    ))
}

/// Pub for the submit client: connects to the coordinator as [`connect`] does.
pub(crate) async fn connect_coordinator(
    addr: &str,
    key: &Key,
) -> Result<Connection<TcpStream>, String> {
    connect(addr, key).await
}

struct JobState {
    id: u64,
    control: mpsc::Sender<Control>,
    status: Arc<MemberStatus>,
}

/// Runs a worker until its coordinator goes away (rules 1-4).
pub(crate) fn run_worker(cfg: WorkerConfig, run_job: RunJob) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("veriflow-net")
        .build()
        .map_err(|e| format!("cannot start the network threads: {e}"))?;
    rt.block_on(async move {
        let listener = TcpListener::bind(&cfg.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
        let peer_addr: SocketAddr = listener.local_addr().map_err(|e| e.to_string())?;
        let conn = connect(&cfg.join, &cfg.key).await?;
        let (mut reader, mut writer) = conn.into_split();
        writer
            .send(&Hello::Worker {
                program: cfg.program.to_string(),
                peer_addr: peer_addr.to_string(),
                threads: cfg.threads,
                spare: cfg.spare,
            })
            .await
            .map_err(|e| format!("coordinator {}: {e}", cfg.join))?;
        let (me, store_spec, fd_params) = match reader.recv::<ToWorker>().await {
            Ok(ToWorker::Welcome { id, store, fd }) => (id, store, fd),
            Ok(_) => {
                return Err(format!(
                    "coordinator {} refused this worker (another program?)",
                    cfg.join
                ))
            }
            Err(e) => return Err(format!("coordinator {}: {e}", cfg.join)),
        };
        let spec: StoreSpec = store_spec
            .parse()
            .map_err(|e| format!("the coordinator's store {store_spec}: {e}"))?;
        let key = cfg.key.clone();
        let store = tokio::task::spawn_blocking(move || open_store(&spec, Some(&key)))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot open the store {store_spec}: {e}"))?;
        eprintln!(
            "worker {me}: joined {} (peers reach us at {peer_addr})",
            cfg.join
        );
        let net = Arc::new(Net {
            key: cfg.key.clone(),
            routes: Mutex::new(Routes {
                me,
                ..Routes::default()
            }),
            rt: tokio::runtime::Handle::current(),
            fd: std::sync::OnceLock::new(),
        });
        tokio::spawn(peer_listener(listener, net.clone()));
        let (out_tx, mut out_rx) = unbounded_channel::<ToCoord>();
        let writing = tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if writer.send(&m).await.is_err() {
                    break;
                }
            }
        });
        // Rule 3: the failure detector on its own thread; the coordinator is peer 0.
        let (beat, report, sink_net) = (out_tx.clone(), out_tx.clone(), net.clone());
        let detector = DetectorThread::spawn(
            Detector::new(me, fd_params, u64::from(me)),
            Arc::new(SystemClock::default()),
            move |to: WorkerId, hb: Heartbeat| {
                if to == 0 {
                    let _ = beat.send(ToCoord::Heartbeat(hb));
                } else {
                    sink_net.to_peer(to, Peer::Heartbeat(hb));
                }
            },
            move |peer, status| {
                if status == Status::Broken && peer != 0 {
                    let _ = report.send(ToCoord::Broken { worker: peer });
                }
            },
        )
        .map_err(|e| format!("cannot start the failure detector: {e}"))?;
        let fd = detector.handle().clone();
        fd.joined(0);
        let _ = net.fd.set(fd.clone());
        let job: Arc<Mutex<Option<JobState>>> = Arc::default();
        let lost = loop {
            let msg = match reader.recv::<ToWorker>().await {
                Ok(m) => m,
                Err(e) => break e.to_string(),
            };
            fd.message(0);
            match msg {
                ToWorker::Welcome { .. } => {}
                ToWorker::Heartbeat(hb) => fd.heartbeat(0, hb),
                ToWorker::Start {
                    job: id,
                    spec,
                    vnodes,
                    hosted,
                    starts,
                    map,
                    peers,
                } => {
                    let outbound_net = net.clone();
                    let router = Router::new(Arc::new(move |to: VnodeId, env| {
                        outbound_net.send(to.0, env)
                    }));
                    {
                        let mut r = net.routes();
                        r.map.clear();
                        r.held.clear();
                        r.router = Some(router.clone());
                    }
                    net.remap(&map, &peers);
                    let (ctl_tx, ctl_rx) = mpsc::channel();
                    let status = MemberStatus::new();
                    *job.lock().unwrap_or_else(|p| p.into_inner()) = Some(JobState {
                        id,
                        control: ctl_tx,
                        status: status.clone(),
                    });
                    let member = Member {
                        transport: Arc::new(router),
                        hosted: hosted
                            .iter()
                            .map(|&(v, e)| (VnodeId(v), Epoch(e)))
                            .collect(),
                        starts,
                        control: ctl_rx,
                        status,
                    };
                    let ctx = JobContext {
                        spec,
                        vnodes,
                        store: store.clone(),
                        member,
                    };
                    let run_job = run_job.clone();
                    let out = out_tx.clone();
                    let job_slot = job.clone();
                    std::thread::Builder::new()
                        .name(format!("veriflow-job-{id}"))
                        .spawn(move || {
                            let msg = match run_job(ctx) {
                                Ok(report) => ToCoord::Done { job: id, report },
                                Err(error) => ToCoord::Failed { job: id, error },
                            };
                            *job_slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
                            let _ = out.send(msg);
                        })
                        .map_err(|e| format!("cannot start the job thread: {e}"))?;
                }
                ToWorker::Map {
                    job: id,
                    map,
                    peers,
                } => {
                    net.remap(&map, &peers);
                    if let Some(j) = job.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                        if j.id == id {
                            for &(v, _, e) in &map {
                                let _ = j.control.send(Control::Epoch(VnodeId(v), Epoch(e)));
                            }
                        }
                    }
                }
                ToWorker::Host {
                    job: id,
                    vnode,
                    epoch,
                } => {
                    net.routes().map.insert(vnode, me);
                    if let Some(j) = job.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                        if j.id == id {
                            let _ = j.control.send(Control::Host(VnodeId(vnode), Epoch(epoch)));
                        }
                    }
                }
                ToWorker::Probe { job: id, round } => {
                    let guard = job.lock().unwrap_or_else(|p| p.into_inner());
                    let (work, completed, started) = match guard.as_ref().filter(|j| j.id == id) {
                        Some(j) => match j.status.work() {
                            Some(w) => (w, j.status.completed(), true),
                            None => (Vec::new(), 0, false),
                        },
                        None => (Vec::new(), 0, false),
                    };
                    drop(guard);
                    let _ = out_tx.send(ToCoord::Status {
                        job: id,
                        round,
                        work: work.into_iter().map(|(v, w)| (v.0, w)).collect(),
                        completed,
                        started,
                    });
                }
                ToWorker::Stop { job: id } => {
                    if let Some(j) = job.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                        if j.id == id {
                            let _ = j.control.send(Control::Stop);
                        }
                    }
                }
            }
        };
        // Rule 1: without the coordinator, stop the job and leave.
        if let Some(j) = job.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = j.control.send(Control::Stop);
        }
        writing.abort();
        drop(detector);
        Err(format!("lost the coordinator {}: {lost}", cfg.join))
    })
}

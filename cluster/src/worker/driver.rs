//! The worker's tokio driver: TCP links, the job's member on threads, and a ticking thread,
//! around [`WorkerCore`] (rules 1-5 of `worker/mod.rs`).
//!
//! Every event goes through [`Driver::dispatch`], which runs the state machine and carries out
//! its actions under one lock: actions only queue frames, deliver to inboxes or pass orders,
//! so nothing under the lock blocks, and frames leave in the order the machine chose.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use veriflow_checkpoint::wire::{Connection, DEFAULT_MAX_FRAME};
use veriflow_checkpoint::{open_store, Key, Store, StoreSpec};
use veriflow_runtime::transport::Router;
use veriflow_runtime::{Clock, Control, Member, MemberStatus, SystemClock, VnodeId};

use super::{hello_proof, Action, Event, WorkerCore};
use crate::error::ClusterError;
use crate::protocol::{Hello, JobSpec, Peer, ToCoord, ToWorker, WorkerId, WorkerReport};

/// What a worker needs to run a job's member: given the job's command line, the store and the
/// member, run it to the end.
pub type RunJob = Arc<dyn Fn(JobContext) -> Result<WorkerReport, String> + Send + Sync + 'static>;

/// One job as the worker's program sees it.
pub struct JobContext {
    /// The job.
    pub spec: JobSpec,
    /// Vnodes of the run.
    pub vnodes: u32,
    /// The store every member logs into.
    pub store: Arc<dyn Store>,
    /// This process's share of the run.
    pub member: Member,
}

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The program (app) it runs.
    pub program: String,
    /// The coordinator's address.
    pub join: String,
    /// Where it listens for peers.
    pub listen: String,
    /// The cluster's key.
    pub key: Key,
    /// Its threads.
    pub threads: u32,
    /// Whether it waits idle until needed for recovery.
    pub spare: bool,
}

struct JobState {
    id: u64,
    control: mpsc::Sender<Control>,
    status: Arc<MemberStatus>,
    router: Router,
}

struct State {
    core: WorkerCore,
    links: HashMap<WorkerId, UnboundedSender<Peer>>,
    job: Option<JobState>,
    exit: Option<String>,
}

struct Driver {
    key: Key,
    clock: SystemClock,
    state: Mutex<State>,
    to_coord: UnboundedSender<ToCoord>,
    rt: tokio::runtime::Handle,
    store: Arc<dyn Store>,
    run_job: RunJob,
    exit_tx: UnboundedSender<String>,
}

impl Driver {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the state machine on `ev` and carries out its actions (module docs).
    fn dispatch(self: &Arc<Self>, ev: Event) {
        let mut st = self.state();
        let now = self.clock.now();
        let actions = st.core.on_event(now, ev);
        for a in actions {
            self.act(&mut st, a);
        }
    }

    fn act(self: &Arc<Self>, st: &mut State, a: Action) {
        let me = st.core.id();
        match a {
            Action::ToCoord(m) => {
                let _ = self.to_coord.send(m);
            }
            Action::ToPeer {
                worker,
                addr,
                link_key,
                frame,
            } => {
                let link = match st.links.get(&worker) {
                    Some(l) if !l.is_closed() => l.clone(),
                    _ => {
                        let (tx, rx) = unbounded_channel::<Peer>();
                        st.links.insert(worker, tx.clone());
                        let key = self.key.clone();
                        self.rt.spawn(async move {
                            if let Err(e) = link(&addr, me, worker, &link_key, &key, rx).await {
                                tracing::debug!("link to worker {worker} ({addr}) dropped: {e}");
                            }
                        });
                        tx
                    }
                };
                let _ = link.send(frame);
            }
            Action::Deliver { to, env } => {
                if let Some(j) = &st.job {
                    j.router.deliver(VnodeId(to), env);
                }
            }
            Action::StartJob {
                job,
                spec,
                vnodes,
                hosted,
                starts,
            } => self.start_job(st, job, spec, vnodes, hosted, starts),
            Action::Control { job, order } => {
                if let Some(j) = st.job.as_ref().filter(|j| j.id == job) {
                    let _ = j.control.send(order);
                }
            }
            Action::AnswerProbe { job, round } => {
                let status = st.job.as_ref().filter(|j| j.id == job).map(|j| &*j.status);
                let _ = self.to_coord.send(ToCoord::status(job, round, status));
            }
            Action::Exit(reason) => {
                if st.exit.is_none() {
                    st.exit = Some(reason.clone());
                    let _ = self.exit_tx.send(reason);
                }
            }
            Action::Note(line) => eprintln!("worker {me}: {line}"),
        }
    }

    fn start_job(
        self: &Arc<Self>,
        st: &mut State,
        job: u64,
        spec: JobSpec,
        vnodes: u32,
        hosted: Vec<(VnodeId, veriflow_runtime::Epoch)>,
        starts: bool,
    ) {
        let me = st.core.id();
        let outbound = Arc::downgrade(self);
        let router = Router::new(Arc::new(move |to: VnodeId, env| {
            if let Some(d) = outbound.upgrade() {
                d.dispatch(Event::Outbound { to: to.0, env });
            }
        }));
        let (ctl_tx, ctl_rx) = mpsc::channel();
        let status = MemberStatus::new();
        st.job = Some(JobState {
            id: job,
            control: ctl_tx,
            status: status.clone(),
            router: router.clone(),
        });
        let member = Member {
            transport: Arc::new(router),
            hosted,
            starts,
            control: ctl_rx,
            status,
        };
        let ctx = JobContext {
            spec,
            vnodes,
            store: self.store.clone(),
            member,
        };
        let driver = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("veriflow-job-{job}"))
            .spawn(move || {
                let result = (driver.run_job)(ctx);
                {
                    let mut st = driver.state();
                    if st.job.as_ref().is_some_and(|j| j.id == job) {
                        st.job = None;
                    }
                }
                driver.dispatch(Event::JobEnded { job, result });
            });
        if let Err(e) = spawned {
            let _ = self.to_coord.send(ToCoord::Failed {
                job,
                error: format!("worker {me} cannot start the job thread: {e}"),
            });
        }
    }
}

/// Opens the link to worker `to` and sends what `rx` gives, after the hello (rule 5).
async fn link(
    addr: &str,
    me: WorkerId,
    to: WorkerId,
    link_key: &[u8; 32],
    key: &Key,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Peer>,
) -> Result<(), ClusterError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| ClusterError::net(addr, e))?;
    let _ = stream.set_nodelay(true);
    let conn = Connection::client(stream, key, DEFAULT_MAX_FRAME)
        .await
        .map_err(|e| ClusterError::wire(addr, e))?;
    let proof = hello_proof(link_key, &conn.channel_binding(), me, to);
    let (_r, mut w) = conn.into_split();
    w.send(&Peer::Hello {
        from: me,
        to,
        proof,
    })
    .await
    .map_err(|e| ClusterError::wire(addr, e))?;
    while let Some(m) = rx.recv().await {
        w.send(&m).await.map_err(|e| ClusterError::wire(addr, e))?;
    }
    Ok(())
}

/// Most peer links one worker accepts at once: a cluster has at most a few hundred workers,
/// and each opens one link to us (rule 7 of `coordinator`: key holders are bounded too).
const MAX_PEER_LINKS: usize = 1024;

async fn peer_listener(listener: TcpListener, driver: Arc<Driver>) {
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("peer accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if open.load(std::sync::atomic::Ordering::SeqCst) >= MAX_PEER_LINKS {
            eprintln!("worker: refused a peer connection from {peer}: {MAX_PEER_LINKS} open");
            continue;
        }
        let _ = stream.set_nodelay(true);
        let driver = driver.clone();
        let open = open.clone();
        tokio::spawn(async move {
            open.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            serve_peer(stream, peer, &driver).await;
            open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        });
    }
}

async fn serve_peer(stream: TcpStream, peer: SocketAddr, driver: &Arc<Driver>) {
    let me = driver.state().core.id();
    let conn = match Connection::server(stream, &driver.key, DEFAULT_MAX_FRAME).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("worker {me}: refused a peer connection from {peer}: {e}");
            return;
        }
    };
    let binding = conn.channel_binding();
    let (mut r, _w) = conn.into_split();
    // Rule 5: the first frame proves who is calling.
    let from = match r.recv::<Peer>().await {
        Ok(Peer::Hello { from, to, proof }) => {
            match driver.state().core.check_hello(from, to, &proof, &binding) {
                Ok(()) => from,
                Err(why) => {
                    eprintln!("worker {me}: refused a peer link from {peer}: {why}");
                    return;
                }
            }
        }
        Ok(_) => {
            eprintln!("worker {me}: refused a peer link from {peer}: it did not say hello");
            return;
        }
        Err(e) => {
            tracing::debug!("peer {peer}: {e}");
            return;
        }
    };
    loop {
        match r.recv::<Peer>().await {
            Ok(frame) => driver.dispatch(Event::FromPeer { from, frame }),
            Err(e) => {
                tracing::debug!("peer {peer} (worker {from}): {e}");
                // A closed or reset link: the detector's rule, broken at once.
                driver.dispatch(Event::PeerClosed { peer: from });
                return;
            }
        }
    }
}

/// Connects to the coordinator with retries and backoff (rule 1).
pub async fn connect_coordinator(
    addr: &str,
    key: &Key,
) -> Result<Connection<TcpStream>, ClusterError> {
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
                    Err(e) => {
                        return Err(ClusterError::Refused {
                            addr: addr.to_string(),
                            reason: e.to_string(),
                        })
                    }
                }
            }
            Err(e) => last = e.to_string(),
        }
        if i + 1 < tries {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }
    Err(ClusterError::Unreachable {
        addr: addr.to_string(),
        tries,
        last,
    })
}

/// How often the ticking thread wakes at most: heartbeats of the default detector go every
/// 200 ms, so 5 ms keeps them on time without a busy thread.
const TICK_MAX: Duration = Duration::from_millis(5);

/// Runs a worker until its coordinator goes away (rules 1-5).
pub fn run_worker(cfg: WorkerConfig, run_job: RunJob) -> Result<(), ClusterError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("veriflow-net")
        .build()
        .map_err(|e| ClusterError::Start {
            what: "the network threads",
            source: e,
        })?;
    rt.block_on(async move {
        let listener = TcpListener::bind(&cfg.listen)
            .await
            .map_err(|e| ClusterError::Listen {
                addr: cfg.listen.clone(),
                source: e,
            })?;
        let peer_addr: SocketAddr = listener.local_addr().map_err(|e| ClusterError::Listen {
            addr: cfg.listen.clone(),
            source: e,
        })?;
        let conn = connect_coordinator(&cfg.join, &cfg.key).await?;
        let (mut reader, mut writer) = conn.into_split();
        writer
            .send(&Hello::Worker {
                program: cfg.program.clone(),
                peer_addr: peer_addr.to_string(),
                threads: cfg.threads,
                spare: cfg.spare,
            })
            .await
            .map_err(|e| ClusterError::wire(&cfg.join, e))?;
        let (me, store_spec, fd_params) = match reader.recv::<ToWorker>().await {
            Ok(ToWorker::Welcome { id, store, fd }) => (id, store, fd),
            Ok(ToWorker::Refused { reason }) => {
                return Err(ClusterError::Refused {
                    addr: cfg.join.clone(),
                    reason,
                })
            }
            Ok(_) => {
                return Err(ClusterError::Refused {
                    addr: cfg.join.clone(),
                    reason: "it did not welcome this worker".to_string(),
                })
            }
            Err(e) => return Err(ClusterError::wire(&cfg.join, e)),
        };
        let spec: StoreSpec = store_spec.parse().map_err(|e| ClusterError::Store {
            spec: store_spec.clone(),
            reason: format!("{e}"),
        })?;
        let key = cfg.key.clone();
        let store = tokio::task::spawn_blocking(move || open_store(&spec, Some(&key)))
            .await
            .map_err(|e| ClusterError::Store {
                spec: store_spec.clone(),
                reason: e.to_string(),
            })?
            .map_err(|e| ClusterError::Store {
                spec: store_spec.clone(),
                reason: e.to_string(),
            })?;
        eprintln!(
            "worker {me}: joined {} (peers reach us at {peer_addr})",
            cfg.join
        );
        let (to_coord, mut out_rx) = unbounded_channel::<ToCoord>();
        let writing = tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                if writer.send(&m).await.is_err() {
                    break;
                }
            }
        });
        let (exit_tx, mut exit_rx) = unbounded_channel::<String>();
        let clock = SystemClock::default();
        let driver = Arc::new(Driver {
            key: cfg.key.clone(),
            clock,
            state: Mutex::new(State {
                core: WorkerCore::new(me, fd_params, clock.now()),
                links: HashMap::new(),
                job: None,
                exit: None,
            }),
            to_coord,
            rt: tokio::runtime::Handle::current(),
            store,
            run_job,
            exit_tx,
        });
        tokio::spawn(peer_listener(listener, driver.clone()));
        // Rule 3: the detector's timers on their own thread, so that compute load and a busy
        // network runtime do not delay heartbeats.
        let ticking = {
            let driver = Arc::downgrade(&driver);
            std::thread::Builder::new()
                .name("veriflow-tick".to_string())
                .spawn(move || loop {
                    let Some(d) = driver.upgrade() else { return };
                    if d.state().exit.is_some() {
                        return;
                    }
                    d.dispatch(Event::Tick);
                    let wait = {
                        let st = d.state();
                        st.core.next_deadline().saturating_sub(d.clock.now())
                    };
                    drop(d);
                    std::thread::sleep(wait.clamp(Duration::from_millis(1), TICK_MAX));
                })
                .map_err(|e| ClusterError::Start {
                    what: "the ticking thread",
                    source: e,
                })?
        };
        let lost = loop {
            tokio::select! {
                msg = reader.recv::<ToWorker>() => match msg {
                    Ok(m) => driver.dispatch(Event::FromCoord(m)),
                    Err(e) => break format!("lost the coordinator {}: {e}", cfg.join),
                },
                Some(reason) = exit_rx.recv() => break reason,
            }
        };
        // Rule 1: without the coordinator, stop the job and leave.
        {
            let mut st = driver.state();
            st.exit.get_or_insert(lost.clone());
            if let Some(j) = st.job.take() {
                let _ = j.control.send(Control::Stop);
            }
        }
        writing.abort();
        drop(driver);
        let _ = ticking.join();
        Err(ClusterError::CoordinatorLost(lost))
    })
}

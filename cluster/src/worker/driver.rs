//! The worker's tokio driver: TCP links, the job's member on threads, and a ticking thread,
//! around [`WorkerCore`] (rules 1-5 of `worker/mod.rs`).
//!
//! Every event goes through [`Driver::dispatch`], which runs the state machine and carries out
//! its actions under one lock: actions only queue frames, deliver to inboxes or pass orders,
//! so nothing under the lock blocks, and frames leave in the order the machine chose.
//!
//! The ticking thread (rule 3) sleeps until [`WorkerCore::next_deadline`] and no longer
//! polls: a dispatch that brings the deadline before the thread's planned wake-up, or an exit,
//! wakes it through [`Driver::tick_wake`]. Between rounds (200 ms by default) an idle worker's
//! timers cost no wake-up at all; they woke every 5 ms before.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use veriflow_checkpoint::wire::{Connection, Role, WireError, DEFAULT_MAX_FRAME};
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
    /// The coordinators' addresses (any order: the one holding the role answers).
    pub join: Vec<String>,
    /// How long it looks for a coordinator after losing one before it gives up (rule 1).
    pub rejoin_patience: Duration,
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
    /// When the runtime's counters last went to the coordinator ([`METRICS_EVERY`]).
    metrics_sent: Option<Duration>,
    /// When the ticking thread, asleep, wakes next; None while it runs (module docs).
    tick_at: Option<Duration>,
}

impl State {
    fn new(core: WorkerCore) -> State {
        State {
            core,
            links: HashMap::new(),
            job: None,
            exit: None,
            metrics_sent: None,
            tick_at: None,
        }
    }
}

/// The runtime's counters go with a probe answer at most this often (`observe` rule 2): the
/// dashboard samples every 500 ms, and at 64 workers a copy with each of ~60 probe answers a
/// second was a third of the coordinator's messages (issue 16).
const METRICS_EVERY: Duration = Duration::from_millis(250);

struct Driver {
    key: Key,
    clock: SystemClock,
    state: Mutex<State>,
    to_coord: UnboundedSender<ToCoord>,
    /// The coordinator fell silent (rule 1): the connection loop drops it.
    lost_tx: UnboundedSender<String>,
    rt: tokio::runtime::Handle,
    store: Arc<dyn Store>,
    run_job: RunJob,
    exit_tx: UnboundedSender<String>,
    /// Wakes the ticking thread before its `tick_at` (module docs); waits on `state`.
    tick_wake: Condvar,
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
        if st
            .tick_at
            .is_some_and(|at| st.exit.is_some() || st.core.next_deadline() < at)
        {
            st.tick_at = None;
            self.tick_wake.notify_one();
        }
    }

    fn act(self: &Arc<Self>, st: &mut State, a: Action) {
        let me = st.core.id();
        match a {
            Action::ToCoord(m) => {
                if matches!(m, ToCoord::Heartbeat(_)) {
                    veriflow_runtime::metrics::heartbeats_sent(1);
                }
                if matches!(m, ToCoord::Done { .. } | ToCoord::Failed { .. }) {
                    // The last counts of the job, whatever METRICS_EVERY held back.
                    st.metrics_sent = Some(self.clock.now());
                    let _ = self
                        .to_coord
                        .send(ToCoord::Metrics(veriflow_runtime::metrics::snapshot()));
                }
                let _ = self.to_coord.send(m);
            }
            Action::ToPeer {
                worker,
                addr,
                link_key,
                frame,
            } => {
                if matches!(frame, Peer::Heartbeat(_)) {
                    veriflow_runtime::metrics::heartbeats_sent(1);
                }
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
                let now = self.clock.now();
                if st
                    .metrics_sent
                    .is_none_or(|at| now.saturating_sub(at) >= METRICS_EVERY)
                {
                    st.metrics_sent = Some(now);
                    let _ = self
                        .to_coord
                        .send(ToCoord::Metrics(veriflow_runtime::metrics::snapshot()));
                }
            }
            Action::Exit(reason) => {
                if st.exit.is_none() {
                    st.exit = Some(reason.clone());
                    let _ = self.exit_tx.send(reason);
                }
            }
            Action::Reconnect(reason) => {
                let _ = self.lost_tx.send(reason);
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
        // The job logs under its own namespace of the cluster's store.
        let store = match crate::job_store(&self.store, job, false) {
            Ok(s) => s,
            Err(e) => {
                let _ = self.to_coord.send(ToCoord::Failed {
                    job,
                    error: format!("worker {me} cannot open job {job}'s logs: {e}"),
                });
                return;
            }
        };
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
            store,
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
    let conn = Connection::client(stream, key, Role::Worker, DEFAULT_MAX_FRAME)
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
    let conn = match Connection::server(stream, &driver.key, Role::Worker, DEFAULT_MAX_FRAME).await
    {
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

/// One connection attempt: a wrong key is [`ClusterError::Refused`], another kind of server
/// [`ClusterError::WrongServer`], the rest transient.
pub(crate) async fn connect_once(
    addr: &str,
    key: &Key,
) -> Result<Connection<TcpStream>, ClusterError> {
    let s = TcpStream::connect(addr)
        .await
        .map_err(|e| ClusterError::net(addr, e))?;
    let _ = s.set_nodelay(true);
    match Connection::client(s, key, Role::Coordinator, DEFAULT_MAX_FRAME).await {
        Ok(c) => Ok(c),
        Err(e @ WireError::WrongRole { .. }) => Err(ClusterError::wire(addr, e)),
        Err(e) if e.is_transient() => Err(ClusterError::wire(addr, e)),
        Err(e) => Err(ClusterError::Refused {
            addr: addr.to_string(),
            reason: e.to_string(),
        }),
    }
}

/// The ticking thread (rule 3): ticks, then sleeps until the next deadline or until a dispatch
/// or an exit wakes it (module docs). It holds the driver only while awake or asleep on its
/// condition variable, and stops once the worker exits.
fn tick_loop(driver: &Weak<Driver>) {
    while let Some(d) = driver.upgrade() {
        if d.state().exit.is_some() {
            return;
        }
        d.dispatch(Event::Tick);
        let mut st = d.state();
        if st.exit.is_some() {
            return;
        }
        let due = st.core.next_deadline();
        // At least 1 ms: a deadline that a tick does not move (the detector's clock and ours
        // disagree by rounding) must not make this thread spin.
        let wait = due
            .saturating_sub(d.clock.now())
            .max(Duration::from_millis(1));
        st.tick_at = Some(due);
        let (mut st, _) = d
            .tick_wake
            .wait_timeout(st, wait)
            .unwrap_or_else(|p| p.into_inner());
        st.tick_at = None;
    }
}

type CoordReader = veriflow_checkpoint::wire::WireReader<tokio::net::tcp::OwnedReadHalf>;
type CoordWriter = veriflow_checkpoint::wire::WireWriter<tokio::net::tcp::OwnedWriteHalf>;

/// What a coordinator answered a hello (built once per connection attempt: its size does not
/// matter).
#[allow(clippy::large_enum_variant)]
enum Answer {
    Welcome {
        reader: CoordReader,
        writer: CoordWriter,
        id: WorkerId,
        store: String,
        fd: veriflow_runtime::detect::FdParams,
        coordinators: Vec<String>,
    },
    Standby,
}

/// Says `hello` (built from the connection's channel binding) to the coordinator at `addr`.
async fn greet(
    addr: &str,
    key: &Key,
    hello: impl FnOnce(&[u8; 32]) -> Hello,
) -> Result<Answer, ClusterError> {
    let conn = connect_once(addr, key).await?;
    let hello = hello(&conn.channel_binding());
    let (mut reader, mut writer) = conn.into_split();
    writer
        .send(&hello)
        .await
        .map_err(|e| ClusterError::wire(addr, e))?;
    match reader.recv::<ToWorker>().await {
        Ok(ToWorker::Welcome {
            id,
            store,
            fd,
            coordinators,
        }) => Ok(Answer::Welcome {
            reader,
            writer,
            id,
            store,
            fd,
            coordinators,
        }),
        Ok(ToWorker::Standby { .. }) => Ok(Answer::Standby),
        Ok(ToWorker::Refused { reason }) => Err(ClusterError::Refused {
            addr: addr.to_string(),
            reason,
        }),
        Ok(_) => Err(ClusterError::Refused {
            addr: addr.to_string(),
            reason: "it did not welcome this worker".to_string(),
        }),
        Err(e) => Err(ClusterError::wire(addr, e)),
    }
}

/// Tries every address in turn, with backoff, until one coordinator welcomes `hello` or
/// `patience` runs out (rule 1). A refusal ends the search.
async fn find_coordinator(
    addrs: &[String],
    key: &Key,
    patience: Duration,
    hello: impl Fn(&[u8; 32]) -> Hello,
) -> Result<(String, Answer), ClusterError> {
    let start = std::time::Instant::now();
    let mut delay = Duration::from_millis(50);
    let mut last = String::new();
    let mut tries = 0u32;
    loop {
        for addr in addrs {
            tries += 1;
            match greet(addr, key, &hello).await {
                Ok(a @ Answer::Welcome { .. }) => return Ok((addr.clone(), a)),
                Ok(Answer::Standby) => last = format!("{addr} is a standby"),
                Err(e) if e.is_refusal() => return Err(e),
                Err(e) => last = e.to_string(),
            }
        }
        if start.elapsed() >= patience {
            return Err(ClusterError::Unreachable {
                addr: addrs.join(","),
                tries,
                last,
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// The first join's patience: long enough for a coordinator that starts at the same time.
const JOIN_PATIENCE: Duration = Duration::from_secs(15);

/// Runs a worker until no coordinator wants it any more (rules 1-5).
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
    let mut store: Option<Arc<dyn Store>> = None;
    let result = rt.block_on(serve_worker(cfg, run_job, &mut store));
    // The store may own a runtime of its own, and dropping a runtime inside another's context
    // panics: the network runtime goes first (its tasks hold the driver, which holds the
    // store), then the last handle on the store, here on this plain thread.
    drop(rt);
    drop(store);
    result
}

async fn serve_worker(
    cfg: WorkerConfig,
    run_job: RunJob,
    keep: &mut Option<Arc<dyn Store>>,
) -> Result<(), ClusterError> {
    if cfg.join.is_empty() {
        return Err(ClusterError::Refused {
            addr: String::new(),
            reason: "no coordinator address given".to_string(),
        });
    }
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
    // From 32 OS-random bytes (RFC 8032's secret seed), as `SigningKey::generate` does.
    let signing = ed25519_dalek::SigningKey::from_bytes(&veriflow_checkpoint::key::random_bytes());
    let public_key = signing.verifying_key().to_bytes();
    let (program, threads, spare) = (cfg.program.clone(), cfg.threads, cfg.spare);
    let peer = peer_addr.to_string();
    let (mut at, answer) =
        find_coordinator(&cfg.join, &cfg.key, JOIN_PATIENCE, |_| Hello::Worker {
            program: program.clone(),
            peer_addr: peer.clone(),
            threads,
            spare,
            public_key,
        })
        .await?;
    let Answer::Welcome {
        mut reader,
        writer,
        id: me,
        store: store_spec,
        fd: fd_params,
        coordinators,
    } = answer
    else {
        unreachable!("find_coordinator returns welcomes only");
    };
    let mut addrs = merge(&cfg.join, &coordinators);
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
    eprintln!("worker {me}: joined {at} (peers reach us at {peer_addr})");
    // Frames to the coordinator go to whichever connection is current (rule 1).
    let current: Arc<tokio::sync::Mutex<Option<CoordWriter>>> =
        Arc::new(tokio::sync::Mutex::new(Some(writer)));
    let (to_coord, mut out_rx) = unbounded_channel::<ToCoord>();
    let writing = {
        let current = current.clone();
        tokio::spawn(async move {
            while let Some(m) = out_rx.recv().await {
                let mut w = current.lock().await;
                if let Some(writer) = w.as_mut() {
                    if writer.send(&m).await.is_err() {
                        *w = None;
                    }
                }
            }
        })
    };
    let (exit_tx, mut exit_rx) = unbounded_channel::<String>();
    let (lost_tx, mut lost_rx) = unbounded_channel::<String>();
    let clock = SystemClock::default();
    let driver = Arc::new(Driver {
        key: cfg.key.clone(),
        clock,
        state: Mutex::new(State::new(WorkerCore::new(me, fd_params, clock.now()))),
        to_coord,
        lost_tx,
        rt: tokio::runtime::Handle::current(),
        store,
        run_job,
        exit_tx,
        tick_wake: Condvar::new(),
    });
    *keep = Some(driver.store.clone());
    tokio::spawn(peer_listener(listener, driver.clone()));
    // Rule 3: the detector's timers on their own thread, so that compute load and a busy
    // network runtime do not delay heartbeats.
    let ticking = {
        let driver = Arc::downgrade(&driver);
        std::thread::Builder::new()
            .name("veriflow-tick".to_string())
            .spawn(move || tick_loop(&driver))
            .map_err(|e| ClusterError::Start {
                what: "the ticking thread",
                source: e,
            })?
    };
    let end: ClusterError = loop {
        let lost = tokio::select! {
            msg = reader.recv::<ToWorker>() => match msg {
                Ok(m) => {
                    driver.dispatch(Event::FromCoord(m));
                    continue;
                }
                Err(e) => format!("lost the coordinator {at}: {e}"),
            },
            Some(reason) = lost_rx.recv() => format!("left the coordinator {at}: {reason}"),
            Some(reason) = exit_rx.recv() => break ClusterError::Refused { addr: at.clone(), reason },
        };
        // Rule 1: the vnodes go on; look for the coordinator that holds the role now.
        eprintln!(
            "worker {me}: {lost}; looking for a coordinator among {}",
            addrs.join(",")
        );
        // The old connection stays open (unread, unwritten) until a coordinator takes this
        // worker back: a coordinator that still counts it then sees the new connection first,
        // and the old one's close accuses nobody (`coordinator` rule 10).
        let old_writer = current.lock().await.take();
        driver.dispatch(Event::CoordLost);
        let (job, report) = driver.state().core.rejoin_claim();
        let claim = |binding: &[u8; 32]| {
            use ed25519_dalek::Signer as _;
            Hello::Rejoin(Box::new(crate::protocol::Rejoin {
                id: me,
                program: cfg.program.clone(),
                peer_addr: peer_addr.to_string(),
                threads: cfg.threads,
                spare: cfg.spare,
                signature: signing
                    .sign(&crate::protocol::rejoin_message(binding, me))
                    .to_bytes()
                    .to_vec(),
                job: job.clone(),
                report: report.clone(),
            }))
        };
        match find_coordinator(&addrs, &cfg.key, cfg.rejoin_patience, claim).await {
            Ok((
                addr,
                Answer::Welcome {
                    reader: r,
                    writer: w,
                    coordinators,
                    ..
                },
            )) => {
                eprintln!("worker {me}: taken back by coordinator {addr}");
                at = addr;
                addrs = merge(&addrs, &coordinators);
                reader = r;
                *current.lock().await = Some(w);
                driver.dispatch(Event::CoordBack);
            }
            Ok((_, Answer::Standby)) => unreachable!("find_coordinator returns welcomes only"),
            Err(e) => {
                break ClusterError::CoordinatorLost(format!(
                    "{at} and no coordinator took this worker back: {e}"
                ))
            }
        }
        drop(old_writer);
    };
    // Rule 1: stop the job and leave.
    {
        let mut st = driver.state();
        st.exit.get_or_insert(end.to_string());
        st.tick_at = None;
        driver.tick_wake.notify_one();
        if let Some(j) = st.job.take() {
            let _ = j.control.send(Control::Stop);
        }
    }
    writing.abort();
    drop(driver);
    let _ = ticking.join();
    Err(end)
}

/// `known` followed by the addresses of `more` it lacks.
fn merge(known: &[String], more: &[String]) -> Vec<String> {
    let mut all = known.to_vec();
    for a in more {
        if !all.contains(a) {
            all.push(a.clone());
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use veriflow_runtime::detect::{FdParams, Heartbeat};

    use super::*;
    use crate::protocol::PeerInfo;

    /// How long a test waits for what should take milliseconds before it fails (no time is
    /// asserted: a ticking thread that was never woken sleeps for an hour).
    const PATIENCE: Duration = Duration::from_secs(30);

    /// Rounds of an hour, and a peer that promises 10 ms found silent 20 ms after that and
    /// broken 20 ms later: only a woken ticking thread sees it within the hour.
    fn slow_rounds() -> FdParams {
        FdParams {
            interval: Duration::from_secs(3600),
            timeout: Duration::from_millis(20),
            insurance: Duration::from_secs(3600),
            broken: Duration::from_millis(20),
            k: 3,
        }
    }

    /// Worker 1, knowing worker 2, with its ticking thread running; the receiving end of its
    /// frames to the coordinator; the network runtime (never driven: links never open).
    fn worker() -> (
        Arc<Driver>,
        std::thread::JoinHandle<()>,
        tokio::sync::mpsc::UnboundedReceiver<ToCoord>,
        tokio::runtime::Runtime,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (to_coord, coord_rx) = unbounded_channel();
        let (lost_tx, lost_rx) = unbounded_channel();
        let (exit_tx, exit_rx) = unbounded_channel();
        // The receivers live as long as the runtime's tasks that never run.
        rt.spawn(async move {
            let _keep = (lost_rx, exit_rx);
        });
        let clock = SystemClock::default();
        let driver = Arc::new(Driver {
            key: Key::from_bytes([7; 32]),
            clock,
            state: Mutex::new(State::new(WorkerCore::new(1, slow_rounds(), clock.now()))),
            to_coord,
            lost_tx,
            rt: rt.handle().clone(),
            store: open_store(&StoreSpec::Memory, None).unwrap(),
            run_job: Arc::new(|_| Err("no job in this test".to_string())),
            exit_tx,
            tick_wake: Condvar::new(),
        });
        driver.dispatch(Event::FromCoord(ToWorker::Map {
            job: 1,
            map: vec![],
            peers: vec![PeerInfo {
                id: 2,
                addr: "127.0.0.1:9".to_string(),
                link_key: [2; 32],
            }],
        }));
        let weak = Arc::downgrade(&driver);
        let ticking = std::thread::spawn(move || tick_loop(&weak));
        (driver, ticking, coord_rx, rt)
    }

    /// Waits until the ticking thread sleeps, and returns until when.
    fn asleep(driver: &Driver) -> Duration {
        let t0 = Instant::now();
        loop {
            if let Some(at) = driver.state().tick_at {
                return at;
            }
            assert!(t0.elapsed() < PATIENCE, "the ticking thread never slept");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_ticking_thread_sleeps_to_the_deadline_and_an_earlier_one_wakes_it() {
        let (driver, _ticking, mut coord_rx, _rt) = worker();
        let at = asleep(&driver);
        assert_eq!(
            at,
            driver.state().core.next_deadline(),
            "it sleeps until the detector's deadline, not a polling period"
        );
        assert!(at > driver.clock.now() + Duration::from_secs(60));
        // Worker 2 promises 10 ms: its silence is due long before the next round.
        driver.dispatch(Event::FromPeer {
            from: 2,
            frame: Peer::Heartbeat(Heartbeat {
                interval: Duration::from_millis(10),
            }),
        });
        let t0 = Instant::now();
        loop {
            match coord_rx.try_recv() {
                Ok(ToCoord::Broken { worker }) => {
                    assert_eq!(worker, 2);
                    break;
                }
                Ok(_) => {}
                Err(_) => {
                    assert!(
                        t0.elapsed() < PATIENCE,
                        "the silent worker 2 was never reported: the ticking thread slept on"
                    );
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    #[test]
    fn an_exit_wakes_the_sleeping_ticking_thread_and_it_stops() {
        let (driver, ticking, _coord_rx, _rt) = worker();
        asleep(&driver);
        driver.dispatch(Event::FromCoord(ToWorker::Refused {
            reason: "test".to_string(),
        }));
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = ticking.join();
            let _ = done_tx.send(());
        });
        assert!(
            done_rx.recv_timeout(PATIENCE).is_ok(),
            "the ticking thread slept on after the exit"
        );
    }
}

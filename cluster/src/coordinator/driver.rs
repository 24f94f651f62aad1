//! The coordinator's tokio driver: connections in, frames out, store calls on a blocking
//! thread, timers, and the lease ([`journal`](super::journal) rule 4), around the
//! [`Coordinator`] state machine (rule 1 of `coordinator`).
//!
//! A coordinator starts as a candidate: it answers every hello with `Standby` until it holds
//! the lease. A `--standby` one waits for an active one's lease to appear and then to expire;
//! any other takes over at once on a store without a lease, waits one expiry on a store whose
//! lease holder died, and refuses to start while another holds a live lease.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::task::AbortHandle;
use veriflow_checkpoint::wire::{self, Connection, DEFAULT_MAX_FRAME};
use veriflow_checkpoint::{Key, Store};
use veriflow_runtime::detect::FdParams;
use veriflow_runtime::log::{terminal_outputs, LogReader, Manifest, RunStatus};
use veriflow_runtime::{Clock, SystemClock};

use super::journal::{self, JournalError, LeaseParams};
use super::{Action, ClientId, Config, ConnId, Coordinator, Event, Joining};
use crate::error::ClusterError;
use crate::observe::{Dashboard, Observation, OracleNews, WorkerCounters};
use crate::protocol::{
    ClusterStatus, FromOracle, Hello, ToCoord, ToOracle, ToSubmit, ToWorker, WorkerId,
};

/// How a coordinator process runs.
#[derive(Clone)]
pub struct CoordinatorConfig {
    /// The cluster's key.
    pub key: Key,
    /// The store every member logs into, as a spec.
    pub store_spec: String,
    /// The same store, opened here.
    pub store: Arc<dyn Store>,
    /// The failure detector's parameters (paper 004 §4), sent to every worker too.
    pub fd: FdParams,
    /// Wait for the active coordinator's lease to expire instead of refusing to start.
    pub standby: bool,
    /// The other coordinators' addresses (told to workers and clients).
    pub coordinators: Vec<String>,
    /// The lease's renewal and expiry.
    pub lease: LeaseParams,
}

impl std::fmt::Debug for CoordinatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorConfig")
            .field("store", &self.store_spec)
            .field("standby", &self.standby)
            .finish_non_exhaustive()
    }
}

/// Most connections open at once: a cluster of a few hundred workers and clients fits, a
/// flood of key holders does not exhaust the process (rule 7).
const MAX_CONNECTIONS: usize = 4096;

/// Largest frame a worker or client may send the coordinator: reports carry the terminal
/// outputs and an iterative run's final states, so this stays the wire's default.
const MAX_FRAME: usize = DEFAULT_MAX_FRAME;

enum Input {
    Event(Event),
    /// A worker connection said hello: frames to it go through `tx`.
    WorkerConn {
        conn: ConnId,
        tx: UnboundedSender<ToWorker>,
        reader: AbortHandle,
    },
    FromConn {
        conn: ConnId,
        msg: ToCoord,
    },
    ConnClosed {
        conn: ConnId,
        reason: String,
    },
    ClientConn {
        id: ClientId,
        tx: UnboundedSender<ToSubmit>,
    },
    /// The online oracle's connection: frames to it go through `tx`.
    OracleConn {
        id: ClientId,
        tx: UnboundedSender<ToOracle>,
    },
    /// The lease could not be renewed: this coordinator must stop.
    Deposed(String),
    /// A status client asks for a snapshot (read-only: no event for the state machine).
    Status(tokio::sync::oneshot::Sender<ClusterStatus>),
    /// The dashboard asks for a snapshot and the workers' counters (`observe` rule 1).
    Observe(tokio::sync::oneshot::Sender<Observation>),
}

/// The dashboard's way to ask the actor for an [`Observation`] (`observe` rule 1).
#[derive(Clone)]
pub(crate) struct Observer {
    tx: UnboundedSender<Input>,
    role: Arc<Role>,
    me: String,
}

impl Observer {
    /// The cluster now; a coordinator that does not hold the role yet says it stands by.
    pub(crate) async fn observe(&self) -> Observation {
        let standby = || Observation {
            status: ClusterStatus {
                coordinator: self.me.clone(),
                role: "standby".to_string(),
                active: self.role.holder(),
                ..ClusterStatus::default()
            },
            ..Observation::default()
        };
        if !self.role.active.load(Ordering::SeqCst) {
            return standby();
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.tx.send(Input::Observe(tx)).is_err() {
            return standby();
        }
        rx.await.unwrap_or_else(|_| standby())
    }
}

/// Who holds the role, as the connection handlers answer it.
#[derive(Default)]
struct Role {
    active: AtomicBool,
    holder: Mutex<Option<String>>,
}

impl Role {
    fn holder(&self) -> Option<String> {
        self.holder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Serves on `listener` until deposed: as a candidate until it holds the lease, then as the
/// active coordinator (module docs).
/// `on_active` runs once, when it takes the role.
pub async fn serve(
    listener: TcpListener,
    cfg: CoordinatorConfig,
    on_active: impl FnOnce(),
) -> Result<(), ClusterError> {
    serve_observed(listener, cfg, None, on_active).await
}

/// [`serve`], and the `dashboard` if one is given, from the start (a standby's page says it
/// stands by until it takes the role).
pub async fn serve_observed(
    listener: TcpListener,
    cfg: CoordinatorConfig,
    dashboard: Option<Dashboard>,
    on_active: impl FnOnce(),
) -> Result<(), ClusterError> {
    let advertise = listener
        .local_addr()
        .map_err(|e| ClusterError::Listen {
            addr: "the coordinator's address".to_string(),
            source: e,
        })?
        .to_string();
    let (tx, rx) = unbounded_channel();
    let role = Arc::new(Role::default());
    tokio::spawn(accept(listener, cfg.key.clone(), tx.clone(), role.clone()));
    if let Some(d) = dashboard {
        tokio::spawn(d.run(Observer {
            tx: tx.clone(),
            role: role.clone(),
            me: advertise.clone(),
        }));
    }
    let clock = SystemClock::default();
    let (term, found) = acquire(&cfg, &advertise, &role).await?;
    let secret = veriflow_checkpoint::key::random_bytes::<32>();
    let mut config = Config::new(&cfg.store_spec, cfg.fd, secret);
    config.advertise = advertise.clone();
    config.coordinators = cfg.coordinators.clone();
    config.term = term;
    config.wall_zero = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(clock.now());
    let (core, first) = match found {
        Some(j) => {
            let mut c = Coordinator::recover(config, j, clock.now());
            let first = c.on_event(clock.now(), Event::Tick);
            (c, first)
        }
        None => (Coordinator::new(config), Vec::new()),
    };
    *role.holder.lock().unwrap_or_else(|p| p.into_inner()) = Some(advertise.clone());
    role.active.store(true, Ordering::SeqCst);
    eprintln!("coordinator: active at {advertise} (term {term:#x})");
    on_active();
    tokio::spawn(renew(
        cfg.store.clone(),
        cfg.lease,
        term,
        advertise,
        tx.clone(),
    ));
    actor(core, first, rx, tx, cfg.store.clone(), clock).await
}

/// Becomes the active coordinator (module docs): the term taken and the predecessor's journal.
///
/// A standby rides out a store it cannot read (checkpoint servers down or paused beyond what
/// the strategy tolerates, for a while): it says so once per outage and tries again every
/// renewal period, since the coordinator it stands by for may need it at any moment. A
/// damaged record, and any error of a candidate that is not a standby, stops it with the
/// error: a coordinator started on a store it cannot reach is a mistake to show at once.
async fn acquire(
    cfg: &CoordinatorConfig,
    me: &str,
    role: &Role,
) -> Result<(u64, Option<journal::Journal>), ClusterError> {
    let mut seen: Option<(journal::Lease, Instant)> = None;
    let mut outage: Option<Instant> = None;
    loop {
        match try_acquire(cfg, me, role, &mut seen).await {
            Ok(Some(taken)) => return Ok(taken),
            Ok(None) => {
                if let Some(since) = outage.take() {
                    eprintln!(
                        "coordinator: the store answers again (after {:.1} s); standing by",
                        since.elapsed().as_secs_f64()
                    );
                }
            }
            Err(ClusterError::Journal(e @ JournalError::Store(_))) if cfg.standby => {
                if outage.is_none() {
                    eprintln!("coordinator: standby cannot read the store ({e}); retrying");
                    outage = Some(Instant::now());
                }
                // What was seen of the lease is stale after an outage: watch it anew.
                seen = None;
            }
            Err(e) => return Err(e),
        }
        tokio::time::sleep(cfg.lease.renew).await;
    }
}

/// One look at the lease ([`acquire`]): the term and journal when this candidate took over.
async fn try_acquire(
    cfg: &CoordinatorConfig,
    me: &str,
    role: &Role,
    seen: &mut Option<(journal::Lease, Instant)>,
) -> Result<Option<(u64, Option<journal::Journal>)>, ClusterError> {
    let store = cfg.store.clone();
    let s = store.clone();
    let lease = blocking(move || journal::read_lease(&*s)).await?;
    let now = Instant::now();
    let expired = match (&lease, &*seen) {
        // A standby waits for an active coordinator to appear, then for its lease to end.
        (None, _) => !cfg.standby,
        (Some(l), Some((old, since))) if l == old => now.duration_since(*since) >= cfg.lease.expiry,
        (Some(l), _) => {
            if seen.is_some() && !cfg.standby {
                return Err(ClusterError::Refused {
                    addr: l.holder.clone(),
                    reason: format!(
                        "coordinator {} holds the lease of this store (term {:#x}) and is \
                         alive: start this one with --standby",
                        l.holder, l.term
                    ),
                });
            }
            *role.holder.lock().unwrap_or_else(|p| p.into_inner()) = Some(l.holder.clone());
            *seen = Some((l.clone(), now));
            false
        }
    };
    if !expired {
        return Ok(None);
    }
    let s = store.clone();
    let found = blocking(move || journal::read_journal(&*s)).await?;
    let seen_term = lease
        .as_ref()
        .map_or(0, |l| l.term)
        .max(found.as_ref().map_or(0, |j| j.term));
    let term = journal::next_term(seen_term, me);
    let (s, who) = (store.clone(), me.to_string());
    if blocking(move || journal::take_over(&*s, term, &who)).await? {
        // Rule 2: the journal read again under the lease (a predecessor's last write may
        // have landed between the first read and the fence).
        let s = store.clone();
        let found = blocking(move || journal::read_journal(&*s)).await?;
        return Ok(Some((term, found)));
    }
    *seen = None;
    Ok(None)
}

/// Runs a journal or lease call on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, JournalError> + Send + 'static,
) -> Result<T, ClusterError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| {
            ClusterError::Journal(JournalError::Damaged {
                what: "journal call",
                reason: e.to_string(),
            })
        })?
        .map_err(ClusterError::Journal)
}

/// Rule 4 of `journal`: renews the lease until deposed; a lease that cannot be written for an
/// expiry deposes this coordinator too (a standby may have taken over meanwhile).
async fn renew(
    store: Arc<dyn Store>,
    params: LeaseParams,
    term: u64,
    holder: String,
    tx: UnboundedSender<Input>,
) {
    let mut beat = 0u64;
    let mut failing_since: Option<Instant> = None;
    loop {
        tokio::time::sleep(params.renew).await;
        beat += 1;
        let lease = journal::Lease {
            term,
            holder: holder.clone(),
            beat,
        };
        let s = store.clone();
        match blocking(move || journal::renew_lease(&*s, &lease)).await {
            Ok(()) => failing_since = None,
            Err(ClusterError::Journal(JournalError::Deposed(e))) => {
                let _ = tx.send(Input::Deposed(format!("the store refused its lease: {e}")));
                return;
            }
            Err(e) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= params.expiry {
                    let _ = tx.send(Input::Deposed(format!(
                        "its lease could not be renewed for {:?}: {e}",
                        params.expiry
                    )));
                    return;
                }
            }
        }
    }
}

async fn accept(listener: TcpListener, key: Key, tx: UnboundedSender<Input>, role: Arc<Role>) {
    let open = Arc::new(AtomicUsize::new(0));
    let mut next_id: ConnId = 1;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors, most often: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if open.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            eprintln!("coordinator: refused a connection from {peer}: {MAX_CONNECTIONS} open");
            continue;
        }
        let _ = stream.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        let (tx, key, open, role) = (tx.clone(), key.clone(), open.clone(), role.clone());
        open.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            connection(stream, peer.to_string(), id, key, tx, &role).await;
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

async fn connection(
    stream: TcpStream,
    peer: String,
    id: ConnId,
    key: Key,
    events: UnboundedSender<Input>,
    role: &Role,
) {
    let conn = match Connection::server(stream, &key, wire::Role::Coordinator, MAX_FRAME).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("refused a connection from {peer}: {e}");
            eprintln!("coordinator: refused a connection from {peer}: {e}");
            return;
        }
    };
    let binding = conn.channel_binding();
    let (mut reader, mut writer) = conn.into_split();
    let hello: Hello = match reader.recv().await {
        Ok(h) => h,
        Err(e) => {
            eprintln!("coordinator: dropped {peer}: {e}");
            return;
        }
    };
    if !role.active.load(Ordering::SeqCst) {
        let active = role.holder();
        let _ = match hello {
            Hello::Worker { .. } | Hello::Rejoin(_) => {
                writer.send(&ToWorker::Standby { active }).await
            }
            Hello::Submit { .. } | Hello::Attach { .. } | Hello::Cancel { .. } | Hello::Status => {
                writer.send(&ToSubmit::Standby { active }).await
            }
            Hello::Oracle { .. } => writer.send(&ToOracle::Standby { active }).await,
        };
        return;
    }
    let event = match hello {
        Hello::Worker {
            program,
            peer_addr,
            threads,
            spare,
            public_key,
        } => Event::Joined {
            conn: id,
            hello: Joining {
                program,
                peer_addr,
                threads,
                spare,
                public_key,
            },
        },
        Hello::Rejoin(claim) => Event::Rejoined {
            conn: id,
            claim,
            binding,
        },
        Hello::Submit { program, job } => {
            serve_client(
                id,
                Event::Submit {
                    client: id,
                    program,
                    job,
                },
                writer,
                &events,
            )
            .await;
            return;
        }
        Hello::Attach { job } => {
            serve_client(id, Event::Attach { client: id, job }, writer, &events).await;
            return;
        }
        Hello::Cancel { job } => {
            serve_client(id, Event::Cancel { client: id, job }, writer, &events).await;
            return;
        }
        Hello::Oracle {
            program,
            public_key,
            following,
        } => {
            let hello = Event::OracleJoined {
                client: id,
                program,
                public_key,
                following,
            };
            serve_oracle(id, hello, reader, writer, &events).await;
            return;
        }
        Hello::Status => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            if events.send(Input::Status(tx)).is_ok() {
                if let Ok(status) = rx.await {
                    let _ = writer.send(&ToSubmit::Status(Box::new(status))).await;
                }
            }
            return;
        }
    };
    let (tx, mut rx) = unbounded_channel::<ToWorker>();
    let events2 = events.clone();
    // The reader waits for the hello's event to be queued first (frames follow the hello).
    let (go, ready) = tokio::sync::oneshot::channel::<()>();
    let reading = tokio::spawn(async move {
        let _ = ready.await;
        let reason = loop {
            match reader.recv::<ToCoord>().await {
                Ok(msg) => {
                    if events2.send(Input::FromConn { conn: id, msg }).is_err() {
                        return;
                    }
                }
                Err(e) => break e.to_string(),
            }
        };
        let _ = events2.send(Input::ConnClosed { conn: id, reason });
    });
    let _ = events.send(Input::WorkerConn {
        conn: id,
        tx,
        reader: reading.abort_handle(),
    });
    let _ = events.send(Input::Event(event));
    let _ = go.send(());
    // Writes until the coordinator drops this connection (then the channel closes).
    while let Some(m) = rx.recv().await {
        if writer.send(&m).await.is_err() {
            break;
        }
    }
}

async fn serve_client(
    id: ClientId,
    event: Event,
    mut writer: veriflow_checkpoint::wire::WireWriter<tokio::net::tcp::OwnedWriteHalf>,
    events: &UnboundedSender<Input>,
) {
    let (tx, mut rx) = unbounded_channel::<ToSubmit>();
    let _ = events.send(Input::ClientConn { id, tx });
    let _ = events.send(Input::Event(event));
    while let Some(m) = rx.recv().await {
        let last = matches!(
            m,
            ToSubmit::Finished { .. } | ToSubmit::Failed { .. } | ToSubmit::Cancelled { .. }
        );
        if writer.send(&m).await.is_err() || last {
            break;
        }
    }
}

/// The online oracle's connection (`coordinator` rule 11): its frames become events, the
/// coordinator's messages to it are written until it is refused or the connection ends.
async fn serve_oracle(
    id: ClientId,
    hello: Event,
    mut reader: veriflow_checkpoint::wire::WireReader<tokio::net::tcp::OwnedReadHalf>,
    mut writer: veriflow_checkpoint::wire::WireWriter<tokio::net::tcp::OwnedWriteHalf>,
    events: &UnboundedSender<Input>,
) {
    let (tx, mut rx) = unbounded_channel::<ToOracle>();
    let _ = events.send(Input::OracleConn { id, tx });
    let _ = events.send(Input::Event(hello));
    let events2 = events.clone();
    let reading = tokio::spawn(async move {
        let reason = loop {
            match reader.recv::<FromOracle>().await {
                Ok(msg) => {
                    let e = Event::FromOracle { client: id, msg };
                    if events2.send(Input::Event(e)).is_err() {
                        return;
                    }
                }
                Err(e) => break e.to_string(),
            }
        };
        let _ = events2.send(Input::Event(Event::OracleClosed { client: id, reason }));
    });
    while let Some(m) = rx.recv().await {
        let last = matches!(m, ToOracle::Refused { .. });
        if writer.send(&m).await.is_err() || last {
            break;
        }
    }
    reading.abort();
    let _ = events.send(Input::Event(Event::OracleClosed {
        client: id,
        reason: "its connection was closed".to_string(),
    }));
}

/// How long a journal write may keep failing before this coordinator gives up its role.
const JOURNAL_PATIENCE: Duration = Duration::from_secs(5);

/// Rule 9: writes the journal before anything else happens; retries a failing store for
/// [`JOURNAL_PATIENCE`].
async fn write_journal(
    store: &Arc<dyn Store>,
    j: journal::Journal,
    seq: u64,
) -> Result<(), ClusterError> {
    let j = Arc::new(j);
    let start = Instant::now();
    let mut delay = Duration::from_millis(20);
    loop {
        let (s, jj) = (store.clone(), j.clone());
        match blocking(move || journal::write_journal(&*s, &jj, seq)).await {
            Ok(()) => return Ok(()),
            Err(ClusterError::Journal(e @ JournalError::Deposed(_))) => {
                return Err(ClusterError::Deposed(e.to_string()))
            }
            Err(e) if start.elapsed() >= JOURNAL_PATIENCE => {
                return Err(ClusterError::Deposed(format!(
                    "its journal could not be written for {JOURNAL_PATIENCE:?}: {e}"
                )))
            }
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(500));
            }
        }
    }
}

/// Owns the state machine: feeds it events and timer ticks, carries out its actions.
async fn actor(
    mut core: Coordinator,
    first: Vec<Action>,
    mut rx: UnboundedReceiver<Input>,
    me: UnboundedSender<Input>,
    store: Arc<dyn Store>,
    clock: SystemClock,
) -> Result<(), ClusterError> {
    let mut conns: HashMap<ConnId, (UnboundedSender<ToWorker>, AbortHandle)> = HashMap::new();
    let mut admitted: HashMap<ConnId, WorkerId> = HashMap::new();
    let mut workers: HashMap<WorkerId, (ConnId, UnboundedSender<ToWorker>, AbortHandle)> =
        HashMap::new();
    let mut clients: HashMap<ClientId, UnboundedSender<ToSubmit>> = HashMap::new();
    let mut oracles: HashMap<ClientId, UnboundedSender<ToOracle>> = HashMap::new();
    // `observe` rule 2: each worker's last counters, lost workers' kept.
    let mut counters: BTreeMap<WorkerId, WorkerCounters> = BTreeMap::new();
    // And what the admitted oracle reported (`observe` rule 1).
    let mut oracle_news = OracleNews::default();
    let mut pending = first;
    let mut journal_seq = 0u64;
    loop {
        for action in std::mem::take(&mut pending) {
            match action {
                Action::Journal(j) => {
                    // `journal` rule 6: each record its own number; retries keep it.
                    write_journal(&store, *j, journal_seq).await?;
                    journal_seq += 1;
                }
                Action::Admit { conn, worker } => {
                    if let Some((tx, reader)) = conns.remove(&conn) {
                        admitted.insert(conn, worker);
                        // A reconnection (rule 10): the old connection is the worker's no more,
                        // and its close accuses nobody.
                        if let Some((old, _, old_reader)) =
                            workers.insert(worker, (conn, tx, reader))
                        {
                            admitted.remove(&old);
                            old_reader.abort();
                        }
                    }
                }
                Action::Refuse { conn, msg } => {
                    // The writer flushes the refusal, then the channel ends.
                    if let Some((tx, reader)) = conns.remove(&conn) {
                        let _ = tx.send(msg);
                        reader.abort();
                    }
                }
                Action::ToWorker { worker, msg } => {
                    if let Some((_, tx, _)) = workers.get(&worker) {
                        let _ = tx.send(msg);
                    }
                }
                Action::Disconnect { worker } => {
                    if let Some((conn, _, reader)) = workers.remove(&worker) {
                        admitted.remove(&conn);
                        reader.abort();
                    }
                }
                Action::ToClient { client, msg } => {
                    let last = matches!(msg, ToSubmit::Finished { .. } | ToSubmit::Failed { .. });
                    if let Some(tx) = clients.get(&client) {
                        let _ = tx.send(msg);
                    }
                    if last {
                        clients.remove(&client);
                    }
                }
                Action::CheckStore { job } => {
                    let (store, me) = (store.clone(), me.clone());
                    tokio::task::spawn_blocking(move || {
                        let result = crate::job_store(&store, job, true)
                            .map_err(|e| e.to_string())
                            .and_then(|s| {
                                Manifest::load(&*s)
                                    .map(|m| m.is_some())
                                    .map_err(|e| e.to_string())
                            });
                        let _ = me.send(Input::Event(Event::StoreChecked { job, result }));
                    });
                }
                Action::ReadOutputs { job } => {
                    let (store, me) = (store.clone(), me.clone());
                    tokio::task::spawn_blocking(move || {
                        let result = crate::job_store(&store, job, false)
                            .map_err(|e| e.to_string())
                            .and_then(read_outputs);
                        let _ = me.send(Input::Event(Event::OutputsRead { job, result }));
                    });
                }
                Action::RecordFinished { job } => {
                    let (store, me) = (store.clone(), me.clone());
                    tokio::task::spawn_blocking(move || {
                        let result = crate::job_store(&store, job, false)
                            .map_err(|e| e.to_string())
                            .and_then(|s| record_finished(&*s));
                        let _ = me.send(Input::Event(Event::Recorded { job, result }));
                    });
                }
                Action::ToOracle { client, msg } => {
                    let last = matches!(msg, ToOracle::Refused { .. });
                    if let Some(tx) = oracles.get(&client) {
                        let _ = tx.send(msg);
                    }
                    if last {
                        oracles.remove(&client);
                    }
                }
                Action::Note(line) => eprintln!("coordinator: {line}"),
            }
        }
        let wait = core.next_deadline().saturating_sub(clock.now());
        let event = match tokio::time::timeout(wait.max(Duration::from_millis(1)), rx.recv()).await
        {
            Ok(None) => return Ok(()),
            Ok(Some(Input::WorkerConn { conn, tx, reader })) => {
                conns.insert(conn, (tx, reader));
                continue;
            }
            Ok(Some(Input::ClientConn { id, tx })) => {
                clients.insert(id, tx);
                continue;
            }
            Ok(Some(Input::OracleConn { id, tx })) => {
                oracles.insert(id, tx);
                continue;
            }
            Ok(Some(Input::Status(reply))) => {
                let _ = reply.send(core.status(clock.now()));
                continue;
            }
            Ok(Some(Input::Observe(reply))) => {
                let _ = reply.send(Observation {
                    status: core.status(clock.now()),
                    workers: counters.clone(),
                    oracle: oracle_news.clone(),
                });
                continue;
            }
            Ok(Some(Input::FromConn { conn, msg })) => match admitted.get(&conn) {
                Some(&worker) => {
                    if let ToCoord::Metrics(m) = &msg {
                        counters.insert(worker, WorkerCounters { runtime: m.clone() });
                    }
                    Event::FromWorker { worker, msg }
                }
                None => continue,
            },
            Ok(Some(Input::ConnClosed { conn, reason })) => {
                conns.remove(&conn);
                match admitted.remove(&conn) {
                    Some(worker) => Event::Closed { worker, reason },
                    None => continue,
                }
            }
            Ok(Some(Input::Deposed(why))) => return Err(ClusterError::Deposed(why)),
            Ok(Some(Input::Event(ev))) => {
                if let Event::OracleClosed { client, .. } = &ev {
                    oracles.remove(client);
                }
                if let Event::FromOracle { client, msg } = &ev {
                    if oracles.contains_key(client) {
                        oracle_news.note(msg);
                    }
                }
                ev
            }
            Err(_) => Event::Tick,
        };
        pending = core.on_event(clock.now(), event);
    }
}

/// The terminal outputs from the logs (rule 6).
pub(crate) fn read_outputs(store: Arc<dyn Store>) -> Result<Option<Vec<Vec<u8>>>, String> {
    LogReader::latest(store)
        .and_then(|r| terminal_outputs(&r))
        .map_err(|e| e.to_string())
}

/// Records the run as finished in the manifest (rule 6) and returns its root; a run without a
/// log (`--no-checkpoint`) has no manifest and no root. A store that cannot record it fails the
/// job: a log left `Running` would refuse `certify` later.
pub(crate) fn record_finished(store: &dyn Store) -> Result<String, String> {
    match Manifest::load(store) {
        Ok(Some(mut m)) => {
            m.status = RunStatus::Finished;
            m.store(store)
                .map(|()| format!("{:#}", m.root))
                .map_err(|e| format!("the job finished but the store did not record it: {e}"))
        }
        Ok(None) => Ok(String::new()),
        Err(e) => Err(format!(
            "the job finished but its manifest cannot be read: {e}"
        )),
    }
}

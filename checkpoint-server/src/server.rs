//! The checkpoint server: holds fragments in a [`Store`] (sled on disk, or RAM with `--memory`:
//! the diskless checkpoint of paper 002) and answers the requests of `protocol.rs` over
//! [`crate::wire`] connections.
//!
//! Rules (beside those of `protocol.rs`):
//!
//! 1. Each connection is authenticated first (wire rule 2); a connection that fails the
//!    handshake or breaks the protocol later is closed and logged; the server keeps serving
//!    every other connection.
//! 2. Store calls are blocking (sled), so they never run on a worker that drives sockets:
//!    reads run on tokio's blocking pool, writes on the server's committer thread (rule 6).
//! 3. Requests on one connection are answered in order; connections are independent.
//! 4. **Every size and count is bounded** ([`ServerConfig`]): at most `max_connections` open
//!    connections, and `max_connections_per_peer` from one IP address; an extra one is closed
//!    at once and the refusal logged (at most once a second, with the count refused since).
//!    Request frames are received within one [`FrameBudget`] of `memory_budget` bytes (wire
//!    rules 7-8: a partial frame holds what arrived, not what it declares, and must complete
//!    within `frame_timeout`); at most `max_requests` requests are handled at once, each
//!    holding its slot until its answer is sent (also within `frame_timeout`), so answers take
//!    at most `max_requests × max_frame` beyond the budget. A scan page holds at most
//!    `page_keys` pairs and `page_bytes` bytes (or one pair, however large) and reads only
//!    that page from the store; clients page through (protocol rule 5).
//! 5. A failing `accept` (out of file descriptors, ...) is retried after a pause that doubles
//!    from [`ACCEPT_BACKOFF_MIN`] to [`ACCEPT_BACKOFF_MAX`] while it keeps failing.
//! 6. **Group commit.** Every write request (`Put`, `Batch`, `FencedBatch`, `Delete`,
//!    `DeleteBatch`, `RaiseFence`), from whichever connection, is checked on its connection
//!    (fragments, protocol rule 1) and then queued for one committer thread. The committer
//!    takes every request queued, applies each to the store as its own atomic write (a fenced
//!    batch still checks its fences and writes under one lock, protocol rule 7; one request's
//!    refusal answers that request only), then flushes the store **once** for all that it
//!    applied, and only then answers them `Done` (protocol rule 2); if the flush fails, each of
//!    them is answered `Failed`. So requests that arrive while a flush runs share the next
//!    one: N concurrent writers cost about one flush per flush time, not N, and no request
//!    waits for a thread of its own.
//!
//!    ```text
//!    conn A: FencedBatch ─┐                        ┌─ Done (A)
//!    conn B: FencedBatch ─┼─ queue ─ apply A, B, C ─ flush ─┼─ Done (B)
//!    conn C: DeleteBatch ─┘                        └─ Done (C)
//!    ```

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_bytes::ByteBuf;
use tokio::net::{TcpListener, TcpStream};

use crate::erasure::verify_fragment;
use crate::key::Key;
use crate::protocol::{Request, Response, ServerAnswer, ServerCall, Slot, PROTOCOL_VERSION};
use crate::store::{PageLimit, Store, StoreError};
use crate::wire::{Connection, FrameBudget, Role, WireError, DEFAULT_MAX_FRAME};

/// First pause after a failed `accept` (rule 5).
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause after failed `accept`s (rule 5): long enough that a server out of file
/// descriptors costs nothing, short enough to serve again within a second of recovering.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Limits of a checkpoint server (rule 4). `Default` gives the values below; [`ServerConfig::validate`]
/// checks a changed one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest frame accepted (default [`DEFAULT_MAX_FRAME`], 64 MiB).
    pub max_frame: usize,
    /// Bytes of request frames held at once over all connections (default 256 MiB: four
    /// largest frames, or thousands of segment batches).
    pub memory_budget: usize,
    /// Open connections over all peers (default 512: below the usual 1024 file descriptors,
    /// far above the one connection per client process a cluster uses).
    pub max_connections: usize,
    /// Open connections from one IP address (default 64: every process of a test cluster on
    /// one machine shares 127.0.0.1).
    pub max_connections_per_peer: usize,
    /// Requests handled at once (default 8: sled serializes flushes, so more buys little).
    pub max_requests: usize,
    /// Time for a frame's body to arrive once its length did, and for an answer to be sent
    /// (default 60 s, the client's request timeout).
    pub frame_timeout: Duration,
    /// Pairs in one scan page (default 4096).
    pub page_keys: usize,
    /// Bytes in one scan page (default 4 MiB; a client may ask for less).
    pub page_bytes: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_frame: DEFAULT_MAX_FRAME,
            memory_budget: 256 << 20,
            max_connections: 512,
            max_connections_per_peer: 64,
            max_requests: 8,
            frame_timeout: Duration::from_secs(60),
            page_keys: 4096,
            page_bytes: 4 << 20,
        }
    }
}

impl ServerConfig {
    /// Checks that the limits add up: every count at least 1, and a largest frame that fits in
    /// the memory budget (else it could never be received).
    pub fn validate(&self) -> Result<(), ServerError> {
        let bad = |m: String| Err(ServerError::Config(m));
        if self.max_frame < 64 {
            return bad(format!(
                "max_frame {} is below the 64 bytes of a handshake",
                self.max_frame
            ));
        }
        if self.memory_budget < crate::wire::frame_cost(self.max_frame) {
            return bad(format!(
                "memory budget {} is smaller than what the largest frame {} costs to receive ({}: the frame and one 64 KiB Noise message): such a frame could never be received",
                self.memory_budget,
                self.max_frame,
                crate::wire::frame_cost(self.max_frame)
            ));
        }
        for (name, v) in [
            ("max_connections", self.max_connections),
            ("max_connections_per_peer", self.max_connections_per_peer),
            ("max_requests", self.max_requests),
            ("page_keys", self.page_keys),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        if self.page_bytes == 0 || self.frame_timeout.is_zero() {
            return bad("page_bytes and frame_timeout must be above 0".to_string());
        }
        Ok(())
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The limits do not add up (fix the options).
    #[error("bad server limits: {0}")]
    Config(String),
    /// The address could not be bound.
    #[error("cannot listen: {0}")]
    Bind(#[from] std::io::Error),
}

/// Counters of a running server, for tests and monitoring (cloneable handle).
#[derive(Debug, Clone)]
pub struct ServerStats {
    budget: FrameBudget,
    conns: Arc<ConnTable>,
    commits: Arc<CommitCounters>,
}

/// What the committer did (rule 6).
#[derive(Debug, Default)]
struct CommitCounters {
    /// Write requests queued and not yet taken by the committer.
    waiting: AtomicUsize,
    /// Write requests applied.
    writes: AtomicU64,
    /// Store flushes the committer called.
    flushes: AtomicU64,
}

impl ServerStats {
    /// Open connections.
    pub fn connections(&self) -> usize {
        self.conns.total.load(Ordering::SeqCst)
    }
    /// Connections refused by the caps so far.
    pub fn refused_connections(&self) -> u64 {
        self.conns.refused.load(Ordering::SeqCst)
    }
    /// Failed `accept` calls so far.
    pub fn accept_errors(&self) -> u64 {
        self.conns.accept_errors.load(Ordering::SeqCst)
    }
    /// The request frame budget and its counters (bytes reserved, buffered, peak).
    pub fn budget(&self) -> &FrameBudget {
        &self.budget
    }
    /// Write requests queued for the committer and not yet taken (rule 6).
    pub fn writes_waiting(&self) -> usize {
        self.commits.waiting.load(Ordering::SeqCst)
    }
    /// Write requests the committer applied so far (rule 6).
    pub fn writes(&self) -> u64 {
        self.commits.writes.load(Ordering::SeqCst)
    }
    /// Store flushes the committer called so far (rule 6): at most one per round of writes.
    pub fn flushes(&self) -> u64 {
        self.commits.flushes.load(Ordering::SeqCst)
    }
}

/// Open connections, total and per peer address (rule 4).
#[derive(Debug, Default)]
struct ConnTable {
    total: AtomicUsize,
    per_peer: Mutex<HashMap<IpAddr, usize>>,
    refused: AtomicU64,
    accept_errors: AtomicU64,
}

/// One open connection's place in the [`ConnTable`]; gives it back when dropped.
struct ConnSlot {
    table: Arc<ConnTable>,
    ip: IpAddr,
}

impl ConnTable {
    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.per_peer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a connection from `ip`, or why not.
    fn admit(self: &Arc<Self>, ip: IpAddr, cfg: &ServerConfig) -> Result<ConnSlot, String> {
        let mut peers = self.peers();
        let total = self.total.load(Ordering::SeqCst);
        if total >= cfg.max_connections {
            return Err(format!(
                "{total} connections open, the limit is {}",
                cfg.max_connections
            ));
        }
        let mine = peers.entry(ip).or_insert(0);
        if *mine >= cfg.max_connections_per_peer {
            return Err(format!(
                "{mine} connections open from {ip}, the limit per peer is {}",
                cfg.max_connections_per_peer
            ));
        }
        *mine += 1;
        self.total.fetch_add(1, Ordering::SeqCst);
        Ok(ConnSlot {
            table: self.clone(),
            ip,
        })
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut peers = self.table.peers();
        if let Some(n) = peers.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                peers.remove(&self.ip);
            }
        }
        self.table.total.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The pause after failed `accept`s (rule 5).
#[derive(Debug)]
struct AcceptBackoff {
    next: Duration,
}

impl AcceptBackoff {
    fn new() -> Self {
        AcceptBackoff {
            next: ACCEPT_BACKOFF_MIN,
        }
    }
    /// After a failure: how long to pause.
    fn failed(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(ACCEPT_BACKOFF_MAX);
        d
    }
    /// After a success: the next failure pauses briefly again.
    fn succeeded(&mut self) {
        self.next = ACCEPT_BACKOFF_MIN;
    }
}

/// Logs refused connections at most once a second (rule 4), so a flood cannot flood the log.
#[derive(Debug, Default)]
struct RefusalLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl RefusalLog {
    fn refused(&mut self, peer: SocketAddr, why: &str) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.suppressed += 1;
            return;
        }
        if self.suppressed > 0 {
            tracing::warn!(
                "refused connection from {peer}: {why} ({} more refused since the last report)",
                self.suppressed
            );
        } else {
            tracing::warn!("refused connection from {peer}: {why}");
        }
        self.last = Some(now);
        self.suppressed = 0;
    }
}

/// What every connection task shares.
struct Shared {
    store: Arc<dyn Store>,
    key: Key,
    config: ServerConfig,
    budget: FrameBudget,
    requests: Arc<tokio::sync::Semaphore>,
    committer: Committer,
}

/// A write request waiting for the committer, and where its answer goes (rule 6).
struct Job {
    req: Request,
    reply: tokio::sync::oneshot::Sender<Response>,
}

/// The queue of the committer thread (rule 6). The thread ends when the queue's last sender
/// (this) is dropped with the server.
struct Committer {
    queue: std::sync::mpsc::Sender<Job>,
    counters: Arc<CommitCounters>,
}

impl Committer {
    fn start(store: Arc<dyn Store>) -> std::io::Result<Committer> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let counters = Arc::new(CommitCounters::default());
        let c = counters.clone();
        std::thread::Builder::new()
            .name("ckpt-committer".to_string())
            .spawn(move || commit_loop(&*store, &rx, &c))?;
        Ok(Committer {
            queue: tx,
            counters,
        })
    }

    /// Queues `req` and waits for its answer.
    async fn call(&self, req: Request) -> Response {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.counters.waiting.fetch_add(1, Ordering::SeqCst);
        let sent = self.queue.send(Job { req, reply });
        if sent.is_err() {
            self.counters.waiting.fetch_sub(1, Ordering::SeqCst);
            return Response::Failed("the server's committer has stopped".to_string());
        }
        answer
            .await
            .unwrap_or_else(|_| Response::Failed("the server's committer has stopped".to_string()))
    }
}

/// Most write requests applied before one flush: bounds the wait of the first of them (the
/// request slots of rule 4 already bound it to `max_requests` in practice).
const MAX_GROUP: usize = 256;

/// The committer thread (rule 6): takes every queued write, applies each, flushes once,
/// answers.
fn commit_loop(store: &dyn Store, rx: &std::sync::mpsc::Receiver<Job>, counters: &CommitCounters) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        counters.waiting.fetch_sub(jobs.len(), Ordering::SeqCst);
        let mut answers: Vec<(tokio::sync::oneshot::Sender<Response>, Option<Response>)> =
            Vec::with_capacity(jobs.len());
        for job in jobs {
            let early = apply(store, job.req).err();
            answers.push((job.reply, early));
        }
        let applied = answers.iter().filter(|(_, a)| a.is_none()).count();
        let flushed = if applied > 0 {
            counters.writes.fetch_add(applied as u64, Ordering::SeqCst);
            counters.flushes.fetch_add(1, Ordering::SeqCst);
            store.flush().map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        for (reply, early) in answers {
            let resp = early.unwrap_or_else(|| match &flushed {
                Ok(()) => Response::Done,
                Err(e) => Response::Failed(e.clone()),
            });
            let _ = reply.send(resp); // a connection that went away needs no answer
        }
    }
}

/// A checkpoint server bound to an address.
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
    conns: Arc<ConnTable>,
}

impl Server {
    /// Binds `addr` (use port 0 for any free port) to serve `store` to holders of `key`, with
    /// the default limits and `max_frame` (the memory budget grows to hold one such frame).
    pub async fn bind(
        addr: &str,
        store: Arc<dyn Store>,
        key: Key,
        max_frame: usize,
    ) -> std::io::Result<Server> {
        let d = ServerConfig::default();
        let config = ServerConfig {
            max_frame: max_frame.max(64),
            memory_budget: d.memory_budget.max(crate::wire::frame_cost(max_frame)),
            ..d
        };
        Server::bind_with(addr, store, key, config)
            .await
            .map_err(|e| match e {
                ServerError::Bind(e) => e,
                e => std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
            })
    }

    /// Binds `addr` with the limits of `config` (rule 4), checked first.
    pub async fn bind_with(
        addr: &str,
        store: Arc<dyn Store>,
        key: Key,
        config: ServerConfig,
    ) -> Result<Server, ServerError> {
        config.validate()?;
        let listener = TcpListener::bind(addr).await?;
        let committer = Committer::start(store.clone())?;
        Ok(Server {
            listener,
            shared: Arc::new(Shared {
                store,
                key,
                budget: FrameBudget::new(config.memory_budget),
                requests: Arc::new(tokio::sync::Semaphore::new(config.max_requests)),
                config,
                committer,
            }),
            conns: Arc::new(ConnTable::default()),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// A handle on the server's counters, valid while and after it runs.
    pub fn stats(&self) -> ServerStats {
        ServerStats {
            budget: self.shared.budget.clone(),
            conns: self.conns.clone(),
            commits: self.shared.committer.counters.clone(),
        }
    }

    /// Serves until the process ends (rule 1: a failing connection never stops the loop).
    pub async fn run(self) -> std::io::Result<()> {
        let mut backoff = AcceptBackoff::new();
        let mut refusals = RefusalLog::default();
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(x) => {
                    backoff.succeeded();
                    x
                }
                Err(e) => {
                    // Out of file descriptors and similar (rule 5): pause rather than spin.
                    self.conns.accept_errors.fetch_add(1, Ordering::SeqCst);
                    let pause = backoff.failed();
                    tracing::warn!("accept failed: {e}; retrying in {pause:?}");
                    tokio::time::sleep(pause).await;
                    continue;
                }
            };
            let slot = match self.conns.admit(peer.ip(), &self.shared.config) {
                Ok(slot) => slot,
                Err(why) => {
                    self.conns.refused.fetch_add(1, Ordering::SeqCst);
                    refusals.refused(peer, &why);
                    drop(stream);
                    continue;
                }
            };
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let _slot = slot;
                if let Err(e) = serve_connection(stream, &shared).await {
                    match e {
                        // A client that went away (closed, reset, killed) is no news.
                        WireError::Closed | WireError::Io(_) => {
                            tracing::debug!("{peer}: closed: {e}")
                        }
                        e => tracing::warn!("{peer}: connection dropped: {e}"),
                    }
                }
            });
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: &Shared) -> Result<(), WireError> {
    let _ = stream.set_nodelay(true);
    let cfg = &shared.config;
    let mut conn =
        Connection::server(stream, &shared.key, Role::CheckpointServer, cfg.max_frame).await?;
    let limit = PageLimit {
        max_keys: cfg.page_keys,
        max_bytes: cfg.page_bytes,
    };
    loop {
        let (req, reservation): (Request, _) =
            conn.recv_within(&shared.budget, cfg.frame_timeout).await?;
        // Rule 4: a bounded number of requests in hand at once, each until its answer is out.
        let slot = shared
            .requests
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| WireError::Closed)?; // never closed
        let resp = match req {
            Request::Ping => Response::Done,
            Request::Hello { .. } => hello(),
            // Rule 6: checked here, applied and flushed by the committer with the others.
            req if is_write(&req) => match check_request(&*shared.store, &req) {
                Err(refused) => refused,
                Ok(()) => shared.committer.call(req).await,
            },
            req => {
                let store = shared.store.clone();
                tokio::task::spawn_blocking(move || handle(&*store, req, limit))
                    .await
                    .unwrap_or_else(|e| Response::Failed(format!("request handler panicked: {e}")))
            }
        };
        drop(reservation); // the request is consumed; its bytes are free
        tokio::time::timeout(cfg.frame_timeout, conn.send(&resp))
            .await
            .map_err(|_| WireError::Timeout(cfg.frame_timeout))??;
        drop(slot);
    }
}

fn check(key: &ByteBuf, value: &ByteBuf) -> Result<(), Response> {
    verify_fragment(value).map(|_| ()).map_err(|e| {
        Response::Refused(format!(
            "value under {} is not a valid fragment: {e}",
            String::from_utf8_lossy(key)
        ))
    })
}

fn slot(value: Vec<u8>) -> Slot {
    match verify_fragment(&value) {
        Ok(_) => Slot::Present(ByteBuf::from(value)),
        Err(e) => Slot::Corrupt(e.to_string()),
    }
}

/// Whether `req` writes (rule 6: the committer applies it).
fn is_write(req: &Request) -> bool {
    matches!(
        req,
        Request::Put { .. }
            | Request::Batch(_)
            | Request::FencedBatch { .. }
            | Request::Delete { .. }
            | Request::DeleteBatch { .. }
            | Request::RaiseFence { .. }
    )
}

/// What a write request must pass before it reaches the store: every value a fragment
/// (protocol rule 1), fences kept by the store (rule 7). Pure CPU, so it runs on the
/// connection, not the committer.
fn check_request(store: &dyn Store, req: &Request) -> Result<(), Response> {
    match req {
        Request::Put { key, value } => check(key, value),
        Request::Batch(pairs) => pairs.iter().try_for_each(|(k, v)| check(k, v)),
        Request::RaiseFence { .. } if !store.keeps_fences() => Err(no_fences(store)),
        Request::FencedBatch { pairs, .. } => {
            if !store.keeps_fences() {
                return Err(no_fences(store));
            }
            pairs.iter().try_for_each(|(k, v)| check(k, v))
        }
        _ => Ok(()),
    }
}

fn hello() -> Response {
    Response::Hello {
        version: PROTOCOL_VERSION,
    }
}

/// Applies one checked write request to `store` without flushing (rule 6): `Ok` when it is
/// written and waits for the flush, else the answer it gets at once.
fn apply(store: &dyn Store, req: Request) -> Result<(), Response> {
    let failed = |e: StoreError| Response::Failed(e.to_string());
    let pairs = |pairs: Vec<(ByteBuf, ByteBuf)>| -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .into_iter()
            .map(|(k, v)| (k.into_vec(), v.into_vec()))
            .collect()
    };
    match req {
        Request::Put { key, value } => store.put(&key, &value).map_err(failed),
        Request::Batch(p) => store.put_batch(&pairs(p)).map_err(failed),
        Request::Delete { key } => store.delete(&key).map_err(failed),
        Request::DeleteBatch { keys } => {
            let keys: Vec<Vec<u8>> = keys.into_iter().map(ByteBuf::into_vec).collect();
            store.delete_batch(&keys).map_err(failed)
        }
        Request::RaiseFence { scope, epoch } => store.raise_fence(&scope, epoch).map_err(failed),
        Request::FencedBatch { fences, pairs: p } => {
            let fences: Vec<(Vec<u8>, u64)> =
                fences.into_iter().map(|(s, e)| (s.into_vec(), e)).collect();
            // Protocol rule 7: the store checks and writes under one lock.
            match store.put_batch_fenced(&fences, &pairs(p)) {
                Ok(()) => Ok(()),
                Err(StoreError::Fenced {
                    scope,
                    epoch,
                    newest,
                }) => Err(Response::Fenced {
                    scope: ByteBuf::from(scope.into_bytes()),
                    epoch,
                    newest,
                }),
                Err(e) => Err(failed(e)),
            }
        }
        other => Err(Response::Refused(format!(
            "not a write request: {}",
            request_name(&other)
        ))),
    }
}

fn request_name(req: &Request) -> &'static str {
    match req {
        Request::Ping => "Ping",
        Request::Put { .. } => "Put",
        Request::Batch(_) => "Batch",
        Request::Get { .. } => "Get",
        Request::Scan { .. } => "Scan",
        Request::Delete { .. } => "Delete",
        Request::Hello { .. } => "Hello",
        Request::RaiseFence { .. } => "RaiseFence",
        Request::FencedBatch { .. } => "FencedBatch",
        Request::DeleteBatch { .. } => "DeleteBatch",
    }
}

/// Answers one request against `store` (protocol rules 1-5, 7-8), scan pages within `limit`
/// (rule 4: the client's `max_bytes` can only lower it); a write is flushed on its own.
pub(crate) fn handle(store: &dyn Store, req: Request, limit: PageLimit) -> Response {
    let failed = |e: crate::store::StoreError| Response::Failed(e.to_string());
    match req {
        Request::Ping => Response::Done,
        Request::Hello { .. } => hello(),
        Request::Get { key } => match store.get(&key) {
            Ok(v) => Response::Value(v.map(slot)),
            Err(e) => failed(e),
        },
        Request::Scan {
            prefix,
            after,
            max_bytes,
        } => {
            let limit = PageLimit {
                max_keys: limit.max_keys,
                max_bytes: max_bytes.min(limit.max_bytes),
            };
            match store.scan_page(&prefix, after.as_deref().map(Vec::as_slice), limit) {
                Ok(page) => Response::Page {
                    entries: page
                        .pairs
                        .into_iter()
                        .map(|(k, v)| (ByteBuf::from(k), slot(v)))
                        .collect(),
                    more: page.more,
                },
                Err(e) => failed(e),
            }
        }
        req => {
            if let Err(r) = check_request(store, &req).and_then(|()| apply(store, req)) {
                return r;
            }
            match store.flush() {
                Ok(()) => Response::Done,
                Err(e) => failed(e),
            }
        }
    }
}

fn no_fences(store: &dyn Store) -> Response {
    Response::Refused(format!(
        "this server's store ({}) keeps no epoch fences",
        store.describe()
    ))
}

/// Answers one request against `store` in this process, with the default page limits: what a
/// server does with a request off the wire, for a [`crate::strategy::ServerLink`] that reaches
/// a server without a network (the cluster simulator's checkpoint servers).
pub fn serve(store: &dyn Store, call: ServerCall) -> ServerAnswer {
    let d = ServerConfig::default();
    let limit = PageLimit {
        max_keys: d.page_keys,
        max_bytes: d.page_bytes,
    };
    ServerAnswer(handle(store, call.0, limit))
}

#[cfg(test)]
mod tests;

//! A blocking client for a set of checkpoint servers: it owns a small tokio runtime, keeps one
//! authenticated connection per server, and runs the requests of one call on every server in
//! parallel (the [`crate::Store`] trait is synchronous, so this is where async stops).
//!
//! Rules:
//!
//! 1. **Bounded waits.** Connecting (TCP and handshake) has a deadline of
//!    [`ClientConfig::connect_timeout`], a request of [`ClientConfig::request_timeout`]; nothing
//!    waits forever on a dead or stopped server.
//! 2. **Retries with backoff.** A transient failure (refused, reset, timeout) drops the
//!    connection and retries on a new one, [`ClientConfig::retries`] times, waiting
//!    `backoff × 2^attempt` between tries. Every request is idempotent (puts carry a stamp
//!    chosen before the first try), so a retried write cannot do harm.
//! 3. **Down marks.** A server that failed every try is skipped for [`ClientConfig::down_for`],
//!    so a dead server costs one round of retries, not one per key. But a call in which
//!    another server fails for real tries the marked ones again at once, mark ignored: a
//!    second server going down is when the operation may need a marked one, and it may be
//!    back (a checkpoint server killed and restarted a second later, then another killed, made
//!    a quorum write fail with "2 of 6 unreachable" while only one was: `knary chaos`, seed 3).
//! 4. **No retry on a wrong key** or a protocol violation: those are configuration errors or
//!    bugs, reported at once with the server's address.
//! 5. **Versions** (protocol rule 6): [`Client::hello_all`] asks each server its protocol
//!    version. A server that completes the handshake and then closes the connection on the
//!    hello is one of protocol 1, which cannot decode it: that is [`ClientError::Protocol`]
//!    saying so (upgrade the server), not a transient failure to retry.
//! 6. **The caller's thread does the I/O.** The runtime has no threads of its own: a call
//!    runs the requests to every server concurrently on the thread that makes it (tokio's
//!    current-thread runtime; callers on several threads take turns driving it). A request
//!    costs no hand-off to another thread and back, which on a busy machine is a wake-up and
//!    a context switch each way (the log writer makes one call per group commit).
//! 7. **Nothing per request but the request.** A call to one server (a `central` store, the
//!    log writer's every group commit) runs on the calling task itself, not on a spawned one,
//!    and a server's down mark is read without a lock while it has none (an atomic flag says
//!    whether there is one to read): a request takes no lock but its connection's, and
//!    allocates nothing but its frame. Calls to several servers are spawned, so that they
//!    run concurrently.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use crate::key::Key;
use crate::protocol::{Request, Response, PROTOCOL_VERSION};
use crate::wire::{Connection, Role, WireError, DEFAULT_MAX_FRAME};

/// Timeouts and retries of a [`Client`] (rules 1-3).
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Deadline for TCP connect plus handshake (default 3 s).
    pub connect_timeout: Duration,
    /// Deadline for one request and its answer (default 60 s: a 64 MiB frame over a slow link).
    pub request_timeout: Duration,
    /// Retries after the first try (default 2).
    pub retries: u32,
    /// First wait between tries, doubled each time (default 50 ms).
    pub backoff: Duration,
    /// How long a server that failed every try is skipped (default 2 s).
    pub down_for: Duration,
    /// Largest frame sent or accepted (default [`DEFAULT_MAX_FRAME`]).
    pub max_frame: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(60),
            retries: 2,
            backoff: Duration::from_millis(50),
            down_for: Duration::from_secs(2),
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

/// Why a call to one server failed, grouped by what the caller should do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// Not reachable after every retry (down, partitioned, or too slow): try again later.
    #[error("checkpoint server {addr} unreachable: {reason}")]
    Unreachable {
        /// The server.
        addr: String,
        /// The last failure.
        reason: String,
    },
    /// The server does not hold our key: use the same key file on client and servers.
    #[error("checkpoint server {addr} refused the connection: it does not share our key (use the key file the server was started with)")]
    WrongKey {
        /// The server.
        addr: String,
    },
    /// The address is another kind of veriflow server (a coordinator, a worker): fix the
    /// store spec.
    #[error("{addr} is {found}, not a checkpoint server")]
    WrongServer {
        /// The address.
        addr: String,
        /// What answered there.
        found: crate::wire::Role,
    },
    /// The server broke the protocol (a bug, or not a checkpoint server).
    #[error("checkpoint server {addr} broke the protocol: {reason}")]
    Protocol {
        /// The server.
        addr: String,
        /// What happened.
        reason: String,
    },
}

#[derive(Debug)]
struct Remote {
    addr: String,
    conn: tokio::sync::Mutex<Option<Connection<TcpStream>>>,
    down_until: Mutex<Option<(Instant, String)>>,
    /// Whether `down_until` may hold a mark (rule 7: while false, no lock is taken).
    marked: AtomicBool,
}

/// A blocking client for a fixed list of servers (rules 1-4).
#[derive(Debug)]
pub struct Client {
    rt: tokio::runtime::Runtime,
    servers: Vec<Arc<Remote>>,
    key: Key,
    config: ClientConfig,
}

impl Client {
    /// A client for `addrs` (connections are opened on first use).
    pub fn new(addrs: &[String], key: Key, config: ClientConfig) -> std::io::Result<Client> {
        // Rule 6: no thread of its own; the caller's thread drives every server's socket.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let servers = addrs
            .iter()
            .map(|a| {
                Arc::new(Remote {
                    addr: a.clone(),
                    conn: tokio::sync::Mutex::new(None),
                    down_until: Mutex::new(None),
                    marked: AtomicBool::new(false),
                })
            })
            .collect();
        Ok(Client {
            rt,
            servers,
            key,
            config,
        })
    }

    /// The servers' addresses, in slot order.
    pub fn addrs(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.clone()).collect()
    }

    /// Pings every server; one result per server, in slot order.
    pub fn ping_all(&self) -> Vec<Result<(), ClientError>> {
        let reqs = (0..self.servers.len())
            .map(|i| (i, Request::Ping))
            .collect();
        self.call_all(reqs)
            .into_iter()
            .map(|(_, r)| r.map(|_| ()))
            .collect()
    }

    /// Asks every server its protocol version (rule 5); one result per server, in slot
    /// order: Ok when it speaks [`PROTOCOL_VERSION`] or newer.
    pub fn hello_all(&self) -> Vec<Result<(), ClientError>> {
        let reqs = (0..self.servers.len())
            .map(|i| {
                (
                    i,
                    Request::Hello {
                        version: PROTOCOL_VERSION,
                    },
                )
            })
            .collect();
        self.call_all(reqs)
            .into_iter()
            .map(|(i, r)| match r? {
                Response::Hello { version } if version >= PROTOCOL_VERSION => Ok(()),
                other => Err(ClientError::Protocol {
                    addr: self.servers[i].addr.clone(),
                    reason: format!(
                        "it answered the protocol hello with {other:?}; this client needs protocol {PROTOCOL_VERSION} (epoch fences, batched deletes): upgrade the checkpoint server"
                    ),
                }),
            })
            .collect()
    }

    /// Runs `reqs` (server index, request) in parallel; answers in the same order.
    pub(crate) fn call_all(
        &self,
        reqs: Vec<(usize, Request)>,
    ) -> Vec<(usize, Result<Response, ClientError>)> {
        self.rt.block_on(async {
            // Rule 3: the marked servers wait, unless another one fails for real.
            let (marked, tried): (Vec<_>, Vec<_>) = reqs
                .into_iter()
                .partition(|(i, _)| down_reason(&self.servers[*i]).is_some());
            let mut out = self.spawn_all(tried).await;
            let failed = out
                .iter()
                .any(|(_, r)| matches!(r, Err(ClientError::Unreachable { .. })));
            if failed {
                out.extend(self.spawn_all(marked).await);
            } else {
                out.extend(marked.into_iter().map(|(i, _)| {
                    let remote = &self.servers[i];
                    let reason = down_reason(remote).unwrap_or_default();
                    let addr = remote.addr.clone();
                    (i, Err(ClientError::Unreachable { addr, reason }))
                }));
            }
            out.sort_by_key(|(i, _)| *i);
            out
        })
    }

    /// Runs `reqs` in parallel, down marks ignored (the caller decided to try them); one
    /// request runs on this task (rule 7).
    async fn spawn_all(
        &self,
        mut reqs: Vec<(usize, Request)>,
    ) -> Vec<(usize, Result<Response, ClientError>)> {
        if reqs.len() <= 1 {
            let Some((i, req)) = reqs.pop() else {
                return Vec::new();
            };
            return vec![(
                i,
                call(&self.servers[i], &self.key, &self.config, req).await,
            )];
        }
        let handles: Vec<_> = reqs
            .into_iter()
            .map(|(i, req)| {
                let remote = self.servers[i].clone();
                let key = self.key.clone();
                let cfg = self.config.clone();
                (
                    i,
                    tokio::spawn(async move { call(&remote, &key, &cfg, req).await }),
                )
            })
            .collect();
        let mut out = Vec::with_capacity(handles.len());
        for (i, h) in handles {
            let r = h.await.unwrap_or_else(|e| {
                Err(ClientError::Protocol {
                    addr: self.servers[i].addr.clone(),
                    reason: format!("client task failed: {e}"),
                })
            });
            out.push((i, r));
        }
        out
    }
}

/// The failure that put `remote` down, while its down mark lasts (rule 3).
fn down_reason(remote: &Remote) -> Option<String> {
    if !remote.marked.load(Ordering::Acquire) {
        return None; // rule 7: no mark, no lock
    }
    let d = remote.down_until.lock().unwrap_or_else(|p| p.into_inner());
    d.as_ref()
        .filter(|(t, _)| Instant::now() < *t)
        .map(|(_, why)| why.clone())
}

fn mark(remote: &Remote, until: Option<(Instant, String)>) {
    if until.is_none() && !remote.marked.load(Ordering::Acquire) {
        return; // rule 7: a success on a server that was never marked takes no lock
    }
    let mut d = remote.down_until.lock().unwrap_or_else(|p| p.into_inner());
    remote.marked.store(until.is_some(), Ordering::Release);
    *d = until;
}

async fn call(
    remote: &Remote,
    key: &Key,
    cfg: &ClientConfig,
    req: Request,
) -> Result<Response, ClientError> {
    let mut last = String::new();
    for attempt in 0..=cfg.retries {
        if attempt > 0 {
            tokio::time::sleep(cfg.backoff * 2u32.saturating_pow(attempt - 1)).await;
        }
        let mut slot = remote.conn.lock().await;
        match try_call(&mut slot, remote, key, cfg, &req).await {
            Ok(resp) => {
                mark(remote, None);
                return Ok(resp);
            }
            Err(e) => {
                *slot = None; // rule 5 of wire.rs: never reuse a connection after an error
                match e {
                    WireError::WrongKey => {
                        return Err(ClientError::WrongKey {
                            addr: remote.addr.clone(),
                        })
                    }
                    WireError::WrongRole { found, .. } => {
                        return Err(ClientError::WrongServer {
                            addr: remote.addr.clone(),
                            found,
                        })
                    }
                    e if e.is_transient() => last = e.to_string(),
                    e => {
                        return Err(ClientError::Protocol {
                            addr: remote.addr.clone(),
                            reason: e.to_string(),
                        })
                    }
                }
            }
        }
    }
    let reason = format!("{last} (after {} tries)", cfg.retries + 1);
    mark(
        remote,
        Some((Instant::now() + cfg.down_for, reason.clone())),
    );
    Err(ClientError::Unreachable {
        addr: remote.addr.clone(),
        reason,
    })
}

async fn try_call(
    slot: &mut Option<Connection<TcpStream>>,
    remote: &Remote,
    key: &Key,
    cfg: &ClientConfig,
    req: &Request,
) -> Result<Response, WireError> {
    let fresh = slot.is_none();
    if fresh {
        let connect = async {
            let s = TcpStream::connect(&remote.addr).await?;
            let _ = s.set_nodelay(true);
            Connection::client(s, key, Role::CheckpointServer, cfg.max_frame).await
        };
        let conn = tokio::time::timeout(cfg.connect_timeout, connect)
            .await
            .map_err(|_| WireError::Timeout(cfg.connect_timeout))??;
        *slot = Some(conn);
    }
    let Some(conn) = slot.as_mut() else {
        return Err(WireError::Closed);
    };
    let exchange = async {
        conn.send(req).await?;
        conn.recv::<Response>().await
    };
    match tokio::time::timeout(cfg.request_timeout, exchange)
        .await
        .map_err(|_| WireError::Timeout(cfg.request_timeout))?
    {
        // Rule 5: a protocol-1 server closes a fresh connection on a hello it cannot decode.
        Err(WireError::Closed) if fresh && matches!(req, Request::Hello { .. }) => {
            Err(WireError::Malformed(format!(
                "the server closed the connection on the protocol hello: it speaks protocol 1,                  older than this client's {PROTOCOL_VERSION} (epoch fences, batched deletes); upgrade the                  checkpoint server"
            )))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote() -> Remote {
        Remote {
            addr: "127.0.0.1:1".to_string(),
            conn: tokio::sync::Mutex::new(None),
            down_until: Mutex::new(None),
            marked: AtomicBool::new(false),
        }
    }

    /// Rule 7: a server without a down mark is looked up and cleared without its lock, so a
    /// request never waits on it (here: the lock is held elsewhere the whole time).
    #[test]
    fn an_unmarked_server_takes_no_lock_per_request() {
        let r = Arc::new(remote());
        let held = r.down_until.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let r2 = r.clone();
        std::thread::spawn(move || {
            let seen = down_reason(&r2);
            mark(&r2, None);
            let _ = tx.send(seen);
        });
        let seen = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the lookup waited for the lock");
        assert_eq!(seen, None);
        drop(held);
    }

    /// Rule 3 still holds with rule 7's flag: a mark is seen until it lapses or is cleared.
    #[test]
    fn a_down_mark_is_seen_until_cleared() {
        let r = remote();
        assert_eq!(down_reason(&r), None);
        mark(
            &r,
            Some((Instant::now() + Duration::from_secs(3600), "gone".into())),
        );
        assert_eq!(down_reason(&r).as_deref(), Some("gone"));
        mark(&r, None);
        assert_eq!(down_reason(&r), None);
        assert!(!r.marked.load(Ordering::Acquire));
        mark(
            &r,
            Some((Instant::now() - Duration::from_secs(1), "lapsed".into())),
        );
        assert_eq!(down_reason(&r), None, "a lapsed mark is not a mark");
    }
}

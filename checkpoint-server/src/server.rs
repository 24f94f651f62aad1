//! The checkpoint server: holds fragments in a [`Store`] (sled on disk, or RAM with `--memory`:
//! the diskless checkpoint of paper 002) and answers the requests of `protocol.rs` over
//! [`crate::wire`] connections.
//!
//! Rules (beside those of `protocol.rs`):
//!
//! 1. Each connection is authenticated first (wire rule 2); a connection that fails the
//!    handshake or breaks the protocol later is closed and logged; the server keeps serving
//!    every other connection.
//! 2. Store calls are blocking (sled), so they run on tokio's blocking pool, never on a worker
//!    that drives sockets.
//! 3. Requests on one connection are answered in order; connections are independent.

use std::net::SocketAddr;
use std::sync::Arc;

use serde_bytes::ByteBuf;
use tokio::net::{TcpListener, TcpStream};

use crate::erasure::verify_fragment;
use crate::key::Key;
use crate::protocol::{Request, Response, Slot};
use crate::store::Store;
use crate::wire::{Connection, WireError};

/// A checkpoint server bound to an address.
pub struct Server {
    listener: TcpListener,
    store: Arc<dyn Store>,
    key: Key,
    max_frame: usize,
}

impl Server {
    /// Binds `addr` (use port 0 for any free port) to serve `store` to holders of `key`.
    pub async fn bind(
        addr: &str,
        store: Arc<dyn Store>,
        key: Key,
        max_frame: usize,
    ) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr).await?;
        Ok(Server {
            listener,
            store,
            key,
            max_frame,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until the process ends (rule 1: a failing connection never stops the loop).
    pub async fn run(self) -> std::io::Result<()> {
        let shared = Arc::new((self.store, self.key, self.max_frame));
        loop {
            let (stream, peer) = match self.listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and similar: wait a moment rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let (store, key, max_frame) = &*shared;
                if let Err(e) = serve_connection(stream, store.clone(), key, *max_frame).await {
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

async fn serve_connection(
    stream: TcpStream,
    store: Arc<dyn Store>,
    key: &Key,
    max_frame: usize,
) -> Result<(), WireError> {
    let _ = stream.set_nodelay(true);
    let mut conn = Connection::server(stream, key, max_frame).await?;
    loop {
        let req: Request = conn.recv().await?;
        let store = store.clone();
        let resp = tokio::task::spawn_blocking(move || handle(&*store, req))
            .await
            .unwrap_or_else(|e| Response::Failed(format!("request handler panicked: {e}")));
        conn.send(&resp).await?;
    }
}

fn check(key: &[u8], value: &[u8]) -> Result<(), Response> {
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

/// Answers one request against `store` (protocol rules 1-5).
pub(crate) fn handle(store: &dyn Store, req: Request) -> Response {
    let failed = |e: crate::store::StoreError| Response::Failed(e.to_string());
    match req {
        Request::Ping => Response::Done,
        Request::Put { key, value } => {
            if let Err(r) = check(&key, &value) {
                return r;
            }
            match store.put(&key, &value).and_then(|_| store.flush()) {
                Ok(()) => Response::Done,
                Err(e) => failed(e),
            }
        }
        Request::Batch(pairs) => {
            for (k, v) in &pairs {
                if let Err(r) = check(k, v) {
                    return r;
                }
            }
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = pairs
                .into_iter()
                .map(|(k, v)| (k.into_vec(), v.into_vec()))
                .collect();
            match store.put_batch(&pairs).and_then(|_| store.flush()) {
                Ok(()) => Response::Done,
                Err(e) => failed(e),
            }
        }
        Request::Get { key } => match store.get(&key) {
            Ok(v) => Response::Value(v.map(slot)),
            Err(e) => failed(e),
        },
        Request::Scan {
            prefix,
            after,
            max_bytes,
        } => match store.scan_prefix(&prefix) {
            Ok(pairs) => {
                let mut entries = Vec::new();
                let mut bytes = 0u64;
                let mut more = false;
                for (k, v) in pairs {
                    if after.as_ref().is_some_and(|a| k.as_slice() <= a.as_slice()) {
                        continue;
                    }
                    if !entries.is_empty() && bytes + (k.len() + v.len()) as u64 > max_bytes {
                        more = true;
                        break;
                    }
                    bytes += (k.len() + v.len()) as u64;
                    entries.push((ByteBuf::from(k), slot(v)));
                }
                Response::Page { entries, more }
            }
            Err(e) => failed(e),
        },
        Request::Delete { key } => match store.delete(&key).and_then(|_| store.flush()) {
            Ok(()) => Response::Done,
            Err(e) => failed(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::erasure::Codec;
    use crate::store::MemoryStore;

    fn b(x: &[u8]) -> ByteBuf {
        ByteBuf::from(x.to_vec())
    }

    #[test]
    fn non_fragments_are_refused_whole_and_corruption_is_reported() {
        let store = MemoryStore::default();
        let good = Codec::replicate(1).unwrap().encode(b"value", 1).remove(0);
        assert!(matches!(
            handle(
                &store,
                Request::Put {
                    key: b(b"a"),
                    value: b(b"not a fragment")
                }
            ),
            Response::Refused(_)
        ));
        // One bad pair refuses the whole batch (protocol rule 1): nothing is stored.
        let r = handle(
            &store,
            Request::Batch(vec![(b(b"a"), b(&good)), (b(b"b"), b(b"junk"))]),
        );
        assert!(matches!(r, Response::Refused(_)), "{r:?}");
        assert!(matches!(
            handle(&store, Request::Get { key: b(b"a") }),
            Response::Value(None)
        ));
        assert!(matches!(
            handle(
                &store,
                Request::Put {
                    key: b(b"a"),
                    value: b(&good)
                }
            ),
            Response::Done
        ));
        // A stored fragment that rots is returned as Corrupt, never as bytes (rule 4).
        let mut rotten = good.clone();
        let last = rotten.len() - 1;
        rotten[last] ^= 1;
        store.put(b"r", &rotten).unwrap();
        assert!(matches!(
            handle(&store, Request::Get { key: b(b"r") }),
            Response::Value(Some(Slot::Corrupt(_)))
        ));
        match handle(
            &store,
            Request::Scan {
                prefix: b(b""),
                after: None,
                max_bytes: 1,
            },
        ) {
            Response::Page { entries, more } => {
                assert_eq!(entries.len(), 1, "a page holds at least one entry");
                assert!(more);
            }
            other => panic!("{other:?}"),
        }
    }
}

//! Tests of the checkpoint server: request handling and the limits of rule 4.

use super::*;
use crate::erasure::Codec;
use crate::store::{MemoryStore, Page, Pairs, StoreError};
use tokio::io::AsyncWriteExt;

/// Guards against a hang only; nothing is asserted about time.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// `super::handle` with the default page limits.
fn handle(store: &dyn Store, req: Request) -> Response {
    let d = ServerConfig::default();
    super::handle(
        store,
        req,
        PageLimit {
            max_keys: d.page_keys,
            max_bytes: d.page_bytes,
        },
    )
}

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

// --- rule 4: limits ---

/// A server of `config` over `store` on a port of 127.0.0.1, running on its own runtime.
struct Running {
    rt: tokio::runtime::Runtime,
    addr: String,
    stats: ServerStats,
    key: Key,
}

fn start(config: ServerConfig, store: Arc<dyn Store>) -> Running {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let key = Key::from_bytes([42; 32]);
    let server = rt
        .block_on(Server::bind_with("127.0.0.1:0", store, key.clone(), config))
        .unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let stats = server.stats();
    rt.spawn(server.run());
    Running {
        rt,
        addr,
        stats,
        key,
    }
}

/// Waits until `cond` holds (a hang guard, not a timing assertion).
async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG_GUARD, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn connect(addr: &str, key: &Key) -> Result<Connection<TcpStream>, WireError> {
    let s = TcpStream::connect(addr).await?;
    Connection::client(s, key, Role::CheckpointServer, DEFAULT_MAX_FRAME).await
}

async fn connect_from(
    local: &str,
    addr: &str,
    key: &Key,
) -> Result<Connection<TcpStream>, WireError> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.bind(local.parse().unwrap())?;
    let s = sock.connect(addr.parse().unwrap()).await?;
    Connection::client(s, key, Role::CheckpointServer, DEFAULT_MAX_FRAME).await
}

async fn ping(c: &mut Connection<TcpStream>) -> Result<(), WireError> {
    c.send(&Request::Ping).await?;
    match c.recv::<Response>().await? {
        Response::Done => Ok(()),
        other => panic!("ping answered {other:?}"),
    }
}

/// Issue 13 point 4, as reported: 16 connections declaring 48 MiB frames and sending 1 KiB of
/// each made the server allocate all 16 × 48 MiB (788 MB RSS). Now a frame's buffer grows
/// with what arrived (wire rule 7) and only the frames that fit in the budget are read at all
/// (wire rule 8). Fails with the old read, which allocated the declared length first.
#[test]
fn partial_frames_hold_what_arrived_not_what_they_declare() {
    let s = start(ServerConfig::default(), Arc::new(MemoryStore::default()));
    let budget = s.stats.budget().clone();
    const DECLARED: usize = 48 << 20;
    const SENT: usize = 1024;
    let conns = s.rt.block_on(async {
        let mut conns = Vec::new();
        for _ in 0..16 {
            let mut c = connect(&s.addr, &s.key).await.unwrap();
            let st = c.stream_mut();
            st.write_all(&(DECLARED as u32).to_le_bytes())
                .await
                .unwrap();
            st.write_all(&[0u8; SENT]).await.unwrap();
            conns.push(c);
        }
        // 256 MiB of budget holds 5 of the 48 MiB frames; the other 11 wait unread.
        let cost = crate::wire::frame_cost(DECLARED);
        let fit = budget.limit() / cost;
        assert_eq!(fit, 5);
        wait_until("the frames that fit are read", || {
            budget.received() >= (fit * SENT) as u64
        })
        .await;
        assert_eq!(budget.reserved(), fit * cost);
        assert_eq!(budget.received(), (fit * SENT) as u64);
        assert!(
            budget.peak_buffered() <= fit * crate::wire::READ_CHUNK,
            "{} bytes buffered for {} received",
            budget.peak_buffered(),
            fit * SENT
        );
        conns
    });
    drop(conns);
    s.rt.block_on(wait_until("every partial frame is given up", || {
        budget.reserved() == 0 && budget.buffered() == 0 && s.stats.connections() == 0
    }));
}

/// Wire rule 8 end to end: with a 4 MiB budget and 1 MiB frames, 16 connections sending whole
/// frames in two parts never make the server hold more than the budget, and every frame gets
/// its answer (a frame that got its reservation can always complete: no deadlock).
#[test]
fn the_frame_budget_caps_bytes_in_flight_and_every_frame_is_answered() {
    let config = ServerConfig {
        max_frame: 1 << 20,
        memory_budget: 4 << 20,
        ..ServerConfig::default()
    };
    let s = start(config, Arc::new(MemoryStore::default()));
    let budget = s.stats.budget().clone();
    const FIRST: usize = 1000;
    s.rt.block_on(async {
        let mut rest = Vec::new();
        let mut conns = Vec::new();
        let mut frame_len = 0;
        for i in 0..16u8 {
            let mut c = connect(&s.addr, &s.key).await.unwrap();
            // A Put of a value that is no fragment: refused, but only once it all arrived.
            // Just under 1 MiB of value: 17 Noise messages' tags still fit in the 1 MiB frame.
            let req = Request::Put {
                key: b(&[i]),
                value: ByteBuf::from(vec![i; (1 << 20) - 400]),
            };
            let frame = c.seal_next(&postcard::to_stdvec(&req).unwrap());
            frame_len = frame.len() - 4;
            c.stream_mut().write_all(&frame[..FIRST]).await.unwrap();
            rest.push(frame[FIRST..].to_vec());
            conns.push(c);
        }
        let cost = crate::wire::frame_cost(frame_len);
        let fit = (4 << 20) / cost;
        assert_eq!(fit, 3);
        wait_until("the frames that fit are started", || {
            budget.received() >= (fit * (FIRST - 4)) as u64
        })
        .await;
        assert_eq!(budget.reserved(), fit * cost);
        assert!(budget.buffered() <= fit * crate::wire::READ_CHUNK);
        let mut answers = Vec::new();
        for (mut c, rest) in conns.into_iter().zip(rest) {
            answers.push(tokio::spawn(async move {
                c.stream_mut().write_all(&rest).await.unwrap();
                c.recv::<Response>().await
            }));
        }
        for a in answers {
            let r = tokio::time::timeout(HANG_GUARD, a)
                .await
                .expect("every frame is answered")
                .unwrap();
            assert!(matches!(r, Ok(Response::Refused(_))), "{r:?}");
        }
        assert!(budget.received() >= (16 * frame_len) as u64);
        assert!(
            budget.peak_buffered() <= budget.limit(),
            "{} buffered over a budget of {}",
            budget.peak_buffered(),
            budget.limit()
        );
    });
    s.rt.block_on(wait_until("the budget is free again", || {
        budget.reserved() == 0 && budget.buffered() == 0
    }));
}

/// Wire rule 8: a peer that stalls mid-frame loses its reservation after `frame_timeout`.
#[test]
fn a_stalled_frame_gives_its_reservation_back() {
    let config = ServerConfig {
        frame_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let s = start(config, Arc::new(MemoryStore::default()));
    let budget = s.stats.budget().clone();
    s.rt.block_on(async {
        let mut c = connect(&s.addr, &s.key).await.unwrap();
        // About 1 MiB, a length a sender could make (exactly 1 MiB would end in a Noise
        // message of 16 bytes, all tag, which wire rule 3 refuses before reading).
        c.stream_mut()
            .write_all(&((1u32 << 20) + 1000).to_le_bytes())
            .await
            .unwrap();
        c.stream_mut().write_all(&[0; 10]).await.unwrap();
        wait_until("the frame is started", || budget.received() >= 10).await;
        // The server gives up on the frame and closes the connection.
        let r = tokio::time::timeout(HANG_GUARD, c.recv::<Response>())
            .await
            .expect("the server closes a stalled connection");
        assert!(r.is_err(), "{r:?}");
        wait_until("the reservation is back", || budget.reserved() == 0).await;
        wait_until("the connection is gone", || s.stats.connections() == 0).await;
    });
}

/// Issue 13 point 4: connections were not capped. Now extra ones are closed at once, per peer
/// address and in total, and counted; a freed slot can be used again.
#[test]
fn connections_are_capped_per_peer_and_in_total() {
    let config = ServerConfig {
        max_connections: 5,
        max_connections_per_peer: 3,
        ..ServerConfig::default()
    };
    let s = start(config, Arc::new(MemoryStore::default()));
    let stats = s.stats.clone();
    s.rt.block_on(async {
        let mut mine = Vec::new();
        for _ in 0..3 {
            let mut c = connect_from("127.0.0.1:0", &s.addr, &s.key).await.unwrap();
            ping(&mut c).await.unwrap();
            mine.push(c);
        }
        let extra = connect_from("127.0.0.1:0", &s.addr, &s.key).await;
        assert!(extra.is_err(), "a 4th connection from one peer is refused");
        assert_eq!(stats.refused_connections(), 1);

        // Another address (all of 127/8 is loopback) still gets in, up to the total of 5.
        let mut other = Vec::new();
        for _ in 0..2 {
            let mut c = connect_from("127.0.0.2:0", &s.addr, &s.key).await.unwrap();
            ping(&mut c).await.unwrap();
            other.push(c);
        }
        let sixth = connect_from("127.0.0.2:0", &s.addr, &s.key).await;
        assert!(sixth.is_err(), "a 6th connection in total is refused");
        assert_eq!(stats.refused_connections(), 2);
        assert_eq!(stats.connections(), 5);

        // Closing one frees its slot.
        drop(mine.pop());
        wait_until("the slot is freed", || stats.connections() == 4).await;
        let mut c = connect_from("127.0.0.1:0", &s.addr, &s.key).await.unwrap();
        ping(&mut c).await.unwrap();
        for c in mine.iter_mut().chain(other.iter_mut()) {
            ping(c).await.unwrap();
        }
    });
}

#[test]
fn accept_errors_back_off_doubling_to_a_cap_and_reset_on_success() {
    let mut b = AcceptBackoff::new();
    let pauses: Vec<Duration> = (0..12).map(|_| b.failed()).collect();
    assert_eq!(pauses[0], ACCEPT_BACKOFF_MIN);
    assert!(pauses
        .windows(2)
        .all(|w| w[1] == (w[0] * 2).min(ACCEPT_BACKOFF_MAX)));
    assert_eq!(*pauses.last().unwrap(), ACCEPT_BACKOFF_MAX);
    b.succeeded();
    assert_eq!(b.failed(), ACCEPT_BACKOFF_MIN);
}

#[test]
fn limits_that_do_not_add_up_are_refused() {
    assert!(ServerConfig::default().validate().is_ok());
    for bad in [
        ServerConfig {
            memory_budget: 1 << 20,
            max_frame: 2 << 20,
            ..ServerConfig::default()
        },
        ServerConfig {
            max_connections: 0,
            ..ServerConfig::default()
        },
        ServerConfig {
            page_keys: 0,
            ..ServerConfig::default()
        },
    ] {
        assert!(
            matches!(bad.validate(), Err(ServerError::Config(_))),
            "{bad:?}"
        );
    }
}

/// A store whose whole-prefix scan is forbidden: the server must serve pages without it.
struct NoWholeScans(MemoryStore);

impl Store for NoWholeScans {
    fn put(&self, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        self.0.put(k, v)
    }
    fn put_batch(&self, p: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        self.0.put_batch(p)
    }
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get(k)
    }
    fn scan_prefix(&self, p: &[u8]) -> Result<Pairs, StoreError> {
        Err(StoreError::Io(format!(
            "the whole prefix {:?} was loaded for one page",
            String::from_utf8_lossy(p)
        )))
    }
    fn scan_page(&self, p: &[u8], a: Option<&[u8]>, l: PageLimit) -> Result<Page, StoreError> {
        self.0.scan_page(p, a, l)
    }
    fn delete(&self, k: &[u8]) -> Result<(), StoreError> {
        self.0.delete(k)
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn describe(&self) -> String {
        "no-whole-scans".into()
    }
}

/// Issue 13 point 4: a Scan page loaded the whole key prefix from the store, then cut a page
/// from it. Now a page reads only itself and holds at most `page_keys` pairs and
/// `page_bytes` bytes, whatever the client asks. Fails with the old handler (it called
/// `scan_prefix`).
#[test]
fn a_scan_page_reads_only_its_page_within_the_server_limits() {
    let store = NoWholeScans(MemoryStore::default());
    let frag = Codec::replicate(1).unwrap().encode(&[5; 1000], 1).remove(0);
    for i in 0u32..500 {
        store
            .put(&[b"p/", &i.to_be_bytes()[..]].concat(), &frag)
            .unwrap();
    }
    let limit = PageLimit {
        max_keys: 64,
        max_bytes: 20_000,
    };
    let mut after = None;
    let mut seen = 0;
    loop {
        let req = Request::Scan {
            prefix: b(b"p/"),
            after: after.clone(),
            max_bytes: u64::MAX,
        };
        let Response::Page { entries, more } = super::handle(&store, req, limit) else {
            panic!("scan failed")
        };
        let bytes: usize = entries.iter().map(|(k, _)| k.len() + frag.len()).sum();
        assert!(entries.len() <= 64 && bytes as u64 <= limit.max_bytes);
        seen += entries.len();
        after = entries.last().map(|(k, _)| k.clone());
        if !more || after.is_none() {
            break;
        }
    }
    assert_eq!(seen, 500);
}

/// A prefix far larger than one page reads whole through the client and every strategy that
/// pages (strategy's `gather`), on real servers with small pages.
#[test]
fn a_prefix_larger_than_a_page_reads_whole_through_the_client() {
    let config = ServerConfig {
        page_keys: 16,
        page_bytes: 8 << 10,
        ..ServerConfig::default()
    };
    let servers: Vec<Running> = (0..3)
        .map(|_| start(config.clone(), Arc::new(MemoryStore::default())))
        .collect();
    let key = servers[0].key.clone();
    let addrs: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
    for spec in [
        format!("central:{}", addrs[0]),
        format!("replicate:2:{},{}", addrs[1], addrs[2]),
    ] {
        let spec: crate::StoreSpec = spec.parse().unwrap();
        let store = crate::open_store(&spec, Some(&key)).unwrap();
        let pairs: Pairs = (0u32..300)
            .map(|i| {
                (
                    [b"seg/", &i.to_be_bytes()[..]].concat(),
                    vec![i as u8; 1000],
                )
            })
            .collect();
        store.put_batch(&pairs).unwrap();
        store.put(b"zzz", b"other").unwrap();
        assert_eq!(store.scan_prefix(b"seg/").unwrap(), pairs, "{spec}");
        assert_eq!(store.scan_prefix(b"").unwrap().len(), 301, "{spec}");
    }
}

/// A valid fragment holding `v`.
fn frag(v: &[u8]) -> ByteBuf {
    ByteBuf::from(Codec::replicate(1).unwrap().encode(v, 1).remove(0))
}

fn fenced(scope: &[u8], epoch: u64, key: &[u8], v: &[u8]) -> Request {
    Request::FencedBatch {
        fences: vec![(b(scope), epoch)],
        pairs: vec![(b(key), frag(v))],
    }
}

/// Protocol rule 7 at the handler: a raise is kept, a stale fenced batch is refused whole
/// (with the scope's epochs in the answer) and writes nothing, a current one is written, a
/// raise never lowers a fence; every fragment is still checked; a store without fences
/// refuses fence requests instead of accepting every write.
#[test]
fn a_server_refuses_a_fenced_batch_older_than_its_scope_and_writes_none_of_it() {
    let store = MemoryStore::default();
    assert!(matches!(
        handle(&store, Request::Hello { version: 1 }),
        Response::Hello {
            version: PROTOCOL_VERSION
        }
    ));
    assert!(matches!(
        handle(&store, fenced(b"seg/1", 0, b"seg/1/a", b"x")),
        Response::Done
    ));
    assert!(matches!(
        handle(
            &store,
            Request::RaiseFence {
                scope: b(b"seg/1"),
                epoch: 3
            }
        ),
        Response::Done
    ));
    assert!(matches!(
        handle(
            &store,
            Request::RaiseFence {
                scope: b(b"seg/1"),
                epoch: 2
            }
        ),
        Response::Done
    ));
    let stale = Request::FencedBatch {
        fences: vec![(b(b"seg/2"), 0), (b(b"seg/1"), 2)],
        pairs: vec![(b(b"seg/2/a"), frag(b"y")), (b(b"seg/1/b"), frag(b"z"))],
    };
    match handle(&store, stale) {
        Response::Fenced {
            scope,
            epoch: 2,
            newest: 3,
        } => assert_eq!(&scope[..], b"seg/1"),
        other => panic!("a stale batch answered {other:?}"),
    }
    assert_eq!(
        store.get(b"seg/2/a").unwrap(),
        None,
        "nothing of it written"
    );
    assert!(matches!(
        handle(&store, fenced(b"seg/1", 3, b"seg/1/c", b"w")),
        Response::Done
    ));
    assert!(store.get(b"seg/1/c").unwrap().is_some());
    let junk = Request::FencedBatch {
        fences: vec![(b(b"seg/1"), 3)],
        pairs: vec![(b(b"seg/1/d"), b(b"not a fragment"))],
    };
    assert!(matches!(handle(&store, junk), Response::Refused(_)));
    // A store that keeps no fences: fence requests are refused, never silently accepted.
    let plain = NoWholeScans(MemoryStore::default());
    for req in [
        Request::RaiseFence {
            scope: b(b"seg/1"),
            epoch: 1,
        },
        fenced(b"seg/1", 1, b"k", b"v"),
    ] {
        match handle(&plain, req) {
            Response::Refused(why) => assert!(why.contains("keeps no epoch fences"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(plain.get(b"k").unwrap(), None);
}

/// Protocol rule 7: a server's fences are as durable as its data. A sled-backed server's
/// fence survives a restart (the store reopened), and stays out of every scan.
#[test]
fn a_sled_servers_fences_survive_a_restart_and_no_scan_sees_them() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = crate::SledStore::open(dir.path()).unwrap();
        assert!(matches!(
            handle(
                &store,
                Request::RaiseFence {
                    scope: b(b"seg/7"),
                    epoch: 5
                }
            ),
            Response::Done
        ));
    }
    let store = crate::SledStore::open(dir.path()).unwrap();
    assert!(matches!(
        handle(&store, fenced(b"seg/7", 4, b"seg/7/x", b"late")),
        Response::Fenced {
            epoch: 4,
            newest: 5,
            ..
        }
    ));
    assert!(matches!(
        handle(&store, fenced(b"seg/7", 5, b"seg/7/y", b"now")),
        Response::Done
    ));
    match handle(
        &store,
        Request::Scan {
            prefix: b(b""),
            after: None,
            max_bytes: u64::MAX,
        },
    ) {
        Response::Page { entries, .. } => {
            let keys: Vec<&[u8]> = entries.iter().map(|(k, _)| &k[..]).collect();
            assert_eq!(keys, vec![&b"seg/7/y"[..]]);
        }
        other => panic!("{other:?}"),
    }
}

/// Client rule 5: a server of protocol 1 (it closes the connection on a request it cannot
/// decode, here the hello) is reported as too old, at open, by name; it is not taken for a
/// crashed server and retried.
#[test]
fn a_protocol_1_server_is_refused_at_open_as_too_old() {
    /// Protocol 1's requests: what an old server decodes.
    #[allow(dead_code)]
    #[derive(serde::Deserialize)]
    enum V1Request {
        Ping,
        Put {
            key: ByteBuf,
            value: ByteBuf,
        },
        Batch(Vec<(ByteBuf, ByteBuf)>),
        Get {
            key: ByteBuf,
        },
        Scan {
            prefix: ByteBuf,
            after: Option<ByteBuf>,
            max_bytes: u64,
        },
        Delete {
            key: ByteBuf,
        },
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let key = Key::from_bytes([9; 32]);
    let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let k = key.clone();
    rt.spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let k = k.clone();
            tokio::spawn(async move {
                let Ok(mut c) =
                    Connection::server(s, &k, Role::CheckpointServer, DEFAULT_MAX_FRAME).await
                else {
                    return;
                };
                // Serves pings; anything it cannot decode closes the connection (wire rule 5).
                while let Ok(req) = c.recv::<V1Request>().await {
                    if !matches!(req, V1Request::Ping) || c.send(&Response::Done).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let spec: crate::StoreSpec = format!("central:{addr}").parse().unwrap();
    let t0 = Instant::now();
    let err = crate::open_store(&spec, Some(&key))
        .err()
        .expect("a protocol-1 server must be refused");
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Refused(_)), "{msg}");
    assert!(
        msg.contains("protocol 1") && msg.contains(&addr) && msg.contains("upgrade"),
        "{msg}"
    );
    assert!(t0.elapsed() < HANG_GUARD);
}

/// Strategy rules 10-11 over real loopback servers, on every layout: once the successor raised
/// its fence, the zombie's fenced writes are refused (as `Fenced`) and nothing it sent is
/// readable; the successor writes; a raise at an older epoch lowers nothing.
#[test]
fn remote_stores_refuse_a_zombie_after_its_successor_raised_the_fence() {
    let servers: Vec<Running> = (0..4)
        .map(|_| start(ServerConfig::default(), Arc::new(MemoryStore::default())))
        .collect();
    let key = servers[0].key.clone();
    let a: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
    for (round, spec) in [
        format!("central:{}", a[0]),
        format!("replicate:3:{},{},{}", a[0], a[1], a[2]),
        format!("parity:2:{},{},{}", a[1], a[2], a[3]),
        format!("ida:2,2:{},{},{},{}", a[0], a[1], a[2], a[3]),
        format!("ida:2,2,quorum:{},{},{},{}", a[3], a[2], a[1], a[0]),
    ]
    .iter()
    .enumerate()
    {
        let spec: crate::StoreSpec = spec.parse().unwrap();
        let zombie = crate::open_store(&spec, Some(&key)).unwrap();
        let successor = crate::open_store(&spec, Some(&key)).unwrap();
        let scope = format!("seg/{round}/").into_bytes();
        let k = |s: &str| [&scope[..], s.as_bytes()].concat();
        let f = |e: u64| vec![(scope.clone(), e)];
        zombie.raise_fence(&scope, 1).unwrap();
        zombie
            .put_batch_fenced(&f(1), &[(k("a"), b"first".to_vec())])
            .unwrap();
        successor.raise_fence(&scope, 2).unwrap();
        let err = zombie
            .put_batch_fenced(&f(1), &[(k("b"), b"late".to_vec())])
            .expect_err("a zombie's write after the raise");
        assert!(
            matches!(
                err,
                StoreError::Fenced {
                    epoch: 1,
                    newest: 2,
                    ..
                }
            ),
            "{spec}: {err}"
        );
        zombie.raise_fence(&scope, 1).unwrap(); // lowers nothing
        assert!(zombie
            .put_batch_fenced(&f(1), &[(k("c"), b"later".to_vec())])
            .is_err());
        successor
            .put_batch_fenced(&f(2), &[(k("d"), b"mine".to_vec())])
            .unwrap();
        let got: Vec<Vec<u8>> = successor
            .scan_prefix(&scope)
            .unwrap()
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        assert_eq!(got, vec![k("a"), k("d")], "{spec}");
        assert!(successor.keeps_fences());
    }
}

// --- rule 6: group commit ---

/// A store that counts its flushes and holds the first one until [`GatedStore::open`].
#[derive(Default)]
struct GatedStore {
    inner: MemoryStore,
    flushes: std::sync::atomic::AtomicU64,
    open: Mutex<bool>,
    opened: std::sync::Condvar,
}

impl GatedStore {
    fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl Store for GatedStore {
    fn put(&self, k: &[u8], v: &[u8]) -> Result<(), StoreError> {
        self.inner.put(k, v)
    }
    fn put_batch(&self, p: &[(Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
        self.inner.put_batch(p)
    }
    fn get(&self, k: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(k)
    }
    fn scan_prefix(&self, p: &[u8]) -> Result<Pairs, StoreError> {
        self.inner.scan_prefix(p)
    }
    fn delete(&self, k: &[u8]) -> Result<(), StoreError> {
        self.inner.delete(k)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        Ok(())
    }
    fn describe(&self) -> String {
        "gated".into()
    }
    fn keeps_fences(&self) -> bool {
        true
    }
    fn raise_fence(&self, scope: &[u8], epoch: u64) -> Result<(), StoreError> {
        self.inner.raise_fence(scope, epoch)
    }
    fn put_batch_fenced(
        &self,
        fences: &[(Vec<u8>, u64)],
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        self.inner.put_batch_fenced(fences, pairs)
    }
}

/// Rule 6: the writes of five connections that arrive while a flush runs are applied in the
/// order they came and share the next flush: 2 flushes for 6 writes (one per request before,
/// so this fails with a handler that flushes each request). Each is answered on its own
/// merits (a stale fenced batch `Fenced`, the others `Done`) and only after the flush that
/// covers it; a batch holding a non-fragment is refused on its connection without waiting.
#[test]
fn writes_that_arrive_during_a_flush_share_the_next_one() {
    let store = Arc::new(GatedStore::default());
    let s = start(ServerConfig::default(), store.clone());
    let stats = s.stats.clone();
    let answers = s.rt.block_on(async {
        let mut first = connect(&s.addr, &s.key).await.unwrap();
        first
            .send(&Request::Batch(vec![(b(b"k0"), frag(b"v0"))]))
            .await
            .unwrap();
        wait_until("the first flush holds the committer", || {
            store.flushes() == 1
        })
        .await;
        let queued = [
            Request::Put {
                key: b(b"k1"),
                value: frag(b"v1"),
            },
            Request::RaiseFence {
                scope: b(b"t/"),
                epoch: 5,
            },
            fenced(b"t/", 3, b"t/stale", b"x"),
            Request::DeleteBatch {
                keys: vec![b(b"k0"), b(b"absent")],
            },
            fenced(b"t/", 5, b"t/new", b"y"),
        ];
        let mut conns = Vec::new();
        for (i, req) in queued.iter().enumerate() {
            let mut c = connect(&s.addr, &s.key).await.unwrap();
            c.send(req).await.unwrap();
            // One at a time, so the queue holds them in this order.
            wait_until("queued", || stats.writes_waiting() == i + 1).await;
            conns.push(c);
        }
        // Refused on its connection while the committer is still held.
        let mut bad = connect(&s.addr, &s.key).await.unwrap();
        bad.send(&Request::Batch(vec![(b(b"j"), b(b"junk"))]))
            .await
            .unwrap();
        let refused = bad.recv::<Response>().await.unwrap();
        assert!(matches!(refused, Response::Refused(_)), "{refused:?}");
        assert_eq!(store.flushes(), 1);
        store.open();
        let mut answers = vec![first.recv::<Response>().await.unwrap()];
        for c in &mut conns {
            answers.push(c.recv::<Response>().await.unwrap());
        }
        answers
    });
    let kinds: Vec<&str> = answers
        .iter()
        .map(|r| match r {
            Response::Done => "done",
            Response::Fenced { .. } => "fenced",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        ["done", "done", "done", "fenced", "done", "done"],
        "{answers:?}"
    );
    assert_eq!(store.flushes(), 2, "one flush for the five queued writes");
    assert_eq!(stats.flushes(), 2);
    assert_eq!(stats.writes(), 5, "the stale fenced batch wrote nothing");
    assert_eq!(all_keys(&*store), vec![b"k1".to_vec(), b"t/new".to_vec()]);
}

/// Protocol rule 8 at the handler: a `DeleteBatch` removes every key it names (absent ones
/// are no error) with one flush.
#[test]
fn a_delete_batch_removes_every_key_it_names() {
    let store = GatedStore::default();
    store.open();
    for k in [b"a", b"b", b"c"] {
        assert!(matches!(
            handle(
                &store,
                Request::Put {
                    key: b(k),
                    value: frag(k)
                }
            ),
            Response::Done
        ));
    }
    let before = store.flushes();
    let r = handle(
        &store,
        Request::DeleteBatch {
            keys: vec![b(b"a"), b(b"c"), b(b"zz")],
        },
    );
    assert!(matches!(r, Response::Done), "{r:?}");
    assert_eq!(store.flushes(), before + 1);
    assert_eq!(all_keys(&store), vec![b"b".to_vec()]);
}

/// Every key in `store`, in order.
fn all_keys(store: &dyn Store) -> Vec<Vec<u8>> {
    store
        .scan_prefix(b"")
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

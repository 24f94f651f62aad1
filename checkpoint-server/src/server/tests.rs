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
    Connection::client(s, key, DEFAULT_MAX_FRAME).await
}

async fn connect_from(
    local: &str,
    addr: &str,
    key: &Key,
) -> Result<Connection<TcpStream>, WireError> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.bind(local.parse().unwrap())?;
    let s = sock.connect(addr.parse().unwrap()).await?;
    Connection::client(s, key, DEFAULT_MAX_FRAME).await
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
        let fit = budget.limit() / DECLARED;
        assert_eq!(fit, 5);
        wait_until("the frames that fit are read", || {
            budget.received() >= (fit * SENT) as u64
        })
        .await;
        assert_eq!(budget.reserved(), fit * DECLARED);
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
            let req = Request::Put {
                key: b(&[i]),
                value: ByteBuf::from(vec![i; (1 << 20) - 100]),
            };
            let frame = c.seal_next(&postcard::to_stdvec(&req).unwrap());
            frame_len = frame.len() - 4;
            c.stream_mut().write_all(&frame[..FIRST]).await.unwrap();
            rest.push(frame[FIRST..].to_vec());
            conns.push(c);
        }
        let fit = (4 << 20) / frame_len;
        assert_eq!(fit, 4);
        wait_until("the frames that fit are started", || {
            budget.received() >= (fit * (FIRST - 4)) as u64
        })
        .await;
        assert_eq!(budget.reserved(), fit * frame_len);
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
        c.stream_mut()
            .write_all(&(1u32 << 20).to_le_bytes())
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

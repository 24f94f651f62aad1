//! A real checkpoint-server process against bad clients: wrong key, an old protocol version,
//! forged and bit-flipped frames, oversized length fields, malformed bodies and replays are
//! refused, and the server keeps serving a good client after each.

mod common;

use std::time::Duration;

use common::Setup;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use veriflow_checkpoint::wire::{Connection, Role, WireError, DEFAULT_MAX_FRAME};
use veriflow_checkpoint::{open_store, Key, StoreSpec};

/// The first variant of the server's response enum (`Done`): enough to read a ping's answer.
#[derive(Debug, Deserialize)]
enum Resp {
    Done,
}

/// A postcard-encoded `Request::Ping` (variant 0, no fields).
const PING: &[u8] = &[0];

/// Guards against a hang only; nothing is asserted about time.
const HANG_GUARD: Duration = Duration::from_secs(30);

async fn connect(addr: &str, key: &Key) -> Connection<TcpStream> {
    let s = TcpStream::connect(addr).await.expect("connect");
    Connection::client(s, key, Role::CheckpointServer, DEFAULT_MAX_FRAME)
        .await
        .expect("handshake")
}

/// The server must close this connection.
async fn assert_closed(conn: &mut Connection<TcpStream>, what: &str) {
    let r = tokio::time::timeout(HANG_GUARD, conn.recv::<Resp>())
        .await
        .unwrap_or_else(|_| panic!("{what}: server neither answered nor closed"));
    assert!(
        matches!(r, Err(WireError::Closed) | Err(WireError::Io(_))),
        "{what}: expected the server to close, got {r:?}"
    );
}

async fn assert_raw_closed(mut s: TcpStream, what: &str) {
    let mut buf = vec![0u8; 1024];
    loop {
        let r = tokio::time::timeout(HANG_GUARD, s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{what}: server did not close"));
        match r {
            Ok(0) | Err(_) => return,
            Ok(_) => {} // e.g. nothing expected, but keep reading until the close
        }
    }
}

/// A good client still gets served, through the whole stack.
fn good_client_works(addr: &str, key: &Key, round: u8) {
    let spec: StoreSpec = format!("central:{addr}").parse().unwrap();
    let store = open_store(&spec, Some(key)).expect("good client");
    store.put(b"k", &[round; 100]).expect("put");
    assert_eq!(store.get(b"k").unwrap(), Some(vec![round; 100]));
}

#[test]
fn server_refuses_bad_clients_and_keeps_serving() {
    let s = Setup::new();
    let mut servers = s.servers(1, false);
    let addr = servers[0].addr.clone();
    let key = s.key.clone();
    good_client_works(&addr, &key, 0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // 1. Wrong key: the server refuses the hello and the client is told so.
    rt.block_on(async {
        let st = TcpStream::connect(&addr).await.unwrap();
        let r = Connection::client(
            st,
            &Key::generate(),
            Role::CheckpointServer,
            DEFAULT_MAX_FRAME,
        )
        .await;
        assert!(matches!(r, Err(WireError::WrongKey)), "{r:?}");
    });
    good_client_works(&addr, &key, 1);

    // 2. Garbage instead of the hello, and an older veriflow's (wire v1) hello.
    rt.block_on(async {
        let mut st = TcpStream::connect(&addr).await.unwrap();
        st.write_all(&[8, 0, 0, 0]).await.unwrap();
        st.write_all(b"GET / HT").await.unwrap();
        assert_raw_closed(st, "garbage hello").await;
        let mut st = TcpStream::connect(&addr).await.unwrap();
        st.write_all(&40u32.to_le_bytes()).await.unwrap();
        st.write_all(b"VFWIRE01").await.unwrap();
        st.write_all(&[7u8; 32]).await.unwrap();
        // A one-byte refusal an old client reports ("server reply of 1 bytes"), then the close.
        let mut answer = [0u8; 5];
        st.read_exact(&mut answer).await.unwrap();
        assert_eq!(
            answer,
            [1, 0, 0, 0, veriflow_checkpoint::wire::REFUSE_VERSION]
        );
        assert_raw_closed(st, "wire v1 hello").await;
    });
    good_client_works(&addr, &key, 2);

    // 3. A length field claiming 4 GiB, before and after the handshake.
    rt.block_on(async {
        let mut st = TcpStream::connect(&addr).await.unwrap();
        st.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
        assert_raw_closed(st, "huge hello").await;
        let mut c = connect(&addr, &key).await;
        c.stream_mut()
            .write_all(&0xFFFF_FFF0u32.to_le_bytes())
            .await
            .unwrap();
        assert_closed(&mut c, "huge authenticated frame").await;
    });
    good_client_works(&addr, &key, 3);

    // 4. An authenticated frame whose body is not a request.
    rt.block_on(async {
        let mut c = connect(&addr, &key).await;
        c.send_raw_with_seq(0, &[0xff, 0xff, 0xff, 0x7f])
            .await
            .unwrap();
        assert_closed(&mut c, "malformed body").await;
    });
    good_client_works(&addr, &key, 4);

    // 5. A forged frame (right length, made-up ciphertext), and a sealed one with one bit
    //    flipped.
    rt.block_on(async {
        let mut c = connect(&addr, &key).await;
        let mut frame = Vec::new();
        frame.extend_from_slice(&21u32.to_le_bytes());
        frame.extend_from_slice(&[0u8; 21]);
        c.stream_mut().write_all(&frame).await.unwrap();
        assert_closed(&mut c, "forged frame").await;
        let mut c = connect(&addr, &key).await;
        let mut frame = c.seal_next(PING);
        frame[4] ^= 0x10;
        c.stream_mut().write_all(&frame).await.unwrap();
        assert_closed(&mut c, "bit-flipped frame").await;
    });
    good_client_works(&addr, &key, 5);

    // 6. A replayed frame (same Noise nonce): the first ping is answered, its replay closes.
    rt.block_on(async {
        let mut c = connect(&addr, &key).await;
        c.send_raw_with_seq(0, PING).await.unwrap();
        let r: Resp = c.recv().await.expect("ping answered");
        assert!(matches!(r, Resp::Done));
        c.send_raw_with_seq(0, PING).await.unwrap();
        assert_closed(&mut c, "replayed frame").await;
    });
    good_client_works(&addr, &key, 6);

    assert!(
        servers[0].is_running(),
        "the server survived every bad client"
    );
}

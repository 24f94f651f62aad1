//! The namespace harness (`veriflow_testkit::netns`): hosts reach each other at their own
//! addresses with the latency asked, TCP gets every byte through losses, and nothing is left
//! behind (after a drop, a panic, or a killed run). Root only: each test skips, saying why,
//! when namespaces cannot be made here.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use veriflow_testkit::netns::{available, Emulation, NetConfig, Network, PREFIX};

fn skip() -> bool {
    match available() {
        Ok(()) => false,
        Err(why) => {
            eprintln!("skipped: {why}");
            true
        }
    }
}

/// Namespaces whose name starts with `prefix`.
fn namespaces(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(String::from)
        .collect()
}

/// An echo server on host `i`: serves one connection, echoing until it closes.
fn echo_server(net: &Network, i: usize) -> (SocketAddr, veriflow_testkit::netns::HostThread<()>) {
    let addr = format!("{}:0", net.addr(i));
    let (tx, rx) = std::sync::mpsc::channel();
    let t = net
        .in_host(i, move || {
            let l = TcpListener::bind(&addr).expect("bind on the host's address");
            tx.send(l.local_addr().unwrap()).unwrap();
            let (mut c, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = c.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                c.write_all(&buf[..n]).unwrap();
            }
        })
        .expect("a thread in the host");
    (rx.recv().unwrap(), t)
}

#[test]
fn hosts_reach_each_other_with_the_latency_asked_and_drop_removes_everything() {
    if skip() {
        return;
    }
    let latency = Duration::from_millis(10);
    let net = Network::create(&NetConfig {
        hosts: 3,
        latency,
        loss: 0.0,
        seed: 1,
    })
    .expect("a network");
    eprintln!("{}", net.describe());
    let prefix = net.hosts()[0].ns.trim_end_matches("h0").to_string();
    assert_eq!(
        namespaces(&prefix).len(),
        3 + usize::from(net.emulation() == Emulation::Netem)
    );
    assert_eq!(net.addr(1), "198.18.0.2");

    let (server, t) = echo_server(&net, 1);
    let rtts = net
        .in_host(2, move || {
            let mut c = TcpStream::connect(server).expect("host 2 reaches host 1");
            c.set_nodelay(true).unwrap();
            let mut rtts = Vec::new();
            for i in 0..5u8 {
                let t0 = Instant::now();
                c.write_all(&[i; 10]).unwrap();
                let mut back = [0u8; 10];
                c.read_exact(&mut back).unwrap();
                rtts.push(t0.elapsed());
                assert_eq!(back, [i; 10]);
            }
            rtts
        })
        .unwrap()
        .join();
    t.join();
    eprintln!("round trips at one-way {latency:?}: {rtts:?}");
    // A lower bound only (a packet cannot arrive before its delay): one way each direction.
    for r in &rtts {
        assert!(
            *r >= 2 * latency,
            "a round trip of {r:?} under 2 x {latency:?}"
        );
    }
    // Host 0 cannot reach an address of no host.
    let stray = net
        .in_host(0, || {
            TcpStream::connect_timeout(
                &"198.18.0.99:9".parse().unwrap(),
                Duration::from_millis(300),
            )
        })
        .unwrap()
        .join();
    assert!(stray.is_err());
    if let Some(w) = net.wire_stats() {
        assert!(w.forwarded >= 10, "{w:?}");
        assert_eq!(w.dropped, 0, "{w:?}");
    }

    drop(net);
    assert_eq!(namespaces(&prefix), Vec::<String>::new(), "left behind");
}

#[test]
fn tcp_gets_every_byte_through_a_lossy_network() {
    if skip() {
        return;
    }
    let net = Network::create(&NetConfig {
        hosts: 2,
        latency: Duration::from_millis(1),
        loss: 0.05,
        seed: 7,
    })
    .expect("a network");
    let (server, t) = echo_server(&net, 0);
    let data: Vec<u8> = (0..400_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let sent = data.clone();
    let back = net
        .in_host(1, move || {
            let c = TcpStream::connect(server).unwrap();
            let mut w = c.try_clone().unwrap();
            let writer = std::thread::spawn(move || {
                w.write_all(&sent).unwrap();
                w.shutdown(std::net::Shutdown::Write).unwrap();
            });
            let mut back = Vec::new();
            (&c).read_to_end(&mut back).unwrap();
            writer.join().unwrap();
            back
        })
        .unwrap()
        .join();
    t.join();
    assert!(back == data, "the echo differs ({} bytes back)", back.len());
    eprintln!("{}", net.describe());
    if let Some(w) = net.wire_stats() {
        // 5 % of some hundreds of packets: TCP retransmitted what the wire dropped.
        assert!(w.dropped > 0, "{w:?}");
    }
}

#[test]
fn a_panic_removes_the_network() {
    if skip() {
        return;
    }
    let mut prefix = String::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let net = Network::create(&NetConfig {
            hosts: 2,
            latency: Duration::ZERO,
            loss: 0.0,
            seed: 0,
        })
        .unwrap();
        prefix = net.hosts()[0].ns.trim_end_matches("h0").to_string();
        panic!("a test failed with the network up");
    }));
    assert!(r.is_err());
    assert!(!prefix.is_empty());
    assert_eq!(namespaces(&prefix), Vec::<String>::new(), "left behind");
}

#[test]
fn leftovers_of_dead_runs_are_swept_and_live_ones_kept() {
    if skip() {
        return;
    }
    // Above the kernel's largest pid (PID_MAX_LIMIT = 2^22): no process has it.
    let dead = format!("{PREFIX}4194400-0-h0");
    // This process is alive: its name is another network's, which the sweep must not touch.
    let live = format!("{PREFIX}{}-999999-h0", std::process::id());
    for ns in [&dead, &live] {
        let ok = Command::new("ip")
            .args(["netns", "add", ns])
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let net = Network::create(&NetConfig {
        hosts: 2,
        latency: Duration::ZERO,
        loss: 0.0,
        seed: 0,
    })
    .unwrap();
    assert!(
        namespaces(&dead).is_empty(),
        "a dead run's namespace stayed"
    );
    assert_eq!(namespaces(&live), vec![live.clone()]);
    let _ = Command::new("ip").args(["netns", "del", &live]).status();
    drop(net);
}

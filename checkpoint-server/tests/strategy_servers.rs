//! Storage strategies over real checkpoint-server processes (SIGKILL, restart, scrub).

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{addrs, Setup};
use veriflow_checkpoint::{open_store, Key, Store, StoreError, StoreSpec};

fn open(spec: &str, key: &Key) -> Arc<dyn Store> {
    let spec: StoreSpec = spec.parse().expect("spec");
    open_store(&spec, Some(key)).unwrap_or_else(|e| panic!("open {spec}: {e}"))
}

/// A value of `len` bytes that depends on `seed` (no two keys alike).
fn value(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(131)) as u8)
        .collect()
}

/// What the runtime's log does: a group-commit batch of segments, a manifest, read back.
fn round_trip(store: &dyn Store) {
    let batch: Vec<(Vec<u8>, Vec<u8>)> = (0..5)
        .map(|i| (format!("seg/{i:04}").into_bytes(), value(i, 1000 * i + 1)))
        .collect();
    store.put_batch(&batch).expect("put_batch");
    store.flush().expect("flush");
    store.put(b"manifest", b"m1").expect("put");
    store.put(b"manifest", b"m2").expect("overwrite");
    store.put(b"empty", b"").expect("empty value");
    assert_eq!(store.get(b"manifest").unwrap().as_deref(), Some(&b"m2"[..]));
    assert_eq!(store.get(b"empty").unwrap().as_deref(), Some(&b""[..]));
    assert_eq!(store.get(b"nothing").unwrap(), None);
    assert_eq!(store.scan_prefix(b"seg/").unwrap(), batch);
    // Paged scans (strategy rule 12) join up to the whole scan, whatever the page.
    for (max_keys, max_bytes) in [(1, u64::MAX), (2, u64::MAX), (100, 1500), (0, 0)] {
        let limit = veriflow_checkpoint::PageLimit {
            max_keys,
            max_bytes,
        };
        let mut got = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = store.scan_page(b"seg/", after.as_deref(), limit).unwrap();
            assert!(page.pairs.len() <= max_keys.max(1));
            after = page.pairs.last().map(|(k, _)| k.clone());
            got.extend(page.pairs);
            if !page.more || after.is_none() {
                break;
            }
        }
        assert_eq!(got, batch, "pages of {max_keys} keys, {max_bytes} bytes");
    }
    let tail = store
        .scan_page(
            b"seg/",
            Some(b"seg/0002"),
            veriflow_checkpoint::PageLimit {
                max_keys: 10,
                max_bytes: u64::MAX,
            },
        )
        .unwrap();
    assert_eq!(
        tail.pairs,
        batch[3..].to_vec(),
        "a page after a key holds what follows it"
    );
    store.delete(b"seg/0002").unwrap();
    assert_eq!(store.get(b"seg/0002").unwrap(), None);
    assert_eq!(store.scan_prefix(b"seg/").unwrap().len(), 4);
}

#[test]
fn central_replicate_parity_and_ida_round_trip() {
    let s = Setup::new();
    let servers = s.servers(5, false);
    round_trip(&*open(&format!("central:{}", servers[0].addr), &s.key));
    round_trip(&*open(
        &format!("replicate:2:{}", addrs(&servers[1..3])),
        &s.key,
    ));
    round_trip(&*open(
        &format!("parity:4:{}", addrs(&servers[0..5])),
        &s.key,
    ));
    round_trip(&*open(
        &format!("ida:3,2,quorum:{}", addrs(&servers[0..5])),
        &s.key,
    ));
}

#[test]
fn memory_servers_round_trip() {
    let s = Setup::new();
    let servers = s.servers(3, true);
    round_trip(&*open(&format!("ida:2,1:{}", addrs(&servers)), &s.key));
}

#[test]
fn a_server_with_another_key_is_refused_by_name() {
    let s = Setup::new();
    let servers = s.servers(1, true);
    let other = Key::generate();
    let spec: StoreSpec = format!("central:{}", servers[0].addr).parse().unwrap();
    let e = open_store(&spec, Some(&other))
        .err()
        .expect("wrong key must fail");
    assert!(matches!(e, StoreError::Refused(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&servers[0].addr) && msg.contains("key"),
        "{msg}"
    );
}

#[test]
fn replicate_survives_losing_a_copy() {
    let s = Setup::new();
    let mut servers = s.servers(2, false);
    let spec = format!("replicate:2:{}", addrs(&servers));
    let store = open(&spec, &s.key);
    store.put(b"k", b"v").unwrap();
    servers[0].kill();
    assert_eq!(store.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    // ack=all: a write with a copy missing is refused, naming the server.
    let e = store.put(b"k2", b"v").expect_err("write needs both copies");
    assert!(e.to_string().contains(&servers[0].addr), "{e}");
}

/// `scrub`'s exit status and JSON report: 0 whole, 3 degraded (every value readable, fragments
/// missing or servers unreachable), 1 a value lost.
fn scrub(spec: &str, key: &std::path::Path) -> (Option<i32>, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_checkpoint-server"))
        .args(["scrub", "--json", "--store", spec, "--key"])
        .arg(key)
        .output()
        .expect("run scrub");
    let text = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "scrub output {text:?} ({e}); stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report)
}

#[test]
fn ida_4_2_survives_two_sigkills_refuses_a_third_and_scrub_repairs() {
    let s = Setup::new();
    let mut servers = s.servers(6, false);
    let all = addrs(&servers);
    let strict = open(&format!("ida:4,2:{all}"), &s.key);
    let mut want: Vec<(Vec<u8>, Vec<u8>)> = (0..20)
        .map(|i| (format!("seg/{i:03}").into_bytes(), value(i, 300 * i + 7)))
        .collect();
    strict.put_batch(&want[..10]).unwrap();
    for (k, v) in &want[10..] {
        strict.put(k, v).unwrap();
    }

    // Server 0 dies; a quorum writer (5 of 6) adds keys and overwrites two old ones: server 0
    // misses those fragments and keeps stale ones.
    servers[0].kill();
    let quorum = open(&format!("ida:4,2,quorum:{all}"), &s.key);
    for i in 20..25 {
        want.push((format!("seg/{i:03}").into_bytes(), value(i, 5000 + i)));
    }
    want[3].1 = b"overwritten three".to_vec();
    want[4].1 = value(99, 70_000);
    let fresh: Vec<_> = want[20..].iter().chain(&want[3..5]).cloned().collect();
    quorum.put_batch(&fresh).unwrap();
    // ack=all refuses with a server down; the fragments it did write stay (a failed write may
    // still be applied: here on 5 of 6 servers, so it is readable and scrub completes it).
    assert!(
        strict.put(b"x", b"y").is_err(),
        "ack=all must refuse with a server down"
    );

    // A second SIGKILL: every value still reads (any 4 of 6).
    servers[1].kill();
    let reader = open(&format!("ida:4,2:{all}"), &s.key);
    want.sort();
    assert_eq!(reader.scan_prefix(b"seg/").unwrap(), want);
    for (k, v) in &want {
        assert_eq!(reader.get(k).unwrap().as_ref(), Some(v));
    }

    // A third: a clean error naming the three unreachable servers and how many are needed.
    servers[2].kill();
    let e = reader.get(&want[0].0).expect_err("3 of 6 down");
    let msg = e.to_string();
    assert!(
        matches!(e, StoreError::Unavailable { need: 4, .. }),
        "{msg}"
    );
    for srv in &servers[..3] {
        assert!(msg.contains(&srv.addr), "{msg} should name {}", srv.addr);
    }
    assert!(msg.contains("4 must be reachable"), "{msg}");
    let e = reader.scan_prefix(b"seg/").expect_err("3 of 6 down");
    assert!(matches!(e, StoreError::Unavailable { .. }), "{e}");

    // Restart servers 0 and 2 on their data dirs; server 1 stays down. Scrub rebuilds the
    // 8 fragments server 0 missed ("x" and 5 new keys) or holds stale (2 overwritten keys),
    // and cannot write server 1's.
    servers[0].restart(&s.key_path);
    servers[2].restart(&s.key_path);
    let spec = format!("ida:4,2:{all}");
    let (code, r) = scrub(&spec, &s.key_path);
    assert_eq!(code, Some(3), "degraded while server 1 is down: {r}");
    assert_eq!(r["keys"], 26, "{r}");
    assert_eq!(r["fragments_repaired"], 8, "{r}");
    assert_eq!(r["fragments_missing"], 26, "{r}");
    assert_eq!(r["fragments_ok"], 26 * 6 - 8 - 26, "{r}");
    assert!(
        r["unrecoverable"].as_array().is_some_and(|a| a.is_empty()),
        "{r}"
    );
    let unreachable = r["unreachable"].to_string();
    assert!(unreachable.contains(&servers[1].addr), "{r}");

    // A second scrub finds nothing more to repair; server 0's fragments now carry the load:
    // with servers 1 and 4 down every value still reads.
    let (code, r) = scrub(&spec, &s.key_path);
    assert_eq!(code, Some(3), "{r}");
    assert_eq!(r["fragments_repaired"], 0, "{r}");
    servers[4].kill();
    let reader = open(&spec, &s.key);
    assert_eq!(reader.scan_prefix(b"seg/").unwrap(), want);
    // Servers 1 and 4 back (they missed no write): the strategy is whole again (exit 0).
    servers[1].restart(&s.key_path);
    servers[4].restart(&s.key_path);
    let (code, r) = scrub(&spec, &s.key_path);
    assert_eq!(code, Some(0), "{r}");
    assert_eq!(r["fragments_missing"], 0, "{r}");
    assert_eq!(r["fragments_ok"], 26 * 6, "{r}");
    for srv in servers.iter_mut() {
        if srv.is_running() {
            srv.kill();
        }
    }
}

/// Servers SIGKILLed while batches stream in leave no half-visible commit: each server applies
/// a batch whole or not at all, and every key of a batch has its fragments on the same servers,
/// so after the servers come back each batch reads entirely (with its own values) or not at all.
#[test]
fn servers_killed_mid_batch_leave_no_half_visible_commit() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = Setup::new();
    let mut servers = s.servers(6, false);
    let all = addrs(&servers);
    let spec = format!("ida:4,2,quorum=4:{all}");
    let store = open(&spec, &s.key);
    let stop = Arc::new(AtomicBool::new(false));
    const KEYS: usize = 12;
    let writer = {
        let store = store.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut acked = Vec::new();
            for b in 0..400usize {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let batch: Vec<(Vec<u8>, Vec<u8>)> = (0..KEYS)
                    .map(|i| {
                        (
                            format!("b{b:04}/k{i:02}").into_bytes(),
                            value(b * 100 + i, 40_000),
                        )
                    })
                    .collect();
                if store.put_batch(&batch).and_then(|()| store.flush()).is_ok() {
                    acked.push(b);
                }
            }
            acked
        })
    };
    // Let some batches land, then kill three servers at once (more than K: writes now fail).
    std::thread::sleep(std::time::Duration::from_millis(300));
    for srv in &mut servers[0..3] {
        srv.kill();
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    stop.store(true, Ordering::SeqCst);
    let acked = writer.join().unwrap();
    assert!(
        !acked.is_empty(),
        "some batches were acknowledged before the kills"
    );
    for srv in &mut servers[0..3] {
        srv.restart(&s.key_path);
    }
    let reader = open(&format!("ida:4,2:{all}"), &s.key);
    let mut visible = 0;
    for b in 0..400usize {
        let got = reader.scan_prefix(format!("b{b:04}/").as_bytes()).unwrap();
        if got.is_empty() {
            assert!(!acked.contains(&b), "acknowledged batch {b} vanished");
            continue;
        }
        assert_eq!(
            got.len(),
            KEYS,
            "batch {b} is half visible: {} of {KEYS} keys",
            got.len()
        );
        for (i, (k, v)) in got.iter().enumerate() {
            assert_eq!(k, format!("b{b:04}/k{i:02}").as_bytes());
            assert!(
                *v == value(b * 100 + i, 40_000),
                "batch {b} key {i}: wrong value"
            );
        }
        visible += 1;
    }
    assert!(visible >= acked.len());
}

/// Strategy rule 9, found by `chaos`: a writer killed mid-overwrite left a watermark record
/// with one fragment of its new version and five of the old, and every later read failed
/// ("only 1 valid fragments, 4 needed"). The new version reached fewer than M servers, so it
/// was never acknowledged: the key reads as the old version, and read repair completes it.
#[test]
fn an_overwrite_that_reached_fewer_than_m_servers_reads_as_the_version_before_it() {
    let s = Setup::new();
    let mut servers = s.servers(6, false);
    let all = addrs(&servers);
    let store = open(&format!("ida:4,2:{all}"), &s.key);
    store.put(b"wm/0", b"old watermark").unwrap();
    // Only server 0 is up when the overwrite comes: it gets its fragment, the write fails.
    let quorum = open(&format!("ida:4,2,quorum:{all}"), &s.key);
    for srv in &mut servers[1..] {
        srv.kill();
    }
    assert!(quorum.put(b"wm/0", b"new watermark").is_err());
    for srv in &mut servers[1..] {
        srv.restart(&s.key_path);
    }
    let reader = open(&format!("ida:4,2:{all}"), &s.key);
    assert_eq!(
        reader.get(b"wm/0").unwrap().as_deref(),
        Some(&b"old watermark"[..])
    );
    assert_eq!(
        reader.scan_prefix(b"wm/").unwrap(),
        vec![(b"wm/0".to_vec(), b"old watermark".to_vec())]
    );
    // Read repair rewrote server 0's fragment: the old version now survives two more losses.
    servers[4].kill();
    servers[5].kill();
    assert_eq!(
        open(&format!("ida:4,2,quorum:{all}"), &s.key)
            .get(b"wm/0")
            .unwrap()
            .as_deref(),
        Some(&b"old watermark"[..])
    );
    // A version that reached M servers is the newest and wins, as before.
    servers[4].restart(&s.key_path);
    servers[5].restart(&s.key_path);
    store.put(b"wm/0", b"newer").unwrap();
    assert_eq!(reader.get(b"wm/0").unwrap().as_deref(), Some(&b"newer"[..]));
}

/// Strategy rule 13, found by `chaos` (cg under ida:4,2,quorum): a logged value (the log's
/// value store, keyed by its digest) is written again by another writer, who dies half-way.
/// With a stamp of its own, its three fragments and the two left of the first write made two
/// versions of three and two fragments, four needed: the value was lost. Written as
/// content-addressed, both writes are the same fragments, and five of them read.
#[test]
fn a_content_addressed_value_written_again_by_a_writer_that_dies_half_way_still_reads() {
    let s = Setup::new();
    let mut servers = s.servers(6, false);
    let all = addrs(&servers);
    let spec = format!("ida:4,2,quorum:{all}");
    let key = b"val/0123".to_vec();
    let blob = value(7, 20_000);
    let pair = [(key.clone(), blob.clone())];
    // The first writer, with server 5 down: acknowledged at 5 of 6.
    servers[5].kill();
    open(&spec, &s.key)
        .put_batch_fenced_content(&[], &pair, 1)
        .unwrap();
    servers[5].restart(&s.key_path);
    // The second writer reaches servers 0-2 only, and fails.
    let second = open(&spec, &s.key);
    for srv in &mut servers[3..] {
        srv.kill();
    }
    assert!(second.put_batch_fenced_content(&[], &pair, 1).is_err());
    for srv in &mut servers[3..] {
        srv.restart(&s.key_path);
    }
    assert_eq!(
        open(&format!("ida:4,2:{all}"), &s.key).get(&key).unwrap(),
        Some(blob)
    );
}

/// Client rule 3 (found by `knary chaos --seed 3`): a server marked down that has come back is
/// tried again at once when another server fails, so a quorum write (5 of 6 under
/// `ida:4,2,quorum`) succeeds with one server down, not "2 of 6 unreachable".
#[test]
fn a_server_marked_down_that_came_back_counts_when_another_goes_down() {
    let s = Setup::new();
    let mut servers = s.servers(6, false);
    let all = addrs(&servers);
    let quorum = open(&format!("ida:4,2,quorum:{all}"), &s.key);
    quorum.put(b"a", b"1").unwrap();
    // Server 0 dies: the write goes on at 5 of 6, and the client marks it down.
    servers[0].kill();
    quorum.put(b"b", b"2").unwrap();
    // It comes back within its down mark; then server 1 dies.
    servers[0].restart(&s.key_path);
    servers[1].kill();
    quorum
        .put(b"c", b"3")
        .expect("servers 0 and 2-5 are up: the write reaches 5 of 6");
    for (k, v) in [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")] {
        assert_eq!(quorum.get(k).unwrap().as_deref(), Some(&v[..]));
    }
}

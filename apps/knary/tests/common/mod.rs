//! Helpers shared by the `knary` command-line tests: running the binary, reading and damaging
//! its logs.
#![allow(dead_code)] // each test file uses a part of them

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use veriflow::runtime::log::segment::{parse_segment_key, segment_key, vnode_prefix};
use veriflow::VnodeId;
use veriflow_checkpoint::{SledStore, Store};
pub(crate) use veriflow_testkit::{s, Out, LOCK_PATIENCE};

/// Runs the binary with `TMPDIR` set to `tmp` (so a fresh log directory lands there); see
/// [`veriflow_testkit::run_bin`].
pub(crate) fn knary_in(tmp: &Path, args: &[&str]) -> Out {
    veriflow_testkit::run_bin(Path::new(env!("CARGO_BIN_EXE_knary")), tmp, args)
}

pub(crate) fn knary(args: &[&str]) -> Out {
    knary_in(&std::env::temp_dir(), args)
}

/// A finished logged run of knary(depth, fanout) on `vnodes` vnodes into `dir`, plus `extra`.
pub(crate) fn logged_run(
    dir: &Path,
    depth: u32,
    fanout: u32,
    vnodes: u32,
    extra: &[&str],
) -> Value {
    let (d, k, v) = (depth.to_string(), fanout.to_string(), vnodes.to_string());
    let mut args = vec![
        "run",
        "--depth",
        &d,
        "--fanout",
        &k,
        "--threads",
        "2",
        "--vnodes",
        &v,
        "--seed",
        "11",
        "--json",
        "--log-dir",
        s(dir),
    ];
    args.extend_from_slice(extra);
    let out = knary(&args);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["correct"], Value::Bool(true), "{}\n{out}", out.cmd());
    assert_eq!(
        j["result"],
        knary::expected_nodes(depth, fanout).unwrap(),
        "{out}"
    );
    j
}

/// Sled allows one open database per directory: the tests of this file open stores one at a
/// time, and retry while a store just closed is still locked (sled releases its file in the
/// background, so the lock can outlive `drop` for a moment).
pub(crate) static SLED: Mutex<()> = Mutex::new(());

/// Opens the store at `dir`, runs `f`, flushes, and closes.
pub(crate) fn with_store<T>(dir: &Path, f: impl FnOnce(&SledStore) -> T) -> T {
    let _one_at_a_time = SLED.lock().unwrap_or_else(|p| p.into_inner());
    let t0 = Instant::now();
    let store = loop {
        match SledStore::open(dir) {
            Ok(st) => break st,
            Err(e) if e.to_string().contains("could not acquire lock") => {
                assert!(
                    t0.elapsed() < LOCK_PATIENCE,
                    "{} stays locked: {e}",
                    dir.display()
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("open {}: {e}", dir.display()),
        }
    };
    let out = f(&store);
    store.flush().expect("flush");
    drop(store);
    out
}

/// Segments of `vnode` in the store at `dir`: (segment number, stored bytes).
pub(crate) fn segments(dir: &Path, vnode: u32) -> Vec<(u64, Vec<u8>)> {
    with_store(dir, |store| {
        store
            .scan_prefix(&vnode_prefix(VnodeId(vnode)))
            .expect("scan")
            .into_iter()
            .map(|(k, v)| {
                let (vn, segno) = parse_segment_key(&k).expect("a segment key");
                assert_eq!(vn, VnodeId(vnode));
                (segno, v)
            })
            .collect()
    })
}

/// The vnode with the most segments, and its segments.
pub(crate) fn busiest_vnode(dir: &Path, vnodes: u32) -> (u32, Vec<(u64, Vec<u8>)>) {
    (0..vnodes)
        .map(|v| (v, segments(dir, v)))
        .max_by_key(|(_, segs)| segs.len())
        .expect("some vnode")
}

/// Replaces one segment's bytes, flushes, and closes the store.
pub(crate) fn put_segment(dir: &Path, vnode: u32, segno: u64, bytes: &[u8]) {
    with_store(dir, |store| {
        let key = segment_key(VnodeId(vnode), segno);
        assert!(key.starts_with(b"seg/"));
        assert!(
            store.get(&key).unwrap().is_some(),
            "v{vnode} segment {segno} exists"
        );
        store.put(&key, bytes).expect("put");
    });
}

pub(crate) fn inspect_json(dir: &Path) -> (Out, Option<Value>) {
    let out = knary(&["inspect", "--log-dir", s(dir), "--json"]);
    let j = (out.code == 0).then(|| out.json());
    (out, j)
}

pub(crate) fn vnode_entry(j: &Value, vnode: u32) -> &Value {
    j["vnodes"]
        .as_array()
        .expect("vnodes array")
        .iter()
        .find(|v| v["vnode"] == vnode)
        .unwrap_or_else(|| panic!("no vnode {vnode} in {j}"))
}

// ---------------------------------------------------------------------------------------------

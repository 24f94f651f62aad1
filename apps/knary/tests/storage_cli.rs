//! Runs whose logs live on checkpoint servers (real processes, killed with SIGKILL), through
//! `--store SPEC --key FILE`: the run, `inspect` and `certify` work as with a local log. And
//! named runs (`--run NAME`): many runs in one store, each addressed by its name.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use veriflow_checkpoint::launch::ServerProcess;

struct Cluster {
    servers: Vec<ServerProcess>,
    key: PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn new(n: usize) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("cluster.key");
        knary(&["keygen", s(&key)]).expect_code(0);
        let bin = veriflow_testkit::checkpoint_server_binary();
        let servers = (0..n)
            .map(|i| {
                let data = dir.path().join(format!("server{i}"));
                ServerProcess::start(&bin, "127.0.0.1:0", Some(&data), &key).unwrap()
            })
            .collect();
        Cluster {
            servers,
            key,
            _dir: dir,
        }
    }

    fn spec(&self, layout: &str) -> String {
        let addrs: Vec<&str> = self.servers.iter().map(|s| s.addr.as_str()).collect();
        format!("{layout}:{}", addrs.join(","))
    }
}

fn key_args<'a>(spec: &'a str, key: &'a Path) -> [&'a str; 4] {
    ["--store", spec, "--key", s(key)]
}

/// ida:4,2 with a write quorum of 4 over 6 servers: two are SIGKILLed while knary runs, the run
/// finishes with the right result, its log is complete (inspect) and certifies; a third kill
/// makes the log unreadable with an error that names the servers and says how many are needed.
#[test]
fn a_run_over_ida_4_2_survives_two_server_kills_and_a_third_is_a_clear_error() {
    let mut c = Cluster::new(6);
    let spec = c.spec("ida:4,2,quorum=4");
    let tmp = tempfile::tempdir().unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_knary"))
        .args([
            "run",
            "--depth",
            "7",
            "--fanout",
            "4",
            "--grain-us",
            "400",
            "--threads",
            "2",
            "--vnodes",
            "2",
            "--json",
        ])
        .args(key_args(&spec, &c.key))
        .env("TMPDIR", tmp.path())
        .env("XDG_CONFIG_HOME", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The kills are timed, not asserted on: the run takes about a second of work per thread.
    std::thread::sleep(Duration::from_millis(150));
    c.servers[1].kill();
    std::thread::sleep(Duration::from_millis(250));
    assert!(
        matches!(run.try_wait(), Ok(None)),
        "the run ended before the second kill: make it longer"
    );
    c.servers[4].kill();
    let out = run.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "run failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(j["correct"], true, "{j}");
    let tasks = knary::expected_tasks(7, 4).unwrap();
    assert_eq!(j["tasks"], tasks);
    assert_eq!(j["store"], spec);

    let k = key_args(&spec, &c.key);
    let ins = knary(&[&["inspect", "--json"][..], &k[..]].concat());
    ins.expect_code(0)
        .stderr_has("warning: read through a degraded store")
        .stderr_has("checkpoint-server scrub");
    let v = ins.json();
    assert_eq!(v["tasks"]["completed"], tasks, "{v}");
    assert_eq!(v["tasks"]["declared"], tasks, "{v}");
    let want = knary::expected_nodes(7, 4).unwrap().to_string();
    assert_eq!(v["terminal"][0]["value"], serde_json::Value::String(want));
    let okey = c.key.parent().unwrap().join("oracle.key");
    knary(&["keygen", s(&okey)]).expect_code(0);
    knary(&[&["certify", "--oracle-key", s(&okey)][..], &k[..]].concat()).expect_code(0);

    c.servers[2].kill();
    let out = knary(&[&["inspect"][..], &k[..]].concat());
    out.expect_code(1)
        .stderr_has("3 of 6 checkpoint servers unreachable")
        .stderr_has("4 must be reachable");
    for i in [1, 2, 4] {
        out.stderr_has(&c.servers[i].addr);
    }
    // A new run with three servers down cannot start its log.
    let spec2 = spec.clone();
    let out = knary(
        &[
            &["run", "--depth", "2", "--fanout", "2"][..],
            &key_args(&spec2, &c.key)[..],
        ]
        .concat(),
    );
    out.expect_code(1).stderr_has("unreachable");
}

/// Every strategy carries a run: the run, inspect and certify work as with a local log.
#[test]
fn every_strategy_carries_a_run() {
    for (layout, n) in [
        ("central", 1),
        ("replicate:2", 2),
        ("parity:3", 4),
        ("ida:3,2", 5),
    ] {
        let c = Cluster::new(n);
        let spec = c.spec(layout);
        let k = key_args(&spec, &c.key);
        let okey = c.key.parent().unwrap().join("oracle.key");
        knary(&["keygen", s(&okey)]).expect_code(0);
        let out = knary(
            &[
                &["run", "--depth", "4", "--fanout", "3", "--json"][..],
                &k[..],
            ]
            .concat(),
        );
        out.expect_code(0);
        assert_eq!(out.json()["store"], spec);
        let ins = knary(&[&["inspect", "--json"][..], &k[..]].concat());
        ins.expect_code(0);
        assert!(!ins.stderr.contains("degraded"), "{layout}: {ins}");
        assert_eq!(
            ins.json()["tasks"]["completed"],
            out.json()["tasks"],
            "{layout}"
        );
        knary(&[&["certify", "--oracle-key", s(&okey)][..], &k[..]].concat()).expect_code(0);
        // A second run into the same store is refused; the first is intact.
        knary(&[&["run", "--depth", "4", "--fanout", "3"][..], &k[..]].concat())
            .expect_code(2)
            .stderr_has("already holds a run");
        knary(&[&["inspect"][..], &k[..]].concat()).expect_code(0);
    }
}

#[test]
fn store_usage_errors() {
    let c = Cluster::new(1);
    let spec = c.spec("central");
    knary(&[
        "run",
        "--depth",
        "2",
        "--fanout",
        "2",
        "--store",
        "ida:4:x:1",
    ])
    .expect_code(2)
    .stderr_has("--store");
    knary(&["run", "--depth", "2", "--fanout", "2", "--store", &spec])
        .expect_code(2)
        .stderr_has("--key FILE");
    let other = tempfile::tempdir().unwrap();
    let wrong = other.path().join("wrong.key");
    knary(&["keygen", s(&wrong)]).expect_code(0);
    knary(&[
        "run",
        "--depth",
        "2",
        "--fanout",
        "2",
        "--store",
        &spec,
        "--key",
        s(&wrong),
    ])
    .expect_code(1)
    .stderr_has(&c.servers[0].addr);
    knary(&["inspect", "--store", "memory"])
        .expect_code(2)
        .stderr_has("memory");
    knary(&[
        "run",
        "--depth",
        "2",
        "--fanout",
        "2",
        "--store",
        &spec,
        "--log-dir",
        "/tmp/x",
    ])
    .expect_code(2);
}

/// Issue 18 point 1: `--run NAME` keeps many runs in one store, on checkpoint servers as in a
/// local directory (`store/namespace.rs`): each run is inspected, certified and refused reuse
/// by its name, the unnamed run beside them is untouched, and a store of named runs only, or a
/// name it does not hold, is a usage error that lists the names.
#[test]
fn named_runs_share_one_store() {
    let c = Cluster::new(1);
    let remote = c.spec("central");
    let local = c.key.parent().unwrap().join("logs");
    let okey = c.key.parent().unwrap().join("oracle.key");
    knary(&["keygen", s(&okey)]).expect_code(0);
    for spec in [format!("local:{}", s(&local)), remote] {
        let k = key_args(&spec, &c.key);
        let with = |args: &[&str]| -> Vec<String> {
            args.iter().chain(k.iter()).map(|a| a.to_string()).collect()
        };
        let run = |args: &[&str]| {
            let words = with(args);
            knary(&words.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let a = run(&[
            "run", "--depth", "4", "--fanout", "3", "--json", "--run", "a",
        ]);
        a.expect_code(0);
        assert_eq!(a.json()["run"], "a", "{a}");
        run(&[
            "run", "--depth", "5", "--fanout", "2", "--run", "b", "--vnodes", "3",
        ])
        .expect_code(0);
        run(&["inspect"])
            .expect_code(2)
            .stderr_has("holds named runs only: choose one with --run NAME (a, b)");
        for (name, depth, fanout) in [("a", 4, 3), ("b", 5, 2)] {
            let tasks = knary::expected_tasks(depth, fanout).unwrap();
            let ins = run(&["inspect", "--json", "--run", name]);
            ins.expect_code(0);
            assert_eq!(
                ins.json()["tasks"]["completed"],
                tasks,
                "{spec} {name}: {ins}"
            );
            run(&["certify", "--oracle-key", s(&okey), "--run", name]).expect_code(0);
        }
        run(&["run", "--depth", "4", "--fanout", "3", "--run", "a"])
            .expect_code(2)
            .stderr_has("already holds a run");
        run(&["inspect", "--run", "c"])
            .expect_code(2)
            .stderr_has("holds no run named c (named runs there: a, b)");
        // The unnamed run beside the named ones.
        run(&["run", "--depth", "3", "--fanout", "3"]).expect_code(0);
        let top = run(&["inspect", "--json"]);
        top.expect_code(0);
        assert_eq!(
            top.json()["tasks"]["completed"],
            knary::expected_tasks(3, 3).unwrap(),
            "{top}"
        );
        let ins = run(&["inspect", "--json", "--run", "a"]);
        assert_eq!(
            ins.json()["tasks"]["completed"],
            knary::expected_tasks(4, 3).unwrap(),
            "{ins}"
        );
    }
    knary(&["run", "--depth", "2", "--fanout", "2", "--run", "../x"])
        .expect_code(2)
        .stderr_has("run name \"../x\"");
}

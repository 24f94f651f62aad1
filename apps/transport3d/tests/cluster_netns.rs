//! Issue 16.3: transport3d `--mode async` (paper 000's asynchronous iterations) across hosts
//! with a real network. Seven network namespaces, each a host with its own address
//! (`veriflow_testkit::netns`), 5 ms one-way latency and 1 % packet loss between any two: the
//! checkpoint server and the client on host 0, the coordinator on host 1, four workers (one
//! block each, as paper 000's grid ran one per machine) and a spare on hosts 2-6. A worker is
//! SIGKILLed during the iterations; its block restarts on the spare from its neighbours'
//! backups and the answer is the sequential one. Root only: skips, saying why, when namespaces
//! cannot be made here.
//!
//! One block per worker matters: with two workers of two adjacent blocks each, the end block
//! v3 has its only backup neighbour v2 on the same worker, and losing that worker loses both
//! (a run here failed so, with the runtime's error naming v3 and saying to keep the backups on
//! a store: rule 6 of `veriflow::runtime::iterative`).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::samples;
use serde_json::Value;
use veriflow_testkit::netns::{available, NetConfig, Network};
use veriflow_testkit::{run_bin, s, wait_json_within, Cluster, ClusterOpts, LOADED_FD};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_transport3d"))
}

/// Bound of every wait: far above the job's seconds on a loaded machine.
const LIMIT: Duration = Duration::from_secs(180);

/// 4 slabs of a 24³ grid, 20 steps of 120 s (the loopback cluster test's grid): about a second
/// on loopback, some 20 s across these hosts (measured: 40 steps took 39 s, 2.2 million
/// packets), so the worker dies well inside the iterations.
const GRID: [&str; 14] = [
    "--nx", "24", "--ny", "24", "--nz", "24", "--blocks", "4", "--dt", "120", "--t-end", "2400",
    "--tol", "1e-8",
];
const STEPS: u64 = 20;

/// Agreement within the solver tolerance (as in `iterative.rs`).
const AGREE: f64 = 10.0 * 1e-8;

#[test]
fn transport3d_async_across_hosts_with_latency_and_loss_survives_a_killed_worker() {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return;
    }
    // The answer, from a sequential-order (sync) run in this process's own network.
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["run", "--mode", "sync", "--json"];
    args.extend_from_slice(&GRID);
    let out = run_bin(bin(), tmp.path(), &args);
    out.expect_code(0);
    let want = samples(&out.json());

    let net = Arc::new(
        Network::create(&NetConfig {
            hosts: 7,
            latency: Duration::from_millis(5),
            loss: 0.01,
            seed: 3,
        })
        .expect("a network of 7 hosts"),
    );
    let c = Cluster::start_with(
        bin(),
        ClusterOpts {
            net: Some(net.clone()),
            workers: 4,
            spares: 1,
            coordinator_args: LOADED_FD.iter().map(|a| a.to_string()).collect(),
            ..ClusterOpts::default()
        },
    );
    // One block per worker (above) only if every worker has joined when the job starts: a
    // job takes the workers there are, and under load the fourth once joined after the start
    // (4 vnodes on 3 workers; it then joined the running job hosting nothing, and the job
    // hung after the kill: a system bug of its own, open, see the commit).
    c.status_until("4 workers and a spare", LIMIT, |v| {
        v["workers"].as_array().map(Vec::len) == Some(5)
    });
    let mut job = vec!["--mode", "async"];
    job.extend_from_slice(&GRID);
    let run = c.submit(&job);
    let t0 = Instant::now();
    loop {
        let out = c.run(&[
            "status",
            "--coordinator",
            &c.addr,
            "--key",
            s(&c.key),
            "--json",
        ]);
        out.expect_code(0);
        if out.json()["jobs"][0]["state"] == "running" {
            break;
        }
        assert!(t0.elapsed() < LIMIT, "the job did not start: {out}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Into the iterations, not at their start.
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    c.workers[1].signal("-KILL");

    let (code, j, err) = wait_json_within(run, LIMIT, "transport3d across hosts");
    assert_eq!(code, 0, "{err}");
    assert_eq!(j["correct"], Value::Bool(true), "{j}");
    assert_eq!(j["failures"], 1, "the killed worker: {j}");
    assert_eq!(j["steps"], STEPS, "{j}");
    let got = samples(&j);
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= AGREE * b.abs(), "{a} vs {b}");
    }
    eprintln!(
        "async job: {} s across hosts, {} worker lost; kill to the job's end: {:.1} s",
        j["elapsed_s"],
        j["failures"],
        killed.elapsed().as_secs_f64()
    );
    eprintln!("network: {}", net.describe());
    if let Some(w) = net.wire_stats() {
        assert!(w.forwarded > 100, "the members talked over the wire: {w:?}");
    }
}

//! Issue 16.3: knary across hosts with a real network. Six network namespaces, each a host
//! with its own address (`veriflow_testkit::netns`), 5 ms one-way latency and 1 % packet loss
//! between any two: the checkpoint server and the client on host 0, the coordinator on host
//! 1, three workers and a spare on hosts 2-5. A worker is SIGKILLed mid-run: the result is
//! right, and the log holds each task declared, started and completed once. Root only: skips,
//! saying why, when namespaces cannot be made here.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use veriflow_testkit::netns::{available, NetConfig, Network};
use veriflow_testkit::{s, wait_json_within, Cluster, ClusterOpts, LOADED_FD};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_knary"))
}

/// Bound of every wait: far above the job's seconds on a loaded machine.
const LIMIT: Duration = Duration::from_secs(180);

/// 5,461 tasks, 4,096 leaves of 3 ms over three 1-thread workers: about 4 s of work each, long
/// enough to still run when the worker is killed.
const PROGRAM: [&str; 6] = ["--depth", "7", "--fanout", "4", "--grain-us", "3000"];

#[test]
fn a_knary_job_across_hosts_with_latency_and_loss_survives_a_killed_worker() {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return;
    }
    let net = Arc::new(
        Network::create(&NetConfig {
            hosts: 6,
            latency: Duration::from_millis(5),
            loss: 0.01,
            seed: 16,
        })
        .expect("a network of 6 hosts"),
    );
    let c = Cluster::start_with(
        bin(),
        ClusterOpts {
            net: Some(net.clone()),
            workers: 3,
            spares: 1,
            coordinator_args: LOADED_FD.iter().map(|a| a.to_string()).collect(),
            ..ClusterOpts::default()
        },
    );
    assert!(c.addr.starts_with("198.18.0.2:"), "{}", c.addr);
    assert!(c.store.contains("198.18.0.1:"), "{}", c.store);
    let v = c.status_until("4 workers", LIMIT, |v| {
        v["workers"].as_array().map(Vec::len) == Some(4)
    });
    // Each worker listens on its own host's address.
    let mut hosts: Vec<String> = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let a = w["addr"].as_str().unwrap_or_else(|| panic!("{v}"));
            a.rsplit_once(':').unwrap().0.to_string()
        })
        .collect();
    hosts.sort();
    assert_eq!(
        hosts,
        ["198.18.0.3", "198.18.0.4", "198.18.0.5", "198.18.0.6"],
        "{v}"
    );

    let run = c.submit(&PROGRAM);
    c.status_until("the job running with progress", LIMIT, |v| {
        v["jobs"][0]["state"] == "running" && v["jobs"][0]["tasks_completed"].as_u64() > Some(0)
    });
    let killed = Instant::now();
    c.workers[1].signal("-KILL");

    let (code, v, err) = wait_json_within(run, LIMIT, "the job across hosts");
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["correct"], true, "{v}");
    assert_eq!(v["result"], knary::expected_nodes(7, 4).unwrap(), "{v}");
    assert_eq!(v["tasks"], knary::expected_tasks(7, 4).unwrap(), "{v}");
    assert_eq!(v["failures"], 1, "the killed worker: {v}");
    eprintln!(
        "job: {} s across hosts, {} worker lost; kill to the job's end: {:.1} s",
        v["elapsed_s"],
        v["failures"],
        killed.elapsed().as_secs_f64()
    );

    // The final log, read from the client's host: each task declared, started and completed
    // once.
    let inspect = c.run(&[
        "inspect",
        "--store",
        &c.store,
        "--key",
        s(&c.key),
        "--run",
        "job-1",
        "--json",
    ]);
    inspect.expect_code(0);
    let i = inspect.json();
    let want = knary::expected_tasks(7, 4).unwrap();
    for k in ["declared", "started", "completed"] {
        assert_eq!(i["tasks"][k], want, "{k}: each task once\n{i}");
    }
    eprintln!("network: {}", net.describe());
    if let Some(w) = net.wire_stats() {
        assert!(
            w.forwarded > 1000,
            "the members talked over the wire: {w:?}"
        );
        assert!(w.dropped > 0, "1 % of the packets lost: {w:?}");
    }
}

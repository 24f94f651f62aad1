//! `knary status` against a real cluster: the coordinator's snapshot with no job, with a job
//! running, after a worker is killed, and after the job; and its errors.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use veriflow_testkit::{wait_json_within, Cluster};

/// Longest wait for a status to show what a test waits for.
const LIMIT: Duration = Duration::from_secs(60);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_knary"))
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("an array: {v}"))
        .iter()
        .map(|w| w["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn status_shows_the_job_workers_map_and_a_killed_worker_then_the_jobs_end() {
    let c = Cluster::start(bin(), 3, 0, &[]);
    // No job yet: the workers as they join.
    let v = c.status_until("3 workers", LIMIT, |v| {
        v["workers"].as_array().map(Vec::len) == Some(3)
    });
    assert_eq!(v["role"], "active", "{v}");
    assert_eq!(v["jobs"], serde_json::json!([]), "{v}");
    for w in v["workers"].as_array().unwrap() {
        assert_eq!(w["program"], "knary", "{v}");
        assert_eq!(w["job"], Value::Null, "{v}");
        assert_eq!(w["threads"], 1, "{v}");
        assert_eq!(w["spare"], false, "{v}");
        assert_eq!(w["detector"], "alive", "{v}");
        assert!(w["addr"].as_str().unwrap().starts_with("127.0.0.1:"), "{v}");
        assert!(w["last_heard_ago_s"].as_f64().unwrap() < 5.0, "{v}");
    }

    // A job long enough to be seen running, and still running when a worker is killed
    // (87381 tasks of 1 ms over 3 workers).
    let run = c.submit(&["--depth", "8", "--fanout", "4", "--grain-us", "1000"]);
    let v = c.status_until("a running job with progress", LIMIT, |v| {
        v["jobs"][0]["state"] == "running" && v["jobs"][0]["tasks_completed"].as_u64() > Some(0)
    });
    let job = &v["jobs"][0];
    assert_eq!(job["id"], 1, "{v}");
    assert_eq!(job["program"], "knary", "{v}");
    assert_eq!(job["run"], "job-1", "{v}");
    assert_eq!(job["argv"][0], "submit", "{v}");
    assert!(
        job["argv"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--depth"),
        "{v}"
    );
    assert_eq!(job["vnodes"], 3, "{v}");
    assert_eq!(job["members"], serde_json::json!([1, 2, 3]), "{v}");
    assert!(job["tasks_per_s"].as_f64().unwrap() > 0.0, "{v}");
    assert!(job["elapsed_s"].as_f64().unwrap() > 0.0, "{v}");
    let map = job["map"].as_array().unwrap();
    assert_eq!(map.len(), 3, "{v}");
    for (i, m) in map.iter().enumerate() {
        assert_eq!(m["vnode"], i, "{v}");
        assert_eq!(m["epoch"], 0, "{v}");
    }
    let hosted: u64 = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["vnodes"].as_u64().unwrap())
        .sum();
    assert_eq!(hosted, 3, "{v}");
    assert!(
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["job"] == 1),
        "{v}"
    );
    assert_eq!(job["failures"], serde_json::json!([]), "{v}");

    // The table says the same for people.
    let table = knary(&[
        "status",
        "--coordinator",
        &c.coordinator_addrs[0],
        "--key",
        s(&c.key),
    ]);
    table.expect_code(0);
    assert!(table.stdout.contains("job 1 (knary): running"), "{table}");
    assert!(table.stdout.contains("vnode map of job 1"), "{table}");

    // A worker killed: the failure shows, its vnode moved at a new epoch.
    c.workers[1].signal("-KILL");
    let v = c.status_until("a failure", LIMIT, |v| {
        v["jobs"][0]["failures"].as_array().map(Vec::len) == Some(1)
    });
    let job = &v["jobs"][0];
    let lost = job["failures"][0]["worker"].as_u64().unwrap();
    assert!(!ids(&v["workers"]).contains(&lost), "{v}");
    assert_eq!(job["workers_lost"], 1, "{v}");
    assert_eq!(v["gone"], serde_json::json!([lost]), "{v}");
    let map = job["map"].as_array().unwrap();
    assert!(map.iter().all(|m| m["worker"] != lost), "{v}");
    assert!(map.iter().any(|m| m["epoch"] == 1), "{v}");

    // After the job: its summary.
    let (code, done, err) = wait_json_within(run, Duration::from_secs(120), "submit");
    assert_eq!(code, 0, "{err}");
    let v = c.status();
    let job = &v["jobs"][0];
    assert_eq!(v["jobs"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(job["id"], 1, "{v}");
    assert_eq!(job["state"], "finished", "{v}");
    assert_eq!(job["tasks_completed"], done["tasks"], "{v}");
    assert_eq!(job["workers_lost"], 1, "{v}");
    assert_eq!(job["map"], serde_json::json!([]), "{v}");
}

#[test]
fn status_with_a_wrong_key_or_no_coordinator_fails_with_a_clear_error() {
    let c = Cluster::start(bin(), 1, 0, &[]);
    let other = c.dir.path().join("other.key");
    knary(&["keygen", s(&other)]).expect_code(0);
    knary(&[
        "status",
        "--coordinator",
        &c.coordinator_addrs[0],
        "--key",
        s(&other),
    ])
    .expect_code(1)
    .stderr_has("error");
    // A port that refuses every connection (held: no other test's server can take it).
    let free = veriflow_testkit::RefusingPort::new();
    knary(&["status", "--coordinator", &free.addr, "--key", s(&c.key)])
        .expect_code(1)
        .stderr_has(&free.addr);
    // Usage errors are clap's.
    knary(&["status", "--key", s(&c.key)]).expect_code(2);
}

/// Issue 18 point 6 (wire.rs rule 2a): a client that reaches another kind of veriflow server
/// says what it reached, and fails at once instead of retrying: `status` and a worker given a
/// checkpoint server's address, a run given a coordinator's address as its store.
#[test]
fn a_client_at_the_wrong_kind_of_server_says_what_it_reached() {
    let c = Cluster::start(bin(), 1, 0, &[]);
    let server = c
        .store
        .strip_prefix("central:")
        .expect("a central store")
        .to_string();
    let coordinator = &c.coordinator_addrs[0];
    knary(&["status", "--coordinator", &server, "--key", s(&c.key)])
        .expect_code(1)
        .stderr_has(&format!(
            "{server} is a checkpoint server, not a coordinator"
        ));
    knary(&["worker", "--join", &server, "--key", s(&c.key)])
        .expect_code(1)
        .stderr_has(&format!(
            "{server} is a checkpoint server, not a coordinator"
        ));
    knary(&[
        "run",
        "--depth",
        "2",
        "--fanout",
        "2",
        "--store",
        &format!("central:{coordinator}"),
        "--key",
        s(&c.key),
    ])
    .expect_code(1)
    .stderr_has(&format!(
        "{coordinator} is a coordinator, not a checkpoint server"
    ));
}

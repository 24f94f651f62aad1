//! Cluster mode with real processes on loopback: `knary cluster`, and a coordinator, workers
//! and `submit` started one by one so that the tests can SIGKILL, SIGSTOP and SIGCONT them.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use veriflow_testkit::{wait_json, Cluster, ClusterOpts};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_knary"))
}

/// Waits until every worker has joined (the submit waits itself; this only paces kills).
fn settle() {
    std::thread::sleep(Duration::from_millis(300));
}

const PROGRAM: [&str; 6] = ["--depth", "7", "--fanout", "4", "--grain-us", "400"];

fn expect_right(v: &Value, ctx: &str) {
    assert_eq!(v["correct"], true, "{ctx}: {v}");
    assert_eq!(
        v["result"],
        knary::expected_nodes(7, 4).unwrap(),
        "{ctx}: {v}"
    );
    // No completed task ran twice: the tasks completed over all members are the program's.
    assert_eq!(
        v["tasks"],
        knary::expected_tasks(7, 4).unwrap(),
        "{ctx}: {v}"
    );
}

#[test]
fn knary_cluster_gives_the_embedded_result_with_and_without_kills() {
    let embedded = knary(&["run", "--depth", "6", "--fanout", "5", "--json"]).json();
    // The servers' default engine (fjall), and sled's, each read back by a recovery.
    let sled = [
        "--kill-random",
        "1",
        "--seed",
        "4",
        "--server-engine",
        "local",
    ];
    for extra in [
        &[][..],
        &["--kill-random", "1", "--seed", "4"][..],
        &sled[..],
    ] {
        let mut args = vec![
            "cluster",
            "--workers",
            "4",
            "--depth",
            "6",
            "--fanout",
            "5",
            "--grain-us",
            "200",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = knary(&args);
        out.expect_code(0);
        let j = out.json();
        assert_eq!(j["result"], embedded["result"], "{out}");
        assert_eq!(j["tasks"], embedded["tasks"], "{out}");
        assert_eq!(j["workers"], 4);
        if !extra.is_empty() {
            assert_eq!(j["failures"], 1, "{out}");
        }
    }
}

#[test]
fn a_worker_killed_mid_run_is_recovered_and_no_completed_task_runs_again() {
    let c = Cluster::start(bin(), 4, 0, &[]);
    settle();
    let run = c.submit(&PROGRAM);
    // Killed once the members have made work durable (a fixed 500 ms under load sometimes
    // found the victim's vnode with nothing completed yet: nothing to reuse).
    c.status_until(
        "a fifth of the tasks completed",
        Duration::from_secs(120),
        |v| {
            v["jobs"][0]["tasks_completed"].as_u64()
                > Some(knary::expected_tasks(7, 4).unwrap() / 5)
        },
    );
    c.workers[2].signal("-KILL");
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_right(&v, "one kill");
    assert_eq!(v["failures"], 1, "{v}");
    assert!(
        v["reused_tasks"].as_u64().unwrap() > 0,
        "the lost vnode's completed tasks are reused: {v}"
    );
}

#[test]
fn two_workers_killed_at_once_and_a_kill_during_recovery() {
    // Two at once.
    let c = Cluster::start(bin(), 4, 0, &[]);
    settle();
    let run = c.submit(&PROGRAM);
    std::thread::sleep(Duration::from_millis(500));
    c.workers[1].signal("-KILL");
    c.workers[3].signal("-KILL");
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_right(&v, "two at once");
    assert_eq!(v["failures"], 2, "{v}");

    // A spare takes the first victim's vnodes and is killed while it recovers them; they move
    // again to a live worker.
    let c = Cluster::start(bin(), 3, 1, &[]);
    settle();
    let run = c.submit(&PROGRAM);
    std::thread::sleep(Duration::from_millis(500));
    c.workers[0].signal("-KILL");
    std::thread::sleep(Duration::from_millis(30));
    c.workers[3].signal("-KILL"); // the spare
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_right(&v, "kill during recovery");
    assert_eq!(v["failures"], 2, "{v}");
}

#[test]
fn a_short_sigstop_is_tolerated_and_a_long_one_is_a_failure_whose_late_messages_are_ignored() {
    // Bound: 200 + 400 + 400 ms = 1 s.
    let fd = [
        "--fd-interval-ms",
        "200",
        "--fd-timeout-ms",
        "400",
        "--fd-broken-ms",
        "400",
    ];
    let c = Cluster::start(bin(), 3, 0, &fd);
    settle();
    let run = c.submit(&PROGRAM);
    std::thread::sleep(Duration::from_millis(300));
    c.workers[1].signal("-STOP");
    std::thread::sleep(Duration::from_millis(300)); // well under the bound
    c.workers[1].signal("-CONT");
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_right(&v, "short stop");
    assert_eq!(v["failures"], 0, "a short stop is not a failure: {v}");

    let c = Cluster::start(bin(), 3, 0, &fd);
    settle();
    let run = c.submit(&PROGRAM);
    std::thread::sleep(Duration::from_millis(300));
    c.workers[1].signal("-STOP");
    // Far over the bound: declared failed, its vnodes move.
    std::thread::sleep(Duration::from_millis(2500));
    c.workers[1].signal("-CONT");
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_right(&v, "long stop");
    assert_eq!(v["failures"], 1, "{v}");
}

#[test]
fn bad_clients_are_refused_and_the_cluster_goes_on() {
    let c = Cluster::start(bin(), 2, 0, &[]);
    // No key: a plain TCP client sending garbage, then one claiming a huge frame.
    use std::io::Write as _;
    for payload in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0xff, 0xff, 0xff, 0x7f][..],
    ] {
        let mut s = std::net::TcpStream::connect(&c.addr).unwrap();
        let _ = s.write_all(payload);
        drop(s);
    }
    // A client with another key.
    let other = c.dir.path().join("other.key");
    knary(&["keygen", s(&other)]).expect_code(0);
    let out = knary(&[
        "submit",
        "--coordinator",
        &c.addr,
        "--key",
        s(&other),
        "--depth",
        "2",
        "--fanout",
        "2",
    ]);
    out.expect_code(1).stderr_has("key");
    // The cluster still runs a job.
    let run = c.submit(&["--depth", "5", "--fanout", "3"]);
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["correct"], true);
}

/// Issue 18.1: a job submitted while another runs waits in the coordinator's queue (and is
/// told so), then runs; each job logs under its own run `job-N` of the one store
/// (`veriflow_cluster::job_store`), and is inspected and certified by that name. (A second
/// submit was refused before: "already holds a run", or "running another job".)
#[test]
fn a_second_job_waits_its_turn_and_each_logs_apart_in_one_store() {
    let c = Cluster::start(bin(), 2, 0, &[]);
    // About 4 s of work on two workers, then a small job submitted while it runs.
    let shapes = [(7u32, 4u32, "400"), (4, 4, "0")];
    let runs: Vec<_> = shapes
        .iter()
        .map(|(depth, fanout, grain)| {
            let (d, k) = (depth.to_string(), fanout.to_string());
            let run = c.submit(&["--depth", &d, "--fanout", &k, "--grain-us", grain]);
            settle();
            run
        })
        .collect();
    let mut queued = 0;
    let mut names = Vec::new();
    for (run, (depth, fanout, _)) in runs.into_iter().zip(shapes) {
        let (code, v, err) = wait_json(run);
        assert_eq!(code, 0, "{err}");
        assert_eq!(v["correct"], true, "{v}");
        assert_eq!(
            v["tasks"],
            knary::expected_tasks(depth, fanout).unwrap(),
            "{v}"
        );
        queued += usize::from(err.contains("cluster: job 2 queued behind 1 job(s)"));
        names.push((v["run"].as_str().unwrap().to_string(), depth, fanout));
    }
    assert_eq!(
        queued, 1,
        "the job submitted second waited for the first: {names:?}"
    );
    let mut sorted: Vec<&str> = names.iter().map(|(n, ..)| n.as_str()).collect();
    sorted.sort_unstable();
    assert_eq!(sorted, ["job-1", "job-2"]);
    let key = s(&c.key);
    let at = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--store", &c.store, "--key", key]);
        knary(&all)
    };
    at(&["inspect"])
        .expect_code(2)
        .stderr_has("holds named runs only: choose one with --run NAME (job-1, job-2)");
    let okey = c.dir.path().join("oracle.key");
    knary(&["keygen", s(&okey)]).expect_code(0);
    for (run, depth, fanout) in &names {
        let ins = at(&["inspect", "--json", "--run", run]);
        ins.expect_code(0);
        let want = knary::expected_tasks(*depth, *fanout).unwrap();
        assert_eq!(ins.json()["tasks"]["completed"], want, "{run}: {ins}");
        let cert = at(&["certify", "--oracle-key", s(&okey), "--run", run]);
        cert.expect_code(0);
        assert!(cert.stdout.contains("ACCEPT"), "{run}: {cert}");
    }
}

#[test]
fn unreachable_coordinator_is_a_clear_error_after_retries() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k");
    knary(&["keygen", s(&key)]).expect_code(0);
    // A port that refuses every connection (held: no other test's server can take it).
    let port = veriflow_testkit::RefusingPort::new();
    let addr = port.addr.clone();
    knary(&["worker", "--join", &addr, "--key", s(&key)])
        .expect_code(1)
        .stderr_has("unreachable after");
    knary(&[
        "submit",
        "--coordinator",
        &addr,
        "--key",
        s(&key),
        "--depth",
        "2",
        "--fanout",
        "2",
    ])
    .expect_code(1)
    .stderr_has(&addr);
}

/// Issue 13: the coordinator accepted a `local:` store that only one process can use (the
/// workers would each open their own directory, and recovery would find no log).
#[test]
fn a_coordinator_refuses_a_store_only_one_process_can_use() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k");
    knary(&["keygen", s(&key)]).expect_code(0);
    let local = format!("local:{}", dir.path().join("logs").display());
    for store in [local.as_str(), "memory"] {
        knary(&["coordinator", "--key", s(&key), "--store", store])
            .expect_code(2)
            .stderr_has("needs checkpoint servers every worker reaches");
    }
    assert!(!dir.path().join("logs").exists(), "nothing was created");
}

/// Issue 15: the active coordinator SIGKILLed mid-run; its standby takes the job over from
/// the journal, the workers come back to it, and `submit` follows the job there.
#[test]
fn the_active_coordinator_killed_mid_run_is_replaced_by_its_standby() {
    let c = Cluster::start_with(
        bin(),
        ClusterOpts {
            workers: 3,
            coordinators: 2,
            ..ClusterOpts::default()
        },
    );
    settle();
    let run = c.submit(&PROGRAM);
    std::thread::sleep(Duration::from_millis(600));
    c.coordinators[0].signal("-KILL");
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_right(&v, "coordinator killed");
    assert!(
        err.contains(&format!(
            "coordinator {} took the job over",
            c.coordinator_addrs[1]
        )),
        "{err}"
    );
    assert_eq!(v["failures"], 0, "every worker came back: {v}");
}

/// Issue 15: a coordinator and a worker killed at once; a restarted coordinator on the same
/// address (no standby) takes the job back from the journal, and the lost worker's vnodes move.
#[test]
fn a_restarted_coordinator_takes_its_job_back_and_moves_a_worker_lost_meanwhile() {
    let mut c = Cluster::start_with(
        bin(),
        ClusterOpts {
            workers: 3,
            coordinators: 1,
            coordinator_args: vec!["--lease-ms".into(), "500".into()],
            ..ClusterOpts::default()
        },
    );
    settle();
    let run = c.submit(&PROGRAM);
    std::thread::sleep(Duration::from_millis(600));
    c.coordinators[0].signal("-KILL");
    c.workers[1].signal("-KILL");
    // Its listening socket is closed only once it has exited: binding its address again
    // before that fails (under load, a SIGKILLed process can take longer than 200 ms to go).
    c.coordinators[0]
        .0
        .wait()
        .expect("the killed coordinator exits");
    std::thread::sleep(Duration::from_millis(200));
    let addr = c.coordinator_addrs[0].clone();
    let args = ["--lease-ms".to_string(), "500".to_string()];
    let (again, _) = c.start_coordinator(&addr, &args, true);
    c.coordinators.push(again);
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_right(&v, "coordinator restarted");
    assert_eq!(v["failures"], 1, "{v}");
    assert!(err.contains("took the job over"), "{err}");
}

/// Issue 15 point 4: a coordinator SIGSTOPped past its lease is replaced; when it wakes it
/// finds the newer term and steps down (exit 1) without touching the job.
#[test]
fn a_coordinator_paused_past_its_lease_is_deposed_when_it_wakes() {
    let mut c = Cluster::start_with(
        bin(),
        ClusterOpts {
            workers: 3,
            coordinators: 2,
            coordinator_args: vec!["--lease-ms".into(), "600".into()],
            ..ClusterOpts::default()
        },
    );
    settle();
    let run = c.submit(&PROGRAM);
    std::thread::sleep(Duration::from_millis(500));
    c.coordinators[0].signal("-STOP");
    std::thread::sleep(Duration::from_millis(3000));
    c.coordinators[0].signal("-CONT");
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_right(&v, "coordinator paused");
    // The woken one steps down with a message.
    let old = &mut c.coordinators[0].0;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = old.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the deposed coordinator still runs"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(1));
    let log = std::fs::read_to_string(c.dir.path().join("coord0.log")).unwrap();
    assert!(log.contains("stepped down"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// Found by the chaos run: a standby that could not read the store for a moment (checkpoint
/// servers killed and paused beyond what `ida:4,2` tolerates) exited with the store's error,
/// and the job was lost with the next coordinator kill. A standby rides the outage out, and
/// the cluster runs a job once the store is back.
#[test]
fn a_standby_waits_out_a_store_it_cannot_read_and_the_cluster_runs_after() {
    let mut c = Cluster::start_with(
        bin(),
        ClusterOpts {
            workers: 2,
            coordinators: 2,
            coordinator_args: vec!["--lease-ms".into(), "500".into()],
            worker_args: vec!["--rejoin-patience".into(), "60".into()],
            ..ClusterOpts::default()
        },
    );
    settle();
    c.servers[0].kill();
    let log = c.dir.path().join("coord1.log");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("standby cannot read the store")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the standby never said it cannot read the store: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        c.coordinators[1].0.try_wait().unwrap().is_none(),
        "the standby exited during the outage: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    c.servers[0]
        .restart()
        .expect("the checkpoint server restarts");
    let run = c.submit(&PROGRAM);
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_right(&v, "after a store outage");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(log.contains("the store answers again"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// Issue 15 point 5: SIGKILL of the only coordinator while workers are idle made every worker
/// panic ("Cannot drop a runtime in a context where blocking is not allowed"). They look for
/// a successor for their patience, then exit 1 with a message.
#[test]
fn workers_whose_only_coordinator_dies_exit_with_a_message_not_a_panic() {
    let mut c = Cluster::start_with(
        bin(),
        ClusterOpts {
            workers: 2,
            coordinators: 1,
            worker_args: vec!["--rejoin-patience".into(), "2".into()],
            ..ClusterOpts::default()
        },
    );
    settle();
    c.coordinators[0].signal("-KILL");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for (i, w) in c.workers.iter_mut().enumerate() {
        let status = loop {
            if let Some(s) = w.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "worker {i} still runs"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = std::fs::read_to_string(c.dir.path().join(format!("w{i}.log"))).unwrap();
        assert_eq!(status.code(), Some(1), "{log}");
        assert!(!log.contains("panicked"), "{log}");
        assert!(
            log.contains("no coordinator took this worker back"),
            "{log}"
        );
    }
}

/// Issue 15 point 3 with a short budget: jobs on real processes while workers, checkpoint
/// servers and coordinators are killed and paused; every job right and certified.
#[test]
fn chaos_with_a_short_budget_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("chaos.json");
    let out = knary(&[
        "chaos",
        "--seconds",
        "25",
        "--seed",
        "3",
        "--workers",
        "4",
        "--fault-every",
        "1,2",
        "--report",
        s(&report),
    ]);
    out.expect_code(0);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["all_right"], true, "{r}");
    assert!(r["jobs"].as_u64().unwrap() >= 1, "{r}");
    assert!(r["faults"]["kills"].as_u64().unwrap() >= 5, "{r}");
    assert_eq!(r["jobs"], r["jobs_right"], "{r}");
}

/// Issue 16: `--kill-every MS` kills one worker every MS ms of the running job, and
/// `--replace` starts a successor for each, which joins the running job and takes the vnodes
/// of the next worker lost. Three kills of three workers: without successors the last kill
/// would leave nobody to finish the job. The job (5,461 nodes of 800 µs on 2 cores, about
/// 2.5 s) outlasts the three kills (the last 900 ms after the first progress report) with
/// room: at 400 µs a job of 1.2-1.4 s ended before the third kill of 400 ms periods.
#[test]
fn kill_every_kills_on_a_clock_and_replace_keeps_the_cluster_alive() {
    let out = knary(&[
        "cluster",
        "--workers",
        "3",
        "--depth",
        "7",
        "--fanout",
        "4",
        "--grain-us",
        "800",
        "--kill-random",
        "3",
        "--kill-every",
        "300",
        "--replace",
        "--seed",
        "5",
        "--json",
    ]);
    out.expect_code(0);
    let j = out.json();
    expect_right(&j, "a kill every 300 ms, replaced");
    assert_eq!(j["failures"], 3, "{out}");
    assert!(j["recovered_tasks"].as_u64().is_some(), "{out}");
    // The coordinator's counters come with the summary.
    let c = &j["coordinator"];
    assert!(c["probe_rounds"].as_u64() > Some(0), "{out}");
    assert!(c["heartbeats_in"].as_u64() > Some(0), "{out}");
    assert!(c["worker_heartbeats"].as_u64() > Some(0), "{out}");
    assert!(c["detection_ms"].as_f64().is_some(), "{out}");

    // Pacing kills that were not asked for is a usage error.
    knary(&[
        "cluster",
        "--kill-every",
        "100",
        "--depth",
        "3",
        "--fanout",
        "2",
    ])
    .expect_code(2);
}

/// Issue 16: `cluster`'s checkpoint servers take a connection from every process: 66 workers
/// and a coordinator, all from 127.0.0.1, passed the default cap of 64 per peer address.
#[test]
fn a_cluster_of_more_processes_than_the_servers_default_cap_per_address_runs() {
    let out = knary(&[
        "cluster",
        "--workers",
        "66",
        "--vnodes",
        "132",
        "--depth",
        "5",
        "--fanout",
        "3",
        "--json",
    ]);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["correct"], true, "{out}");
    assert_eq!(j["workers"], 66, "{out}");
    assert_eq!(j["tasks"], knary::expected_tasks(5, 3).unwrap(), "{out}");
}

//! Cluster mode with real processes on loopback, on 4 workers: `nqueens cluster` with a worker
//! SIGKILLed at a seeded point of the progress, and a coordinator, workers and `submit`
//! started one by one ([`veriflow_testkit::Cluster`]) so that the test SIGKILLs workers itself.
//! The count is exact, and the tasks completed over all members are the program's: no
//! completed task ran twice.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use veriflow_testkit::{wait_json, Cluster};

/// n = 16 split into 3 rows: 14,772,512 solutions, about 4 CPU-s in some 1,250 tasks, so
/// that a kill half a second in lands mid-run.
const PROGRAM: [&str; 4] = ["--n", "16", "--split-rows", "3"];

fn program() -> nqueens::NQueens {
    nqueens::NQueens {
        n: 16,
        split_rows: Some(3),
        cutoff_row: None,
        no_mirror: false,
    }
}

fn expect_exact(v: &Value, ctx: &str) {
    assert_eq!(v["correct"], true, "{ctx}: {v}");
    assert_eq!(v["result"], 14_772_512u64, "{ctx}: {v}");
    assert_eq!(v["tasks"], tasks_of(&program()), "{ctx}: {v}");
}

#[test]
fn nqueens_cluster_on_4_workers_with_and_without_a_kill() {
    for kill in [false, true] {
        let mut args = vec!["cluster", "--workers", "4", "--json", "--seed", "3"];
        args.extend_from_slice(&PROGRAM);
        if kill {
            args.extend_from_slice(&["--kill-random", "1"]);
        }
        let out = nqueens(&args);
        out.expect_code(0);
        let j = out.json();
        expect_exact(&j, &out.cmd());
        assert_eq!(j["workers"], 4, "{out}");
        assert_eq!(j["failures"], u64::from(kill), "{out}");
        assert!(j["events"].as_u64().unwrap() > 0, "{out}");
    }
}

#[test]
fn workers_sigkilled_mid_run_are_recovered_with_the_exact_count() {
    // One worker of four.
    let c = Cluster::start(bin(), 4, 0, &[]);
    std::thread::sleep(Duration::from_millis(300)); // the workers join
    let run = c.submit(&PROGRAM);
    std::thread::sleep(Duration::from_millis(500));
    c.workers[2].signal("-KILL");
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_exact(&v, "one kill");
    assert_eq!(v["failures"], 1, "{v}");
    assert!(
        v["reused_tasks"].as_u64().unwrap() > 0,
        "the lost vnode's completed tasks are reused: {v}"
    );

    // Two of four at once, and a third a moment later: the last worker finishes the job.
    let c = Cluster::start(bin(), 4, 0, &[]);
    std::thread::sleep(Duration::from_millis(300));
    let run = c.submit(&PROGRAM);
    std::thread::sleep(Duration::from_millis(400));
    c.workers[0].signal("-KILL");
    c.workers[3].signal("-KILL");
    std::thread::sleep(Duration::from_millis(300));
    c.workers[1].signal("-KILL");
    let (code, v, err) = wait_json(run);
    assert_eq!(code, 0, "{err}");
    expect_exact(&v, "three kills");
    assert_eq!(v["failures"], 3, "{v}");
}

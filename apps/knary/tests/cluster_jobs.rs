//! Many jobs and programs on one coordinator (issue 18.1, `coordinator` rules 2 and 12), with
//! real processes on loopback: knary and nqueens workers joined to one coordinator run a job
//! of each at once; `jobs` lists them; `job cancel` stops a running job, whose submitter then
//! fails and whose run is never recorded as finished.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use veriflow_testkit::{app_binary, wait_json_within, Cluster};

const LIMIT: Duration = Duration::from_secs(120);

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_knary"))
}

/// The jobs of a status in a given state.
fn in_state<'a>(v: &'a Value, state: &str) -> Vec<&'a Value> {
    v["jobs"]
        .as_array()
        .map(|j| j.iter().filter(|j| j["state"] == state).collect())
        .unwrap_or_default()
}

#[test]
fn two_programs_run_at_once_on_one_coordinator_and_a_running_job_is_cancelled() {
    let mut c = Cluster::start(bin(), 2, 0, &[]);
    let nqueens = app_binary("nqueens");
    c.add_worker_of(&nqueens, false);
    c.add_worker_of(&nqueens, false);
    c.status_until("4 workers of two programs", LIMIT, |v| {
        v["workers"].as_array().map(Vec::len) == Some(4)
    });
    // About 4 s of knary on its two workers, and a few seconds of N-Queens on the others.
    let knary_run = c.submit(&["--depth", "7", "--fanout", "4", "--grain-us", "400"]);
    let nqueens_run = c.submit_of(&nqueens, &["-n", "15", "--split-rows", "3"]);
    let v = c.status_until("both jobs running at once", LIMIT, |v| {
        in_state(v, "running").len() == 2
    });
    let mut programs: Vec<&str> = in_state(&v, "running")
        .iter()
        .map(|j| j["program"].as_str().unwrap())
        .collect();
    programs.sort_unstable();
    assert_eq!(programs, ["knary", "nqueens"], "{v}");
    for w in v["workers"].as_array().unwrap() {
        let job = v["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == w["job"])
            .unwrap_or_else(|| panic!("every worker is in a job: {v}"));
        assert_eq!(
            job["program"], w["program"],
            "a worker serves its program: {v}"
        );
    }
    for (run, program) in [(knary_run, "knary"), (nqueens_run, "nqueens")] {
        let (code, out, err) = wait_json_within(run, LIMIT, program);
        assert_eq!(code, 0, "{program}: {err}");
        assert_eq!(out["correct"], true, "{program}: {out}");
    }
    // `jobs` lists both, finished, by program and run name.
    let key = s(&c.key).to_string();
    let jobs = c.run(&["jobs", "--coordinator", &c.addr, "--key", &key, "--json"]);
    jobs.expect_code(0);
    let list = jobs.json();
    let ended: Vec<(String, String, String)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["program"].as_str().unwrap().to_string(),
                j["state"].as_str().unwrap().to_string(),
                j["run"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(ended.len(), 2, "{list}");
    assert!(
        ended.iter().all(|(_, state, _)| state == "finished"),
        "{list}"
    );
    let table = c.run(&["jobs", "--coordinator", &c.addr, "--key", &key]);
    table.expect_code(0);
    assert!(
        table.stdout.contains("nqueens") && table.stdout.contains("finished"),
        "{table}"
    );

    // A long knary job, cancelled while it runs: its submitter fails and says so, `jobs`
    // says cancelled, and its run stays unfinished in the store.
    let long = c.submit(&["--depth", "9", "--fanout", "4", "--grain-us", "400"]);
    let v = c.status_until("job 3 running", LIMIT, |v| {
        in_state(v, "running").iter().any(|j| j["id"] == 3)
    });
    assert_eq!(in_state(&v, "running").len(), 1, "{v}");
    let cancel = |id: &str| c.run(&["job", "cancel", id, "--coordinator", &c.addr, "--key", &key]);
    let cancelled = cancel("3");
    cancelled.expect_code(0);
    assert!(
        cancelled.stdout.contains("job 3 cancelled (running)"),
        "{cancelled}"
    );
    let (code, _, err) = wait_json_within(long, LIMIT, "the cancelled submit");
    assert_ne!(code, 0, "a cancelled job's submitter fails: {err}");
    assert!(err.contains("job 3 was cancelled by a client"), "{err}");
    let v = c.status();
    let job3 = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == 3)
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(job3["state"], "cancelled", "{v}");
    // Cancelling it again, or a job never submitted, is an error that says why.
    cancel("3")
        .expect_code(1)
        .stderr_has("job 3 has ended already (cancelled)");
    cancel("77").expect_code(1).stderr_has("knows no job 77");
    let ins = c.run(&[
        "inspect", "--json", "--store", &c.store, "--key", &key, "--run", "job-3",
    ]);
    ins.expect_code(0);
    let status = ins.json()["status"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        status.starts_with("Running"),
        "a cancelled run is never recorded as finished: {ins}"
    );
}

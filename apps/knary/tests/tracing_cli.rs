//! `VERIFLOW_LOG` says what veriflow does (issue 19.4): steals, group commits and, at trace
//! level, each task's start and end; the certifier's phases at info; sled's internals stay
//! out unless asked for. (The cluster's failures, epochs and takeovers are checked on the
//! coordinator's state machine, in `veriflow-cluster`.)

use std::path::Path;
use std::process::Command;

fn run_logged(filter: &str, tmp: &Path) -> String {
    let log = tmp.join("log");
    let out = Command::new(env!("CARGO_BIN_EXE_knary"))
        .args([
            "run",
            "--depth",
            "5",
            "--fanout",
            "3",
            "--threads",
            "2",
            "--vnodes",
            "2",
        ])
        .args(["--grain-us", "200"])
        .args(["--seed", "11", "--json", "--log-dir"])
        .arg(&log)
        .env("VERIFLOW_LOG", filter)
        .env("TMPDIR", tmp)
        .output()
        .expect("knary runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn debug_logs_steals_and_group_commits_and_trace_logs_tasks_but_not_sleds_internals() {
    let tmp = tempfile::tempdir().unwrap();
    let debug = run_logged("debug", tmp.path());
    assert!(debug.contains("group commit flushed"), "{debug}");
    assert!(debug.contains("steal granted"), "{debug}");
    assert!(debug.contains("task adopted"), "{debug}");
    assert!(
        !debug.contains("task started"),
        "trace lines at debug: {debug}"
    );
    assert!(
        !debug.lines().any(|l| l.contains(" sled::")),
        "sled's lines at debug: {debug}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let trace = run_logged("veriflow_runtime=trace", tmp.path());
    assert!(trace.contains("task started"), "{trace}");
    assert!(trace.contains("task completed"), "{trace}");
}

#[test]
fn info_logs_the_certifiers_phases() {
    let tmp = tempfile::tempdir().unwrap();
    let _ = run_logged("warn", tmp.path());
    let key = tmp.path().join("oracle.key");
    let keygen = Command::new(env!("CARGO_BIN_EXE_knary"))
        .arg("keygen")
        .arg(&key)
        .output()
        .expect("keygen runs");
    assert!(keygen.status.success());
    let out = Command::new(env!("CARGO_BIN_EXE_knary"))
        .args(["certify", "--log-dir"])
        .arg(tmp.path().join("log"))
        .arg("--oracle-key")
        .arg(&key)
        .env("VERIFLOW_LOG", "info")
        .env("TMPDIR", tmp.path())
        .output()
        .expect("certify runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for phase in [
        "certify: log loaded",
        "certify: terminal subgraph, structural check and Merkle root",
        "certify: re-executions done",
    ] {
        assert!(stderr.contains(phase), "{phase}: {stderr}");
    }
    assert!(
        stderr.contains("certify: log loaded generation=0 tasks="),
        "plain text, with the loaded log's size: {stderr}"
    );
}

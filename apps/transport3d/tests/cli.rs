//! `transport3d` from the command line: a logged run that `certify` accepts, a run with a vnode
//! killed that gives the same digest, and bad options that are usage errors, never panics.

use std::path::Path;

use serde_json::Value;
use veriflow_testkit::{run_bin, s, Out};

fn t3d(tmp: &Path, args: &[&str]) -> Out {
    run_bin(Path::new(env!("CARGO_BIN_EXE_transport3d")), tmp, args)
}

const SMALL: [&str; 16] = [
    "--nx",
    "8",
    "--ny",
    "3",
    "--nz",
    "8",
    "--blocks",
    "4",
    "--dt",
    "120",
    "--t-end",
    "480",
    "--tol",
    "1e-8",
    "--threads",
    "2",
];

fn run(tmp: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["run"];
    args.extend_from_slice(&SMALL);
    args.extend_from_slice(&["--json"]);
    args.extend_from_slice(extra);
    let out = t3d(tmp, &args);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["correct"], Value::Bool(true), "{out}");
    j
}

#[test]
fn certify_accepts_an_honest_run_and_a_killed_vnode_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("oracle.key");
    t3d(tmp.path(), &["keygen", s(&key)]).expect_code(0);
    let log = tmp.path().join("log");
    let j = run(tmp.path(), &["--vnodes", "4", "--log-dir", s(&log)]);
    let digest = j["result"]["digest"].clone();
    assert_eq!(j["result"]["steps"], 4, "{j}");
    let out = t3d(
        tmp.path(),
        &[
            "certify",
            "--log-dir",
            s(&log),
            "--oracle-key",
            s(&key),
            "--json",
        ],
    );
    out.expect_code(0);
    assert_eq!(out.json()["decision"], "ACCEPT", "{out}");

    let killed = run(
        tmp.path(),
        &[
            "--vnodes",
            "4",
            "--log-dir",
            s(&tmp.path().join("log2")),
            "--kill-vnode",
            "2",
            "--kill-after",
            "9",
        ],
    );
    assert_eq!(killed["result"]["digest"], digest, "{killed}");
    let one = run(tmp.path(), &["--vnodes", "1", "--no-checkpoint"]);
    assert_eq!(one["result"]["digest"], digest, "{one}");
}

#[test]
fn bad_options_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for (bad, word) in [
        (&["--dt", "0"][..], "dt"),
        (&["--dt=-5"][..], "dt"),
        (&["--nx", "2"][..], "nx"),
        (&["--blocks", "9", "--nz", "8"][..], "blocks"),
        (&["--tol", "1e-8", "--inner-tol", "1e-6"][..], "inner_tol"),
        (&["--model", "nope"][..], "model"),
    ] {
        let mut args = vec!["run", "--no-checkpoint"];
        args.extend_from_slice(bad);
        let out = t3d(tmp.path(), &args);
        out.expect_code(2);
        assert!(out.stderr.contains(word), "{word}: {out}");
    }
}

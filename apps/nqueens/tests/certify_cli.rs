//! Certification of N-Queens runs from the command line: `run --certify` and `certify` accept
//! honest runs (embedded and cluster); a run with forged tasks (`--forge-tasks`) has a wrong
//! count, and the certifier rejects it naming exactly the forged tasks, then corrects it.

mod common;

use std::path::Path;

use common::*;

fn key(dir: &Path) -> String {
    let k = dir.join("oracle.key");
    if !k.exists() {
        nqueens(&["keygen", s(&k)]).expect_code(0);
    }
    s(&k).to_string()
}

#[test]
fn honest_runs_are_accepted_by_run_certify_and_certify() {
    let tmp = tempfile::tempdir().unwrap();
    let k = key(tmp.path());
    let log = tmp.path().join("log");
    let cert = tmp.path().join("cert.json");
    let j = counted(
        10,
        &[
            "run",
            "-n",
            "10",
            "--split-rows",
            "4",
            "--vnodes",
            "3",
            "--json",
            "--log-dir",
            s(&log),
            "--certify",
            "--oracle-key",
            &k,
            "--cert-out",
            s(&cert),
        ],
    );
    let c = &j["certificate"];
    assert_eq!(c["decision"], "ACCEPT", "{j}");
    assert_eq!(c["n"], j["tasks"], "every task is an ancestor of the count");
    nqueens(&[
        "certify",
        "--verify",
        s(&cert),
        "--log-dir",
        s(&log),
        "--oracle-key",
        &k,
    ])
    .expect_code(0);
    // `certify` on the finished log, sampled and in full.
    for extra in [&[][..], &["--full"][..]] {
        let mut args = vec![
            "certify",
            "--log-dir",
            s(&log),
            "--oracle-key",
            &k,
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = nqueens(&args);
        out.expect_code(0);
        assert_eq!(out.json()["decision"], "ACCEPT", "{out}");
    }
    // A cluster run certified right after it.
    let out = nqueens(&[
        "cluster",
        "--workers",
        "2",
        "-n",
        "9",
        "--split-rows",
        "3",
        "--certify",
        "--oracle-key",
        &k,
    ]);
    out.expect_code(0);
    assert!(out.stdout.contains("result 352 (checked)"), "{out}");
    assert!(out.stdout.contains("certify: ACCEPT"), "{out}");
}

#[test]
fn a_forged_run_is_caught_named_and_corrected() {
    let tmp = tempfile::tempdir().unwrap();
    let k = key(tmp.path());
    let log = tmp.path().join("log");
    let out = nqueens(&[
        "run",
        "-n",
        "9",
        "--split-rows",
        "3",
        "--vnodes",
        "2",
        "--forge-tasks",
        "2",
        "--forge-seed",
        "5",
        "--json",
        "--log-dir",
        s(&log),
    ]);
    // The lie reaches the count, which the program checks against A000170.
    out.expect_code(1);
    let j = out.json();
    assert_eq!(j["correct"], false, "{out}");
    let mut forged: Vec<String> = j["forged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["task"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(forged.len(), 2, "{j}");

    let out = nqueens(&[
        "certify",
        "--log-dir",
        s(&log),
        "--oracle-key",
        &k,
        "--full",
        "--json",
    ]);
    out.expect_code(1);
    let c = out.json();
    assert_eq!(c["decision"], "REJECT", "{out}");
    let mut found: Vec<String> = c["detections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["task"].as_str().unwrap().to_string())
        .collect();
    found.sort();
    forged.sort();
    assert_eq!(found, forged, "{c}");

    // Algorithm 1 re-executes them and their successors: the log's count is right again.
    let out = nqueens(&[
        "certify",
        "--log-dir",
        s(&log),
        "--oracle-key",
        &k,
        "--full",
        "--correct",
    ]);
    out.expect_code(0);
    assert!(out.stdout.contains("corrected 2 forged task(s)"), "{out}");
    let out = nqueens(&["inspect", "--log-dir", s(&log), "--json"]);
    out.expect_code(0);
    let ins = out.json();
    assert_eq!(ins["generation"], 1, "{ins}");
    assert_eq!(ins["terminal"][0]["value"], "352", "{ins}");
}

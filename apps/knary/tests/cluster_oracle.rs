//! The online oracle on real processes (issue 20): `knary cluster --oracle` with one worker of
//! four lying. The oracle catches it while the run goes on, the coordinator evicts it, and the
//! run ends with the right result and an ACCEPT certificate of the corrected generation; an
//! honest run is never touched; a worker cannot lie unless tests allow it.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

/// `knary cluster --oracle ...` with forgery allowed (the test-only flag), as JSON.
fn cluster_with_oracle(tmp: &Path, depth: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "cluster",
        "--workers",
        "4",
        "--oracle",
        "--depth",
        depth,
        "--fanout",
        "4",
        "--grain-us",
        "200",
        "--seed",
        "3",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_knary"))
        .args(&args)
        .env("TMPDIR", tmp)
        .env("XDG_CONFIG_HOME", tmp)
        .env("VERIFLOW_ALLOW_FORGERY", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && !stderr.contains("panicked"),
        "knary {}: {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        args.join(" "),
        out.status
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn a_forging_worker_is_caught_evicted_and_its_work_corrected_while_the_run_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    // 27,306 tasks, a few seconds: the oracle's first checks come within a second.
    let j = cluster_with_oracle(
        tmp.path(),
        "8",
        &["--forge-workers", "1", "--forge-rate", "0.05"],
    );
    assert_eq!(j["correct"], true, "{j}");
    assert_eq!(j["result"], knary::expected_nodes(8, 4).unwrap(), "{j}");
    let c = &j["online_certificate"];
    assert_eq!(c["decision"], "ACCEPT", "{c}");
    assert!(c["generation"].as_u64().unwrap() >= 1, "corrected: {c}");
    assert_eq!(c["seed_source"], "oracle secret");
    assert_eq!(
        c["commitment"].as_str().unwrap(),
        blake3::hash(
            &veriflow_checkpoint::hex::decode::<32>(c["secret"].as_str().unwrap()).unwrap()
        )
        .to_hex()
        .as_str(),
        "the secret revealed is the one committed to"
    );
    let workers = c["online"]["workers"].as_array().unwrap();
    let evicted: Vec<&Value> = workers.iter().filter(|w| w["evicted"] == true).collect();
    assert_eq!(evicted.len(), 1, "exactly the liar: {workers:?}");
    assert!(evicted[0]["forged"].as_u64().unwrap() >= 1);
    for w in workers.iter().filter(|w| w["evicted"] == false) {
        assert_eq!(w["forged"], 0, "{w}");
    }
    assert!(
        j["failures"].as_u64().unwrap() >= 1,
        "caught while the run went on, its vnodes moved: {j}"
    );
    assert!(j["uncertified"].is_null(), "{j}");
}

#[test]
fn an_honest_run_followed_by_the_oracle_evicts_nobody() {
    let tmp = tempfile::tempdir().unwrap();
    let j = cluster_with_oracle(tmp.path(), "7", &[]);
    assert_eq!(j["correct"], true, "{j}");
    assert_eq!(j["failures"], 0, "{j}");
    let c = &j["online_certificate"];
    assert_eq!(c["decision"], "ACCEPT", "{c}");
    assert_eq!(c["generation"], 0, "nothing to correct: {c}");
    let online = &c["online"];
    assert!(online["checked"].as_u64().unwrap() >= c["k"].as_u64().unwrap().min(1));
    assert!(online["detections"].as_array().unwrap().is_empty());
    for w in online["workers"].as_array().unwrap() {
        assert_eq!(w["evicted"], false, "{w}");
        assert!(
            w["checked"].as_u64().unwrap() >= 1,
            "every worker is spot-checked: {w}"
        );
    }
}

#[test]
fn a_worker_cannot_lie_unless_tests_allow_it() {
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("k");
    knary(&["keygen", s(&key)]).expect_code(0);
    let out = knary(&[
        "worker",
        "--join",
        "127.0.0.1:9",
        "--key",
        s(&key),
        "--forge-rate",
        "0.1",
    ]);
    out.expect_code(2).stderr_has("VERIFLOW_ALLOW_FORGERY=1");
}

//! `knary certify`, `run --certify`, forgery injection, `keygen` and `public-key` from the
//! command line: verdicts and exit statuses, correction into a new log generation,
//! certificates that verify (with the oracle's public key alone) and certificates that must
//! not, old MAC certificates, and usage errors.

mod common;

use std::path::Path;

use common::*;
use serde_json::Value;

fn key(dir: &Path) -> String {
    let k = dir.join("oracle.key");
    if !k.exists() {
        knary(&["keygen", s(&k)]).expect_code(0);
    }
    s(&k).to_string()
}

#[test]
fn run_certify_accepts_an_honest_run_and_says_so_in_json_and_text() {
    let tmp = tempfile::tempdir().unwrap();
    let k = key(tmp.path());
    let log = tmp.path().join("log");
    let cert = tmp.path().join("cert.json");
    let j = logged_run(
        &log,
        4,
        4,
        2,
        &["--certify", "--oracle-key", &k, "--cert-out", s(&cert)],
    );
    let c = &j["certificate"];
    assert_eq!(c["decision"], "ACCEPT", "{j}");
    assert_eq!(
        c["n"], j["tasks"],
        "every knary task is an ancestor of the result"
    );
    assert_eq!(
        c["k"].as_u64(),
        Some(c["checked"].as_array().unwrap().len() as u64)
    );
    assert_eq!(c["seed_source"], "log digest");
    knary(&[
        "certify",
        "--verify",
        s(&cert),
        "--log-dir",
        s(&log),
        "--oracle-key",
        &k,
    ])
    .expect_code(0);

    let out = knary(&[
        "run",
        "--depth",
        "3",
        "--fanout",
        "3",
        "--certify",
        "--oracle-key",
        &k,
        "--log-dir",
        s(&tmp.path().join("log2")),
    ]);
    out.expect_code(0);
    assert!(out.stdout.contains("certify: ACCEPT"), "{out}");
    assert!(out.stdout.contains("fewer than"), "{out}");
}

#[test]
fn forged_tasks_are_rejected_named_then_corrected_into_a_new_generation() {
    let tmp = tempfile::tempdir().unwrap();
    let k = key(tmp.path());
    let log = tmp.path().join("log");
    let out = knary(&[
        "run",
        "--depth",
        "4",
        "--fanout",
        "3",
        "--threads",
        "2",
        "--vnodes",
        "2",
        "--forge-tasks",
        "3",
        "--forge-seed",
        "7",
        "--json",
        "--log-dir",
        s(&log),
    ]);
    out.expect_code(1); // the lie reaches the result, which knary checks
    let j = out.json();
    assert_eq!(j["correct"], false);
    let forged: Vec<String> = j["forged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["task"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(forged.len(), 3, "{j}");

    // Full duplication finds every one of them and rejects.
    let out = knary(&[
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
    assert_eq!(c["decision"], "REJECT");
    let mut found: Vec<String> = c["detections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["task"].as_str().unwrap().to_string())
        .collect();
    found.sort();
    let mut want = forged.clone();
    want.sort();
    assert_eq!(found, want, "{c}");

    // Correction: re-executed, written as generation 1, accepted; the result is right again.
    let cert = tmp.path().join("c.json");
    let out = knary(&[
        "certify",
        "--log-dir",
        s(&log),
        "--oracle-key",
        &k,
        "--full",
        "--correct",
        "--out",
        s(&cert),
    ]);
    out.expect_code(0);
    assert!(out.stdout.contains("corrected 3 forged task(s)"), "{out}");
    assert!(out.stdout.contains("certify: ACCEPT"), "{out}");
    let (ins, j) = inspect_json(&log);
    ins.expect_code(0);
    let j = j.unwrap();
    assert_eq!(j["generation"], 1);
    let expected = knary::expected_nodes(4, 3).unwrap().to_string();
    assert_eq!(j["terminal"][0]["value"], Value::String(expected), "{j}");
    knary(&[
        "certify",
        "--verify",
        s(&cert),
        "--log-dir",
        s(&log),
        "--oracle-key",
        &k,
    ])
    .expect_code(0);
    // Certifying again needs no more correction.
    let out = knary(&[
        "certify",
        "--log-dir",
        s(&log),
        "--oracle-key",
        &k,
        "--json",
    ]);
    out.expect_code(0);
    assert_eq!(out.json()["generation"], 1);
}

#[test]
fn a_lying_vnode_is_caught_by_sampling() {
    let tmp = tempfile::tempdir().unwrap();
    let k = key(tmp.path());
    let log = tmp.path().join("log");
    // q = 0.3 on vnode 1 of 2: about 15% of the tasks lie; eps 1e-3, q 0.05 checks ~135.
    // Nodes of 200 µs, so that vnode 1 always runs some: a tree of empty nodes may run whole on
    // vnode 0, which keeps its last ready task when it logs (`exec/worth.rs` rule 2).
    let out = knary(&[
        "run",
        "--depth",
        "5",
        "--fanout",
        "3",
        "--grain-us",
        "200",
        "--threads",
        "2",
        "--vnodes",
        "2",
        "--forge-vnode",
        "1",
        "--forge-rate",
        "0.3",
        "--json",
        "--log-dir",
        s(&log),
    ]);
    let j = out.json();
    assert!(!j["forged"].as_array().unwrap().is_empty(), "{out}");
    let out = knary(&[
        "certify",
        "--log-dir",
        s(&log),
        "--oracle-key",
        &k,
        "--epsilon",
        "0.001",
        "--q",
        "0.05",
    ]);
    out.expect_code(1);
    assert!(out.stdout.contains("REJECT"), "{out}");
    assert!(
        out.stdout.contains("on v1"),
        "the lying vnode is named\n{out}"
    );
    assert!(
        !out.stdout.contains("on v0"),
        "the honest vnode is not\n{out}"
    );
}

#[test]
fn tampered_or_foreign_certificates_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let k = key(tmp.path());
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    logged_run(&a, 3, 3, 2, &[]);
    logged_run(&b, 3, 4, 2, &[]);
    let cert = tmp.path().join("a.json");
    knary(&[
        "certify",
        "--log-dir",
        s(&a),
        "--oracle-key",
        &k,
        "--out",
        s(&cert),
    ])
    .expect_code(0);

    knary(&[
        "certify",
        "--verify",
        s(&cert),
        "--log-dir",
        s(&b),
        "--oracle-key",
        &k,
    ])
    .expect_code(1)
    .stderr_has("does not belong to this log");

    let text = std::fs::read_to_string(&cert).unwrap();
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, text.replace("\"epsilon\": 0.05", "\"epsilon\": 0.5")).unwrap();
    knary(&[
        "certify",
        "--verify",
        s(&bad),
        "--log-dir",
        s(&a),
        "--oracle-key",
        &k,
    ])
    .expect_code(1)
    .stderr_has("signature does not verify");

    let other = tmp.path().join("other.key");
    knary(&["keygen", s(&other)]).expect_code(0);
    knary(&[
        "certify",
        "--verify",
        s(&cert),
        "--log-dir",
        s(&a),
        "--oracle-key",
        s(&other),
    ])
    .expect_code(1)
    .stderr_has("signed by oracle key");

    std::fs::write(&bad, "{not json").unwrap();
    knary(&[
        "certify",
        "--verify",
        s(&bad),
        "--log-dir",
        s(&a),
        "--oracle-key",
        &k,
    ])
    .expect_code(1)
    .stderr_has("not a veriflow certificate");
}

#[test]
fn certify_usage_and_input_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let k = key(tmp.path());
    let log = tmp.path().join("log");
    logged_run(&log, 2, 3, 1, &[]);
    let l = s(&log);
    knary(&["certify", "--log-dir", l, "--epsilon", "0"]).expect_code(2);
    knary(&["certify", "--log-dir", l, "--q", "1.5"]).expect_code(2);
    knary(&[
        "certify",
        "--log-dir",
        l,
        "--oracle-key",
        &k,
        "--outputs",
        "d:12",
    ])
    .expect_code(2)
    .stderr_has("--outputs");
    knary(&[
        "certify",
        "--log-dir",
        l,
        "--oracle-key",
        &k,
        "--outputs",
        &format!("d:{}", "ab".repeat(16)),
    ])
    .expect_code(1)
    .stderr_has("is not a terminal output");
    knary(&[
        "certify",
        "--log-dir",
        s(&tmp.path().join("nothing")),
        "--oracle-key",
        &k,
    ])
    .expect_code(1);
    knary(&[
        "certify",
        "--log-dir",
        l,
        "--oracle-key",
        s(&tmp.path().join("missing.key")),
    ])
    .expect_code(1)
    .stderr_has("missing.key");
    let run = ["run", "--depth", "2", "--fanout", "2", "--vnodes", "2"];
    let with = |extra: &[&'static str]| [&run[..], extra].concat();
    knary(&with(&["--forge-vnode", "5", "--forge-rate", "0.1"]))
        .expect_code(2)
        .stderr_has("the run has 2 vnodes");
    knary(&with(&["--forge-vnode", "0", "--forge-rate", "2"]))
        .expect_code(2)
        .stderr_has("between 0 and 1");
    knary(&with(&["--forge-vnode", "0"]))
        .expect_code(2)
        .stderr_has("--forge-rate");
    knary(&[
        "run",
        "--depth",
        "2",
        "--fanout",
        "2",
        "--forge-tasks",
        "1000000",
    ])
    .expect_code(2)
    .stderr_has("only");
    knary(&[
        "run",
        "--depth",
        "2",
        "--fanout",
        "2",
        "--no-checkpoint",
        "--certify",
    ])
    .expect_code(2)
    .stderr_has("cannot be used with");
}

#[test]
fn keygen_writes_an_owner_only_key_and_never_overwrites() {
    let tmp = tempfile::tempdir().unwrap();
    let k = tmp.path().join("k");
    knary(&["keygen", s(&k)]).expect_code(0);
    let first = std::fs::read(&k).unwrap();
    assert_eq!(first.len(), 65, "64 hex digits and a newline");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&k).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    knary(&["keygen", s(&k)])
        .expect_code(1)
        .stderr_has("exists already");
    assert_eq!(std::fs::read(&k).unwrap(), first, "the key is untouched");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o644)).unwrap();
        let log = tmp.path().join("log");
        logged_run(&log, 2, 2, 1, &[]);
        knary(&["certify", "--log-dir", s(&log), "--oracle-key", s(&k)])
            .expect_code(1)
            .stderr_has("chmod 600");
    }
}

#[test]
fn the_default_key_is_created_once_in_the_config_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("log");
    logged_run(&log, 2, 3, 1, &[]);
    let a = knary_in(
        tmp.path(),
        &[
            "certify",
            "--log-dir",
            s(&log),
            "--out",
            s(&tmp.path().join("a.json")),
        ],
    );
    a.expect_code(0);
    let key = tmp.path().join("veriflow").join("oracle.key");
    assert!(key.is_file(), "{a}");
    let bytes = std::fs::read(&key).unwrap();
    knary_in(
        tmp.path(),
        &[
            "certify",
            "--verify",
            s(&tmp.path().join("a.json")),
            "--log-dir",
            s(&log),
        ],
    )
    .expect_code(0);
    assert_eq!(std::fs::read(&key).unwrap(), bytes);
}

/// Issue 18 point 2, end to end: the oracle publishes its public key (`keygen --public`,
/// `public-key`), and anyone verifies a certificate with it alone: no secret key is read, and
/// none is made. A wrong key, a changed certificate, or a secret key given as the public key
/// are refused.
#[test]
fn anyone_verifies_a_certificate_with_the_oracle_public_key_alone() {
    let oracle = tempfile::tempdir().unwrap();
    let k = oracle.path().join("oracle.key");
    let pub_file = oracle.path().join("oracle.pub");
    let out = knary(&["keygen", s(&k), "--public", s(&pub_file)]);
    out.expect_code(0);
    assert!(out.stdout.contains("public key ed25519:"), "{out}");
    let published = std::fs::read_to_string(&pub_file).unwrap();
    assert!(
        published.starts_with("ed25519:") && published.len() == 8 + 64 + 1,
        "{published}"
    );
    // `public-key` prints the same key, and writes it again without complaint.
    let out = knary(&["public-key", "--oracle-key", s(&k)]);
    out.expect_code(0);
    assert_eq!(out.stdout, published);
    knary(&["public-key", "--oracle-key", s(&k), "--out", s(&pub_file)]).expect_code(0);

    let log = oracle.path().join("log");
    let cert = oracle.path().join("cert.json");
    let j = logged_run(
        &log,
        3,
        3,
        2,
        &["--certify", "--oracle-key", s(&k), "--cert-out", s(&cert)],
    );
    let c = &j["certificate"];
    assert_eq!(c["format"], "veriflow-certificate/3", "{j}");
    assert_eq!(c["signature_scheme"], "ed25519", "{j}");
    assert_eq!(
        format!("ed25519:{}\n", c["public_key"].as_str().unwrap()),
        published
    );

    // A stranger: its own config directory, holding no key at all.
    let stranger = tempfile::tempdir().unwrap();
    let verify = |cert: &Path, public: &Path| {
        knary_in(
            stranger.path(),
            &[
                "certify",
                "--verify",
                s(cert),
                "--log-dir",
                s(&log),
                "--public-key",
                s(public),
            ],
        )
    };
    let out = verify(&cert, &pub_file);
    out.expect_code(0);
    assert!(
        out.stdout.contains("valid (Ed25519 signature by ed25519:"),
        "{out}"
    );
    assert!(
        std::fs::read_dir(stranger.path()).unwrap().next().is_none(),
        "verifying with a public key made no key"
    );

    // Another oracle's public key.
    let other = stranger.path().join("other.key");
    let other_pub = stranger.path().join("other.pub");
    knary(&["keygen", s(&other), "--public", s(&other_pub)]).expect_code(0);
    verify(&cert, &other_pub)
        .expect_code(1)
        .stderr_has("signed by oracle key");
    // A changed certificate.
    let bad = stranger.path().join("bad.json");
    let text = std::fs::read_to_string(&cert).unwrap();
    std::fs::write(&bad, text.replace("\"ACCEPT\"", "\"REJECT\"")).unwrap();
    verify(&bad, &pub_file)
        .expect_code(1)
        .stderr_has("signature does not verify");
    // The secret key file where the public key goes.
    verify(&cert, &k).expect_code(1).stderr_has("secret key");
    // Usage: --public-key is for --verify, and not with --oracle-key.
    knary(&[
        "certify",
        "--log-dir",
        s(&log),
        "--public-key",
        s(&pub_file),
    ])
    .expect_code(2);
    knary(&[
        "certify",
        "--verify",
        s(&cert),
        "--log-dir",
        s(&log),
        "--public-key",
        s(&pub_file),
        "--oracle-key",
        s(&k),
    ])
    .expect_code(2);
}

/// Issue 18 point 2: a certificate sealed with a keyed-blake3 MAC (format 1, before
/// signatures) still verifies with the oracle's secret key, and is refused against its public
/// key with a message naming the format and the way out.
#[test]
fn an_old_mac_certificate_verifies_with_the_oracle_key_only() {
    let tmp = tempfile::tempdir().unwrap();
    let k = tmp.path().join("oracle.key");
    let pub_file = tmp.path().join("oracle.pub");
    knary(&["keygen", s(&k), "--public", s(&pub_file)]).expect_code(0);
    let log = tmp.path().join("log");
    let signed = tmp.path().join("signed.json");
    logged_run(
        &log,
        3,
        2,
        2,
        &["--certify", "--oracle-key", s(&k), "--cert-out", s(&signed)],
    );
    // Sealed as format 1 was: the same fields without the signature fields, and a keyed blake3
    // MAC under the context "veriflow certificate mac v1" over the JSON with `mac` empty.
    let mut c =
        veriflow::Certificate::from_json(&std::fs::read_to_string(&signed).unwrap()).unwrap();
    c.format = "veriflow-certificate/1".to_string();
    c.signature_scheme = None;
    c.public_key = None;
    c.signature = None;
    c.mac = Some(String::new());
    let key = veriflow_checkpoint::Key::load(&k).unwrap();
    let mac = key.mac(
        "veriflow certificate mac v1",
        &serde_json::to_vec(&c).unwrap(),
    );
    c.mac = Some(veriflow_checkpoint::hex::encode(&mac));
    let old = tmp.path().join("old.json");
    std::fs::write(&old, c.to_json()).unwrap();

    let out = knary(&[
        "certify",
        "--verify",
        s(&old),
        "--log-dir",
        s(&log),
        "--oracle-key",
        s(&k),
    ]);
    out.expect_code(0);
    assert!(out.stdout.contains("veriflow-certificate/1 MAC"), "{out}");
    let out = knary(&[
        "certify",
        "--verify",
        s(&old),
        "--log-dir",
        s(&log),
        "--public-key",
        s(&pub_file),
    ]);
    out.expect_code(1)
        .stderr_has("veriflow-certificate/1")
        .stderr_has("--oracle-key");
    let changed = tmp.path().join("changed.json");
    std::fs::write(&changed, c.to_json().replace("\"ACCEPT\"", "\"REJECT\"")).unwrap();
    knary(&[
        "certify",
        "--verify",
        s(&changed),
        "--log-dir",
        s(&log),
        "--oracle-key",
        s(&k),
    ])
    .expect_code(1)
    .stderr_has("MAC does not match");
}

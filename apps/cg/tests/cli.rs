//! `cg run --mode dataflow` from the command line: the same bits (x digest, iterations) on 1 and
//! 4 vnodes, with a vnode killed, and after a forged task is corrected by `certify --correct`;
//! certification of an honest run; usage errors and bad files with their exit statuses.

use std::path::{Path, PathBuf};

use serde_json::Value;
use veriflow_testkit::{run_bin, s, Out};

fn cg_in(tmp: &Path, args: &[&str]) -> Out {
    run_bin(Path::new(env!("CARGO_BIN_EXE_cg")), tmp, args)
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// A logged run of lund_a (rtol 1e-12, 4 blocks) on `vnodes` vnodes into `log`, plus `extra`;
/// returns the JSON summary after checking the exit status.
fn lund_run(tmp: &Path, log: &Path, vnodes: &str, extra: &[&str], code: i32) -> Value {
    let out = lund_out(tmp, log, vnodes, extra);
    out.expect_code(code);
    out.json()
}

/// [`lund_run`] with two forged tasks: a flipped bit in a vector or a scalar may make CG
/// diverge, and which task is drawn depends on the schedule (steals), so the run ends either
/// with a result (0) or as a wrong one (1, said so). Returns the JSON summary.
fn forged_lund_run(tmp: &Path, log: &Path, extra: &[&str]) -> Value {
    let forge = ["--forge-tasks", "2", "--forge-seed", "3"];
    let out = lund_out(tmp, log, "2", &[extra, &forge].concat());
    match out.code {
        0 => {}
        1 => {
            out.stderr_has("wrong result");
        }
        _ => panic!("{}: exit status 0 or 1\n{out}", out.cmd()),
    }
    let j = out.json();
    assert_eq!(j["forged"].as_array().map(Vec::len), Some(2), "{out}");
    j
}

fn lund_out(tmp: &Path, log: &Path, vnodes: &str, extra: &[&str]) -> Out {
    let m = data("lund_a.rsa");
    let mut args = vec![
        "run",
        "--matrix",
        s(&m),
        "--rtol",
        "1e-12",
        "--blocks",
        "4",
        "--threads",
        "2",
        "--vnodes",
        vnodes,
        "--json",
        "--log-dir",
        s(log),
    ];
    args.extend_from_slice(extra);
    cg_in(tmp, &args)
}

/// The terminal value of a log, as `inspect --json` shows it (the Debug form of the
/// [`cg::Solution`], every float in shortest round-trip form: equal text, equal bits).
fn terminal(tmp: &Path, log: &Path) -> String {
    let out = cg_in(tmp, &["inspect", "--log-dir", s(log), "--json"]);
    out.expect_code(0);
    let j = out.json();
    j["terminal"][0]["value"]
        .as_str()
        .unwrap_or_else(|| panic!("a terminal value in {j}"))
        .to_string()
}

/// Two vnodes of four killed part way (the runs that must give the same bits).
const KILLS: [&str; 8] = [
    "--kill-vnode",
    "2",
    "--kill-after",
    "700",
    "--kill-vnode",
    "0",
    "--kill-after",
    "2500",
];

#[test]
fn same_bits_on_one_and_four_vnodes_and_with_a_vnode_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let one = lund_run(t, &t.join("v1"), "1", &[], 0);
    let four = lund_run(t, &t.join("v4"), "4", &[], 0);
    let killed = lund_run(t, &t.join("k"), "4", &KILLS, 0);
    assert_eq!(killed["failures"], 2, "{killed}");
    let r1 = &one["result"];
    assert_eq!(r1["converged"], true);
    assert!(r1["rel_error"].as_f64().unwrap() < 5e-10, "{r1}");
    for (name, j) in [("4 vnodes", &four), ("killed", &killed)] {
        for key in ["x_digest", "iterations", "rel_residual", "error"] {
            assert_eq!(j["result"][key], r1[key], "{name}: {key}\n{j}\n{one}");
        }
    }
    // And the same as the sequential solver with 4 blocks.
    let p = cg::problem(
        &cg::Source::parse(s(&data("lund_a.rsa"))).unwrap(),
        cg::Rhs::Ones,
    )
    .unwrap();
    let seq = cg::solve(
        &p.a,
        &p.b,
        &cg::CgOptions {
            rtol: 1e-12,
            max_iter: 1470,
            blocks: 4,
        },
    )
    .unwrap();
    let sol = cg::Solution {
        x: seq.x,
        iterations: seq.iterations,
        rho: seq.rho,
        converged: seq.converged,
    };
    let report = cg::Report::new(&p.a, &p.b, &p.l, &sol);
    assert_eq!(r1["x_digest"], report.x_digest.as_str());
    assert_eq!(r1["iterations"], seq.iterations);
    assert_eq!(terminal(t, &t.join("v1")), terminal(t, &t.join("k")));
}

#[test]
fn an_honest_run_is_certified_and_a_forged_one_corrected_to_the_same_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let key = t.join("oracle.key");
    cg_in(t, &["keygen", s(&key)]).expect_code(0);
    let honest = t.join("honest");
    let j = lund_run(t, &honest, "2", &["--certify", "--oracle-key", s(&key)], 0);
    assert_eq!(j["certificate"]["decision"], "ACCEPT", "{j}");
    let want = terminal(t, &honest);

    // Two forged tasks (a flipped bit in a vector or a scalar each), drawn with a fixed seed.
    let forged = t.join("forged");
    forged_lund_run(t, &forged, &[]);
    let out = cg_in(
        t,
        &[
            "certify",
            "--log-dir",
            s(&forged),
            "--oracle-key",
            s(&key),
            "--full",
            "--json",
        ],
    );
    out.expect_code(1);
    let j = out.json();
    assert_eq!(j["decision"], "REJECT", "{out}");
    // Without correction a full check re-runs every task, so it finds both forgeries.
    assert_eq!(j["detections"].as_array().map(Vec::len), Some(2), "{out}");
    let out = cg_in(
        t,
        &[
            "certify",
            "--log-dir",
            s(&forged),
            "--oracle-key",
            s(&key),
            "--full",
            "--correct",
        ],
    );
    out.expect_code(0);
    // With correction, a forged task that is a successor of another forged task drawn first
    // falls into G_F and is re-executed without being counted; the draw order follows the
    // log digest, which depends on the schedule. So one or both are counted.
    assert!(
        out.stdout.contains("corrected 2 forged task(s)")
            || out.stdout.contains("corrected 1 forged task(s)"),
        "{out}"
    );
    assert!(out.stdout.contains("certify: ACCEPT"), "{out}");
    assert_eq!(
        terminal(t, &forged),
        want,
        "the corrected run has the honest bits"
    );
}

/// With `--stored-from 256`, every batch seed's arguments (x, r and p of a block, ~900 bytes
/// here) go to the value store by digest (VFM4): a run with two vnodes killed recovers them from
/// there to the same bits, and `certify --full` re-runs every task from them; a forged run's
/// correction re-runs the seeds too.
#[test]
fn stored_seed_arguments_recover_and_certify() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let key = t.join("oracle.key");
    cg_in(t, &["keygen", s(&key)]).expect_code(0);
    let want = lund_run(t, &t.join("inline"), "1", &[], 0);
    let log = t.join("stored");
    let killed = lund_run(
        t,
        &log,
        "4",
        &[&["--stored-from", "256"][..], &KILLS].concat(),
        0,
    );
    assert_eq!(killed["failures"], 2, "{killed}");
    assert_eq!(killed["result"]["x_digest"], want["result"]["x_digest"]);
    let certify = |log: &Path, extra: &[&str]| {
        let mut args = vec![
            "certify",
            "--log-dir",
            s(log),
            "--oracle-key",
            s(&key),
            "--full",
        ];
        args.extend_from_slice(extra);
        cg_in(t, &args)
    };
    let out = certify(&log, &[]);
    out.expect_code(0);
    assert!(out.stdout.contains("certify: ACCEPT"), "{out}");
    let forged = t.join("forged");
    forged_lund_run(t, &forged, &["--stored-from", "256"]);
    let out = certify(&forged, &["--correct"]);
    out.expect_code(0);
    assert!(out.stdout.contains("certify: ACCEPT"), "{out}");
    assert_eq!(terminal(t, &forged), terminal(t, &log));
}

#[test]
fn usage_errors_and_bad_files_exit_with_a_message() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let lund = data("lund_a.rsa");
    let lund = s(&lund);
    let usage = |args: &[&str], needle: &str| {
        let mut all = vec!["run", "--no-checkpoint"];
        all.extend_from_slice(args);
        cg_in(t, &all).expect_code(2).stderr_has(needle);
    };
    // spmd has its own options (tests/spmd.rs): a data-flow-only one is refused, and `run
    // --help` says where they are listed, in groups.
    usage(&["--matrix", lund, "--mode", "spmd"], "--no-checkpoint");
    let help = cg_in(t, &["run", "--help"]);
    help.expect_code(0);
    assert!(
        help.stdout.contains("see `cg run --mode spmd --help`"),
        "{help}"
    );
    let spmd = cg_in(t, &["run", "--mode", "spmd", "--help"]);
    spmd.expect_code(0);
    let at = |needle: &str| {
        spmd.stdout
            .find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in {spmd}"))
    };
    let groups = [
        "Program:",
        "      --matrix <",
        "Runtime:",
        "--vnodes <",
        "Checkpoints:",
        "--encoding <",
        "Faults:",
        "--kill-worker <",
    ];
    assert!(groups.windows(2).all(|w| at(w[0]) < at(w[1])), "{spmd}");
    usage(
        &["--matrix", lund, "--mode", "mpi"],
        "\"mpi\" is not a mode",
    );
    usage(&[], "--matrix");
    usage(&["--matrix", "/no/such.mtx"], "cannot read /no/such.mtx");
    usage(&["--matrix", "poisson4d:3"], "cannot read poisson4d:3");
    usage(&["--matrix", "poisson2d:0"], "not a grid side");
    usage(
        &["--matrix", lund, "--rhs", "twos"],
        "expected ones or random:SEED",
    );
    usage(&["--matrix", lund, "--rtol=-1"], "--rtol -1");
    usage(&["--matrix", lund, "--rtol", "nan"], "--rtol NaN");
    usage(&["--matrix", lund, "--blocks", "0"], "--blocks");
    usage(&["--matrix", lund, "--blocks", "148"], "only 147 rows");
    let utm = data("utm300.rua");
    usage(&["--matrix", s(&utm)], "not symmetric");

    // A damaged file: the error names the line and the field.
    let text = std::fs::read_to_string(data("lund_a.rsa")).unwrap();
    let bad = t.join("bad.rsa");
    std::fs::write(&bad, text.replacen("(5E16.8)", "(5E16)  ", 1)).unwrap();
    usage(&["--matrix", s(&bad)], "line 4, VALFMT (columns 33-52)");

    // A file that changes after the run named it fails the run (exit 1), not a silent
    // different matrix: here the log of a finished run is certified after the file changed.
    let key = t.join("oracle.key");
    cg_in(t, &["keygen", s(&key)]).expect_code(0);
    let m = t.join("m.mtx");
    std::fs::copy(data("lund_a.mtx"), &m).unwrap();
    let log = t.join("log");
    cg_in(
        t,
        &[
            "run",
            "--matrix",
            s(&m),
            "--rtol",
            "1e-10",
            "--json",
            "--log-dir",
            s(&log),
        ],
    )
    .expect_code(0);
    let changed = std::fs::read_to_string(&m).unwrap().replacen(
        "7.5000000000000e+07",
        "7.5000000000001e+07",
        1,
    );
    std::fs::write(&m, changed).unwrap();
    let out = cg_in(
        t,
        &[
            "certify",
            "--log-dir",
            s(&log),
            "--oracle-key",
            s(&key),
            "--full",
        ],
    );
    assert_ne!(out.code, 0, "{out}");
    assert!(
        format!("{}{}", out.stdout, out.stderr).contains("changed since the run started"),
        "{out}"
    );
}

/// Issue 13 point 9: on a singular matrix CG's residual test passes while x is far from L
/// (`rel_error 0.71`), and the summary said "(checked)" with exit 0. Now x = L is checked
/// against `--x-tol` (exit 1 here), and without it the summary says it was not checked.
/// Failed before the fix: exit 0, "(checked)", and `--x-tol` did not exist.
#[test]
fn a_singular_matrix_fails_the_x_check_or_says_it_was_not_checked() {
    let tmp = tempfile::tempdir().unwrap();
    // The Laplacian of a path of 3 nodes: symmetric, positive semi-definite, singular (its
    // null space is the constants). b = A L lies in its range, so CG's residual goes to zero,
    // with x in the range too: x = L minus L's mean, not L.
    let mtx = tmp.path().join("path3.mtx");
    std::fs::write(
        &mtx,
        "%%MatrixMarket matrix coordinate real symmetric\n3 3 5\n1 1 1\n2 1 -1\n2 2 2\n3 2 -1\n3 3 1\n",
    )
    .unwrap();
    let base = [
        "run",
        "--matrix",
        s(&mtx),
        "--rhs",
        "random:3",
        "--blocks",
        "1",
    ];
    let out = cg_in(tmp.path(), &base);
    out.expect_code(0);
    assert!(
        out.stdout.contains("not checked: x = L"),
        "the summary must say x = L was not checked: {out}"
    );
    assert!(!out.stdout.contains("(checked)"), "{out}");
    let mut strict = base.to_vec();
    strict.extend(["--x-tol", "1e-6"]);
    let out = cg_in(tmp.path(), &strict);
    out.expect_code(1);
    assert!(out.stdout.contains("|x - L| / |L|"), "{out}");
    let mut json = strict.clone();
    json.push("--json");
    let out = cg_in(tmp.path(), &json);
    out.expect_code(1);
    assert_eq!(out.json()["correct"], false);
    // The same check passes on a well-conditioned matrix, and says what it checked.
    let out = cg_in(
        tmp.path(),
        &[
            "run",
            "--matrix",
            "poisson2d:8",
            "--rtol",
            "1e-10",
            "--x-tol",
            "1e-6",
            "--json",
        ],
    );
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["result"]["x_tol"], 1e-6, "{j}");
    assert!(j["result"].get("not_checked").is_none(), "{j}");
    // The spmd mode has the same check.
    let mut spmd = strict.clone();
    spmd.extend(["--mode", "spmd"]);
    cg_in(tmp.path(), &spmd).expect_code(1);
}

/// Large values are files of the local store (`values/<shard>/<key in hex>`, rule 7 of the checkpoint
/// crate's `sled_store.rs`; a block of poisson3d:12 on 2 blocks is 6.9 KB, above the 4 KiB at
/// which values leave their events): a finished run certifies; one value file deleted, or one
/// bit of it flipped, makes `certify --full` (which re-runs every task, so reads every value)
/// exit 1 naming the value's digest and what is wrong, never a panic; restored, it certifies.
#[test]
fn a_missing_or_corrupt_value_file_is_named_by_certify() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let key = t.join("oracle.key");
    cg_in(t, &["keygen", s(&key)]).expect_code(0);
    let log = t.join("log");
    cg_in(
        t,
        &[
            "run",
            "--matrix",
            "poisson3d:12",
            "--blocks",
            "2",
            "--threads",
            "2",
            "--vnodes",
            "2",
            "--json",
            "--log-dir",
            s(&log),
        ],
    )
    .expect_code(0);
    let mut files: Vec<PathBuf> = std::fs::read_dir(log.join("values"))
        .expect("the store's value files")
        .flat_map(|shard| std::fs::read_dir(shard.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() > 20, "{} value files", files.len());
    let certify = || {
        cg_in(
            t,
            &[
                "certify",
                "--log-dir",
                s(&log),
                "--oracle-key",
                s(&key),
                "--full",
            ],
        )
    };
    certify().expect_code(0);
    let file = &files[files.len() / 2];
    // The key is "val/" (8 hex digits) then the digest, which messages name by 16 digits.
    let name = file.file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("76616c2f"), "{name}");
    let digest = &name[8..24];
    let bytes = std::fs::read(file).unwrap();
    std::fs::remove_file(file).unwrap();
    certify()
        .expect_code(1)
        .stderr_has(digest)
        .stderr_has("missing");
    let mut flipped = bytes.clone();
    flipped[100] ^= 0x40;
    std::fs::write(file, &flipped).unwrap();
    certify()
        .expect_code(1)
        .stderr_has(digest)
        .stderr_has("corrupt");
    std::fs::write(file, &bytes).unwrap();
    certify().expect_code(0);
}

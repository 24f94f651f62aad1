//! Issue 13 points 1 and 2, end to end: a gap in a vnode's log is corruption naming vnode and
//! segment in `inspect`, `certify` and `run --resume` (never a hang, never "a veriflow bug"),
//! and the readers never write: damaged sled files are reported (exit 1), never repaired in
//! place, never a panic.

use std::path::Path;
use std::time::Duration;

use veriflow::runtime::log::segment::segment_key;
use veriflow::runtime::log::{Manifest, RunStatus, MANIFEST_KEY};
use veriflow::VnodeId;
use veriflow_checkpoint::Store;
use veriflow_testkit::damage::{copy_dir, essence, run_limited, tree_digest, Ran};

mod common;
use common::*;

/// Far above what these small runs take, even on a loaded machine: only a hang reaches it.
const HANG: Duration = Duration::from_secs(120);

fn knary_limited(tmp: &Path, args: &[&str]) -> Ran {
    let ran = run_limited(Path::new(env!("CARGO_BIN_EXE_knary")), tmp, args, HANG);
    assert!(
        !ran.timed_out,
        "knary {}: hung\n{}",
        args.join(" "),
        ran.stderr
    );
    assert!(
        !ran.panicked(),
        "knary {}: panicked ({:?})\n{}",
        args.join(" "),
        ran.code,
        ran.stderr
    );
    ran
}

fn expect_corrupt(ran: &Ran, what: &str, needles: &[&str]) {
    assert_eq!(
        ran.code,
        Some(1),
        "{what}: exit status\n{}\n{}",
        ran.stdout,
        ran.stderr
    );
    for n in needles {
        assert!(
            ran.stderr.contains(n),
            "{what}: stderr should name {n:?}\n{}",
            ran.stderr
        );
    }
}

const RUN: [&str; 12] = [
    "run",
    "--depth",
    "5",
    "--fanout",
    "4",
    "--threads",
    "2",
    "--vnodes",
    "3",
    "--seed",
    "11",
    "--json",
];

/// A finished run with many small segments, in `tmp/log`.
fn finished(tmp: &Path) -> std::path::PathBuf {
    let dir = tmp.join("log");
    logged_run(&dir, 5, 4, 3, &["--commit-kib", "1"]);
    dir
}

/// A finished run whose store has blob files (segments above sled's blob threshold, half a
/// sled segment: 128 KiB), in `tmp/log`.
fn finished_with_blobs(tmp: &Path) -> std::path::PathBuf {
    let dir = tmp.join("log");
    logged_run(&dir, 7, 4, 3, &["--commit-kib", "256"]);
    dir
}

/// The run in `dir` no longer known to be finished: what a crash leaves.
fn mark_running(dir: &Path) {
    with_store(dir, |st| {
        let mut m = Manifest::load(st).unwrap().unwrap();
        m.status = RunStatus::Running;
        m.store(st).unwrap();
    });
}

fn delete_segment(dir: &Path, vnode: u32, segno: u64) {
    with_store(dir, |st| {
        let key = segment_key(VnodeId(vnode), segno);
        assert!(
            st.get(&key).unwrap().is_some(),
            "v{vnode} segment {segno} exists"
        );
        st.delete(&key).unwrap();
    });
}

/// Issue 13.1: one segment deleted from a finished run's log (a middle one, or the last one)
/// is corruption naming vnode and segment in `inspect` and `certify` (inspect used to report
/// nothing and exit 0).
#[test]
fn a_missing_segment_of_a_finished_run_is_corruption_in_inspect_and_certify() {
    for which in ["middle", "last"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = finished(tmp.path());
        let (v, segs) = busiest_vnode(&dir, 3);
        assert!(segs.len() >= 3, "v{v} has {} segments", segs.len());
        let segno = if which == "middle" {
            segs[segs.len() / 2].0
        } else {
            segs.last().unwrap().0
        };
        delete_segment(&dir, v, segno);
        let needles = [
            format!("v{v}"),
            format!("segment {segno}"),
            "corrupt".to_string(),
        ];
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        let d = dir.to_str().unwrap();
        let ran = knary_limited(tmp.path(), &["inspect", "--log-dir", d, "--json"]);
        expect_corrupt(&ran, &format!("inspect, {which} segment"), &needles);
        let ran = knary_limited(tmp.path(), &["certify", "--log-dir", d]);
        expect_corrupt(&ran, &format!("certify, {which} segment"), &needles);
    }
}

/// Issue 13.1: `run --resume` of an interrupted run one of whose segments was deleted stops
/// with corruption naming vnode and segment (it used to hang, or stop with "internal error ...
/// written twice (a veriflow bug)").
#[test]
fn resume_after_a_lost_segment_reports_it_and_never_hangs() {
    for pick in [1usize, 2, 3] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = finished(tmp.path());
        mark_running(&dir);
        let (v, segs) = busiest_vnode(&dir, 3);
        let segno = segs[segs.len() * pick / 4].0;
        delete_segment(&dir, v, segno);
        let mut args = RUN.to_vec();
        args.extend(["--log-dir", dir.to_str().unwrap(), "--resume"]);
        let ran = knary_limited(tmp.path(), &args);
        expect_corrupt(
            &ran,
            "resume",
            &[&format!("v{v}"), &format!("segment {segno}"), "corrupt"],
        );
        assert!(!ran.stderr.contains("veriflow bug"), "{}", ran.stderr);
    }
}

/// A log whose manifest was deleted is a damaged store, not a directory without a run:
/// `run --resume` exits 1 saying the manifest is missing (found by the damage campaign, whose
/// `delete-key` drew a finished run's manifest under load; it was "holds no run to resume", a
/// usage error), and the log it found is left as it was.
#[test]
fn resume_of_a_log_without_its_manifest_is_damage_not_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = finished(tmp.path());
    with_store(&dir, |st| st.delete(MANIFEST_KEY).unwrap());
    let log = |dir: &Path| {
        let mut pairs = Vec::new();
        with_store(dir, |st| pairs = st.scan_prefix(b"").unwrap());
        pairs
    };
    let before = log(&dir);
    let mut args = RUN.to_vec();
    args.extend(["--log-dir", dir.to_str().unwrap(), "--resume"]);
    let ran = knary_limited(tmp.path(), &args);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("no run manifest") && ran.stderr.contains("damaged"),
        "{}",
        ran.stderr
    );
    assert!(
        before == log(&dir),
        "resume changed the damaged store's keys or values"
    );
}

/// Issue 13.1 with recovery checkpoints (log rule 9): a segment deleted *before* a vnode's
/// checkpoint is not read by a resume, which used to go on and finish a run whose log can
/// no longer be certified. It is corruption naming vnode and segment, as after a checkpoint.
#[test]
fn resume_reports_a_segment_lost_before_a_recovery_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    logged_run(
        &dir,
        5,
        4,
        3,
        &["--commit-kib", "1", "--checkpoint-kib", "4"],
    );
    mark_running(&dir);
    let (v, segs) = busiest_vnode(&dir, 3);
    let segno = segs[1].0;
    delete_segment(&dir, v, segno);
    let mut args = RUN.to_vec();
    args.extend([
        "--log-dir",
        dir.to_str().unwrap(),
        "--resume",
        "--commit-kib",
        "1",
        "--checkpoint-kib",
        "4",
    ]);
    let ran = knary_limited(tmp.path(), &args);
    expect_corrupt(
        &ran,
        "resume from a checkpoint",
        &[&format!("v{v}"), &format!("segment {segno}"), "corrupt"],
    );
}

/// The blob files of a store (sled keeps each large value, most segments, in one).
fn blobs(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut b: Vec<_> = std::fs::read_dir(dir.join("blobs"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    b.sort();
    assert!(!b.is_empty(), "the store has blob files");
    b
}

/// Issue 13.2: a flipped bit in a blob file is corruption in `inspect` and `certify`, and
/// neither changes the directory (inspect used to exit 0 showing the finished run as
/// "Running" while sled deleted the blob files).
#[test]
fn readers_never_write_and_a_flipped_blob_bit_is_corruption() {
    for which in ["first", "last"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = finished_with_blobs(tmp.path());
        let all = blobs(&dir);
        let blob = if which == "first" {
            &all[0]
        } else {
            all.last().unwrap()
        };
        let mut bytes = std::fs::read(blob).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x10;
        std::fs::write(blob, &bytes).unwrap();
        let before = tree_digest(&dir);
        let d = dir.to_str().unwrap();
        let ran = knary_limited(tmp.path(), &["inspect", "--log-dir", d]);
        expect_corrupt(&ran, &format!("inspect, {which} blob"), &["corrupt"]);
        let ran = knary_limited(tmp.path(), &["certify", "--log-dir", d]);
        expect_corrupt(&ran, &format!("certify, {which} blob"), &["corrupt"]);
        assert_eq!(
            tree_digest(&dir),
            before,
            "{which} blob: a reader changed the store"
        );
    }
}

/// Issue 13.2: a deleted blob file makes `inspect`, `certify` and `run --resume` exit 1 with
/// a message, or give exactly the intact answer when the blob held a node version sled had
/// superseded (they used to panic inside sled, exit 101, or exit 0 with a segment missing).
///
/// Which single blob files are live depends on the run's timing: sled rewrites a node that
/// holds a large value, and often every blob file left is a superseded version or has a
/// newer copy (0 of 12 seeds had a single deletion that lost data in one run of the full
/// suite, at 76d7590; the test then asked for one and was wrong, not the system). So every
/// single deletion is checked to be either an error or the intact answer, and deleting every
/// blob file, which always takes the newest version of the nodes too large for the `db`
/// file, must be an error in `inspect` and `certify` (`run --resume` of a run whose manifest
/// still reads Finished refuses before it reads the log).
#[test]
fn a_deleted_blob_file_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let intact = tmp.path().join("log");
    let mut args = RUN.to_vec();
    args[2] = "7";
    args.extend(["--log-dir", intact.to_str().unwrap(), "--commit-kib", "256"]);
    knary(&args).expect_code(0);
    let i = intact.to_str().unwrap();
    let want = knary_limited(tmp.path(), &["inspect", "--log-dir", i, "--json"]);
    assert_eq!(want.code, Some(0), "{}", want.stderr);
    let want = essence(&want.json().unwrap());
    let all = blobs(&intact);
    let mut cases: Vec<(String, Vec<&Path>)> = all
        .iter()
        .map(|b| (format!("blob {} deleted", b.display()), vec![b.as_path()]))
        .collect();
    cases.push((
        format!("all {} blob files deleted", all.len()),
        all.iter().map(|b| b.as_path()).collect(),
    ));
    for (n, (what, gone)) in cases.iter().enumerate() {
        let every = gone.len() == all.len();
        let dir = tmp.path().join(format!("copy{n}"));
        copy_dir(&intact, &dir).unwrap();
        for blob in gone {
            std::fs::remove_file(dir.join("blobs").join(blob.file_name().unwrap())).unwrap();
        }
        let d = dir.to_str().unwrap();
        let ran = knary_limited(tmp.path(), &["inspect", "--log-dir", d, "--json"]);
        let right = ran.code == Some(0) && !every;
        if right {
            assert_eq!(essence(&ran.json().unwrap()), want, "{what}: inspect");
        } else {
            expect_corrupt(&ran, &format!("{what}: inspect"), &[]);
        }
        let ran = knary_limited(tmp.path(), &["certify", "--log-dir", d]);
        if !(right && ran.code == Some(0)) {
            expect_corrupt(&ran, &format!("{what}: certify"), &[]);
        }
        let mut args = RUN.to_vec();
        args[2] = "7";
        args.extend(["--log-dir", d, "--resume", "--commit-kib", "256"]);
        let ran = knary_limited(tmp.path(), &args);
        if ran.code == Some(0) {
            assert_eq!(ran.json().unwrap()["correct"], true, "{what}: resume");
        } else if ran.code == Some(2) {
            // The manifest still reads Finished: nothing to resume (a usage error; resume
            // reads nothing else then).
            assert!(
                ran.stderr.contains("nothing to resume"),
                "{what}: resume\n{}",
                ran.stderr
            );
        } else {
            expect_corrupt(&ran, &format!("{what}: resume"), &[]);
        }
    }
}

/// Issue 13.2: a truncated `db` file is corruption in `inspect` and `run --resume` (inspect
/// used to exit 0 with a vnode missing, and `--resume` to idle forever).
#[test]
fn a_truncated_db_file_is_corruption_not_a_shorter_log() {
    for keep in [2usize, 3] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = finished(tmp.path());
        let db = dir.join("db");
        let len = std::fs::metadata(&db).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&db)
            .unwrap()
            .set_len(len * (keep as u64 - 1) / keep as u64)
            .unwrap();
        let d = dir.to_str().unwrap();
        let ran = knary_limited(tmp.path(), &["inspect", "--log-dir", d]);
        expect_corrupt(&ran, "inspect", &["corrupt"]);
        let mut args = RUN.to_vec();
        args.extend(["--log-dir", d, "--resume"]);
        let ran = knary_limited(tmp.path(), &args);
        expect_corrupt(&ran, "resume", &[]);
    }
}

/// Issue 13.2: `run --resume` on a directory that does not exist is an error and creates
/// nothing.
#[test]
fn resume_on_a_missing_directory_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("nothing-here");
    let mut args = RUN.to_vec();
    args.extend(["--log-dir", dir.to_str().unwrap(), "--resume"]);
    let ran = knary_limited(tmp.path(), &args);
    // Nothing to resume is a usage error (exit 2), naming the directory.
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("nothing-here"), "{}", ran.stderr);
    assert!(!dir.exists(), "--resume created {}", dir.display());
}

/// Issue 13 point 7: a run whose log fills the disk stopped with 0 CPU forever (sled's flush
/// waited for a write that had failed). It is a clear error, exit 1, and what was durable
/// before reads back. Needs root to mount a 3 MiB tmpfs (CI runs as root); elsewhere it says
/// so and checks nothing.
#[test]
fn a_run_that_fills_the_disk_stops_with_an_error_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("full");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
        .arg(&mnt)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: mounting a 3 MiB tmpfs needs root");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.0)
                .status();
        }
    }
    let _guard = Unmount(&mnt);
    let log = mnt.join("log");
    let ran = knary_limited(
        tmp.path(),
        &["run", "--depth", "8", "--fanout", "5", "--log-dir", s(&log)],
    );
    expect_corrupt(&ran, "full disk", &["No space left on device"]);
}

//! Ctrl-C never loses a run (issue 18 point 4), with real processes: `knary run` stopped by
//! SIGINT or SIGTERM makes its log durable, prints the exact command that resumes it and exits
//! with 128 + the signal; that command finishes the run with the result of an uninterrupted
//! one, each task completed once; a second SIGINT exits at once; and the log directory a run
//! makes for itself is gone once the run has finished (`src/interrupt.rs` rules 1-6). And
//! `inspect` reads a run while it runs (issue 18 point 5).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use veriflow_testkit::damage::isolated;
use veriflow_testkit::Proc;

/// A `knary` process whose standard error is read line by line while it runs.
struct Running {
    proc: Proc,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
    stdout: std::thread::JoinHandle<String>,
}

impl Running {
    /// Starts `knary args` with `TMPDIR` and the config directory in `tmp` (testkit rule 1).
    fn start(tmp: &Path, args: &[&str]) -> Running {
        let mut child = isolated(Path::new(env!("CARGO_BIN_EXE_knary")), tmp, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the knary binary runs");
        let err = child.stderr.take().unwrap();
        let mut out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        Running {
            proc: Proc(child),
            lines,
            stderr: Vec::new(),
            stdout,
        }
    }

    /// Waits for a line of standard error that contains `needle`, and returns it.
    fn wait_for(&mut self, needle: &str, limit: Duration) -> String {
        let t0 = Instant::now();
        loop {
            let left = limit.saturating_sub(t0.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stderr.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line with {needle:?} on stderr within {limit:?}:\n{}",
                    self.stderr.join("\n")
                ),
            }
        }
    }

    /// Waits for the process to exit (at most `limit`): its status code (a death by signal
    /// fails the test: the command must exit by itself), stdout, stderr, and how long it took.
    fn finish(mut self, limit: Duration) -> (i32, String, String, Duration) {
        let t0 = Instant::now();
        let status = loop {
            if let Some(st) = self.proc.0.try_wait().unwrap() {
                break st;
            }
            assert!(
                t0.elapsed() < limit,
                "still running after {limit:?}:\n{}",
                self.stderr.join("\n")
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let took = t0.elapsed();
        let stdout = self.stdout.join().unwrap();
        self.stderr.extend(self.lines.iter());
        let stderr = self.stderr.join("\n");
        let code = status
            .code()
            .unwrap_or_else(|| panic!("killed by a signal ({status}):\n{stderr}"));
        assert!(
            !stderr.contains("panicked"),
            "something panicked:\n{stderr}"
        );
        (code, stdout, stderr, took)
    }
}

/// The command printed after "Resume the run with:" on `stderr`, as words (test paths need no
/// quoting: none is printed).
fn resume_words(stderr: &str) -> Vec<String> {
    let mut lines = stderr.lines();
    lines
        .find(|l| l.contains("Resume the run with:"))
        .unwrap_or_else(|| panic!("no resume command:\n{stderr}"));
    let cmd = lines.next().expect("the command follows").trim();
    assert!(!cmd.contains('\''), "{cmd}");
    cmd.split_whitespace().map(str::to_string).collect()
}

/// Runs the printed command as it is: its first word is the binary.
fn run_words(tmp: &Path, words: &[String]) -> Out {
    assert_eq!(
        Path::new(&words[0]),
        Path::new(env!("CARGO_BIN_EXE_knary")),
        "the command names the binary that ran"
    );
    let args: Vec<&str> = words[1..].iter().map(String::as_str).collect();
    knary_in(tmp, &args)
}

/// 4687 tasks of 1 ms on 2 threads: about 2.5 s, long enough to be stopped part way.
const LONG_RUN: [&str; 13] = [
    "run",
    "--depth",
    "6",
    "--fanout",
    "5",
    "--grain-us",
    "1000",
    "--threads",
    "2",
    "--vnodes",
    "3",
    "--seed",
    "5",
];

fn inspect_dir(dir: &Path) -> Value {
    let (out, j) = inspect_json(dir);
    out.expect_code(0);
    j.unwrap()
}

/// Rules 1-2: SIGINT part way; the printed command, run as printed, finishes the run with the
/// result of an uninterrupted run, every task declared, started and completed once, the tasks
/// completed before the stop not run again, and a log that certifies.
#[test]
fn ctrl_c_stops_a_run_and_the_printed_command_resumes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let mut args = LONG_RUN.to_vec();
    args.extend(["--json", "--log-dir", s(&dir)]);
    let mut run = Running::start(tmp.path(), &args);
    let line = run.wait_for("log dir:", Duration::from_secs(60));
    assert!(line.ends_with(s(&dir)), "{line}");
    std::thread::sleep(Duration::from_millis(700));
    run.proc.signal("-INT");
    let (code, stdout, stderr, _) = run.finish(Duration::from_secs(60));
    assert_eq!(code, 130, "128 + SIGINT\n{stderr}");
    assert!(stderr.contains("SIGINT: stopping"), "{stderr}");
    let j: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(j["interrupted"], "SIGINT", "{j}");
    let stopped_at = j["completed_tasks"].as_u64().unwrap();
    let tasks = knary::expected_tasks(6, 5).unwrap();
    assert!(
        stopped_at > 0 && stopped_at < tasks,
        "stopped part way: {stopped_at} of {tasks}\n{stderr}"
    );
    // The exact command: the one typed, plus --resume.
    let words = resume_words(&stderr);
    let mut expected: Vec<String> = vec![env!("CARGO_BIN_EXE_knary").to_string()];
    expected.extend(args.iter().map(|a| a.to_string()));
    expected.push("--resume".to_string());
    assert_eq!(words, expected);
    assert_eq!(j["resume"], words.join(" "), "{j}");

    // Durable: the log says Interrupted and holds every task completed before the stop.
    let ins = inspect_dir(&dir);
    assert_eq!(ins["status"], "Interrupted", "{ins}");
    assert_eq!(ins["tasks"]["completed"], stopped_at, "{ins}");

    let out = run_words(tmp.path(), &words);
    out.expect_code(0);
    let resumed = out.json();
    let plain_dir = tmp.path().join("plain");
    let plain = logged_run(&plain_dir, 6, 5, 3, &[]);
    assert_eq!(resumed["result"], plain["result"], "{out}");
    assert_eq!(resumed["correct"], true, "{out}");
    assert_eq!(resumed["tasks"], tasks, "{out}");
    assert_eq!(
        resumed["reused_tasks"], stopped_at,
        "the tasks completed before the stop are not run again: {out}"
    );
    let ins = inspect_dir(&dir);
    assert_eq!(ins["status"], "Finished", "{ins}");
    for k in ["declared", "started", "completed"] {
        assert_eq!(ins["tasks"][k], tasks, "{k}: each task once\n{ins}");
    }
    assert_eq!(
        ins["terminal"][0]["value"],
        inspect_dir(&plain_dir)["terminal"][0]["value"],
        "the same terminal value as an uninterrupted run"
    );
    let key = tmp.path().join("oracle.key");
    knary(&["keygen", s(&key)]).expect_code(0);
    let out = knary(&["certify", "--log-dir", s(&dir), "--oracle-key", s(&key)]);
    out.expect_code(0);
    assert!(out.stdout.contains("certify: ACCEPT"), "{out}");
}

/// Issue 18 point 5: `inspect` reads a run that is still writing its log (from a copy of its
/// store: `sled_store.rs` rule 1, so sled's lock is never in the way), sees it Running with its
/// counts growing, and does not disturb it: stopped afterwards, the log holds every task the
/// inspections saw completed.
#[test]
fn inspect_reads_a_run_while_it_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    // 23,436 tasks of 1 ms on 2 threads: at least 12 s, stopped once seen growing.
    let args = [
        "run",
        "--depth",
        "7",
        "--fanout",
        "5",
        "--grain-us",
        "1000",
        "--threads",
        "2",
        "--vnodes",
        "3",
        "--log-dir",
        s(&dir),
    ];
    let tasks = knary::expected_tasks(7, 5).unwrap();
    let mut run = Running::start(tmp.path(), &args);
    run.wait_for("log dir:", Duration::from_secs(60));
    let mut seen: Vec<u64> = Vec::new();
    let t0 = Instant::now();
    while seen.len() < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the run's completed count did not grow twice: {seen:?}"
        );
        // "log dir:" comes before the run stores its manifest (interrupt.rs rule 1: once the
        // signal handler is in place); until then inspect finds no run there, and says so.
        let (out, ins) = inspect_json(&dir);
        let Some(ins) = ins else {
            assert!(
                seen.is_empty() && out.stderr.contains("holds no run manifest"),
                "{}",
                out.stderr
            );
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        assert_eq!(ins["status"], "Running", "{ins}");
        let done = ins["tasks"]["completed"].as_u64().unwrap();
        assert!(done < tasks, "read while running: {done} of {tasks}\n{ins}");
        if done > seen.last().copied().unwrap_or(0) {
            seen.push(done);
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    run.proc.signal("-INT");
    let (code, _, stderr, _) = run.finish(Duration::from_secs(60));
    assert_eq!(
        code, 130,
        "the run went on undisturbed until stopped\n{stderr}"
    );
    let ins = inspect_dir(&dir);
    assert_eq!(ins["status"], "Interrupted", "{ins}");
    assert!(
        ins["tasks"]["completed"].as_u64().unwrap() >= seen[1],
        "what inspect saw durable stays durable: {seen:?}\n{ins}"
    );
}

/// Rules 2 and 6 with SIGTERM: the directory the run made for itself is kept while the run is
/// unfinished, the printed command names it, and running that command finishes the run and
/// removes it.
#[test]
fn sigterm_keeps_the_fresh_log_dir_until_the_printed_command_finishes_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let mut run = Running::start(tmp.path(), &LONG_RUN);
    let line = run.wait_for("log dir:", Duration::from_secs(60));
    assert!(line.contains("made for this run"), "{line}");
    std::thread::sleep(Duration::from_millis(700));
    run.proc.signal("-TERM");
    let (code, _, stderr, _) = run.finish(Duration::from_secs(60));
    assert_eq!(code, 143, "128 + SIGTERM\n{stderr}");
    assert!(stderr.contains("SIGTERM: stopped after"), "{stderr}");
    let words = resume_words(&stderr);
    let at = words
        .iter()
        .position(|w| w == "--log-dir")
        .expect("the command names the log dir");
    let dir = PathBuf::from(&words[at + 1]);
    assert!(dir.starts_with(tmp.path()), "{}", dir.display());
    assert_eq!(words.last().map(String::as_str), Some("--resume"));
    assert!(dir.join("veriflow.auto").is_file(), "marked as made by run");
    assert_eq!(inspect_dir(&dir)["status"], "Interrupted");

    let out = run_words(tmp.path(), &words);
    out.expect_code(0);
    assert!(out.stdout.contains("result 3906 (checked)"), "{out}");
    assert!(out.stdout.contains("log dir removed"), "{out}");
    assert!(!dir.exists(), "{} is left behind", dir.display());
}

/// Rule 3: while the first SIGINT waits for running tasks (10 s each here), a second one exits
/// at once, still with 130, and still prints the command that resumes the run.
#[test]
fn a_second_ctrl_c_exits_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let args = [
        "run",
        "--depth",
        "2",
        "--fanout",
        "2",
        "--grain-us",
        "10000000",
        "--threads",
        "2",
        "--log-dir",
        s(&dir),
    ];
    let started = Instant::now();
    let mut run = Running::start(tmp.path(), &args);
    run.wait_for("log dir:", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300));
    run.proc.signal("-INT");
    run.wait_for("SIGINT: stopping", Duration::from_secs(30));
    run.proc.signal("-INT");
    let (code, _, stderr, took) = run.finish(Duration::from_secs(60));
    assert_eq!(code, 130, "{stderr}");
    assert!(stderr.contains("SIGINT again: exiting at once"), "{stderr}");
    assert!(
        took < Duration::from_secs(5) && started.elapsed() < Duration::from_secs(10),
        "the second SIGINT did not end the process at once ({took:?}): it waited for the tasks"
    );
    let words = resume_words(&stderr);
    assert_eq!(words.last().map(String::as_str), Some("--resume"));
    assert!(words.iter().any(|w| w == s(&dir)), "{words:?}");
    // What was durable is a log that reads (like after a crash).
    let (out, _) = inspect_json(&dir);
    out.expect_code(0);
}

/// Rule 6: a finished run leaves no directory of its own behind, nor does one that never
/// started, unless asked to keep it or its result is wrong; a directory given with --log-dir
/// is never removed.
#[test]
fn a_finished_run_leaves_no_log_dir_of_its_own_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let out = knary_in(tmp.path(), &["run", "--depth", "4", "--fanout", "3"]);
    out.expect_code(0);
    assert!(out.stdout.contains("log dir removed"), "{out}");
    assert!(out.stderr.contains("log dir:"), "announced first\n{out}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");

    let out = knary_in(
        tmp.path(),
        &["run", "--depth", "4", "--fanout", "3", "--json"],
    );
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["log_dir_removed"], true, "{j}");
    assert!(!Path::new(j["log_dir"].as_str().unwrap()).exists());

    // A run that fails before its first task leaves nothing either.
    knary_in(
        tmp.path(),
        &[
            "run",
            "--depth",
            "2",
            "--fanout",
            "2",
            "--forge-tasks",
            "1000000",
        ],
    )
    .expect_code(2)
    .stderr_has("only");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "left behind by a run that never started: {left:?}"
    );

    // A wrong result keeps it, and says why.
    let out = knary_in(
        tmp.path(),
        &["run", "--depth", "4", "--fanout", "3", "--forge-tasks", "1"],
    );
    out.expect_code(1);
    assert!(
        out.stdout.contains("log dir kept (the result is wrong)"),
        "{out}"
    );
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);

    // A directory given is the user's: kept.
    let given = tmp.path().join("mine");
    logged_run(&given, 3, 3, 2, &[]);
    assert!(given.join("db").is_file());
}

//! Workers from a real Slurm (issue 16, points 1 and 2): `.ci/slurm-up` starts a single-host
//! Slurm from Debian's packages; a coordinator gets its workers from `knary alloc slurm
//! --watch`, runs a knary job, one worker's Slurm job is `scancel`led mid-run, and the result
//! is right, each task completed once, and the watcher submitted a replacement. Without root
//! (or when Slurm cannot be installed or started) that test is skipped, saying why. The
//! command's errors (no sbatch, sbatch refusing, bad flags) need no Slurm.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use veriflow_testkit::{run_bin, wait_json_within, Cluster, ClusterOpts, Proc};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_knary"))
}

/// Bound of every wait on Slurm or the job: far above their seconds on a loaded machine.
const LIMIT: Duration = Duration::from_secs(180);

/// The job: 87381 tasks, 16384 leaves of 2 ms, over three 1-thread workers (about 11 s of
/// work each), long enough to still run when a worker is cancelled and its replacement
/// submitted (the watcher looks every second).
const PROGRAM: [&str; 6] = ["--depth", "8", "--fanout", "4", "--grain-us", "2000"];

/// Starts the test Slurm (`.ci/slurm-up`) once for this file's tests; `Err` says why it
/// cannot run here.
fn slurm_up() -> Result<(), String> {
    static UP: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    UP.get_or_init(start_slurm).clone()
}

fn start_slurm() -> Result<(), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.ci/slurm-up");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} failed ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `knary alloc ARGS` with `--coordinator ADDR` where the subcommand takes it.
fn alloc(tmp: &Path, args: &[&str]) -> Out {
    let mut all = vec!["alloc"];
    all.extend_from_slice(args);
    run_bin(bin(), tmp, &all)
}

/// Cancels the pool's allocations when dropped, so a failed test leaves no worker in Slurm.
struct CancelOnDrop {
    tmp: PathBuf,
    coordinator: String,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let out = alloc(
            &self.tmp,
            &["cancel", "--all", "--coordinator", &self.coordinator],
        );
        if out.code != 0 {
            eprintln!("cleanup: {out}");
        }
    }
}

/// The pool's allocations, as `alloc list --json` prints them.
fn allocations(c: &Cluster) -> Vec<Value> {
    let out = alloc(
        c.dir.path(),
        &["list", "--json", "--coordinator", c.addr.as_str()],
    );
    out.expect_code(0);
    out.json().as_array().cloned().unwrap_or_default()
}

/// The allocations that still count (queued or running).
fn live(allocs: &[Value]) -> Vec<Value> {
    allocs
        .iter()
        .filter(|a| a["state"] == "queued" || a["state"] == "running")
        .cloned()
        .collect()
}

#[test]
fn a_knary_job_on_slurm_workers_survives_a_scancel_and_the_allocation_is_replaced() {
    if let Err(why) = slurm_up() {
        eprintln!("skipped: no Slurm here: {why}");
        return;
    }
    let c = Cluster::start_with(
        bin(),
        ClusterOpts {
            workers: 0,
            coordinator_args: veriflow_testkit::LOADED_FD
                .iter()
                .map(|a| a.to_string())
                .collect(),
            ..ClusterOpts::default()
        },
    );
    let _cancel = CancelOnDrop {
        tmp: c.dir.path().to_path_buf(),
        coordinator: c.addr.clone(),
    };
    let logs = c.dir.path().join("slurm");
    let mut watch = Command::new(bin())
        .args([
            "alloc",
            "slurm",
            "--coordinator",
            &c.addr,
            "--key",
            s(&c.key),
            "--workers",
            "3",
            "--threads",
            "1",
            "--time-limit",
            "30m",
            "--worker-host",
            "127.0.0.1",
            "--log-dir",
            s(&logs),
            "--watch",
            "--watch-interval",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(c.dir.path().join("watch.log")).expect("the watcher's log"))
        .spawn()
        .expect("alloc slurm --watch starts");
    let stdout = watch.stdout.take().expect("piped");
    let watch = Proc(watch);
    let submitted = Arc::new(Mutex::new(Vec::<(Instant, String)>::new()));
    {
        let submitted = submitted.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                submitted.lock().unwrap().push((Instant::now(), line));
            }
        });
    }

    // Three Slurm jobs, each a worker that joins the coordinator.
    let v = c.status_until("3 workers from Slurm", LIMIT, |v| {
        v["workers"].as_array().map(Vec::len) == Some(3)
    });
    for w in v["workers"].as_array().unwrap() {
        assert_eq!(w["spare"], false, "{v}");
        assert_eq!(w["threads"], 1, "{v}");
    }
    let first = live(&allocations(&c));
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(
        first
            .iter()
            .all(|a| a["role"] == "worker" && a["state"] == "running"),
        "{first:?}"
    );
    assert_eq!(submitted.lock().unwrap().len(), 3, "{:?}", submitted);

    // A job, and one worker's allocation cancelled while it runs.
    let run = c.submit(&PROGRAM);
    c.status_until("the job running with progress", LIMIT, |v| {
        v["jobs"][0]["state"] == "running" && v["jobs"][0]["tasks_completed"].as_u64() > Some(0)
    });
    let victim = first[1]["id"].as_str().expect("an id").to_string();
    let cancelled = Instant::now();
    let out = Command::new("scancel")
        .arg(&victim)
        .output()
        .expect("scancel runs");
    assert!(out.status.success(), "scancel {victim}: {out:?}");

    let (code, v, err) = wait_json_within(run, LIMIT, "the job on Slurm workers");
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["correct"], true, "{v}");
    assert_eq!(v["result"], knary::expected_nodes(8, 4).unwrap(), "{v}");
    assert_eq!(v["tasks"], knary::expected_tasks(8, 4).unwrap(), "{v}");
    assert_eq!(
        v["failures"], 1,
        "the cancelled allocation is a lost worker: {v}"
    );

    eprintln!(
        "job: {} s on Slurm workers, {} worker lost; scancel to the job's end: {:.1} s",
        v["elapsed_s"],
        v["failures"],
        cancelled.elapsed().as_secs_f64()
    );

    // The watcher saw the allocation end while the job needed workers, and replaced it.
    let t0 = Instant::now();
    let replacement = loop {
        let now = allocations(&c);
        let new: Vec<&Value> = now
            .iter()
            .filter(|a| first.iter().all(|f| f["id"] != a["id"]))
            .collect();
        if let Some(a) = new.first() {
            assert_eq!(a["role"], "worker", "{now:?}");
            break a["id"].as_str().unwrap().to_string();
        }
        assert!(
            t0.elapsed() < LIMIT,
            "no replacement of allocation {victim} within {LIMIT:?}: {now:?}; watcher said {:?}",
            submitted.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let said = format!("allocation {replacement} submitted (worker)");
    let at = submitted
        .lock()
        .unwrap()
        .iter()
        .find(|(_, l)| *l == said)
        .map(|(t, _)| *t)
        .unwrap_or_else(|| panic!("the watcher did not say {said:?}: {submitted:?}"));
    eprintln!(
        "replacement allocation {replacement} submitted {:.1} s after the scancel",
        at.saturating_duration_since(cancelled).as_secs_f64()
    );

    // The final log: each task declared, started and completed once.
    let inspect = run_bin(
        bin(),
        c.dir.path(),
        &[
            "inspect",
            "--store",
            &c.store,
            "--key",
            s(&c.key),
            "--run",
            "job-1",
            "--json",
        ],
    );
    inspect.expect_code(0);
    let i = inspect.json();
    let want = knary::expected_tasks(8, 4).unwrap();
    for k in ["declared", "started", "completed"] {
        assert_eq!(i["tasks"][k], want, "{k}: each task once\n{i}");
    }

    // `alloc cancel --all` ends the pool (the watcher stopped first, or it would refill it).
    drop(watch);
    let out = alloc(
        c.dir.path(),
        &["cancel", "--all", "--coordinator", c.addr.as_str()],
    );
    out.expect_code(0);
    assert!(out.stdout.contains(&replacement), "{out}");
    let t0 = Instant::now();
    while !live(&allocations(&c)).is_empty() {
        assert!(t0.elapsed() < LIMIT, "allocations still there after cancel");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Workers that fail at once (they cannot listen on the address given) make a watcher stop
/// after three allocations rather than submit forever (`alloc` rule 7); their logs say why.
#[test]
fn a_watcher_stops_when_its_workers_fail_at_once() {
    if let Err(why) = slurm_up() {
        eprintln!("skipped: no Slurm here: {why}");
        return;
    }
    // A coordinator with a submission waiting for workers: the workers are needed.
    let c = Cluster::start_with(bin(), ClusterOpts::default());
    let tmp = c.dir.path().join("slurm");
    let tmp = tmp.as_path();
    std::fs::create_dir(tmp).unwrap();
    let coordinator = c.addr.as_str();
    let key = &c.key;
    let _cancel = CancelOnDrop {
        tmp: tmp.to_path_buf(),
        coordinator: coordinator.to_string(),
    };
    let _waiting = Proc(c.submit(&PROGRAM));
    c.status_until("a submission waiting", LIMIT, |v| v["waiting"] == 1);
    let watch = Command::new(bin())
        .args([
            "alloc",
            "slurm",
            "--coordinator",
            coordinator,
            "--key",
            s(key),
            "--workers",
            "1",
            // TEST-NET-1 (RFC 5737): no interface here has it, so the worker cannot listen.
            "--worker-host",
            "192.0.2.1",
            "--log-dir",
            s(tmp),
            "--watch",
            "--watch-interval",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("alloc slurm --watch starts");
    let (code, _, err) = wait_json_within(watch, LIMIT, "a watcher of failing workers");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("3 allocations in a row failed"), "{err}");
    assert!(err.contains(s(tmp)), "names the logs: {err}");
    let logs: Vec<String> = std::fs::read_dir(tmp)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("veriflow-knary-")
        })
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert_eq!(logs.len(), 3, "{logs:?}");
    assert!(
        logs.iter()
            .all(|l| l.contains("cannot listen on 192.0.2.1")),
        "{logs:?}"
    );
}

/// A directory holding a fake `NAME` script (for PATH), printing `stderr` and exiting `code`.
fn fake(dir: &Path, name: &str, stderr: &str, code: i32) {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("#!/bin/sh\necho '{stderr}' >&2\nexit {code}\n"),
    )
    .expect("a fake command");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// `knary alloc slurm` of one worker with PATH = `path`: (exit status, stderr).
fn alloc_slurm_with_path(tmp: &Path, path: &Path, extra: &[&str]) -> (i32, String) {
    let key = tmp.join("k");
    if !key.exists() {
        run_bin(bin(), tmp, &["keygen", s(&key)]).expect_code(0);
    }
    let out = Command::new(bin())
        .args([
            "alloc",
            "slurm",
            "--coordinator",
            "127.0.0.1:9",
            "--key",
            s(&key),
            "--workers",
            "1",
            "--log-dir",
            s(tmp),
        ])
        .args(extra)
        .env("PATH", path)
        .output()
        .expect("knary runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    (out.status.code().unwrap_or(-1), err)
}

#[test]
fn alloc_says_when_sbatch_is_missing_or_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (code, err) = alloc_slurm_with_path(tmp.path(), &empty, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot run sbatch") && err.contains("on PATH"),
        "{err}"
    );

    let refusing = tmp.path().join("refusing");
    std::fs::create_dir(&refusing).unwrap();
    fake(
        &refusing,
        "sbatch",
        "sbatch: error: Batch job submission failed: Invalid account",
        1,
    );
    let (code, err) = alloc_slurm_with_path(tmp.path(), &refusing, &["--", "--account=nope"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("sbatch refused") && err.contains("Invalid account"),
        "{err}"
    );

    // A watcher that cannot list the pool says so at once.
    fake(
        &refusing,
        "squeue",
        "squeue: error: slurm_load_jobs error",
        1,
    );
    let (code, err) = alloc_slurm_with_path(tmp.path(), &refusing, &["--watch"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("squeue refused"), "{err}");
}

#[test]
fn alloc_refuses_bad_flags() {
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("k");
    run_bin(bin(), tmp.path(), &["keygen", s(&key)]).expect_code(0);
    let base = ["slurm", "--coordinator", "127.0.0.1:9", "--key", s(&key)];
    for (extra, needle) in [
        (&["--workers", "0"][..], "--workers"),
        (&["--workers", "2", "--time-limit", "1x"], "time limit"),
        (&["--workers", "2", "--per", "socket"], "--per"),
        (&["--workers", "2", "--watch-interval", "3"], "--watch"),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        alloc(tmp.path(), &args).expect_code(2).stderr_has(needle);
    }
    // A key that is not one: before anything is submitted.
    let not_key = tmp.path().join("not-a-key");
    std::fs::write(&not_key, "hello").unwrap();
    let out = alloc(
        tmp.path(),
        &[
            "slurm",
            "--coordinator",
            "127.0.0.1:9",
            "--key",
            s(&not_key),
            "--workers",
            "1",
        ],
    );
    out.expect_code(1);
    alloc(tmp.path(), &["cancel"]).expect_code(2);
    alloc(tmp.path(), &["cancel", "12;rm"])
        .expect_code(2)
        .stderr_has("not a Slurm job id");
}

//! `paper cg --parts dataflow`: the logged data-flow CG (`cg run`, dataflow mode, log on: the
//! default) against the same run without the log and against scipy, per iteration, with each
//! run's peak memory (issue 17 target 8).
//!
//! Method:
//!
//! 1. `cg run --matrix poisson3d:N --rtol 1e-8 --json` (default N = 100: n = 10^6; 4 blocks,
//!    batch 8, the machine's cores as threads and vnodes), logged to a fresh directory
//!    (`--store ENGINE:DIR`, `--dataflow-engine`, default `local`: sled, what `--log-dir`
//!    opens; removed after each run), and the same with `--no-checkpoint`; the two
//!    interleaved, `--runs` times each. Time per iteration = the run's `elapsed_s` / its
//!    iterations (both from its JSON summary: start-up and matrix generation are outside).
//! 2. Peak memory: the child's peak RSS (`ru_maxrss` of `wait4`), against the problem's data:
//!    the CSR matrix (8-byte values, 4-byte columns, 8-byte row offsets) and the five vectors
//!    CG holds (b, x, r, p, q).
//! 3. scipy: `scipy.sparse.linalg.cg` on the same matrix, one core, per iteration (the kernel
//!    part's script, [`crate::cg::scipy`]), in the same session.
//! 4. Targets: logged ≤ 2× scipy per iteration; peak memory ≤ 3× the problem's data.
//! 5. **The disk's floor.** Each logged run's store is measured before it is removed (bytes
//!    of its directory / iterations: what the log stores per iteration). Then the same bytes
//!    are written as files of [`FLOOR_FILE`] bytes in a directory beside the logs, each made
//!    durable (`fdatasync`, as the log's value files are: `value_files.rs` rule 2), one
//!    iteration's worth at a time, [`FLOOR_ROUNDS`] times: no logged run that stores every
//!    vector durably can take less per iteration on this file system, whatever its CPU costs.
//!    Against 2× scipy it says whether the time target is within the disk's reach.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::cg::CgArgs;
use crate::harness::{app_binary, loadavg, Quiet, Stats};

/// Target: logged data-flow CG per iteration against scipy's.
const TARGET_VS_SCIPY: f64 = 2.0;
/// Target: peak memory against the problem's data.
const TARGET_MEMORY_RATIO: f64 = 3.0;
/// Bytes of one file of the disk's floor (rule 5): one vector of n = 10^6 f64s.
const FLOOR_FILE: usize = 8 << 20;
/// Iterations' worth of bytes the floor writes (rule 5).
const FLOOR_ROUNDS: usize = 10;

/// Rule 5: milliseconds to write `bytes` as durable files in `dir`, once per round.
fn disk_floor(dir: &Path, bytes: u64) -> Result<Vec<f64>> {
    use std::io::Write as _;
    let chunk = vec![0x5au8; FLOOR_FILE];
    let mut times = Vec::with_capacity(FLOOR_ROUNDS);
    for round in 0..FLOOR_ROUNDS {
        let t = std::time::Instant::now();
        let (mut left, mut i) = (bytes, 0);
        while left > 0 {
            let n = usize::try_from(left).map_or(FLOOR_FILE, |l| l.min(FLOOR_FILE));
            let path = dir.join(format!("floor-{round}-{i}"));
            let mut f = std::fs::File::create(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            f.write_all(&chunk[..n])
                .and_then(|()| f.sync_data())
                .with_context(|| format!("cannot write {}", path.display()))?;
            left -= n as u64;
            i += 1;
        }
        times.push(crate::harness::report::ms(t.elapsed()));
        for j in 0..i {
            let _ = std::fs::remove_file(dir.join(format!("floor-{round}-{j}")));
        }
    }
    Ok(times)
}

/// One child run: its JSON summary and its peak RSS in bytes.
fn child(cg: &Path, args: &[String]) -> Result<(Value, u64)> {
    let out = tempfile::NamedTempFile::new().context("a temporary file for cg's output")?;
    let child = Command::new(cg)
        .args(args)
        .stdout(Stdio::from(out.reopen()?))
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", cg.display()))?;
    let pid = libc::pid_t::try_from(child.id()).context("a pid out of range")?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet waited for (std's `Child` is never waited on here);
    // `status` and `usage` are valid for writes.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if r != pid {
        bail!("wait4 on cg: {}", std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("cg {} failed (status {status})", args.join(" "));
    }
    let text = std::fs::read_to_string(out.path())?;
    let v: Value = serde_json::from_str(text.trim())
        .with_context(|| format!("cg's JSON summary: {}", text.trim()))?;
    // ru_maxrss is in KiB on Linux.
    let peak = u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024;
    Ok((v, peak))
}

/// Runs the dataflow part (module docs).
pub(crate) fn dataflow(args: &CgArgs, side: u32, runs: u32) -> Result<Value> {
    let cg = app_binary("cg", "cg", "--cg-bin", args.cg_bin.as_deref())?;
    let a = cg::matrix::poisson::poisson3d(side);
    let n = a.n_rows as u64;
    let nnz = a.nnz() as u64;
    let data_bytes = nnz * (8 + 4) + (n + 1) * 8 + 5 * n * 8;
    drop(a);
    let quiet = Quiet::secs(args.quiet_wait).wait();
    let load_before = loadavg();
    let dir = tempfile::tempdir().context("a temporary log directory")?;
    let base: Vec<String> = [
        "run",
        "--matrix",
        &format!("poisson3d:{side}"),
        "--rtol",
        "1e-8",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let med = |v: &[f64]| Stats::of(v).map_or(f64::NAN, |s| s.median);
    let (mut logged, mut plain) = (Vec::new(), Vec::new());
    let (mut logged_peak, mut plain_peak) = (Vec::new(), Vec::new());
    let mut stored_per_iter = Vec::new();
    let mut iterations = 0;
    for round in 0..runs {
        for log in [true, false] {
            let mut a = base.clone();
            let log_dir = dir.path().join(format!("log{round}"));
            if log {
                a.extend([
                    "--store".to_string(),
                    format!("{}:{}", args.dataflow_engine, log_dir.display()),
                ]);
            } else {
                a.push("--no-checkpoint".to_string());
            }
            let (v, peak) = child(&cg, &a)?;
            let stored = crate::harness::report::dir_bytes(&log_dir);
            let _ = std::fs::remove_dir_all(&log_dir);
            let its = v["result"]["iterations"].as_u64().unwrap_or(0);
            let elapsed = v["elapsed_s"].as_f64().unwrap_or(f64::NAN);
            if its == 0 || v["correct"] != true {
                bail!("cg did not solve poisson3d:{side}: {v}");
            }
            iterations = its;
            if log {
                stored_per_iter.push(stored as f64 / its as f64);
            }
            let per = elapsed * 1e3 / its as f64;
            eprintln!(
                "  dataflow {} round {round}: {its} iterations, {per:.1} ms each, peak {:.0} MiB",
                if log { "logged" } else { "no log" },
                peak as f64 / f64::from(1 << 20)
            );
            let (t, p) = if log {
                (&mut logged, &mut logged_peak)
            } else {
                (&mut plain, &mut plain_peak)
            };
            t.push(per);
            p.push(peak as f64 / f64::from(1 << 20));
        }
    }
    let stored = med(&stored_per_iter);
    let floor = disk_floor(dir.path(), stored as u64)?;
    let scipy = if args.no_scipy {
        json!({"skipped": "--no-scipy"})
    } else {
        crate::cg::scipy(&args.python, side, runs, iterations)
    };
    let sp = scipy["cg_ms_per_iter"]["median"].as_f64();
    let floor_vs_scipy = sp.map(|s| med(&floor) / s);
    let data_mib = data_bytes as f64 / f64::from(1 << 20);
    let logged_vs_scipy = sp.map(|s| med(&logged) / s);
    let memory_ratio = med(&logged_peak) / data_mib;
    Ok(json!({
        "matrix": format!("poisson3d:{side}"),
        "n": n,
        "nnz": nnz,
        "iterations": iterations,
        "runs": runs,
        "command": format!("cg {}", base.join(" ")),
        "engine": args.dataflow_engine,
        "quiet_before": quiet,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "logged_ms_per_iter": Stats::of(&logged),
        "no_log_ms_per_iter": Stats::of(&plain),
        "logged_peak_mib": Stats::of(&logged_peak),
        "no_log_peak_mib": Stats::of(&plain_peak),
        "problem_data_mib": data_mib,
        "stored_mb_per_iter": stored / 1e6,
        "disk_floor_ms_per_iter": Stats::of(&floor),
        "scipy": scipy,
        "targets": {
            "logged_vs_scipy": logged_vs_scipy,
            "logged_vs_no_log": med(&logged) / med(&plain),
            "floor_vs_scipy": floor_vs_scipy,
            "floor_in_reach": floor_vs_scipy.map(|r| r <= TARGET_VS_SCIPY),
            "peak_vs_data": memory_ratio,
            "time_met": logged_vs_scipy.map(|r| r <= TARGET_VS_SCIPY),
            "memory_met": memory_ratio <= TARGET_MEMORY_RATIO,
        },
    }))
}

/// The dataflow part's section of `cg.md`.
pub(crate) fn markdown(r: &Value) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let d = &r["dataflow"];
    if d.is_null() {
        return s;
    }
    let f = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.1}"));
    let stat = |v: &Value| format!("{} ({}-{})", f(&v["median"]), f(&v["min"]), f(&v["max"]));
    let _ = writeln!(
        s,
        "\n# paper cg --parts dataflow: the logged data-flow CG (issue 17 target 8)\n"
    );
    let _ = writeln!(
        s,
        "{} · load {} → {} · `{}` (logged to `--store {}:DIR`, and with --no-checkpoint), \
         interleaved, medians over {} runs (min-max); {} iterations; n = {}, nnz = {}.\n",
        d["date"].as_str().or(r["date"].as_str()).unwrap_or("?"),
        d["loadavg_before"].as_str().unwrap_or("?"),
        d["loadavg_after"].as_str().unwrap_or("?"),
        d["command"].as_str().unwrap_or("?"),
        d["engine"].as_str().unwrap_or("local"),
        d["runs"],
        d["iterations"],
        d["n"],
        d["nnz"],
    );
    let _ = writeln!(s, "| | ms per iteration | peak RSS (MiB) |");
    let _ = writeln!(s, "|---|---|---|");
    let _ = writeln!(
        s,
        "| logged (log on) | {} | {} |",
        stat(&d["logged_ms_per_iter"]),
        stat(&d["logged_peak_mib"])
    );
    let _ = writeln!(
        s,
        "| no log | {} | {} |",
        stat(&d["no_log_ms_per_iter"]),
        stat(&d["no_log_peak_mib"])
    );
    let _ = writeln!(
        s,
        "| scipy cg, one core | {} | |",
        stat(&d["scipy"]["cg_ms_per_iter"])
    );
    let t = &d["targets"];
    let yes = |v: &Value| match v.as_bool() {
        Some(true) => "met",
        Some(false) => "not met",
        None => "-",
    };
    let _ = writeln!(
        s,
        "\nLogged / scipy: {} (target ≤ {TARGET_VS_SCIPY}: {}); logged / no log: {}; peak RSS \
         / problem data ({} MiB): {} (target ≤ {TARGET_MEMORY_RATIO}: {}).",
        f(&t["logged_vs_scipy"]),
        yes(&t["time_met"]),
        f(&t["logged_vs_no_log"]),
        f(&d["problem_data_mib"]),
        f(&t["peak_vs_data"]),
        yes(&t["memory_met"]),
    );
    if !d["disk_floor_ms_per_iter"].is_null() {
        let _ = writeln!(
            s,
            "\nThe disk's floor (rule 5): the log stored {} MB per iteration; writing that \
             much as durable 8 MiB files (`fdatasync` each) in the same file system took {} ms \
             per iteration ({FLOOR_ROUNDS} rounds), {} × scipy: {}.",
            f(&d["stored_mb_per_iter"]),
            stat(&d["disk_floor_ms_per_iter"]),
            f(&t["floor_vs_scipy"]),
            match t["floor_in_reach"].as_bool() {
                Some(true) => "the time target is within the disk's reach",
                Some(false) =>
                    "no logged run that stores every vector can meet the time target here",
                None => "-",
            },
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule 5: every round writes the bytes and removes its files.
    #[test]
    fn the_disk_floor_writes_each_round_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let times = disk_floor(dir.path(), 100_000).unwrap();
        assert_eq!(times.len(), FLOOR_ROUNDS);
        assert!(times.iter().all(|t| t.is_finite() && *t > 0.0));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let gone = dir.path().join("gone");
        assert!(
            disk_floor(&gone, 10).is_err(),
            "a missing directory is an error"
        );
    }

    /// Rule 5 in the report: the floor's verdict follows floor / scipy.
    #[test]
    fn the_report_says_whether_the_disk_floor_is_within_reach() {
        let report = |floor_vs_scipy: f64| {
            json!({"dataflow": {
                "stored_mb_per_iter": 32.0,
                "disk_floor_ms_per_iter": {"median": 40.0, "min": 35.0, "max": 50.0},
                "targets": {
                    "floor_vs_scipy": floor_vs_scipy,
                    "floor_in_reach": floor_vs_scipy <= TARGET_VS_SCIPY,
                },
            }})
        };
        let far = markdown(&report(4.0));
        assert!(far.contains("32.0 MB per iteration"), "{far}");
        assert!(far.contains("40.0 (35.0-50.0) ms"), "{far}");
        assert!(
            far.contains("no logged run that stores every vector"),
            "{far}"
        );
        assert!(markdown(&report(1.5)).contains("within the disk's reach"));
    }
}

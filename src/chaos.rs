//! `APP chaos`: real processes under a seeded fault schedule (issue 15).
//!
//! Jobs run back to back for `--seconds`, each on a fresh cluster of its own: six checkpoint
//! server processes under `ida:4,2,quorum`, two coordinators (one active, one standby) and
//! `--workers` worker processes, all on loopback. The programs cycle over this binary's own
//! and those of the other veriflow apps found beside it (knary, nqueens, cg). Meanwhile a
//! schedule drawn from `--seed` injects a fault every 3 to 6 s (`--fault-every`):
//!
//! - a worker SIGKILLed, and a new worker process started in its place;
//! - a checkpoint server SIGKILLed and restarted on its address and data a second later (one
//!   at a time: the quorum acknowledges at 5 of 6);
//! - the active coordinator SIGKILLed and restarted as the standby of its successor, on its
//!   address (at most one takeover in flight);
//! - a worker, server or coordinator SIGSTOPped for 1 to 3 s, then SIGCONTed.
//!
//! Every job must end with exit 0, its result checked by the program and its log certified
//! (`submit --certify`, ACCEPT); a job that has not ended within `JOB_LIMIT` is a hang. The
//! report (JSON, `--report FILE`) lists the faults injected by kind and each job's outcome.
//! Every loop is bounded by the budget or by `JOB_LIMIT`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process};
use std::time::{Duration, Instant};

use clap::Args;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};
use veriflow_checkpoint::launch::{server_binary, ServerProcess};
use veriflow_checkpoint::Key;

use crate::app::CliError;
use crate::cluster_cli::spawn;

#[derive(Args, Debug)]
pub(crate) struct ChaosArgs {
    /// How long to keep starting jobs, in seconds (a job in flight at the end finishes).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    seconds: u64,
    /// Seed of the fault schedule.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Worker processes of each job's cluster.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=16))]
    workers: u32,
    /// Seconds between faults, drawn uniformly in [MIN, MAX].
    #[arg(long, value_name = "MIN,MAX", value_delimiter = ',', default_values_t = [3.0, 6.0])]
    fault_every: Vec<f64>,
    /// Write the JSON report here too.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
}

/// Longest a job may take under faults before it counts as a hang.
const JOB_LIMIT: Duration = Duration::from_secs(240);
/// The coordinators' lease: a takeover within about a second.
const LEASE_MS: &str = "1000";
/// A coordinator is killed only this long after the last takeover began (one in flight).
const TAKEOVER_SETTLE: Duration = Duration::from_secs(6);

/// Each program's job under chaos: small enough for a few per minute on two cores.
fn job_args(program: &str) -> Option<&'static [&'static str]> {
    Some(match program {
        "knary" => &["--depth", "7", "--fanout", "5", "--grain-us", "300"],
        "nqueens" => &["-n", "15", "--split-rows", "3"],
        "cg" => &["--matrix", "poisson3d:24", "--blocks", "8"],
        _ => return None,
    })
}

/// The programs to cycle over: this one first, then the other apps beside this binary.
fn programs(own: &str) -> Result<Vec<(String, PathBuf)>, CliError> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Invalid(format!("cannot find this program's binary: {e}")))?;
    let mut all = vec![(own.to_string(), exe.clone())];
    for other in ["knary", "nqueens", "cg"] {
        let path = exe.with_file_name(other);
        if other != own && path.is_file() {
            all.push((other.to_string(), path));
        }
    }
    all.retain(|(p, _)| job_args(p).is_some());
    if all.is_empty() {
        return Err(CliError::Invalid(format!(
            "chaos runs knary, nqueens and cg jobs; {own} is none of them and none is beside it"
        )));
    }
    Ok(all)
}

/// A process SIGKILLed and reaped when dropped.
struct Proc {
    child: Option<Child>,
    what: String,
}

impl Proc {
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The faults injected, by kind.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    worker_kills: u32,
    server_kills: u32,
    coordinator_kills: u32,
    pauses: u32,
}

impl Counts {
    fn kills(&self) -> u32 {
        self.worker_kills + self.server_kills + self.coordinator_kills
    }
}

/// One job's cluster.
struct Job {
    dir: tempfile::TempDir,
    bin: PathBuf,
    key: PathBuf,
    servers: Vec<ServerProcess>,
    /// The coordinators' addresses, fixed for the job (a restart reuses its address).
    caddrs: Vec<String>,
    coordinators: Vec<Proc>,
    active: usize,
    last_takeover: Option<Instant>,
    workers: Vec<Proc>,
    spawned: usize,
    /// Paused processes and when they continue.
    paused: Vec<(u32, Instant)>,
    /// A killed server and when it restarts.
    server_down: Option<(usize, Instant)>,
}

impl Job {
    fn start(bin: &Path, workers: u32) -> Result<Job, CliError> {
        let dir = tempfile::Builder::new()
            .prefix("veriflow-chaos-")
            .tempdir()
            .map_err(|source| CliError::Io {
                what: "cannot create a directory in",
                path: std::env::temp_dir(),
                source,
            })?;
        let key = dir.path().join("cluster.key");
        Key::create(&key)?;
        let server_bin = server_binary().ok_or_else(|| {
            CliError::Invalid(
                "chaos needs the checkpoint-server binary beside this one (cargo build \
                 -p veriflow-checkpoint --bin checkpoint-server)"
                    .into(),
            )
        })?;
        let mut servers = Vec::new();
        for i in 0..6 {
            let data = dir.path().join(format!("cs{i}"));
            servers.push(
                ServerProcess::start(&server_bin, "127.0.0.1:0", Some(&data), &key).map_err(
                    |e| CliError::Invalid(format!("cannot start a checkpoint server: {e}")),
                )?,
            );
        }
        let mut job = Job {
            dir,
            bin: bin.to_path_buf(),
            key,
            servers,
            caddrs: Vec::new(),
            coordinators: Vec::new(),
            active: 0,
            last_takeover: None,
            workers: Vec::new(),
            spawned: 0,
            paused: Vec::new(),
            server_down: None,
        };
        for i in 0..2 {
            let (p, addr) = job.start_coordinator("127.0.0.1:0", i > 0)?;
            job.coordinators.push(p);
            job.caddrs.push(addr);
        }
        for _ in 0..workers {
            job.add_worker()?;
        }
        Ok(job)
    }

    fn store(&self) -> String {
        let addrs: Vec<&str> = self.servers.iter().map(|s| s.addr.as_str()).collect();
        format!("ida:4,2,quorum:{}", addrs.join(","))
    }

    fn start_coordinator(
        &mut self,
        listen: &str,
        standby: bool,
    ) -> Result<(Proc, String), CliError> {
        let n = self.dir.path().read_dir().map_or(0, |d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("coord"))
                .count()
        });
        let log = self.dir.path().join(format!("coord{n}.log"));
        let mut args = vec![
            "coordinator".to_string(),
            "--listen".into(),
            listen.into(),
            "--key".into(),
            self.key.display().to_string(),
            "--store".into(),
            self.store(),
            "--lease-ms".into(),
            LEASE_MS.into(),
        ];
        if standby {
            args.push("--standby".into());
        }
        let mut child = spawn(&self.bin, &args, &log)?;
        let addr = crate::cluster_cli::coordinator_started(&mut child, &log, !standby);
        let proc = Proc {
            child: Some(child),
            what: format!("coordinator {n}"),
        };
        let addr = addr?;
        Ok((proc, addr))
    }

    fn add_worker(&mut self) -> Result<(), CliError> {
        let log = self.dir.path().join(format!("w{}.log", self.spawned));
        let args = vec![
            "worker".to_string(),
            "--join".into(),
            self.caddrs.join(","),
            "--key".into(),
            self.key.display().to_string(),
            "--threads".into(),
            "1".into(),
        ];
        let child = spawn(&self.bin, &args, &log)?;
        self.workers.push(Proc {
            child: Some(child),
            what: format!("worker process {}", self.spawned),
        });
        self.spawned += 1;
        Ok(())
    }

    fn submit(&self, program: &str) -> Result<Child, CliError> {
        let mut args = vec![
            "submit".to_string(),
            "--coordinator".into(),
            self.caddrs.join(","),
            "--key".into(),
            self.key.display().to_string(),
            "--json".into(),
            "--certify".into(),
        ];
        args.extend(
            job_args(program)
                .unwrap_or_default()
                .iter()
                .map(|s| s.to_string()),
        );
        let log = self.dir.path().join("submit.log");
        spawn(&self.bin, &args, &log)
    }

    /// Continues paused processes and restarts a server whose time has come.
    fn heal(&mut self, now: Instant) -> Result<(), CliError> {
        self.paused.retain(|&(pid, until)| {
            if now >= until {
                let _ = Process::new("kill")
                    .args(["-CONT", &pid.to_string()])
                    .status();
                false
            } else {
                true
            }
        });
        if let Some((i, at)) = self.server_down {
            if now >= at {
                self.servers[i]
                    .restart()
                    .map_err(|e| CliError::Invalid(format!("cannot restart a server: {e}")))?;
                self.server_down = None;
            }
        }
        Ok(())
    }

    /// Injects one fault drawn from `rng`; returns what it did.
    fn fault(&mut self, rng: &mut ChaCha8Rng, counts: &mut Counts) -> Result<String, CliError> {
        let now = Instant::now();
        let coordinator_ok = self
            .last_takeover
            .is_none_or(|t| now.duration_since(t) >= TAKEOVER_SETTLE);
        let roll: f64 = rng.random();
        if roll < 0.15 && coordinator_ok {
            // The active coordinator dies; it comes back as its successor's standby.
            let a = self.active;
            self.coordinators[a].kill();
            let addr = self.caddrs[a].clone();
            let (p, _) = self.start_coordinator(&addr, true)?;
            self.coordinators[a] = p;
            self.active = 1 - a;
            self.last_takeover = Some(now);
            counts.coordinator_kills += 1;
            return Ok(format!("killed the active coordinator {addr}"));
        }
        if roll < 0.35 && self.server_down.is_none() {
            let i = rng.random_range(0..self.servers.len());
            self.servers[i].kill();
            self.server_down = Some((i, now + Duration::from_millis(rng.random_range(500..2000))));
            counts.server_kills += 1;
            return Ok(format!("killed checkpoint server {}", self.servers[i].addr));
        }
        if roll < 0.55 {
            let mut pids: Vec<(u32, String)> = self
                .workers
                .iter()
                .filter_map(|w| w.pid().map(|p| (p, w.what.clone())))
                .collect();
            pids.extend(
                self.coordinators
                    .iter()
                    .filter_map(|c| c.pid().map(|p| (p, c.what.clone()))),
            );
            if self.server_down.is_none() {
                pids.extend(
                    self.servers
                        .iter()
                        .filter_map(|s| s.pid().map(|p| (p, format!("server {}", s.addr)))),
                );
            }
            pids.retain(|(p, _)| self.paused.iter().all(|(q, _)| q != p));
            if !pids.is_empty() {
                let (pid, what) = pids.swap_remove(rng.random_range(0..pids.len()));
                let _ = Process::new("kill")
                    .args(["-STOP", &pid.to_string()])
                    .status();
                let secs = rng.random_range(1.0..3.0);
                self.paused.push((pid, now + Duration::from_secs_f64(secs)));
                counts.pauses += 1;
                return Ok(format!("paused {what} for {secs:.1} s"));
            }
        }
        let i = rng.random_range(0..self.workers.len());
        let what = self.workers[i].what.clone();
        self.workers[i].kill();
        self.workers.swap_remove(i);
        self.add_worker()?;
        counts.worker_kills += 1;
        Ok(format!("killed {what} and started another"))
    }

    /// Continues everything paused (before tearing down or reading logs).
    fn resume_all(&mut self) {
        for (pid, _) in self.paused.drain(..) {
            let _ = Process::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        }
    }
}

/// `APP chaos`.
pub(crate) fn chaos_cmd(args: &ChaosArgs, own: &str) -> Result<(), CliError> {
    let (lo, hi) = match args.fault_every.as_slice() {
        [lo, hi] if *lo > 0.0 && lo <= hi => (*lo, *hi),
        _ => {
            return Err(CliError::Usage(
                "--fault-every MIN,MAX: 0 < MIN <= MAX seconds".into(),
            ))
        }
    };
    let programs = programs(own)?;
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let budget = Duration::from_secs(args.seconds);
    let start = Instant::now();
    let mut counts = Counts::default();
    let mut jobs: Vec<Value> = Vec::new();
    let mut next_fault = start + Duration::from_secs_f64(rng.random_range(lo..=hi));
    let mut all_right = true;
    let mut n = 0usize;
    while start.elapsed() < budget {
        let (program, bin) = &programs[n % programs.len()];
        n += 1;
        let mut job = Job::start(bin, args.workers)?;
        let began = Instant::now();
        let mut submit = job.submit(program)?;
        let mut faults: Vec<String> = Vec::new();
        let status = loop {
            if let Some(s) = submit
                .try_wait()
                .map_err(|e| CliError::Invalid(e.to_string()))?
            {
                break Some(s);
            }
            if began.elapsed() >= JOB_LIMIT {
                break None;
            }
            let now = Instant::now();
            job.heal(now)?;
            if now >= next_fault && start.elapsed() < budget {
                let what = job.fault(&mut rng, &mut counts)?;
                eprintln!(
                    "chaos: {:>6.1} s  {program}: {what}",
                    start.elapsed().as_secs_f64()
                );
                faults.push(what);
                next_fault = now + Duration::from_secs_f64(rng.random_range(lo..=hi));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        job.resume_all();
        let mut out = String::new();
        if let Some(mut o) = submit.stdout.take() {
            use std::io::Read as _;
            let _ = o.read_to_string(&mut out);
        }
        if status.is_none() {
            let _ = submit.kill();
            let _ = submit.wait();
        }
        let summary: Value = serde_json::from_str(out.trim()).unwrap_or(Value::Null);
        let log = std::fs::read_to_string(job.dir.path().join("submit.log")).unwrap_or_default();
        let verdict = summary["certificate"]["decision"]
            .as_str()
            .map(str::to_string);
        let ok = status.is_some_and(|s| s.success())
            && summary["correct"] == true
            && verdict.as_deref() == Some("ACCEPT");
        let outcome = match status {
            None => format!("hung: no end within {JOB_LIMIT:?}"),
            Some(_) if ok => "right, certified".to_string(),
            Some(s) => format!(
                "wrong or failed (exit {:?}): {}",
                s.code(),
                log.lines().last().unwrap_or("")
            ),
        };
        eprintln!(
            "chaos: {:>6.1} s  {program} job {n}: {outcome} ({} fault(s) during it)",
            start.elapsed().as_secs_f64(),
            faults.len()
        );
        let kept = if ok {
            None
        } else {
            all_right = false;
            Some(job.dir.path().display().to_string())
        };
        jobs.push(json!({
            "program": program,
            "args": job_args(program),
            "ok": ok,
            "outcome": outcome,
            "elapsed_s": began.elapsed().as_secs_f64(),
            "tasks": summary["tasks"],
            "workers_lost": summary["failures"],
            "takeovers": log.matches("took the job over").count(),
            "certificate": verdict,
            "faults": faults,
            "logs": kept,
        }));
        if !ok {
            // Keep the evidence: the processes' logs stay on disk.
            let Job { dir, .. } = job;
            let _ = dir.keep();
        }
    }
    let report = json!({
        "seed": args.seed,
        "seconds": args.seconds,
        "elapsed_s": start.elapsed().as_secs_f64(),
        "workers": args.workers,
        "checkpoint_servers": 6,
        "store_strategy": "ida:4,2,quorum",
        "coordinators": 2,
        "faults": {
            "kills": counts.kills(),
            "worker_kills": counts.worker_kills,
            "checkpoint_server_kills": counts.server_kills,
            "coordinator_kills": counts.coordinator_kills,
            "pauses": counts.pauses,
        },
        "jobs": jobs.len(),
        "jobs_right": jobs.iter().filter(|j| j["ok"] == true).count(),
        "all_right": all_right,
        "per_job": jobs,
    });
    let text =
        serde_json::to_string_pretty(&report).map_err(|e| CliError::Invalid(e.to_string()))?;
    println!("{text}");
    if let Some(path) = &args.report {
        std::fs::write(path, format!("{text}\n")).map_err(|source| CliError::Io {
            what: "cannot write",
            path: path.clone(),
            source,
        })?;
    }
    if all_right {
        Ok(())
    } else {
        Err(CliError::Invalid(
            "chaos: a job was wrong, failed or hung (its logs were kept; see the report)".into(),
        ))
    }
}

//! The Slurm driver of [`alloc`](super): job scripts, and the `sbatch`, `squeue` and `scancel`
//! calls. Everything but [`Slurm`]'s three methods is pure text in, text out.
//!
//! Rules:
//!
//! 1. One `sbatch` per allocation, its script on stdin; `--parsable` makes it print the job id.
//!    The user's extra arguments come after ours on the command line, so they override the
//!    script's `#SBATCH` lines (sbatch's own precedence).
//! 2. The script `exec`s the worker (`alloc` rule 1) with absolute paths for the binary, the
//!    key and the log directory: a compute node sees none of the submitting shell's state.
//! 3. The pool is listed from `squeue --states=all` by job name and comment (`alloc` rule 2):
//!    ended allocations too, with how they ended, while Slurm keeps them (`MinJobAge`); one
//!    that has left the listing has ended.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{AllocState, Allocation, Role};

/// Why a Slurm command failed.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// The command is not there or cannot run.
    #[error("cannot run {program}: {source} (is Slurm installed, and {program} on PATH?)")]
    NotFound {
        /// `sbatch`, `squeue` or `scancel`.
        program: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The command ran and refused (non-zero exit).
    #[error("{program} refused ({status}): {stderr}")]
    Refused {
        /// The command.
        program: &'static str,
        /// Its exit status.
        status: String,
        /// What it said.
        stderr: String,
    },
    /// The command's output is not what this driver reads.
    #[error("{program} printed {output:?}, which is not {expected}")]
    Unreadable {
        /// The command.
        program: &'static str,
        /// What it printed.
        output: String,
        /// What was expected.
        expected: &'static str,
    },
}

/// One worker per Slurm task or per node (`alloc` rule 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Per {
    /// One task of `threads` CPUs; allocations share nodes.
    #[default]
    Task,
    /// A whole node (`--exclusive`); the worker takes all its CPUs unless `threads` says.
    Node,
}

/// What every allocation of a pool runs.
#[derive(Debug, Clone)]
pub struct SlurmSpec {
    /// The program (app) name: the job name is `veriflow-<program>`.
    pub program: String,
    /// The app binary, absolute.
    pub exe: PathBuf,
    /// The coordinators' addresses the workers join.
    pub coordinators: Vec<String>,
    /// The cluster's key file, absolute (on a file system the nodes share).
    pub key: PathBuf,
    /// Worker threads (`None`: the task's or node's CPUs).
    pub threads: Option<u32>,
    /// Per task or per node.
    pub per: Per,
    /// The allocation's time limit.
    pub time_limit: Option<Duration>,
    /// The host the worker listens on for its peers (`None`: the node's `hostname`).
    pub worker_host: Option<String>,
    /// Where Slurm writes each allocation's output (`veriflow-<program>-<jobid>.log`), absolute.
    pub log_dir: PathBuf,
    /// More sbatch arguments, after ours (rule 1).
    pub extra: Vec<String>,
}

impl SlurmSpec {
    /// The job name of this program's allocations (`alloc` rule 2).
    pub fn job_name(&self) -> String {
        job_name(&self.program)
    }

    /// The comment that marks an allocation of `role` for these coordinators (`alloc` rule 2).
    pub fn comment(&self, role: Role) -> String {
        format!("veriflow:{role}:{}", self.coordinators.join(","))
    }

    /// The batch script of one allocation of `role` (rule 2).
    pub fn script(&self, role: Role) -> String {
        let mut s = String::from("#!/bin/sh\n");
        let mut line = |l: String| {
            let _ = writeln!(s, "#SBATCH {l}");
        };
        line(format!("--job-name={}", self.job_name()));
        line(format!("--comment={}", self.comment(role)));
        line("--nodes=1".into());
        line("--ntasks=1".into());
        match self.per {
            Per::Task => line(format!("--cpus-per-task={}", self.threads.unwrap_or(1))),
            Per::Node => line("--exclusive".into()),
        }
        if let Some(t) = self.time_limit {
            line(format!("--time={}", slurm_time(t)));
        }
        line(format!(
            "--output={}",
            self.log_dir
                .join(format!("veriflow-{}-%j.log", self.program))
                .display()
        ));
        let _ = writeln!(
            s,
            "# One veriflow {role} for this allocation; the allocation ends when it does."
        );
        let threads = match (self.threads, self.per) {
            (Some(t), _) => t.to_string(),
            (None, Per::Task) => "1".to_string(),
            (None, Per::Node) => "\"${SLURM_CPUS_ON_NODE:-1}\"".to_string(),
        };
        let host = match &self.worker_host {
            Some(h) => quote(h),
            None => "\"$(hostname)\"".to_string(),
        };
        let _ = write!(
            s,
            "exec {} worker --join {} --key {} --threads {threads} --listen {host}:0",
            quote(&self.exe.display().to_string()),
            quote(&self.coordinators.join(",")),
            quote(&self.key.display().to_string()),
        );
        if role == Role::Spare {
            s.push_str(" --spare");
        }
        s.push('\n');
        s
    }
}

/// The job name of `program`'s allocations.
pub fn job_name(program: &str) -> String {
    format!("veriflow-{program}")
}

/// A duration as sbatch's `--time` reads it, rounded up to whole minutes.
pub fn slurm_time(t: Duration) -> String {
    let minutes = t.as_secs().div_ceil(60).max(1);
    let (d, h, m) = (minutes / 1440, minutes / 60 % 24, minutes % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:00")
    } else {
        format!("{h:02}:{m:02}:00")
    }
}

/// `text` in single quotes for sh.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The job id `sbatch --parsable` printed (`id` or `id;cluster`).
pub fn parse_submitted(stdout: &str) -> Result<String, AllocError> {
    let id = stdout.trim().split(';').next().unwrap_or("");
    if !id.is_empty() && id.chars().all(|c| c.is_ascii_digit() || c == '_') {
        Ok(id.to_string())
    } else {
        Err(AllocError::Unreadable {
            program: "sbatch",
            output: stdout.to_string(),
            expected: "a job id",
        })
    }
}

/// squeue's format for [`parse_squeue`]: id, state, comment, time, limit, nodes or reason.
pub const SQUEUE_FORMAT: &str = "%i|%T|%k|%M|%l|%R";

/// The pool's allocations in `squeue --noheader --format=SQUEUE_FORMAT` output; lines of
/// jobs that are not ours (no `veriflow:` comment) are left out (`alloc` rule 2).
pub fn parse_squeue(text: &str) -> Result<Vec<Allocation>, AllocError> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.trim().splitn(6, '|').collect();
        let [id, state, comment, time, limit, nodes] = f[..] else {
            return Err(AllocError::Unreadable {
                program: "squeue",
                output: line.to_string(),
                expected: SQUEUE_FORMAT,
            });
        };
        let mut c = comment.splitn(3, ':');
        let (Some("veriflow"), Some(role), Some(coordinator)) = (c.next(), c.next(), c.next())
        else {
            continue;
        };
        let role = match role {
            "worker" => Role::Worker,
            "spare" => Role::Spare,
            _ => continue,
        };
        out.push(Allocation {
            id: id.to_string(),
            role,
            state: state_of(state),
            raw_state: state.to_string(),
            coordinator: coordinator.to_string(),
            time: time.to_string(),
            time_limit: limit.to_string(),
            nodes: nodes.to_string(),
        });
    }
    Ok(out)
}

/// `alloc` rule 3 in Slurm's words (squeue's long state names).
fn state_of(state: &str) -> AllocState {
    match state {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_FED" | "REQUEUE_HOLD" | "RESIZING" => {
            AllocState::Queued
        }
        "RUNNING" => AllocState::Running,
        // The script (the worker) exited non-zero.
        "FAILED" | "OUT_OF_MEMORY" => AllocState::Failed,
        // Its script ended, Slurm still cleans up: ended how is known after.
        "COMPLETING" | "STAGE_OUT" | "SIGNALING" => AllocState::Ending,
        // SUSPENDED (its worker is stopped, so lost), and every other end.
        _ => AllocState::Ended,
    }
}

/// Runs Slurm's commands (rule 1 and 3).
#[derive(Debug, Clone, Default)]
pub struct Slurm;

impl Slurm {
    /// Submits one allocation of `role`; returns its job id.
    pub fn submit(&self, spec: &SlurmSpec, role: Role) -> Result<String, AllocError> {
        let mut child = Command::new("sbatch")
            .arg("--parsable")
            .args(&spec.extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| AllocError::NotFound {
                program: "sbatch",
                source,
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            // A refusal before reading the script shows in the exit status below.
            let _ = stdin.write_all(spec.script(role).as_bytes());
        }
        let out = child
            .wait_with_output()
            .map_err(|source| AllocError::NotFound {
                program: "sbatch",
                source,
            })?;
        let stdout = checked("sbatch", out)?;
        parse_submitted(&stdout)
    }

    /// The allocations of `program` that Slurm still lists.
    pub fn list(&self, program: &str) -> Result<Vec<Allocation>, AllocError> {
        let out = Command::new("squeue")
            .arg("--noheader")
            .arg("--states=all")
            .arg(format!("--name={}", job_name(program)))
            .arg(format!("--format={SQUEUE_FORMAT}"))
            .stdin(Stdio::null())
            .output()
            .map_err(|source| AllocError::NotFound {
                program: "squeue",
                source,
            })?;
        parse_squeue(&checked("squeue", out)?)
    }

    /// Cancels the allocations `ids` (nothing to do when empty).
    pub fn cancel(&self, ids: &[String]) -> Result<(), AllocError> {
        if ids.is_empty() {
            return Ok(());
        }
        let out = Command::new("scancel")
            .args(ids)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| AllocError::NotFound {
                program: "scancel",
                source,
            })?;
        checked("scancel", out).map(drop)
    }
}

/// The stdout of a command that exited 0, else its refusal.
fn checked(program: &'static str, out: std::process::Output) -> Result<String, AllocError> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(AllocError::Refused {
            program,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

//! Child processes (rule 8 of the harness): the app binaries the experiments run, built fresh
//! in this binary's profile, and children that are always killed and reaped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The `knary` binary: `explicit`, or the one beside this binary after `cargo build -p knary`
/// in this binary's profile (so that it is never stale); without cargo, whatever is there.
pub fn knary_binary(explicit: Option<&Path>) -> Result<PathBuf> {
    app_binary("knary", "knary", "--knary-bin", explicit)
}

/// Binary `bin` of package `package`: `explicit` (given with option `flag`), or the one beside
/// this binary after `cargo build -p <package> --bin <bin>` in this binary's profile (so that
/// it is never stale); without cargo, whatever is there.
pub fn app_binary(
    package: &str,
    bin: &str,
    flag: &str,
    explicit: Option<&Path>,
) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if !p.is_file() {
            bail!("{flag} {}: no such file", p.display());
        }
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    let dir = exe
        .parent()
        .context("this binary has no directory")?
        .to_path_buf();
    let path = dir.join(bin);
    let release = dir.file_name().is_some_and(|d| d == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "-q", "-p", package, "--bin", bin])
        .arg("--manifest-path")
        .arg(&manifest);
    if release {
        cmd.arg("--release");
    }
    eprintln!(
        "building {bin}: {} build -p {package} --bin {bin}{}",
        cargo.to_string_lossy(),
        if release { " --release" } else { "" }
    );
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) if path.is_file() => {
            eprintln!("  (cargo build failed: {s}; using {})", path.display())
        }
        Ok(s) => bail!("building {bin} failed ({s}); pass {flag} PATH"),
        Err(e) if path.is_file() => {
            eprintln!("  (cannot run cargo: {e}; using {})", path.display())
        }
        Err(e) => bail!("cannot run cargo to build {bin} ({e}); pass {flag} PATH"),
    }
    if !path.is_file() {
        bail!("no {bin} at {}; pass {flag} PATH", path.display());
    }
    Ok(path)
}

/// A child process, SIGKILLed and reaped when dropped (or on [`Guard::kill`]). With `group`,
/// the child leads a process group of its own, and the whole group is killed while the child
/// is not yet reaped (its pid, hence the group's id, cannot be reused until then): a `knary
/// cluster` and the coordinator and workers it started go together.
pub struct Guard {
    child: Option<Child>,
    group: bool,
    what: &'static str,
}

impl Guard {
    /// Starts `cmd`.
    pub fn spawn(cmd: &mut Command, group: bool, what: &'static str) -> Result<Guard> {
        if group {
            use std::os::unix::process::CommandExt as _;
            cmd.process_group(0);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {what} ({:?})", cmd.get_program()))?;
        Ok(Guard {
            child: Some(child),
            group,
            what,
        })
    }

    /// The process id, while not reaped.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The child itself (to take its pipes), while not reaped.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// Sends `signal` (a name `kill -s` knows: STOP, CONT, ...) to the child, with the
    /// `kill` command (the bench has no libc binding).
    pub fn signal(&self, signal: &str) -> Result<()> {
        let pid = self
            .id()
            .with_context(|| format!("{} already exited", self.what))?;
        let status = Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("cannot run `kill`")?;
        if !status.success() {
            bail!("`kill -s {signal} {pid}` failed ({status})");
        }
        Ok(())
    }

    /// Sends SIGKILL to the child alone, without reaping it: a crash to observe
    /// ([`Guard::kill`], or dropping the guard, reaps it later).
    pub fn sigkill(&mut self) -> Result<()> {
        let child = self
            .child
            .as_mut()
            .with_context(|| format!("{} already exited", self.what))?;
        child
            .kill()
            .with_context(|| format!("cannot SIGKILL {}", self.what))
    }

    /// Waits for the child to exit, at most `limit`; reaps it. `None` on timeout (still
    /// running).
    pub fn wait_timeout(&mut self, limit: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + limit;
        let Some(child) = self.child.as_mut() else {
            bail!("{} was already reaped", self.what);
        };
        loop {
            if let Some(status) = child
                .try_wait()
                .with_context(|| format!("cannot wait for {}", self.what))?
            {
                self.child = None;
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILLs the child (and its group) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.group {
                // The child is not reaped yet: its pid still names its group.
                let _ = Command::new("kill")
                    .args(["-s", "KILL", "--", &format!("-{}", c.id())])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_kills_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("sleep 30 & echo $! > {}; wait", pid_file.display()));
        let mut g = Guard::spawn(&mut cmd, true, "sh").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let grandchild = loop {
            if let Some(p) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
            {
                break p;
            }
            assert!(Instant::now() < deadline, "sh did not start its sleep");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(g.wait_timeout(Duration::from_millis(20)).unwrap().is_none());
        g.kill();
        assert!(g.id().is_none());
        // The grandchild is gone or a zombie waiting for its new parent.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.trim_start().to_string();
                    rest.chars().next()
                });
            if matches!(state, None | Some('Z') | Some('X')) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the grandchild is still {state:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

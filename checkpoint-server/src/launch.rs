//! Starting `checkpoint-server` processes from other programs (tests, benchmarks, and the local
//! cluster of `APP cluster`).
//!
//! Rules:
//!
//! 1. A [`ServerProcess`] is started with `--listen ADDR` (port 0 picks a free one) and is
//!    ready once it printed `listening on ADDR`; its address is the one it printed.
//! 2. It is killed with SIGKILL and reaped when dropped: no server outlives its owner's scope.
//! 3. [`server_binary`] finds the binary: `$VERIFLOW_CHECKPOINT_SERVER` if set, else next to the
//!    running executable or one directory up (cargo puts test executables in `deps/`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Name of the server binary.
pub const SERVER_BINARY: &str = "checkpoint-server";

/// Where the `checkpoint-server` binary is (rule 3), if found.
pub fn server_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VERIFLOW_CHECKPOINT_SERVER") {
        return Some(PathBuf::from(p));
    }
    beside_this_binary(SERVER_BINARY)
}

/// The binary `name` in this process's directory or the one above it (cargo puts a test's
/// binary in `target/PROFILE/deps`, the workspace's binaries in `target/PROFILE`).
pub fn beside_this_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let name = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
}

/// A running checkpoint server (rules 1-2).
#[derive(Debug)]
pub struct ServerProcess {
    child: Option<Child>,
    launcher: Vec<String>,
    binary: PathBuf,
    /// The address it listens on.
    pub addr: String,
    /// Its data directory (`None`: `--memory`).
    pub data: Option<PathBuf>,
    key: PathBuf,
}

impl ServerProcess {
    /// Starts `binary --listen listen --key key (--data data | --memory)` and waits until it
    /// listens.
    pub fn start(
        binary: &Path,
        listen: &str,
        data: Option<&Path>,
        key: &Path,
    ) -> std::io::Result<ServerProcess> {
        ServerProcess::start_via(&[], binary, listen, data, key)
    }

    /// [`ServerProcess::start`] through a launcher: `launcher[0] launcher[1..] binary ...`
    /// (for instance `ip netns exec NS`, which execs the binary: the child is the server).
    /// An empty launcher starts the binary itself.
    pub fn start_via(
        launcher: &[String],
        binary: &Path,
        listen: &str,
        data: Option<&Path>,
        key: &Path,
    ) -> std::io::Result<ServerProcess> {
        let mut cmd = match launcher.split_first() {
            None => Command::new(binary),
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(binary);
                c
            }
        };
        cmd.args(["--listen", listen, "--key"]).arg(key);
        match data {
            Some(d) => cmd.arg("--data").arg(d),
            None => cmd.arg("--memory"),
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot start {}: {e}", binary.display()))
            })?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out).read_line(&mut line)?;
        }
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let status = child.wait().ok();
            return Err(std::io::Error::other(format!(
                "{} did not start (said {:?}, exit {status:?})",
                binary.display(),
                line.trim()
            )));
        };
        Ok(ServerProcess {
            addr: addr.to_string(),
            child: Some(child),
            launcher: launcher.to_vec(),
            binary: binary.to_path_buf(),
            data: data.map(Path::to_path_buf),
            key: key.to_path_buf(),
        })
    }

    /// SIGKILL and reap (no-op if already dead).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same address and data.
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        let again = ServerProcess::start_via(
            &self.launcher,
            &self.binary,
            &self.addr,
            self.data.as_deref(),
            &self.key,
        )?;
        *self = again;
        Ok(())
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

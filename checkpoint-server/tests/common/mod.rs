//! Real checkpoint-server processes for tests, killed when their guard drops.

#![allow(dead_code, unreachable_pub)] // each test file uses a different part; pub for the tests, not a crate API

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use veriflow_checkpoint::Key;

/// A running `checkpoint-server`; SIGKILLed and reaped on drop.
pub struct ServerProc {
    child: Option<Child>,
    pub addr: String,
    pub data: PathBuf,
    memory: bool,
}

impl ServerProc {
    /// Starts a server on `listen` (e.g. `127.0.0.1:0`) over `data`, and waits for its
    /// "listening on ADDR" line.
    pub fn start(listen: &str, data: &Path, key: &Path, memory: bool) -> ServerProc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_checkpoint-server"));
        cmd.args(["--listen", listen, "--key"]).arg(key);
        if memory {
            cmd.arg("--memory");
        } else {
            cmd.arg("--data").arg(data);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn checkpoint-server");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read stdout");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        ServerProc {
            child: Some(child),
            addr,
            data: data.to_path_buf(),
            memory,
        }
    }

    /// SIGKILL (std's Child::kill) and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same address and data directory.
    pub fn restart(&mut self, key: &Path) {
        self.kill();
        // sled's lock file goes with the killed process; the same port is free again once
        // the process is reaped (the listener had SO_REUSEADDR from tokio).
        let again = ServerProc::start(&self.addr, &self.data, key, self.memory);
        self.child = again.into_child();
    }

    fn into_child(mut self) -> Option<Child> {
        self.child.take()
    }

    /// Whether the process is still running (not exited on its own).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A temp dir with a key file in it.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub key_path: PathBuf,
    pub key: Key,
}

impl Setup {
    pub fn new() -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        let key_path = dir.path().join("cluster.key");
        let key = Key::create(&key_path).expect("key");
        Setup { dir, key_path, key }
    }

    /// `n` servers on fresh data dirs (or in RAM).
    pub fn servers(&self, n: usize, memory: bool) -> Vec<ServerProc> {
        (0..n)
            .map(|i| {
                let data = self.dir.path().join(format!("server{i}"));
                ServerProc::start("127.0.0.1:0", &data, &self.key_path, memory)
            })
            .collect()
    }
}

pub fn addrs(servers: &[ServerProc]) -> String {
    servers
        .iter()
        .map(|s| s.addr.clone())
        .collect::<Vec<_>>()
        .join(",")
}

//! Real checkpoint-server processes for tests, killed when their guard drops.

#![allow(dead_code, unreachable_pub)] // each test file uses a different part; pub for the tests, not a crate API

use std::path::{Path, PathBuf};

use veriflow_checkpoint::launch::ServerProcess;
use veriflow_checkpoint::Key;

/// A running `checkpoint-server` (the library's launcher, with panics for tests).
pub struct ServerProc(ServerProcess);

impl std::ops::Deref for ServerProc {
    type Target = ServerProcess;
    fn deref(&self) -> &ServerProcess {
        &self.0
    }
}

impl ServerProc {
    /// Starts a server on `listen` (e.g. `127.0.0.1:0`) over `data` (or in RAM).
    pub fn start(listen: &str, data: &Path, key: &Path, memory: bool) -> ServerProc {
        let bin = Path::new(env!("CARGO_BIN_EXE_checkpoint-server"));
        let data = (!memory).then_some(data);
        ServerProc(ServerProcess::start(bin, listen, data, key).expect("start checkpoint-server"))
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Starts again on the same address and data directory.
    pub fn restart(&mut self, _key: &Path) {
        self.0.restart().expect("restart checkpoint-server");
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.0.is_running()
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

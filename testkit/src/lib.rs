//! Helpers shared by the command-line tests of the apps (`apps/*/tests`): run an app binary
//! and check what it printed ([`run_bin`], [`Out`]), and start a cluster of its processes on
//! loopback, one by one, so that a test can SIGKILL, SIGSTOP and SIGCONT them ([`Cluster`]).
//!
//! Every app binary has the same command line (`veriflow::App`), so the helpers take the
//! binary's path (`env!("CARGO_BIN_EXE_<app>")` in the test) and nothing app-specific.
//! Rules they keep:
//!
//! 1. A run never inherits the caller's `VERIFLOW_LOG`, `RUST_BACKTRACE`, `TMPDIR` or config
//!    directory: fresh log directories and default keys land in the directory the test gives.
//! 2. A panic, or a death by signal, of the binary fails the test, whatever the exit status
//!    the test expects.
//! 3. Every process started is SIGKILLed and reaped when its handle is dropped, so a failed
//!    test leaves nothing running.
//! 4. A [`Cluster`] on a [`netns::Network`] (`ClusterOpts::net`) puts its members on hosts:
//!    the checkpoint servers and the clients (`submit`, [`Cluster::run`]) on host 0, the
//!    coordinators on host 1, worker `i` on host `2 + i mod (hosts - 2)`; each listens on its
//!    host's address. Without one, everything is on 127.0.0.1.
//! 5. A [`Cluster`] dropped while its test panics prints the last [`LOG_TAIL`] lines of each
//!    member's log (`coord<i>.log`, `w<i>.log`) to standard error before its directory goes:
//!    a job that hung says what its members saw, in CI too (a transport3d job across hosts
//!    once found no end within 180 s in a full run of the suite, and said nothing).

pub mod browser;
pub mod damage;
pub mod netns;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// What one invocation did.
pub struct Out {
    /// The binary's file name (for messages).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Exit status.
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Out {
    /// Standard output as one JSON object (panics, showing the output, if it is not one).
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "{}: stdout is not one JSON object ({e}):\n{self}",
                self.cmd()
            )
        })
    }

    /// The command line, for messages.
    pub fn cmd(&self) -> String {
        format!("{} {}", self.program, self.args.join(" "))
    }

    /// Asserts the exit status.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, code, "{}: exit status\n{self}", self.cmd());
        self
    }

    /// Asserts that standard error mentions `needle`.
    pub fn stderr_has(&self, needle: &str) -> &Self {
        assert!(
            self.stderr.contains(needle),
            "{}: stderr should mention {needle:?}\n{self}",
            self.cmd()
        );
        self
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--- status {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// A loopback TCP port that refuses every connection for as long as this lives: a socket bound
/// to it and never listening. A listener bound to `127.0.0.1:0` and dropped frees its port,
/// which another test's server may take at once (a worker told to join such a port once met a
/// checkpoint server with another key there, and failed with the wrong error).
pub struct RefusingPort {
    _socket: rustix::fd::OwnedFd,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

impl RefusingPort {
    /// Binds one (panics if the machine has no loopback TCP).
    pub fn new() -> RefusingPort {
        use rustix::net::{AddressFamily, SocketType};
        let socket = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)
            .expect("a TCP socket");
        let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        rustix::net::bind(&socket, &any).expect("bind 127.0.0.1:0");
        let bound = rustix::net::getsockname(&socket).expect("getsockname");
        let port = std::net::SocketAddrV4::try_from(bound)
            .expect("an IPv4 address")
            .port();
        RefusingPort {
            _socket: socket,
            addr: format!("127.0.0.1:{port}"),
        }
    }
}

impl Default for RefusingPort {
    fn default() -> Self {
        RefusingPort::new()
    }
}

/// How long to retry an invocation (or an open) that fails on sled's lock: a store closed a
/// moment ago may still hold it (sled releases its file in the background).
pub const LOCK_PATIENCE: Duration = Duration::from_secs(30);

/// Runs `bin` with `TMPDIR` and `XDG_CONFIG_HOME` set to `tmp` (rule 1), and checks rule 2.
///
/// An invocation that fails on sled's lock is retried (see [`LOCK_PATIENCE`]), so it cannot
/// pass for the error a test expects.
pub fn run_bin(bin: &Path, tmp: &Path, args: &[&str]) -> Out {
    run_command(|| Command::new(bin), bin, tmp, args)
}

/// [`run_bin`] of the command `make` returns (the binary `bin`, maybe through a launcher).
fn run_command(make: impl Fn() -> Command, bin: &Path, tmp: &Path, args: &[&str]) -> Out {
    let t0 = Instant::now();
    let out = loop {
        let out = make()
            .args(args)
            .env("TMPDIR", tmp)
            .env("XDG_CONFIG_HOME", tmp)
            .env_remove("VERIFLOW_LOG")
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap_or_else(|e| panic!("{} runs: {e}", bin.display()));
        let locked = String::from_utf8_lossy(&out.stderr).contains("could not acquire lock");
        if !locked || t0.elapsed() > LOCK_PATIENCE {
            break out;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = Out {
        program: program_name(bin),
        args: args.iter().map(|s| s.to_string()).collect(),
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !out.stderr.contains("panicked") && !out.stdout.contains("panicked"),
        "{}: something panicked\n{out}",
        out.cmd()
    );
    assert!(out.code >= 0, "{}: killed by a signal\n{out}", out.cmd());
    out
}

fn program_name(bin: &Path) -> String {
    bin.file_name()
        .map_or_else(|| bin.display().to_string(), |f| f.to_string_lossy().into())
}

/// Failure-detector flags of cluster tests on a loaded 2-core machine: a bound of 300 + 800 +
/// 800 ms = 1.9 s. The full suite on 2 cores once starved all three workers past a bound of 1 s
/// (every worker declared broken, the job failed): that bound was too tight for the machine, not
/// the system wrong.
pub const LOADED_FD: [&str; 6] = [
    "--fd-interval-ms",
    "300",
    "--fd-timeout-ms",
    "800",
    "--fd-broken-ms",
    "800",
];

/// A path as `&str` (test paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// A process SIGKILLed and reaped when dropped (rule 3).
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    /// Sends a signal (`-KILL`, `-STOP`, `-CONT`, ...) with the `kill` command.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill {sig} failed");
    }
}

/// The `checkpoint-server` binary, brought up to date once per test process: `cargo test -p
/// APP` builds only APP's binaries, and a stale server from an older build would speak an
/// older protocol than the app under test (cargo's check costs a second when it is fresh).
pub fn checkpoint_server_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        if std::env::var_os("VERIFLOW_CHECKPOINT_SERVER").is_some() {
            return; // the caller names its own
        }
        cargo_build("veriflow-checkpoint", "checkpoint-server");
    });
    veriflow_checkpoint::launch::server_binary().expect("built")
}

/// `cargo build -p PACKAGE --bin BIN` of this workspace, in the caller's profile.
fn cargo_build(package: &str, bin: &str) {
    let mut cargo = Command::new(env!("CARGO"));
    // From inside the workspace, whatever the caller's directory (`paper` runs anywhere).
    cargo
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "-p", package, "--bin", bin]);
    if !cfg!(debug_assertions) {
        cargo.arg("--release"); // beside a release build's binaries (`paper`)
    }
    let status = cargo.status().expect("cargo runs");
    assert!(status.success(), "building {bin} failed");
}

/// Another app's binary (`nqueens` from a knary test: two programs on one coordinator), built
/// up to date once per test process beside the caller's.
pub fn app_binary(name: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !built.iter().any(|b| b == name) {
        cargo_build(name, name);
        built.push(name.to_string());
    }
    veriflow_checkpoint::launch::beside_this_binary(name)
        .unwrap_or_else(|| panic!("{name} was built beside this test's binary"))
}

/// How [`Cluster::start_with`] starts a cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOpts {
    /// The hosts to start the members on (rule 4; at least 3), `None`: all on 127.0.0.1.
    pub net: Option<Arc<netns::Network>>,
    /// Workers of one thread each.
    pub workers: usize,
    /// Spares, after the workers.
    pub spares: usize,
    /// Coordinators: the first takes the role, the others stand by (0 means 1).
    pub coordinators: usize,
    /// Options of every coordinator (failure detector, lease).
    pub coordinator_args: Vec<String>,
    /// Options of every worker.
    pub worker_args: Vec<String>,
    /// The storage strategy (`central`, `replicate:R`, `parity:M`, `ida:M,K`, with `,quorum`
    /// or `,quorum=W`), each of its checkpoint servers a process on its own data directory
    /// (`None`: `central`).
    pub strategy: Option<String>,
}

/// Coordinators over one checkpoint server, and workers, all processes of `bin`; everything
/// killed when dropped (rule 3).
pub struct Cluster {
    /// The app binary.
    pub bin: PathBuf,
    /// Holds the key, the server's store and the logs (`w<i>.log`, `coord<i>.log`).
    pub dir: tempfile::TempDir,
    /// The cluster's key file.
    pub key: PathBuf,
    /// The coordinators' addresses, comma-separated (what `--join` and `--coordinator` take).
    pub addr: String,
    /// Each coordinator's address.
    pub coordinator_addrs: Vec<String>,
    /// The coordinators, the active one first.
    pub coordinators: Vec<Proc>,
    /// The workers, in start order (spares last).
    pub workers: Vec<Proc>,
    /// The store every member logs into.
    pub store: String,
    /// The hosts the members are on (rule 4).
    pub net: Option<Arc<netns::Network>>,
    worker_args: Vec<String>,
    /// The checkpoint servers (kill and restart them to take the store away for a while).
    pub servers: Vec<veriflow_checkpoint::launch::ServerProcess>,
}

/// Rule 5: lines of each member's log a failing test prints.
pub const LOG_TAIL: usize = 40;

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprint!("{}", log_tails(self.dir.path(), LOG_TAIL));
        }
    }
}

/// Rule 5: the last `n` lines of each `*.log` file in `dir`, by name, each under a heading.
pub fn log_tails(dir: &Path, n: usize) -> String {
    use std::fmt::Write as _;
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
    logs.sort();
    let mut out = String::new();
    for path in logs {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(n);
        let _ = writeln!(
            out,
            "--- {} (last {} of {} lines)",
            path.display(),
            lines.len() - from,
            lines.len()
        );
        for line in &lines[from..] {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// Rule 4: where each kind of member runs.
const CLIENT_HOST: usize = 0;
const COORDINATOR_HOST: usize = 1;

impl Cluster {
    /// Starts a checkpoint server, a coordinator (`fd`: its failure-detector options) and
    /// `workers` workers plus `spares` spares of one thread each.
    pub fn start(bin: &Path, workers: usize, spares: usize, fd: &[&str]) -> Cluster {
        Cluster::start_with(
            bin,
            ClusterOpts {
                workers,
                spares,
                coordinators: 1,
                coordinator_args: fd.iter().map(|a| a.to_string()).collect(),
                ..ClusterOpts::default()
            },
        )
    }

    /// Starts a checkpoint server, the coordinators and the workers of `opts`.
    pub fn start_with(bin: &Path, opts: ClusterOpts) -> Cluster {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let key = dir.path().join("cluster.key");
        run_bin(bin, dir.path(), &["keygen", s(&key)]).expect_code(0);
        let strategy = opts.strategy.as_deref().unwrap_or("central");
        let n = veriflow_checkpoint::StoreSpec::servers_for(strategy)
            .unwrap_or_else(|e| panic!("strategy {strategy}: {e}"));
        if let Some(net) = &opts.net {
            assert!(
                net.hosts().len() >= 3,
                "a cluster on a network needs 3 hosts"
            );
        }
        let host = |h: usize| opts.net.as_ref().map(|net| net.addr(h));
        let launcher: Vec<String> = opts.net.as_ref().map_or_else(Vec::new, |net| {
            let ns = net.hosts()[CLIENT_HOST].ns.clone();
            vec!["ip".into(), "netns".into(), "exec".into(), ns]
        });
        let servers: Vec<veriflow_checkpoint::launch::ServerProcess> = (0..n)
            .map(|i| {
                let data = if i == 0 {
                    dir.path().join("cs")
                } else {
                    dir.path().join(format!("cs{i}"))
                };
                veriflow_checkpoint::launch::ServerProcess::start_via(
                    &launcher,
                    &checkpoint_server_binary(),
                    &listen_on(host(CLIENT_HOST)),
                    Some(&data),
                    &key,
                )
                .expect("a checkpoint server starts")
            })
            .collect();
        let addrs: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
        let store = if strategy == "central" {
            format!("central:{}", addrs[0])
        } else {
            format!("{strategy}:{}", addrs.join(","))
        };
        let mut cl = Cluster {
            bin: bin.to_path_buf(),
            dir,
            key,
            addr: String::new(),
            coordinator_addrs: Vec::new(),
            coordinators: Vec::new(),
            workers: Vec::new(),
            store,
            net: opts.net.clone(),
            worker_args: opts.worker_args.clone(),
            servers,
        };
        for i in 0..opts.coordinators.max(1) {
            let mut args = opts.coordinator_args.clone();
            if i > 0 {
                args.push("--standby".into());
            }
            let listen = listen_on(host(COORDINATOR_HOST));
            let (proc, addr) = cl.start_coordinator(&listen, &args, i == 0);
            cl.coordinators.push(proc);
            cl.coordinator_addrs.push(addr);
        }
        cl.addr = cl.coordinator_addrs.join(",");
        for i in 0..opts.workers + opts.spares {
            cl.add_worker(i >= opts.workers);
        }
        cl
    }

    /// Starts a coordinator of this cluster listening on `listen` with `args`, and waits for
    /// its address (and, if `active`, for it to take the role). Its stderr goes to `coord<i>.log`.
    pub fn start_coordinator(&self, listen: &str, args: &[String], active: bool) -> (Proc, String) {
        let n = std::fs::read_dir(self.dir.path())
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with("coord"))
                    .count()
            })
            .unwrap_or(0);
        let log_path = self.dir.path().join(format!("coord{n}.log"));
        let log = std::fs::File::create(&log_path).expect("a coordinator log");
        let mut c = self.command(COORDINATOR_HOST);
        c.args([
            "coordinator",
            "--listen",
            listen,
            "--key",
            s(&self.key),
            "--store",
            &self.store,
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(log);
        let mut child = c.spawn().expect("the coordinator starts");
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        out.read_line(&mut line)
            .expect("the coordinator prints its address");
        let addr = line
            .trim()
            .strip_prefix("coordinator listening on ")
            .unwrap_or_else(|| {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("coordinator said {line:?}; its log:\n{log}")
            })
            .to_string();
        if active {
            line.clear();
            out.read_line(&mut line)
                .expect("the coordinator says it is active");
            assert!(
                line.starts_with("coordinator active"),
                "coordinator said {line:?}"
            );
        }
        (Proc(child), addr)
    }

    /// Starts one more worker of one thread (a spare if `spare`).
    pub fn add_worker(&mut self, spare: bool) {
        let bin = self.bin.clone();
        self.add_worker_of(&bin, spare);
    }

    /// Starts one more worker of one thread running another app's binary `bin` (a coordinator
    /// serves every program: `coordinator` rule 2).
    pub fn add_worker_of(&mut self, bin: &Path, spare: bool) {
        let i = self.workers.len();
        let host = self.net.as_ref().map(|net| 2 + i % (net.hosts().len() - 2));
        let mut c = self.command_of(host.unwrap_or(0), bin);
        c.args([
            "worker",
            "--join",
            &self.addr,
            "--key",
            s(&self.key),
            "--threads",
            "1",
            "--listen",
            &listen_on(host.and_then(|h| self.net.as_ref().map(|net| net.addr(h)))),
        ])
        .args(&self.worker_args);
        if spare {
            c.arg("--spare");
        }
        let log =
            std::fs::File::create(self.dir.path().join(format!("w{}.log", self.workers.len())))
                .expect("a worker log");
        let child = c
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("a worker starts");
        self.workers.push(Proc(child));
    }

    /// `<bin> submit ... --json <program>` as a child process (see [`wait_json`]).
    pub fn submit(&self, program: &[&str]) -> Child {
        self.submit_of(&self.bin, program)
    }

    /// [`Cluster::submit`] of another app's binary `bin`.
    pub fn submit_of(&self, bin: &Path, program: &[&str]) -> Child {
        self.command_of(CLIENT_HOST, bin)
            .args([
                "submit",
                "--coordinator",
                &self.addr,
                "--key",
                s(&self.key),
                "--json",
            ])
            .args(program)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("submit starts")
    }

    /// The app binary on `host` of the network (rule 4), or here without one.
    pub fn command(&self, host: usize) -> Command {
        self.command_of(host, &self.bin)
    }

    /// `bin` on `host` of the network (rule 4), or here without one.
    fn command_of(&self, host: usize, bin: &Path) -> Command {
        match &self.net {
            Some(net) => net.command(host, bin),
            None => Command::new(bin),
        }
    }

    /// [`run_bin`] of the app binary on the clients' host (rule 4), in the cluster's directory:
    /// `status`, `inspect` and the like reach the members from there.
    pub fn run(&self, args: &[&str]) -> Out {
        run_command(
            || self.command(CLIENT_HOST),
            &self.bin,
            self.dir.path(),
            args,
        )
    }

    /// `APP status --json` of the cluster's coordinators, from the client's host.
    pub fn status(&self) -> Value {
        let out = self.run(&[
            "status",
            "--coordinator",
            &self.addr,
            "--key",
            s(&self.key),
            "--json",
        ]);
        out.expect_code(0);
        out.json()
    }

    /// [`Cluster::status`] until `ok` holds of it, polled every 100 ms; it fails the test after
    /// `limit`, naming `what` it waited for and the last status.
    pub fn status_until(&self, what: &str, limit: Duration, ok: impl Fn(&Value) -> bool) -> Value {
        let t0 = std::time::Instant::now();
        loop {
            let v = self.status();
            if ok(&v) {
                return v;
            }
            assert!(
                t0.elapsed() < limit,
                "no status with {what} within {limit:?}; the last: {v}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `ADDR:0` on a host's address, or on 127.0.0.1.
fn listen_on(host: Option<String>) -> String {
    format!("{}:0", host.as_deref().unwrap_or("127.0.0.1"))
}

/// Waits for a `--json` child: (exit status, its JSON summary or null, its stderr). A panic
/// fails the test (rule 2).
pub fn wait_json(child: Child) -> (i32, Value, String) {
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    let v = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v, stderr)
}

/// [`wait_json`] with a bound: a child still running after `limit` is SIGKILLed and the test
/// fails, naming `what` and showing what the child wrote so far (a hang fails with a message).
pub fn wait_json_within(mut child: Child, limit: Duration, what: &str) -> (i32, Value, String) {
    use std::io::Read as _;
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut out);
            }
            out
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    );
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait().expect("try_wait") {
            Some(status) => break Some(status),
            None if t0.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let Some(status) = status else {
        panic!("{what}: no end within {limit:?}; stdout:\n{stdout}\nstderr:\n{stderr}");
    };
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    let v = serde_json::from_str(stdout.trim()).unwrap_or(Value::Null);
    (status.code().unwrap_or(-1), v, stderr)
}

#[cfg(test)]
mod tests {
    /// Rule 5: each log's last lines, by file name, under a heading with the counts; other
    /// files are left out.
    #[test]
    fn log_tails_gives_the_last_lines_of_each_log() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("w1.log"), "a\nb\nc\n").unwrap();
        std::fs::write(dir.path().join("coord0.log"), "only\n").unwrap();
        std::fs::write(dir.path().join("key"), "not a log\n").unwrap();
        let out = super::log_tails(dir.path(), 2);
        let c = dir.path().join("coord0.log");
        let w = dir.path().join("w1.log");
        assert_eq!(
            out,
            format!(
                "--- {} (last 1 of 1 lines)\nonly\n--- {} (last 2 of 3 lines)\nb\nc\n",
                c.display(),
                w.display()
            )
        );
    }
}

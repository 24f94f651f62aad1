//! Hosts with real networks on one machine: each host a Linux network namespace with its own
//! address, all joined into one network whose packets are delayed and lost (issue 16.3).
//!
//! ```no_run
//! use std::time::Duration;
//! use veriflow_testkit::netns::{NetConfig, Network};
//!
//! let net = Network::create(&NetConfig {
//!     hosts: 3,
//!     latency: Duration::from_millis(5),
//!     loss: 0.01,
//!     seed: 7,
//! })
//! .expect("namespaces (root only)");
//! // `ip netns exec <host 1's namespace> sleep 1`, reachable from the others at
//! // `net.hosts()[1].addr`.
//! let status = net.command(1, "sleep").arg("1").status().unwrap();
//! ```
//!
//! Rules:
//!
//! 1. Every name it makes starts with [`PREFIX`]`<pid>-<n>-` (pid: this process; n: a
//!    counter), so networks of parallel tests, threads or processes, never collide. Host `i`
//!    is the namespace `<prefix>h<i>` with address `198.18.0.<i + 1>/24` (RFC 2544's range for
//!    benchmark networks: no real host has it, and the packets never leave the namespaces).
//! 2. Before it creates anything, a sweep deletes the namespaces named [`PREFIX`]`<pid>-...`
//!    whose pid is no live process (leftovers of a test run killed with SIGKILL); never those
//!    of a process that runs.
//! 3. Dropping a [`Network`], also while a panic unwinds, deletes its namespaces (which
//!    removes the devices in them and ends the processes' network) and stops its wire;
//!    processes still running in a namespace are the caller's to kill (testkit's `Proc` does).
//!    A failure half-way through [`Network::create`] removes what was made so far.
//! 4. Latency and loss act on each IPv4 packet, once on its way from one host to another:
//!    one-way delay `latency` (round trip 2 × latency) and loss probability `loss`, in each
//!    direction. Real packets: TCP sees the losses and retransmits (a TCP relay would hide
//!    them). Two ways, chosen once per process ([`Emulation::detect`]):
//!    - [`Emulation::Netem`] when the kernel has `tc netem`: each host has a veth pair to a
//!      bridge in a switch namespace, with `netem delay L loss P` on the host's side (its
//!      egress).
//!    - [`Emulation::Wire`] otherwise (this project's build machine: its kernel has no netem
//!      and no modules to load it): each host has a TUN device, and a userspace wire in this
//!      process reads every IPv4 packet a host sends, drops it with probability `loss` (from a
//!      seeded ChaCha8 generator), and writes it into the destination host's TUN device
//!      `latency` after it was read, in arrival order. Packets to an address of no host, and
//!      IPv6 packets (router solicitations), are dropped. NFQUEUE with iptables-legacy would
//!      also work there, but needs a package, a rule per namespace and a verdict process per
//!      namespace; the wire needs nothing but `/dev/net/tun`.
//!
//!    `VERIFLOW_NETNS_EMULATION=wire` forces the wire (to test it where netem exists);
//!    [`Network::describe`] says which one ran, for the tests' output.
//! 5. [`available`] says whether namespaces can be made here at all (root, `ip`, and, without
//!    netem, `/dev/net/tun`); tests skip with its reason only when they cannot.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

/// Start of every namespace name this module makes (rule 1).
pub const PREFIX: &str = "vfnet-";

/// First three octets of every host's address (rule 1).
const NET: [u8; 3] = [198, 18, 0];

/// Hosts per network: addresses .1 to .250 of the /24.
pub const MAX_HOSTS: usize = 250;

/// What a network looks like.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// Hosts (namespaces), 2 to [`MAX_HOSTS`].
    pub hosts: usize,
    /// One-way delay of every packet between two hosts (rule 4), at most 1 s.
    pub latency: Duration,
    /// Probability that a packet between two hosts is lost, in [0, 0.5].
    pub loss: f64,
    /// Seed of the wire's losses (rule 4; netem draws its own).
    pub seed: u64,
}

/// How latency and loss are made (rule 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emulation {
    /// The kernel's `tc netem` on veth pairs to a bridge.
    Netem,
    /// This process's userspace wire between TUN devices.
    Wire,
}

impl Emulation {
    /// Netem if the kernel has it (tried once per process on the loopback device of a scratch
    /// namespace), else the wire; `VERIFLOW_NETNS_EMULATION=wire|netem` decides instead.
    pub fn detect() -> Emulation {
        static E: OnceLock<Emulation> = OnceLock::new();
        *E.get_or_init(
            || match std::env::var("VERIFLOW_NETNS_EMULATION").as_deref() {
                Ok("wire") => Emulation::Wire,
                Ok("netem") => Emulation::Netem,
                _ => {
                    let probe = format!("{PREFIX}{}-probe", std::process::id());
                    let has = ip(&["netns", "add", &probe]).is_ok()
                        && run(
                            "tc",
                            &[
                                "-n", &probe, "qdisc", "add", "dev", "lo", "root", "netem",
                                "delay", "1ms",
                            ],
                        )
                        .is_ok();
                    let _ = ip(&["netns", "del", &probe]);
                    if has {
                        Emulation::Netem
                    } else {
                        Emulation::Wire
                    }
                }
            },
        )
    }
}

/// Whether networks can be made here; `Err` says why not (rule 5).
pub fn available() -> Result<(), String> {
    static A: OnceLock<Result<(), String>> = OnceLock::new();
    A.get_or_init(|| {
        let probe = format!("{PREFIX}{}-avail", std::process::id());
        ip(&["netns", "add", &probe])
            .map_err(|e| format!("cannot create a network namespace: {e}"))?;
        let _ = ip(&["netns", "del", &probe]);
        if Emulation::detect() == Emulation::Wire {
            tun_tap::Iface::without_packet_info("vfprobe%d", tun_tap::Mode::Tun)
                .map_err(|e| format!("no netem, and no TUN device for the wire: {e}"))?;
        }
        Ok(())
    })
    .clone()
}

/// One host of a [`Network`].
#[derive(Clone, Debug)]
pub struct Host {
    /// Its namespace.
    pub ns: String,
    /// Its address.
    pub addr: Ipv4Addr,
}

/// A thread started by [`Network::in_host`].
pub struct HostThread<T>(JoinHandle<Option<T>>);

impl<T> HostThread<T> {
    /// Waits for `f`'s value; a panic in `f` goes on in the caller.
    pub fn join(self) -> T {
        match self.0.join() {
            Ok(v) => v.expect("f ran: the thread moved into the namespace"),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// What the wire did (rule 4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Packets delivered.
    pub forwarded: u64,
    /// Packets lost on purpose.
    pub dropped: u64,
    /// Packets to no host, or not IPv4.
    pub stray: u64,
}

/// Namespaces joined into one network with latency and loss; everything removed when dropped
/// (rule 3).
pub struct Network {
    name: String,
    config: NetConfig,
    hosts: Vec<Host>,
    emulation: Emulation,
    /// Namespaces made so far, hosts and switch (deleted on drop).
    made: Vec<String>,
    wire: Option<Wire>,
}

/// Networks made by this process (rule 1's counter).
static NEXT: AtomicU64 = AtomicU64::new(0);

impl Network {
    /// Makes the network (rules 1-4); an `Err` names the command that failed.
    pub fn create(config: &NetConfig) -> std::io::Result<Network> {
        if !(2..=MAX_HOSTS).contains(&config.hosts) {
            return Err(invalid(format!(
                "{} hosts: a network has 2 to {MAX_HOSTS}",
                config.hosts
            )));
        }
        if config.latency > Duration::from_secs(1) {
            return Err(invalid(format!(
                "latency {:?}: at most 1 s",
                config.latency
            )));
        }
        if !(0.0..=0.5).contains(&config.loss) {
            return Err(invalid(format!(
                "loss {}: a probability in [0, 0.5]",
                config.loss
            )));
        }
        sweep();
        let name = format!(
            "{PREFIX}{}-{}-",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let hosts = (0..config.hosts)
            .map(|i| Host {
                ns: format!("{name}h{i}"),
                addr: Ipv4Addr::new(NET[0], NET[1], NET[2], host_octet(i)),
            })
            .collect();
        let mut net = Network {
            name,
            config: config.clone(),
            hosts,
            emulation: Emulation::detect(),
            made: Vec::new(),
            wire: None,
        };
        // On an error, `net` is dropped here and removes what was made (rule 3).
        match net.emulation {
            Emulation::Netem => net.build_netem()?,
            Emulation::Wire => net.build_wire()?,
        }
        Ok(net)
    }

    fn add_ns(&mut self, ns: &str) -> std::io::Result<()> {
        ip(&["netns", "add", ns])?;
        self.made.push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"])
    }

    fn build_netem(&mut self) -> std::io::Result<()> {
        let sw = format!("{}sw", self.name);
        self.add_ns(&sw)?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        let delay = format!("{}us", self.config.latency.as_micros());
        let loss = format!("{}%", self.config.loss * 100.0);
        for h in self.hosts.clone() {
            self.add_ns(&h.ns)?;
            let port = format!("p{}", h.addr.octets()[3]);
            ip(&[
                "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &h.ns,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            host_link_up(&h.ns, h.addr, "eth0")?;
            run(
                "tc",
                &[
                    "-n", &h.ns, "qdisc", "add", "dev", "eth0", "root", "netem", "delay", &delay,
                    "loss", &loss,
                ],
            )?;
        }
        Ok(())
    }

    fn build_wire(&mut self) -> std::io::Result<()> {
        let mut ifaces = Vec::new();
        for h in self.hosts.clone() {
            self.add_ns(&h.ns)?;
            // Created in this namespace (the kernel picks a free name), then moved: the open
            // file keeps it attached to this process.
            let iface = tun_tap::Iface::without_packet_info("vfw%d", tun_tap::Mode::Tun)
                .map_err(|e| ctx(e, "a TUN device"))?;
            ip(&["link", "set", iface.name(), "netns", &h.ns])?;
            ip(&["-n", &h.ns, "link", "set", iface.name(), "name", "wire0"])?;
            host_link_up(&h.ns, h.addr, "wire0")?;
            ifaces.push(Arc::new(iface));
        }
        self.wire = Some(Wire::start(ifaces, &self.config));
        Ok(())
    }

    /// The hosts, host `i` at index `i`.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Host `i`'s address as a string.
    pub fn addr(&self, i: usize) -> String {
        self.hosts[i].addr.to_string()
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &NetConfig {
        &self.config
    }

    /// How latency and loss are made here.
    pub fn emulation(&self) -> Emulation {
        self.emulation
    }

    /// `ip netns exec <host i> program`: add arguments, then spawn or run it. The child is the
    /// program itself (`ip` execs it), so its pid is the program's.
    pub fn command(&self, host: usize, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[host].ns])
            .arg(program.as_ref());
        c
    }

    /// Runs `f` on a thread of this process that has moved into host `i`'s namespace: the
    /// sockets it opens are that host's (tests talk over the network without a child
    /// process). `f` runs only once the move succeeded.
    pub fn in_host<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<HostThread<T>> {
        let path = format!("/var/run/netns/{}", self.hosts[i].ns);
        let ns = std::fs::File::open(&path).map_err(|e| ctx(e, &path))?;
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            use std::os::fd::AsFd as _;
            let moved = rustix::thread::move_into_link_name_space(
                ns.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            );
            let ok = moved.is_ok();
            let _ = tx.send(moved);
            ok.then(f)
        });
        match rx.recv() {
            Ok(Ok(())) => Ok(HostThread(handle)),
            Ok(Err(e)) => Err(std::io::Error::other(format!("setns into {path}: {e}"))),
            Err(_) => Err(std::io::Error::other(format!(
                "setns into {path}: the thread died"
            ))),
        }
    }

    /// What the wire did so far (`None` with netem).
    pub fn wire_stats(&self) -> Option<WireStats> {
        self.wire.as_ref().map(|w| WireStats {
            forwarded: w.stats.forwarded.load(Ordering::Relaxed),
            dropped: w.stats.dropped.load(Ordering::Relaxed),
            stray: w.stats.stray.load(Ordering::Relaxed),
        })
    }

    /// One line for the tests' output: hosts, latency, loss and how they are made (rule 4).
    pub fn describe(&self) -> String {
        let how = match self.emulation {
            Emulation::Netem => "tc netem on veth pairs to a bridge".to_string(),
            Emulation::Wire => {
                let s = self.wire_stats().unwrap_or_default();
                format!(
                    "userspace wire between TUN devices (no netem in this kernel): {} packets \
                     forwarded, {} lost on purpose",
                    s.forwarded, s.dropped
                )
            }
        };
        format!(
            "{} hosts ({}h0..h{}), one-way latency {:?}, loss {} %: {how}",
            self.hosts.len(),
            self.name,
            self.hosts.len() - 1,
            self.config.latency,
            self.config.loss * 100.0
        )
    }
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if let Some(w) = &self.wire {
            w.stop();
        }
        // Deleting a namespace removes its devices; the wire's readers then wake with an error.
        for ns in self.made.drain(..).rev() {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                eprintln!("netns: cannot remove {ns}: {e}");
            }
        }
        if let Some(w) = self.wire.take() {
            w.join();
        }
    }
}

/// The last octet of host `i`'s address.
fn host_octet(i: usize) -> u8 {
    u8::try_from(i + 1).expect("at most MAX_HOSTS hosts")
}

/// Rule 2: deletes namespaces of this module whose process is gone.
fn sweep() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

fn invalid(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, msg)
}

fn ctx(e: std::io::Error, what: &str) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn ip(args: &[&str]) -> std::io::Result<()> {
    run("ip", args)
}

/// Gives device `dev` of namespace `ns` the host's address on the /24 and brings it up.
fn host_link_up(ns: &str, addr: Ipv4Addr, dev: &str) -> std::io::Result<()> {
    ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
    ip(&["-n", ns, "link", "set", dev, "up"])
}

/// Runs a command to its end; an error names it and says what it printed.
fn run(program: &str, args: &[&str]) -> std::io::Result<()> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ctx(e, &format!("cannot run {program}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{program} {}: {} ({})",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        )))
    }
}

/// Rule 4's userspace wire: a reader thread per host, one sender thread.
struct Wire {
    shared: Arc<Shared>,
    stats: Arc<Counters>,
    threads: Vec<JoinHandle<()>>,
}

#[derive(Default)]
struct Counters {
    forwarded: AtomicU64,
    dropped: AtomicU64,
    stray: AtomicU64,
}

struct Shared {
    stop: AtomicBool,
    queue: Mutex<Queue>,
    ready: Condvar,
}

struct Queue {
    /// Packets in flight: when they are due, to which host, the packet. Every packet waits the
    /// same latency, so arrival order is due order.
    flight: VecDeque<(Instant, usize, Vec<u8>)>,
    rng: ChaCha8Rng,
}

/// Largest packet read: the TUN device's MTU is 1500; room for more does no harm.
const MAX_PACKET: usize = 65_536;

impl Wire {
    fn start(ifaces: Vec<Arc<tun_tap::Iface>>, cfg: &NetConfig) -> Wire {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            queue: Mutex::new(Queue {
                flight: VecDeque::new(),
                rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            }),
            ready: Condvar::new(),
        });
        let stats = Arc::new(Counters::default());
        let mut threads = Vec::new();
        for (from, iface) in ifaces.iter().enumerate() {
            let (iface, shared, stats) = (iface.clone(), shared.clone(), stats.clone());
            let (latency, loss, hosts) = (cfg.latency, cfg.loss, ifaces.len());
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; MAX_PACKET];
                while let Ok(n) = iface.recv(&mut buf) {
                    if shared.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let to = destination(&buf[..n], hosts).filter(|&to| to != from);
                    let Some(to) = to else {
                        stats.stray.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let now = Instant::now();
                    let mut q = shared.queue.lock().expect("wire queue");
                    if loss > 0.0 && q.rng.random_bool(loss) {
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    q.flight.push_back((now + latency, to, buf[..n].to_vec()));
                    drop(q);
                    shared.ready.notify_one();
                }
            }));
        }
        {
            let (shared, stats) = (shared.clone(), stats.clone());
            threads.push(std::thread::spawn(move || {
                let mut q = shared.queue.lock().expect("wire queue");
                while !shared.stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    match q.flight.front() {
                        None => q = shared.ready.wait(q).expect("wire queue"),
                        Some(&(due, _, _)) if due > now => {
                            q = shared
                                .ready
                                .wait_timeout(q, due - now)
                                .expect("wire queue")
                                .0;
                        }
                        Some(_) => {
                            let (_, to, packet) = q.flight.pop_front().expect("a packet");
                            drop(q);
                            // A host whose device is gone (the network is being removed)
                            // loses the packet, as a real host that went away.
                            if ifaces[to].send(&packet).is_ok() {
                                stats.forwarded.fetch_add(1, Ordering::Relaxed);
                            }
                            q = shared.queue.lock().expect("wire queue");
                        }
                    }
                }
            }));
        }
        Wire {
            shared,
            stats,
            threads,
        }
    }

    fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _guard = self.shared.queue.lock();
        self.shared.ready.notify_all();
    }

    /// Waits up to 2 s for the threads (readers end when their devices are removed), then
    /// leaves any still blocked behind rather than hang the test.
    fn join(self) {
        let t0 = Instant::now();
        while self.threads.iter().any(|t| !t.is_finished()) && t0.elapsed() < Duration::from_secs(2)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        for t in self.threads {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// The host an IPv4 packet goes to, if it is one of the `hosts`.
fn destination(packet: &[u8], hosts: usize) -> Option<usize> {
    if packet.len() < 20 || packet[0] >> 4 != 4 {
        return None;
    }
    let dst = &packet[16..20];
    if dst[..3] != NET {
        return None;
    }
    let i = usize::from(dst[3]).checked_sub(1)?;
    (i < hosts).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destination_reads_ipv4_addresses_of_hosts_only() {
        let mut p = [0u8; 20];
        p[0] = 0x45;
        p[16..20].copy_from_slice(&[198, 18, 0, 3]);
        assert_eq!(destination(&p, 4), Some(2));
        assert_eq!(destination(&p, 2), None, "host .3 of 2");
        p[16..20].copy_from_slice(&[198, 18, 0, 0]);
        assert_eq!(destination(&p, 4), None, "the network address");
        p[16..20].copy_from_slice(&[10, 0, 0, 1]);
        assert_eq!(destination(&p, 4), None, "another network");
        p[0] = 0x60;
        assert_eq!(destination(&p, 4), None, "IPv6");
        assert_eq!(destination(&p[..10], 4), None, "too short");
    }

    #[test]
    fn bad_configurations_are_refused_before_anything_is_made() {
        let ok = NetConfig {
            hosts: 2,
            latency: Duration::from_millis(5),
            loss: 0.0,
            seed: 0,
        };
        for (bad, needle) in [
            (
                NetConfig {
                    hosts: 1,
                    ..ok.clone()
                },
                "hosts",
            ),
            (
                NetConfig {
                    hosts: 251,
                    ..ok.clone()
                },
                "hosts",
            ),
            (
                NetConfig {
                    latency: Duration::from_secs(2),
                    ..ok.clone()
                },
                "latency",
            ),
            (
                NetConfig {
                    loss: 0.6,
                    ..ok.clone()
                },
                "loss",
            ),
            (
                NetConfig {
                    loss: f64::NAN,
                    ..ok.clone()
                },
                "loss",
            ),
        ] {
            let e = Network::create(&bad).expect_err("refused");
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains(needle), "{e}");
        }
    }
}

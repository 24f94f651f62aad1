//! The failure detector on a virtual clock (rules in `detect/mod.rs`), and its thread.
//!
//! [`Net`] is a discrete-event simulation of N processes, each with its own [`Detector`],
//! linked by FIFO links with seeded random delays. It can crash a process (silently or with its
//! connections reset), stall one (SIGSTOP: no ticks, arriving messages held until it wakes),
//! and add application traffic. Every random choice comes from a seed named in the failure
//! message.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::*;
use crate::clock::SystemClock;

fn ms(x: u64) -> Duration {
    Duration::from_millis(x)
}

fn secs(x: u64) -> Duration {
    Duration::from_secs(x)
}

fn pid(i: usize) -> PeerId {
    PeerId::try_from(i).expect("test nets are small")
}

fn idx(p: PeerId) -> usize {
    usize::try_from(p).expect("u32 fits usize")
}

/// Something that happens in the simulated network.
#[derive(Debug, Clone, Copy)]
enum Ev {
    /// A node's detector is due (stale if `gen` is not the node's current one).
    Tick { node: usize, gen: u64 },
    /// A heartbeat (or, with `hb: None`, an application message) arrives.
    Deliver {
        to: usize,
        from: usize,
        hb: Option<Heartbeat>,
    },
    /// The node dies; with `reset`, every survivor's connection to it closes a delay later.
    Crash { node: usize, reset: bool },
    /// `at`'s connection to `peer` closed.
    Closed { at: usize, peer: usize },
    /// The node stops running (SIGSTOP) until `until`.
    Stall { node: usize, until: Duration },
    /// The node runs again (SIGCONT).
    Wake { node: usize },
    /// The node sends an application message to a random peer, and plans its next one.
    Traffic { node: usize },
    /// The node changes its parameters.
    SetParams { node: usize, params: FdParams },
}

struct Node {
    det: Detector,
    crashed: bool,
    /// Stopped until then (SIGSTOP): no ticks.
    stalled: Option<Duration>,
    /// Messages that arrived while stalled: delivered after the wake-up tick (the worst order).
    held: Vec<(usize, Option<Heartbeat>)>,
    gen: u64,
    tick_at: Option<Duration>,
}

/// A status change one node reported about another.
#[derive(Debug, Clone, Copy)]
struct Verdict {
    at: Duration,
    by: usize,
    peer: usize,
    status: Status,
}

/// A node waking from a stall: the earliest silence deadline it held, before its first tick.
#[derive(Debug, Clone, Copy)]
struct WakeUp {
    node: usize,
    at: Duration,
    earliest_silence: Option<Duration>,
}

struct Net {
    now: Duration,
    nodes: Vec<Node>,
    queue: BinaryHeap<Reverse<(Duration, u64)>>,
    events: HashMap<u64, Ev>,
    seq: u64,
    rng: ChaCha8Rng,
    /// Per-message delay, uniform in [min, max].
    delay: (Duration, Duration),
    /// FIFO links (TCP): the last arrival time on each (from, to) link.
    tail: HashMap<(usize, usize), Duration>,
    /// Period of each node's application messages, if any.
    traffic: Option<Duration>,
    verdicts: Vec<Verdict>,
    wakeups: Vec<WakeUp>,
}

impl Net {
    /// `n` processes, all connected at time 0, ticking from time 0.
    fn new(n: usize, params: FdParams, delay: (Duration, Duration), seed: u64) -> Net {
        let mut nodes: Vec<Node> = (0..n)
            .map(|i| Node {
                det: Detector::new(pid(i), params, seed),
                crashed: false,
                stalled: None,
                held: Vec::new(),
                gen: 0,
                tick_at: None,
            })
            .collect();
        for (i, node) in nodes.iter_mut().enumerate() {
            for j in (0..n).filter(|&j| j != i) {
                node.det.add_peer(pid(j), Duration::ZERO);
            }
        }
        let mut net = Net {
            now: Duration::ZERO,
            nodes,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            seq: 0,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_0fde_7ec7_0f00),
            delay,
            tail: HashMap::new(),
            traffic: None,
            verdicts: Vec::new(),
            wakeups: Vec::new(),
        };
        for i in 0..n {
            net.reschedule(i);
        }
        net
    }

    /// Every node also sends an application message to a random peer every `period`.
    fn with_traffic(mut self, period: Duration) -> Net {
        self.traffic = Some(period);
        for node in 0..self.nodes.len() {
            let first = Duration::from_micros(self.rng.random_range(0..=micros(period)));
            self.at(first, Ev::Traffic { node });
        }
        self
    }

    fn at(&mut self, time: Duration, ev: Ev) {
        self.seq += 1;
        self.events.insert(self.seq, ev);
        self.queue.push(Reverse((time, self.seq)));
    }

    fn sample_delay(&mut self) -> Duration {
        let (lo, hi) = self.delay;
        Duration::from_micros(self.rng.random_range(micros(lo)..=micros(hi)))
    }

    /// Runs every event up to and including time `until`.
    fn run_until(&mut self, until: Duration) {
        while let Some(&Reverse((time, seq))) = self.queue.peek() {
            if time > until {
                break;
            }
            self.queue.pop();
            self.now = time;
            let ev = self.events.remove(&seq).expect("queued event");
            self.handle(ev);
        }
        self.now = until;
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Tick { node, gen } => {
                let n = &mut self.nodes[node];
                if n.gen != gen || n.crashed || n.stalled.is_some() {
                    return;
                }
                n.tick_at = None;
                self.tick(node);
                self.reschedule(node);
            }
            Ev::Deliver { to, from, hb } => {
                let n = &mut self.nodes[to];
                if n.crashed {
                    return;
                }
                if n.stalled.is_some() {
                    n.held.push((from, hb));
                    return;
                }
                receive(&mut n.det, from, hb, now);
                self.reschedule(to);
            }
            Ev::Crash { node, reset } => {
                self.nodes[node].crashed = true;
                if reset {
                    for at in 0..self.nodes.len() {
                        if at != node {
                            let when = now + self.sample_delay();
                            self.at(when, Ev::Closed { at, peer: node });
                        }
                    }
                }
            }
            Ev::Closed { at, peer } => {
                let n = &mut self.nodes[at];
                if n.crashed {
                    return;
                }
                if let Some(wake) = n.stalled {
                    // The reader task saw the reset; the detector learns it after waking.
                    self.at(wake, Ev::Closed { at, peer });
                    return;
                }
                n.det.on_closed(pid(peer), now);
                self.reschedule(at);
            }
            Ev::Stall { node, until } => {
                self.nodes[node].stalled = Some(until);
                self.at(until, Ev::Wake { node });
            }
            Ev::Wake { node } => {
                let n = &mut self.nodes[node];
                n.stalled = None;
                let earliest_silence = n.det.earliest_silence_deadline();
                self.wakeups.push(WakeUp {
                    node,
                    at: now,
                    earliest_silence,
                });
                // Worst order: the detector ticks before it sees what arrived meanwhile.
                self.tick(node);
                let held = std::mem::take(&mut self.nodes[node].held);
                for (from, hb) in held {
                    receive(&mut self.nodes[node].det, from, hb, now);
                }
                self.nodes[node].tick_at = None;
                self.reschedule(node);
            }
            Ev::Traffic { node } => {
                let period = self.traffic.expect("traffic events only with traffic");
                self.at(now + period, Ev::Traffic { node });
                let n = &self.nodes[node];
                if n.crashed || n.stalled.is_some() {
                    return;
                }
                let others = self.nodes.len() - 1;
                let mut to = self.rng.random_range(0..others);
                if to >= node {
                    to += 1;
                }
                self.nodes[node].det.on_sent(pid(to), now);
                self.send(node, to, None);
                self.reschedule(node);
            }
            Ev::SetParams { node, params } => {
                self.nodes[node].det.set_params(params);
                self.reschedule(node);
            }
        }
    }

    fn tick(&mut self, node: usize) {
        let now = self.now;
        for action in self.nodes[node].det.tick(now) {
            match action {
                Action::SendHeartbeat { to, heartbeat } => {
                    self.send(node, idx(to), Some(heartbeat))
                }
                other => {
                    let (peer, status) = other.status_change().expect("a status change");
                    self.verdicts.push(Verdict {
                        at: now,
                        by: node,
                        peer: idx(peer),
                        status,
                    });
                }
            }
        }
    }

    fn send(&mut self, from: usize, to: usize, hb: Option<Heartbeat>) {
        let delay = self.sample_delay();
        let tail = self.tail.entry((from, to)).or_default();
        let arrival = (self.now + delay).max(*tail);
        *tail = arrival;
        self.at(arrival, Ev::Deliver { to, from, hb });
    }

    /// Plans the node's next tick at its detector's next deadline.
    fn reschedule(&mut self, node: usize) {
        let now = self.now;
        let n = &mut self.nodes[node];
        if n.crashed || n.stalled.is_some() {
            return;
        }
        let due = n.det.next_deadline().max(now);
        if n.tick_at == Some(due) {
            return;
        }
        n.gen += 1;
        n.tick_at = Some(due);
        let gen = n.gen;
        self.at(due, Ev::Tick { node, gen });
    }

    fn alive(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| !self.nodes[i].crashed)
    }

    /// When `by` reported `peer` with `status`, every time it did.
    fn reports(&self, by: usize, peer: usize, status: Status) -> Vec<Duration> {
        self.verdicts
            .iter()
            .filter(|v| v.by == by && v.peer == peer && v.status == status)
            .map(|v| v.at)
            .collect()
    }

    /// Heartbeats sent per node per T_interval so far: (round, insurance).
    fn heartbeat_rates(&self, interval: Duration) -> (f64, f64) {
        let intervals = self.now.as_secs_f64() / interval.as_secs_f64();
        let count = self.nodes.len() as f64;
        let (mut round, mut insurance) = (0u64, 0u64);
        for node in &self.nodes {
            let stats = node.det.stats();
            round += stats.round_heartbeats;
            insurance += stats.insurance_heartbeats;
        }
        (
            round as f64 / count / intervals,
            insurance as f64 / count / intervals,
        )
    }
}

fn receive(det: &mut Detector, from: usize, hb: Option<Heartbeat>, now: Duration) {
    match hb {
        Some(hb) => det.on_heartbeat(pid(from), &hb, now),
        None => det.on_message(pid(from), now),
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).expect("test durations are short")
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() - 1) * p / 100]
}

/// Small delays: 1-50 ms, a LAN under load.
const LAN: (Duration, Duration) = (Duration::from_millis(1), Duration::from_millis(50));

// ---------------------------------------------------------------------------------------------
// (a) crashes are found within the bounds

/// A silent crash (no reset) is Broken at each of the victim's k monitors within
/// T_interval + T_timeout + T_broken + d, and at every survivor within
/// T_insurance + T_timeout + T_broken + d (rules 3, 4, 6, 7); nobody else is accused.
#[test]
fn crash_is_broken_at_every_monitor_within_bound() {
    let p = FdParams::default();
    let d_max = LAN.1;
    let monitor_bound = p.interval + p.timeout + p.broken + d_max;
    let everyone_bound = p.insurance + p.timeout + p.broken + d_max;
    for n in [8, 32] {
        let mut latencies = Vec::new();
        for seed in 0..6 {
            let mut net = Net::new(n, p, LAN, seed);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let victim = rng.random_range(0..n);
            let crash = secs(30) + ms(rng.random_range(0..1000));
            net.run_until(crash - Duration::from_micros(1));
            let monitors: Vec<usize> = net.nodes[victim]
                .det
                .monitors()
                .into_iter()
                .map(idx)
                .collect();
            assert_eq!(
                monitors.len(),
                p.k,
                "n {n} seed {seed}: k monitors at all times"
            );
            net.at(
                crash,
                Ev::Crash {
                    node: victim,
                    reset: false,
                },
            );
            net.run_until(crash + everyone_bound + secs(2));

            for by in net.alive().collect::<Vec<_>>() {
                let broken = net.reports(by, victim, Status::Broken);
                assert_eq!(
                    broken.len(),
                    1,
                    "n {n} seed {seed}: {by} reports {victim} once"
                );
                let latency = broken[0] - crash;
                if monitors.contains(&by) {
                    assert!(
                        latency <= monitor_bound,
                        "n {n} seed {seed}: monitor {by} took {latency:?} > {monitor_bound:?}"
                    );
                    latencies.push(latency);
                }
                assert!(
                    latency <= everyone_bound,
                    "n {n} seed {seed}: {by} took {latency:?} > {everyone_bound:?}"
                );
                assert!(net.nodes[by].det.is_broken(pid(victim)));
            }
            let others: Vec<_> = net.verdicts.iter().filter(|v| v.peer != victim).collect();
            assert!(
                others.is_empty(),
                "n {n} seed {seed}: false accusations {others:?}"
            );
        }
        latencies.sort();
        eprintln!(
            "crash, n = {n}: monitors' detection latency p50 {:?}, max {:?} (bound {monitor_bound:?})",
            percentile(&latencies, 50),
            latencies.last().expect("some monitors")
        );
    }
}

/// A process lost together with all of its monitors is still found by the insurance
/// heartbeats (rule 4), within T_insurance + T_timeout + T_broken + d.
#[test]
fn insurance_finds_a_process_lost_with_all_its_monitors() {
    let p = FdParams::default();
    let bound = p.insurance + p.timeout + p.broken + LAN.1;
    for seed in 0..4 {
        let mut net = Net::new(12, p, LAN, 100 + seed);
        let crash = secs(20) + ms(seed * 237);
        net.run_until(crash - Duration::from_micros(1));
        let victim = 5;
        let mut dead: Vec<usize> = net.nodes[victim]
            .det
            .monitors()
            .into_iter()
            .map(idx)
            .collect();
        dead.push(victim);
        for &node in &dead {
            net.at(crash, Ev::Crash { node, reset: false });
        }
        net.run_until(crash + bound + secs(1));
        for by in net.alive().collect::<Vec<_>>() {
            let broken = net.reports(by, victim, Status::Broken);
            assert_eq!(broken.len(), 1, "seed {seed}: {by} reports {victim} once");
            assert!(
                broken[0] - crash <= bound,
                "seed {seed}: {by} took {:?}",
                broken[0] - crash
            );
        }
    }
}

/// A process stopped for good (a hang, SIGSTOP) is Broken at its monitors within the same
/// bound as a crash: the detector cannot tell them apart, and should not.
#[test]
fn hung_process_is_broken_like_a_crash() {
    let p = FdParams::default();
    let bound = p.interval + p.timeout + p.broken + LAN.1;
    let mut net = Net::new(8, p, LAN, 7);
    let start = secs(15) + ms(311);
    net.run_until(start - Duration::from_micros(1));
    let monitors: Vec<usize> = net.nodes[2].det.monitors().into_iter().map(idx).collect();
    net.at(
        start,
        Ev::Stall {
            node: 2,
            until: secs(1000),
        },
    );
    net.run_until(start + bound + ms(1));
    for m in monitors {
        let broken = net.reports(m, 2, Status::Broken);
        assert_eq!(broken.len(), 1, "monitor {m}");
        assert!(broken[0] - start <= bound);
    }
}

// ---------------------------------------------------------------------------------------------
// (b) no false positive under jitter below the bound

/// 10,000 intervals with per-message delays anywhere in [1 ms, 950 ms] (jitter 949 ms, below
/// T_timeout = 1 s): no peer is ever Unreachable (the rule 2 bound in `detect/mod.rs`).
#[test]
fn no_false_positive_under_jitter_below_timeout() {
    let p = FdParams::default();
    let jitter = (ms(1), ms(950));
    for (n, seed) in [(8, 11), (32, 12)] {
        let mut net = Net::new(n, p, jitter, seed);
        net.run_until(p.interval * 10_000);
        assert!(
            net.verdicts.is_empty(),
            "n {n} seed {seed}: false accusations {:?}",
            &net.verdicts[..net.verdicts.len().min(5)]
        );
    }
}

/// The control: with jitter above T_timeout the same network does see Unreachable peers, so
/// the test above is able to fail.
#[test]
fn jitter_above_timeout_does_cause_suspicions() {
    let p = FdParams::default();
    let mut net = Net::new(8, p, (ms(1), ms(2500)), 13);
    net.run_until(p.interval * 300);
    let unreachable = net
        .verdicts
        .iter()
        .filter(|v| v.status == Status::Unreachable);
    assert!(unreachable.count() > 0, "seed 13");
}

/// Changing T_interval in flight (each process at its own moment) keeps every promise already
/// made, so nobody is suspected.
#[test]
fn changing_the_interval_in_flight_keeps_promises() {
    let p = FdParams::default();
    let mut net = Net::new(8, p, LAN, 21);
    net.run_until(secs(30));
    let slow = FdParams {
        interval: secs(3),
        ..p
    };
    for node in 0..8 {
        let at = secs(30) + ms(137 * u64::try_from(node).expect("small"));
        net.at(at, Ev::SetParams { node, params: slow });
        let back = secs(90) + ms(89 * u64::try_from(node).expect("small"));
        net.at(back, Ev::SetParams { node, params: p });
    }
    net.run_until(secs(200));
    assert!(net.verdicts.is_empty(), "seed 21: {:?}", net.verdicts);
}

// ---------------------------------------------------------------------------------------------
// (c) heartbeats per process per interval

/// Per process and T_interval: k + 1 round heartbeats (rule 3) plus insurance heartbeats
/// (rule 4), bounded by (n - 1 - k) · T_interval / T_insurance when idle, fewer with traffic
/// (rule 5). Prints the measured table (`cargo test -p veriflow-runtime detect -- --nocapture`).
#[test]
fn heartbeats_per_interval() {
    let p = FdParams::default();
    let intervals = 2000;
    let ratio = p.interval.as_secs_f64() / p.insurance.as_secs_f64();
    for n in [4usize, 8, 32, 64] {
        for traffic in [None, Some(ms(100))] {
            let mut net = Net::new(n, p, LAN, 31);
            if let Some(period) = traffic {
                net = net.with_traffic(period);
            }
            net.run_until(p.interval * intervals);
            assert!(net.verdicts.is_empty(), "n {n}: {:?}", net.verdicts);
            let (round, insurance) = net.heartbeat_rates(p.interval);
            let monitors = p.k.min(n - 1);
            let expected_round = if n - 1 > p.k { p.k + 1 } else { monitors } as f64;
            let insurance_cap = (n - 1 - monitors) as f64 * ratio;
            eprintln!(
                "n = {n:2}, k = {}, {}: {round:.3} round + {insurance:.3} insurance = {:.3} \
                 heartbeats per process per T_interval (insurance cap {insurance_cap:.2})",
                p.k,
                if traffic.is_some() {
                    "10 app msgs/s"
                } else {
                    "idle        "
                },
                round + insurance,
            );
            assert!(
                (round - expected_round).abs() < 0.01,
                "n {n}: {round} round heartbeats"
            );
            // The introductions at time 0 are a one-off: n - 1 heartbeats over the whole run.
            let intro = (n - 1) as f64 / f64::from(intervals);
            assert!(
                insurance <= insurance_cap + intro + 0.01,
                "n {n}: {insurance}"
            );
        }
    }
}

/// Monitors rotate one per round (rule 3): every round the set changes by exactly one peer
/// when there is someone to rotate in, and over many rounds the watching load is spread.
#[test]
fn monitors_rotate_one_per_round_and_spread_the_load() {
    let p = FdParams::default();
    let n = 16;
    let mut net = Net::new(n, p, LAN, 41);
    let mut watched = vec![0u32; n];
    let mut previous: Option<Vec<PeerId>> = None;
    for r in 1..=3000u32 {
        net.run_until(p.interval * r + ms(500));
        let mut now: Vec<PeerId> = net.nodes[0].det.monitors();
        assert_eq!(now.len(), p.k);
        for &m in &now {
            watched[idx(m)] += 1;
        }
        now.sort_unstable();
        if let Some(prev) = &previous {
            let kept = now.iter().filter(|m| prev.contains(m)).count();
            assert!(kept >= p.k - 1, "round {r}: {prev:?} -> {now:?}");
        }
        previous = Some(now);
    }
    let others = &watched[1..];
    let mean = others.iter().map(|&w| f64::from(w)).sum::<f64>() / others.len() as f64;
    for (peer, &w) in others.iter().enumerate() {
        let share = f64::from(w) / mean;
        assert!(
            (0.6..1.4).contains(&share),
            "peer {}: {w} rounds vs mean {mean}",
            peer + 1
        );
    }
}

// ---------------------------------------------------------------------------------------------
// (d) a stalled monitor accuses nobody

/// A process whose ticks stop for 10 × T_interval, with messages arriving meanwhile held (as in
/// its sockets) until after its first tick, accuses no one when it wakes (rule 9). T_broken is
/// long here so that the others do not declare it Broken and keep talking to it; they see it
/// Unreachable, then Reachable.
#[test]
fn stalled_monitor_accuses_nobody_when_it_wakes() {
    let p = FdParams {
        broken: secs(30),
        ..FdParams::default()
    };
    let stalled = 3;
    let mut net = Net::new(8, p, LAN, 51);
    let start = secs(20) + ms(300);
    let wake = start + p.interval * 10;
    net.at(
        start,
        Ev::Stall {
            node: stalled,
            until: wake,
        },
    );
    net.run_until(wake + p.interval * 100);

    let wakeup = net.wakeups[0];
    assert_eq!((wakeup.node, wakeup.at), (stalled, wake));
    // Without rule 9 it would have accused: its silence timers had run out while stopped.
    let expired = wakeup.earliest_silence.expect("peers");
    assert!(expired < wake, "seed 51: {expired:?} not before {wake:?}");
    assert_eq!(net.nodes[stalled].det.stats().stalls, 1);

    let by_stalled: Vec<_> = net.verdicts.iter().filter(|v| v.by == stalled).collect();
    assert!(by_stalled.is_empty(), "seed 51: it accused {by_stalled:?}");
    let about_others: Vec<_> = net.verdicts.iter().filter(|v| v.peer != stalled).collect();
    assert!(about_others.is_empty(), "seed 51: {about_others:?}");
    // The others suspected it while it was stopped, then heard from it again.
    let suspected: Vec<usize> = (0..8)
        .filter(|&by| !net.reports(by, stalled, Status::Unreachable).is_empty())
        .collect();
    assert!(!suspected.is_empty());
    for by in suspected {
        let back = net.reports(by, stalled, Status::Alive);
        assert_eq!(back.len(), 1, "{by}");
        assert!(back[0] >= wake);
    }
    for by in (0..8).filter(|&i| i != stalled) {
        assert_eq!(net.nodes[by].det.status(pid(stalled)), Some(Status::Alive));
    }
}

/// With the default T_broken the others do declare the stopped process Broken (it was gone
/// for 10 s) and stop talking to it; it still accuses no one at its wake-up, nor within the
/// T_interval + T_timeout that follow.
#[test]
fn stalled_monitor_accuses_nobody_at_wake_even_when_fenced() {
    let p = FdParams::default();
    let mut net = Net::new(8, p, LAN, 52);
    let start = secs(20) + ms(700);
    let wake = start + p.interval * 10;
    net.at(
        start,
        Ev::Stall {
            node: 0,
            until: wake,
        },
    );
    net.run_until(wake + p.interval + p.timeout - ms(1));
    let by_stalled: Vec<_> = net.verdicts.iter().filter(|v| v.by == 0).collect();
    assert!(by_stalled.is_empty(), "seed 52: {by_stalled:?}");
    for by in 1..8 {
        assert!(net.nodes[by].det.is_broken(0), "{by} sees 0 broken");
    }
}

// ---------------------------------------------------------------------------------------------
// (e) a closed connection is Broken at once

#[test]
fn closed_connection_is_broken_at_once_and_final() {
    let mut det = Detector::new(0, FdParams::default(), 1);
    for peer in 1..=4 {
        det.add_peer(peer, Duration::ZERO);
    }
    let _ = det.tick(Duration::ZERO);
    det.on_heartbeat(2, &Heartbeat { interval: secs(1) }, ms(300));
    det.on_closed(2, ms(400));
    assert!(det.is_broken(2), "broken as soon as the reset is seen");
    assert_eq!(det.next_deadline(), ms(400), "the report is due at once");
    let actions = det.tick(ms(400));
    assert_eq!(
        actions
            .iter()
            .filter(|a| a.status_change().is_some())
            .collect::<Vec<_>>(),
        [&Action::Broken { peer: 2 }]
    );
    // Final: a late message, a second reset, a re-add change nothing and report nothing.
    det.on_heartbeat(2, &Heartbeat { interval: secs(1) }, ms(500));
    det.on_message(2, ms(500));
    det.on_closed(2, ms(500));
    det.add_peer(2, ms(500));
    let mut now = ms(400);
    while now < secs(30) {
        now = det.next_deadline().max(now);
        for action in det.tick(now) {
            match action {
                Action::SendHeartbeat { to, .. } => assert_ne!(to, 2, "no heartbeats to broken"),
                other => panic!("unexpected {other:?}"),
            }
            // Keep the others alive.
        }
        for peer in [1, 3, 4] {
            det.on_heartbeat(peer, &Heartbeat { interval: secs(1) }, now);
        }
    }
    assert_eq!(det.broken(), [2]);
    assert!(!det.monitors().contains(&2));
}

/// In the network: a killed process whose sockets reset is Broken at every survivor as soon as
/// each sees the reset.
#[test]
fn reset_connections_make_a_crash_broken_at_once() {
    let mut net = Net::new(8, FdParams::default(), LAN, 61);
    let crash = secs(10) + ms(123);
    net.at(
        crash,
        Ev::Crash {
            node: 4,
            reset: true,
        },
    );
    net.run_until(crash + LAN.1 + ms(1));
    for by in net.alive().collect::<Vec<_>>() {
        let broken = net.reports(by, 4, Status::Broken);
        assert_eq!(broken.len(), 1, "{by}");
        assert!(broken[0] - crash <= LAN.1);
    }
}

// ---------------------------------------------------------------------------------------------
// (f) back before T_broken: Reachable, never Broken

#[test]
fn peer_heard_again_before_t_broken_is_reachable_not_broken() {
    let p = FdParams::default();
    let mut det = Detector::new(0, p, 1);
    det.add_peer(1, Duration::ZERO);
    let hb = Heartbeat {
        interval: p.interval,
    };
    det.on_heartbeat(1, &hb, Duration::ZERO);
    let mut now = Duration::ZERO;
    let mut changes = Vec::new();
    // Peer 1 is silent until 2.5 s: Unreachable at 2 s (1 s promise + 1 s timeout).
    while now < ms(2500) {
        changes.extend(det.tick(now).into_iter().filter_map(|a| a.status_change()));
        now = det.next_deadline().min(ms(2500));
    }
    assert_eq!(changes, [(1, Status::Unreachable)]);
    assert_eq!(det.status(1), Some(Status::Unreachable));
    det.on_message(1, ms(2500));
    assert_eq!(det.status(1), Some(Status::Alive));
    // It keeps its promise from then on: never Broken.
    while now < secs(60) {
        changes.extend(det.tick(now).into_iter().filter_map(|a| a.status_change()));
        det.on_heartbeat(1, &hb, now);
        now = (now + p.interval).min(det.next_deadline().max(now));
    }
    assert_eq!(changes, [(1, Status::Unreachable), (1, Status::Alive)]);
    assert!(!det.is_broken(1));
}

/// A process stopped for 1.5 s, starting just before its round (so its monitors see it late by
/// more than T_timeout): they report it Unreachable, then Reachable when it resumes; nobody
/// ever reports it Broken.
#[test]
fn short_stall_makes_a_peer_unreachable_then_reachable() {
    let p = FdParams::default();
    let mut net = Net::new(8, p, (ms(1), ms(20)), 71);
    net.run_until(secs(20));
    let round = net.nodes[6].det.next_round_at().expect("started");
    let start = round - ms(1);
    net.at(
        start,
        Ev::Stall {
            node: 6,
            until: start + ms(1500),
        },
    );
    net.run_until(secs(60));
    let suspected: Vec<usize> = (0..8)
        .filter(|&by| !net.reports(by, 6, Status::Unreachable).is_empty())
        .collect();
    assert!(
        !suspected.is_empty(),
        "seed 71: the stall was long enough to be seen"
    );
    for by in suspected {
        assert_eq!(net.reports(by, 6, Status::Alive).len(), 1, "{by}");
    }
    let broken: Vec<_> = net
        .verdicts
        .iter()
        .filter(|v| v.status == Status::Broken)
        .collect();
    assert!(broken.is_empty(), "seed 71: {broken:?}");
}

/// Stops shorter than T_timeout + T_broken - jitter, at random moments: never Broken anywhere
/// (a promise is late by at most the stop). This is what issue 6's SIGSTOP test relies on.
#[test]
fn stops_shorter_than_timeout_plus_broken_are_never_broken() {
    let p = FdParams::default();
    let delays = (ms(1), ms(20));
    let stop = p.timeout + p.broken - (delays.1 - delays.0) - ms(10);
    for seed in 0..10 {
        let mut net = Net::new(8, p, delays, 80 + seed);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let node = rng.random_range(0..8);
        let start = secs(10) + ms(rng.random_range(0..1000));
        net.at(
            start,
            Ev::Stall {
                node,
                until: start + stop,
            },
        );
        net.run_until(secs(40));
        let broken: Vec<_> = net
            .verdicts
            .iter()
            .filter(|v| v.status == Status::Broken)
            .collect();
        assert!(broken.is_empty(), "seed {}: {broken:?}", 80 + seed);
    }
}

// ---------------------------------------------------------------------------------------------
// Odds and ends of the state machine

#[test]
fn same_seed_same_actions_and_different_processes_draw_differently() {
    let run = |me: PeerId| {
        let mut det = Detector::new(me, FdParams::default(), 99);
        for peer in (0..20).filter(|&p| p != me) {
            det.add_peer(peer, Duration::ZERO);
        }
        let mut all = Vec::new();
        for r in 0..50u32 {
            let now = secs(1) * r;
            all.extend(det.tick(now));
            for peer in (0..20).filter(|&p| p != me) {
                det.on_message(peer, now);
            }
        }
        all
    };
    assert_eq!(run(0), run(0));
    let monitors = |me| {
        let mut det = Detector::new(me, FdParams::default(), 99);
        for peer in 0..40 {
            det.add_peer(peer, Duration::ZERO);
        }
        let _ = det.tick(Duration::ZERO);
        det.monitors()
    };
    assert_ne!(monitors(50), monitors(51), "stream (seed, me)");
}

/// Monitors are drawn among Alive peers first (rule 3): once peers turn Unreachable, within
/// k rounds every monitor is a peer that is still heard from.
#[test]
fn monitors_are_drawn_among_alive_peers_first() {
    let p = FdParams {
        broken: secs(100),
        ..FdParams::default()
    };
    let mut det = Detector::new(0, p, 8);
    for peer in 1..=6 {
        det.add_peer(peer, Duration::ZERO);
    }
    for r in 0..40u32 {
        let now = p.interval * r;
        for peer in 4..=6 {
            det.on_message(peer, now);
        }
        let _ = det.tick(now);
        if r >= 6 {
            assert_eq!(det.status(1), Some(Status::Unreachable), "silent since 0");
        }
        if r >= 6 + 3 {
            let monitors = det.monitors();
            assert!(
                monitors.iter().all(|m| (4..=6).contains(m)),
                "round {r}: {monitors:?}"
            );
        }
    }
}

#[test]
fn unknown_and_removed_peers_get_no_verdict() {
    let mut det = Detector::new(0, FdParams::default(), 1);
    det.on_heartbeat(9, &Heartbeat { interval: secs(1) }, Duration::ZERO);
    det.on_closed(9, Duration::ZERO);
    det.add_peer(0, Duration::ZERO);
    assert_eq!(det.status(9), None);
    assert_eq!(det.status(0), None, "a process does not watch itself");
    det.add_peer(1, Duration::ZERO);
    let _ = det.tick(Duration::ZERO);
    det.remove_peer(1);
    let mut now = Duration::ZERO;
    while now < secs(30) {
        now = det.next_deadline();
        assert!(det.tick(now).is_empty());
    }
    assert!(det.broken().is_empty());
}

#[test]
fn first_heartbeat_introduces_and_carries_the_promise() {
    let p = FdParams::default();
    let mut a = Detector::new(0, p, 5);
    for peer in 1..=6 {
        a.add_peer(peer, Duration::ZERO);
    }
    let sent = a.tick(Duration::ZERO);
    let mut to: BTreeMap<PeerId, Duration> = BTreeMap::new();
    for action in sent {
        if let Action::SendHeartbeat {
            to: peer,
            heartbeat,
        } = action
        {
            assert!(
                to.insert(peer, heartbeat.interval).is_none(),
                "one heartbeat each"
            );
        }
    }
    assert_eq!(to.len(), 6, "every new peer is introduced at once (rule 4)");
    for (peer, promise) in to {
        let monitor = a.monitors().contains(&peer);
        assert_eq!(
            promise,
            if monitor { p.interval } else { p.insurance },
            "{peer}"
        );
    }
    // A receiver learns the promise from the heartbeat.
    let mut b = Detector::new(1, p, 5);
    b.add_peer(0, Duration::ZERO);
    assert_eq!(
        b.promise_from(0),
        Some(p.insurance),
        "T_insurance before any heartbeat"
    );
    b.on_heartbeat(0, &Heartbeat { interval: ms(250) }, ms(10));
    assert_eq!(b.promise_from(0), Some(ms(250)));
}

/// Application messages sent to every peer each round leave nothing for the insurance rule
/// but the introductions (rule 5); without them, insurance heartbeats flow.
#[test]
fn sent_messages_postpone_insurance_heartbeats() {
    let p = FdParams::default();
    let run = |with_traffic: bool| {
        let mut det = Detector::new(0, p, 3);
        for peer in 1..=10 {
            det.add_peer(peer, Duration::ZERO);
        }
        for r in 0..=100u32 {
            let now = p.interval * r;
            for peer in 1..=10 {
                det.on_message(peer, now);
                if with_traffic && r > 0 {
                    det.on_sent(peer, now);
                }
            }
            let _ = det.tick(now);
        }
        det.stats()
    };
    let busy = run(true);
    // The k monitors are introduced by the first round, the 10 - k others by rule 4.
    let intros = 10 - u64::try_from(p.k).expect("small");
    assert_eq!(
        busy.insurance_heartbeats, intros,
        "only the introductions: {busy:?}"
    );
    let idle = run(false);
    assert!(idle.insurance_heartbeats > 10 + 50, "{idle:?}");
    assert_eq!(
        busy.round_heartbeats, idle.round_heartbeats,
        "rounds always go"
    );
}

#[test]
fn params_validate_and_tiny_periods_do_not_spin() {
    let p = FdParams::default();
    assert_eq!(p.validate(), Ok(()));
    let zero = FdParams {
        interval: Duration::ZERO,
        ..p
    };
    assert_eq!(zero.validate(), Err(FdParamsError::ZeroInterval));
    let no_timeout = FdParams {
        timeout: Duration::ZERO,
        ..p
    };
    assert_eq!(no_timeout.validate(), Err(FdParamsError::ZeroTimeout));
    let low = FdParams {
        insurance: ms(10),
        ..p
    };
    assert!(matches!(
        low.validate(),
        Err(FdParamsError::InsuranceBelowInterval { .. })
    ));
    assert_eq!(
        FdParams { k: 0, ..p }.validate(),
        Err(FdParamsError::NoMonitors)
    );
    // Detector::new does not fail: a zero interval becomes 1 ms, so time always moves.
    let mut det = Detector::new(0, zero, 1);
    det.add_peer(1, Duration::ZERO);
    let _ = det.tick(Duration::ZERO);
    assert!(det.next_deadline() >= ms(1));
}

#[test]
fn heartbeat_round_trips_through_postcard() {
    let hb = Heartbeat {
        interval: Duration::new(1, 250_000_000),
    };
    let bytes = postcard::to_allocvec(&hb).expect("encode");
    let back: Heartbeat = postcard::from_bytes(&bytes).expect("decode");
    assert_eq!(back, hb);
    assert!(bytes.len() <= 8, "{} bytes", bytes.len());
}

#[test]
fn vnode_map_reports_broken_vnodes_and_refuses_receives() {
    let mut det = Detector::new(0, FdParams::default(), 1);
    det.add_peer(1, Duration::ZERO);
    det.add_peer(2, Duration::ZERO);
    let map: VnodeMap = [(0, 0), (1, 1), (2, 2), (3, 2), (4, 1)]
        .into_iter()
        .map(|(v, p)| (VnodeId(v), p))
        .collect();
    let all: Vec<VnodeId> = (0..6).map(VnodeId).collect();
    assert!(map.broken_vnodes(&det, &all).is_empty());
    assert!(!map.any_broken(&det, &all));
    det.on_closed(2, ms(5));
    assert_eq!(map.broken_vnodes(&det, &all), [VnodeId(2), VnodeId(3)]);
    assert_eq!(
        map.broken_vnodes(&det, &[VnodeId(3), VnodeId(1)]),
        [VnodeId(3)]
    );
    assert!(map.any_broken(&det, &all));
    assert!(!map.any_broken(&det, &[VnodeId(0), VnodeId(4)]));
    assert_eq!(
        map.check(&det, VnodeId(3)),
        Err(FdError::Broken(VnodeId(3)))
    );
    assert_eq!(map.check(&det, VnodeId(1)), Ok(()));
    assert_eq!(
        map.check(&det, VnodeId(5)),
        Ok(()),
        "unmapped: held, not broken"
    );
    assert_eq!(map.vnodes_of(2), [VnodeId(2), VnodeId(3)]);
    assert_eq!(
        FdError::Broken(VnodeId(3)).to_string(),
        "vnode v3 is on a broken process"
    );
}

// ---------------------------------------------------------------------------------------------
// (g) the thread, end to end on the real clock

/// Two detector threads linked by their handles exchange heartbeats; when one stops, the other
/// reports it Broken; a reset makes a third peer Broken at once. Waits are bounded loops with a
/// generous limit, never assertions about speed.
#[test]
fn detector_threads_end_to_end() {
    let p = FdParams {
        interval: ms(20),
        timeout: ms(500),
        insurance: ms(100),
        broken: ms(500),
        k: 3,
    };
    let clock: Arc<dyn crate::Clock> = Arc::new(SystemClock::default());
    let a_slot: Arc<OnceLock<DetectorHandle>> = Arc::new(OnceLock::new());
    let b_slot: Arc<OnceLock<DetectorHandle>> = Arc::new(OnceLock::new());
    let (reports_tx, reports) = mpsc::channel();

    let to_b = Arc::clone(&b_slot);
    let a = DetectorThread::spawn(
        Detector::new(0, p, 1),
        Arc::clone(&clock),
        move |to: PeerId, hb: Heartbeat| {
            if let (1, Some(b)) = (to, to_b.get()) {
                b.heartbeat(0, hb);
            }
        },
        move |peer, status| {
            let _ = reports_tx.send((peer, status));
        },
    )
    .expect("spawn a");
    a_slot.set(a.handle().clone()).expect("once");
    let to_a = Arc::clone(&a_slot);
    let b = DetectorThread::spawn(
        Detector::new(1, p, 1),
        Arc::clone(&clock),
        move |to: PeerId, hb: Heartbeat| {
            if let (0, Some(a)) = (to, to_a.get()) {
                a.heartbeat(1, hb);
            }
        },
        |_, _| {},
    )
    .expect("spawn b");
    b_slot.set(b.handle().clone()).expect("once");
    a.handle().joined(1);
    b.handle().joined(0);

    // Both sides exchange heartbeats (bounded wait).
    let deadline = Instant::now() + secs(20);
    while a.handle().stats().round_heartbeats < 5 || b.handle().stats().round_heartbeats < 5 {
        assert!(Instant::now() < deadline, "no heartbeats within 20 s");
        std::thread::sleep(ms(5));
    }
    assert_eq!(a.handle().monitors(), [1]);
    assert_eq!(a.handle().status(1), Some(Status::Alive));

    // A reset: peer 2 is Broken at once.
    a.handle().joined(2);
    a.handle().closed(2);
    assert_eq!(wait_for(&reports, 2), Status::Broken);
    assert!(a.handle().is_broken(2));
    let map: VnodeMap = [(VnodeId(0), 1), (VnodeId(1), 2)].into_iter().collect();
    assert_eq!(
        map.broken_vnodes(a.handle(), &[VnodeId(0), VnodeId(1)]),
        [VnodeId(1)]
    );
    assert_eq!(map.check(&a, VnodeId(1)), Err(FdError::Broken(VnodeId(1))));

    // B stops (its thread ends on drop): A finds it silent, then Broken.
    let b_handle = b.handle().clone();
    drop(b);
    assert!(!b_handle.is_running(), "stopped on drop");
    let mut seen = Vec::new();
    loop {
        let status = wait_for(&reports, 1);
        seen.push(status);
        if status == Status::Broken {
            break;
        }
    }
    assert!(
        seen.ends_with(&[Status::Unreachable, Status::Broken]),
        "{seen:?}"
    );
    assert_eq!(a.handle().broken(), [1, 2]);
    assert!(a.handle().is_running());
    let a_handle = a.handle().clone();
    drop(a);
    assert!(!a_handle.is_running());
}

/// The next report about `peer`, waiting at most 20 s.
fn wait_for(reports: &mpsc::Receiver<(PeerId, Status)>, peer: PeerId) -> Status {
    let deadline = Instant::now() + secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (p, status) = reports
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no report about {peer} within 20 s: {e}"));
        if p == peer {
            return status;
        }
    }
}

/// `last_heard` reports when a peer was added or last heard from, for status reports only,
/// and never goes back in time for a message stamped late.
#[test]
fn last_heard_follows_messages_and_ignores_late_stamps() {
    let mut d = Detector::new(0, FdParams::default(), 1);
    assert_eq!(d.last_heard(1), None);
    d.add_peer(1, ms(10));
    assert_eq!(d.last_heard(1), Some(ms(10)));
    d.on_message(1, ms(50));
    assert_eq!(d.last_heard(1), Some(ms(50)));
    d.on_heartbeat(1, &Heartbeat { interval: ms(200) }, ms(40));
    assert_eq!(d.last_heard(1), Some(ms(50)));
    d.remove_peer(1);
    assert_eq!(d.last_heard(1), None);
}

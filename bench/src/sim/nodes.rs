//! `paper sim --nodes N`: the heartbeat traffic of N processes, each one real [`Detector`], on
//! simulated time in one thread, and how fast they find a seeded share of them killed.
//!
//! # Model (paper 004 §4.2)
//!
//! 1. **Connections.** Each process opens `dial` connections to distinct processes drawn
//!    uniformly at random (a seeded splitmix64). A connection is a TCP stream: both ends know
//!    it, so both call [`Detector::add_peer`] for the other (rule 1 of `detect/mod.rs`). This
//!    matters because of which side does what: a process draws its k monitors among *its own*
//!    peers and sends them heartbeats (rule 3), but a monitor only watches a process it knows
//!    as a peer (events about unknown peers are ignored, rule 1). With symmetric connections
//!    every monitor drawn knows the process it watches, so every process with at least k
//!    peers is watched closely by k others. The simulation checks it at the kill: every live
//!    process has k monitors, each of which sees it Alive. Degrees are `dial` at least (those
//!    it opened) plus those opened to it, `2 dial` on average, independent of N: the paper
//!    connects each process to its neighbours, not to everyone (with all N − 1 connected, the
//!    insurance heartbeats alone would be (N − 1 − k) / T_insurance per process: 50 per
//!    second at N = 10,000 and the paper's 200 s, against k / T_interval = 0.4 for the
//!    monitors).
//! 2. **Start.** Every connection opens at time 0; each process starts its detector (its first
//!    tick: first round, introductions) at a seeded time uniform in [0, T_interval), so that
//!    rounds are spread out as those of processes started one by one are.
//! 3. **Links.** Every message is a heartbeat (there is no application traffic; paper 004 counts
//!    every message as one, rule 5) and takes a seeded delay uniform in [`DELAY_US`]; a link
//!    keeps order (TCP), so a message never arrives before the one sent before it on the same
//!    link.
//! 4. **Ticks.** A process's detector ticks exactly at its [`Detector::next_deadline`] (or
//!    earlier, which is harmless): a min-heap holds deliveries and ticks, ordered by time then
//!    by a sequence number, so one seed always gives the same run.
//! 5. **Phases.** Warm-up (T_insurance + T_interval: the introductions' promises have run out
//!    once), then `window` in which the heartbeats each process sends and receives are counted,
//!    then the kill: a seeded `kill_fraction` of the processes stop at once, silently (no
//!    reset: they neither send nor receive any more; what they sent before is still
//!    delivered). The run goes on for T_insurance + T_timeout + T_broken + T_interval + the
//!    largest delay after the kill, past the detector's bound for a process that failed
//!    together with all its monitors (`detect/mod.rs`, "Bounds and cost").
//! 6. **Verdicts.** The detection time of a victim is the first Broken verdict about it by any
//!    live process, minus the kill time. A verdict (Unreachable or Broken) about a live process
//!    is false.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use veriflow::runtime::detect::{Action, Detector, FdParams, FdStats, Heartbeat, PeerId, Status};

use crate::detector::SplitMix;
use crate::Stats;

/// Per-message delay, uniform in this range, in µs (the brief's 0.1-5 ms: loopback to a LAN
/// under load).
pub const DELAY_US: (u64, u64) = (100, 5000);

/// One node simulation.
#[derive(Debug, Clone)]
pub struct NodesConfig {
    /// What the parameters are ("paper 004", "cluster default").
    pub name: String,
    /// Processes.
    pub nodes: u32,
    /// The detectors' parameters.
    pub params: FdParams,
    /// Connections each process opens (rule 1).
    pub dial: u32,
    /// How long heartbeats are counted, after the warm-up (rule 5).
    pub window: Duration,
    /// Share of the processes killed (rule 5); at least one if positive.
    pub kill_fraction: f64,
    /// Seed of the connections, starts, delays and victims.
    pub seed: u64,
}

/// Summary statistics of a sample.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Summary {
    /// Mean.
    pub mean: f64,
    /// Smallest.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Summary {
    /// The summary of `v`; `None` when empty.
    pub fn of(v: &[f64]) -> Option<Summary> {
        let s = Stats::of(v)?;
        let mut sorted = v.to_vec();
        sorted.sort_by(f64::total_cmp);
        // Nearest rank: the smallest value with at least 99 % of the sample at or below it.
        let rank = (sorted.len() * 99).div_ceil(100).max(1);
        Some(Summary {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            min: s.min,
            median: s.median,
            p99: sorted[rank - 1],
            max: s.max,
        })
    }
}

/// What one node simulation measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodesOutcome {
    /// Name of the parameter set.
    pub name: String,
    /// Processes.
    pub nodes: u32,
    /// k.
    pub k: usize,
    /// T_interval, s.
    pub interval_s: f64,
    /// T_timeout, s.
    pub timeout_s: f64,
    /// T_insurance, s.
    pub insurance_s: f64,
    /// T_broken, s.
    pub broken_s: f64,
    /// Connections each process opened.
    pub dial: u32,
    /// Seed.
    pub seed: u64,
    /// Peers per process (connections, both directions).
    pub degree: Summary,
    /// End of the warm-up, s of simulated time.
    pub warmup_s: f64,
    /// The kill, s (heartbeats are counted from the warm-up until then).
    pub kill_at_s: f64,
    /// End of the run, s.
    pub end_s: f64,
    /// Heartbeats each process sent per second in the window.
    pub sent_per_s: Summary,
    /// Heartbeats each process received per second in the window.
    pub received_per_s: Summary,
    /// Of the heartbeats sent, mean per process per second: by rounds (rule 3).
    pub round_per_s: f64,
    /// ... and by promises running out (insurance, rule 4).
    pub insurance_per_s: f64,
    /// Mean heartbeats sent per process per T_interval.
    pub sent_per_interval: f64,
    /// Mean heartbeats received per process per T_interval (what paper 004 Fig. 2 counts).
    pub received_per_interval: f64,
    /// Paper 004's estimate, k / T_interval + (c − k) / T_insurance per process of degree c
    /// (fixed monitors), mean over the processes, per second.
    pub paper_estimate_per_s: f64,
    /// The bound of `detect/mod.rs` for our detector, whose rounds also send one heartbeat to
    /// the monitor rotating out: (k + 1) / T_interval + (c − k) / T_insurance, mean, per second.
    pub bound_per_s: f64,
    /// Live processes, at the kill, with fewer than k monitors or a monitor that does not see
    /// them Alive (must be 0: such a process is watched by fewer than k).
    pub under_watched: u32,
    /// Processes each process watched closely at the kill (how many have it as a monitor).
    pub watching: Summary,
    /// Processes killed.
    pub victims: u32,
    /// Victims all of whose monitors were killed too (only insurance can find them).
    pub victims_without_live_monitor: u32,
    /// Seconds from the kill to the first Broken verdict about each detected victim.
    pub detection_s: Option<Summary>,
    /// Victims first declared Broken by one of their monitors at the kill.
    pub detected_by_monitor: u32,
    /// Victims no live process declared Broken by the end.
    pub never_detected: u32,
    /// Detections later than the monitors' bound T_interval + T_timeout + T_broken + largest
    /// delay, among victims that had a live monitor (must be 0).
    pub late_detections: u32,
    /// Unreachable verdicts about live processes (must be 0).
    pub false_unreachable: u64,
    /// Broken verdicts about live processes (must be 0).
    pub false_broken: u64,
    /// Messages delivered (to live processes) over the whole run.
    pub delivered: u64,
    /// Messages sent to dead processes (dropped).
    pub dropped: u64,
    /// Ticks run.
    pub ticks: u64,
    /// Wall time of the simulation, s.
    pub wall_s: f64,
}

/// A simulated event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A node's detector is due (stale unless `gen` is the node's current one).
    Tick { node: u32, gen: u32 },
    /// A heartbeat carrying `promise` arrives.
    Deliver {
        to: u32,
        from: u32,
        promise: Duration,
    },
}

/// The world: detectors, connections, the heap.
struct World {
    now: Duration,
    dets: Vec<Detector>,
    /// Sorted peers of each process.
    adj: Vec<Vec<u32>>,
    /// Last arrival on each link, indexed like `adj` (rule 3).
    tail: Vec<Vec<Duration>>,
    heap: BinaryHeap<Reverse<(Duration, u64, Ev)>>,
    seq: u64,
    gen: Vec<u32>,
    /// When each node's next tick is queued (None: none queued).
    tick_at: Vec<Option<Duration>>,
    /// When each node starts (rule 2): before it, no tick.
    start_at: Vec<Duration>,
    alive: Vec<bool>,
    delays: SplitMix,
    sent: Vec<u64>,
    received: Vec<u64>,
    /// Per victim (indexed by node): first Broken verdict by a live process, and by whom.
    first_broken: Vec<Option<(Duration, u32)>>,
    false_unreachable: u64,
    false_broken: u64,
    delivered: u64,
    dropped: u64,
    ticks: u64,
}

/// u32 node ids index vectors: lossless on the 32- and 64-bit targets we build for.
fn ix(n: u32) -> usize {
    n as usize
}

impl World {
    fn push(&mut self, at: Duration, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    /// Queues a tick at the node's deadline unless one is queued no later (rule 4).
    fn schedule_tick(&mut self, node: u32) {
        let i = ix(node);
        if !self.alive[i] {
            return;
        }
        let due = self.dets[i]
            .next_deadline()
            .max(self.now)
            .max(self.start_at[i]);
        if self.tick_at[i].is_some_and(|t| t <= due) {
            return;
        }
        self.gen[i] = self.gen[i].wrapping_add(1);
        self.tick_at[i] = Some(due);
        let gen = self.gen[i];
        self.push(due, Ev::Tick { node, gen });
    }

    fn send(&mut self, from: u32, to: u32, promise: Duration) {
        let (lo, hi) = DELAY_US;
        let delay = Duration::from_micros(lo + self.delays.below_u64(hi - lo + 1));
        let f = ix(from);
        let Ok(slot) = self.adj[f].binary_search(&to) else {
            // A detector only sends to its peers, which are its connections.
            unreachable!("process {from} sent to {to}, which is not its peer");
        };
        let arrival = (self.now + delay).max(self.tail[f][slot]);
        self.tail[f][slot] = arrival;
        self.sent[f] += 1;
        self.push(arrival, Ev::Deliver { to, from, promise });
    }

    fn run_until(&mut self, until: Duration) {
        while let Some(&Reverse((at, _, ev))) = self.heap.peek() {
            if at > until {
                break;
            }
            self.heap.pop();
            self.now = at;
            match ev {
                Ev::Tick { node, gen } => self.tick(node, gen),
                Ev::Deliver { to, from, promise } => self.deliver(to, from, promise),
            }
        }
        self.now = until;
    }

    fn tick(&mut self, node: u32, gen: u32) {
        let i = ix(node);
        if !self.alive[i] || gen != self.gen[i] {
            return;
        }
        self.tick_at[i] = None;
        self.ticks += 1;
        let now = self.now;
        for action in self.dets[i].tick(now) {
            match action {
                Action::SendHeartbeat { to, heartbeat } => self.send(node, to, heartbeat.interval),
                Action::Unreachable { peer } => {
                    if self.alive[ix(peer)] {
                        self.false_unreachable += 1;
                    }
                }
                Action::Broken { peer } => {
                    let p = ix(peer);
                    if self.alive[p] {
                        self.false_broken += 1;
                    } else if self.first_broken[p].is_none() {
                        // Time only moves forward: the first recorded is the earliest.
                        self.first_broken[p] = Some((now, node));
                    }
                }
                Action::Reachable { .. } => {}
            }
        }
        self.schedule_tick(node);
    }

    fn deliver(&mut self, to: u32, from: u32, promise: Duration) {
        let i = ix(to);
        if !self.alive[i] {
            self.dropped += 1;
            return;
        }
        self.delivered += 1;
        self.received[i] += 1;
        self.dets[i].on_heartbeat(from, &Heartbeat { interval: promise }, self.now);
        self.schedule_tick(to);
    }

    fn stats(&self) -> Vec<FdStats> {
        self.dets.iter().map(Detector::stats).collect()
    }
}

/// Draws the connections (rule 1): `dial` distinct others per process, both ends knowing the
/// link; returns each process's sorted peers.
fn connections(n: u32, dial: u32, rng: &mut SplitMix) -> Vec<Vec<u32>> {
    let mut adj: Vec<Vec<u32>> = vec![Vec::new(); ix(n)];
    let mut mine = Vec::with_capacity(ix(dial));
    for p in 0..n {
        mine.clear();
        while mine.len() < ix(dial) {
            let q = u32::try_from(rng.below_u64(u64::from(n))).unwrap_or(0);
            if q != p && !mine.contains(&q) {
                mine.push(q);
            }
        }
        for &q in &mine {
            adj[ix(p)].push(q);
            adj[ix(q)].push(p);
        }
    }
    for peers in &mut adj {
        peers.sort_unstable();
        // p may have dialled q and q p: one connection each way is still one peer.
        peers.dedup();
    }
    adj
}

/// Runs one node simulation (rules 1-6).
pub fn simulate(cfg: &NodesConfig) -> Result<NodesOutcome> {
    let started = Instant::now();
    let n = cfg.nodes;
    let p = cfg.params;
    if let Err(e) = p.validate() {
        bail!("{}: bad detector parameters: {e}", cfg.name);
    }
    if cfg.dial < 1 || u64::from(cfg.dial) >= u64::from(n) {
        bail!(
            "{}: each process opens {} connections, which needs 1 to {} for {n} processes",
            cfg.name,
            cfg.dial,
            n.saturating_sub(1)
        );
    }
    if !(0.0..1.0).contains(&cfg.kill_fraction) {
        bail!(
            "--kill-fraction {} must be in [0, 1): someone must be left to detect",
            cfg.kill_fraction
        );
    }
    let mut graph_rng = SplitMix(cfg.seed ^ 0x6e0d_e5c0_a11e_c7ed);
    let mut start_rng = SplitMix(cfg.seed ^ 0x57a7_7ed0_0000_0001);
    let mut victim_rng = SplitMix(cfg.seed ^ 0x0dea_d000_0000_0002);
    let adj = connections(n, cfg.dial, &mut graph_rng);
    let degrees: Vec<f64> = adj.iter().map(|a| a.len() as f64).collect();

    let mut dets = Vec::with_capacity(ix(n));
    for (me, peers) in (0..n).zip(&adj) {
        let mut d = Detector::new(me, p, cfg.seed);
        for &q in peers {
            d.add_peer(q, Duration::ZERO);
        }
        dets.push(d);
    }
    let start_at: Vec<Duration> = (0..n)
        .map(|_| p.interval.mul_f64(start_rng.unit()))
        .collect();
    let mut w = World {
        now: Duration::ZERO,
        dets,
        tail: adj.iter().map(|a| vec![Duration::ZERO; a.len()]).collect(),
        adj,
        heap: BinaryHeap::new(),
        seq: 0,
        gen: vec![0; ix(n)],
        tick_at: vec![None; ix(n)],
        start_at,
        alive: vec![true; ix(n)],
        delays: SplitMix(cfg.seed ^ 0xde1a_4500_0000_0003),
        sent: vec![0; ix(n)],
        received: vec![0; ix(n)],
        first_broken: vec![None; ix(n)],
        false_unreachable: 0,
        false_broken: 0,
        delivered: 0,
        dropped: 0,
        ticks: 0,
    };
    for node in 0..n {
        w.schedule_tick(node);
    }

    // Rule 5: warm-up, window, kill, detection.
    let warmup = p.insurance + p.interval;
    let kill_at = warmup + cfg.window;
    let d_max = Duration::from_micros(DELAY_US.1);
    let end = kill_at + p.insurance + p.timeout + p.broken + p.interval + d_max;
    w.run_until(warmup);
    let (sent0, received0, stats0) = (w.sent.clone(), w.received.clone(), w.stats());
    w.run_until(kill_at);
    let (sent1, received1, stats1) = (w.sent.clone(), w.received.clone(), w.stats());
    let window_s = cfg.window.as_secs_f64();
    let per_s = |a: &[u64], b: &[u64]| -> Vec<f64> {
        a.iter()
            .zip(b)
            .map(|(x, y)| (y - x) as f64 / window_s)
            .collect()
    };
    let sent = per_s(&sent0, &sent1);
    let received = per_s(&received0, &received1);
    let nf = f64::from(n);
    let round_per_s = stats0
        .iter()
        .zip(&stats1)
        .map(|(a, b)| (b.round_heartbeats - a.round_heartbeats) as f64)
        .sum::<f64>()
        / nf
        / window_s;
    let insurance_per_s = stats0
        .iter()
        .zip(&stats1)
        .map(|(a, b)| (b.insurance_heartbeats - a.insurance_heartbeats) as f64)
        .sum::<f64>()
        / nf
        / window_s;
    let (k, t_int, t_ins) = (
        p.k as f64,
        p.interval.as_secs_f64(),
        p.insurance.as_secs_f64(),
    );
    let paper_estimate_per_s = degrees
        .iter()
        .map(|&c| k / t_int + (c - k).max(0.0) / t_ins)
        .sum::<f64>()
        / nf;
    let bound_per_s = degrees
        .iter()
        .map(|&c| (k + 1.0).min(c) / t_int + (c - k).max(0.0) / t_ins)
        .sum::<f64>()
        / nf;

    // Who watches whom, at the kill (rule 1).
    let mut under_watched = 0u32;
    let mut watching = vec![0u32; ix(n)];
    let monitors: Vec<Vec<PeerId>> = w.dets.iter().map(Detector::monitors).collect();
    for (me, mons) in (0..n).zip(&monitors) {
        let seen = mons
            .iter()
            .filter(|&&m| w.dets[ix(m)].status(me) == Some(Status::Alive))
            .count();
        if mons.len() < p.k || seen < mons.len() {
            under_watched += 1;
        }
        for &m in mons {
            watching[ix(m)] += 1;
        }
    }
    let watching: Vec<f64> = watching.iter().map(|&x| f64::from(x)).collect();

    // The kill.
    let wanted = (cfg.kill_fraction * nf).round();
    let mut victims: Vec<u32> = Vec::new();
    if cfg.kill_fraction > 0.0 {
        // At least one, at most n - 1 (checked above: kill_fraction < 1).
        let count = (wanted.max(1.0) as usize).min(ix(n) - 1);
        let mut pool: Vec<u32> = (0..n).collect();
        for i in 0..count {
            let j = i + victim_rng.below(pool.len() - i);
            pool.swap(i, j);
        }
        victims = pool[..count].to_vec();
        victims.sort_unstable();
    }
    for &v in &victims {
        w.alive[ix(v)] = false;
    }
    let without_live_monitor = victims
        .iter()
        .filter(|&&v| monitors[ix(v)].iter().all(|&m| !w.alive[ix(m)]))
        .count();
    w.run_until(end);

    let bound = p.interval + p.timeout + p.broken + d_max;
    let mut detection = Vec::new();
    let (mut by_monitor, mut never, mut late) = (0u32, 0u32, 0u32);
    for &v in &victims {
        let has_live_monitor = monitors[ix(v)].iter().any(|&m| w.alive[ix(m)]);
        match w.first_broken[ix(v)] {
            Some((at, by)) => {
                let took = at - kill_at;
                detection.push(took.as_secs_f64());
                if monitors[ix(v)].contains(&by) {
                    by_monitor += 1;
                }
                if has_live_monitor && took > bound {
                    late += 1;
                }
            }
            None => never += 1,
        }
    }
    let summary = |v: &[f64], what: &str| {
        Summary::of(v).ok_or_else(|| anyhow::anyhow!("{}: no {what} to summarise", cfg.name))
    };
    Ok(NodesOutcome {
        name: cfg.name.clone(),
        nodes: n,
        k: p.k,
        interval_s: t_int,
        timeout_s: p.timeout.as_secs_f64(),
        insurance_s: t_ins,
        broken_s: p.broken.as_secs_f64(),
        dial: cfg.dial,
        seed: cfg.seed,
        degree: summary(&degrees, "degrees")?,
        warmup_s: warmup.as_secs_f64(),
        kill_at_s: kill_at.as_secs_f64(),
        end_s: end.as_secs_f64(),
        sent_per_s: summary(&sent, "rates")?,
        received_per_s: summary(&received, "rates")?,
        round_per_s,
        insurance_per_s,
        sent_per_interval: sent.iter().sum::<f64>() / nf * t_int,
        received_per_interval: received.iter().sum::<f64>() / nf * t_int,
        paper_estimate_per_s,
        bound_per_s,
        under_watched,
        watching: summary(&watching, "monitors")?,
        victims: u32::try_from(victims.len()).unwrap_or(u32::MAX),
        victims_without_live_monitor: u32::try_from(without_live_monitor).unwrap_or(u32::MAX),
        detection_s: Summary::of(&detection),
        detected_by_monitor: by_monitor,
        never_detected: never,
        late_detections: late,
        false_unreachable: w.false_unreachable,
        false_broken: w.false_broken,
        delivered: w.delivered,
        dropped: w.dropped,
        ticks: w.ticks,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_symmetric_and_at_least_dial() {
        let mut rng = SplitMix(3);
        let adj = connections(50, 4, &mut rng);
        for (p, peers) in adj.iter().enumerate() {
            assert!(peers.len() >= 4, "process {p}: {peers:?}");
            for &q in peers {
                assert_ne!(ix(q), p);
                let p32 = u32::try_from(p).unwrap();
                assert!(
                    adj[ix(q)].binary_search(&p32).is_ok(),
                    "{q} does not know {p}"
                );
            }
        }
    }

    #[test]
    fn summary_percentile() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        let s = Summary::of(&v).unwrap();
        assert_eq!((s.min, s.p99, s.max), (1.0, 198.0, 200.0));
        assert_eq!(s.median, 100.5);
    }
}

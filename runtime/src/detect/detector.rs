//! The detector's state machine: one [`Peer`] per connection, rounds, insurance, verdicts.
//! Rules are numbered in `detect/mod.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::mem;
use std::time::Duration;

use rand::rngs::ChaCha8Rng;
use rand::seq::IndexedRandom;
use rand::SeedableRng;

use super::{Action, FdParams, Heartbeat, PeerId, Status};

/// Shortest period [`Detector`] accepts: a zero T_interval or T_insurance would make `tick` spin.
const MIN_PERIOD: Duration = Duration::from_millis(1);

/// How we watch one peer (receive side), a state carrying its timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// Heard from at `heard`; it promised its next message within `promise` (rule 2).
    Alive { heard: Duration, promise: Duration },
    /// Silent past its promise + T_timeout since `since` (rule 6).
    Unreachable { since: Duration, promise: Duration },
    /// Final (rule 7).
    Broken,
}

/// One connection: how we watch the peer, and what we promised it.
#[derive(Debug, Clone)]
struct Peer {
    watch: Watch,
    /// When we last sent it anything (rule 5).
    sent_at: Duration,
    /// The interval our last heartbeat to it carried; zero before the first (rule 4).
    promised: Duration,
    /// When we last heard from it (any message), or when it was added; for status reports.
    last_heard: Duration,
}

impl Peer {
    fn status(&self) -> Status {
        match self.watch {
            Watch::Alive { .. } => Status::Alive,
            Watch::Unreachable { .. } => Status::Unreachable,
            Watch::Broken => Status::Broken,
        }
    }

    fn is_broken(&self) -> bool {
        self.watch == Watch::Broken
    }

    /// Something arrived at `now`, with a new promise if it was a heartbeat (rules 5, 8).
    /// Returns true when an Unreachable peer became Alive.
    #[must_use]
    fn heard(&mut self, now: Duration, promise: Option<Duration>) -> bool {
        self.last_heard = self.last_heard.max(now);
        match &mut self.watch {
            Watch::Alive {
                heard,
                promise: old,
            } => {
                // Events may be stamped slightly out of order by several reader threads.
                *heard = (*heard).max(now);
                *old = promise.unwrap_or(*old);
                false
            }
            Watch::Unreachable { promise: old, .. } => {
                self.watch = Watch::Alive {
                    heard: now,
                    promise: promise.unwrap_or(*old),
                };
                true
            }
            Watch::Broken => false,
        }
    }

    /// The next time a timer of this peer fires: a silence or T_broken deadline (rules 6-7),
    /// or the time our promise to it runs out (rule 4). None once Broken.
    fn deadline(&self, params: &FdParams) -> Option<Duration> {
        let ours = self.sent_at.saturating_add(self.promised);
        let theirs = match self.watch {
            Watch::Alive { heard, promise } => {
                heard.saturating_add(promise).saturating_add(params.timeout)
            }
            Watch::Unreachable { since, .. } => since.saturating_add(params.broken),
            Watch::Broken => return None,
        };
        Some(ours.min(theirs))
    }

    /// Applies rules 6-7 at `now`: Alive → Unreachable → Broken. Returns the changes made.
    #[must_use]
    fn expire(&mut self, now: Duration, params: &FdParams) -> (bool, bool) {
        let mut unreachable = false;
        if let Watch::Alive { heard, promise } = self.watch {
            if now >= heard.saturating_add(promise).saturating_add(params.timeout) {
                self.watch = Watch::Unreachable {
                    since: now,
                    promise,
                };
                unreachable = true;
            }
        }
        let mut broken = false;
        if let Watch::Unreachable { since, .. } = self.watch {
            if now >= since.saturating_add(params.broken) {
                self.watch = Watch::Broken;
                broken = true;
            }
        }
        (unreachable, broken)
    }

    /// Rule 9: this process was stalled; time it did not see does not count against the peer.
    fn restart(&mut self, now: Duration) {
        match &mut self.watch {
            Watch::Alive { heard, .. } => *heard = (*heard).max(now),
            Watch::Unreachable { since, .. } => *since = (*since).max(now),
            Watch::Broken => {}
        }
    }
}

/// Counters of one detector, for tests and the `paper detector` benchmark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FdStats {
    /// Rounds run (rule 3).
    pub rounds: u64,
    /// Heartbeats sent by rounds, to monitors and to the monitor rotating out (rule 3).
    pub round_heartbeats: u64,
    /// Heartbeats sent because a promise ran out, introductions included (rule 4).
    pub insurance_heartbeats: u64,
    /// Ticks that found this process had been stalled (rule 9).
    pub stalls: u64,
}

/// The Phoenix failure detector of one process: a pure state machine on explicit time.
///
/// Call the `on_*` methods as things happen, then [`Detector::tick`] no later than
/// [`Detector::next_deadline`]; `tick` returns what to send and whose status changed.
#[derive(Debug)]
pub struct Detector {
    me: PeerId,
    params: FdParams,
    rng: ChaCha8Rng,
    peers: BTreeMap<PeerId, Peer>,
    /// The k monitors, oldest first (rule 3).
    monitors: VecDeque<PeerId>,
    /// When the next round is due; None before the first tick.
    next_round: Option<Duration>,
    /// When the last tick ran; None before the first (rule 9 needs a previous tick).
    last_tick: Option<Duration>,
    /// Status changes found between ticks (rules 7-8), returned by the next tick.
    pending: Vec<Action>,
    /// When the oldest pending action was found: the next tick is due then.
    pending_at: Option<Duration>,
    stats: FdStats,
}

impl Detector {
    /// A detector for process `me`, drawing its monitors from ChaCha8 with `seed`, stream `me`
    /// (so processes given one cluster seed still draw differently). Periods below 1 ms are
    /// raised to 1 ms; use [`FdParams::validate`] to refuse bad input instead.
    pub fn new(me: PeerId, params: FdParams, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(u64::from(me));
        Detector {
            me,
            params: sanitize(params),
            rng,
            peers: BTreeMap::new(),
            monitors: VecDeque::new(),
            next_round: None,
            last_tick: None,
            pending: Vec::new(),
            pending_at: None,
            stats: FdStats::default(),
        }
    }

    /// This process.
    pub fn me(&self) -> PeerId {
        self.me
    }

    /// The parameters in force.
    pub fn params(&self) -> FdParams {
        self.params
    }

    /// Changes the parameters (paper 004 §5.1 `ph_set_parameter`). Promises already made are
    /// kept: the next round is still due when the last one said, and new heartbeats carry the
    /// new intervals.
    pub fn set_params(&mut self, params: FdParams) {
        self.params = sanitize(params);
    }

    /// Counters since creation.
    pub fn stats(&self) -> FdStats {
        self.stats
    }

    /// A connection to `peer` opened (rule 1): it is watched from `now`, held to our
    /// T_insurance until its first heartbeat, and introduced at the next tick (rule 4). A
    /// peer already known, even Broken, is left as it is: Broken is final (to admit a new
    /// process under a used id, [`Detector::remove_peer`] it first).
    pub fn add_peer(&mut self, peer: PeerId, now: Duration) {
        if peer == self.me || self.peers.contains_key(&peer) {
            return;
        }
        self.peers.insert(
            peer,
            Peer {
                watch: Watch::Alive {
                    heard: now,
                    promise: self.params.insurance,
                },
                sent_at: now,
                promised: Duration::ZERO,
                last_heard: now,
            },
        );
    }

    /// `peer` left in good order: forget it, without a verdict.
    pub fn remove_peer(&mut self, peer: PeerId) {
        self.peers.remove(&peer);
        self.monitors.retain(|&m| m != peer);
    }

    /// A heartbeat arrived from `from` (rules 2, 5, 8).
    pub fn on_heartbeat(&mut self, from: PeerId, hb: &Heartbeat, now: Duration) {
        self.heard(from, Some(hb.interval), now);
    }

    /// Any other message arrived from `from`: it counts as a heartbeat (rule 5).
    pub fn on_message(&mut self, from: PeerId, now: Duration) {
        self.heard(from, None, now);
    }

    /// A message other than our heartbeats was sent to `to`: it postpones the insurance
    /// heartbeat (rule 5).
    pub fn on_sent(&mut self, to: PeerId, now: Duration) {
        if let Some(peer) = self.peers.get_mut(&to) {
            if !peer.is_broken() {
                peer.sent_at = peer.sent_at.max(now);
            }
        }
    }

    /// The connection to `peer` was closed or reset: it is Broken at once, and the next tick
    /// (due now) reports it (rule 7).
    pub fn on_closed(&mut self, peer: PeerId, now: Duration) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if p.is_broken() {
            return;
        }
        p.watch = Watch::Broken;
        self.monitors.retain(|&m| m != peer);
        tracing::debug!(
            me = self.me,
            peer,
            "failure detector: connection closed, broken"
        );
        self.push_pending(Action::Broken { peer }, now);
    }

    /// Runs the timers due at `now` and returns, in order, the status changes found and the
    /// heartbeats to send (rules 3-4, 6-9). Call it no later than [`Detector::next_deadline`];
    /// calling it earlier is harmless.
    #[must_use = "the heartbeats must be sent and the verdicts acted on"]
    pub fn tick(&mut self, now: Duration) -> Vec<Action> {
        // Rule 9: a tick much later than due means we were not running.
        if self.last_tick.is_some() {
            let late = now.saturating_sub(self.next_deadline());
            if late > self.params.timeout {
                self.stats.stalls += 1;
                tracing::warn!(
                    me = self.me,
                    late_ms = late.as_millis(),
                    "failure detector was stalled: restarting silence timers, accusing no one"
                );
                for peer in self.peers.values_mut() {
                    peer.restart(now);
                }
            }
        }
        self.last_tick = Some(now);

        let mut out = mem::take(&mut self.pending);
        self.pending_at = None;

        // Rules 6-7.
        for (&id, peer) in &mut self.peers {
            let (unreachable, broken) = peer.expire(now, &self.params);
            if unreachable {
                tracing::debug!(me = self.me, peer = id, "failure detector: unreachable");
                out.push(Action::Unreachable { peer: id });
            }
            if broken {
                tracing::info!(me = self.me, peer = id, "failure detector: broken");
                out.push(Action::Broken { peer: id });
            }
        }

        // Rule 3.
        if !matches!(self.next_round, Some(due) if now < due) {
            self.round(now, &mut out);
            self.next_round = Some(now.saturating_add(self.params.interval));
        }

        // Rule 4, after the round so that a monitor is not sent two heartbeats.
        let (interval, insurance) = (self.params.interval, self.params.insurance);
        for (&id, peer) in &mut self.peers {
            if !peer.is_broken() && now >= peer.sent_at.saturating_add(peer.promised) {
                let promise = if self.monitors.contains(&id) {
                    interval
                } else {
                    insurance
                };
                out.push(send(id, peer, promise, now));
                self.stats.insurance_heartbeats += 1;
            }
        }
        out
    }

    /// When [`Detector::tick`] must run next: the earliest of the next round, every peer's
    /// silence, T_broken and insurance timers, and any status change found since the last tick.
    pub fn next_deadline(&self) -> Duration {
        let mut due = self.next_round.unwrap_or(Duration::ZERO);
        if let Some(at) = self.pending_at {
            due = due.min(at);
        }
        for peer in self.peers.values() {
            if let Some(at) = peer.deadline(&self.params) {
                due = due.min(at);
            }
        }
        due
    }

    /// Whether `peer` is Broken (rule 7). Unknown peers are not.
    pub fn is_broken(&self, peer: PeerId) -> bool {
        self.peers.get(&peer).is_some_and(Peer::is_broken)
    }

    /// The Broken peers, in increasing order.
    pub fn broken(&self) -> Vec<PeerId> {
        self.peers
            .iter()
            .filter(|(_, p)| p.is_broken())
            .map(|(&id, _)| id)
            .collect()
    }

    /// How this detector sees `peer`; None if it is not a known peer.
    pub fn status(&self, peer: PeerId) -> Option<Status> {
        self.peers.get(&peer).map(Peer::status)
    }

    /// When `peer` was last heard from (any message counts, rule 5), or added if never; None
    /// if it is not a known peer. For status reports only: verdicts follow the watch states.
    pub fn last_heard(&self, peer: PeerId) -> Option<Duration> {
        self.peers.get(&peer).map(|p| p.last_heard)
    }

    /// Every known peer with its status, in increasing order.
    pub fn peers(&self) -> Vec<(PeerId, Status)> {
        self.peers.iter().map(|(&id, p)| (id, p.status())).collect()
    }

    /// The peers currently watching this process closely, oldest first (rule 3).
    pub fn monitors(&self) -> Vec<PeerId> {
        self.monitors.iter().copied().collect()
    }

    fn heard(&mut self, from: PeerId, promise: Option<Duration>, now: Duration) {
        let Some(peer) = self.peers.get_mut(&from) else {
            return;
        };
        if peer.heard(now, promise) {
            tracing::debug!(
                me = self.me,
                peer = from,
                "failure detector: reachable again"
            );
            self.push_pending(Action::Reachable { peer: from }, now);
        }
    }

    fn push_pending(&mut self, action: Action, now: Duration) {
        self.pending.push(action);
        self.pending_at = Some(self.pending_at.map_or(now, |at| at.min(now)));
    }

    /// Rule 3: rotate one monitor, fill up to k, send the round's heartbeats.
    fn round(&mut self, now: Duration, out: &mut Vec<Action>) {
        self.stats.rounds += 1;
        let peers = &self.peers;
        self.monitors
            .retain(|m| peers.get(m).is_some_and(|p| !p.is_broken()));
        let live = peers.values().filter(|p| !p.is_broken()).count();
        let k = self.params.k;

        let mut leaving = Vec::new();
        while self.monitors.len() > k {
            leaving.extend(self.monitors.pop_front());
        }
        if self.monitors.len() == k && live > k {
            leaving.extend(self.monitors.pop_front());
        }
        // Draw among the Alive peers if any (an Unreachable one is probably dead and would
        // watch nobody), and take the monitor rotating out back only if nobody else is left.
        let mut candidates: Vec<PeerId> = Vec::new();
        while self.monitors.len() < k {
            let tiers = [(true, true), (true, false), (false, true), (false, false)];
            for (alive_only, excluding_leaving) in tiers {
                candidates.clear();
                candidates.extend(
                    self.peers
                        .iter()
                        .filter(|(id, p)| {
                            !p.is_broken()
                                && (!alive_only || p.status() == Status::Alive)
                                && !self.monitors.contains(id)
                                && (!excluding_leaving || !leaving.contains(id))
                        })
                        .map(|(&id, _)| id),
                );
                if !candidates.is_empty() {
                    break;
                }
            }
            match candidates.choose(&mut self.rng) {
                Some(&drawn) => self.monitors.push_back(drawn),
                None => break,
            }
        }

        let (interval, insurance) = (self.params.interval, self.params.insurance);
        for id in leaving {
            if !self.monitors.contains(&id) {
                if let Some(peer) = self.peers.get_mut(&id) {
                    out.push(send(id, peer, insurance, now));
                    self.stats.round_heartbeats += 1;
                }
            }
        }
        for &id in &self.monitors {
            if let Some(peer) = self.peers.get_mut(&id) {
                out.push(send(id, peer, interval, now));
                self.stats.round_heartbeats += 1;
            }
        }
    }

    /// Test hook: the earliest silence deadline among Alive peers (rule 6), if any.
    #[cfg(test)]
    pub(super) fn earliest_silence_deadline(&self) -> Option<Duration> {
        self.peers
            .values()
            .filter_map(|p| match p.watch {
                Watch::Alive { heard, promise } => Some(heard + promise + self.params.timeout),
                _ => None,
            })
            .min()
    }

    /// Test hook: when the next round is due (None before the first tick).
    #[cfg(test)]
    pub(super) fn next_round_at(&self) -> Option<Duration> {
        self.next_round
    }

    /// Test hook: the promise `peer` last made to us, if it is not Broken.
    #[cfg(test)]
    pub(super) fn promise_from(&self, peer: PeerId) -> Option<Duration> {
        match self.peers.get(&peer)?.watch {
            Watch::Alive { promise, .. } | Watch::Unreachable { promise, .. } => Some(promise),
            Watch::Broken => None,
        }
    }
}

/// Records a heartbeat to `peer` carrying `promise` (rule 2) and returns the action.
fn send(id: PeerId, peer: &mut Peer, promise: Duration, now: Duration) -> Action {
    peer.sent_at = now;
    peer.promised = promise;
    Action::SendHeartbeat {
        to: id,
        heartbeat: Heartbeat { interval: promise },
    }
}

fn sanitize(mut params: FdParams) -> FdParams {
    params.interval = params.interval.max(MIN_PERIOD);
    params.insurance = params.insurance.max(MIN_PERIOD);
    params
}

//! The online oracle's certifier half: it follows the logs of a run while the run goes on,
//! re-runs sampled completed tasks, keeps each worker's credibility, and names forgers (issue
//! 20; Sarmenta's spot-checking with paper 001's draw). The cluster's oracle process
//! (`veriflow-cluster`) feeds it the map of incarnations and carries its findings to the
//! coordinator; this part does no network I/O, only store reads.
//!
//! Rules:
//!
//! 1. **Reading.** Each vnode's log is followed with a [`LogTail`]: only segments its durable
//!    watermark covers, each event once. Events grow a [`Track`] as the certifier's own load
//!    builds it. A completed task belongs to the *incarnation* (vnode, epoch) whose segment
//!    holds its `Completed` (the epoch is the segment number's high bits), and through it to
//!    the worker the coordinator says hosted that incarnation.
//! 2. **The uniform draw, ahead.** The final certificate's first pass draws by the key of the
//!    secret (`draw.rs` rule 3): the N = N_{ε,q} tasks of smallest priority. When m tasks have
//!    completed, a task that completes is a *candidate* if its priority, as a number in [0, 1),
//!    is below min(1, 2N/m) (the final draw's tasks of n ≥ m have priorities near N/n ≤ N/m).
//!    Candidates are checked smallest priority first, at most a fraction a of the tasks
//!    completed so far ([`Follower::draw_ahead`], [`DRAW_AHEAD`] by default), and dropped once
//!    their priority is above 2N/m. The smallest a·m priorities of m tasks lie near a, so while
//!    a ≤ N/n nearly every task checked ahead is one the final pass draws: about N tasks are
//!    re-run for the draw in all (the rest, N − a·n if positive, by the final pass), instead of
//!    the 2N(1 + ln(n/2N)) that checking every candidate at once costs, and on machines the
//!    workers share the oracle takes that much less from them.
//! 3. **Checking.** A selected task is checked (`oracle.rs` rule 1, in parallel) as soon as all
//!    its check reads is in the logs read: its record, its completion, its inputs' values and
//!    its children's records. Until then it waits; nothing is decided on a partial log.
//! 4. **Credibility.** Each completed task of worker w is also spot-checked with probability
//!    s_w = max(f, 1/(1 + c_w)), where c_w counts the checks of w's tasks drawn so far (done,
//!    or waiting for their inputs: within one poll's batch the rate falls as checks are drawn,
//!    not all at once when they are done) and f is the floor
//!    ([`Follower::new`]), drawn with the spot key (`draw.rs` rule 3, so the uniform draw stays
//!    uniform). A new worker is checked at once and often, one with a history at the floor.
//!    Each forged task is caught with probability at least f, whatever the worker did before:
//!    a worker that forges m tasks stays unnoticed with probability at most (1 - f)^m, and it
//!    gets at most (1 - f)/f forgeries accepted on average before it is caught.
//! 5. **A forger.** The first forged task found of a worker names it ([`Finding`]), once. Every
//!    task it completed is then distrusted, caught or not ([`Prior::distrusted`]): at the end
//!    each is checked, and those forged start G_F with their successors (crate rule 6), so
//!    nothing it forged survives into the certified result, and what it computed right is
//!    kept (re-running all of its tasks' successors would re-run the whole graph whenever it
//!    held the root).
//! 6. A log that cannot be read, or a task the registry does not know, is an error, never a
//!    detection: an honest worker is never named for the oracle's own trouble.
//! 7. **The end.** The final certificate starts from the track followed, without reading the
//!    log again, when the tails read every segment the store holds (none past a watermark,
//!    no torn one) and the generation is still the one followed; otherwise it loads the log
//!    as `certify` does. Track building does not depend on the order events are read in.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use rayon::prelude::*;
use veriflow_checkpoint::Store;
use veriflow_runtime::log::{segment::EPOCH_SHIFT, Event, LogError, LogReader, LogTail};
use veriflow_runtime::{Registry, RunError, TaskId, VnodeId};

use crate::certificate::{OnlineRecord, WorkerRecord};
use crate::draw::DrawKey;
use crate::oracle::{self, Detection, Verdict};
use crate::sample::{self, SampleError};
use crate::track::{Ix, Track};
use crate::Prior;

/// The default fraction of completed tasks checked ahead for the final draw (rule 2): every
/// candidate at once. Checks ahead are uniform draws, so they catch liars too: with 0.01 the
/// oracle re-ran 940 tasks of an honest run instead of 3,372 (`paper online`), but a worker
/// forging 0.5 % of its tasks went uncaught and the run ended wrong, which the full draw
/// caught 5 times in 5.
pub const DRAW_AHEAD: f64 = 1.0;

/// A vnode incarnation: (vnode, epoch).
pub type Incarnation = (u32, u64);

/// A forger named (rule 5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The worker that completed the forged task, if the map named it yet.
    pub worker: Option<u32>,
    /// The incarnation whose log holds the forged completion.
    pub incarnation: Incarnation,
    /// What the oracle found.
    pub detection: Detection,
}

/// Why following stopped.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The log cannot be read (rule 6).
    #[error(transparent)]
    Log(#[from] LogError),
    /// The registry cannot re-run a logged task (rule 6).
    #[error("the oracle cannot run this log: {0} (run the oracle of the app that runs the job)")]
    Program(RunError),
    /// ε or q out of range.
    #[error(transparent)]
    Sample(#[from] SampleError),
}

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    tasks: u64,
    checked: u64,
    clean: u64,
    forged: u64,
    /// Checks drawn (rule 4's c_w).
    drawn: u64,
}

/// What one [`Follower::poll`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Polled {
    /// New events read.
    pub events: u64,
    /// Tasks checked.
    pub checked: u64,
    /// Forgers named (rule 5).
    pub findings: Vec<Finding>,
}

/// Follows one run (rules 1-6).
pub struct Follower {
    reader: LogReader,
    registry: Arc<Registry>,
    tails: Vec<LogTail>,
    track: Option<Track>,
    draw: DrawKey,
    spot: DrawKey,
    n_eps_q: f64,
    epsilon: f64,
    floor: f64,
    hosts: BTreeMap<Incarnation, u32>,
    /// The incarnations of each worker (the reverse of `hosts`).
    incarnations: BTreeMap<u32, Vec<Incarnation>>,
    done_in: HashMap<TaskId, Incarnation>,
    completed: u64,
    /// Rule 2's candidates, smallest priority first: (priority's bits, task).
    candidates: BinaryHeap<Reverse<(u64, Ix)>>,
    ahead: f64,
    /// Candidates taken to be checked (rule 2's budget).
    taken: u64,
    pending: BTreeSet<Ix>,
    clean: HashSet<[u8; 32]>,
    checked: u64,
    forged: Vec<(TaskId, Detection)>,
    by_inc: BTreeMap<Incarnation, Counts>,
    caught: BTreeSet<u32>,
    caught_inc: BTreeSet<Incarnation>,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follower")
            .field("store", &self.reader.store().describe())
            .field("completed", &self.completed)
            .field("checked", &self.checked)
            .finish_non_exhaustive()
    }
}

impl Follower {
    /// Follows the run in `store` with the draw of `secret` (rule 2), ε and q as the final
    /// certificate will use them, and the spot-check floor `floor` (rule 4).
    pub fn new(
        store: Arc<dyn Store>,
        registry: Arc<Registry>,
        secret: &[u8; 32],
        epsilon: f64,
        q: f64,
        floor: f64,
    ) -> Result<Follower, FollowError> {
        let n_eps_q = sample::n_eps_q(epsilon, q)?;
        if !(floor > 0.0 && floor <= 1.0) {
            return Err(FollowError::Sample(SampleError::Q(floor)));
        }
        Ok(Follower {
            reader: LogReader::new(store),
            registry,
            tails: Vec::new(),
            track: None,
            draw: DrawKey::from_secret(secret, 0),
            spot: DrawKey::spot(secret),
            n_eps_q,
            epsilon,
            floor,
            hosts: BTreeMap::new(),
            incarnations: BTreeMap::new(),
            done_in: HashMap::new(),
            completed: 0,
            candidates: BinaryHeap::new(),
            ahead: DRAW_AHEAD,
            taken: 0,
            pending: BTreeSet::new(),
            clean: HashSet::new(),
            checked: 0,
            forged: Vec::new(),
            by_inc: BTreeMap::new(),
            caught: BTreeSet::new(),
            caught_inc: BTreeSet::new(),
        })
    }

    /// Checks at most this fraction of the completed tasks ahead for the final draw (rule 2;
    /// 0 leaves the whole draw to the final pass, 1 checks every candidate at once).
    pub fn draw_ahead(mut self, fraction: f64) -> Result<Follower, FollowError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(FollowError::Sample(SampleError::Q(fraction)));
        }
        self.ahead = fraction;
        Ok(self)
    }

    /// The coordinator says `worker` hosts (hosted) `vnode` at `epoch` (rule 1).
    pub fn hosted(&mut self, vnode: u32, epoch: u64, worker: u32) {
        if self.hosts.insert((vnode, epoch), worker).is_none() {
            self.incarnations
                .entry(worker)
                .or_default()
                .push((vnode, epoch));
        }
    }

    /// Tasks completed so far (as read).
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Tasks checked so far.
    pub fn checked(&self) -> u64 {
        self.checked
    }

    /// Workers named as forgers so far.
    pub fn caught(&self) -> &BTreeSet<u32> {
        &self.caught
    }

    /// A worker's counts: the sum over its own incarnations (a few), not over every one.
    fn worker_counts(&self, w: u32) -> Counts {
        let mut c = Counts::default();
        for n in self
            .incarnations
            .get(&w)
            .into_iter()
            .flatten()
            .filter_map(|inc| self.by_inc.get(inc))
        {
            c.tasks += n.tasks;
            c.checked += n.checked;
            c.clean += n.clean;
            c.drawn += n.drawn;
            c.forged += n.forged;
        }
        c
    }

    /// Rule 4: the spot-check rate of the worker behind `inc` (its incarnation's own history
    /// while the map has not named it).
    fn spot_rate(&self, inc: Incarnation) -> f64 {
        let drawn = match self.hosts.get(&inc) {
            Some(&w) => self.worker_counts(w).drawn,
            None => self.by_inc.get(&inc).map_or(0, |c| c.drawn),
        };
        (1.0 / (1.0 + drawn as f64)).max(self.floor)
    }

    /// Reads what became durable, selects and checks (rules 1-5).
    pub fn poll(&mut self) -> Result<Polled, FollowError> {
        let mut polled = Polled::default();
        if self.track.is_none() {
            // The run's first member writes the manifest; until then there is nothing to read.
            let Some(m) = veriflow_runtime::log::Manifest::load(&**self.reader.store())? else {
                return Ok(polled);
            };
            self.tails = (0..m.vnodes)
                .map(|v| self.reader.tail(VnodeId(v)))
                .collect();
            let mut track = Track::live(m, 0);
            track.store = Some(crate::track::ValueSource(self.reader.store().clone()));
            self.track = Some(track);
        }
        // Events read before a failing read are kept (the tail moved past them): absorbed
        // first, then the error is returned.
        let mut fresh: Vec<(VnodeId, u64, Event)> = Vec::new();
        let mut failed: Option<LogError> = None;
        for (v, tail) in self.tails.iter_mut().enumerate() {
            let vnode = VnodeId(v as u32);
            if let Err(e) = tail.poll(&self.reader, &mut |e| {
                fresh.push((vnode, e.segment >> EPOCH_SHIFT, e.event))
            }) {
                failed.get_or_insert(e);
            }
        }
        polled.events = fresh.len() as u64;
        for (vnode, epoch, event) in fresh {
            let done = match &event {
                Event::Completed { task, .. } => Some(*task),
                _ => None,
            };
            let track = self.track.as_mut().expect("set above");
            track.absorb(vnode, event);
            if let Some(task) = done {
                self.completed_one(task, (vnode.0, epoch));
            }
        }
        self.check_ready(&mut polled)?;
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(polled),
        }
    }

    /// Rules 1, 2 and 4 for a task whose completion was just read.
    fn completed_one(&mut self, task: TaskId, inc: Incarnation) {
        if self.done_in.contains_key(&task) {
            return; // a completion logged twice (set semantics across segments)
        }
        self.done_in.insert(task, inc);
        self.completed += 1;
        self.by_inc.entry(inc).or_default().tasks += 1;
        let track = self.track.as_ref().expect("a task was read");
        let Some(t) = track.index_of(task) else {
            return;
        };
        let priority = self.draw.uniform(task);
        if self.spot.uniform(task) < self.spot_rate(inc) {
            self.pending.insert(t);
            self.by_inc.entry(inc).or_default().drawn += 1;
        } else if priority < self.threshold() {
            self.candidates.push(Reverse((priority.to_bits(), t)));
        }
    }

    /// Rule 2: the priority below which a task may be in the final draw.
    fn threshold(&self) -> f64 {
        (2.0 * self.n_eps_q / self.completed.max(1) as f64).min(1.0)
    }

    /// Rule 2: candidates to check now, smallest priority first, within the budget.
    fn take_candidates(&mut self) {
        let threshold = self.threshold();
        while (self.taken as f64) < self.ahead * self.completed as f64 {
            let Some(Reverse((bits, t))) = self.candidates.pop() else {
                return;
            };
            if f64::from_bits(bits) >= threshold {
                // The smallest is past the threshold: so is every other.
                self.candidates.clear();
                return;
            }
            if self.pending.insert(t) {
                self.taken += 1;
                let track = self.track.as_ref().expect("candidates come from it");
                if let Some(inc) = self.done_in.get(&track.id(t)) {
                    self.by_inc.entry(*inc).or_default().drawn += 1;
                }
            }
        }
    }

    /// Rule 3: whether everything the check of `t` reads is in the logs read.
    fn ready(track: &Track, t: Ix) -> bool {
        // Presence only: the values are copied once, by the check itself.
        track.has_record(t)
            && track.is_completed(t)
            && track.inputs(t).all(|d| track.value(d).is_some())
            && track
                .children(t)
                .all(|c| track.index_of(c).is_some_and(|ci| track.has_record(ci)))
    }

    fn check_ready(&mut self, polled: &mut Polled) -> Result<(), FollowError> {
        self.take_candidates();
        let Some(track) = &self.track else {
            return Ok(());
        };
        let ready: Vec<Ix> = self
            .pending
            .iter()
            .copied()
            .filter(|&t| Self::ready(track, t))
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        let registry = &*self.registry;
        let verdicts: Vec<(Ix, Result<Verdict, RunError>)> = ready
            .par_iter()
            .map(|&t| (t, oracle::check(track, registry, t)))
            .collect();
        for (t, v) in verdicts {
            self.pending.remove(&t);
            let v = v.map_err(FollowError::Program)?;
            let track = self.track.as_ref().expect("checked above");
            let id = track.id(t);
            let inc = self.done_in[&id];
            self.checked += 1;
            polled.checked += 1;
            let counts = self.by_inc.entry(inc).or_default();
            counts.checked += 1;
            match v {
                Verdict::Clean => {
                    counts.clean += 1;
                    self.clean.insert(track.leaf(t));
                }
                Verdict::Forged(detection) => {
                    counts.forged += 1;
                    self.forged.push((id, detection.clone()));
                    let worker = self.hosts.get(&inc).copied();
                    let new = match worker {
                        Some(w) => self.caught.insert(w),
                        None => self.caught_inc.insert(inc),
                    };
                    if new {
                        polled.findings.push(Finding {
                            worker,
                            incarnation: inc,
                            detection,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The log as followed, for the final certificate ([`crate::certify_followed`]), if it is
    /// all of the store's log: every vnode's tail has read the last segment there is (rule 7).
    /// Call it after the last [`Follower::poll`] of a finished run; following stops.
    pub fn final_track(&mut self) -> Result<Option<Track>, FollowError> {
        for tail in &self.tails {
            if !tail.caught_up(&self.reader)? {
                return Ok(None);
            }
        }
        Ok(self.track.take())
    }

    /// Whether incarnation `inc` belongs to a worker named a forger (rule 5).
    fn distrusted(&self, inc: &Incarnation) -> bool {
        self.caught_inc.contains(inc)
            || self.hosts.get(inc).is_some_and(|w| self.caught.contains(w))
    }

    /// What the final certification starts from (crate rule 6).
    pub fn prior(&self) -> Prior {
        let mut distrusted: Vec<TaskId> = self
            .done_in
            .iter()
            .filter(|(_, inc)| self.distrusted(inc))
            .map(|(t, _)| *t)
            .collect();
        distrusted.sort_unstable();
        Prior {
            clean: self.clean.clone(),
            forged: self.forged.clone(),
            distrusted,
        }
    }

    /// The certificate's record of what was seen (certificate rule 5).
    pub fn record(&self, job: u64) -> OnlineRecord {
        let mut workers: BTreeMap<u32, WorkerRecord> = BTreeMap::new();
        for (&inc, &w) in &self.hosts {
            let r = workers.entry(w).or_insert_with(|| WorkerRecord {
                worker: w,
                incarnations: Vec::new(),
                tasks: 0,
                checked: 0,
                forged: 0,
                spot_rate: 0.0,
                q_hat: 1.0,
                evicted: self.caught.contains(&w),
            });
            r.incarnations.push(inc);
        }
        for r in workers.values_mut() {
            let c = self.worker_counts(r.worker);
            r.tasks = c.tasks;
            r.checked = c.checked;
            r.forged = c.forged;
            r.spot_rate = (1.0 / (1.0 + c.drawn as f64)).max(self.floor);
            // A worker caught forging has no bound: its clean checks say nothing more.
            r.q_hat = if c.forged > 0 {
                1.0
            } else {
                sample::q_hat(self.epsilon, c.clean)
            };
        }
        OnlineRecord {
            job,
            checked: self.checked,
            detections: self.forged.iter().map(|(_, d)| d.clone()).collect(),
            spot_floor: self.floor,
            workers: workers.into_values().collect(),
        }
    }
}

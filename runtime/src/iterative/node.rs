//! One vnode of an iterative run: the loop that iterates, exchanges halos, takes part in
//! convergence detection and keeps backups (rules 1-7 of the module docs).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backup::StoreBackup;
use super::conv::{Conv, ConvKind, Out, Tag};
use super::{Block, IterConfig, IterError, IterMsg, Mode};
use crate::clock::{Clock, SystemClock};
use crate::ids::{Epoch, VnodeId};
use crate::transport::{Endpoint, Envelope, Message};

/// Counters of one vnode.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    /// Iterations done.
    pub iterations: u64,
    /// Iterations with a halo that was not fresh (they do not count: rule 2).
    pub stale_iterations: u64,
    /// Iterations whose residual was below the tolerance (converged ones: the local count,
    /// verifications, and keeping pace with the neighbours while detection runs).
    pub converged_iterations: u64,
    /// Messages sent (halos, convergence, acks, backups).
    pub messages: u64,
    /// Halos sent.
    pub halos: u64,
    /// Detection rounds that ended with a negative verdict.
    pub negative_verdicts: u64,
    /// Data backups sent or stored.
    pub data_backups: u64,
    /// Incarnations of this vnode after the first.
    pub restores: u64,
    /// Messages dropped because their sender's epoch was older than one already seen from
    /// that vnode: messages of an incarnation declared dead (rule 8).
    pub fenced: u64,
}

impl NodeStats {
    /// Adds another incarnation's counters (the negative verdicts are a count seen, not summed).
    pub fn add(&mut self, o: &NodeStats) {
        self.iterations += o.iterations;
        self.stale_iterations += o.stale_iterations;
        self.converged_iterations += o.converged_iterations;
        self.messages += o.messages;
        self.halos += o.halos;
        self.negative_verdicts = self.negative_verdicts.max(o.negative_verdicts);
        self.data_backups += o.data_backups;
        self.restores += o.restores;
        self.fenced += o.fenced;
    }
}

/// What the supervisor (embedded or cluster member) tells a node, and learns from it.
pub(crate) struct Control {
    /// Die now, losing all memory (fault injection).
    pub(crate) kill: AtomicBool,
    /// Every vnode has finished: stop serving.
    pub(crate) stop: Arc<AtomicBool>,
    /// Where a vnode reports its final state: (vnode, steps, state).
    pub(crate) done: Sender<(VnodeId, u64, Vec<u8>)>,
    /// Restored, and holding fresh backups of every vnode it backs up (rule 6).
    pub(crate) ready: AtomicBool,
}

/// A node thread's last word: who, why, its counters, and its endpoint for a replacement.
pub(crate) type ExitMsg = (VnodeId, Exit, NodeStats, Option<Box<dyn Endpoint>>);

/// Which incarnation of a vnode to start.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Incarnation {
    pub(crate) vnode: VnodeId,
    pub(crate) epoch: Epoch,
    /// A replacement: restore from backups first (rule 6).
    pub(crate) restore: bool,
}

/// Starts a node on its own thread, on the real clock; its [`ExitMsg`] goes to `exits` (a
/// panic is reported as [`IterError::Panicked`]).
pub(crate) fn spawn_node(
    who: Incarnation,
    ep: Box<dyn Endpoint>,
    factory: &super::BlockFactory,
    cfg: &Arc<IterConfig>,
    ctl: Arc<Control>,
    tree: &[Vec<VnodeId>],
    exits: &Sender<ExitMsg>,
) -> Result<(), IterError> {
    let v = who.vnode;
    let clock = SystemClock::default();
    let node = make_node(who, ep, factory, cfg, ctl, tree, clock.now())?;
    let exits = exits.clone();
    std::thread::Builder::new()
        .name(format!("iter-{v}"))
        .spawn(move || {
            let msg =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| node.run(&clock))) {
                    Ok((exit, stats, ep)) => (v, exit, stats, Some(ep)),
                    Err(_) => (
                        v,
                        Exit::Failed(IterError::Panicked(v)),
                        NodeStats::default(),
                        None,
                    ),
                };
            let _ = exits.send(msg);
        })
        .map_err(|e| IterError::Config(format!("cannot start a thread: {e}")))?;
    Ok(())
}

/// The node of incarnation `who` over `ep`, started at time `now` on its driver's clock.
pub(crate) fn make_node(
    who: Incarnation,
    ep: Box<dyn Endpoint>,
    factory: &super::BlockFactory,
    cfg: &Arc<IterConfig>,
    ctl: Arc<Control>,
    tree: &[Vec<VnodeId>],
    now: Duration,
) -> Result<Node, IterError> {
    let v = who.vnode;
    let block = factory(v).map_err(|source| IterError::Block { vnode: v, source })?;
    Ok(Node::new(
        v,
        who.epoch,
        ep,
        block,
        cfg.clone(),
        ctl,
        tree[v.0 as usize].clone(),
        who.restore,
        now,
    ))
}

/// Why a node's loop returned.
#[derive(Debug)]
pub(crate) enum Exit {
    /// Stopped after the run ended.
    Stopped,
    /// Killed by fault injection.
    Killed,
    /// A fatal error.
    Failed(IterError),
}

/// The status backup (rule 5): the convergence state and the messages not yet acknowledged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Status {
    conv: Conv,
    pending: Vec<(VnodeId, Tag, ConvKind)>,
    finished: bool,
    negative_verdicts: u64,
}

/// (step, sender's epoch, iteration): the newest halo wins (rule 1).
type HaloKey = (u64, u64, u64);

/// A forced data backup awaiting acknowledgements: (step, iter, state, waiting for, last send).
type Forced = (u64, u64, Vec<u8>, BTreeSet<VnodeId>, Duration);

struct Halo {
    key: HaloKey,
    data: Vec<u8>,
    installed: bool,
    fresh: bool,
}

#[derive(Default)]
struct Held {
    status: Option<(u64, Vec<u8>)>,
    data: Option<(u64, u64, Vec<u8>)>,
}

type Backups = (Option<(u64, Vec<u8>)>, Option<(u64, u64, Vec<u8>)>);

/// A replacement gathering the backups its backup neighbours hold for it (rule 6).
struct Restoring {
    replies: HashMap<VnodeId, Backups>,
    /// A replier lost what it held (or nothing can hold anything).
    lost: bool,
    /// Last time the missing backups were asked for.
    asked: Option<Duration>,
}

/// What one [`Node::step`] did: the driver's cue.
#[derive(Debug)]
pub(crate) enum Poll {
    /// It iterated: step again at once.
    Busy,
    /// Nothing to do before a message arrives or this much time passes.
    Idle(Duration),
    /// The node is over.
    Exit(Exit),
}

/// What [`Node::prepare`] found.
#[derive(Debug)]
pub(crate) enum Prepared {
    /// It wants to iterate now, with `fresh` of its `of` neighbours' halos fresh; `settled`:
    /// an asynchronous vnode converged on what it has (module rule 2; `pool.rs` rule 3).
    Iterate {
        fresh: usize,
        of: usize,
        settled: bool,
    },
    /// No iteration: the cue [`Node::step`] would give.
    Poll(Poll),
}

/// The status version a new convergence message waits for before the status that records it
/// is saved (rule 4).
const UNSAVED: u64 = u64::MAX;

/// Is a periodic action last done at `last` due at `now`? Never done: due.
fn due(now: Duration, last: Option<Duration>, period: Duration) -> bool {
    last.is_none_or(|t| now.saturating_sub(t) >= period)
}

pub(crate) struct Node {
    me: VnodeId,
    /// Time of the current step (the driver's clock: real or simulated).
    now: Duration,
    /// Not started yet: the first step starts it, restoring first if set (rule 6).
    start: Option<bool>,
    /// Restoring its backups (rule 6), until every backup neighbour answered.
    restoring_state: Option<Restoring>,
    /// A message the driver received while waiting, handled at the next step.
    arrived: Option<Envelope>,
    /// The newest epoch seen of each sender: a message of an older one is of an incarnation
    /// declared dead (a zombie) and is dropped (rule 8).
    peer_epochs: HashMap<VnodeId, Epoch>,
    ep: Box<dyn Endpoint>,
    block: Box<dyn Block>,
    cfg: Arc<IterConfig>,
    ctl: Arc<Control>,
    nbrs: Vec<VnodeId>,
    backups: Vec<VnodeId>,
    /// Vnodes this one is a backup neighbour of.
    wards: Vec<VnodeId>,
    /// Wards whose fresh backups a replacement still waits for (rule 6).
    rebackup_wait: BTreeSet<VnodeId>,
    rebackup_asked: Duration,
    /// Restoring its backups (rule 6): not ready yet.
    restoring: bool,
    conv: Conv,
    /// Steps the block has ended (rule 6: a verdict advances it once).
    block_step: u64,
    iter: u64,
    /// Iterations of this step with a residual at or above the tolerance (the limit counts
    /// these: a converged vnode that iterates on its neighbours' news while detection runs is
    /// not failing to converge).
    unconverged: u64,
    counter: u32,
    finished: bool,
    negative_verdicts: u64,
    /// Unacknowledged convergence messages: their last send, and the status version that must
    /// be on every backup neighbour before they go out (rule 4; [`UNSAVED`] until the next
    /// status is saved).
    pending: BTreeMap<(VnodeId, Tag, ConvKind), (Option<Duration>, u64)>,
    /// Acks to send once the backups are settled: (to, tag, kind, status version).
    deferred: Vec<(VnodeId, Tag, ConvKind, u64)>,
    status_version: u64,
    status_bytes: Vec<u8>,
    status_acked: HashMap<VnodeId, (u64, Duration)>,
    /// Forced data backup awaiting acknowledgements: (step, iter, state, waiting for, last send).
    forced: Option<Forced>,
    /// A yes to send once the forced data backup is acknowledged.
    answer_after_backup: bool,
    /// Neighbours whose fresh halo the current verification waits for; then one iteration.
    verify_need: Option<BTreeSet<VnodeId>>,
    halos: HashMap<VnodeId, Halo>,
    future: HashMap<VnodeId, (HaloKey, Vec<u8>)>,
    last_sent: HashMap<VnodeId, (u64, u64, Vec<u8>)>,
    halo_asked: Duration,
    held: HashMap<VnodeId, Held>,
    /// The newest data backup on the store (`backup.rs`).
    store_backup: StoreBackup,
    /// A replacement: it lost the backups it held for others (rule 6).
    lost_held: bool,
    rr: usize,
    last_residual: f64,
    news: bool,
    /// A verification started: iterate once (sending fresh halos) even without news.
    kick: bool,
    last_iteration: Duration,
    pub(crate) stats: NodeStats,
}

impl Node {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        me: VnodeId,
        epoch: Epoch,
        mut ep: Box<dyn Endpoint>,
        block: Box<dyn Block>,
        cfg: Arc<IterConfig>,
        ctl: Arc<Control>,
        tree: Vec<VnodeId>,
        restore: bool,
        now: Duration,
    ) -> Self {
        ep.set_epoch(epoch);
        let nbrs = cfg.neighbours[me.0 as usize].clone();
        let backups = if cfg.store.is_some() && cfg.backup_neighbours == 0 {
            Vec::new()
        } else {
            cfg.backups_of(me)
        };
        let wards = if backups.is_empty() && cfg.store.is_some() {
            Vec::new()
        } else {
            (0..cfg.neighbours.len() as u32)
                .map(VnodeId)
                .filter(|&w| w != me && cfg.backups_of(w).contains(&me))
                .collect()
        };
        Node {
            me,
            now,
            start: Some(restore),
            restoring_state: None,
            arrived: None,
            peer_epochs: HashMap::new(),
            wards,
            rebackup_wait: BTreeSet::new(),
            rebackup_asked: now,
            restoring: false,
            ep,
            block,
            nbrs,
            backups,
            conv: Conv::new(me, tree),
            block_step: 0,
            iter: 0,
            unconverged: 0,
            counter: 0,
            finished: false,
            negative_verdicts: 0,
            pending: BTreeMap::new(),
            deferred: Vec::new(),
            status_version: 0,
            status_bytes: Vec::new(),
            status_acked: HashMap::new(),
            forced: None,
            answer_after_backup: false,
            verify_need: None,
            halos: HashMap::new(),
            future: HashMap::new(),
            last_sent: HashMap::new(),
            halo_asked: now,
            held: HashMap::new(),
            store_backup: StoreBackup::new(epoch),
            lost_held: epoch.0 > 0,
            rr: 0,
            last_residual: f64::INFINITY,
            news: true,
            kick: false,
            last_iteration: now,
            stats: NodeStats::default(),
            cfg,
            ctl,
        }
    }

    /// The real driver: steps on `clock` and blocks on the endpoint while idle, until
    /// stopped, killed or failed. Returns the endpoint so that a replacement can take it over.
    pub(crate) fn run(mut self, clock: &dyn Clock) -> (Exit, NodeStats, Box<dyn Endpoint>) {
        let exit = loop {
            match self.step(clock.now()) {
                Ok(Poll::Busy) => {}
                Ok(Poll::Idle(wait)) => self.wait(wait),
                Ok(Poll::Exit(exit)) => break exit,
                Err(e) => break Exit::Failed(e),
            }
        };
        (exit, std::mem::take(&mut self.stats), self.ep)
    }

    /// Its counters and its endpoint, for the supervisor once it has exited.
    pub(crate) fn into_parts(mut self) -> (NodeStats, Box<dyn Endpoint>) {
        (std::mem::take(&mut self.stats), self.ep)
    }

    /// Blocks up to `timeout` for a message, kept for the next [`Node::step`] (the real
    /// driver's wait; the simulator never blocks).
    pub(crate) fn wait(&mut self, timeout: Duration) {
        if self.arrived.is_none() {
            self.arrived = self.ep.recv_timeout(timeout);
        }
    }

    /// One step at time `now`, never blocking: handles the messages waiting, resends what is
    /// due, and iterates at most once (rules 1-7). The first step starts the node (a
    /// replacement asks for its backups: rule 6).
    pub(crate) fn step(&mut self, now: Duration) -> Result<Poll, IterError> {
        match self.prepare(now)? {
            Prepared::Iterate { .. } => {
                self.iterate()?;
                Ok(Poll::Busy)
            }
            Prepared::Poll(p) => Ok(p),
        }
    }

    /// The part of [`Node::step`] before the iteration: handles the messages waiting and
    /// resends what is due, and says whether the node wants to iterate now (and with how many
    /// fresh halos: the pool's cue, `pool.rs` rule 3) or what else. Never iterates.
    pub(crate) fn prepare(&mut self, now: Duration) -> Result<Prepared, IterError> {
        self.now = self.now.max(now);
        if self.ctl.kill.load(Ordering::Relaxed) {
            return Ok(Prepared::Poll(Poll::Exit(Exit::Killed)));
        }
        if self.ctl.stop.load(Ordering::Relaxed) {
            return Ok(Prepared::Poll(Poll::Exit(Exit::Stopped)));
        }
        if let Some(restore) = self.start.take() {
            if restore {
                self.stats.restores += 1;
                self.restoring = true;
                self.begin_restore();
            } else {
                self.save_status();
                self.update_ready();
                self.send_halos();
            }
        }
        if self.restoring_state.is_some() {
            return self.step_restore().map(Prepared::Poll);
        }
        self.drain()?;
        self.resend_due();
        if self.finished {
            return Ok(Prepared::Poll(Poll::Idle(self.cfg.resend)));
        }
        if self.cfg.mode == Mode::Sync && !self.all_fresh() {
            if due(self.now, Some(self.halo_asked), self.cfg.resend) {
                self.halo_asked = self.now;
                let late: Vec<VnodeId> = self
                    .nbrs
                    .iter()
                    .copied()
                    .filter(|v| !self.halos.get(v).is_some_and(|h| h.fresh))
                    .collect();
                for v in late {
                    self.send(v, IterMsg::HaloRequest);
                }
            }
            return Ok(Prepared::Poll(Poll::Idle(Duration::from_millis(1))));
        }
        if self.cfg.mode == Mode::Async
            && !(self.news && (self.all_fresh() || self.verify_need.is_some()))
            && !self.kick
            && self.last_residual < self.cfg.tol
            && !due(self.now, Some(self.last_iteration), self.cfg.resend)
        {
            // Rule 2: converged on what it has, it iterates again once every neighbour's
            // halo is fresh (as a synchronous vnode would), not on each one: on a halo from
            // one side, a vnode whose change is below 3e-16 changed nothing and took a core
            // from a vnode still converging (64³ on 8 vnodes: 1.5 × sync's iterations on the
            // converged vnodes). In a verification it iterates on any news: its neighbours
            // wait for its fresh halo to answer. Never longer than the resend period, so that
            // lost halos are replaced.
            return Ok(Prepared::Poll(Poll::Idle(Duration::from_millis(1))));
        }
        Ok(Prepared::Iterate {
            fresh: self.fresh_halos(),
            of: self.nbrs.len(),
            // A synchronous vnode's iteration is what its neighbours wait for, converged or not.
            settled: self.cfg.mode == Mode::Async && self.last_residual < self.cfg.tol,
        })
    }

    /// One iteration, after [`Node::prepare`] said [`Prepared::Iterate`].
    pub(crate) fn iterate(&mut self) -> Result<(), IterError> {
        self.iterate_once()
    }

    /// Restored, and holding fresh backups of every vnode it backs up (rule 6).
    pub(crate) fn is_ready(&self) -> bool {
        !self.restoring && self.start.is_none() && self.rebackup_wait.is_empty()
    }

    /// What it waits for, for a run that makes no progress (issue 14 point 5).
    pub(crate) fn waits(&self) -> String {
        let pending: Vec<String> = self
            .pending
            .keys()
            .map(|(to, tag, kind)| format!("{kind:?}->{to}@{}.{}", tag.step, tag.round))
            .collect();
        format!(
            "step {} tag {}.{} iter {} residual {:e} count {} restoring {} rebackup {:?} \
             verify_need {:?} forced {:?} deferred {} unacked [{}]",
            self.block_step,
            self.conv.tag().step,
            self.conv.tag().round,
            self.iter,
            self.last_residual,
            self.counter,
            self.restoring,
            self.rebackup_wait,
            self.verify_need,
            self.forced.as_ref().map(|f| &f.3),
            self.deferred.len(),
            pending.join(" ")
        )
    }

    /// Steps its block has ended.
    pub(crate) fn steps_ended(&self) -> u64 {
        self.block_step
    }

    /// Its vnode.
    pub(crate) fn vnode(&self) -> VnodeId {
        self.me
    }

    /// Counters so far.
    pub(crate) fn stats(&self) -> &NodeStats {
        &self.stats
    }

    fn update_ready(&self) {
        if self.is_ready() {
            self.ctl.ready.store(true, Ordering::Relaxed);
        }
    }

    /// Neighbours whose halo is fresh (not used by an iteration yet).
    fn fresh_halos(&self) -> usize {
        self.nbrs
            .iter()
            .filter(|v| self.halos.get(v).is_some_and(|h| h.fresh))
            .count()
    }

    fn all_fresh(&self) -> bool {
        self.nbrs
            .iter()
            .all(|v| self.halos.get(v).is_some_and(|h| h.fresh))
    }

    /// The next message that passes the epoch fence (rule 8), if one is waiting.
    fn next_message(&mut self) -> Option<Envelope> {
        loop {
            let env = match self.arrived.take() {
                Some(env) => env,
                None => self.ep.try_recv()?,
            };
            let newest = self.peer_epochs.entry(env.from).or_insert(env.epoch);
            if env.epoch < *newest {
                self.stats.fenced += 1;
                continue;
            }
            *newest = env.epoch;
            return Some(env);
        }
    }

    fn drain(&mut self) -> Result<(), IterError> {
        while let Some(env) = self.next_message() {
            self.handle(env)?;
        }
        Ok(())
    }

    fn send(&mut self, to: VnodeId, msg: IterMsg) {
        self.stats.messages += 1;
        // A vnode with no route is a configuration error caught by validate(); loss is rule 2.
        let _ = self.ep.send(to, Message::Iter(msg));
    }

    fn iterate_once(&mut self) -> Result<(), IterError> {
        let mut counts = true;
        for v in self.nbrs.clone() {
            match self.halos.get_mut(&v) {
                Some(h) => {
                    counts &= h.fresh;
                    h.fresh = false;
                    if !h.installed {
                        h.installed = true;
                        let data = std::mem::take(&mut h.data);
                        let r = self.block.set_halo(v, &data);
                        if let Some(h) = self.halos.get_mut(&v) {
                            h.data = data;
                        }
                        r.map_err(|source| IterError::Block {
                            vnode: self.me,
                            source,
                        })?;
                    }
                }
                None => counts = false,
            }
        }
        let answering = self.verify_need.as_ref().is_some_and(BTreeSet::is_empty);
        let residual = self.block.iterate();
        self.news = false;
        self.kick = false;
        self.last_iteration = self.now;
        self.last_residual = residual;
        self.iter += 1;
        self.stats.iterations += 1;
        let converged = residual < self.cfg.tol;
        self.stats.stale_iterations += u64::from(!counts);
        self.stats.converged_iterations += u64::from(converged);
        if !converged {
            self.counter = 0;
            self.unconverged += 1;
        } else if counts {
            self.counter = self.counter.saturating_add(1);
        }
        let local = self.counter >= self.cfg.local_iterations;
        if self.cfg.max_iterations > 0 && self.unconverged > self.cfg.max_iterations {
            return Err(IterError::NotConverging {
                vnode: self.me,
                step: self.block_step,
                iterations: self.unconverged,
            });
        }
        self.send_halos();
        if self.iter.is_multiple_of(self.cfg.backup_every) {
            self.data_backup_round_robin()?;
        }
        if answering {
            self.verify_need = None;
            if local && converged {
                // Rule 5: a yes is sent only once the state behind it is backed up.
                self.answer_after_backup = true;
                self.forced_backup()?;
            } else {
                let outs = self.conv.answer(false);
                self.apply(outs)?;
            }
        }
        let outs = self.conv.poll(local);
        self.apply(outs)?;
        self.save_status();
        Ok(())
    }

    fn send_halos(&mut self) {
        if self.finished {
            return;
        }
        for v in self.nbrs.clone() {
            let data = self.block.halo_for(v);
            self.stats.halos += 1;
            self.send(
                v,
                IterMsg::Halo {
                    step: self.block_step,
                    iter: self.iter,
                    data: data.clone(),
                },
            );
            self.last_sent.insert(v, (self.block_step, self.iter, data));
        }
    }

    fn data_backup_round_robin(&mut self) -> Result<(), IterError> {
        if let Some(store) = &self.cfg.store {
            let state = self.block.save();
            self.stats.data_backups += 1;
            // Rule 5: like a round-robin backup to a neighbour, not waited for.
            return self.store_backup.put(
                &**store,
                self.me,
                (self.block_step, self.iter),
                &state,
                false,
            );
        }
        if self.backups.is_empty() {
            return Ok(());
        }
        let to = self.backups[self.rr % self.backups.len()];
        self.rr += 1;
        let state = self.block.save();
        self.stats.data_backups += 1;
        self.send(
            to,
            IterMsg::Data {
                step: self.block_step,
                iter: self.iter,
                ack: false,
                state,
            },
        );
        Ok(())
    }

    /// A data backup to every backup neighbour (or the store), acknowledged (rule 5).
    fn forced_backup(&mut self) -> Result<(), IterError> {
        let state = self.block.save();
        self.stats.data_backups += 1;
        if let Some(store) = &self.cfg.store {
            self.store_backup.put(
                &**store,
                self.me,
                (self.block_step, self.iter),
                &state,
                true,
            )?;
            self.forced = None;
            return self.backup_settled();
        }
        let waiting: BTreeSet<VnodeId> = self.backups.iter().copied().collect();
        for &b in &waiting.clone() {
            self.send(
                b,
                IterMsg::Data {
                    step: self.block_step,
                    iter: self.iter,
                    ack: true,
                    state: state.clone(),
                },
            );
        }
        self.forced = Some((self.block_step, self.iter, state, waiting, self.now));
        self.backup_settled()
    }

    /// Called when a forced backup may be complete: sends the yes it was holding back.
    fn backup_settled(&mut self) -> Result<(), IterError> {
        if self.forced.as_ref().is_some_and(|f| !f.3.is_empty()) {
            return Ok(());
        }
        self.forced = None;
        if std::mem::take(&mut self.answer_after_backup) {
            let outs = self.conv.answer(true);
            self.apply(outs)?;
            self.save_status();
        }
        self.release_deferred();
        Ok(())
    }

    fn apply(&mut self, outs: Vec<Out>) -> Result<(), IterError> {
        let tag = self.conv.tag();
        for o in outs {
            match o {
                Out::Send(to, kind) => {
                    // Rule 4: it goes out once the status that records it is backed up.
                    self.pending.insert((to, tag, kind), (None, UNSAVED));
                }
                Out::NeedAnswer => {
                    self.verify_need = Some(self.nbrs.iter().copied().collect());
                    self.kick = true;
                }
                Out::Verdict(ok) => self.on_verdict(tag, ok)?,
            }
        }
        self.save_status();
        Ok(())
    }

    fn on_verdict(&mut self, tag: Tag, ok: bool) -> Result<(), IterError> {
        self.verify_need = None;
        self.answer_after_backup = false;
        if !ok {
            self.negative_verdicts += 1;
            self.stats.negative_verdicts = self.negative_verdicts;
            self.conv.reset(Tag {
                step: tag.step,
                round: tag.round + 1,
            });
            return Ok(());
        }
        // Rule 6: the block ends each step once, even if the verdict comes again.
        if self.block_step == tag.step {
            let more = self.block.advance();
            self.block_step += 1;
            self.iter = 0;
            self.unconverged = 0;
            self.counter = 0;
            self.last_residual = f64::INFINITY;
            self.news = true;
            if more {
                self.promote_future();
            } else {
                self.finish();
            }
        }
        self.conv.reset(Tag {
            step: tag.step + 1,
            round: 0,
        });
        self.forced_backup()?;
        self.send_halos();
        Ok(())
    }

    fn finish(&mut self) {
        self.finished = true;
        let _ = self
            .ctl
            .done
            .send((self.me, self.block_step, self.block.save()));
    }

    fn promote_future(&mut self) {
        let step = self.block_step;
        for (v, (key, data)) in std::mem::take(&mut self.future) {
            if key.0 == step {
                self.accept_halo(v, key, data);
            } else if key.0 > step {
                self.future.insert(v, (key, data));
            }
        }
    }

    fn accept_halo(&mut self, from: VnodeId, key: HaloKey, data: Vec<u8>) {
        if key.0 > self.block_step {
            let e = self.future.entry(from).or_insert((key, Vec::new()));
            if key >= e.0 {
                *e = (key, data);
            }
            return;
        }
        if key.0 < self.block_step || !self.nbrs.contains(&from) {
            return;
        }
        if self.halos.get(&from).is_some_and(|h| h.key >= key) {
            return;
        }
        self.halos.insert(
            from,
            Halo {
                key,
                data,
                installed: false,
                fresh: true,
            },
        );
        self.news = true;
        if let Some(need) = &mut self.verify_need {
            need.remove(&from);
        }
    }

    fn status(&self) -> Status {
        Status {
            conv: self.conv.clone(),
            pending: self.pending.keys().copied().collect(),
            finished: self.finished,
            negative_verdicts: self.negative_verdicts,
        }
    }

    /// Sends the status to every backup neighbour if it changed (rule 5).
    fn save_status(&mut self) {
        let bytes = postcard::to_stdvec(&self.status()).expect("status encodes");
        if bytes == self.status_bytes {
            self.seal_pending();
            return;
        }
        self.status_bytes = bytes;
        self.status_version += 1;
        self.seal_pending();
        let version = self.status_version;
        for b in self.backups.clone() {
            let status = self.status_bytes.clone();
            self.send(b, IterMsg::Status { version, status });
        }
        let now = self.now;
        for b in &self.backups {
            let e = self.status_acked.entry(*b).or_insert((0, now));
            e.1 = now;
        }
        self.release_deferred();
        self.send_pending();
    }

    /// The convergence messages added since the last save wait for this status (rule 4).
    fn seal_pending(&mut self) {
        let version = self.status_version;
        for p in self.pending.values_mut() {
            if p.1 == UNSAVED {
                p.1 = version;
            }
        }
    }

    /// Sends (again) every convergence message whose status is backed up and whose resend is
    /// due (rule 4).
    fn send_pending(&mut self) {
        let now = self.now;
        let period = self.cfg.resend;
        let ready: Vec<(VnodeId, Tag, ConvKind)> = self
            .pending
            .iter()
            .filter(|(_, &(t, after))| {
                after != UNSAVED && due(now, t, period) && self.status_settled(after)
            })
            .map(|(k, _)| *k)
            .collect();
        for (to, tag, kind) in ready {
            if let Some(p) = self.pending.get_mut(&(to, tag, kind)) {
                p.0 = Some(now);
            }
            self.send(to, IterMsg::Conv { tag, kind });
        }
    }

    fn status_settled(&self, version: u64) -> bool {
        self.backups
            .iter()
            .all(|b| self.status_acked.get(b).is_some_and(|&(v, _)| v >= version))
    }

    fn release_deferred(&mut self) {
        if self.forced.is_some() {
            return;
        }
        let deferred = std::mem::take(&mut self.deferred);
        for (to, tag, kind, version) in deferred {
            if self.status_settled(version) {
                self.send(to, IterMsg::ConvAck { tag, kind });
            } else {
                self.deferred.push((to, tag, kind, version));
            }
        }
    }

    fn resend_due(&mut self) {
        let now = self.now;
        let period = self.cfg.resend;
        if !self.rebackup_wait.is_empty() && due(now, Some(self.rebackup_asked), period) {
            self.rebackup_asked = now;
            for w in self.rebackup_wait.clone() {
                self.send(w, IterMsg::Rebackup);
            }
        }
        self.send_pending();
        let version = self.status_version;
        let late: Vec<VnodeId> = self
            .backups
            .iter()
            .copied()
            .filter(|b| {
                self.status_acked
                    .get(b)
                    .is_some_and(|&(v, t)| v < version && due(now, Some(t), period))
            })
            .collect();
        for b in late {
            let status = self.status_bytes.clone();
            self.send(b, IterMsg::Status { version, status });
            if let Some(e) = self.status_acked.get_mut(&b) {
                e.1 = now;
            }
        }
        if let Some((step, iter, state, waiting, t)) = &self.forced {
            if due(now, Some(*t), period) {
                let (step, iter, state, waiting) = (*step, *iter, state.clone(), waiting.clone());
                for b in waiting {
                    self.send(
                        b,
                        IterMsg::Data {
                            step,
                            iter,
                            ack: true,
                            state: state.clone(),
                        },
                    );
                }
                if let Some(f) = &mut self.forced {
                    f.4 = now;
                }
            }
        }
    }

    fn handle(&mut self, env: Envelope) -> Result<(), IterError> {
        let Message::Iter(msg) = env.msg else {
            return Ok(()); // not ours: data-flow messages have no business here
        };
        let from = env.from;
        match msg {
            IterMsg::Halo { step, iter, data } => {
                self.accept_halo(from, (step, env.epoch.0, iter), data);
            }
            IterMsg::HaloRequest => {
                if let Some((step, iter, data)) = self.last_sent.get(&from).cloned() {
                    self.send(from, IterMsg::Halo { step, iter, data });
                }
            }
            IterMsg::Conv { tag, kind } => self.on_conv(from, tag, kind)?,
            IterMsg::ConvAck { tag, kind } => {
                if self.pending.remove(&(from, tag, kind)).is_some() {
                    self.save_status();
                }
            }
            IterMsg::Status { version, status } => {
                let h = self.held.entry(from).or_default();
                if h.status.as_ref().is_none_or(|(v, _)| *v <= version) {
                    h.status = Some((version, status));
                }
                self.send(from, IterMsg::StatusAck { version });
            }
            IterMsg::StatusAck { version } => {
                if let Some(e) = self.status_acked.get_mut(&from) {
                    e.0 = e.0.max(version);
                }
                self.release_deferred();
                self.send_pending();
            }
            IterMsg::Data {
                step,
                iter,
                ack,
                state,
            } => {
                let h = self.held.entry(from).or_default();
                if h.data
                    .as_ref()
                    .is_none_or(|(s, i, _)| (*s, *i) <= (step, iter))
                {
                    h.data = Some((step, iter, state));
                }
                if ack {
                    self.send(from, IterMsg::DataAck { step, iter });
                }
            }
            IterMsg::DataAck { step, iter } => {
                if let Some(f) = &mut self.forced {
                    if (f.0, f.1) == (step, iter) {
                        f.3.remove(&from);
                    }
                }
                self.backup_settled()?;
            }
            IterMsg::Fetch => {
                let h = self.held.get(&from);
                let msg = IterMsg::Backups {
                    status: h.and_then(|h| h.status.clone()),
                    data: h.and_then(|h| h.data.clone()),
                    lost: self.lost_held && h.is_none_or(|h| h.status.is_none()),
                };
                self.send(from, msg);
            }
            IterMsg::Backups { .. } => {} // only a restoring vnode asks
            IterMsg::Rebackup => {
                let data = self
                    .cfg
                    .store
                    .is_none()
                    .then(|| (self.block_step, self.iter, self.block.save()));
                let status = (self.status_version, self.status_bytes.clone());
                self.send(from, IterMsg::Ward { status, data });
            }
            IterMsg::Ward { status, data } => {
                let h = self.held.entry(from).or_default();
                if h.status.as_ref().is_none_or(|(v, _)| *v <= status.0) {
                    h.status = Some(status);
                }
                if let Some((step, iter, state)) = data {
                    if h.data
                        .as_ref()
                        .is_none_or(|(s, i, _)| (*s, *i) <= (step, iter))
                    {
                        h.data = Some((step, iter, state));
                    }
                }
                if self.rebackup_wait.remove(&from) {
                    self.update_ready();
                }
            }
        }
        Ok(())
    }

    fn on_conv(&mut self, from: VnodeId, tag: Tag, kind: ConvKind) -> Result<(), IterError> {
        let current = self.conv.tag();
        if tag < current {
            // Stale (rule 1): acknowledged so the sender stops, otherwise ignored.
            self.send(from, IterMsg::ConvAck { tag, kind });
            return Ok(());
        }
        if tag > current {
            return Ok(()); // from a step or round this vnode has not reached: resent later
        }
        let outs = self.conv.on_msg(from, kind);
        self.apply(outs)?;
        self.save_status();
        // Rule 4: acknowledged once the new status is on every backup neighbour.
        self.deferred.push((from, tag, kind, self.status_version));
        self.release_deferred();
        Ok(())
    }

    /// Rule 6, first part: asks the wards for fresh backups and starts gathering its own.
    fn begin_restore(&mut self) {
        // With no backup neighbour and no store, nothing can say whether a step has ended.
        let lost = self.backups.is_empty() && self.cfg.store.is_none();
        // Rule 6: what this vnode held for its wards died with its predecessor.
        self.rebackup_wait = self.wards.iter().copied().collect();
        self.rebackup_asked = self.now;
        for w in self.wards.clone() {
            self.send(w, IterMsg::Rebackup);
        }
        self.restoring_state = Some(Restoring {
            replies: HashMap::new(),
            lost,
            asked: None,
        });
    }

    /// Rule 6, one step of gathering: asks again for what is missing when due, takes the
    /// replies, and restores once every backup neighbour has answered.
    fn step_restore(&mut self) -> Result<Poll, IterError> {
        let Some(r) = self.restoring_state.as_mut() else {
            return Ok(Poll::Busy);
        };
        if due(self.now, r.asked, self.cfg.resend) {
            r.asked = Some(self.now);
            let missing: Vec<VnodeId> = self
                .backups
                .iter()
                .copied()
                .filter(|b| !r.replies.contains_key(b))
                .collect();
            for b in missing {
                self.send(b, IterMsg::Fetch);
            }
        }
        while let Some(env) = self.next_message() {
            match env.msg {
                Message::Iter(IterMsg::Backups { status, data, lost }) => {
                    if let (true, Some(r)) = (
                        self.backups.contains(&env.from),
                        self.restoring_state.as_mut(),
                    ) {
                        r.lost |= lost;
                        r.replies.insert(env.from, (status, data));
                    }
                }
                Message::Iter(
                    IterMsg::Conv { .. } | IterMsg::ConvAck { .. } | IterMsg::DataAck { .. },
                ) => {} // before the status is back: the senders resend
                // Not before its own state is back; the asker resends.
                Message::Iter(IterMsg::StatusAck { .. } | IterMsg::Rebackup) => {}
                _ => self.handle(env)?,
            }
        }
        let complete = self
            .restoring_state
            .as_ref()
            .is_some_and(|r| r.replies.len() >= self.backups.len());
        if !complete {
            return Ok(Poll::Idle(Duration::from_millis(2)));
        }
        let Some(r) = self.restoring_state.take() else {
            return Ok(Poll::Busy);
        };
        self.finish_restore(r.replies, r.lost)?;
        self.restoring = false;
        self.update_ready();
        self.send_halos();
        Ok(Poll::Busy)
    }

    /// Rule 6, last part: restores the newest status and data the replies (and the store)
    /// hold.
    fn finish_restore(
        &mut self,
        replies: HashMap<VnodeId, Backups>,
        lost: bool,
    ) -> Result<(), IterError> {
        // In vnode order, so that equal versions resolve the same way in every run.
        let replies: BTreeMap<VnodeId, Backups> = replies.into_iter().collect();
        let mut status: Option<(u64, Vec<u8>)> = None;
        let mut data: Option<(u64, u64, Vec<u8>)> = None;
        for (s, d) in replies.into_values() {
            if let Some(s) = s {
                if status.as_ref().is_none_or(|(v, _)| s.0 > *v) {
                    status = Some(s);
                }
            }
            if let Some(d) = d {
                if data.as_ref().is_none_or(|(s, i, _)| (d.0, d.1) > (*s, *i)) {
                    data = Some(d);
                }
            }
        }
        if let Some(store) = &self.cfg.store {
            if let Some(d) = self.store_backup.get(&**store, self.me)? {
                if data.as_ref().is_none_or(|(s, i, _)| (d.0, d.1) > (*s, *i)) {
                    data = Some(d);
                }
            }
        }
        let status: Option<Status> = match status {
            Some((v, bytes)) => {
                self.status_version = v;
                Some(postcard::from_bytes(&bytes).map_err(|e| IterError::Block {
                    vnode: self.me,
                    source: super::BlockError(format!("status backup does not decode: {e}")),
                })?)
            }
            None => None,
        };
        let step = status.as_ref().map_or(0, |s| s.conv.tag().step);
        match data {
            Some((dstep, diter, state)) => {
                self.block
                    .restore(&state)
                    .map_err(|source| IterError::Block {
                        vnode: self.me,
                        source,
                    })?;
                self.block_step = dstep;
                // Rule 6: the iteration count goes on from the backup's, so that this
                // incarnation's backups outrank its predecessors' (holders keep the newest by
                // step and iteration). Counting from zero again, a replacement's fresh forced
                // backup lost to an older one of a dead incarnation, which the next
                // replacement restored: a false convergence (iterative simulator, seed 599).
                self.iter = diter;
            }
            None if lost || step > 0 || status.as_ref().is_some_and(|s| s.finished) => {
                return Err(IterError::Unrecoverable(self.me));
            }
            None => {} // never backed up: the initial state is the state (no step has ended)
        }
        if let Some(s) = status {
            self.conv = s.conv;
            self.finished = s.finished;
            self.negative_verdicts = s.negative_verdicts;
            for (to, tag, kind) in s.pending {
                self.pending.insert((to, tag, kind), (None, UNSAVED));
            }
        }
        // The data may predate the end of a step the status records (rule 6).
        while self.block_step < self.conv.tag().step {
            self.block.advance();
            self.block_step += 1;
            self.iter = 0;
        }
        if self.block_step > self.conv.tag().step {
            // The step ended after the status was saved: the forced data backup of a step's
            // end (rule 5) goes out before the status that records the verdict's messages, and
            // that status died with the predecessor. The verdict of the status's tag was
            // positive (every vnode saves a status at the verdict's tag before the verdict:
            // its Verify or Answer waits for it, rule 4), so pass it on again to every tree
            // neighbour: one that never got it would wait at that tag forever (found by
            // `no_false_convergence_over_a_hundred_seeded_runs`, seed 85, under load: a hang).
            // A neighbour that has it finds it stale and acknowledges it. Then make the
            // detection state agree with the block.
            let ended = self.conv.tag();
            for t in self.conv.tree().to_vec() {
                self.pending
                    .insert((t, ended, ConvKind::Verdict(true)), (None, UNSAVED));
            }
            self.conv.reset(Tag {
                step: self.block_step,
                round: 0,
            });
        }
        for h in self.halos.values_mut() {
            if h.key.0 < self.block_step {
                h.fresh = false;
            }
        }
        self.promote_future();
        self.status_bytes.clear();
        self.save_status();
        let outs = self.conv.resend_all();
        // The messages resend_all names are pending already or implied; send them once.
        self.apply(outs)?;
        if self.finished {
            let _ = self
                .ctl
                .done
                .send((self.me, self.block_step, self.block.save()));
        }
        Ok(())
    }
}

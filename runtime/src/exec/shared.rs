//! State shared by the vnodes of one run in this process: work counters for termination
//! detection (rule 4 of `exec/mod.rs`), progress counters, the stop flag and the first error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::forge::Forge;
use crate::error::RunError;
use crate::ids::{TaskId, VnodeId};
use crate::util::Padded;

/// Low 32 bits: outstanding work units. High 32 bits: number of changes (wrapping).
/// Adding `UP` raises both; adding `DOWN - n` (= 2^32 - n) lowers the low half by `n` and,
/// through the carry, still raises the change count by one: one atomic add per change.
const UP: u64 = (1 << 32) + 1;
const DOWN: u64 = 1 << 32;
const LOW: u64 = 0xffff_ffff;

/// The outstanding work units of a work word (its low half): zero when the vnode is idle.
pub fn work_units(word: u64) -> u64 {
    word & LOW
}

/// A planned failure (fault injection): `vnode` fails once `after` tasks have completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kill {
    /// The vnode that fails.
    pub vnode: VnodeId,
    /// Completed tasks (whole run) at which it fails.
    pub after: u64,
    /// Land where there is something to lose: if `vnode` holds no outstanding work when the
    /// kill is due, the next vnode in id order (cyclically) that holds some fails instead
    /// (`--kill-random`: a kill drawn onto an idle vnode would inject nothing). With no vnode
    /// holding work, `vnode` fails anyway, and its report counts a failure without effect.
    pub retarget: bool,
}

/// Asks a run to stop early (rule 7 of `exec/mod.rs`): no new task starts, what was logged is
/// made durable, and the run returns [`RunError::Interrupted`]; `Runtime::resume` finishes it.
/// Cloneable; [`StopToken::stop`] may be called from any thread (a signal handler's, say).
#[derive(Clone, Debug, Default)]
pub struct StopToken(Arc<AtomicBool>);

impl StopToken {
    /// A token not stopped yet.
    pub fn new() -> StopToken {
        StopToken::default()
    }

    /// Asks the runs holding this token to stop.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether [`StopToken::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

pub(crate) struct RunShared {
    work: Vec<Padded<AtomicU64>>,
    /// Current incarnation of each vnode: messages from an older one are dropped.
    epochs: Vec<Padded<AtomicU64>>,
    /// How many times an epoch rose: a vnode that sees it change resends at once what its
    /// peers have not acknowledged (`vnode.rs` rule 5).
    epoch_changes: AtomicU64,
    /// Failures still to inject, sorted by `after`.
    kills: Mutex<Vec<Kill>>,
    completed: Vec<Padded<AtomicU64>>,
    stop: AtomicBool,
    /// Set when the termination test found the run over (rule 4), not merely stopped.
    finished: AtomicBool,
    /// The caller's request to stop early (rule 7), if it may make one.
    token: Option<StopToken>,
    error: Mutex<Option<RunError>>,
    /// Forgery injection, if any (`forge.rs`).
    pub(crate) forge: Option<Forge>,
    /// A member of a cluster run: termination is decided by the coordinator, not by scanning
    /// this process's counters (`member.rs`).
    distributed: AtomicBool,
    /// Drivers return to their caller (a member run changes its vnodes), without stopping.
    interrupt: AtomicBool,
    /// Tasks forged so far, with the vnode that forged them.
    forged: Mutex<Vec<(TaskId, VnodeId)>>,
}

impl RunShared {
    pub(crate) fn new(vnodes: u32, forge: Option<Forge>) -> Self {
        RunShared {
            work: (0..vnodes).map(|_| Padded(AtomicU64::new(0))).collect(),
            epochs: (0..vnodes).map(|_| Padded(AtomicU64::new(0))).collect(),
            epoch_changes: AtomicU64::new(0),
            kills: Mutex::new(Vec::new()),
            completed: (0..vnodes).map(|_| Padded(AtomicU64::new(0))).collect(),
            stop: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            token: None,
            error: Mutex::new(None),
            forge,
            distributed: AtomicBool::new(false),
            interrupt: AtomicBool::new(false),
            forged: Mutex::new(Vec::new()),
        }
    }

    /// Lets `token` stop the run (rule 7 of `exec/mod.rs`).
    pub(crate) fn with_token(mut self, token: Option<StopToken>) -> Self {
        self.token = token;
        self
    }

    pub(crate) fn set_distributed(&self) {
        self.distributed.store(true, Ordering::SeqCst);
    }

    pub(crate) fn distributed(&self) -> bool {
        self.distributed.load(Ordering::Relaxed)
    }

    pub(crate) fn set_interrupt(&self, on: bool) {
        self.interrupt.store(on, Ordering::SeqCst);
    }

    pub(crate) fn interrupted(&self) -> bool {
        self.interrupt.load(Ordering::Relaxed)
    }

    /// Sets the incarnation of `v` (a member run: the coordinator numbers them).
    pub(crate) fn set_epoch(&self, v: VnodeId, epoch: u64) {
        if let Some(e) = self.epochs.get(v.0 as usize) {
            if e.0.fetch_max(epoch, Ordering::SeqCst) < epoch {
                self.epoch_changes.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// How many times an epoch rose so far (a new incarnation of some vnode).
    pub(crate) fn epoch_changes(&self) -> u64 {
        self.epoch_changes.load(Ordering::Relaxed)
    }

    /// The work word (outstanding units, change count) of `v`.
    pub(crate) fn work_word(&self, v: VnodeId) -> u64 {
        self.work
            .get(v.0 as usize)
            .map_or(0, |w| w.0.load(Ordering::SeqCst))
    }

    pub(crate) fn record_forged(&self, task: TaskId, vnode: VnodeId) {
        self.forged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((task, vnode));
    }

    pub(crate) fn take_forged(&self) -> Vec<(TaskId, VnodeId)> {
        std::mem::take(&mut *self.forged.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn set_kills(&self, mut kills: Vec<Kill>) {
        kills.sort_by_key(|k| k.after);
        *self.kills.lock().unwrap_or_else(|p| p.into_inner()) = kills;
    }

    /// Takes the planned failure of one of `mine` that is due, if any.
    pub(crate) fn due_kill(&self, mine: &[VnodeId]) -> Option<VnodeId> {
        let mut kills = self.kills.lock().unwrap_or_else(|p| p.into_inner());
        if kills.is_empty() {
            return None;
        }
        let done = self.completed();
        let n = self.work.len();
        let busy = |v: usize| work_units(self.work[v].0.load(Ordering::SeqCst)) != 0;
        for k in kills.iter_mut().filter(|k| k.after <= done && k.retarget) {
            // Settled once: the vnode it lands on is chosen when it becomes due.
            k.retarget = false;
            let v = k.vnode.0 as usize;
            if v < n && !busy(v) {
                if let Some(w) = (1..n).map(|d| (v + d) % n).find(|&w| busy(w)) {
                    // w < n = vnodes, a u32.
                    k.vnode = VnodeId(w as u32);
                }
            }
        }
        let i = kills
            .iter()
            .position(|k| k.after <= done && mine.contains(&k.vnode))?;
        Some(kills.remove(i).vnode)
    }

    /// Whether a planned failure is due and not yet injected: the run must not end before its
    /// vnode's driver has injected it (an idle vnode's driver may be asleep).
    pub(crate) fn kill_due(&self) -> bool {
        let kills = self.kills.lock().unwrap_or_else(|p| p.into_inner());
        if kills.is_empty() {
            return false;
        }
        let done = self.completed();
        kills.iter().any(|k| k.after <= done)
    }

    pub(crate) fn epoch(&self, v: VnodeId) -> u64 {
        self.epochs[v.0 as usize].0.load(Ordering::SeqCst)
    }

    /// A new incarnation of `v`: bumps its epoch and forgets its work (the rebuilt vnode
    /// counts its own again), as one change for the termination test. One unit stays, for the
    /// recovery itself: the caller lowers it with `work_done` once the rebuild is counted, so
    /// the run cannot look finished while the vnode is being rebuilt.
    pub(crate) fn reincarnate(&self, v: VnodeId) -> u64 {
        let w = &self.work[v.0 as usize].0;
        let _ = w.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |x| {
            Some((((x >> 32).wrapping_add(1) << 32) & !LOW) | 1)
        });
        let epoch = self.epochs[v.0 as usize].0.fetch_add(1, Ordering::SeqCst) + 1;
        self.epoch_changes.fetch_add(1, Ordering::SeqCst);
        epoch
    }

    pub(crate) fn set_completed(&self, v: VnodeId, total: u64) {
        self.completed[v.0 as usize]
            .0
            .store(total, Ordering::Relaxed);
    }

    pub(crate) fn work_add(&self, v: VnodeId) {
        self.work[v.0 as usize].0.fetch_add(UP, Ordering::SeqCst);
    }

    pub(crate) fn work_done(&self, v: VnodeId) {
        self.work_done_n(v, 1);
    }

    /// Lowers the work of `v` by `n` units (at most its outstanding units) as one change.
    pub(crate) fn work_done_n(&self, v: VnodeId, n: u32) {
        let delta = DOWN - u64::from(n);
        self.work[v.0 as usize].0.fetch_add(delta, Ordering::SeqCst);
    }

    /// Tasks completed so far, over all vnodes.
    pub(crate) fn completed(&self) -> u64 {
        self.completed
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum()
    }

    /// Whether no vnode has work and none changed between two scans: then there is an instant
    /// at which every counter was zero at once, so no task is live and no message that carries
    /// work is in flight (its sender keeps an obligation until acknowledged).
    pub(crate) fn quiescent(&self) -> bool {
        let scan = || {
            self.work
                .iter()
                .map(|w| w.0.load(Ordering::SeqCst))
                .collect::<Vec<u64>>()
        };
        let first = scan();
        if first.iter().any(|&w| work_units(w) != 0) {
            return false;
        }
        first == scan()
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// The run is over: every task completed (rule 4 of `exec/mod.rs`).
    pub(crate) fn finish(&self) {
        self.finished.store(true, Ordering::SeqCst);
        self.stop();
    }

    pub(crate) fn finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// Whether the run stops: it ended, failed, or its caller asked (rule 7).
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.token.as_ref().is_some_and(StopToken::is_stopped)
    }

    /// Whether the caller's token asked the run to stop (rule 7).
    pub(crate) fn stop_requested(&self) -> bool {
        self.token.as_ref().is_some_and(StopToken::is_stopped)
    }

    /// Records the first error and stops the run.
    pub(crate) fn fail(&self, e: RunError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        drop(slot);
        self.stop();
    }

    pub(crate) fn take_error(&self) -> Option<RunError> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

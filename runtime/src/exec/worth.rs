//! Whether a ready task is worth giving to a thief when the vnode logs (`vnode.rs` rule 3).
//!
//! With a log, a move puts two durable waits (`vnode.rs` rule 6) on the way of the task's
//! readers: the victim's `Stolen` before the grant leaves, and the thief's outputs before
//! `Returned` leaves. For a task that runs in less than that, the move is a loss whenever its
//! readers would otherwise have had it sooner from the victim itself.
//!
//! Rules:
//!
//! 1. **What it knows.** Per task kind (its registered name), the mean time its runs took here
//!    (body and completion, on the run's clock) and whether one of them spawned children; and
//!    the mean time a message that someone waits for (a grant, a `Returned`) was held here
//!    until durable: the *move wait*. Means are exponential, weight 1/8 for a new sample (a few
//!    runs settle them, one slow run does not).
//! 2. **Worth moving.** With a log, a victim whose thread has nothing else to run keeps its
//!    last ready task: it runs it at once, where a thief would start it a durable wait later
//!    and the victim would idle meanwhile (on the logged CG, giving away the last task of a
//!    batch, the next `Step`, moved every batch to the other vnode: 50 % more peak memory for
//!    no parallelism). Otherwise a task is worth moving unless all of these hold: the vnode logs; its
//!    kind has run here and never spawned children (a spawning task's subtree is work this
//!    vnode cannot see, usually the most worth moving: the oldest ready task of a tree); a move
//!    wait was measured; and the ready work the victim keeps (the other ready tasks, counted at
//!    this kind's mean) plus the task itself takes less than two move waits. Then the victim,
//!    running everything it has, is done before a thief could have returned the task.
//! 3. **Only the choice.** A victim gives the oldest ready task worth moving (`vnode.rs` rule
//!    3), or none; what a move does is unchanged, so recovery and the protocol's invariants are
//!    unchanged. Without a log a move waits for nothing (a message leaves at once), so every
//!    task is worth moving, as before.
//! 4. **Flush first.** A vnode about to run a task while it holds a sealed message that
//!    someone waits for (`vnode.rs` rule 6) waits for that batch to become durable before the
//!    task, when the kind's mean time is more than two *flushes* (the mean of such waits); it
//!    waits at most the kind's mean time, and a wait that ends without durability counts as
//!    its bound. Without the wait the message leaves only after the task: its receiver gains
//!    the task's time less the flush, the vnode idles for the flush, so the whole gains when
//!    the task takes more than two flushes. Before the first wait a vnode tries. Measured
//!    (`nqueens cluster --workers 2 -n 16`, tasks of ~30 ms, flushes of 0.3-1 ms): without
//!    it a thief waited a whole victim task for every grant, 118 ms of 1.8 s idle in one run.
//!
//! Example (issue 17 target 8, the logged data-flow CG on 2 vnodes): a block's SpMV takes about
//! 3 ms and each move wait about 7 ms (a 2 MB value made durable), so a victim with three SpMVs
//! ready (9 ms) keeps them, where before every iteration moved three tasks and waited six times.

use std::time::Duration;

/// Rule 1: the weight of a new sample in a mean is 1 / this.
const MEAN_WEIGHT: u32 = 8;

/// Rule 1: a mean over the samples seen (`None` before the first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Mean(Option<Duration>);

impl Mean {
    fn add(&mut self, sample: Duration) {
        self.0 = Some(match self.0 {
            None => sample,
            Some(m) => (m * (MEAN_WEIGHT - 1) + sample) / MEAN_WEIGHT,
        });
    }
}

/// What a vnode knows of a task kind (rule 1).
#[derive(Clone, Copy, Debug, Default)]
struct Kind {
    took: Mean,
    spawns: bool,
}

/// A vnode's measures of what a move costs and what its tasks take (module docs).
#[derive(Debug, Default)]
pub(crate) struct Worth {
    /// By name, in the order first run (a program has a few kinds: a scan, cheaper on every
    /// task than hashing the name; no order of it reaches a message).
    kinds: Vec<(&'static str, Kind)>,
    move_wait: Mean,
    flush: Mean,
}

impl Worth {
    /// Rule 1: a task of kind `name` ran here in `took`, and spawned children or not.
    pub(crate) fn ran(&mut self, name: &'static str, took: Duration, spawned: bool) {
        let at = match self.kinds.iter().position(|(n, _)| *n == name) {
            Some(at) => at,
            None => {
                self.kinds.push((name, Kind::default()));
                self.kinds.len() - 1
            }
        };
        let k = &mut self.kinds[at].1;
        k.took.add(took);
        k.spawns |= spawned;
    }

    /// Rule 1: what is known of kind `name`, if it ran here.
    fn kind(&self, name: &str) -> Option<&Kind> {
        self.kinds.iter().find(|(n, _)| *n == name).map(|(_, k)| k)
    }

    /// Rule 1: a grant or a `Returned` was held `waited` until durable.
    pub(crate) fn waited(&mut self, waited: Duration) {
        self.move_wait.add(waited);
    }

    /// Rule 4: how long a vnode about to run a task of kind `name` waits first for a sealed
    /// message someone waits for to become durable (`None`: it does not wait).
    pub(crate) fn flush_first(&self, name: &str) -> Option<Duration> {
        let took = self.kind(name)?.took.0?;
        match self.flush.0 {
            Some(flush) if flush.saturating_mul(2) >= took => None,
            _ => Some(took),
        }
    }

    /// Rule 4: a wait for a flush took `waited` (its bound when it ended without durability).
    pub(crate) fn flushed(&mut self, waited: Duration) {
        self.flush.add(waited);
    }

    /// Rule 2: whether a ready task of kind `name` is worth giving away by a vnode that logs
    /// (`logging`) and keeps `others` ready tasks besides it, on a thread that has nothing
    /// else to run (`alone`).
    pub(crate) fn worth_moving(
        &self,
        logging: bool,
        name: &str,
        others: usize,
        alone: bool,
    ) -> bool {
        if !logging {
            return true;
        }
        if others == 0 && alone {
            return false;
        }
        let (Some(kind), Mean(Some(wait))) = (self.kind(name), self.move_wait) else {
            return true;
        };
        let Mean(Some(took)) = kind.took else {
            return true;
        };
        if kind.spawns {
            return true;
        }
        let kept = u32::try_from(others.saturating_add(1)).unwrap_or(u32::MAX);
        took.saturating_mul(kept) >= wait.saturating_mul(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Rule 2: a short leaf task is kept while the victim's ready work is shorter than two move
    /// waits, given once it is longer; a spawning kind, an unknown kind, a vnode that has not
    /// measured a move yet and a vnode without a log always give.
    #[test]
    fn short_leaf_tasks_stay_unless_the_victim_has_more_work_than_a_move_waits() {
        let mut w = Worth::default();
        assert!(
            !w.worth_moving(true, "leaf", 0, true),
            "its last task, on a free thread"
        );
        assert!(
            w.worth_moving(true, "leaf", 0, false),
            "its thread has other work"
        );
        assert!(w.worth_moving(false, "leaf", 0, true), "without a log");
        assert!(
            w.worth_moving(true, "leaf", 0, false),
            "nothing measured yet"
        );
        w.ran("leaf", 3 * MS, false);
        w.ran("tree", MS, true);
        assert!(
            w.worth_moving(true, "leaf", 0, false),
            "no move measured yet"
        );
        w.waited(7 * MS);
        assert!(!w.worth_moving(true, "leaf", 0, false));
        assert!(
            !w.worth_moving(true, "leaf", 3, false),
            "4 x 3 ms < 2 x 7 ms"
        );
        assert!(
            w.worth_moving(true, "leaf", 4, false),
            "5 x 3 ms >= 2 x 7 ms"
        );
        assert!(
            w.worth_moving(true, "tree", 0, false),
            "its subtree is unknown"
        );
        assert!(w.worth_moving(true, "never-ran", 0, false));
        assert!(
            w.worth_moving(false, "leaf", 0, false),
            "without a log a move waits for nothing"
        );
        // A kind that spawned once stays a spawning kind.
        w.ran("leaf", 3 * MS, true);
        assert!(w.worth_moving(true, "leaf", 0, false));
    }

    /// Rule 4: a vnode waits for a flush before a task of a known kind that takes more than
    /// two flushes, at most the kind's time; a wait that timed out counts as its bound.
    #[test]
    fn a_flush_is_waited_for_before_a_task_that_takes_more_than_two() {
        let mut w = Worth::default();
        assert_eq!(w.flush_first("leaf"), None, "a kind never run here");
        w.ran("leaf", 30 * MS, false);
        w.ran("tiny", MS / 10, false);
        assert_eq!(
            w.flush_first("leaf"),
            Some(30 * MS),
            "no flush measured: it tries"
        );
        w.flushed(MS);
        assert_eq!(w.flush_first("leaf"), Some(30 * MS));
        assert_eq!(w.flush_first("tiny"), None, "0.1 ms < 2 x 1 ms");
        // Waits that reached their bound push the mean up until the leaf is not worth it.
        for _ in 0..6 {
            w.flushed(30 * MS);
        }
        assert!(w.flush.0.unwrap() >= 15 * MS);
        assert_eq!(w.flush_first("leaf"), None);
    }

    /// Rule 1: a new sample weighs 1/8, so one slow run moves the mean by an eighth.
    #[test]
    fn means_are_exponential_with_weight_an_eighth() {
        let mut m = Mean::default();
        m.add(8 * MS);
        assert_eq!(m.0, Some(8 * MS));
        m.add(16 * MS);
        assert_eq!(m.0, Some(9 * MS));
    }
}

//! The worker pool of embedded runs: fewer threads than vnodes. With a thread per vnode, 8
//! vnodes on 2 cores fought for the cores, and an asynchronous vnode iterated again and again
//! on halos its descheduled neighbours had not refreshed (`paper transport`, 64³ on 8 vnodes:
//! async 7.2 s and 3,121 iterations against sync 4.4 s and 1,457).
//!
//! Rules:
//!
//! 1. `threads` workers (embedded default: min(cores, vnodes)) share every node of the run. A
//!    node is either *parked* in the pool or *taken* by exactly one worker, which prepares it
//!    (`Node::prepare`: its messages, resends and timers), iterates it at most once, prepares it
//!    again and parks it with what it wants next. A node is never run by two workers at once
//!    and runs the same code as on a thread of its own, so the module rules hold unchanged.
//! 2. A parked node is *stale* when a message was sent to it (every endpoint of the pool rings
//!    the pool after each send: [`Doorbell`]), when it was added, when the supervisor pokes it
//!    (kill, stop), when its last preparation asked to go on at once, or when the idle time it
//!    asked for has passed. A free worker prepares stale nodes first, the lowest vnode first
//!    (no iteration: cheap).
//! 3. Otherwise a free worker iterates, among the nodes that want to, the one whose
//!    neighbours' halos are freshest: all of them fresh before some, then a node still
//!    converging before one *settled* (an asynchronous node converged on what it has, module
//!    rule 2: its iteration changes little, the other's is on the step's critical path), more
//!    fresh before fewer, and among equals the one that iterated least recently (round-robin:
//!    [`pick`]). A node
//!    whose halos are all stale still iterates when nothing better waits (async mode never
//!    waits for a neighbour), but no longer instead of a neighbour that would refresh them.
//! 4. With nothing to do, a worker sleeps until a doorbell rings, a node is parked wanting to
//!    iterate, or the earliest idle time passes.
//! 5. A node that exits (stopped, killed, failed or panicked) leaves the pool; its exit goes
//!    to the supervisor's callback with the node (`None` after a panic), whose endpoint a
//!    replacement takes over when it is added to the pool.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::node::{Exit, Node, Poll, Prepared};
use super::IterError;
use crate::clock::{Clock, SystemClock};
use crate::ids::{Epoch, VnodeId};
use crate::transport::{Endpoint, Envelope, Message, TransportError};

/// The longest a worker sleeps without a doorbell (rule 4): a bound on a lost wake-up, not a
/// period anyone waits for (nodes ask for 1-20 ms).
const MAX_SLEEP: Duration = Duration::from_millis(5);

/// What the pool runs: a node, or a test's stand-in.
pub(crate) trait Job: Send + 'static {
    /// Everything but the iteration (rule 1).
    fn prepare(&mut self, now: Duration) -> Result<Prepared, IterError>;
    /// One iteration, after [`Job::prepare`] said [`Prepared::Iterate`].
    fn iterate(&mut self) -> Result<(), IterError>;
}

impl Job for Node {
    fn prepare(&mut self, now: Duration) -> Result<Prepared, IterError> {
        Node::prepare(self, now)
    }
    fn iterate(&mut self) -> Result<(), IterError> {
        Node::iterate(self)
    }
}

/// What a parked node waits for (rules 2-3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// To be prepared (rule 2).
    Stale,
    /// Nothing until this time, or a doorbell.
    Idle(Duration),
    /// To iterate, with `fresh` of its `of` neighbours' halos fresh, `settled` when it is
    /// converged on what it has (rule 3); it last iterated at the pool's iteration count
    /// `last` (0: never).
    Iterate {
        fresh: usize,
        of: usize,
        settled: bool,
        last: u64,
    },
}

/// Rules 2-3: the node a free worker takes at `now` among the parked ones (vnode index,
/// want), and whether to iterate it (`false`: only prepare it).
pub(crate) fn pick(parked: &[(usize, Want)], now: Duration) -> Option<(usize, bool)> {
    let stale = parked
        .iter()
        .filter(|(_, w)| match w {
            Want::Stale => true,
            Want::Idle(t) => *t <= now,
            Want::Iterate { .. } => false,
        })
        .map(|&(i, _)| i)
        .min();
    if let Some(i) = stale {
        return Some((i, false));
    }
    parked
        .iter()
        .filter_map(|&(i, w)| match w {
            Want::Iterate {
                fresh,
                of,
                settled,
                last,
            } => Some((
                fresh >= of,
                !settled,
                fresh,
                std::cmp::Reverse(last),
                std::cmp::Reverse(i),
            )),
            _ => None,
        })
        .max()
        .map(|(_, _, _, _, std::cmp::Reverse(i))| (i, true))
}

/// Where a node's exit goes (rule 5): its vnode, the node (`None` after a panic), why.
pub(crate) type OnExit<J> = Box<dyn Fn(VnodeId, Option<J>, Exit) + Send + Sync>;

struct Slot<J> {
    /// `None` while a worker has it.
    job: Option<J>,
    want: Want,
    /// A doorbell rang while a worker had it: stale when parked (rule 2).
    rung: bool,
    /// The pool's iteration count at its last iteration.
    last: u64,
}

struct State<J> {
    slots: Vec<Option<Slot<J>>>,
    /// Iterations done by the pool.
    iterations: u64,
    shutdown: bool,
}

struct Shared<J> {
    state: Mutex<State<J>>,
    cv: Condvar,
    clock: SystemClock,
    on_exit: OnExit<J>,
}

/// Something a doorbell rings (rule 2).
trait Ring: Send + Sync {
    fn ring(&self, v: VnodeId);
}

impl<J: Job> Ring for Shared<J> {
    fn ring(&self, v: VnodeId) {
        let mut g = self.lock();
        if let Some(Some(s)) = g.slots.get_mut(v.0 as usize) {
            s.rung = true;
            if s.job.is_some() {
                s.want = Want::Stale;
            }
            drop(g);
            self.cv.notify_one();
        }
    }
}

impl<J: Job> Shared<J> {
    fn lock(&self) -> MutexGuard<'_, State<J>> {
        // A poisoned lock: a worker panicked outside a node (a bug); the state stays usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The pool (rules 1-5).
pub(crate) struct Pool<J: Job> {
    shared: Arc<Shared<J>>,
    workers: Vec<JoinHandle<()>>,
}

impl<J: Job> Pool<J> {
    /// A pool for vnodes `0..vnodes` with `threads` workers (at least 1).
    pub(crate) fn new(
        vnodes: usize,
        threads: usize,
        on_exit: OnExit<J>,
    ) -> Result<Self, IterError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: (0..vnodes).map(|_| None).collect(),
                iterations: 0,
                shutdown: false,
            }),
            cv: Condvar::new(),
            clock: SystemClock::default(),
            on_exit,
        });
        let mut pool = Pool {
            shared,
            workers: Vec::new(),
        };
        for k in 0..threads.max(1) {
            let shared = pool.shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("iter-pool-{k}"))
                .spawn(move || work(&shared))
                .map_err(|e| IterError::Config(format!("cannot start a thread: {e}")))?;
            pool.workers.push(h);
        }
        Ok(pool)
    }

    /// The pool's clock: nodes are created on it.
    pub(crate) fn now(&self) -> Duration {
        self.shared.clock.now()
    }

    /// Adds the node of vnode `v` (its previous incarnation has left: rule 5).
    pub(crate) fn add(&self, v: VnodeId, job: J) -> Result<(), IterError> {
        let mut g = self.shared.lock();
        match g.slots.get_mut(v.0 as usize) {
            Some(slot @ None) => {
                *slot = Some(Slot {
                    job: Some(job),
                    want: Want::Stale,
                    rung: false,
                    last: 0,
                });
            }
            Some(Some(_)) => return Err(IterError::Config(format!("{v} is already in the pool"))),
            None => return Err(IterError::Config(format!("{v} is not a vnode of the pool"))),
        }
        drop(g);
        self.shared.cv.notify_one();
        Ok(())
    }

    /// Makes `v` stale (rule 2): the supervisor changed its control (kill, stop).
    pub(crate) fn poke(&self, v: VnodeId) {
        self.shared.ring(v);
    }

    /// [`Pool::poke`] for every vnode.
    pub(crate) fn poke_all(&self) {
        let n = self.shared.lock().slots.len();
        for i in 0..n {
            self.shared.ring(VnodeId(i as u32));
        }
    }

    /// `ep` wrapped so that its sends ring this pool (rule 2).
    pub(crate) fn doorbell(&self, ep: Box<dyn Endpoint>) -> Box<dyn Endpoint> {
        let shared: Arc<dyn Ring> = self.shared.clone();
        Box::new(Doorbell {
            inner: ep,
            pool: Arc::downgrade(&shared),
        })
    }
}

impl<J: Job> Drop for Pool<J> {
    /// Stops the workers once they park their nodes; nodes still in the pool are dropped.
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.cv.notify_all();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// One worker (rules 1-4).
fn work<J: Job>(shared: &Shared<J>) {
    let mut g = shared.lock();
    loop {
        if g.shutdown {
            return;
        }
        let now = shared.clock.now();
        let parked: Vec<(usize, Want)> = g
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().filter(|s| s.job.is_some()).map(|s| (i, s.want)))
            .collect();
        let Some((i, iterate)) = pick(&parked, now) else {
            // Rule 4.
            let wake = parked
                .iter()
                .filter_map(|(_, w)| match w {
                    Want::Idle(t) => Some(t.saturating_sub(now)),
                    _ => None,
                })
                .min()
                .unwrap_or(MAX_SLEEP)
                .min(MAX_SLEEP);
            g = shared
                .cv
                .wait_timeout(g, wake)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            continue;
        };
        let v = VnodeId(i as u32);
        let Some(slot) = g.slots[i].as_mut() else {
            continue;
        };
        let Some(mut job) = slot.job.take() else {
            continue;
        };
        slot.rung = false;
        drop(g);
        let mut iterated = false;
        let out = catch_unwind(AssertUnwindSafe(|| {
            run_once(&mut job, iterate, &shared.clock, &mut iterated)
        }));
        g = shared.lock();
        if iterated {
            g.iterations += 1;
        }
        let count = g.iterations;
        let exit = match out {
            Ok(Ok(Prepared::Poll(Poll::Exit(exit)))) => Some((Some(job), exit)),
            Ok(Err(e)) => Some((Some(job), Exit::Failed(e))),
            Err(_) => Some((None, Exit::Failed(IterError::Panicked(v)))),
            Ok(Ok(p)) => {
                let Some(slot) = g.slots[i].as_mut() else {
                    continue;
                };
                if iterated {
                    slot.last = count;
                }
                slot.want = match p {
                    _ if slot.rung => Want::Stale,
                    Prepared::Iterate { fresh, of, settled } => Want::Iterate {
                        fresh,
                        of,
                        settled,
                        last: slot.last,
                    },
                    Prepared::Poll(Poll::Idle(d)) => {
                        Want::Idle(shared.clock.now().saturating_add(d))
                    }
                    Prepared::Poll(Poll::Busy | Poll::Exit(_)) => Want::Stale,
                };
                slot.rung = false;
                slot.job = Some(job);
                if !matches!(slot.want, Want::Idle(_)) {
                    shared.cv.notify_one();
                }
                None
            }
        };
        if let Some((job, exit)) = exit {
            // Rule 5: the slot is free for a replacement.
            g.slots[i] = None;
            drop(g);
            (shared.on_exit)(v, job, exit);
            g = shared.lock();
        }
    }
}

/// Rule 1: prepares, iterates if asked and the node still wants to, prepares again.
fn run_once<J: Job>(
    job: &mut J,
    iterate: bool,
    clock: &SystemClock,
    iterated: &mut bool,
) -> Result<Prepared, IterError> {
    if iterate {
        match job.prepare(clock.now())? {
            Prepared::Iterate { .. } => {
                job.iterate()?;
                *iterated = true;
            }
            p => return Ok(p),
        }
    }
    job.prepare(clock.now())
}

/// An endpoint whose sends ring the pool (rule 2).
pub(crate) struct Doorbell {
    inner: Box<dyn Endpoint>,
    pool: Weak<dyn Ring>,
}

impl Endpoint for Doorbell {
    fn send(&mut self, to: VnodeId, msg: Message) -> Result<(), TransportError> {
        let r = self.inner.send(to, msg);
        if let Some(p) = self.pool.upgrade() {
            p.ring(to);
        }
        r
    }
    fn try_recv(&mut self) -> Option<Envelope> {
        self.inner.try_recv()
    }
    fn recv_timeout(&mut self, timeout: Duration) -> Option<Envelope> {
        self.inner.recv_timeout(timeout)
    }
    fn set_epoch(&mut self, epoch: Epoch) {
        self.inner.set_epoch(epoch);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn stale_nodes_are_prepared_first_then_the_freshest_iterates() {
        let now = Duration::from_millis(10);
        let it = |fresh, last| Want::Iterate {
            fresh,
            of: 2,
            settled: false,
            last,
        };
        // A stale node, or one whose idle time has passed, before any iteration (rule 2).
        let parked = [(0, it(2, 0)), (3, Want::Idle(now)), (1, Want::Stale)];
        assert_eq!(pick(&parked, now), Some((1, false)));
        let parked = [(0, it(2, 0)), (3, Want::Idle(now))];
        assert_eq!(pick(&parked, now), Some((3, false)));
        // Rule 3: all fresh, then more fresh, then the least recently iterated.
        let later = Want::Idle(now + Duration::from_millis(1));
        let parked = [(0, it(1, 0)), (1, it(2, 7)), (2, later), (3, it(2, 5))];
        assert_eq!(pick(&parked, now), Some((3, true)));
        let parked = [(0, it(0, 0)), (1, it(1, 9)), (2, later)];
        assert_eq!(pick(&parked, now), Some((1, true)));
        // A lone vnode has no neighbour: its halos are all fresh.
        let lone = Want::Iterate {
            fresh: 0,
            of: 0,
            settled: false,
            last: 4,
        };
        assert_eq!(pick(&[(0, it(1, 0)), (5, lone)], now), Some((5, true)));
        // Equals: the lower vnode.
        assert_eq!(pick(&[(4, it(1, 3)), (2, it(1, 3))], now), Some((2, true)));
        // Among all fresh, or among some fresh, one still converging before a settled one.
        let settled = |fresh, last| Want::Iterate {
            fresh,
            of: 2,
            settled: true,
            last,
        };
        assert_eq!(
            pick(&[(0, settled(2, 0)), (1, it(2, 9))], now),
            Some((1, true))
        );
        assert_eq!(
            pick(&[(0, settled(1, 0)), (1, it(1, 9))], now),
            Some((1, true))
        );
        assert_eq!(
            pick(&[(0, settled(2, 9)), (1, it(1, 0))], now),
            Some((0, true))
        );
        assert_eq!(pick(&[(2, later)], now), None);
    }

    /// A stand-in node: wants to iterate `left` more times with `fresh` of 2 halos fresh,
    /// then exits; its iterations go to `log` with the thread that ran them.
    struct Fake {
        me: usize,
        fresh: usize,
        left: u32,
        log: mpsc::Sender<(usize, std::thread::ThreadId)>,
    }

    impl Job for Fake {
        fn prepare(&mut self, _now: Duration) -> Result<Prepared, IterError> {
            Ok(if self.left == 0 {
                Prepared::Poll(Poll::Exit(Exit::Stopped))
            } else {
                Prepared::Iterate {
                    fresh: self.fresh,
                    of: 2,
                    settled: false,
                }
            })
        }
        fn iterate(&mut self) -> Result<(), IterError> {
            self.left -= 1;
            let _ = self.log.send((self.me, std::thread::current().id()));
            Ok(())
        }
    }

    /// Runs fakes (fresh halos, iterations) on `threads` workers; the iterations in order.
    fn run(threads: usize, fakes: &[(usize, u32)]) -> Vec<(usize, std::thread::ThreadId)> {
        let (log, iterations) = mpsc::channel();
        let (exit_tx, exits) = mpsc::channel();
        let pool: Pool<Fake> = Pool::new(
            fakes.len(),
            threads,
            Box::new(move |v, job, exit| {
                assert!(
                    job.is_some() && matches!(exit, Exit::Stopped),
                    "{v}: {exit:?}"
                );
                let _ = exit_tx.send(v);
            }),
        )
        .unwrap();
        // All added under one hold of the lock, so that no worker starts before the last.
        let mut g = pool.shared.lock();
        for (i, &(fresh, left)) in fakes.iter().enumerate() {
            g.slots[i] = Some(Slot {
                job: Some(Fake {
                    me: i,
                    fresh,
                    left,
                    log: log.clone(),
                }),
                want: Want::Stale,
                rung: false,
                last: 0,
            });
        }
        drop(g);
        pool.shared.cv.notify_all();
        drop(log);
        for _ in fakes {
            exits
                .recv_timeout(Duration::from_secs(60))
                .expect("every fake exits");
        }
        drop(pool);
        iterations.iter().collect()
    }

    #[test]
    fn one_worker_iterates_the_freshest_first_and_equals_round_robin() {
        let order: Vec<usize> = run(1, &[(0, 1), (2, 1), (1, 1), (2, 1), (0, 1)])
            .into_iter()
            .map(|(v, _)| v)
            .collect();
        assert_eq!(order, vec![1, 3, 2, 0, 4]);
        let order: Vec<usize> = run(1, &[(1, 3), (1, 3), (1, 3)])
            .into_iter()
            .map(|(v, _)| v)
            .collect();
        assert_eq!(order, vec![0, 1, 2, 0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn eight_nodes_run_on_the_pools_two_threads() {
        let done = run(2, &[(2, 50); 8]);
        assert_eq!(done.len(), 400);
        let threads: std::collections::HashSet<std::thread::ThreadId> =
            done.iter().map(|&(_, t)| t).collect();
        assert!(
            threads.len() <= 2,
            "{} threads ran the nodes",
            threads.len()
        );
        assert!(!threads.contains(&std::thread::current().id()));
    }
}

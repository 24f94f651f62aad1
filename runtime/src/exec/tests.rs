//! Runtime tests: small programs on 1, 2 and 4 vnodes, and every way a task can be wrong.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::log::{EventKind, LogReader};
use crate::{Ctx, MemoryStore, Registry, Runtime, Task, TaskResult, Writes};

#[derive(Serialize, Deserialize)]
struct Fib(u32);

impl Task for Fib {
    const NAME: &'static str = "fib";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        if self.0 < 2 {
            ctx.write(out, u64::from(self.0));
        } else {
            let (a,) = ctx.spawn(Fib(self.0 - 1), ());
            let (b,) = ctx.spawn(Fib(self.0 - 2), ());
            ctx.spawn_delegate(Add, (a, b), (out,));
        }
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct Add;

impl Task for Add {
    const NAME: &'static str = "add";
    type Inputs = (u64, u64);
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (a, b): (u64, u64), (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, a + b);
        Ok(())
    }
}

fn fib_registry() -> Registry {
    Registry::new()
        .with::<Fib>()
        .unwrap()
        .with::<Add>()
        .unwrap()
}

/// Across all logs in `store`: `tasks` tasks, each with one Declared, Started and Completed
/// (the reader drops duplicates inside one log, so a second one can only be in another log).
fn assert_each_task_logged_once(store: &Arc<MemoryStore>, tasks: u64, ctx: &str) {
    let all = LogReader::new(store.clone()).read_all().unwrap();
    let mut per_task = std::collections::HashMap::new();
    for v in &all {
        for e in &v.events {
            let k = e.event.key();
            if matches!(
                k.1,
                EventKind::Declared | EventKind::Started | EventKind::Completed
            ) {
                per_task.entry(k).or_insert_with(Vec::new).push(v.vnode);
            }
        }
    }
    assert_eq!(per_task.len() as u64, 3 * tasks, "{ctx}");
    let twice: Vec<_> = per_task
        .iter()
        .filter(|(_, where_)| where_.len() != 1)
        .collect();
    assert!(
        twice.is_empty(),
        "{ctx}: logged in several logs (key, vnodes): {twice:?}"
    );
}

fn fib(n: u32) -> u64 {
    (0..n).fold((0u64, 1u64), |(a, b), _| (b, a + b)).0
}

/// Tasks of `Fib(n)`: one per call, plus one `Add` per internal call.
fn fib_tasks(n: u32) -> u64 {
    if n < 2 {
        1
    } else {
        2 + fib_tasks(n - 1) + fib_tasks(n - 2)
    }
}

#[test]
fn fib_on_1_2_4_vnodes_with_and_without_log() {
    for vnodes in [1, 2, 4] {
        for logged in [false, true] {
            for seed in 0..3 {
                let store = Arc::new(MemoryStore::default());
                let mut b = Runtime::builder(fib_registry())
                    .threads(2)
                    .vnodes(vnodes)
                    .seed(seed);
                if logged {
                    b = b.store(store.clone());
                }
                let rt = b.build().unwrap();
                let ctx = format!("vnodes {vnodes} logged {logged} seed {seed}");
                eprintln!("{ctx}");
                let r = rt.run(Fib(16), ()).unwrap();
                eprintln!("{ctx}");
                assert_eq!(r.outputs.0, fib(16), "{ctx}");
                assert_eq!(r.tasks, fib_tasks(16), "{ctx}");
                if logged {
                    let all = LogReader::new(store).read_all().unwrap();
                    let mut kinds = std::collections::BTreeMap::new();
                    for e in all.iter().flat_map(|v| &v.events) {
                        *kinds.entry(e.event.kind()).or_insert(0u64) += 1;
                    }
                    let n: u64 = kinds.values().sum();
                    assert_eq!(n, r.events, "{ctx}");
                    let count = |k| kinds.get(&k).copied().unwrap_or(0);
                    let stolen: u64 = r.vnodes.iter().map(|s| s.stolen).sum();
                    let adopted: u64 = r.vnodes.iter().map(|s| s.adopted).sum();
                    assert_eq!(count(EventKind::Declared), r.tasks, "{ctx}");
                    assert_eq!(count(EventKind::Started), r.tasks, "{ctx}");
                    assert_eq!(count(EventKind::Completed), r.tasks, "{ctx}");
                    assert_eq!(count(EventKind::Stolen), stolen, "{ctx}");
                    assert_eq!(count(EventKind::Adopted), adopted, "{ctx}");
                    assert_eq!(stolen, adopted, "{ctx}");
                    // A value written by a task stolen back arrives home before its Returned.
                    assert!(count(EventKind::Returned) <= stolen, "{ctx}");
                } else {
                    assert_eq!(r.events, 0);
                }
            }
        }
    }
}

/// Rules 2, 3 and 5 of vnode.rs: with a fifth of all messages lost and a fifth duplicated, every
/// run still finishes with the right result, and every task is declared, started and completed
/// once in the logs.
#[test]
fn lost_and_duplicated_messages_are_resent_and_ignored() {
    use crate::transport::{InProcTransport, LossyTransport};
    use std::sync::atomic::Ordering;
    let timers = crate::Timers {
        steal_timeout: std::time::Duration::from_millis(2),
        resend_after: std::time::Duration::from_millis(3),
        ..crate::Timers::default()
    };
    let mut lost_total = 0;
    for seed in 0..8u64 {
        for logged in [false, true] {
            let ctx = format!("seed {seed} logged {logged}");
            eprintln!("{ctx}");
            let counters = Arc::new(std::sync::Mutex::new(Vec::new()));
            let c = counters.clone();
            let store = Arc::new(MemoryStore::default());
            let mut b = Runtime::builder(fib_registry())
                .threads(2)
                .vnodes(4)
                .seed(seed)
                .timers(timers)
                .transport(Arc::new(move |v| {
                    let t = LossyTransport::new(Box::new(InProcTransport::new(v)), 0.2, 0.2, seed);
                    c.lock().unwrap().push(t.counters());
                    Box::new(t)
                }));
            if logged {
                b = b.store(store.clone());
            }
            let r = b.build().unwrap().run(Fib(15), ()).unwrap();
            assert_eq!(r.outputs.0, fib(15), "{ctx}");
            assert_eq!(r.tasks, fib_tasks(15), "{ctx}");
            let (lost, _dup) = counters.lock().unwrap()[0].clone();
            lost_total += lost.load(Ordering::Relaxed);
            if logged {
                assert_each_task_logged_once(&store, r.tasks, &ctx);
            }
        }
    }
    assert!(
        lost_total > 20,
        "the transport must actually lose messages ({lost_total})"
    );
}

/// recover.rs: vnodes fail at seeded points (the root's vnode too, several at once, one during
/// another's recovery, before anything is durable) and are rebuilt from their logs. Every run
/// gives the fault-free result, and every task is declared, started and completed once in the
/// final logs.
#[test]
fn failed_vnodes_are_recovered_from_their_logs() {
    use crate::Kill;
    use rand::{RngExt, SeedableRng};
    let total = fib_tasks(14);
    let mut failures = 0;
    let mut restarted = 0;
    let k = |v: u32, after: u64| Kill {
        vnode: crate::VnodeId(v),
        after,
        retarget: false,
    };
    // Named cases first: two vnodes at once, the root's vnode, a vnode failing again during
    // its own recovery and another's, before anything was durable; then seeded random ones.
    let named: Vec<(u32, Vec<Kill>)> = vec![
        (3, vec![k(1, 500), k(2, 500)]),
        (2, vec![k(0, 300)]),
        (3, vec![k(1, 400), k(1, 401), k(2, 401)]),
        (4, vec![k(0, 0), k(3, 0)]),
    ];
    for seed in 0..200u64 + named.len() as u64 {
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(seed);
        let (vnodes, kills) = match named.get(seed as usize) {
            Some((v, kills)) => (*v, kills.clone()),
            None => {
                let vnodes = [2u32, 3, 4][(seed % 3) as usize];
                let kills = (0..1 + seed % 3)
                    .map(|_| {
                        let after = if seed % 7 == 0 {
                            0
                        } else {
                            rng.random_range(0..total)
                        };
                        k(rng.random_range(0..vnodes), after)
                    })
                    .collect();
                (vnodes, kills)
            }
        };
        let ctx = format!("seed {seed} vnodes {vnodes} kills {kills:?}");
        eprintln!("{ctx}");
        let store = Arc::new(MemoryStore::default());
        let rt = Runtime::builder(fib_registry())
            .threads(2)
            .vnodes(vnodes)
            .seed(seed)
            .store(store.clone())
            .kills(kills)
            .build()
            .unwrap();
        let r = rt.run(Fib(14), ()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(r.outputs.0, fib(14), "{ctx}");
        assert_each_task_logged_once(&store, total, &ctx);
        assert_eq!(r.tasks, total, "{ctx}: {:?}", r.vnodes);
        failures += r.vnodes.iter().map(|s| s.failures).sum::<u64>();
        restarted += r.vnodes.iter().map(|s| s.recovered_tasks).sum::<u64>();
    }
    assert!(failures >= 200, "failures injected: {failures}");
    assert!(restarted > 0, "some recoveries restart tasks");
}

/// One value, many readers: `Fan(n)` spawns `Gen` and n `Plus(i)` reading its output, summed
/// by a chain of `Add`s.
#[derive(Serialize, Deserialize)]
struct Fan(u64);

impl Task for Fan {
    const NAME: &'static str = "fan";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        let (d,) = ctx.spawn(Gen, ());
        let (mut acc,) = ctx.spawn(Plus(0), (d,));
        for i in 1..self.0 {
            let (p,) = ctx.spawn(Plus(i), (d,));
            (acc,) = ctx.spawn(Add, (acc, p));
        }
        let (z,) = ctx.spawn(Plus(0), (d,));
        ctx.spawn_delegate(Add, (acc, z), (out,));
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct Gen;

impl Task for Gen {
    const NAME: &'static str = "gen";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, 100);
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct Plus(u64);

impl Task for Plus {
    const NAME: &'static str = "plus";
    type Inputs = (u64,);
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (v,): (u64,), (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, v + self.0);
        Ok(())
    }
}

/// Recovery rebuilds a vnode whose log holds a written value and many live readers of it:
/// every reader is wired before any may drop the value (a regression: the first reader
/// consumed it and the second found it unknown). Every event is sealed at once, so the log
/// holds what ran before the failure; kills land between steps of `STEP_BUDGET` tasks, so the
/// fan is wider than that; whatever the kill point, the sum is the same.
#[test]
fn a_value_with_several_live_readers_survives_recovery() {
    use super::STEP_BUDGET;
    use crate::log::CommitPolicy;
    use crate::Kill;
    let registry = || {
        Registry::new()
            .with::<Fan>()
            .unwrap()
            .with::<Gen>()
            .unwrap()
            .with::<Plus>()
            .unwrap()
            .with::<Add>()
            .unwrap()
    };
    let n = 3 * STEP_BUDGET as u64;
    for after in [1, 2, 3, 100, 300, 500, 700, 1000] {
        for vnodes in [1, 2] {
            let ctx = format!("{vnodes} vnode(s), v0 fails after {after} tasks");
            let rt = Runtime::builder(registry())
                .threads(1)
                .vnodes(vnodes)
                .store(Arc::new(MemoryStore::default()))
                .commit_policy(CommitPolicy {
                    max_bytes: 1,
                    max_delay: std::time::Duration::ZERO,
                    ..CommitPolicy::default()
                })
                .kills(vec![Kill {
                    vnode: crate::VnodeId(0),
                    after,
                    retarget: false,
                }])
                .build()
                .unwrap();
            let r = rt.run(Fan(n), ()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(r.outputs.0, (n + 1) * 100 + n * (n - 1) / 2, "{ctx}");
            assert_eq!(r.vnodes[0].failures, 1, "{ctx}");
            // The failure came mid-run: some tasks reused from the log, some run again.
            let v0 = &r.vnodes[0];
            assert!(
                v0.reused_tasks > 0 && v0.recovered_tasks > 0,
                "{ctx}: {v0:?}"
            );
        }
    }
}

/// An in-process transport whose sends go through `deliver` first: it may count a message,
/// and the message is lost when it says `false`.
struct Filtered(
    crate::transport::InProcTransport,
    fn(&crate::transport::Message) -> bool,
);

struct FilteredEndpoint(
    Box<dyn crate::transport::Endpoint>,
    fn(&crate::transport::Message) -> bool,
);

impl crate::transport::Transport for Filtered {
    fn endpoint(
        &self,
        me: crate::VnodeId,
    ) -> Result<Box<dyn crate::transport::Endpoint>, crate::transport::TransportError> {
        Ok(Box::new(FilteredEndpoint(self.0.endpoint(me)?, self.1)))
    }
}

impl crate::transport::Endpoint for FilteredEndpoint {
    fn send(
        &mut self,
        to: crate::VnodeId,
        msg: crate::transport::Message,
    ) -> Result<(), crate::transport::TransportError> {
        if !(self.1)(&msg) {
            return Ok(());
        }
        self.0.send(to, msg)
    }
    fn try_recv(&mut self) -> Option<crate::transport::Envelope> {
        self.0.try_recv()
    }
    fn recv_timeout(&mut self, t: std::time::Duration) -> Option<crate::transport::Envelope> {
        self.0.recv_timeout(t)
    }
    fn set_epoch(&mut self, e: crate::Epoch) {
        self.0.set_epoch(e)
    }
}

/// [`Filtered`]: every `Returned` message is lost (a stolen task's output never comes home).
fn no_returns(msg: &crate::transport::Message) -> bool {
    !matches!(msg, crate::transport::Message::Returned { .. })
}

/// waits.rs: a run that can never end says what it waits for (here: outputs of stolen tasks
/// that never come back) instead of idling silently, and with `fail` it ends with the report.
#[test]
fn a_run_that_cannot_end_reports_what_its_vnodes_wait_for() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(stalled_run());
    });
    // If the stall report broke, the run would idle forever: a deadline far above 300 ms
    // turns that into a failure.
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the run neither ended nor reported its stall");
    let Err(crate::RunError::Stalled { waits, .. }) = r else {
        panic!("the run must stall and say so: {r:?}");
    };
    let text: Vec<String> = waits.iter().map(ToString::to_string).collect();
    let text = text.join(" | ");
    assert!(
        waits.iter().any(|w| w.expected.0 > 0 || w.returns.0 > 0),
        "the report names the returns it waits for: {text}"
    );
    assert!(text.contains("work units"), "{text}");
}

fn stalled_run() -> Result<crate::RunReport<(u64,)>, crate::RunError> {
    Runtime::builder(fib_registry())
        .threads(2)
        .vnodes(2)
        .seed(1)
        .transport(Arc::new(|v| {
            Box::new(Filtered(
                crate::transport::InProcTransport::new(v),
                no_returns,
            ))
        }))
        .stall(crate::Stall {
            after: std::time::Duration::from_millis(300),
            fail: true,
        })
        .build()
        .unwrap()
        .run(Fib(18), ())
}

/// Bytes of log between checkpoints in the test below: at every flush (every recovery starts
/// from a checkpoint, with no log after it), or every few segments (recoveries read a tail).
const CHECKPOINT_EVERY: [u64; 3] = [1, 8 << 10, 32 << 10];

/// recover.rs with checkpoints: the seeded failures of `failed_vnodes_are_recovered_from_their_logs`
/// (several vnodes, the root's, during another's recovery), now over a lossy transport and with
/// a checkpoint at every flush, so recoveries start from compacted states, acknowledged returns
/// are dropped from them and grants are sent again from them. Every run gives the fault-free
/// result and logs each task once.
#[test]
fn failed_vnodes_are_recovered_from_checkpoints() {
    use crate::transport::{InProcTransport, LossyTransport};
    use crate::Kill;
    use rand::{RngExt, SeedableRng};
    let total = fib_tasks(14);
    let timers = crate::Timers {
        steal_timeout: std::time::Duration::from_millis(2),
        resend_after: std::time::Duration::from_millis(3),
        ..crate::Timers::default()
    };
    let (mut from_checkpoints, mut restarted, mut tails) = (0, 0, 0);
    for seed in 0..60u64 {
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(seed);
        let vnodes = [2u32, 3, 4][(seed % 3) as usize];
        let kills: Vec<Kill> = (0..1 + seed % 3)
            .map(|_| Kill {
                vnode: crate::VnodeId(rng.random_range(0..vnodes)),
                after: rng.random_range(0..total),
                retarget: false,
            })
            .collect();
        let lossy = seed % 2 == 1;
        let ctx = format!("seed {seed} vnodes {vnodes} lossy {lossy} kills {kills:?}");
        eprintln!("{ctx}");
        let store = Arc::new(MemoryStore::default());
        let mut b = Runtime::builder(fib_registry())
            .threads(2)
            .vnodes(vnodes)
            .seed(seed)
            .store(store.clone())
            .checkpoint_every(CHECKPOINT_EVERY[(seed % 3) as usize])
            .timers(timers)
            .kills(kills);
        if lossy {
            b = b.transport(Arc::new(move |v| {
                Box::new(LossyTransport::new(
                    Box::new(InProcTransport::new(v)),
                    0.1,
                    0.1,
                    seed,
                ))
            }));
        }
        let r = b
            .build()
            .unwrap()
            .run(Fib(14), ())
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(r.outputs.0, fib(14), "{ctx}");
        assert_each_task_logged_once(&store, total, &ctx);
        assert_eq!(r.tasks, total, "{ctx}: {:?}", r.vnodes);
        from_checkpoints += r
            .vnodes
            .iter()
            .map(|s| s.checkpoint_recoveries)
            .sum::<u64>();
        restarted += r.vnodes.iter().map(|s| s.recovered_tasks).sum::<u64>();
        tails += r.vnodes.iter().map(|s| s.recovery_log_events).sum::<u64>();
    }
    assert!(tails > 0, "some recoveries read log after their checkpoint");
    assert!(
        from_checkpoints >= 40,
        "recoveries from a checkpoint: {from_checkpoints}"
    );
    assert!(restarted > 0, "some recoveries restart tasks");
}

/// `Fib`, except that it fails while [`FAIL_AT`] names its argument: interrupts a run part way.
#[derive(Serialize, Deserialize)]
struct FlakyFib(u32, u32);

static FAIL_AT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

impl Task for FlakyFib {
    const NAME: &'static str = "flaky-fib";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        let FlakyFib(n, id) = self;
        if id == FAIL_AT.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::TaskError::msg("interrupted on purpose"));
        }
        if n < 2 {
            ctx.write(out, u64::from(n));
        } else {
            let (a,) = ctx.spawn(FlakyFib(n - 1, 2 * id), ());
            let (b,) = ctx.spawn(FlakyFib(n - 2, 2 * id + 1), ());
            ctx.spawn_delegate(Add, (a, b), (out,));
        }
        Ok(())
    }
}

fn copy_store(from: &MemoryStore, drop_checkpoints: bool) -> Arc<MemoryStore> {
    use veriflow_checkpoint::Store;
    let to = Arc::new(MemoryStore::default());
    let pairs: Vec<_> = from
        .scan_prefix(b"")
        .unwrap()
        .into_iter()
        .filter(|(k, _)| {
            !(drop_checkpoints && k.starts_with(crate::log::checkpoint::CHECKPOINT_PREFIX))
        })
        .collect();
    to.put_batch(&pairs).unwrap();
    to
}

/// `log/mod.rs` rule 9, end to end: an interrupted run resumed from its checkpoints, from its
/// whole logs (checkpoints deleted), and with every checkpoint damaged gives the same bits and
/// the same counts of tasks reused and restarted; only the first reads checkpoints, and it
/// decodes fewer events.
#[test]
fn resuming_from_checkpoints_equals_resuming_from_whole_logs() {
    use std::sync::atomic::Ordering;
    use veriflow_checkpoint::Store;
    let registry = || {
        Registry::new()
            .with::<FlakyFib>()
            .unwrap()
            .with::<Add>()
            .unwrap()
    };
    let n = 16;
    // Node ids are heap-numbered (root 1): fail deep in the tree, late in the run.
    let fail_at = (1u32 << 12) + 77;
    let rt = |store: Arc<MemoryStore>| {
        Runtime::builder(registry())
            .program("flaky")
            .threads(2)
            .vnodes(3)
            .seed(5)
            .store(store)
            .checkpoint_every(24 << 10)
            .build()
            .unwrap()
    };
    let interrupted = Arc::new(MemoryStore::default());
    FAIL_AT.store(fail_at, Ordering::SeqCst);
    let first = rt(interrupted.clone()).run(FlakyFib(n, 1), ());
    FAIL_AT.store(u32::MAX, Ordering::SeqCst);
    assert!(first.is_err(), "the first run must stop part way");
    let checkpoints = interrupted
        .scan_prefix(crate::log::checkpoint::CHECKPOINT_PREFIX)
        .unwrap();
    assert!(!checkpoints.is_empty(), "the run wrote checkpoints");

    let damaged = copy_store(&interrupted, false);
    for (k, mut v) in checkpoints {
        let at = v.len() / 2;
        v[at] ^= 0x40;
        damaged.put(&k, &v).unwrap();
    }
    let mut seen = Vec::new();
    for (name, store) in [
        ("checkpoints", copy_store(&interrupted, false)),
        ("whole logs", copy_store(&interrupted, true)),
        ("damaged checkpoints", damaged),
    ] {
        let r = rt(store)
            .resume(FlakyFib(n, 1), ())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.outputs.0, fib(n), "{name}");
        assert_eq!(r.tasks, fib_tasks(n), "{name}");
        let sum = |f: fn(&crate::VnodeStats) -> u64| r.vnodes.iter().map(f).sum::<u64>();
        let counts = (sum(|s| s.reused_tasks), sum(|s| s.recovered_tasks));
        let used = sum(|s| s.checkpoint_recoveries);
        let decoded = sum(|s| s.recovery_log_events);
        eprintln!("{name}: reused, restarted {counts:?}; checkpoints {used}; events {decoded}");
        assert!(
            counts.0 > 0,
            "{name}: the interrupted run had completed tasks"
        );
        seen.push((name, counts, used, decoded));
    }
    let (_, counts, used, decoded) = seen[0];
    assert!(used > 0, "resuming read the checkpoints");
    for &(name, c, u, d) in &seen[1..] {
        assert_eq!(c, counts, "{name}: same reused and restarted counts");
        assert_eq!(u, 0, "{name}: no checkpoint used");
        assert!(
            d > decoded,
            "{name}: the whole log has more events ({d} vs {decoded})"
        );
    }
}

/// `core.rs` rule 3 and `log/state.rs` rule 3: a long run's graph holds its live frontier, not
/// the tasks it ran, also after a vnode was rebuilt from its log (a regression: recovery
/// restored every completed task's outputs and never dropped them). Counts only, no timings.
#[test]
fn the_graph_holds_the_live_frontier_not_the_tasks_run() {
    use crate::Kill;
    // Fib(27): 1.2 M tasks without a log; Fib(20): 44 k tasks with a log and two failures.
    for (n, logged) in [(27u32, false), (20, true)] {
        let store = Arc::new(MemoryStore::default());
        let mut b = Runtime::builder(fib_registry())
            .threads(2)
            .vnodes(2)
            .seed(3);
        if logged {
            let half = fib_tasks(n) / 2;
            b = b.store(store).checkpoint_every(64 << 10).kills(vec![
                Kill {
                    vnode: crate::VnodeId(0),
                    after: half,
                    retarget: false,
                },
                Kill {
                    vnode: crate::VnodeId(1),
                    after: half + half / 2,
                    retarget: false,
                },
            ]);
        }
        let r = b.build().unwrap().run(Fib(n), ()).unwrap();
        assert_eq!(r.outputs.0, fib(n));
        assert_eq!(r.tasks, fib_tasks(n));
        let peak = r.vnodes.iter().map(|s| s.peak_graph).max().unwrap_or(0);
        eprintln!(
            "Fib({n}) logged {logged}: {} tasks, peak graph {peak}",
            r.tasks
        );
        // Depth-first order keeps O(depth) tasks per vnode, plus what thieves hold and the
        // values in flight: a few hundred, against 44 k to 1.2 M tasks.
        assert!(peak < 2000, "Fib({n}) logged {logged}: peak graph {peak}");
        if logged {
            let failures: u64 = r.vnodes.iter().map(|s| s.failures).sum();
            assert_eq!(failures, 2);
        }
    }
}

/// `log/state.rs` rules 1-3 on real logs (stealing, adoption, returns, failures): folding a
/// vnode's log in two parts, compacted and sent through a checkpoint record between them,
/// gives the state that folding it whole gives; and compaction keeps every live task and the
/// count of completed ones.
#[test]
fn a_checkpoint_between_two_parts_of_a_log_changes_nothing() {
    use crate::log::checkpoint::Checkpoint;
    use crate::log::watermark::LastSegment;
    use crate::log::LogState;
    use crate::Kill;
    let mut compared = 0;
    for seed in 0..6u64 {
        let store = Arc::new(MemoryStore::default());
        let kills = vec![Kill {
            vnode: crate::VnodeId((seed % 3) as u32),
            after: 300 + 100 * seed,
            retarget: false,
        }];
        let r = Runtime::builder(fib_registry())
            .threads(2)
            .vnodes(3)
            .seed(seed)
            .store(store.clone())
            .kills(kills)
            .build()
            .unwrap()
            .run(Fib(13), ())
            .unwrap();
        assert_eq!(r.outputs.0, fib(13));
        for log in LogReader::new(store.clone()).read_all().unwrap() {
            let events: Vec<_> = log.events.iter().map(|e| e.event.clone()).collect();
            let mut raw = LogState::default();
            for e in &events {
                raw.fold(e.clone());
            }
            let mut whole = raw.clone();
            whole.compact();
            let live = |s: &LogState| {
                let mut l: Vec<_> = s
                    .tasks
                    .values()
                    .filter(|t| t.live())
                    .map(|t| t.record.task)
                    .collect();
                l.sort();
                l
            };
            assert_eq!(live(&raw), live(&whole), "seed {seed} {}", log.vnode);
            assert_eq!(raw.completed, whole.completed);
            assert!(whole.size() <= raw.size());
            let n = events.len();
            for cut in [0, n / 5, n / 2, n - n / 5, n] {
                let mut part = LogState::default();
                for e in &events[..cut] {
                    part.fold(e.clone());
                }
                part.compact();
                let ck = Checkpoint {
                    vnode: log.vnode,
                    upto: LastSegment {
                        segno: 0,
                        end_seq: cut as u64,
                    },
                    segments: 1,
                    state: part,
                };
                let mut part = Checkpoint::decode(log.vnode, &ck.encode().unwrap())
                    .unwrap()
                    .state;
                for e in &events[cut..] {
                    part.fold(e.clone());
                }
                part.compact();
                assert_eq!(part, whole, "seed {seed} {} cut {cut} of {n}", log.vnode);
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 6 * 3 * 5);
}

/// `Relay(n)` hands its output down a chain of `n` more tasks (delegation, as CG's steps hand
/// down the terminal output); the last one writes 42.
#[derive(Serialize, Deserialize)]
struct Relay(u32);

impl Task for Relay {
    const NAME: &'static str = "relay";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        if self.0 == 0 {
            ctx.write(out, 42);
        } else {
            ctx.spawn_delegate(Relay(self.0 - 1), (), (out,));
        }
        Ok(())
    }
}

/// recover.rs rule 4, the hang of CG's `killed_vnodes_recover_to_the_same_bits` (issue 14.5),
/// driven exactly: the root `Relay(2)` (terminal output O) was stolen from v0 by v1; v1 ran it,
/// and v0 stole back its chain task S1, which also writes O; S1 ran on v0 and declared S2
/// (writes O too), which v0 then gave to v1 again: `Stolen(S2, v1)` is v0's last durable event
/// and v0 failed before v1 saw the grant (v1's log has no `Adopted(S2)`). Both vnodes are
/// rebuilt from these logs. v0 expects O from v1 once for two stolen tasks (the root and S2);
/// its rebuilt incarnation must still send S2's grant again, else nobody runs S2: v0 waits for
/// O from v1 and v1 waits for O from v0 (for S1) forever. Here the stall deadline turns that
/// hang into an error.
#[test]
fn a_grant_to_a_thief_already_owing_the_same_value_is_sent_again_after_recovery() {
    use std::borrow::Cow;
    use std::time::Duration;

    use crate::log::{CommitPolicy, Declared, Event, LogWriter};
    use crate::{DataId, TaskId, VnodeId};

    let store = Arc::new(MemoryStore::default());
    let rt = Runtime::builder(Registry::new().with::<Relay>().unwrap())
        .program("relay")
        .threads(2)
        .vnodes(2)
        .store(store.clone())
        .stall(crate::Stall {
            after: Duration::from_secs(2),
            fail: true,
        })
        .build()
        .unwrap();
    let (setup, manifest) = rt.prepare(Relay(2), ()).unwrap();
    manifest.store_new(&*store).unwrap();

    let root = setup.id;
    let s1 = TaskId::child(root, 0);
    let s2 = TaskId::child(s1, 0);
    let o = DataId::output(root, 0);
    assert_eq!(setup.terminal, vec![o]);
    let record = |task, parent, n: u32| Declared {
        task,
        parent,
        index: 0,
        name: Cow::Borrowed(Relay::NAME),
        args: crate::codec::encode(&Relay(n)).unwrap().into(),
        inputs: vec![],
        outputs: vec![o],
    };
    let (v0, v1) = (VnodeId(0), VnodeId(1));
    let logs = [
        (
            v0,
            vec![
                Event::Declared(record(root, None, 2)),
                Event::Stolen {
                    task: root,
                    thief: v1,
                },
                Event::Adopted {
                    victim: v1,
                    record: record(s1, Some(root), 1),
                    inputs: vec![],
                },
                Event::Started {
                    task: s1,
                    inputs: vec![],
                },
                Event::Declared(record(s2, Some(s1), 0)),
                Event::Completed {
                    task: s1,
                    outputs: vec![],
                    children: vec![s2],
                },
                Event::Stolen {
                    task: s2,
                    thief: v1,
                },
            ],
        ),
        (
            v1,
            vec![
                Event::Adopted {
                    victim: v0,
                    record: record(root, None, 2),
                    inputs: vec![],
                },
                Event::Started {
                    task: root,
                    inputs: vec![],
                },
                Event::Declared(record(s1, Some(root), 1)),
                Event::Completed {
                    task: root,
                    outputs: vec![],
                    children: vec![s1],
                },
                Event::Stolen {
                    task: s1,
                    thief: v0,
                },
            ],
        ),
    ];
    let writer = LogWriter::start(store.clone(), 2, CommitPolicy::default()).unwrap();
    for (v, events) in &logs {
        let mut log = writer.vnode_log(*v).unwrap();
        log.forget_recovery();
        for e in events {
            log.append(e).unwrap();
        }
        log.sync().unwrap();
    }
    writer.shutdown().unwrap();

    let r = rt
        .resume(Relay(2), ())
        .unwrap_or_else(|e| panic!("the grant of S2 must reach v1 again: {e}"));
    assert_eq!(r.outputs.0, 42);
    // S2 is the one task left to run, and v1 adopted it.
    assert_eq!(r.tasks, 3);
    let adopted_s2 = LogReader::new(store)
        .read_vnode(v1)
        .unwrap()
        .events
        .iter()
        .any(|e| matches!(&e.event, Event::Adopted { record, .. } if record.task == s2));
    assert!(adopted_s2, "v1 adopted S2 from the grant sent again");
}

/// `Fib`, except that the first task of argument [`STOP_AT_ARG`] stops the run's token (rule 7
/// of `exec/mod.rs`): a Ctrl-C at a known point.
#[derive(Serialize, Deserialize)]
struct StoppingFib(u32);

const STOP_AT_ARG: u32 = 9;
static STOP_TOKEN: std::sync::Mutex<Option<crate::StopToken>> = std::sync::Mutex::new(None);

impl Task for StoppingFib {
    const NAME: &'static str = "stopping-fib";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        if self.0 == STOP_AT_ARG {
            if let Some(t) = STOP_TOKEN.lock().unwrap().take() {
                t.stop();
            }
        }
        if self.0 < 2 {
            ctx.write(out, u64::from(self.0));
        } else {
            let (a,) = ctx.spawn(StoppingFib(self.0 - 1), ());
            let (b,) = ctx.spawn(StoppingFib(self.0 - 2), ());
            ctx.spawn_delegate(Add, (a, b), (out,));
        }
        Ok(())
    }
}

/// Rule 7 of `exec/mod.rs` (issue 18 point 4): a run whose token is stopped part way returns
/// `Interrupted`, its manifest says so, and every event it logged is durable; `resume`
/// finishes it with each task completed once and the result of an uninterrupted run.
#[test]
fn a_run_stopped_by_its_token_is_durable_and_resumes_to_the_same_result() {
    use crate::log::{Manifest, RunStatus};
    let registry = || {
        Registry::new()
            .with::<StoppingFib>()
            .unwrap()
            .with::<Add>()
            .unwrap()
    };
    let n = 20;
    for vnodes in [1, 3] {
        let store = Arc::new(MemoryStore::default());
        let token = crate::StopToken::new();
        *STOP_TOKEN.lock().unwrap() = Some(token.clone());
        let rt = |token: Option<crate::StopToken>| {
            let mut b = Runtime::builder(registry())
                .program("stopping")
                .threads(2)
                .vnodes(vnodes)
                .seed(3)
                .store(store.clone());
            if let Some(t) = token {
                b = b.stop_token(t);
            }
            b.build().unwrap()
        };
        let e = rt(Some(token.clone()))
            .run(StoppingFib(n), ())
            .expect_err("the run was stopped");
        let crate::RunError::Interrupted { completed } = e else {
            panic!("vnodes {vnodes}: expected Interrupted, got {e}");
        };
        assert!(token.is_stopped());
        assert!(
            completed > 0 && completed < fib_tasks(n),
            "vnodes {vnodes}: stopped part way ({completed} tasks)"
        );
        let manifest = Manifest::load(&*store).unwrap().unwrap();
        assert_eq!(manifest.status, RunStatus::Interrupted, "vnodes {vnodes}");
        // Durable: every vnode's watermark covers what it logged (nothing torn, no gap).
        let logs = LogReader::new(store.clone()).read_all().unwrap();
        let completed_logged = logs
            .iter()
            .flat_map(|v| &v.events)
            .filter(|e| e.event.kind() == EventKind::Completed)
            .count() as u64;
        assert_eq!(completed_logged, completed, "vnodes {vnodes}");
        for v in &logs {
            assert!(v.torn.is_none(), "vnodes {vnodes}: {} torn", v.vnode);
        }

        // The same token stopped already does not hold a resumed run: a fresh one finishes it.
        let r = rt(None).resume(StoppingFib(n), ()).unwrap();
        assert_eq!(r.outputs.0, fib(n), "vnodes {vnodes}");
        assert_eq!(r.tasks, fib_tasks(n), "vnodes {vnodes}");
        let reused: u64 = r.vnodes.iter().map(|s| s.reused_tasks).sum();
        assert_eq!(
            reused, completed,
            "vnodes {vnodes}: completed tasks are not run again"
        );
        assert_each_task_logged_once(&store, fib_tasks(n), &format!("vnodes {vnodes}"));
        let manifest = Manifest::load(&*store).unwrap().unwrap();
        assert_eq!(manifest.status, RunStatus::Finished, "vnodes {vnodes}");
    }
}

/// Rule 2 of `vnode.rs` (issue 16): a process's idle vnodes back off in proportion to the
/// vnodes it runs per thread, up to the cap.
#[test]
fn the_steal_back_off_grows_with_the_vnodes_per_thread() {
    let t = crate::Timers::default();
    assert_eq!(t.per_thread(2, 2), t);
    assert_eq!(t.per_thread(0, 0), t);
    assert_eq!(
        t.per_thread(16, 1).steal_backoff_max,
        t.steal_backoff_max * 16
    );
    assert_eq!(
        t.per_thread(17, 2).steal_backoff_max,
        t.steal_backoff_max * 9
    );
    assert_eq!(
        t.per_thread(1000, 1).steal_backoff_max,
        t.steal_backoff_max * crate::exec::STEAL_BACKOFF_SCALE_MAX
    );
    assert_eq!(t.per_thread(1000, 1).steal_timeout, t.steal_timeout);
}

/// Rule 1 of `exec/mod.rs` and rule 2 of `vnode.rs` (issue 16): on one thread, the idle
/// vnodes do not steal while vnode 0 has a ready task: a stolen task would only wait for the
/// same thread. Before, they did (and sent a request every 2 ms each all run long).
#[test]
fn vnodes_of_a_busy_thread_do_not_steal() {
    for seed in 0..3 {
        let rt = Runtime::builder(fib_registry())
            .threads(1)
            .vnodes(8)
            .seed(seed)
            .build()
            .unwrap();
        let r = rt.run(Fib(16), ()).unwrap();
        assert_eq!(r.outputs.0, fib(16));
        let adopted: u64 = r.vnodes.iter().map(|s| s.adopted).sum();
        assert_eq!(adopted, 0, "seed {seed}: {:?}", r.vnodes);
    }
}

/// Steal requests sent through [`count_requests`] (only the test below uses it).
static REQUESTS_SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// What each [`Peek`] saw of [`REQUESTS_SENT`] when it started, in the order they ran.
static PEEKED: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// [`Filtered`]: counts the steal requests in [`REQUESTS_SENT`], loses nothing.
fn count_requests(msg: &crate::transport::Message) -> bool {
    if matches!(msg, crate::transport::Message::StealRequest) {
        REQUESTS_SENT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    true
}

/// Notes how many steal requests were sent when it started.
#[derive(Serialize, Deserialize)]
struct Peek;

impl Task for Peek {
    const NAME: &'static str = "peek";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        let seen = REQUESTS_SENT.load(std::sync::atomic::Ordering::SeqCst);
        PEEKED.lock().unwrap().push(seen);
        ctx.write(out, seen);
        Ok(())
    }
}

/// Spawns two [`Peek`]s and adds what they saw.
#[derive(Serialize, Deserialize)]
struct TwoPeeks;

impl Task for TwoPeeks {
    const NAME: &'static str = "two-peeks";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        let (a,) = ctx.spawn(Peek, ());
        let (b,) = ctx.spawn(Peek, ());
        ctx.spawn_delegate(Add, (a, b), (out,));
        Ok(())
    }
}

/// Rule 2 of `vnode.rs`: a vnode asks for work *before* it runs its last ready task, so the
/// answer travels while that task runs; while another task is ready it does not ask. Stepped
/// one task at a time on one member hosting vnode 0 of 2 (vnode 1 hosted nowhere: nothing
/// answers), on a manual clock: the root, alone, is asked ahead of (1 request); past the
/// request's timeout the root's two peeks run, the newest first, which sees no new request
/// (the other is still ready), then the last ready one, which sees the one sent just before it
/// (2). Before, a vnode asked only once idle, and both peeks saw 0.
#[test]
fn a_vnode_asks_for_work_before_its_last_ready_task() {
    let registry = Registry::new()
        .with::<TwoPeeks>()
        .unwrap()
        .with::<Peek>()
        .unwrap()
        .with::<Add>()
        .unwrap();
    let clock = Arc::new(crate::clock::ManualClock::default());
    let rt = Arc::new(
        Runtime::builder(registry)
            .threads(1)
            .vnodes(2)
            .checkpoint(false)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let transport = Arc::new(Filtered(
        crate::transport::InProcTransport::new(2),
        count_requests,
    ));
    let mut member = rt
        .stepped_member(
            TwoPeeks,
            (),
            &[(crate::VnodeId(0), crate::Epoch(0))],
            true,
            transport,
        )
        .unwrap();
    member.step(1).unwrap(); // the root
    assert_eq!(REQUESTS_SENT.load(std::sync::atomic::Ordering::SeqCst), 1);
    clock.advance(crate::Timers::default().steal_timeout * 2);
    member.step(1).unwrap(); // the newest peek
    member.step(1).unwrap(); // the last ready one
    assert_eq!(*PEEKED.lock().unwrap(), vec![1, 2]);
    assert_eq!(REQUESTS_SENT.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A value that refuses to be encoded: only a wire or a log would need its bytes.
#[derive(Clone, Debug, PartialEq)]
struct InProcessOnly(u64);

impl Serialize for InProcessOnly {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("InProcessOnly is never encoded"))
    }
}

impl<'de> Deserialize<'de> for InProcessOnly {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u64::deserialize(d).map(InProcessOnly)
    }
}

/// Fib over [`InProcessOnly`] values: every input a thief takes and every output it returns
/// is one.
#[derive(Serialize, Deserialize)]
struct OpaqueFib(u32);

impl Task for OpaqueFib {
    const NAME: &'static str = "opaque-fib";
    type Inputs = ();
    type Outputs = (InProcessOnly,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        if self.0 < 2 {
            ctx.write(out, InProcessOnly(u64::from(self.0)));
        } else {
            let (a,) = ctx.spawn(OpaqueFib(self.0 - 1), ());
            let (b,) = ctx.spawn(OpaqueFib(self.0 - 2), ());
            ctx.spawn_delegate(OpaqueAdd, (a, b), (out,));
        }
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct OpaqueAdd;

impl Task for OpaqueAdd {
    const NAME: &'static str = "opaque-add";
    type Inputs = (InProcessOnly, InProcessOnly);
    type Outputs = (InProcessOnly,);
    fn run(
        self,
        ctx: &mut Ctx<'_>,
        (a, b): (InProcessOnly, InProcessOnly),
        (out,): Writes<Self>,
    ) -> TaskResult {
        ctx.write(out, InProcessOnly(a.0 + b.0));
        Ok(())
    }
}

/// `task/value.rs`: without a log, values move between the vnodes of one process typed, in
/// steal grants and in returns, and are never encoded (they used to be encoded, copied and
/// decoded at every steal). With a log, the same program fails naming the value it could not
/// encode, so the first half is not vacuous.
#[test]
fn values_between_vnodes_of_one_process_are_never_encoded_without_a_log() {
    let registry = || {
        Registry::new()
            .with::<OpaqueFib>()
            .unwrap()
            .with::<OpaqueAdd>()
            .unwrap()
    };
    let mut stolen = 0;
    for seed in 0..4 {
        let rt = Runtime::builder(registry())
            .threads(2)
            .vnodes(4)
            .seed(seed)
            .build()
            .unwrap();
        let r = rt.run(OpaqueFib(14), ()).unwrap();
        assert_eq!(r.outputs.0, InProcessOnly(fib(14)), "seed {seed}");
        stolen += r.vnodes.iter().map(|s| s.stolen).sum::<u64>();
    }
    assert!(stolen > 0, "some tasks moved between vnodes");
    let rt = Runtime::builder(registry())
        .threads(2)
        .vnodes(4)
        .store(Arc::new(MemoryStore::default()))
        .build()
        .unwrap();
    let e = rt.run(OpaqueFib(14), ()).unwrap_err().to_string();
    assert!(e.contains("cannot encode output"), "{e}");
}

/// Core rule 7: a task spec is its id and a pointer to one block holding the declaration and
/// the body; the record it gives is the declaration as spawned, its arguments survive a run
/// only as an error, and the body runs once (a second run is an error, not a second run).
#[test]
fn a_task_spec_holds_its_declaration_in_one_block_and_its_body_runs_once() {
    use crate::exec::core::TaskSpec;
    use crate::ids::{DataId, TaskId};
    use crate::log::Payload;
    use crate::replay::Replayer;
    use crate::task::{Boxed, Host};

    assert!(std::mem::size_of::<TaskSpec>() <= 32);
    let registry = fib_registry();
    let (id, parent, out) = (TaskId(7), TaskId(3), DataId(9));
    let mut spec = TaskSpec::new(
        id,
        Some(parent),
        4,
        Boxed::new(Fib(1)),
        [].into_iter().collect(),
        [out].into_iter().collect(),
        None,
    );
    let args = spec.take_args().unwrap();
    assert_eq!(args, crate::codec::encode(&Fib(1)).unwrap());
    let record = spec.record(args.clone());
    assert_eq!(
        (record.task, record.parent, record.index, &*record.name),
        (id, Some(parent), 4, "fib")
    );
    assert_eq!((record.inputs, record.outputs), (vec![], vec![out]));
    assert_eq!(record.args, Payload::Inline(args));

    let mut replayer = Replayer::default();
    let outputs = [out];
    let mut ctx = Ctx::new(Host::Replay(&registry, &mut replayer), id, "fib", &outputs);
    spec.decl.body.run(&mut ctx, Vec::new()).unwrap();
    assert_eq!(ctx.writes.len(), 1);
    let again = spec.decl.body.run(&mut ctx, Vec::new());
    assert!(
        matches!(again, Err(crate::RunError::TaskFailed { .. })),
        "{again:?}"
    );
    assert!(spec.take_args().is_err());
}

/// A memory store whose every batch takes [`SLOW_BATCH`]: a log's durable waits are that long.
#[derive(Default)]
struct SlowStore(MemoryStore);

/// How long a batch of [`SlowStore`] takes: far above a [`Leaf`]'s run.
const SLOW_BATCH: std::time::Duration = std::time::Duration::from_millis(20);

impl veriflow_checkpoint::Store for SlowStore {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), veriflow_checkpoint::StoreError> {
        self.0.put(key, value)
    }
    fn put_batch(
        &self,
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), veriflow_checkpoint::StoreError> {
        std::thread::sleep(SLOW_BATCH);
        self.0.put_batch(pairs)
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, veriflow_checkpoint::StoreError> {
        self.0.get(key)
    }
    fn scan_prefix(
        &self,
        prefix: &[u8],
    ) -> Result<veriflow_checkpoint::Pairs, veriflow_checkpoint::StoreError> {
        self.0.scan_prefix(prefix)
    }
    fn delete(&self, key: &[u8]) -> Result<(), veriflow_checkpoint::StoreError> {
        self.0.delete(key)
    }
    fn flush(&self) -> Result<(), veriflow_checkpoint::StoreError> {
        self.0.flush()
    }
    fn describe(&self) -> String {
        "slow".to_string()
    }
}

/// A short task that spawns nothing: its own number, after a millisecond.
#[derive(Serialize, Deserialize)]
struct Leaf(u64);

impl Task for Leaf {
    const NAME: &'static str = "leaf";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        std::thread::sleep(std::time::Duration::from_millis(1));
        ctx.write(out, self.0);
        Ok(())
    }
}

/// Rounds left, and the sum so far: spawns three [`Leaf`]s and the next round, which reads
/// them (a barrier per round, like an iteration of CG).
#[derive(Serialize, Deserialize)]
struct Rounds(u32);

impl Task for Rounds {
    const NAME: &'static str = "rounds";
    type Inputs = Vec<u64>;
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, sums: Vec<u64>, (out,): Writes<Self>) -> TaskResult {
        let so_far: u64 = sums.iter().sum();
        if self.0 == 0 {
            ctx.write(out, so_far);
            return Ok(());
        }
        let mut reads = Vec::new();
        for i in 0..3 {
            reads.push(ctx.spawn(Leaf(u64::from(self.0) * 10 + i), ()).0);
        }
        let (total,) = ctx.spawn(Const(so_far), ());
        reads.push(total);
        ctx.spawn_delegate(Rounds(self.0 - 1), reads, (out,));
        Ok(())
    }
}

/// Writes its number.
#[derive(Serialize, Deserialize)]
struct Const(u64);

impl Task for Const {
    const NAME: &'static str = "const";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, self.0);
        Ok(())
    }
}

/// Rule 3 of `vnode.rs` and `worth.rs` rule 2: with a log whose durable waits (20 ms) are far
/// longer than a round's ready work (three 1 ms leaves), a victim keeps its leaves once it has
/// measured both, so at most the few leaves given before that move (each vnode learns on its
/// own); before, a thief asking ahead took about one leaf a round, each round then waiting for
/// two durable waits. The result, and each task logged once, are unchanged; without a log every
/// task stays worth moving (the fib tests above).
#[test]
fn a_logged_victim_keeps_leaves_shorter_than_a_move() {
    let rounds = 20;
    let store = Arc::new(SlowStore::default());
    let registry = Registry::new()
        .with::<Rounds>()
        .unwrap()
        .with::<Leaf>()
        .unwrap()
        .with::<Const>()
        .unwrap();
    let rt = Runtime::builder(registry)
        .threads(2)
        .vnodes(2)
        .store(store.clone())
        .build()
        .unwrap();
    let r = rt.run(Rounds(rounds), Vec::new()).unwrap();
    let want: u64 = (1..=u64::from(rounds)).map(|k| 3 * k * 10 + 3).sum();
    assert_eq!(r.outputs.0, want);
    let all = LogReader::new(store).read_all().unwrap();
    let moved_leaves = all
        .iter()
        .flat_map(|v| &v.events)
        .filter(|e| matches!(&e.event, crate::log::Event::Adopted { record, .. } if record.name == "leaf"))
        .count();
    assert!(
        moved_leaves <= 4,
        "{moved_leaves} leaves moved in {rounds} rounds"
    );
}

/// `vnode.rs` rule 7: a member's work words say "no work" only once its log is durable, so a
/// coordinator that sees them quiescent (two equal scans, all zero) and then loses the member
/// finds the terminal outputs in the logs. On a store whose batches take 20 ms, the root's
/// completion used to sit in the open batch while the words were already zero.
#[test]
fn a_members_work_words_are_quiescent_only_once_its_log_is_durable() {
    use crate::exec::{Control, Member, MemberStatus};
    use crate::transport::{InProcTransport, Transport};
    let store = Arc::new(SlowStore::default());
    let registry = Registry::new()
        .with::<Fib>()
        .unwrap()
        .with::<Add>()
        .unwrap();
    let rt = Runtime::builder(registry)
        .threads(1)
        .vnodes(1)
        .store(store.clone())
        .build()
        .unwrap();
    let (control, orders) = std::sync::mpsc::channel();
    let status = MemberStatus::new();
    let member = Member {
        transport: Arc::new(InProcTransport::new(1)) as Arc<dyn Transport>,
        hosted: vec![(crate::VnodeId(0), crate::Epoch(0))],
        starts: true,
        control: orders,
        status: status.clone(),
    };
    let run = std::thread::spawn(move || rt.run_member(Fib(10), (), member));
    let idle = |words: &[(crate::VnodeId, u64)]| {
        words.iter().all(|&(_, w)| crate::exec::work_units(w) == 0)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        assert!(std::time::Instant::now() < deadline, "never quiescent");
        let first = status.work();
        std::thread::sleep(std::time::Duration::from_millis(1));
        if let (Some(a), Some(b)) = (first, status.work()) {
            if idle(&a) && a == b {
                break;
            }
        }
    }
    let outputs = crate::log::terminal_outputs(&LogReader::latest(store).unwrap()).unwrap();
    control.send(Control::Stop).unwrap();
    let report = run.join().unwrap().unwrap();
    assert_eq!(
        outputs, report.outputs,
        "the terminal outputs are in the log when the words say the run is over"
    );
}

/// Core rule 8: a completion does not lower the shared work word at once; a raise that follows
/// it in the same step takes its unit back and leaves the word exactly as it was (not even its
/// change count moves), and `publish_work`, which ends every step, lowers what is left. The
/// word is never below the live count on the way.
#[test]
fn a_completion_lowers_the_work_word_late_and_a_raise_takes_it_back() {
    use super::core::{Core, TaskSpec};
    use super::shared::{work_units, RunShared};
    use crate::ids::{DataId, TaskId, VnodeId};
    use crate::task::value::Value;
    use crate::task::Boxed;

    let v = VnodeId(0);
    let shared = Arc::new(RunShared::new(1, None));
    let mut core = Core::new(v, Arc::new(fib_registry()), None, shared.clone());
    let leaf = |id: u128, out: DataId| {
        TaskSpec::new(
            TaskId(id),
            None,
            0,
            Boxed::new(Fib(0)),
            [].into_iter().collect(),
            [out].into_iter().collect(),
            None,
        )
    };
    let (a, b) = (DataId(1), DataId(2));
    core.pin(a);
    core.declare(leaf(1, a)).unwrap();
    let one_live = shared.work_word(v);
    assert_eq!(work_units(one_live), 1);
    let _ran = core.pop_ready().unwrap();
    let wrote = [(0, Value::typed(0u64))].into_iter().collect();
    core.complete(TaskId(1), "fib", &[a], wrote, Vec::new(), &[])
        .unwrap();
    assert_eq!(
        shared.work_word(v),
        one_live,
        "the completion's unit is deferred"
    );
    core.pin(b);
    core.declare(leaf(2, b)).unwrap();
    assert_eq!(
        shared.work_word(v),
        one_live,
        "a raise took the deferred unit back: the word did not change"
    );
    let _ran = core.pop_ready().unwrap();
    let wrote = [(0, Value::typed(0u64))].into_iter().collect();
    core.complete(TaskId(2), "fib", &[b], wrote, Vec::new(), &[])
        .unwrap();
    assert_eq!(
        work_units(shared.work_word(v)),
        1,
        "never below the live count"
    );
    core.publish_work();
    let after = shared.work_word(v);
    assert_eq!(work_units(after), 0, "exact once published");
    assert_ne!(after >> 32, one_live >> 32, "the lower counts as a change");
    assert!(shared.quiescent());
}

/// Core rule 3: outside a recovery a spawn creates its outputs closed and its task keeps no
/// list of them, so an output written and read by its last reader is dropped at once; after a
/// recovery (`known` not empty) they are held open until the scope that created them ends.
#[test]
fn a_spawn_creates_its_outputs_closed_except_after_a_recovery() {
    use super::core::Core;
    use super::shared::RunShared;
    use crate::ids::{DataId, TaskId, VnodeId};
    use crate::task::value::Value;

    let shared = Arc::new(RunShared::new(1, None));
    let mut core = Core::new(VnodeId(0), Arc::new(fib_registry()), None, shared);
    let d = DataId(5);
    assert!(!core.create_data(d), "no scope to close it");
    core.write(d, Value::typed(1u64), None, None, 0).unwrap();
    assert!(
        core.value(d).is_none(),
        "written, no reader, closed: dropped"
    );

    core.known.insert(TaskId(1));
    let d = DataId(6);
    assert!(core.create_data(d), "after a recovery its scope closes it");
    core.write(d, Value::typed(1u64), None, None, 0).unwrap();
    assert!(core.value(d).is_some(), "held open while its scope runs");
    core.close(&[d]);
    assert!(core.value(d).is_none(), "dropped once its scope ended");
}

/// Set by the test acting as vnode 1 once it has received a grant.
static GRANT_RECEIVED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// [`Slow`] tasks started.
static SLOW_STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// What a checking [`Slow`] saw: whether the grant came while it ran.
static SAW_GRANT: std::sync::Mutex<Option<bool>> = std::sync::Mutex::new(None);

/// Sleeps `sleep_ms`; a checking one first waits (up to 10 s) for [`GRANT_RECEIVED`].
#[derive(Serialize, Deserialize)]
struct Slow {
    sleep_ms: u64,
    check: bool,
}

impl Task for Slow {
    const NAME: &'static str = "slow";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        use std::sync::atomic::Ordering::SeqCst;
        SLOW_STARTED.fetch_add(1, SeqCst);
        if self.check {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !GRANT_RECEIVED.load(SeqCst) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            *SAW_GRANT.lock().unwrap() = Some(GRANT_RECEIVED.load(SeqCst));
        }
        std::thread::sleep(std::time::Duration::from_millis(self.sleep_ms));
        ctx.write(out, self.sleep_ms);
        Ok(())
    }
}

/// Spawns a [`Const`] (the oldest ready task: what a thief gets), a checking [`Slow`], and a
/// 300 ms [`Slow`] (the newest: run first).
#[derive(Serialize, Deserialize)]
struct Fork;

impl Task for Fork {
    const NAME: &'static str = "fork";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        let (c,) = ctx.spawn(Const(1), ());
        let (checks,) = ctx.spawn(
            Slow {
                sleep_ms: 0,
                check: true,
            },
            (),
        );
        let (first,) = ctx.spawn(
            Slow {
                sleep_ms: 300,
                check: false,
            },
            (),
        );
        let (both,) = ctx.spawn(Add, (c, checks));
        ctx.spawn_delegate(Add, (both, first), (out,));
        Ok(())
    }
}

/// `vnode.rs` rule 6 and `worth.rs` rule 4: a victim that grants a task while its next task is
/// of a kind that took 300 ms waits for the grant's flush first, so the grant leaves before
/// that task runs, not after it. Vnode 0 runs alone in a member with a log (a thread's writer
/// on a memory store); the test is vnode 1: once the 300 ms task runs it asks for work, and the
/// next task of that kind waits (up to 10 s) for the grant to reach the test. Before, the grant
/// left only after that task, which then waited its 10 s in vain.
#[test]
fn a_grant_leaves_before_a_long_next_task_not_after_it() {
    use crate::exec::{Control, Member, MemberStatus};
    use crate::transport::{InProcTransport, Message, Transport};
    use std::sync::atomic::Ordering::SeqCst;
    let registry = Registry::new()
        .with::<Fork>()
        .unwrap()
        .with::<Slow>()
        .unwrap()
        .with::<Const>()
        .unwrap()
        .with::<Add>()
        .unwrap();
    let rt = Runtime::builder(registry)
        .threads(1)
        .vnodes(2)
        .store(Arc::new(MemoryStore::default()))
        .build()
        .unwrap();
    let transport = Arc::new(InProcTransport::new(2));
    let mut thief = transport.endpoint(crate::VnodeId(1)).unwrap();
    let (control, orders) = std::sync::mpsc::channel();
    let member = Member {
        transport: transport as Arc<dyn Transport>,
        hosted: vec![(crate::VnodeId(0), crate::Epoch(0))],
        starts: true,
        control: orders,
        status: MemberStatus::new(),
    };
    let run = std::thread::spawn(move || rt.run_member(Fork, (), member));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while SLOW_STARTED.load(SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first task never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    thief
        .send(crate::VnodeId(0), Message::StealRequest)
        .unwrap();
    while SAW_GRANT.lock().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the checking task never ran"
        );
        if let Some(env) = thief.recv_timeout(std::time::Duration::from_millis(1)) {
            if matches!(env.msg, Message::StealGrant { .. }) {
                GRANT_RECEIVED.store(true, SeqCst);
            }
        }
    }
    control.send(Control::Stop).unwrap();
    let _ = run.join().unwrap();
    assert_eq!(*SAW_GRANT.lock().unwrap(), Some(true));
}

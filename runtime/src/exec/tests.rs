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
    use rand::{Rng, SeedableRng};
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
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let (vnodes, kills) = match named.get(seed as usize) {
            Some((v, kills)) => (*v, kills.clone()),
            None => {
                let vnodes = [2u32, 3, 4][(seed % 3) as usize];
                let kills = (0..1 + seed % 3)
                    .map(|_| {
                        let after = if seed % 7 == 0 {
                            0
                        } else {
                            rng.gen_range(0..total)
                        };
                        k(rng.gen_range(0..vnodes), after)
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

/// A transport that loses every `Returned` message: a stolen task's output never comes home.
struct NoReturns(crate::transport::InProcTransport);

struct NoReturnsEndpoint(Box<dyn crate::transport::Endpoint>);

impl crate::transport::Transport for NoReturns {
    fn endpoint(
        &self,
        me: crate::VnodeId,
    ) -> Result<Box<dyn crate::transport::Endpoint>, crate::transport::TransportError> {
        Ok(Box::new(NoReturnsEndpoint(self.0.endpoint(me)?)))
    }
}

impl crate::transport::Endpoint for NoReturnsEndpoint {
    fn send(
        &mut self,
        to: crate::VnodeId,
        msg: crate::transport::Message,
    ) -> Result<(), crate::transport::TransportError> {
        if matches!(msg, crate::transport::Message::Returned { .. }) {
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
            Box::new(NoReturns(crate::transport::InProcTransport::new(v)))
        }))
        .stall(crate::Stall {
            after: std::time::Duration::from_millis(300),
            fail: true,
        })
        .build()
        .unwrap()
        .run(Fib(18), ())
}

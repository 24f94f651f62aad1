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
                let all = LogReader::new(store).read_all().unwrap();
                let mut per_task = std::collections::HashMap::new();
                for e in all.iter().flat_map(|v| &v.events) {
                    let k = e.event.key();
                    if matches!(
                        k.1,
                        EventKind::Declared | EventKind::Started | EventKind::Completed
                    ) {
                        *per_task.entry(k).or_insert(0) += 1;
                    }
                }
                assert_eq!(per_task.len() as u64, 3 * r.tasks, "{ctx}");
                assert!(per_task.values().all(|&n| n == 1), "{ctx}");
            }
        }
    }
    assert!(
        lost_total > 20,
        "the transport must actually lose messages ({lost_total})"
    );
}

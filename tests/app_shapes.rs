//! Graph shapes knary does not have: a root with several typed program inputs and several
//! terminal outputs (one written, one delegated to a chain, one delegated to a likely stolen
//! child), fire-and-forget children with no outputs, a task reading the same data object twice,
//! a root with no output at all, and a long delegation chain. Each checked on 1, 2 and 4 vnodes,
//! with the log read back through the facade's `inspect`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use veriflow::{
    inspect, Ctx, Event, LogReader, MemoryStore, Registry, RunStatus, Runtime, Store, Task,
    TaskResult, Writes,
};

fn spin(us: u64) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_micros(us) {
        std::hint::spin_loop();
    }
}

/// Root: inputs (x, s), outputs (3x + 1 via a child and a delegate, "s-n" written here,
/// [n; 3] by a delegate), plus `effects` fire-and-forget children.
#[derive(Serialize, Deserialize)]
struct Multi {
    n: u8,
    effects: u32,
}

impl Task for Multi {
    const NAME: &'static str = "shape.multi";
    type Inputs = (u64, String);
    type Outputs = (u64, String, Vec<u8>);
    fn run(self, ctx: &mut Ctx<'_>, (x, s): (u64, String), (a, b, c): Writes<Self>) -> TaskResult {
        let (k,) = ctx.spawn(Triple(x), ());
        ctx.spawn_delegate(Incr, (k,), (a,));
        ctx.write(b, format!("{s}-{}", self.n));
        ctx.spawn_delegate(Bytes(self.n), (), (c,));
        for i in 0..self.effects {
            ctx.spawn(Effect(i), ());
        }
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct Triple(u64);

impl Task for Triple {
    const NAME: &'static str = "shape.triple";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (o,): Writes<Self>) -> TaskResult {
        ctx.write(o, self.0 * 3);
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct Incr;

impl Task for Incr {
    const NAME: &'static str = "shape.incr";
    type Inputs = (u64,);
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (x,): (u64,), (o,): Writes<Self>) -> TaskResult {
        ctx.write(o, x + 1);
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct Bytes(u8);

impl Task for Bytes {
    const NAME: &'static str = "shape.bytes";
    type Inputs = ();
    type Outputs = (Vec<u8>,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (o,): Writes<Self>) -> TaskResult {
        spin(300); // long enough for an idle vnode to steal it
        ctx.write(o, vec![self.0; 3]);
        Ok(())
    }
}

/// No outputs: runs for its effect (here: nothing but time) and spawns more of itself.
#[derive(Serialize, Deserialize)]
struct Effect(u32);

impl Task for Effect {
    const NAME: &'static str = "shape.effect";
    type Inputs = ();
    type Outputs = ();
    fn run(self, ctx: &mut Ctx<'_>, (): (), (): Writes<Self>) -> TaskResult {
        spin(50);
        if self.0.is_multiple_of(10) {
            ctx.spawn(Effect(self.0 + 1), ());
        }
        Ok(())
    }
}

/// A root with no outputs at all.
#[derive(Serialize, Deserialize)]
struct Nothing(u32);

impl Task for Nothing {
    const NAME: &'static str = "shape.nothing";
    type Inputs = ();
    type Outputs = ();
    fn run(self, ctx: &mut Ctx<'_>, (): (), (): Writes<Self>) -> TaskResult {
        for i in 0..self.0 {
            ctx.spawn(Effect(i), ());
        }
        Ok(())
    }
}

/// Reads one data object twice.
#[derive(Serialize, Deserialize)]
struct Twice(u64);

impl Task for Twice {
    const NAME: &'static str = "shape.twice";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (o,): Writes<Self>) -> TaskResult {
        let (k,) = ctx.spawn(Triple(self.0), ());
        ctx.spawn_delegate(Pair, (k, k), (o,));
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct Pair;

impl Task for Pair {
    const NAME: &'static str = "shape.pair";
    type Inputs = (u64, u64);
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (a, b): (u64, u64), (o,): Writes<Self>) -> TaskResult {
        ctx.write(o, a * 1000 + b);
        Ok(())
    }
}

/// Delegates its output down a chain of `left` more tasks; the last one writes `total`.
#[derive(Serialize, Deserialize)]
struct Chain {
    left: u32,
    total: u32,
}

impl Task for Chain {
    const NAME: &'static str = "shape.chain";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (o,): Writes<Self>) -> TaskResult {
        if self.left == 0 {
            ctx.write(o, u64::from(self.total));
        } else {
            ctx.spawn_delegate(
                Chain {
                    left: self.left - 1,
                    total: self.total,
                },
                (),
                (o,),
            );
        }
        Ok(())
    }
}

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register::<Multi>().unwrap();
    r.register::<Triple>().unwrap();
    r.register::<Incr>().unwrap();
    r.register::<Bytes>().unwrap();
    r.register::<Effect>().unwrap();
    r.register::<Nothing>().unwrap();
    r.register::<Twice>().unwrap();
    r.register::<Pair>().unwrap();
    r.register::<Chain>().unwrap();
    r
}

fn runtime(vnodes: u32, seed: u64, store: Option<Arc<dyn Store>>) -> Runtime {
    common::runtime(registry(), "shapes", vnodes, seed, store)
}

/// Tasks of `Effect(i)` and its descendants.
fn effect_tasks(i: u32) -> u64 {
    if i.is_multiple_of(10) {
        1 + effect_tasks(i + 1)
    } else {
        1
    }
}

#[test]
fn several_inputs_and_outputs_with_fire_and_forget_children() {
    let effects = 40;
    let want_tasks = 1 + 3 + (0..effects).map(effect_tasks).sum::<u64>();
    for vnodes in [1, 2, 4] {
        for seed in 0..4 {
            for logged in [false, true] {
                let ctx = format!("{vnodes} vnodes, seed {seed}, logged={logged}");
                let store = Arc::new(MemoryStore::default());
                let rt = runtime(
                    vnodes,
                    seed,
                    logged.then(|| store.clone() as Arc<dyn Store>),
                );
                let r = rt
                    .run(Multi { n: 7, effects }, (5, "hi".to_string()))
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(r.outputs, (16, "hi-7".to_string(), vec![7, 7, 7]), "{ctx}");
                assert_eq!(r.tasks, want_tasks, "{ctx}: every fire-and-forget task ran");
                assert_eq!(r.terminal.len(), 3, "{ctx}");
                if !logged {
                    continue;
                }
                let ins =
                    inspect(store.clone(), &registry()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(ins.manifest.status, RunStatus::Finished, "{ctx}");
                assert_eq!(ins.manifest.inputs.len(), 2, "{ctx}");
                let values: Vec<Option<&str>> =
                    ins.terminal.iter().map(|t| t.value.as_deref()).collect();
                assert_eq!(
                    values,
                    [Some("16"), Some("\"hi-7\""), Some("[7, 7, 7]")],
                    "{ctx}"
                );
                assert_eq!(
                    ins.task_counts(),
                    (want_tasks, want_tasks, want_tasks),
                    "{ctx}"
                );
                assert_eq!(ins.graph.task_count() as u64, want_tasks, "{ctx}");
                // Both program inputs are logged with their values.
                let logs = LogReader::new(store).read_all().unwrap();
                let inputs: Vec<&Event> = logs
                    .iter()
                    .flat_map(|l| &l.events)
                    .map(|e| &e.event)
                    .filter(|e| matches!(e, Event::Input { .. }))
                    .collect();
                assert_eq!(inputs.len(), 2, "{ctx}");
                let json = ins.to_json();
                assert_eq!(json["terminal"].as_array().map(Vec::len), Some(3), "{ctx}");
            }
        }
    }
}

#[test]
fn a_root_without_outputs_runs_all_its_children() {
    for vnodes in [1, 2, 4] {
        for logged in [false, true] {
            let ctx = format!("{vnodes} vnodes, logged={logged}");
            let store = Arc::new(MemoryStore::default());
            let rt = runtime(vnodes, 3, logged.then(|| store.clone() as Arc<dyn Store>));
            let r = rt
                .run(Nothing(25), ())
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(r.tasks, 1 + (0..25).map(effect_tasks).sum::<u64>(), "{ctx}");
            assert!(r.terminal.is_empty(), "{ctx}");
            if logged {
                let ins = inspect(store, &registry()).unwrap();
                assert!(ins.terminal.is_empty(), "{ctx}");
                assert_eq!(ins.task_counts().2, r.tasks, "{ctx}");
                assert!(ins.to_text().contains("status: Finished"), "{ctx}");
            }
        }
    }
}

#[test]
fn a_task_may_read_one_data_object_twice() {
    for vnodes in [1, 2, 4] {
        for seed in 0..8 {
            let ctx = format!("{vnodes} vnodes, seed {seed}");
            let store = Arc::new(MemoryStore::default());
            let r = runtime(vnodes, seed, Some(store.clone()))
                .run(Twice(4), ())
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(r.outputs.0, 12_012, "{ctx}");
            assert_eq!(r.tasks, 3, "{ctx}");
            // Pair started with the same digest twice.
            let logs = LogReader::new(store).read_all().unwrap();
            let started: Vec<_> = logs
                .iter()
                .flat_map(|l| &l.events)
                .filter_map(|e| match &e.event {
                    Event::Started { inputs, .. } if inputs.len() == 2 => Some(inputs.clone()),
                    _ => None,
                })
                .collect();
            assert_eq!(started.len(), 1, "{ctx}");
            assert_eq!(started[0][0], started[0][1], "{ctx}");
        }
    }
}

#[test]
fn a_long_delegation_chain_neither_overflows_nor_crawls() {
    let n = 100_000;
    for vnodes in [1, 4] {
        for logged in [false, true] {
            let ctx = format!("chain of {n} on {vnodes} vnodes, logged={logged}");
            let store = Arc::new(MemoryStore::default());
            let rt = runtime(vnodes, 0, logged.then(|| store.clone() as Arc<dyn Store>));
            let t0 = Instant::now();
            let r = rt
                .run(Chain { left: n, total: n }, ())
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(r.outputs.0, u64::from(n), "{ctx}");
            assert_eq!(r.tasks, u64::from(n) + 1, "{ctx}");
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{ctx}: took {:?}",
                t0.elapsed()
            );
            if logged {
                let ins = inspect(store, &registry()).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(ins.terminal[0].value.as_deref(), Some("100000"), "{ctx}");
                assert_eq!(ins.graph.task_count() as u64, r.tasks, "{ctx}");
                assert!(ins.graph.to_dot().starts_with("digraph"), "{ctx}");
            }
        }
    }
}

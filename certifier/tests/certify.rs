//! Certification of real runs: honest runs accepted, forgeries found, named and corrected,
//! certificates verified against their log.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use veriflow_certifier::{certify, Certificate, Decision, NoProgress, Options, Track};
use veriflow_checkpoint::Key;
use veriflow_runtime::{
    Ctx, Forge, ForgeMode, IdSet, Kill, MemoryStore, Registry, RunReport, Runtime, Store, Task,
    TaskId, TaskResult, VnodeId, Writes,
};

/// A k-ary tree: leaves write a value that depends on their path; inner nodes sum children.
#[derive(Serialize, Deserialize)]
struct Node {
    depth: u32,
    fanout: u32,
    path: u64,
}

impl Task for Node {
    const NAME: &'static str = "node";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        if self.depth == 0 {
            ctx.write(out, self.path.wrapping_mul(2_654_435_761) % 1_000_003);
            return Ok(());
        }
        let parts: Vec<_> = (0..self.fanout)
            .map(|i| {
                let (r,) = ctx.spawn(
                    Node {
                        depth: self.depth - 1,
                        fanout: self.fanout,
                        path: self.path * u64::from(self.fanout) + u64::from(i) + 1,
                    },
                    (),
                );
                r
            })
            .collect();
        ctx.spawn_delegate(Sum, parts, (out,));
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct Sum;

impl Task for Sum {
    const NAME: &'static str = "sum";
    type Inputs = Vec<u64>;
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, xs: Vec<u64>, (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, xs.iter().fold(0u64, |a, b| a.wrapping_add(*b)));
        Ok(())
    }
}

fn registry() -> Registry {
    Registry::new()
        .with::<Node>()
        .unwrap()
        .with::<Sum>()
        .unwrap()
}

fn run(
    depth: u32,
    vnodes: u32,
    seed: u64,
    forge: Option<Forge>,
) -> (Arc<dyn Store>, RunReport<(u64,)>) {
    run_with(depth, vnodes, seed, forge, Vec::new())
}

fn run_with(
    depth: u32,
    vnodes: u32,
    seed: u64,
    forge: Option<Forge>,
    kills: Vec<Kill>,
) -> (Arc<dyn Store>, RunReport<(u64,)>) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let mut b = Runtime::builder(registry())
        .threads(2)
        .vnodes(vnodes)
        .seed(seed)
        .kills(kills)
        .store(store.clone());
    if let Some(f) = forge {
        b = b.forge(f);
    }
    let report = b
        .build()
        .unwrap()
        .run(
            Node {
                depth,
                fanout: 3,
                path: 0,
            },
            (),
        )
        .unwrap();
    (store, report)
}

fn opts(eps: f64, q: f64) -> Options {
    Options {
        epsilon: eps,
        q,
        ..Options::default()
    }
}

fn terminal_value(store: &Arc<dyn Store>) -> Vec<u8> {
    let t = Track::load(store.clone()).unwrap();
    let d = t.terminal()[0];
    t.data[&d].value.as_ref().unwrap().0.to_vec()
}

#[test]
fn honest_runs_are_accepted() {
    for seed in 0..12u64 {
        let (store, report) = run(4, 1 + (seed % 4) as u32, seed, None);
        let cert = certify(store, &registry(), &opts(0.05, 0.05), &NoProgress).unwrap();
        assert_eq!(cert.decision, Decision::Accept, "seed {seed}: {cert:?}");
        assert_eq!(
            cert.n, report.tasks,
            "every task is an ancestor of the root output"
        );
        assert_eq!(
            cert.k,
            veriflow_certifier::sample::sample_size(0.05, 0.05, cert.n).unwrap()
        );
        assert_eq!(cert.checked.len() as u64, cert.k);
        assert!(cert.structural.is_empty() && cert.detections.is_empty());
    }
}

#[test]
fn honest_runs_with_failures_and_recovery_are_accepted() {
    for seed in 0..8u64 {
        let kills = vec![
            Kill {
                vnode: VnodeId(1),
                after: 10 + seed * 7,
                retarget: false,
            },
            Kill {
                vnode: VnodeId(2),
                after: 40 + seed * 3,
                retarget: false,
            },
        ];
        let (store, report) = run_with(4, 3, seed, None, kills);
        assert!(report.vnodes.iter().map(|v| v.failures).sum::<u64>() > 0);
        let mut o = opts(0.05, 0.05);
        o.full = true;
        let cert = certify(store, &registry(), &o, &NoProgress).unwrap();
        assert_eq!(cert.decision, Decision::Accept, "seed {seed}: {cert:?}");
        assert_eq!(cert.n, report.tasks);
    }
}

fn forge_tasks(tasks: &[TaskId]) -> Forge {
    Forge {
        tasks: tasks.iter().copied().collect::<IdSet<TaskId>>(),
        seed: 5,
        ..Forge::default()
    }
}

/// Ids of the leaves of an honest run (tasks that write their output themselves).
fn writers(store: &Arc<dyn Store>) -> Vec<TaskId> {
    let t = Track::load(store.clone()).unwrap();
    let mut v: Vec<TaskId> = t
        .tasks
        .iter()
        .filter(|r| r.wrote.as_ref().is_some_and(|w| !w.is_empty()))
        .map(|r| r.id)
        .collect();
    v.sort();
    v
}

#[test]
fn a_forged_task_is_named_and_the_run_rejected() {
    let (honest, _) = run(3, 2, 1, None);
    let victims = writers(&honest);
    let target = victims[victims.len() / 2];
    let (store, report) = run(3, 2, 1, Some(forge_tasks(&[target])));
    assert_eq!(report.forged.len(), 1);
    assert_ne!(
        terminal_value(&store),
        terminal_value(&honest),
        "the lie reaches the output"
    );
    let mut o = opts(0.05, 0.05);
    o.full = true;
    let cert = certify(store, &registry(), &o, &NoProgress).unwrap();
    assert_eq!(cert.decision, Decision::Reject);
    assert_eq!(cert.detections.len(), 1, "{:?}", cert.detections);
    assert_eq!(cert.detections[0].task, format!("{target:#}"));
    assert_eq!(cert.detections[0].vnode, Some(report.forged[0].1 .0));
}

#[test]
fn correction_restores_the_honest_output() {
    let (honest, _) = run(4, 3, 2, None);
    let victims = writers(&honest);
    let lies = [victims[3], victims[victims.len() - 5]];
    let (store, report) = run(4, 3, 2, Some(forge_tasks(&lies)));
    assert_eq!(report.forged.len(), 2);
    let before = terminal_value(&store);
    assert_ne!(before, terminal_value(&honest));
    let mut o = opts(0.05, 0.05);
    o.full = true;
    o.correct = true;
    let cert = certify(store.clone(), &registry(), &o, &NoProgress).unwrap();
    assert_eq!(cert.decision, Decision::Accept, "{cert:?}");
    assert_eq!(cert.generation, 1);
    assert_eq!(cert.corrections.len(), 1);
    assert_eq!(cert.corrections[0].detected.len(), 2);
    assert_eq!(
        terminal_value(&store),
        terminal_value(&honest),
        "corrected = honest"
    );
    // The original generation is kept.
    let g0 = veriflow_runtime::log::LogReader::new(store.clone());
    let t0 = Track::load_from(&g0).unwrap();
    let d = t0.terminal()[0];
    assert_eq!(t0.data[&d].value.as_ref().unwrap().0.to_vec(), before);
}

#[test]
fn a_vnode_that_logs_another_value_than_it_sent_fails_the_structural_check() {
    // Chosen tasks, not a rate on one vnode: which vnode runs what depends on the schedule.
    let (honest_store, honest) = run(3, 3, 4, None);
    let f = Forge {
        mode: ForgeMode::LogOnly,
        ..forge_tasks(&writers(&honest_store)[..3])
    };
    let (store, report) = run(3, 3, 4, Some(f));
    assert!(!report.forged.is_empty());
    assert_eq!(
        report.outputs, honest.outputs,
        "the honest values were sent"
    );
    let cert = certify(store, &registry(), &opts(0.05, 0.05), &NoProgress).unwrap();
    assert_eq!(cert.decision, Decision::Reject);
    assert!(!cert.structural.is_empty());
    // The lie shows on whichever edge carried the honest value, which the schedule decides: a
    // local reader's or a thief's input ("... but its producer ... logged") or a copy returned
    // to a victim ("... received digest ..., the writer logged ...").
    let e = &cert.structural[0];
    assert!(
        e.message.contains("its producer") || e.message.contains("the writer logged"),
        "{e:?}"
    );
    assert!(e.data.is_some(), "the edge is named");
}

#[test]
fn certificates_verify_and_tampering_is_caught() {
    let key = Key::from_bytes([7; 32]);
    let (store, _) = run(3, 2, 3, None);
    let mut cert = certify(store.clone(), &registry(), &opts(0.1, 0.05), &NoProgress).unwrap();
    cert.sign(&key).unwrap();
    let json = cert.to_json();
    let back = Certificate::from_json(&json).unwrap();
    back.verify(&key, store.clone())
        .expect("a fresh certificate verifies");

    let other_key = Key::from_bytes([8; 32]);
    assert!(back.verify(&other_key, store.clone()).is_err());

    let tampered = json.replace("\"ACCEPT\"", "\"REJECT\"");
    let t = Certificate::from_json(&tampered).unwrap();
    let e = t.verify(&key, store.clone()).unwrap_err();
    assert!(e.to_string().contains("MAC"), "{e}");

    let (other, _) = run(3, 2, 3, Some(forge_tasks(&writers(&store)[..1])));
    let e = back.verify(&key, other).unwrap_err();
    assert!(e.to_string().contains("does not belong"), "{e}");

    assert!(Certificate::from_json("{\"format\": 1}").is_err());
}

#[test]
fn the_draw_depends_on_the_seed_only() {
    let (store, _) = run(4, 2, 8, None);
    let mut o = opts(0.05, 0.1);
    o.seed = Some(42);
    let a = certify(store.clone(), &registry(), &o, &NoProgress).unwrap();
    let b = certify(store.clone(), &registry(), &o, &NoProgress).unwrap();
    assert_eq!(a.checked, b.checked);
    o.seed = Some(43);
    let c = certify(store.clone(), &registry(), &o, &NoProgress).unwrap();
    assert_ne!(a.checked, c.checked);
    o.seed = None;
    let d = certify(store, &registry(), &o, &NoProgress).unwrap();
    assert_eq!(d.seed_source, "log digest");
}

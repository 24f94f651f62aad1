//! knary on the embedded runtime: the result and the number of tasks for many tree shapes
//! (depth n, fanout k, serial children r), on 1, 2 and 4 vnodes, with and without an event log,
//! for several seeds. With a log, the events the run reports are exactly the events read back.

use std::collections::BTreeMap;
use std::sync::Arc;

use knary::{expected_nodes, expected_tasks, Knary};
use veriflow::{EventKind, LogReader, MemoryStore, Program, Registry, RunStatus, Runtime, Store};

/// (depth, fanout, serial).
const SHAPES: &[(u32, u32, u32)] = &[
    (1, 1, 0),
    (1, 5, 0),
    (2, 3, 3),
    (3, 2, 1),
    (4, 3, 2),
    (5, 4, 0),
    (6, 3, 3),
    (7, 2, 2),
    (8, 2, 1),
    (5, 5, 5),
    (4, 1, 1),
    (3, 7, 4),
];

fn registry() -> Registry {
    let mut r = Registry::new();
    <Knary as Program>::register(&mut r).expect("knary registers");
    r
}

fn program(depth: u32, fanout: u32, serial: u32) -> Knary {
    Knary {
        depth,
        fanout,
        serial,
        grain_us: 0,
    }
}

#[test]
fn knary_results_and_task_counts_on_1_2_4_vnodes_with_and_without_log() {
    let mut runs = 0;
    for &(n, k, r) in SHAPES {
        let p = program(n, k, r);
        p.validate()
            .unwrap_or_else(|e| panic!("knary({n},{k},{r}) is valid: {e}"));
        let want_nodes = expected_nodes(n, k).expect("small tree");
        let want_tasks = expected_tasks(n, k).expect("small tree");
        for vnodes in [1u32, 2, 4] {
            for logged in [false, true] {
                for seed in 0..3u64 {
                    let ctx = format!(
                        "knary(n={n}, k={k}, r={r}) on {vnodes} vnodes, 2 threads, \
                         logged={logged}, seed={seed}"
                    );
                    let store = Arc::new(MemoryStore::default());
                    let mut b = Runtime::builder(registry())
                        .program(<Knary as Program>::NAME)
                        .threads(2)
                        .vnodes(vnodes)
                        .seed(seed);
                    if logged {
                        b = b.store(store.clone() as Arc<dyn Store>);
                    }
                    let rt = b.build().unwrap_or_else(|e| panic!("{ctx}: build: {e}"));
                    assert_eq!(rt.vnodes(), vnodes, "{ctx}");
                    let (root, inputs) = p.root();
                    let report = rt
                        .run(root, inputs)
                        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    runs += 1;

                    assert_eq!(report.outputs.0, want_nodes, "{ctx}: result");
                    assert!(
                        p.check(&report.outputs).is_ok(),
                        "{ctx}: the program's own check"
                    );
                    assert_eq!(report.tasks, want_tasks, "{ctx}: report.tasks");
                    assert_eq!(
                        report.vnodes.len(),
                        vnodes as usize,
                        "{ctx}: per-vnode stats"
                    );
                    let per_vnode: u64 = report.vnodes.iter().map(|s| s.tasks).sum();
                    assert_eq!(per_vnode, want_tasks, "{ctx}: sum of per-vnode tasks");
                    let stolen: u64 = report.vnodes.iter().map(|s| s.stolen).sum();
                    let adopted: u64 = report.vnodes.iter().map(|s| s.adopted).sum();
                    assert_eq!(stolen, adopted, "{ctx}: stolen vs adopted");
                    if vnodes == 1 {
                        assert_eq!(adopted, 0, "{ctx}: one vnode cannot steal");
                    }
                    assert_eq!(report.terminal.len(), 1, "{ctx}: one terminal output");

                    if !logged {
                        assert_eq!(report.events, 0, "{ctx}: nothing is logged without a store");
                        assert!(
                            store.scan_prefix(b"").unwrap().is_empty(),
                            "{ctx}: the unused store stays empty"
                        );
                        continue;
                    }
                    let reader = LogReader::new(store.clone());
                    let manifest = reader.manifest().unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    assert_eq!(manifest.status, RunStatus::Finished, "{ctx}");
                    assert_eq!(manifest.root, report.root, "{ctx}");
                    assert_eq!(manifest.terminal, report.terminal, "{ctx}");
                    assert_eq!(manifest.vnodes, vnodes, "{ctx}");
                    assert_eq!(manifest.seed, seed, "{ctx}");
                    assert_eq!(manifest.program, "knary", "{ctx}");
                    let logs = reader.read_all().unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    let read: u64 = logs.iter().map(|l| l.events.len() as u64).sum();
                    let dups: u64 = logs.iter().map(|l| l.duplicates).sum();
                    assert_eq!(
                        report.events, read,
                        "{ctx}: events reported vs read back ({dups} duplicates dropped)"
                    );
                    for l in &logs {
                        assert!(l.torn.is_none(), "{ctx}: {} has a torn tail", l.vnode);
                        let stats = &report.vnodes[l.vnode.0 as usize];
                        assert_eq!(
                            stats.events,
                            l.events.len() as u64 + l.duplicates,
                            "{ctx}: events of {}",
                            l.vnode
                        );
                    }
                    let mut kinds: BTreeMap<EventKind, u64> = BTreeMap::new();
                    for e in logs.iter().flat_map(|l| &l.events) {
                        *kinds.entry(e.event.kind()).or_default() += 1;
                    }
                    let count = |kind| kinds.get(&kind).copied().unwrap_or(0);
                    assert_eq!(count(EventKind::Declared), want_tasks, "{ctx}: {kinds:?}");
                    assert_eq!(count(EventKind::Started), want_tasks, "{ctx}: {kinds:?}");
                    assert_eq!(count(EventKind::Completed), want_tasks, "{ctx}: {kinds:?}");
                    assert_eq!(count(EventKind::Stolen), stolen, "{ctx}: {kinds:?}");
                    assert_eq!(count(EventKind::Adopted), adopted, "{ctx}: {kinds:?}");
                    // knary's root reads no program input.
                    assert_eq!(count(EventKind::Input), 0, "{ctx}: {kinds:?}");
                }
            }
        }
    }
    assert_eq!(runs, SHAPES.len() * 3 * 2 * 3);
}

/// The task count is a property of the shape, not of the schedule: many seeds on 4 vnodes give
/// the same count and result for a tree with both serial and parallel children.
#[test]
fn knary_counts_do_not_depend_on_the_seed() {
    let (n, k, r) = (6, 4, 2);
    let p = program(n, k, r);
    let rt = Runtime::builder(registry())
        .program("knary")
        .threads(2)
        .vnodes(4)
        .build()
        .unwrap();
    for seed in 0..12u64 {
        // One runtime runs many programs one after the other (no store: each run is fresh).
        let ctx = format!("knary(n={n}, k={k}, r={r}) on 4 vnodes, seed={seed}");
        let rt_seeded = Runtime::builder(registry())
            .program("knary")
            .threads(2)
            .vnodes(4)
            .seed(seed)
            .build()
            .unwrap();
        let (root, inputs) = p.root();
        let a = rt_seeded
            .run(root.clone(), inputs.clone())
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let b = rt
            .run(root, inputs)
            .unwrap_or_else(|e| panic!("{ctx}: reused runtime: {e}"));
        assert_eq!(a.outputs.0, expected_nodes(n, k).unwrap(), "{ctx}");
        assert_eq!(b.outputs.0, expected_nodes(n, k).unwrap(), "{ctx}");
        assert_eq!(a.tasks, expected_tasks(n, k).unwrap(), "{ctx}");
        assert_eq!(b.tasks, expected_tasks(n, k).unwrap(), "{ctx}");
        // The root id depends only on program name and root arguments.
        assert_eq!(a.root, b.root, "{ctx}");
    }
}

/// More vnodes than threads, more threads than vnodes, one thread: the same answer.
#[test]
fn knary_on_other_thread_and_vnode_counts() {
    let (n, k, r) = (6, 3, 1);
    let p = program(n, k, r);
    for (threads, vnodes) in [(1, 1), (1, 4), (3, 1), (3, 3), (2, 8), (3, 16)] {
        for logged in [false, true] {
            let ctx = format!(
                "knary(n={n}, k={k}, r={r}) on {threads} threads, {vnodes} vnodes, logged={logged}"
            );
            let store = Arc::new(MemoryStore::default());
            let mut b = Runtime::builder(registry())
                .program("knary")
                .threads(threads)
                .vnodes(vnodes)
                .seed(42);
            if logged {
                b = b.store(store.clone());
            }
            let rt = b.build().unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(rt.threads(), threads, "{ctx}");
            let (root, inputs) = p.root();
            let report = rt
                .run(root, inputs)
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(report.outputs.0, expected_nodes(n, k).unwrap(), "{ctx}");
            assert_eq!(report.tasks, expected_tasks(n, k).unwrap(), "{ctx}");
            if logged {
                let logs = LogReader::new(store).read_all().unwrap();
                let read: u64 = logs.iter().map(|l| l.events.len() as u64).sum();
                assert_eq!(report.events, read, "{ctx}");
            }
        }
    }
}

/// `checkpoint(false)` logs nothing even with a store (the S0 baseline).
#[test]
fn checkpoint_off_logs_nothing_even_with_a_store() {
    let store = Arc::new(MemoryStore::default());
    let rt = Runtime::builder(registry())
        .program("knary")
        .threads(2)
        .vnodes(2)
        .store(store.clone())
        .checkpoint(false)
        .build()
        .unwrap();
    let (root, inputs) = program(5, 3, 1).root();
    let report = rt.run(root, inputs).unwrap();
    assert_eq!(report.outputs.0, expected_nodes(5, 3).unwrap());
    assert_eq!(report.events, 0);
    assert!(
        store.scan_prefix(b"").unwrap().is_empty(),
        "the store was written"
    );
    // And the runtime can run again (no store to refuse a second run).
    let (root, inputs) = program(3, 2, 0).root();
    assert_eq!(rt.run(root, inputs).unwrap().outputs.0, 7);
}

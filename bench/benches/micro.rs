//! Micro-benchmarks of hot paths: id derivation, the codec, and a whole small knary run.
//!
//! `cargo bench -p veriflow-bench --bench micro` (add `-- --quick` for a fast pass).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_main, Criterion};
use veriflow::runtime::{codec, DataId, TaskId};
use veriflow::{Program, Runtime};
use veriflow_bench::knary_registry;

fn ids(c: &mut Criterion) {
    let mut g = c.benchmark_group("ids");
    let parent = TaskId::root("knary", b"bench");
    g.bench_function("TaskId::child", |b| {
        b.iter(|| TaskId::child(black_box(parent), black_box(3)));
    });
    g.bench_function("DataId::output", |b| {
        b.iter(|| DataId::output(black_box(parent), black_box(0)));
    });
    g.finish();
}

fn codec_encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    // A task's arguments, as the log records them.
    let node = knary::Node {
        depth: 7,
        fanout: 5,
        serial: 1,
        grain_us: 100,
    };
    g.bench_function("encode knary::Node", |b| {
        b.iter(|| codec::encode(black_box(&node)).expect("a Node encodes"));
    });
    let counts: Vec<u64> = vec![1, 6, 31, 156, 781];
    g.bench_function("encode Vec<u64> of 5", |b| {
        b.iter(|| codec::encode(black_box(&counts)).expect("a Vec encodes"));
    });
    g.finish();
}

fn knary_run(c: &mut Criterion) {
    let mut g = c.benchmark_group("knary");
    g.sample_size(20);
    let program = knary::Knary {
        depth: 5,
        fanout: 4,
        serial: 0,
        grain_us: 0,
    };
    let expected = knary::expected_nodes(5, 4).expect("small tree");
    let runtime = Runtime::builder(knary_registry().expect("knary registers"))
        .program(<knary::Knary as Program>::NAME)
        .threads(2)
        .checkpoint(false)
        .build()
        .expect("runtime builds");
    g.bench_function("d5 k4 grain 0, no store (426 tasks)", |b| {
        b.iter(|| {
            let (root, inputs) = program.root();
            let report = runtime.run(root, inputs).expect("knary runs");
            assert_eq!(report.outputs.0, expected);
            report.tasks
        });
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

/// The group `criterion_main!` runs (in a module: the macro's `pub fn` cannot carry docs).
#[allow(missing_docs, unreachable_pub)]
mod group {
    use super::{codec_encode, config, ids, knary_run};
    use criterion::criterion_group;

    criterion_group! {
        name = micro;
        config = config();
        targets = ids, codec_encode, knary_run
    }
}

criterion_main!(group::micro);

//! A second and a third application, to show the API serves more than knary:
//!
//! - parallel merge sort over typed `Vec<i64>` data: the root reads the unsorted vector as a
//!   *program input*, halves are handed to children as *arguments* (a `Slice` task that
//!   publishes them as data) and read back as *data* by the child `Sort`s, and a separate
//!   `Merge` task writes the parent's output through `spawn_delegate`;
//! - a row-blocked integer matrix product: one shared data object (B) read by many tasks, and
//!   a variable number of inputs (`Inputs = Vec<Vec<i64>>`) gathered by a `Concat`.
//!
//! Both are checked against a sequential reference on 1, 2 and 4 vnodes, with and without a log.

mod common;

use std::sync::Arc;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use veriflow::runtime::codec;
use veriflow::{
    Ctx, Event, EventKind, LogReader, MemoryStore, Registry, RunReport, RunStatus, Store, Task,
    TaskResult, Writes,
};

// ---------------------------------------------------------------------------------------------
// Merge sort.

/// Sorts its input: below the cutoff by insertion sort, else by halves and a [`Merge`].
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Sort {
    cutoff: usize,
}

impl Task for Sort {
    const NAME: &'static str = "msort.sort";
    type Inputs = (Vec<i64>,);
    type Outputs = (Vec<i64>,);
    fn run(self, ctx: &mut Ctx<'_>, (mut v,): (Vec<i64>,), (out,): Writes<Self>) -> TaskResult {
        if v.len() <= self.cutoff.max(1) {
            insertion_sort(&mut v);
            ctx.write(out, v);
            return Ok(());
        }
        let right = v.split_off(v.len() / 2);
        // The halves travel as arguments of a `Slice`, which publishes them as data...
        let (l,) = ctx.spawn(Slice { part: v }, ());
        let (r,) = ctx.spawn(Slice { part: right }, ());
        // ... that the child sorts read as inputs.
        let (sl,) = ctx.spawn(
            Sort {
                cutoff: self.cutoff,
            },
            (l,),
        );
        let (sr,) = ctx.spawn(
            Sort {
                cutoff: self.cutoff,
            },
            (r,),
        );
        ctx.spawn_delegate(Merge, (sl, sr), (out,));
        Ok(())
    }
}

/// Writes its argument: turns a value a task holds into a data object others can read.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Slice {
    part: Vec<i64>,
}

impl Task for Slice {
    const NAME: &'static str = "msort.slice";
    type Inputs = ();
    type Outputs = (Vec<i64>,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, self.part);
        Ok(())
    }
}

/// Merges two sorted vectors (stable: ties from the left first).
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Merge;

impl Task for Merge {
    const NAME: &'static str = "msort.merge";
    type Inputs = (Vec<i64>, Vec<i64>);
    type Outputs = (Vec<i64>,);
    fn run(
        self,
        ctx: &mut Ctx<'_>,
        (a, b): (Vec<i64>, Vec<i64>),
        (out,): Writes<Self>,
    ) -> TaskResult {
        let mut m = Vec::with_capacity(a.len() + b.len());
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            if b[j] < a[i] {
                m.push(b[j]);
                j += 1;
            } else {
                m.push(a[i]);
                i += 1;
            }
        }
        m.extend_from_slice(&a[i..]);
        m.extend_from_slice(&b[j..]);
        ctx.write(out, m);
        Ok(())
    }
}

fn insertion_sort(v: &mut [i64]) {
    for i in 1..v.len() {
        let mut j = i;
        while j > 0 && v[j - 1] > v[j] {
            v.swap(j - 1, j);
            j -= 1;
        }
    }
}

fn msort_registry() -> Registry {
    Registry::new()
        .with::<Sort>()
        .unwrap()
        .with::<Slice>()
        .unwrap()
        .with::<Merge>()
        .unwrap()
}

/// Tasks of sorting `n` values: a leaf sort, or a sort, two slices, a merge and two sub-sorts.
fn msort_tasks(n: usize, cutoff: usize) -> u64 {
    if n <= cutoff.max(1) {
        1
    } else {
        4 + msort_tasks(n / 2, cutoff) + msort_tasks(n - n / 2, cutoff)
    }
}

use common::runtime;

/// Checks what a logged run left: the program input and the terminal value, both decoded.
fn check_log<O: serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(
    ctx: &str,
    store: Arc<MemoryStore>,
    report: &RunReport<(O,)>,
    inputs: &[Vec<u8>],
) {
    let reader = LogReader::new(store);
    let manifest = reader.manifest().unwrap();
    assert_eq!(manifest.status, RunStatus::Finished, "{ctx}");
    assert_eq!(
        manifest.inputs.len(),
        inputs.len(),
        "{ctx}: program inputs in the manifest"
    );
    let logs = reader.read_all().unwrap();
    let read: u64 = logs.iter().map(|l| l.events.len() as u64).sum();
    assert_eq!(read, report.events, "{ctx}: events read back");
    let completed = logs
        .iter()
        .flat_map(|l| &l.events)
        .filter(|e| e.event.kind() == EventKind::Completed)
        .count() as u64;
    assert_eq!(completed, report.tasks, "{ctx}: Completed events");
    // Program inputs are logged on vnode 0, before anything else, with their values.
    let home = &logs[0];
    for (i, (&id, want)) in manifest.inputs.iter().zip(inputs).enumerate() {
        let Event::Input { output } = &home.events[i].event else {
            panic!(
                "{ctx}: event {i} of v0 is {:?}, not an Input",
                home.events[i].event.kind()
            );
        };
        assert_eq!(output.data, id, "{ctx}: input {i}");
        let logged =
            veriflow::runtime::log::values::resolve(&**reader.store(), output.value.clone())
                .unwrap_or_else(|e| panic!("{ctx}: input {i}: {e}"));
        assert!(&logged == want, "{ctx}: logged value of input {i}");
    }
    // Every task started on the values their producers logged (same digests).
    let mut produced = std::collections::HashMap::new();
    let mut declared = std::collections::HashMap::new();
    for e in logs.iter().flat_map(|l| &l.events) {
        match &e.event {
            Event::Completed { outputs, .. } => {
                for o in outputs {
                    produced.insert(o.data, o.digest);
                }
            }
            Event::Returned { output } | Event::Input { output } => {
                produced.insert(output.data, output.digest);
            }
            Event::Declared(d) => {
                declared.insert(d.task, d.inputs.clone());
            }
            _ => {}
        }
    }
    for e in logs.iter().flat_map(|l| &l.events) {
        if let Event::Started { task, inputs } = &e.event {
            let ids = &declared[task];
            assert_eq!(ids.len(), inputs.len(), "{ctx}: {task:#}");
            for (id, d) in ids.iter().zip(inputs) {
                assert_eq!(produced.get(id), Some(d), "{ctx}: {task:#} read {id:#}");
            }
        }
    }
    let t = manifest.terminal[0];
    let value = logs
        .iter()
        .flat_map(|l| &l.events)
        .find_map(|e| match &e.event {
            Event::Completed { outputs, .. } => outputs.iter().find(|o| o.data == t).cloned(),
            Event::Returned { output } if output.data == t => Some(output.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{ctx}: terminal output not logged"));
    let bytes = veriflow::runtime::log::values::resolve(&**reader.store(), value.value).unwrap();
    let decoded: O = codec::decode(&bytes).unwrap();
    assert!(
        decoded == report.outputs.0,
        "{ctx}: the logged terminal value differs from the result"
    );
}

/// Values in `lo..hi`, or any `i64`.
type Range = Option<(i64, i64)>;

fn random_vec(seed: u64, n: usize, range: Range) -> Vec<i64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| match range {
            Some((lo, hi)) => rng.random_range(lo..hi),
            None => rng.random::<i64>(),
        })
        .collect()
}

#[test]
fn merge_sort_matches_slice_sort() {
    // (size, cutoff, value range): full-range values, and a narrow range with many ties.
    let cases: &[(usize, usize, Range)] = &[
        (0, 1, None),
        (1, 1, None),
        (2, 1, None),
        (3, 1, Some((-1, 1))),
        (1000, 8, None),
        (1000, 16, Some((-5, 5))),
        (100_000, 128, None),
    ];
    for (ci, &(n, cutoff, range)) in cases.iter().enumerate() {
        let data_seed = 1000 + ci as u64;
        let data = random_vec(data_seed, n, range);
        let mut want = data.clone();
        want.sort();
        for vnodes in [1u32, 2, 4] {
            for logged in [false, true] {
                let seed = u64::from(vnodes) * 31 + ci as u64;
                let ctx = format!(
                    "merge sort of {n} values (data seed {data_seed}, range {range:?}), cutoff \
                     {cutoff}, {vnodes} vnodes, logged={logged}, seed {seed}"
                );
                let store = Arc::new(MemoryStore::default());
                let rt = runtime(
                    msort_registry(),
                    "msort",
                    vnodes,
                    seed,
                    logged.then(|| store.clone() as Arc<dyn Store>),
                );
                let report = rt
                    .run(Sort { cutoff }, (data.clone(),))
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(report.outputs.0.len(), n, "{ctx}: length");
                assert!(
                    report.outputs.0 == want,
                    "{ctx}: not sorted like slice::sort"
                );
                assert_eq!(report.tasks, msort_tasks(n, cutoff), "{ctx}: tasks");
                if logged {
                    check_log(&ctx, store, &report, &[codec::encode(&data).unwrap()]);
                } else {
                    assert_eq!(report.events, 0, "{ctx}");
                }
            }
        }
    }
}

/// The tasks are deterministic (rule 5): two runs of the same sort on different schedules log
/// the same set of task ids and the same output digests.
#[test]
fn merge_sort_logs_the_same_graph_on_any_schedule() {
    let data = random_vec(77, 5000, None);
    let mut graphs = Vec::new();
    for (vnodes, seed) in [(1u32, 0u64), (4, 1), (4, 2)] {
        let store = Arc::new(MemoryStore::default());
        let rt = runtime(msort_registry(), "msort", vnodes, seed, Some(store.clone()));
        let report = rt.run(Sort { cutoff: 32 }, (data.clone(),)).unwrap();
        let mut outs: Vec<(u128, [u8; 32])> = LogReader::new(store)
            .read_all()
            .unwrap()
            .iter()
            .flat_map(|l| &l.events)
            .filter_map(|e| match &e.event {
                Event::Completed { outputs, .. } => Some(outputs.clone()),
                _ => None,
            })
            .flatten()
            .map(|o| (o.data.0, o.digest.0))
            .collect();
        outs.sort_unstable();
        graphs.push((vnodes, seed, report.root, outs));
    }
    let (v0, s0, root0, g0) = &graphs[0];
    for (v, s, root, g) in &graphs[1..] {
        assert_eq!(
            root, root0,
            "root id: {v} vnodes seed {s} vs {v0} vnodes seed {s0}"
        );
        assert!(
            g == g0,
            "outputs logged: {v} vnodes seed {s} vs {v0} vnodes seed {s0}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Matrix product.

/// C = A B for n x n row-major matrices, `rows` rows of C per task.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct MatMul {
    n: usize,
    rows: usize,
}

impl Task for MatMul {
    const NAME: &'static str = "mm.matmul";
    type Inputs = (Vec<i64>, Vec<i64>);
    type Outputs = (Vec<i64>,);
    fn run(
        self,
        ctx: &mut Ctx<'_>,
        (a, b): (Vec<i64>, Vec<i64>),
        (out,): Writes<Self>,
    ) -> TaskResult {
        let n = self.n;
        if a.len() != n * n || b.len() != n * n {
            return Err(veriflow::TaskError::msg(format!(
                "expected two {n}x{n} matrices, got {} and {} values",
                a.len(),
                b.len()
            )));
        }
        // B is published once and read by every block.
        let (shared_b,) = ctx.spawn(Slice { part: b }, ());
        let mut blocks = Vec::new();
        for lo in (0..n).step_by(self.rows.max(1)) {
            let hi = (lo + self.rows.max(1)).min(n);
            let (c,) = ctx.spawn(
                RowBlock {
                    n,
                    a_rows: a[lo * n..hi * n].to_vec(),
                },
                (shared_b,),
            );
            blocks.push(c);
        }
        ctx.spawn_delegate(Concat, blocks, (out,));
        Ok(())
    }
}

/// Some rows of A (as arguments) times B (read).
#[derive(Serialize, Deserialize, Clone, Debug)]
struct RowBlock {
    n: usize,
    a_rows: Vec<i64>,
}

impl Task for RowBlock {
    const NAME: &'static str = "mm.rows";
    type Inputs = (Vec<i64>,);
    type Outputs = (Vec<i64>,);
    fn run(self, ctx: &mut Ctx<'_>, (b,): (Vec<i64>,), (out,): Writes<Self>) -> TaskResult {
        let n = self.n;
        let mut c = vec![0i64; self.a_rows.len()];
        for (i, row) in self.a_rows.chunks(n).enumerate() {
            for (k, &aik) in row.iter().enumerate() {
                for j in 0..n {
                    c[i * n + j] += aik * b[k * n + j];
                }
            }
        }
        ctx.write(out, c);
        Ok(())
    }
}

/// Concatenates any number of row blocks, in order.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Concat;

impl Task for Concat {
    const NAME: &'static str = "mm.concat";
    type Inputs = Vec<Vec<i64>>;
    type Outputs = (Vec<i64>,);
    fn run(self, ctx: &mut Ctx<'_>, parts: Vec<Vec<i64>>, (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, parts.concat());
        Ok(())
    }
}

fn mm_registry() -> Registry {
    Registry::new()
        .with::<MatMul>()
        .unwrap()
        .with::<Slice>()
        .unwrap()
        .with::<RowBlock>()
        .unwrap()
        .with::<Concat>()
        .unwrap()
}

fn matmul_reference(n: usize, a: &[i64], b: &[i64]) -> Vec<i64> {
    let mut c = vec![0; n * n];
    for i in 0..n {
        for j in 0..n {
            c[i * n + j] = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
        }
    }
    c
}

#[test]
fn matrix_product_matches_the_reference() {
    for (ci, &(n, rows)) in [(1usize, 1usize), (2, 1), (7, 3), (33, 4), (64, 1)]
        .iter()
        .enumerate()
    {
        let a = random_vec(2 * ci as u64, n * n, Some((-100, 100)));
        let b = random_vec(2 * ci as u64 + 1, n * n, Some((-100, 100)));
        let want = matmul_reference(n, &a, &b);
        let blocks = n.div_ceil(rows) as u64;
        for vnodes in [1u32, 2, 4] {
            for logged in [false, true] {
                let seed = ci as u64 + u64::from(vnodes);
                let ctx = format!(
                    "{n}x{n} product, {rows} rows per task, {vnodes} vnodes, logged={logged}, \
                     seed {seed}"
                );
                let store = Arc::new(MemoryStore::default());
                let rt = runtime(
                    mm_registry(),
                    "matmul",
                    vnodes,
                    seed,
                    logged.then(|| store.clone() as Arc<dyn Store>),
                );
                let report = rt
                    .run(MatMul { n, rows }, (a.clone(), b.clone()))
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert!(report.outputs.0 == want, "{ctx}: wrong product");
                // MatMul, Slice of B, the blocks, Concat.
                assert_eq!(report.tasks, 3 + blocks, "{ctx}: tasks");
                if logged {
                    let inputs = [codec::encode(&a).unwrap(), codec::encode(&b).unwrap()];
                    check_log(&ctx, store, &report, &inputs);
                }
            }
        }
    }
}

/// A wrongly shaped program input is the task's own error, reported as such.
#[test]
fn matrix_product_refuses_wrong_shapes() {
    let rt = runtime(mm_registry(), "matmul", 2, 0, None);
    let err = rt
        .run(MatMul { n: 3, rows: 1 }, (vec![1; 9], vec![1; 8]))
        .unwrap_err();
    match &err {
        veriflow::RunError::TaskFailed { task, message, .. } => {
            assert_eq!(task, "mm.matmul", "{err}");
            assert!(message.contains("got 9 and 8 values"), "{err}");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
    // The runtime still works.
    let ok = rt
        .run(MatMul { n: 1, rows: 1 }, (vec![6], vec![7]))
        .unwrap();
    assert_eq!(ok.outputs.0, vec![42]);
}

// ---------------------------------------------------------------------------------------------
// Certification of both applications (paper 001 §V).

fn certify_opts(full: bool, correct: bool) -> veriflow::certifier::Options {
    veriflow::certifier::Options {
        epsilon: 0.01,
        q: 0.05,
        full,
        correct,
        ..Default::default()
    }
}

/// Honest runs are never rejected: merge sort and the matrix product on several schedules,
/// sampled and fully duplicated.
#[test]
fn honest_merge_sorts_and_products_are_certified() {
    use veriflow::certifier::NoProgress;
    for seed in 0..6u64 {
        let vnodes = 1 + (seed % 4) as u32;
        let data = random_vec(seed, 3000, None);
        let store = Arc::new(MemoryStore::default());
        let rt = runtime(msort_registry(), "msort", vnodes, seed, Some(store.clone()));
        rt.run(Sort { cutoff: 16 }, (data,)).unwrap();
        for full in [false, true] {
            let c = veriflow::certify(
                store.clone(),
                &msort_registry(),
                &certify_opts(full, false),
                &NoProgress,
            )
            .unwrap();
            assert_eq!(
                c.decision,
                veriflow::Decision::Accept,
                "msort seed {seed}: {c:?}"
            );
        }

        let (a, b) = (
            random_vec(seed, 400, Some((-9, 9))),
            random_vec(seed + 1, 400, Some((-9, 9))),
        );
        let store = Arc::new(MemoryStore::default());
        let rt = runtime(mm_registry(), "matmul", vnodes, seed, Some(store.clone()));
        rt.run(MatMul { n: 20, rows: 3 }, (a, b)).unwrap();
        let c = veriflow::certify(
            store,
            &mm_registry(),
            &certify_opts(true, false),
            &NoProgress,
        )
        .unwrap();
        assert_eq!(
            c.decision,
            veriflow::Decision::Accept,
            "matmul seed {seed}: {c:?}"
        );
    }
}

/// Lying vnodes in merge sort: found by full duplication, and corrected into the sorted
/// vector the honest run gives.
#[test]
fn a_forged_merge_sort_is_corrected_to_the_sorted_vector() {
    use veriflow::certifier::{NoProgress, Track};
    let data = random_vec(5, 2000, None);
    let mut want = data.clone();
    want.sort();
    let store = Arc::new(MemoryStore::default());
    // Every vnode lies at the rate: which vnodes run the sort's tasks depends on the threads'
    // timing (one lying vnode, vnode 1, was left without work on a loaded machine, and nothing
    // was forged).
    let forge = veriflow::Forge {
        vnodes: Vec::new(),
        rate: 0.2,
        seed: 3,
        ..Default::default()
    };
    let report = veriflow::Runtime::builder(msort_registry())
        .program("msort")
        .threads(2)
        .vnodes(3)
        .seed(9)
        .store(store.clone())
        .forge(forge)
        .build()
        .unwrap()
        .run(Sort { cutoff: 16 }, (data,))
        .unwrap();
    assert!(!report.forged.is_empty());
    assert!(report.outputs.0 != want, "the lies reach the output");
    let c = veriflow::certify(
        store.clone(),
        &msort_registry(),
        &certify_opts(true, false),
        &NoProgress,
    )
    .unwrap();
    assert_eq!(c.decision, veriflow::Decision::Reject);
    let c = veriflow::certify(
        store.clone(),
        &msort_registry(),
        &certify_opts(true, true),
        &NoProgress,
    )
    .unwrap();
    assert_eq!(c.decision, veriflow::Decision::Accept, "{c:?}");
    let track = Track::load(store).unwrap();
    let out = track.terminal()[0];
    let bytes = track.resolve(track.value(out).unwrap().0).unwrap();
    let sorted: Vec<i64> = codec::decode(&bytes).unwrap();
    assert!(sorted == want, "the corrected output is the sorted vector");
}

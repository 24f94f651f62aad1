//! The data-flow mode on the library runtime (no binary): the solution and the iteration count
//! are the bits of the sequential solver with the same blocks, on 1, 2 and 4 vnodes, whatever
//! the batch size, and with vnodes killed at seeded points and recovered from their logs.

use std::path::Path;
use std::sync::Arc;

use cg::{dataflow::Solution, problem, Cg, CgOptions, Mode, Rhs, Source};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use veriflow::runtime::Kill;
use veriflow::{MemoryStore, Program, Registry, Runtime, Store, VnodeId};

fn registry() -> Registry {
    let mut r = Registry::new();
    Cg::register(&mut r).expect("cg registers");
    r.register::<cg::dataflow::Start>()
        .expect("the root registers");
    r
}

fn program(matrix: &str, rhs: Rhs, blocks: u32, batch: u32, rtol: f64) -> Cg {
    let source = if matrix.starts_with("poisson") {
        Source::parse(matrix).unwrap()
    } else {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(matrix);
        Source::parse(p.to_str().unwrap()).unwrap()
    };
    let p = Cg {
        mode: Mode::Dataflow,
        matrix: source,
        rhs,
        rtol,
        x_tol: None,
        max_iter: None,
        blocks,
        batch,
    };
    p.validate().expect("valid");
    p
}

/// Runs `p` on `vnodes` vnodes with `kills`, logged in memory; returns the solution and the
/// number of vnode failures.
/// Two kills of any of 4 vnodes anywhere in the first 4000 tasks, drawn from `seed`.
fn two_kills(seed: u64) -> Vec<Kill> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..2)
        .map(|_| Kill {
            vnode: VnodeId(rng.random_range(0..4)),
            after: rng.random_range(1..4000),
            retarget: false,
        })
        .collect()
}

fn run(p: &Cg, vnodes: u32, kills: Vec<Kill>, seed: u64) -> (Solution, u64) {
    let rt = Runtime::builder(registry())
        .program(Cg::NAME)
        .threads(2)
        .vnodes(vnodes)
        .seed(seed)
        .store(Arc::new(MemoryStore::default()) as Arc<dyn Store>)
        .kills(kills)
        .build()
        .expect("runtime");
    let (root, inputs) = p.root();
    let report = rt.run(root, inputs).expect("run");
    let result = p.check(&report.outputs).expect("the program's check");
    assert_eq!(result["converged"], true);
    let failures = report.vnodes.iter().map(|v| v.failures).sum();
    (report.outputs.0, failures)
}

fn sequential(p: &Cg) -> cg::CgOutcome {
    let prob = problem(&p.matrix, p.rhs).unwrap();
    cg::solve(
        &prob.a,
        &prob.b,
        &CgOptions {
            rtol: p.rtol,
            max_iter: 10 * prob.n() as u64,
            blocks: p.blocks as usize,
        },
    )
    .unwrap()
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn dataflow_equals_the_sequential_solver_on_any_vnodes_and_batch() {
    for (matrix, rhs, blocks) in [
        ("lund_a.rsa", Rhs::Ones, 4),
        ("lund_a.mtx", Rhs::Random(3), 3),
        ("poisson2d:20", Rhs::Random(1), 5),
        ("poisson3d:6", Rhs::Ones, 1),
    ] {
        let want = sequential(&program(matrix, rhs, blocks, 8, 1e-10));
        assert!(want.converged);
        for batch in [1, 3, 8, 1000] {
            let p = program(matrix, rhs, blocks, batch, 1e-10);
            for vnodes in [1, 2, 4] {
                let ctx = format!("{matrix} {rhs} blocks {blocks} batch {batch} vnodes {vnodes}");
                let (sol, _) = run(&p, vnodes, vec![], 5);
                assert_eq!(sol.iterations, want.iterations, "{ctx}");
                assert_eq!(bits(&sol.x), bits(&want.x), "{ctx}");
                assert_eq!(sol.rho.to_bits(), want.rho.to_bits(), "{ctx}");
            }
        }
    }
}

#[test]
fn killed_vnodes_recover_to_the_same_bits() {
    let p = program("lund_a.rsa", Rhs::Ones, 4, 8, 1e-12);
    let (clean, _) = run(&p, 1, vec![], 0);
    // About 14 tasks per iteration, 357 iterations: kills anywhere in the first 4000 tasks.
    for seed in 0..6u64 {
        let kills = two_kills(seed);
        let (sol, failures) = run(&p, 4, kills.clone(), seed);
        assert!(failures >= 1, "seed {seed}: kills {kills:?} happened");
        assert_eq!(
            sol.iterations, clean.iterations,
            "seed {seed}, kills {kills:?}"
        );
        assert_eq!(bits(&sol.x), bits(&clean.x), "seed {seed}, kills {kills:?}");
    }
}

/// The hang once seen in `killed_vnodes_recover_to_the_same_bits`, hunted: seed 3's kills (both
/// on v0, after 1,291 and 2,556 completed tasks) run again and again with a 5 s stall deadline.
/// Under load (2 cores, load average 10-13) it hung about once in 300-1,000 runs, each time
/// the same way: v0's last durable event is `Stolen` of a CG step task to a thief that never
/// logs `Adopted` for it, v0's rebuilt incarnation expects the terminal output from that thief
/// with no grant outstanding, and the thief expects the same output back from v0 for the
/// chain task v0 stole back from it. Explained and fixed (issue 14.5, `recover.rs` rule 4): the
/// rebuilt v0 sent a stolen task's grant again only if its output was not expected from that
/// thief yet, and the root, stolen by the same thief and rebuilt first, already expected it. The deterministic regression test is the
/// runtime's `a_grant_to_a_thief_already_owing_the_same_value_is_sent_again_after_recovery`;
/// this one stays to hunt for others:
/// `XR=400 cargo test -p cg --test dataflow_runtime hunt -- --ignored --nocapture`.
#[test]
#[ignore]
fn hunt_the_killed_vnodes_hang() {
    use veriflow::runtime::Stall;
    let p = program("lund_a.rsa", Rhs::Ones, 4, 8, 1e-12);
    let rounds: u64 = std::env::var("XR")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let seed = 3u64;
    let kills = two_kills(seed);
    for round in 0..rounds {
        let rt = Runtime::builder(registry())
            .program(Cg::NAME)
            .threads(2)
            .vnodes(4)
            .seed(seed)
            .store(Arc::new(MemoryStore::default()) as Arc<dyn Store>)
            .kills(kills.clone())
            .stall(Stall {
                after: std::time::Duration::from_secs(5),
                fail: true,
            })
            .build()
            .expect("runtime");
        let (root, inputs) = p.root();
        if let Err(e) = rt.run(root, inputs) {
            panic!("round {round}: kills {kills:?}: {e}");
        }
    }
}

#[test]
fn an_iteration_cap_stops_the_run_unconverged() {
    let mut p = program("lund_a.rsa", Rhs::Ones, 2, 8, 1e-12);
    p.max_iter = Some(50);
    let rt = Runtime::builder(registry())
        .threads(2)
        .vnodes(2)
        .build()
        .unwrap();
    let (root, inputs) = p.root();
    let report = rt.run(root, inputs).unwrap();
    let sol = &report.outputs.0;
    assert_eq!(sol.iterations, 50);
    assert!(!sol.converged);
    let e = p.check(&report.outputs).unwrap_err();
    assert!(e.got.contains("after 50 iterations"), "{e}");
    let seq = cg::solve(
        &problem(&p.matrix, p.rhs).unwrap().a,
        &problem(&p.matrix, p.rhs).unwrap().b,
        &CgOptions {
            rtol: 1e-12,
            max_iter: 50,
            blocks: 2,
        },
    )
    .unwrap();
    assert_eq!(bits(&sol.x), bits(&seq.x));
}

/// poisson3d:12 in 2 blocks: 864 unknowns a block, so every vector block (6.9 KB encoded) is a
/// large value, logged in the value store (rule 10 of the runtime's `log/mod.rs`).
fn large_values() -> Cg {
    program("poisson3d:12", Rhs::Random(2), 2, 4, 1e-10)
}

fn logged_run(p: &Cg, store: Arc<dyn Store>, kills: Vec<Kill>, seed: u64) -> (Solution, u64) {
    let rt = Runtime::builder(registry())
        .program(Cg::NAME)
        .threads(2)
        .vnodes(2)
        .seed(seed)
        .store(store)
        .kills(kills)
        .build()
        .expect("runtime");
    let (root, inputs) = p.root();
    let report = rt.run(root, inputs).expect("run");
    let failures = report.vnodes.iter().map(|v| v.failures).sum();
    (report.outputs.0, failures)
}

fn value_keys(store: &MemoryStore) -> Vec<Vec<u8>> {
    store
        .scan_prefix(veriflow::runtime::log::values::VALUE_PREFIX)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

/// Vnodes killed in a run whose vectors are in the value store are rebuilt from it: the same
/// bits as the sequential solver, and no segment holds a vector block.
#[test]
fn killed_vnodes_recover_large_values_from_the_value_store() {
    let p = large_values();
    let want = sequential(&p);
    assert!(
        want.converged && want.iterations > 20,
        "{}",
        want.iterations
    );
    for seed in 0..3u64 {
        let store = Arc::new(MemoryStore::default());
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let kills = (0..2)
            .map(|_| Kill {
                vnode: VnodeId(rng.random_range(0..2)),
                after: rng.random_range(1..200),
                retarget: false,
            })
            .collect::<Vec<_>>();
        let (sol, failures) = logged_run(&p, store.clone(), kills.clone(), seed);
        let ctx = format!("seed {seed}, kills {kills:?}");
        assert!(failures >= 1, "{ctx}");
        assert_eq!(sol.iterations, want.iterations, "{ctx}");
        assert_eq!(bits(&sol.x), bits(&want.x), "{ctx}");
        assert!(
            value_keys(&store).len() > 2 * want.iterations as usize,
            "{ctx}"
        );
        // A block of x is 864 f64: its first 8 values' bytes are in no segment.
        let block: Vec<u8> = sol.x[..8].iter().flat_map(|v| v.to_le_bytes()).collect();
        for (key, seg) in store.scan_prefix(b"seg/").unwrap() {
            assert!(
                !seg.windows(block.len()).any(|w| w == block.as_slice()),
                "{ctx}: segment {key:?} holds a block of x"
            );
        }
    }
}

/// Certification re-runs tasks from values read back from the value store (every task, so
/// every stored input is read): ACCEPT; a missing value is then an error naming it, and a
/// corrupt one too, never a panic nor a verdict on wrong bytes.
#[test]
fn a_run_with_large_values_is_certified_and_a_missing_value_named() {
    use veriflow::certifier::Options;
    use veriflow::runtime::log::values::VALUE_PREFIX;
    let p = large_values();
    let store = Arc::new(MemoryStore::default());
    logged_run(&p, store.clone(), vec![], 1);
    let opts = Options {
        full: true,
        ..Options::default()
    };
    let certify = || {
        veriflow::certify(
            store.clone() as Arc<dyn Store>,
            &registry(),
            &opts,
            &veriflow::certifier::NoProgress,
        )
    };
    let c = certify().expect("certify");
    assert_eq!(c.decision, veriflow::Decision::Accept, "{c:?}");
    assert!(c.checked.len() > 100, "{}", c.checked.len());

    let keys = value_keys(&store);
    let key = &keys[keys.len() / 2];
    let digest = veriflow::Digest(key[VALUE_PREFIX.len()..].try_into().unwrap());
    let bytes = store.get(key).unwrap().unwrap();
    store.delete(key).unwrap();
    let err = certify().unwrap_err().to_string();
    assert!(
        err.contains(&digest.to_string()) && err.contains("missing"),
        "{err}"
    );
    let mut flipped = bytes.clone();
    flipped[100] ^= 0x40;
    store.put(key, &flipped).unwrap();
    let err = certify().unwrap_err().to_string();
    assert!(
        err.contains(&digest.to_string()) && err.contains("corrupt"),
        "{err}"
    );
    store.put(key, &bytes).unwrap();
    assert_eq!(certify().unwrap().decision, veriflow::Decision::Accept);
}

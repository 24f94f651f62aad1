//! N-Queens on the library runtime (no binary): the counts of OEIS A000170 for n = 1..14 on
//! 1, 2 and 4 vnodes, with and without a log, with and without the mirror, split and cut off
//! at several rows; vnodes failing mid-run at seeded points and recovered from their logs.
//! Every run must also complete exactly the tasks the program predicts (none lost, none run
//! twice).

use std::sync::Arc;

use nqueens::{expected_tasks, NQueens, A000170};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use veriflow::runtime::Kill;
use veriflow::{MemoryStore, Program, Registry, Runtime, Store, VnodeId};

/// The values the issue lists, written out here rather than read from the library's table, so
/// that a wrong table cannot pass.
const ISSUE_COUNTS: [u64; 14] = [
    1, 0, 0, 2, 10, 4, 40, 92, 352, 724, 2680, 14200, 73712, 365596,
];

fn registry() -> Registry {
    let mut r = Registry::new();
    NQueens::register(&mut r).expect("nqueens registers");
    r.register::<nqueens::Queens>().expect("the root registers");
    r
}

struct Setup {
    vnodes: u32,
    threads: usize,
    logged: bool,
    seed: u64,
    kills: Vec<Kill>,
}

/// Runs `p` and checks the count against the issue's table and the task count against the
/// program's prediction; returns the report's (failures, reused tasks).
fn run(p: &NQueens, s: &Setup) -> (u64, u64) {
    let ctx = format!(
        "n {} split {} cutoff {} mirror {} on {} vnodes / {} threads, logged {}, seed {}, \
         kills {:?}",
        p.n,
        p.split(),
        p.cutoff(),
        p.mirror(),
        s.vnodes,
        s.threads,
        s.logged,
        s.seed,
        s.kills
    );
    p.validate().unwrap_or_else(|e| panic!("{ctx}: valid: {e}"));
    let mut b = Runtime::builder(registry())
        .program(NQueens::NAME)
        .threads(s.threads)
        .vnodes(s.vnodes)
        .seed(s.seed)
        .kills(s.kills.clone());
    if s.logged {
        b = b.store(Arc::new(MemoryStore::default()) as Arc<dyn Store>);
    }
    let rt = b.build().unwrap_or_else(|e| panic!("{ctx}: build: {e}"));
    let (root, inputs) = p.root();
    let report = rt
        .run(root, inputs)
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let want = ISSUE_COUNTS
        .get(p.n as usize - 1)
        .copied()
        .unwrap_or_else(|| A000170[p.n as usize - 1]);
    assert_eq!(report.outputs.0, want, "{ctx}: count");
    assert!(
        p.check(&report.outputs).is_ok(),
        "{ctx}: the program's check"
    );
    assert_eq!(
        Some(report.tasks),
        expected_tasks(p.n, p.split(), p.cutoff(), p.mirror()),
        "{ctx}: tasks"
    );
    if s.logged {
        assert!(report.events >= 3 * report.tasks, "{ctx}: events logged");
    } else {
        assert_eq!(report.events, 0, "{ctx}");
    }
    let failures = report.vnodes.iter().map(|v| v.failures).sum();
    let reused = report.vnodes.iter().map(|v| v.reused_tasks).sum();
    (failures, reused)
}

#[test]
fn library_table_is_the_issues() {
    assert_eq!(&A000170[..14], &ISSUE_COUNTS[..]);
    for n in 1..=14u32 {
        assert_eq!(
            nqueens::solve(n),
            ISSUE_COUNTS[n as usize - 1],
            "solve({n})"
        );
    }
}

#[test]
fn counts_for_n_1_to_14_on_1_2_4_vnodes_with_and_without_log() {
    for n in 1..=14u32 {
        for vnodes in [1u32, 2, 4] {
            for logged in [false, true] {
                let s = Setup {
                    vnodes,
                    threads: 2,
                    logged,
                    seed: u64::from(n),
                    kills: Vec::new(),
                };
                run(&NQueens::new(n), &s);
            }
        }
    }
}

#[test]
fn split_cutoff_and_mirror_do_not_change_the_count() {
    let s = Setup {
        vnodes: 3,
        threads: 2,
        logged: true,
        seed: 5,
        kills: Vec::new(),
    };
    for n in [1u32, 2, 3, 5, 6, 7, 9, 10, 11] {
        for split in 1..=n.min(5) {
            for cutoff in [1, split.div_ceil(2), split] {
                for no_mirror in [false, true] {
                    let p = NQueens {
                        n,
                        split_rows: Some(split),
                        cutoff_row: Some(cutoff),
                        no_mirror,
                    };
                    run(&p, &s);
                }
            }
        }
    }
}

/// Vnodes fail (all their memory lost) at seeded points of the run and are recovered from
/// their logs: the count is exact and every task completed once, over many seeds.
#[test]
fn vnodes_killed_mid_run_give_the_exact_count() {
    // n = 11 split into 5 rows: thousands of small tasks, so kills land mid-run.
    let p = NQueens {
        n: 11,
        split_rows: Some(5),
        cutoff_row: Some(2),
        no_mirror: false,
    };
    let tasks = p.expected_tasks().expect("small");
    assert!(tasks > 2000, "{tasks}");
    for seed in 0..12u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let vnodes = rng.random_range(2..=5u32);
        let kills = (0..rng.random_range(1..=3))
            .map(|_| Kill {
                vnode: VnodeId(rng.random_range(0..vnodes)),
                after: rng.random_range(0..tasks),
                retarget: false,
            })
            .collect::<Vec<_>>();
        let want = kills.len() as u64;
        let s = Setup {
            vnodes,
            threads: 2,
            logged: true,
            seed,
            kills,
        };
        // Every kill is planned before the run's last completion, so every one happens
        // (RuntimeBuilder::kills).
        let (failures, _) = run(&p, &s);
        assert_eq!(failures, want, "seed {seed}: failures");
    }
}

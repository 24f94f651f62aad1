//! Iterative mode under the simulator over many seeds (`veriflow_cluster::sim::iterative`,
//! rules 1-7).
//!
//! `VERIFLOW_SIM_SEED=N` replays one seed (with `VERIFLOW_SIM_TRACE=1`, every fault,
//! declaration and report is printed); `VERIFLOW_SIM_SEEDS=K` runs K seeds instead of the
//! default.

use std::time::Instant;

use veriflow_cluster::sim::iterative::{self, IterSimConfig};
use veriflow_cluster::sim::{FaultCounts, Faults};

/// Seeds `cargo test` runs: issue 14's budget for iterative mode.
const SEEDS: u64 = 200;

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("VERIFLOW_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![s];
    }
    let n = std::env::var("VERIFLOW_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS);
    (0..n).collect()
}

#[test]
fn iterative_seeds_keep_every_invariant() {
    let started = Instant::now();
    let seeds = seeds();
    let mut total = FaultCounts::default();
    let (mut checks, mut fenced, mut superseded, mut replacements) = (0u64, 0u64, 0u64, 0u64);
    let mut failures = Vec::new();
    let mut fewest = u64::MAX;
    let mut short = Vec::new();
    for &seed in &seeds {
        match iterative::run(&IterSimConfig::from_seed(seed)) {
            Ok(o) => {
                if std::env::var_os("VERIFLOW_SIM_VERBOSE").is_some() {
                    println!(
                        "seed {seed}: ended at {:?} (fault-free {:?}), {} replaced, {} fenced, \
                         faults {:?}",
                        o.finished_at, o.reference_at, o.replacements, o.fenced, o.faults
                    );
                }
                total.add(&o.faults);
                checks += o.checks;
                fenced += o.fenced;
                superseded += o.superseded;
                replacements += o.replacements;
                fewest = fewest.min(o.faults.total());
                if o.faults.total() < 20 {
                    short.push(seed);
                }
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    println!(
        "sim_iterative: {} seeds, {} failed, in {:.1} s; faults {total:?} (fewest in one seed: \
         {fewest}); {replacements} vnodes replaced; {fenced} messages of dead incarnations \
         dropped, {superseded} zombie nodes stopped by store fences; {checks} invariants checked",
        seeds.len(),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} seeds failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        fewest >= 20 || seeds.len() == 1,
        "seeds {short:?} injected fewer than 20 faults (issue 14: at least 20 each)"
    );
    if seeds.len() >= 100 {
        // The kinds of faults all happened somewhere (else the sim tests less than it says).
        for (kind, n) in [
            ("crashes", total.crashes),
            ("restarts", total.restarts),
            ("zombies", total.zombies),
            ("partitions", total.partitions),
            ("lost", total.lost),
            ("duplicated", total.duplicated),
            ("writes lost", total.writes_lost),
        ] {
            assert!(n > 0, "no {kind} in {} seeds: {total:?}", seeds.len());
        }
        assert!(fenced > 0, "no zombie message was ever dropped");
    }
}

#[test]
fn one_iterative_seed_run_twice_gives_the_same_trace() {
    for seed in [5, 11] {
        let cfg = IterSimConfig::from_seed(seed);
        let a = iterative::run(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let b = iterative::run(&cfg).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.trace, b.trace, "seed {seed}");
        assert_eq!(a.faults, b.faults, "seed {seed}");
        assert_eq!(a.finished_at, b.finished_at, "seed {seed}");
    }
    let a = iterative::run(&IterSimConfig::from_seed(5)).unwrap();
    let b = iterative::run(&IterSimConfig::from_seed(6)).unwrap();
    assert_ne!(a.trace, b.trace, "different seeds, different traces");
}

#[test]
fn without_faults_the_run_converges_to_the_direct_solution() {
    let cfg = IterSimConfig {
        faults: Faults::none(),
        min_faults: 0,
        ..IterSimConfig::from_seed(1)
    };
    let o = iterative::run(&cfg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(o.faults.total(), 0);
    assert_eq!(o.replacements, 0);
    assert_eq!(o.finished_at, o.reference_at);
    assert!(o.checks > 0, "{o:?}");
}

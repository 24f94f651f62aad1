//! Iterative mode under the simulator over many seeds (`veriflow_cluster::sim::iterative`,
//! rules 1-7).
//!
//! `VERIFLOW_SIM_SEED=N` replays one seed, `VERIFLOW_SIM_SEED=N,M,...` those seeds (with
//! `VERIFLOW_SIM_TRACE=1`, every fault, declaration and report is printed; with `=2`, every
//! frame between processes but halos too; with `=3`, halos too); `VERIFLOW_SIM_SEEDS=K` runs K seeds instead of the
//! default.

use std::time::Instant;

use veriflow_cluster::sim::iterative::{self, IterSimConfig};
use veriflow_cluster::sim::{FaultCounts, Faults};

/// Seeds `cargo test` runs: issue 14's budget for iterative mode.
const SEEDS: u64 = 200;

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("VERIFLOW_SIM_SEED").ok().and_then(|s| {
        s.split(',')
            .map(|x| x.trim().parse().ok())
            .collect::<Option<Vec<u64>>>()
    }) {
        return s;
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
        fewest >= 20 || seeds.len() < 10,
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
        assert!(superseded > 0, "no zombie store write was ever refused");
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

/// Found by the simulator (first as seed 279): a process cut off from the supervisor past the
/// detector's bound was declared dead and its vnodes restored elsewhere, while its own nodes
/// ran on as zombies; their convergence messages, taken by neighbours that had already heard
/// from the replacements, left the detection state split (some vnodes a step ahead of the
/// others, or no leader) and the run hung with every vnode locally converged. Nodes now drop
/// the messages of an epoch older than one seen from the same vnode (`iterative` rule 8). With
/// that check removed, seeds 328 and 480 hung (checked by hand); with it they end, and their
/// nodes dropped zombie messages. Since converged asynchronous vnodes iterate only on fresh
/// halos (`iterative` rule 2), seed 480's schedule has no zombie, so seed 483 (88 messages
/// fenced) stands in for it. With the check removed, every seed that fences fails at once on
/// the simulator's invariant ("accepted a message of a dead incarnation"; seeds 461-499
/// checked by hand).
#[test]
fn regression_seeds_328_483_zombie_messages_are_fenced() {
    for seed in [328, 483] {
        let o = iterative::run(&IterSimConfig::from_seed(seed)).unwrap_or_else(|e| panic!("{e}"));
        assert!(o.fenced > 0, "seed {seed}: {o:?}");
    }
}

/// Found by the simulator (seeds 651, 2014 and 2031 hung): a node sent a convergence message
/// before the status recording it was on its backup neighbours. In seed 651, v0 became the
/// leader and sent `Verify`, its status with the verification was lost (a lost frame, then a
/// pause past the detector's bound), and its replacement restored the status before it:
/// detecting. v1, in the verification, sent its answer; the replacement acknowledged it and
/// dropped it (no verification there), then led a verification of its own, whose `Verify` v1
/// took for a duplicate. Both waited forever, locally converged. Now a message goes out only
/// once its status is backed up (`iterative` rule 4, write-ahead).
#[test]
fn regression_seeds_651_2014_2031_a_message_is_sent_only_once_its_status_is_backed_up() {
    for seed in [651, 2014, 2031] {
        iterative::run(&IterSimConfig::from_seed(seed)).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Found by the simulator (seeds 599 and 2736, false convergence with a global residual of
/// 5e-7): a replacement counted its iterations from zero again, and backup holders keep the
/// newest data by (step, iteration). In seed 599, v0's second incarnation answered yes after a
/// forced backup at iteration 21 of step 0, which its backup neighbour refused to keep over the
/// first incarnation's older backup at iteration 42; the third incarnation restored that older,
/// unconverged state, and the positive verdict then ended step 0 with it. A replacement now
/// goes on from the restored backup's iteration (`iterative` rule 6).
#[test]
fn regression_seeds_599_2736_a_replacement_counts_on_from_its_backup() {
    for seed in [599, 2736] {
        iterative::run(&IterSimConfig::from_seed(seed)).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Found by 3,000 seeds (8 hung: 705, 1305, 1410, 1464, 1826, 2051, 2056, 2857), and by the
/// runtime's embedded test under load: the vnode that took a positive verdict sent its forced
/// data backup of the next step, then the status recording the verdict it owed its tree
/// neighbours; that status was lost and the vnode died before resending it. Its replacement
/// restored data a step ahead of the status, made its detection state agree, and the verdict
/// was never passed on: a neighbour waited at the old step forever, locally converged, nothing
/// unacknowledged. The replacement now passes that verdict on again (`iterative` rule 6).
#[test]
fn regression_seeds_705_1305_1410_a_verdict_lost_with_its_status_is_passed_on_again() {
    for seed in [705, 1305, 1410, 1464, 1826, 2051, 2056, 2857] {
        iterative::run(&IterSimConfig::from_seed(seed)).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Found by the simulator's first version (seed 297, data backups on the store): without the
/// store's epoch fences (`backup.rs` rule 4), v0's first incarnation, paused 97 ms at step 0
/// and declared dead, came back as a zombie after its replacement had moved on several steps,
/// and wrote its stale step-0 state over the store's one live copy of v0's backup before it
/// read its exit; the next replacement restored it and advanced it, unconverged, through the
/// steps its status said had ended (step 0's global residual: 1e-4). With the fences the
/// zombie's write is refused and it stops. (After the later fixes, 600 seeds without store
/// fences no longer show it; the mechanism's own test is `backup.rs`'s
/// `a_zombie_cannot_replace_the_backup_its_replacement_read`.) Seed 18 has zombies the store
/// stopped (seed 13 did under rand 0.8; rand 0.10 draws ranges differently, and seed 13 no
/// longer uses a store).
#[test]
fn regression_seeds_297_18_zombie_store_writes_are_fenced() {
    let o = iterative::run(&IterSimConfig {
        store: true,
        ..IterSimConfig::from_seed(297)
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(o.replacements > 0, "{o:?}");
    let o = iterative::run(&IterSimConfig::from_seed(18)).unwrap_or_else(|e| panic!("{e}"));
    assert!(o.config.store && o.superseded > 0, "{o:?}");
}

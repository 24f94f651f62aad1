//! Statistical soundness of the Monte-Carlo test of forgery (paper 001 §V, Proposition 2), and
//! the uniformity of the draw it relies on ([`Draws`]).
//!
//! The simulation, seeded and deterministic:
//!
//! 1. Each of the n tasks of a run is forged independently with probability q (a ChaCha8
//!    generator with a fixed seed per (ε, q, n)).
//! 2. The tester checks k = [`sample_size`]`(ε, q, n)` tasks drawn by [`Draws::new`]`(n, seed)`
//!    — the same iterator `certify` uses — with a fresh seed per certification, and ACCEPTs iff
//!    none of them is forged.
//! 3. Runs without any forgery (H0) are skipped; we keep going until [`TRIALS_H1`] runs with at
//!    least one forgery (H1) were certified, and measure β̂ = ACCEPTs / [`TRIALS_H1`], an
//!    estimate of β = P(ACCEPT | H1).
//!
//! The margin, stated once: with m = [`TRIALS_H1`] certifications under H1, β̂ is binomial;
//! if β were exactly ε its standard deviation would be σ_ε = sqrt(ε(1-ε)/m). Soundness holds
//! when β̂ ≤ ε + 3σ_ε: this is the one-sided score test of "β ≤ ε" at z = 3 (a false alarm
//! rate of 0.13% when β = ε; equivalently, ε is not below the lower end of β̂'s Wilson score
//! interval at z = 3). We also ask more than soundness: β̂ must match the exact β of
//! [`beta`] within 4 of its own standard deviations, sqrt(β(1-β)/m) (two-sided, 6·10⁻⁵), so a
//! simulation that accepted too *rarely* (a broken tester) would fail too. All m·β here are
//! ≥ 90, where the normal approximation behind both margins is good.
//!
//! The negative control checks k/3 tasks instead of k: β̂ must then be *above* ε + 3σ_ε, i.e.
//! the soundness assertion would fail; it shows the test can fail.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use statrs::distribution::{ChiSquared, ContinuousCDF};
use veriflow_certifier::sample::{beta, sample_size};
use veriflow_certifier::Draws;

/// The (ε, q) pairs simulated: the paper's example (5%, 1%), Fig. 7's (10%, 1%), a higher
/// forgery rate and a stricter ε.
const PAIRS: [(f64, f64); 4] = [(0.05, 0.01), (0.1, 0.01), (0.05, 0.05), (0.01, 0.1)];

/// Run sizes: around the paper's "at least 300 tasks", and past where f(n) has reached N.
const SIZES: [u64; 3] = [300, 1_000, 5_000];

/// Certifications with at least one forgery per (ε, q, n): 3 × 10,000 = 30,000 per (ε, q), well
/// over the ≥ 2,000 asked, so that 3σ_ε ≤ 0.009 even at ε = 10% (and the file still runs in
/// about a second with the test profile).
const TRIALS_H1: u64 = 10_000;

/// The z of the soundness margin (one-sided score test).
const Z_SOUND: f64 = 3.0;

/// The z of the agreement with the exact β (two-sided).
const Z_EXACT: f64 = 4.0;

/// What the simulation of one (ε, q, n, k) measured.
#[derive(Debug, Clone, Copy)]
struct Estimate {
    /// Certifications of runs with at least one forgery (H1).
    h1: u64,
    /// Of those, how many the tester accepted.
    accepted: u64,
    /// Runs without forgery, skipped.
    h0: u64,
}

impl Estimate {
    /// β̂ = P(ACCEPT | H1) measured.
    fn rate(&self) -> f64 {
        self.accepted as f64 / self.h1 as f64
    }

    /// Standard deviation of β̂ if the true rate were `p`.
    fn sd(&self, p: f64) -> f64 {
        (p * (1.0 - p) / self.h1 as f64).sqrt()
    }

    /// The soundness assertion's condition: β̂ ≤ ε + 3σ_ε.
    fn sound(&self, eps: f64) -> bool {
        self.rate() <= eps + Z_SOUND * self.sd(eps)
    }
}

/// Rules 1-3 of the module docs: certifications of runs of `n` tasks each forged with
/// probability `q`, checking `k` drawn tasks, until `trials_h1` runs had a forgery.
fn simulate(q: f64, n: u64, k: u64, trials_h1: u64, seed: u64) -> Estimate {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = usize::try_from(n).expect("n fits in memory");
    let k = usize::try_from(k).expect("k <= n");
    let mut forged = vec![false; n];
    let mut est = Estimate {
        h1: 0,
        accepted: 0,
        h0: 0,
    };
    while est.h1 < trials_h1 {
        let mut any = false;
        for f in forged.iter_mut() {
            *f = rng.random_bool(q);
            any |= *f;
        }
        // The draw's seed comes from the same stream: independent of the forgeries.
        let draw_seed: u64 = rng.random();
        if !any {
            est.h0 += 1;
            continue;
        }
        est.h1 += 1;
        let caught = Draws::new(n, draw_seed).take(k).any(|i| forged[i]);
        est.accepted += u64::from(!caught);
    }
    est
}

/// A fixed seed per (ε, q, n), printed on failure.
fn seed_of(eps: f64, q: f64, n: u64) -> u64 {
    eps.to_bits() ^ q.to_bits().rotate_left(17) ^ n.rotate_left(40)
}

#[test]
fn accepting_a_forged_run_is_at_most_epsilon() {
    for (eps, q) in PAIRS {
        for n in SIZES {
            let k = sample_size(eps, q, n).unwrap();
            let exact = beta(q, n, k);
            assert!(exact <= eps, "sample_size gives beta {exact} > {eps}");
            let seed = seed_of(eps, q, n);
            let est = simulate(q, n, k, TRIALS_H1, seed);
            let rate = est.rate();
            println!(
                "eps {eps} q {q} n {n} k {k}: P(ACCEPT|H1) measured {rate:.4} over {} runs \
                 ({} without forgery skipped), exact beta {exact:.4}, bound {:.4}",
                est.h1,
                est.h0,
                eps + Z_SOUND * est.sd(eps)
            );
            assert!(
                est.sound(eps),
                "eps {eps} q {q} n {n} k {k} seed {seed}: measured {rate} > eps + 3 sd = {}",
                eps + Z_SOUND * est.sd(eps)
            );
            assert!(
                (rate - exact).abs() <= Z_EXACT * est.sd(exact),
                "eps {eps} q {q} n {n} k {k} seed {seed}: measured {rate}, exact beta {exact} \
                 (4 sd = {})",
                Z_EXACT * est.sd(exact)
            );
        }
    }
}

#[test]
fn a_third_of_the_checks_fails_the_bound() {
    for (eps, q) in PAIRS {
        for n in SIZES {
            let k = sample_size(eps, q, n).unwrap() / 3;
            let seed = seed_of(eps, q, n) ^ 0x5eed;
            let est = simulate(q, n, k, TRIALS_H1, seed);
            let rate = est.rate();
            println!(
                "control eps {eps} q {q} n {n} k/3 = {k}: P(ACCEPT|H1) measured {rate:.4}, \
                 exact beta {:.4}",
                beta(q, n, k)
            );
            assert!(
                !est.sound(eps),
                "eps {eps} q {q} n {n} k/3 = {k} seed {seed}: measured {rate} passes the bound \
                 {}: the soundness test cannot tell too few checks",
                eps + Z_SOUND * est.sd(eps)
            );
            // Clearly above, not at the edge: at least twice ε.
            assert!(rate > 2.0 * eps, "{rate}");
        }
    }
}

/// The p-value of Pearson's chi-square statistic of `counts` against equal expected counts.
fn uniform_p_value(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    let expected = total as f64 / counts.len() as f64;
    let stat: f64 = counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    let dof = (counts.len() - 1) as f64;
    1.0 - ChiSquared::new(dof).unwrap().cdf(stat)
}

/// Below this p-value a frequency table is declared non-uniform. The seeds are fixed, so each
/// test either always passes or always fails; 10⁻³ leaves room for the several tables here.
const P_MIN: f64 = 1e-3;

#[test]
fn the_chi_square_helper_rejects_a_biased_table() {
    assert!(uniform_p_value(&[1000, 1000, 1000, 1000]) > 0.99);
    assert!(uniform_p_value(&[1100, 1000, 1000, 900]) < P_MIN);
}

#[test]
fn draws_are_a_permutation_without_replacement() {
    for n in [0usize, 1, 2, 3, 7, 100, 1_000, 4_096] {
        for seed in 0..20u64 {
            let mut d = Draws::new(n, seed);
            let mut all: Vec<usize> = d.by_ref().collect();
            assert_eq!(d.next(), None, "n {n} seed {seed}: draws after the last");
            assert_eq!(all.len(), n, "n {n} seed {seed}");
            all.sort_unstable();
            assert!(
                all.iter().copied().eq(0..n),
                "n {n} seed {seed}: a task drawn twice or never"
            );
        }
    }
}

#[test]
fn draws_are_reproducible_from_their_seed() {
    let a: Vec<usize> = Draws::new(1_000, 42).take(300).collect();
    let b: Vec<usize> = Draws::new(1_000, 42).take(300).collect();
    let c: Vec<usize> = Draws::new(1_000, 43).take(300).collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn every_order_of_four_tasks_is_equally_likely() {
    // 24 orders, 2,000 expected each.
    const N: usize = 4;
    let mut counts = [0u64; 24];
    for seed in 0..48_000u64 {
        let order: Vec<usize> = Draws::new(N, seed).collect();
        // The rank of the permutation in the factorial number system.
        let mut rank = 0;
        for (i, &v) in order.iter().enumerate() {
            let smaller_after = order[i + 1..].iter().filter(|&&w| w < v).count();
            rank = rank * (N - i) + smaller_after;
        }
        counts[rank] += 1;
    }
    let p = uniform_p_value(&counts);
    assert!(p > P_MIN, "orders not uniform (p = {p}): {counts:?}");
}

#[test]
fn each_position_of_the_draw_is_uniform() {
    // 50 tasks, 20,000 seeds: 400 expected per task at each position looked at.
    const N: usize = 50;
    let positions = [0usize, 1, 24, 49];
    let mut counts = vec![[0u64; N]; positions.len()];
    for seed in 0..20_000u64 {
        let order: Vec<usize> = Draws::new(N, seed).collect();
        for (c, &pos) in counts.iter_mut().zip(&positions) {
            c[order[pos]] += 1;
        }
    }
    for (c, pos) in counts.iter().zip(positions) {
        let p = uniform_p_value(c);
        assert!(p > P_MIN, "position {pos} not uniform (p = {p}): {c:?}");
    }
}

#[test]
fn the_first_draws_of_a_large_run_cover_it_uniformly() {
    // What certify does: a few hundred draws out of many tasks. The first 3 draws of 10,000
    // tasks over 20,000 seeds, in 20 buckets of 500 tasks (3,000 expected per bucket).
    const N: usize = 10_000;
    let mut buckets = [0u64; 20];
    for seed in 0..20_000u64 {
        for i in Draws::new(N, seed).take(3) {
            buckets[i / 500] += 1;
        }
    }
    let p = uniform_p_value(&buckets);
    assert!(p > P_MIN, "not uniform over 0..{N} (p = {p}): {buckets:?}");
}

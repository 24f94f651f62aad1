//! How many tasks to check (paper 001 §V, Proposition 2, Fig. 4).
//!
//! With n tasks each forged with probability at most q, checking k of them drawn uniformly
//! without replacement accepts a forged run with probability
//! β(k) = ((1-q)^k - (1-q)^n) / (1 - (1-q)^n). Rules:
//!
//! 1. [`n_eps_q`]: N = ln ε / ln(1-q), the number of checks that suffices for every n.
//! 2. [`f_eps_q`]: f(n) = ln((1-q)^n (1-ε) + ε) / ln(1-q), the exact bound for n tasks;
//!    non-decreasing in n, equal to n for small n, tending to N.
//! 3. [`sample_size`]: k = min(⌈f(n)⌉, n): then β(k) ≤ ε.
//! 4. [`hypergeometric_size`]: when at least b of the n tasks are forged (not each with
//!    probability q), the smallest k with P(no forged task among k drawn) ≤ ε, exactly, from
//!    the hypergeometric law (statrs).
//! 5. [`q_hat`]: after k clean checks, fewer than q̂ = 1 - ε^(1/k) of the tasks are forged, at
//!    confidence 1 - ε (the bound a certificate reports).
//!
//! Parameters outside (0, 1) are errors, never NaN.

use statrs::distribution::{Discrete, Hypergeometric};

/// Parameters of a certification that are out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SampleError {
    /// ε must be in (0, 1).
    #[error("epsilon must be strictly between 0 and 1, not {0}")]
    Epsilon(f64),
    /// q must be in (0, 1).
    #[error("q must be strictly between 0 and 1, not {0}")]
    Q(f64),
    /// b must be in 1..=n.
    #[error("the number of forged tasks must be between 1 and n = {n}, not {b}")]
    Forged {
        /// Tasks.
        n: u64,
        /// Forged tasks.
        b: u64,
    },
}

fn check(eps: f64, q: f64) -> Result<(), SampleError> {
    if !(eps > 0.0 && eps < 1.0) {
        return Err(SampleError::Epsilon(eps));
    }
    if !(q > 0.0 && q < 1.0) {
        return Err(SampleError::Q(q));
    }
    Ok(())
}

/// Rule 1: N_{ε,q} = ln ε / ln(1-q).
pub fn n_eps_q(eps: f64, q: f64) -> Result<f64, SampleError> {
    check(eps, q)?;
    Ok(eps.ln() / (-q).ln_1p())
}

/// Rule 2: f_{ε,q}(n).
pub fn f_eps_q(eps: f64, q: f64, n: u64) -> Result<f64, SampleError> {
    check(eps, q)?;
    let l = (-q).ln_1p();
    // (1-q)^n computed in log space: exact for large n, never overflows.
    let pn = (n as f64 * l).exp();
    Ok((pn * (1.0 - eps) + eps).ln() / l)
}

/// Rule 3: k = min(⌈f(n)⌉, n).
pub fn sample_size(eps: f64, q: f64, n: u64) -> Result<u64, SampleError> {
    let f = f_eps_q(eps, q, n)?;
    // f is at most N, far below u64::MAX; the tiny slack absorbs rounding when f is an
    // integer in exact arithmetic (e.g. f(n) = n for n = 1).
    let k = (f - 1e-9).ceil().max(0.0) as u64;
    Ok(k.min(n))
}

/// The probability β that k clean checks accept a run of n tasks with forgery rate q.
pub fn beta(q: f64, n: u64, k: u64) -> f64 {
    let l = (-q).ln_1p();
    let pk = (k.min(n) as f64 * l).exp();
    let pn = (n as f64 * l).exp();
    if pn >= 1.0 {
        return 0.0;
    }
    ((pk - pn) / (1.0 - pn)).max(0.0)
}

/// Rule 4: the smallest k such that drawing k of n tasks, of which b are forged, misses them
/// all with probability at most ε.
pub fn hypergeometric_size(eps: f64, n: u64, b: u64) -> Result<u64, SampleError> {
    if !(eps > 0.0 && eps < 1.0) {
        return Err(SampleError::Epsilon(eps));
    }
    if b == 0 || b > n {
        return Err(SampleError::Forged { n, b });
    }
    let miss = |k: u64| -> f64 { Hypergeometric::new(n, b, k).map_or(0.0, |h| h.pmf(0)) };
    // P(miss) falls as k grows: binary search the first k with miss(k) ≤ ε.
    let (mut lo, mut hi) = (0u64, n - b + 1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if miss(mid) <= eps {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(lo)
}

/// Rule 5: q̂ = 1 - ε^(1/k) (1 when nothing was checked).
pub fn q_hat(eps: f64, k: u64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    -(eps.ln() / k as f64).exp_m1()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_example() {
        let n = n_eps_q(0.05, 0.01).unwrap();
        assert!((n - 298.07).abs() < 0.01, "{n}");
        assert_eq!(sample_size(0.05, 0.01, 1_000_000).unwrap(), 299);
        assert_eq!(sample_size(0.05, 0.01, 1 << 40).unwrap(), 299);
    }

    #[test]
    fn f_is_non_decreasing_tends_to_n_and_equals_n_for_small_n() {
        for &(eps, q) in &[(0.05, 0.01), (0.1, 0.01), (1e-3, 0.05), (0.01, 0.2)] {
            let big = n_eps_q(eps, q).unwrap();
            let mut prev = 0.0;
            for n in 1..20_000u64 {
                let f = f_eps_q(eps, q, n).unwrap();
                assert!(f + 1e-9 >= prev, "f decreases at n = {n}");
                assert!(f <= big + 1e-9 && f <= n as f64 + 1e-9);
                prev = f;
            }
            assert!((f_eps_q(eps, q, 1 << 30).unwrap() - big).abs() < 1e-6);
            assert_eq!(sample_size(eps, q, 1).unwrap(), 1);
            assert_eq!(sample_size(eps, q, 2).unwrap(), 2);
        }
    }

    #[test]
    fn k_keeps_beta_below_epsilon_and_k_minus_one_does_not() {
        for &(eps, q) in &[(0.05, 0.01), (0.1, 0.01), (0.01, 0.05)] {
            for n in [10u64, 50, 100, 300, 1_000, 8_000, 32_000, 1_000_000] {
                let k = sample_size(eps, q, n).unwrap();
                assert!(beta(q, n, k) <= eps + 1e-12, "n {n} k {k}");
                if k > 1 && k < n {
                    assert!(
                        beta(q, n, k - 1) > eps,
                        "k {k} is not the smallest at n {n}"
                    );
                }
            }
        }
    }

    #[test]
    fn hypergeometric_size_matches_the_issue() {
        assert_eq!(hypergeometric_size(1e-3, 1000, 10).unwrap(), 497);
        assert_eq!(hypergeometric_size(0.5, 10, 10).unwrap(), 1);
        assert_eq!(hypergeometric_size(1e-9, 10, 1).unwrap(), 10);
    }

    #[test]
    fn q_hat_inverts_n() {
        let k = sample_size(0.05, 0.01, 1_000_000).unwrap();
        let qh = q_hat(0.05, k);
        assert!(qh <= 0.01 && qh > 0.0099, "{qh}");
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert_eq!(n_eps_q(0.0, 0.1), Err(SampleError::Epsilon(0.0)));
        assert_eq!(n_eps_q(0.1, 1.0), Err(SampleError::Q(1.0)));
        assert!(n_eps_q(f64::NAN, 0.1).is_err());
        assert!(hypergeometric_size(0.1, 10, 11).is_err());
        assert!(hypergeometric_size(0.1, 10, 0).is_err());
    }
}

//! Medians and spread of a sample (rules 4 and 5 of the harness).

use anyhow::{Context, Result};

/// Median, minimum and maximum of a sample: the one reduction every experiment reports.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Median (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

impl Stats {
    /// The statistics of `values`; `None` when empty.
    pub fn of(values: &[f64]) -> Option<Stats> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stats {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }

    /// The statistics of `values`, an error when there are none (rule 5).
    pub fn require(values: &[f64]) -> Result<Stats> {
        Stats::of(values).context("no runs to take statistics of")
    }

    /// The statistics of `f` over `items`.
    pub fn by<T>(items: &[T], f: impl Fn(&T) -> f64) -> Option<Stats> {
        Stats::of(&items.iter().map(f).collect::<Vec<_>>())
    }

    /// (max − min) / median: the spread as a share of the median (0 for a median of 0).
    pub fn spread(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median
        }
    }
}

/// The median of `values`, NaN when there are none.
pub fn median(values: &[f64]) -> f64 {
    Stats::of(values).map_or(f64::NAN, |s| s.median)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max_and_spread() {
        let s = Stats::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(s.spread(), 1.0);
        let even = Stats::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(even.median, 2.5);
        assert_eq!((even.min, even.max), (1.0, 4.0));
        assert!(Stats::of(&[]).is_none());
        assert!(Stats::require(&[]).is_err());
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[5.0, 1.0, 9.0, 7.0, 3.0]), 5.0);
        assert_eq!(
            Stats::by(&[(1, 10.0), (2, 30.0)], |p| p.1).unwrap().median,
            20.0
        );
    }
}

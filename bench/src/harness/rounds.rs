//! Interleaved repetitions with a quiet wait and a retry budget (rule 1-3 of the harness).

use std::fmt::Write as _;

use anyhow::Result;

use super::cpu::{Disturbed, Quiet};
use super::Stats;

/// A measurement that knows its time and what other processes took meanwhile.
pub trait Timed {
    /// The time measured, in seconds.
    fn seconds(&self) -> f64;
    /// CPU seconds other processes used during it; `None` where unknown (never disturbed).
    fn foreign_cpu_s(&self) -> Option<f64>;
}

/// A bare time in seconds, with no record of other processes (never disturbed).
impl Timed for f64 {
    fn seconds(&self) -> f64 {
        *self
    }
    fn foreign_cpu_s(&self) -> Option<f64> {
        None
    }
}

/// `1.23`, or `?` when unknown.
pub fn cpu_text(s: Option<f64>) -> String {
    s.map_or_else(|| "?".to_string(), |s| format!("{s:.2}"))
}

/// The retry budget of a series (rule 3): a disturbed measurement is run again while retries
/// are left; past that it is kept and counted.
#[derive(Clone, Copy, Debug)]
pub struct Retries {
    left: u32,
    /// Measurements (or rounds) discarded and run again.
    pub rerun: u32,
    /// Disturbed measurements (or rounds) kept because no retry was left.
    pub kept_disturbed: u32,
}

impl Retries {
    /// A budget of `n` retries.
    pub fn new(n: u32) -> Retries {
        Retries {
            left: n,
            rerun: 0,
            kept_disturbed: 0,
        }
    }

    /// What the log line says of a measurement, before [`Retries::keep`] decides.
    pub fn note(&self, bad: bool) -> &'static str {
        match (bad, self.left > 0) {
            (false, _) => "",
            (true, true) => " -- disturbed, run again",
            (true, false) => " -- disturbed, kept (no retry left)",
        }
    }

    /// Whether to keep a measurement that was `bad` (disturbed), spending a retry when not.
    pub fn keep(&mut self, bad: bool) -> bool {
        if bad && self.left > 0 {
            self.left -= 1;
            self.rerun += 1;
            return false;
        }
        self.kept_disturbed += u32::from(bad);
        true
    }
}

/// What is run again when a measurement is disturbed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redo {
    /// The whole round (every setting once): the settings of a kept round were measured side
    /// by side, so that their ratios pair (`paper overhead`, `cluster`).
    Round,
    /// The one disturbed run, at once; with `quiet_first`, after a quiet wait.
    Run {
        /// Wait for a quiet machine before the run is done again.
        quiet_first: bool,
    },
}

/// How a series is repeated (rules 1-3).
#[derive(Clone, Debug)]
pub struct Rounds {
    /// Kept rounds wanted.
    pub runs: usize,
    /// The wait before each round.
    pub quiet: Quiet,
    /// Retries of the whole series.
    pub retries: u32,
    /// The rule that makes a measurement disturbed.
    pub disturbed: Disturbed,
    /// What a retry runs again.
    pub redo: Redo,
    /// The start of every progress line (`grain 100 µs`, `n = 16`).
    pub label: String,
}

/// The measurements of one series.
#[derive(Clone, Debug)]
pub struct Series<R> {
    /// Kept measurements, one list per setting, in round order.
    pub kept: Vec<Vec<R>>,
    /// Discarded measurements with their setting's index, in the order they were run (with
    /// [`Redo::Round`], whole rounds: see [`Series::discarded_rounds`]).
    pub discarded: Vec<(usize, R)>,
    /// Retries spent.
    pub rerun: u32,
    /// Disturbed rounds (or runs) kept because no retry was left.
    pub kept_disturbed: u32,
    /// Rounds started although the machine was not quiet.
    pub not_quiet: u32,
}

impl<R: Timed> Series<R> {
    /// The time statistics of setting `i`'s kept runs.
    pub fn stats(&self, i: usize) -> Result<Stats> {
        Stats::require(&self.seconds(i))
    }

    /// Setting `i`'s kept times.
    pub fn seconds(&self, i: usize) -> Vec<f64> {
        self.kept[i].iter().map(Timed::seconds).collect()
    }

    /// The discarded rounds (with [`Redo::Round`]), each the runs of every setting in order.
    pub fn discarded_rounds(&self) -> Vec<Vec<&R>> {
        self.discarded
            .chunks(self.kept.len().max(1))
            .map(|c| c.iter().map(|(_, r)| r).collect())
            .collect()
    }

    /// Per kept round: whether none of its runs broke `rule` (the rounds kept disturbed once
    /// the retries ran out are the others).
    pub fn clean(&self, rule: &Disturbed) -> Vec<bool> {
        let rounds = self.kept.first().map_or(0, Vec::len);
        (0..rounds)
            .map(|j| {
                self.kept
                    .iter()
                    .all(|runs| !rule.is(runs[j].foreign_cpu_s(), runs[j].seconds()))
            })
            .collect()
    }

    /// Most CPU seconds other processes took during one kept run.
    pub fn max_foreign(&self) -> Option<f64> {
        self.kept
            .iter()
            .flatten()
            .filter_map(Timed::foreign_cpu_s)
            .reduce(f64::max)
    }
}

impl Rounds {
    /// Runs `settings` settings in turn, `runs` rounds (rule 1): `run(round, i)` measures
    /// setting `i` in round `round` (the kept rounds before it); `show(i, r)` says what it
    /// measured in the progress line. Before each round, the quiet wait (rule 2); a disturbed
    /// measurement (rule 3) is run again as `redo` says, while the retry budget lasts.
    pub fn run<R: Timed>(
        &self,
        settings: usize,
        mut run: impl FnMut(usize, usize) -> Result<R>,
        show: impl Fn(usize, &R) -> String,
    ) -> Result<Series<R>> {
        let mut series = Series {
            kept: (0..settings).map(|_| Vec::new()).collect(),
            discarded: Vec::new(),
            rerun: 0,
            kept_disturbed: 0,
            not_quiet: 0,
        };
        let mut retries = Retries::new(self.retries);
        let bad = |r: &R| self.disturbed.is(r.foreign_cpu_s(), r.seconds());
        let mut round = 0;
        while round < self.runs && settings > 0 {
            self.quiet(&mut series);
            let mut line = format!("  {}run {}/{}:", self.prefix(), round + 1, self.runs);
            let mut rep = Vec::with_capacity(settings);
            for i in 0..settings {
                let r = loop {
                    let r = run(round, i)?;
                    let Redo::Run { quiet_first } = self.redo else {
                        break r;
                    };
                    let b = bad(&r);
                    if b {
                        eprintln!(
                            "  {}{} disturbed (other processes' CPU {} s){}",
                            self.prefix(),
                            show(i, &r),
                            cpu_text(r.foreign_cpu_s()),
                            retries.note(true)
                        );
                    }
                    if retries.keep(b) {
                        break r;
                    }
                    series.discarded.push((i, r));
                    if quiet_first {
                        self.quiet(&mut series);
                    }
                };
                let _ = write!(line, " {},", show(i, &r));
                rep.push(r);
            }
            if self.redo == Redo::Round {
                let b = rep.iter().any(bad);
                let others: Vec<String> = rep.iter().map(|r| cpu_text(r.foreign_cpu_s())).collect();
                eprintln!(
                    "{line} other processes' CPU {} s{}",
                    others.join(" / "),
                    retries.note(b)
                );
                if !retries.keep(b) {
                    series.discarded.extend(rep.into_iter().enumerate());
                    continue;
                }
            } else {
                eprintln!("{}", line.trim_end_matches(','));
            }
            for (kept, r) in series.kept.iter_mut().zip(rep) {
                kept.push(r);
            }
            round += 1;
        }
        series.rerun = retries.rerun;
        series.kept_disturbed = retries.kept_disturbed;
        Ok(series)
    }

    /// The parameters of the repetition, for a report's `parameters`: `quiet_wait_s`,
    /// `quiet_cores`, `retries` and the `disturbed` rule.
    pub fn parameters(&self) -> serde_json::Value {
        serde_json::json!({
            "quiet_wait_s": self.quiet.wait.as_secs(),
            "quiet_cores": self.quiet.cores,
            "retries": self.retries,
            "disturbed": self.disturbed.text(),
        })
    }

    fn prefix(&self) -> String {
        if self.label.is_empty() {
            String::new()
        } else {
            format!("{} ", self.label)
        }
    }

    fn quiet<R>(&self, series: &mut Series<R>) {
        if !self.quiet.wait() {
            series.not_quiet += 1;
            eprintln!(
                "  (machine still busy after {} s: running anyway)",
                self.quiet.wait.as_secs()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct M {
        setting: usize,
        call: usize,
        foreign: Option<f64>,
    }

    impl Timed for M {
        fn seconds(&self) -> f64 {
            1.0
        }
        fn foreign_cpu_s(&self) -> Option<f64> {
            self.foreign
        }
    }

    fn rounds(runs: usize, retries: u32, redo: Redo) -> Rounds {
        Rounds {
            runs,
            quiet: super::super::Quiet::secs(0),
            retries,
            // 0.05 + 0.05 x 1 x 1 s: 0.1 CPU-s.
            disturbed: Disturbed::threads(1),
            redo,
            label: "test".into(),
        }
    }

    /// Runs 3 settings; the calls numbered in `bad` are disturbed. Returns the series and the
    /// order of the calls (setting per call).
    fn series(runs: usize, retries: u32, redo: Redo, bad: &[usize]) -> (Series<M>, Vec<usize>) {
        let mut calls = Vec::new();
        let s = rounds(runs, retries, redo)
            .run(
                3,
                |_, i| {
                    let call = calls.len();
                    calls.push(i);
                    Ok(M {
                        setting: i,
                        call,
                        foreign: Some(if bad.contains(&call) { 1.0 } else { 0.0 }),
                    })
                },
                |i, m| format!("s{i} call {}", m.call),
            )
            .unwrap();
        (s, calls)
    }

    #[test]
    fn settings_interleave_round_by_round() {
        let (s, calls) = series(3, 0, Redo::Round, &[]);
        assert_eq!(calls, vec![0, 1, 2, 0, 1, 2, 0, 1, 2]);
        for (i, kept) in s.kept.iter().enumerate() {
            assert!(kept.iter().all(|m| m.setting == i));
            assert_eq!(
                kept.iter().map(|m| m.call).collect::<Vec<_>>(),
                vec![i, i + 3, i + 6]
            );
        }
        assert_eq!((s.rerun, s.kept_disturbed, s.not_quiet), (0, 0, 0));
    }

    #[test]
    fn a_disturbed_round_is_run_again_while_retries_last() {
        // Call 1 (round 1, setting 1) and call 4 (the retry's setting 1) are disturbed; one
        // retry: the first round is discarded whole, the second kept as disturbed.
        let (s, calls) = series(2, 1, Redo::Round, &[1, 4]);
        assert_eq!(calls.len(), 9);
        assert_eq!(s.rerun, 1);
        assert_eq!(s.kept_disturbed, 1);
        let rounds = s.discarded_rounds();
        assert_eq!(rounds.len(), 1);
        assert_eq!(
            rounds[0].iter().map(|m| m.call).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(
            s.kept[0].iter().map(|m| m.call).collect::<Vec<_>>(),
            vec![3, 6]
        );
        assert_eq!(
            s.kept[1].iter().map(|m| m.call).collect::<Vec<_>>(),
            vec![4, 7]
        );
        assert_eq!(s.clean(&Disturbed::threads(1)), vec![false, true]);
    }

    #[test]
    fn a_disturbed_run_alone_is_run_again() {
        // Call 1 is disturbed: setting 1 runs again at once (call 2), then setting 2.
        let (s, calls) = series(1, 5, Redo::Run { quiet_first: true }, &[1]);
        assert_eq!(calls, vec![0, 1, 1, 2]);
        assert_eq!(s.discarded.len(), 1);
        assert_eq!((s.discarded[0].0, s.discarded[0].1.call), (1, 1));
        assert_eq!(s.kept[1][0].call, 2);
        assert_eq!((s.rerun, s.kept_disturbed), (1, 0));
        // Without retries it is kept and counted.
        let (s, calls) = series(1, 0, Redo::Run { quiet_first: false }, &[1]);
        assert_eq!(calls, vec![0, 1, 2]);
        assert_eq!((s.rerun, s.kept_disturbed), (0, 1));
    }

    #[test]
    fn retries_count() {
        let mut r = Retries::new(1);
        assert_eq!(r.note(true), " -- disturbed, run again");
        assert!(!r.keep(true));
        assert_eq!(r.note(true), " -- disturbed, kept (no retry left)");
        assert!(r.keep(true));
        assert!(r.keep(false));
        assert_eq!((r.rerun, r.kept_disturbed), (1, 1));
    }
}

//! The harness every `paper` experiment runs on: interleaved repetitions, quiet waits,
//! disturbed-run retries, medians, reports and figures, so that an experiment's file is about
//! its experiment.
//!
//! Rules:
//!
//! 1. **Interleaved.** An experiment compares settings by running them in turn, round after
//!    round (S0, S1, S2, S0, S1, S2, ...), never one setting's runs in a block: a slow drift of
//!    the machine then hits every setting alike, and round i's runs pair ([`Rounds::run`]).
//! 2. **Quiet wait.** Before each round the harness waits up to `--quiet-wait` seconds for
//!    other processes to use less than [`QUIET_CORES`] cores; a round that starts on a busy
//!    machine anyway is counted ([`Series::not_quiet`]) and the report says so.
//! 3. **Disturbed runs.** Every measurement records the CPU time other processes took during
//!    it ([`CpuSnapshot`]). One that took more than the rule's share ([`Disturbed`]: 0.05
//!    CPU-s + 5 % of the run's CPUs × its time) is disturbed, and is run again while the
//!    series' `--retries` last: the whole round ([`Redo::Round`]) where the settings' ratios
//!    pair, the run alone ([`Redo::Run`]) elsewhere. Past the budget it is kept and counted
//!    ([`Retries`]). Discarded runs stay in the report.
//! 4. **Medians.** A setting is summarised by the median of its kept runs, with min and max
//!    as the spread ([`Stats`]); ratios are ratios of medians.
//! 5. **No empty statistics.** A statistic of no runs is an error ([`Stats::require`]) or an
//!    explicit `None`, never a zero that looks measured.
//! 6. **One report per command.** `<stem>.json` and `<stem>.md` in `--out`
//!    (`<name>-quick.*` for `--quick`), both opening with the standard block
//!    ([`Session`]): date, commit, CPU, cores, rustc, kernel, total time, load average before
//!    and after. The JSON keeps every raw run; `paper replot` and the README read it.
//! 7. **Figures in pairs.** A figure is drawn from the numbers the JSON holds, as `<name>.svg`
//!    and `<name>.png` ([`Plots::draw`]); a file that cannot be drawn (no fonts for the PNG) is
//!    left out and the report says why.
//! 8. **Children never outlive a run.** App binaries are built in this binary's profile before
//!    use ([`app_binary`]); every child is killed and reaped, with its process group, when its
//!    [`Guard`] drops.
//!
//! ```no_run
//! # use veriflow_bench::harness::{Disturbed, Quiet, Redo, Rounds, Session, Timed};
//! # struct Run(f64);
//! # impl Timed for Run { fn seconds(&self) -> f64 { self.0 } fn foreign_cpu_s(&self) -> Option<f64> { None } }
//! # fn measure(setting: usize) -> anyhow::Result<Run> { Ok(Run(1.0)) }
//! let session = Session::start(None, false)?;
//! let rounds = Rounds {
//!     runs: 5,
//!     quiet: Quiet::secs(60),
//!     retries: 3,
//!     disturbed: Disturbed::cores(),
//!     redo: Redo::Round,
//!     label: String::new(),
//! };
//! let series = rounds.run(2, |_round, i| measure(i), |i, r| format!("S{i} {:.3} s", r.0))?;
//! let ratio = series.stats(1)?.median / series.stats(0)?.median;
//! let stem = session.stem("example");
//! session.write("example", &stem, serde_json::json!({ "ratio": ratio }), "...")?;
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod cpu;
pub mod machine;
pub mod plot;
pub mod process;
pub mod report;
pub mod rounds;
pub mod stats;

pub use cpu::{
    cores, peak_rss_mib, process_cpu_s, status_mib, wait_for_quiet, CpuSnapshot, Disturbed, Quiet,
    QUIET_CORES,
};
pub use machine::{loadavg, utc_now, Machine};
pub use plot::{Figure, Plots, COLORS, PLOT_SIZE};
pub use process::{app_binary, knary_binary, Guard};
pub use report::{
    dir_bytes, merge, ms, out_dir, require_runs, scratch_dir, thousands, write_files, write_report,
    Session,
};
pub use rounds::{cpu_text, Redo, Retries, Rounds, Series, Timed};
pub use stats::{median, Stats};

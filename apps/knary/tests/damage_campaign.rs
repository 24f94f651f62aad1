//! Issue 13's damage campaign under `cargo test` (the long one is `paper damage`): a finished
//! and an interrupted knary run's stores, seeded random damages (bytes flipped in sled's files,
//! files cut short or deleted, segments deleted or duplicated through the store's API), and
//! `inspect`, `certify` and `run --resume` on each damaged copy, each under a time limit:
//! no hang, no panic, no exit 0 with missing data, no wrong ACCEPT, no reader that writes
//! (`veriflow_testkit::damage`).

use std::path::Path;
use std::time::Duration;

use veriflow_testkit::damage::{campaign, knary_baselines, tally};

/// Damages under `cargo test` (the first seeds; `paper damage --count 1000` runs many more).
const DAMAGES: u64 = 100;

/// Far above what one command takes here (well under a second): only a hang reaches it.
const HANG: Duration = Duration::from_secs(60);

#[test]
fn damaged_stores_never_hang_panic_or_answer_wrong() {
    let bin = Path::new(env!("CARGO_BIN_EXE_knary"));
    let work = tempfile::tempdir().unwrap();
    let baselines = knary_baselines(bin, work.path(), HANG).expect("baselines");
    let (trials, skipped) =
        campaign(bin, work.path(), &baselines, 1, DAMAGES, HANG, |_| {}).expect("campaign");
    let failures: Vec<String> = trials.iter().flat_map(|t| t.failures()).collect();
    for ((base, kind, cmd, outcome), n) in tally(&trials) {
        eprintln!("{base:12} {kind:18} {cmd:16} {outcome:24} {n}");
    }
    eprintln!(
        "{} damages ({skipped} draws found nothing to damage)",
        trials.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The campaign tests something: damages were reported, and some left the answer right.
    let outcomes: Vec<_> = trials
        .iter()
        .flat_map(|t| t.outcomes.iter().map(|o| o.1))
        .collect();
    assert!(outcomes.contains(&veriflow_testkit::damage::Outcome::Detected));
}

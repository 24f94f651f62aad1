//! `paper damage`: issue 13's damage campaign, at scale.
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- damage [--count N] [--first-seed S]
//!     [--timeout SECS] [--knary-bin PATH] [--out DIR]
//! ```
//!
//! Makes the stores of a finished knary run and of one killed with SIGKILL part way
//! (`veriflow_testkit::damage::knary_baselines`), then, for N seeds, damages a copy of one of
//! them (alternately) with one damage drawn from the seed: a byte flipped in sled's `db` file,
//! in a blob file or in another file; the `db` file or a blob file cut short; a blob or another
//! file deleted; a log segment deleted, or copied over another segment key, or another key
//! (manifest, durable watermark) deleted through the store's API. On each damaged copy it runs
//! `knary inspect`, `knary certify` and `knary run --resume`, each with a time limit, and sorts
//! the outcomes (`veriflow_testkit::damage::Outcome`): reported (exit 1 with a message), right
//! answer (exit 0 with what the intact store gives), or a failure: hang, panic, exit 0 with
//! missing data, wrong ACCEPT, a reader that wrote, another exit status. Results:
//! `damage.json` (every trial, and the counts) and `damage.md` (counts per damage kind and
//! outcome, and every failure with its seed).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use veriflow_testkit::damage::{campaign, knary_baselines, Kind, Outcome, Trial};

use crate::harness::{knary_binary, Session};

/// Options of `paper damage`.
#[derive(Args, Debug)]
pub struct DamageArgs {
    /// Damages to apply (each judged by inspect, certify and run --resume).
    #[arg(long, default_value_t = 1000)]
    pub count: u64,
    /// First seed (seeds are consecutive; a failure names its seed).
    #[arg(long, default_value_t = 1)]
    pub first_seed: u64,
    /// Time limit of one command: reaching it counts as a hang.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub timeout: u64,
    /// The `knary` binary [default: beside this binary, built first with `cargo build -p
    /// knary` in this binary's profile].
    #[arg(long, value_name = "PATH")]
    pub knary_bin: Option<PathBuf>,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Runs `paper damage` (module docs) and writes its results.
pub fn run(args: &DamageArgs) -> Result<()> {
    let knary = knary_binary(args.knary_bin.as_deref())?;
    let session = Session::start(args.out.as_deref(), false)?;
    let work = tempfile::Builder::new()
        .prefix("veriflow-damage-")
        .tempdir()
        .context("creating a work directory")?;
    let limit = Duration::from_secs(args.timeout);
    let t0 = Instant::now();
    let baselines = knary_baselines(&knary, work.path(), limit)
        .map_err(anyhow::Error::msg)
        .context("making the baseline stores")?;
    for b in &baselines {
        eprintln!(
            "baseline {}: {} events, status {}",
            b.name, b.inspect["events"], b.inspect["status"]
        );
    }
    let (trials, skipped) = campaign(
        &knary,
        work.path(),
        &baselines,
        args.first_seed,
        args.count,
        limit,
        |t| {
            let failed = t.failures();
            if !failed.is_empty() {
                eprintln!("{}", failed.join("\n"));
            } else if t.seed % 50 == 0 {
                eprintln!(
                    "seed {}: {} damages so far",
                    t.seed,
                    t.seed - args.first_seed + 1
                );
            }
        },
    )
    .context("running the campaign")?;
    let elapsed = t0.elapsed();
    let failures: Vec<String> = trials.iter().flat_map(Trial::failures).collect();

    // Counts per kind and outcome (over the three commands), and per command and outcome.
    let mut by_kind: BTreeMap<Kind, BTreeMap<Outcome, u64>> = BTreeMap::new();
    let mut damages: BTreeMap<Kind, u64> = BTreeMap::new();
    let mut by_cmd: BTreeMap<(&str, &str), BTreeMap<Outcome, u64>> = BTreeMap::new();
    for t in &trials {
        *damages.entry(t.kind).or_default() += 1;
        for (cmd, o, _) in &t.outcomes {
            *by_kind.entry(t.kind).or_default().entry(*o).or_default() += 1;
            *by_cmd
                .entry((t.baseline, cmd))
                .or_default()
                .entry(*o)
                .or_default() += 1;
        }
    }
    let outcomes: Vec<Outcome> = {
        let mut all: Vec<Outcome> = by_kind.values().flat_map(|m| m.keys().copied()).collect();
        all.sort();
        all.dedup();
        all
    };
    let count = |m: &BTreeMap<Outcome, u64>, o: Outcome| m.get(&o).copied().unwrap_or(0);
    let total_of = |o: Outcome| -> u64 { by_kind.values().map(|m| count(m, o)).sum() };

    let json = json!({
        "date": session.date,
        "command": format!("paper damage --count {} --first-seed {} --timeout {}", args.count, args.first_seed, args.timeout),
        "elapsed_s": elapsed.as_secs_f64(),
        "damages": trials.len(),
        "skipped_draws": skipped,
        "baselines": baselines.iter().map(|b| json!({"name": b.name, "inspect": b.inspect, "run": b.run_args})).collect::<Vec<_>>(),
        "by_kind": damages.iter().map(|(k, n)| json!({
            "kind": k.name(),
            "damages": n,
            "outcomes": by_kind[k].iter().map(|(o, c)| (o.name().to_string(), json!(c))).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "by_command": by_cmd.iter().map(|((b, c), m)| json!({
            "baseline": b, "command": c,
            "outcomes": m.iter().map(|(o, n)| (o.name().to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "failures": failures,
        "trials": trials.iter().map(|t| json!({
            "seed": t.seed, "baseline": t.baseline, "kind": t.kind.name(), "damage": t.damage,
            "outcomes": t.outcomes.iter().map(|(c, o, why)| json!({"command": c, "outcome": o.name(), "stderr": why})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    let mut md = String::new();
    let _ = writeln!(md, "# Damage campaign (issue 13)\n");
    let _ = writeln!(
        md,
        "`paper damage --count {} --first-seed {}`, {} cores ({}), {:.0} s: {} damages \
         ({} draws found nothing to damage and were skipped), each judged by `knary inspect`, \
         `knary certify` and `knary run --resume` with a {} s limit. Stores: a finished and an \
         interrupted (SIGKILLed) `knary run {}`, damaged alternately.\n",
        args.count,
        args.first_seed,
        session.machine.cores,
        session.machine.cpu.as_deref().unwrap_or("unknown CPU"),
        elapsed.as_secs_f64(),
        trials.len(),
        skipped,
        args.timeout,
        veriflow_testkit::damage::KNARY_RUN.join(" "),
    );
    let _ = writeln!(
        md,
        "Failures: {} hangs, {} panics, {} exit 0 with missing data, {} wrong ACCEPTs, {} readers \
         that wrote, {} other exit statuses.\n",
        total_of(Outcome::Hang),
        total_of(Outcome::Panic),
        total_of(Outcome::Silent),
        total_of(Outcome::WrongAccept),
        total_of(Outcome::ReaderWrote),
        total_of(Outcome::OtherExit),
    );
    let _ = writeln!(
        md,
        "## Outcomes per damage kind (three commands per damage)\n"
    );
    let _ = write!(md, "| damage | damages |");
    for o in &outcomes {
        let _ = write!(md, " {} |", o.name());
    }
    let _ = write!(md, "\n|---|---:|");
    for _ in &outcomes {
        let _ = write!(md, "---:|");
    }
    md.push('\n');
    for (k, n) in &damages {
        let _ = write!(md, "| {} | {n} |", k.name());
        for o in &outcomes {
            let _ = write!(md, " {} |", count(&by_kind[k], *o));
        }
        md.push('\n');
    }
    let _ = writeln!(md, "\n## Outcomes per store and command\n");
    let _ = write!(md, "| store | command |");
    for o in &outcomes {
        let _ = write!(md, " {} |", o.name());
    }
    let _ = write!(md, "\n|---|---|");
    for _ in &outcomes {
        let _ = write!(md, "---:|");
    }
    md.push('\n');
    for ((b, c), m) in &by_cmd {
        let _ = write!(md, "| {b} | {c} |");
        for o in &outcomes {
            let _ = write!(md, " {} |", count(m, *o));
        }
        md.push('\n');
    }
    let _ = writeln!(
        md,
        "\nExit 0 counts as right only when `inspect` reports what it reports on the intact store \
         (status, events per vnode, terminal outputs), `certify` says ACCEPT on such a store of a \
         finished run, and `run --resume` prints the right result. Every trial, with the first \
         line of each command's error, is in `damage.json`."
    );
    if !failures.is_empty() {
        let _ = writeln!(md, "\n## Failures\n");
        for f in &failures {
            let _ = writeln!(md, "- {f}");
        }
    }
    session.write("damage", "damage", json, &md)?;
    if !failures.is_empty() {
        bail!(
            "{} failures (see {})",
            failures.len(),
            session.out.join("damage.md").display()
        );
    }
    Ok(())
}

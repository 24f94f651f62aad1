//! `APP run` for an iterative program ([`Program::iterative`], paper 000): the blocks run in
//! this process, one thread per vnode (`veriflow_runtime::iterative::run_embedded`), and the
//! summary both `run` and the cluster commands print.
//!
//! Rules:
//!
//! 1. The run's vnodes are the program's blocks: `--vnodes` may only repeat their number.
//! 2. Data-flow options that mean nothing here (a task log to resume, certify or forge, kills
//!    after N tasks) are refused with a usage error, not ignored.
//! 3. `--log-dir`/`--store` keeps the data backups there (module rule 5 of iterative mode)
//!    instead of on a neighbour; `--kill-random K` kills K vnodes, one every `--kill-every`
//!    ms, drawn from `--seed`; `--loss P` loses each message with probability P.
//! 4. The result is the program's check of every vnode's final state; a failed check exits 1
//!    as for data-flow runs.

use std::time::Duration;

use serde_json::json;
use veriflow_runtime::iterative::{run_embedded, Embedded, IterKills, IterReport};

use crate::app::{CliError, InvalidArgs, Iterative, Program, RunArgs, WrongResult};

/// Rules 1-2: the options an iterative run refuses.
pub(crate) fn check<P: Program>(args: &RunArgs<P>, it: &Iterative) -> Result<(), InvalidArgs> {
    let rt = &args.runtime;
    let n = it.config.neighbours.len();
    let bad = |m: &str| {
        Err(InvalidArgs(format!(
            "an iterative run keeps no task log: {m}"
        )))
    };
    if rt.vnodes.is_some_and(|v| v as usize != n) {
        return Err(InvalidArgs(format!(
            "this iterative run has {n} blocks, one per vnode: --vnodes must be {n} or left out"
        )));
    }
    if rt.resume {
        return bad("--resume needs a data-flow run");
    }
    if rt.keep_log {
        return bad("--keep-log keeps the log directory of a data-flow run");
    }
    if args.certify {
        return bad("--certify needs a data-flow run");
    }
    if !rt.kill_vnode.is_empty() {
        return bad("--kill-vnode/--kill-after count tasks; use --kill-random K --kill-every MS");
    }
    if args.forge.forge_rate.is_some()
        || args.forge.forge_tasks.is_some()
        || !args.forge.forge_vnode.is_empty()
    {
        return bad("forgery injection needs a data-flow run");
    }
    if let Some(loss) = rt.loss.filter(|p| !(0.0..1.0).contains(p)) {
        return Err(InvalidArgs(format!(
            "--loss {loss}: a probability in [0, 1)"
        )));
    }
    it.config.validate().map_err(|e| InvalidArgs(e.to_string()))
}

/// `--kill-every` when not given: a vnode killed every second.
const DEFAULT_KILL_EVERY_MS: u64 = 1000;

/// Rule 3.
pub(crate) fn run<P: Program>(args: &RunArgs<P>, it: Iterative) -> Result<(), CliError> {
    let rt = &args.runtime;
    let mut config = it.config.clone();
    if let Some(spec) = rt.store.spec() {
        config.store = Some(rt.store.open(&spec)?);
    }
    let opts = Embedded {
        loss: rt.loss.unwrap_or(0.0),
        seed: rt.seed,
        kills: (rt.kill_random > 0).then_some(IterKills {
            every: Duration::from_millis(rt.kill_every_ms.unwrap_or(DEFAULT_KILL_EVERY_MS)),
            count: rt.kill_random,
            seed: rt.seed ^ 0x6b69_6c6c, // "kill"
        }),
        ..Embedded::default()
    };
    let report = run_embedded(config, it.factory.clone(), &opts)
        .map_err(|e| CliError::Invalid(format!("the run failed: {e}")))?;
    let checked = (it.check)(&report);
    print_summary::<P>(&it, &report, &checked, rt.json, &Where::Embedded);
    checked.map(drop).map_err(CliError::from)
}

/// Where an iterative run ran, for its summary.
pub(crate) enum Where {
    /// `run`: threads of this process.
    Embedded,
    /// A cluster: these workers, this many lost.
    Cluster { workers: u32, lost: u32 },
}

/// Rule 4: the summary of an iterative run, human or JSON.
pub(crate) fn print_summary<P: Program>(
    it: &Iterative,
    report: &IterReport,
    checked: &Result<serde_json::Value, WrongResult>,
    as_json: bool,
    at: &Where,
) {
    let mode = format!("{:?}", it.config.mode).to_lowercase();
    let secs = report.elapsed_s;
    let (workers, lost) = match at {
        Where::Embedded => (None, None),
        Where::Cluster { workers, lost } => (Some(*workers), Some(*lost)),
    };
    if as_json {
        println!(
            "{}",
            json!({
                "program": P::NAME,
                "mode": mode,
                "result": checked.as_ref().ok(),
                "correct": checked.is_ok(),
                "steps": report.steps,
                "iterations": report.iterations(),
                "messages": report.messages(),
                "negative_verdicts": report.negative_verdicts(),
                "replacements": report.replacements,
                "elapsed_s": secs,
                "vnodes": report.vnodes.len(),
                "workers": workers,
                "failures": lost,
                "per_vnode": report.vnodes,
            })
        );
        return;
    }
    match checked {
        Ok(v) => println!("{}: result {v} {}", P::NAME, crate::app::checked_note(v)),
        Err(e) => println!("{}: {e}", P::NAME),
    }
    let on = match workers {
        Some(w) => format!(" on {w} workers"),
        None => String::new(),
    };
    println!(
        "iterative ({mode}): {} steps, {} iterations, {} messages in {secs:.3} s{on}, {} vnodes",
        report.steps,
        report.iterations(),
        report.messages(),
        report.vnodes.len(),
    );
    if lost.is_some_and(|l| l > 0) || report.replacements > 0 {
        println!(
            "recovery: {} vnode(s) replaced and restored from their neighbours' backups{}",
            report.replacements,
            match lost {
                Some(l) => format!(" ({l} worker(s) lost)"),
                None => String::new(),
            }
        );
    }
}

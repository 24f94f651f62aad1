//! `paper cg`, part spmd: paper 002's Tables 2-4 with `cg run --mode spmd`, scaled here.
//!
//! Method:
//!
//! 1. The problem is `poisson3d:N` (N = 100: 10^6 unknowns) with b = A 1, solved by
//!    `cg::spmd::run` on P workers (default 2, one per core; one row block each) with rtol 0 and
//!    a fixed number of iterations K (default 1200, enough for a checkpoint step of 600), so
//!    every run does the same work. Checkpoints use the checksum (XOR parity on one extra
//!    vnode), as the paper's solver.
//! 2. **Table 3** (checkpoint step): runs with checkpoints every 50, 100, 200, 400, 600
//!    iterations and one without (`--encoding none`). Setup cost = the time a worker spends
//!    taking checkpoints (writing its x, r, p in the exact layout, keeping its copy, handing the
//!    piece to the encoder: the run's path; the longest over workers), as % of the run; the
//!    encoder's time (XOR of the pieces, on the extra vnode's thread, off the workers' path but
//!    on the same 2 cores) is reported beside it, and so is the run time against the run
//!    without checkpoints (noisy on a shared machine: a few %).
//! 3. **Table 4** (one recovery): checkpoints every 200 iterations, worker 1 killed when it
//!    starts iteration 5K/12 (500 of 1200: 100 iterations after the last checkpoint). The
//!    restoration time (from the master hearing of the death to the spare's state rebuilt from
//!    the survivors' copies and the parity) as % of the run, the paper's measure; and the whole
//!    cost, run time against the failure-free run with the same step, which adds the iterations
//!    done again. The x digest must equal the failure-free run's.
//! 4. **Storage** (paper §5.3): the step-200 run with the encoding in memory (diskless), on a
//!    local sled store (a file checkpoint), and on one checkpoint server (`central:`, a process
//!    on loopback with a sled directory; skipped if the `checkpoint-server` binary is not
//!    built).
//! 5. Targets (issue 8): setup ≤ 1% of the run for every step (paper: 1.61-2.29%), one
//!    recovery ≤ 2% (paper: 5.41%).

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use cg::{Encoding, Kill, Rhs, Source, SpmdConfig};
use veriflow_checkpoint::launch::{server_binary, ServerProcess};
use veriflow_checkpoint::{open_store, Key, Store, StoreSpec};

use crate::cg::CgArgs;
use crate::harness::{loadavg, Quiet};

/// Issue 8's targets, % of the run.
const TARGET_SETUP_PCT: f64 = 1.0;
const TARGET_RECOVERY_PCT: f64 = 2.0;

fn config(
    side: u32,
    iters: u64,
    workers: u32,
    encoding: Encoding,
    every: u64,
    store: Option<Arc<dyn Store>>,
    kills: Vec<Kill>,
) -> SpmdConfig {
    SpmdConfig {
        source: Source::Poisson3d(side),
        rhs: Rhs::Ones,
        rtol: 0.0,
        max_iter: Some(iters),
        blocks: workers,
        workers,
        checkpoint_every: every.max(1),
        encoding,
        store,
        kills,
    }
}

fn run_one(cfg: &SpmdConfig) -> Result<Value> {
    let r = cg::spmd::run(cfg).with_context(|| format!("spmd run ({})", cfg.encoding))?;
    let mut bytes = Vec::with_capacity(8 * r.solution.x.len());
    for v in &r.solution.x {
        bytes.extend_from_slice(&v.to_bits().to_le_bytes());
    }
    let pct = |v: f64| 100.0 * v / r.elapsed_s.max(1e-9);
    Ok(json!({
        "encoding": cfg.encoding.to_string(),
        "step": if cfg.encoding == Encoding::None { Value::Null } else { json!(cfg.checkpoint_every) },
        "iterations": r.solution.iterations,
        "elapsed_s": r.elapsed_s,
        "checkpoints": r.checkpoints,
        "checkpoint_s": r.checkpoint_s,
        "setup_pct": pct(r.checkpoint_s),
        "encode_s": r.encode_s,
        "encode_pct": pct(r.encode_s),
        "per_checkpoint_ms": if r.checkpoints > 0 { json!(1e3 * r.checkpoint_s / r.checkpoints as f64) } else { Value::Null },
        "encode_per_checkpoint_ms": if r.checkpoints > 0 { json!(1e3 * r.encode_s / r.checkpoints as f64) } else { Value::Null },
        "encoding_bytes": r.encoding_bytes,
        "state_bytes": r.state_bytes,
        "kills": r.kills,
        "recoveries": r.recoveries,
        "recovery_s": r.recovery_s,
        "recovery_pct": pct(r.recovery_s),
        "iterations_redone": r.iterations_redone,
        "recovery_error": r.recovery_error,
        "x_digest": blake3::hash(&bytes).to_hex().to_string(),
    }))
}

/// Runs the part (module docs) and returns its section of `cg.json`.
pub fn spmd(args: &CgArgs) -> Result<Value> {
    let side = args.spmd_side.unwrap_or(if args.quick { 30 } else { 100 });
    let iters = args
        .spmd_iters
        .unwrap_or(if args.quick { 120 } else { 1200 });
    let p = args.workers;
    let steps: Vec<u64> = if args.quick {
        vec![5, 10, 20, 40, 60]
    } else {
        vec![50, 100, 200, 400, 600]
    };
    let recovery_step = steps[2];
    let quiet = Quiet::secs(args.quiet_wait).wait();
    let load_before = loadavg();
    let cfg = |enc, every, store, kills| config(side, iters, p, enc, every, store, kills);

    let base = run_one(&cfg(Encoding::None, 1, None, vec![]))?;
    eprintln!("spmd: no checkpoints: {:.2} s", base["elapsed_s"]);
    let t_base = base["elapsed_s"].as_f64().unwrap_or(f64::NAN);
    let mut table3 = Vec::new();
    for &c in &steps {
        let mut r = run_one(&cfg(Encoding::Checksum, c, None, vec![]))?;
        let t = r["elapsed_s"].as_f64().unwrap_or(f64::NAN);
        r["vs_no_checkpoints_pct"] = json!(100.0 * (t - t_base) / t_base);
        r["same_x_as_no_checkpoints"] = json!(r["x_digest"] == base["x_digest"]);
        eprintln!(
            "spmd: step {c}: {:.2} s, setup {:.3}%",
            t,
            r["setup_pct"].as_f64().unwrap_or(f64::NAN)
        );
        table3.push(r);
    }
    let reference = table3[2].clone();
    let kill_at = iters * 5 / 12;
    let mut rec = run_one(&cfg(
        Encoding::Checksum,
        recovery_step,
        None,
        vec![Kill {
            worker: 1 % p,
            iteration: kill_at,
        }],
    ))?;
    let (t_rec, t_ref) = (
        rec["elapsed_s"].as_f64().unwrap_or(f64::NAN),
        reference["elapsed_s"].as_f64().unwrap_or(f64::NAN),
    );
    rec["killed_at"] = json!(kill_at);
    rec["vs_failure_free_pct"] = json!(100.0 * (t_rec - t_ref) / t_ref);
    rec["same_x_as_failure_free"] = json!(rec["x_digest"] == reference["x_digest"]);
    eprintln!(
        "spmd: one recovery: {:.2} s, restoration {:.3}%",
        t_rec,
        rec["recovery_pct"].as_f64().unwrap_or(f64::NAN)
    );

    // Storage: memory (the reference), local sled, one checkpoint server.
    let tmp = tempfile::tempdir().context("temp dir")?;
    let mut storage = vec![json!({"where": "memory (diskless)", "run": reference.clone()})];
    let sled_dir = tmp.path().join("sled");
    let sled = open_store(&StoreSpec::Local(sled_dir.clone()), None)?;
    let r = run_one(&cfg(Encoding::Checksum, recovery_step, Some(sled), vec![]))?;
    storage.push(json!({"where": "local sled store (file)", "run": r}));
    match server_binary() {
        Some(bin) => {
            let key_file = tmp.path().join("key");
            let key = Key::create(&key_file)?;
            let data = tmp.path().join("server");
            let server = ServerProcess::start(&bin, "127.0.0.1:0", Some(&data), &key_file)
                .context("start checkpoint-server")?;
            let spec: StoreSpec = format!("central:{}", server.addr)
                .parse()
                .context("store spec")?;
            let store = open_store(&spec, Some(&key))?;
            let r = run_one(&cfg(Encoding::Checksum, recovery_step, Some(store), vec![]))?;
            storage.push(json!({"where": "one checkpoint server (central:, sled, loopback)", "run": r}));
            drop(server);
        }
        None => storage.push(json!({
            "where": "one checkpoint server",
            "skipped": "checkpoint-server binary not built (cargo build --release -p veriflow-checkpoint)",
        })),
    }
    let worst_setup = table3
        .iter()
        .filter_map(|r| r["setup_pct"].as_f64())
        .fold(0.0, f64::max);
    let rec_pct = rec["recovery_pct"].as_f64().unwrap_or(f64::NAN);
    Ok(json!({
        "matrix": format!("poisson3d:{side}"),
        "n": u64::from(side).pow(3),
        "workers": p,
        "iterations": iters,
        "encoding": "checksum",
        "quiet_machine": quiet,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "no_checkpoints": base,
        "table3": table3,
        "recovery": rec,
        "storage": storage,
        "targets": {
            "setup_pct_max": worst_setup,
            "setup_met": worst_setup <= TARGET_SETUP_PCT,
            "recovery_pct": rec_pct,
            "recovery_met": rec_pct <= TARGET_RECOVERY_PCT,
        },
    }))
}

/// The part's section of `cg.md`.
pub fn markdown(r: &Value) -> String {
    let mut s = String::new();
    if r.is_null() {
        return s;
    }
    let f = |v: &Value, d: usize| v.as_f64().map_or("-".to_string(), |x| format!("{x:.d$}"));
    let _ = writeln!(
        s,
        "\n# paper cg (paper 002): Tables 2-4 with --mode spmd\n\n{} (n = {}), {} workers + 1 \
         checksum vnode, {} iterations per run (rtol 0), b = A 1; load {} → {}.\n",
        r["matrix"].as_str().unwrap_or("?"),
        r["n"],
        r["workers"],
        r["iterations"],
        r["loadavg_before"].as_str().unwrap_or("?"),
        r["loadavg_after"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        s,
        "Table 3 analog. Without checkpoints: {} s.\n\n| step | checkpoints | run, s | setup (workers' \
         path), % | per checkpoint, ms | encoding (extra vnode), % | run vs no checkpoints, % | \
         same x |\n|---|---|---|---|---|---|---|---|",
        f(&r["no_checkpoints"]["elapsed_s"], 2)
    );
    for t in r["table3"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            t["step"],
            t["checkpoints"],
            f(&t["elapsed_s"], 2),
            f(&t["setup_pct"], 3),
            f(&t["per_checkpoint_ms"], 1),
            f(&t["encode_pct"], 3),
            f(&t["vs_no_checkpoints_pct"], 1),
            t["same_x_as_no_checkpoints"]
        );
    }
    let tg = &r["targets"];
    let _ = writeln!(
        s,
        "\nSetup: at most {}% (target ≤ {TARGET_SETUP_PCT}%: {}; paper 1.61-2.29%).\n",
        f(&tg["setup_pct_max"], 3),
        if tg["setup_met"].as_bool() == Some(true) {
            "met"
        } else {
            "missed"
        },
    );
    let rec = &r["recovery"];
    let _ =
        writeln!(
        s,
        "Table 4 analog: step {}, worker 1 killed at iteration {}: restoration {} s = {}% of the \
         run (target ≤ {TARGET_RECOVERY_PCT}%: {}; paper 5.41%); {} iterations redone; run {} s, \
         {}% over the failure-free run; same x as the failure-free run: {}.\n",
        rec["step"],
        rec["killed_at"],
        f(&rec["recovery_s"], 3),
        f(&rec["recovery_pct"], 3),
        if tg["recovery_met"].as_bool() == Some(true) { "met" } else { "missed" },
        rec["iterations_redone"],
        f(&rec["elapsed_s"], 2),
        f(&rec["vs_failure_free_pct"], 1),
        rec["same_x_as_failure_free"],
    );
    let _ = writeln!(
        s,
        "Storage (step {}): \n\n| where | run, s | setup, % | encoding per checkpoint, ms | encoding, bytes |\n|---|---|---|---|---|",
        rec["step"]
    );
    for st in r["storage"].as_array().into_iter().flatten() {
        let run = &st["run"];
        match st["skipped"].as_str() {
            Some(why) => {
                let _ = writeln!(
                    s,
                    "| {} | skipped: {why} | | | |",
                    st["where"].as_str().unwrap_or("?")
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} |",
                    st["where"].as_str().unwrap_or("?"),
                    f(&run["elapsed_s"], 2),
                    f(&run["setup_pct"], 3),
                    f(&run["encode_per_checkpoint_ms"], 1),
                    run["encoding_bytes"]
                );
            }
        }
    }
    s
}

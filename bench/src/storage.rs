//! `paper storage`: what the checkpoint storage strategies cost (paper 003, Fig. 2 and Fig. 3).
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- storage [--runs N] [--quick]
//!     [--sizes N[:W],...] [--rows R] [--threads T] [--strategy NAME]... [--out DIR]
//!     [--scratch DIR] [--server-bin PATH] [--quiet-wait SECS] [--retries N]
//!     [--parts coding,overhead,paced] [--skip-coding] [--skip-overhead] [--skip-paced]
//!     [--paced-secs SECS] [--paced-segment BYTES]
//! ```
//!
//! Four measurements, one report (`storage.json`, `storage.md`, `storage_overhead.svg`):
//!
//! 1. **Coding throughput on one core and on all** (Fig. 2 analog): `Codec::encode` and
//!    `Codec::decode` (framing and blake3 digests included) of parity(9), ida(9,1), ida(8,2)
//!    and ida(24,8) at 64 KiB, 1 MiB and 16 MiB blobs, in a one-thread rayon pool and on the
//!    codec's own pool (it codes blocks in parallel, erasure/mod.rs rule 2); decode
//!    with every fragment present and with the first K data fragments lost (the rebuild path);
//!    and the code alone ([`ErasureCode::encode`] and
//!    `reconstruct_data` over the same stripes `Codec` uses, no copies, no digests). Each
//!    figure is the median of several repetitions, each repetition a loop of at least
//!    `MIN_LOOP` of calls, in GB/s (10^9 bytes of blob per second); one blake3 hash of the
//!    blob is timed beside them for reference. Each code and size waits for a quiet machine
//!    and is measured again when other processes took CPU meanwhile.
//! 2. **Run-time overhead** (Fig. 3 analog): a blocked matrix product whose every task is
//!    logged, run with no log (`none`, the baseline), with the log kept in RAM (`memory`: the
//!    paper's "generates checkpoints but doesn't store them"), in a local sled store (`local`),
//!    and through `central`, `replicate:2`, `parity:3` (4 servers), `ida:9,1` and `ida:8,2`
//!    (10 servers), for n = 1350 and 2700 (paper 003's sizes) and n = 1350 with 40 times the
//!    computation per block (`1350:40`: a lower log rate, as a longer checkpoint interval
//!    gives). Servers are real `checkpoint-server` processes on 127.0.0.1, started fresh
//!    for every run in a new data directory and killed after it. The settings are interleaved
//!    (none, memory, local, ..., then again) so that drifts hit all alike; a run during which
//!    other processes (not ours, not our servers) took CPU is run again in its place.
//! 3. **Storage overhead**: (M+K)/M per strategy, the bytes stored (keys and values read back
//!    from the local store or from every server's data directory) relative to the log, and the
//!    bytes on disk (du of the same directories) relative to the local store's.
//! 4. **Overhead at paper 003's log rate, measured** (`paced`): `--threads` threads run a
//!    fixed amount of computation (about `--paced-secs`) while the main thread writes 64 KiB
//!    log segments through the strategy, 0.189 MB per second of computation (paper 003's
//!    highest rate per core), to real servers; the extra CPU of the process and its servers
//!    over the baseline without a log, from /proc, against the computation's CPU. Defaults:
//!    none, parity:3 and ida:8,2 (`--strategy` chooses others).
//!
//! The matrix product (`storage.matmul`): C = A B for n x n matrices of small integers held as
//! f64 (so every sum is exact and the result is checked exactly). The root spawns one `GenB`
//! task per panel of `rows` rows of B, one `RowBlock` task per `rows` rows of C (it generates
//! its rows of A from the seed and reads every panel of B), and a `Checksum` that reads every
//! block of C and writes the row sums of C, the run's output, checked against A (B's row sums)
//! computed by the driver. The log therefore holds B and C once each (2 n^2 f64) plus small
//! records. The run uses one vnode and `--threads` threads: a `RowBlock` multiplies its rows in
//! parallel with rayon inside the task. One vnode because a stolen task's log records its
//! input values (`Event::Adopted`): with two vnodes, every stolen `RowBlock` would log all of B
//! again.

use std::fmt::Write as _;
use std::hint::black_box;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Value};
use veriflow::runtime::Digest;
use veriflow::{Ctx, MemoryStore, Registry, Runtime, SledStore, Store, Task, TaskResult, Writes};
use veriflow_checkpoint::erasure::{coding_threads, Codec, ErasureCode, MIN_PIECE, STRIPE_BYTES};
use veriflow_checkpoint::{open_store, Key, StoreSpec};

use crate::harness::{
    self, app_binary, cpu_text, median, process_cpu_s, require_runs, scratch_dir, CpuSnapshot,
    Disturbed, Quiet, Redo, Retries, Rounds, Session, Stats, Timed,
};

/// Options of `paper storage`.
#[derive(clap::Args, Debug, Clone)]
pub struct StorageArgs {
    /// Repetitions of every strategy per matrix size (medians over them; at least 3 unless
    /// --quick).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// Worker threads of the runtime (the matrix product uses all of them inside its tasks).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// Matrix sizes of the overhead series: `N` (n x n) or `N:W` (each `RowBlock` multiplies
    /// W times: W times the computation per byte logged) [default: 1350,2700,1350:40;
    /// --quick: 270,540,270:4].
    #[arg(long, value_delimiter = ',', value_name = "N[:W],...", value_parser = parse_series)]
    pub sizes: Option<Vec<Series>>,
    /// Rows of B per `GenB` panel and rows of C per `RowBlock` task.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub rows: u64,
    /// Small matrices, short coding loops, one run: a smoke run (writes storage-quick.*).
    #[arg(long)]
    pub quick: bool,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Where the stores' and servers' data directories go [default: the system's temp
    /// directory].
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
    /// The `checkpoint-server` binary [default: beside this binary, built first with
    /// `cargo build -p veriflow-checkpoint --bin checkpoint-server` in this binary's profile].
    #[arg(long, value_name = "PATH")]
    pub server_bin: Option<PathBuf>,
    /// Before each round of runs, wait up to this many seconds for other processes to use less
    /// than a quarter of a core (0: do not wait).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub quiet_wait: u64,
    /// A run disturbed by other processes is run again (after a quiet wait), at most this many
    /// times per matrix size; a coding row at most this many times.
    #[arg(long, default_value_t = 20)]
    pub retries: u32,
    /// The parts to run: `coding` (part 1), `overhead` (parts 2 and 3), `paced` (part 4)
    /// [default: all three].
    #[arg(long, value_delimiter = ',', value_name = "PART,...")]
    pub parts: Vec<Part>,
    /// Skip the coding throughput (part 1).
    #[arg(long)]
    pub skip_coding: bool,
    /// Skip the run-time and storage overhead (parts 2 and 3).
    #[arg(long)]
    pub skip_overhead: bool,
    /// Skip the overhead measured at paper 003's rate (part 4).
    #[arg(long)]
    pub skip_paced: bool,
    /// Part 4: CPU seconds of computation per thread and run [--quick: 3].
    #[arg(long, value_name = "SECS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub paced_secs: u64,
    /// Part 4: bytes per log segment (the runtime's log writer seals 64 KiB segments).
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 10,
          value_parser = parse_segment)]
    pub paced_segment: usize,
    /// A strategy of the overhead series, by name (repeat the option for several) [default:
    /// all: none, memory, local, central, replicate:2, parity:3, ida:9,1, ida:8,2]; `none`,
    /// the baseline, always runs.
    #[arg(long = "strategy", value_name = "NAME")]
    pub strategies: Vec<String>,
}

/// A part of `paper storage` (`--parts`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// 1: coding throughput.
    Coding,
    /// 2 and 3: run-time and storage overhead of the matrix product.
    Overhead,
    /// 4: the overhead measured at paper 003's log rate.
    Paced,
}

/// Parses `--paced-segment`: 1 byte to 16 MiB.
fn parse_segment(s: &str) -> Result<usize> {
    let n: usize = s
        .trim()
        .parse()
        .with_context(|| format!("{s:?}: a segment size in bytes"))?;
    if n == 0 || n > 16 << 20 {
        bail!("{s:?}: a segment is 1 byte to 16 MiB");
    }
    Ok(n)
}

/// One matrix product of the overhead series: its size and how many times each `RowBlock`
/// repeats its multiplication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Series {
    /// n: the matrices are n x n.
    pub n: usize,
    /// Repetitions of each block's multiplication (1: the plain product). W > 1 gives W times
    /// the computation for the same log, as a longer checkpoint interval would.
    pub work: usize,
}

impl std::fmt::Display for Series {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.work {
            1 => write!(f, "n = {}", self.n),
            w => write!(f, "n = {}, work x{w}", self.n),
        }
    }
}

/// Parses `N` or `N:W` (see [`StorageArgs::sizes`]).
fn parse_series(s: &str) -> Result<Series> {
    let (n, w) = s.split_once(':').unwrap_or((s, "1"));
    let n: usize = n
        .trim()
        .parse()
        .with_context(|| format!("{s:?}: the size N must be a number"))?;
    let work: usize = w
        .trim()
        .parse()
        .with_context(|| format!("{s:?}: the work factor W must be a number"))?;
    if n == 0 || work == 0 {
        bail!("{s:?}: N and W must be at least 1");
    }
    Ok(Series { n, work })
}

/// Targets of the issue (issue 5, "Benchmarks").
const TARGET_IDA_8_2_GBPS: f64 = 5.0;
const TARGET_PARITY_GBPS: f64 = 10.0;
const TARGET_OVERHEAD: f64 = 1.01;
/// Paper 003's bound on IDA's overhead ("always below 3 percent").
const PAPER_OVERHEAD: f64 = 1.03;

/// Runs `paper storage` and writes its results.
pub fn run(args: &StorageArgs) -> Result<()> {
    require_runs(args.runs, 3, args.quick)?;
    let wanted =
        |part: Part, skip: bool| !skip && (args.parts.is_empty() || args.parts.contains(&part));
    let (do_coding, do_overhead, do_paced) = (
        wanted(Part::Coding, args.skip_coding),
        wanted(Part::Overhead, args.skip_overhead),
        wanted(Part::Paced, args.skip_paced),
    );
    if !(do_coding || do_overhead || do_paced) {
        bail!("--parts and --skip-* together leave nothing to measure");
    }
    let session = Session::start(args.out.as_deref(), args.quick)?;
    let scratch = scratch_dir(args.scratch.as_deref())?;

    let coding = if do_coding {
        coding_series(args)?
    } else {
        Vec::new()
    };
    let overhead = if do_overhead {
        Some(overhead_series(args, &scratch)?)
    } else {
        None
    };
    let paced = if do_paced {
        Some(paced_series(args, &scratch)?)
    } else {
        None
    };
    let report = Report {
        quick: args.quick,
        cores: coding_threads(),
        runs: args.runs as usize,
        threads: args.threads as usize,
        rows: usize::try_from(args.rows).context("--rows too large")?,
        coding,
        overhead,
        paced,
    };
    session.write(
        "storage",
        &session.stem("storage"),
        report.json(),
        &report.markdown(),
    )?;
    if let Some(o) = &report.overhead {
        let plots = session.plot(&session.stem("storage_overhead"), &OverheadFigure::of(o)?);
        for path in plots.written(&session.out) {
            println!("written: {}", path.display());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Part 1: coding throughput.

/// The codes of paper 003 Fig. 2 and the issue.
fn codecs() -> Result<Vec<Codec>> {
    Ok(vec![
        Codec::parity(9)?,
        Codec::ida(9, 1)?,
        Codec::ida(8, 2)?,
        Codec::ida(24, 8)?,
    ])
}

/// Blob sizes of the coding series.
const BLOB_SIZES: [usize; 3] = [64 << 10, 1 << 20, 16 << 20];

/// A repetition loops for at least this long (the coder's rate is then not the timer's).
const MIN_LOOP: Duration = Duration::from_millis(100);
const MIN_LOOP_QUICK: Duration = Duration::from_millis(10);
/// Repetitions per figure.
const CODING_REPS: usize = 7;
const CODING_REPS_QUICK: usize = 3;

/// One code at one blob size: GB/s per repetition of each operation.
struct CodingRow {
    code: String,
    m: usize,
    k: usize,
    blob: usize,
    /// `Codec::encode` on one core (a one-thread rayon pool).
    encode: Vec<f64>,
    /// `Codec::decode`, every fragment present, on one core.
    decode: Vec<f64>,
    /// `Codec::decode`, the first K data fragments lost, on one core.
    rebuild: Vec<f64>,
    /// The same three on every core (from this thread: the codec's own pool, one thread per
    /// core; erasure/mod.rs rule 2).
    encode_all: Vec<f64>,
    decode_all: Vec<f64>,
    rebuild_all: Vec<f64>,
    /// The code alone: `ErasureCode::encode` over the stripes.
    code_encode: Vec<f64>,
    /// The code alone: `ErasureCode::reconstruct_data` of K lost data pieces over the stripes.
    code_rebuild: Vec<f64>,
    /// blake3 of the whole blob (`Digest::of`), for reference: `Codec` hashes (M+K)/M times
    /// the blob's bytes.
    blake3: Vec<f64>,
    /// CPU seconds other processes took while this row was measured.
    other_cpu_s: Option<f64>,
    /// Whether the machine was still busy when the quiet wait gave up.
    not_quiet: bool,
    /// Measurements discarded because other processes disturbed them.
    reruns: u32,
    /// Whether the kept measurement was disturbed (no retry left).
    disturbed: bool,
}

/// Deterministic pseudo-random bytes (splitmix64).
fn blob(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x = splitmix64(x);
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// GB/s of `reps` repetitions of `f`, each a loop of at least `min` (calibrated on one call).
fn rates(bytes: usize, reps: usize, min: Duration, mut f: impl FnMut()) -> Vec<f64> {
    f(); // warm up: caches, page faults of first allocations
    let t = Instant::now();
    f();
    let one = t.elapsed().max(Duration::from_nanos(100));
    let iters = (min.as_secs_f64() / one.as_secs_f64()).ceil().max(1.0) as u64;
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            bytes as f64 * iters as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect()
}

/// Others' load below which a coding row counts as undisturbed: more than 0.05 CPU-s plus
/// this many cores over the row's time (a quarter of a core: the machine's other work).
const CODING_DISTURBED_CORES: f64 = 0.25;

fn coding_series(args: &StorageArgs) -> Result<Vec<CodingRow>> {
    let (reps, min) = if args.quick {
        (CODING_REPS_QUICK, MIN_LOOP_QUICK)
    } else {
        (CODING_REPS, MIN_LOOP)
    };
    let cores = coding_threads();
    eprintln!(
        "coding: one core and {cores} (the codec's pool), median of {reps} repetitions of >= \
         {min:?} loops"
    );
    let mut rows = Vec::new();
    for codec in codecs()? {
        for &len in &BLOB_SIZES {
            // Per row: a retry budget, a quiet wait before every try; one core is measured,
            // so another core's work is tolerated (CODING_DISTURBED_CORES).
            let quiet = Quiet::secs(args.quiet_wait);
            let mut retries = Retries::new(args.retries);
            let row = loop {
                let not_quiet = !quiet.wait();
                let before = CpuSnapshot::now();
                let t = Instant::now();
                let mut row = coding_row(&codec, len, reps, min)?;
                let took = t.elapsed().as_secs_f64();
                row.other_cpu_s = CpuSnapshot::foreign_since(before);
                row.not_quiet = not_quiet;
                let bad = Disturbed::absolute(CODING_DISTURBED_CORES).is(row.other_cpu_s, took);
                eprintln!(
                    "  {:<10} {:>7}: encode {:.2} / {:.2}, decode {:.2} / {:.2}, rebuild {:.2} / \
                     {:.2} (one core / {cores} threads), code alone {:.2} / {:.2} GB/s; other \
                     processes' CPU {} s in {took:.1} s{}",
                    row.code,
                    size_text(len),
                    median(&row.encode),
                    median(&row.encode_all),
                    median(&row.decode),
                    median(&row.decode_all),
                    median(&row.rebuild),
                    median(&row.rebuild_all),
                    median(&row.code_encode),
                    median(&row.code_rebuild),
                    cpu_text(row.other_cpu_s),
                    retries.note(bad)
                );
                if !retries.keep(bad) {
                    continue;
                }
                row.reruns = retries.rerun;
                row.disturbed = bad;
                break row;
            };
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Measures one code at one blob size (after checking that it round-trips).
fn coding_row(codec: &Codec, len: usize, reps: usize, min: Duration) -> Result<CodingRow> {
    let (m, k) = (codec.data_fragments(), codec.parity_fragments());
    let data = blob(len, len as u64);
    let frags: Vec<Option<Vec<u8>>> = codec.encode(&data, 1).into_iter().map(Some).collect();
    let mut lost = frags.clone();
    for slot in lost.iter_mut().take(k) {
        *slot = None;
    }
    for (what, f) in [("intact", &frags), ("rebuilt", &lost)] {
        let got = codec
            .decode(f)
            .with_context(|| format!("{codec} {what} decode"))?;
        if got.blob != data {
            bail!("{codec}: {what} decode of {len} bytes gave other bytes");
        }
    }
    // Rule 2 of erasure/mod.rs: the codec codes on the current rayon pool.
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .context("a one-thread rayon pool")?;
    let encode_rates = || {
        rates(len, reps, min, || {
            black_box(codec.encode(black_box(&data), 1));
        })
    };
    let decode_rates = |f: &[Option<Vec<u8>>]| {
        rates(len, reps, min, || {
            black_box(codec.decode(black_box(f)).ok());
        })
    };
    // One core then every core, operation by operation, so that a drift hits both alike.
    let encode = one.install(encode_rates);
    let encode_all = encode_rates();
    let decode = one.install(|| decode_rates(&frags));
    let decode_all = decode_rates(&frags);
    let rebuild = one.install(|| decode_rates(&lost));
    let rebuild_all = decode_rates(&lost);
    let (code_encode, code_rebuild) = code_alone(codec, &data, reps, min)?;
    let blake3 = rates(len, reps, min, || {
        black_box(Digest::of(black_box(&data)));
    });
    Ok(CodingRow {
        blake3,
        code: codec.to_string(),
        m,
        k,
        blob: len,
        encode,
        decode,
        rebuild,
        encode_all,
        decode_all,
        rebuild_all,
        code_encode,
        code_rebuild,
        other_cpu_s: None,
        not_quiet: false,
        reruns: 0,
        disturbed: false,
    })
}

/// The code alone over the stripes `Codec` uses (`erasure/mod.rs` rule 2), on the blob cut
/// into M pieces: encode (M pieces in, K out), and rebuild of the first K data pieces.
fn code_alone(
    codec: &Codec,
    data: &[u8],
    reps: usize,
    min: Duration,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let code: &dyn ErasureCode = &**codec.code();
    let (m, k) = (code.data_pieces(), code.parity_pieces());
    let s = data.len().div_ceil(m);
    let mut pieces: Vec<Vec<u8>> = (0..m + k)
        .map(|i| {
            let mut p = vec![0u8; s];
            if i < m {
                let start = (i * s).min(data.len());
                let end = ((i + 1) * s).min(data.len());
                p[..end - start].copy_from_slice(&data[start..end]);
            }
            p
        })
        .collect();
    // The codec's widest block (erasure/mod.rs rule 2): a power of two within the stripe.
    let stripe = 1 << (STRIPE_BYTES / m).max(MIN_PIECE).ilog2();
    let encode_all = |pieces: &mut [Vec<u8>]| {
        let (ins, outs) = pieces.split_at_mut(m);
        let mut off = 0;
        while off < s {
            let end = (off + stripe).min(s);
            let i: Vec<&[u8]> = ins.iter().map(|p| &p[off..end]).collect();
            let mut o: Vec<&mut [u8]> = outs.iter_mut().map(|p| &mut p[off..end]).collect();
            code.encode(&i, &mut o);
            off = end;
        }
    };
    let encode = rates(data.len(), reps, min, || encode_all(&mut pieces));
    let original = pieces.clone();
    let mut present = vec![true; m + k];
    for p in present.iter_mut().take(k) {
        *p = false;
    }
    let rebuild_all = |pieces: &mut [Vec<u8>]| -> Result<()> {
        let mut off = 0;
        while off < s {
            let end = (off + stripe).min(s);
            let mut v: Vec<&mut [u8]> = pieces.iter_mut().map(|p| &mut p[off..end]).collect();
            code.reconstruct_data(&mut v, &present)
                .context("reconstructing with the code alone")?;
            off = end;
        }
        Ok(())
    };
    for p in pieces.iter_mut().take(k) {
        p.fill(0);
    }
    rebuild_all(&mut pieces)?;
    if pieces != original {
        bail!("{codec}: the code alone rebuilt other bytes");
    }
    let mut failed = None;
    let rebuild = rates(data.len(), reps, min, || {
        if let Err(e) = rebuild_all(&mut pieces) {
            failed = Some(e);
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    Ok((encode, rebuild))
}

// ---------------------------------------------------------------------------------------------
// The checkpointing application: a blocked matrix product.

/// Rows of a matrix, shared without copies between the tasks of one process (`Arc`), encoded
/// as a plain sequence of f64 when logged.
#[derive(Clone)]
pub(crate) struct Panel(Arc<[f64]>);

impl std::fmt::Debug for Panel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Panel({} values)", self.0.len())
    }
}

impl Serialize for Panel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Panel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<f64>::deserialize(d).map(|v| Panel(v.into()))
    }
}

/// Which matrix an entry belongs to (part of its hash).
const MATRIX_A: u64 = 1;
const MATRIX_B: u64 = 2;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Entry (i, j) of matrix `which`: an integer in -4..=4, so that every product and sum of the
/// matrix product is an exact f64 (|C| <= 16 n, row sums <= 16 n^2: far below 2^53).
fn entry(seed: u64, which: u64, i: usize, j: usize) -> f64 {
    let h = splitmix64(seed ^ which.rotate_left(56) ^ (i as u64).rotate_left(28) ^ j as u64);
    (h % 9) as f64 - 4.0
}

/// Rows `lo..hi` of matrix `which`, row-major.
fn rows_of(seed: u64, which: u64, n: usize, lo: usize, hi: usize) -> Vec<f64> {
    let mut v = vec![0.0; (hi - lo) * n];
    v.par_chunks_mut(n.max(1)).enumerate().for_each(|(r, row)| {
        for (j, x) in row.iter_mut().enumerate() {
            *x = entry(seed, which, lo + r, j);
        }
    });
    v
}

/// C = A B, n x n, `rows` rows per panel of B and per block of C.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct MatMul {
    n: usize,
    rows: usize,
    seed: u64,
    /// Multiplications per block (see [`Series::work`]).
    work: usize,
}

impl Task for MatMul {
    const NAME: &'static str = "storage.matmul";
    type Inputs = ();
    type Outputs = (Vec<f64>,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        let (n, rows, seed, work) = (self.n, self.rows.max(1), self.seed, self.work.max(1));
        let ranges: Vec<(usize, usize)> = (0..n)
            .step_by(rows)
            .map(|lo| (lo, (lo + rows).min(n)))
            .collect();
        let panels: Vec<_> = ranges
            .iter()
            .map(|&(lo, hi)| ctx.spawn(GenB { n, lo, hi, seed }, ()).0)
            .collect();
        let blocks: Vec<_> = ranges
            .iter()
            .map(|&(lo, hi)| {
                let block = RowBlock {
                    n,
                    lo,
                    hi,
                    seed,
                    work,
                };
                ctx.spawn(block, panels.clone()).0
            })
            .collect();
        ctx.spawn_delegate(Checksum { n }, blocks, (out,));
        Ok(())
    }
}

/// Rows `lo..hi` of B.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct GenB {
    n: usize,
    lo: usize,
    hi: usize,
    seed: u64,
}

impl Task for GenB {
    const NAME: &'static str = "storage.gen-b";
    type Inputs = ();
    type Outputs = (Panel,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        let v = rows_of(self.seed, MATRIX_B, self.n, self.lo, self.hi);
        ctx.write(out, Panel(v.into()));
        Ok(())
    }
}

/// Rows `lo..hi` of C: its rows of A (generated) times B (every panel, read).
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct RowBlock {
    n: usize,
    lo: usize,
    hi: usize,
    seed: u64,
    /// Times the block is multiplied (the result is the same each time).
    work: usize,
}

/// Rows of C a rayon job updates together: each row of B is loaded once per group, and the
/// group's rows of C (8 x 21.6 KB at n = 2700) stay in the L2 cache.
const GROUP: usize = 8;

impl Task for RowBlock {
    const NAME: &'static str = "storage.row-block";
    type Inputs = Vec<Panel>;
    type Outputs = (Panel,);
    fn run(self, ctx: &mut Ctx<'_>, panels: Vec<Panel>, (out,): Writes<Self>) -> TaskResult {
        let n = self.n;
        let have: usize = panels.iter().map(|p| p.0.len()).sum();
        if have != n * n {
            return Err(veriflow::TaskError::msg(format!(
                "B has {have} values, expected {n}x{n}"
            )));
        }
        let a = rows_of(self.seed, MATRIX_A, n, self.lo, self.hi);
        let mut c = vec![0.0; a.len()];
        for _ in 0..self.work.max(1) {
            if n == 0 {
                break;
            }
            c.par_chunks_mut(GROUP * n)
                .zip(a.par_chunks(GROUP * n))
                .for_each(|(cg, ag)| {
                    cg.fill(0.0);
                    let g = cg.len() / n;
                    let mut k = 0;
                    for p in &panels {
                        for b in p.0.chunks_exact(n) {
                            for r in 0..g {
                                let aik = ag[r * n + k];
                                for (cv, bv) in cg[r * n..(r + 1) * n].iter_mut().zip(b) {
                                    *cv += aik * bv;
                                }
                            }
                            k += 1;
                        }
                    }
                });
            black_box(&c);
        }
        ctx.write(out, Panel(c.into()));
        Ok(())
    }
}

/// The row sums of C, from its blocks in order.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct Checksum {
    n: usize,
}

impl Task for Checksum {
    const NAME: &'static str = "storage.checksum";
    type Inputs = Vec<Panel>;
    type Outputs = (Vec<f64>,);
    fn run(self, ctx: &mut Ctx<'_>, blocks: Vec<Panel>, (out,): Writes<Self>) -> TaskResult {
        let n = self.n.max(1);
        let sums: Vec<f64> = blocks
            .iter()
            .flat_map(|b| b.0.chunks_exact(n).map(|row| row.iter().sum::<f64>()))
            .collect();
        ctx.write(out, sums);
        Ok(())
    }
}

fn matmul_registry() -> Result<Registry> {
    Registry::new()
        .with::<MatMul>()
        .and_then(|r| r.with::<GenB>())
        .and_then(|r| r.with::<RowBlock>())
        .and_then(|r| r.with::<Checksum>())
        .context("registering the matrix product's tasks")
}

/// The row sums of C = A B, computed directly: r_i = sum_k a_ik (sum_j b_kj).
fn expected_row_sums(n: usize, seed: u64) -> Vec<f64> {
    let b_sums: Vec<f64> = (0..n)
        .into_par_iter()
        .map(|k| (0..n).map(|j| entry(seed, MATRIX_B, k, j)).sum())
        .collect();
    (0..n)
        .into_par_iter()
        .map(|i| {
            (0..n)
                .map(|k| entry(seed, MATRIX_A, i, k) * b_sums[k])
                .sum()
        })
        .collect()
}

/// Tasks of one product: the root, the panels, the blocks and the checksum.
fn matmul_tasks(n: usize, rows: usize) -> usize {
    2 + 2 * n.div_ceil(rows.max(1))
}

/// The overhead series by default: paper 003's 1350 x 1350 and 2700 x 2700, and 1350 x 1350
/// with 40 times the computation per block (the log rate of 2700 x 2700 divided by ~20: a
/// longer checkpoint interval, closer to the paper's).
const DEFAULT_SERIES: [Series; 3] = [
    Series { n: 1350, work: 1 },
    Series { n: 2700, work: 1 },
    Series { n: 1350, work: 40 },
];

/// The overhead series of `--quick`: small, for a smoke run.
const QUICK_SERIES: [Series; 3] = [
    Series { n: 270, work: 1 },
    Series { n: 540, work: 1 },
    Series { n: 270, work: 4 },
];

/// Seed of the matrices (any; fixed so that every run computes the same product).
const MATRIX_SEED: u64 = 3;

// ---------------------------------------------------------------------------------------------
// Strategies and checkpoint servers.

/// Where a run's log goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    /// No log at all (the baseline).
    None,
    /// The log in this process's RAM (`memory`).
    Memory,
    /// One sled directory (`local:DIR`).
    Local,
    /// One checkpoint server.
    Central,
    /// R copies on R servers.
    Replicate(usize),
    /// M slices + XOR parity on M + 1 servers.
    Parity(usize),
    /// Reed-Solomon, any M of M + K, on M + K servers.
    Ida(usize, usize),
}

/// The strategies of the overhead series, in the order they run in each round.
const STRATEGIES: [Strategy; 8] = [
    Strategy::None,
    Strategy::Memory,
    Strategy::Local,
    Strategy::Central,
    Strategy::Replicate(2),
    Strategy::Parity(3),
    Strategy::Ida(9, 1),
    Strategy::Ida(8, 2),
];

impl Strategy {
    fn name(self) -> String {
        match self {
            Strategy::None => "none".into(),
            Strategy::Memory => "memory".into(),
            Strategy::Local => "local".into(),
            Strategy::Central => "central".into(),
            Strategy::Replicate(r) => format!("replicate:{r}"),
            Strategy::Parity(m) => format!("parity:{m}"),
            Strategy::Ida(m, k) => format!("ida:{m},{k}"),
        }
    }

    /// Checkpoint servers it needs.
    fn servers(self) -> usize {
        match self {
            Strategy::None | Strategy::Memory | Strategy::Local => 0,
            Strategy::Central => 1,
            Strategy::Replicate(r) => r,
            Strategy::Parity(m) => m + 1,
            Strategy::Ida(m, k) => m + k,
        }
    }

    /// (M + K) / M: bytes stored per byte of log; `None` without a store.
    fn expansion(self) -> Option<f64> {
        match self {
            Strategy::None | Strategy::Memory => None,
            Strategy::Local | Strategy::Central => Some(1.0),
            Strategy::Replicate(r) => Some(r as f64),
            Strategy::Parity(m) => Some((m + 1) as f64 / m as f64),
            Strategy::Ida(m, k) => Some((m + k) as f64 / m as f64),
        }
    }

    /// The `--store` spec over `addrs`.
    fn spec(self, addrs: &[String]) -> String {
        let a = addrs.join(",");
        match self {
            Strategy::Central => format!("central:{a}"),
            Strategy::Replicate(r) => format!("replicate:{r}:{a}"),
            Strategy::Parity(m) => format!("parity:{m}:{a}"),
            Strategy::Ida(m, k) => format!("ida:{m},{k}:{a}"),
            Strategy::None | Strategy::Memory | Strategy::Local => self.name(),
        }
    }
}

/// How long a server may take to say where it listens.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(20);

/// Checkpoint server processes of one run, killed (SIGKILL) and reaped when dropped.
struct Servers {
    procs: Vec<Child>,
    addrs: Vec<String>,
    dirs: Vec<PathBuf>,
}

impl Servers {
    /// Starts `count` servers on 127.0.0.1 (any free port), server `i` with data directory
    /// `root/server-i`, and waits until each prints `listening on ADDR`.
    fn start(bin: &Path, key: &Path, root: &Path, count: usize) -> Result<Servers> {
        let mut servers = Servers {
            procs: Vec::new(),
            addrs: Vec::new(),
            dirs: Vec::new(),
        };
        let mut waiting = Vec::new();
        for i in 0..count {
            let dir = root.join(format!("server-{i}"));
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let errlog = root.join(format!("server-{i}.stderr"));
            let err = std::fs::File::create(&errlog)
                .with_context(|| format!("cannot create {}", errlog.display()))?;
            let mut child = Command::new(bin)
                .arg("--listen")
                .arg("127.0.0.1:0")
                .arg("--data")
                .arg(&dir)
                .arg("--key")
                .arg(key)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(err)
                .spawn()
                .with_context(|| format!("cannot start {}", bin.display()))?;
            let stdout = child.stdout.take().context("server stdout")?;
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let r = BufReader::new(stdout).read_line(&mut line).map(|_| line);
                let _ = tx.send(r);
            });
            servers.procs.push(child);
            servers.dirs.push(dir);
            waiting.push((rx, errlog));
        }
        for (rx, errlog) in waiting {
            let line = match rx.recv_timeout(SERVER_START_TIMEOUT) {
                Ok(Ok(line)) => line,
                Ok(Err(e)) => bail!("reading a checkpoint server's stdout: {e}"),
                Err(_) => bail!(
                    "a checkpoint server did not say where it listens within {:?}",
                    SERVER_START_TIMEOUT
                ),
            };
            let Some(addr) = line.trim().strip_prefix("listening on ") else {
                let err = std::fs::read_to_string(&errlog).unwrap_or_default();
                bail!(
                    "a checkpoint server printed {:?} instead of `listening on ADDR`; its \
                     stderr: {}",
                    line.trim(),
                    err.trim()
                );
            };
            servers.addrs.push(addr.to_string());
        }
        Ok(servers)
    }

    /// CPU seconds the servers used so far (all threads; from `/proc/PID/stat`).
    fn cpu_s(&self) -> Option<f64> {
        self.procs
            .iter()
            .map(|c| process_cpu_s(c.id()))
            .sum::<Option<f64>>()
    }

    /// Kills and reaps every server.
    fn stop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.procs.clear();
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Bytes on disk (allocated blocks, as `du`) and apparent bytes of everything under `path`.
fn disk_usage(path: &Path) -> Result<(u64, u64)> {
    let mut used = 0;
    let mut apparent = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p)
            .with_context(|| format!("cannot stat {}", p.display()))?;
        used += meta.blocks() * 512;
        if meta.is_dir() {
            for e in
                std::fs::read_dir(&p).with_context(|| format!("cannot list {}", p.display()))?
            {
                stack.push(
                    e.with_context(|| format!("cannot list {}", p.display()))?
                        .path(),
                );
            }
        } else {
            apparent += meta.len();
        }
    }
    Ok((used, apparent))
}

/// The `checkpoint-server` binary: `--server-bin`, or the one beside this binary after
/// `cargo build -p veriflow-checkpoint --bin checkpoint-server` in this binary's profile (so
/// that it is never stale); without cargo, whatever is beside this binary.
fn server_binary(args: &StorageArgs) -> Result<PathBuf> {
    app_binary(
        "veriflow-checkpoint",
        "checkpoint-server",
        "--server-bin",
        args.server_bin.as_deref(),
    )
}

// ---------------------------------------------------------------------------------------------
// Part 2 and 3: run-time and storage overhead.

/// What one run of the matrix product measured.
#[derive(Clone, Debug)]
struct MatRun {
    /// `RunReport::elapsed`: root declared until every event is durable.
    seconds: f64,
    tasks: u64,
    events: u64,
    /// CPU seconds of this process during the run.
    cpu_s: Option<f64>,
    /// CPU seconds of the run's checkpoint servers during the run.
    servers_cpu_s: Option<f64>,
    /// CPU seconds other processes took during the run (not ours, not our servers).
    other_cpu_s: Option<f64>,
    /// Allocated bytes of the store's data directories after the run (local and servers).
    disk_bytes: Option<u64>,
    /// Apparent size of the same files.
    file_bytes: Option<u64>,
    /// Bytes of keys and values of the log (memory and local only: read back from the store).
    log_bytes: Option<u64>,
    /// Bytes of keys and values the store holds after the run: the log for local, every
    /// fragment on every server (read back from the killed servers' sled directories) for the
    /// remote strategies.
    stored_bytes: Option<u64>,
}

impl Timed for MatRun {
    fn seconds(&self) -> f64 {
        self.seconds
    }
    /// Not ours and not our servers'.
    fn foreign_cpu_s(&self) -> Option<f64> {
        self.other_cpu_s
    }
}

/// The sled directory of the `local` strategy inside a run's directory.
const LOCAL_DIR: &str = "local";

/// The state of one `paper storage` overhead series.
struct Bench {
    threads: usize,
    rows: usize,
    scratch: PathBuf,
    server_bin: PathBuf,
    key_file: PathBuf,
    key: Key,
}

impl Bench {
    /// One run of the product of size `n` with `strategy`, in a fresh directory (removed
    /// after) with fresh servers (killed after).
    fn run(&self, series: Series, strategy: Strategy, expected: &[f64]) -> Result<MatRun> {
        let n = series.n;
        let dir = tempfile::Builder::new()
            .prefix("veriflow-storage-")
            .tempdir_in(&self.scratch)
            .with_context(|| format!("cannot create a directory in {}", self.scratch.display()))?;
        let (store, mut servers) = self.open(strategy, dir.path())?;
        let local_dir = matches!(strategy, Strategy::Local).then(|| dir.path().join(LOCAL_DIR));
        let mut builder = Runtime::builder(matmul_registry()?)
            .program("storage-matmul")
            .threads(self.threads)
            .vnodes(1);
        builder = match &store {
            Some(s) => builder.store(s.clone()).checkpoint(true),
            None => builder.checkpoint(false),
        };
        let runtime = builder.build().context("building the runtime")?;
        let root = MatMul {
            n,
            rows: self.rows,
            seed: MATRIX_SEED,
            work: series.work,
        };
        let servers_before = servers.as_ref().and_then(Servers::cpu_s);
        let before = CpuSnapshot::now();
        let report = runtime.run(root, ());
        let cpu_s = CpuSnapshot::own_since(before);
        let machine_foreign = CpuSnapshot::foreign_since(before);
        let servers_cpu_s = match (servers.as_ref().and_then(Servers::cpu_s), servers_before) {
            (Some(a), Some(b)) => Some(a - b),
            _ => None,
        };
        let report =
            report.with_context(|| format!("matrix product n={n} with {}", strategy.name()))?;
        if report.outputs.0 != expected {
            bail!(
                "matrix product n={n} with {}: wrong row sums of C",
                strategy.name()
            );
        }
        if store.is_some() && report.events == 0 {
            bail!(
                "matrix product n={n} with {} logged nothing",
                strategy.name()
            );
        }
        let other_cpu_s = machine_foreign.map(|f| (f - servers_cpu_s.unwrap_or(0.0)).max(0.0));
        drop(runtime);
        let log_bytes = match strategy {
            Strategy::Memory | Strategy::Local => {
                let s = store.as_ref().context("no store")?;
                let pairs = s.scan_prefix(b"").context("reading the log back")?;
                Some(pairs.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum())
            }
            _ => None,
        };
        drop(store);
        if let Some(s) = servers.as_mut() {
            s.stop();
        }
        let data_dirs: Vec<PathBuf> = match (&servers, local_dir) {
            (Some(s), _) => s.dirs.clone(),
            (None, Some(d)) => vec![d],
            (None, None) => Vec::new(),
        };
        let (disk_bytes, file_bytes) = if data_dirs.is_empty() {
            (None, None)
        } else {
            let mut used = 0;
            let mut apparent = 0;
            for d in &data_dirs {
                let (u, a) = disk_usage(d)?;
                used += u;
                apparent += a;
            }
            (Some(used), Some(apparent))
        };
        let stored_bytes = match (&servers, strategy) {
            (Some(s), _) => {
                let mut total = 0;
                for d in &s.dirs {
                    let pairs = SledStore::open_read_only(d)
                        .and_then(|db| db.scan_prefix(b""))
                        .with_context(|| format!("cannot read the fragments in {}", d.display()))?;
                    total += pairs
                        .iter()
                        .map(|(k, v)| (k.len() + v.len()) as u64)
                        .sum::<u64>();
                }
                Some(total)
            }
            (None, Strategy::Local) => log_bytes,
            (None, _) => None,
        };
        drop(servers);
        let path = dir.path().to_path_buf();
        dir.close()
            .with_context(|| format!("cannot remove {}", path.display()))?;
        Ok(MatRun {
            seconds: report.elapsed.as_secs_f64(),
            tasks: report.tasks,
            events: report.events,
            cpu_s,
            servers_cpu_s,
            other_cpu_s,
            disk_bytes,
            file_bytes,
            log_bytes,
            stored_bytes,
        })
    }
}

/// Every run of one matrix size.
struct SizeRuns {
    series: Series,
    /// Kept runs per strategy (in the order of [`Overhead::strategies`]), the runs disturbed
    /// by other processes and run again, and the quiet waits that gave up.
    runs: harness::Series<MatRun>,
}

/// The overhead series: every size, every strategy.
struct Overhead {
    /// The strategies run, `none` first, in [`STRATEGIES`] order.
    strategies: Vec<Strategy>,
    sizes: Vec<SizeRuns>,
    server_bin: PathBuf,
}

/// The strategies `--strategy` names (all without any), `none` first, in [`STRATEGIES`] order.
fn selected_strategies(names: &[String]) -> Result<Vec<Strategy>> {
    if names.is_empty() {
        return Ok(STRATEGIES.to_vec());
    }
    let mut out = vec![Strategy::None];
    for name in names {
        let Some(&s) = STRATEGIES.iter().find(|s| s.name() == name.trim()) else {
            let known: Vec<String> = STRATEGIES.iter().map(|s| s.name()).collect();
            bail!(
                "--strategy {name:?}: unknown strategy; known: {}",
                known.join(", ")
            );
        };
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out.sort_by_key(|s| STRATEGIES.iter().position(|t| t == s));
    Ok(out)
}

fn overhead_series(args: &StorageArgs, scratch: &Path) -> Result<Overhead> {
    let sizes = args.sizes.clone().unwrap_or_else(|| {
        if args.quick {
            QUICK_SERIES.to_vec()
        } else {
            DEFAULT_SERIES.to_vec()
        }
    });
    let strategies = selected_strategies(&args.strategies)?;
    let runs = if args.quick { 1 } else { args.runs as usize };
    let server_bin = server_binary(args)?;
    let keydir = tempfile::Builder::new()
        .prefix("veriflow-storage-key-")
        .tempdir_in(scratch)
        .with_context(|| format!("cannot create a directory in {}", scratch.display()))?;
    let key_file = keydir.path().join("key");
    let key = Key::create(&key_file)
        .with_context(|| format!("cannot create the key {}", key_file.display()))?;
    let bench = Bench {
        threads: args.threads as usize,
        rows: usize::try_from(args.rows).context("--rows too large")?,
        scratch: scratch.to_path_buf(),
        server_bin: server_bin.clone(),
        key_file,
        key,
    };
    let mut out = Vec::new();
    for &series in &sizes {
        let n = series.n;
        eprintln!(
            "overhead: {series}, {} rows per task ({} tasks), {runs} rounds of {} strategies, \
             {} threads, 1 vnode, data in {}",
            bench.rows,
            matmul_tasks(n, bench.rows),
            strategies.len(),
            bench.threads,
            scratch.display()
        );
        let expected = expected_row_sums(n, MATRIX_SEED);
        // A disturbed run is run again alone, after a quiet wait (harness rule 3).
        let runs = Rounds {
            runs,
            quiet: Quiet::secs(args.quiet_wait),
            retries: args.retries,
            disturbed: Disturbed::threads(bench.threads),
            redo: Redo::Run { quiet_first: true },
            label: series.to_string(),
        }
        .run(
            strategies.len(),
            |_, i| bench.run(series, strategies[i], &expected),
            |i, r| format!("{} {:.3}s", strategies[i].name(), r.seconds),
        )?;
        let size = SizeRuns { series, runs };
        out.push(size);
    }
    drop(keydir);
    Ok(Overhead {
        strategies,
        sizes: out,
        server_bin,
    })
}

// ---------------------------------------------------------------------------------------------
// Part 4: the overhead measured at paper 003's log rate.

/// Strategies of the paced series when `--strategy` names none: the baseline and the issue's
/// storage strategies.
const PACED_STRATEGIES: [Strategy; 3] = [Strategy::None, Strategy::Parity(3), Strategy::Ida(8, 2)];

/// Side of the square f64 blocks one compute unit multiplies (3 x 128 KiB: the L2 cache's size,
/// so that the storage's cache traffic can slow the computation, as a real one's would).
const PACED_BLOCK: usize = 128;

/// What one paced run measured.
#[derive(Clone, Debug)]
struct PacedRun {
    /// Wall time from the compute threads' start until the last of them finished.
    seconds: f64,
    /// CPU seconds of the compute threads (their own counters, `/proc/thread-self/stat`).
    compute_cpu_s: Option<f64>,
    /// CPU seconds of this process during the run (compute, the producer, the store's threads).
    process_cpu_s: Option<f64>,
    /// CPU seconds of the run's checkpoint servers during the run.
    servers_cpu_s: Option<f64>,
    /// CPU seconds other processes took (not ours, not our servers).
    other_cpu_s: Option<f64>,
    /// Bytes of log segments written and flushed.
    log_bytes: u64,
}

impl Timed for PacedRun {
    fn seconds(&self) -> f64 {
        self.seconds
    }
    fn foreign_cpu_s(&self) -> Option<f64> {
        self.other_cpu_s
    }
}

/// The paced series: its strategies, in order, and their kept runs.
struct Paced {
    strategies: Vec<Strategy>,
    runs: Vec<Vec<PacedRun>>,
    /// Compute units per thread (one unit: a PACED_BLOCK^3 product).
    units: u64,
    /// Units one thread ran per second of its CPU (the calibration).
    per_second: f64,
    /// The log rate asked for, bytes per second per compute thread.
    rate: f64,
    segment: usize,
    threads: usize,
}

/// CPU seconds of the calling thread so far (user + system, 10 ms ticks).
fn thread_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// One compute unit: C += A B on PACED_BLOCK-square blocks (i-k-j order, vectorised).
fn compute_unit(a: &[f64], b: &[f64], c: &mut [f64]) {
    let n = PACED_BLOCK;
    for i in 0..n {
        let row = &mut c[i * n..(i + 1) * n];
        for k in 0..n {
            let x = a[i * n + k];
            for (r, y) in row.iter_mut().zip(&b[k * n..(k + 1) * n]) {
                *r += x * y;
            }
        }
    }
}

/// Runs `units` compute units on this thread, counting them in `done`; returns its CPU
/// seconds.
fn compute(units: u64, seed: u64, done: &AtomicU64) -> Option<f64> {
    let n = PACED_BLOCK * PACED_BLOCK;
    let a: Vec<f64> = (0..n).map(|i| entry(seed, MATRIX_A, i, 0)).collect();
    let b: Vec<f64> = (0..n).map(|i| entry(seed, MATRIX_B, i, 0) / 64.0).collect();
    let mut c = vec![0.0; n];
    let before = thread_cpu_s();
    for _ in 0..units {
        compute_unit(&a, &b, &mut c);
        black_box(&mut c);
        done.fetch_add(1, Ordering::Relaxed);
    }
    Some(thread_cpu_s()? - before?)
}

/// Compute units one thread runs per second of its own CPU (median of three loops of 0.3 CPU
/// seconds; CPU, not wall time, so that a busy machine does not change the log's rate).
fn units_per_second() -> f64 {
    let rates: Vec<f64> = (0..3)
        .map(|_| {
            let t = Instant::now();
            let cpu = thread_cpu_s();
            let mut units = 0u64;
            let spent = || match (thread_cpu_s(), cpu) {
                (Some(now), Some(before)) => now - before,
                _ => t.elapsed().as_secs_f64(),
            };
            while spent() < 0.3 {
                compute(4, units, &AtomicU64::new(0));
                units += 4;
            }
            units as f64 / spent()
        })
        .collect();
    median(&rates)
}

/// A strategy's store (none for the baseline) and its servers (none for a local one).
type Opened = (Option<Arc<dyn Store>>, Option<Servers>);

impl Bench {
    /// Opens `strategy`'s store in `dir` (servers started there for the remote ones).
    fn open(&self, strategy: Strategy, dir: &Path) -> Result<Opened> {
        Ok(match strategy {
            Strategy::None => (None, None),
            Strategy::Memory => (Some(Arc::new(MemoryStore::default())), None),
            Strategy::Local => {
                let d = dir.join(LOCAL_DIR);
                let s = SledStore::open(&d)
                    .with_context(|| format!("cannot open a sled store in {}", d.display()))?;
                (Some(Arc::new(s)), None)
            }
            _ => {
                let s = Servers::start(&self.server_bin, &self.key_file, dir, strategy.servers())?;
                let text = strategy.spec(&s.addrs);
                let spec: StoreSpec = text
                    .parse()
                    .with_context(|| format!("bad store spec {text}"))?;
                let store = open_store(&spec, Some(&self.key))
                    .with_context(|| format!("cannot open {text}"))?;
                (Some(store), Some(s))
            }
        })
    }

    /// One paced run: `self.threads` threads compute `units` units each while this thread
    /// writes a `segment`-byte log segment (`put_batch` and `flush`, as the runtime's log
    /// writer does) through `strategy` for every `segment / rate` seconds of computation
    /// (`per_second` units a CPU second): the log follows the computation's
    /// progress, as a real run's does, so a busy machine slows both alike.
    fn paced(
        &self,
        strategy: Strategy,
        units: u64,
        per_second: f64,
        rate: f64,
        segment: usize,
    ) -> Result<PacedRun> {
        let dir = tempfile::Builder::new()
            .prefix("veriflow-paced-")
            .tempdir_in(&self.scratch)
            .with_context(|| format!("cannot create a directory in {}", self.scratch.display()))?;
        let (store, servers) = self.open(strategy, dir.path())?;
        let units_per_segment = segment as f64 / rate * per_second;
        let done = AtomicU64::new(0);
        let mut bytes = blob(segment, 0x5e9);
        let servers_before = servers.as_ref().and_then(Servers::cpu_s);
        let before = CpuSnapshot::now();
        let start = Instant::now();
        let (compute_cpu, log_bytes) = std::thread::scope(|scope| -> Result<_> {
            let done = &done;
            let workers: Vec<_> = (0..self.threads)
                .map(|t| scope.spawn(move || compute(units, t as u64, done)))
                .collect();
            let mut written = 0u64;
            let mut segno = 0u64;
            let mut failed = None;
            while !workers.iter().all(|w| w.is_finished()) {
                let due = (segno + 1) as f64 * units_per_segment;
                if (done.load(Ordering::Relaxed) as f64) < due {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                if let (Some(store), None) = (&store, &failed) {
                    bytes[..8].copy_from_slice(&segno.to_le_bytes());
                    let key = format!("paced/{segno:012}").into_bytes();
                    let r = store
                        .put_batch(&[(key, bytes.clone())])
                        .and_then(|()| store.flush());
                    match r {
                        Ok(()) => written += bytes.len() as u64,
                        Err(e) => failed = Some(e),
                    }
                }
                segno += 1;
            }
            let cpu: Option<f64> = workers.into_iter().map(|w| w.join().ok().flatten()).sum();
            if let Some(e) = failed {
                bail!("writing log segments through {}: {e}", strategy.name());
            }
            Ok((cpu, written))
        })?;
        let seconds = start.elapsed().as_secs_f64();
        let (process_cpu_s, foreign) = CpuSnapshot::since(before);
        let servers_cpu_s = match (servers.as_ref().and_then(Servers::cpu_s), servers_before) {
            (Some(a), Some(b)) => Some(a - b),
            _ => None,
        };
        let other_cpu_s = foreign.map(|f| (f - servers_cpu_s.unwrap_or(0.0)).max(0.0));
        drop(store);
        drop(servers);
        drop(dir);
        Ok(PacedRun {
            seconds,
            compute_cpu_s: compute_cpu,
            process_cpu_s,
            servers_cpu_s,
            other_cpu_s,
            log_bytes,
        })
    }
}

fn paced_series(args: &StorageArgs, scratch: &Path) -> Result<Paced> {
    let strategies = if args.strategies.is_empty() {
        PACED_STRATEGIES.to_vec()
    } else {
        selected_strategies(&args.strategies)?
    };
    let runs = if args.quick { 1 } else { args.runs as usize };
    let secs = if args.quick { 3 } else { args.paced_secs };
    let threads = args.threads as usize;
    let keydir = tempfile::Builder::new()
        .prefix("veriflow-storage-key-")
        .tempdir_in(scratch)
        .with_context(|| format!("cannot create a directory in {}", scratch.display()))?;
    let key_file = keydir.path().join("key");
    let key = Key::create(&key_file)
        .with_context(|| format!("cannot create the key {}", key_file.display()))?;
    let bench = Bench {
        threads,
        rows: usize::try_from(args.rows).context("--rows too large")?,
        scratch: scratch.to_path_buf(),
        server_bin: server_binary(args)?,
        key_file,
        key,
    };
    Quiet::secs(args.quiet_wait).wait();
    let per_second = units_per_second();
    let units = (per_second * secs as f64).ceil().max(1.0) as u64;
    let rate = PAPER_MB_PER_CORE_S * 1e6;
    let segment = args.paced_segment;
    eprintln!(
        "paced: {threads} threads x {units} units ({secs} s calibrated) while {:.3} MB/s of \
         {segment}-byte segments go to the store; {runs} rounds of {} strategies",
        rate * threads as f64 / 1e6,
        strategies.len()
    );
    let series = Rounds {
        runs,
        quiet: Quiet::secs(args.quiet_wait),
        retries: args.retries,
        disturbed: Disturbed::threads(threads),
        redo: Redo::Run { quiet_first: true },
        label: "paced".to_string(),
    }
    .run(
        strategies.len(),
        |_, i| bench.paced(strategies[i], units, per_second, rate, segment),
        |i, r| {
            format!(
                "{} {:.2}s, CPU {} + servers {}",
                strategies[i].name(),
                r.seconds,
                cpu_text(r.process_cpu_s),
                cpu_text(r.servers_cpu_s)
            )
        },
    )?;
    drop(keydir);
    Ok(Paced {
        strategies,
        runs: series.kept,
        units,
        per_second,
        rate,
        segment,
        threads,
    })
}

/// One strategy's medians in the paced series.
struct PacedRow {
    name: String,
    seconds: f64,
    ratio: f64,
    compute: Option<f64>,
    process: Option<f64>,
    servers: Option<f64>,
    /// MB of log per second of the compute threads' CPU, as written.
    rate: Option<f64>,
    /// (process + servers) minus the baseline's process CPU, over the baseline's process CPU.
    extra_by_difference: Option<f64>,
    /// CPU of everything but the compute threads (this process's other threads and the
    /// servers) minus the baseline's, over this run's compute CPU; per run, then the median.
    extra_direct: Option<f64>,
}

impl Paced {
    fn rows(&self) -> Vec<PacedRow> {
        let med = |runs: &[PacedRun], f: &dyn Fn(&PacedRun) -> Option<f64>| -> Option<f64> {
            let v: Vec<f64> = runs.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| median(&v))
        };
        let base = &self.runs[0];
        let base_secs = median(&base.iter().map(|r| r.seconds).collect::<Vec<_>>());
        let base_process = med(base, &|r| r.process_cpu_s);
        let base_rest = med(base, &|r| Some(r.process_cpu_s? - r.compute_cpu_s?));
        self.strategies
            .iter()
            .zip(&self.runs)
            .map(|(s, runs)| {
                let seconds = median(&runs.iter().map(|r| r.seconds).collect::<Vec<_>>());
                let process = med(runs, &|r| r.process_cpu_s);
                let servers = med(runs, &|r| Some(r.servers_cpu_s.unwrap_or(0.0)));
                let total = med(runs, &|r| {
                    Some(r.process_cpu_s? + r.servers_cpu_s.unwrap_or(0.0))
                });
                PacedRow {
                    name: s.name(),
                    seconds,
                    ratio: seconds / base_secs,
                    compute: med(runs, &|r| r.compute_cpu_s),
                    process,
                    servers: s.servers().gt(&0).then_some(servers).flatten(),
                    rate: med(runs, &|r| Some(r.log_bytes as f64 / r.compute_cpu_s? / 1e6)),
                    extra_by_difference: (*s != Strategy::None)
                        .then(|| Some((total? - base_process?) / base_process?))
                        .flatten(),
                    extra_direct: (*s != Strategy::None)
                        .then(|| {
                            med(runs, &|r| {
                                let rest = r.process_cpu_s? - r.compute_cpu_s?
                                    + r.servers_cpu_s.unwrap_or(0.0);
                                Some((rest - base_rest?) / r.compute_cpu_s?)
                            })
                        })
                        .flatten(),
                }
            })
            .collect()
    }

    fn markdown(&self, s: &mut String) {
        let _ = write!(
            s,
            "\nStorage overhead measured at paper 003's log rate: {} threads each run {} \
             compute units (a {b} x {b} f64 block product; calibrated to `--paced-secs` of one \
             thread's CPU) while the main thread writes one {} log segment (`put_batch` + \
             `flush`, as the runtime's log writer) through the strategy for every {:.3} s of \
             computation ({:.0} units; the log follows the computation's progress): {:.3} MB \
             per second of compute, paper 003's highest rate per core (see above). CPU \
             from /proc: the compute threads' own counters, the process's, the servers'; \
             medians of {} interleaved rounds. \"Extra CPU, by difference\": (process + \
             servers) minus the baseline's process CPU, over the baseline's (includes the \
             compute's slowdown from shared caches; its noise is the spread of the \
             baseline's CPU); \"extra CPU, direct\": CPU of everything but the compute \
             threads (the writer, the store's threads, the servers) minus the baseline's, \
             over the compute threads' CPU (10 ms ticks).\n\n",
            self.threads,
            self.units,
            size_text(self.segment),
            self.segment as f64 / self.rate,
            self.segment as f64 / self.rate * self.per_second,
            self.rate / 1e6,
            self.runs.first().map_or(0, Vec::len),
            b = PACED_BLOCK,
        );
        s.push_str(
            "| strategy | median (s) | / none | log (MB per compute s) | CPU compute (s) | CPU \
             process (s) | CPU servers (s) | extra CPU, by difference | extra CPU, direct |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let pct = |x: Option<f64>| opt_text(x, |x| format!("{:.2} %", 100.0 * x));
        for r in self.rows() {
            let _ = writeln!(
                s,
                "| {} | {:.2} | {:.4} | {} | {} | {} | {} | {} | {} |",
                r.name,
                r.seconds,
                r.ratio,
                opt_text(r.rate, |x| format!("{x:.3}")),
                cpu_text(r.compute),
                cpu_text(r.process),
                cpu_text(r.servers),
                pct(r.extra_by_difference),
                pct(r.extra_direct),
            );
        }
        let min_max = |f: &dyn Fn(&PacedRun) -> Option<f64>| {
            let v: Vec<f64> = self.runs[0].iter().filter_map(f).collect();
            Stats::of(&v).map_or("?".into(), |st| format!("{:.2}-{:.2}", st.min, st.max))
        };
        let _ = writeln!(
            s,
            "\nBaseline (none) process CPU min-max over its runs: {} s.",
            min_max(&|r| r.process_cpu_s)
        );
    }

    fn targets(&self) -> Vec<Target> {
        self.rows()
            .into_iter()
            .filter_map(|r| {
                let x = r.extra_direct?;
                Some(Target {
                    what: format!(
                        "{} extra CPU at paper 003's rate, measured (direct) <= 1 %",
                        r.name
                    ),
                    measured: format!(
                        "{:.2} % (by difference: {})",
                        100.0 * x,
                        opt_text(r.extra_by_difference, |d| format!("{:.2} %", 100.0 * d))
                    ),
                    met: x <= TARGET_OVERHEAD - 1.0,
                })
            })
            .collect()
    }

    fn json(&self) -> Value {
        let runs: Vec<Value> = self
            .strategies
            .iter()
            .zip(&self.runs)
            .map(|(s, runs)| {
                json!({
                    "strategy": s.name(),
                    "runs": runs.iter().map(|r| json!({
                        "seconds": r.seconds,
                        "compute_cpu_s": r.compute_cpu_s,
                        "process_cpu_s": r.process_cpu_s,
                        "servers_cpu_s": r.servers_cpu_s,
                        "other_processes_cpu_s": r.other_cpu_s,
                        "log_bytes": r.log_bytes,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let rows: Vec<Value> = self
            .rows()
            .into_iter()
            .map(|r| {
                json!({
                    "strategy": r.name, "median_s": r.seconds, "ratio": r.ratio,
                    "log_mb_per_compute_cpu_s": r.rate,
                    "extra_cpu_by_difference": r.extra_by_difference,
                    "extra_cpu_direct": r.extra_direct,
                })
            })
            .collect();
        json!({
            "threads": self.threads,
            "units_per_thread": self.units,
            "units_per_cpu_second": self.per_second,
            "unit": format!("{b} x {b} f64 block product", b = PACED_BLOCK),
            "rate_bytes_per_compute_cpu_s": self.rate,
            "segment_bytes": self.segment,
            "rows": rows,
            "strategies": runs,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Report.

/// Paper 003 Table 1: the highest checkpoint rate of one of its nodes (one AthlonXP core): a
/// local checkpoint of 116.6 MB per 616.1 s segment (5400 x 5400). At 2700 it is 29.2 MB per
/// 303.1 s, at 1350 7.3 MB per 54.8 s: lower.
const PAPER_MB_PER_CORE_S: f64 = 116.6 / 616.1;

struct Report {
    quick: bool,
    /// Threads of rayon's global pool: the cores the codec codes on in the "all cores" columns.
    cores: usize,
    runs: usize,
    threads: usize,
    rows: usize,
    coding: Vec<CodingRow>,
    overhead: Option<Overhead>,
    paced: Option<Paced>,
}

struct Target {
    what: String,
    measured: String,
    met: bool,
}

fn median_of<T>(runs: &[MatRun], f: impl Fn(&MatRun) -> Option<T>) -> Option<f64>
where
    T: Into<f64>,
{
    let v: Vec<f64> = runs.iter().filter_map(|r| f(r).map(Into::into)).collect();
    Stats::of(&v).map(|s| s.median)
}

fn size_text(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn mb(bytes: f64) -> String {
    format!("{:.1}", bytes / 1e6)
}

fn opt_text(x: Option<f64>, f: impl Fn(f64) -> String) -> String {
    x.map_or_else(|| "–".to_string(), f)
}

/// Bytes (u64) as f64 for the medians: exact below 2^53, far above any log here.
fn bytes_f64(b: u64) -> f64 {
    b as f64
}

/// Summary of one strategy at one size (medians over its runs).
struct Row {
    strategy: Strategy,
    seconds: Stats,
    /// Median time over the median time of `none`.
    ratio: f64,
    cpu_s: Option<f64>,
    servers_cpu_s: Option<f64>,
    /// CPU seconds above the baseline's: process + servers − `none`'s process.
    extra_cpu_s: Option<f64>,
    disk_bytes: Option<f64>,
    log_bytes: Option<f64>,
    stored_bytes: Option<f64>,
    events: u64,
    tasks: u64,
}

impl SizeRuns {
    /// One row per strategy, `none` first.
    fn rows(&self, strategies: &[Strategy]) -> Result<Vec<Row>> {
        let base = median(&secs(&self.runs.kept[0]));
        let base_cpu = median_of(&self.runs.kept[0], |r| r.cpu_s);
        strategies
            .iter()
            .zip(&self.runs.kept)
            .map(|(&strategy, runs)| {
                let seconds = Stats::of(&secs(runs)).context("no runs")?;
                let cpu_s = median_of(runs, |r| r.cpu_s);
                let servers_cpu_s = median_of(runs, |r| r.servers_cpu_s);
                Ok(Row {
                    strategy,
                    ratio: seconds.median / base,
                    seconds,
                    cpu_s,
                    servers_cpu_s,
                    extra_cpu_s: match (cpu_s, base_cpu) {
                        (Some(c), Some(b)) => Some(c + servers_cpu_s.unwrap_or(0.0) - b),
                        _ => None,
                    },
                    disk_bytes: median_of(runs, |r| r.disk_bytes.map(bytes_f64)),
                    log_bytes: median_of(runs, |r| r.log_bytes.map(bytes_f64)),
                    stored_bytes: median_of(runs, |r| r.stored_bytes.map(bytes_f64)),
                    events: runs.iter().map(|r| r.events).max().unwrap_or(0),
                    tasks: runs.iter().map(|r| r.tasks).max().unwrap_or(0),
                })
            })
            .collect()
    }
}

fn secs(runs: &[MatRun]) -> Vec<f64> {
    runs.iter().map(|r| r.seconds).collect()
}

/// The log's size at one matrix size (median over the memory and local runs).
fn log_size(rows: &[Row]) -> Option<f64> {
    let v: Vec<f64> = rows.iter().filter_map(|r| r.log_bytes).collect();
    Stats::of(&v).map(|s| s.median)
}

/// Derived figures of a row, given the log's size.
struct Derived {
    /// Extra CPU per MB of log, in seconds.
    cpu_per_mb: Option<f64>,
    /// Overhead projected at paper 003's checkpoint rate, as a fraction (0.01 = 1 %).
    projected: Option<f64>,
    /// Bytes stored over bytes of log.
    stored_over_log: Option<f64>,
    /// Bytes on disk over the local store's bytes on disk.
    disk_over_local: Option<f64>,
}

impl Row {
    fn derived(&self, log: Option<f64>, local_disk: Option<f64>) -> Derived {
        let log_mb = log.filter(|&l| l > 0.0).map(|l| l / 1e6);
        let cpu_per_mb = match (self.extra_cpu_s, log_mb) {
            (Some(c), Some(l)) if self.strategy != Strategy::None => Some(c / l),
            _ => None,
        };
        Derived {
            cpu_per_mb,
            projected: cpu_per_mb.map(|c| c * PAPER_MB_PER_CORE_S),
            stored_over_log: match (self.stored_bytes, log) {
                (Some(s), Some(l)) if l > 0.0 => Some(s / l),
                _ => None,
            },
            disk_over_local: match (self.disk_bytes, local_disk) {
                (Some(d), Some(l)) if l > 0.0 => Some(d / l),
                _ => None,
            },
        }
    }
}

/// The local store's bytes on disk at one size.
fn local_disk(rows: &[Row]) -> Option<f64> {
    rows.iter()
        .find(|r| r.strategy == Strategy::Local)
        .and_then(|r| r.disk_bytes)
}

impl Report {
    /// GB/s of blob a codec that hashes every fragment reaches at most on every core: the
    /// cores hashing (M+K)/M bytes per blob byte at blake3's one-core rate, nothing else.
    fn hash_floor(&self, r: &CodingRow) -> f64 {
        self.cores as f64 * median(&r.blake3) * r.m as f64 / (r.m + r.k) as f64
    }

    fn coding_targets(&self) -> Vec<Target> {
        let mut t = Vec::new();
        for r in &self.coding {
            let goal = match r.code.as_str() {
                "ida(8,2)" => TARGET_IDA_8_2_GBPS,
                c if c.starts_with("parity") => TARGET_PARITY_GBPS,
                _ => continue,
            };
            // The issue's targets are for the codec on every core; the code alone is one core's.
            let all = format!("{} cores", self.cores);
            for (op, v) in [
                (format!("encode ({all})"), &r.encode_all),
                (format!("decode, all fragments ({all})"), &r.decode_all),
                (
                    format!("decode, K data fragments lost ({all})"),
                    &r.rebuild_all,
                ),
                ("code alone, encode (one core)".to_string(), &r.code_encode),
                (
                    "code alone, rebuild (one core)".to_string(),
                    &r.code_rebuild,
                ),
            ] {
                let x = median(v);
                let floor = if op.contains("code alone") {
                    String::new()
                } else {
                    format!(" (hash floor {:.2})", self.hash_floor(r))
                };
                t.push(Target {
                    what: format!("{} {op} at {} >= {goal} GB/s", r.code, size_text(r.blob)),
                    measured: format!("{x:.2} GB/s{floor}"),
                    met: x >= goal,
                });
            }
        }
        t
    }

    fn overhead_targets(&self) -> Result<Vec<Target>> {
        let mut t = Vec::new();
        let Some(o) = &self.overhead else {
            return Ok(t);
        };
        for size in &o.sizes {
            for row in size.rows(&o.strategies)?.iter().skip(1) {
                t.push(Target {
                    what: format!(
                        "{} / none <= {TARGET_OVERHEAD} at {}",
                        row.strategy.name(),
                        size.series
                    ),
                    measured: format!("{:.4}", row.ratio),
                    met: row.ratio <= TARGET_OVERHEAD,
                });
            }
        }
        Ok(t)
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        if !self.coding.is_empty() {
            let c = self.cores;
            let _ = write!(
                s,
                "\nCoding throughput on one core and on {c} (paper 003 Fig. 2): GB/s of blob \
                 (10^9 B/s), median of the repetitions. Encode and decode are `Codec`'s \
                 (fragment headers and blake3 digests of every fragment included), \"1\" in a \
                 one-thread rayon pool, \"{c}\" on the codec's own pool ({c} threads: the codec \
                 codes and hashes blocks of the pieces in parallel, erasure/mod.rs rule 2); \
                 \"K lost\": the first K data fragments missing, rebuilt from parity; \"code \
                 alone\": `ErasureCode::encode` / `reconstruct_data` over the codec's widest \
                 blocks on one core, no copies, no digests; \"blake3 alone\": one blake3 hash \
                 of the blob on one core (`Codec` hashes (M+K)/M times its bytes); \"hash \
                 floor\": the most a codec that hashes every fragment can reach on {c} cores, \
                 {c} x blake3 alone x M/(M+K) (hashing alone; coding, copies and fresh pages \
                 only add to it). Last columns but two: seconds to encode 100 MB at the \
                 {c}-core encode rate (paper 003: \"a few seconds\").\n\n",
            );
            let _ = write!(
                s,
                "| code | blob | encode, 1 | encode, {c} | decode (all), 1 | decode (all), {c} | \
                 decode (K lost), 1 | decode (K lost), {c} | code alone: encode | \
                 code alone: rebuild | blake3 alone | hash floor, {c} | 100 MB encode (s) | \
                 other CPU (s) | rerun / kept disturbed |\n\
                 |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            );
            for r in &self.coding {
                let enc = median(&r.encode_all);
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | \
                     {:.2} | {:.2} | {:.3} | {} | {} / {} |",
                    r.code,
                    size_text(r.blob),
                    median(&r.encode),
                    enc,
                    median(&r.decode),
                    median(&r.decode_all),
                    median(&r.rebuild),
                    median(&r.rebuild_all),
                    median(&r.code_encode),
                    median(&r.code_rebuild),
                    median(&r.blake3),
                    self.hash_floor(r),
                    0.1 / enc,
                    cpu_text(r.other_cpu_s),
                    r.reruns,
                    u32::from(r.disturbed),
                );
            }
        }
        if let Some(o) = &self.overhead {
            self.overhead_markdown(&mut s, o);
        }
        if let Some(p) = &self.paced {
            p.markdown(&mut s);
        }
        let mut targets = self.coding_targets();
        targets.extend(self.paced.iter().flat_map(Paced::targets));
        match self.overhead_targets() {
            Ok(t) => targets.extend(t),
            Err(e) => {
                let _ = writeln!(s, "\n(overhead targets: {e})");
            }
        }
        if !targets.is_empty() {
            s.push_str("\n| target | measured | met |\n|---|---:|---|\n");
            for t in &targets {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} |",
                    t.what,
                    t.measured,
                    if t.met { "yes" } else { "**no**" }
                );
            }
        }
        s
    }

    fn overhead_markdown(&self, s: &mut String, o: &Overhead) {
        let _ = writeln!(
            s,
            "\nRun-time overhead (paper 003 Fig. 3): matrix product C = A B (f64), {} rows of B \
             per `GenB` panel and of C per `RowBlock`, {} threads, 1 vnode, every task logged \
             (B and C once each); median of {} interleaved rounds; time = \
             `RunReport::elapsed` (until every event is durable); servers are \
             `checkpoint-server` processes on 127.0.0.1 sharing the same cores, fresh for \
             every run (`{}`). \"/ none\" is on the medians. CPU: of this process and of the \
             servers during the run; extra CPU = both minus the baseline's. \"At paper 003's \
             rate\": extra CPU per MB of log times {:.3} MB/s per core (paper 003 Table 1, \
             5400 x 5400: 116.6 MB per node every 616.1 s), a projection, not a measurement.",
            self.rows,
            self.threads,
            if self.quick { 1 } else { self.runs },
            o.server_bin.display(),
            PAPER_MB_PER_CORE_S
        );
        for size in &o.sizes {
            let rows = match size.rows(&o.strategies) {
                Ok(r) => r,
                Err(e) => {
                    let _ = writeln!(s, "\n{}: {e}", size.series);
                    continue;
                }
            };
            let log = log_size(&rows);
            let local = local_disk(&rows);
            let none = rows[0].seconds.median;
            let _ = writeln!(
                s,
                "\n{} ({} tasks, {} events; log {} MB, {} MB/s of the baseline's time; {} \
                 disturbed run(s) run again, {} kept, {} quiet wait(s) gave up):\n",
                size.series,
                rows.last().map_or(0, |r| r.tasks),
                rows.last().map_or(0, |r| r.events),
                opt_text(log, mb),
                opt_text(log, |l| format!("{:.1}", l / 1e6 / none)),
                size.runs.rerun,
                size.runs.kept_disturbed,
                size.runs.not_quiet
            );
            s.push_str(
                "| strategy | median (s) | / none | min–max (s) | CPU process (s) | CPU servers \
                 (s) | extra CPU (s) | extra CPU per MB of log (ms) | at paper 003's rate |\n\
                 |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            );
            for r in &rows {
                let d = r.derived(log, local);
                let _ = writeln!(
                    s,
                    "| {} | {:.3} | {:.4} | {:.3}–{:.3} | {} | {} | {} | {} | {} |",
                    r.strategy.name(),
                    r.seconds.median,
                    r.ratio,
                    r.seconds.min,
                    r.seconds.max,
                    cpu_text(r.cpu_s),
                    cpu_text(r.servers_cpu_s),
                    cpu_text(r.extra_cpu_s.filter(|_| r.strategy != Strategy::None)),
                    opt_text(d.cpu_per_mb, |c| format!("{:.2}", c * 1e3)),
                    opt_text(d.projected, |p| format!("{:.2} %", p * 100.0)),
                );
            }
            s.push_str(
                "\nStorage (medians): bytes of keys and values stored (the log for local; every \
                 fragment on every server, read back from their data directories), and bytes \
                 on disk (`du` of the data directories: sled's files).\n\n\
                 | strategy | (M+K)/M | stored (MB) | stored / log | on disk (MB) | on disk / \
                 local's |\n|---|---:|---:|---:|---:|---:|\n",
            );
            for r in rows.iter().filter(|r| r.strategy.expansion().is_some()) {
                let d = r.derived(log, local);
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} |",
                    r.strategy.name(),
                    opt_text(r.strategy.expansion(), |e| format!("{e:.3}")),
                    opt_text(r.stored_bytes, mb),
                    opt_text(d.stored_over_log, |x| format!("{x:.3}")),
                    opt_text(r.disk_bytes, mb),
                    opt_text(d.disk_over_local, |x| format!("{x:.2}")),
                );
            }
        }
    }

    fn overhead_json(&self, o: &Overhead) -> Value {
        let sizes: Vec<Value> = o
            .sizes
            .iter()
            .map(|size| {
                let rows = size.rows(&o.strategies).unwrap_or_default();
                let log = log_size(&rows);
                let local = local_disk(&rows);
                let strategies: Vec<Value> = o
                    .strategies
                    .iter()
                    .zip(&size.runs.kept)
                    .enumerate()
                    .map(|(i, (&st, runs))| {
                        let row = rows.get(i);
                        let d = row.map(|r| r.derived(log, local));
                        json!({
                            "strategy": st.name(),
                            "servers": st.servers(),
                            "expansion_m_plus_k_over_m": st.expansion(),
                            "seconds": secs(runs),
                            "median_s": row.map(|r| r.seconds.median),
                            "min_s": row.map(|r| r.seconds.min),
                            "max_s": row.map(|r| r.seconds.max),
                            "over_none": row.map(|r| r.ratio),
                            "cpu_s": runs.iter().map(|r| r.cpu_s).collect::<Vec<_>>(),
                            "servers_cpu_s": runs.iter().map(|r| r.servers_cpu_s).collect::<Vec<_>>(),
                            "other_processes_cpu_s": runs.iter().map(|r| r.other_cpu_s).collect::<Vec<_>>(),
                            "extra_cpu_s_median": row.and_then(|r| r.extra_cpu_s),
                            "extra_cpu_s_per_mb_of_log": d.as_ref().and_then(|d| d.cpu_per_mb),
                            "projected_overhead_at_paper_rate": d.as_ref().and_then(|d| d.projected),
                            "log_bytes": runs.iter().map(|r| r.log_bytes).collect::<Vec<_>>(),
                            "stored_bytes": runs.iter().map(|r| r.stored_bytes).collect::<Vec<_>>(),
                            "stored_over_log": d.as_ref().and_then(|d| d.stored_over_log),
                            "disk_bytes": runs.iter().map(|r| r.disk_bytes).collect::<Vec<_>>(),
                            "file_bytes": runs.iter().map(|r| r.file_bytes).collect::<Vec<_>>(),
                            "disk_over_local": d.as_ref().and_then(|d| d.disk_over_local),
                            "tasks": runs.iter().map(|r| r.tasks).collect::<Vec<_>>(),
                            "events": runs.iter().map(|r| r.events).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                json!({
                    "n": size.series.n,
                    "work": size.series.work,
                    "tasks": matmul_tasks(size.series.n, self.rows),
                    "log_bytes": log,
                    "disturbed_runs_run_again": size.runs.rerun,
                    "disturbed_runs_kept": size.runs.kept_disturbed,
                    "quiet_waits_given_up": size.runs.not_quiet,
                    "strategies": strategies,
                })
            })
            .collect();
        json!({
            "server_bin": o.server_bin,
            "paper_mb_per_core_s": PAPER_MB_PER_CORE_S,
            "sizes": sizes,
        })
    }

    fn json(&self) -> Value {
        let coding: Vec<Value> = self
            .coding
            .iter()
            .map(|r| {
                let stat = |v: &[f64]| {
                    let st = Stats::of(v);
                    json!({
                        "gb_per_s": v,
                        "median": st.map(|s| s.median),
                        "min": st.map(|s| s.min),
                        "max": st.map(|s| s.max),
                    })
                };
                json!({
                    "code": r.code, "m": r.m, "k": r.k, "blob_bytes": r.blob,
                    "encode": stat(&r.encode),
                    "decode_all_fragments": stat(&r.decode),
                    "decode_k_data_fragments_lost": stat(&r.rebuild),
                    "encode_all_cores": stat(&r.encode_all),
                    "decode_all_fragments_all_cores": stat(&r.decode_all),
                    "decode_k_data_fragments_lost_all_cores": stat(&r.rebuild_all),
                    "code_alone_encode": stat(&r.code_encode),
                    "code_alone_rebuild": stat(&r.code_rebuild),
                    "blake3_alone": stat(&r.blake3),
                    "other_processes_cpu_s": r.other_cpu_s,
                    "started_on_busy_machine": r.not_quiet,
                    "disturbed_measurements_rerun": r.reruns,
                    "kept_disturbed": r.disturbed,
                })
            })
            .collect();
        let overhead = self.overhead.as_ref().map(|o| self.overhead_json(o));
        let targets: Vec<Value> = self
            .coding_targets()
            .into_iter()
            .chain(self.overhead_targets().unwrap_or_default())
            .chain(self.paced.iter().flat_map(Paced::targets))
            .map(|t| json!({ "target": t.what, "measured": t.measured, "met": t.met }))
            .collect();
        json!({
            "parameters": {
                "coding": {
                    "codes": codecs().map(|c| c.iter().map(|c| c.to_string()).collect::<Vec<_>>()).unwrap_or_default(),
                    "blob_bytes": BLOB_SIZES,
                    "repetitions": if self.quick { CODING_REPS_QUICK } else { CODING_REPS },
                    "min_loop_s": if self.quick { MIN_LOOP_QUICK } else { MIN_LOOP }.as_secs_f64(),
                    "unit": "GB/s = 1e9 bytes of blob per second; one core (a one-thread rayon \
                             pool) and all cores (the codec's own pool) for the codec, one core \
                             for the code alone and blake3 alone",
                    "cores": self.cores,
                    "stripe_bytes": STRIPE_BYTES,
                },
                "overhead": {
                    "app": "C = A B, n x n, f64 entries in -4..=4 (exact): GenB panels, \
                            RowBlocks (rayon inside), Checksum (row sums, checked)",
                    "rows_per_task": self.rows,
                    "threads": self.threads,
                    "vnodes": 1,
                    "runs": if self.quick { 1 } else { self.runs },
                    "strategies": self.overhead.as_ref().map(|o| o.strategies.iter().map(|s| s.name()).collect::<Vec<_>>()),
                    "timing": "RunReport::elapsed (root declared until every event is durable; \
                               runtime build, store open and server start excluded)",
                    "servers": "checkpoint-server processes on 127.0.0.1, sled data dirs in \
                                the scratch dir, fresh per run, SIGKILLed after it",
                    "quiet_cores": harness::QUIET_CORES,
                    "disturbed": format!("{} (other processes: not this one, not its servers)",
                                         Disturbed::threads(self.threads).text()),
                },
            },
            "coding": coding,
            "overhead": overhead,
            "paced": self.paced.as_ref().map(Paced::json),
            "targets": targets,
        })
    }
}

/// Pixels of the overhead plot.
const PLOT_SIZE: (u32, u32) = (900, 500);

/// `storage_overhead.png`: the overhead of every strategy over `none`, in percent, one bar per
/// matrix size.
pub(crate) struct OverheadFigure {
    /// The strategies after `none`.
    names: Vec<String>,
    /// Per matrix size: its label and the overhead of each strategy (%).
    series: Vec<(String, Vec<f64>)>,
}

impl OverheadFigure {
    fn of(o: &Overhead) -> Result<OverheadFigure> {
        let mut series = Vec::new();
        for size in &o.sizes {
            let rows = size.rows(&o.strategies)?;
            series.push((
                size.series.to_string(),
                rows.iter()
                    .skip(1)
                    .map(|r| (r.ratio - 1.0) * 100.0)
                    .collect(),
            ));
        }
        Ok(OverheadFigure {
            names: o.strategies.iter().skip(1).map(|s| s.name()).collect(),
            series,
        })
    }

    /// The figure of a `storage.json` (`paper replot`).
    pub(crate) fn from_json(j: &Value) -> Result<OverheadFigure> {
        let sizes = j["overhead"]["sizes"]
            .as_array()
            .context("no overhead.sizes")?;
        let mut names = Vec::new();
        let mut series = Vec::new();
        for size in sizes {
            let label = Series {
                n: usize::try_from(size["n"].as_u64().context("a size without n")?)?,
                work: usize::try_from(size["work"].as_u64().unwrap_or(1))?,
            }
            .to_string();
            let strategies = size["strategies"]
                .as_array()
                .context("a size without strategies")?;
            names = strategies
                .iter()
                .skip(1)
                .map(|s| s["strategy"].as_str().unwrap_or("?").to_string())
                .collect();
            let values = strategies
                .iter()
                .skip(1)
                .map(|s| {
                    let r = s["over_none"]
                        .as_f64()
                        .context("a strategy without over_none")?;
                    Ok((r - 1.0) * 100.0)
                })
                .collect::<Result<_>>()?;
            series.push((label, values));
        }
        Ok(OverheadFigure { names, series })
    }
}

impl harness::Figure for OverheadFigure {
    fn size(&self) -> (u32, u32) {
        PLOT_SIZE
    }

    fn draw<DB: plotters::prelude::DrawingBackend>(
        &self,
        root: plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    ) -> Result<(), String> {
        draw_overhead(root, self)
    }
}

fn draw_overhead<DB: plotters::prelude::DrawingBackend>(
    root: plotters::drawing::DrawingArea<DB, plotters::coord::Shift>,
    f: &OverheadFigure,
) -> Result<(), String> {
    use plotters::prelude::*;
    let (names, series) = (&f.names, &f.series);
    let all = series.iter().flat_map(|(_, v)| v.iter().copied());
    let top = all.clone().fold((PAPER_OVERHEAD - 1.0) * 100.0, f64::max) * 1.1;
    let bottom = all.fold(0.0, f64::min).min(0.0) * 1.1 - 0.5;
    root.fill(&WHITE).map_err(harness::plot::err)?;
    let groups = names.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Run-time overhead of checkpoint storage (matrix product, 2 cores)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..groups as f64, bottom..top)
        .map_err(harness::plot::err)?;
    let labels = names.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor();
            if (x - i - 0.5).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("time over no log − 1 (%)")
        .draw()
        .map_err(harness::plot::err)?;
    let palette = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
    ];
    let width = 0.8 / series.len().max(1) as f64;
    for (si, (n, values)) in series.iter().enumerate() {
        let color = palette[si % palette.len()];
        chart
            .draw_series(values.iter().enumerate().map(|(i, &v)| {
                let x0 = i as f64 + 0.1 + si as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width, v)], color.filled())
            }))
            .map_err(harness::plot::err)?
            .label(n.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        chart
            .draw_series(values.iter().enumerate().map(|(i, &v)| {
                let x = i as f64 + 0.1 + si as f64 * width;
                Text::new(
                    format!("{v:.1}"),
                    (x, v.max(0.0) + (top - bottom) * 0.03),
                    ("sans-serif", 11),
                )
            }))
            .map_err(harness::plot::err)?;
    }
    for (pct, label, color) in [
        ((TARGET_OVERHEAD - 1.0) * 100.0, "target 1 %", BLACK),
        (
            (PAPER_OVERHEAD - 1.0) * 100.0,
            "paper 003: < 3 %",
            RGBColor(128, 128, 128),
        ),
    ] {
        chart
            .draw_series(LineSeries::new(
                [(0.0, pct), (groups as f64, pct)],
                color.stroke_width(1),
            ))
            .map_err(harness::plot::err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 12, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(harness::plot::err)?;
    root.present().map_err(harness::plot::err)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The machine.

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_product_is_exact_with_and_without_a_log() {
        let n = 37;
        let expected = expected_row_sums(n, MATRIX_SEED);
        for store in [
            None,
            Some(Arc::new(MemoryStore::default()) as Arc<dyn Store>),
        ] {
            let mut b = Runtime::builder(matmul_registry().unwrap())
                .threads(2)
                .vnodes(1);
            b = match store {
                Some(s) => b.store(s),
                None => b.checkpoint(false),
            };
            let report = b
                .build()
                .unwrap()
                .run(
                    MatMul {
                        n,
                        rows: 5,
                        seed: MATRIX_SEED,
                        work: 2,
                    },
                    (),
                )
                .unwrap();
            assert_eq!(report.outputs.0, expected);
            assert_eq!(report.tasks as usize, matmul_tasks(n, 5));
        }
    }

    #[test]
    fn strategy_specs_parse() {
        let addrs: Vec<String> = (0..10).map(|i| format!("127.0.0.1:{}", 7000 + i)).collect();
        for s in STRATEGIES.iter().filter(|s| s.servers() > 0) {
            let spec = s.spec(&addrs[..s.servers()]);
            assert!(spec.parse::<StoreSpec>().is_ok(), "{spec}");
        }
    }

    #[test]
    fn strategies_are_selected_by_name_with_the_baseline_first() {
        let names = |v: &[&str]| -> Vec<String> { v.iter().map(|s| s.to_string()).collect() };
        assert_eq!(selected_strategies(&[]).unwrap(), STRATEGIES.to_vec());
        assert_eq!(
            selected_strategies(&names(&["ida:8,2", "local", "ida:8,2"])).unwrap(),
            vec![Strategy::None, Strategy::Local, Strategy::Ida(8, 2)]
        );
        assert!(selected_strategies(&names(&["ida:7,3"])).is_err());
    }

    #[test]
    fn code_alone_round_trips() {
        for codec in codecs().unwrap() {
            let data = blob(100_000, 1);
            let (e, r) = code_alone(&codec, &data, 1, Duration::ZERO).unwrap();
            assert!(e[0] > 0.0 && r[0] > 0.0);
        }
    }
}

//! The damage campaign (issue 13): seeded random damages of a stored run, and the verdict on
//! what the readers made of each.
//!
//! A campaign takes the log directory of a finished run and of an interrupted one (a run killed
//! with SIGKILL part way), and for each seed: copies one of them, applies one [`Kind`] of
//! damage drawn from the seed, then runs `inspect --json`, `certify --json` and `run --resume
//! --json` on the copy, each with a time limit, and sorts what happened ([`Outcome`]):
//!
//! - `inspect` may exit 0 only if what it reports (status, events per vnode, terminal outputs)
//!   is what it reports on the intact store;
//! - `certify` may exit 0 (ACCEPT) only on an intact log, i.e. where `inspect` is right too;
//! - `run --resume` may exit 0 only with the right result;
//! - `inspect` and `certify` must leave the directory as they found it (readers never write);
//! - a time limit reached is a hang, exit 101 or a signal is a panic.
//!
//! Everything is drawn from the seed (a splitmix64 stream), so a failure names the seed that
//! replays it.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use veriflow_checkpoint::{SledStore, Store};

/// A kind of damage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// One byte of sled's `db` file changed.
    FlipDb,
    /// One byte of a blob file (sled's file for a large value: most segments) changed.
    FlipBlob,
    /// One byte of another file (`conf`, a snapshot, the flush record) changed.
    FlipOther,
    /// sled's `db` file cut short.
    TruncateDb,
    /// A blob file cut short.
    TruncateBlob,
    /// A blob file deleted.
    DeleteBlob,
    /// Another file deleted (`conf`, `db`, a snapshot, the flush record).
    DeleteOther,
    /// One log segment deleted through the store's API.
    DeleteSegment,
    /// One log segment's bytes stored again under another segment's key (after the last, or
    /// over another one), through the store's API.
    DuplicateSegment,
    /// Another key deleted through the store's API (the manifest, a durable watermark).
    DeleteKey,
}

impl Kind {
    /// Every kind, in the order they are drawn.
    pub const ALL: [Kind; 10] = [
        Kind::FlipDb,
        Kind::FlipBlob,
        Kind::FlipOther,
        Kind::TruncateDb,
        Kind::TruncateBlob,
        Kind::DeleteBlob,
        Kind::DeleteOther,
        Kind::DeleteSegment,
        Kind::DuplicateSegment,
        Kind::DeleteKey,
    ];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Kind::FlipDb => "flip-db",
            Kind::FlipBlob => "flip-blob",
            Kind::FlipOther => "flip-other-file",
            Kind::TruncateDb => "truncate-db",
            Kind::TruncateBlob => "truncate-blob",
            Kind::DeleteBlob => "delete-blob",
            Kind::DeleteOther => "delete-other-file",
            Kind::DeleteSegment => "delete-segment",
            Kind::DuplicateSegment => "duplicate-segment",
            Kind::DeleteKey => "delete-key",
        }
    }
}

/// What one command did with one damaged store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Exit 1 with a message: the damage was reported.
    Detected,
    /// Exit 0 with what the intact store gives (the damage touched nothing that matters).
    Right,
    /// Exit 0 on the interrupted run's store with less than the intact copy shows: only
    /// events at the tail of vnodes' logs, as if the run had been killed a little earlier.
    /// A SIGKILLed process leaves in sled's files writes it never flushed (the page cache
    /// keeps them), which no reader may count on; the flush record (rule 2 of `sled_store.rs`)
    /// guarantees that no flushed write is missing. Not a failure: `run --resume` must then
    /// still give the right result (judged on its own).
    EarlierCrashPoint,
    /// The time limit was reached.
    Hang,
    /// Exit 101, a signal, or "panicked" in the output.
    Panic,
    /// Exit 0 with missing or different data (inspect, resume).
    Silent,
    /// `certify` said ACCEPT on a damaged log.
    WrongAccept,
    /// `inspect` or `certify` changed the directory.
    ReaderWrote,
    /// `run --resume` of a run whose manifest says it finished: refused as a usage error
    /// (exit 2, "nothing to resume"), whatever else is damaged; nothing is written.
    NothingToResume,
    /// Any other exit status (2 for anything but nothing to resume: a usage error is not
    /// expected here).
    OtherExit,
}

impl Outcome {
    /// Whether this outcome fails the campaign.
    pub fn is_failure(self) -> bool {
        !matches!(
            self,
            Outcome::Detected
                | Outcome::Right
                | Outcome::EarlierCrashPoint
                | Outcome::NothingToResume
        )
    }

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Detected => "detected (exit 1)",
            Outcome::Right => "right answer (exit 0)",
            Outcome::EarlierCrashPoint => "earlier crash point (exit 0)",
            Outcome::Hang => "hang",
            Outcome::Panic => "panic",
            Outcome::Silent => "exit 0, missing data",
            Outcome::WrongAccept => "wrong ACCEPT",
            Outcome::ReaderWrote => "reader wrote",
            Outcome::NothingToResume => "nothing to resume (exit 2)",
            Outcome::OtherExit => "other exit",
        }
    }
}

/// splitmix64: a small seeded stream, enough to draw damages.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5eed_da4a_6e00_0013)
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// One of `items` (not empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        let len = u64::try_from(items.len()).unwrap_or(u64::MAX);
        &items[usize::try_from(self.below(len)).unwrap_or(0)]
    }
}

/// Every regular file under `dir`, relative to it, sorted.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => walk(base, &p, out),
                Ok(t) if t.is_file() => out.push(p.strip_prefix(base).unwrap_or(&p).to_path_buf()),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// A digest of every file under `dir` (names and bytes), to tell whether a reader wrote.
pub fn tree_digest(dir: &Path) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    for f in files(dir) {
        h.update(f.to_string_lossy().as_bytes());
        h.update(&[0]);
        h.update(&std::fs::read(dir.join(&f)).unwrap_or_default());
        h.update(&[0]);
    }
    h.finalize()
}

/// Copies the directory tree `from` to `to` (which must not exist).
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for f in files(from) {
        let target = to.join(&f);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(from.join(&f), target)?;
    }
    Ok(())
}

/// Applies one damage of `kind` drawn from `rng` to the store in `dir`; returns what was done,
/// or `None` when the store offers nothing to damage that way (e.g. no blob file).
pub fn apply(kind: Kind, rng: &mut Rng, dir: &Path) -> std::io::Result<Option<String>> {
    let all = files(dir);
    let is_blob = |f: &&PathBuf| f.starts_with("blobs");
    let is_db = |f: &&PathBuf| f.as_path() == Path::new("db");
    let choose = |rng: &mut Rng, pred: &dyn Fn(&&PathBuf) -> bool| -> Option<PathBuf> {
        let picked: Vec<&PathBuf> = all.iter().filter(pred).collect();
        (!picked.is_empty()).then(|| (*rng.pick(&picked)).clone())
    };
    let other = |f: &&PathBuf| !is_blob(f) && !is_db(f);
    match kind {
        Kind::FlipDb | Kind::FlipBlob | Kind::FlipOther => {
            let file = match kind {
                Kind::FlipDb => choose(rng, &is_db),
                Kind::FlipBlob => choose(rng, &is_blob),
                _ => choose(rng, &other),
            };
            let Some(file) = file else { return Ok(None) };
            let path = dir.join(&file);
            let mut bytes = std::fs::read(&path)?;
            if bytes.is_empty() {
                return Ok(None);
            }
            let at = usize::try_from(rng.below(bytes.len() as u64)).unwrap_or(0);
            let mask = u8::try_from(1 + rng.below(255)).unwrap_or(1);
            bytes[at] ^= mask;
            std::fs::write(&path, &bytes)?;
            Ok(Some(format!(
                "{}: byte {at} of {} xor {mask:#04x}",
                file.display(),
                bytes.len()
            )))
        }
        Kind::TruncateDb | Kind::TruncateBlob => {
            let file = if kind == Kind::TruncateDb {
                choose(rng, &is_db)
            } else {
                choose(rng, &is_blob)
            };
            let Some(file) = file else { return Ok(None) };
            let path = dir.join(&file);
            let len = std::fs::metadata(&path)?.len();
            if len == 0 {
                return Ok(None);
            }
            let keep = rng.below(len);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)?
                .set_len(keep)?;
            Ok(Some(format!(
                "{}: cut to {keep} of {len} bytes",
                file.display()
            )))
        }
        Kind::DeleteBlob | Kind::DeleteOther => {
            let file = if kind == Kind::DeleteBlob {
                choose(rng, &is_blob)
            } else {
                choose(rng, &|f: &&PathBuf| !is_blob(f))
            };
            let Some(file) = file else { return Ok(None) };
            std::fs::remove_file(dir.join(&file))?;
            Ok(Some(format!("{} deleted", file.display())))
        }
        Kind::DeleteSegment | Kind::DuplicateSegment | Kind::DeleteKey => {
            let store = SledStore::open(dir).map_err(std::io::Error::other)?;
            let done = store_damage(kind, rng, &store).map_err(std::io::Error::other)?;
            store.flush().map_err(std::io::Error::other)?;
            drop(store);
            Ok(done)
        }
    }
}

/// Segment keys are `seg/` ‖ vnode (u32 BE) ‖ segment number (u64 BE) (runtime `segment.rs`).
fn store_damage(
    kind: Kind,
    rng: &mut Rng,
    store: &SledStore,
) -> Result<Option<String>, veriflow_checkpoint::StoreError> {
    let segments: Vec<(Vec<u8>, Vec<u8>)> = store.scan_prefix(b"seg/")?;
    let name = |k: &[u8]| -> String {
        match (k.get(4..8), k.get(8..16)) {
            (Some(v), Some(s)) => format!(
                "v{} segment {}",
                u32::from_be_bytes(v.try_into().unwrap_or_default()),
                u64::from_be_bytes(s.try_into().unwrap_or_default())
            ),
            _ => String::from_utf8_lossy(k).into_owned(),
        }
    };
    match kind {
        Kind::DeleteSegment => {
            if segments.is_empty() {
                return Ok(None);
            }
            let (k, _) = rng.pick(&segments).clone();
            store.delete(&k)?;
            Ok(Some(format!("{} deleted", name(&k))))
        }
        Kind::DuplicateSegment => {
            if segments.is_empty() {
                return Ok(None);
            }
            let (k, v) = rng.pick(&segments).clone();
            let target = if rng.below(2) == 0 {
                // After the last segment of its vnode.
                let last = segments
                    .iter()
                    .filter(|(o, _)| o.get(..8) == k.get(..8))
                    .map(|(o, _)| o.clone())
                    .max()
                    .unwrap_or_else(|| k.clone());
                let mut t = last.clone();
                let n = u64::from_be_bytes(last[8..16].try_into().unwrap_or_default());
                t[8..16].copy_from_slice(&(n + 1).to_be_bytes());
                t
            } else {
                rng.pick(&segments).0.clone()
            };
            store.put(&target, &v)?;
            Ok(Some(format!("{} copied over {}", name(&k), name(&target))))
        }
        _ => {
            let mut keys: Vec<Vec<u8>> = store
                .scan_prefix(b"")?
                .into_iter()
                .map(|(k, _)| k)
                .filter(|k| !k.starts_with(b"seg/"))
                .collect();
            keys.sort();
            if keys.is_empty() {
                return Ok(None);
            }
            let k = rng.pick(&keys).clone();
            store.delete(&k)?;
            Ok(Some(format!("key {} deleted", String::from_utf8_lossy(&k))))
        }
    }
}

/// What one process did.
#[derive(Clone, Debug)]
pub struct Ran {
    /// Exit status, if it exited.
    pub code: Option<i32>,
    /// Whether the time limit was reached (it was then killed).
    pub timed_out: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Ran {
    /// Whether it panicked: exit 101, a signal, or "panicked" in its output.
    pub fn panicked(&self) -> bool {
        !self.timed_out
            && (self.code.is_none_or_101()
                || self.stderr.contains("panicked")
                || self.stdout.contains("panicked"))
    }

    /// Standard output as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(self.stdout.trim()).ok()
    }
}

trait CodeExt {
    fn is_none_or_101(&self) -> bool;
}

impl CodeExt for Option<i32> {
    fn is_none_or_101(&self) -> bool {
        matches!(self, None | Some(101))
    }
}

/// `bin args` with `TMPDIR` and `XDG_CONFIG_HOME` set to `tmp` (its scratch files and config
/// stay there) and no logging or backtrace settings inherited.
pub fn isolated(bin: &Path, tmp: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.args(args)
        .env("TMPDIR", tmp)
        .env("XDG_CONFIG_HOME", tmp)
        .env_remove("VERIFLOW_LOG")
        .env_remove("RUST_BACKTRACE");
    c
}

/// Runs `bin args` with `TMPDIR` and `XDG_CONFIG_HOME` set to `tmp`, killing it after `limit`.
pub fn run_limited(bin: &Path, tmp: &Path, args: &[&str], limit: Duration) -> Ran {
    let mut child = match isolated(bin, tmp, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return Ran {
                code: Some(-1),
                timed_out: false,
                stdout: String::new(),
                stderr: format!("cannot start {}: {e}", bin.display()),
            }
        }
    };
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut s);
            }
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = drain(child.stdout.take().map(|o| Box::new(o) as _));
    let err = drain(child.stderr.take().map(|o| Box::new(o) as _));
    let t0 = Instant::now();
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if t0.elapsed() > limit => {
                timed_out = true;
                let _ = child.kill(); // this child only, by its pid
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break None,
        }
    };
    Ran {
        code: if timed_out {
            None
        } else {
            status.and_then(|s| s.code())
        },
        timed_out,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// One baseline: a stored run, its command-line options (for `--resume`), and what `inspect
/// --json` says about it intact.
#[derive(Clone, Debug)]
pub struct Baseline {
    /// "finished" or "interrupted".
    pub name: &'static str,
    /// The intact log directory (never changed).
    pub dir: PathBuf,
    /// The run's options (program and runtime, without `--log-dir`, `--json`, `--resume`).
    pub run_args: Vec<String>,
    /// The right result of the run.
    pub result: Value,
    /// `inspect --json` on the intact store, reduced by [`essence`].
    pub inspect: Value,
}

/// What of an `inspect --json` report must not change when a damage touches nothing that
/// matters: status, generation, events per vnode, terminal outputs.
pub fn essence(inspect: &Value) -> Value {
    let vnodes: Vec<Value> = inspect["vnodes"]
        .as_array()
        .map(|vs| {
            vs.iter()
                .map(|v| serde_json::json!([v["vnode"], v["events"], v["torn"]]))
                .collect()
        })
        .unwrap_or_default();
    serde_json::json!({
        "status": inspect["status"],
        "generation": inspect["generation"],
        "events": inspect["events"],
        "vnodes": vnodes,
        "terminal": inspect["terminal"],
    })
}

/// The verdicts on one damaged copy.
#[derive(Clone, Debug)]
pub struct Trial {
    /// The seed.
    pub seed: u64,
    /// The baseline damaged.
    pub baseline: &'static str,
    /// The kind of damage.
    pub kind: Kind,
    /// What was done.
    pub damage: String,
    /// Per command ("inspect", "certify", "resume"): the outcome and a line of evidence.
    pub outcomes: Vec<(&'static str, Outcome, String)>,
}

impl Trial {
    /// The failures, one line each, naming the seed.
    pub fn failures(&self) -> Vec<String> {
        self.outcomes
            .iter()
            .filter(|(_, o, _)| o.is_failure())
            .map(|(cmd, o, why)| {
                format!(
                    "seed {} ({} run, {}: {}): {cmd}: {} -- {why}",
                    self.seed,
                    self.baseline,
                    self.kind.name(),
                    self.damage,
                    o.name()
                )
            })
            .collect()
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .chars()
        .take(240)
        .collect()
}

/// Damages a copy of `base` with the damage drawn from `seed`, and judges `inspect`,
/// `certify` and `run --resume` on it. `None` when the draw found nothing to damage.
pub fn trial(
    bin: &Path,
    work: &Path,
    base: &Baseline,
    seed: u64,
    limit: Duration,
) -> std::io::Result<Option<Trial>> {
    let mut rng = Rng::new(seed);
    let kind = *rng.pick(&Kind::ALL);
    let dir = work.join(format!("{}-{seed}", base.name));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&base.dir, &dir)?;
    let Some(damage) = apply(kind, &mut rng, &dir)? else {
        std::fs::remove_dir_all(&dir)?;
        return Ok(None);
    };
    let d = dir.to_str().unwrap_or_default().to_string();
    let mut outcomes = Vec::new();
    let before = tree_digest(&dir);

    let inspect = run_limited(bin, work, &["inspect", "--log-dir", &d, "--json"], limit);
    let inspect_right = inspect.code == Some(0)
        && inspect.json().map(|j| essence(&j)) == Some(base.inspect.clone());
    let o = judge(&inspect, || {
        if inspect_right {
            Outcome::Right
        } else if base.name == "interrupted"
            && inspect
                .json()
                .is_some_and(|j| is_earlier(&essence(&j), &base.inspect))
        {
            Outcome::EarlierCrashPoint
        } else {
            Outcome::Silent
        }
    });
    outcomes.push(("inspect", o, first_line(&inspect.stderr)));

    let certify = run_limited(bin, work, &["certify", "--log-dir", &d, "--json"], limit);
    let o = judge(&certify, || {
        // ACCEPT only where the log is what it was.
        if inspect_right && base.name == "finished" {
            Outcome::Right
        } else {
            Outcome::WrongAccept
        }
    });
    outcomes.push(("certify", o, first_line(&certify.stderr)));
    if tree_digest(&dir) != before {
        outcomes.push((
            "inspect+certify",
            Outcome::ReaderWrote,
            "the directory changed".to_string(),
        ));
    }

    let mut args: Vec<&str> = vec!["run"];
    args.extend(base.run_args.iter().map(String::as_str));
    args.extend(["--log-dir", &d, "--json", "--resume"]);
    let resume = run_limited(bin, work, &args, limit);
    let o = judge(&resume, || match resume.json() {
        Some(j) if j["correct"] == Value::Bool(true) && j["result"] == base.result => {
            Outcome::Right
        }
        _ => Outcome::Silent,
    });
    outcomes.push(("resume", o, first_line(&resume.stderr)));
    std::fs::remove_dir_all(&dir)?;
    Ok(Some(Trial {
        seed,
        baseline: base.name,
        kind,
        damage,
        outcomes,
    }))
}

/// Whether `got` is what an earlier kill of the run would show next to `intact`: same status,
/// generation and terminal outputs, and per vnode at most as many events, none torn.
fn is_earlier(got: &Value, intact: &Value) -> bool {
    let same = |k: &str| got[k] == intact[k];
    let (Some(g), Some(i)) = (got["vnodes"].as_array(), intact["vnodes"].as_array()) else {
        return false;
    };
    same("status")
        && same("generation")
        && same("terminal")
        && g.len() == i.len()
        && g.iter()
            .zip(i)
            .all(|(g, i)| g[0] == i[0] && g[2].is_null() && g[1].as_u64() <= i[1].as_u64())
}

fn judge(ran: &Ran, on_zero: impl FnOnce() -> Outcome) -> Outcome {
    if ran.timed_out {
        Outcome::Hang
    } else if ran.panicked() {
        Outcome::Panic
    } else {
        match ran.code {
            Some(0) => on_zero(),
            Some(1) if !ran.stderr.trim().is_empty() => Outcome::Detected,
            Some(2) if ran.stderr.contains("nothing to resume") => Outcome::NothingToResume,
            _ => Outcome::OtherExit,
        }
    }
}

/// Counts per (baseline, kind, command, outcome).
pub fn tally(trials: &[Trial]) -> BTreeMap<(String, String, String, String), u64> {
    let mut t = BTreeMap::new();
    for trial in trials {
        for (cmd, o, _) in &trial.outcomes {
            *t.entry((
                trial.baseline.to_string(),
                trial.kind.name().to_string(),
                (*cmd).to_string(),
                o.name().to_string(),
            ))
            .or_default() += 1;
        }
    }
    t
}

/// The knary options of the campaign's runs: 6826 tasks of 50 µs on 3 vnodes, segments of up
/// to 256 KiB, so that the store has both segments inline in sled's `db` file and segments in
/// blob files (sled keeps a value above half a sled segment, 128 KiB, in a file of its own).
pub const KNARY_RUN: [&str; 14] = [
    "--depth",
    "7",
    "--fanout",
    "4",
    "--grain-us",
    "50",
    "--threads",
    "2",
    "--vnodes",
    "3",
    "--seed",
    "5",
    "--commit-kib",
    "256",
];

/// Makes the two baselines in `work`: a finished knary run, and one killed with SIGKILL part
/// way (retried with another kill time until it is killed before it finishes and after it has
/// recorded itself and logged something).
pub fn knary_baselines(bin: &Path, work: &Path, limit: Duration) -> Result<Vec<Baseline>, String> {
    let run_args: Vec<String> = KNARY_RUN.iter().map(|s| s.to_string()).collect();
    let inspect = |dir: &Path| -> Result<Value, String> {
        let d = dir.to_str().unwrap_or_default();
        let ran = run_limited(bin, work, &["inspect", "--log-dir", d, "--json"], limit);
        match (ran.code, ran.json()) {
            (Some(0), Some(j)) => Ok(essence(&j)),
            _ => Err(format!("inspect of the intact {d} failed: {}", ran.stderr)),
        }
    };
    let finished = work.join("baseline-finished");
    let _ = std::fs::remove_dir_all(&finished);
    let mut args: Vec<&str> = vec!["run"];
    args.extend(KNARY_RUN);
    let f = finished.to_str().unwrap_or_default();
    args.extend(["--log-dir", f, "--json"]);
    let ran = run_limited(bin, work, &args, limit);
    let j = ran
        .json()
        .filter(|j| ran.code == Some(0) && j["correct"] == Value::Bool(true))
        .ok_or_else(|| format!("the baseline run failed: {}\n{}", ran.stdout, ran.stderr))?;
    let result = j["result"].clone();
    let fin = Baseline {
        name: "finished",
        inspect: inspect(&finished)?,
        dir: finished,
        run_args: run_args.clone(),
        result: result.clone(),
    };

    let killed = work.join("baseline-interrupted");
    let k = killed.to_str().unwrap_or_default().to_string();
    let mut after = Duration::from_millis(150);
    for _ in 0..12 {
        let _ = std::fs::remove_dir_all(&killed);
        let mut args: Vec<&str> = vec!["run"];
        args.extend(KNARY_RUN);
        args.extend(["--log-dir", &k, "--json"]);
        let mut child = Command::new(bin)
            .args(&args)
            .env("TMPDIR", work)
            .env("XDG_CONFIG_HOME", work)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let t0 = Instant::now();
        while !(killed.join("db").exists() && t0.elapsed() > after) && t0.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill(); // SIGKILL, this child only
        let status = child.wait().map_err(|e| e.to_string())?;
        if status.success() {
            after /= 2; // finished first: kill sooner
            continue;
        }
        let ins = match inspect(&killed) {
            Ok(ins) => ins,
            // Killed before the run recorded itself (seen under load 8): kill later.
            Err(e) if e.contains("holds no run manifest") => {
                after += after / 2;
                continue;
            }
            Err(e) => return Err(e),
        };
        let events = ins["events"].as_u64().unwrap_or(0);
        if ins["status"] == "Running" && events > 0 {
            return Ok(vec![
                fin,
                Baseline {
                    name: "interrupted",
                    dir: killed,
                    run_args,
                    result,
                    inspect: ins,
                },
            ]);
        }
        after += after / 2; // nothing logged yet: kill later
    }
    Err("could not kill a knary run between its first log write and its end".to_string())
}

/// Runs `count` trials, seeds `first..`, alternating the baselines; a seed whose draw found
/// nothing to damage is skipped (and counted in the second value).
pub fn campaign(
    bin: &Path,
    work: &Path,
    baselines: &[Baseline],
    first: u64,
    count: u64,
    limit: Duration,
    mut progress: impl FnMut(&Trial),
) -> std::io::Result<(Vec<Trial>, u64)> {
    let mut trials = Vec::new();
    let mut skipped = 0;
    let mut seed = first;
    while (trials.len() as u64) < count {
        let base = &baselines[usize::try_from(seed).unwrap_or(0) % baselines.len()];
        match trial(bin, work, base, seed, limit)? {
            Some(t) => {
                progress(&t);
                trials.push(t);
            }
            None => skipped += 1,
        }
        seed += 1;
    }
    Ok((trials, skipped))
}

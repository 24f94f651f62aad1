//! Real crash tests of the three store engines (sled, redb, fjall): a child process writes
//! batches shaped like the log's group commits (segment values + a watermark key), flushing
//! after each and saying so on stdout; it is SIGKILLed at a seeded random moment, and the
//! store, reopened, must hold every batch it said was flushed and no torn batch (all of a
//! batch's keys or none). The same directory takes every kill of an engine, so recovery after
//! recovery is tested too; each child goes on after the last batch it finds.
//!
//! The child is this test binary run again with `VF_CRASH_CHILD=ENGINE:DIR`.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rand::{RngExt as _, SeedableRng as _};
use veriflow_checkpoint::{FjallStore, RedbStore, SledStore, Store, StoreError};

const CHILD_ENV: &str = "VF_CRASH_CHILD";
/// Keys per batch (3 segments + 1 watermark) and the size of a segment: like the log's
/// ~64 KiB group commits, smaller so that 20 kills stay well under 100 MB on disk.
const SEGMENTS: u32 = 3;
const SEGMENT_BYTES: usize = 16 << 10;
const KILLS_PER_ENGINE: u32 = 20;
const SEED: u64 = 0x5eed_c4a5;

fn open(engine: &str, dir: &Path) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match engine {
        "sled" => Arc::new(SledStore::open(dir)?),
        "redb" => Arc::new(RedbStore::open(dir)?),
        "fjall" => Arc::new(FjallStore::open(dir)?),
        other => panic!("unknown engine {other}"),
    })
}

fn open_read_only(engine: &str, dir: &Path) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match engine {
        "sled" => Arc::new(SledStore::open_read_only(dir)?),
        "redb" => Arc::new(RedbStore::open_read_only(dir)?),
        "fjall" => Arc::new(FjallStore::open_read_only(dir)?),
        other => panic!("unknown engine {other}"),
    })
}

fn segment_key(batch: u32, i: u32) -> Vec<u8> {
    format!("seg/{batch:08}/{i}").into_bytes()
}

fn watermark_key(batch: u32) -> Vec<u8> {
    format!("wm/{batch:08}").into_bytes()
}

/// The value of segment `i` of `batch`: its bytes say where they belong.
fn segment_value(batch: u32, i: u32) -> Vec<u8> {
    let mut v = vec![(batch as u8) ^ (i as u8); SEGMENT_BYTES];
    v[..4].copy_from_slice(&batch.to_le_bytes());
    v[4..8].copy_from_slice(&i.to_le_bytes());
    v
}

fn batch_pairs(batch: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut pairs: Vec<_> = (0..SEGMENTS)
        .map(|i| (segment_key(batch, i), segment_value(batch, i)))
        .collect();
    pairs.push((watermark_key(batch), batch.to_le_bytes().to_vec()));
    pairs
}

/// The batches found whole, checking that none is torn and every value is right; panics
/// with `what` otherwise.
fn whole_batches(store: &dyn Store, what: &str) -> Vec<u32> {
    let wms = store.scan_prefix(b"wm/").unwrap();
    let segs = store.scan_prefix(b"seg/").unwrap();
    let mut found = std::collections::BTreeMap::<u32, u32>::new();
    for (k, v) in &segs {
        let s = std::str::from_utf8(k).unwrap();
        let (b, i) = s["seg/".len()..].split_once('/').unwrap();
        let (b, i): (u32, u32) = (b.parse().unwrap(), i.parse().unwrap());
        assert!(*v == segment_value(b, i), "{what}: other bytes under {s}");
        *found.entry(b).or_default() += 1;
    }
    let mut whole = Vec::new();
    for (k, v) in &wms {
        let b: u32 = std::str::from_utf8(&k[3..]).unwrap().parse().unwrap();
        assert_eq!(v.as_slice(), b.to_le_bytes(), "{what}: watermark {b}");
        assert_eq!(
            found.remove(&b),
            Some(SEGMENTS),
            "{what}: batch {b} torn (watermark without all its segments)"
        );
        whole.push(b);
    }
    assert!(
        found.is_empty(),
        "{what}: torn batches (segments without a watermark): {found:?}"
    );
    whole
}

/// The child: writes and flushes batches until killed, after the last batch it finds.
#[test]
fn child_main() {
    let Ok(arg) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (engine, dir) = arg.split_once(':').unwrap();
    let store = open(engine, Path::new(dir)).unwrap();
    let next = whole_batches(&*store, "child").last().map_or(0, |b| b + 1);
    let mut out = std::io::stdout().lock();
    for batch in next.. {
        store.put_batch(&batch_pairs(batch)).unwrap();
        store.flush().unwrap();
        use std::io::Write as _;
        writeln!(out, "flushed {batch}").unwrap();
        out.flush().unwrap();
    }
}

/// Opens an engine's store in a directory.
type Opener = fn(&str, &Path) -> Result<Arc<dyn Store>, StoreError>;

fn crash_engine(engine: &str) {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(SEED);
    let mut acknowledged: Option<u32> = None;
    for kill in 0..KILLS_PER_ENGINE {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, format!("{engine}:{}", store_dir.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut last = None;
            for line in BufReader::new(stdout).lines() {
                let line = line.unwrap_or_default();
                if let Some(n) = line.strip_prefix("flushed ") {
                    last = Some(n.parse::<u32>().unwrap());
                }
            }
            last
        });
        // Seeded kill point: between the child's start (its open and recovery) and a
        // few hundred batches in.
        let wait = rng.random_range(50..400);
        std::thread::sleep(Duration::from_millis(wait));
        let pid = child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let _ = child.wait();
        if let Some(last) = reader.join().unwrap() {
            acknowledged = Some(acknowledged.map_or(last, |a| a.max(last)));
        }
        let what = format!("{engine}, kill {kill} (seed {SEED:#x}, after {wait} ms)");
        // A reader first (it must not need the writer's recovery), then a writer.
        // One after the other: a redb reader in place holds a shared lock a writer waits on.
        let opens: [(&str, Opener); 2] = [("read-only", open_read_only), ("writer", open)];
        for (how, opener) in opens {
            let store = match opener(engine, &store_dir) {
                Ok(s) => s,
                // The child may be killed before its store existed.
                Err(StoreError::Open { .. }) if acknowledged.is_none() => continue,
                Err(e) => panic!("{what}: {how} open failed: {e}"),
            };
            let whole = whole_batches(&*store, &what);
            if let Some(a) = acknowledged {
                let expected: Vec<u32> = (0..=a).collect();
                assert!(
                    whole.len() > a as usize && whole[..=a as usize] == expected[..],
                    "{what}: {how} lost flushed batches: acknowledged 0..={a}, found {} batches",
                    whole.len()
                );
            }
        }
    }
    assert!(
        acknowledged.is_some_and(|a| a > 0),
        "{engine}: no child ever flushed a batch: the test tested nothing"
    );
    eprintln!(
        "{engine}: {KILLS_PER_ENGINE} kills, {} batches acknowledged, all found whole",
        acknowledged.map_or(0, |a| a + 1)
    );
}

#[test]
fn sled_keeps_every_flushed_batch_whole_across_kills() {
    crash_engine("sled");
}

#[test]
fn redb_keeps_every_flushed_batch_whole_across_kills() {
    crash_engine("redb");
}

#[test]
fn fjall_keeps_every_flushed_batch_whole_across_kills() {
    crash_engine("fjall");
}

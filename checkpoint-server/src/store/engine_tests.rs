//! The same rules checked on the three engines (sled, redb, fjall): conformance, reopen,
//! fences, read-only opening, lost flushed writes, damaged files.

use std::path::Path;
use std::sync::Arc;

use super::tests::{encode_for_test, exercise, exercise_pages, snapshot};
use super::{FjallStore, RedbStore, SledStore, Store, StoreError};

type Open = fn(&Path) -> Result<Arc<dyn Store>, StoreError>;

struct Engine {
    name: &'static str,
    open: Open,
    open_existing: Open,
    read_only: Open,
    /// Whether a flipped byte in a value is caught on read. redb checks its page checksums
    /// only in `check_integrity` (and after a crash), not on a plain read: measured, a
    /// flipped byte of a value came back from `get` as that value (the log's own blake3
    /// digest per record is what catches it then).
    verifies_reads: bool,
}

fn engines() -> [Engine; 3] {
    [
        Engine {
            name: "sled",
            open: |p| Ok(Arc::new(SledStore::open(p)?)),
            open_existing: |p| Ok(Arc::new(SledStore::open_existing(p)?)),
            read_only: |p| Ok(Arc::new(SledStore::open_read_only(p)?)),
            verifies_reads: true,
        },
        Engine {
            name: "redb",
            open: |p| Ok(Arc::new(RedbStore::open(p)?)),
            open_existing: |p| Ok(Arc::new(RedbStore::open_existing(p)?)),
            read_only: |p| Ok(Arc::new(RedbStore::open_read_only(p)?)),
            verifies_reads: false,
        },
        Engine {
            name: "fjall",
            open: |p| Ok(Arc::new(FjallStore::open(p)?)),
            open_existing: |p| Ok(Arc::new(FjallStore::open_existing(p)?)),
            read_only: |p| Ok(Arc::new(FjallStore::open_read_only(p)?)),
            verifies_reads: true,
        },
    ]
}

#[test]
fn every_engine_keeps_the_rules_and_survives_reopen() {
    for e in engines() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s");
        exercise(&*(e.open)(&store).unwrap());
        let s = (e.open_existing)(&store).unwrap();
        assert_eq!(
            s.get(b"a/2").unwrap().as_deref(),
            Some(&b"two"[..]),
            "{}",
            e.name
        );
        assert_eq!(s.get(b"a/1").unwrap(), None, "{}", e.name);
        drop(s);
        let pages = dir.path().join("p");
        exercise_pages(&*(e.open)(&pages).unwrap());
    }
}

/// Writes not followed by a flush are not required to survive; flushed ones are, and a
/// reopened store takes new writes and flushes.
#[test]
fn every_engine_keeps_what_was_flushed_across_reopens() {
    for e in engines() {
        let dir = tempfile::tempdir().unwrap();
        for round in 0u32..3 {
            let s = (e.open)(dir.path()).unwrap();
            for earlier in 0..round {
                assert!(
                    s.get(&earlier.to_be_bytes()).unwrap().is_some(),
                    "{}: round {earlier} lost",
                    e.name
                );
            }
            s.put_batch(&[(round.to_be_bytes().to_vec(), vec![round as u8; 70_000])])
                .unwrap();
            s.flush().unwrap();
        }
    }
}

#[test]
fn every_engine_keeps_fences_across_reopen_and_out_of_scans() {
    for e in engines() {
        let dir = tempfile::tempdir().unwrap();
        let stale = |s: &dyn Store| {
            s.put_batch_fenced(
                &[(b"seg/1".to_vec(), 1)],
                &[(b"seg/1/z".to_vec(), b"z".to_vec())],
            )
        };
        {
            let s = (e.open)(dir.path()).unwrap();
            assert!(s.keeps_fences(), "{}", e.name);
            s.raise_fence(b"seg/1", 1).unwrap();
            stale(&*s).unwrap();
            s.raise_fence(b"seg/1", 4).unwrap();
            s.raise_fence(b"seg/1", 3).unwrap(); // never lowers
            s.flush().unwrap();
        }
        let s = (e.open)(dir.path()).unwrap();
        let err = stale(&*s).expect_err("fenced after reopen");
        assert!(
            matches!(
                err,
                StoreError::Fenced {
                    epoch: 1,
                    newest: 4,
                    ..
                }
            ),
            "{}: {err}",
            e.name
        );
        // A refusal does not poison the store.
        s.put_batch_fenced(
            &[(b"seg/1".to_vec(), 4), (b"seg/2".to_vec(), 0)],
            &[(b"seg/1/y".to_vec(), b"y".to_vec())],
        )
        .unwrap();
        let keys: Vec<Vec<u8>> = s
            .scan_prefix(b"")
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            keys,
            vec![b"seg/1/y".to_vec(), b"seg/1/z".to_vec()],
            "{}",
            e.name
        );
        s.flush().unwrap();
        drop(s);
        let ro = (e.read_only)(dir.path()).unwrap();
        assert!(
            matches!(ro.raise_fence(b"seg/1", 9), Err(StoreError::ReadOnly(_))),
            "{}",
            e.name
        );
    }
}

#[test]
fn a_read_only_store_of_every_engine_never_writes() {
    for e in engines() {
        let dir = tempfile::tempdir().unwrap();
        exercise(&*(e.open)(dir.path()).unwrap());
        let before = snapshot(dir.path());
        {
            let s = (e.read_only)(dir.path()).unwrap();
            assert_eq!(
                s.get(b"a/2").unwrap().as_deref(),
                Some(&b"two"[..]),
                "{}",
                e.name
            );
            assert!(
                matches!(s.put(b"x", b"y"), Err(StoreError::ReadOnly(_))),
                "{}",
                e.name
            );
            assert!(matches!(s.delete(b"a/2"), Err(StoreError::ReadOnly(_))));
            s.flush().unwrap();
        }
        assert!(snapshot(dir.path()) == before, "{} wrote", e.name);
        let missing = dir.path().join("nope");
        assert!((e.read_only)(&missing).is_err(), "{}", e.name);
        assert!((e.open_existing)(&missing).is_err(), "{}", e.name);
        assert!(!missing.exists(), "{}", e.name);
    }
}

/// A store being written can be read at the same time (inspect while running), and sees at
/// least what was flushed.
#[test]
fn every_engine_reads_while_a_writer_has_it_open() {
    for e in engines() {
        let dir = tempfile::tempdir().unwrap();
        let w = (e.open)(dir.path()).unwrap();
        w.put(b"k", b"v").unwrap();
        w.flush().unwrap();
        let r = (e.read_only)(dir.path()).unwrap();
        assert_eq!(
            r.get(b"k").unwrap().as_deref(),
            Some(&b"v"[..]),
            "{}",
            e.name
        );
        w.put(b"k2", b"v2").unwrap();
        w.flush().unwrap();
    }
}

/// engine.rs rule 3 (sled_store.rs rule 2): a store whose engine holds fewer flushes than its
/// record lost flushed writes, for a writer and a reader alike.
#[test]
fn every_engine_reports_lost_flushed_writes() {
    for e in engines() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = (e.open)(dir.path()).unwrap();
            s.put(b"k", b"v").unwrap();
            s.flush().unwrap();
        }
        let record = dir.path().join(SledStore::FLUSH_FILE);
        std::fs::write(&record, encode_for_test(1000)).unwrap();
        for open in [e.read_only, e.open] {
            let err = must_fail(open(dir.path()), "flushed writes lost");
            assert!(err.to_string().contains("lost writes"), "{}: {err}", e.name);
        }
        std::fs::write(&record, b"garbage").unwrap();
        let err = must_fail((e.read_only)(dir.path()), "a damaged record");
        assert!(
            matches!(err, StoreError::Corruption(_)),
            "{}: {err}",
            e.name
        );
    }
}

#[test]
fn opening_a_file_as_a_store_is_an_error_for_every_engine() {
    for e in engines() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("plain");
        std::fs::write(&f, b"not a database").unwrap();
        for open in [e.open, e.open_existing, e.read_only] {
            let err = must_fail(open(&f), "a file is no store");
            assert!(matches!(err, StoreError::Open { .. }), "{}: {err}", e.name);
        }
    }
}

/// Every file of a flushed store truncated to half or with a byte flipped: each open is an
/// error or a store whose reads are errors or the bytes written, never a panic, and never
/// other bytes from an engine that verifies reads.
#[test]
fn a_damaged_file_of_every_engine_is_an_error_never_a_panic() {
    for e in engines() {
        let dir = tempfile::tempdir().unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = (0u32..40)
            .map(|i| (i.to_be_bytes().to_vec(), vec![i as u8; 3000]))
            .collect();
        {
            let s = (e.open)(dir.path()).unwrap();
            for chunk in want.chunks(8) {
                s.put_batch(chunk).unwrap();
                s.flush().unwrap();
            }
        }
        let pristine = snapshot(dir.path());
        for (file, bytes) in &pristine {
            if bytes.len() < 2 {
                continue;
            }
            for damage in ["truncate", "flip"] {
                let mut damaged = bytes.clone();
                if damage == "truncate" {
                    damaged.truncate(bytes.len() / 2);
                } else {
                    let at = bytes.len() / 2;
                    damaged[at] ^= 0x5a;
                }
                std::fs::write(file, &damaged).unwrap();
                for (how, open) in [("read_only", e.read_only), ("open", e.open)] {
                    let r = std::panic::catch_unwind(|| {
                        let Ok(s) = open(dir.path()) else { return };
                        let Ok(pairs) = s.scan_prefix(b"") else {
                            return;
                        };
                        for (k, v) in pairs {
                            let i = u32::from_be_bytes(k.as_slice().try_into().unwrap());
                            assert!(
                                !e.verifies_reads || v == want[i as usize].1,
                                "other bytes under {i}"
                            );
                        }
                    });
                    assert!(
                        r.is_ok(),
                        "{}: {how} after {damage} of {} panicked",
                        e.name,
                        file.display()
                    );
                }
                // Put every file back as it was (an `open` may have repaired or added some).
                restore(dir.path(), &pristine);
            }
        }
    }
}

fn must_fail(r: Result<Arc<dyn Store>, StoreError>, why: &str) -> StoreError {
    match r {
        Ok(s) => panic!("{} opened: {why}", s.describe()),
        Err(e) => e,
    }
}

fn restore(dir: &Path, files: &[(std::path::PathBuf, Vec<u8>)]) {
    let _ = std::fs::remove_dir_all(dir);
    for (f, bytes) in files {
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, bytes).unwrap();
    }
}

/// `--store redb:DIR` and `fjall:DIR` open those engines; `local:DIR` stays sled.
#[test]
fn a_spec_names_the_engine() {
    use crate::{open_store, StoreSpec};
    let dir = tempfile::tempdir().unwrap();
    for (scheme, engine) in [("local", "local"), ("redb", "redb"), ("fjall", "fjall")] {
        let d = dir.path().join(scheme);
        let spec: StoreSpec = format!("{scheme}:{}", d.display()).parse().unwrap();
        assert_eq!(spec.to_string(), format!("{scheme}:{}", d.display()));
        assert_eq!(spec.local_dir(), Some(d.as_path()));
        let store = open_store(&spec, None).unwrap();
        assert!(
            store.describe().starts_with(&format!("{engine}:")),
            "{}",
            store.describe()
        );
        store.put(b"k", b"v").unwrap();
        store.flush().unwrap();
        drop(store);
        let ro = spec.open_local_existing(false).unwrap().unwrap();
        assert_eq!(ro.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    }
    assert!("redb:".parse::<StoreSpec>().is_err());
}

/// fjall_store.rs rule 5: the journal holds a flushed value uncompressed, and a journal that
/// fjall wrote compressed (its default) still reads.
#[test]
fn fjall_journals_values_uncompressed_and_reads_compressed_ones() {
    // 64 KiB that lz4 shrinks to almost nothing; the journal's files are preallocated (64
    // MiB of zeros), so what counts is how many of the value's bytes they hold.
    let value = vec![7u8; 64 << 10];
    let journal_bytes = |dir: &Path| -> u64 {
        let mut n = 0;
        for e in std::fs::read_dir(dir.join(super::fjall_store::FJALL_DIR)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "jnl") {
                n += std::fs::read(&p)
                    .unwrap()
                    .iter()
                    .filter(|&&b| b == 7)
                    .count() as u64;
            }
        }
        n
    };
    let dir = tempfile::tempdir().unwrap();
    let s = FjallStore::open(dir.path()).unwrap();
    s.put(b"seg", &value).unwrap();
    s.flush().unwrap();
    assert!(
        journal_bytes(dir.path()) >= value.len() as u64,
        "the journal holds {} of the value's {} bytes: compressed",
        journal_bytes(dir.path()),
        value.len()
    );
    drop(s);

    // The same value written by fjall with its default (lz4) journal, never flushed into a
    // table: reopening replays the compressed entry.
    let old = tempfile::tempdir().unwrap();
    {
        let db = fjall::Database::builder(old.path().join(super::fjall_store::FJALL_DIR))
            .manual_journal_persist(true)
            .journal_compression(fjall::CompressionType::Lz4)
            .open()
            .unwrap();
        let data = db
            .keyspace(
                super::fjall_store::DATA,
                fjall::KeyspaceCreateOptions::default,
            )
            .unwrap();
        data.insert(b"seg", &value[..]).unwrap();
        db.persist(fjall::PersistMode::SyncAll).unwrap();
        let n = journal_bytes(old.path());
        assert!(n < value.len() as u64 / 4, "{n}");
    }
    let s = FjallStore::open(old.path()).unwrap();
    assert_eq!(s.get(b"seg").unwrap().as_deref(), Some(&value[..]));
}

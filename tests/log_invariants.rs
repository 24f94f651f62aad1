//! Invariants of the event logs a real run leaves (`runtime/src/log/mod.rs`, `exec/mod.rs`):
//! one Declared/Started/Completed per task across all logs, steals matched by adoptions, input
//! digests matching what producers logged, the terminal value in the log, and set semantics
//! (logging events twice changes nothing).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use knary::{expected_nodes, expected_tasks, Knary};
use veriflow::runtime::codec::{self, Digest};
use veriflow::runtime::log::{
    values, CommitPolicy, Event, LogWriter, LoggedEvent, VnodeEvents, STORED_FROM,
};
use veriflow::{
    DataId, EventKind, LogReader, MemoryStore, Program, Registry, RunReport, RunStatus, Runtime,
    SledStore, Store, TaskId, VnodeId,
};

const VNODES: u32 = 4;
const SEEDS: [u64; 3] = [0, 7, 12345];

fn registry() -> Registry {
    let mut r = Registry::new();
    <Knary as Program>::register(&mut r).expect("knary registers");
    r
}

/// knary(7, 3, 1) with a grain of 200 µs, so the three idle vnodes find work to steal: at 5 µs
/// the whole tree (5 ms of work) could run on vnode 0, which keeps its last ready task when it
/// logs (`exec/worth.rs` rule 2), and 2 runs in 10 stole nothing.
fn program() -> Knary {
    Knary {
        depth: 7,
        fanout: 3,
        serial: 1,
        grain_us: 200,
    }
}

/// Runs the program on 4 vnodes into a sled store in `dir`, then reopens the store (so what is
/// read is what reached the disk) and reads every log.
fn logged_run(
    dir: &std::path::Path,
    seed: u64,
) -> (RunReport<(u64,)>, Vec<VnodeEvents>, LogReader) {
    let report = {
        let store: Arc<dyn Store> = Arc::new(SledStore::open(dir).expect("open sled"));
        // Odd seeds store every value out of line (rule 10 of `log/mod.rs`): the invariants
        // below hold for values in the value store as for values inline.
        let stored_from = if seed % 2 == 1 { 1 } else { STORED_FROM };
        let rt = Runtime::builder(registry())
            .program("knary")
            .threads(2)
            .vnodes(VNODES)
            .seed(seed)
            .store(store)
            .commit_policy(CommitPolicy {
                stored_from,
                ..CommitPolicy::default()
            })
            .build()
            .expect("build");
        let (root, inputs) = program().root();
        rt.run(root, inputs)
            .unwrap_or_else(|e| panic!("seed {seed}: run: {e}"))
    };
    let store: Arc<dyn Store> = Arc::new(reopen(dir));
    let reader = LogReader::new(store);
    let logs = reader
        .read_all()
        .unwrap_or_else(|e| panic!("seed {seed}: read: {e}"));
    (report, logs, reader)
}

/// Reopens a sled store this process just closed: sled releases its file lock lazily (its
/// epoch-based reclamation may hold the file for a moment after the last handle is dropped), so
/// an open that fails on the lock is retried.
fn reopen(dir: &std::path::Path) -> SledStore {
    let t0 = std::time::Instant::now();
    loop {
        match SledStore::open_existing(dir) {
            Ok(s) => return s,
            Err(e) if e.to_string().contains("could not acquire lock") => {
                assert!(
                    t0.elapsed().as_secs() < 30,
                    "{} stays locked: {e}",
                    dir.display()
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => panic!("reopen {}: {e}", dir.display()),
        }
    }
}

fn all_events(logs: &[VnodeEvents]) -> impl Iterator<Item = (VnodeId, &LoggedEvent)> {
    logs.iter()
        .flat_map(|l| l.events.iter().map(move |e| (l.vnode, e)))
}

#[test]
fn every_task_is_declared_started_and_completed_once_and_steals_match() {
    for seed in SEEDS {
        let dir = tempfile::tempdir().unwrap();
        let (report, logs, reader) = logged_run(dir.path(), seed);
        let ctx = format!("knary(7,3,1) on {VNODES} vnodes, seed {seed}");
        assert_eq!(report.outputs.0, expected_nodes(7, 3).unwrap(), "{ctx}");
        assert_eq!(report.tasks, expected_tasks(7, 3).unwrap(), "{ctx}");
        assert_eq!(
            reader.manifest().unwrap().status,
            RunStatus::Finished,
            "{ctx}"
        );
        assert!(logs.len() <= VNODES as usize, "{ctx}: {} logs", logs.len());
        assert_eq!(logs[0].vnode, VnodeId(0), "{ctx}: vnode 0 holds the root");

        // (task, kind) -> vnodes whose logs hold it.
        let mut per_task: HashMap<(TaskId, EventKind), Vec<VnodeId>> = HashMap::new();
        let mut kinds: BTreeMap<EventKind, u64> = BTreeMap::new();
        for (v, e) in all_events(&logs) {
            *kinds.entry(e.event.kind()).or_default() += 1;
            let task = match &e.event {
                Event::Declared(d) => d.task,
                Event::Started { task, .. } | Event::Completed { task, .. } => *task,
                _ => continue,
            };
            per_task.entry((task, e.event.kind())).or_default().push(v);
        }
        let declared: Vec<TaskId> = per_task
            .keys()
            .filter(|(_, k)| *k == EventKind::Declared)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(
            declared.len() as u64,
            report.tasks,
            "{ctx}: distinct declared tasks"
        );
        assert!(
            declared.contains(&report.root),
            "{ctx}: the root is declared"
        );
        for t in &declared {
            for kind in [
                EventKind::Declared,
                EventKind::Started,
                EventKind::Completed,
            ] {
                let where_ = per_task.get(&(*t, kind)).map(Vec::as_slice).unwrap_or(&[]);
                assert_eq!(
                    where_.len(),
                    1,
                    "{ctx}: task {t:#}: {kind:?} found in {where_:?}"
                );
            }
        }
        for ((t, kind), _) in per_task.iter() {
            assert!(
                declared.contains(t),
                "{ctx}: task {t:#} has a {kind:?} but was never declared"
            );
        }
        let count = |k| kinds.get(&k).copied().unwrap_or(0);
        assert_eq!(count(EventKind::Declared), report.tasks, "{ctx}: {kinds:?}");
        assert_eq!(count(EventKind::Started), report.tasks, "{ctx}: {kinds:?}");
        assert_eq!(
            count(EventKind::Completed),
            report.tasks,
            "{ctx}: {kinds:?}"
        );

        let adopted: u64 = report.vnodes.iter().map(|s| s.adopted).sum();
        let stolen: u64 = report.vnodes.iter().map(|s| s.stolen).sum();
        assert_eq!(
            count(EventKind::Stolen),
            adopted,
            "{ctx}: #Stolen vs adopted {kinds:?}"
        );
        assert_eq!(
            count(EventKind::Adopted),
            adopted,
            "{ctx}: #Adopted vs adopted {kinds:?}"
        );
        assert_eq!(stolen, adopted, "{ctx}");
        assert!(
            adopted > 0,
            "{ctx}: three idle vnodes and 1457 tasks, yet nothing was stolen"
        );

        // Each Stolen on a victim matches one Adopted on the thief it names, and the adopted
        // task then starts and completes on that thief.
        let mut stolen_to: HashMap<TaskId, (VnodeId, VnodeId)> = HashMap::new();
        let mut adopted_from: HashMap<TaskId, (VnodeId, VnodeId)> = HashMap::new();
        for (v, e) in all_events(&logs) {
            match &e.event {
                Event::Stolen { task, thief } => {
                    assert!(
                        stolen_to.insert(*task, (v, *thief)).is_none(),
                        "{ctx}: {task:#}"
                    );
                }
                Event::Adopted { victim, record, .. } => {
                    let dup = adopted_from.insert(record.task, (*victim, v));
                    assert!(dup.is_none(), "{ctx}: {:#} adopted twice", record.task);
                }
                _ => {}
            }
        }
        assert_eq!(
            stolen_to, adopted_from,
            "{ctx}: (victim, thief) of every steal"
        );
        for (t, (victim, thief)) in &stolen_to {
            assert_ne!(victim, thief, "{ctx}: {t:#} stolen by its own vnode");
            let started = &per_task[&(*t, EventKind::Started)];
            let completed = &per_task[&(*t, EventKind::Completed)];
            assert_eq!(
                started,
                &vec![*thief],
                "{ctx}: {t:#} must start on its thief"
            );
            assert_eq!(
                completed,
                &vec![*thief],
                "{ctx}: {t:#} must complete on its thief"
            );
            let declared_on = &per_task[&(*t, EventKind::Declared)];
            assert_eq!(
                declared_on,
                &vec![*victim],
                "{ctx}: {t:#} is declared on its victim"
            );
        }
    }
}

#[test]
fn started_digests_match_what_producers_logged_and_terminal_value_decodes() {
    for seed in SEEDS {
        let dir = tempfile::tempdir().unwrap();
        let (report, logs, reader) = logged_run(dir.path(), seed);
        let ctx = format!("knary(7,3,1) on {VNODES} vnodes, seed {seed}");

        // Every value logged for a data object, by whom; all copies must agree.
        let mut produced: HashMap<DataId, (Digest, Vec<u8>)> = HashMap::new();
        let mut copies = 0u64;
        for (v, e) in all_events(&logs) {
            let outputs: &[_] = match &e.event {
                Event::Completed { outputs, .. } => outputs,
                Event::Returned { output } | Event::Input { output } => {
                    std::slice::from_ref(output)
                }
                _ => continue,
            };
            for o in outputs {
                copies += 1;
                assert_eq!(
                    o.value.is_stored(),
                    seed % 2 == 1,
                    "{ctx}: {:#} is stored apart on odd seeds only",
                    o.data
                );
                let bytes = values::resolve(&**reader.store(), o.value.clone())
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                assert_eq!(
                    Digest::of(&bytes),
                    o.digest,
                    "{ctx}: {v} logged {:#} with a digest that is not of its value",
                    o.data
                );
                if let Some((d, _)) = produced.get(&o.data) {
                    assert_eq!(*d, o.digest, "{ctx}: two different values for {:#}", o.data);
                } else {
                    produced.insert(o.data, (o.digest, bytes));
                }
            }
        }
        assert!(copies >= produced.len() as u64);
        // knary: each task writes (or delegates) exactly one output; one value per node.
        assert_eq!(
            produced.len() as u64,
            expected_nodes(7, 3).unwrap(),
            "{ctx}: one value per tree node"
        );

        // The inputs each task reads, from its Declared record.
        let mut reads: HashMap<TaskId, Vec<DataId>> = HashMap::new();
        for (_, e) in all_events(&logs) {
            if let Event::Declared(d) = &e.event {
                reads.insert(d.task, d.inputs.clone());
            }
        }
        let mut checked_inputs = 0;
        let mut adopted_checked = 0;
        for (v, e) in all_events(&logs) {
            match &e.event {
                Event::Started { task, inputs } => {
                    let ids = reads
                        .get(task)
                        .unwrap_or_else(|| panic!("{ctx}: {task:#} started on {v} undeclared"));
                    assert_eq!(inputs.len(), ids.len(), "{ctx}: {task:#}: inputs read");
                    for (i, (digest, id)) in inputs.iter().zip(ids).enumerate() {
                        let (want, _) = produced.get(id).unwrap_or_else(|| {
                            panic!("{ctx}: {task:#} read {id:#} (input {i}) that no log holds")
                        });
                        assert_eq!(digest, want, "{ctx}: {task:#} input {i} ({id:#}) on {v}");
                        checked_inputs += 1;
                    }
                }
                Event::Adopted { record, inputs, .. } => {
                    assert_eq!(
                        inputs.len(),
                        record.inputs.len(),
                        "{ctx}: {:#}",
                        record.task
                    );
                    assert_eq!(
                        Some(&record.inputs),
                        reads.get(&record.task),
                        "{ctx}: the adopted record of {:#} differs from its declaration",
                        record.task
                    );
                    for (p, id) in inputs.iter().zip(&record.inputs) {
                        let bytes = values::resolve(&**reader.store(), p.clone())
                            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                        assert_eq!(
                            Digest::of(&bytes),
                            produced[id].0,
                            "{ctx}: adopted {:#} carries another value for {id:#}",
                            record.task
                        );
                    }
                    adopted_checked += 1;
                }
                _ => {}
            }
        }
        // With r = 1 no child waits for a sibling (child i reads child i-1 only for i < r), so
        // the inputs read are the Sums' k = 3 counts per internal node.
        let internal = expected_tasks(7, 3).unwrap() - expected_nodes(7, 3).unwrap();
        assert_eq!(
            checked_inputs,
            internal * 3,
            "{ctx}: inputs read by the Sum tasks"
        );
        let adopted: u64 = report.vnodes.iter().map(|s| s.adopted).sum();
        assert_eq!(adopted_checked, adopted, "{ctx}");

        // The terminal output in the log decodes to the run's result.
        let manifest = reader.manifest().unwrap();
        assert_eq!(manifest.terminal, report.terminal, "{ctx}");
        let t = manifest.terminal[0];
        let (_, bytes) = produced
            .get(&t)
            .unwrap_or_else(|| panic!("{ctx}: terminal output {t:#} is in no log"));
        let value: u64 = codec::decode(bytes).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(
            value, report.outputs.0,
            "{ctx}: logged terminal value vs result"
        );
        assert_eq!(value, expected_nodes(7, 3).unwrap(), "{ctx}");
        // The home vnode holds it (written there, or Returned there by a thief).
        let home = logs.iter().find(|l| l.vnode == VnodeId(0)).unwrap();
        let at_home = home.events.iter().any(|e| match &e.event {
            Event::Completed { outputs, .. } => outputs.iter().any(|o| o.data == t),
            Event::Returned { output } => output.data == t,
            _ => false,
        });
        assert!(
            at_home,
            "{ctx}: the terminal output must be in vnode 0's log"
        );
    }
}

/// Rule 1: appending every event of a log twice, across segments, reads back as the same list,
/// and the reader counts what it dropped.
#[test]
fn logging_the_same_events_twice_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_, logs, _) = logged_run(dir.path(), 3);
    let mut total = 0;
    for original in &logs {
        let v = original.vnode;
        let ctx = format!("replaying the log of {v} (seed 3)");
        let events: Vec<Event> = original.events.iter().map(|e| e.event.clone()).collect();
        if events.is_empty() {
            // Which vnodes get work in a run this small depends on the threads' timing (a
            // vnode nobody stole from logs nothing): there is nothing to replay.
            continue;
        }
        total += events.len();

        let store = Arc::new(MemoryStore::default());
        let writer =
            LogWriter::start(store.clone(), VNODES, CommitPolicy::default()).expect("writer");
        let mut log = writer.vnode_log(v).expect("vnode log");
        for e in &events {
            log.append(e).unwrap_or_else(|err| panic!("{ctx}: {err}"));
        }
        log.seal().unwrap();
        for e in &events {
            log.append(e).unwrap_or_else(|err| panic!("{ctx}: {err}"));
        }
        log.sync().unwrap_or_else(|err| panic!("{ctx}: {err}"));
        assert_eq!(
            log.appended(),
            2 * events.len() as u64,
            "{ctx}: two copies were written"
        );
        assert_eq!(log.durable(), 2 * events.len() as u64, "{ctx}");
        drop(log);
        writer.shutdown().unwrap();

        let read = LogReader::new(store.clone())
            .read_vnode(v)
            .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let replayed: Vec<Event> = read.events.iter().map(|e| e.event.clone()).collect();
        assert_eq!(replayed.len(), events.len(), "{ctx}: distinct events");
        assert!(
            replayed == events,
            "{ctx}: the replayed log differs from the original"
        );
        assert_eq!(
            read.duplicates,
            events.len() as u64,
            "{ctx}: duplicates dropped"
        );
        assert!(read.torn.is_none(), "{ctx}");
        assert!(read.segments >= 2, "{ctx}: {} segments", read.segments);
        assert_eq!(read.durable_seq, 2 * events.len() as u64, "{ctx}");
        // Nothing else appeared in the store: only this vnode's segments.
        let other = LogReader::new(store).vnodes().unwrap();
        assert_eq!(other, vec![v], "{ctx}");
    }
    assert!(total > 0);
}

/// Rule 1 inside one open batch: the duplicate is dropped when appended, so the reader never
/// sees it (0 duplicates).
#[test]
fn a_duplicate_inside_one_batch_is_dropped_at_write() {
    let dir = tempfile::tempdir().unwrap();
    let (_, logs, _) = logged_run(dir.path(), 5);
    let events: Vec<Event> = logs[0]
        .events
        .iter()
        .take(50)
        .map(|e| e.event.clone())
        .collect();
    assert!(events.len() >= 2, "vnode 0 logged {} events", events.len());

    let store = Arc::new(MemoryStore::default());
    let writer = LogWriter::start(store.clone(), 1, CommitPolicy::default()).unwrap();
    let mut log = writer.vnode_log(VnodeId(0)).unwrap();
    for (i, e) in events.iter().enumerate() {
        let seq = log.append(e).unwrap();
        assert_eq!(
            seq,
            i as u64 + 1,
            "event {i}: sequence after a fresh append"
        );
        let again = log.append(e).unwrap();
        assert_eq!(
            again, seq,
            "event {i}: a duplicate takes no sequence number"
        );
        // And an older event of the same batch, again.
        let old = log.append(&events[0]).unwrap();
        assert_eq!(
            old, seq,
            "event {i}: a duplicate of event 0 takes no sequence number"
        );
    }
    assert_eq!(log.appended(), events.len() as u64);
    log.sync().unwrap();
    drop(log);
    writer.shutdown().unwrap();

    let read = LogReader::new(store).read_vnode(VnodeId(0)).unwrap();
    let back: Vec<Event> = read.events.iter().map(|e| e.event.clone()).collect();
    assert!(
        back == events,
        "the batch must hold each event once, in order"
    );
    assert_eq!(
        read.duplicates, 0,
        "dropped at write, so the reader sees none"
    );
    assert_eq!(read.segments, 1, "one sync, one segment");
    assert_eq!(read.durable_seq, events.len() as u64);
}

/// A second writer over the same store continues each vnode's log after its last segment
/// (segment numbers and sequence numbers go on; nothing is overwritten), and what it appends
/// again reads back as duplicates.
#[test]
fn a_new_writer_continues_the_log_and_its_replay_is_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    let (_, logs, _) = logged_run(dir.path(), 8);
    let original = logs.iter().max_by_key(|l| l.events.len()).unwrap();
    let v = original.vnode;
    let events: Vec<Event> = original.events.iter().map(|e| e.event.clone()).collect();
    let half = events.len() / 2;
    let policy = CommitPolicy {
        max_bytes: 512,
        ..CommitPolicy::default()
    };
    let store = Arc::new(MemoryStore::default());
    let first_segments = {
        let writer = LogWriter::start(store.clone(), VNODES, policy).unwrap();
        let mut log = writer.vnode_log(v).unwrap();
        for e in &events[..half + 1] {
            log.append(e).unwrap();
        }
        log.sync().unwrap();
        drop(log);
        writer.shutdown().unwrap();
        store.scan_prefix(b"seg/").unwrap()
    };
    assert!(
        first_segments.len() > 1,
        "{} segments",
        first_segments.len()
    );
    // A new writer (a restarted process): appends everything, the first half again.
    let writer = LogWriter::start(store.clone(), VNODES, policy).unwrap();
    let mut log = writer.vnode_log(v).unwrap();
    assert_eq!(
        log.appended(),
        half as u64 + 1,
        "continues after the stored sequence numbers"
    );
    assert_eq!(log.durable(), half as u64 + 1, "what is stored is durable");
    for e in &events {
        log.append(e).unwrap();
    }
    log.sync().unwrap();
    drop(log);
    writer.shutdown().unwrap();
    // The first writer's segments are untouched.
    let all = store.scan_prefix(b"seg/").unwrap();
    for (k, val) in &first_segments {
        assert!(
            all.iter().any(|(k2, v2)| k2 == k && v2 == val),
            "segment {k:02x?} was overwritten"
        );
    }
    let read = LogReader::new(store).read_vnode(v).unwrap();
    let back: Vec<Event> = read.events.iter().map(|e| e.event.clone()).collect();
    assert!(
        back == events,
        "the continued log reads as the original ({v})"
    );
    assert_eq!(read.duplicates, half as u64 + 1, "{v}");
    assert_eq!(read.durable_seq, (half + 1 + events.len()) as u64, "{v}");
    assert_eq!(read.segments, all.len() as u64);
}

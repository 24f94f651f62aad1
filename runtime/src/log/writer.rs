//! Writing side of the log: a [`VnodeLog`] per vnode and one group-commit [`LogWriter`] thread
//! (rules 1, 2 and 5 of `log/mod.rs`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use veriflow_checkpoint::Store;

use super::checkpoint::{checkpoint_key, Checkpoint};
use super::reader::{LogReader, RecoveredLog};
use super::segment::{self, SegmentBuilder, SegmentValues};
use super::state::LogState;
use super::values::{value_key, STORED_FROM};
use super::watermark::{watermark_prefix, LastSegment, Watermark};
use super::window::{Peeks, Scratch};
use super::{Event, EventKey, LogError, Payload};
use crate::codec::Digest;
use crate::ids::{DataId, IdHasher, IdMap, VnodeId};
use crate::util::Padded;

/// When an open batch is sealed into a segment (rule 2).
#[derive(Clone, Copy, Debug)]
pub struct CommitPolicy {
    /// Seal when the batch holds this many bytes. 64 KiB: measured on this machine, segments of
    /// that size flushed one by one cost ~0.9 µs per event (DESIGN.md).
    pub max_bytes: usize,
    /// Seal a non-empty batch at most this long after its first event, so durability keeps
    /// moving when tasks are long. Default [`DEFAULT_MAX_DELAY`].
    pub max_delay: Duration,
    /// Values of at least this many encoded bytes go to the value store, not into their event
    /// (rule 10; `usize::MAX`: none). Default [`STORED_FROM`].
    pub stored_from: usize,
}

/// How long an open batch waits at most (rule 2). Nothing waits on this delay: a vnode whose
/// messages wait for durability, or that goes idle or finishes, seals at once; the delay only
/// bounds the work a crash can lose (a vnode's last 20 ms, run again) and how far the durable
/// watermark lags a busy vnode (what an online oracle sees). When tasks are long it sets the
/// writer's flush rate, and every flush costs CPU the workers do not get: knary -n 6 -k 5 -r 1
/// at 1 ms grain on 2 threads (4,687 tasks), `perf record` of the writer and sled's threads:
/// 210-300 ms of CPU at 5 ms, 130 ms at 20 ms, 105 ms at 50 ms. 20 ms is a tenth of
/// PostgreSQL's `wal_writer_delay` for its asynchronous commits, the same kind of durability.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(20);

/// [`DEFAULT_MAX_DELAY`] of a cluster job's members (the `--commit-ms` default of `cluster`
/// and `submit`). There a flush is a request to a checkpoint server over an encrypted
/// connection, answered after the server's own flush: some 130 µs of CPU over the writer,
/// the server's committer and sled (perf, session 32), against ~10 µs for a local flush. At
/// 20 ms a one-vnode worker of `paper cluster` (knary depth 7 at 300 µs, 4 workers on 2
/// cores) sealed ~140 times a run, 80 % of them for the delay. At 100 ms the log's threads
/// (the workers' writers, the server's committer, sled and tokio threads) took 215-255 ms of
/// CPU a run against 285-342 at 20 ms (`perf record`, 4 interleaved S1 runs, load 6-9). The
/// price is the work a killed worker's vnode runs again: at most its last 100 ms.
pub const CLUSTER_MAX_DELAY: Duration = Duration::from_millis(100);

impl Default for CommitPolicy {
    fn default() -> Self {
        Self {
            max_bytes: 64 << 10,
            max_delay: DEFAULT_MAX_DELAY,
            stored_from: STORED_FROM,
        }
    }
}

struct Sealed {
    vnode: VnodeId,
    /// The incarnation that sealed it: its write is fenced by it (`store/fence.rs`).
    epoch: u64,
    segno: u64,
    last_seq: u64,
    bytes: Vec<u8>,
    /// The large values it names (rule 10), stored before it (a manual writer's; a thread's
    /// writer hands them to its value threads when sealed).
    values: SegmentValues,
    /// The values handed to the value threads with it: stored before it is (rule 10).
    awaits: Vec<Digest>,
    /// Its events' kinds and ids, noted as they were appended (rule 9, `window.rs` rule 4).
    peeks: Peeks,
}

impl Sealed {
    /// Bytes it takes in memory until stored: the segment and its values.
    fn size(&self) -> u64 {
        (self.bytes.len() + self.values.iter().map(|(_, b)| b.len()).sum::<usize>()) as u64
    }
}

enum ToWriter {
    Segment(Sealed),
    /// A victim acknowledged a value this vnode returned (`state.rs` rule 5).
    Acked {
        vnode: VnodeId,
        data: DataId,
        victim: VnodeId,
    },
    /// Store what came before, then exit (vnode logs may outlive the writer).
    Stop,
    /// Store what came before, then answer.
    Barrier(mpsc::SyncSender<()>),
}

/// State shared by the writer thread and every vnode log.
struct Shared {
    durable: Vec<Padded<AtomicU64>>,
    error: Mutex<Option<String>>,
    flushed: Mutex<u64>,
    flushed_cv: Condvar,
    /// Set when the writer thread has exited: nothing more will become durable.
    closed: std::sync::atomic::AtomicBool,
    /// A manual writer ([`LogWriter::manual`]): no thread; sealed segments wait here until
    /// [`LogWriter::pump`] (or a sync) stores them.
    manual: Option<Mutex<Manual>>,
    /// Rule 9: each vnode's folded log, and how often it becomes a checkpoint.
    compactors: Mutex<IdMap<VnodeId, Compactor>>,
    /// Bytes of segments between two checkpoints of a vnode; 0: no checkpoints.
    checkpoint_every: AtomicU64,
    /// Bytes of segments sealed and not yet stored: vnodes wait while it is above
    /// [`MAX_IN_FLIGHT_BYTES`] (rule 2), so a writer slower than its vnodes holds a bounded
    /// backlog in memory instead of one that grows with the run.
    in_flight: AtomicU64,
    /// Rule 8: the store keys of each vnode's watermarks, oldest first, that the writer has
    /// not deleted yet (`watermark.rs`: each is written once; all but the newest two go).
    watermarks: Mutex<IdMap<VnodeId, Vec<Vec<u8>>>>,
    /// Rule 10: digests of the values handed to the writer (sent with a sealed segment, in
    /// channel order, under this lock): the writer stores them before any segment sent after
    /// them, or stores nothing more (rule 6). A value logged again is neither copied nor
    /// stored again: the segment naming it again is sent after it.
    handed: Mutex<HashSet<Digest, std::hash::BuildHasherDefault<IdHasher>>>,
    /// Rule 10: the value threads of a thread's writer (none for a manual one).
    values: Option<ValueThreads>,
}

/// Rule 10: the threads that store large values as soon as a vnode seals the segment that
/// first names them, each value on its own, several at once, while the writer thread stores
/// segments and flushes; a segment's batch goes to the store once the values it awaits are
/// stored. A value file is durable when stored (`value_files.rs` rule 2); in any other store a
/// value put before a segment's batch is durable by that batch's flush.
struct ValueThreads {
    tx: Mutex<Option<Sender<ValueJob>>>,
    done: Mutex<ValuesDone>,
    done_cv: Condvar,
}

/// A value for the value threads: its digest and bytes.
type ValueJob = (Digest, Vec<u8>);

#[derive(Default)]
struct ValuesDone {
    /// Stored, not yet awaited by the writer.
    stored: HashSet<Digest, std::hash::BuildHasherDefault<IdHasher>>,
    /// The first store error: nothing is stored after it (rule 6).
    error: Option<String>,
}

/// Value threads of a writer. Several values in flight at once share the file system's
/// journal commits: 16 files of 2 MiB, each written and `fdatasync`ed, took 71 ms one after
/// another and 44 ms from 16 threads (this machine's disk, ext4, load ~6; a logged CG makes
/// ~16 such values an iteration, from 2 vnodes). 4 keeps most of that without a thread per
/// value.
const VALUE_THREADS: usize = 4;

impl ValueThreads {
    /// Starts the threads storing into `store`; `shared` learns of their progress.
    fn start(
        store: &Arc<dyn Store>,
        shared: &Arc<Shared>,
    ) -> Result<Vec<JoinHandle<()>>, LogError> {
        let Some(me) = &shared.values else {
            return Ok(Vec::new());
        };
        let (tx, rx) = mpsc::channel::<ValueJob>();
        *me.tx.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        let rx = Arc::new(Mutex::new(rx));
        (0..VALUE_THREADS)
            .map(|i| {
                let (store, shared, rx) = (store.clone(), shared.clone(), rx.clone());
                std::thread::Builder::new()
                    .name(format!("veriflow-log-values-{i}"))
                    .spawn(move || loop {
                        let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok((digest, bytes)) = job else { return };
                        let len = bytes.len() as u64;
                        let pair = [(value_key(&digest), bytes)];
                        // A store that panics fails the log (rule 6), never leaves it waiting.
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            store.put_batch_fenced_content(&[], &pair, 1)
                        }))
                        .unwrap_or_else(|_| {
                            Err(veriflow_checkpoint::StoreError::Io(
                                "the store panicked".to_string(),
                            ))
                        });
                        drop(pair);
                        let me = shared.values.as_ref().expect("value threads");
                        let mut done = me.done.lock().unwrap_or_else(|p| p.into_inner());
                        match r {
                            Ok(()) => {
                                done.stored.insert(digest);
                            }
                            Err(e) => {
                                done.error.get_or_insert(format!("value {digest}: {e}"));
                            }
                        }
                        drop(done);
                        me.done_cv.notify_all();
                        shared.in_flight.fetch_sub(len, Ordering::AcqRel);
                        let _guard = shared.flushed.lock().unwrap_or_else(|p| p.into_inner());
                        shared.flushed_cv.notify_all();
                    })
                    .map_err(|e| LogError::Store(format!("cannot start a log value thread: {e}")))
            })
            .collect()
    }

    /// Hands `values` to the threads (counted in flight until stored); their digests.
    fn hand(&self, shared: &Shared, values: SegmentValues) -> Result<Vec<Digest>, ()> {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let tx = tx.as_ref().ok_or(())?;
        let mut digests = Vec::with_capacity(values.len());
        for (d, bytes) in values {
            shared
                .in_flight
                .fetch_add(bytes.len() as u64, Ordering::AcqRel);
            digests.push(d);
            tx.send((d, bytes)).map_err(|_| ())?;
        }
        Ok(digests)
    }

    /// Waits until every value of `awaits` is stored, or a value failed.
    fn wait(&self, awaits: &[Digest]) -> Result<(), veriflow_checkpoint::StoreError> {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        for d in awaits {
            loop {
                if let Some(e) = &done.error {
                    return Err(veriflow_checkpoint::StoreError::Io(e.clone()));
                }
                if done.stored.remove(d) {
                    break;
                }
                done = self.done_cv.wait(done).unwrap_or_else(|p| p.into_inner());
            }
        }
        Ok(())
    }

    /// No more values: the threads exit once they have stored what they hold.
    fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// Watermarks of a vnode kept when older ones are deleted: the newest, and the one before it
/// in case the newest names segments that are gone. A deposed incarnation deletes too
/// (deletes carry no fence): of its writes at most one can be acknowledged and have its
/// segments sealed away by its successor (the one in flight at the successor's fence raise;
/// strategy rule 10 of the checkpoint crate), so the watermark before it still names segments
/// that are there.
const WATERMARKS_KEPT: usize = 2;

/// Most bytes of sealed segments waiting for the writer before vnodes that seal wait too: one
/// full writer batch ([`MAX_SEGMENTS_PER_FLUSH`] segments of the default 64 KiB).
const MAX_IN_FLIGHT_BYTES: u64 = 64 << 20;

/// Rule 9: a vnode's log folded as the writer stores it, a window at a time (`window.rs`),
/// and written as a checkpoint every [`LogWriter::set_checkpoint_every`] bytes of segments.
struct Compactor {
    state: LogState,
    /// The last segment taken in (folded, or kept to fold).
    upto: Option<LastSegment>,
    /// Segments in the log up to `upto` (the checkpoint's count).
    segments: u64,
    /// Bytes of segments taken in since the last checkpoint.
    since: u64,
    /// Stored segments not folded yet, in log order, folded together once they reach
    /// [`FOLD_WINDOW_BYTES`] or a checkpoint is due. Each is the sealed segment's own buffer,
    /// moved here once stored, unless it holds less than half its capacity: then a copy of
    /// its bytes (a sealed segment's buffer has the batch's whole capacity however little it
    /// holds: CG's segments, whose values go to the value store, held ~1 KiB each, and a 4 MiB
    /// window of them kept some 250 MB).
    kept: Vec<Vec<u8>>,
    /// Bytes of `kept`.
    kept_bytes: u64,
    /// The kept segments' notes (`window.rs` rule 4), one per event, in order.
    peeks: Peeks,
    /// Where each event of `kept` is (segment, start, end), reused from one fold to the next
    /// (as `scratch`).
    events: Vec<(u32, u32, u32)>,
    /// The fold's tables (`window.rs` rule 5).
    scratch: Scratch,
    /// The log could not be read back when the vnode's log was opened, or a segment did not
    /// fold: no checkpoint is written (recovery reads the whole log, and reports what is wrong
    /// with it).
    broken: bool,
}

/// Default of [`LogWriter::set_checkpoint_every`]: 32 MiB of segments. Recovery then decodes
/// at most this much log after the checkpoint (a fraction of a second); the checkpoint itself
/// is the live frontier, usually far smaller, so writing one costs little against 32 MiB of
/// segments.
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 32 << 20;

/// Bytes of a vnode's stored segments kept to be folded together (rule 9, `window.rs`): the
/// larger the window, the fewer tasks straddle two windows and are built to be dropped, and
/// the more memory it takes (this much per vnode, against the 64 MiB of segments the writer
/// may hold in flight). At 4 MiB (some 60 segments of 64 KiB, ~15,000 tasks of knary) the
/// tasks that straddle are a few hundred, the frontier.
pub(super) const FOLD_WINDOW_BYTES: u64 = 4 << 20;

impl Compactor {
    fn seeded(state: LogState, upto: Option<LastSegment>, segments: u64) -> Compactor {
        Compactor {
            state,
            upto,
            segments,
            since: 0,
            kept: Vec::new(),
            kept_bytes: 0,
            peeks: Peeks::default(),
            events: Vec::new(),
            scratch: Scratch::default(),
            broken: false,
        }
    }

    /// Takes in one segment as it goes to the store (rule 9): counted now, folded later
    /// ([`Compactor::keep`] once stored, or by a checkpoint due with it). False: not to be
    /// folded, a repeat (a segment at or below what was taken in: a new incarnation re-opened
    /// the log) or a broken log.
    fn accept(&mut self, s: &Sealed) -> bool {
        if self.broken || self.upto.is_some_and(|u| s.segno <= u.segno) {
            return false;
        }
        self.upto = Some(LastSegment {
            segno: s.segno,
            end_seq: s.last_seq,
        });
        self.segments += 1;
        self.since += s.bytes.len() as u64;
        true
    }

    /// Bytes of the kept segments.
    fn pending_bytes(&self) -> u64 {
        self.kept_bytes
    }

    /// Keeps an accepted segment once stored, and the notes of its events, to fold with its
    /// window.
    fn keep(&mut self, mut bytes: Vec<u8>, peeks: &Peeks) {
        if self.broken {
            return;
        }
        if bytes.len() < bytes.capacity() / 2 {
            bytes.shrink_to_fit();
        }
        self.kept_bytes += bytes.len() as u64;
        self.kept.push(bytes);
        self.peeks.extend(peeks);
    }

    /// Folds the kept segments, then `more` (accepted, not stored yet, with their notes), and
    /// compacts.
    fn fold(&mut self, vnode: VnodeId, more: &[(&[u8], &Peeks)]) {
        for (bytes, peeks) in more {
            self.keep(bytes.to_vec(), peeks);
        }
        if !self.broken && !self.kept.is_empty() {
            let Compactor {
                kept,
                peeks,
                events,
                scratch,
                state,
                ..
            } = self;
            events.clear();
            let folded = kept
                .iter()
                .enumerate()
                .try_for_each(|(k, seg)| {
                    let base = seg.as_ptr() as usize;
                    segment::for_each_sealed_event(seg, |e| {
                        // A segment is at most MAX_SEGMENT_BYTES (1 GiB): offsets fit.
                        let at = (e.as_ptr() as usize - base) as u32;
                        events.push((k as u32, at, at + e.len() as u32));
                        Ok(())
                    })
                })
                .map_err(|e| format!("{e:?}"))
                .and_then(|()| {
                    state
                        .fold_window_peeked(kept, events, Some(peeks), scratch)
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = folded {
                // The state may hold part of the window: no checkpoint is written from it.
                tracing::error!("log of {vnode}: cannot fold its segments: {e}");
                self.broken = true;
            }
        }
        self.kept.clear();
        self.kept_bytes = 0;
        self.peeks.clear();
    }

    /// The checkpoint record, if one is due, after folding what was kept and `more` (the
    /// vnode's accepted segments in the chunk it goes with).
    fn checkpoint(
        &mut self,
        vnode: VnodeId,
        every: u64,
        more: &[(&[u8], &Peeks)],
    ) -> Option<(Vec<u8>, Vec<u8>)> {
        if self.broken || every == 0 || self.since < every {
            return None;
        }
        let upto = self.upto?;
        self.fold(vnode, more);
        if self.broken {
            return None;
        }
        self.since = 0;
        let ck = Checkpoint {
            vnode,
            upto,
            segments: self.segments,
            state: std::mem::take(&mut self.state),
        };
        let bytes = ck.encode();
        self.state = ck.state;
        match bytes {
            Ok(b) => Some((checkpoint_key(vnode), b)),
            Err(e) => {
                tracing::error!("log of {vnode}: cannot encode its checkpoint: {e}");
                None
            }
        }
    }
}

/// The queue and store of a manual writer.
struct Manual {
    rx: Receiver<ToWriter>,
    store: Arc<dyn Store>,
}

impl Shared {
    /// A manual writer: stores what was sealed so far, as the thread would (rule 2).
    fn pump(&self) {
        let Some(m) = &self.manual else { return };
        let m = m.lock().unwrap_or_else(|p| p.into_inner());
        let mut batch = Vec::new();
        while let Ok(msg) = m.rx.try_recv() {
            match msg {
                ToWriter::Segment(s) => batch.push(s),
                ToWriter::Barrier(reply) => {
                    let _ = reply.send(());
                }
                ToWriter::Stop => {}
                ToWriter::Acked {
                    vnode,
                    data,
                    victim,
                } => self.acked(vnode, data, victim),
            }
        }
        if !batch.is_empty() && self.error().is_none() {
            store_batch(&*m.store, self, batch);
        }
    }
}

impl Shared {
    fn new(vnodes: u32, manual: Option<Manual>) -> Shared {
        let values = manual.is_none().then(|| ValueThreads {
            tx: Mutex::new(None),
            done: Mutex::new(ValuesDone::default()),
            done_cv: Condvar::new(),
        });
        Shared {
            values,
            durable: (0..vnodes).map(|_| Padded(AtomicU64::new(0))).collect(),
            error: Mutex::new(None),
            flushed: Mutex::new(0),
            flushed_cv: Condvar::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
            manual: manual.map(Mutex::new),
            compactors: Mutex::new(IdMap::default()),
            watermarks: Mutex::new(IdMap::default()),
            checkpoint_every: AtomicU64::new(DEFAULT_CHECKPOINT_BYTES),
            in_flight: AtomicU64::new(0),
            handed: Mutex::new(HashSet::default()),
        }
    }

    fn acked(&self, vnode: VnodeId, data: DataId, victim: VnodeId) {
        let mut c = self.compactors.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = c.get_mut(&vnode) {
            c.state.acknowledged(data, victim);
        }
    }

    fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The group-commit writer: one thread that stores sealed segments and flushes (rule 2).
pub struct LogWriter {
    tx: Option<Sender<ToWriter>>,
    thread: Option<JoinHandle<()>>,
    /// Rule 10's value threads.
    value_threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
    policy: CommitPolicy,
}

impl std::fmt::Debug for LogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWriter")
            .field("store", &self.store.describe())
            .finish()
    }
}

/// Most segments stored per flush: bounds the latency of the first of them.
const MAX_SEGMENTS_PER_FLUSH: usize = 1024;

impl LogWriter {
    /// Starts the writer thread for `vnodes` vnodes over `store`.
    pub fn start(
        store: Arc<dyn Store>,
        vnodes: u32,
        policy: CommitPolicy,
    ) -> Result<LogWriter, LogError> {
        let shared = Arc::new(Shared::new(vnodes, None));
        let value_threads = ValueThreads::start(&store, &shared)?;
        let (tx, rx) = mpsc::channel::<ToWriter>();
        let thread = {
            let (shared, store) = (shared.clone(), store.clone());
            std::thread::Builder::new()
                .name("veriflow-log-writer".to_string())
                .spawn(move || {
                    writer_loop(&*store, &shared, rx);
                    shared.closed.store(true, Ordering::SeqCst);
                    let _guard = shared.flushed.lock().unwrap_or_else(|p| p.into_inner());
                    shared.flushed_cv.notify_all();
                })
                .map_err(|e| LogError::Store(format!("cannot start the log writer: {e}")))?
        };
        Ok(LogWriter {
            tx: Some(tx),
            thread: Some(thread),
            value_threads,
            shared,
            store,
            policy,
        })
    }

    /// A writer without a thread, for a caller that runs everything on one thread (the
    /// cluster simulator): sealed segments wait in memory until [`LogWriter::pump`] stores
    /// them, so a crash before the pump loses them as a real crash loses what was not yet
    /// flushed. [`VnodeLog::sync`] and [`LogWriter::barrier`] pump first.
    pub fn manual(store: Arc<dyn Store>, vnodes: u32, policy: CommitPolicy) -> LogWriter {
        let (tx, rx) = mpsc::channel::<ToWriter>();
        let manual = Manual {
            rx,
            store: store.clone(),
        };
        LogWriter {
            tx: Some(tx),
            thread: None,
            value_threads: Vec::new(),
            shared: Arc::new(Shared::new(vnodes, Some(manual))),
            store,
            policy,
        }
    }

    /// A manual writer: stores and flushes every segment sealed so far (a thread's writer
    /// does this by itself; then this does nothing).
    pub fn pump(&self) {
        self.shared.pump();
    }

    /// The log of `vnode`, continuing after any segments it already has in the store. One
    /// process writes every vnode here (embedded mode, or `run --resume` on the store of a
    /// cluster run that is over): it writes at the epoch of the newest incarnation whose
    /// segments it finds (0 for an embedded run's own), so that the fences a cluster's
    /// incarnations raised accept it (rule 7).
    pub fn vnode_log(&self, vnode: VnodeId) -> Result<VnodeLog, LogError> {
        self.open_log(vnode, None)
    }

    /// The log of incarnation `epoch` of `vnode` (a cluster member hosting it after its host
    /// died): its segment numbers start at `epoch << 40`, so a zombie of an older incarnation
    /// that writes late never overwrites this one's segments.
    pub fn vnode_log_at(&self, vnode: VnodeId, epoch: u64) -> Result<VnodeLog, LogError> {
        self.open_log(vnode, Some(epoch))
    }

    /// The log of a new incarnation of `vnode` in this process (an embedded vnode rebuilt after
    /// it failed, `exec/recover.rs` rule 1): as a cluster member's ([`LogWriter::vnode_log_at`]),
    /// at the epoch after the newest among its segments, so that the log itself says where the
    /// old incarnation stopped (`inspect` draws it) and a late write of the old one is fenced.
    pub fn vnode_log_next_incarnation(&self, vnode: VnodeId) -> Result<VnodeLog, LogError> {
        let newest = self
            .store
            .last_under(&segment::vnode_prefix(vnode))?
            .and_then(|(key, _)| segment::parse_segment_key(&key))
            .map_or(0, |(_, segno)| segno >> segment::EPOCH_SHIFT);
        self.open_log(vnode, Some(newest + 1))
    }

    /// [`LogWriter::vnode_log_at`] at `epoch`, or ([`LogWriter::vnode_log`]) at the newest
    /// epoch among the vnode's segments.
    fn open_log(&self, vnode: VnodeId, at: Option<u64>) -> Result<VnodeLog, LogError> {
        let mut epoch = at.unwrap_or(0);
        let slot = self.shared.durable.get(vnode.0 as usize).ok_or_else(|| {
            LogError::Stopped(format!(
                "{vnode} is outside the {} vnodes",
                self.shared.durable.len()
            ))
        })?;
        // A new incarnation raises its log's fence before reading it: from now on a zombie of
        // an older one cannot add a segment this one would not have seen (rule 7).
        let prefix = segment::vnode_prefix(vnode);
        let wm_prefix = watermark_prefix(vnode);
        self.store.raise_fence(&prefix, epoch)?;
        // Rule 9: what recovery needs, read once here (from the newest checkpoint on) and
        // handed to it by `VnodeLog::take_recovery`; the writer folds on from the same state.
        let recovery = LogReader::new(self.store.clone()).recover_vnode(vnode);
        let (mut next_segno, next_seq, compactor) = match &recovery {
            Ok(r) => {
                let mut next_segno = r.next_segno;
                if let Some(t) = &r.torn {
                    // Rule 4: a torn last segment (the watermark does not cover it, else the
                    // read failed) holds nothing durable. Appending after it would make it a
                    // torn *middle* segment, which readers refuse: drop it, reuse its number.
                    tracing::warn!(
                        "log of {vnode}: dropping torn last segment {} ({})",
                        t.segment,
                        t.reason
                    );
                    self.store.delete(&segment::segment_key(vnode, t.segment))?;
                    self.store.flush()?;
                    next_segno = next_segno.max(t.segment);
                }
                let upto = r.next_segno.checked_sub(1).map(|segno| LastSegment {
                    segno,
                    end_seq: r.next_seq,
                });
                // A torn last segment dropped above is not counted: its number is reused.
                let c = Compactor::seeded(r.state.clone(), upto, r.segments);
                (next_segno, r.next_seq, c)
            }
            // The log does not read back: recovery reports why. Number after whatever is there.
            Err(_) => {
                let (segno, seq) = self.scan_numbers(vnode, &prefix)?;
                let mut c = Compactor::seeded(LogState::default(), None, 0);
                c.broken = true;
                (segno, seq, c)
            }
        };
        self.shared
            .compactors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(vnode, compactor);
        if at.is_none() && next_segno > 0 {
            // Continuing the newest incarnation (see `vnode_log`): its epoch, and its fence.
            epoch = (next_segno - 1) >> segment::EPOCH_SHIFT;
            if epoch > 0 {
                self.store.raise_fence(&prefix, epoch)?;
            }
        }
        // Rule 8: the watermarks there, to delete once this log has written newer ones (when
        // an older one cannot be read now, the newest: the others stay).
        let existing = match self.store.scan_prefix(&wm_prefix) {
            Ok(pairs) => pairs.into_iter().map(|(k, _)| k).collect(),
            Err(_) => self
                .store
                .last_under(&wm_prefix)?
                .into_iter()
                .map(|(k, _)| k)
                .collect(),
        };
        self.shared
            .watermarks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(vnode, existing);
        next_segno = next_segno.max(epoch << segment::EPOCH_SHIFT);
        slot.0.fetch_max(next_seq, Ordering::Release);
        let tx = self
            .tx
            .clone()
            .ok_or_else(|| LogError::Stopped("shut down".to_string()))?;
        Ok(VnodeLog {
            vnode,
            epoch,
            builder: SegmentBuilder::storing_from(self.policy.max_bytes, self.policy.stored_from),
            first_seq: next_seq,
            next_seq,
            next_segno,
            keys: Default::default(),
            peeks: Peeks::default(),
            opened_at: None,
            policy: self.policy,
            tx,
            shared: self.shared.clone(),
            store: self.store.clone(),
            recovery: Some(recovery),
        })
    }

    /// The next segment and sequence numbers of a log that does not read back: after every
    /// segment there, a torn last one the watermark does not cover dropped (rule 4).
    fn scan_numbers(&self, vnode: VnodeId, prefix: &[u8]) -> Result<(u64, u64), LogError> {
        let existing = self.store.scan_prefix(prefix)?;
        // Rule 8: a torn segment the watermark covers was flushed whole, so it is damage, not
        // a crash's leftover: it is kept for readers to report, never dropped here.
        let covered = LogReader::new(self.store.clone())
            .watermark(vnode)
            .ok()
            .flatten()
            .and_then(|wm| wm.last)
            .map(|l| l.segno);
        let mut next_segno = 0;
        let mut next_seq = 0;
        for (i, (key, value)) in existing.iter().enumerate() {
            if let Some((_, segno)) = segment::parse_segment_key(key) {
                match segment::decode_segment(value) {
                    Ok(seg) => {
                        next_seq = next_seq.max(seg.first_seq + seg.events.len() as u64);
                        next_segno = next_segno.max(segno + 1);
                    }
                    Err(segment::SegmentError::Frame(f))
                        if f.is_torn()
                            && i + 1 == existing.len()
                            && covered.is_none_or(|c| segno > c) =>
                    {
                        tracing::warn!("log of {vnode}: dropping torn last segment {segno} ({f})");
                        self.store.delete(key)?;
                        self.store.flush()?;
                        next_segno = next_segno.max(segno);
                    }
                    Err(_) => next_segno = next_segno.max(segno + 1),
                }
            }
        }
        Ok((next_segno, next_seq))
    }

    /// Rule 9: bytes of segments between two checkpoints of a vnode (default
    /// [`DEFAULT_CHECKPOINT_BYTES`]); 0 writes none, and recovery reads whole logs.
    pub fn set_checkpoint_every(&self, bytes: u64) {
        self.shared.checkpoint_every.store(bytes, Ordering::Relaxed);
    }

    /// Returns once every segment sealed before the call is stored and flushed (or the
    /// writer has stopped). Recovery uses it: what a failed vnode sealed reaches the store
    /// before its log is read back, and the new incarnation numbers its segments after it.
    pub fn barrier(&self) {
        if self.shared.manual.is_some() {
            self.shared.pump();
            return;
        }
        let (reply, done) = mpsc::sync_channel(1);
        if let Some(tx) = &self.tx {
            if tx.send(ToWriter::Barrier(reply)).is_ok() {
                let _ = done.recv();
            }
        }
    }

    /// Bytes of values the writer's recovery state holds inline (rule 9), over all vnodes:
    /// only values below [`CommitPolicy::stored_from`], since larger ones are held as their
    /// digest (rule 10). The segments kept to fold (`window.rs`) are folded first.
    pub fn held_value_bytes(&self) -> u64 {
        let mut compactors = self
            .shared
            .compactors
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        compactors
            .iter_mut()
            .map(|(vnode, c)| {
                c.fold(*vnode, &[]);
                c.state.inline_bytes()
            })
            .sum()
    }

    /// The store under this writer.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Stores what was sealed, stops the thread, and reports any store error (rule 5).
    pub fn shutdown(mut self) -> Result<(), LogError> {
        self.shared.pump();
        self.stop();
        match self.shared.error() {
            Some(e) => Err(LogError::Store(e)),
            None => Ok(()),
        }
    }

    fn stop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(ToWriter::Stop);
        }
        if let Some(t) = self.thread.take() {
            // The loop catches nothing: a panic there is a bug, reported as a store error.
            if t.join().is_err() {
                *self.shared.error.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some("log writer thread panicked".to_string());
            }
        }
        if let Some(v) = &self.shared.values {
            v.close();
        }
        for t in self.value_threads.drain(..) {
            if t.join().is_err() {
                *self.shared.error.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some("a log value thread panicked".to_string());
            }
        }
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
impl LogWriter {
    /// Bytes sealed and not stored yet (rule 2's bound counts them).
    pub(super) fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// Bytes of `vnode`'s stored segments not folded yet, and the tasks its state holds.
    pub(super) fn unfolded(&self, vnode: VnodeId) -> (u64, usize) {
        let (bytes, _, tasks) = self.unfolded_held(vnode);
        (bytes, tasks)
    }

    /// [`LogWriter::unfolded`] with the memory that holds those bytes.
    pub(super) fn unfolded_held(&self, vnode: VnodeId) -> (u64, u64, usize) {
        let compactors = self
            .shared
            .compactors
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        compactors.get(&vnode).map_or((0, 0, 0), |c| {
            (
                c.pending_bytes(),
                c.kept.iter().map(|k| k.capacity() as u64).sum(),
                c.state.tasks.len(),
            )
        })
    }
}

fn writer_loop(store: &dyn Store, shared: &Shared, rx: Receiver<ToWriter>) {
    let mut stopping = false;
    let mut barriers = Vec::new();
    while !stopping {
        let mut batch = Vec::new();
        match rx.recv() {
            Ok(ToWriter::Segment(first)) => batch.push(first),
            Ok(ToWriter::Barrier(reply)) => {
                let _ = reply.send(());
                continue;
            }
            Ok(ToWriter::Acked {
                vnode,
                data,
                victim,
            }) => {
                shared.acked(vnode, data, victim);
                continue;
            }
            Ok(ToWriter::Stop) | Err(_) => break,
        }
        while batch.len() < MAX_SEGMENTS_PER_FLUSH {
            match rx.try_recv() {
                Ok(ToWriter::Segment(s)) => batch.push(s),
                Ok(ToWriter::Barrier(reply)) => {
                    barriers.push(reply);
                    break;
                }
                Ok(ToWriter::Stop) => {
                    stopping = true;
                    break;
                }
                Ok(ToWriter::Acked {
                    vnode,
                    data,
                    victim,
                }) => shared.acked(vnode, data, victim),
                Err(_) => break,
            }
        }
        if !store_batch(store, shared, batch) {
            shared.flushed_cv.notify_all();
            return; // rule 5: nothing after this is claimed durable
        }
        for reply in barriers.drain(..) {
            let _ = reply.send(());
        }
    }
}

/// Stores one batch of sealed segments and flushes, then raises the durable marks (rule 2).
/// Returns false, with the error kept in `shared`, if the store failed (rule 5).
fn store_batch(store: &dyn Store, shared: &Shared, batch: Vec<Sealed>) -> bool {
    let started = std::time::Instant::now();
    let batch_bytes: u64 = batch.iter().map(Sealed::size).sum();
    let mut marks: Vec<(VnodeId, u64)> = Vec::with_capacity(batch.len());
    let mut fences: Vec<(VnodeId, u64)> = Vec::new();
    for s in &batch {
        if !fences.contains(&(s.vnode, s.epoch)) {
            fences.push((s.vnode, s.epoch));
        }
    }
    let fences: Vec<(Vec<u8>, u64)> = fences
        .into_iter()
        .map(|(v, e)| (segment::vnode_prefix(v), e))
        .collect();
    // Stores bound what one batch may carry (a checkpoint server takes one frame): hand
    // them the segments in order, in chunks of at most MAX_BATCH_BYTES, then flush once.
    // Chunks go in log order, so a crash leaves a prefix of the segments, never a gap.
    // Each chunk carries the durable watermark of every vnode it holds segments of (rule
    // 8), so the watermark never names a segment that is not stored with it, and a fenced
    // zombie's watermark is refused with its segments.
    let every = shared.checkpoint_every.load(Ordering::Relaxed);
    // Rule 10: the values the value threads store for these segments, stored first.
    let mut result = match &shared.values {
        Some(v) => v.wait(
            &batch
                .iter()
                .flat_map(|s| s.awaits.iter().copied())
                .collect::<Vec<_>>(),
        ),
        None => Ok(()),
    };
    let mut compactors = shared.compactors.lock().unwrap_or_else(|p| p.into_inner());
    let mut segments = batch.into_iter().peekable();
    while segments.peek().is_some() && result.is_ok() {
        let mut chunk: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        // Rule 9: (vnode, index in `chunk`, its events' notes) of the segments to fold once
        // stored.
        let mut accepted: Vec<(VnodeId, usize, Peeks)> = Vec::new();
        let mut last: Vec<(VnodeId, LastSegment)> = Vec::new();
        let mut bytes = 0usize;
        // Rule 10: a manual writer's values go in the chunk before the segments that name
        // them, written as content-addressed (the same bytes whoever writes them again).
        let mut values: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut new_values: HashSet<Digest, std::hash::BuildHasherDefault<IdHasher>> =
            HashSet::default();
        while let Some(mut s) =
            segments.next_if(|s| chunk.is_empty() || bytes + s.size() as usize <= MAX_BATCH_BYTES)
        {
            bytes += s.size() as usize;
            for (digest, value) in std::mem::take(&mut s.values) {
                if new_values.insert(digest) {
                    values.push((value_key(&digest), value));
                }
            }
            marks.push((s.vnode, s.last_seq));
            let mark = LastSegment {
                segno: s.segno,
                end_seq: s.last_seq,
            };
            match last.iter_mut().find(|(v, _)| *v == s.vnode) {
                Some((_, m)) => *m = mark,
                None => last.push((s.vnode, mark)),
            }
            // Rule 9: taken in now, its bytes folded once stored (or by a checkpoint).
            if every > 0 && compactors.get_mut(&s.vnode).is_some_and(|c| c.accept(&s)) {
                accepted.push((s.vnode, chunk.len(), std::mem::take(&mut s.peeks)));
            }
            chunk.push((segment::segment_key(s.vnode, s.segno), s.bytes));
        }
        // Rule 9: a checkpoint that is due goes in this chunk, beside the last segment it
        // covers and that segment's watermark, folded up to it.
        if every > 0 {
            let mut checkpoints = Vec::new();
            for (vnode, _) in &last {
                let Some(c) = compactors.get_mut(vnode) else {
                    continue;
                };
                let more: Vec<(&[u8], &Peeks)> = accepted
                    .iter()
                    .filter(|(v, _, _)| v == vnode)
                    .map(|(_, i, p)| (chunk[*i].1.as_slice(), p))
                    .collect();
                if let Some(pair) = c.checkpoint(*vnode, every, &more) {
                    checkpoints.push(pair);
                    accepted.retain(|(v, _, _)| v != vnode);
                }
            }
            chunk.append(&mut checkpoints);
        }
        let mut written = Vec::with_capacity(last.len());
        for (vnode, mark) in last {
            let wm = Watermark {
                vnode,
                last: Some(mark),
            };
            match wm.encode() {
                Ok(bytes) => {
                    written.push((vnode, wm.key()));
                    chunk.push((wm.key(), bytes));
                }
                Err(e) => {
                    result = Err(veriflow_checkpoint::StoreError::Io(e.to_string()));
                    break;
                }
            }
        }
        let content = values.len();
        if result.is_ok() {
            values.append(&mut chunk);
            result = store.put_batch_fenced_content(&fences, &values, content);
        }
        if result.is_ok() {
            // Rule 9: the stored segments' bytes, kept to fold.
            for (vnode, i, peeks) in accepted {
                if let Some(c) = compactors.get_mut(&vnode) {
                    c.keep(std::mem::take(&mut values[content + i].1), &peeks);
                }
            }
        }
        drop(values); // the values' bytes, at once
        if result.is_ok() {
            forget_watermarks(store, shared, written);
        }
    }
    drop(compactors);
    let result = result.and_then(|()| store.flush());
    if let Err(e) = result {
        tracing::error!("log writer: {e}");
        *shared.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        return false;
    }
    shared.in_flight.fetch_sub(batch_bytes, Ordering::AcqRel);
    let took = started.elapsed();
    crate::metrics::committed(batch_bytes, took);
    tracing::debug!(
        bytes = batch_bytes,
        segments = marks.len(),
        took_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        "group commit flushed"
    );
    for (v, seq) in marks {
        shared.durable[v.0 as usize]
            .0
            .fetch_max(seq, Ordering::Release);
    }
    *shared.flushed.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    shared.flushed_cv.notify_all();
    // Rule 9: full windows fold once the flush is acknowledged, so that no vnode waits on it.
    let mut compactors = shared.compactors.lock().unwrap_or_else(|p| p.into_inner());
    for (vnode, c) in compactors.iter_mut() {
        if c.pending_bytes() >= FOLD_WINDOW_BYTES {
            c.fold(*vnode, &[]);
        }
    }
    true
}

/// Old watermarks deleted at once: a vnode's watermarks older than its newest
/// [`WATERMARKS_KEPT`] wait until there are this many, then go in one [`Store::delete_batch`]
/// (one request and one flush per checkpoint server, protocol rule 8 of the checkpoint crate).
/// Deleting each as soon as it is old cost a second request and a second server flush per
/// group commit; 32 makes that one in 32, and leaves at most 33 small records per vnode.
pub(crate) const WATERMARK_DELETE_BATCH: usize = 32;

/// Rule 8: after `written` (vnode, watermark key) were acknowledged, deletes each vnode's
/// watermarks older than its newest [`WATERMARKS_KEPT`], once [`WATERMARK_DELETE_BATCH`] of
/// them wait. A failed delete is retried with the next batch: an old watermark left over is
/// never read while a newer one is there.
fn forget_watermarks(store: &dyn Store, shared: &Shared, written: Vec<(VnodeId, Vec<u8>)>) {
    let mut all = shared.watermarks.lock().unwrap_or_else(|p| p.into_inner());
    let mut old: Vec<(VnodeId, Vec<Vec<u8>>)> = Vec::new();
    for (vnode, key) in written {
        let keys = all.entry(vnode).or_default();
        if keys.last() != Some(&key) {
            keys.push(key);
        }
        let n = keys.len().saturating_sub(WATERMARKS_KEPT);
        if n >= WATERMARK_DELETE_BATCH {
            old.push((vnode, keys.drain(..n).collect()));
        }
    }
    if old.is_empty() {
        return;
    }
    let keys: Vec<Vec<u8>> = old.iter().flat_map(|(_, k)| k.iter().cloned()).collect();
    if let Err(e) = store.delete_batch(&keys) {
        tracing::warn!("{} old watermarks stay for now: {e}", keys.len());
        for (vnode, mut keys) in old {
            let newer = all.entry(vnode).or_default();
            keys.append(newer);
            *newer = keys; // oldest first again, tried with the next batch
        }
    }
}

/// Most bytes of segments handed to the store in one `put_batch` (a remote store sends a
/// server its part of a batch as one frame, at most 64 MiB).
const MAX_BATCH_BYTES: usize = 16 << 20;

/// One vnode's log: appends to the open batch and seals segments (rules 1-2).
pub struct VnodeLog {
    vnode: VnodeId,
    epoch: u64,
    builder: SegmentBuilder,
    first_seq: u64,
    next_seq: u64,
    next_segno: u64,
    keys: std::collections::HashSet<EventKey, std::hash::BuildHasherDefault<IdHasher>>,
    /// The open batch's events' kinds and ids, for the writer's fold (`window.rs` rule 4).
    peeks: Peeks,
    opened_at: Option<Duration>,
    policy: CommitPolicy,
    tx: Sender<ToWriter>,
    shared: Arc<Shared>,
    /// The store, to read back the large values the log names (rule 10).
    store: Arc<dyn Store>,
    /// What recovery needs from the log as it was opened, until taken (rule 9).
    recovery: Option<Result<RecoveredLog, LogError>>,
}

impl std::fmt::Debug for VnodeLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VnodeLog")
            .field("vnode", &self.vnode)
            .field("appended", &self.next_seq)
            .field("durable", &self.durable())
            .finish()
    }
}

impl VnodeLog {
    /// What recovery needs from this log as it was when opened (rule 9): the newest sound
    /// checkpoint with the segments after it folded in, or the whole log folded. Once only.
    pub fn take_recovery(&mut self) -> Result<RecoveredLog, LogError> {
        self.recovery.take().unwrap_or_else(|| {
            Err(LogError::Stopped(format!(
                "the recovery state of {}'s log was already taken",
                self.vnode
            )))
        })
    }

    /// The bytes of a value read back from this log: its own, or loaded from the value store
    /// and checked (rule 10).
    pub fn load_value(&self, payload: Payload) -> Result<Vec<u8>, LogError> {
        super::values::resolve(&*self.store, payload)
    }

    /// The store this log is written to (where its large values are, rule 10).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Drops the recovery state (a fresh run has nothing to recover).
    pub fn forget_recovery(&mut self) {
        self.recovery = None;
    }

    /// `victim` acknowledged the value of `data` that this vnode returned: checkpoints need
    /// not keep it to send it again (`state.rs` rule 5).
    pub fn note_acknowledged(&self, data: DataId, victim: VnodeId) {
        let _ = self.tx.send(ToWriter::Acked {
            vnode: self.vnode,
            data,
            victim,
        });
    }

    /// Appends `event` and returns the sequence number to wait for ([`VnodeLog::durable`])
    /// before it counts as stable. A duplicate of an event in the open batch is dropped
    /// (rule 1).
    pub fn append(&mut self, event: &Event) -> Result<u64, LogError> {
        self.append_outlined(event, SegmentValues::new())
    }

    /// [`VnodeLog::append`] of an event whose large values the caller took out of it (its
    /// payloads [`Payload::Stored`]), with their bytes, moved into the segment's value list
    /// (rule 10); a value already handed to the writer is dropped here.
    pub fn append_outlined(
        &mut self,
        event: &Event,
        mut values: SegmentValues,
    ) -> Result<u64, LogError> {
        if !self.keys.insert(event.key()) {
            return Ok(self.next_seq);
        }
        if !values.is_empty() {
            let handed = self.shared.handed.lock().unwrap_or_else(|p| p.into_inner());
            values.retain(|(d, _)| !handed.contains(d));
        }
        self.builder
            .push_outlined(event, values)
            .map_err(|e| LogError::Encode(e.to_string()))?;
        self.peeks.push(event);
        self.next_seq += 1;
        self.seal_if_full()?;
        Ok(self.next_seq)
    }

    /// Whether the value `digest` was handed to the writer already (rule 10): an event naming
    /// it again as [`Payload::Stored`], appended from now on, is stored after it.
    pub fn handed(&self, digest: &Digest) -> bool {
        self.shared
            .handed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(digest)
    }

    /// Values of at least this many encoded bytes go to the value store (rule 10).
    pub fn stored_from(&self) -> usize {
        self.policy.stored_from
    }

    /// [`VnodeLog::append`] of `Event::Declared` of `d`'s fields, encoded from them
    /// (`encode.rs` rule 4); also whether its arguments went to the value store (rule 10).
    pub(crate) fn append_declared(
        &mut self,
        d: &super::encode::DeclaredRef<'_>,
    ) -> Result<(u64, bool), LogError> {
        if !self.keys.insert((d.task.0, super::EventKind::Declared)) {
            return Ok((self.next_seq, false));
        }
        let stored = self
            .builder
            .push_declared(d)
            .map_err(|e| LogError::Encode(e.to_string()))?;
        self.peeks.push_declared(d.task, d.parent);
        self.next_seq += 1;
        self.seal_if_full()?;
        Ok((self.next_seq, stored))
    }

    /// Seals once the batch holds [`CommitPolicy::max_bytes`]; large values stream to the
    /// writer with the segment that names them (rule 10).
    fn seal_if_full(&mut self) -> Result<(), LogError> {
        if self.builder.body_len() + self.builder.value_bytes() >= self.policy.max_bytes {
            self.seal()?;
        }
        Ok(())
    }

    /// Notes the time for [`CommitPolicy::max_delay`]: call with the vnode's clock.
    pub fn tick(&mut self, now: Duration) -> Result<(), LogError> {
        match self.opened_at {
            None if self.builder.count() > 0 => self.opened_at = Some(now),
            Some(t0) if now.saturating_sub(t0) >= self.policy.max_delay => self.seal()?,
            _ => {}
        }
        Ok(())
    }

    /// Seals the open batch (if any) and hands it to the writer.
    pub fn seal(&mut self) -> Result<(), LogError> {
        if self.shared.error().is_some() {
            return Err(self.stopped("the log writer has stopped"));
        }
        if self.builder.count() == 0 {
            return Ok(());
        }
        let full = std::mem::replace(
            &mut self.builder,
            SegmentBuilder::storing_from(self.policy.max_bytes, self.policy.stored_from),
        );
        let (bytes, values) = full.seal_with_values(self.vnode, self.next_segno, self.first_seq);
        let mut sealed = Sealed {
            vnode: self.vnode,
            epoch: self.epoch,
            segno: self.next_segno,
            last_seq: self.next_seq,
            bytes,
            values,
            awaits: Vec::new(),
            peeks: {
                // The next batch takes about as many events as this one.
                let room = Peeks::with_capacity(self.peeks.len());
                std::mem::replace(&mut self.peeks, room)
            },
        };
        self.wait_for_room();
        {
            // Rule 10: a value handed already (by any vnode, since it was appended here) is on
            // its way before this segment; the others are handed now, and sent under the lock,
            // so that a vnode that finds one handed sends its segment after this one.
            let mut handed = self.shared.handed.lock().unwrap_or_else(|p| p.into_inner());
            sealed.values.retain(|(d, _)| handed.insert(*d));
            if let Some(v) = &self.shared.values {
                let values = std::mem::take(&mut sealed.values);
                sealed.awaits = v
                    .hand(&self.shared, values)
                    .map_err(|()| self.stopped("the log writer has stopped"))?;
            }
            self.shared
                .in_flight
                .fetch_add(sealed.size(), Ordering::AcqRel);
            self.tx
                .send(ToWriter::Segment(sealed))
                .map_err(|_| self.stopped("the log writer has stopped"))?;
        }
        self.next_segno += 1;
        self.first_seq = self.next_seq;
        self.keys.clear();
        self.opened_at = None;
        Ok(())
    }

    /// Waits while the writer is [`MAX_IN_FLIGHT_BYTES`] behind (a manual writer stores only
    /// when pumped: its caller decides when, so it never waits).
    fn wait_for_room(&self) {
        if self.shared.manual.is_some() {
            return;
        }
        let mut flushed = self
            .shared
            .flushed
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        while self.shared.in_flight.load(Ordering::Acquire) > MAX_IN_FLIGHT_BYTES
            && !self.shared.closed.load(Ordering::SeqCst)
            && self.shared.error().is_none()
        {
            flushed = self
                .shared
                .flushed_cv
                .wait_timeout(flushed, Duration::from_millis(10))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Rule 5: the store's error if the writer kept one (it records it before it exits, so
    /// after a failed send this finds it), else `Stopped` with `why`.
    fn stopped(&self, why: &str) -> LogError {
        match self.shared.error() {
            Some(e) => LogError::Store(e),
            None => LogError::Stopped(why.to_string()),
        }
    }

    /// Events with a sequence number at or below this are sealed (handed to the writer).
    pub fn sealed(&self) -> u64 {
        self.first_seq
    }

    /// Events appended so far (the highest sequence number).
    pub fn appended(&self) -> u64 {
        self.next_seq
    }

    /// Events whose sequence number is at or below this are durable (rule 2).
    pub fn durable(&self) -> u64 {
        self.shared.durable[self.vnode.0 as usize]
            .0
            .load(Ordering::Acquire)
    }

    /// Whether the open batch holds events.
    pub fn has_open_batch(&self) -> bool {
        self.builder.count() > 0
    }

    /// Whether a thread of the writer makes sealed batches durable, so that
    /// [`VnodeLog::wait_durable`] can see them become so: a manual writer's become durable
    /// only when it is pumped.
    pub fn flushes_in_background(&self) -> bool {
        self.shared.manual.is_none()
    }

    /// Waits up to `timeout` until the events up to `seq` (sealed already) are durable, and
    /// says whether they are.
    pub fn wait_durable(&self, seq: u64, timeout: Duration) -> Result<bool, LogError> {
        let deadline = Instant::now().checked_add(timeout);
        let mut flushed = self
            .shared
            .flushed
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        loop {
            if self.durable() >= seq {
                return Ok(true);
            }
            let closed = self.shared.closed.load(Ordering::SeqCst);
            if self.shared.error().is_some() || closed {
                return Err(self.stopped("the log writer has shut down"));
            }
            let now = Instant::now();
            let left = deadline.map_or(timeout, |d| d.saturating_duration_since(now));
            if left.is_zero() {
                return Ok(false);
            }
            flushed = self
                .shared
                .flushed_cv
                .wait_timeout(flushed, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Seals and waits until everything appended is durable.
    pub fn sync(&mut self) -> Result<(), LogError> {
        self.seal()?;
        self.shared.pump();
        let target = self.next_seq;
        while !self.wait_durable(target, Duration::from_millis(50))? {}
        Ok(())
    }
}

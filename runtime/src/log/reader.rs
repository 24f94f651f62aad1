//! Reading side of the log (rules 1, 3, 4 and 7 of `log/mod.rs`).
//!
//! Rules of this module:
//!
//! 1. A whole log is read in pages of segments ([`SEGMENT_PAGE`]), never all at once: a page's
//!    segments are decoded in parallel while the events of the page before go, in log order,
//!    to whoever reads them ([`LogReader::stream`]). Memory is a few pages of bytes, whatever
//!    the log's size.
//! 2. Decoding is pure; every check that depends on what came before (segment order, the
//!    durable watermark, a torn *last* segment, duplicates) runs in log order on one thread
//!    ([`Walk`]), exactly as when segments were read one by one.
//! 3. Three stages overlap on a whole log's read: while the reader (`sink`) takes the events
//!    of one page, the page after it is checked ([`Walk::admit`]: order, watermark,
//!    duplicates) and the page after that is fetched and decoded. The reader gets the same
//!    events in the same order as with segments read one by one; on an error it has taken
//!    some events of the pages before the damaged segment, then the error.
//! 4. A reader that decodes events its own way ([`LogReader::walk_encoded`]: the certifier's
//!    columnar track) gets each event's bytes in place, with the checks of rule 2 on every
//!    segment (the same [`Walk`], the same errors), but not the duplicates' check: it drops
//!    the repeats of one vnode's log itself. No event is decoded or copied by the reader.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use rayon::prelude::*;
use veriflow_checkpoint::{Store, StoreError};

use veriflow_checkpoint::PageLimit;

use super::checkpoint::{checkpoint_key, Checkpoint};
use super::segment::{self, SegmentError};
use super::state::LogState;
use super::watermark::{
    parse_watermark_key, watermark_prefix, LastSegment, Watermark, WATERMARK_PREFIX,
};
use super::{Event, EventKey, EventKind, LogError, Manifest};
use crate::codec::{FrameError, HEADER_LEN};
use crate::ids::{IdHasher, VnodeId};

/// An event and where it was found.
#[derive(Clone, Debug)]
pub struct LoggedEvent {
    /// Segment number.
    pub segment: u64,
    /// Byte offset inside the segment.
    pub offset: u32,
    /// The event.
    pub event: Event,
}

/// A torn last segment that was skipped (rule 4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// Segment number.
    pub segment: u64,
    /// How it was torn.
    pub reason: FrameError,
}

/// An event read a second time and dropped (rule 1): the vnode logged again what it had logged
/// before, as a recovered vnode does when it re-runs a task that had started but not completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repeat {
    /// How many distinct events of the log come before it (its place among
    /// [`VnodeEvents::events`]).
    pub at: u64,
    /// The segment it was found in.
    pub segment: u64,
    /// Its key.
    pub key: EventKey,
}

/// Everything durable in one vnode's log.
#[derive(Clone, Debug)]
pub struct VnodeEvents {
    /// The vnode.
    pub vnode: VnodeId,
    /// Its events, each once (rule 1), in log order.
    pub events: Vec<LoggedEvent>,
    /// Segments read (the torn one included).
    pub segments: u64,
    /// Highest sequence number durable in the store (the durable watermark).
    pub durable_seq: u64,
    /// Duplicate events dropped.
    pub duplicates: u64,
    /// Where the duplicates were, in log order (at most [`MAX_REPEATS`] of them).
    pub repeats: Vec<Repeat>,
    /// A torn last segment, if the writer was cut off mid-write.
    pub torn: Option<TornTail>,
}

/// The most [`Repeat`]s one [`VnodeEvents`] keeps: a zombie's whole overlapping log is counted
/// in [`VnodeEvents::duplicates`] but not listed event by event (16 bytes each: 16 MiB).
pub const MAX_REPEATS: usize = 1 << 20;

/// What [`LogReader::stream`] read of one vnode's log, besides its events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamedVnode {
    /// The vnode.
    pub vnode: VnodeId,
    /// Segments read (the torn one included).
    pub segments: u64,
    /// Distinct events handed on.
    pub events: u64,
    /// Duplicate events dropped.
    pub duplicates: u64,
    /// A torn last segment, if the writer was cut off mid-write.
    pub torn: Option<TornTail>,
}

/// A segment's events that [`Walk::admit`] lets through (rule 3 of this module): its number,
/// and its new events with their offsets, in log order.
type Admitted = (u64, Vec<(u32, Event)>);

/// Who takes each event's encoding from [`LogReader::walk_encoded`]: (segment number, byte
/// offset in the stored segment, bytes); an `Err` is why the event does not decode.
pub type EncodedSink<'a> = dyn FnMut(u64, u32, &[u8]) -> Result<(), String> + 'a;

/// What a segment's header says, and how many events it holds.
struct Header {
    vnode: VnodeId,
    segno: u64,
    first_seq: u64,
    events: u64,
}

/// One page of a log's segments, decoded (rule 1 of this module): store key and segment.
type Decoded = Vec<(Vec<u8>, Result<segment::Segment, SegmentError>)>;

/// Reads logs from a store, in one generation (`segment::generation_prefix`).
#[derive(Clone)]
pub struct LogReader {
    store: Arc<dyn Store>,
    generation: u32,
    prefix: Vec<u8>,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("store", &self.store.describe())
            .field("generation", &self.generation)
            .finish()
    }
}

impl LogReader {
    /// A reader of the run's own log (generation 0) in `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self::at_generation(store, 0)
    }

    /// A reader of generation `generation` in `store`.
    pub fn at_generation(store: Arc<dyn Store>, generation: u32) -> Self {
        Self {
            store,
            generation,
            prefix: segment::generation_prefix(generation),
        }
    }

    /// A reader of the generation the manifest names as current.
    pub fn latest(store: Arc<dyn Store>) -> Result<Self, LogError> {
        let g = Self::new(store.clone()).manifest()?.generation;
        Ok(Self::at_generation(store, g))
    }

    /// The generation read.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    fn key(&self, rest: &[u8]) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(rest);
        k
    }

    /// The run manifest; an error if the store holds none.
    pub fn manifest(&self) -> Result<Manifest, LogError> {
        Manifest::load(&*self.store)?.ok_or_else(|| {
            LogError::NotALog(format!("{} holds no run manifest", self.store.describe()))
        })
    }

    /// The vnodes of the run: every vnode the manifest lists (rule 8: each must have a log, even
    /// an empty one). A durable watermark of a vnode outside them is corruption. A store
    /// without a manifest (a bare log, as the log's own tests write) has the vnodes that have a
    /// watermark.
    pub fn vnodes(&self) -> Result<Vec<VnodeId>, LogError> {
        // Keys only, in pages: values are not needed to list vnodes.
        let prefix = self.key(WATERMARK_PREFIX);
        let mut marked: Vec<VnodeId> = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let (keys, more) = self.store.scan_keys(&prefix, after.as_deref(), KEY_PAGE)?;
            for key in &keys {
                let rest = key.get(self.prefix.len()..).unwrap_or_default();
                let v = parse_watermark_key(rest).ok_or_else(|| LogError::Missing {
                    vnode: VnodeId(u32::MAX),
                    segment: None,
                    what: format!("a watermark key is malformed ({rest:02x?})"),
                })?;
                // Keys sort by vnode first: a vnode's watermarks are adjacent.
                if marked.last() != Some(&v) {
                    marked.push(v);
                }
            }
            after = keys.last().cloned();
            if !more || after.is_none() {
                break;
            }
        }
        match Manifest::load(&*self.store)? {
            None => Ok(marked),
            Some(m) => {
                // A correction's generation holds the oracle's own log besides the vnodes'.
                let oracle = marked.contains(&VnodeId::ORACLE);
                if let Some(&v) = marked
                    .iter()
                    .find(|v| v.0 >= m.vnodes && **v != VnodeId::ORACLE)
                {
                    return Err(LogError::Missing {
                        vnode: v,
                        segment: None,
                        what: format!(
                            "it has a durable watermark but the manifest lists {} vnodes, so \
                             the manifest is not this log's",
                            m.vnodes
                        ),
                    });
                }
                Ok((0..m.vnodes)
                    .map(VnodeId)
                    .chain(oracle.then_some(VnodeId::ORACLE))
                    .collect())
            }
        }
    }

    /// About how many events the logs of `vnodes` hold (their durable watermarks' sequence
    /// numbers; duplicates counted), to size what they are read into. Unreadable watermarks
    /// count 0: reading the log reports them.
    pub fn events_hint(&self, vnodes: &[VnodeId]) -> u64 {
        vnodes
            .iter()
            .filter_map(|&v| self.watermark(v).ok().flatten()?.last)
            .map(|l| l.end_seq)
            .sum()
    }

    /// The durable watermark of `vnode` (rule 8), if it has one: the newest readable one
    /// (`watermark.rs`); an error if it is damaged or stored under another key than its own.
    pub fn watermark(&self, vnode: VnodeId) -> Result<Option<Watermark>, LogError> {
        let Some((key, bytes)) = self.store.last_under(&self.key(&watermark_prefix(vnode)))? else {
            return Ok(None);
        };
        let key = key.get(self.prefix.len()..).unwrap_or_default();
        let wm = Watermark::decode(vnode, &bytes)?;
        if wm.key() != key {
            return Err(LogError::Missing {
                vnode,
                segment: None,
                what: format!(
                    "its durable watermark record is damaged (stored under {key:02x?}, it \
                     names {:?})",
                    wm.last
                ),
            });
        }
        Ok(Some(wm))
    }

    /// The durable watermark of `vnode` as rule 8 requires it: the last durable segment, or
    /// `None` for a vnode that logged nothing. `segments` is whether the store holds any of its
    /// segments (then a missing watermark is corruption).
    fn covered(&self, vnode: VnodeId, segments: bool) -> Result<Option<LastSegment>, LogError> {
        let missing = |segment: Option<u64>, what: String| LogError::Missing {
            vnode,
            segment,
            what,
        };
        match self.watermark(vnode)? {
            Some(wm) => Ok(wm.last),
            // Rule 8: the writer stores a watermark with every segment, and a new run one for
            // every vnode its manifest lists.
            None if segments => Err(missing(
                None,
                "its durable watermark record is missing (segments are there)".to_string(),
            )),
            None => match Manifest::load(&*self.store)? {
                Some(m) if vnode.0 < m.vnodes => Err(missing(
                    Some(0),
                    format!(
                        "its whole log is missing (no segment and no durable watermark; the \
                         manifest lists {} vnodes)",
                        m.vnodes
                    ),
                )),
                _ => Ok(None),
            },
        }
    }

    /// Reads, checks and de-duplicates the log of `vnode` (rules 1, 4 and 7).
    pub fn read_vnode(&self, vnode: VnodeId) -> Result<VnodeEvents, LogError> {
        let mut events = Vec::new();
        let walk = self.walk_vnode(vnode, &mut |e| events.push(e))?;
        Ok(VnodeEvents {
            vnode,
            events,
            segments: walk.segments,
            durable_seq: walk.durable_seq,
            duplicates: walk.duplicates,
            repeats: walk.repeats,
            torn: walk.torn,
        })
    }

    /// Reads the logs of `vnodes` (from [`LogReader::vnodes`]), in order, as
    /// [`LogReader::read_vnode`] reads them, handing each event to `sink` in log order instead
    /// of keeping them (rule 1 of this module: pages decoded in parallel while `sink` takes the
    /// page before).
    pub fn stream(
        &self,
        vnodes: &[VnodeId],
        sink: &mut (dyn FnMut(VnodeId, LoggedEvent) + Send),
    ) -> Result<Vec<StreamedVnode>, LogError> {
        vnodes
            .iter()
            .map(|&vnode| {
                let walk = self.walk_vnode(vnode, &mut |e| sink(vnode, e))?;
                Ok(StreamedVnode {
                    vnode,
                    segments: walk.segments,
                    events: walk.distinct,
                    duplicates: walk.duplicates,
                    torn: walk.torn,
                })
            })
            .collect()
    }

    /// Reads the log of `vnode` as [`LogReader::read_vnode`] reads it, with every check but
    /// one, and hands `each` every event's encoding (segment number, byte offset in the stored
    /// segment, bytes) in log order, undecoded (rule 4 of this module). Duplicates are *not*
    /// dropped: `each` gets an event as often as it was logged, and drops repeats itself
    /// ([`StreamedVnode::duplicates`] is 0). An `Err` of `each` stops the read with the
    /// segment's content error, as a reader that decodes it names it.
    pub fn walk_encoded(
        &self,
        vnode: VnodeId,
        each: &mut EncodedSink<'_>,
    ) -> Result<StreamedVnode, LogError> {
        let prefix = self.key(&segment::vnode_prefix(vnode));
        let first = self.store.scan_page(&prefix, None, ONE_KEY)?;
        let covered = self.covered(vnode, !first.pairs.is_empty())?;
        let mut walk = Walk::new(vnode, covered, None);
        let skip = self.prefix.len();
        // Only the last segment may be torn (rule 4 of `log/mod.rs`): one is held back until
        // the next is seen.
        let mut pending: Option<(Vec<u8>, Vec<u8>)> = None;
        let mut after: Option<Vec<u8>> = None;
        while !first.pairs.is_empty() {
            let page = self
                .store
                .scan_page(&prefix, after.as_deref(), SEGMENT_PAGE)?;
            after = page.pairs.last().map(|(k, _)| k.clone());
            for pair in page.pairs {
                if let Some((key, value)) = pending.replace(pair) {
                    walk.encoded(key.get(skip..).unwrap_or_default(), &value, false, each)?;
                }
            }
            if !page.more || after.is_none() {
                break;
            }
        }
        if let Some((key, value)) = pending {
            walk.encoded(key.get(skip..).unwrap_or_default(), &value, true, each)?;
        }
        walk.finish()?;
        Ok(StreamedVnode {
            vnode,
            segments: walk.segments,
            events: walk.distinct,
            duplicates: 0,
            torn: walk.torn,
        })
    }

    /// One page of `vnode`'s segments after `after`, decoded in parallel (rule 1).
    fn decoded_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
    ) -> Result<(Decoded, bool), LogError> {
        let page = self.store.scan_page(prefix, after, SEGMENT_PAGE)?;
        let decoded = page
            .pairs
            .into_par_iter()
            .map(|(key, value)| {
                let seg = segment::decode_segment(&value);
                (key, seg)
            })
            .collect();
        Ok((decoded, page.more))
    }

    /// Rules 1 and 2 of this module on the log of `vnode`: its events to `sink`, each once.
    fn walk_vnode(
        &self,
        vnode: VnodeId,
        sink: &mut (dyn FnMut(LoggedEvent) + Send),
    ) -> Result<Walk, LogError> {
        let prefix = self.key(&segment::vnode_prefix(vnode));
        let first = self.store.scan_page(&prefix, None, ONE_KEY)?;
        let covered = self.covered(vnode, !first.pairs.is_empty())?;
        let mut walk = Walk::new(vnode, covered, None);
        // The watermark says about how many events come (about 3 a task: one id each): the
        // ids seen are sized once instead of growing (and rehashing) along the log; a damaged
        // watermark gets no more than `SEEN_RESERVE_MAX`.
        let expected = (covered.map_or(0, |c| c.end_seq) / 3).min(SEEN_RESERVE_MAX);
        walk.seen.reserve(usize::try_from(expected).unwrap_or(0));
        if first.pairs.is_empty() {
            walk.finish()?;
            return Ok(walk);
        }
        let skip = self.prefix.len();
        // Only the last segment may be torn (rule 4 of `log/mod.rs`): the last one decoded is
        // held back until the next page says whether one follows. Rule 3 of this module: page
        // i + 1 is fetched and decoded and page i checked while `sink` takes page i - 1's
        // events.
        let mut pending: Option<(Vec<u8>, Result<segment::Segment, SegmentError>)> = None;
        let mut page = Some(self.decoded_page(&prefix, None)?);
        let mut after: Option<Vec<u8>> = None;
        let mut admitted: Vec<Admitted> = Vec::new();
        loop {
            let checking = page.take().map(|(decoded, more)| {
                if let Some((k, _)) = decoded.last() {
                    after = Some(k.clone());
                }
                let mut ready: Decoded = pending.take().into_iter().chain(decoded).collect();
                pending = ready.pop();
                (ready, more && after.is_some())
            });
            let Some((ready, fetch)) = checking else {
                deliver(std::mem::take(&mut admitted), &mut *sink);
                break;
            };
            let handing = std::mem::take(&mut admitted);
            let walk_ref = &mut walk;
            let (checked, ()) = rayon::join(
                || -> Result<_, LogError> {
                    let mut out = Vec::with_capacity(ready.len());
                    for (key, seg) in ready {
                        let key = key.get(skip..).unwrap_or_default();
                        if let Some(events) = walk_ref.admit(key, seg, false)? {
                            out.push(events);
                        }
                    }
                    let next = match fetch {
                        true => Some(self.decoded_page(&prefix, after.as_deref())?),
                        false => None,
                    };
                    Ok((out, next))
                },
                || deliver(handing, &mut *sink),
            );
            let (out, next) = checked?;
            admitted = out;
            page = next;
        }
        if let Some((key, seg)) = pending {
            let key = key.get(skip..).unwrap_or_default();
            walk.segment_decoded(key, seg, true, &mut *sink)?;
        }
        walk.finish()?;
        Ok(walk)
    }

    /// What recovery needs from the log of `vnode` (rule 9): the newest sound checkpoint, with
    /// the segments after it folded in, or the whole log folded when there is no sound
    /// checkpoint. The segments read are checked as [`LogReader::read_vnode`] checks them
    /// (rules 4 and 8), from the checkpoint on. The state is compacted.
    pub fn recover_vnode(&self, vnode: VnodeId) -> Result<RecoveredLog, LogError> {
        let started = std::time::Instant::now();
        let pinned = match Manifest::load(&*self.store) {
            Ok(Some(m)) if vnode.0 == 0 => m.terminal,
            _ => Vec::new(),
        };
        let prefix = self.key(&segment::vnode_prefix(vnode));
        let first = self.store.scan_page(&prefix, None, ONE_KEY)?;
        let covered = self.covered(vnode, !first.pairs.is_empty())?;
        // Rule 9: a checkpoint is overwritten in place, so a write of it that was interrupted
        // can leave no version rebuildable; the log holds everything it does.
        let stored = match self.store.get(&self.key(&checkpoint_key(vnode))) {
            Err(e @ StoreError::Unrecoverable { .. }) => {
                tracing::warn!(
                    "log of {vnode}: checkpoint unreadable ({e}); reading the whole log"
                );
                None
            }
            other => other?,
        };
        let checkpoint = match stored {
            None => None,
            Some(bytes) => match Checkpoint::decode(vnode, &bytes) {
                Ok(ck)
                    if covered.is_some_and(|c| {
                        c.segno >= ck.upto.segno && c.end_seq >= ck.upto.end_seq
                    }) =>
                {
                    Some(ck)
                }
                Ok(ck) => {
                    tracing::warn!(
                        "log of {vnode}: checkpoint at segment {} is ahead of the durable \
                         watermark ({covered:?}); reading the whole log",
                        ck.upto.segno
                    );
                    None
                }
                Err(e) => {
                    tracing::warn!("{e}; reading the whole log");
                    None
                }
            },
        };
        let ck_segments = checkpoint.as_ref().map_or(0, |ck| ck.segments);
        if let Some(ck) = &checkpoint {
            self.check_covered_segments(vnode, &prefix, ck)?;
        }
        let (mut state, start) = match checkpoint {
            Some(ck) => {
                let mut state = ck.state;
                state.pinned = pinned;
                (state, Some(ck.upto))
            }
            None => (LogState::new(pinned), None),
        };
        let mut walk = Walk::new(vnode, covered, start);
        let mut events = 0u64;
        let mut after: Option<Vec<u8>> =
            start.map(|s| self.key(&segment::segment_key(vnode, s.segno)));
        // One segment is held back until the next is seen: only the last may be torn (rule 4).
        let mut pending: Option<(Vec<u8>, Vec<u8>)> = None;
        'pages: loop {
            let page = self.store.scan_page(&prefix, after.as_deref(), TAIL_PAGE)?;
            after = page.pairs.last().map(|(k, _)| k.clone());
            let more = page.more;
            for pair in page.pairs {
                if let Some((key, value)) = pending.replace(pair) {
                    let key = key.get(self.prefix.len()..).unwrap_or_default();
                    if !walk.segment(key, &value, false, &mut |e| {
                        events += 1;
                        state.fold(e.event);
                    })? {
                        break 'pages;
                    }
                }
            }
            if !more || after.is_none() {
                break;
            }
        }
        if let Some((key, value)) = pending.take() {
            let key = key.get(self.prefix.len()..).unwrap_or_default();
            walk.segment(key, &value, true, &mut |e| {
                events += 1;
                state.fold(e.event);
            })?;
        }
        walk.finish()?;
        state.compact();
        Ok(RecoveredLog {
            vnode,
            state,
            checkpoint: start,
            segments: ck_segments + walk.segments - u64::from(walk.torn.is_some()),
            tail_segments: walk.segments,
            tail_events: events,
            next_segno: walk.last_read.map_or(0, |s| s + 1),
            next_seq: walk.next_seq,
            torn: walk.torn,
            read_time: started.elapsed(),
        })
    }

    /// Rule 9: the segments checkpoint `ck` covers are all still in the store, by their keys
    /// alone (numbers in order as [`Walk`] wants them, and as many as it counted); a hole is
    /// missing data, named as a reader of the whole log names it.
    fn check_covered_segments(
        &self,
        vnode: VnodeId,
        prefix: &[u8],
        ck: &Checkpoint,
    ) -> Result<(), LogError> {
        let missing = |segment: Option<u64>, what: String| LogError::Missing {
            vnode,
            segment,
            what,
        };
        let mut prev: Option<u64> = None;
        let mut count = 0u64;
        let mut after: Option<Vec<u8>> = None;
        'pages: loop {
            let (keys, more) = self.store.scan_keys(prefix, after.as_deref(), KEY_PAGE)?;
            for key in &keys {
                let k = key.get(self.prefix.len()..).unwrap_or_default();
                let Some((_, segno)) = segment::parse_segment_key(k) else {
                    return Err(LogError::Corrupt {
                        vnode,
                        segment: u64::MAX,
                        offset: 0,
                        reason: format!("malformed segment key {k:02x?}"),
                    });
                };
                if segno > ck.upto.segno {
                    break 'pages;
                }
                if let Some((from, there)) = gap(prev, segno) {
                    return Err(missing(Some(from), gap_text(from, segno, &there)));
                }
                prev = Some(segno);
                count += 1;
            }
            after = keys.last().cloned();
            if !more || after.is_none() {
                break;
            }
        }
        if prev != Some(ck.upto.segno) {
            return Err(missing(
                Some(ck.upto.segno),
                format!(
                    "segment {} is missing (its recovery checkpoint covers the log up to it)",
                    ck.upto.segno
                ),
            ));
        }
        if count < ck.segments {
            return Err(missing(
                None,
                format!(
                    "{} of the {} segments up to segment {} are missing (its recovery \
                     checkpoint counted them; an epoch's last segments went missing)",
                    ck.segments - count,
                    ck.segments,
                    ck.upto.segno
                ),
            ));
        }
        Ok(())
    }

    /// A follower of `vnode`'s log while the run goes on ([`LogTail`]).
    pub fn tail(&self, vnode: VnodeId) -> LogTail {
        LogTail {
            walk: Walk::new(vnode, None, None),
            after: None,
        }
    }

    /// Reads every vnode's log.
    pub fn read_all(&self) -> Result<Vec<VnodeEvents>, LogError> {
        self.vnodes()?
            .into_iter()
            .map(|v| self.read_vnode(v))
            .collect()
    }

    /// The store read from.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}

/// Follows one vnode's log as it grows ([`LogReader::tail`]): each [`LogTail::poll`] reads the
/// segments that became durable since the last one (those its durable watermark covers, rule
/// 8), checked as [`LogReader::read_vnode`] checks them (rules 1, 4 and 8), and hands their
/// new events on. A segment past the watermark waits: it may still be written, or be a torn
/// segment a crash left, which the next incarnation's segments follow. Each poll reads only
/// what is new (paged scans after the last key read).
#[derive(Debug)]
pub struct LogTail {
    walk: Walk,
    after: Option<Vec<u8>>,
}

impl LogTail {
    /// Reads what became durable since the last poll; returns the number of new events.
    pub fn poll(
        &mut self,
        reader: &LogReader,
        sink: &mut dyn FnMut(LoggedEvent),
    ) -> Result<u64, LogError> {
        let vnode = self.walk.vnode;
        let Some(covered) = reader.watermark(vnode)?.and_then(|w| w.last) else {
            return Ok(0);
        };
        if self.walk.last_read.is_some_and(|r| r >= covered.segno) {
            return Ok(0);
        }
        self.walk.covered = Some(covered);
        let prefix = reader.key(&segment::vnode_prefix(vnode));
        let mut events = 0u64;
        loop {
            let page = reader
                .store
                .scan_page(&prefix, self.after.as_deref(), TAIL_PAGE)?;
            let mut reached = false;
            for (key, value) in &page.pairs {
                let short = key.get(reader.prefix.len()..).unwrap_or_default();
                match segment::parse_segment_key(short) {
                    Some((_, segno)) if segno > covered.segno => {
                        reached = true;
                        break;
                    }
                    _ => {}
                }
                self.walk.segment(short, value, false, &mut |e| {
                    events += 1;
                    sink(e);
                })?;
                self.after = Some(key.clone());
            }
            if reached || !page.more || page.pairs.is_empty() {
                break;
            }
        }
        Ok(events)
    }

    /// Whether the store holds no segment of this vnode past the last one read: none the
    /// watermark did not cover yet, nor a torn one (keys only, one page of one key).
    pub fn caught_up(&self, reader: &LogReader) -> Result<bool, LogError> {
        let prefix = reader.key(&segment::vnode_prefix(self.walk.vnode));
        let (keys, _) = reader.store.scan_keys(&prefix, self.after.as_deref(), 1)?;
        Ok(keys.is_empty())
    }

    /// The last segment read, if any.
    pub fn last_segment(&self) -> Option<u64> {
        self.walk.last_read
    }
}

/// Rule 1's order of segment numbers: `segno` follows `prev` (the one before it, if any)
/// when it is the next number or the first of a newer epoch. Otherwise the first missing
/// number, and what is there.
fn gap(prev: Option<u64>, segno: u64) -> Option<(u64, String)> {
    match prev {
        Some(p) if segno == p + 1 => None,
        Some(p) if segno > p && segment::starts_epoch(segno) => None,
        None if segment::starts_epoch(segno) => None,
        _ => {
            let from = prev.map_or(segno & !((1u64 << segment::EPOCH_SHIFT) - 1), |p| p + 1);
            let there = match prev {
                Some(p) => format!("segments {p} and {segno} are there"),
                None => format!("its first segment is {segno}"),
            };
            Some((from, there))
        }
    }
}

/// Keys listed per page when checking what a checkpoint covers.
const KEY_PAGE: usize = 4096;

/// "segment 5 is missing" or "segments 5..9 are missing", then `(there)`.
fn gap_text(from: u64, to: u64, there: &str) -> String {
    if to <= from + 1 {
        format!("segment {from} is missing ({there})")
    } else {
        format!("segment {from} to segment {} are missing ({there})", to - 1)
    }
}

/// One page of a tail read: a few segments (64 KiB each by default).
const TAIL_PAGE: PageLimit = PageLimit {
    max_keys: 64,
    max_bytes: 16 << 20,
};
/// A page of a whole log's read (rule 1 of this module): 64 segments of 64 KiB, enough for
/// both cores to decode while the page before is handed on.
const SEGMENT_PAGE: PageLimit = PageLimit {
    max_keys: 64,
    max_bytes: 16 << 20,
};
/// Most ids the ids seen are sized for before reading (4 Mi ids, 128 MiB).
const SEEN_RESERVE_MAX: u64 = 1 << 22;
/// Enough to know whether a vnode has any segment.
const ONE_KEY: PageLimit = PageLimit {
    max_keys: 1,
    max_bytes: u64::MAX,
};

/// What [`LogReader::recover_vnode`] read.
#[derive(Clone, Debug)]
pub struct RecoveredLog {
    /// The vnode.
    pub vnode: VnodeId,
    /// Its log's recovery state, compacted.
    pub state: LogState,
    /// The last segment the checkpoint used covered, if one was used.
    pub checkpoint: Option<LastSegment>,
    /// Segments read after the checkpoint (all of them without one), a torn one included.
    pub tail_segments: u64,
    /// Events folded from those segments.
    pub tail_events: u64,
    /// Segments in the log it read (with those its checkpoint covers), a torn last one not
    /// counted.
    pub segments: u64,
    /// The number the next segment takes.
    pub next_segno: u64,
    /// The sequence number the next event takes.
    pub next_seq: u64,
    /// A torn last segment, skipped (rule 4).
    pub torn: Option<TornTail>,
    /// Time taken to read, check and fold it.
    pub read_time: std::time::Duration,
}

/// Hands segments' events admitted by [`Walk::admit`] (segment number, events) to `sink`, in
/// order.
fn deliver(admitted: Vec<Admitted>, sink: &mut dyn FnMut(LoggedEvent)) {
    for (segment, events) in admitted {
        for (offset, event) in events {
            sink(LoggedEvent {
                segment,
                offset,
                event,
            });
        }
    }
}

/// The bit of `kind` in [`Walk`]'s ids seen.
fn kind_bit(kind: EventKind) -> u8 {
    match kind {
        EventKind::Declared => 1,
        EventKind::Started => 2,
        EventKind::Completed => 4,
        EventKind::Stolen => 8,
        EventKind::Adopted => 16,
        EventKind::Returned => 32,
        EventKind::Input => 64,
    }
}

/// Checks segments in key order (rules 1, 4 and 8), from the start of the log or from a
/// checkpoint.
#[derive(Debug)]
struct Walk {
    vnode: VnodeId,
    covered: Option<LastSegment>,
    /// The kinds of event seen of each id, one bit a kind ([`kind_bit`]): an event's key is
    /// (id, kind), and a task's three events share one entry (a third of the entries of a
    /// set of keys, so fewer cache misses on a large log).
    seen: HashMap<u128, u8, BuildHasherDefault<IdHasher>>,
    prev_segno: Option<u64>,
    next_seq: u64,
    /// The last segment read whole (the checkpoint's before any).
    last_read: Option<u64>,
    segments: u64,
    durable_seq: u64,
    duplicates: u64,
    /// Distinct events read so far.
    distinct: u64,
    /// Where the duplicates were ([`MAX_REPEATS`] at most).
    repeats: Vec<Repeat>,
    torn: Option<TornTail>,
}

impl Walk {
    fn new(vnode: VnodeId, covered: Option<LastSegment>, start: Option<LastSegment>) -> Walk {
        Walk {
            vnode,
            covered,
            // Keys are random ids: no need to hash them again (`ids.rs`).
            seen: HashMap::default(),
            prev_segno: start.map(|s| s.segno),
            next_seq: start.map_or(0, |s| s.end_seq),
            last_read: start.map(|s| s.segno),
            segments: 0,
            durable_seq: start.map_or(0, |s| s.end_seq),
            duplicates: 0,
            distinct: 0,
            repeats: Vec::new(),
            torn: None,
        }
    }

    fn missing(&self, segment: Option<u64>, what: String) -> LogError {
        LogError::Missing {
            vnode: self.vnode,
            segment,
            what,
        }
    }

    /// Checks one stored segment (`key` without the generation prefix) and hands its new events
    /// to `sink`. Returns false after a torn last segment (skipped).
    fn segment(
        &mut self,
        key: &[u8],
        value: &[u8],
        is_last: bool,
        sink: &mut dyn FnMut(LoggedEvent),
    ) -> Result<bool, LogError> {
        self.segment_decoded(key, segment::decode_segment(value), is_last, sink)
    }

    /// [`Walk::segment`] on a segment already decoded (`decoded`: what
    /// [`segment::decode_segment`] made of its value).
    fn segment_decoded(
        &mut self,
        key: &[u8],
        decoded: Result<segment::Segment, SegmentError>,
        is_last: bool,
        sink: &mut dyn FnMut(LoggedEvent),
    ) -> Result<bool, LogError> {
        match self.admit(key, decoded, is_last)? {
            Some(events) => {
                deliver(vec![events], sink);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The first checks of a segment, on its key alone (rules 1 and 8): its number, in order
    /// after the one before.
    fn open(&mut self, key: &[u8]) -> Result<u64, LogError> {
        self.segments += 1;
        let Some((_, segno)) = segment::parse_segment_key(key) else {
            return Err(LogError::Corrupt {
                vnode: self.vnode,
                segment: u64::MAX,
                offset: 0,
                reason: format!("malformed segment key {key:02x?}"),
            });
        };
        if let Some((from, there)) = gap(self.prev_segno, segno) {
            return Err(self.missing(Some(from), gap_text(from, segno, &there)));
        }
        self.prev_segno = Some(segno);
        Ok(segno)
    }

    /// The checks of segment `segno` once it was opened ([`Walk::open`]) and decoded or walked
    /// (`header`: what its header says, or why it could not be read): false after a torn last
    /// segment (skipped).
    fn header(
        &mut self,
        segno: u64,
        header: Result<Header, SegmentError>,
        is_last: bool,
    ) -> Result<bool, LogError> {
        let vnode = self.vnode;
        let corrupt = |offset: u64, reason: String| LogError::Corrupt {
            vnode,
            segment: segno,
            offset,
            reason,
        };
        let covered = self.covered;
        let covered_by_watermark = covered.is_some_and(|c| segno <= c.segno);
        let seg = match header {
            Ok(s) => s,
            Err(SegmentError::Frame(f)) if f.is_torn() && is_last && !covered_by_watermark => {
                tracing::warn!("log of {vnode}: torn last segment {segno} skipped ({f})");
                self.torn = Some(TornTail {
                    segment: segno,
                    reason: f,
                });
                return Ok(false);
            }
            Err(SegmentError::Frame(f)) if f.is_torn() && is_last => {
                return Err(corrupt(
                    0,
                    format!(
                        "{f}, though the durable watermark (segment {}) says it was flushed \
                         whole (rule 8)",
                        covered.map_or(0, |c| c.segno)
                    ),
                ))
            }
            Err(SegmentError::Frame(f)) => return Err(corrupt(0, f.to_string())),
            Err(SegmentError::Content { offset, reason }) => return Err(corrupt(offset, reason)),
        };
        if seg.vnode != vnode || seg.segno != segno {
            return Err(corrupt(
                0,
                format!("segment says it is {} segment {}", seg.vnode, seg.segno),
            ));
        }
        // Rule 8: a first_seq below the expected one is a zombie's overlap (duplicates); above
        // it, events are missing.
        if seg.first_seq > self.next_seq {
            return Err(self.missing(
                Some(segno),
                format!(
                    "events {}..{} are missing before segment {segno} (a segment before it was \
                     lost)",
                    self.next_seq, seg.first_seq
                ),
            ));
        }
        let end = seg.first_seq + seg.events;
        self.next_seq = self.next_seq.max(end);
        self.durable_seq = self.durable_seq.max(end);
        self.last_read = Some(segno);
        Ok(true)
    }

    /// Rule 4 of this module on one stored segment (`key` without the generation prefix): its
    /// events' encodings to `each` (segment number, byte offset in the stored value, bytes),
    /// duplicates included; false after a torn last segment (skipped). An `Err` of `each` is
    /// the segment's content error, as [`segment::decode_segment`] names one.
    fn encoded(
        &mut self,
        key: &[u8],
        value: &[u8],
        is_last: bool,
        each: &mut EncodedSink<'_>,
    ) -> Result<bool, LogError> {
        let segno = self.open(key)?;
        let mut events = 0u64;
        let walked = segment::for_each_encoded_event(value, |e| {
            events += 1;
            // `e` is a slice of `value`: its place is where it starts, less its length.
            let offset = (e.as_ptr() as usize - value.as_ptr() as usize - 4) as u32;
            each(segno, offset, e)
        });
        let header = walked.map(|()| {
            // The frame and the segment header were checked by the walk.
            let h = &value[HEADER_LEN..HEADER_LEN + segment::SEGMENT_HEADER_LEN];
            let u64_at = |p: usize| u64::from_le_bytes(h[p..p + 8].try_into().expect("8 bytes"));
            Header {
                vnode: VnodeId(u32::from_le_bytes(h[..4].try_into().expect("4 bytes"))),
                segno: u64_at(4),
                first_seq: u64_at(12),
                events,
            }
        });
        let kept = self.header(segno, header, is_last)?;
        self.distinct += if kept { events } else { 0 };
        Ok(kept)
    }

    /// The checks of [`Walk::segment_decoded`] on one segment, without handing its events on:
    /// its number and its new events (duplicates dropped, the others in log order), or `None`
    /// after a torn last segment (skipped).
    fn admit(
        &mut self,
        key: &[u8],
        decoded: Result<segment::Segment, SegmentError>,
        is_last: bool,
    ) -> Result<Option<Admitted>, LogError> {
        let segno = self.open(key)?;
        let (header, events) = match decoded {
            Ok(seg) => {
                let header = Header {
                    vnode: seg.vnode,
                    segno: seg.segno,
                    first_seq: seg.first_seq,
                    events: seg.events.len() as u64,
                };
                (Ok(header), seg.events)
            }
            Err(e) => (Err(e), Vec::new()),
        };
        // A segment that did not decode is an error or a torn tail skipped here.
        if !self.header(segno, header, is_last)? {
            return Ok(None);
        }
        let mut events = events;
        // Duplicates are rare: `retain` moves nothing until it drops one.
        events.retain(|(_, event)| {
            let key = event.key();
            let bits = self.seen.entry(key.0).or_insert(0);
            let bit = kind_bit(key.1);
            let new = *bits & bit == 0;
            *bits |= bit;
            if new {
                self.distinct += 1;
            } else {
                self.duplicates += 1;
                if self.repeats.len() < MAX_REPEATS {
                    self.repeats.push(Repeat {
                        at: self.distinct,
                        segment: segno,
                        key,
                    });
                }
            }
            new
        });
        Ok(Some((segno, events)))
    }

    /// Rule 8: the log reaches its durable watermark, or its tail was lost.
    fn finish(&self) -> Result<(), LogError> {
        let Some(c) = self.covered else {
            return Ok(());
        };
        let read_to = self.last_read;
        let short = read_to.is_none_or(|r| r < c.segno);
        if short || self.next_seq < c.end_seq {
            let there = match read_to {
                Some(r) => format!("the log stops at segment {r}, event {}", self.next_seq),
                None => "no segment is there".to_string(),
            };
            let what = match read_to.map_or(0, |r| r + 1) {
                _ if !short => format!("events {}..{} are missing", self.next_seq, c.end_seq),
                from if from >= c.segno => format!("segment {} is missing", c.segno),
                from => format!("segment {from} to segment {} are missing", c.segno),
            };
            return Err(self.missing(
                Some(c.segno),
                format!(
                    "{what}: the durable watermark says segment {} up to event {} was flushed \
                     ({there})",
                    c.segno, c.end_seq
                ),
            ));
        }
        Ok(())
    }
}

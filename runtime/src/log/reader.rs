//! Reading side of the log (rules 1, 3, 4 and 7 of `log/mod.rs`).

use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use veriflow_checkpoint::Store;

use super::segment::{self, SegmentError};
use super::watermark::{parse_watermark_key, watermark_key, Watermark, WATERMARK_PREFIX};
use super::{Event, EventKey, LogError, Manifest};
use crate::codec::FrameError;
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
    /// A torn last segment, if the writer was cut off mid-write.
    pub torn: Option<TornTail>,
}

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
        let marked: Vec<VnodeId> = self
            .store
            .scan_prefix(&self.key(WATERMARK_PREFIX))?
            .into_iter()
            .map(|(key, _)| {
                let rest = key.get(self.prefix.len()..).unwrap_or_default();
                parse_watermark_key(rest).ok_or_else(|| LogError::Missing {
                    vnode: VnodeId(u32::MAX),
                    segment: None,
                    what: format!("a watermark key is malformed ({rest:02x?})"),
                })
            })
            .collect::<Result<_, _>>()?;
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

    /// The durable watermark of `vnode` (rule 8), if it has one.
    pub fn watermark(&self, vnode: VnodeId) -> Result<Option<Watermark>, LogError> {
        match self.store.get(&self.key(&watermark_key(vnode)))? {
            Some(bytes) => Watermark::decode(vnode, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Reads, checks and de-duplicates the log of `vnode` (rules 1, 4 and 7).
    pub fn read_vnode(&self, vnode: VnodeId) -> Result<VnodeEvents, LogError> {
        let watermark = self.watermark(vnode)?;
        let stored = self
            .store
            .scan_prefix(&self.key(&segment::vnode_prefix(vnode)))?;
        let mut out = VnodeEvents {
            vnode,
            events: Vec::new(),
            segments: stored.len() as u64,
            durable_seq: 0,
            duplicates: 0,
            torn: None,
        };
        let missing = |segment: Option<u64>, what: String| LogError::Missing {
            vnode,
            segment,
            what,
        };
        let covered = match watermark {
            Some(wm) => wm.last,
            // Rule 8: the writer stores a watermark with every segment, and a new run one for
            // every vnode its manifest lists.
            None if !stored.is_empty() => {
                return Err(missing(
                    None,
                    format!(
                        "its durable watermark record is missing ({} segments are there)",
                        stored.len()
                    ),
                ))
            }
            None => match Manifest::load(&*self.store)? {
                Some(m) if vnode.0 < m.vnodes => {
                    return Err(missing(
                        Some(0),
                        format!(
                            "its whole log is missing (no segment and no durable watermark; \
                             the manifest lists {} vnodes)",
                            m.vnodes
                        ),
                    ))
                }
                _ => None,
            },
        };
        // Keys are random ids: no need to hash them again (`ids.rs`).
        let mut seen: HashSet<EventKey, BuildHasherDefault<IdHasher>> = HashSet::default();
        let last = stored.len().saturating_sub(1);
        // Rule 8: the segment number and sequence number the next segment must have.
        let mut prev_segno: Option<u64> = None;
        let mut next_seq = 0u64;
        for (i, (key, value)) in stored.iter().enumerate() {
            let key = key.get(self.prefix.len()..).unwrap_or_default();
            let segno = match segment::parse_segment_key(key) {
                Some((_, s)) => s,
                None => {
                    return Err(LogError::Corrupt {
                        vnode,
                        segment: u64::MAX,
                        offset: 0,
                        reason: format!("malformed segment key {key:02x?}"),
                    })
                }
            };
            let corrupt = |offset: u64, reason: String| LogError::Corrupt {
                vnode,
                segment: segno,
                offset,
                reason,
            };
            match prev_segno {
                Some(p) if segno == p + 1 => {}
                Some(p) if segno > p && segment::starts_epoch(segno) => {}
                None if segment::starts_epoch(segno) => {}
                _ => {
                    let from =
                        prev_segno.map_or(segno & !((1u64 << segment::EPOCH_SHIFT) - 1), |p| p + 1);
                    let there = match prev_segno {
                        Some(p) => format!("segments {p} and {segno} are there"),
                        None => format!("its first segment is {segno}"),
                    };
                    return Err(missing(Some(from), gap_text(from, segno, &there)));
                }
            }
            prev_segno = Some(segno);
            let covered_by_watermark = covered.is_some_and(|c| segno <= c.segno);
            let seg = match segment::decode_segment(value) {
                Ok(s) => s,
                Err(SegmentError::Frame(f))
                    if f.is_torn() && i == last && !covered_by_watermark =>
                {
                    tracing::warn!("log of {vnode}: torn last segment {segno} skipped ({f})");
                    out.torn = Some(TornTail {
                        segment: segno,
                        reason: f,
                    });
                    break;
                }
                Err(SegmentError::Frame(f)) if f.is_torn() && i == last => {
                    return Err(corrupt(
                        0,
                        format!(
                            "{f}, though the durable watermark (segment {}) says it was \
                             flushed whole (rule 8)",
                            covered.map_or(0, |c| c.segno)
                        ),
                    ))
                }
                Err(SegmentError::Frame(f)) => return Err(corrupt(0, f.to_string())),
                Err(SegmentError::Content { offset, reason }) => {
                    return Err(corrupt(offset, reason))
                }
            };
            if seg.vnode != vnode || seg.segno != segno {
                return Err(corrupt(
                    0,
                    format!("segment says it is {} segment {}", seg.vnode, seg.segno),
                ));
            }
            // Rule 8: a first_seq below the expected one is a zombie's overlap (duplicates); above
            // it, events are missing.
            if seg.first_seq > next_seq {
                return Err(missing(
                    Some(segno),
                    format!(
                        "events {next_seq}..{} are missing before segment {segno} (a segment \
                         before it was lost)",
                        seg.first_seq
                    ),
                ));
            }
            let end = seg.first_seq + seg.events.len() as u64;
            next_seq = next_seq.max(end);
            out.durable_seq = out.durable_seq.max(end);
            out.events.reserve(seg.events.len());
            seen.reserve(seg.events.len());
            for (offset, event) in seg.events {
                if seen.insert(event.key()) {
                    out.events.push(LoggedEvent {
                        segment: segno,
                        offset,
                        event,
                    });
                } else {
                    out.duplicates += 1;
                }
            }
        }
        // Rule 8: the log reaches its durable watermark, or its tail was lost.
        if let Some(c) = covered {
            let read_to = if out.torn.is_some() {
                stored.len().checked_sub(2)
            } else {
                stored.len().checked_sub(1)
            }
            .and_then(|i| stored.get(i))
            .and_then(|(k, _)| segment::parse_segment_key(k.get(self.prefix.len()..)?))
            .map(|(_, s)| s);
            let short = read_to.map_or(true, |r| r < c.segno);
            if short || next_seq < c.end_seq {
                let there = match read_to {
                    Some(r) => format!("the log stops at segment {r}, event {next_seq}"),
                    None => "no segment is there".to_string(),
                };
                let what = match read_to.map_or(0, |r| r + 1) {
                    _ if !short => format!("events {next_seq}..{} are missing", c.end_seq),
                    from if from >= c.segno => format!("segment {} is missing", c.segno),
                    from => format!("segment {from} to segment {} are missing", c.segno),
                };
                return Err(missing(
                    Some(c.segno),
                    format!(
                        "{what}: the durable watermark says segment {} up to event {} was \
                         flushed ({there})",
                        c.segno, c.end_seq
                    ),
                ));
            }
        }
        Ok(out)
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

/// "segment 5 is missing" or "segments 5..9 are missing", then `(there)`.
fn gap_text(from: u64, to: u64, there: &str) -> String {
    if to <= from + 1 {
        format!("segment {from} is missing ({there})")
    } else {
        format!("segment {from} to segment {} are missing ({there})", to - 1)
    }
}

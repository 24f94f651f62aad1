//! Reading side of the log (rules 1, 3 and 4 of `log/mod.rs`).

use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use veriflow_checkpoint::Store;

use super::segment::{self, SegmentError};
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

    /// The vnodes that have at least one segment.
    pub fn vnodes(&self) -> Result<Vec<VnodeId>, LogError> {
        let mut out: Vec<VnodeId> = Vec::new();
        for (key, _) in self.store.scan_prefix(&self.key(b"seg/"))? {
            let key = key.get(self.prefix.len()..).unwrap_or_default();
            if let Some((v, _)) = segment::parse_segment_key(key) {
                if out.last() != Some(&v) {
                    out.push(v);
                }
            }
        }
        Ok(out)
    }

    /// Reads, checks and de-duplicates the log of `vnode` (rules 1 and 4).
    pub fn read_vnode(&self, vnode: VnodeId) -> Result<VnodeEvents, LogError> {
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
        // Keys are random ids: no need to hash them again (`ids.rs`).
        let mut seen: HashSet<EventKey, BuildHasherDefault<IdHasher>> = HashSet::default();
        let last = stored.len().saturating_sub(1);
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
            let seg = match segment::decode_segment(value) {
                Ok(s) => s,
                Err(SegmentError::Frame(f)) if f.is_torn() && i == last => {
                    tracing::warn!("log of {vnode}: torn last segment {segno} skipped ({f})");
                    out.torn = Some(TornTail {
                        segment: segno,
                        reason: f,
                    });
                    break;
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
            out.durable_seq = out.durable_seq.max(seg.first_seq + seg.events.len() as u64);
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

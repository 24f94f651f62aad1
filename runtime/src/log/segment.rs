//! Segments: one group-commit batch of events, stored as one framed record (rule 3 of
//! `log/mod.rs`).
//!
//! Payload layout: `vnode (u32 LE) | segment number (u64 LE) | first event sequence (u64 LE) |
//! event count (u32 LE)` then, per event, `length (u32 LE) | postcard(Event)`.

use crate::codec::{self, Digest, FrameError, HEADER_LEN};
use crate::ids::VnodeId;
use crate::log::event::{Declared, Event, Output, Payload};
use crate::log::values::STORED_FROM;

/// Magic of a segment frame.
pub const SEGMENT_MAGIC: [u8; 4] = *b"VFSG";
/// Bytes of the segment header inside the payload.
pub const SEGMENT_HEADER_LEN: usize = 4 + 8 + 8 + 4;
/// Largest segment a reader accepts (checked before allocation). One event may be big (a task
/// output of many MiB); 1 GiB leaves room for that while refusing absurd headers.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;
/// Largest single event a writer accepts.
pub const MAX_EVENT_BYTES: usize = 512 << 20;

/// A cluster incarnation at epoch e numbers its segments from `e << EPOCH_SHIFT`
/// (`LogWriter::vnode_log_at`), so a zombie of an older one never overwrites them; a reader
/// accepts that jump in the numbering (rule 8 of `log/mod.rs`). 2^40 segments of an epoch are
/// more than any run writes.
pub const EPOCH_SHIFT: u32 = 40;

/// Whether `segno` is the first segment number of an epoch (rule 8 of `log/mod.rs`).
pub fn starts_epoch(segno: u64) -> bool {
    segno & ((1u64 << EPOCH_SHIFT) - 1) == 0
}

/// Store key of segment `segno` of `vnode`: sorts by vnode then number.
pub fn segment_key(vnode: VnodeId, segno: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + 4 + 8);
    k.extend_from_slice(b"seg/");
    k.extend_from_slice(&vnode.0.to_be_bytes());
    k.extend_from_slice(&segno.to_be_bytes());
    k
}

/// Store key prefix of `vnode`'s segments.
pub fn vnode_prefix(vnode: VnodeId) -> Vec<u8> {
    let mut k = b"seg/".to_vec();
    k.extend_from_slice(&vnode.0.to_be_bytes());
    k
}

/// Store key prefix of a log generation: empty for generation 0 (the run's own log), `gen/<g>/`
/// for the generations the certifier writes when it corrects forged tasks.
pub fn generation_prefix(generation: u32) -> Vec<u8> {
    if generation == 0 {
        return Vec::new();
    }
    let mut k = b"gen/".to_vec();
    k.extend_from_slice(&generation.to_be_bytes());
    k.push(b'/');
    k
}

/// Splits a segment key back into (vnode, segment number).
pub fn parse_segment_key(key: &[u8]) -> Option<(VnodeId, u64)> {
    let rest = key.strip_prefix(b"seg/")?;
    if rest.len() != 12 {
        return None;
    }
    let v = u32::from_be_bytes(rest[..4].try_into().ok()?);
    let s = u64::from_be_bytes(rest[4..].try_into().ok()?);
    Some((VnodeId(v), s))
}

/// Large values a segment names (rule 10 of `log/mod.rs`): (digest, bytes), to be stored
/// under their digest before the segment.
pub type SegmentValues = Vec<(Digest, Vec<u8>)>;

/// A segment being filled: the frame header and segment header are reserved at the front, so
/// sealing writes them in place (no copy of the body).
#[derive(Debug)]
pub struct SegmentBuilder {
    buf: Vec<u8>,
    count: u32,
    /// Values of at least this many bytes go out of line (rule 10 of `log/mod.rs`).
    stored_from: usize,
    /// The values that went out of line, for the value store.
    values: SegmentValues,
    /// Bytes of `values`.
    value_bytes: usize,
}

impl SegmentBuilder {
    /// An empty segment with room for `capacity` bytes of events, storing values of
    /// [`STORED_FROM`] bytes or more out of line.
    pub fn new(capacity: usize) -> Self {
        Self::storing_from(capacity, STORED_FROM)
    }

    /// An empty segment storing values of `stored_from` bytes or more out of line
    /// (`usize::MAX`: none).
    pub fn storing_from(capacity: usize, stored_from: usize) -> Self {
        let mut buf = Vec::with_capacity(HEADER_LEN + SEGMENT_HEADER_LEN + capacity);
        buf.resize(HEADER_LEN + SEGMENT_HEADER_LEN, 0);
        Self {
            buf,
            count: 0,
            stored_from,
            values: Vec::new(),
            value_bytes: 0,
        }
    }

    /// Appends one event; its large values go to the segment's value list (rule 10 of
    /// `log/mod.rs`), and the event names them.
    pub fn push(&mut self, event: &Event) -> Result<(), codec::CodecError> {
        self.push_with(|buf, stored_from, values| {
            // The task path's events byte for byte as postcard, faster (`encode.rs`).
            if !super::encode::encode_event(event, buf, stored_from, values) {
                let outlined = outline(event, stored_from, values);
                codec::encode_into(outlined.as_ref().unwrap_or(event), buf)?;
            }
            Ok(())
        })
    }

    /// Appends `Event::Declared` of `d`'s fields (`encode.rs` rule 4), as [`SegmentBuilder::push`]
    /// of that event; `true` when its arguments went out of line.
    pub(crate) fn push_declared(
        &mut self,
        d: &super::encode::DeclaredRef<'_>,
    ) -> Result<bool, codec::CodecError> {
        let before = self.values.len();
        self.push_with(|buf, stored_from, values| {
            super::encode::encode_declared(buf, d, stored_from, values);
            Ok(())
        })?;
        Ok(self.values.len() > before)
    }

    /// [`SegmentBuilder::push`] of an event whose large values its caller took out already
    /// (their payloads are [`Payload::Stored`]): `values` are their bytes, moved in, not copied.
    pub fn push_outlined(
        &mut self,
        event: &Event,
        values: SegmentValues,
    ) -> Result<(), codec::CodecError> {
        self.push(event)?;
        self.value_bytes += values.iter().map(|(_, b)| b.len()).sum::<usize>();
        self.values.extend(values);
        Ok(())
    }

    /// Appends one event that `encode` writes (its large values to the list it is given).
    fn push_with(
        &mut self,
        encode: impl FnOnce(&mut Vec<u8>, usize, &mut SegmentValues) -> Result<(), codec::CodecError>,
    ) -> Result<(), codec::CodecError> {
        let at = self.buf.len();
        let values_before = self.values.len();
        self.buf.extend_from_slice(&[0; 4]);
        if let Err(e) = encode(&mut self.buf, self.stored_from, &mut self.values) {
            self.buf.truncate(at);
            self.values.truncate(values_before);
            return Err(e);
        }
        let len = self.buf.len() - at - 4;
        if len > MAX_EVENT_BYTES {
            self.buf.truncate(at);
            self.values.truncate(values_before);
            return Err(codec::CodecError::from(
                postcard::Error::SerializeBufferFull,
            ));
        }
        self.value_bytes += self.values[values_before..]
            .iter()
            .map(|(_, b)| b.len())
            .sum::<usize>();
        // `len` is below MAX_EVENT_BYTES, so it fits.
        self.buf[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        self.count += 1;
        Ok(())
    }

    /// Events so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes of events so far.
    pub fn body_len(&self) -> usize {
        self.buf.len() - HEADER_LEN - SEGMENT_HEADER_LEN
    }

    /// Bytes of the values that went out of line so far.
    pub fn value_bytes(&self) -> usize {
        self.value_bytes
    }

    /// Writes both headers and returns the framed bytes and the values it names (rule 10 of
    /// `log/mod.rs`), which must be stored before it.
    pub fn seal_with_values(
        mut self,
        vnode: VnodeId,
        segno: u64,
        first_seq: u64,
    ) -> (Vec<u8>, SegmentValues) {
        let values = std::mem::take(&mut self.values);
        (self.seal(vnode, segno, first_seq), values)
    }

    /// Writes both headers and returns the framed bytes (a caller that stores values out of
    /// line takes them with [`SegmentBuilder::seal_with_values`] instead).
    pub fn seal(mut self, vnode: VnodeId, segno: u64, first_seq: u64) -> Vec<u8> {
        debug_assert!(
            self.values.is_empty(),
            "a segment naming stored values is sealed with seal_with_values"
        );
        let h = HEADER_LEN;
        self.buf[h..h + 4].copy_from_slice(&vnode.0.to_le_bytes());
        self.buf[h + 4..h + 12].copy_from_slice(&segno.to_le_bytes());
        self.buf[h + 12..h + 20].copy_from_slice(&first_seq.to_le_bytes());
        self.buf[h + 20..h + 24].copy_from_slice(&self.count.to_le_bytes());
        codec::seal_frame(SEGMENT_MAGIC, &mut self.buf);
        self.buf
    }
}

/// `event` with its inline values of `from` bytes or more replaced by references, the values
/// pushed to `values`; `None` when it has none (rule 10 of `log/mod.rs`). For the events
/// `encode.rs` leaves to postcard (off the task path: steals, returns, program inputs).
fn outline(event: &Event, from: usize, values: &mut SegmentValues) -> Option<Event> {
    let large = |p: &Payload| p.inline().is_some_and(|b| b.len() >= from);
    let mut put = |p: &Payload, digest: Option<Digest>| -> Payload {
        match p {
            Payload::Inline(b) if b.len() >= from => {
                let digest = digest.unwrap_or_else(|| Digest::of(b));
                values.push((digest, b.clone()));
                Payload::Stored {
                    digest,
                    len: b.len() as u64,
                }
            }
            other => other.clone(),
        }
    };
    let output = |o: &Output, put: &mut dyn FnMut(&Payload, Option<Digest>) -> Payload| Output {
        data: o.data,
        value: put(&o.value, Some(o.digest)),
        digest: o.digest,
    };
    match event {
        Event::Adopted {
            victim,
            record,
            inputs,
        } if inputs.iter().any(large) || large(&record.args) => Some(Event::Adopted {
            victim: *victim,
            record: Declared {
                args: put(&record.args, None),
                ..record.clone()
            },
            inputs: inputs.iter().map(|p| put(p, None)).collect(),
        }),
        Event::Returned { output: o } if large(&o.value) => Some(Event::Returned {
            output: output(o, &mut put),
        }),
        Event::Input { output: o } if large(&o.value) => Some(Event::Input {
            output: output(o, &mut put),
        }),
        Event::Completed {
            task,
            outputs,
            children,
        } if outputs.iter().any(|o| large(&o.value)) => Some(Event::Completed {
            task: *task,
            outputs: outputs.iter().map(|o| output(o, &mut put)).collect(),
            children: children.clone(),
        }),
        _ => None,
    }
}

/// A decoded segment.
#[derive(Debug)]
pub struct Segment {
    /// Vnode recorded in the header.
    pub vnode: VnodeId,
    /// Segment number recorded in the header.
    pub segno: u64,
    /// Sequence number of its first event.
    pub first_seq: u64,
    /// Its events with their byte offsets inside the stored value.
    pub events: Vec<(u32, Event)>,
}

/// What is wrong with a stored segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentError {
    /// The frame failed (torn, corrupt, wrong magic or version).
    Frame(FrameError),
    /// The frame is sound but its content does not decode, at this byte offset.
    Content {
        /// Byte offset inside the stored value.
        offset: u64,
        /// What failed.
        reason: String,
    },
}

/// Decodes a stored segment value.
pub fn decode_segment(bytes: &[u8]) -> Result<Segment, SegmentError> {
    let opened = open_segment(bytes)?;
    // Every event takes at least its 4-byte length: a damaged count reserves no more than the
    // payload can hold (found by `cargo fuzz run segment`: 13.6 MB for a 68-byte segment).
    let room = (opened.payload.len() - SEGMENT_HEADER_LEN) / 4;
    let mut events = Vec::with_capacity((opened.count as usize).min(room));
    walk_segment(&opened, |at, encoded| {
        // The task path's events by hand, anything else by postcard (`decode.rs` rule 1).
        let ev: Event = match super::decode::decode_event(encoded) {
            Some(ev) => ev,
            None => codec::decode(encoded).map_err(|e| e.to_string())?,
        };
        events.push(((HEADER_LEN + at) as u32, ev));
        Ok(())
    })?;
    Ok(Segment {
        vnode: opened.vnode,
        segno: opened.segno,
        first_seq: opened.first_seq,
        events,
    })
}

/// Checks a stored segment value as [`decode_segment`] does and hands `each` every event's
/// encoding in order, undecoded (the log writer folds them with
/// [`crate::log::LogState::fold_encoded`], which decodes only what recovery keeps).
pub fn for_each_encoded_event<'a>(
    bytes: &'a [u8],
    mut each: impl FnMut(&'a [u8]) -> Result<(), String>,
) -> Result<(), SegmentError> {
    walk_segment(&open_segment(bytes)?, |_, encoded| each(encoded))
}

/// [`for_each_encoded_event`] of a segment this process sealed ([`SegmentBuilder::seal`]) and
/// kept in memory since: its layout is checked the same way, but its frame's digest is not
/// computed again (the log writer's fold walks every segment it stored; hashing each again
/// was some 5 % of its CPU).
pub(crate) fn for_each_sealed_event<'a>(
    bytes: &'a [u8],
    mut each: impl FnMut(&'a [u8]) -> Result<(), String>,
) -> Result<(), SegmentError> {
    if bytes.len() < HEADER_LEN + SEGMENT_HEADER_LEN || bytes[..4] != SEGMENT_MAGIC {
        // Not one of ours as sealed: the full check names what is wrong.
        return for_each_encoded_event(bytes, each);
    }
    walk_segment(&header(&bytes[HEADER_LEN..]), |_, encoded| each(encoded))
}

/// A segment whose frame and header were checked.
struct Opened<'a> {
    payload: &'a [u8],
    vnode: VnodeId,
    segno: u64,
    first_seq: u64,
    count: u32,
}

fn content_error(offset: usize, reason: String) -> SegmentError {
    SegmentError::Content {
        offset: (HEADER_LEN + offset) as u64,
        reason,
    }
}

fn open_segment(bytes: &[u8]) -> Result<Opened<'_>, SegmentError> {
    let payload =
        codec::unframe(SEGMENT_MAGIC, bytes, MAX_SEGMENT_BYTES).map_err(SegmentError::Frame)?;
    if payload.len() < SEGMENT_HEADER_LEN {
        return Err(content_error(0, "segment header missing".to_string()));
    }
    Ok(header(payload))
}

/// The segment header at the front of `payload` (at least [`SEGMENT_HEADER_LEN`] bytes).
fn header(payload: &[u8]) -> Opened<'_> {
    let u32_at = |p: usize| u32::from_le_bytes(payload[p..p + 4].try_into().expect("4 bytes"));
    let u64_at = |p: usize| u64::from_le_bytes(payload[p..p + 8].try_into().expect("8 bytes"));
    Opened {
        payload,
        vnode: VnodeId(u32_at(0)),
        segno: u64_at(4),
        first_seq: u64_at(12),
        count: u32_at(20),
    }
}

/// Hands `each` every event's offset in the payload and its bytes, checking the layout.
fn walk_segment<'a>(
    opened: &Opened<'a>,
    mut each: impl FnMut(usize, &'a [u8]) -> Result<(), String>,
) -> Result<(), SegmentError> {
    let (payload, count) = (opened.payload, opened.count);
    let mut at = SEGMENT_HEADER_LEN;
    for i in 0..count {
        if at + 4 > payload.len() {
            return Err(content_error(
                at,
                format!("event {i} of {count}: length missing"),
            ));
        }
        let len = u32::from_le_bytes(payload[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len > payload.len() - at - 4 {
            return Err(content_error(
                at,
                format!("event {i} of {count}: length {len} overruns"),
            ));
        }
        each(at, &payload[at + 4..at + 4 + len])
            .map_err(|e| content_error(at, format!("event {i} of {count} does not decode: {e}")))?;
        at += 4 + len;
    }
    if at != payload.len() {
        return Err(content_error(
            at,
            format!("{} bytes after the last event", payload.len() - at),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TaskId;

    fn sealed() -> Vec<u8> {
        let mut b = SegmentBuilder::new(1024);
        for t in 0..5 {
            b.push(&Event::Started {
                task: TaskId(t),
                inputs: vec![],
            })
            .unwrap();
        }
        b.seal(VnodeId(3), 7, 11)
    }

    /// A walk over a segment's events ([`for_each_encoded_event`] or [`for_each_sealed_event`]).
    type Walker =
        fn(&[u8], &mut dyn FnMut(&[u8]) -> Result<(), String>) -> Result<(), SegmentError>;

    fn walk(bytes: &[u8], f: Walker) -> Result<Vec<Vec<u8>>, SegmentError> {
        let mut out = Vec::new();
        f(bytes, &mut |e| {
            out.push(e.to_vec());
            Ok(())
        })?;
        Ok(out)
    }

    fn checked(
        b: &[u8],
        e: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<(), SegmentError> {
        for_each_encoded_event(b, e)
    }

    fn unhashed(
        b: &[u8],
        e: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<(), SegmentError> {
        for_each_sealed_event(b, e)
    }

    /// A sealed segment walks to the same events without its digest computed again; its
    /// layout is still checked, and what is not a sealed segment gets the full check.
    #[test]
    fn a_sealed_segment_is_walked_without_hashing_it_again() {
        let bytes = sealed();
        let events = walk(&bytes, checked).unwrap();
        assert_eq!(events.len(), 5);
        assert_eq!(walk(&bytes, unhashed).unwrap(), events);
        // A byte of the last event's id changed: the digest no longer matches, the layout does.
        let mut changed = bytes.clone();
        let last = changed.len() - 2;
        changed[last] ^= 1;
        assert!(matches!(
            walk(&changed, checked),
            Err(SegmentError::Frame(_))
        ));
        assert_eq!(walk(&changed, unhashed).unwrap().len(), 5);
        // A length that overruns, a cut segment, and bytes that are no segment: refused.
        let mut overrun = bytes.clone();
        overrun[HEADER_LEN + SEGMENT_HEADER_LEN] = 0xff;
        assert!(matches!(
            walk(&overrun, unhashed),
            Err(SegmentError::Content { .. })
        ));
        assert!(walk(&bytes[..bytes.len() - 3], unhashed).is_err());
        assert!(walk(&[1, 2, 3], unhashed).is_err());
    }
}

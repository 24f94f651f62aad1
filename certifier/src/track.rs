//! The execution track: G rebuilt from every vnode's log, the terminal subgraph G_S, the
//! structural check and the Merkle root that ties a certificate to a log.
//!
//! Rules:
//!
//! 1. Loading is linear in the number of events, and columnar. Each vnode's log is read in
//!    place (`LogReader::walk_encoded`, the vnodes in parallel) into a *part*: flat columns of
//!    ids, digests, outputs and value bytes, with no allocation per task. Every task then
//!    gets one dense index, its rank among the sorted task ids (no hash map). Every id a part
//!    names (an event's task or datum, a record's data and parent, a completion's outputs
//!    and children) is then resolved to its index once, in parallel, so that applying the
//!    events, G_S and the structural check look up no id (an id not found then, or named
//!    after, is looked up when used). The events
//!    are applied in log order, vnode after vnode, as a reader of every log one by one would
//!    apply them: a task's record comes from `Declared` (or the `Adopted` copy, which must be
//!    equal), its reads from `Started`, its writes and children from `Completed`; an event a
//!    vnode logged twice counts once. Two logs that disagree about one task or one datum are
//!    a [`Conflict`], never silently merged. A track grown one event at a time while a run
//!    goes on ([`Track::live`], [`Track::absorb`]) has the same columns, with indexes in the
//!    order tasks were met and a hash index of ids.
//! 2. G_S is the set of ancestors of the chosen terminal outputs S: the writer of each datum,
//!    and for each task the writers of its inputs *and its parent* (a task's record is its
//!    parent's output: a lying parent can declare a wrong child). One backward pass, linear.
//! 3. The structural check looks at every task of G_S: declared, started and completed; every
//!    input digest a consumer (or a thief, for the values it adopted) logged equals the digest
//!    its producer logged; every value returned to a victim equals its writer's; every child it
//!    declared has a record naming it as parent; each task wrote only its own outputs. Each
//!    failure names the task, the datum and the vnodes involved.
//! 4. A task's *leaf* hashes its id, name, argument digest, input ids with the digests it read,
//!    output ids with the digests it wrote, and its children. The Merkle root of G_S is over the
//!    leaves of G_S sorted by task id; the log digest is the root over all tasks of G. Both are
//!    independent of how events were spread over segments and vnodes. (The context keys of the
//!    leaf and node hashers are derived once, and a leaf's fields are laid out in one buffer
//!    hashed in one call: the same bytes as deriving the key for every leaf and node and
//!    hashing field by field. Leaves are computed in batches of tasks, each batch's fields
//!    gathered before any is hashed, so that the reads of many tasks are in flight at once.)
//! 5. A written value is kept once, in its part's columns as its writer's `Completed` logged
//!    it; a datum's columns hold its writer, the digest of its value, a program input's value
//!    and the copies returned to victims. [`Track::value`] is a datum's logged value: its
//!    writer's (the first output naming it), else the program input's. Records, outputs and
//!    children are handed out as views built on demand ([`Track::task`], [`Track::record`]).
//! 6. A loaded track holds little per task (its peak memory against the store's size, issue 17
//!    target 1): a record keeps no copy of its task's id (the track's id of the index it is
//!    applied to) and its parent's id as two words and a flag (64 bytes, not 96); an event's
//!    kind is a column of its own beside its id and place (25 bytes, not 32). The sorted
//!    distinct ids are made by a counting sort on the ids' top bits (they are random), then
//!    each bucket sorted and made distinct: the one list of every event's id it holds (16
//!    bytes an event) is freed before the track's columns are made.
//! 7. What a task's events set (its record, the parts that declared it and ran it, the
//!    digests it read, what it wrote, its children, and while loading the kinds of event the
//!    vnode being applied logged of it) is one 64-byte row, one cache line, rather than a
//!    column each: applying an event misses the cache once, not once a column. The parts
//!    that declared and ran it stand for their vnodes (a part is a vnode's log), so that no
//!    vnode id, the oracle's included, needs to stand for "none". A datum's writer and
//!    digest are side by side too.
//! 8. **Fetched ahead.** The linear passes over a loaded track (resolving ids, applying the
//!    events, G_S, the structural check, the leaves) read, for each item, a few places chosen
//!    by the item (a task's row, its record, the datums it read, its children's rows), each a
//!    cache miss in a track larger than the cache, and each known only once the one before
//!    was read. So every such pass is a software pipeline: while item `i` is worked on, the
//!    places of item `i + d` are asked for (`prefetch`: a hint that reads nothing), one
//!    level of indirection a stage, the farthest stage first (`FOUR_STAGES`,
//!    `TWO_STAGES`; G_S, a depth-first walk, fetches for the tasks a few places down its
//!    stack). The misses of several items then overlap instead of following each other. What
//!    a pass computes is unchanged (the certificates of `certify_pinned` are byte-identical).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use blake3::hazmat::{hash_derive_key_context, ContextKey, HasherExt};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use veriflow_checkpoint::Store;
use veriflow_runtime::log::{
    view_event, Declared, Event, EventKind as Kind, EventView, LogError, LogReader, Manifest,
    Output, Payload, PayloadView, StreamedVnode, TornTail,
};
use veriflow_runtime::{DataId, Digest, IdMap, TaskId, VnodeId};

/// Index of a task in a [`Track`].
pub type Ix = u32;

/// No index, no part.
const NONE: u32 = u32::MAX;

/// Rule 8: how many items ahead of the one worked on each stage of a pass's prefetch runs,
/// farthest first: the structural check's four ([`Track::prefetch_check`]), and the two of
/// applying events and of the leaves.
const FOUR_STAGES: [usize; 4] = [16, 12, 8, 4];
const TWO_STAGES: [usize; 2] = [8, 4];

/// Rule 8: [`prefetch`] of `items[i]`, if there is one.
#[inline(always)]
fn prefetch_at<T>(items: &[T], i: usize) {
    if let Some(x) = items.get(i) {
        prefetch(x);
    }
}

/// Rule 8: [`prefetch`] of the first of `items`, if any.
#[inline(always)]
fn prefetch_first<T>(items: &[T]) {
    if let Some(x) = items.first() {
        prefetch(x);
    }
}

/// Rule 8: asks the CPU to bring `x`'s cache line in (a hint: it reads nothing, and where
/// there is no such instruction it does nothing).
#[inline(always)]
fn prefetch<T>(x: &T) {
    // SAFETY: SSE is part of every x86_64 CPU, and a prefetch reads no memory (an address
    // that is not mapped is ignored); `x` is a valid reference anyway.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// One task of G, merged from every log that mentions it (rule 1): a view of the track's
/// columns built by [`Track::task`].
#[derive(Clone, Debug, Default)]
pub struct TaskRec {
    /// Its id.
    pub id: TaskId,
    /// Its record (from `Declared` or `Adopted`), `None` if no log declared it.
    pub record: Option<Declared>,
    /// The vnode whose log declared it.
    pub declared_on: Option<VnodeId>,
    /// The vnode whose log holds its `Started`/`Completed` (where it ran).
    pub ran_on: Option<VnodeId>,
    /// Digests of the inputs it read (`Started`).
    pub started: Option<Vec<Digest>>,
    /// The values it wrote itself (`Completed`), as logged; `None` if not completed.
    pub wrote: Option<Vec<Output>>,
    /// Children it declared (`Completed`), in spawn order.
    pub children: Vec<TaskId>,
    /// Input digests of the values its thief adopted with it (`Adopted`), and the thief.
    pub adopted: Option<(VnodeId, Vec<Digest>)>,
}

/// One data object of G: a view of the track's columns built by [`Track::data`].
#[derive(Clone, Debug, Default)]
pub struct DataRec {
    /// The task that wrote it (`None` for a program input or a datum never written).
    pub writer: Option<Ix>,
    /// The digest of its logged value ([`Track::value`]): its writer's, else the program
    /// input's.
    pub digest: Option<Digest>,
    /// A program input's logged value and digest (the `Input` event).
    pub input: Option<(Payload, Digest)>,
    /// Copies returned to victims: (victim vnode, digest).
    pub returned: Vec<(VnodeId, Digest)>,
}

/// Two logs disagree (rule 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// The task (or the writer of the datum) concerned.
    pub task: String,
    /// What disagrees.
    pub what: String,
}

/// A structural failure in G_S (rule 3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StructuralError {
    /// The task at fault or being checked.
    pub task: String,
    /// Its registered name, if known.
    pub name: Option<String>,
    /// The vnode that logged it.
    pub vnode: Option<u32>,
    /// The edge (datum) concerned, if any.
    pub data: Option<String>,
    /// What is wrong.
    pub message: String,
}

/// The store a track's large values are read from (rule 10 of the runtime's `log/mod.rs`).
#[derive(Clone)]
pub struct ValueSource(pub Arc<dyn Store>);

impl std::fmt::Debug for ValueSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ValueSource({})", self.0.describe())
    }
}

/// A run of items in one part's flat column; `part` [`NONE`]: absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    part: u32,
    start: u32,
    len: u32,
}

impl Span {
    const ABSENT: Span = Span {
        part: NONE,
        start: 0,
        len: 0,
    };

    fn is_some(self) -> bool {
        self.part != NONE
    }

    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// Where a logged value is, in its part: `len` bytes of the part's bytes from `start`, or
/// (`len` [`NONE`]) the value-store reference at `start` in the part's stored references.
#[derive(Clone, Copy, Debug)]
struct Val {
    start: u64,
    len: u32,
}

/// A record (`Declared` or `Adopted`), in its part's columns. Its task's id is the id of the
/// task it is the record of (the track's `ids`), not kept again; its parent's id is two words
/// and a flag rather than an `Option<u128>` (64 bytes a record, not 96: rule 6).
#[derive(Clone, Copy, Debug)]
struct Rec {
    parent: [u64; 2],
    has_parent: bool,
    index: u32,
    name: u32,
    args: Val,
    /// Inputs then outputs, in the part's ids.
    ids: u32,
    inputs: u32,
    outputs: u32,
    /// The parent's index, resolved at load ([`NONE`]: look it up).
    parent_ix: u32,
}

impl Rec {
    fn parent(&self) -> Option<u128> {
        self.has_parent
            .then(|| (u128::from(self.parent[0]) << 64) | u128::from(self.parent[1]))
    }
}

/// A written value, in its part's columns.
#[derive(Clone, Copy, Debug)]
struct Out {
    data: u128,
    digest: Digest,
    value: Val,
}

/// The bit of `kind` in the kinds of events a vnode logged of one id (rule 1: each counts
/// once).
fn bit(kind: Kind) -> u8 {
    1 << kind as u8
}

/// One event of a part, in log order: its id (a task's, or a datum's for `Returned` and
/// `Input`) and where its content is in the part's list of its kind (the kind is in a column
/// of its own, [`Part::kinds`]: 24 + 1 bytes an event rather than 32, rule 6).
#[derive(Clone, Copy, Debug)]
struct Ev {
    id: [u64; 2],
    at: u32,
    /// The index of `id` (a task's, or a datum's), resolved at load ([`NONE`]: look it up).
    ix: u32,
}

impl Ev {
    fn new(id: u128, at: u32) -> Ev {
        Ev {
            id: [(id >> 64) as u64, id as u64],
            at,
            ix: NONE,
        }
    }

    fn id(&self) -> u128 {
        (u128::from(self.id[0]) << 64) | u128::from(self.id[1])
    }
}

/// What one vnode's log holds, in flat columns (rule 1).
#[derive(Debug, Default)]
struct Part {
    vnode: VnodeId,
    /// Inline values and arguments.
    bytes: Vec<u8>,
    /// Value-store references.
    stored: Vec<(Digest, u64)>,
    /// Task names, each once.
    names: Vec<Box<str>>,
    name_ix: HashMap<Box<str>, u32>,
    /// Data ids of records (inputs then outputs).
    ids: Vec<u128>,
    /// Children's task ids.
    kids: Vec<u128>,
    /// Indexes resolved at load (rule 1), each empty or as long as its column: the data
    /// index of each of `ids`, the task index of each of `kids`, the data index of each of
    /// `outs` ([`NONE`]: not found then, look it up).
    ids_ix: Vec<u32>,
    kids_ix: Vec<u32>,
    outs_ix: Vec<u32>,
    /// Digests read (`Started`) and adopted (`Adopted`).
    digests: Vec<Digest>,
    outs: Vec<Out>,
    records: Vec<Rec>,
    /// `Started`: its digests.
    starts: Vec<(u32, u32)>,
    /// `Completed`: its outputs (in `outs`) and children (in `ids`).
    completions: Vec<[u32; 4]>,
    /// `Adopted`: its record, its thief's digests.
    adoptions: Vec<(u32, u32, u32)>,
    /// `Returned`: digest.
    returns: Vec<Digest>,
    /// `Input`: value and digest.
    inputs: Vec<(Val, Digest)>,
    /// Its events in log order (while loading), and their kinds.
    events: Vec<Ev>,
    kinds: Vec<Kind>,
}

impl Part {
    fn new(vnode: VnodeId) -> Part {
        Part {
            vnode,
            ..Part::default()
        }
    }

    fn val(&mut self, p: PayloadView<'_>) -> Val {
        match p {
            PayloadView::Inline(b) => {
                let start = self.bytes.len() as u64;
                self.bytes.extend_from_slice(b);
                Val {
                    start,
                    len: b.len() as u32,
                }
            }
            PayloadView::Stored { digest, len } => {
                self.stored.push((digest, len));
                Val {
                    start: self.stored.len() as u64 - 1,
                    len: NONE,
                }
            }
        }
    }

    fn payload(&self, v: Val) -> PayloadView<'_> {
        match v.len {
            NONE => {
                let (digest, len) = self.stored[v.start as usize];
                PayloadView::Stored { digest, len }
            }
            n => PayloadView::Inline(&self.bytes[v.start as usize..v.start as usize + n as usize]),
        }
    }

    fn name(&mut self, name: &str) -> u32 {
        // A program has few task names: the first ones are compared before any is hashed.
        if let Some(i) = self.names.iter().take(4).position(|n| **n == *name) {
            return i as u32;
        }
        if let Some(&i) = self.name_ix.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.into());
        self.name_ix.insert(name.into(), i);
        i
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        parent: Option<TaskId>,
        index: u32,
        name: &str,
        args: PayloadView<'_>,
        inputs: impl Iterator<Item = u128>,
        outputs: impl Iterator<Item = u128>,
    ) -> u32 {
        let ids = self.ids.len() as u32;
        self.ids.extend(inputs);
        let n_in = self.ids.len() as u32 - ids;
        self.ids.extend(outputs);
        let n_out = self.ids.len() as u32 - ids - n_in;
        let p = parent.map_or(0, |p| p.0);
        let rec = Rec {
            parent: [(p >> 64) as u64, p as u64],
            has_parent: parent.is_some(),
            index,
            name: self.name(name),
            args: self.val(args),
            ids,
            inputs: n_in,
            outputs: n_out,
            parent_ix: NONE,
        };
        self.records.push(rec);
        self.records.len() as u32 - 1
    }

    fn digests(&mut self, d: impl Iterator<Item = Digest>) -> (u32, u32) {
        let start = self.digests.len() as u32;
        self.digests.extend(d);
        (start, self.digests.len() as u32 - start)
    }

    fn completion<'a>(
        &mut self,
        outputs: impl Iterator<Item = (DataId, PayloadView<'a>, Digest)>,
        children: impl Iterator<Item = u128>,
    ) -> u32 {
        let outs = self.outs.len() as u32;
        for (data, value, digest) in outputs {
            let value = self.val(value);
            self.outs.push(Out {
                data: data.0,
                digest,
                value,
            });
        }
        let kids = self.kids.len() as u32;
        self.kids.extend(children);
        self.completions.push([
            outs,
            self.outs.len() as u32 - outs,
            kids,
            self.kids.len() as u32 - kids,
        ]);
        self.completions.len() as u32 - 1
    }

    /// Resolves every id of the part to its index (rule 1): `tasks` and `data` are the
    /// indexes of a loaded track and their sorted ids.
    fn resolve(&mut self, tasks: (&Index, &[u128]), data: (&Index, &[u128])) {
        let ((ti, tids), (di, dids)) = (tasks, data);
        self.ids_ix = di.get_all(dids, &self.ids, |&d| Some(d));
        self.kids_ix = ti.get_all(tids, &self.kids, |&c| Some(c));
        self.outs_ix = di.get_all(dids, &self.outs, |o| Some(o.data));
        let parents = ti.get_all(tids, &self.records, Rec::parent);
        for (r, p) in self.records.iter_mut().zip(parents) {
            r.parent_ix = p;
        }
        let is_data = |kind: Kind| matches!(kind, Kind::Returned | Kind::Input);
        let kinds = &self.kinds;
        let task_of = |k: usize| (!is_data(kinds[k])).then(|| self.events[k].id());
        let evs = ti.get_each(tids, self.events.len(), task_of);
        for ((e, x), &kind) in self.events.iter_mut().zip(evs).zip(kinds) {
            // Few events are about data: looked up one by one.
            e.ix = match is_data(kind) {
                true => di.get(dids, e.id()).unwrap_or(NONE),
                false => x,
            };
        }
    }

    /// Adds one event read in place (rule 1); `Err`: it does not decode (postcard's words).
    fn push_encoded(&mut self, bytes: &[u8]) -> Result<(), String> {
        let (kind, ev) = match view_event(bytes) {
            Some(EventView::Declared(d)) => {
                let at = self.record(
                    d.parent,
                    d.index,
                    d.name,
                    d.args,
                    d.inputs.iter(),
                    d.outputs.iter(),
                );
                (Kind::Declared, Ev::new(d.task.0, at))
            }
            Some(EventView::Started { task, inputs }) => {
                let d = self.digests(inputs.iter());
                self.starts.push(d);
                let at = self.starts.len() as u32 - 1;
                (Kind::Started, Ev::new(task.0, at))
            }
            Some(EventView::Completed {
                task,
                outputs,
                children,
            }) => {
                let at = self.completion(
                    outputs.iter().map(|o| (o.data, o.value, o.digest)),
                    children.iter(),
                );
                (Kind::Completed, Ev::new(task.0, at))
            }
            None => {
                let event: Event =
                    veriflow_runtime::codec::decode(bytes).map_err(|e| e.to_string())?;
                self.push_event(&event)
            }
        };
        self.events.push(ev);
        self.kinds.push(kind);
        Ok(())
    }

    /// Adds one decoded event (rule 1).
    fn push_event(&mut self, event: &Event) -> (Kind, Ev) {
        let record = |part: &mut Part, d: &Declared| {
            part.record(
                d.parent,
                d.index,
                &d.name,
                PayloadView::from(&d.args),
                d.inputs.iter().map(|i| i.0),
                d.outputs.iter().map(|o| o.0),
            )
        };
        let (id, kind, at) = match event {
            Event::Declared(d) => (d.task.0, Kind::Declared, record(self, d)),
            Event::Started { task, inputs } => {
                let d = self.digests(inputs.iter().copied());
                self.starts.push(d);
                (task.0, Kind::Started, self.starts.len() as u32 - 1)
            }
            Event::Completed {
                task,
                outputs,
                children,
            } => {
                let at = self.completion(
                    outputs
                        .iter()
                        .map(|o| (o.data, PayloadView::from(&o.value), o.digest)),
                    children.iter().map(|c| c.0),
                );
                (task.0, Kind::Completed, at)
            }
            Event::Stolen { task, .. } => (task.0, Kind::Stolen, 0),
            Event::Adopted {
                record: r, inputs, ..
            } => {
                let rec = record(self, r);
                let (start, len) = self.digests(inputs.iter().map(Payload::digest));
                self.adoptions.push((rec, start, len));
                (r.task.0, Kind::Adopted, self.adoptions.len() as u32 - 1)
            }
            Event::Returned { output } => {
                self.returns.push(output.digest);
                (output.data.0, Kind::Returned, self.returns.len() as u32 - 1)
            }
            Event::Input { output } => {
                let v = self.val(PayloadView::from(&output.value));
                self.inputs.push((v, output.digest));
                (output.data.0, Kind::Input, self.inputs.len() as u32 - 1)
            }
        };
        (kind, Ev::new(id, at))
    }
}

/// Item `k` of a column of indexes resolved at load ([`NONE`]: not resolved, look it up).
fn resolved(column: &[u32], k: usize) -> u32 {
    column.get(k).copied().unwrap_or(NONE)
}

/// The distinct ids of `ids(s)` for every source `s` in `0..sources`, sorted (rules 1 and 6).
/// Ids are random, so a counting sort by their top bits leaves about 32 ids a bucket (the
/// counts stay in the cache): each bucket is then sorted and made distinct on its own, in
/// parallel chunks. Linear, where sorting every event's id with comparisons took 2.3 times
/// the CPU.
fn distinct_sorted<I: Iterator<Item = u128>>(
    sources: usize,
    ids: impl Fn(usize) -> I,
) -> Vec<u128> {
    let n: usize = (0..sources).map(|s| ids(s).count()).sum();
    // About 32 ids a bucket: the counts stay in the cache.
    let bits = (usize::BITS - (n >> 5).leading_zeros()).clamp(1, 24);
    let shift = 128 - bits;
    // `ends[b]`: where bucket b ends once filled; it starts where bucket b - 1 ends.
    let mut ends = vec![0u32; 1 << bits];
    for s in 0..sources {
        ids(s).for_each(|id| ends[(id >> shift) as usize] += 1);
    }
    let mut total = 0u32;
    for e in &mut ends {
        total += *e;
        *e = total;
    }
    let mut all = vec![0u128; n];
    let mut next: Vec<u32> = std::iter::once(0).chain(ends.iter().copied()).collect();
    next.pop();
    for s in 0..sources {
        for id in ids(s) {
            let b = (id >> shift) as usize;
            all[next[b] as usize] = id;
            next[b] += 1;
        }
    }
    drop(next);
    // Chunks of whole buckets, each sorted and made distinct at its front, in parallel.
    const CHUNK: usize = 1 << 8;
    let mut chunks: Vec<(&mut [u128], &[u32], u32)> = Vec::new();
    let mut rest = &mut all[..];
    let mut from = 0u32;
    for bucket_ends in ends.chunks(CHUNK) {
        let to = *bucket_ends.last().unwrap_or(&from);
        let (chunk, tail) = std::mem::take(&mut rest).split_at_mut((to - from) as usize);
        chunks.push((chunk, bucket_ends, from));
        rest = tail;
        from = to;
    }
    let kept: Vec<usize> = chunks
        .into_par_iter()
        .map(|(chunk, bucket_ends, base)| {
            let (mut start, mut out) = (0usize, 0usize);
            for &end in bucket_ends {
                let end = (end - base) as usize;
                let bucket = &mut chunk[start..end];
                bucket.sort_unstable();
                for k in start..end {
                    if out == 0 || chunk[out - 1] != chunk[k] {
                        chunk[out] = chunk[k];
                        out += 1;
                    }
                }
                start = end;
            }
            out
        })
        .collect();
    // The chunks' distinct ids moved together.
    let (mut out, mut from) = (0usize, 0usize);
    for (bucket_ends, kept) in ends.chunks(CHUNK).zip(kept) {
        all.copy_within(from..from + kept, out);
        out += kept;
        from = *bucket_ends.last().unwrap_or(&0) as usize;
    }
    all.truncate(out);
    all.shrink_to_fit();
    all
}

/// Ids to indexes (rule 1): the sorted ids of a loaded track searched from the bucket of
/// their top bits, or a hash map for a track grown one event at a time.
#[derive(Debug, Default)]
struct Index {
    /// `buckets[b]`: the first id whose top bits are `b` or more (sorted ids only).
    buckets: Vec<u32>,
    shift: u32,
    map: Option<IdMap<u128, u32>>,
}

impl Index {
    fn live() -> Index {
        Index {
            map: Some(IdMap::default()),
            ..Index::default()
        }
    }

    /// The index of `ids`, sorted and distinct: ids are random, so a bucket holds about one.
    fn sorted(ids: &[u128]) -> Index {
        let bits = (usize::BITS - ids.len().leading_zeros()).clamp(1, 24);
        let shift = 128 - bits;
        let mut buckets = Vec::with_capacity((1 << bits) + 1);
        for (i, &id) in ids.iter().enumerate() {
            let b = (id >> shift) as usize;
            while buckets.len() <= b {
                buckets.push(i as u32);
            }
        }
        while buckets.len() <= 1 << bits {
            buckets.push(ids.len() as u32);
        }
        Index {
            buckets,
            shift,
            map: None,
        }
    }

    /// The index of `id` in `ids` and false, or true and a new index at the end of `ids`
    /// (a sorted index becomes a hash index then: the ids no longer ascend).
    fn get_or_push(&mut self, ids: &mut Vec<u128>, id: u128) -> (u32, bool) {
        if let Some(i) = self.get(ids, id) {
            return (i, false);
        }
        let map = self.map.get_or_insert_with(|| {
            ids.iter()
                .enumerate()
                .map(|(i, &x)| (x, i as u32))
                .collect()
        });
        let i = ids.len() as u32;
        ids.push(id);
        map.insert(id, i);
        (i, true)
    }

    /// The index of the id `key` gives of each of `items` ([`NONE`] where it is absent or
    /// `key` gives none), in parallel chunks, each a software pipeline (rule 8).
    fn get_all<T: Sync>(
        &self,
        ids: &[u128],
        items: &[T],
        key: impl Fn(&T) -> Option<u128> + Sync,
    ) -> Vec<u32> {
        self.get_each(ids, items.len(), |k| key(&items[k]))
    }

    /// [`Index::get_all`] of the ids `key` gives of item numbers `0..n`. Rule 8: a lookup
    /// reads its bucket, then the ids the bucket spans, two cache misses apart; the bucket of
    /// the item `2 * AHEAD` on is fetched, and the first id of the item `AHEAD` on, while
    /// this one is looked up.
    fn get_each(
        &self,
        ids: &[u128],
        n: usize,
        key: impl Fn(usize) -> Option<u128> + Sync,
    ) -> Vec<u32> {
        const CHUNK: usize = 1 << 14;
        const AHEAD: usize = 8;
        let mut out = vec![NONE; n];
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
            let base = c * CHUNK;
            if self.map.is_some() {
                for (k, o) in out.iter_mut().enumerate() {
                    *o = key(base + k)
                        .and_then(|id| self.get(ids, id))
                        .unwrap_or(NONE);
                }
                return;
            }
            let n = out.len();
            let bucket = |k: usize| match k < n {
                true => key(base + k).map(|id| (id, (id >> self.shift) as usize)),
                false => None,
            };
            for (k, o) in out.iter_mut().enumerate() {
                if let Some((_, b)) = bucket(k + 2 * AHEAD) {
                    prefetch(&self.buckets[b]);
                }
                if let Some((_, b)) = bucket(k + AHEAD) {
                    prefetch_at(ids, self.buckets[b] as usize);
                }
                if let Some((id, b)) = bucket(k) {
                    let (from, to) = (self.buckets[b], self.buckets[b + 1]);
                    *o = ids[from as usize..to as usize]
                        .iter()
                        .position(|&x| x == id)
                        .map_or(NONE, |i| from + i as u32);
                }
            }
        });
        out
    }

    fn get(&self, ids: &[u128], id: u128) -> Option<u32> {
        if let Some(m) = &self.map {
            return m.get(&id).copied();
        }
        let b = (id >> self.shift) as usize;
        let (from, to) = (*self.buckets.get(b)? as usize, self.buckets[b + 1] as usize);
        // About one id a bucket: a scan, no branches to mispredict in a search.
        ids[from..to]
            .iter()
            .position(|&x| x == id)
            .map(|i| (from + i) as u32)
    }
}

/// Each vnode's events counted once (rule 1), while a track is loaded: the kinds of event
/// the vnode being applied logged of the data it returned or got as input (a task's are in
/// its [`Row`]).
struct Once {
    data: HashSet<(u128, u8)>,
    part: u32,
}

impl Once {
    /// Whether this is the first event of `kind` about datum `id` of part `p`.
    fn first(&mut self, p: u32, id: u128, kind: Kind) -> bool {
        if self.part != p {
            self.part = p;
            self.data.clear();
        }
        self.data.insert((id, bit(kind)))
    }
}

/// A datum's writer ([`NONE`]: none) and the digest of its logged value, side by side (rule
/// 7).
#[derive(Clone, Copy, Debug)]
struct Datum {
    writer: u32,
    digest: Option<Digest>,
}

impl Datum {
    const EMPTY: Datum = Datum {
        writer: NONE,
        digest: None,
    };
}

/// What a task's events set, side by side in one cache line (rule 7).
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
struct Row {
    /// (part, record) of its record, `part` [`NONE`] if none.
    rec: (u32, u32),
    /// The parts whose vnodes declared it and where it ran ([`NONE`]: none).
    declared_on: u32,
    ran_on: u32,
    /// Digests read, in its part's digests.
    started: Span,
    /// Outputs written, in its part's outputs.
    wrote: Span,
    /// Children, in its part's ids.
    children: Span,
    /// While a track is loaded (rule 1): the last part whose events about it were applied,
    /// and the kinds of those events.
    once_part: u32,
    once_kinds: u8,
}

impl Row {
    const EMPTY: Row = Row {
        rec: (NONE, 0),
        declared_on: NONE,
        ran_on: NONE,
        started: Span::ABSENT,
        wrote: Span::ABSENT,
        children: Span::ABSENT,
        once_part: NONE,
        once_kinds: 0,
    };

    /// Whether this is the first event of `kind` that part `p` logged about its task.
    fn first(&mut self, p: u32, kind: Kind) -> bool {
        if self.once_part != p {
            self.once_part = p;
            self.once_kinds = 0;
        }
        let new = self.once_kinds & bit(kind) == 0;
        self.once_kinds |= bit(kind);
        new
    }
}

/// G as read from the logs of one generation.
#[derive(Debug)]
pub struct Track {
    /// The run's manifest.
    pub manifest: Manifest,
    /// The generation read.
    pub generation: u32,
    /// Disagreements between logs (rule 1).
    pub conflicts: Vec<Conflict>,
    /// Torn last segments that were skipped.
    pub torn: Vec<(VnodeId, TornTail)>,
    /// Events read.
    pub events: u64,
    /// The store the log is in: large values are read from its value store.
    pub store: Option<ValueSource>,
    parts: Vec<Part>,
    /// A live track's part of each vnode.
    part_of: HashMap<VnodeId, u32>,
    /// Whether `ids` ascend (a loaded track: an index is a rank).
    sorted: bool,
    // Tasks, by index.
    ids: Vec<u128>,
    index: Index,
    rows: Vec<Row>,
    /// The thief and the digests it adopted (few tasks are stolen).
    adopted: HashMap<Ix, (VnodeId, Span)>,
    // Data, by index.
    data_ids: Vec<u128>,
    data_index: Index,
    datums: Vec<Datum>,
    /// Program inputs' values (few): (part, value, digest).
    input: HashMap<u32, (u32, Val, Digest)>,
    /// Copies returned to victims (few), by datum id: the structural check looks a written
    /// datum up here without its index.
    returned: IdMap<u128, Vec<(VnodeId, Digest)>>,
}

impl Track {
    /// Reads the current generation of the log in `store` (rule 1).
    pub fn load(store: Arc<dyn Store>) -> Result<Track, LogError> {
        let reader = LogReader::latest(store)?;
        Track::load_from(&reader)
    }

    /// Reads the generation `reader` reads (rule 1).
    pub fn load_from(reader: &LogReader) -> Result<Track, LogError> {
        let manifest = reader.manifest()?;
        let vnodes = reader.vnodes()?;
        // Each vnode's log into its part, in parallel; the first damaged log (in vnode order)
        // is the error, as when they are read one by one.
        let read: Vec<Result<(Part, StreamedVnode), LogError>> = vnodes
            .par_iter()
            .map(|&v| {
                let mut part = Part::new(v);
                let read = reader.walk_encoded(v, &mut |_, _, bytes| part.push_encoded(bytes))?;
                Ok((part, read))
            })
            .collect();
        let mut t = Track::live(manifest, reader.generation());
        t.store = Some(ValueSource(reader.store().clone()));
        for r in read {
            let (part, read) = r?;
            if let Some(torn) = read.torn {
                t.torn.push((read.vnode, torn));
            }
            t.parts.push(part);
        }
        // Indexes are ranks of the sorted ids: every part's ids counted into buckets of their
        // top bits, then sorted and made distinct bucket by bucket (rule 6).
        let is_task = |k: &Kind| !matches!(k, Kind::Returned | Kind::Input | Kind::Stolen);
        let is_data = |k: &Kind| matches!(k, Kind::Returned | Kind::Input);
        let parts = &t.parts;
        let ids = distinct_sorted(parts.len(), |p| {
            let part = &parts[p];
            let evs = part.events.iter().zip(&part.kinds);
            evs.filter(|(_, k)| is_task(k)).map(|(e, _)| e.id())
        });
        let data = distinct_sorted(parts.len(), |p| {
            let part = &parts[p];
            let evs = part.events.iter().zip(&part.kinds);
            let returned = evs.filter(|(_, k)| is_data(k)).map(|(e, _)| e.id());
            part.outs.iter().map(|o| o.data).chain(returned)
        });
        let n = ids.len();
        t.index = Index::sorted(&ids);
        t.ids = ids;
        t.sorted = true;
        t.rows = vec![Row::EMPTY; n];
        t.data_index = Index::sorted(&data);
        t.datums = vec![Datum::EMPTY; data.len()];
        t.data_ids = data;
        // Every id each part names resolved to its index at once, in parallel: applying the
        // events, G_S and the structural check then look up no id.
        let (tasks, data) = ((&t.index, &t.ids[..]), (&t.data_index, &t.data_ids[..]));
        t.parts
            .par_iter_mut()
            .for_each(|part| part.resolve(tasks, data));
        let mut once = Once {
            data: HashSet::new(),
            part: NONE,
        };
        for p in 0..t.parts.len() {
            let events = std::mem::take(&mut t.parts[p].events);
            let kinds = std::mem::take(&mut t.parts[p].kinds);
            for (i, (&ev, &kind)) in events.iter().zip(&kinds).enumerate() {
                for (stage, d) in TWO_STAGES.iter().enumerate() {
                    if let (Some(a), Some(&k)) = (events.get(i + d), kinds.get(i + d)) {
                        t.prefetch_apply(p, a, k, stage);
                    }
                }
                t.apply(p as u32, ev, kind, Some(&mut once));
            }
        }
        Ok(t)
    }

    /// An empty track of a run still going on, grown by [`Track::absorb`] (`online.rs`).
    pub fn live(manifest: Manifest, generation: u32) -> Track {
        Track {
            manifest,
            generation,
            conflicts: Vec::new(),
            torn: Vec::new(),
            events: 0,
            store: None,
            parts: Vec::new(),
            part_of: HashMap::new(),
            sorted: false,
            ids: Vec::new(),
            index: Index::live(),
            rows: Vec::new(),
            adopted: HashMap::new(),
            data_ids: Vec::new(),
            data_index: Index::live(),
            datums: Vec::new(),
            input: HashMap::new(),
            returned: IdMap::default(),
        }
    }

    /// Adds one event that vnode `v` logged (rule 1), to a track grown while the run goes on
    /// (its reader counts each event once).
    pub fn absorb(&mut self, v: VnodeId, event: Event) {
        let p = match self.part_of.get(&v) {
            Some(&p) => p,
            None => {
                self.parts.push(Part::new(v));
                let p = self.parts.len() as u32 - 1;
                self.part_of.insert(v, p);
                p
            }
        };
        let (kind, ev) = self.parts[p as usize].push_event(&event);
        self.apply(p, ev, kind, None);
    }

    /// The index of task `id`, a new one if the track has not met it yet.
    fn ix(&mut self, id: u128) -> Ix {
        let (i, new) = self.index.get_or_push(&mut self.ids, id);
        if !new {
            return i;
        }
        // A loaded track grown further: indexes are no longer ranks.
        self.sorted &= self.index.map.is_none();
        self.rows.push(Row::EMPTY);
        i
    }

    /// The index of datum `id`, a new one if the track has not met it yet.
    fn dix(&mut self, id: u128) -> u32 {
        let (i, new) = self.data_index.get_or_push(&mut self.data_ids, id);
        if !new {
            return i;
        }
        self.datums.push(Datum::EMPTY);
        i
    }

    fn conflict(&mut self, task: TaskId, what: String) {
        self.conflicts.push(Conflict {
            task: format!("{task:#}"),
            what,
        });
    }

    /// Applies event `ev` of part `p` (rule 1); `once`: drop what its vnode logged before.
    /// Rule 8: stage `stage` of fetching what [`Track::apply`] of event `ev` of part `p`
    /// writes: its task's row, then the datums a completion writes.
    fn prefetch_apply(&self, p: usize, ev: &Ev, kind: Kind, stage: usize) {
        match (stage, kind) {
            (0, _) => prefetch_at(&self.rows, ev.ix as usize),
            (_, Kind::Completed) => {
                let Some(part) = self.parts.get(p) else {
                    return;
                };
                let Some(&[o, no, ..]) = part.completions.get(ev.at as usize) else {
                    return;
                };
                let outs = o as usize..(o + no) as usize;
                for &x in part.outs_ix.get(outs).unwrap_or_default() {
                    prefetch_at(&self.datums, x as usize);
                }
            }
            _ => {}
        }
    }

    fn apply(&mut self, p: u32, ev: Ev, kind: Kind, once: Option<&mut Once>) {
        let id = ev.id();
        let t = match kind {
            Kind::Returned | Kind::Input => None,
            _ if ev.ix != NONE => Some(ev.ix),
            Kind::Stolen => self.index.get(&self.ids, id),
            _ => Some(self.ix(id)),
        };
        if let Some(once) = once {
            let first = match t {
                Some(t) => self.rows[t as usize].first(p, kind),
                None => once.first(p, id, kind),
            };
            if !first {
                return;
            }
        }
        self.events += 1;
        let v = self.parts[p as usize].vnode;
        let task = TaskId(id);
        let span = |start: u32, len: u32| Span {
            part: p,
            start,
            len,
        };
        match (kind, t) {
            (Kind::Declared, Some(i)) => self.set_record(v, i, (p, ev.at), true),
            (Kind::Adopted, Some(i)) => {
                let (rec, start, len) = self.parts[p as usize].adoptions[ev.at as usize];
                self.adopted.insert(i, (v, span(start, len)));
                self.set_record(v, i, (p, rec), false);
            }
            (Kind::Started, Some(i)) => {
                let (start, len) = self.parts[p as usize].starts[ev.at as usize];
                let new = span(start, len);
                let old = self.rows[i as usize].started;
                if old.is_some() && self.digests_of(old) != self.digests_of(new) {
                    self.conflict(task, format!("{v} logged another start for it"));
                }
                let row = &mut self.rows[i as usize];
                row.started = new;
                row.ran_on = p;
            }
            (Kind::Completed, Some(i)) => {
                let [o, no, c, nc] = self.parts[p as usize].completions[ev.at as usize];
                let (outs, kids) = (span(o, no), span(c, nc));
                let old = self.rows[i as usize].wrote;
                if old.is_some() {
                    // Compared as (datum, digest), as the leaf hashes them.
                    let same = self.outs_of(old).len() == self.outs_of(outs).len()
                        && self
                            .outs_of(old)
                            .iter()
                            .zip(self.outs_of(outs))
                            .all(|(a, b)| a.data == b.data && a.digest == b.digest)
                        && self.kids_of(self.rows[i as usize].children) == self.kids_of(kids);
                    if !same {
                        self.conflict(task, format!("{v} logged another completion for it"));
                    }
                    return;
                }
                for k in outs.range() {
                    let part = &self.parts[p as usize];
                    let (o, x) = (part.outs[k], resolved(&part.outs_ix, k));
                    let d = match x {
                        NONE => self.dix(o.data) as usize,
                        x => x as usize,
                    };
                    match self.datums[d].writer {
                        w if w == NONE => {
                            self.datums[d].writer = i;
                            self.datums[d].digest = Some(o.digest);
                        }
                        // Written twice in one completion: the first is its value (rule 5).
                        w if w == i => {}
                        w => {
                            let other = TaskId(self.ids[w as usize]);
                            let data = DataId(o.data);
                            self.conflict(task, format!("{data} is also written by {other}"));
                        }
                    }
                }
                let row = &mut self.rows[i as usize];
                row.wrote = outs;
                row.children = kids;
                row.ran_on = p;
            }
            (Kind::Returned, _) => {
                let digest = self.parts[p as usize].returns[ev.at as usize];
                if ev.ix == NONE {
                    self.dix(id);
                }
                self.returned.entry(id).or_default().push((v, digest));
            }
            (Kind::Input, _) => {
                let (value, digest) = self.parts[p as usize].inputs[ev.at as usize];
                let d = match ev.ix {
                    NONE => self.dix(id),
                    x => x,
                };
                if self.datums[d as usize].writer == NONE {
                    self.datums[d as usize].digest = Some(digest);
                }
                self.input.insert(d, (p, value, digest));
            }
            _ => {} // `Stolen`
        }
    }

    fn set_record(&mut self, v: VnodeId, i: Ix, rec: (u32, u32), declared: bool) {
        let row = &mut self.rows[i as usize];
        if declared && row.declared_on == NONE {
            row.declared_on = rec.0;
        }
        let old = row.rec;
        if old.0 == NONE {
            row.rec = rec;
        } else if !self.same_record(old, rec) {
            let task = TaskId(self.ids[i as usize]);
            self.conflict(task, format!("{v} logged another record for it"));
        }
    }

    /// Whether two records are equal as [`Declared`]s are (arguments compared as payloads).
    fn same_record(&self, (pa, a): (u32, u32), (pb, b): (u32, u32)) -> bool {
        let (x, y) = (&self.parts[pa as usize], &self.parts[pb as usize]);
        let (ra, rb) = (x.records[a as usize], y.records[b as usize]);
        fn ids(part: &Part, r: Rec) -> &[u128] {
            &part.ids[r.ids as usize..(r.ids + r.inputs + r.outputs) as usize]
        }
        // Both are records of one task (the index they were applied to): its id is equal.
        ra.parent() == rb.parent()
            && ra.index == rb.index
            && ra.inputs == rb.inputs
            && ids(x, ra) == ids(y, rb)
            && x.names[ra.name as usize] == y.names[rb.name as usize]
            && x.payload(ra.args).to_payload() == y.payload(rb.args).to_payload()
    }

    fn digests_of(&self, s: Span) -> &[Digest] {
        match s.is_some() {
            true => &self.parts[s.part as usize].digests[s.range()],
            false => &[],
        }
    }

    fn outs_of(&self, s: Span) -> &[Out] {
        match s.is_some() {
            true => &self.parts[s.part as usize].outs[s.range()],
            false => &[],
        }
    }

    fn kids_of(&self, s: Span) -> &[u128] {
        match s.is_some() {
            true => &self.parts[s.part as usize].kids[s.range()],
            false => &[],
        }
    }

    /// Task `t`'s record in its part, if any.
    fn rec_of(&self, t: Ix) -> Option<(&Part, Rec)> {
        let (p, r) = self.rows[t as usize].rec;
        (p != NONE).then(|| {
            let part = &self.parts[p as usize];
            (part, part.records[r as usize])
        })
    }

    /// The data task `t` reads, in order (none without a record).
    pub fn inputs(&self, t: Ix) -> impl ExactSizeIterator<Item = DataId> + '_ {
        let ids = self.rec_of(t).map_or(&[][..], |(part, r)| {
            &part.ids[r.ids as usize..(r.ids + r.inputs) as usize]
        });
        ids.iter().map(|&d| DataId(d))
    }

    /// The data task `t` must write or delegate, in order (none without a record).
    fn outputs(&self, t: Ix) -> &[u128] {
        self.rec_of(t).map_or(&[][..], |(part, r)| {
            let from = (r.ids + r.inputs) as usize;
            &part.ids[from..from + r.outputs as usize]
        })
    }

    /// The id of task `t`.
    pub fn id(&self, t: Ix) -> TaskId {
        TaskId(self.ids[t as usize])
    }

    /// Whether a log declared task `t` (it has a record).
    pub fn has_record(&self, t: Ix) -> bool {
        self.rows[t as usize].rec.0 != NONE
    }

    /// Whether a log holds task `t`'s completion.
    pub fn is_completed(&self, t: Ix) -> bool {
        self.rows[t as usize].wrote.is_some()
    }

    /// The vnode where task `t` ran, if a log holds its start or completion.
    pub fn ran_on(&self, t: Ix) -> Option<VnodeId> {
        self.vnode_of(self.rows[t as usize].ran_on)
    }

    /// The vnode of part `p`, `None` for [`NONE`].
    fn vnode_of(&self, p: u32) -> Option<VnodeId> {
        self.parts.get(p as usize).map(|part| part.vnode)
    }

    /// The vnode that logged task `t`: where it ran, else where it was declared.
    pub fn vnode(&self, t: Ix) -> Option<VnodeId> {
        let row = &self.rows[t as usize];
        self.vnode_of(row.ran_on)
            .or_else(|| self.vnode_of(row.declared_on))
    }

    /// The children task `t` declared, in spawn order (none if not completed).
    pub fn children(&self, t: Ix) -> impl Iterator<Item = TaskId> + '_ {
        self.kids_of(self.rows[t as usize].children)
            .iter()
            .map(|&c| TaskId(c))
    }

    /// The (datum, digest) pairs task `t` wrote, as logged (none if not completed).
    pub fn wrote(&self, t: Ix) -> impl Iterator<Item = (DataId, Digest)> + '_ {
        self.outs_of(self.rows[t as usize].wrote)
            .iter()
            .map(|o| (DataId(o.data), o.digest))
    }

    /// The tasks that wrote a value themselves, sorted by id.
    pub fn writers(&self) -> Vec<TaskId> {
        let ids = (0..self.len() as Ix)
            .filter(|&t| !self.outs_of(self.rows[t as usize].wrote).is_empty());
        self.sorted_by_id(ids)
            .into_iter()
            .map(|t| self.id(t))
            .collect()
    }

    /// Task `t`'s record (rule 5: built from its part's columns).
    pub fn record(&self, t: Ix) -> Option<Declared> {
        let (part, r) = self.rec_of(t)?;
        let ids = |from: u32, n: u32| {
            part.ids[from as usize..(from + n) as usize]
                .iter()
                .map(|&d| DataId(d))
                .collect()
        };
        Some(Declared {
            task: TaskId(self.ids[t as usize]),
            parent: r.parent().map(TaskId),
            index: r.index,
            name: Cow::Owned(part.names[r.name as usize].to_string()),
            args: part.payload(r.args).to_payload(),
            inputs: ids(r.ids, r.inputs),
            outputs: ids(r.ids + r.inputs, r.outputs),
        })
    }

    /// The name of task `t`, if it has a record.
    pub fn name(&self, t: Ix) -> Option<&str> {
        self.rec_of(t)
            .map(|(part, r)| &*part.names[r.name as usize])
    }

    /// Task `t` whole (rule 5: a view built from the columns).
    pub fn task(&self, t: Ix) -> TaskRec {
        let i = t as usize;
        let Row { started, wrote, .. } = self.rows[i];
        TaskRec {
            id: self.id(t),
            record: self.record(t),
            declared_on: self.vnode_of(self.rows[i].declared_on),
            ran_on: self.ran_on(t),
            started: started.is_some().then(|| self.digests_of(started).to_vec()),
            wrote: wrote.is_some().then(|| {
                let part = &self.parts[wrote.part as usize];
                self.outs_of(wrote)
                    .iter()
                    .map(|o| Output {
                        data: DataId(o.data),
                        value: part.payload(o.value).to_payload(),
                        digest: o.digest,
                    })
                    .collect()
            }),
            children: self.children(t).collect(),
            adopted: self
                .adopted
                .get(&t)
                .map(|&(v, s)| (v, self.digests_of(s).to_vec())),
        }
    }

    /// Datum `d` (a view built from the columns), if a log names it.
    pub fn data(&self, d: DataId) -> Option<DataRec> {
        let x = self.data_ix(d)?;
        Some(DataRec {
            writer: (self.datums[x as usize].writer != NONE)
                .then_some(self.datums[x as usize].writer),
            digest: self.datums[x as usize].digest,
            input: self
                .input
                .get(&x)
                .map(|&(p, v, g)| (self.parts[p as usize].payload(v).to_payload(), g)),
            returned: self.returned.get(&d.0).cloned().unwrap_or_default(),
        })
    }

    /// Every datum the logs name: written, a program input or returned.
    pub fn data_ids(&self) -> impl Iterator<Item = DataId> + '_ {
        (0..self.data_ids.len() as u32)
            .filter(|x| {
                self.datums[*x as usize].digest.is_some()
                    || self.datums[*x as usize].writer != NONE
                    || self.returned.contains_key(&self.data_ids[*x as usize])
            })
            .map(|x| DataId(self.data_ids[x as usize]))
    }

    fn data_ix(&self, d: DataId) -> Option<u32> {
        self.data_index.get(&self.data_ids, d.0)
    }

    /// The index of datum `d`: `x` if resolved at load, else looked up.
    fn data_ix_or(&self, d: DataId, x: u32) -> Option<u32> {
        match x {
            NONE => self.data_ix(d),
            x => Some(x),
        }
    }

    /// Number of tasks in G.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether G has no task.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The index of a task.
    pub fn index_of(&self, id: TaskId) -> Option<Ix> {
        self.index.get(&self.ids, id.0)
    }

    /// The terminal outputs of the run (the root's outputs).
    pub fn terminal(&self) -> &[DataId] {
        &self.manifest.terminal
    }

    /// The logged values of the terminal outputs, in the manifest's order, or `None` if one
    /// is in no log read (`log::terminal_outputs` from a track already read); a large one is
    /// read from the value store ([`Track::resolve`]).
    pub fn terminal_values(&self) -> Result<Option<Vec<Vec<u8>>>, LogError> {
        self.values_of(self.manifest.terminal.iter().copied())
    }

    /// The logged values of `data`, in order, or `None` if one has none.
    fn values_of(
        &self,
        data: impl ExactSizeIterator<Item = DataId>,
    ) -> Result<Option<Vec<Vec<u8>>>, LogError> {
        let mut out = Vec::with_capacity(data.len());
        for d in data {
            let Some((v, _)) = self.value(d) else {
                return Ok(None);
            };
            out.push(self.resolve(v)?);
        }
        Ok(Some(out))
    }

    /// G_S for the outputs `s` (rule 2), as a sorted list of task indexes, with the structural
    /// errors met on the way (a datum of S or an input nobody wrote).
    pub fn terminal_subgraph(&self, s: &[DataId]) -> (Vec<Ix>, Vec<StructuralError>) {
        let mut errors = Vec::new();
        let mut seen = vec![false; self.len()];
        let mut stack: Vec<Ix> = Vec::new();
        // `x`: the datum's index if resolved at load.
        let mut need =
            |d: DataId, x: u32, reader: Option<Ix>, stack: &mut Vec<Ix>, seen: &mut [bool]| {
                match self.data_ix_or(d, x) {
                    Some(x) if self.datums[x as usize].writer != NONE => {
                        let w = self.datums[x as usize].writer;
                        if !seen[w as usize] {
                            seen[w as usize] = true;
                            stack.push(w);
                        }
                    }
                    Some(x) if self.input.contains_key(&x) => {}
                    _ => errors.push(self.error(
                        reader,
                        Some(d),
                        match reader {
                            Some(_) => "reads a datum that no task wrote".to_string(),
                            None => "terminal output was never written".to_string(),
                        },
                    )),
                }
            };
        for &d in s {
            need(d, NONE, None, &mut stack, &mut seen);
        }
        while let Some(t) = stack.pop() {
            // Rule 8: the tasks a few places down the stack are usually the next ones popped.
            let below = |d: usize| stack.len().checked_sub(d).map(|k| stack[k]);
            if let Some(a) = below(8) {
                prefetch_at(&self.rows, a as usize);
            }
            if let Some((_, rec)) = below(4).and_then(|a| self.rec_ref(a)) {
                prefetch(rec);
            }
            if let Some((part, rec)) = below(2).and_then(|a| self.rec_ref(a)) {
                prefetch_at(&part.ids_ix, rec.ids as usize);
            }
            let Some((part, r)) = self.rec_of(t) else {
                continue;
            };
            for k in r.ids as usize..(r.ids + r.inputs) as usize {
                let x = resolved(&part.ids_ix, k);
                need(DataId(part.ids[k]), x, Some(t), &mut stack, &mut seen);
            }
            let parent = match r.parent_ix {
                NONE => r.parent().and_then(|p| self.index_of(TaskId(p))),
                p => Some(p),
            };
            if let Some(p) = parent {
                if !seen[p as usize] {
                    seen[p as usize] = true;
                    stack.push(p);
                }
            }
        }
        let gs = self.sorted_by_id((0..self.len() as Ix).filter(|&i| seen[i as usize]));
        (gs, errors)
    }

    /// The tasks `ixs`, sorted by id: in index order when indexes are ranks, else (id, index)
    /// pairs sorted side by side.
    fn sorted_by_id(&self, ixs: impl Iterator<Item = Ix>) -> Vec<Ix> {
        if self.sorted {
            return ixs.collect();
        }
        let mut pairs: Vec<(u128, Ix)> = ixs.map(|i| (self.ids[i as usize], i)).collect();
        pairs.par_sort_unstable_by_key(|&(id, _)| id);
        pairs.into_iter().map(|(_, i)| i).collect()
    }

    fn error(&self, task: Option<Ix>, data: Option<DataId>, message: String) -> StructuralError {
        StructuralError {
            task: task.map_or_else(|| "-".to_string(), |t| format!("{:#}", self.id(t))),
            name: task.and_then(|t| self.name(t)).map(str::to_string),
            vnode: task.and_then(|t| self.vnode(t)).map(|v| v.0),
            data: data.map(|d| format!("{d:#}")),
            message,
        }
    }

    /// The structural check of rule 3 over the tasks `gs`, in parallel chunks; within a
    /// chunk, what each task's check reads is fetched into the cache a few tasks ahead, one
    /// level of indirection a stage (rule 8).
    pub fn structural_check(&self, gs: &[Ix]) -> Vec<StructuralError> {
        const CHUNK: usize = 1024;
        let mut errors: Vec<StructuralError> = gs
            .par_chunks(CHUNK)
            .flat_map_iter(|chunk| {
                let mut out = Vec::new();
                for (i, &t) in chunk.iter().enumerate() {
                    for (stage, d) in FOUR_STAGES.iter().enumerate() {
                        if let Some(&a) = chunk.get(i + d) {
                            self.prefetch_check(a, stage);
                        }
                    }
                    out.extend(self.check_task(t));
                }
                out
            })
            .collect();
        for c in &self.conflicts {
            errors.push(StructuralError {
                task: c.task.clone(),
                name: None,
                vnode: None,
                data: None,
                message: format!("logs disagree: {}", c.what),
            });
        }
        errors
    }

    /// Rule 8: the part and record of task `t`, as a prefetch reads them (out of range is
    /// `None`, never a panic: a hint must not fail).
    fn rec_ref(&self, t: Ix) -> Option<(&Part, &Rec)> {
        let (p, r) = self.rows.get(t as usize)?.rec;
        let part = self.parts.get(p as usize)?;
        Some((part, part.records.get(r as usize)?))
    }

    /// Rule 8: the items of span `s` in a part's column `col` (none when out of range).
    fn span_ref<'a, T>(&'a self, s: Span, col: impl Fn(&'a Part) -> &'a [T]) -> &'a [T] {
        match s.is_some() {
            true => self
                .parts
                .get(s.part as usize)
                .and_then(|p| col(p).get(s.range()))
                .unwrap_or_default(),
            false => &[],
        }
    }

    /// Rule 8: stage `stage` of fetching what [`Track::check_task`] of `t` reads. Stage 0
    /// (farthest ahead) needs only `t`'s row; each later stage follows what the one before
    /// fetched: the record, the digests read and the outputs written; then the resolved
    /// indexes of its inputs and children; then the inputs' datums and the children's rows;
    /// then the children's records.
    fn prefetch_check(&self, t: Ix, stage: usize) {
        let Some(row) = self.rows.get(t as usize) else {
            return;
        };
        let kids_ix = || self.span_ref(row.children, |p| &p.kids_ix);
        match stage {
            0 => {
                if let Some((_, rec)) = self.rec_ref(t) {
                    prefetch(rec);
                }
                prefetch_first(self.span_ref(row.wrote, |p| &p.outs));
                prefetch_first(self.span_ref(row.started, |p| &p.digests));
            }
            1 => {
                if let Some((part, rec)) = self.rec_ref(t) {
                    prefetch_at(&part.ids_ix, rec.ids as usize);
                    prefetch_at(&part.ids, rec.ids as usize);
                }
                prefetch_first(kids_ix());
            }
            2 => {
                if let Some((part, rec)) = self.rec_ref(t) {
                    let inputs = rec.ids as usize..(rec.ids + rec.inputs) as usize;
                    for &x in part.ids_ix.get(inputs).unwrap_or_default() {
                        prefetch_at(&self.datums, x as usize);
                    }
                }
                for &c in kids_ix() {
                    prefetch_at(&self.rows, c as usize);
                }
            }
            _ => {
                for &c in kids_ix() {
                    if let Some((_, rec)) = self.rec_ref(c) {
                        prefetch(rec);
                    }
                }
            }
        }
    }

    fn check_task(&self, t: Ix) -> Vec<StructuralError> {
        let mut out = Vec::new();
        let Some((part, r)) = self.rec_of(t) else {
            out.push(self.error(Some(t), None, "no log declared it".to_string()));
            return out;
        };
        let Row { started, wrote, .. } = self.rows[t as usize];
        if !started.is_some() || !wrote.is_some() {
            out.push(self.error(Some(t), None, "declared but never completed".to_string()));
            return out;
        }
        let started = self.digests_of(started);
        let inputs = r.ids as usize..(r.ids + r.inputs) as usize;
        let inputs_ix = |i: usize| resolved(&part.ids_ix, inputs.start + i);
        let inputs = &part.ids[inputs.clone()];
        // The producer's digest (`x`: the datum's index if resolved at load), and (only on a
        // mismatch) who it is.
        let producer = |d: u128, x: u32| -> Option<(Digest, u32)> {
            let x = self.data_ix_or(DataId(d), x)? as usize;
            Some((self.datums[x].digest?, self.datums[x].writer))
        };
        let who = |writer: u32| match writer {
            NONE => "the program input".to_string(),
            w => {
                let on = self
                    .ran_on(w)
                    .map_or_else(String::new, |v| format!(" on {v}"));
                format!("its producer {}{on}", self.id(w))
            }
        };
        if started.len() != inputs.len() {
            out.push(self.error(
                Some(t),
                None,
                format!("read {} inputs, declared {}", started.len(), inputs.len()),
            ));
        }
        for (i, (&d, read)) in inputs.iter().zip(started).enumerate() {
            match producer(d, inputs_ix(i)) {
                Some((logged, w)) if logged != *read => out.push(self.error(
                    Some(t),
                    Some(DataId(d)),
                    format!(
                        "read input {i} with digest {read}, but {} logged {logged}",
                        who(w)
                    ),
                )),
                Some(_) => {}
                None => out.push(self.error(
                    Some(t),
                    Some(DataId(d)),
                    format!("input {i} has no logged value"),
                )),
            }
        }
        if let Some(&(thief, adopted)) = self.adopted.get(&t) {
            for (i, (&d, got)) in inputs.iter().zip(self.digests_of(adopted)).enumerate() {
                if let Some((logged, w)) = producer(d, inputs_ix(i)).filter(|(l, _)| l != got) {
                    out.push(self.error(
                        Some(t),
                        Some(DataId(d)),
                        format!(
                            "{thief} adopted input {i} with digest {got}, but {} logged {logged}",
                            who(w)
                        ),
                    ));
                }
            }
        }
        let outputs = self.outputs(t);
        for o in self.outs_of(wrote) {
            let (d, digest) = (DataId(o.data), o.digest);
            if !outputs.contains(&o.data) {
                out.push(self.error(
                    Some(t),
                    Some(d),
                    "wrote a datum that is not one of its outputs".to_string(),
                ));
            }
            // Few data were returned: a small map, looked up by id.
            for (victim, got) in self.returned.get(&o.data).into_iter().flatten() {
                if *got != digest {
                    out.push(self.error(
                        Some(t),
                        Some(d),
                        format!("{victim} received digest {got}, the writer logged {digest}"),
                    ));
                }
            }
        }
        let id = self.ids[t as usize];
        let kids = self.rows[t as usize].children;
        for (i, &c) in self.kids_of(kids).iter().enumerate() {
            let resolved = match kids.is_some() {
                true => resolved(
                    &self.parts[kids.part as usize].kids_ix,
                    kids.start as usize + i,
                ),
                false => NONE,
            };
            let child = match resolved {
                NONE => self.index_of(TaskId(c)),
                ci => Some(ci),
            };
            let ok = child
                .and_then(|ci| self.rec_of(ci))
                .is_some_and(|(_, cr)| cr.parent() == Some(id) && cr.index as usize == i);
            if !ok {
                out.push(self.error(
                    Some(t),
                    None,
                    format!(
                        "child {i} ({}) has no record naming it as parent",
                        TaskId(c)
                    ),
                ));
            }
        }
        out
    }

    /// Rule 8: stage `stage` of fetching what [`LeafBatch::gather`] of `t` reads: from its
    /// row, its record and the digests, outputs and children it logged; then, from its
    /// record, its input ids and its arguments.
    fn prefetch_leaf(&self, t: Ix, stage: usize) {
        let Some(row) = self.rows.get(t as usize) else {
            return;
        };
        match (stage, self.rec_ref(t)) {
            (0, rec) => {
                if let Some((_, rec)) = rec {
                    prefetch(rec);
                }
                prefetch_first(self.span_ref(row.started, |p| &p.digests));
                prefetch_first(self.span_ref(row.wrote, |p| &p.outs));
                prefetch_first(self.span_ref(row.children, |p| &p.kids));
            }
            (_, Some((part, rec))) => {
                prefetch_at(&part.ids, rec.ids as usize);
                if rec.args.len != NONE {
                    prefetch_at(&part.bytes, rec.args.start as usize);
                }
            }
            (_, None) => {}
        }
    }

    /// The leaf of task `t` (rule 4).
    pub fn leaf(&self, t: Ix) -> [u8; 32] {
        let mut batch = LeafBatch::default();
        batch.gather(self, t);
        let mut leaf = [[0; 32]];
        batch.hash_into(&mut leaf);
        leaf[0]
    }

    /// The leaves of `tasks` into `out` (rule 4), in batches: the fields of a batch of tasks
    /// are gathered first, so that their cache misses overlap, then hashed.
    fn leaves_into(&self, tasks: impl IndexedParallelIterator<Item = Ix>, out: &mut [[u8; 32]]) {
        const BATCH: usize = 512;
        tasks
            .chunks(BATCH)
            .zip(out.par_chunks_mut(BATCH))
            .for_each_init(LeafBatch::default, |batch, (tasks, out)| {
                batch.clear();
                for (i, &t) in tasks.iter().enumerate() {
                    for (stage, d) in TWO_STAGES.iter().enumerate() {
                        if let Some(&a) = tasks.get(i + d) {
                            self.prefetch_leaf(a, stage);
                        }
                    }
                    batch.gather(self, t);
                }
                batch.hash_into(out);
            });
    }

    /// The leaf of every task, by index (computed in parallel).
    pub fn leaves(&self) -> Vec<[u8; 32]> {
        let mut out = vec![[0; 32]; self.len()];
        self.leaves_into((0..self.len() as Ix).into_par_iter(), &mut out);
        out
    }

    /// The Merkle root over the leaves of `tasks` (sorted by id; rule 4).
    pub fn merkle_root(&self, tasks: &[Ix]) -> [u8; 32] {
        let mut leaves = vec![[0; 32]; tasks.len()];
        self.leaves_into(tasks.par_iter().copied(), &mut leaves);
        merkle(leaves)
    }

    /// [`Track::merkle_root`] from leaves already computed by [`Track::leaves`].
    pub fn merkle_root_of(&self, tasks: &[Ix], leaves: &[[u8; 32]]) -> [u8; 32] {
        merkle(tasks.iter().map(|&t| leaves[t as usize]).collect())
    }

    /// The log digest (rule 4): the Merkle root over every task of G.
    pub fn log_digest(&self) -> [u8; 32] {
        self.log_digest_of(&self.leaves())
    }

    /// [`Track::log_digest`] from leaves already computed by [`Track::leaves`].
    pub fn log_digest_of(&self, leaves: &[[u8; 32]]) -> [u8; 32] {
        let all = self.sorted_by_id(0..self.len() as Ix);
        self.merkle_root_of(&all, leaves)
    }

    /// The Merkle root of `gs` (a G_S of [`Track::terminal_subgraph`]: sorted by id) and the
    /// log digest, from leaves already computed: one tree when G_S is all of G (then both
    /// roots are over the same leaves in the same order).
    pub fn roots_of(&self, gs: &[Ix], leaves: &[[u8; 32]]) -> ([u8; 32], [u8; 32]) {
        let root = self.merkle_root_of(gs, leaves);
        if gs.len() == self.len() {
            return (root, root);
        }
        (root, self.log_digest_of(leaves))
    }

    /// Successors of `t` in G: the tasks that read what it wrote, and its children.
    pub(crate) fn successors<'a>(
        &'a self,
        t: Ix,
        readers: &'a IdMap<DataId, Vec<Ix>>,
    ) -> impl Iterator<Item = Ix> + 'a {
        let out = self
            .wrote(t)
            .flat_map(move |(d, _)| readers.get(&d).into_iter().flatten().copied());
        let kids = self.children(t).filter_map(move |c| self.index_of(c));
        out.chain(kids)
    }

    /// Who reads each datum.
    pub(crate) fn readers(&self) -> IdMap<DataId, Vec<Ix>> {
        let mut m: IdMap<DataId, Vec<Ix>> = IdMap::default();
        for t in 0..self.len() as Ix {
            for d in self.inputs(t) {
                m.entry(d).or_default().push(t);
            }
        }
        m
    }

    /// The logged input values of task `t`, in input order; `None` if one has no logged
    /// value (or it has no record). A large value is read from the value store: an error if
    /// it is not there or not what its digest says.
    pub fn input_values(&self, t: Ix) -> Result<Option<Vec<Vec<u8>>>, LogError> {
        if !self.has_record(t) {
            return Ok(None);
        }
        self.values_of(self.inputs(t))
    }

    /// The logged value of `d` and its digest (rule 5): its writer's, else the program
    /// input's; `None` if no log read holds it. A large one is a reference into the value
    /// store, read when a re-run needs it ([`Track::resolve`]; rule 10 of the runtime's
    /// `log/mod.rs`).
    pub fn value(&self, d: DataId) -> Option<(PayloadView<'_>, Digest)> {
        let x = self.data_ix(d)?;
        let w = self.datums[x as usize].writer;
        if w != NONE {
            let s = self.rows[w as usize].wrote;
            if let Some(o) = self.outs_of(s).iter().find(|o| o.data == d.0) {
                return Some((self.parts[s.part as usize].payload(o.value), o.digest));
            }
        }
        self.input
            .get(&x)
            .map(|&(p, v, g)| (self.parts[p as usize].payload(v), g))
    }

    /// The bytes of a logged value: its own, or read from the value store and checked.
    pub fn resolve(&self, p: PayloadView<'_>) -> Result<Vec<u8>, LogError> {
        match (p, &self.store) {
            (PayloadView::Inline(b), _) => Ok(b.to_vec()),
            (PayloadView::Stored { digest, len }, Some(ValueSource(store))) => {
                veriflow_runtime::log::values::load(&**store, digest, len)
            }
            (PayloadView::Stored { digest, .. }, None) => Err(LogError::Value {
                digest,
                reason: "is in a value store this reader was not given".to_string(),
            }),
        }
    }
}

/// The bytes of a batch of leaves (rule 4), laid out one after the other.
#[derive(Default)]
struct LeafBatch {
    bytes: Vec<u8>,
    /// Per leaf: where its bytes end, and where its argument digest goes (`NONE`: none).
    ends: Vec<(usize, u32)>,
    /// Inline arguments, hashed with the leaves: (their place in `args`).
    args: Vec<u8>,
    arg_spans: Vec<std::ops::Range<usize>>,
}

impl LeafBatch {
    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        self.args.clear();
        self.arg_spans.clear();
    }

    /// Lays out the fields of task `t`'s leaf; an inline argument's digest is left to
    /// [`LeafBatch::hash_into`] (32 zero bytes until then).
    fn gather(&mut self, track: &Track, t: Ix) {
        let i = t as usize;
        let buf = &mut self.bytes;
        let leaf_start = buf.len();
        buf.extend_from_slice(&track.ids[i].to_le_bytes());
        let mut args_at = NONE;
        if let Some((part, r)) = track.rec_of(t) {
            let name = part.names[r.name as usize].as_bytes();
            buf.extend_from_slice(&(name.len() as u64).to_le_bytes());
            buf.extend_from_slice(name);
            let digest = match part.payload(r.args) {
                PayloadView::Inline(b) => {
                    args_at = (buf.len() - leaf_start) as u32;
                    let from = self.args.len();
                    self.args.extend_from_slice(b);
                    self.arg_spans.push(from..self.args.len());
                    Digest::default()
                }
                PayloadView::Stored { digest, .. } => digest,
            };
            buf.extend_from_slice(&digest.0);
            buf.extend_from_slice(&u64::from(r.inputs).to_le_bytes());
            let started = track.digests_of(track.rows[i].started);
            let inputs = &part.ids[r.ids as usize..(r.ids + r.inputs) as usize];
            for (k, d) in inputs.iter().enumerate() {
                buf.extend_from_slice(&d.to_le_bytes());
                buf.extend_from_slice(&started.get(k).copied().unwrap_or_default().0);
            }
        }
        let wrote = track.outs_of(track.rows[i].wrote);
        buf.extend_from_slice(&(wrote.len() as u64).to_le_bytes());
        for o in wrote {
            buf.extend_from_slice(&o.data.to_le_bytes());
            buf.extend_from_slice(&o.digest.0);
        }
        let children = track.kids_of(track.rows[i].children);
        buf.extend_from_slice(&(children.len() as u64).to_le_bytes());
        for c in children {
            buf.extend_from_slice(&c.to_le_bytes());
        }
        self.ends.push((buf.len(), args_at));
    }

    /// Hashes the leaves gathered, in order, into `out`.
    fn hash_into(&mut self, out: &mut [[u8; 32]]) {
        let mut start = 0;
        let mut spans = self.arg_spans.iter();
        for (leaf, &(end, args_at)) in out.iter_mut().zip(&self.ends) {
            if args_at != NONE {
                let span = spans.next().cloned().unwrap_or_default();
                let at = start + args_at as usize;
                self.bytes[at..at + 32].copy_from_slice(&Digest::of(&self.args[span]).0);
            }
            let mut h = blake3::Hasher::new_from_context_key(&LEAF_KEY);
            h.update(&self.bytes[start..end]);
            *leaf = *h.finalize().as_bytes();
            start = end;
        }
    }
}

/// The key of a leaf's hasher (rule 4), derived once from its context.
static LEAF_KEY: LazyLock<ContextKey> =
    LazyLock::new(|| hash_derive_key_context("veriflow certifier leaf v1"));
/// The key of a node's hasher, derived once.
static NODE_KEY: LazyLock<ContextKey> =
    LazyLock::new(|| hash_derive_key_context("veriflow certifier node v1"));

/// A node of the tree: its two children hashed under the node key, as one block.
fn node(a: &[u8; 32], b: &[u8; 32], key: &ContextKey) -> [u8; 32] {
    let mut pair = [0u8; 64];
    pair[..32].copy_from_slice(a);
    pair[32..].copy_from_slice(b);
    let mut h = blake3::Hasher::new_from_context_key(key);
    h.update(&pair);
    *h.finalize().as_bytes()
}

/// Pairwise blake3 up to one root; an odd node is carried up; the empty tree's root is the
/// hash of nothing under the node key. Each level is hashed in place, in parallel chunks.
pub(crate) fn merkle(mut level: Vec<[u8; 32]>) -> [u8; 32] {
    if level.is_empty() {
        return *blake3::Hasher::new_from_context_key(&NODE_KEY)
            .finalize()
            .as_bytes();
    }
    let key = &*NODE_KEY;
    let mut len = level.len();
    while len > 1 {
        let half = len.div_ceil(2);
        // Pair i of this level becomes node i of the next, written over the pair's first
        // element: chunks of 2 × CHUNK leaves map to chunks of CHUNK nodes.
        const CHUNK: usize = 4096;
        let (done, _) = level.split_at_mut(len);
        done.par_chunks_mut(2 * CHUNK).for_each(|chunk| {
            for i in 0..chunk.len().div_ceil(2) {
                chunk[i] = match chunk.get(2 * i + 1) {
                    Some(b) => node(&chunk[2 * i], b, key),
                    None => chunk[2 * i],
                };
            }
        });
        // Gather the chunks' nodes to the front.
        for (c, from) in (0..len).step_by(2 * CHUNK).enumerate().skip(1) {
            let n = (len - from).min(2 * CHUNK).div_ceil(2);
            level.copy_within(from..from + n, c * CHUNK);
        }
        len = half;
    }
    level[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Rule 6: the counting sort gives what sorting every id and dropping repeats gives,
        /// with ids spread over the buckets or crowded into a few (their top bits equal).
        #[test]
        fn distinct_ids_are_every_id_sorted_once(
            sources in prop::collection::vec(
                prop::collection::vec((0..4u8, any::<u128>(), 0..3u8), 0..300), 0..4),
        ) {
            let id = |(top, x, small): (u8, u128, u8)| match top {
                0 => x,
                1 => u128::from(small),
                2 => (u128::from(small) << 120) | 5,
                _ => u128::MAX - u128::from(small),
            };
            let lists: Vec<Vec<u128>> =
                sources.iter().map(|s| s.iter().copied().map(id).collect()).collect();
            let mut want: Vec<u128> = lists.concat();
            want.sort_unstable();
            want.dedup();
            let got = distinct_sorted(lists.len(), |s| lists[s].iter().copied());
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_record_and_an_event_are_small() {
        // Rule 6: 3.67 M events and 1.22 M records of a 1.2 M-task log.
        assert_eq!(std::mem::size_of::<Rec>(), 64);
        assert_eq!(std::mem::size_of::<Ev>(), 24);
        // Rule 7: a task's row is one cache line.
        assert_eq!(std::mem::size_of::<Row>(), 64);
        assert_eq!(std::mem::align_of::<Row>(), 64);
        let mut r = Rec {
            parent: [0; 2],
            has_parent: false,
            index: 0,
            name: 0,
            args: Val { start: 0, len: 0 },
            ids: 0,
            inputs: 0,
            outputs: 0,
            parent_ix: NONE,
        };
        assert_eq!(r.parent(), None);
        let id = (7u128 << 100) | (3 << 64) | 0xdead_beef;
        r.parent = [(id >> 64) as u64, id as u64];
        r.has_parent = true;
        assert_eq!(r.parent(), Some(id));
        assert_eq!(Ev::new(u128::MAX - 5, 9).id(), u128::MAX - 5);
    }

    /// Rule 4's tree as first written: a new vector per level, keys derived for every node.
    fn merkle_by_levels(mut level: Vec<[u8; 32]>) -> [u8; 32] {
        let key = "veriflow certifier node v1";
        if level.is_empty() {
            return *blake3::Hasher::new_derive_key(key).finalize().as_bytes();
        }
        while level.len() > 1 {
            level = level
                .chunks(2)
                .map(|pair| match pair {
                    [a, b] => {
                        let mut h = blake3::Hasher::new_derive_key(key);
                        h.update(a);
                        h.update(b);
                        *h.finalize().as_bytes()
                    }
                    _ => pair[0],
                })
                .collect();
        }
        level[0]
    }

    /// A track of one task `t` writing datum `d` with digest `wrote`, its copy returned to
    /// vnode 1 with digest `returned` (if any).
    fn one_task(returned: Option<Digest>) -> (Track, Vec<Ix>) {
        use veriflow_runtime::log::{Output, RunStatus};
        let (t, d) = (TaskId(7), DataId(8));
        let manifest = Manifest {
            program: "test".to_string(),
            root: t,
            root_name: "root".to_string(),
            root_args: Vec::new(),
            inputs: Vec::new(),
            terminal: vec![d],
            vnodes: 2,
            seed: 0,
            status: RunStatus::Finished,
            tool_version: String::new(),
            generation: 0,
        };
        let output = |digest: Digest| Output {
            data: d,
            value: Payload::Inline(vec![1]),
            digest,
        };
        let mut track = Track::live(manifest, 0);
        let v = VnodeId(0);
        track.absorb(
            v,
            Event::Declared(Declared {
                task: t,
                parent: None,
                index: 0,
                name: "root".into(),
                args: Vec::new().into(),
                inputs: Vec::new(),
                outputs: vec![d],
            }),
        );
        track.absorb(
            v,
            Event::Started {
                task: t,
                inputs: Vec::new(),
            },
        );
        track.absorb(
            v,
            Event::Completed {
                task: t,
                outputs: vec![output(Digest([1; 32]))],
                children: Vec::new(),
            },
        );
        if let Some(g) = returned {
            track.absorb(VnodeId(1), Event::Returned { output: output(g) });
        }
        let (gs, errors) = track.terminal_subgraph(&[d]);
        assert!(errors.is_empty(), "{errors:?}");
        (track, gs)
    }

    /// Rule 3: a copy returned to a victim with another digest than its writer's is named,
    /// though the check looks up only the data that were returned.
    #[test]
    fn a_returned_copy_with_another_digest_is_named() {
        let (track, gs) = one_task(Some(Digest([2; 32])));
        let errors = track.structural_check(&gs);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].message.contains("received digest"), "{errors:?}");
        let (track, gs) = one_task(Some(Digest([1; 32])));
        assert!(track.structural_check(&gs).is_empty());
        let (track, gs) = one_task(None);
        assert!(track.structural_check(&gs).is_empty());
    }

    /// Rule 5: a written datum's value is its writer's (kept once, in the writer's record), a
    /// program input's is its `Input` event's, and a datum no log holds has none.
    #[test]
    fn a_datum_s_value_is_its_writer_s_else_the_program_input_s() {
        use veriflow_runtime::log::Output;
        let (mut track, _) = one_task(None);
        let (written, input, nothing) = (DataId(8), DataId(9), DataId(10));
        track.absorb(
            VnodeId(0),
            Event::Input {
                output: Output {
                    data: input,
                    value: Payload::Inline(vec![3]),
                    digest: Digest([3; 32]),
                },
            },
        );
        let value = |d| track.value(d).map(|(v, digest)| (v.to_payload(), digest));
        assert_eq!(
            value(written),
            Some((Payload::Inline(vec![1]), Digest([1; 32])))
        );
        assert_eq!(
            value(input),
            Some((Payload::Inline(vec![3]), Digest([3; 32])))
        );
        assert_eq!(value(nothing), None);
        let data = |d| track.data(d).unwrap();
        assert_eq!(data(written).writer, Some(0));
        assert_eq!(data(written).digest, Some(Digest([1; 32])));
        assert!(data(written).input.is_none());
        assert_eq!(data(input).digest, Some(Digest([3; 32])));
        // A second completion with another digest is a conflict, and the first value stays.
        track.absorb(
            VnodeId(1),
            Event::Completed {
                task: TaskId(7),
                outputs: vec![Output {
                    data: written,
                    value: Payload::Inline(vec![2]),
                    digest: Digest([2; 32]),
                }],
                children: Vec::new(),
            },
        );
        assert_eq!(track.conflicts.len(), 1, "{:?}", track.conflicts);
        assert_eq!(track.value(written).map(|(_, d)| d), Some(Digest([1; 32])));
    }

    /// Leaves of many tasks, some with inline arguments and some stored, across batches:
    /// each the leaf of that task alone (a batch of one), and the roots over them those of
    /// the tree by levels.
    #[test]
    fn leaves_hashed_in_batches_are_the_leaves_one_by_one() {
        let (mut track, _) = one_task(None);
        let v = VnodeId(1);
        for i in 0..6000u128 {
            let task = TaskId(i * 0x9e37_79b9_7f4a_7c15 + 11);
            let args = match i % 3 {
                0 => Payload::Inline(vec![i as u8; (i % 7) as usize]),
                1 => Payload::Stored {
                    digest: Digest([i as u8; 32]),
                    len: 9000,
                },
                _ => Payload::Inline(Vec::new()),
            };
            let d = DataId(i + 100);
            track.absorb(
                v,
                Event::Declared(Declared {
                    task,
                    parent: Some(TaskId(7)),
                    index: i as u32,
                    name: if i % 2 == 0 { "a" } else { "bb" }.into(),
                    args,
                    inputs: vec![DataId(8)],
                    outputs: vec![d],
                }),
            );
            if i % 5 != 0 {
                track.absorb(
                    v,
                    Event::Completed {
                        task,
                        outputs: vec![veriflow_runtime::log::Output {
                            data: d,
                            value: Payload::Inline(vec![2]),
                            digest: Digest([3; 32]),
                        }],
                        children: vec![TaskId(i)],
                    },
                );
            }
        }
        let leaves = track.leaves();
        let one_by_one: Vec<[u8; 32]> = (0..track.len() as Ix).map(|t| track.leaf(t)).collect();
        assert_eq!(leaves, one_by_one);
        // One batch reused for batch after batch.
        let mut batch = LeafBatch::default();
        for from in (0..track.len()).step_by(700) {
            let to = (from + 700).min(track.len());
            batch.clear();
            for t in from..to {
                batch.gather(&track, t as Ix);
            }
            let mut out = vec![[0; 32]; to - from];
            batch.hash_into(&mut out);
            assert_eq!(out, one_by_one[from..to]);
        }
        let all = track.sorted_by_id(0..track.len() as Ix);
        let by_levels = merkle_by_levels(all.iter().map(|&t| one_by_one[t as usize]).collect());
        assert_eq!(track.merkle_root(&all), by_levels);
        assert_eq!(track.log_digest(), by_levels);
    }

    /// Rule 1: the ids resolved at load in groups, in parallel chunks, are the ids looked up
    /// one by one, found or not, on a sorted index and on a hash index.
    #[test]
    fn ids_resolved_in_groups_are_the_ids_looked_up_one_by_one() {
        let mut ids: Vec<u128> = (0..50_000u128)
            .map(|i| {
                u128::from_le_bytes(
                    blake3::hash(&i.to_le_bytes()).as_bytes()[..16]
                        .try_into()
                        .unwrap(),
                )
            })
            .collect();
        ids.sort_unstable();
        // Present ids, absent ones, and items without an id, past chunk and group edges.
        let items: Vec<Option<u128>> = (0..70_003usize)
            .map(|k| match k % 5 {
                0 => None,
                1 => Some(ids[k % ids.len()] ^ 1),
                _ => Some(ids[(k * 7919) % ids.len()]),
            })
            .collect();
        let sorted = Index::sorted(&ids);
        let mut live = Index::live();
        let mut grown = Vec::new();
        for &id in &ids {
            live.get_or_push(&mut grown, id);
        }
        for (index, ids) in [(&sorted, &ids), (&live, &grown)] {
            let all = index.get_all(ids, &items, |&x| x);
            let one_by_one: Vec<u32> = items
                .iter()
                .map(|x| x.and_then(|id| index.get(ids, id)).unwrap_or(NONE))
                .collect();
            assert_eq!(all, one_by_one);
            assert!(all.iter().filter(|&&x| x != NONE).count() > items.len() / 2);
        }
    }

    #[test]
    fn the_in_place_tree_has_the_roots_of_the_tree_by_levels() {
        // Sizes around the parallel chunks (2 × 4096 leaves) and odd levels.
        for n in [
            0,
            1,
            2,
            3,
            5,
            8191,
            8192,
            8193,
            16_385,
            3 * 8192 + 5,
            70_001,
        ] {
            let leaves: Vec<[u8; 32]> = (0..n as u64)
                .map(|i| *blake3::hash(&i.to_le_bytes()).as_bytes())
                .collect();
            assert_eq!(
                merkle(leaves.clone()),
                merkle_by_levels(leaves),
                "{n} leaves"
            );
        }
    }
}

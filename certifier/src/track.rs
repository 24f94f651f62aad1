//! The execution track: G rebuilt from every vnode's log, the terminal subgraph G_S, the
//! structural check and the Merkle root that ties a certificate to a log.
//!
//! Rules:
//!
//! 1. Loading is linear in the number of events (segments decoded in parallel while the
//!    events decoded before are merged, `LogReader::stream`; nothing of the log is held but
//!    G itself).
//!    Every task gets one dense index; a task's record comes from `Declared` (or the
//!    `Adopted` copy, which must be equal), its reads from `Started`, its writes and children
//!    from `Completed`. Two logs that disagree about one task or one datum are a
//!    [`Conflict`], never silently merged.
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
//!    independent of how events were spread over segments and vnodes. (The keyed hashers are
//!    derived once and cloned: the same bytes as deriving them for every leaf and node.)
//! 5. A written value is kept once, in its writer's record as its `Completed` logged it (the
//!    event's outputs moved in whole, no copy of the (datum, digest) pairs); a datum's record
//!    holds its writer, the digest of its value, a program input's value and the copies
//!    returned to victims. [`Track::value`] is a datum's logged value: its writer's (the first
//!    output naming it), else the program input's.

use std::sync::{Arc, LazyLock};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use veriflow_checkpoint::Store;
use veriflow_runtime::log::{
    Declared, Event, LogError, LogReader, Manifest, Output, Payload, TornTail,
};
use veriflow_runtime::{DataId, Digest, IdMap, IdSet, TaskId, VnodeId};

/// Index of a task in a [`Track`].
pub type Ix = u32;

/// One task of G, merged from every log that mentions it (rule 1).
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
    /// The values it wrote itself (`Completed`), as logged; `None` if not completed. A written
    /// datum's logged value is here, not in its [`DataRec`] (rule 5).
    pub wrote: Option<Vec<Output>>,
    /// Children it declared (`Completed`), in spawn order.
    pub children: Vec<TaskId>,
    /// Input digests of the values its thief adopted with it (`Adopted`), and the thief.
    pub adopted: Option<(VnodeId, Vec<Digest>)>,
}

/// One data object of G.
#[derive(Clone, Debug, Default)]
pub struct DataRec {
    /// The task that wrote it (`None` for a program input or a datum never written).
    pub writer: Option<Ix>,
    /// The digest of its logged value ([`Track::value`]): its writer's, else the program
    /// input's (kept here for the structural check, rule 5).
    pub digest: Option<Digest>,
    /// A program input's logged value and digest (the `Input` event), boxed: few data are
    /// inputs. A written datum's is in its writer's [`TaskRec::wrote`]; [`Track::value`] gives
    /// either (rule 5).
    pub input: Option<Box<(Payload, Digest)>>,
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

/// G as read from the logs of one generation.
#[derive(Debug)]
pub struct Track {
    /// The run's manifest.
    pub manifest: Manifest,
    /// The generation read.
    pub generation: u32,
    /// Tasks, by dense index.
    pub tasks: Vec<TaskRec>,
    index: IdMap<TaskId, Ix>,
    /// Data objects.
    pub data: IdMap<DataId, DataRec>,
    /// Disagreements between logs (rule 1).
    pub conflicts: Vec<Conflict>,
    /// Torn last segments that were skipped.
    pub torn: Vec<(VnodeId, TornTail)>,
    /// Events read.
    pub events: u64,
    /// The store the log is in: large values are read from its value store.
    pub store: Option<ValueSource>,
    /// The data with copies returned to victims ([`DataRec::returned`] not empty): few, so the
    /// structural check looks a written datum up only when it is one of them (rule 3).
    returned: IdSet<DataId>,
}

impl Track {
    /// Reads the current generation of the log in `store` (rule 1).
    pub fn load(store: Arc<dyn Store>) -> Result<Track, LogError> {
        let reader = LogReader::latest(store)?;
        Track::load_from(&reader)
    }

    /// Reads the generation `reader` reads.
    pub fn load_from(reader: &LogReader) -> Result<Track, LogError> {
        let manifest = reader.manifest()?;
        let mut t = Track::live(manifest, reader.generation());
        t.store = Some(ValueSource(reader.store().clone()));
        let vnodes = reader.vnodes()?;
        // About 3 events per task (declared, started, completed) and a datum per task.
        let tasks = usize::try_from(reader.events_hint(&vnodes) / 3).unwrap_or(0);
        t.tasks.reserve(tasks);
        t.index.reserve(tasks);
        t.data.reserve(tasks);
        let read = reader.stream(&vnodes, &mut |v, e| t.absorb(v, e.event))?;
        for r in read {
            if let Some(torn) = r.torn {
                t.torn.push((r.vnode, torn));
            }
        }
        Ok(t)
    }

    /// An empty track of a run still going on, grown by [`Track::absorb`] (`online.rs`).
    pub fn live(manifest: Manifest, generation: u32) -> Track {
        Track {
            manifest,
            generation,
            tasks: Vec::new(),
            index: IdMap::default(),
            data: IdMap::default(),
            conflicts: Vec::new(),
            torn: Vec::new(),
            events: 0,
            store: None,
            returned: IdSet::default(),
        }
    }

    fn ix(&mut self, id: TaskId) -> Ix {
        let next = self.tasks.len() as Ix;
        let i = *self.index.entry(id).or_insert(next);
        if i == next {
            self.tasks.push(TaskRec {
                id,
                ..TaskRec::default()
            });
        }
        i
    }

    fn conflict(&mut self, task: TaskId, what: String) {
        self.conflicts.push(Conflict {
            task: format!("{task:#}"),
            what,
        });
    }

    fn set_record(&mut self, v: VnodeId, record: Declared, declared: bool) {
        let i = self.ix(record.task) as usize;
        match &self.tasks[i].record {
            Some(r) if *r != record => {
                let task = record.task;
                self.conflict(task, format!("{v} logged another record for it"));
            }
            Some(_) => {}
            None => self.tasks[i].record = Some(record),
        }
        if declared {
            self.tasks[i].declared_on.get_or_insert(v);
        }
    }

    /// Adds one event that vnode `v` logged (rule 1).
    pub fn absorb(&mut self, v: VnodeId, event: Event) {
        self.events += 1;
        match event {
            Event::Declared(d) => self.set_record(v, d, true),
            Event::Adopted {
                victim: _,
                record,
                inputs,
            } => {
                let digests = inputs.iter().map(Payload::digest).collect();
                let i = self.ix(record.task) as usize;
                self.tasks[i].adopted = Some((v, digests));
                self.set_record(v, record, false);
            }
            Event::Stolen { .. } => {}
            Event::Started { task, inputs } => {
                let i = self.ix(task) as usize;
                if self.tasks[i].started.as_ref().is_some_and(|s| *s != inputs) {
                    self.conflict(task, format!("{v} logged another start for it"));
                }
                self.tasks[i].started = Some(inputs);
                self.tasks[i].ran_on = Some(v);
            }
            Event::Completed {
                task,
                outputs,
                children,
            } => {
                let i = self.ix(task);
                if let Some(w) = &self.tasks[i as usize].wrote {
                    // Compared as (datum, digest), as the leaf hashes them.
                    let same = w.len() == outputs.len()
                        && w.iter()
                            .zip(&outputs)
                            .all(|(a, b)| a.data == b.data && a.digest == b.digest);
                    if !same || self.tasks[i as usize].children != children {
                        self.conflict(task, format!("{v} logged another completion for it"));
                    }
                    return;
                }
                for o in &outputs {
                    let d = self.data.entry(o.data).or_default();
                    match d.writer {
                        Some(w) if w != i => {
                            let other = self.tasks[w as usize].id;
                            self.conflict(task, format!("{} is also written by {other}", o.data));
                        }
                        // Written twice in one completion: the first is its value (rule 5).
                        Some(_) => {}
                        None => {
                            d.writer = Some(i);
                            d.digest = Some(o.digest);
                        }
                    }
                }
                let rec = &mut self.tasks[i as usize];
                rec.wrote = Some(outputs);
                rec.children = children;
                rec.ran_on = Some(v);
            }
            Event::Returned { output } => {
                let d = self.data.entry(output.data).or_default();
                d.returned.push((v, output.digest));
                self.returned.insert(output.data);
            }
            Event::Input { output } => {
                let d = self.data.entry(output.data).or_default();
                if d.writer.is_none() {
                    d.digest = Some(output.digest);
                }
                d.input = Some(Box::new((output.value, output.digest)));
            }
        }
    }

    /// Number of tasks in G.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether G has no task.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The index of a task.
    pub fn index_of(&self, id: TaskId) -> Option<Ix> {
        self.index.get(&id).copied()
    }

    /// The terminal outputs of the run (the root's outputs).
    pub fn terminal(&self) -> &[DataId] {
        &self.manifest.terminal
    }

    /// The logged values of the terminal outputs, in the manifest's order, or `None` if one
    /// is in no log read (`log::terminal_outputs` from a track already read); a large one is
    /// read from the value store ([`Track::resolve`]).
    pub fn terminal_values(&self) -> Result<Option<Vec<Vec<u8>>>, LogError> {
        let mut out = Vec::with_capacity(self.manifest.terminal.len());
        for d in &self.manifest.terminal {
            let Some((v, _)) = self.value(*d) else {
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
        let mut seen = vec![false; self.tasks.len()];
        let mut stack: Vec<Ix> = Vec::new();
        let mut need =
            |d: DataId, reader: Option<Ix>, stack: &mut Vec<Ix>, seen: &mut [bool]| match self
                .data
                .get(&d)
            {
                Some(DataRec {
                    writer: Some(w), ..
                }) => {
                    if !seen[*w as usize] {
                        seen[*w as usize] = true;
                        stack.push(*w);
                    }
                }
                Some(DataRec { input: Some(_), .. }) => {}
                _ => errors.push(self.error(
                    reader,
                    Some(d),
                    match reader {
                        Some(_) => "reads a datum that no task wrote".to_string(),
                        None => "terminal output was never written".to_string(),
                    },
                )),
            };
        for &d in s {
            need(d, None, &mut stack, &mut seen);
        }
        while let Some(t) = stack.pop() {
            let rec = &self.tasks[t as usize];
            if let Some(r) = &rec.record {
                for &d in &r.inputs {
                    need(d, Some(t), &mut stack, &mut seen);
                }
                if let Some(p) = r.parent.and_then(|p| self.index_of(p)) {
                    if !seen[p as usize] {
                        seen[p as usize] = true;
                        stack.push(p);
                    }
                }
            }
        }
        let gs = self.sorted_by_id((0..self.tasks.len() as Ix).filter(|&i| seen[i as usize]));
        (gs, errors)
    }

    /// The tasks `ixs`, sorted by id: (id, index) pairs sorted side by side, so the sort reads
    /// memory in order instead of a task record per comparison.
    fn sorted_by_id(&self, ixs: impl Iterator<Item = Ix>) -> Vec<Ix> {
        let mut pairs: Vec<(TaskId, Ix)> = ixs.map(|i| (self.tasks[i as usize].id, i)).collect();
        pairs.par_sort_unstable_by_key(|&(id, _)| id);
        pairs.into_iter().map(|(_, i)| i).collect()
    }

    fn error(&self, task: Option<Ix>, data: Option<DataId>, message: String) -> StructuralError {
        let rec = task.map(|t| &self.tasks[t as usize]);
        StructuralError {
            task: rec.map_or_else(|| "-".to_string(), |r| format!("{:#}", r.id)),
            name: rec.and_then(|r| r.record.as_ref().map(|d| d.name.to_string())),
            vnode: rec.and_then(|r| r.ran_on.or(r.declared_on)).map(|v| v.0),
            data: data.map(|d| format!("{d:#}")),
            message,
        }
    }

    /// The structural check of rule 3 over the tasks `gs`.
    pub fn structural_check(&self, gs: &[Ix]) -> Vec<StructuralError> {
        let mut errors: Vec<StructuralError> = gs
            .par_iter()
            .flat_map_iter(|&t| self.check_task(t))
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

    fn check_task(&self, t: Ix) -> Vec<StructuralError> {
        let mut out = Vec::new();
        let rec = &self.tasks[t as usize];
        let Some(r) = &rec.record else {
            out.push(self.error(Some(t), None, "no log declared it".to_string()));
            return out;
        };
        let (Some(started), Some(wrote)) = (&rec.started, &rec.wrote) else {
            out.push(self.error(Some(t), None, "declared but never completed".to_string()));
            return out;
        };
        // The producer's digest, and (only on a mismatch) who it is.
        let producer = |d: DataId| -> Option<(Digest, Option<Ix>)> {
            let rec = self.data.get(&d)?;
            Some((rec.digest?, rec.writer))
        };
        let who = |writer: Option<Ix>| match writer {
            Some(w) => {
                let wr = &self.tasks[w as usize];
                let on = wr.ran_on.map_or_else(String::new, |v| format!(" on {v}"));
                format!("its producer {}{on}", wr.id)
            }
            None => "the program input".to_string(),
        };
        if started.len() != r.inputs.len() {
            out.push(self.error(
                Some(t),
                None,
                format!("read {} inputs, declared {}", started.len(), r.inputs.len()),
            ));
        }
        for (i, (&d, read)) in r.inputs.iter().zip(started).enumerate() {
            match producer(d) {
                Some((logged, w)) if logged != *read => out.push(self.error(
                    Some(t),
                    Some(d),
                    format!(
                        "read input {i} with digest {read}, but {} logged {logged}",
                        who(w)
                    ),
                )),
                Some(_) => {}
                None => {
                    out.push(self.error(Some(t), Some(d), format!("input {i} has no logged value")))
                }
            }
        }
        if let Some((thief, adopted)) = &rec.adopted {
            for (i, (&d, got)) in r.inputs.iter().zip(adopted).enumerate() {
                if let Some((logged, w)) = producer(d).filter(|(l, _)| l != got) {
                    out.push(self.error(
                        Some(t),
                        Some(d),
                        format!(
                            "{thief} adopted input {i} with digest {got}, but {} logged {logged}",
                            who(w)
                        ),
                    ));
                }
            }
        }
        for o in wrote {
            let (d, digest) = (o.data, o.digest);
            if !r.outputs.contains(&d) {
                out.push(self.error(
                    Some(t),
                    Some(d),
                    "wrote a datum that is not one of its outputs".to_string(),
                ));
            }
            // Most data were never returned: no lookup in `data` for them.
            if let Some(rec) = self
                .returned
                .contains(&d)
                .then(|| self.data.get(&d))
                .flatten()
            {
                for (victim, got) in &rec.returned {
                    if *got != digest {
                        out.push(self.error(
                            Some(t),
                            Some(d),
                            format!("{victim} received digest {got}, the writer logged {digest}"),
                        ));
                    }
                }
            }
        }
        for (i, c) in rec.children.iter().enumerate() {
            let ok = self
                .index_of(*c)
                .and_then(|ci| self.tasks[ci as usize].record.as_ref())
                .is_some_and(|cr| cr.parent == Some(rec.id) && cr.index as usize == i);
            if !ok {
                out.push(self.error(
                    Some(t),
                    None,
                    format!("child {i} ({c}) has no record naming it as parent"),
                ));
            }
        }
        out
    }

    /// The leaf of task `t` (rule 4).
    pub fn leaf(&self, t: Ix) -> [u8; 32] {
        let rec = &self.tasks[t as usize];
        let mut h = LEAF_HASHER.clone();
        h.update(&rec.id.0.to_le_bytes());
        if let Some(r) = &rec.record {
            h.update(&(r.name.len() as u64).to_le_bytes());
            h.update(r.name.as_bytes());
            h.update(&r.args.digest().0);
            h.update(&(r.inputs.len() as u64).to_le_bytes());
            for (i, d) in r.inputs.iter().enumerate() {
                h.update(&d.0.to_le_bytes());
                let read = rec.started.as_ref().and_then(|s| s.get(i)).copied();
                h.update(&read.unwrap_or_default().0);
            }
        }
        let wrote = rec.wrote.as_deref().unwrap_or(&[]);
        h.update(&(wrote.len() as u64).to_le_bytes());
        for o in wrote {
            h.update(&o.data.0.to_le_bytes());
            h.update(&o.digest.0);
        }
        h.update(&(rec.children.len() as u64).to_le_bytes());
        for c in &rec.children {
            h.update(&c.0.to_le_bytes());
        }
        *h.finalize().as_bytes()
    }

    /// The leaf of every task, by index (computed in parallel).
    pub fn leaves(&self) -> Vec<[u8; 32]> {
        (0..self.tasks.len() as Ix)
            .into_par_iter()
            .map(|t| self.leaf(t))
            .collect()
    }

    /// The Merkle root over the leaves of `tasks` (sorted by id; rule 4).
    pub fn merkle_root(&self, tasks: &[Ix]) -> [u8; 32] {
        let leaves: Vec<[u8; 32]> = tasks.par_iter().map(|&t| self.leaf(t)).collect();
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
        let all = self.sorted_by_id(0..self.tasks.len() as Ix);
        self.merkle_root_of(&all, leaves)
    }

    /// The Merkle root of `gs` (a G_S of [`Track::terminal_subgraph`]: sorted by id) and the
    /// log digest, from leaves already computed: one tree when G_S is all of G (then both
    /// roots are over the same leaves in the same order).
    pub fn roots_of(&self, gs: &[Ix], leaves: &[[u8; 32]]) -> ([u8; 32], [u8; 32]) {
        let root = self.merkle_root_of(gs, leaves);
        if gs.len() == self.tasks.len() {
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
        let rec = &self.tasks[t as usize];
        let wrote = rec.wrote.as_deref().unwrap_or(&[]);
        let out = wrote
            .iter()
            .flat_map(move |o| readers.get(&o.data).into_iter().flatten().copied());
        let kids = rec.children.iter().filter_map(move |c| self.index_of(*c));
        out.chain(kids)
    }

    /// Who reads each datum.
    pub(crate) fn readers(&self) -> IdMap<DataId, Vec<Ix>> {
        let mut m: IdMap<DataId, Vec<Ix>> = IdMap::default();
        for (i, t) in self.tasks.iter().enumerate() {
            if let Some(r) = &t.record {
                for &d in &r.inputs {
                    m.entry(d).or_default().push(i as Ix);
                }
            }
        }
        m
    }

    /// The logged input values of task `t`, in input order; `None` if one has no logged
    /// value. A large value is read from the value store: an error if it is not there or not
    /// what its digest says.
    pub fn input_values(&self, t: Ix) -> Result<Option<Vec<Vec<u8>>>, LogError> {
        let Some(r) = self.tasks[t as usize].record.as_ref() else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(r.inputs.len());
        for d in &r.inputs {
            let Some((v, _)) = self.value(*d) else {
                return Ok(None);
            };
            out.push(self.resolve(v)?);
        }
        Ok(Some(out))
    }

    /// The logged value of `d` and its digest (rule 5): its writer's, else the program
    /// input's; `None` if no log read holds it. A large one is a reference into the value
    /// store, read when a re-run needs it ([`Track::resolve`]; rule 10 of the runtime's
    /// `log/mod.rs`).
    pub fn value(&self, d: DataId) -> Option<(&Payload, Digest)> {
        let rec = self.data.get(&d)?;
        match rec.writer.and_then(|w| self.written(w, d)) {
            Some(o) => Some((&o.value, o.digest)),
            None => rec.input.as_ref().map(|b| (&b.0, b.1)),
        }
    }

    /// What task `w` logged writing `d`, if it did.
    fn written(&self, w: Ix, d: DataId) -> Option<&Output> {
        self.tasks[w as usize]
            .wrote
            .as_deref()?
            .iter()
            .find(|o| o.data == d)
    }

    /// The bytes of a logged value: its own, or read from the value store and checked.
    pub fn resolve(&self, p: &Payload) -> Result<Vec<u8>, LogError> {
        match (p, &self.store) {
            (Payload::Inline(b), _) => Ok(b.clone()),
            (Payload::Stored { digest, len }, Some(ValueSource(store))) => {
                veriflow_runtime::log::values::load(&**store, *digest, *len)
            }
            (Payload::Stored { digest, .. }, None) => Err(LogError::Value {
                digest: *digest,
                reason: "is in a value store this reader was not given".to_string(),
            }),
        }
    }
}

/// The hasher of a leaf (rule 4), derived once.
static LEAF_HASHER: LazyLock<blake3::Hasher> =
    LazyLock::new(|| blake3::Hasher::new_derive_key("veriflow certifier leaf v1"));
/// The hasher of a node, derived once.
static NODE_HASHER: LazyLock<blake3::Hasher> =
    LazyLock::new(|| blake3::Hasher::new_derive_key("veriflow certifier node v1"));

/// Pairwise blake3 up to one root; an odd node is carried up; the empty tree's root is the
/// hash of nothing under the node key. Each level is hashed in place, in parallel chunks.
pub(crate) fn merkle(mut level: Vec<[u8; 32]>) -> [u8; 32] {
    if level.is_empty() {
        return *NODE_HASHER.clone().finalize().as_bytes();
    }
    let node = &*NODE_HASHER;
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
                    Some(b) => {
                        let mut h = node.clone();
                        h.update(&chunk[2 * i]);
                        h.update(b);
                        *h.finalize().as_bytes()
                    }
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
        let value = |d| track.value(d).map(|(v, digest)| (v.clone(), digest));
        assert_eq!(
            value(written),
            Some((Payload::Inline(vec![1]), Digest([1; 32])))
        );
        assert_eq!(
            value(input),
            Some((Payload::Inline(vec![3]), Digest([3; 32])))
        );
        assert_eq!(value(nothing), None);
        assert_eq!(track.data[&written].writer, Some(0));
        assert_eq!(track.data[&written].digest, Some(Digest([1; 32])));
        assert!(track.data[&written].input.is_none());
        assert_eq!(track.data[&input].digest, Some(Digest([3; 32])));
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

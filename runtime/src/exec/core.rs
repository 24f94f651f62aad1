//! The part of the data-flow graph one vnode owns, with its dependency counters.
//!
//! Rules:
//!
//! 1. Every task declared on or adopted by this vnode has an entry for each of its outputs in
//!    `data` before it can run, so a write always finds its entry (delegation keeps the id).
//! 2. A task's `missing` counter is the number of its inputs not yet written; it becomes ready
//!    when that reaches zero, and at that moment it *takes* its input values (and their
//!    digests), so running it and giving it to a thief need nothing more from `data`.
//! 3. A data entry is dropped once it is written, no task waits for it, no declared reader is
//!    left, and the scope that declared it has ended (`open` false); terminal outputs are
//!    pinned and never dropped. A completed task's record lives on in the log, not in memory.
//! 4. `work` (see `exec/mod.rs` rule 4) counts each live task and each obligation (a value to
//!    return, an acknowledgement awaited) and is raised *before* it is lowered elsewhere, so
//!    the sum over vnodes is zero only when the run is over.

use std::any::TypeId;
use std::borrow::Cow;
use std::collections::{HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use smallvec::SmallVec;

use super::forge::ForgeMode;
use super::shared::RunShared;
use crate::codec::Digest;
use crate::error::RunError;
use crate::ids::{DataId, IdHasher, IdMap, IdSet, TaskId, VnodeId};
use crate::log::{Declared, Event, Output, Payload, VnodeLog};
use crate::task::value::Value;
use crate::task::{ErasedTask, IdList, Registry, Task};

/// A task as the scheduler holds it.
pub(crate) struct TaskSpec {
    pub(crate) id: TaskId,
    pub(crate) parent: Option<TaskId>,
    pub(crate) index: u32,
    pub(crate) body: Box<dyn ErasedTask>,
    pub(crate) inputs: IdList,
    pub(crate) outputs: IdList,
    /// Encoded arguments, when already known (logged or received).
    pub(crate) args: Option<Vec<u8>>,
}

/// A task whose inputs are all there (rule 2).
pub(crate) struct ReadyTask {
    pub(crate) spec: TaskSpec,
    pub(crate) values: Vec<Value>,
    /// Digests of `values` (empty when not logging).
    pub(crate) digests: Vec<Digest>,
}

struct Waiting {
    spec: TaskSpec,
    missing: u32,
}

#[derive(Default)]
struct DataEntry {
    value: Option<Value>,
    digest: Option<Digest>,
    waiters: SmallVec<[TaskId; 1]>,
    readers: u32,
    open: bool,
    pinned: bool,
    /// Vnodes this value is owed to: the victims of the adopted tasks that write it here.
    return_to: SmallVec<[VnodeId; 1]>,
}

impl DataEntry {
    /// Rule 3: written, no waiter, no reader left, scope ended, not a terminal output.
    fn droppable(&self) -> bool {
        self.value.is_some()
            && !self.open
            && !self.pinned
            && self.readers == 0
            && self.waiters.is_empty()
    }
}

pub(crate) struct Core {
    pub(crate) vnode: VnodeId,
    registry: Arc<Registry>,
    checked: HashSet<TypeId, BuildHasherDefault<IdHasher>>,
    waiting: IdMap<TaskId, Waiting>,
    pub(crate) ready: VecDeque<ReadyTask>,
    data: IdMap<DataId, DataEntry>,
    pub(crate) log: Option<VnodeLog>,
    pub(crate) shared: Arc<RunShared>,
    /// Values written here that belong to another vnode: (to, value, log sequence to wait for).
    pub(crate) returns: Vec<(VnodeId, Output, u64)>,
    pub(crate) completed: u64,
    /// After a recovery: every task the log already declared here (recovery rule 3: a
    /// restarted task's children are recognised by id, not declared again). Empty otherwise.
    pub(crate) known: IdSet<TaskId>,
}

impl Core {
    pub(crate) fn new(
        vnode: VnodeId,
        registry: Arc<Registry>,
        log: Option<VnodeLog>,
        shared: Arc<RunShared>,
    ) -> Self {
        Core {
            vnode,
            registry,
            checked: HashSet::default(),
            waiting: IdMap::default(),
            ready: VecDeque::new(),
            data: IdMap::default(),
            log,
            shared,
            returns: Vec::new(),
            completed: 0,
            known: IdSet::default(),
        }
    }

    /// Tasks waiting for inputs, with the inputs they miss (`waits.rs` rule 2).
    pub(crate) fn blocked(&self) -> (usize, Vec<(TaskId, Vec<DataId>)>) {
        super::waits::sample(self.waiting.iter().map(|(t, w)| {
            let missing = w
                .spec
                .inputs
                .iter()
                .copied()
                .filter(|d| self.data.get(d).is_none_or(|e| e.value.is_none()))
                .take(4)
                .collect();
            (*t, missing)
        }))
    }

    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    fn internal(&self, message: String) -> RunError {
        RunError::Internal {
            vnode: self.vnode,
            message,
        }
    }

    /// Whether `T` is registered (cached per type: this is on the spawn path).
    pub(crate) fn is_registered<T: Task>(&mut self) -> bool {
        let t = TypeId::of::<T>();
        if self.checked.contains(&t) {
            return true;
        }
        let ok = self.registry.contains::<T>();
        if ok {
            self.checked.insert(t);
        }
        ok
    }

    /// Sequence number to wait for before a message caused by what was just logged may leave.
    pub(crate) fn log_position(&self) -> u64 {
        self.log.as_ref().map_or(0, |l| l.appended())
    }

    pub(crate) fn logging(&self) -> bool {
        self.log.is_some()
    }

    pub(crate) fn append(&mut self, event: &Event) -> Result<u64, RunError> {
        match &mut self.log {
            Some(log) => Ok(log.append(event)?),
            None => Ok(0),
        }
    }

    /// A new data object declared by a running task's scope (rule 3). After a recovery the
    /// entry may exist already (rebuilt from the log): its scope is open again.
    pub(crate) fn create_data(&mut self, id: DataId) {
        self.data.entry(id).or_default().open = true;
    }

    /// A terminal output: never dropped.
    pub(crate) fn pin(&mut self, id: DataId) {
        let e = self.data.entry(id).or_default();
        e.pinned = true;
        e.open = true;
    }

    /// Recovery: keeps `id` from being dropped while the live tasks are wired one by one (an
    /// early reader that finds the value would otherwise drop it before a later reader is
    /// wired); `true` if it was closed, and then [`Core::close`] must follow.
    pub(crate) fn hold(&mut self, id: DataId) -> bool {
        let e = self.data.entry(id).or_default();
        !std::mem::replace(&mut e.open, true)
    }

    /// Recovery: a data entry as the log left it (value if written), scope closed.
    pub(crate) fn restore_data(&mut self, id: DataId, value: Option<(Vec<u8>, Digest)>) {
        let e = self.data.entry(id).or_default();
        if let (None, Some((bytes, digest))) = (&e.value, value) {
            e.value = Some(Value::bytes(bytes));
            e.digest = Some(digest);
        }
    }

    /// Recovery: written values owed to victims (their acknowledgements are not logged, so
    /// they are sent again; victims ignore duplicates).
    pub(crate) fn owed_returns(&mut self) -> Result<(), RunError> {
        let owed: Vec<DataId> = self
            .data
            .iter()
            .filter(|(_, e)| e.value.is_some() && !e.return_to.is_empty())
            .map(|(&id, _)| id)
            .collect();
        for id in owed {
            let e = &self.data[&id];
            let value = e
                .value
                .as_ref()
                .map(Value::encode)
                .transpose()
                .map_err(|err| RunError::Encode {
                    what: format!("value of {id}"),
                    reason: err.to_string(),
                })?;
            let (Some(bytes), Some(digest)) = (value, e.digest) else {
                continue;
            };
            for to in e.return_to.clone() {
                self.shared.work_add(self.vnode);
                self.returns.push((
                    to,
                    Output {
                        data: id,
                        value: bytes.clone().into(),
                        digest,
                    },
                    0,
                ));
            }
        }
        Ok(())
    }

    /// An output of an adopted task, to be returned to `victim` when written. The entry may
    /// already be here: when a task stolen from us delegated this output to a child that we
    /// now steal back, the value is written here for our own readers *and* owed to `victim`,
    /// whose obligation only the value can discharge.
    pub(crate) fn create_return(&mut self, id: DataId, victim: VnodeId) {
        let e = self.data.entry(id).or_default();
        if !e.return_to.contains(&victim) {
            e.return_to.push(victim);
        }
    }

    /// The value of `id` if it is here and written.
    pub(crate) fn value(&self, id: DataId) -> Option<&Value> {
        self.data.get(&id).and_then(|e| e.value.as_ref())
    }

    /// Whether `id` is here and not yet written.
    pub(crate) fn awaits(&self, id: DataId) -> bool {
        self.data.get(&id).is_some_and(|e| e.value.is_none())
    }

    /// Declares a task on this vnode (logs `Declared`, counts it live, wires its inputs).
    pub(crate) fn declare(&mut self, mut spec: TaskSpec) -> Result<(), RunError> {
        if !self.known.is_empty() && self.known.contains(&spec.id) {
            return Ok(()); // recovery rule 3
        }
        if self.log.is_some() {
            let args = match spec.args.take() {
                Some(a) => a,
                None => spec.body.encode_args().map_err(|e| RunError::Encode {
                    what: format!("arguments of task {}", spec.body.name()),
                    reason: e.to_string(),
                })?,
            };
            let event = Event::Declared(Declared {
                task: spec.id,
                parent: spec.parent,
                index: spec.index,
                name: Cow::Borrowed(spec.body.name()),
                args: Payload::Inline(args),
                inputs: spec.inputs.to_vec(),
                outputs: spec.outputs.to_vec(),
            });
            self.append(&event)?;
            if let Event::Declared(d) = event {
                spec.args = d.args.into_inline();
            }
        }
        self.wire(spec)
    }

    /// Counts a declared task live and wires its inputs (rule 2); recovery calls it for the
    /// tasks the log declared, without logging them again.
    pub(crate) fn wire(&mut self, spec: TaskSpec) -> Result<(), RunError> {
        self.shared.work_add(self.vnode);
        let mut missing = 0;
        for &input in &spec.inputs {
            let Some(e) = self.data.get_mut(&input) else {
                return Err(self.internal(format!("task {} reads unknown {input}", spec.id)));
            };
            e.readers += 1;
            if e.value.is_none() {
                e.waiters.push(spec.id);
                missing += 1;
            }
        }
        if missing == 0 {
            self.make_ready(spec)?;
        } else {
            self.waiting.insert(spec.id, Waiting { spec, missing });
        }
        Ok(())
    }

    /// Adds an already-ready task (adopted from a thief's grant) and counts it live.
    pub(crate) fn push_ready(&mut self, task: ReadyTask) {
        self.shared.work_add(self.vnode);
        self.ready.push_back(task);
    }

    /// Takes a task's input values (rule 2) and queues it. The task goes into `ready` where it
    /// is built, not returned: a `TaskSpec` is a few hundred bytes, and each move of it was a
    /// `memcpy` on the spawn path (11 % of an empty-task run).
    fn make_ready(&mut self, spec: TaskSpec) -> Result<(), RunError> {
        let mut values = Vec::with_capacity(spec.inputs.len());
        let mut digests = Vec::new();
        let logging = self.log.is_some();
        for &input in &spec.inputs {
            let Some(e) = self.data.get_mut(&input) else {
                return Err(self.internal(format!("task {} lost input {input}", spec.id)));
            };
            let Some(v) = e.value.clone() else {
                return Err(self.internal(format!("task {} ready before {input}", spec.id)));
            };
            values.push(v);
            if logging {
                digests.push(e.digest.unwrap_or_default());
            }
            e.readers -= 1;
            if e.droppable() {
                self.data.remove(&input);
            }
        }
        self.ready.push_back(ReadyTask {
            spec,
            values,
            digests,
        });
        Ok(())
    }

    /// Writes `value` into `id` and wakes its readers.
    pub(crate) fn write(
        &mut self,
        id: DataId,
        value: Value,
        digest: Option<Digest>,
        encoded: Option<Vec<u8>>,
        seq: u64,
    ) -> Result<(), RunError> {
        let vnode = self.vnode;
        let Some(e) = self.data.get_mut(&id) else {
            return Err(self.internal(format!("write to unknown {id}")));
        };
        if e.value.is_some() {
            return Err(self.internal(format!("{id} written twice")));
        }
        if !e.return_to.is_empty() {
            let bytes = match encoded {
                Some(b) => b,
                None => value.encode().map_err(|err| RunError::Encode {
                    what: format!("value of {id}"),
                    reason: err.to_string(),
                })?,
            };
            let digest = digest.unwrap_or_else(|| Digest::of(&bytes));
            e.digest = Some(digest);
            for &to in &e.return_to {
                // Rule 4: the obligation is raised before the writer's completion lowers it.
                self.shared.work_add(vnode);
                let output = Output {
                    data: id,
                    value: bytes.clone().into(),
                    digest,
                };
                self.returns.push((to, output, seq));
            }
        } else {
            e.digest = digest;
        }
        e.value = Some(value);
        let waiters = std::mem::take(&mut e.waiters);
        for w in waiters {
            let now_ready = match self.waiting.get_mut(&w) {
                Some(t) => {
                    t.missing -= 1;
                    t.missing == 0
                }
                None => return Err(self.internal(format!("{id} wakes unknown task {w}"))),
            };
            if now_ready {
                if let Some(t) = self.waiting.remove(&w) {
                    self.make_ready(t.spec)?;
                }
            }
        }
        self.maybe_drop(id);
        Ok(())
    }

    /// The scope that declared `ids` has ended (rule 3).
    pub(crate) fn close(&mut self, ids: &[DataId]) {
        for &id in ids {
            if let Some(e) = self.data.get_mut(&id) {
                e.open = false;
                self.maybe_drop(id);
            }
        }
    }

    /// Drops every entry [`Core::maybe_drop`] would (recovery restores values before it knows
    /// which readers are left).
    pub(crate) fn sweep(&mut self) {
        self.data.retain(|_, e| !e.droppable());
    }

    /// Tasks and data entries held: what the graph costs in memory (the live frontier).
    pub(crate) fn graph_size(&self) -> u64 {
        (self.waiting.len() + self.ready.len() + self.data.len()) as u64
    }

    fn maybe_drop(&mut self, id: DataId) {
        if self.data.get(&id).is_some_and(DataEntry::droppable) {
            self.data.remove(&id);
        }
    }

    /// Forgery injection (`forge.rs`): replaces the values this task wrote by plausible wrong
    /// ones (rule 4: in `writes`, or only in what is logged, `log_only`).
    fn forge(
        &mut self,
        id: TaskId,
        name: &'static str,
        writes: &mut SmallVec<[(usize, Value); 2]>,
        log_only: &mut SmallVec<[(usize, Vec<u8>); 1]>,
    ) -> Result<(), RunError> {
        let Some(forge) = &self.shared.forge else {
            return Ok(());
        };
        let Some(kind) = self.registry.get(name) else {
            return Ok(());
        };
        let mut any = false;
        for (i, value) in writes.iter_mut() {
            let bytes = value.encode().map_err(|e| RunError::Encode {
                what: format!("output {i} of task {id}"),
                reason: e.to_string(),
            })?;
            let seed = forge.task_hash(id) ^ (*i as u64);
            let Some(wrong) = kind.forge_output(*i, &bytes, seed) else {
                continue;
            };
            any = true;
            match forge.mode {
                ForgeMode::Consistent => *value = Value::bytes(wrong),
                ForgeMode::LogOnly => log_only.push((*i, wrong)),
            }
        }
        if any {
            self.shared.record_forged(id, self.vnode);
        }
        Ok(())
    }

    /// A task body finished well: log `Completed`, publish its writes, end its scope.
    pub(crate) fn complete(
        &mut self,
        id: TaskId,
        name: &'static str,
        outputs: &[DataId],
        mut writes: SmallVec<[(usize, Value); 2]>,
        children: Vec<TaskId>,
        created: &[DataId],
    ) -> Result<(), RunError> {
        let mut log_only: SmallVec<[(usize, Vec<u8>); 1]> = SmallVec::new();
        if self
            .shared
            .forge
            .as_ref()
            .is_some_and(|f| f.selects(self.vnode, id))
        {
            self.forge(id, name, &mut writes, &mut log_only)?;
        }
        if self.log.is_some() {
            let mut logged = Vec::with_capacity(writes.len());
            for (i, value) in &writes {
                let forged = log_only
                    .iter()
                    .find(|(j, _)| j == i)
                    .map(|(_, b)| b.clone());
                let bytes = match forged {
                    Some(b) => b,
                    None => value.encode().map_err(|e| RunError::Encode {
                        what: format!("output {i} of task {id}"),
                        reason: e.to_string(),
                    })?,
                };
                let digest = Digest::of(&bytes);
                logged.push(Output {
                    data: outputs[*i],
                    value: bytes.into(),
                    digest,
                });
            }
            let event = Event::Completed {
                task: id,
                outputs: logged,
                children,
            };
            let seq = self.append(&event)?;
            let Event::Completed {
                outputs: logged, ..
            } = event
            else {
                unreachable!()
            };
            for ((i, value), out) in writes.into_iter().zip(logged) {
                if log_only.iter().any(|(j, _)| *j == i) {
                    // Forged in the log only: readers get, and log, the honest value.
                    let honest = value.encode().map_err(|e| RunError::Encode {
                        what: format!("output {i} of task {id}"),
                        reason: e.to_string(),
                    })?;
                    let digest = Digest::of(&honest);
                    self.write(out.data, value, Some(digest), Some(honest), seq)?;
                    continue;
                }
                let returning = self
                    .data
                    .get(&out.data)
                    .is_some_and(|e| !e.return_to.is_empty());
                let bytes = returning.then(|| out.value.into_inline()).flatten();
                self.write(out.data, value, Some(out.digest), bytes, seq)?;
            }
        } else {
            for (i, value) in writes {
                self.write(outputs[i], value, None, None, 0)?;
            }
        }
        self.close(created);
        self.completed += 1;
        self.shared.task_done(self.vnode, self.completed);
        Ok(())
    }
}

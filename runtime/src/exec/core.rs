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
//!    A spawn creates its outputs closed unless this vnode was rebuilt from its log (`known`
//!    not empty): until the spawning task has completed, no task here can write or read them
//!    (a vnode runs one task at a time, and handles a steal or a returned value only between
//!    two tasks), so its scope's end would change nothing, and the task keeps no list of them
//!    to close. After a recovery a scope that runs again may find its outputs restored with
//!    their values, so it holds them open until it ends, as every spawn did before.
//! 4. `work` (see `exec/mod.rs` rule 4) counts each live task and each obligation (a value to
//!    return, an acknowledgement awaited) and is raised *before* it is lowered elsewhere, so
//!    the sum over vnodes is zero only when the run is over.
//! 5. A declared task that has not run yet lives in one slot of the task arena (`tasks`) from
//!    its declaration until it runs or is given away: the ready queue and the waiters of a data
//!    entry name it by slot, so it is written once and moved out once, with no map from task
//!    ids to waiting tasks (each move of a `TaskSpec`, a few hundred bytes, and each map
//!    operation was on the spawn path). A slot is reused only once its task has left, and a
//!    waiting task leaves only after its last input woke it, so no waiter names a reused slot.
//! 6. The last reader of a value that is then dropped (rule 3) takes the value instead of a
//!    copy of its handle.
//! 7. What a declaration fixes (parent, index, input and output ids, arguments) lives with the
//!    task's body in one heap block ([`Decl`]), allocated once at the spawn and freed once the
//!    task has completed or moved away; a [`TaskSpec`] is its id and a pointer (32 bytes), so
//!    the arena slot, the ready queue and the running vnode move 96 bytes a task, not the
//!    ~340 of a declaration held inline (16 % of a no-log run's CPU was those moves).
//! 8. The unit of a task completed here is lowered in the shared work word lazily: the
//!    completion counts it in `deferred`, a raise of this vnode first takes a deferred unit
//!    back (the word then does not change: a lower and a raise cancel), and what is left is
//!    lowered in one atomic add by [`Core::publish_work`], which every step of the vnode calls
//!    before it returns (`vnode.rs`). So the word is never below the live count (a zero word
//!    still means no work: rule 4 and the termination test hold) and is exact between steps,
//!    where the driver's termination test, planned failures and a member's report read it.
//!    Two atomic adds a task on a cache line the idle drivers scan were 7 % of a no-log
//!    knary run's samples; a node that completes and declares its children now touches the
//!    word once at most.

use std::any::TypeId;
use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use smallvec::SmallVec;

use super::forge::ForgeMode;
use super::shared::RunShared;
use crate::codec::Digest;
use crate::error::RunError;
use crate::ids::{DataId, IdHasher, IdMap, IdSet, TaskId, VnodeId};
use crate::log::segment::SegmentValues;
use crate::log::{Declared, DeclaredRef, Event, Output, Payload, PayloadView, VnodeLog};
use crate::task::value::Value;
use crate::task::{ErasedTask, IdList, Registry, Task};

/// A task as the scheduler holds it (rule 7): its id beside one heap block with the rest.
pub(crate) struct TaskSpec {
    pub(crate) id: TaskId,
    pub(crate) decl: Box<Decl<dyn ErasedTask>>,
}

/// What a task's declaration fixed, and its body, in one heap block (rule 7).
pub(crate) struct Decl<B: ?Sized> {
    pub(crate) parent: Option<TaskId>,
    pub(crate) index: u32,
    pub(crate) inputs: IdList,
    pub(crate) outputs: IdList,
    /// Encoded arguments, when already known (logged or received).
    pub(crate) args: Option<Vec<u8>>,
    pub(crate) body: B,
}

impl TaskSpec {
    /// A task with its declaration in one block (`body` is a typed task, or a decoded box).
    pub(crate) fn new<B: ErasedTask + 'static>(
        id: TaskId,
        parent: Option<TaskId>,
        index: u32,
        body: B,
        inputs: IdList,
        outputs: IdList,
        args: Option<Vec<u8>>,
    ) -> Self {
        TaskSpec {
            id,
            decl: Box::new(Decl {
                parent,
                index,
                inputs,
                outputs,
                args,
                body,
            }),
        }
    }

    /// Its arguments as logged: the known bytes, or the body's encoding.
    pub(crate) fn take_args(&mut self) -> Result<Vec<u8>, RunError> {
        match self.decl.args.take() {
            Some(a) => Ok(a),
            None => self.decl.body.encode_args().map_err(|e| RunError::Encode {
                what: format!("arguments of task {}", self.decl.body.name()),
                reason: e.to_string(),
            }),
        }
    }

    /// The record of its declaration, with `args` as logged.
    pub(crate) fn record(&self, args: Vec<u8>) -> Declared {
        let d = &self.decl;
        Declared {
            task: self.id,
            parent: d.parent,
            index: d.index,
            name: Cow::Borrowed(d.body.name()),
            args: Payload::Inline(args),
            inputs: d.inputs.to_vec(),
            outputs: d.outputs.to_vec(),
        }
    }
}

/// A task whose inputs are all there (rule 2).
/// A value owed to a victim (`vnode.rs` rule 5): to whom, the data object, its value, its
/// digest as logged (`None` without a log), and the log position of the event that wrote it.
pub(crate) type OwedReturn = (VnodeId, DataId, Value, Option<Digest>, u64);

pub(crate) struct ReadyTask {
    pub(crate) spec: TaskSpec,
    pub(crate) values: Vec<Value>,
    /// Digests of `values` (empty when not logging).
    pub(crate) digests: Vec<Digest>,
}

/// A declared task not yet run (rule 5): `missing` inputs still to be written; its values are
/// taken when that reaches zero.
struct Slot {
    task: ReadyTask,
    missing: u32,
}

/// Slot number in the task arena (rule 5).
type SlotId = u32;

#[derive(Default)]
struct DataEntry {
    value: Option<Value>,
    digest: Option<Digest>,
    /// Arena slots of the tasks waiting for this value (rule 5).
    waiters: SmallVec<[SlotId; 2]>,
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
    /// The task arena (rule 5): `None` marks a free slot, listed in `free`.
    tasks: Vec<Option<Slot>>,
    free: Vec<SlotId>,
    /// Tasks in the arena that wait for inputs.
    waiting: usize,
    /// Slots of the ready tasks, oldest first.
    ready: VecDeque<SlotId>,
    data: IdMap<DataId, DataEntry>,
    pub(crate) log: Option<VnodeLog>,
    pub(crate) shared: Arc<RunShared>,
    /// Values written here that belong to another vnode: (to, value, log sequence to wait for).
    pub(crate) returns: Vec<OwedReturn>,
    pub(crate) completed: u64,
    /// Rule 8: units of completed tasks not yet lowered in the shared work word.
    deferred: u32,
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
            tasks: Vec::new(),
            free: Vec::new(),
            waiting: 0,
            ready: VecDeque::new(),
            data: IdMap::default(),
            log,
            shared,
            returns: Vec::new(),
            completed: 0,
            deferred: 0,
            known: IdSet::default(),
        }
    }

    /// Raises this vnode's work word by one (rule 4), or takes back a deferred unit (rule 8).
    fn work_add(&mut self) {
        if self.deferred > 0 {
            self.deferred -= 1;
        } else {
            self.shared.work_add(self.vnode);
        }
    }

    /// Rule 8: lowers the work word by the units deferred since the last call; every step of
    /// the vnode ends with it.
    pub(crate) fn publish_work(&mut self) {
        if self.deferred > 0 {
            self.shared.work_done_n(self.vnode, self.deferred);
            self.deferred = 0;
        }
    }

    /// Tasks waiting for inputs, with the inputs they miss (`waits.rs` rule 2).
    pub(crate) fn blocked(&self) -> (usize, Vec<(TaskId, Vec<DataId>)>) {
        let waiting = self.tasks.iter().flatten().filter(|s| s.missing > 0);
        super::waits::sample(waiting.map(|w| {
            let missing = w
                .task
                .spec
                .decl
                .inputs
                .iter()
                .copied()
                .filter(|d| self.data.get(d).is_none_or(|e| e.value.is_none()))
                .take(4)
                .collect();
            (w.task.spec.id, missing)
        }))
    }

    /// Puts `task` in a free slot of the arena (rule 5). Inlined: a task built by the caller
    /// and copied in by a call was read back before its last stores had left the store
    /// buffer (two store-forwarding stalls, most of this function's 5 % of a no-log run).
    #[inline(always)]
    fn alloc(&mut self, task: ReadyTask, missing: u32) -> SlotId {
        let slot = Some(Slot { task, missing });
        match self.free.pop() {
            Some(i) => {
                self.tasks[i as usize] = slot;
                i
            }
            None => {
                self.tasks.push(slot);
                // Slots are live tasks of one vnode: far fewer than 2^32.
                u32::try_from(self.tasks.len() - 1).expect("fewer than 2^32 pending tasks")
            }
        }
    }

    /// Takes the task out of slot `i` and frees the slot.
    fn release(&mut self, i: SlotId) -> Option<ReadyTask> {
        let slot = self.tasks.get_mut(i as usize)?.take()?;
        self.free.push(i);
        Some(slot.task)
    }

    /// Ready tasks here.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Whether no task is ready here.
    pub(crate) fn no_ready(&self) -> bool {
        self.ready.is_empty()
    }

    /// The newest ready task (`vnode.rs` rule 1), out of the arena.
    pub(crate) fn pop_ready(&mut self) -> Option<ReadyTask> {
        let i = self.ready.pop_back()?;
        self.release(i)
    }

    /// The oldest ready task whose id and kind `give` accepts (`vnode.rs` rule 3), out of the
    /// arena.
    pub(crate) fn take_oldest_ready(
        &mut self,
        mut give: impl FnMut(TaskId, &'static str) -> bool,
    ) -> Option<ReadyTask> {
        let tasks = &self.tasks;
        let pos = self.ready.iter().position(|&i| {
            tasks[i as usize]
                .as_ref()
                .is_some_and(|s| give(s.task.spec.id, s.task.spec.decl.body.name()))
        })?;
        let i = self.ready.remove(pos)?;
        self.release(i)
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

    /// A new data object declared by a running task's scope (rule 3); `true` if the scope
    /// must close it when it ends (only after a recovery: the entry may exist already, rebuilt
    /// from the log, and its scope is open again).
    pub(crate) fn create_data(&mut self, id: DataId) -> bool {
        let e = self.data.entry(id).or_default();
        if self.known.is_empty() {
            return false; // rule 3: created closed
        }
        e.open = true;
        true
    }

    /// A terminal output: never dropped.
    pub(crate) fn pin(&mut self, id: DataId) {
        let e = self.data.entry(id).or_default();
        e.pinned = true;
        e.open = true;
    }

    /// Keeps `id` from being dropped (rule 3) while its readers are wired: the program inputs
    /// until the root is, and in a recovery the inputs of the live tasks until all of them are
    /// (an early reader that finds the value would otherwise drop it before a later reader is
    /// wired) and the outputs of a scope that runs again; `true` if it was closed, and then
    /// [`Core::close`] must follow.
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
            let (Some(value), Some(digest)) = (e.value.clone(), e.digest) else {
                continue;
            };
            for to in e.return_to.clone() {
                self.work_add();
                self.returns.push((to, id, value.clone(), Some(digest), 0));
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
            let args = spec.take_args()?;
            let d = &spec.decl;
            let record = DeclaredRef {
                task: spec.id,
                parent: d.parent,
                index: d.index,
                name: d.body.name(),
                args: PayloadView::Inline(&args),
                inputs: &d.inputs,
                outputs: &d.outputs,
            };
            let stored = match &mut self.log {
                Some(log) => log.append_declared(&record)?.1,
                None => false,
            };
            // Arguments that went to the value store are not kept in memory (rule 10 of
            // `log/mod.rs`).
            if !stored {
                spec.decl.args = Some(args);
            }
        }
        self.wire(spec)
    }

    /// Counts a declared task live and wires its inputs (rule 2); recovery calls it for the
    /// tasks the log declared, without logging them again.
    pub(crate) fn wire(&mut self, spec: TaskSpec) -> Result<(), RunError> {
        self.work_add();
        let slot = self.alloc(
            ReadyTask {
                spec,
                values: Vec::new(),
                digests: Vec::new(),
            },
            0,
        );
        let vnode = self.vnode;
        let internal = |message| RunError::Internal { vnode, message };
        let Some(Some(s)) = self.tasks.get_mut(slot as usize) else {
            return Err(internal(format!("slot {slot} lost its task")));
        };
        // One map lookup per input (an internal error ends the run, so a half-wired task
        // is never seen).
        for &input in &s.task.spec.decl.inputs {
            let Some(e) = self.data.get_mut(&input) else {
                return Err(internal(format!(
                    "task {} reads unknown {input}",
                    s.task.spec.id
                )));
            };
            e.readers += 1;
            if e.value.is_none() {
                e.waiters.push(slot);
                s.missing += 1;
            }
        }
        if s.missing == 0 {
            self.make_ready(slot)?;
        } else {
            self.waiting += 1;
        }
        Ok(())
    }

    /// Adds an already-ready task (adopted from a thief's grant) and counts it live.
    pub(crate) fn push_ready(&mut self, task: ReadyTask) {
        self.work_add();
        let slot = self.alloc(task, 0);
        self.ready.push_back(slot);
    }

    /// Takes the input values of the task in `slot` (rules 2 and 6) and queues it.
    fn make_ready(&mut self, slot: SlotId) -> Result<(), RunError> {
        let Some(Some(s)) = self.tasks.get_mut(slot as usize) else {
            return Err(self.internal(format!("slot {slot} made ready empty")));
        };
        let task = &mut s.task;
        let logging = self.log.is_some();
        task.values.reserve_exact(task.spec.decl.inputs.len());
        if logging {
            task.digests.reserve_exact(task.spec.decl.inputs.len());
        }
        for &input in &task.spec.decl.inputs {
            let id = task.spec.id;
            let internal = |message| RunError::Internal {
                vnode: self.vnode,
                message,
            };
            let Entry::Occupied(mut o) = self.data.entry(input) else {
                return Err(internal(format!("task {id} lost input {input}")));
            };
            let e = o.get_mut();
            if logging {
                task.digests.push(e.digest.unwrap_or_default());
            }
            e.readers -= 1;
            let value = if e.droppable() {
                // Rule 6: the last reader takes the value itself.
                o.remove().value
            } else {
                e.value.clone()
            };
            let Some(v) = value else {
                return Err(internal(format!("task {id} ready before {input}")));
            };
            task.values.push(v);
        }
        self.ready.push_back(slot);
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
        e.digest = digest;
        if !e.return_to.is_empty() {
            // What goes home: the value itself (typed in process, `task/value.rs`), or the
            // bytes it was logged as (encoded once for both; a forger's differ from the value,
            // `forge.rs` rule 4).
            let home = encoded.map_or_else(|| value.clone(), Value::bytes);
            for &to in &e.return_to {
                // Rule 4: the obligation is raised before the writer's completion lowers it.
                self.shared.work_add(vnode);
                self.returns.push((to, id, home.clone(), digest, seq));
            }
        }
        e.value = Some(value);
        let waiters = std::mem::take(&mut e.waiters);
        for w in waiters {
            let now_ready = match self.tasks.get_mut(w as usize) {
                Some(Some(t)) if t.missing > 0 => {
                    t.missing -= 1;
                    t.missing == 0
                }
                _ => return Err(self.internal(format!("{id} wakes slot {w}, not waiting"))),
            };
            if now_ready {
                self.waiting -= 1;
                self.make_ready(w)?;
            }
        }
        self.maybe_drop(id);
        Ok(())
    }

    /// The scope that declared `ids` has ended (rule 3).
    pub(crate) fn close(&mut self, ids: &[DataId]) {
        for &id in ids {
            if let Entry::Occupied(mut o) = self.data.entry(id) {
                o.get_mut().open = false;
                if o.get().droppable() {
                    o.remove();
                }
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
        (self.waiting + self.ready.len() + self.data.len()) as u64
    }

    fn maybe_drop(&mut self, id: DataId) {
        if let Entry::Occupied(o) = self.data.entry(id) {
            if o.get().droppable() {
                o.remove();
            }
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
        if let Some(log) = &self.log {
            let stored_from = log.stored_from();
            let mut logged = Vec::with_capacity(writes.len());
            // Rule 10 of `log/mod.rs`: a large output's bytes move into the log's value list
            // (encoded once, hashed once, never copied) unless they go home to a victim too.
            let mut moved = SegmentValues::new();
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
                let data = outputs[*i];
                let returning = self
                    .data
                    .get(&data)
                    .is_some_and(|e| !e.return_to.is_empty());
                let value = if bytes.len() >= stored_from && !returning {
                    let len = bytes.len() as u64;
                    moved.push((digest, bytes));
                    Payload::Stored { digest, len }
                } else {
                    bytes.into()
                };
                logged.push(Output {
                    data,
                    value,
                    digest,
                });
            }
            let event = Event::Completed {
                task: id,
                outputs: logged,
                children,
            };
            let seq = match &mut self.log {
                Some(log) => log.append_outlined(&event, moved)?,
                None => 0,
            };
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
        self.shared.set_completed(self.vnode, self.completed);
        self.deferred += 1; // rule 8
        Ok(())
    }
}

//! [`Ctx`]: what a running task uses to spawn children and write its outputs.

use smallvec::SmallVec;

use super::sets::IdList;
use super::value::Value;
use super::{Boxed, Data, InputSet, OutputReads, OutputSet, Reads, Task, Write, Writes};
use crate::error::RunError;
use crate::exec::core::{Core, TaskSpec};
use crate::ids::{ChildIds, DataId, TaskId, VnodeId};
use crate::replay::Replayer;
use crate::task::Registry;

/// Where a task runs: on a vnode of a run, or alone on the oracle (`replay.rs`).
pub(crate) enum Host<'a> {
    Vnode(&'a mut Core),
    Replay(&'a Registry, &'a mut Replayer),
}

/// The context of a running task (rules 2-3 of `task/mod.rs`).
pub struct Ctx<'a> {
    pub(crate) host: Host<'a>,
    pub(crate) task: TaskId,
    pub(crate) name: &'static str,
    pub(crate) outputs: &'a [DataId],
    /// Bit i set: output i was written or delegated (output tuples stop at six).
    done: u64,
    pub(crate) writes: SmallVec<[(usize, Value); 2]>,
    pub(crate) children: Vec<TaskId>,
    /// Data created by this task's spawns that its end must close (`exec/core.rs` rule 3).
    pub(crate) created: IdList,
    next_index: u32,
    /// Ids of the children, a pair per hash (`ids.rs` rule 2).
    child_ids: ChildIds,
    pub(crate) error: Option<RunError>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(
        host: Host<'a>,
        task: TaskId,
        name: &'static str,
        outputs: &'a [DataId],
    ) -> Ctx<'a> {
        Ctx {
            host,
            task,
            name,
            outputs,
            done: 0,
            writes: SmallVec::new(),
            children: Vec::new(),
            created: IdList::new(),
            next_index: 0,
            child_ids: ChildIds::new(task),
            error: None,
        }
    }

    /// This task's logical id.
    pub fn task_id(&self) -> TaskId {
        self.task
    }

    /// The vnode running this task (informational: a task must not depend on it, rule 5).
    pub fn vnode(&self) -> VnodeId {
        match &self.host {
            Host::Vnode(core) => core.vnode,
            Host::Replay(..) => VnodeId::ORACLE,
        }
    }

    /// Declares a child whose outputs are new data objects, and returns handles to them
    /// (rule 2). Returns at once; the child runs when its inputs are written.
    pub fn spawn<T: Task>(&mut self, task: T, inputs: Reads<T>) -> OutputReads<T> {
        let (id, index, first) = self.next_child();
        let mut outs = IdList::new();
        for i in 0..T::Outputs::LEN {
            // LEN is a tuple length (at most 6), far below u32::MAX.
            outs.push(match i {
                0 => first,
                _ => DataId::output(id, i as u32),
            });
        }
        let reads = T::Outputs::make_reads(&outs);
        if let Host::Vnode(core) = &mut self.host {
            for &o in &outs {
                // Closed at once outside a recovery (`exec/core.rs` rule 3).
                if core.create_data(o) {
                    self.created.push(o);
                }
            }
        }
        self.declare(task, id, index, &inputs, outs);
        reads
    }

    /// Declares a child that writes this task's own outputs `outputs` in its place
    /// (delegation, rule 3).
    pub fn spawn_delegate<T: Task>(&mut self, task: T, inputs: Reads<T>, outputs: Writes<T>) {
        let mut outs = IdList::new();
        T::Outputs::write_ids(outputs, &mut outs);
        for &o in &outs {
            if let Err(e) = self.claim(o) {
                self.fail(e);
            }
        }
        let (id, index, _) = self.next_child();
        self.declare(task, id, index, &inputs, outs);
    }

    /// Writes one of this task's outputs (rule 3).
    pub fn write<T: Data>(&mut self, output: Write<T>, value: T) {
        match self.claim(output.id) {
            Ok(i) => self.writes.push((i, Value::typed(value))),
            Err(e) => self.fail(e),
        }
    }

    /// The next child's id, spawn index and first output's id (`ids.rs` rules 2-3).
    fn next_child(&mut self) -> (TaskId, u32, DataId) {
        let index = self.next_index;
        self.next_index += 1;
        let (id, first) = self.child_ids.get(index);
        (id, index, first)
    }

    fn declare<T: Task>(
        &mut self,
        task: T,
        id: TaskId,
        index: u32,
        inputs: &Reads<T>,
        outputs: IdList,
    ) {
        let (logging, registered) = match &mut self.host {
            Host::Vnode(core) => (core.logging(), core.is_registered::<T>()),
            Host::Replay(registry, _) => (true, registry.contains::<T>()),
        };
        if logging {
            self.children.push(id); // only the `Completed` event needs them
        }
        if self.error.is_some() {
            return;
        }
        if !registered {
            self.fail(RunError::UnregisteredTask {
                name: T::NAME.to_string(),
            });
            return;
        }
        let mut ins = IdList::new();
        T::Inputs::ids(inputs, &mut ins);
        let spec = TaskSpec::new(
            id,
            Some(self.task),
            index,
            Boxed::new(task),
            ins,
            outputs,
            None,
        );
        let declared = match &mut self.host {
            Host::Vnode(core) => core.declare(spec),
            Host::Replay(_, r) => r.declare(spec),
        };
        if let Err(e) = declared {
            self.fail(e);
        }
    }

    /// Marks our output `id` as finished, returning its index.
    fn claim(&mut self, id: DataId) -> Result<usize, RunError> {
        let Some(i) = self.outputs.iter().position(|&o| o == id) else {
            return Err(RunError::ForeignWrite {
                task: self.name.to_string(),
                id: self.task,
                data: id,
            });
        };
        if self.done & (1 << i) != 0 {
            return Err(RunError::OutputWrittenTwice {
                task: self.name.to_string(),
                id: self.task,
                output: i,
            });
        }
        self.done |= 1 << i;
        Ok(i)
    }

    fn fail(&mut self, e: RunError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// After the body: the first error, or the first output neither written nor delegated.
    pub(crate) fn check_finished(&mut self) -> Result<(), RunError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        for i in 0..self.outputs.len() {
            if self.done & (1 << i) == 0 {
                return Err(RunError::OutputNotWritten {
                    task: self.name.to_string(),
                    id: self.task,
                    output: i,
                });
            }
        }
        Ok(())
    }
}

//! Recovery of a failed vnode from its log SC_v (paper 001 §IV, Fig. 3).
//!
//! Rules:
//!
//! 1. A failed vnode loses everything in memory: its graph, its open log batch, the messages
//!    it had received but not handled. What its log made durable survives (segments it had
//!    sealed reach the store first: the writer's barrier). Its epoch goes up, so messages its
//!    old incarnation sent and that are still in flight are dropped; messages addressed to the
//!    vnode wait in its inbox and go to the new incarnation. Its log goes on at a new epoch
//!    (`LogWriter::vnode_log_next_incarnation`), as a cluster member's does, so the log shows
//!    where the old incarnation stopped.
//! 2. The new incarnation reads SC_v (from its newest checkpoint on: `log/mod.rs` rule 9, the
//!    same state either way, `log/state.rs`) and, per task, restarts from the last registered state of
//!    the automaton: a `Completed` task is never run again (no domino effect) and its outputs
//!    are restored from the log; a `Declared` or `Started` task is declared again (without a
//!    new `Declared` event) and runs its body when its inputs are there; an `Adopted` task is
//!    ready again with the input values its record carries; a `Stolen` task stays with its
//!    thief. A value restored from the log stays until every restarted task that reads it is
//!    wired (its entry is held open meanwhile), then is dropped like any value whose readers
//!    are done: a value read by several tasks is not lost to the first.
//! 3. A restarted task re-runs its body: the children it had declared are recognised by their
//!    ids (the log knows them) and are neither declared nor run again. Only this vnode knows
//!    them, so a restarted task that had started is never given to a thief.
//! 4. Obligations are rebuilt from the log, since acknowledgements are not logged: outputs of
//!    a stolen task not yet `Returned` are expected again and its grant is sent again (the
//!    thief ignores it if it adopted the task); written values owed to a victim are sent
//!    again (the victim ignores duplicates). *Every* stolen task with an output not back has
//!    its grant sent again, also when that output is already expected from the same thief for
//!    an earlier stolen task: an expectation is kept once per (data, thief) (`vnode.rs` rule
//!    3), a grant per task. Example (CG's step chain): v1 stole the root, v0 stole a chain
//!    task back from v1 and gave its delegate, which writes the same terminal output, to v1
//!    again; if v0 fails before v1 adopts that delegate, its grant alone brings it to v1.
//!    Deciding "already expected, nothing to send" left nobody running it, and v0 and v1
//!    waiting for the terminal output from each other (issue 14.5).
//! 5. On vnode 0, the terminal outputs are pinned again; if the root's declaration never
//!    became durable, the program inputs and the root are planted again as at the start.

use std::time::Duration;

use super::core::{Core, ReadyTask, TaskSpec};
use super::vnode::{Unacked, Vnode};
use crate::codec::Digest;
use crate::error::RunError;
use crate::ids::{DataId, Epoch, TaskId};
use crate::log::state::TaskState;
use crate::log::{Declared, Event, LogState, LogWriter, Output, Payload};
use crate::task::value::Value;
use crate::task::Registry;
use crate::transport::Message;

/// What the program started with: enough to plant the root again (rule 5).
pub(crate) struct RootSetup {
    pub(crate) id: TaskId,
    pub(crate) name: String,
    pub(crate) args: Vec<u8>,
    pub(crate) inputs: Vec<(DataId, Value)>,
    pub(crate) terminal: Vec<DataId>,
}

/// Declares the program inputs and the root on vnode 0 (exec/mod.rs rule 2).
pub(crate) fn plant_root(core: &mut Core, root: &RootSetup) -> Result<(), RunError> {
    let kind = *core
        .registry()
        .get(&root.name)
        .ok_or_else(|| RunError::UnregisteredTask {
            name: root.name.clone(),
        })?;
    let body = kind.decode(&root.args).map_err(|e| RunError::Encode {
        what: format!("arguments of root task {}", root.name),
        reason: e.to_string(),
    })?;
    for (id, value) in &root.inputs {
        let id = *id;
        if core.value(id).is_some() {
            continue; // recovery: its Input event was durable
        }
        core.hold(id); // open until the root is wired (closed below)
        let mut digest = None;
        if core.logging() {
            let bytes = value.encode().map_err(|e| RunError::Encode {
                what: format!("program input {id}"),
                reason: e.to_string(),
            })?;
            let d = Digest::of(&bytes);
            core.append(&Event::Input {
                output: Output {
                    data: id,
                    value: bytes.into(),
                    digest: d,
                },
            })?;
            digest = Some(d);
        }
        core.write(id, value.clone(), digest, None, 0)?;
    }
    for &o in &root.terminal {
        core.pin(o);
    }
    let inputs: Vec<DataId> = root.inputs.iter().map(|(id, _)| *id).collect();
    core.declare(TaskSpec::new(
        root.id,
        None,
        0,
        body,
        inputs.iter().copied().collect(),
        root.terminal.iter().copied().collect(),
        Some(root.args.clone()),
    ))?;
    core.close(&inputs);
    Ok(())
}

/// What one recovery did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Recovered {
    /// Tasks restarted (declared but not completed when the vnode failed).
    pub(crate) restarted: u64,
    /// Tasks completed before the failure, kept and not run again.
    pub(crate) reused: u64,
}

/// What recovery needs besides the vnode.
pub(crate) struct RecoveryContext<'a> {
    pub(crate) writer: Option<&'a LogWriter>,
    pub(crate) root: &'a RootSetup,
}

impl Vnode {
    /// Fails this vnode and rebuilds it from its log in place (rules 1-5).
    pub(crate) fn fail_and_recover(
        &mut self,
        rc: &RecoveryContext<'_>,
    ) -> Result<Recovered, RunError> {
        let v = self.core.vnode;
        let Some(writer) = rc.writer else {
            return Err(RunError::Config(format!(
                "{v} failed and there is no log to recover it"
            )));
        };
        // Rule 1: drop the old incarnation (its log handle too: the open batch is lost).
        let registry = self.core.registry().clone();
        let shared = self.core.shared.clone();
        self.core.log = None;
        let epoch = shared.reincarnate(v);
        self.reset(Epoch(epoch));
        writer.barrier();
        self.core = Core::new(
            v,
            registry.clone(),
            Some(writer.vnode_log_next_incarnation(v)?),
            shared.clone(),
        );
        let out = self.recover(&registry, rc.root)?;
        shared.work_done(v); // the unit `reincarnate` kept
        Ok(out)
    }

    /// A fresh process resumes a run, or a member takes this vnode over: it is rebuilt from
    /// its log, which its core holds already (rules 2-5).
    pub(crate) fn resume_from_log(&mut self, root: &RootSetup) -> Result<Recovered, RunError> {
        let registry = self.core.registry().clone();
        self.recover(&registry, root)
    }

    /// Rebuilds from what the core's log read when it was opened: the newest checkpoint and
    /// the log after it, or the whole log (`log/mod.rs` rule 9).
    fn recover(&mut self, registry: &Registry, root: &RootSetup) -> Result<Recovered, RunError> {
        let v = self.core.vnode;
        let started = std::time::Instant::now();
        let read = match self.core.log.as_mut() {
            Some(log) => log.take_recovery()?,
            None => {
                return Err(RunError::Config(format!(
                    "{v} has no log to be rebuilt from"
                )))
            }
        };
        self.stats.checkpoint_recoveries += u64::from(read.checkpoint.is_some());
        self.stats.recovery_log_events += read.tail_events;
        let read_time = read.read_time;
        let out = self.rebuild(registry, read.state, root)?;
        tracing::info!(
            vnode = %v,
            epoch = self.core.shared.epoch(v),
            reused = out.reused,
            restarted = out.restarted,
            from_checkpoint = read.checkpoint.is_some(),
            "vnode rebuilt from its log"
        );
        self.stats.tasks = out.reused;
        self.core.shared.set_completed(v, out.reused);
        self.core.completed = out.reused;
        let took = read_time + started.elapsed();
        self.stats.recovery_micros += u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        Ok(out)
    }

    fn rebuild(
        &mut self,
        registry: &Registry,
        state: LogState,
        root: &RootSetup,
    ) -> Result<Recovered, RunError> {
        let v = self.core.vnode;
        let LogState {
            tasks,
            values,
            completed,
            adopted: adopted_before,
            ..
        } = state;
        let mut order: Vec<&TaskState> = tasks.values().collect();
        order.sort_by_key(|t| t.order);
        let live = |t: &TaskId| tasks.get(t).is_some_and(TaskState::live);
        // Rule 10 of `log/mod.rs`: a large value is read back from the value store (and
        // checked against its digest) when a restored entry needs it.
        let store = match &self.core.log {
            Some(log) => log.store().clone(),
            None => {
                return Err(RunError::Config(format!(
                    "{v} has no log to be rebuilt from"
                )))
            }
        };
        let load = |p: &Payload| -> Result<Vec<u8>, RunError> {
            Ok(crate::log::values::resolve(&*store, p.clone())?)
        };
        let value = |d: &DataId| -> Result<Option<(Vec<u8>, Digest)>, RunError> {
            values
                .get(d)
                .map(|s| Ok((load(&s.value)?, s.digest)))
                .transpose()
        };

        // Data as the log left it; outputs of adopted tasks are owed to their victims.
        for t in &order {
            let d = &t.record;
            for &o in &d.outputs {
                self.core.restore_data(o, value(&o)?);
                if let Some((victim, _)) = &t.adopted {
                    self.core.create_return(o, *victim);
                }
                if d.parent.is_some_and(|p| live(&p)) {
                    self.core.hold(o); // its scope will run again
                }
            }
            if t.live() {
                for &i in &d.inputs {
                    self.core.restore_data(i, value(&i)?);
                }
            }
        }
        // The inputs of live tasks are held open until all of them are wired (after the loop
        // above, so that a scope that runs again stays open).
        let mut held: Vec<DataId> = Vec::new();
        for t in order.iter().filter(|t| t.live()) {
            for &i in &t.record.inputs {
                if self.core.hold(i) {
                    held.push(i);
                }
            }
        }
        // Rule 5.
        if v.0 == 0 {
            for &o in &root.terminal {
                self.core.restore_data(o, value(&o)?);
                self.core.pin(o);
            }
        }
        self.core.known = tasks.keys().copied().collect();
        if v.0 == 0 && !tasks.contains_key(&root.id) {
            plant_root(&mut self.core, root)?;
            self.core.known.insert(root.id);
        }

        // Rule 2: restart the live tasks, in log order.
        let mut out = Recovered {
            reused: completed,
            ..Recovered::default()
        };
        self.adopted.extend(adopted_before);
        for t in &order {
            let d = &t.record;
            let id = &d.task;
            if t.adopted.is_some() {
                self.adopted.insert(*id);
            }
            if !t.live() {
                continue;
            }
            let kind = *registry
                .get(&d.name)
                .ok_or_else(|| RunError::UnknownTaskName {
                    name: d.name.to_string(),
                    context: format!("the log of {v} (recovering task {:#})", d.task),
                })?;
            let args = load(&d.args)?;
            let body = kind.decode(&args).map_err(|e| RunError::Encode {
                what: format!("arguments of task {} in the log of {v}", d.task),
                reason: e.to_string(),
            })?;
            let spec = TaskSpec::new(
                d.task,
                d.parent,
                d.index,
                body,
                d.inputs.iter().copied().collect(),
                d.outputs.iter().copied().collect(),
                Some(args),
            );
            if t.started {
                self.keep.insert(*id); // rule 3: its children are known here only
            }
            match &t.adopted {
                Some((_, inputs)) => {
                    let bytes = inputs.iter().map(load).collect::<Result<Vec<_>, _>>()?;
                    let digests = bytes.iter().map(|b| Digest::of(b)).collect();
                    let values = bytes.into_iter().map(Value::bytes).collect();
                    self.core.push_ready(ReadyTask {
                        spec,
                        values,
                        digests,
                    });
                }
                None => self.core.wire(spec)?,
            }
            out.restarted += 1;
        }

        // Rule 4: what was stolen from us and has not all come back.
        for t in &order {
            let Some(thief) = t.stolen else {
                continue;
            };
            let d = &t.record;
            let task = d.task;
            let mut missing = false;
            for &o in &d.outputs {
                if values.contains_key(&o) {
                    continue;
                }
                missing = true;
                // One expectation per (data, thief), one grant per task: another stolen task
                // may already expect this value from this thief (rule 4).
                if self.expected.insert((o, thief)) {
                    self.core.shared.work_add(v);
                }
            }
            if !missing {
                continue;
            }
            let stored = d
                .inputs
                .iter()
                .map(|i| values.get(i))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| RunError::Internal {
                    vnode: v,
                    message: format!("the log lacks an input of stolen task {task}"),
                })?;
            let digests = stored.iter().map(|s| s.digest).collect();
            let inputs = stored
                .into_iter()
                .map(|s| load(&s.value).map(Value::bytes))
                .collect::<Result<Vec<_>, _>>()?;
            // A grant carries its arguments' bytes (the log may name them by digest).
            let record = Declared {
                args: Payload::Inline(load(&d.args)?),
                ..d.clone()
            };
            let msg = Message::StealGrant {
                record,
                inputs,
                digests,
            };
            self.core.shared.work_add(v);
            self.grants.insert(
                task,
                Unacked {
                    to: thief,
                    msg: msg.clone(),
                    seq: 0,
                    resend_at: Duration::ZERO,
                },
            );
            self.held.push_back((0, thief, msg));
        }
        self.core.owed_returns()?;
        self.core.close(&held);
        // Values restored for tasks that need them no more (a completed task's outputs whose
        // readers are done) leave at once, as they would have in the failed incarnation.
        self.core.sweep();
        Ok(out)
    }
}

//! One vnode: its graph ([`Core`]), its log, and the stealing protocol with its peers.
//!
//! Protocol rules (papers 001 and 004; DESIGN.md "Execution"):
//!
//! 1. A vnode runs its own ready tasks newest first (depth-first, like Cilk's work-first
//!    order). Between two tasks it reads its inbox, so a steal request waits at most one task.
//! 2. An idle vnode sends `StealRequest` to one peer drawn from its seeded RNG, and so does a
//!    vnode about to run its last ready task (it asks ahead: a victim answers only between two
//!    of its tasks, and across processes a grant waits for the victim's log too, so asking
//!    only once idle left the thief idle for half a victim's task and a round trip per steal:
//!    `nqueens cluster --workers 2` at n = 16); it has at most
//!    one request out, gives up on it after `steal_timeout` ([`Timers`]), and backs off exponentially
//!    after `StealNone` answers, up to `steal_backoff_max` times the vnodes its process runs per
//!    thread ([`Timers::per_thread`], at most [`STEAL_BACKOFF_SCALE_MAX`] times): however many vnodes a
//!    process hosts, its idle ones ask about as often as one vnode per thread would. And a
//!    vnode does not steal while another vnode driven by the same thread has a ready task
//!    (`steal_ok`, set by the driver, `exec/mod.rs` rule 1): the thread is busy, and a stolen
//!    task would only wait behind that work while another process could have run it (issue 16:
//!    1,000 vnodes on 16 one-thread processes sent 21,000 requests a second for 10 steals a
//!    second, and the heartbeats starved).
//! 3. A victim gives its *oldest* ready task (the biggest subtree) that it did not itself adopt
//!    (a task moves at most once, so `Stolen` and `Adopted` are each logged at most once per
//!    task) and that is worth moving (with a log, its last ready task stays, and so does a
//!    short task that never spawns when the victim would run all its ready work before a
//!    move's two durable waits are over: `worth.rs`; none worth moving: `StealNone`): it logs `Stolen`, and sends
//!    `StealGrant` with the task's record and input values, resent every `resend_after`
//!    until `AdoptAck`. It then expects each output of the task back, once per (output,
//!    thief): when a task given away delegated an output down a chain, a chain task came
//!    back here and a later one went to the same thief again, one value answers both. Grants
//!    stay per task: each is resent until acknowledged, after a recovery too (`recover.rs`
//!    rule 4).
//! 4. A thief logs `Adopted` (record and inputs: its log alone can re-run the task), creates the
//!    outputs as data to return, and runs the task and the subtree it spawns in its own log.
//!    A grant for a task already adopted is only acknowledged again.
//! 5. When a returned output is written, the thief sends `Returned`, resent until `ReturnAck`.
//!    The victim logs `Returned` and writes the value into its graph, waking its readers; a
//!    duplicate is only acknowledged again. Grants and returns not acknowledged are resent
//!    every `resend_after`, and at once when some vnode's epoch rises: a peer that failed
//!    lost what it had received and not made durable (a grant it asked for, a value it was
//!    waiting for), and its new incarnation should not wait up to `resend_after` for it.
//! 6. Output commit: a message caused by a logged event leaves only once that event is durable.
//!    Then a receiver never holds something its sender could forget in a crash. Without a log,
//!    messages leave at once. A message its receiver waits for (a grant, a returned value)
//!    seals the open batch at once, so that it leaves quickly; an acknowledgement (`AdoptAck`,
//!    `ReturnAck`) only stops its receiver's resends, so it waits for the batch's next seal
//!    (its age, its size, another message, the vnode going idle), and seals it itself only
//!    once it has waited half of `resend_after` ([`Timers`]). In `paper cluster` (knary at
//!    300 µs on 4 one-vnode workers) acknowledgements made half of the output-commit seals,
//!    every one a flush over the network: two of the four per steal. And a vnode about to
//!    run a task while such a message waits for a sealed batch waits for the batch first when
//!    the task is long against a flush (`worth.rs` rule 4), rather than make the receiver
//!    wait for the whole task too.
//! 7. Termination implies durability: while its log holds events not durable yet, a vnode
//!    keeps one unit of work (`exec/mod.rs` rule 4), so the run (or the coordinator's
//!    termination test over the members' work words) ends only once every event is durable.
//!    A coordinator that loses vnode 0's host after the end reads the terminal outputs from
//!    the logs (coordinator rule 6): before this rule they could still sit in that host's open
//!    batch (`chaos` met it: a CG job failed with "the logs do not hold the terminal outputs").

use std::collections::{HashSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::ChaCha8Rng;
use rand::RngExt;

use super::core::{Core, ReadyTask, TaskSpec};
use super::waits::{sample, VnodeWaits};
use super::worth::Worth;
use crate::clock::Clock;
use crate::codec::Digest;
use crate::error::{panic_message, RunError};
use crate::ids::{DataId, Epoch, IdMap, TaskId, VnodeId};
use crate::log::{Declared, Event, Output, Payload};
use crate::task::value::Value;
use crate::task::{Ctx, Host};
use crate::transport::{Endpoint, Envelope, Message};

/// The protocol's timers (rules 2, 3 and 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    /// Rule 2: a steal request not answered within this is abandoned. The default is generous:
    /// the answer may wait for one task to finish and for one log flush (rule 6).
    pub steal_timeout: Duration,
    /// Rules 3 and 5: how long before an unacknowledged grant or return is sent again.
    pub resend_after: Duration,
    /// Rule 2: the longest back-off of one vnode after refusals, when its process runs one
    /// vnode per thread.
    pub steal_backoff_max: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            steal_timeout: Duration::from_millis(100),
            resend_after: Duration::from_millis(250),
            steal_backoff_max: Duration::from_millis(2),
        }
    }
}

/// Rule 2: the back-off grows with the vnodes per thread up to this many times
/// `steal_backoff_max` (50 vnodes a thread and more): a task that appears waits at most about
/// that long for a given idle vnode to ask for it, while the process's other idle vnodes ask in
/// between.
pub const STEAL_BACKOFF_SCALE_MAX: u32 = 50;

impl Timers {
    /// Rule 2: these timers for a vnode of a process that runs `vnodes` vnodes on `threads`
    /// threads: the back-off cap times the vnodes per thread (rounded up, at most
    /// [`STEAL_BACKOFF_SCALE_MAX`]).
    #[must_use]
    pub fn per_thread(self, vnodes: usize, threads: usize) -> Timers {
        let per = vnodes.div_ceil(threads.max(1)).max(1);
        let per = u32::try_from(per)
            .unwrap_or(u32::MAX)
            .min(STEAL_BACKOFF_SCALE_MAX);
        Timers {
            steal_backoff_max: self.steal_backoff_max.saturating_mul(per),
            ..self
        }
    }
}

/// Rule 2: first back-off after a `StealNone`, doubled per further refusal up to the cap.
const BACKOFF_MIN: Duration = Duration::from_micros(20);

/// Counts of what a vnode did in a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VnodeStats {
    /// The vnode.
    pub vnode: VnodeId,
    /// Tasks it ran to completion.
    pub tasks: u64,
    /// Tasks it adopted from victims.
    pub adopted: u64,
    /// Tasks stolen from it.
    pub stolen: u64,
    /// Steal requests it sent.
    pub steal_requests: u64,
    /// Events appended to its log.
    pub events: u64,
    /// Times it failed and was recovered (fault injection).
    pub failures: u64,
    /// Tasks restarted by its recoveries (declared, not completed at the failure).
    pub recovered_tasks: u64,
    /// Tasks completed before its failures, reused and not run again.
    pub reused_tasks: u64,
    /// Failures that found nothing to lose: it held no task (none restarted, none reused).
    pub failures_without_effect: u64,
    /// Recoveries that started from a checkpoint (`log/mod.rs` rule 9) instead of the whole log.
    #[serde(default)]
    pub checkpoint_recoveries: u64,
    /// Log events its recoveries decoded (after the checkpoint, or all of them without one).
    #[serde(default)]
    pub recovery_log_events: u64,
    /// Time its recoveries took to rebuild it from the store, in µs.
    #[serde(default)]
    pub recovery_micros: u64,
    /// Most tasks and data entries its graph held at once (checked between steps): the live
    /// frontier, not the tasks run (`core.rs` rule 3).
    #[serde(default)]
    pub peak_graph: u64,
}

pub(crate) struct Unacked {
    pub(crate) to: VnodeId,
    pub(crate) msg: Message,
    pub(crate) seq: u64,
    pub(crate) resend_at: Duration,
}

pub(crate) struct Vnode {
    pub(crate) core: Core,
    endpoint: Box<dyn Endpoint>,
    clock: Arc<dyn Clock>,
    rng: ChaCha8Rng,
    peers: u32,
    timers: Timers,
    /// Rule 6: messages waiting for their event to be durable, in sequence order.
    pub(crate) held: VecDeque<(u64, VnodeId, Message)>,
    /// Rule 6: when the acknowledgements held now seal the batch themselves (`None` while
    /// none is held).
    acks_due: Option<Duration>,
    /// Rule 7: this vnode holds a unit of work for events not durable yet.
    undurable: bool,
    /// Rule 3: the held messages someone waits for (grants, returns), by sequence number, with
    /// when they were held: how long a move waits for durability here (`worth.rs` rule 1).
    waiting: VecDeque<(u64, Duration)>,
    /// Rule 3: what moves cost here and what tasks take (`worth.rs`).
    worth: Worth,
    /// Rule 5: the epoch changes seen by the last [`Vnode::resend`].
    epochs_seen: u64,
    /// Messages received while blocked in [`Vnode::wait`].
    stash: VecDeque<Envelope>,
    pub(crate) grants: IdMap<TaskId, Unacked>,
    returns: std::collections::HashMap<(DataId, VnodeId), Unacked>,
    /// Outputs of tasks given away, by (data, thief): each owed once (see `Core::create_return`).
    pub(crate) expected: HashSet<(DataId, VnodeId)>,
    pub(crate) adopted: HashSet<TaskId>,
    /// Restarted tasks whose children the log already declared here: only this vnode
    /// recognises those children (recover.rs rule 3), so they are never given away.
    pub(crate) keep: HashSet<TaskId>,
    steal_out: Option<(VnodeId, Duration)>,
    /// Rule 2: whether this vnode may steal now (its driver thread has nothing else to run).
    pub(crate) steal_ok: bool,
    refusals: u32,
    next_steal: Duration,
    pub(crate) stats: VnodeStats,
}

impl Vnode {
    pub(crate) fn new(
        core: Core,
        endpoint: Box<dyn Endpoint>,
        clock: Arc<dyn Clock>,
        rng: ChaCha8Rng,
        peers: u32,
        timers: Timers,
    ) -> Self {
        let stats = VnodeStats {
            vnode: core.vnode,
            ..VnodeStats::default()
        };
        Vnode {
            core,
            endpoint,
            clock,
            rng,
            peers,
            timers,
            held: VecDeque::new(),
            acks_due: None,
            undurable: false,
            waiting: VecDeque::new(),
            worth: Worth::default(),
            epochs_seen: 0,
            stash: VecDeque::new(),
            grants: IdMap::default(),
            returns: Default::default(),
            expected: HashSet::new(),
            adopted: HashSet::new(),
            keep: HashSet::new(),
            steal_out: None,
            steal_ok: true,
            refusals: 0,
            next_steal: Duration::ZERO,
            stats,
        }
    }

    /// Recovery rule 1: forgets everything but the inbox (which now speaks for `epoch`).
    pub(crate) fn reset(&mut self, epoch: Epoch) {
        self.endpoint.set_epoch(epoch);
        self.held.clear();
        self.acks_due = None;
        self.undurable = false; // the new incarnation's work starts afresh (`reincarnate`)
        self.waiting.clear();
        self.worth = Worth::default();
        self.stash.clear();
        self.grants.clear();
        self.returns.clear();
        self.expected.clear();
        self.adopted.clear();
        self.keep.clear();
        self.steal_out = None;
        self.refusals = 0;
        self.next_steal = Duration::ZERO;
    }

    fn id(&self) -> VnodeId {
        self.core.vnode
    }

    /// What this vnode waits for (`waits.rs` rule 2).
    pub(crate) fn waits(&self) -> VnodeWaits {
        let v = self.id();
        VnodeWaits {
            vnode: v,
            epoch: self.core.shared.epoch(v),
            work: self.core.shared.work_word(v),
            ready: self.core.ready_len(),
            blocked: self.core.blocked(),
            grants: sample(self.grants.iter().map(|(t, u)| (*t, u.to))),
            returns: sample(self.returns.keys().copied()),
            expected: sample(self.expected.iter().copied()),
            held: (
                self.held.len(),
                self.held.front().map_or(0, |h| h.0),
                self.core.log.as_ref().map_or(0, |l| l.durable()),
            ),
            stealing_from: self.steal_out.map(|(v, _)| v),
        }
    }

    /// The vnode's clock.
    pub(crate) fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Whether a task is ready to run here.
    pub(crate) fn has_ready(&self) -> bool {
        !self.core.no_ready()
    }

    /// Runs up to `budget` tasks and handles messages. Returns whether anything happened.
    pub(crate) fn step(&mut self, budget: usize) -> Result<bool, RunError> {
        let mut worked = self.poll()?;
        let mut ran = 0;
        while ran < budget {
            let Some(task) = self.core.pop_ready() else {
                break;
            };
            self.flush_first(task.spec.decl.body.name())?;
            if self.core.no_ready() {
                // Rule 2: ask for work before running the last ready task, so that the answer
                // travels while it runs instead of after.
                let now = self.clock.now();
                self.maybe_steal(now)?;
            }
            self.run_task(task)?;
            ran += 1;
            worked |= self.poll()?;
            // Between any two tasks, not only at the end of the step: a message may wait for
            // durability (rule 6) but never for the rest of a step of long tasks.
            self.between_tasks()?;
        }
        worked |= ran > 0;
        self.between_tasks()?;
        let now = self.clock.now();
        let idle = self.core.no_ready();
        if let Some(log) = &mut self.core.log {
            if idle {
                log.seal()?; // idle: let durability catch up (log/mod.rs rule 2)
            }
        }
        if self.core.no_ready() {
            self.maybe_steal(now)?;
        }
        worked |= self.release_held()?;
        self.resend(now)?;
        self.count_undurable();
        self.stats.peak_graph = self.stats.peak_graph.max(self.core.graph_size());
        self.core.publish_work(); // core.rs rule 8: the word is exact between steps
        Ok(worked)
    }

    /// Queues returns, ages the open batch, sends what became durable.
    fn between_tasks(&mut self) -> Result<(), RunError> {
        if !self.core.returns.is_empty() {
            self.queue_returns();
        }
        if let Some(log) = &mut self.core.log {
            log.tick(self.clock.now())?;
        }
        if !self.held.is_empty() {
            self.release_held()?;
        }
        Ok(())
    }

    /// Blocks up to `timeout` for a message (idle).
    pub(crate) fn wait(&mut self, timeout: Duration) {
        let timeout = if self.held.is_empty() && !self.undurable {
            timeout
        } else {
            timeout.min(HELD_POLL)
        };
        if let Some(env) = self.endpoint.recv_timeout(timeout) {
            self.stash.push_back(env);
        }
    }

    /// Seals and waits until the log is durable; counts the events.
    pub(crate) fn finish(&mut self) -> Result<(), RunError> {
        if let Some(log) = &mut self.core.log {
            self.stats.events = log.appended();
            log.sync()?;
        }
        Ok(())
    }

    fn poll(&mut self) -> Result<bool, RunError> {
        let mut any = false;
        while let Some(env) = self.stash.pop_front().or_else(|| self.endpoint.try_recv()) {
            self.handle(env)?;
            any = true;
        }
        Ok(any)
    }

    fn run_task(&mut self, task: ReadyTask) -> Result<(), RunError> {
        let ReadyTask {
            spec,
            values,
            digests,
        } = task;
        let TaskSpec { id, mut decl } = spec;
        let name = decl.body.name();
        tracing::trace!(vnode = %self.id(), task = %id, name, "task started");
        if self.core.logging() {
            self.core.append(&Event::Started {
                task: id,
                inputs: digests,
            })?;
        }
        // Rule 3: timed only with a log, the only case `worth.rs` reads it (without one, two
        // clock reads and a lookup on every task would buy nothing).
        let began = self.core.logging().then(|| self.clock.now());
        let decl = &mut *decl;
        let (outputs, body) = (&decl.outputs, &mut decl.body);
        let mut ctx = Ctx::new(Host::Vnode(&mut self.core), id, name, outputs);
        let result = catch_unwind(AssertUnwindSafe(|| body.run(&mut ctx, values)));
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(payload) => {
                return Err(RunError::TaskPanicked {
                    task: name.to_string(),
                    id,
                    message: panic_message(&*payload),
                })
            }
        }
        ctx.check_finished()?;
        let Ctx {
            writes,
            children,
            created,
            ..
        } = ctx;
        let spawned = !children.is_empty();
        self.core
            .complete(id, name, outputs, writes, children, &created)?;
        // Rule 3: what a task of this kind takes here (`worth.rs` rule 1).
        if let Some(began) = began {
            let took = self.clock.now().saturating_sub(began);
            self.worth.ran(name, took, spawned);
        }
        tracing::trace!(vnode = %self.id(), task = %id, name, "task completed");
        self.stats.tasks += 1;
        Ok(())
    }

    fn handle(&mut self, env: Envelope) -> Result<(), RunError> {
        let from = env.from;
        if env.epoch.0 < self.core.shared.epoch(from) {
            return Ok(()); // from a failed incarnation (recover.rs rule 1)
        }
        match env.msg {
            Message::StealRequest => self.on_steal_request(from),
            Message::StealNone => {
                if self.steal_out.is_some_and(|(v, _)| v == from) {
                    self.steal_out = None;
                    self.refusals = self.refusals.saturating_add(1);
                    let backoff = BACKOFF_MIN
                        .saturating_mul(1 << self.refusals.min(16))
                        .min(self.timers.steal_backoff_max);
                    self.next_steal = self.clock.now() + backoff;
                }
                Ok(())
            }
            Message::StealGrant {
                record,
                inputs,
                digests,
            } => self.on_grant(from, record, inputs, &digests),
            Message::AdoptAck { task } => {
                if self.grants.remove(&task).is_some() {
                    self.core.shared.work_done(self.id());
                }
                Ok(())
            }
            Message::Returned {
                data,
                value,
                digest,
            } => self.on_returned(from, data, value, digest),
            Message::Iter(_) => Ok(()), // iterative mode's: not for a data-flow vnode
            Message::ReturnAck { data } => {
                if self.returns.remove(&(data, from)).is_some() {
                    self.core.shared.work_done(self.id());
                    if let Some(log) = &self.core.log {
                        log.note_acknowledged(data, from);
                    }
                }
                Ok(())
            }
        }
    }

    /// Rule 3.
    fn on_steal_request(&mut self, thief: VnodeId) -> Result<(), RunError> {
        // Rule 3: a task moves at most once, so an adopted task is never given away again;
        // nor is a restarted task with children already in our log (recover.rs rule 3).
        let (adopted, keep, worth) = (&self.adopted, &self.keep, &self.worth);
        // ... and only a task worth moving (`worth.rs` rule 2).
        let (logging, others) = (self.core.logging(), self.core.ready_len().saturating_sub(1));
        let alone = self.steal_ok; // its thread has nothing else to run (rule 2)
        let task = self.core.take_oldest_ready(|id, name| {
            !adopted.contains(&id)
                && !keep.contains(&id)
                && worth.worth_moving(logging, name, others, alone)
        });
        let Some(task) = task else {
            return self.send(thief, Message::StealNone);
        };
        let ReadyTask {
            mut spec,
            values,
            digests,
        } = task;
        let args = spec.take_args()?;
        // The values themselves: encoded only if the message goes over a wire (value.rs).
        let inputs = values;
        let record = spec.record(args);
        let seq = self.core.append(&Event::Stolen {
            task: spec.id,
            thief,
        })?;
        let me = self.id();
        let shared = self.core.shared.clone();
        // Rule 4 of core.rs: obligations (one per output, one for the ack) before the task
        // stops counting as live here.
        for &o in &spec.decl.outputs {
            if self.expected.insert((o, thief)) {
                shared.work_add(me);
            }
        }
        shared.work_add(me);
        shared.work_done(me);
        let msg = Message::StealGrant {
            record,
            inputs,
            digests,
        };
        let resend_at = self.clock.now() + self.timers.resend_after;
        self.grants.insert(
            spec.id,
            Unacked {
                to: thief,
                msg: msg.clone(),
                seq,
                resend_at,
            },
        );
        self.held.push_back((seq, thief, msg));
        self.waiting.push_back((seq, self.clock.now()));
        self.stats.stolen += 1;
        crate::metrics::stolen();
        tracing::debug!(victim = %me, thief = %thief, task = %spec.id, "steal granted");
        Ok(())
    }

    /// Rule 4.
    fn on_grant(
        &mut self,
        victim: VnodeId,
        record: Declared,
        inputs: Vec<Value>,
        sent: &[Digest],
    ) -> Result<(), RunError> {
        if self.steal_out.is_some_and(|(v, _)| v == victim) {
            self.steal_out = None;
        }
        self.refusals = 0;
        let task = record.task;
        if self.adopted.contains(&task) {
            let at = self.core.log_position();
            self.held
                .push_back((at, victim, Message::AdoptAck { task }));
            return Ok(());
        }
        let context = || format!("a steal grant from {victim} for task {task}");
        let kind =
            *self
                .core
                .registry()
                .get(&record.name)
                .ok_or_else(|| RunError::UnknownTaskName {
                    name: record.name.to_string(),
                    context: context(),
                })?;
        let bad_args = |reason: String| RunError::InputDecode {
            task: record.name.to_string(),
            id: task,
            input: usize::MAX,
            reason: format!("arguments in {}: {reason}", context()),
        };
        // A grant carries its bytes; only a log holds them by digest.
        let args = record
            .args
            .inline()
            .ok_or_else(|| bad_args("named by digest, not carried".to_string()))?;
        let body = kind
            .decode(args)
            .map_err(|e| bad_args(format!("they do not decode: {e}")))?;
        if inputs.len() != record.inputs.len() {
            return Err(RunError::Internal {
                vnode: self.id(),
                message: format!(
                    "{} has {} input values for {} inputs",
                    context(),
                    inputs.len(),
                    record.inputs.len()
                ),
            });
        }
        // Rule 4: the log gets the record and the inputs' bytes (moved back out after), or,
        // for an input its log holds by digest already, the digest and length alone.
        let (seq, digests, record) = if self.core.logging() {
            let mut digests = Vec::with_capacity(inputs.len());
            let mut payloads = Vec::with_capacity(inputs.len());
            for (i, input) in inputs.iter().enumerate() {
                let known = sent
                    .get(i)
                    .copied()
                    .filter(|_| input.wire_bytes().is_none());
                if let Some((d, stored)) =
                    known.and_then(|d| Some((d, self.already_stored(input, d)?)))
                {
                    digests.push(d);
                    payloads.push(stored);
                    continue;
                }
                let b = input.encode().map_err(|e| RunError::Encode {
                    what: format!("inputs of task {task}"),
                    reason: e.to_string(),
                })?;
                digests.push(known.unwrap_or_else(|| Digest::of(&b)));
                payloads.push(Payload::from(b));
            }
            let event = Event::Adopted {
                victim,
                record,
                inputs: payloads,
            };
            let seq = self.core.append(&event)?;
            let Event::Adopted { record, .. } = event else {
                unreachable!("built above")
            };
            (seq, digests, record)
        } else {
            (0, Vec::new(), record)
        };
        for &o in &record.outputs {
            self.core.create_return(o, victim);
        }
        let spec = TaskSpec::new(
            task,
            record.parent,
            record.index,
            body,
            record.inputs.into_iter().collect(),
            record.outputs.into_iter().collect(),
            record.args.into_inline(),
        );
        self.core.push_ready(ReadyTask {
            spec,
            values: inputs,
            digests,
        });
        self.adopted.insert(task);
        self.held
            .push_back((seq, victim, Message::AdoptAck { task }));
        self.stats.adopted += 1;
        tracing::debug!(thief = %self.id(), victim = %victim, task = %task, "task adopted");
        Ok(())
    }

    /// Rule 5, victim side.
    fn on_returned(
        &mut self,
        thief: VnodeId,
        data: DataId,
        value: Value,
        digest: Option<Digest>,
    ) -> Result<(), RunError> {
        // Bytes from a wire are checked against the digest the thief logged; a value from
        // this process (typed, or the bytes the thief logged) is not.
        if let (Some(b), Some(d)) = (value.wire_bytes(), digest) {
            if Digest::of(b) != d {
                tracing::warn!(
                    "{}: dropped a Returned for {data} from {thief}: a digest mismatch",
                    self.id()
                );
                return Ok(());
            }
        }
        let expected = self.expected.remove(&(data, thief));
        // An expected value may already be here, written by a task we stole back (see
        // `Core::create_return`); its entry may even be gone (dropped once written).
        if expected && self.core.awaits(data) {
            // The log needs the bytes and a digest (the thief's log has stored them already
            // in this process: their digest and length); a duplicate is never encoded.
            let (seq, digest) = if self.core.logging() {
                let stored = digest.and_then(|d| Some((d, self.already_stored(&value, d)?)));
                let (payload, digest) = match stored {
                    Some((d, p)) => (p, d),
                    None => {
                        let bytes = value.encode().map_err(|e| RunError::Encode {
                            what: format!("returned value of {data}"),
                            reason: e.to_string(),
                        })?;
                        let digest = digest.unwrap_or_else(|| Digest::of(&bytes));
                        (Payload::from(bytes), digest)
                    }
                };
                let output = Output {
                    data,
                    value: payload,
                    digest,
                };
                (self.core.append(&Event::Returned { output })?, Some(digest))
            } else {
                (0, digest)
            };
            self.core.write(data, value, digest, None, seq)?;
            self.held
                .push_back((seq, thief, Message::ReturnAck { data }));
        } else {
            let at = self.core.log_position();
            self.held
                .push_back((at, thief, Message::ReturnAck { data }));
        }
        if expected {
            self.core.shared.work_done(self.id());
        }
        Ok(())
    }

    /// `value` as a reference to its copy in the value store, when its digest `d` (known, not
    /// computed here) was handed to this process's log writer already and its length is
    /// known without encoding it (`log/mod.rs` rule 10): no copy of it is made again.
    fn already_stored(&self, value: &Value, d: Digest) -> Option<Payload> {
        let log = self.core.log.as_ref()?;
        let len = value.encoded_len()?;
        (usize::try_from(len).is_ok_and(|l| l >= log.stored_from()) && log.handed(&d))
            .then_some(Payload::Stored { digest: d, len })
    }

    /// Rule 5, thief side: values written here that go home.
    fn queue_returns(&mut self) {
        let now = self.clock.now();
        for (to, data, value, digest, seq) in std::mem::take(&mut self.core.returns) {
            let msg = Message::Returned {
                data,
                value,
                digest,
            };
            let resend_at = now + self.timers.resend_after;
            self.returns.insert(
                (data, to),
                Unacked {
                    to,
                    msg: msg.clone(),
                    seq,
                    resend_at,
                },
            );
            self.held.push_back((seq, to, msg));
            self.waiting.push_back((seq, now));
        }
    }

    /// Rule 2.
    fn maybe_steal(&mut self, now: Duration) -> Result<(), RunError> {
        if self.peers < 2 || !self.steal_ok || self.core.shared.stopped() {
            return Ok(());
        }
        if let Some((_, deadline)) = self.steal_out {
            if now < deadline {
                return Ok(());
            }
            self.steal_out = None;
        }
        if now < self.next_steal {
            return Ok(());
        }
        let me = self.id().0;
        let pick = self.rng.random_range(0..self.peers - 1);
        let victim = VnodeId(if pick >= me { pick + 1 } else { pick });
        self.steal_out = Some((victim, now + self.timers.steal_timeout));
        self.stats.steal_requests += 1;
        self.send(victim, Message::StealRequest)
    }

    /// Rule 6 (`worth.rs` rule 4): before a task of kind `name`, waits for the sealed batch
    /// of a message someone waits for when that is worth it, and sends what became durable.
    fn flush_first(&mut self, name: &str) -> Result<(), RunError> {
        let Some(&(seq, ..)) = self.held.iter().rev().find(|h| !is_ack(&h.2)) else {
            return Ok(());
        };
        let Some(bound) = self.worth.flush_first(name) else {
            return Ok(());
        };
        let (unsealed, background) = match &self.core.log {
            Some(log) => (seq > log.sealed(), log.flushes_in_background()),
            None => return Ok(()),
        };
        if !background {
            return Ok(());
        }
        if unsealed {
            self.release_held()?; // seals the batch it waits for
        }
        let Some(log) = &self.core.log else {
            return Ok(());
        };
        let began = self.clock.now();
        let durable = log.wait_durable(seq, bound)?;
        let waited = self.clock.now().saturating_sub(began);
        self.worth.flushed(if durable { waited } else { bound });
        if durable {
            self.release_held()?;
        }
        Ok(())
    }

    /// Rule 7: holds a unit of work while the log has events not durable yet.
    fn count_undurable(&mut self) {
        let pending = self
            .core
            .log
            .as_ref()
            .is_some_and(|log| log.durable() < log.appended());
        if pending != self.undurable {
            self.undurable = pending;
            if pending {
                self.core.shared.work_add(self.id());
            } else {
                self.core.shared.work_done(self.id());
            }
        }
    }

    /// Rule 6. Returns whether something left.
    fn release_held(&mut self) -> Result<bool, RunError> {
        if self.held.is_empty() {
            return Ok(false);
        }
        let durable = match &mut self.core.log {
            Some(log) => {
                // Seal only when a held message waits for the open batch: sealing on every
                // call would cut one-event segments between short tasks.
                let (waiting_for, due) = must_seal(
                    &self.held,
                    self.acks_due,
                    self.clock.now(),
                    self.timers.resend_after / 2,
                );
                self.acks_due = due;
                if waiting_for > log.sealed() {
                    log.seal()?;
                }
                log.durable()
            }
            None => u64::MAX,
        };
        let now = self.clock.now();
        while let Some(&(_, since)) = self.waiting.front().filter(|(seq, _)| *seq <= durable) {
            self.waiting.pop_front();
            self.worth.waited(now.saturating_sub(since)); // worth.rs rule 1
        }
        let mut sent = false;
        while self.held.front().is_some_and(|(seq, _, _)| *seq <= durable) {
            if let Some((_, to, msg)) = self.held.pop_front() {
                self.send(to, msg)?;
                sent = true;
            }
        }
        if self.acks_due.is_some() && !self.held.iter().any(|h| is_ack(&h.2)) {
            self.acks_due = None;
        }
        Ok(sent)
    }

    /// Rules 3 and 5: resend what was sent and not acknowledged, when its time came or a peer
    /// came back.
    fn resend(&mut self, now: Duration) -> Result<(), RunError> {
        let changes = self.core.shared.epoch_changes();
        let peer_back = changes != self.epochs_seen;
        self.epochs_seen = changes;
        let durable = self.core.log.as_ref().map_or(u64::MAX, |l| l.durable());
        let due = |u: &Unacked| u.seq <= durable && (peer_back || now >= u.resend_at);
        if !self.grants.values().any(due) && !self.returns.values().any(due) {
            return Ok(()); // the common case, every step: nothing allocated
        }
        // In a fixed order (grants by their id map, returns sorted by key; the return map's
        // own order is random per process), so that a seeded simulation sends the same
        // messages in the same order however it is run: a peer coming back sends them all at
        // once.
        let mut returns: Vec<_> = self.returns.iter_mut().collect();
        returns.sort_unstable_by_key(|(k, _)| **k);
        let mut out = Vec::new();
        for u in self
            .grants
            .values_mut()
            .chain(returns.into_iter().map(|(_, u)| u))
        {
            if due(u) {
                u.resend_at = now + self.timers.resend_after;
                out.push((u.to, u.msg.clone()));
            }
        }
        for (to, msg) in out {
            self.send(to, msg)?;
        }
        Ok(())
    }

    fn send(&mut self, to: VnodeId, msg: Message) -> Result<(), RunError> {
        self.endpoint.send(to, msg).map_err(|e| RunError::Internal {
            vnode: self.core.vnode,
            message: format!("send to {to}: {e}"),
        })
    }
}

/// Rule 6: an acknowledgement only stops its receiver's resends; it never seals the batch at
/// once.
fn is_ack(msg: &Message) -> bool {
    matches!(msg, Message::AdoptAck { .. } | Message::ReturnAck { .. })
}

/// Rule 6: the sequence number the batch must be sealed up to now for the `held` messages (0:
/// none waits), and when the acknowledgements among them are due (`None` when none is held):
/// `acks_due` if it was set, else `patience` from `now`. Until then only the messages someone
/// waits for count; from then on every held message does.
fn must_seal(
    held: &VecDeque<(u64, VnodeId, Message)>,
    acks_due: Option<Duration>,
    now: Duration,
    patience: Duration,
) -> (u64, Option<Duration>) {
    let due = held
        .iter()
        .any(|h| is_ack(&h.2))
        .then(|| acks_due.unwrap_or(now + patience));
    let upto = if due.is_some_and(|d| now >= d) {
        held.back().map_or(0, |h| h.0)
    } else {
        held.iter().rev().find(|h| !is_ack(&h.2)).map_or(0, |h| h.0)
    };
    (upto, due)
}

/// While messages wait for durability, an idle vnode looks at the watermark this often.
const HELD_POLL: Duration = Duration::from_micros(200);

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(seq: u64) -> (u64, VnodeId, Message) {
        let task = TaskId::default();
        (seq, VnodeId(1), Message::AdoptAck { task })
    }

    fn waited_for(seq: u64) -> (u64, VnodeId, Message) {
        (seq, VnodeId(1), Message::StealNone)
    }

    const MS: Duration = Duration::from_millis(1);

    /// Rule 5: a return not acknowledged goes again at once when a peer's epoch rises (a peer
    /// came back and may have lost it), not only `resend_after` later; an epoch raised to what
    /// it was changes nothing.
    #[test]
    fn unacknowledged_returns_go_again_at_once_when_a_peer_comes_back() {
        use crate::transport::{InProcTransport, Transport};
        use rand::SeedableRng;
        let shared = Arc::new(super::super::shared::RunShared::new(2, None));
        let registry = Arc::new(crate::task::Registry::new());
        let transport = InProcTransport::new(2);
        let mut thief_inbox = transport.endpoint(VnodeId(1)).unwrap();
        let clock = Arc::new(crate::clock::ManualClock::default());
        let mut v = Vnode::new(
            Core::new(VnodeId(0), registry, None, shared.clone()),
            transport.endpoint(VnodeId(0)).unwrap(),
            clock.clone(),
            ChaCha8Rng::seed_from_u64(1),
            2,
            Timers {
                resend_after: Duration::from_secs(3600),
                ..Timers::default()
            },
        );
        let data = DataId::default();
        let msg = Message::Returned {
            data,
            value: Value::typed(7u64),
            digest: None,
        };
        v.returns.insert(
            (data, VnodeId(1)),
            Unacked {
                to: VnodeId(1),
                msg,
                seq: 0,
                resend_at: clock.now() + Duration::from_secs(3600),
            },
        );
        let sent = |inbox: &mut Box<dyn crate::transport::Endpoint>| {
            std::iter::from_fn(|| inbox.try_recv()).count()
        };
        v.resend(clock.now()).unwrap();
        assert_eq!(sent(&mut thief_inbox), 0, "not due, no peer back");
        shared.set_epoch(VnodeId(1), 1);
        v.resend(clock.now()).unwrap();
        assert_eq!(
            sent(&mut thief_inbox),
            1,
            "the peer came back: sent at once"
        );
        v.resend(clock.now()).unwrap();
        shared.set_epoch(VnodeId(1), 1);
        v.resend(clock.now()).unwrap();
        assert_eq!(sent(&mut thief_inbox), 0, "once per epoch change");
        shared.reincarnate(VnodeId(0));
        v.resend(clock.now()).unwrap();
        assert_eq!(
            sent(&mut thief_inbox),
            1,
            "a vnode rebuilt in this process counts too"
        );
        clock.advance(Duration::from_secs(3600));
        v.resend(clock.now()).unwrap();
        assert_eq!(sent(&mut thief_inbox), 1, "and when due, as before");
    }

    #[test]
    fn acknowledgements_wait_for_the_next_seal_until_they_are_due() {
        let now = 10 * MS;
        let patience = 125 * MS;
        // Acknowledgements alone seal nothing; they become due `patience` from now.
        let acks: VecDeque<_> = [ack(3), ack(4)].into();
        assert_eq!(
            must_seal(&acks, None, now, patience),
            (0, Some(now + patience))
        );
        // A due time once set stays, however often the vnode looks.
        assert_eq!(
            must_seal(&acks, Some(20 * MS), now, patience),
            (0, Some(20 * MS))
        );
        // Once due, they seal up to the last held message.
        assert_eq!(must_seal(&acks, Some(now), now, patience), (4, Some(now)));
        // A message someone waits for seals up to itself, not the acknowledgements after it.
        let mixed: VecDeque<_> = [ack(3), waited_for(5), ack(7)].into();
        assert_eq!(
            must_seal(&mixed, None, now, patience),
            (5, Some(now + patience))
        );
        assert_eq!(
            must_seal(&mixed, Some(5 * MS), now, patience),
            (7, Some(5 * MS))
        );
        // Without acknowledgements there is no due time, and every message counts.
        let waited: VecDeque<_> = [waited_for(2), waited_for(6)].into();
        assert_eq!(must_seal(&waited, Some(MS), now, patience), (6, None));
        assert_eq!(must_seal(&VecDeque::new(), None, now, patience), (0, None));
        let ret = (
            9,
            VnodeId(0),
            Message::ReturnAck {
                data: DataId::default(),
            },
        );
        assert_eq!(must_seal(&[ret].into(), None, now, patience).0, 0);
    }
}

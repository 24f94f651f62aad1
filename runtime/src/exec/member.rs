//! A member of a cluster run: this process hosts some of the run's vnodes; a coordinator
//! elsewhere decides when the run ends and which process hosts each vnode (DESIGN.md
//! "Execution", cluster mode; paper 001 §IV's fault-tolerance module).
//!
//! Rules:
//!
//! 1. The member drives its vnodes exactly as an embedded run does (`exec/mod.rs` rules 1, 3,
//!    5), over the caller's transport (a [`Router`](crate::transport::Router)); each logs into
//!    the shared store under its own vnode's keys.
//! 2. It never ends the run by itself: [`MemberStatus::work`] exposes the work words of the
//!    vnodes it hosts so that the coordinator can run the two-scan termination test over all
//!    of them, and [`Control::Stop`] ends it.
//! 3. [`Control::Host`] makes it host a vnode of a process declared dead, at a new epoch: the
//!    vnode is rebuilt from its log (recovery rules 2-5) while the other vnodes keep their
//!    state; drivers pause only while the vnode is added. [`Control::Epoch`] fences an old
//!    incarnation: its late messages are dropped.
//! 4. The member hosting vnode 0 when the run starts writes the manifest (if the store has
//!    none) and plants the root; a member that hosts vnode 0 after a failure writes it too if
//!    it is still missing (its first host died before writing it) and the rebuild plants the
//!    root again; whoever hosts vnode 0 at the end returns the terminal outputs.
//! 5. At the end every hosted vnode's log is synced and the writer shut down before the
//!    report is returned: what the member did is durable when the coordinator hears of it.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rand::rngs::ChaCha8Rng;
use rand::SeedableRng;

use super::core::Core;
use super::recover::{plant_root, RecoveryContext, RootSetup};
use super::shared::RunShared;
use super::vnode::{Vnode, VnodeStats};
use super::waits::VnodeWaits;
use super::Runtime;
use crate::error::RunError;
use crate::ids::{Epoch, TaskId, VnodeId};
use crate::log::{LogWriter, Manifest};
use crate::task::value::Value;
use crate::task::Task;
use crate::transport::Transport;

/// What the coordinator tells a member while it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// Host `vnode` from now on, at `epoch`: rebuild it from its log (rule 3).
    Host(VnodeId, Epoch),
    /// `vnode` is now at `epoch`: drop messages of older incarnations (rule 3).
    Epoch(VnodeId, Epoch),
    /// The run is over (or abandoned): finish and report (rule 5).
    Stop,
}

/// What a member shares with its network layer while it runs (rule 2).
#[derive(Default)]
pub struct MemberStatus {
    shared: OnceLock<Arc<RunShared>>,
    /// Iterative mode (`crate::iterative`): the work word of each hosted vnode.
    words: Mutex<Option<std::collections::BTreeMap<VnodeId, u64>>>,
    hosted: Mutex<Vec<VnodeId>>,
}

impl std::fmt::Debug for MemberStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberStatus")
            .field("hosted", &self.hosted())
            .finish_non_exhaustive()
    }
}

impl MemberStatus {
    /// A status for a run that has not started.
    pub fn new() -> Arc<MemberStatus> {
        Arc::default()
    }

    /// The vnodes hosted here.
    pub fn hosted(&self) -> Vec<VnodeId> {
        self.hosted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The work word of each hosted vnode (low 32 bits: outstanding work; high: changes), or
    /// `None` before the run has started here.
    pub fn work(&self) -> Option<Vec<(VnodeId, u64)>> {
        if let Some(words) = self
            .words
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return Some(words.iter().map(|(&v, &w)| (v, w)).collect());
        }
        let shared = self.shared.get()?;
        Some(
            self.hosted()
                .into_iter()
                .map(|v| (v, shared.work_word(v)))
                .collect(),
        )
    }

    /// Iterative mode: `v` is hosted here with this work word (1: not finished; 0: finished).
    pub(crate) fn set_word(&self, v: VnodeId, word: u64) {
        let mut words = self.words.lock().unwrap_or_else(|p| p.into_inner());
        words.get_or_insert_with(Default::default).insert(v, word);
        let mut hosted = self.hosted.lock().unwrap_or_else(|p| p.into_inner());
        if !hosted.contains(&v) {
            hosted.push(v);
        }
    }

    /// Tasks completed by the vnodes hosted here.
    pub fn completed(&self) -> u64 {
        self.shared.get().map_or(0, |s| s.completed())
    }

    /// The first error met here, as text, if the member has failed.
    pub fn failed(&self) -> bool {
        self.shared.get().is_some_and(|s| s.stopped())
    }
}

/// The cluster's side of a member run.
pub struct Member {
    /// The member's transport (hosted vnodes take their endpoints from it).
    pub transport: Arc<dyn Transport>,
    /// Vnodes hosted from the start, with their epochs.
    pub hosted: Vec<(VnodeId, Epoch)>,
    /// Whether this member starts the run (writes the manifest, plants the root on vnode 0).
    pub starts: bool,
    /// Orders from the coordinator.
    pub control: Receiver<Control>,
    /// Shared with the network layer.
    pub status: Arc<MemberStatus>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("hosted", &self.hosted)
            .field("starts", &self.starts)
            .finish_non_exhaustive()
    }
}

/// What a member did.
#[derive(Debug, Clone)]
pub struct MemberReport {
    /// The terminal outputs, encoded, if vnode 0 was hosted here at the end.
    pub outputs: Option<Vec<Vec<u8>>>,
    /// Root task of the run.
    pub root: TaskId,
    /// Per hosted vnode counts.
    pub vnodes: Vec<VnodeStats>,
    /// Tasks completed here.
    pub tasks: u64,
    /// Events logged here.
    pub events: u64,
    /// Tasks forged here (forgery injection).
    pub forged: Vec<(TaskId, VnodeId)>,
}

/// How long the control watcher blocks before looking at the run's state again.
const CONTROL_POLL: Duration = Duration::from_millis(20);

/// A member run's state that does not depend on how it is driven (threads or one caller).
struct MemberRun {
    vnodes: Vec<Vnode>,
    shared: Arc<RunShared>,
    writer: Option<LogWriter>,
    setup: RootSetup,
    manifest: Manifest,
}

impl Runtime {
    /// Runs this process's share of a cluster run (rules 1-5). `root` and `inputs` are the
    /// program's, on every member (any member may end up hosting vnode 0).
    pub fn run_member<T: Task>(
        &self,
        root: T,
        inputs: T::Inputs,
        member: Member,
    ) -> Result<MemberReport, RunError> {
        let Member {
            transport,
            hosted,
            starts,
            control,
            status,
        } = member;
        let mut run =
            self.member_start(root, inputs, &hosted, starts, &*transport, &status, false)?;
        let outcome = self.member_loop(&mut run, &*transport, &status, control);
        self.member_end(run, outcome)
    }

    /// This process's share of a cluster run, stepped by the caller on one thread (the
    /// cluster simulator): the same vnodes, log and recovery as [`Runtime::run_member`],
    /// with a manual log writer ([`LogWriter::manual`]) so that durability moves only when
    /// the caller pumps it.
    pub fn stepped_member<T: Task>(
        self: &Arc<Self>,
        root: T,
        inputs: T::Inputs,
        hosted: &[(VnodeId, Epoch)],
        starts: bool,
        transport: Arc<dyn Transport>,
    ) -> Result<SteppedMember, RunError> {
        let status = MemberStatus::new();
        let run = self.member_start(root, inputs, hosted, starts, &*transport, &status, true)?;
        Ok(SteppedMember {
            rt: self.clone(),
            run: Some(run),
            transport,
            status,
        })
    }

    /// Rules 1 and 4: the hosted vnodes, the log writer, and (if this member starts the run)
    /// the manifest and the root.
    #[allow(clippy::too_many_arguments)]
    fn member_start<T: Task>(
        &self,
        root: T,
        inputs: T::Inputs,
        hosted: &[(VnodeId, Epoch)],
        starts: bool,
        transport: &dyn Transport,
        status: &MemberStatus,
        manual: bool,
    ) -> Result<MemberRun, RunError> {
        let store = self.store.clone();
        let (setup, manifest) = self.prepare(root, inputs)?;
        let shared = Arc::new(RunShared::new(self.vnodes, self.forge.clone()));
        shared.set_distributed();
        // Without a store (the S0 baseline) nothing is logged and no vnode can be recovered.
        let writer = match &store {
            Some(st) if manual => Some(LogWriter::manual(st.clone(), self.vnodes, self.policy)),
            Some(st) => Some(LogWriter::start(st.clone(), self.vnodes, self.policy)?),
            None => None,
        };
        if let Some(w) = &writer {
            w.set_checkpoint_every(self.checkpoint_every);
        }
        let mut vnodes = Vec::new();
        for &(v, epoch) in hosted {
            shared.set_epoch(v, epoch.0);
            vnodes.push(self.member_vnode(
                v,
                epoch,
                writer.as_ref(),
                &shared,
                transport,
                hosted.len(),
            )?);
        }
        *status.hosted.lock().unwrap_or_else(|p| p.into_inner()) =
            hosted.iter().map(|(v, _)| *v).collect();
        if starts {
            if let Some(store) = &store {
                ensure_manifest(&**store, &manifest)?;
            }
            if let Some(v0) = vnodes.iter_mut().find(|v| v.core.vnode == VnodeId(0)) {
                plant_root(&mut v0.core, &setup)?;
            }
        }
        // Only now may the coordinator count this member's work: before the root is planted,
        // every counter is zero and the run would look over (rule 2).
        let _ = status.shared.set(shared.clone());
        Ok(MemberRun {
            vnodes,
            shared,
            writer,
            setup,
            manifest,
        })
    }

    /// Rule 3: hosts `v` from now on, at `epoch`, rebuilt from its log.
    fn member_host(
        &self,
        run: &mut MemberRun,
        v: VnodeId,
        epoch: Epoch,
        transport: &dyn Transport,
        status: &MemberStatus,
    ) -> Result<(), RunError> {
        if run.vnodes.iter().any(|x| x.core.vnode == v) {
            return Ok(());
        }
        run.shared.set_epoch(v, epoch.0);
        let Some(writer) = run.writer.as_ref() else {
            return Err(RunError::Config(format!(
                "{v} lost its host and this run logs nothing to rebuild it from"
            )));
        };
        if v == VnodeId(0) {
            // Rule 4: the member that started the run may have died before it wrote the
            // manifest (found by the cluster simulator: the run then finished without one,
            // and could be neither inspected nor certified).
            ensure_manifest(&**writer.store(), &run.manifest)?;
        }
        let here = run.vnodes.len() + 1;
        let mut vn = self.member_vnode(v, epoch, Some(writer), &run.shared, transport, here)?;
        let r = vn.resume_from_log(&run.setup)?;
        vn.stats.failures += 1;
        vn.stats.recovered_tasks += r.restarted;
        vn.stats.reused_tasks += r.reused;
        vn.stats.failures_without_effect += u64::from(r.restarted == 0 && r.reused == 0);
        run.vnodes.push(vn);
        status
            .hosted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(v);
        Ok(())
    }

    /// Rule 5: syncs every hosted vnode's log, shuts the writer down, and reports.
    fn member_end(
        &self,
        run: MemberRun,
        outcome: Result<(), RunError>,
    ) -> Result<MemberReport, RunError> {
        let MemberRun {
            mut vnodes,
            shared,
            writer,
            setup,
            ..
        } = run;
        // Rule 5, after an error too (best effort then).
        let mut error = outcome.err().or_else(|| shared.take_error());
        let mut stats = Vec::with_capacity(vnodes.len());
        for v in &mut vnodes {
            let synced = v.finish();
            if let (None, Err(e)) = (&error, synced) {
                error = Some(e);
            }
            stats.push(v.stats.clone());
        }
        let mut outputs = None;
        if let Some(v0) = vnodes.iter().find(|v| v.core.vnode == VnodeId(0)) {
            let mut values = Vec::new();
            for &o in &setup.terminal {
                match v0.core.value(o).map(Value::encode) {
                    Some(Ok(bytes)) => values.push(bytes),
                    _ => break,
                }
            }
            if values.len() == setup.terminal.len() {
                outputs = Some(values);
            }
        }
        drop(vnodes);
        if let Some(Err(e)) = writer.map(LogWriter::shutdown) {
            error.get_or_insert(RunError::Log(e));
        }
        if let Some(e) = error {
            return Err(e);
        }
        Ok(MemberReport {
            outputs,
            root: setup.id,
            tasks: stats.iter().map(|s| s.tasks).sum(),
            events: stats.iter().map(|s| s.events).sum(),
            vnodes: stats,
            forged: shared.take_forged(),
        })
    }

    fn member_vnode(
        &self,
        v: VnodeId,
        epoch: Epoch,
        writer: Option<&LogWriter>,
        shared: &Arc<RunShared>,
        transport: &dyn Transport,
        here: usize,
    ) -> Result<Vnode, RunError> {
        let core = Core::new(
            v,
            self.registry.clone(),
            writer.map(|w| w.vnode_log_at(v, epoch.0)).transpose()?,
            shared.clone(),
        );
        let endpoint = transport.endpoint(v).map_err(|e| RunError::Internal {
            vnode: v,
            message: e.to_string(),
        })?;
        let rng = ChaCha8Rng::seed_from_u64(
            self.seed ^ u64::from(v.0).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ epoch.0,
        );
        let mut vnode = Vnode::new(
            core,
            endpoint,
            self.clock.clone(),
            rng,
            self.vnodes,
            self.timers.per_thread(here, self.threads),
        );
        vnode.reset(epoch);
        Ok(vnode)
    }

    fn member_loop(
        &self,
        run: &mut MemberRun,
        transport: &dyn Transport,
        status: &MemberStatus,
        control: Receiver<Control>,
    ) -> Result<(), RunError> {
        let pending: Mutex<Vec<Control>> = Mutex::default();
        let pending = &pending;
        let shared = run.shared.clone();
        let shared = &shared;
        std::thread::scope(|scope| {
            // The watcher: applies epochs at once, queues hosting orders and interrupts the
            // drivers for them, stops the run on Stop or when the coordinator is gone.
            scope.spawn(move || loop {
                if shared.stopped() {
                    return;
                }
                match control.recv_timeout(CONTROL_POLL) {
                    Ok(Control::Epoch(v, e)) => shared.set_epoch(v, e.0),
                    Ok(c @ Control::Host(..)) => {
                        pending.lock().unwrap_or_else(|p| p.into_inner()).push(c);
                        shared.set_interrupt(true);
                    }
                    Ok(Control::Stop) | Err(RecvTimeoutError::Disconnected) => {
                        shared.stop();
                        return;
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                }
            });
            let result = (|| -> Result<(), RunError> {
                loop {
                    {
                        let rc = RecoveryContext {
                            writer: run.writer.as_ref(),
                            root: &run.setup,
                        };
                        self.drive(&mut run.vnodes, shared, &rc);
                    }
                    if shared.stopped() {
                        return Ok(());
                    }
                    shared.set_interrupt(false);
                    let orders: Vec<Control> =
                        std::mem::take(&mut *pending.lock().unwrap_or_else(|p| p.into_inner()));
                    for order in orders {
                        if let Control::Host(v, epoch) = order {
                            self.member_host(run, v, epoch, transport, status)?;
                        }
                    }
                }
            })();
            if result.is_err() {
                shared.stop();
            }
            result
        })
    }
}

/// Writes `manifest` unless the store holds one (rule 4).
fn ensure_manifest(
    store: &dyn veriflow_checkpoint::Store,
    manifest: &Manifest,
) -> Result<(), RunError> {
    if Manifest::load(store)?.is_none() {
        // With an empty durable watermark for each vnode that has none (log rule 8).
        manifest.store_new(store)?;
    }
    Ok(())
}

/// A member driven by its caller on one thread ([`Runtime::stepped_member`]).
pub struct SteppedMember {
    rt: Arc<Runtime>,
    run: Option<MemberRun>,
    transport: Arc<dyn Transport>,
    status: Arc<MemberStatus>,
}

impl std::fmt::Debug for SteppedMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SteppedMember")
            .field("hosted", &self.status.hosted())
            .finish_non_exhaustive()
    }
}

impl SteppedMember {
    fn run(&mut self) -> Result<&mut MemberRun, RunError> {
        self.run.as_mut().ok_or_else(|| RunError::Internal {
            vnode: VnodeId(u32::MAX),
            message: "a stepped member used after it finished".to_string(),
        })
    }

    /// Steps every hosted vnode once (up to `budget` tasks each, then its messages and
    /// timers). Returns whether anything happened.
    pub fn step(&mut self, budget: usize) -> Result<bool, RunError> {
        let run = self.run()?;
        let mut worked = false;
        for v in &mut run.vnodes {
            worked |= v.step(budget)?;
        }
        if let Some(e) = run.shared.take_error() {
            return Err(e);
        }
        Ok(worked)
    }

    /// Stores and flushes what the vnodes sealed so far: durability moves (rule 2 of
    /// `log/mod.rs`); messages waiting for it go out at the next step.
    pub fn pump(&mut self) -> Result<(), RunError> {
        if let Some(w) = self.run()?.writer.as_ref() {
            w.pump();
        }
        Ok(())
    }

    /// An order of the coordinator (rule 3); `Stop` ends nothing by itself: call
    /// [`SteppedMember::finish`].
    pub fn control(&mut self, order: Control) -> Result<(), RunError> {
        let rt = self.rt.clone();
        let transport = self.transport.clone();
        let status = self.status.clone();
        let run = self.run()?;
        match order {
            Control::Epoch(v, e) => run.shared.set_epoch(v, e.0),
            Control::Host(v, e) => rt.member_host(run, v, e, &*transport, &status)?,
            Control::Stop => run.shared.stop(),
        }
        Ok(())
    }

    /// What the coordinator's probes read (rule 2).
    pub fn status(&self) -> &Arc<MemberStatus> {
        &self.status
    }

    /// What each hosted vnode waits for (`waits.rs`).
    pub fn waits(&self) -> Vec<VnodeWaits> {
        self.run
            .as_ref()
            .map(|r| r.vnodes.iter().map(Vnode::waits).collect())
            .unwrap_or_default()
    }

    /// Rule 5: syncs the logs and reports.
    pub fn finish(mut self) -> Result<MemberReport, RunError> {
        let run = self.run.take().ok_or_else(|| RunError::Internal {
            vnode: VnodeId(u32::MAX),
            message: "a stepped member finished twice".to_string(),
        })?;
        self.rt.member_end(run, Ok(()))
    }
}

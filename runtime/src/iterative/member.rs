//! Iterative mode in cluster mode: the part of an iterative run hosted by one member process
//! (the same [`Member`] a data-flow run gets from the cluster's worker).
//!
//! Rules:
//!
//! 1. Every vnode hosted from the start runs its node on its own thread, over the member's
//!    transport (the cluster's router); a vnode hosted at an epoch above 0 is a replacement and
//!    restores from its backups first (module rule 6).
//! 2. The member never ends the run by itself. Through [`MemberStatus::work`] each hosted
//!    vnode shows the work word 1 until it has finished its last step and 0 after, so the
//!    coordinator's two-scan termination test ends the run once every vnode has finished, and
//!    [`Control::Stop`] stops the nodes (a finished vnode keeps serving its neighbours until
//!    then: module rule 7).
//! 3. [`Control::Host`] starts a replacement for a vnode whose process died, at the new epoch.
//!    [`Control::Epoch`] needs nothing here: every node drops the messages of an epoch older
//!    than one it has seen from the same vnode (module rule 8), and the store refuses the
//!    backups of an incarnation whose replacement has read them (`backup.rs` rule 4); such a
//!    node stops without failing the member (a process declared dead that comes back, a
//!    zombie, is told to stop by the coordinator anyway).
//! 4. The report holds the final state of every vnode that finished here, with its counters.
//!    A vnode's node failing fails the member with that error.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::conv::spanning_tree;
use super::node::{spawn_node, Control as NodeControl, Exit, ExitMsg, Incarnation, NodeStats};
use super::{BlockFactory, IterConfig, IterError};
use crate::exec::{Control, Member};
use crate::ids::{Epoch, VnodeId};

/// What a member did in an iterative run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MemberOutcome {
    /// Final states of the vnodes that finished here: (vnode, steps, [`super::Block::save`]).
    pub states: Vec<(VnodeId, u64, Vec<u8>)>,
    /// Counters of every incarnation that ran here, by vnode.
    pub stats: Vec<(VnodeId, NodeStats)>,
}

/// Runs this member's vnodes of an iterative run until the coordinator stops it (rules 1-4).
pub fn run_member(
    cfg: IterConfig,
    factory: BlockFactory,
    member: Member,
) -> Result<MemberOutcome, IterError> {
    cfg.validate()?;
    let n = cfg.neighbours.len();
    let tree = spanning_tree(&cfg.neighbours);
    let cfg = Arc::new(cfg);
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel();
    let (exit_tx, exit_rx) = mpsc::channel::<ExitMsg>();
    let mut running = 0usize;
    let mut failure: Option<IterError> = None;
    let mut stats: BTreeMap<VnodeId, NodeStats> = BTreeMap::new();
    let mut states: BTreeMap<VnodeId, (u64, Vec<u8>)> = BTreeMap::new();
    let start = |v: VnodeId, epoch: Epoch| -> Result<(), IterError> {
        if v.0 as usize >= n {
            return Err(IterError::Config(format!(
                "the coordinator asks to host {v}, but the run has {n} vnodes"
            )));
        }
        let ep = member
            .transport
            .endpoint(v)
            .map_err(|e| IterError::Config(format!("{v}: {e}")))?;
        let ctl = Arc::new(NodeControl {
            kill: AtomicBool::new(false),
            stop: stop.clone(),
            done: done_tx.clone(),
            ready: AtomicBool::new(false),
        });
        member.status.set_word(v, 1);
        spawn_node(
            Incarnation {
                vnode: v,
                epoch,
                restore: epoch.0 > 0,
            },
            ep,
            &factory,
            &cfg,
            ctl,
            &tree,
            &exit_tx,
        )
    };
    for &(v, epoch) in &member.hosted {
        match start(v, epoch) {
            Ok(()) => running += 1,
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let mut stopping = failure.is_some();
    loop {
        while let Ok((v, steps, state)) = done_rx.try_recv() {
            member.status.set_word(v, 0);
            states.insert(v, (steps, state));
        }
        while let Ok((v, exit, s, _ep)) = exit_rx.try_recv() {
            running -= 1;
            stats.entry(v).or_default().add(&s);
            match exit {
                // A zombie's node the store fenced (`backup.rs` rule 4): the vnode lives on
                // elsewhere, this incarnation stops (module rule 8).
                Exit::Failed(IterError::Superseded { .. }) => {}
                Exit::Failed(e) => {
                    failure = failure.or(Some(e));
                    stopping = true;
                }
                Exit::Stopped | Exit::Killed => {}
            }
        }
        if stopping {
            stop.store(true, Ordering::Relaxed);
            if running == 0 {
                break;
            }
        }
        match member.control.recv_timeout(Duration::from_millis(5)) {
            Ok(Control::Host(v, epoch)) if !stopping => match start(v, epoch) {
                Ok(()) => running += 1,
                Err(e) => {
                    failure = failure.or(Some(e));
                    stopping = true;
                }
            },
            Ok(Control::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => stopping = true,
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    while let Ok((v, steps, state)) = done_rx.try_recv() {
        states.insert(v, (steps, state));
    }
    Ok(MemberOutcome {
        states: states
            .into_iter()
            .map(|(v, (steps, state))| (v, steps, state))
            .collect(),
        stats: stats.into_iter().collect(),
    })
}

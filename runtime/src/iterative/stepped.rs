//! Nodes stepped by their caller on its own clock: the deterministic simulator's way to run
//! iterative mode (`veriflow_cluster::sim::iterative`). It is the node code of the threads of
//! [`super::run_embedded`] and [`super::run_member`], not a copy: those threads are a loop
//! around the same [`Node::step`], blocking on their endpoint while a step says idle.
//!
//! Rules:
//!
//! 1. A node never blocks and never reads a clock: each [`SteppedNode::step`] gets the time,
//!    handles the messages waiting on its endpoint, resends what is due, and iterates at most
//!    once.
//! 2. Crashing a node is dropping it: its memory is gone. A replacement is a new node of the
//!    same vnode at a higher epoch with `restore` set (module rule 6).
//! 3. A node whose step fails with [`IterError::Superseded`] is an incarnation declared dead
//!    that a store fence stopped; the caller drops it like a crashed one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

use super::conv::spanning_tree;
use super::node::{Control, Exit, Node, NodeStats, Poll};
use super::{BlockFactory, IterConfig, IterError};
use crate::ids::{Epoch, VnodeId};
use crate::transport::Endpoint;

/// An iterative run whose nodes the caller steps (rules 1-3).
#[derive(Clone)]
pub struct SteppedRun {
    cfg: Arc<IterConfig>,
    tree: Arc<Vec<Vec<VnodeId>>>,
    factory: BlockFactory,
}

impl std::fmt::Debug for SteppedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SteppedRun")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl SteppedRun {
    /// The run of the blocks `factory` makes under `cfg` (checked).
    pub fn new(cfg: IterConfig, factory: BlockFactory) -> Result<SteppedRun, IterError> {
        cfg.validate()?;
        let tree = spanning_tree(&cfg.neighbours);
        Ok(SteppedRun {
            cfg: Arc::new(cfg),
            tree: Arc::new(tree),
            factory,
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &IterConfig {
        &self.cfg
    }

    /// The same run with another configuration of the same vnodes (a simulated process's own
    /// handle on the store, say).
    pub fn with_config(&self, cfg: IterConfig) -> Result<SteppedRun, IterError> {
        cfg.validate()?;
        if cfg.neighbours != self.cfg.neighbours {
            return Err(IterError::Config(
                "another configuration of the same run must keep its neighbours".into(),
            ));
        }
        Ok(SteppedRun {
            cfg: Arc::new(cfg),
            tree: self.tree.clone(),
            factory: self.factory.clone(),
        })
    }

    /// The node of vnode `v` at `epoch` over `ep`, started at time `now`; a replacement
    /// (`restore`) first restores from its backups (rule 2).
    pub fn node(
        &self,
        v: VnodeId,
        epoch: Epoch,
        restore: bool,
        ep: Box<dyn Endpoint>,
        now: Duration,
    ) -> Result<SteppedNode, IterError> {
        let tree = self
            .tree
            .get(v.0 as usize)
            .cloned()
            .ok_or_else(|| IterError::Config(format!("{v} is not a vnode of the run")))?;
        let block = (self.factory)(v).map_err(|source| IterError::Block { vnode: v, source })?;
        let (done_tx, done) = mpsc::channel();
        let ctl = Arc::new(Control {
            kill: AtomicBool::new(false),
            stop: Arc::new(AtomicBool::new(false)),
            done: done_tx,
            ready: AtomicBool::new(false),
        });
        let node = Node::new(
            v,
            epoch,
            ep,
            block,
            self.cfg.clone(),
            ctl.clone(),
            tree,
            restore,
            now,
        );
        Ok(SteppedNode {
            node,
            ctl,
            done,
            finished: None,
        })
    }
}

/// What a step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stepped {
    /// It iterated: there is more to do at once.
    Busy,
    /// Nothing to do before a message arrives or this much time passes.
    Idle(Duration),
}

/// One incarnation of a vnode, stepped by its caller (rules 1-3).
pub struct SteppedNode {
    node: Node,
    ctl: Arc<Control>,
    done: Receiver<(VnodeId, u64, Vec<u8>)>,
    finished: Option<(u64, Vec<u8>)>,
}

impl std::fmt::Debug for SteppedNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SteppedNode")
            .field("vnode", &self.node.vnode())
            .finish_non_exhaustive()
    }
}

impl SteppedNode {
    /// One step at time `now` (rule 1).
    pub fn step(&mut self, now: Duration) -> Result<Stepped, IterError> {
        let poll = self.node.step(now);
        while let Ok((_, steps, state)) = self.done.try_recv() {
            self.finished = Some((steps, state));
        }
        match poll? {
            Poll::Busy => Ok(Stepped::Busy),
            Poll::Idle(d) => Ok(Stepped::Idle(d)),
            // Nobody kills or stops a stepped node: its caller drops it.
            Poll::Exit(Exit::Failed(e)) => Err(e),
            Poll::Exit(Exit::Killed | Exit::Stopped) => Ok(Stepped::Idle(Duration::MAX)),
        }
    }

    /// Steps its block has ended (its progress).
    pub fn steps_ended(&self) -> u64 {
        self.node.steps_ended()
    }

    /// Its vnode.
    pub fn vnode(&self) -> VnodeId {
        self.node.vnode()
    }

    /// Restored, and holding fresh backups of every vnode it backs up (module rule 6).
    pub fn ready(&self) -> bool {
        self.node.is_ready() && self.ctl.ready.load(Ordering::Relaxed)
    }

    /// Its final state once its last step has ended: (steps, [`super::Block::save`]).
    pub fn finished(&self) -> Option<&(u64, Vec<u8>)> {
        self.finished.as_ref()
    }

    /// What it waits for (step, detection tag, unacknowledged messages, backups awaited):
    /// the diagnosis of a run that makes no progress.
    pub fn waits(&self) -> String {
        self.node.waits()
    }

    /// Its counters so far.
    pub fn stats(&self) -> &NodeStats {
        self.node.stats()
    }
}

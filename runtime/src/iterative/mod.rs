//! Iterative mode (paper 000, JaceP2P-V2): one long-lived iterative process per vnode, each
//! owning a block of the unknowns, exchanging halos with its data neighbours, and a
//! decentralized protocol that detects global convergence.
//!
//! A program implements [`Block`] for its blocks and runs them with [`run_embedded`] (one
//! process, a pool of min(cores, vnodes) threads: rule 9) or, in cluster mode, with [`run_member`] in every member
//! process (the cluster's coordinator, router and failure detector, as for data-flow runs). The mode is chosen by
//! [`IterConfig::mode`]:
//!
//! - [`Mode::Async`]: a vnode never waits for a neighbour while it has not converged. It
//!   iterates with the last halo it received from each neighbour; lost halos only make it use
//!   older data. Once converged on what it has, it keeps pace with its neighbours (rule 2).
//! - [`Mode::Sync`]: every iteration waits for a fresh halo from every neighbour (asking for a
//!   resend when one is late), the classical synchronous block iteration, for comparison.
//!
//! # Example
//!
//! The heat equation of [`heat`] on 4 vnodes, asynchronous, with 10% of the messages lost and
//! two vnodes killed and replaced from their neighbours' backups while the others go on:
//!
//! ```
//! use std::time::Duration;
//! use veriflow_runtime::iterative::{heat, run_embedded, Embedded, IterConfig, IterKills, Mode};
//!
//! let (n, blocks, r, steps) = (64, 4, 0.5, 3);
//! let cfg = IterConfig::new(Mode::Async, IterConfig::chain(blocks as u32), 1e-10);
//! let opts = Embedded {
//!     loss: 0.1,
//!     seed: 7,
//!     kills: Some(IterKills { every: Duration::from_millis(5), count: 2, seed: 7 }),
//!     ..Embedded::default()
//! };
//! let report = run_embedded(cfg, heat::factory(n, blocks, r, steps), &opts)?;
//! let u: Vec<f64> = report
//!     .states
//!     .iter()
//!     .flat_map(|s| postcard::from_bytes::<heat::Heat>(s).unwrap().u)
//!     .collect();
//! let exact = heat::reference(n, r, steps);
//! let err = u.iter().zip(&exact[2]).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
//! assert!(err < 1e-8, "{err}");
//! # Ok::<(), veriflow_runtime::iterative::IterError>(())
//! ```
//!
//! # Rules
//!
//! 1. **Halos** (`node.rs`). After each iteration a vnode sends each data neighbour its halo,
//!    tagged (step, iteration); the envelope adds the sender's epoch. The receiver keeps the
//!    latest by (step, epoch, iteration): a replacement (higher epoch) wins even though its
//!    iteration count restarted from an older backup. Halos of a later step wait for that step.
//! 2. **Local convergence.** An iteration *counts* when every neighbour's halo it used is fresh
//!    (newer than the one the previous counting iteration used). A vnode is locally converged
//!    after [`IterConfig::local_iterations`] counting iterations in a row with a residual below
//!    [`IterConfig::tol`]; a residual at or above it starts the count again. An asynchronous
//!    vnode whose last residual is below the tolerance (converged on what it has) iterates
//!    again only once every neighbour's halo is fresh, on any news while a verification runs
//!    (rule 3: its neighbours wait for its fresh halo), or when the resend period has passed
//!    since its last iteration; one above it iterates
//!    on whatever it has. So a converged vnode keeps pace with its neighbours as a synchronous
//!    one does (each iteration on a chain or tree leaves a fresh halo on at least one side of
//!    every edge, so some vnode always has all its halos fresh; on other graphs the resend
//!    period bounds the wait), instead of iterating on every
//!    halo from either side and taking a core from a vnode still converging.
//! 3. **Global convergence** (`conv.rs`): detection along a spanning tree of the data
//!    neighbours, then verification: a vnode answers a verification only after a fresh halo from
//!    every neighbour and one iteration with them, and answers yes only if it is locally
//!    converged and that iteration's residual is below the tolerance. A positive verdict ends the
//!    step ([`Block::advance`]); a negative one restarts detection with round + 1.
//! 4. **Reliable convergence messages.** Convergence messages are resent every
//!    [`IterConfig::resend`] until acknowledged, duplicates are ignored, stale tags discarded.
//!    A receiver acknowledges only after its new status is saved on all its backup neighbours
//!    (they acknowledge the status backup), so an acknowledged message survives the receiver's
//!    crash. Likewise a sender sends a message only once the status that records it as
//!    unacknowledged is saved on all of them (write-ahead), so a replacement never lacks a
//!    message its predecessor sent: otherwise a neighbour could be in a verification the
//!    restored status knows nothing of, and acknowledge-and-drop the replacement's own
//!    (found by the iterative simulator, seed 651: a hang).
//! 5. **Backups** (paper 000 §3.2). The status backup (convergence state and its unacknowledged
//!    messages: small) goes to every backup neighbour on every status change. The data backup
//!    (block state, step and iteration) goes every [`IterConfig::backup_every`] iterations to one
//!    backup neighbour, round-robin, or to the store with [`IterConfig::store`] (one live copy
//!    per vnode, the previous one reclaimed: `backup.rs`); and to all of
//!    them, acknowledged, before a vnode answers yes in a verification and after it ends a step.
//!    So a yes and a finished step are never lost with the vnode that said them.
//! 6. **Replacement.** A vnode found dead is replaced (new epoch) by one that fetches the backups
//!    its backup neighbours (and the store) hold, restores the newest status and the newest data
//!    (advancing the data to the status's step with [`Block::advance`] when the step ended after
//!    the data was saved), resends what the status implies, and goes on; the others never stop.
//!    It also asks the vnodes it backs up for fresh backups, since it lost what it held for
//!    them, and is *ready* once it has them all: redundancy is then whole again (the embedded
//!    supervisor kills only when every vnode is ready).
//!    Its local-convergence count starts at zero, so it answers no to any verification until it
//!    has converged again: a crash delays detection and never causes a false one. Its iteration
//!    count goes on from the restored data's, so its backups outrank its predecessors' (found
//!    by the iterative simulator, seed 599: counting from zero, a replacement's forced backup
//!    lost to an older one that the next replacement restored, a false convergence). Data a
//!    step ahead of the status means the status's verdict was positive and its messages may
//!    have died unsent (the step's forced data backup goes out before the status that records
//!    them): the replacement passes that verdict on again to its tree neighbours (found by
//!    `no_false_convergence_over_a_hundred_seeded_runs` under load: a neighbour waited at the
//!    old step forever). A vnode whose
//!    backups are all lost (it and all its backup neighbours died before any new backup) fails
//!    the run with [`IterError::Unrecoverable`].
//! 7. **End.** A vnode whose last step ended reports its final state and keeps answering (acks,
//!    halo requests, backups) until every vnode has finished; then all stop.
//! 8. **Dead incarnations** (`node.rs`). A node drops every message whose sender's epoch is
//!    older than one it has already seen from that vnode ([`NodeStats::fenced`]): once a
//!    replacement has asked its backup neighbours for its backups, an incarnation declared dead
//!    that still runs (a zombie back from a pause) can no longer have them acknowledge a backup
//!    (so it cannot answer yes: rule 5) nor replace what they hold for the vnode. Data backups
//!    on a store are fenced the same way (`backup.rs` rule 4).
//! 9. **Scheduling** (`pool.rs`). [`run_embedded`] runs the nodes on
//!    [`Embedded::threads`] workers, min(cores, vnodes) by default, never a thread per vnode:
//!    a free worker first handles the messages of the nodes that received some, then iterates
//!    the node whose neighbours' halos are freshest (all fresh, then one still converging
//!    before an asynchronous one converged on what it has, then the most fresh, then the one
//!    that iterated least recently). An asynchronous vnode still never waits (it iterates
//!    on stale halos when nothing fresher is to be done), but no longer takes a core from the
//!    neighbour whose halo it lacks: with 8 threads on 2 cores, async iterated twice as often
//!    as sync and took 1.6 × its time (`paper transport`, 64³).
//!
//! The node code is one state machine stepped on an explicit time (`node.rs`, [`SteppedNode`]):
//! the pool of [`run_embedded`] and the threads of [`run_member`] loop around its step (the
//! member's threads block on their endpoint while it is idle); the deterministic simulator (`veriflow_cluster::sim::iterative`)
//! steps the same nodes on one thread on simulated time.

mod backup;
mod conv;
mod embedded;
pub mod heat;
mod member;
mod node;
mod pool;
mod stepped;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use conv::{ConvKind, Tag};
pub use embedded::{run_embedded, Embedded, IterKills};
pub use member::{run_member, MemberOutcome};
pub use node::NodeStats;
pub use stepped::{Stepped, SteppedNode, SteppedRun};

use crate::ids::VnodeId;
use veriflow_checkpoint::Store;

/// The data backup of vnode `v` on `store` (rule 5 with [`IterConfig::store`]), checked
/// against its digest: (step, iteration, [`Block::save`] bytes). Reads only; a replacement
/// reads its own. For tools and tests: after a run, what the store holds.
pub fn stored_backup(
    store: &dyn Store,
    v: VnodeId,
) -> Result<Option<(u64, u64, Vec<u8>)>, IterError> {
    Ok(backup::read(store, v)?.map(|(_, _, found)| found))
}

/// One vnode's part of an iterative computation.
///
/// Everything crosses vnodes as bytes the block encodes itself, so a block can be restored in
/// another process.
pub trait Block: Send {
    /// Encodes the halo that neighbour `to` needs from this block.
    fn halo_for(&self, to: VnodeId) -> Vec<u8>;
    /// Installs a halo received from neighbour `from`.
    fn set_halo(&mut self, from: VnodeId, halo: &[u8]) -> Result<(), BlockError>;
    /// One iteration with the halos installed; returns the local residual (rule 2).
    fn iterate(&mut self) -> f64;
    /// Ends the current step with the current iterate (rule 3); `false` when the computation is
    /// over.
    fn advance(&mut self) -> bool;
    /// The whole state, for data backups and the final result.
    fn save(&self) -> Vec<u8>;
    /// Replaces the state with one [`Block::save`] produced.
    fn restore(&mut self, state: &[u8]) -> Result<(), BlockError>;
}

/// A block refused bytes it was given.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct BlockError(pub String);

/// Makes the block of a vnode in its initial state (also for replacements, which then restore).
pub type BlockFactory = Arc<dyn Fn(VnodeId) -> Result<Box<dyn Block>, BlockError> + Send + Sync>;

/// Asynchronous or synchronous iterations (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Never wait; use the latest halos.
    Async,
    /// Wait for a fresh halo from every neighbour each iteration.
    Sync,
}

/// Parameters of an iterative run.
#[derive(Clone)]
pub struct IterConfig {
    /// Asynchronous or synchronous.
    pub mode: Mode,
    /// Data neighbours of each vnode (symmetric: v in n[u] iff u in n[v]).
    pub neighbours: Vec<Vec<VnodeId>>,
    /// Residual below which an iteration is converged.
    pub tol: f64,
    /// Counting converged iterations in a row for local convergence (rule 2).
    pub local_iterations: u32,
    /// Backup neighbours per vnode (rule 5); the ring neighbours v±1, v±2, ...
    pub backup_neighbours: u32,
    /// Iterations between data backups (rule 5).
    pub backup_every: u64,
    /// Resend period of unacknowledged messages (rule 4), and of halo requests in sync mode.
    pub resend: Duration,
    /// Iterations per step with a residual at or above `tol` after which the run fails as not
    /// converging (0: no limit). Iterations below `tol` (a converged vnode iterating on news
    /// while detection runs) do not count.
    pub max_iterations: u64,
    /// Data backups go here instead of to a neighbour (rule 5).
    pub store: Option<Arc<dyn Store>>,
}

impl std::fmt::Debug for IterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IterConfig")
            .field("mode", &self.mode)
            .field("vnodes", &self.neighbours.len())
            .field("tol", &self.tol)
            .field("local_iterations", &self.local_iterations)
            .field("backup_neighbours", &self.backup_neighbours)
            .field("backup_every", &self.backup_every)
            .field("resend", &self.resend)
            .field("store", &self.store.as_ref().map(|s| s.describe()))
            .finish()
    }
}

impl IterConfig {
    /// Defaults for `vnodes` vnodes with these neighbours: async, 3 local iterations, 2 backup
    /// neighbours, a data backup every 10 iterations, resend after 20 ms.
    pub fn new(mode: Mode, neighbours: Vec<Vec<VnodeId>>, tol: f64) -> Self {
        IterConfig {
            mode,
            neighbours,
            tol,
            local_iterations: 3,
            backup_neighbours: 2,
            backup_every: 10,
            resend: Duration::from_millis(20),
            max_iterations: 0,
            store: None,
        }
    }

    /// The neighbours of a chain of `n` vnodes (slabs): v-1 and v+1.
    pub fn chain(n: u32) -> Vec<Vec<VnodeId>> {
        (0..n)
            .map(|i| {
                let mut v = Vec::new();
                if i > 0 {
                    v.push(VnodeId(i - 1));
                }
                if i + 1 < n {
                    v.push(VnodeId(i + 1));
                }
                v
            })
            .collect()
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), IterError> {
        let n = self.neighbours.len();
        let bad = |m: String| Err(IterError::Config(m));
        if n == 0 {
            return bad("no vnodes".into());
        }
        if !(self.tol.is_finite() && self.tol > 0.0) {
            return bad(format!("tolerance {} must be positive", self.tol));
        }
        if self.local_iterations == 0 {
            return bad("local iterations must be at least 1".into());
        }
        if self.backup_every == 0 {
            return bad("the data backup period must be at least 1 iteration".into());
        }
        if n > 1 && self.backup_neighbours == 0 && self.store.is_none() {
            return bad("at least one backup neighbour (or a store) is needed".into());
        }
        for (u, ns) in self.neighbours.iter().enumerate() {
            for v in ns {
                if v.0 as usize >= n || v.0 as usize == u {
                    return bad(format!("vnode {u} has a bad neighbour {v}"));
                }
                if !self.neighbours[v.0 as usize].contains(&VnodeId(u as u32)) {
                    return bad(format!(
                        "neighbours are not symmetric: {v} in v{u}'s but not the reverse"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The backup neighbours of `v` (rule 5): v+1, v-1, v+2, ... on the ring of vnodes.
    pub fn backups_of(&self, v: VnodeId) -> Vec<VnodeId> {
        let n = self.neighbours.len() as i64;
        let mut out = Vec::new();
        let mut d = 1i64;
        while (out.len() as u32) < self.backup_neighbours && (out.len() as i64) < n - 1 {
            for s in [d, -d] {
                let w = VnodeId((i64::from(v.0) + s).rem_euclid(n) as u32);
                if w != v && !out.contains(&w) && (out.len() as u32) < self.backup_neighbours {
                    out.push(w);
                }
            }
            d += 1;
        }
        out
    }
}

/// A message of iterative mode (carried by [`crate::transport::Message::Iter`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum IterMsg {
    /// A halo (rule 1).
    Halo {
        /// Step it belongs to.
        step: u64,
        /// Sender's iteration count in that step.
        iter: u64,
        /// The block's encoding.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Sync mode: "resend me your latest halo".
    HaloRequest,
    /// A convergence message (rule 4).
    Conv {
        /// Its tag.
        tag: Tag,
        /// Its kind.
        kind: ConvKind,
    },
    /// Acknowledges a convergence message.
    ConvAck {
        /// Its tag.
        tag: Tag,
        /// Its kind.
        kind: ConvKind,
    },
    /// A status backup of the sender (rule 5).
    Status {
        /// Version: increases with every change.
        version: u64,
        /// The encoded status.
        #[serde(with = "serde_bytes")]
        status: Vec<u8>,
    },
    /// Acknowledges a status backup.
    StatusAck {
        /// Its version.
        version: u64,
    },
    /// A data backup of the sender (rule 5).
    Data {
        /// Step of the state.
        step: u64,
        /// Iteration of the state in that step.
        iter: u64,
        /// Must be acknowledged.
        ack: bool,
        /// [`Block::save`].
        #[serde(with = "serde_bytes")]
        state: Vec<u8>,
    },
    /// Acknowledges a data backup.
    DataAck {
        /// Its step.
        step: u64,
        /// Its iteration.
        iter: u64,
    },
    /// A replacement asks for the backups held for it (rule 6).
    Fetch,
    /// A replacement asks the vnodes it backs up for fresh backups, since it lost what it
    /// held for them (rule 6).
    Rebackup,
    /// The answer to [`IterMsg::Rebackup`]: the sender's current status and, without a store,
    /// its current data.
    Ward {
        /// Status version and bytes.
        status: (u64, Vec<u8>),
        /// Step, iteration and state.
        data: Option<(u64, u64, Vec<u8>)>,
    },
    /// The backups held for the asker.
    Backups {
        /// Newest status (version, bytes).
        status: Option<(u64, Vec<u8>)>,
        /// Newest data (step, iteration, state).
        data: Option<(u64, u64, Vec<u8>)>,
        /// The replier is a replacement that lost what it held for the asker.
        lost: bool,
    },
}

/// How an iterative run failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum IterError {
    /// Bad parameters.
    #[error("iterative mode: {0}")]
    Config(String),
    /// A block refused its input.
    #[error("{vnode}: {source}")]
    Block {
        /// Where.
        vnode: VnodeId,
        /// Why.
        source: BlockError,
    },
    /// Rule 6's failure.
    #[error("{0}: its state is lost with all its backup neighbours; keep data backups on checkpoint servers (--store) to survive this")]
    Unrecoverable(VnodeId),
    /// A step did not converge within the iteration limit.
    #[error(
        "{vnode}: step {step} did not converge: {iterations} iterations at or above the tolerance"
    )]
    NotConverging {
        /// Where.
        vnode: VnodeId,
        /// Which step.
        step: u64,
        /// Iterations at or above the tolerance done in that step (what the limit counts).
        iterations: u64,
    },
    /// The store failed.
    #[error("{vnode}: data backup store: {message}")]
    Store {
        /// Where.
        vnode: VnodeId,
        /// What.
        message: String,
    },
    /// A vnode thread panicked (a bug).
    #[error("{0} panicked")]
    Panicked(VnodeId),
    /// This incarnation was declared dead and a newer one has taken the vnode over (the store
    /// refused its write: `backup.rs` rule 4). Not a failure of the run: the incarnation
    /// stops.
    #[error("{vnode}: this incarnation (epoch {epoch}) was replaced by epoch {newest}")]
    Superseded {
        /// Where.
        vnode: VnodeId,
        /// This incarnation's epoch.
        epoch: u64,
        /// The newest epoch of the vnode.
        newest: u64,
    },
}

/// What an iterative run did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IterReport {
    /// Final state of each vnode's block ([`Block::save`]), by vnode.
    pub states: Vec<Vec<u8>>,
    /// Steps done.
    pub steps: u64,
    /// Per-vnode counters, summed over its incarnations.
    pub vnodes: Vec<NodeStats>,
    /// Vnodes killed and replaced.
    pub replacements: u64,
    /// Wall time, seconds.
    pub elapsed_s: f64,
}

impl IterReport {
    /// Iterations of all vnodes.
    pub fn iterations(&self) -> u64 {
        self.vnodes.iter().map(|s| s.iterations).sum()
    }
    /// Messages sent by all vnodes.
    pub fn messages(&self) -> u64 {
        self.vnodes.iter().map(|s| s.messages).sum()
    }
    /// Detection rounds that ended with a negative verdict, seen by vnode 0.
    pub fn negative_verdicts(&self) -> u64 {
        self.vnodes.first().map_or(0, |s| s.negative_verdicts)
    }
}

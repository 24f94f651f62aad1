//! Watching a cluster: the status client ([`status()`], `APP status`), and the coordinator's
//! read-only web dashboard with its Prometheus `/metrics` ([`Dashboard`], `APP coordinator
//! --dashboard ADDR`).
//!
//! Rules:
//! 1. Observers never change the cluster. They read [`Coordinator::status`] snapshots, which
//!    the driver takes between events (`coordinator` rule 1), and the workers' runtime
//!    counters; nothing they do reaches the state machine, and the state machine stays I/O-free.
//! 2. The workers' counters (`veriflow_runtime::metrics`) come with a probe answer, at most
//!    every 250 ms (`ToCoord::Metrics`); the driver keeps the last one of each worker, lost ones included,
//!    so the cluster's sums never go down when a worker dies.
//! 3. The history (throughput over time, the timeline of failures, recoveries, detector
//!    suspicions and takeovers) is built here from successive snapshots, in bounded rings
//!    ([`history`]): it is what a sampler saw, so a suspicion raised and cleared between two
//!    samples ([`SAMPLE_EVERY`]) is not in it. Its counters only grow.
//! 4. The dashboard binds to loopback unless told otherwise, and every request (page, assets,
//!    event stream, `/state`, `/metrics`) carries the token printed at start, as `?token=` or
//!    `Authorization: Bearer`; a missing or wrong token is answered 401 and nothing else.
//!
//! [`Coordinator::status`]: crate::coordinator::Coordinator::status

pub(crate) mod dashboard;
pub(crate) mod history;
pub(crate) mod metrics;
mod status;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

pub use dashboard::{Dashboard, DashboardError};
pub use metrics::certification_checked;
pub use status::status;

use crate::protocol::{ClusterStatus, FromOracle, WorkerId};
use veriflow_runtime::metrics::RuntimeMetrics;

/// How often the dashboard asks the coordinator for a snapshot: often enough that a lost
/// worker shows within a second, rare enough that a snapshot (a few vectors the size of the
/// cluster) costs the coordinator nothing measurable.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// A worker's last counters (rule 2).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct WorkerCounters {
    /// Its runtime's counters.
    pub(crate) runtime: RuntimeMetrics,
}

/// What the driver hands an observer: a snapshot, the workers' counters and what the online
/// oracle reported (rule 1).
#[derive(Debug, Clone, Default)]
pub(crate) struct Observation {
    pub(crate) status: ClusterStatus,
    pub(crate) workers: BTreeMap<WorkerId, WorkerCounters>,
    pub(crate) oracle: OracleNews,
}

/// Forgeries remembered for the page (the count goes on past it).
const MAX_FORGED: usize = 100;

/// What the coordinator's online oracle reported, as the driver passed it on (the admitted
/// oracle's messages only).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct OracleNews {
    /// The last job certified and the decision (`ACCEPT`, `REJECT`, ...).
    pub(crate) certified: Option<(u64, String)>,
    /// The last certification that failed: job and why.
    pub(crate) failed: Option<(u64, String)>,
    /// Forgeries reported, the newest last (at most [`MAX_FORGED`]), as lines.
    pub(crate) forged: VecDeque<String>,
    /// Forgeries reported in all.
    pub(crate) forged_total: u64,
}

impl OracleNews {
    /// Notes one message of the oracle.
    pub(crate) fn note(&mut self, msg: &FromOracle) {
        match msg {
            FromOracle::Certified { job, decision, .. } => {
                self.certified = Some((*job, decision.clone()));
            }
            FromOracle::Failed { job, error } => self.failed = Some((*job, error.clone())),
            FromOracle::Forged {
                job,
                vnode,
                epoch,
                task,
                reason,
            } => {
                if self.forged.len() == MAX_FORGED {
                    self.forged.pop_front();
                }
                self.forged.push_back(format!(
                    "job {job}: task {task} of vnode {vnode} at epoch {epoch} forged: {reason}"
                ));
                self.forged_total += 1;
            }
            FromOracle::Checked { tasks, .. } => metrics::certification_checked(*tasks),
            FromOracle::Committed { .. } => {}
        }
    }
}

//! Watching a cluster: the status client ([`status()`], `APP status`), and the coordinator's
//! read-only web dashboard with its Prometheus `/metrics` ([`Dashboard`], `APP coordinator
//! --dashboard ADDR`).
//!
//! Rules:
//! 1. Observers never change the cluster. They read [`Coordinator::status`] snapshots, which
//!    the driver takes between events (`coordinator` rule 1), and the workers' runtime
//!    counters; nothing they do reaches the state machine, and the state machine stays I/O-free.
//! 2. The workers' counters (`veriflow_runtime::metrics`) come with every probe answer
//!    (`ToCoord::Metrics`); the driver keeps the last one of each worker, lost ones included,
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

use std::collections::BTreeMap;
use std::time::Duration;

pub use dashboard::{Dashboard, DashboardError};
pub use metrics::certification_checked;
pub use status::status;

use crate::protocol::{ClusterStatus, WorkerId};
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

/// What the driver hands an observer: a snapshot and the workers' counters (rule 1).
#[derive(Debug, Clone, Default)]
pub(crate) struct Observation {
    pub(crate) status: ClusterStatus,
    pub(crate) workers: BTreeMap<WorkerId, WorkerCounters>,
}

//! Process-wide counters of what the runtime did, read by whoever reports them (a cluster
//! worker carries them to its coordinator, whose `/metrics` exports them).
//!
//! Rules:
//! 1. Counters only grow, over the whole life of the process (every run and every member
//!    counted together): a reader takes differences, and a Prometheus counter is exactly this.
//! 2. They are written where the work is already done (a steal granted, a group commit
//!    flushed), with one relaxed atomic add each: nothing waits on them and no order between
//!    them is promised; a [`snapshot`] may see one counter a step ahead of another.
//! 3. The commit latency is the time one group commit took to store and flush its batch
//!    (`log/writer.rs` rule 2), counted into fixed buckets ([`COMMIT_BUCKETS_US`]).
//!
//! ```
//! let before = veriflow_runtime::metrics::snapshot();
//! // ... a run ...
//! let after = veriflow_runtime::metrics::snapshot();
//! assert!(after.log_bytes >= before.log_bytes);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Upper bounds of the commit-latency buckets, in µs (a last bucket holds the rest). From
/// 100 µs (a local flush of a small batch) to 1 s (a remote store under load), about ×2.5
/// apart: the spread measured between a tmpfs sled store and checkpoint servers on a loaded
/// 2-core machine.
pub const COMMIT_BUCKETS_US: [u64; 10] = [
    100, 250, 1_000, 2_500, 10_000, 25_000, 100_000, 250_000, 500_000, 1_000_000,
];

/// What the runtime of this process did so far (rule 1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeMetrics {
    /// Tasks stolen from this process's vnodes (steal grants sent).
    pub steals: u64,
    /// Bytes of log segments stored and flushed.
    pub log_bytes: u64,
    /// Group commits flushed.
    pub commits: u64,
    /// Their total time, in µs.
    pub commit_us_sum: u64,
    /// Commits per bucket of [`COMMIT_BUCKETS_US`], and one more for the slower (not
    /// cumulative).
    pub commit_buckets: Vec<u64>,
    /// Failure-detector heartbeats this process sent (a cluster worker counts its own:
    /// [`heartbeats_sent`]).
    pub heartbeats: u64,
}

struct Counters {
    steals: AtomicU64,
    heartbeats: AtomicU64,
    log_bytes: AtomicU64,
    commits: AtomicU64,
    commit_us_sum: AtomicU64,
    buckets: [AtomicU64; COMMIT_BUCKETS_US.len() + 1],
}

static COUNTERS: Counters = Counters {
    steals: AtomicU64::new(0),
    heartbeats: AtomicU64::new(0),
    log_bytes: AtomicU64::new(0),
    commits: AtomicU64::new(0),
    commit_us_sum: AtomicU64::new(0),
    buckets: [const { AtomicU64::new(0) }; COMMIT_BUCKETS_US.len() + 1],
};

/// A steal was granted (`exec/vnode.rs`).
pub(crate) fn stolen() {
    COUNTERS.steals.fetch_add(1, Ordering::Relaxed);
}

/// A group commit of `bytes` took `took` (rule 3).
pub(crate) fn committed(bytes: u64, took: Duration) {
    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    COUNTERS.log_bytes.fetch_add(bytes, Ordering::Relaxed);
    COUNTERS.commits.fetch_add(1, Ordering::Relaxed);
    COUNTERS.commit_us_sum.fetch_add(us, Ordering::Relaxed);
    let i = COMMIT_BUCKETS_US
        .iter()
        .position(|&b| us <= b)
        .unwrap_or(COMMIT_BUCKETS_US.len());
    COUNTERS.buckets[i].fetch_add(1, Ordering::Relaxed);
}

/// `n` failure-detector heartbeats were sent (a cluster worker, as it sends them).
pub fn heartbeats_sent(n: u64) {
    COUNTERS.heartbeats.fetch_add(n, Ordering::Relaxed);
}

/// The counters now (rule 2).
pub fn snapshot() -> RuntimeMetrics {
    let c = &COUNTERS;
    RuntimeMetrics {
        steals: c.steals.load(Ordering::Relaxed),
        heartbeats: c.heartbeats.load(Ordering::Relaxed),
        log_bytes: c.log_bytes.load(Ordering::Relaxed),
        commits: c.commits.load(Ordering::Relaxed),
        commit_us_sum: c.commit_us_sum.load(Ordering::Relaxed),
        commit_buckets: c
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_lands_in_its_bucket_and_counters_only_grow() {
        let before = snapshot();
        committed(100, Duration::from_micros(2_000));
        committed(7, Duration::from_secs(5));
        stolen();
        heartbeats_sent(3);
        let after = snapshot();
        assert!(after.heartbeats >= before.heartbeats + 3);
        assert!(after.log_bytes >= before.log_bytes + 107);
        assert!(after.commits >= before.commits + 2);
        assert!(after.steals > before.steals);
        // 2 ms is in the 2.5 ms bucket (index 3); 5 s past the last bound.
        assert!(after.commit_buckets[3] > before.commit_buckets[3]);
        assert!(after.commit_buckets[COMMIT_BUCKETS_US.len()] > before.commit_buckets[10]);
        assert!(after.commit_us_sum >= before.commit_us_sum + 5_002_000);
    }
}

//! `/metrics`: the cluster's counters in the Prometheus (OpenMetrics) text format, encoded by
//! `prometheus-client` from one observation at each scrape.
//!
//! Rules:
//! 1. Every counter only grows (`observe` rules 2 and 3): the workers' sums keep the last
//!    counts of lost workers, and the history's counters never go back.
//! 2. Names start with `veriflow_`; counters end in `_total`, times are in seconds.
//! 3. `veriflow_certification_checks_total` counts the tasks the online oracle checked, as it
//!    reports them to this coordinator (`FromOracle::Checked`, through
//!    [`certification_checked`]); without an oracle it stays 0.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use veriflow_runtime::metrics::COMMIT_BUCKETS_US;

use super::history::Counters;
use super::WorkerCounters;
use crate::protocol::{CoordCounters, WorkerId};

static CERTIFICATION_CHECKS: AtomicU64 = AtomicU64::new(0);

/// Counts `n` certification checks made in this process (rule 3).
pub fn certification_checked(n: u64) {
    CERTIFICATION_CHECKS.fetch_add(n, Ordering::Relaxed);
}

/// What one scrape exports.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrape {
    pub(crate) counters: Counters,
    pub(crate) workers: BTreeMap<WorkerId, WorkerCounters>,
    /// The coordinator's own traffic and termination-test counts (`APP status` `counters`).
    pub(crate) coordinator: CoordCounters,
    /// Workers admitted and not lost.
    pub(crate) workers_alive: i64,
    /// Vnodes of the running jobs' maps.
    pub(crate) vnodes: i64,
    /// Jobs running (checking their store, running, ending) and jobs queued.
    pub(crate) jobs_running: i64,
    pub(crate) jobs_queued: i64,
    /// The last sample's tasks per second.
    pub(crate) tasks_per_s: f64,
}

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sum = |f: fn(&WorkerCounters) -> u64| self.workers.values().map(f).sum::<u64>();
        let c = &self.counters;
        let k = &self.coordinator;
        let counters: [(&str, &str, u64); 17] = [
            (
                "tasks_completed",
                "Tasks completed in the cluster's jobs",
                c.tasks,
            ),
            (
                "steals",
                "Tasks stolen between vnodes (steal grants), over the workers",
                sum(|w| w.runtime.steals),
            ),
            (
                "log_bytes",
                "Bytes of log segments the workers stored and flushed",
                sum(|w| w.runtime.log_bytes),
            ),
            ("worker_failures", "Workers lost during jobs", c.failures),
            (
                "recoveries",
                "Vnodes rebuilt from their logs on a new host (a new epoch)",
                c.recoveries,
            ),
            (
                "detector_suspicions",
                "Times the coordinator's failure detector found a worker unreachable or broken",
                c.suspicions,
            ),
            (
                "takeovers",
                "Takeovers of the coordinator's role from a predecessor's journal",
                c.takeovers,
            ),
            (
                "certification_checks",
                "Checks made by the online certification oracle (0 without one)",
                CERTIFICATION_CHECKS.load(Ordering::Relaxed),
            ),
            (
                "forgeries",
                "Forged tasks the online oracle reported",
                c.forgeries,
            ),
            (
                "log_commits",
                "Group commits the workers flushed",
                sum(|w| w.runtime.commits),
            ),
            (
                "coordinator_messages_in",
                "Messages the coordinator received from workers, heartbeats included",
                k.messages_in,
            ),
            (
                "coordinator_messages_out",
                "Messages the coordinator sent to workers, heartbeats included",
                k.messages_out,
            ),
            (
                "coordinator_heartbeats_in",
                "Failure-detector heartbeats the coordinator received",
                k.heartbeats_in,
            ),
            (
                "coordinator_heartbeats_out",
                "Failure-detector heartbeats the coordinator sent",
                k.heartbeats_out,
            ),
            (
                "worker_heartbeats",
                "Heartbeats the workers sent (to the coordinator and each other), as last reported",
                k.worker_heartbeats,
            ),
            (
                "probe_rounds",
                "Termination-test rounds every member answered",
                k.probe_rounds,
            ),
            (
                "probes",
                "Termination-test probes the coordinator sent (one per member per round)",
                k.probes_sent,
            ),
        ];
        for (name, help, v) in counters {
            let m = ConstCounter::new(v);
            m.encode(enc.encode_descriptor(name, help, None, m.metric_type())?)?;
        }
        let gauges: [(&str, &str, i64); 4] = [
            (
                "workers",
                "Workers admitted and not lost",
                self.workers_alive,
            ),
            ("vnodes", "Vnodes of the running jobs", self.vnodes),
            (
                "jobs_running",
                "Jobs started and not ended (checking their store, running or ending)",
                self.jobs_running,
            ),
            (
                "jobs_queued",
                "Jobs waiting for their workers",
                self.jobs_queued,
            ),
        ];
        for (name, help, v) in gauges {
            let m = ConstGauge::new(v);
            m.encode(enc.encode_descriptor(name, help, None, m.metric_type())?)?;
        }
        let rate = ConstGauge::new(self.tasks_per_s);
        rate.encode(enc.encode_descriptor(
            "tasks_per_second",
            "Tasks completed per second at the last sample",
            None,
            rate.metric_type(),
        )?)?;
        // The workers' commit-latency buckets, added up (not cumulative; the last is +Inf).
        let mut buckets: Vec<(f64, u64)> = COMMIT_BUCKETS_US
            .iter()
            .map(|&us| (us as f64 / 1e6, 0))
            .chain(std::iter::once((f64::MAX, 0)))
            .collect();
        for w in self.workers.values() {
            for (b, n) in buckets.iter_mut().zip(&w.runtime.commit_buckets) {
                b.1 += n;
            }
        }
        let mut h = enc.encode_descriptor(
            "log_commit_seconds",
            "Time a group commit took to store and flush its batch",
            None,
            MetricType::Histogram,
        )?;
        h.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            sum(|w| w.runtime.commit_us_sum) as f64 / 1e6,
            sum(|w| w.runtime.commits),
            &buckets,
            None,
        )
    }
}

/// The scrape's text (rule 2).
pub(crate) fn encode(scrape: Scrape) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("veriflow");
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use veriflow_runtime::metrics::RuntimeMetrics;

    #[test]
    fn a_scrape_sums_the_workers_and_names_every_counter() {
        let w = |steals, b0| WorkerCounters {
            runtime: RuntimeMetrics {
                steals,
                log_bytes: 1000,
                commits: b0 + 1,
                commit_us_sum: 3_000_000,
                commit_buckets: {
                    let mut v = vec![0; COMMIT_BUCKETS_US.len() + 1];
                    v[0] = b0;
                    v[COMMIT_BUCKETS_US.len()] = 1;
                    v
                },
                heartbeats: 0,
            },
        };
        let text = encode(Scrape {
            counters: Counters {
                tasks: 42,
                failures: 1,
                recoveries: 2,
                suspicions: 3,
                takeovers: 0,
                forgeries: 0,
            },
            workers: [(1, w(5, 2)), (2, w(7, 3))].into(),
            coordinator: CoordCounters {
                heartbeats_in: 9,
                probe_rounds: 11,
                ..CoordCounters::default()
            },
            workers_alive: 1,
            vnodes: 4,
            jobs_running: 2,
            jobs_queued: 3,
            tasks_per_s: 10.5,
        })
        .unwrap();
        for line in [
            "veriflow_tasks_completed_total 42",
            "veriflow_steals_total 12",
            "veriflow_log_bytes_total 2000",
            "veriflow_worker_failures_total 1",
            "veriflow_recoveries_total 2",
            "veriflow_detector_suspicions_total 3",
            "veriflow_takeovers_total 0",
            "veriflow_workers 1",
            "veriflow_coordinator_heartbeats_in_total 9",
            "veriflow_probe_rounds_total 11",
            "veriflow_jobs_running 2",
            "veriflow_jobs_queued 3",
            "veriflow_log_commit_seconds_count 7",
            "veriflow_log_commit_seconds_sum 6.0",
            "veriflow_log_commit_seconds_bucket{le=\"0.0001\"} 5",
            "veriflow_log_commit_seconds_bucket{le=\"+Inf\"} 7",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(
            text.contains("veriflow_certification_checks_total "),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    /// The oracle's reports of its checks reach the counter (rule 3); the counter is the
    /// process's, so the test reads it before and after.
    #[test]
    fn the_oracles_checks_are_counted() {
        let before = CERTIFICATION_CHECKS.load(Ordering::Relaxed);
        let mut news = super::super::OracleNews::default();
        news.note(&crate::protocol::FromOracle::Checked { job: 1, tasks: 7 });
        news.note(&crate::protocol::FromOracle::Checked { job: 1, tasks: 5 });
        assert!(CERTIFICATION_CHECKS.load(Ordering::Relaxed) >= before + 12);
    }
}

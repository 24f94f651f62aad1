//! What the dashboard remembers (`observe` rule 3): throughput samples and a timeline of
//! events, each in a bounded ring, and counters that only grow, all built by comparing each
//! [`Observation`] with the one before. Pure: the caller gives the time.
//!
//! Rules:
//! 1. A failure is a new entry of a job's `failures` (a worker, once per job); a recovery is
//!    a vnode of a job whose epoch grew (it was rebuilt from its log on a new host); a
//!    suspicion is a worker whose detector verdict left `alive`; a takeover is a snapshot that
//!    says `took_over` under a term not seen before; a job's start and end are one event
//!    each, when it is first seen running and first seen ended.
//! 2. Tasks completed over the cluster's life are every job's tasks, each job counted once,
//!    at the most it was seen at (its final count once ended).
//! 3. The online oracle's reports: a forgery is one event each (counted by the oracle's
//!    total, so one never shown on the page still counts); a certification or a failed one
//!    is an event when it differs from the last.
//! 4. Rings hold [`MAX_SAMPLES`] samples and [`MAX_EVENTS`] events; the oldest go first.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::Serialize;

use super::Observation;
use crate::protocol::WorkerId;

/// Samples kept: ten minutes at `SAMPLE_EVERY`.
pub(crate) const MAX_SAMPLES: usize = 1200;
/// Timeline events kept: a cluster losing more than this is read in the coordinator's log.
pub(crate) const MAX_EVENTS: usize = 500;

/// Samples after a worker adopted vnodes in which its count may still jump (its probe
/// answers come every few hundred ms, and the rebuild takes its time): 2 s at `SAMPLE_EVERY`.
pub(crate) const ADOPTING_SAMPLES: u64 = 4;

/// One point of the throughput and load charts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Sample {
    /// Sequence number (the page drops a sample it already has).
    pub(crate) n: u64,
    /// Seconds since the dashboard started.
    pub(crate) t: f64,
    /// Tasks completed over the cluster's life (rule 2).
    pub(crate) tasks: u64,
    /// Tasks per second since the sample before.
    pub(crate) tasks_per_s: f64,
    /// Each worker's tasks completed in the current job.
    pub(crate) workers: BTreeMap<WorkerId, u64>,
    /// Workers that took over vnodes within the last [`ADOPTING_SAMPLES`] samples: their
    /// counts jump by the rebuilt vnodes' tasks when their next probe answers come, so no rate
    /// is drawn for them over these intervals.
    pub(crate) adopted: Vec<WorkerId>,
}

/// One entry of the timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TimelineEvent {
    /// Seconds since the dashboard started.
    pub(crate) t: f64,
    /// `failure`, `recovery`, `suspicion`, `cleared`, `takeover`, `job` or `end`.
    pub(crate) kind: &'static str,
    pub(crate) text: String,
}

/// Counters over the dashboard's life (rules 1 and 3); they only grow.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Counters {
    pub(crate) tasks: u64,
    pub(crate) failures: u64,
    pub(crate) recoveries: u64,
    pub(crate) suspicions: u64,
    pub(crate) takeovers: u64,
    pub(crate) forgeries: u64,
}

/// The rings, the counters, and what the last observation held.
#[derive(Debug, Default)]
pub(crate) struct History {
    pub(crate) samples: VecDeque<Sample>,
    pub(crate) events: VecDeque<TimelineEvent>,
    pub(crate) counters: Counters,
    next: u64,
    /// Each job's most tasks seen (rule 2).
    job_tasks: BTreeMap<u64, u64>,
    /// Jobs seen running, and seen ended (rule 1).
    started_seen: BTreeSet<u64>,
    ended_seen: BTreeSet<u64>,
    failures_seen: BTreeSet<(u64, WorkerId)>,
    detector: BTreeMap<WorkerId, String>,
    /// Each running job's vnodes: host and epoch.
    epochs: BTreeMap<(u64, u32), (WorkerId, u64)>,
    terms_seen: BTreeSet<u64>,
    certified_seen: Option<(u64, String)>,
    failed_seen: Option<(u64, String)>,
    /// Workers that adopted vnodes, until which sample.
    adopting: BTreeMap<WorkerId, u64>,
}

impl History {
    /// Folds in an observation made at `t` seconds; returns the new sample and the timeline
    /// events it caused (also kept in the rings).
    pub(crate) fn fold(&mut self, t: f64, obs: &Observation) -> (Sample, Vec<TimelineEvent>) {
        let s = &obs.status;
        let mut new = Vec::new();
        let mut event = |kind: &'static str, text: String| {
            new.push(TimelineEvent { t, kind, text });
        };
        // Rule 1: a takeover, once per term.
        if s.took_over && self.terms_seen.insert(s.term) {
            self.counters.takeovers += 1;
            event(
                "takeover",
                format!(
                    "{} took over (term {:#x}) from a predecessor's journal",
                    s.coordinator, s.term
                ),
            );
        }
        // Rules 1 and 2: each job's start and end once, its tasks at the most seen.
        for j in &s.jobs {
            if j.state == "queued" {
                continue;
            }
            let most = self.job_tasks.entry(j.id).or_default();
            *most = (*most).max(j.tasks_completed);
            if j.ended() {
                if self.ended_seen.insert(j.id) {
                    self.started_seen.insert(j.id);
                    event(
                        "end",
                        match &j.error {
                            Some(e) => format!("job {} {}: {e}", j.id, j.state),
                            None => format!(
                                "job {} {}: {} tasks in {:.1} s, {} workers lost",
                                j.id, j.state, j.tasks_completed, j.elapsed_s, j.workers_lost
                            ),
                        },
                    );
                }
            } else if self.started_seen.insert(j.id) {
                event(
                    "job",
                    format!(
                        "job {} ({}) started on {} workers",
                        j.id,
                        j.program,
                        j.members.len()
                    ),
                );
            }
            // Rule 1: failures, once per job and worker.
            for f in &j.failures {
                if self.failures_seen.insert((j.id, f.worker)) {
                    self.counters.failures += 1;
                    event(
                        "failure",
                        format!(
                            "worker {} lost ({}); {} vnodes of job {} moved",
                            f.worker, f.reason, f.moved, j.id
                        ),
                    );
                }
            }
        }
        let tasks = self
            .job_tasks
            .values()
            .sum::<u64>()
            .max(self.counters.tasks);
        // Rule 1: suspicions (a verdict that left alive) and their end.
        for w in &s.workers {
            let before = self.detector.insert(w.id, w.detector.clone());
            let was_alive = before.as_deref().is_none_or(|d| d == "alive");
            if was_alive && w.detector != "alive" && w.detector != "unknown" {
                self.counters.suspicions += 1;
                event(
                    "suspicion",
                    format!(
                        "the coordinator's detector finds worker {} {}",
                        w.id, w.detector
                    ),
                );
            } else if !was_alive && w.detector == "alive" {
                event("cleared", format!("worker {} is heard again", w.id));
            }
        }
        // Rule 3: the oracle's reports.
        let o = &obs.oracle;
        let new_forged = o.forged_total.saturating_sub(self.counters.forgeries);
        let shown = usize::try_from(new_forged).map_or(o.forged.len(), |n| n.min(o.forged.len()));
        for line in o.forged.iter().skip(o.forged.len() - shown) {
            event("forged", line.clone());
        }
        self.counters.forgeries = self.counters.forgeries.max(o.forged_total);
        if o.certified.is_some() && o.certified != self.certified_seen {
            self.certified_seen.clone_from(&o.certified);
            if let Some((job, decision)) = &o.certified {
                event(
                    "certified",
                    format!("job {job} certified by the online oracle: {decision}"),
                );
            }
        }
        if o.failed.is_some() && o.failed != self.failed_seen {
            self.failed_seen.clone_from(&o.failed);
            if let Some((job, error)) = &o.failed {
                event(
                    "uncertified",
                    format!("the online oracle could not certify job {job}: {error}"),
                );
            }
        }
        // Rule 1: recoveries, a vnode at a higher epoch.
        let mut live = BTreeSet::new();
        for j in s.jobs.iter().filter(|j| !j.map.is_empty()) {
            live.insert(j.id);
            for v in &j.map {
                let before = self.epochs.insert((j.id, v.vnode), (v.worker, v.epoch));
                if let Some((from, epoch)) = before {
                    if v.epoch > epoch {
                        self.counters.recoveries += 1;
                        self.adopting.insert(v.worker, self.next + ADOPTING_SAMPLES);
                        event(
                            "recovery",
                            format!(
                                "vnode {} of job {} rebuilt on worker {} at epoch {} (was \
                                 worker {from})",
                                v.vnode, j.id, v.worker, v.epoch
                            ),
                        );
                    }
                }
            }
        }
        self.epochs.retain(|(job, _), _| live.contains(job));
        let n = self.next;
        self.adopting.retain(|_, until| *until >= n);
        let adopted = self.adopting.keys().copied().collect();
        let dt = self.samples.back().map_or(0.0, |p| t - p.t);
        let prev = self.samples.back().map_or(0, |p| p.tasks);
        self.counters.tasks = tasks;
        let sample = Sample {
            n: self.next,
            t,
            tasks,
            // Exact up to 2^53 tasks, far beyond any cluster's life.
            tasks_per_s: if dt > 0.0 {
                tasks.saturating_sub(prev) as f64 / dt
            } else {
                0.0
            },
            workers: s
                .workers
                .iter()
                .map(|w| (w.id, w.tasks_completed))
                .collect(),
            adopted,
        };
        self.next += 1;
        // Rule 3.
        push_bounded(&mut self.samples, sample.clone(), MAX_SAMPLES);
        for e in &new {
            push_bounded(&mut self.events, e.clone(), MAX_EVENTS);
        }
        (sample, new)
    }
}

fn push_bounded<T>(ring: &mut VecDeque<T>, item: T, max: usize) {
    if ring.len() == max {
        ring.pop_front();
    }
    ring.push_back(item);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ClusterStatus, FailureStatus, JobStatus, VnodeStatus, WorkerStatus};

    fn worker(id: WorkerId, detector: &str, tasks: u64) -> WorkerStatus {
        WorkerStatus {
            id,
            detector: detector.into(),
            tasks_completed: tasks,
            ..WorkerStatus::default()
        }
    }

    fn running(tasks: u64, map: &[(u32, WorkerId, u64)]) -> ClusterStatus {
        ClusterStatus {
            role: "active".into(),
            term: 7,
            jobs: vec![JobStatus {
                id: 1,
                state: "running".into(),
                members: vec![1, 2],
                tasks_completed: tasks,
                map: map
                    .iter()
                    .map(|&(vnode, worker, epoch)| VnodeStatus {
                        vnode,
                        worker,
                        epoch,
                    })
                    .collect(),
                ..JobStatus::default()
            }],
            workers: vec![worker(1, "alive", tasks / 2), worker(2, "alive", tasks / 2)],
            ..ClusterStatus::default()
        }
    }

    fn obs(status: ClusterStatus) -> Observation {
        Observation {
            status,
            ..Observation::default()
        }
    }

    #[test]
    fn a_lost_worker_is_one_suspicion_one_failure_and_one_recovery_per_moved_vnode() {
        let mut h = History::default();
        let (s0, e0) = h.fold(0.0, &obs(running(10, &[(0, 1, 0), (1, 2, 0)])));
        assert_eq!(s0.tasks, 10);
        assert_eq!(e0.len(), 1, "{e0:?}");
        assert_eq!(e0[0].kind, "job");
        let (s1, _) = h.fold(0.5, &obs(running(30, &[(0, 1, 0), (1, 2, 0)])));
        assert_eq!(s1.tasks_per_s, 40.0);
        assert_eq!(s1.workers[&1], 15);
        // Worker 2 suspected.
        let mut st = running(40, &[(0, 1, 0), (1, 2, 0)]);
        st.workers[1].detector = "unreachable".into();
        let (_, e) = h.fold(1.0, &obs(st.clone()));
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].kind, "suspicion");
        // Seen again unchanged: nothing new.
        let (_, e) = h.fold(1.5, &obs(st));
        assert!(e.is_empty(), "{e:?}");
        // Lost: its vnode moved to worker 1 at epoch 1.
        let mut st = running(50, &[(0, 1, 0), (1, 1, 1)]);
        st.workers.pop();
        st.jobs[0].failures = vec![FailureStatus {
            worker: 2,
            reason: "broken".into(),
            ago_s: 0.1,
            moved: 1,
        }];
        let (_, e) = h.fold(2.0, &obs(st.clone()));
        let kinds: Vec<_> = e.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["failure", "recovery"], "{e:?}");
        assert_eq!(h.samples.back().unwrap().adopted, [1]);
        for i in 0..ADOPTING_SAMPLES {
            let (s, e) = h.fold(2.5 + i as f64, &obs(st.clone()));
            assert!(e.is_empty(), "{e:?}");
            assert_eq!(s.adopted, [1]);
        }
        let (s, _) = h.fold(9.0, &obs(st.clone()));
        assert!(s.adopted.is_empty());
        let (_, e) = h.fold(9.5, &obs(st));
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(
            h.counters,
            Counters {
                tasks: 50,
                failures: 1,
                recoveries: 1,
                suspicions: 1,
                takeovers: 0,
                forgeries: 0,
            }
        );
    }

    #[test]
    fn tasks_over_jobs_only_grow_and_a_jobs_end_is_one_event() {
        let mut h = History::default();
        h.fold(0.0, &obs(running(100, &[(0, 1, 0)])));
        let ended = ClusterStatus {
            role: "active".into(),
            jobs: vec![JobStatus {
                id: 1,
                state: "finished".into(),
                tasks_completed: 120,
                ..JobStatus::default()
            }],
            ..ClusterStatus::default()
        };
        let (s, e) = h.fold(1.0, &obs(ended.clone()));
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].kind, "end");
        assert_eq!(s.tasks, 120);
        let (s, e) = h.fold(2.0, &obs(ended.clone()));
        assert!(e.is_empty());
        assert_eq!(s.tasks, 120);
        // A second job counts on top of the first.
        let mut next = running(5, &[(0, 1, 0)]);
        next.jobs[0].id = 2;
        next.jobs.insert(0, ended.jobs[0].clone());
        let (s, e) = h.fold(3.0, &obs(next.clone()));
        assert_eq!(s.tasks, 125, "{s:?}");
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].kind, "job");
        // Two jobs running at once (two programs on their own workers) count side by side.
        next.jobs.push(JobStatus {
            id: 3,
            program: "nqueens".into(),
            state: "running".into(),
            tasks_completed: 7,
            ..JobStatus::default()
        });
        next.jobs[1].tasks_completed = 9;
        let (s, e) = h.fold(4.0, &obs(next));
        assert_eq!(s.tasks, 120 + 9 + 7, "{s:?}");
        assert!(e[0].text.contains("(nqueens)"), "{e:?}");
    }

    #[test]
    fn the_oracles_forgeries_and_verdict_are_events_once() {
        use crate::protocol::FromOracle;
        let mut h = History::default();
        let mut o = Observation {
            status: running(10, &[(0, 1, 0)]),
            ..Observation::default()
        };
        h.fold(0.0, &o);
        let forged = |task: &str| FromOracle::Forged {
            job: 1,
            vnode: 0,
            epoch: 0,
            task: task.into(),
            reason: "wrong output".into(),
        };
        o.oracle.note(&forged("t:1"));
        o.oracle.note(&forged("t:2"));
        let (_, e) = h.fold(0.5, &o);
        let kinds: Vec<_> = e.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["forged", "forged"], "{e:?}");
        assert!(e[1].text.contains("t:2"), "{e:?}");
        o.oracle.note(&FromOracle::Certified {
            job: 1,
            decision: "ACCEPT".into(),
            certificate: String::new(),
            outputs: Vec::new(),
        });
        let (_, e) = h.fold(1.0, &o);
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].kind, "certified");
        assert!(e[0].text.ends_with("ACCEPT"), "{e:?}");
        let (_, e) = h.fold(1.5, &o);
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(h.counters.forgeries, 2);
    }

    #[test]
    fn a_takeover_is_counted_once_per_term_and_rings_are_bounded() {
        let mut h = History::default();
        let mut st = running(0, &[]);
        st.took_over = true;
        for i in 0..(MAX_SAMPLES + 10) {
            h.fold(i as f64, &obs(st.clone()));
        }
        assert_eq!(h.counters.takeovers, 1);
        assert_eq!(h.samples.len(), MAX_SAMPLES);
        assert_eq!(h.samples.front().unwrap().n, 10);
        st.term = 8;
        let (_, e) = h.fold(1e6, &obs(st));
        assert_eq!(e[0].kind, "takeover");
        assert_eq!(h.counters.takeovers, 2);
    }
}

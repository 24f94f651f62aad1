//! The coordinator's rules, driven event by event on explicit time.

use std::time::Duration;

use veriflow_runtime::detect::Heartbeat;

use super::*;

fn coord() -> Coordinator {
    Coordinator::new(Config::new(
        "knary",
        "central:x:1",
        crate::test_fd(),
        [7; 32],
    ))
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn hello(threads: u32, spare: bool) -> Joining {
    Joining {
        program: "knary".into(),
        peer_addr: "127.0.0.1:9".into(),
        threads,
        spare,
    }
}

fn spec(vnodes: u32, min_workers: u32) -> JobSpec {
    JobSpec {
        argv: vec!["submit".into()],
        vnodes,
        min_workers,
        iterative: false,
    }
}

fn to_worker(actions: &[Action], w: WorkerId) -> Vec<ToWorker> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ToWorker { worker, msg } if *worker == w => Some(msg.clone()),
            _ => None,
        })
        .collect()
}

fn to_client(actions: &[Action]) -> Vec<ToSubmit> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ToClient { msg, .. } => Some(msg.clone()),
            _ => None,
        })
        .collect()
}

/// A coordinator with `n` workers (the last `spares` of them spare) running a job of
/// `vnodes` vnodes, at time 10 ms.
fn running(n: u32, spares: u32, vnodes: u32) -> Coordinator {
    let mut c = coord();
    for w in 1..=n {
        let _ = c.on_event(
            ms(1),
            Event::Joined {
                worker: w,
                hello: hello(1, w > n - spares),
            },
        );
    }
    let a = c.on_event(
        ms(2),
        Event::Submit {
            client: 100,
            program: "knary".into(),
            job: spec(vnodes, n),
        },
    );
    assert!(
        a.iter().any(|a| matches!(a, Action::CheckStore { job: 1 })),
        "the store is checked before the job starts: {a:?}"
    );
    let a = c.on_event(
        ms(3),
        Event::StoreChecked {
            job: 1,
            result: Ok(false),
        },
    );
    assert!(matches!(
        to_client(&a).first(),
        Some(ToSubmit::Accepted { .. })
    ));
    c
}

fn beat_all(c: &mut Coordinator, now: Duration) {
    for w in c.workers() {
        let _ = c.on_event(
            now,
            Event::FromWorker {
                worker: w,
                msg: ToCoord::Heartbeat(Heartbeat { interval: ms(100) }),
            },
        );
    }
}

#[test]
fn a_job_maps_vnodes_round_robin_and_gives_each_member_only_its_own_link_keys() {
    let mut c = coord();
    for w in 1..=3 {
        let _ = c.on_event(
            ms(1),
            Event::Joined {
                worker: w,
                hello: hello(2, w == 3),
            },
        );
    }
    let _ = c.on_event(
        ms(2),
        Event::Submit {
            client: 9,
            program: "knary".into(),
            job: spec(0, 3),
        },
    );
    let a = c.on_event(
        ms(3),
        Event::StoreChecked {
            job: 1,
            result: Ok(false),
        },
    );
    // vnodes 0: the non-spare workers' threads (2 + 2), round-robin on workers 1 and 2.
    assert_eq!(
        c.map().unwrap(),
        vec![(1, 0), (2, 0), (1, 0), (2, 0)],
        "spares host nothing at the start"
    );
    for w in 1..=3u32 {
        let msgs = to_worker(&a, w);
        let Some(ToWorker::Start {
            hosted,
            starts,
            peers,
            ..
        }) = msgs.first()
        else {
            panic!("worker {w} was not started: {a:?}");
        };
        assert_eq!(*starts, w == 1, "the host of vnode 0 starts the run");
        let want: Vec<(u32, u64)> = match w {
            1 => vec![(0, 0), (2, 0)],
            2 => vec![(1, 0), (3, 0)],
            _ => vec![],
        };
        assert_eq!(hosted, &want);
        assert_eq!(peers.len(), 2, "every other worker, never itself");
        for p in peers {
            assert_ne!(p.id, w);
            assert_eq!(p.link_key, link_key(&[7; 32], w, p.id));
        }
    }
    assert_ne!(link_key(&[7; 32], 1, 2), link_key(&[7; 32], 1, 3));
    assert_eq!(link_key(&[7; 32], 1, 2), link_key(&[7; 32], 2, 1));
}

#[test]
fn a_store_that_holds_a_run_is_refused() {
    let mut c = coord();
    let _ = c.on_event(
        ms(1),
        Event::Joined {
            worker: 1,
            hello: hello(1, false),
        },
    );
    let _ = c.on_event(
        ms(2),
        Event::Submit {
            client: 5,
            program: "knary".into(),
            job: spec(2, 1),
        },
    );
    let a = c.on_event(
        ms(3),
        Event::StoreChecked {
            job: 1,
            result: Ok(true),
        },
    );
    match to_client(&a).as_slice() {
        [ToSubmit::Failed { error }] => assert!(error.contains("already holds a run"), "{error}"),
        other => panic!("{other:?}"),
    }
    assert!(c.map().is_none());
}

/// Answers every probe of a running job on workers 1 and 2 (hosting vnodes 0 and 1) with idle,
/// unchanged words until the coordinator stops the job; returns when it did, or None if it did
/// not within `rounds` rounds.
fn idle_until_stopped(c: &mut Coordinator, mut now: Duration, rounds: u32) -> Option<Duration> {
    for _ in 0..rounds {
        let a = c.on_event(now, Event::Tick);
        let probes: Vec<_> = [1, 2]
            .iter()
            .flat_map(|&w| to_worker(&a, w))
            .filter_map(|m| match m {
                ToWorker::Probe { job, round } => Some((job, round)),
                _ => None,
            })
            .collect();
        assert_eq!(probes.len(), 2, "one probe per member: {a:?}");
        let (job, round) = probes[0];
        for w in [1u32, 2] {
            let a = c.on_event(
                now,
                Event::FromWorker {
                    worker: w,
                    msg: ToCoord::Status {
                        job,
                        round,
                        work: vec![(w - 1, 5 << 32)],
                        completed: 10,
                        started: true,
                    },
                },
            );
            if to_worker(&a, 1)
                .iter()
                .any(|m| matches!(m, ToWorker::Stop { .. }))
            {
                return Some(now);
            }
        }
        now += ms(10);
    }
    None
}

#[test]
fn two_idle_unchanged_rounds_stop_the_job_and_the_summary_waits_for_the_manifest() {
    let mut c = running(2, 0, 2);
    let now = idle_until_stopped(&mut c, ms(10), 4).expect("two identical idle rounds end the run");
    let report = |outputs| WorkerReport {
        outputs,
        tasks: 10,
        ..WorkerReport::default()
    };
    let a = c.on_event(
        now,
        Event::FromWorker {
            worker: 1,
            msg: ToCoord::Done {
                job: 1,
                report: report(Some(vec![vec![1]])),
            },
        },
    );
    assert!(!a.iter().any(|a| matches!(a, Action::RecordFinished { .. })));
    let a = c.on_event(
        now,
        Event::FromWorker {
            worker: 2,
            msg: ToCoord::Done {
                job: 1,
                report: report(None),
            },
        },
    );
    assert!(a
        .iter()
        .any(|a| matches!(a, Action::RecordFinished { job: 1 })));
    assert!(
        to_client(&a).is_empty(),
        "the client hears once it is recorded"
    );
    let a = c.on_event(
        now,
        Event::Recorded {
            job: 1,
            result: Ok("t:root".into()),
        },
    );
    match to_client(&a).as_slice() {
        [ToSubmit::Finished {
            outputs,
            tasks,
            root,
            ..
        }] => {
            assert_eq!(outputs, &vec![vec![1u8]]);
            assert_eq!(*tasks, 20);
            assert_eq!(root, "t:root");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_busy_or_changing_word_does_not_end_the_run() {
    let mut c = running(1, 0, 1);
    let mut now = ms(10);
    for i in 0..6u64 {
        let a = c.on_event(now, Event::Tick);
        let Some(ToWorker::Probe { job, round }) = to_worker(&a, 1)
            .into_iter()
            .find(|m| matches!(m, ToWorker::Probe { .. }))
        else {
            panic!("no probe: {a:?}");
        };
        // Idle every round, but the change count moves: work came and went in between.
        let a = c.on_event(
            now,
            Event::FromWorker {
                worker: 1,
                msg: ToCoord::Status {
                    job,
                    round,
                    work: vec![(0, i << 32)],
                    completed: i,
                    started: true,
                },
            },
        );
        assert!(
            !to_worker(&a, 1)
                .iter()
                .any(|m| matches!(m, ToWorker::Stop { .. })),
            "round {i}"
        );
        now += ms(10);
    }
}

/// Issue 13: `Submit` with vnodes = 4294967295 made the coordinator allocate 17 GB and abort.
#[test]
fn a_job_asking_for_4294967295_vnodes_is_refused_without_allocating() {
    let mut c = coord();
    let _ = c.on_event(
        ms(1),
        Event::Joined {
            worker: 1,
            hello: hello(1, false),
        },
    );
    for job in [
        spec(u32::MAX, 1),
        spec(2, u32::MAX),
        JobSpec {
            argv: vec!["x".repeat(1 << 20)],
            ..spec(2, 1)
        },
        JobSpec {
            argv: vec![String::new(); 100_000],
            ..spec(2, 1)
        },
    ] {
        let a = c.on_event(
            ms(2),
            Event::Submit {
                client: 3,
                program: "knary".into(),
                job,
            },
        );
        match to_client(&a).as_slice() {
            [ToSubmit::Failed { error }] => assert!(error.contains("at most"), "{error}"),
            other => panic!("{other:?}"),
        }
        assert!(!a.iter().any(|a| matches!(a, Action::CheckStore { .. })));
    }
}

/// Issue 13: workers' claimed thread counts were unchecked (and summed into the vnode count).
#[test]
fn a_worker_claiming_no_threads_or_a_million_or_another_program_is_refused() {
    let mut c = coord();
    for (i, h) in [
        hello(0, false),
        hello(1_000_000, false),
        Joining {
            program: "nqueens".into(),
            ..hello(1, false)
        },
        Joining {
            peer_addr: "a".repeat(10_000),
            ..hello(1, false)
        },
    ]
    .into_iter()
    .enumerate()
    {
        let w = u32::try_from(i).unwrap() + 1;
        let a = c.on_event(
            ms(1),
            Event::Joined {
                worker: w,
                hello: h,
            },
        );
        assert!(
            matches!(to_worker(&a, w).as_slice(), [ToWorker::Refused { .. }]),
            "{a:?}"
        );
        assert!(a
            .iter()
            .any(|a| matches!(a, Action::Disconnect { worker } if *worker == w)));
    }
    assert!(c.workers().is_empty());
}

/// Issue 13: any key holder could claim that worker N is broken and get it evicted on one
/// report; healthy workers 2 and 3 were evicted this way.
#[test]
fn one_report_against_a_worker_the_coordinator_hears_from_evicts_nobody() {
    let mut c = running(4, 0, 4);
    beat_all(&mut c, ms(20));
    let a = c.on_event(
        ms(21),
        Event::FromWorker {
            worker: 1,
            msg: ToCoord::Broken { worker: 2 },
        },
    );
    assert!(c.workers().contains(&2), "{a:?}");
    assert!(a
        .iter()
        .any(|a| matches!(a, Action::Note(n) if n.contains("suspects"))));
    // The same reporter again counts once.
    let _ = c.on_event(
        ms(22),
        Event::FromWorker {
            worker: 1,
            msg: ToCoord::Broken { worker: 2 },
        },
    );
    assert!(c.workers().contains(&2));
    // A report about itself or a stranger is refused.
    for (from, about) in [(3, 3), (3, 77)] {
        let a = c.on_event(
            ms(23),
            Event::FromWorker {
                worker: from,
                msg: ToCoord::Broken { worker: about },
            },
        );
        assert!(a
            .iter()
            .any(|a| matches!(a, Action::Note(n) if n.contains("refused"))));
    }
    assert_eq!(c.workers(), vec![1, 2, 3, 4]);
    // k = 2 distinct reporters: acted on.
    let a = c.on_event(
        ms(24),
        Event::FromWorker {
            worker: 3,
            msg: ToCoord::Broken { worker: 2 },
        },
    );
    assert!(!c.workers().contains(&2), "{a:?}");
}

#[test]
fn a_report_against_a_worker_silent_here_too_is_acted_on_at_once() {
    let mut c = running(3, 0, 3);
    // Workers 1 and 3 keep beating; worker 2 falls silent until the coordinator's own
    // detector finds it unreachable (not yet broken).
    let mut now = ms(10);
    let mut unreachable = false;
    while now < ms(2000) && !unreachable {
        for w in [1, 3] {
            let _ = c.on_event(
                now,
                Event::FromWorker {
                    worker: w,
                    msg: ToCoord::Heartbeat(Heartbeat { interval: ms(100) }),
                },
            );
        }
        let _ = c.on_event(now, Event::Tick);
        unreachable = c.detector.status(2) == Some(Status::Unreachable);
        now += ms(10);
    }
    assert!(
        unreachable,
        "worker 2 silent long enough is unreachable here"
    );
    assert!(
        c.workers().contains(&2),
        "unreachable alone is not lost yet"
    );
    let a = c.on_event(
        now,
        Event::FromWorker {
            worker: 1,
            msg: ToCoord::Broken { worker: 2 },
        },
    );
    assert!(!c.workers().contains(&2), "{a:?}");
}

#[test]
fn a_lost_workers_vnodes_move_to_an_idle_spare_at_a_new_epoch_and_it_is_never_readmitted() {
    let mut c = running(3, 1, 4);
    assert_eq!(c.map().unwrap(), vec![(1, 0), (2, 0), (1, 0), (2, 0)]);
    let a = c.on_event(
        ms(20),
        Event::Closed {
            worker: 2,
            reason: "reset".into(),
        },
    );
    assert_eq!(c.map().unwrap(), vec![(1, 0), (3, 1), (1, 0), (3, 1)]);
    let hosts: Vec<_> = to_worker(&a, 3)
        .into_iter()
        .filter_map(|m| match m {
            ToWorker::Host { vnode, epoch, .. } => Some((vnode, epoch)),
            _ => None,
        })
        .collect();
    assert_eq!(hosts, vec![(1, 1), (3, 1)]);
    for w in [1, 3] {
        assert!(
            to_worker(&a, w)
                .iter()
                .any(|m| matches!(m, ToWorker::Map { map, .. } if map.len() == 2)),
            "every member learns the new map"
        );
    }
    assert!(matches!(
        to_client(&a).as_slice(),
        [ToSubmit::WorkerLost { worker: 2, .. }]
    ));
    // Its late messages are ignored, and it cannot come back under its id.
    let a = c.on_event(
        ms(21),
        Event::FromWorker {
            worker: 2,
            msg: ToCoord::Failed {
                job: 1,
                error: "zombie".into(),
            },
        },
    );
    assert!(a.iter().all(|a| !matches!(a, Action::ToWorker { .. })));
    let a = c.on_event(
        ms(22),
        Event::Joined {
            worker: 2,
            hello: hello(1, false),
        },
    );
    assert!(a
        .iter()
        .any(|a| matches!(a, Action::Disconnect { worker: 2 })));
    assert!(!c.workers().contains(&2));
}

#[test]
fn a_silent_worker_is_lost_by_the_coordinators_own_detector() {
    let mut c = running(2, 0, 2);
    let mut now = ms(10);
    while now < ms(3000) && c.workers().contains(&2) {
        let _ = c.on_event(
            now,
            Event::FromWorker {
                worker: 1,
                msg: ToCoord::Heartbeat(Heartbeat { interval: ms(100) }),
            },
        );
        let _ = c.on_event(now, Event::Tick);
        now += ms(10);
    }
    assert_eq!(c.workers(), vec![1]);
    assert_eq!(c.map().unwrap(), vec![(1, 0), (1, 1)]);
}

/// Found by the simulator (then seed 538): the member hosting vnode 0 was lost after the run
/// ended and before it reported, and the job failed with "no member returned the terminal
/// outputs". They are durable in the logs: the coordinator reads them from there.
#[test]
fn when_vnode_0s_host_is_lost_as_the_job_ends_the_outputs_come_from_the_logs() {
    let mut c = running(2, 0, 2);
    let now = idle_until_stopped(&mut c, ms(10), 4).expect("the run ends");
    // Worker 2 reports; worker 1 (vnode 0's host) dies before it does.
    let _ = c.on_event(
        now,
        Event::FromWorker {
            worker: 2,
            msg: ToCoord::Done {
                job: 1,
                report: WorkerReport::default(),
            },
        },
    );
    let a = c.on_event(
        now,
        Event::Closed {
            worker: 1,
            reason: "reset".into(),
        },
    );
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::ReadOutputs { job: 1 })),
        "{a:?}"
    );
    let a = c.on_event(
        now,
        Event::OutputsRead {
            job: 1,
            result: Ok(Some(vec![vec![42]])),
        },
    );
    assert!(a
        .iter()
        .any(|a| matches!(a, Action::RecordFinished { job: 1 })));
    let a = c.on_event(
        now,
        Event::Recorded {
            job: 1,
            result: Ok("t:root".into()),
        },
    );
    match to_client(&a).as_slice() {
        [ToSubmit::Finished {
            outputs,
            workers_lost,
            ..
        }] => {
            assert_eq!(outputs, &vec![vec![42u8]]);
            assert_eq!(*workers_lost, 1);
        }
        other => panic!("{other:?}"),
    }
}

//! Automatic allocation's decisions and the Slurm driver's text, without Slurm.

use std::path::PathBuf;
use std::time::Duration;

use super::slurm::{parse_squeue, parse_submitted, slurm_time, Per, SlurmSpec};
use super::*;
use crate::protocol::{ClusterStatus, JobStatus};

fn alloc(id: u32, role: Role, state: AllocState) -> Allocation {
    Allocation {
        id: id.to_string(),
        role,
        state,
        raw_state: String::new(),
        coordinator: "127.0.0.1:7000".into(),
        time: String::new(),
        time_limit: String::new(),
        nodes: String::new(),
    }
}

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

const POOL: Pool = Pool {
    workers: 3,
    spares: 1,
};

fn full() -> Vec<Allocation> {
    vec![
        alloc(1, Role::Worker, AllocState::Running),
        alloc(2, Role::Worker, AllocState::Running),
        alloc(3, Role::Worker, AllocState::Queued),
        alloc(4, Role::Spare, AllocState::Running),
    ]
}

/// An [`AutoAlloc`] whose first round (rule 4) is done: the pool was complete once.
fn settled() -> AutoAlloc {
    let mut a = AutoAlloc::new(POOL);
    assert_eq!(a.tick(s(0), &full(), Demand::Idle), Step::Wait);
    a
}

#[test]
fn the_first_round_submits_the_whole_pool_whatever_the_coordinator_says() {
    for demand in [Demand::Idle, Demand::Needed, Demand::Unknown] {
        let mut a = AutoAlloc::new(POOL);
        assert_eq!(a.tick(s(0), &[], demand), Step::Submit(POOL), "{demand:?}");
    }
}

#[test]
fn the_first_round_counts_allocations_already_there() {
    let mut a = AutoAlloc::new(POOL);
    let some = &full()[..2];
    assert_eq!(
        a.tick(s(0), some, Demand::Idle),
        Step::Submit(Pool {
            workers: 1,
            spares: 1
        })
    );
}

#[test]
fn a_first_round_that_failed_is_retried_even_with_no_demand() {
    let mut a = AutoAlloc::new(POOL);
    assert_eq!(a.tick(s(0), &[], Demand::Idle), Step::Submit(POOL));
    a.submitted(s(0), Err("sbatch: busy".into()));
    assert_eq!(a.tick(s(0), &[], Demand::Idle), Step::Wait, "backing off");
    assert_eq!(a.tick(s(1), &[], Demand::Idle), Step::Submit(POOL));
}

#[test]
fn an_ended_allocation_is_resubmitted_while_a_job_needs_workers() {
    let mut a = settled();
    let mut now = full();
    now[1].state = AllocState::Ended; // scancel, time limit or node failure
    assert_eq!(
        a.tick(s(5), &now, Demand::Needed),
        Step::Submit(Pool {
            workers: 1,
            spares: 0
        })
    );
    a.submitted(s(5), Ok("5".into()));
    // Gone from squeue entirely: the same.
    now.remove(1);
    now.remove(2);
    assert_eq!(
        a.tick(s(6), &now, Demand::Needed),
        Step::Submit(Pool {
            workers: 1,
            spares: 1
        })
    );
}

#[test]
fn nothing_is_resubmitted_while_the_coordinator_is_idle() {
    let mut a = settled();
    assert_eq!(a.tick(s(30), &[], Demand::Idle), Step::Wait);
    // A submission arrives: the pool is refilled.
    assert_eq!(a.tick(s(31), &[], Demand::Needed), Step::Submit(POOL));
}

#[test]
fn queued_running_and_ending_allocations_count_ended_ones_do_not() {
    let mut allocs = full();
    assert_eq!(missing(POOL, &allocs), Pool::default());
    allocs.push(alloc(9, Role::Worker, AllocState::Queued)); // more than asked: no cancel
    assert_eq!(missing(POOL, &allocs), Pool::default());
    allocs[0].state = AllocState::Ending; // Slurm still holds its node
    assert_eq!(missing(POOL, &allocs), Pool::default());
    for a in &mut allocs {
        a.state = AllocState::Ended;
    }
    assert_eq!(missing(POOL, &allocs), POOL);
}

#[test]
fn failed_submissions_back_off_doubling_then_stop() {
    let mut a = settled();
    let mut t = s(30); // the settled pool ended long-lived (rule 7)
    let mut waits = Vec::new();
    for i in 0..MAX_FAILURES {
        assert!(
            matches!(a.tick(t, &[], Demand::Needed), Step::Submit(_)),
            "try {i}"
        );
        a.submitted(t, Err(format!("refusal {i}")));
        // Waits until the retry time, then submits again.
        let mut wait = s(0);
        while a.tick(t + wait, &[], Demand::Needed) == Step::Wait {
            wait += Duration::from_millis(250);
            assert!(wait <= RETRY_MAX + s(1), "no retry after {wait:?}");
            if i + 1 == MAX_FAILURES {
                break;
            }
        }
        waits.push(wait);
        t += wait;
    }
    assert_eq!(waits[..4], [s(1), s(2), s(4), s(8)]);
    match a.tick(t + RETRY_MAX, &[], Demand::Needed) {
        Step::Stop(why) => assert!(why.contains("refusal 4"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_success_resets_the_back_off() {
    let mut a = settled();
    a.submitted(s(30), Err("no".into()));
    a.submitted(s(30), Err("no".into()));
    a.submitted(s(34), Ok("6".into()));
    assert_eq!(a.tick(s(34), &[], Demand::Needed), Step::Submit(POOL));
}

#[test]
fn a_silent_coordinator_gets_nothing_and_is_given_up_after_the_patience() {
    let mut a = settled();
    // Even with the whole pool gone: nothing is submitted for a coordinator that is not there.
    assert_eq!(a.tick(s(30), &[], Demand::Unknown), Step::Wait);
    assert_eq!(
        a.tick(s(30) + COORDINATOR_PATIENCE - s(1), &[], Demand::Unknown),
        Step::Wait
    );
    // It answers: the clock starts over.
    assert_eq!(a.tick(s(89), &full(), Demand::Idle), Step::Wait);
    assert_eq!(a.tick(s(90), &full(), Demand::Unknown), Step::Wait);
    assert_eq!(a.tick(s(149), &full(), Demand::Unknown), Step::Wait);
    assert!(matches!(
        a.tick(s(150), &full(), Demand::Unknown),
        Step::Stop(_)
    ));
}

#[test]
fn demand_comes_from_the_job_and_the_waiting_submissions() {
    let mut st = ClusterStatus {
        role: "active".into(),
        ..ClusterStatus::default()
    };
    assert_eq!(Demand::of(&st), Demand::Idle);
    st.waiting = 1;
    assert_eq!(Demand::of(&st), Demand::Needed);
    st.waiting = 0;
    st.jobs = vec![JobStatus {
        state: "finished".into(),
        ..JobStatus::default()
    }];
    assert_eq!(
        Demand::of(&st),
        Demand::Idle,
        "an ended job asks for nothing"
    );
    st.jobs[0].state = "running".into();
    assert_eq!(Demand::of(&st), Demand::Needed);
    st.role = "standby".into();
    assert_eq!(Demand::of(&st), Demand::Unknown);
}

#[test]
fn time_limits_parse_in_units_or_minutes() {
    assert_eq!(parse_time_limit("90s"), Ok(s(90)));
    assert_eq!(parse_time_limit("30m"), Ok(s(1800)));
    assert_eq!(parse_time_limit("1h"), Ok(s(3600)));
    assert_eq!(parse_time_limit("1h30m"), Ok(s(5400)));
    assert_eq!(parse_time_limit("2d"), Ok(s(172_800)));
    assert_eq!(parse_time_limit("45"), Ok(s(2700)));
    for bad in [
        "",
        "0",
        "0h",
        "1x",
        "h",
        "1h30",
        "-5m",
        "99999999999999999999d",
    ] {
        assert!(parse_time_limit(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn slurm_times_round_up_to_minutes() {
    assert_eq!(slurm_time(s(1)), "00:01:00");
    assert_eq!(slurm_time(s(90)), "00:02:00");
    assert_eq!(slurm_time(s(3600)), "01:00:00");
    assert_eq!(slurm_time(s(26 * 3600 + 60)), "1-02:01:00");
}

fn spec(per: Per, threads: Option<u32>) -> SlurmSpec {
    SlurmSpec {
        program: "knary".into(),
        exe: PathBuf::from("/opt/vf/bin/knary"),
        coordinators: vec!["10.0.0.1:7000".into(), "10.0.0.2:7000".into()],
        key: PathBuf::from("/home/it's/cluster.key"),
        threads,
        per,
        time_limit: Some(s(3600)),
        worker_host: None,
        log_dir: PathBuf::from("/scratch/logs"),
        extra: vec![],
    }
}

#[test]
fn a_task_script_runs_one_worker_of_its_cpus() {
    let sc = spec(Per::Task, Some(4)).script(Role::Worker);
    for want in [
        "#!/bin/sh\n",
        "#SBATCH --job-name=veriflow-knary\n",
        "#SBATCH --comment=veriflow:worker:10.0.0.1:7000,10.0.0.2:7000\n",
        "#SBATCH --ntasks=1\n",
        "#SBATCH --cpus-per-task=4\n",
        "#SBATCH --time=01:00:00\n",
        "#SBATCH --output=/scratch/logs/veriflow-knary-%j.log\n",
        "exec '/opt/vf/bin/knary' worker --join '10.0.0.1:7000,10.0.0.2:7000' \
         --key '/home/it'\\''s/cluster.key' --threads 4 --listen \"$(hostname)\":0\n",
    ] {
        assert!(sc.contains(want), "{want:?} not in\n{sc}");
    }
    assert!(
        !sc.contains("--spare") && !sc.contains("--exclusive"),
        "{sc}"
    );
}

#[test]
fn a_node_script_takes_the_node_and_a_spare_says_so() {
    let mut sp = spec(Per::Node, None);
    sp.worker_host = Some("127.0.0.1".into());
    let sc = sp.script(Role::Spare);
    assert!(sc.contains("#SBATCH --exclusive\n"), "{sc}");
    assert!(sc.contains("#SBATCH --comment=veriflow:spare:"), "{sc}");
    assert!(
        sc.contains("--threads \"${SLURM_CPUS_ON_NODE:-1}\" --listen '127.0.0.1':0 --spare\n"),
        "{sc}"
    );
    assert!(!sc.contains("cpus-per-task"), "{sc}");
}

#[test]
fn squeue_lines_become_the_pools_allocations() {
    let text = "\
12|RUNNING|veriflow:worker:127.0.0.1:7000|0:41|1:00:00|vm
13|PENDING|veriflow:spare:127.0.0.1:7000|0:00|1:00:00|(Resources)
14|COMPLETING|veriflow:worker:127.0.0.1:7000|1:02|1:00:00|vm
15|RUNNING|someone else's job|0:10|UNLIMITED|vm
16|RUNNING|veriflow:driver:x|0:10|UNLIMITED|vm
17|FAILED|veriflow:worker:127.0.0.1:7000|0:01|1:00:00|vm
18|CANCELLED|veriflow:worker:127.0.0.1:7000|0:05|1:00:00|vm
";
    let a = parse_squeue(text).unwrap();
    assert_eq!(a.len(), 5, "{a:?}");
    assert_eq!(
        (a[0].id.as_str(), a[0].role, a[0].state),
        ("12", Role::Worker, AllocState::Running)
    );
    assert_eq!(a[0].coordinator, "127.0.0.1:7000");
    assert_eq!(a[0].nodes, "vm");
    assert_eq!((a[1].role, a[1].state), (Role::Spare, AllocState::Queued));
    assert_eq!(a[1].nodes, "(Resources)");
    assert_eq!(a[2].state, AllocState::Ending);
    assert_eq!(a[3].state, AllocState::Failed);
    assert_eq!(a[4].state, AllocState::Ended);
    assert!(a[..3].iter().all(Allocation::counts) && !a[3..].iter().any(Allocation::counts));
    assert!(parse_squeue("12|RUNNING").is_err());
    assert_eq!(parse_squeue("").unwrap(), vec![]);
}

#[test]
fn sbatch_job_ids_are_read_or_refused() {
    assert_eq!(parse_submitted("42\n").unwrap(), "42");
    assert_eq!(parse_submitted("42;cluster\n").unwrap(), "42");
    assert!(parse_submitted("Submitted batch job 42\n").is_err());
    assert!(parse_submitted("").is_err());
}

/// One round of `a` at `t` seconds with `allocs`, a job needing workers.
fn round(a: &mut AutoAlloc, t: u64, allocs: &[Allocation]) -> Step {
    a.tick(s(t), allocs, Demand::Needed)
}

const ONE: Pool = Pool {
    workers: 1,
    spares: 0,
};

#[test]
fn allocations_whose_workers_fail_at_once_stop_the_watcher() {
    let mut a = AutoAlloc::new(ONE);
    for (t, i) in (1..=MAX_SHORT_LIVED).enumerate() {
        let t = t as u64;
        assert_eq!(round(&mut a, t, &[]), Step::Submit(ONE), "round {i}");
        a.submitted(s(t), Ok(i.to_string()));
        // It ran and failed between two rounds: first seen failed.
        assert_eq!(
            round(&mut a, t + 1, &[alloc(i, Role::Worker, AllocState::Failed)]),
            if i < MAX_SHORT_LIVED {
                Step::Submit(ONE)
            } else {
                Step::Stop(format!(
                    "3 allocations in a row failed less than {MIN_LIFE:?} after they were \
                     submitted: their workers fail at once"
                ))
            },
            "round {i}"
        );
    }
}

#[test]
fn scancels_lost_nodes_and_long_lives_are_no_crash_loop() {
    let mut a = AutoAlloc::new(ONE);
    let ended = |i, state| [alloc(i, Role::Worker, state)];
    let short_failure = |a: &mut AutoAlloc, i: u32, t: u64| {
        assert_eq!(round(a, t, &[]), Step::Submit(ONE));
        a.submitted(s(t), Ok(i.to_string()));
        assert_eq!(
            round(a, t + 1, &ended(i, AllocState::Failed)),
            Step::Submit(ONE)
        );
    };
    // Two short failures...
    short_failure(&mut a, 1, 0);
    short_failure(&mut a, 2, 2);
    // ...then one that ran and was scancelled within a second: the count starts over.
    a.submitted(s(4), Ok("3".into()));
    assert_eq!(round(&mut a, 5, &ended(3, AllocState::Running)), Step::Wait);
    assert_eq!(
        round(&mut a, 6, &ended(3, AllocState::Ended)),
        Step::Submit(ONE)
    );
    short_failure(&mut a, 4, 7);
    short_failure(&mut a, 5, 9);
    // One cancelled while queued changes nothing; one that failed after MIN_LIFE resets.
    a.submitted(s(11), Ok("6".into()));
    assert_eq!(round(&mut a, 12, &ended(6, AllocState::Queued)), Step::Wait);
    assert_eq!(round(&mut a, 13, &[]), Step::Submit(ONE));
    a.submitted(s(13), Ok("7".into()));
    let later = 13 + MIN_LIFE.as_secs();
    assert_eq!(
        round(&mut a, later, &ended(7, AllocState::Failed)),
        Step::Submit(ONE)
    );
    short_failure(&mut a, 8, later + 1);
    short_failure(&mut a, 9, later + 3);
}

#[test]
fn an_earlier_watchers_failed_allocations_are_not_counted() {
    let mut a = AutoAlloc::new(ONE);
    let old: Vec<Allocation> = (1..=5)
        .map(|i| alloc(i, Role::Worker, AllocState::Failed))
        .collect();
    assert_eq!(round(&mut a, 0, &old), Step::Submit(ONE));
    a.submitted(s(0), Ok("6".into()));
    let mut now = old.clone();
    now.push(alloc(6, Role::Worker, AllocState::Running));
    assert_eq!(round(&mut a, 1, &now), Step::Wait);
}

/// Slurm lists a failing job as `COMPLETING` for a moment before `FAILED`: a watcher that
/// sees it then waits for its end instead of taking it for an ordinary end and submitting a
/// replacement (which the knary Slurm test caught as a fourth allocation).
#[test]
fn an_allocation_seen_completing_is_judged_by_the_state_it_ends_in() {
    let mut a = AutoAlloc::new(ONE);
    for i in 1..=MAX_SHORT_LIVED {
        let t = u64::from(i) * 3;
        assert_eq!(round(&mut a, t, &[]), Step::Submit(ONE), "round {i}");
        a.submitted(s(t), Ok(i.to_string()));
        // Still holding its node, and how it ends is not known: nothing is submitted.
        let completing = [alloc(i, Role::Worker, AllocState::Ending)];
        assert_eq!(round(&mut a, t + 1, &completing), Step::Wait, "round {i}");
        let step = round(&mut a, t + 2, &[alloc(i, Role::Worker, AllocState::Failed)]);
        if i < MAX_SHORT_LIVED {
            assert_eq!(step, Step::Submit(ONE), "round {i}");
        } else {
            assert!(matches!(step, Step::Stop(_)), "round {i}: {step:?}");
        }
    }
    // An earlier watcher's allocation first seen ending is not counted when it fails.
    let mut b = AutoAlloc::new(ONE);
    let old = alloc(9, Role::Worker, AllocState::Ending);
    assert_eq!(round(&mut b, 0, &[old]), Step::Wait);
    for t in 1..=MAX_SHORT_LIVED {
        let failed = alloc(9 + t, Role::Worker, AllocState::Failed);
        assert!(!matches!(
            round(&mut b, u64::from(t), &[failed]),
            Step::Stop(_)
        ));
    }
}

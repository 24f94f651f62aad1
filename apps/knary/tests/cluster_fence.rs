//! Store-level epoch fences with real processes (issue 15 points 2 and 4): a worker SIGSTOPped
//! past the failure detector's bound while it runs a knary job loses its vnodes to the others;
//! SIGCONTed, it is a zombie whose log writes the checkpoint servers refuse
//! (`checkpoint-server/src/strategy.rs` rules 10-11). The job's result is right, the final log
//! holds each task declared and completed once, `inspect` and `certify` agree, and the servers
//! still refuse a write at the zombie's epoch afterwards.

use std::path::Path;
use std::time::{Duration, Instant};

use veriflow::runtime::log::segment::vnode_prefix;
use veriflow::VnodeId;
use veriflow_checkpoint::{open_store, Key, StoreError, StoreSpec};
use veriflow_testkit::{run_bin, wait_json_within, Cluster, ClusterOpts};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_knary"))
}

const PROGRAM: [&str; 6] = ["--depth", "7", "--fanout", "4", "--grain-us", "400"];

/// Bound of every wait on the job: far above its few seconds on a loaded machine.
const JOB_LIMIT: Duration = Duration::from_secs(180);
/// Bound of the wait for the zombie to show its refusal after the job.
const ZOMBIE_LIMIT: Duration = Duration::from_secs(30);

/// What the zombie did once continued: its job failed on a refused write, or it left.
fn zombie_outcome(c: &mut Cluster, who: usize) -> String {
    let log = c.dir.path().join(format!("w{who}.log"));
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("declared dead") {
            return text;
        }
        if let Ok(Some(status)) = c.workers[who].0.try_wait() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                text.contains("declared dead") || text.contains("coordinator"),
                "the zombie exited ({status}) without saying why:\n{text}"
            );
            return text;
        }
        assert!(
            t0.elapsed() < ZOMBIE_LIMIT,
            "the zombie neither had a write refused nor left within {ZOMBIE_LIMIT:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigstop_past_the_bound_on(strategy: &str) {
    let mut c = Cluster::start_with(
        bin(),
        ClusterOpts {
            workers: 3,
            coordinator_args: veriflow_testkit::LOADED_FD
                .iter()
                .map(|a| a.to_string())
                .collect(),
            strategy: Some(strategy.to_string()),
            ..ClusterOpts::default()
        },
    );
    std::thread::sleep(Duration::from_millis(300)); // paces the stop only; submit waits itself
    let run = c.submit(&PROGRAM);
    std::thread::sleep(Duration::from_millis(400));
    c.workers[1].signal("-STOP");
    // Far over the bound: declared failed, its vnodes move (a takeover raises their fences).
    std::thread::sleep(Duration::from_millis(4000));
    c.workers[1].signal("-CONT");
    let (code, v, err) = wait_json_within(run, JOB_LIMIT, strategy);
    assert_eq!(code, 0, "{strategy}: {err}");
    assert_eq!(v["correct"], true, "{strategy}: {v}");
    assert_eq!(v["result"], knary::expected_nodes(7, 4).unwrap(), "{v}");
    assert_eq!(v["tasks"], knary::expected_tasks(7, 4).unwrap(), "{v}");
    assert_eq!(v["failures"], 1, "{strategy}: {v}");

    let zombie = zombie_outcome(&mut c, 1);
    eprintln!(
        "{strategy}: the zombie {}",
        if zombie.contains("declared dead") {
            "had its log write refused by the servers"
        } else {
            "left when the coordinator dropped it"
        }
    );

    // The final log: each task declared and completed once; inspect and certify agree.
    let key = veriflow_testkit::s(&c.key).to_string();
    let tmp = c.dir.path().to_path_buf();
    let inspect = run_bin(
        bin(),
        &tmp,
        &[
            "inspect", "--store", &c.store, "--key", &key, "--run", "job-1", "--json",
        ],
    );
    inspect.expect_code(0);
    let i = inspect.json();
    let want = knary::expected_tasks(7, 4).unwrap();
    assert_eq!(i["tasks"]["declared"], want, "{strategy}: {i}");
    assert_eq!(i["tasks"]["completed"], want, "{strategy}: {i}");
    assert_eq!(i["tasks"]["started"], want, "{strategy}: {i}");
    let certify = run_bin(
        bin(),
        &tmp,
        &[
            "certify", "--store", &c.store, "--key", &key, "--run", "job-1", "--json",
        ],
    );
    certify.expect_code(0);
    let cert = certify.json();
    assert_eq!(cert["decision"], "ACCEPT", "{strategy}: {cert}");
    assert_eq!(cert["n"], want, "{strategy}: {cert}");

    // The servers still refuse a write at the zombie's epoch for the vnodes that moved.
    let vnodes = i["vnodes_configured"].as_u64().expect("vnodes") as u32;
    let spec: StoreSpec = c.store.parse().unwrap();
    let store = open_store(&spec, Some(&Key::load(&c.key).unwrap())).unwrap();
    let store = veriflow::cluster::job_store(&store, 1, false).unwrap();
    let mut fenced = Vec::new();
    for v in 0..vnodes {
        let probe = (format!("probe/{v}").into_bytes(), b"late".to_vec());
        match store.put_batch_fenced(&[(vnode_prefix(VnodeId(v)), 0)], &[probe]) {
            Err(StoreError::Fenced { newest, .. }) => {
                assert!(newest >= 1, "{newest}");
                fenced.push(v);
            }
            Ok(()) => {}
            Err(e) => panic!("{strategy}: probing v{v}: {e}"),
        }
    }
    assert!(
        !fenced.is_empty(),
        "{strategy}: no vnode's log is fenced after a takeover (the servers keep no fences?)"
    );
}

#[test]
fn a_worker_sigstopped_past_the_bound_is_fenced_at_a_central_server() {
    sigstop_past_the_bound_on("central");
}

#[test]
fn a_worker_sigstopped_past_the_bound_is_fenced_at_ida_servers() {
    sigstop_past_the_bound_on("ida:2,1,quorum");
}

//! `paper sim` at tiny sizes: the reports' structure, and properties of what they measure.

use serde_json::Value;
use veriflow::cluster::sim::{self as cluster_sim, SimConfig};
use veriflow_bench::sim::{self, nodes, ParamSet, SimArgs};

fn read_json(dir: &std::path::Path, stem: &str) -> Value {
    let text = std::fs::read_to_string(dir.join(format!("{stem}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn seeds_report_every_seed_in_order_with_its_faults_and_trace() {
    let dir = tempfile::tempdir().unwrap();
    let args = SimArgs {
        seeds: Some(20),
        first: Some(5),
        threads: Some(2),
        out: Some(dir.path().to_path_buf()),
        ..SimArgs::default()
    };
    let result = sim::run(&args);

    let j = read_json(dir.path(), "sim");
    assert_eq!(j["seeds"]["first"], 5);
    assert_eq!(j["seeds"]["count"], 20);
    let rows = j["per_seed"].as_array().unwrap();
    let seeds: Vec<u64> = rows.iter().map(|r| r[0].as_u64().unwrap()).collect();
    assert_eq!(seeds, (5..25).collect::<Vec<_>>(), "rows in seed order");
    let passed = rows.iter().filter(|r| r[1] == true).count();
    assert_eq!(j["passed"], passed);
    assert_eq!(
        j["failures"].as_array().unwrap().len() + passed,
        20,
        "every seed passed or is listed as failed"
    );
    for fail in j["failures"].as_array().unwrap() {
        let replay = fail["replay"].as_str().unwrap();
        assert!(replay.starts_with("VERIFLOW_SIM_SEED="), "{replay}");
    }
    // The per-kind totals add up to the per-seed rows.
    let row_faults: f64 = rows.iter().filter_map(|r| r[3].as_f64()).sum();
    assert_eq!(f(&j["faults_per_kind"]["total"]["total"]), row_faults);
    // FaultCounts::total: every kind but the sub-counts resets, restarts, zombies,
    // server_writes_lost, coord_zombies and takeovers.
    let kinds = [
        "crashes",
        "pauses",
        "partitions",
        "clogs",
        "lost",
        "duplicated",
        "writes_lost",
        "server_crashes",
        "coord_crashes",
        "coord_pauses",
    ];
    let by_kind: f64 = kinds
        .iter()
        .map(|k| f(&j["faults_per_kind"][k]["total"]))
        .sum();
    assert_eq!(by_kind, row_faults);
    assert!(f(&j["seeds_per_s"]) > 0.0);

    // Seeds run on two threads give the traces of the same seeds run alone, here.
    for row in rows.iter().filter(|r| r[1] == true).take(3) {
        let seed = row[0].as_u64().unwrap();
        let alone = cluster_sim::run(&SimConfig::from_seed(seed)).unwrap();
        assert_eq!(row[2].as_str().unwrap(), format!("{:016x}", alone.trace));
        assert_eq!(row[4].as_u64().unwrap(), alone.checks, "seed {seed}");
    }

    let md = std::fs::read_to_string(dir.path().join("sim.md")).unwrap();
    assert!(md.contains("**20 run, "), "{md}");
    assert!(md.contains("| lost | peer frames lost |"), "{md}");
    result.unwrap();
}

/// Reads `sim_nodes.json` and checks what every run must satisfy.
fn check_nodes_runs(j: &Value, victims: u64) -> Vec<Value> {
    let delay_max = f(&j["delay_us"][1]) * 1e-6;
    let runs = j["runs"].as_array().unwrap().clone();
    for r in &runs {
        let name = r["name"].as_str().unwrap();
        let (k, t_int, t_to, t_ins, t_br) = (
            f(&r["k"]),
            f(&r["interval_s"]),
            f(&r["timeout_s"]),
            f(&r["insurance_s"]),
            f(&r["broken_s"]),
        );
        assert_eq!(r["victims"], victims, "{name}");
        assert_eq!(r["false_unreachable"], 0, "{name}");
        assert_eq!(r["false_broken"], 0, "{name}");
        assert_eq!(r["never_detected"], 0, "{name}");
        assert_eq!(r["under_watched"], 0, "{name}");
        assert!(f(&r["degree"]["min"]) >= f(&r["dial"]), "{name}");
        // Each process is watched by k: the monitoring load averages exactly k.
        assert!((f(&r["watching"]["mean"]) - k).abs() < 1e-9, "{name}: {r}");

        // Heartbeats: at least the k round heartbeats per T_interval, at most the bound of
        // detect/mod.rs ((k + 1) / T_interval + (c − k) / T_insurance), 2 % for the window's
        // edges; received as many as sent, but those in flight at the window's edges.
        let sent = f(&r["sent_per_s"]["mean"]);
        let received = f(&r["received_per_s"]["mean"]);
        assert!(sent >= 0.98 * k / t_int, "{name}: {sent} sent per s");
        assert!(
            sent <= 1.02 * f(&r["bound_per_s"]),
            "{name}: {sent} sent per s"
        );
        assert!(
            (received - sent).abs() <= 0.02 * sent,
            "{name}: {received} vs {sent}"
        );

        // Detection: never before T_timeout + T_broken after the kill (a monitor's promise
        // covered up to then), within the monitors' bound when a monitor survived, and
        // within the insurance bound always.
        let d = &r["detection_s"];
        assert!(f(&d["min"]) > t_to + t_br, "{name}: {d}");
        let bound = if r["victims_without_live_monitor"] == 0 {
            t_int + t_to + t_br + delay_max
        } else {
            t_ins + t_to + t_br + delay_max
        };
        assert!(f(&d["max"]) <= bound + 1e-9, "{name}: {d} > {bound}");
        assert!(f(&d["median"]) <= f(&d["p99"]) && f(&d["p99"]) <= f(&d["max"]));
    }
    runs
}

#[test]
fn nodes_find_every_victim_and_accuse_no_live_process() {
    let dir = tempfile::tempdir().unwrap();
    let args = SimArgs {
        nodes: Some(200),
        kill_fraction: Some(0.05),
        params: Some(ParamSet::Both),
        out: Some(dir.path().to_path_buf()),
        ..SimArgs::default()
    };
    sim::run(&args).unwrap();
    let j = read_json(dir.path(), "sim_nodes");
    let runs = check_nodes_runs(&j, 10);
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["name"], "paper 004");
    assert_eq!(runs[1]["name"], "cluster default");
    // Paper 004's parameters: the rotation brings every peer back as a monitor long before
    // 200 s, so the rate is the rounds' (k + 1) per T_interval.
    let per_interval = f(&runs[0]["sent_per_interval"]);
    assert!((per_interval - 3.0).abs() < 0.05, "{per_interval}");
    let md = std::fs::read_to_string(dir.path().join("sim_nodes.md")).unwrap();
    assert!(md.contains("| paper 004 | 200 | 2 |"), "{md}");
}

#[test]
fn processes_that_lose_every_monitor_are_found_by_insurance() {
    // 30 % of the processes killed at once: some victims lose all k of their monitors, and
    // only the insurance heartbeats' silence finds them (within T_insurance + T_timeout +
    // T_broken + the largest delay).
    let cfg = nodes::NodesConfig {
        name: "cluster default".into(),
        nodes: 300,
        params: sim::param_sets(ParamSet::Cluster)[0].1,
        dial: 5,
        window: std::time::Duration::from_secs(2),
        kill_fraction: 0.3,
        seed: 4,
    };
    let o = nodes::simulate(&cfg).unwrap();
    assert!(
        sim::nodes_problems(&o).is_empty(),
        "{:?}",
        sim::nodes_problems(&o)
    );
    assert_eq!(o.victims, 90);
    assert!(o.victims_without_live_monitor > 0, "{o:?}");
    assert!(o.detected_by_monitor < o.victims, "{o:?}");
    let d = o.detection_s.unwrap();
    assert!(d.min > o.timeout_s + o.broken_s, "{d:?}");
    assert!(
        d.max <= o.insurance_s + o.timeout_s + o.broken_s + 0.005,
        "{d:?}"
    );
}

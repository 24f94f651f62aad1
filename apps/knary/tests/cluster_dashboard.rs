//! The coordinator's dashboard (`knary coordinator --dashboard`) against a real cluster: the
//! page in headless Chromium while a worker is killed, `/metrics` scraped during a run, and
//! the token and loopback checks.

mod common;

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use veriflow_testkit::browser::Browser;
use veriflow_testkit::{wait_json_within, Cluster, ClusterOpts};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_knary"))
}

/// A cluster of `workers` whose coordinator serves a dashboard, and the dashboard's address
/// and token (from the coordinator's log).
fn cluster_with_dashboard(workers: usize) -> (Cluster, String, String) {
    let c = Cluster::start_with(
        bin(),
        ClusterOpts {
            workers,
            coordinators: 1,
            coordinator_args: vec!["--dashboard".into(), "127.0.0.1:0".into()],
            ..ClusterOpts::default()
        },
    );
    let log = c.dir.path().join("coord0.log");
    let t0 = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(url) = text
            .lines()
            .find_map(|l| l.strip_prefix("coordinator: dashboard at http://"))
        {
            let (addr, token) = url
                .split_once("/?token=")
                .unwrap_or_else(|| panic!("a dashboard line with a token: {url}"));
            return (c, addr.to_string(), token.trim().to_string());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the coordinator named no dashboard: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `GET path` on `addr` with these extra header lines: (status code, body).
fn get(addr: &str, path: &str, headers: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("the dashboard accepts");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("an HTTP answer");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"));
    (code, body.to_string())
}

/// The OpenMetrics text checked line by line; its samples by name (labels included).
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "{text}");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("# TYPE name type");
            assert!(
                ["counter", "gauge", "histogram"].contains(&ty),
                "{line} in\n{text}"
            );
            types.insert(name.to_string(), ty.to_string());
        } else if line.starts_with("# HELP ") {
            continue;
        } else {
            let (name, value) = line.rsplit_once(' ').expect("name value");
            let v: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("{line}: not a number"));
            let family = name.split('{').next().unwrap();
            assert!(family.starts_with("veriflow_"), "{line}");
            let declared = types.iter().any(|(f, ty)| {
                let suffixes: &[&str] = match ty.as_str() {
                    "counter" => &["_total"],
                    "histogram" => &["_sum", "_count", "_bucket"],
                    _ => &[""],
                };
                suffixes.iter().any(|s| family == format!("{f}{s}"))
            });
            assert!(declared, "{line}: no # TYPE for it in\n{text}");
            samples.insert(name.to_string(), v);
        }
    }
    samples
}

fn scrape(addr: &str, token: &str) -> BTreeMap<String, f64> {
    let (code, body) = get(addr, &format!("/metrics?token={token}"), "");
    assert_eq!(code, 200, "{body}");
    parse_metrics(&body)
}

#[test]
fn metrics_rise_during_a_run_parse_and_end_at_the_jobs_count() {
    let (c, addr, token) = cluster_with_dashboard(3);
    let before = scrape(&addr, &token);
    assert_eq!(before["veriflow_tasks_completed_total"], 0.0, "{before:?}");
    assert_eq!(before["veriflow_certification_checks_total"], 0.0);
    // 5461 tasks of 1 ms over 3 workers: long enough to be scraped while it runs.
    let run = c.submit(&["--depth", "7", "--fanout", "4", "--grain-us", "1000"]);
    let t0 = Instant::now();
    let mut last = before.clone();
    let mut rose = 0;
    let during = loop {
        let m = scrape(&addr, &token);
        // Counters never go down.
        for (k, v) in &last {
            if k.ends_with("_total") || k.contains("_bucket") || k.ends_with("_count") {
                assert!(m[k] >= *v, "{k} went from {v} to {}", m[k]);
            }
        }
        if m["veriflow_tasks_completed_total"] > last["veriflow_tasks_completed_total"] {
            rose += 1;
        }
        last = m.clone();
        if rose >= 2 && m["veriflow_log_commit_seconds_count"] > 0.0 {
            break m;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the counters did not rise twice: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(during["veriflow_log_bytes_total"] > 0.0, "{during:?}");
    assert_eq!(during["veriflow_workers"], 3.0, "{during:?}");
    // The histogram: cumulative buckets, +Inf is the count.
    let buckets: Vec<f64> = during
        .iter()
        .filter(|(k, _)| k.starts_with("veriflow_log_commit_seconds_bucket"))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(buckets.len(), 11, "{during:?}");
    assert_eq!(
        during["veriflow_log_commit_seconds_bucket{le=\"+Inf\"}"],
        during["veriflow_log_commit_seconds_count"]
    );
    let (code, done, err) = wait_json_within(run, Duration::from_secs(180), "submit");
    assert_eq!(code, 0, "{err}");
    // After the job: its tasks and steals, as the submitter was told.
    let t0 = Instant::now();
    let end = loop {
        let m = scrape(&addr, &token);
        if m["veriflow_tasks_completed_total"] == done["tasks"].as_f64().unwrap() {
            break m;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "tasks_completed never reached {}: {m:?}",
            done["tasks"]
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        end["veriflow_steals_total"],
        done["steals"].as_f64().unwrap(),
        "{end:?} vs {done}"
    );
    assert!(end["veriflow_steals_total"] > 0.0, "{end:?}");
    assert_eq!(end["veriflow_worker_failures_total"], 0.0);
}

#[test]
fn the_dashboard_refuses_a_missing_or_wrong_token_and_a_public_address_without_the_flag() {
    let (c, addr, token) = cluster_with_dashboard(1);
    for path in ["/", "/metrics", "/events", "/state", "/assets/dashboard.js"] {
        let (code, body) = get(&addr, path, "");
        assert_eq!(code, 401, "{path} without a token: {body}");
        assert!(body.contains("token"), "{body}");
        // A token that differs from the right one in its first character.
        let wrong = if token.starts_with('0') { '1' } else { '0' };
        let (code, _) = get(&addr, &format!("{path}?token={wrong}{}", &token[1..]), "");
        assert_eq!(code, 401, "{path} with a wrong token");
        let (code, _) = get(&addr, path, "Authorization: Bearer nope\r\n");
        assert_eq!(code, 401, "{path} with a wrong bearer");
    }
    // The right token, either way (the first sample may precede the coordinator's role).
    let t0 = Instant::now();
    let state = loop {
        let (code, body) = get(&addr, &format!("/state?token={token}"), "");
        assert_eq!(code, 200, "{body}");
        let state: Value = serde_json::from_str(&body).expect("JSON state");
        if state["status"]["role"] == "active" {
            break state;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{state}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(state["status"]["jobs"].is_array(), "{state}");
    assert_eq!(state["certification"], Value::Null, "{state}");
    let (code, body) = get(
        &addr,
        "/metrics",
        &format!("Authorization: Bearer {token}\r\n"),
    );
    assert_eq!(code, 200, "{body}");
    // A non-loopback address needs --dashboard-public; a bad one is a clear error.
    let store = format!("--store={}", c.store);
    for (addr, says) in [
        ("0.0.0.0:0", "--dashboard-public"),
        ("127.0.0.1", "dashboard address 127.0.0.1"),
    ] {
        knary(&[
            "coordinator",
            "--key",
            s(&c.key),
            &store,
            "--standby",
            "--dashboard",
            addr,
        ])
        .expect_code(1)
        .stderr_has(says);
    }
}

/// Where the screenshot goes: the one the README shows (bench/results/dashboard.png) when
/// `VERIFLOW_SAVE_SCREENSHOT=1`, else the temporary directory, so that a test run leaves the
/// tree as it was.
fn screenshot_path() -> PathBuf {
    if std::env::var("VERIFLOW_SAVE_SCREENSHOT").as_deref() == Ok("1") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results/dashboard.png")
    } else {
        std::env::temp_dir().join(format!("veriflow-dashboard-{}.png", std::process::id()))
    }
}

#[test]
fn the_page_in_a_browser_shows_the_job_then_a_killed_workers_failure_and_the_new_map() {
    let mut browser = match Browser::launch(1400, 1100) {
        Ok(b) => b,
        Err(why) => {
            eprintln!("SKIPPED: the dashboard's browser test needs Chromium: {why}");
            return;
        }
    };
    let (c, addr, token) = cluster_with_dashboard(3);
    browser.open(&format!("http://{addr}/?token={token}"));
    let dump = "document.querySelector('main').innerText";
    let limit = Duration::from_secs(90);
    browser.wait_for(
        "three workers",
        "document.querySelectorAll('#workers tbody tr').length",
        limit,
        |v| v == 3,
        dump,
    );
    // 87381 tasks of 1 ms over 3 workers: still running when a worker is killed.
    let run = c.submit(&["--depth", "8", "--fanout", "4", "--grain-us", "1000"]);
    let map_js = "Array.from(document.querySelectorAll('#vnode-map .vnode'))\
                  .map(e => [Number(e.dataset.vnode), Number(e.dataset.worker), Number(e.dataset.epoch)])";
    let map = browser.wait_for(
        "the job's map",
        map_js,
        limit,
        |v| v.as_array().is_some_and(|a| a.len() == 3),
        dump,
    );
    let hosts: Vec<u64> = map
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m[1].as_u64().unwrap())
        .collect();
    assert!(map.as_array().unwrap().iter().all(|m| m[2] == 0), "{map}");
    // A few seconds of throughput first (the screenshot shows the dip).
    let tasks_js = "Number(document.getElementById('c-tasks').textContent)";
    browser.wait_for(
        "throughput",
        tasks_js,
        limit,
        |v| v.as_u64() > Some(3000),
        dump,
    );
    let ids = "Array.from(document.querySelectorAll('#workers tbody tr')).map(r => Number(r.dataset.worker))";
    let before: Vec<u64> = serde_json::from_value(browser.eval(ids)).unwrap();
    assert_eq!(before.len(), 3, "{before:?}");

    c.workers[1].signal("-KILL");
    let failure = browser.wait_for(
        "the failure in the timeline",
        "Array.from(document.querySelectorAll('#timeline li[data-kind=failure]')).map(l => l.textContent)",
        limit,
        |v| v.as_array().is_some_and(|a| a.len() == 1),
        dump,
    );
    let after: Vec<u64> = serde_json::from_value(browser.wait_for(
        "two workers",
        ids,
        limit,
        |v| v.as_array().is_some_and(|a| a.len() == 2),
        dump,
    ))
    .unwrap();
    let lost = *before.iter().find(|w| !after.contains(w)).unwrap();
    assert!(
        failure[0]
            .as_str()
            .unwrap()
            .contains(&format!("worker {lost} lost")),
        "{failure}"
    );
    // The new map: nothing on the lost worker, its vnodes at a new epoch.
    let map = browser.wait_for(
        "the new map",
        map_js,
        limit,
        |v| {
            v.as_array().is_some_and(|a| {
                a.len() == 3 && a.iter().all(|m| m[1] != lost) && a.iter().any(|m| m[2] == 1)
            })
        },
        dump,
    );
    for (m, host) in map.as_array().unwrap().iter().zip(&hosts) {
        let moved = *host == lost;
        assert_eq!(m[2] == 1, moved, "{map} (hosts before {hosts:?})");
    }
    browser.wait_for(
        "the failure counted",
        "[document.getElementById('c-failures').textContent, document.getElementById('c-recoveries').textContent]",
        limit,
        |v| v[0] == "1" && v[1].as_str().and_then(|s| s.parse::<u64>().ok()) >= Some(1),
        dump,
    );
    // The recovered job running on for a while, then the picture for the README.
    let seen = browser.eval(tasks_js).as_u64().unwrap();
    browser.wait_for(
        "progress after the failure",
        tasks_js,
        limit,
        |v| v.as_u64() > Some(seen + 6000),
        dump,
    );
    browser.screenshot(&screenshot_path());

    // The job's end.
    let (code, done, err) = wait_json_within(run, Duration::from_secs(240), "submit");
    assert_eq!(code, 0, "{err}");
    let end = browser.wait_for(
        "the job's end",
        "[document.getElementById('job-end').dataset.state, document.getElementById('job-end').textContent, document.getElementById('certification').textContent]",
        limit,
        |v| v[0] == "finished",
        dump,
    );
    let text = end[1].as_str().unwrap();
    assert!(text.contains(&format!("{} tasks", done["tasks"])), "{end}");
    assert!(text.contains("1 workers lost"), "{end}");
    assert!(end[2].as_str().unwrap().starts_with("none"), "{end}");
    // Updates came live: the page counted many.
    let updates = browser.eval("Number(document.body.dataset.updates)");
    assert!(updates.as_u64() > Some(5), "{updates}");
}

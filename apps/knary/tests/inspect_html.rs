//! `knary inspect --html` and `--dot` of a run that lost vnodes and recovered them, with its
//! certificate (issue 19 point 5, issue 18 point 8): the report's rows, bars and recovery
//! marks match what `inspect --json` counts, the dot graph marks the oracle's checks, bad
//! input is a clear error, and the page renders in the real headless Chromium without an
//! error and without fetching anything.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::Value;
use veriflow_testkit::browser::Browser;

/// A knary(6, 4) run on 4 vnodes, vnodes 0 and 3 killed part-way and recovered from their
/// logs, certified (the certificate in `dir/cert.json`); its `inspect --json`.
fn recovered_run(dir: &Path) -> (PathBuf, PathBuf, Value, Value) {
    let key = dir.join("oracle.key");
    knary(&["keygen", s(&key)]).expect_code(0);
    let log = dir.join("log");
    let cert = dir.join("cert.json");
    let run = logged_run(
        &log,
        6,
        4,
        4,
        &[
            "--grain-us",
            "100",
            "--kill-vnode",
            "0",
            "--kill-after",
            "200",
            "--kill-vnode",
            "3",
            "--kill-after",
            "700",
            "--certify",
            "--oracle-key",
            s(&key),
            "--cert-out",
            s(&cert),
        ],
    );
    assert_eq!(run["failures"], 2, "{run}");
    let (out, ins) = inspect_json(&log);
    out.expect_code(0);
    (log, cert, run, ins.unwrap())
}

fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

#[test]
fn the_report_of_a_recovered_run_shows_every_vnode_task_and_recovery() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, cert, run, ins) = recovered_run(tmp.path());
    let html_path = tmp.path().join("report.html");
    let out = knary(&[
        "inspect",
        "--log-dir",
        s(&log),
        "--html",
        s(&html_path),
        "--certificate",
        s(&cert),
    ]);
    out.expect_code(0);
    assert!(out.stdout.contains("report written to"), "{out}");
    let html = std::fs::read_to_string(&html_path).unwrap();
    let tl = &ins["timeline"];
    let started = tl["started"].as_u64().unwrap() as usize;
    assert_eq!(started as u64, run["tasks"].as_u64().unwrap(), "{ins}");
    // One row per vnode, one bar per task.
    assert_eq!(count(&html, "<g class=\"row\""), 4);
    assert_eq!(count(&html, "<rect class=\"task"), started);
    // Each failed vnode came back as a new incarnation (a mark on its row and a line in the
    // failure list), which ran the tasks it recovered from the log: marked in their own colour.
    // (A vnode that logs nothing after its recovery shows none: vnode 3 may find no work.)
    let incarnations = tl["incarnations"].as_u64().unwrap() as usize;
    assert!(
        (1..=2).contains(&incarnations),
        "two vnodes were killed mid-run: {ins}"
    );
    assert_eq!(count(&html, "<line class=\"mark epoch\""), incarnations);
    assert_eq!(count(&html, "<li class=\"epoch\">"), incarnations);
    let recovered = tl["recovered"].as_u64().unwrap() as usize;
    let restarted: u64 = run["per_vnode"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["recovered_tasks"].as_u64().unwrap())
        .sum();
    // A kill may find the vnode between tasks: then nothing is restarted, and nothing is
    // drawn as recovered (the grain makes tasks in flight likely).
    assert!(
        (recovered > 0) == (restarted > 0) && recovered as u64 <= restarted,
        "{recovered} recovered, the run restarted {restarted}: {ins}"
    );
    assert_eq!(count(&html, "<rect class=\"task redone\""), recovered);
    assert_eq!(
        count(&html, "<rect class=\"task stolen\""),
        tl["stolen"].as_u64().unwrap() as usize
    );
    // The certificate: its verdict and its checks.
    let c: Value = serde_json::from_str(&std::fs::read_to_string(&cert).unwrap()).unwrap();
    assert!(html.contains("<span class=\"accept\" id=\"verdict\">ACCEPT</span>"));
    assert!(html.contains(&format!(
        "<th>checked</th><td>{}</td>",
        c["checked"].as_array().unwrap().len()
    )));
    // 1,365 tasks: more than the graph's bound, so it points to --dot instead.
    assert!(html.contains("are not drawn here"));
}

#[test]
fn the_dot_graph_marks_what_the_oracle_checked_and_what_was_recovered() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, cert, _, ins) = recovered_run(tmp.path());
    let dot = tmp.path().join("g.dot");
    knary(&[
        "inspect",
        "--log-dir",
        s(&log),
        "--dot",
        s(&dot),
        "--certificate",
        s(&cert),
    ])
    .expect_code(0);
    let text = std::fs::read_to_string(&dot).unwrap();
    let c: Value = serde_json::from_str(&std::fs::read_to_string(&cert).unwrap()).unwrap();
    let checked = c["checked"].as_array().unwrap().len();
    // One double border per checked task, plus the legend's.
    assert_eq!(count(&text, "peripheries=2"), checked + 1);
    let recovered = ins["timeline"]["recovered"].as_u64().unwrap() as usize;
    // Recovered tasks have the orange border (the legend's has it too).
    assert_eq!(count(&text, "penwidth=3, color=\"#dd6b20\""), recovered + 1);
    let tasks = ins["graph"]["tasks"].as_u64().unwrap() as usize;
    assert_eq!(
        count(&text, "arrowhead=empty]"),
        tasks - 1,
        "one spawn edge per task but the root"
    );
}

#[test]
fn a_bad_certificate_or_an_unwritable_report_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("log");
    logged_run(&log, 3, 3, 2, &[]);
    let html = tmp.path().join("r.html");
    let garbage = tmp.path().join("garbage.json");
    std::fs::write(&garbage, "{\"not\": \"a certificate\"}").unwrap();
    // A missing certificate, then one that is not a certificate.
    for (cert, name) in [
        (tmp.path().join("nope.json"), "nope.json"),
        (garbage, "garbage.json"),
    ] {
        let out = knary(&[
            "inspect",
            "--log-dir",
            s(&log),
            "--html",
            s(&html),
            "--certificate",
            s(&cert),
        ]);
        out.expect_code(1);
        assert!(out.stderr.contains(name), "{out}");
    }
    assert!(!html.exists(), "nothing written after a bad certificate");
    let out = knary(&[
        "inspect",
        "--log-dir",
        s(&log),
        "--html",
        s(&tmp.path().join("no/such/dir/r.html")),
    ]);
    out.expect_code(1);
    assert!(out.stderr.contains("cannot write"), "{out}");
}

/// Where the screenshot goes: the one the README shows (bench/results/inspect_report.png)
/// when `VERIFLOW_SAVE_SCREENSHOT=1`, else the temporary directory.
fn screenshot_path() -> PathBuf {
    if std::env::var("VERIFLOW_SAVE_SCREENSHOT").as_deref() == Ok("1") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results/inspect_report.png")
    } else {
        std::env::temp_dir().join(format!("veriflow-report-{}.png", std::process::id()))
    }
}

#[test]
fn the_report_renders_in_a_browser_without_errors_or_fetches() {
    let mut browser = match Browser::launch(1280, 1400) {
        Ok(b) => b,
        Err(why) => {
            eprintln!("SKIPPED: the report's browser test needs Chromium: {why}");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    // A small run (its graph is drawn) whose vnode 0 (it holds the root: it has work) fails
    // and is recovered.
    let key = tmp.path().join("oracle.key");
    knary(&["keygen", s(&key)]).expect_code(0);
    let log = tmp.path().join("log");
    let cert = tmp.path().join("cert.json");
    logged_run(
        &log,
        4,
        4,
        3,
        &[
            "--grain-us",
            "300",
            "--kill-vnode",
            "0",
            "--kill-after",
            "40",
            "--certify",
            "--oracle-key",
            s(&key),
            "--cert-out",
            s(&cert),
        ],
    );
    let (_, ins) = inspect_json(&log);
    let ins = ins.unwrap();
    let html = tmp.path().join("report.html");
    knary(&[
        "inspect",
        "--log-dir",
        s(&log),
        "--html",
        s(&html),
        "--certificate",
        s(&cert),
    ])
    .expect_code(0);
    browser.open(&format!("file://{}", s(&html)));
    let dump = "document.body ? document.body.innerText.slice(0, 2000) : 'no body'";
    browser.wait_for(
        "the page's script run",
        "document.body && document.body.dataset.ready",
        Duration::from_secs(20),
        |v| v == "1",
        dump,
    );
    let rows = browser.eval("document.querySelectorAll('#stream-svg g.row').length");
    assert_eq!(rows, 3, "rows");
    let bars = browser.eval("document.querySelectorAll('#stream-svg rect.task').length");
    assert_eq!(bars, ins["timeline"]["started"], "bars");
    let boxes = browser.eval("document.querySelectorAll('#graph-svg g.gtask').length");
    assert_eq!(boxes, ins["graph"]["tasks"], "graph boxes");
    // Rendered: the stream has a size on screen, and so has every bar.
    let width = browser.eval("document.getElementById('stream-svg').getBoundingClientRect().width");
    assert!(width.as_f64().unwrap() > 500.0, "stream width {width}");
    let flat = browser.eval(
        "Array.from(document.querySelectorAll('rect.task')).filter(r => \
         r.getBBox().width <= 0).length",
    );
    assert_eq!(flat, 0, "bars without a width");
    assert_eq!(
        browser.eval("document.getElementById('verdict').textContent"),
        "ACCEPT"
    );
    // No script error, nothing fetched.
    assert_eq!(
        browser.eval("JSON.stringify(window.veriflowErrors)"),
        "[]",
        "errors in the page"
    );
    assert_eq!(
        browser.eval("performance.getEntriesByType('resource').length"),
        0,
        "the page fetched something"
    );
    // Clicking a bar shows its task.
    browser.eval("document.querySelector('rect.task').dispatchEvent(new MouseEvent('click'))");
    let info = browser.eval("document.getElementById('info').textContent");
    assert!(info.as_str().unwrap().contains("knary"), "info: {info}");
    browser.screenshot(&screenshot_path());
}

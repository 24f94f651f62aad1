//! `inspect`'s pictures of a run (issue 19 point 5, issue 18 point 8): the HTML report's task
//! stream with one bar per task, then binned for a large run within its size bound; the dot
//! graph with spawn edges and vnode colours, then summarised past its task bound.

use std::collections::BTreeMap;
use std::sync::Arc;

use knary::{expected_tasks, Knary};
use veriflow::{
    inspect, HtmlLimits, Inspection, MemoryStore, Program, Registry, Runtime, Store, HTML_LIMITS,
};

fn registry() -> Registry {
    let mut r = Registry::new();
    <Knary as Program>::register(&mut r).expect("knary registers");
    r
}

/// A logged knary(depth, fanout) run on `vnodes` vnodes, inspected.
fn inspected(depth: u32, fanout: u32, vnodes: u32) -> Inspection {
    let store = Arc::new(MemoryStore::default());
    let rt = Runtime::builder(registry())
        .program(<Knary as Program>::NAME)
        .threads(2)
        .vnodes(vnodes)
        .seed(5)
        .store(store.clone() as Arc<dyn Store>)
        .build()
        .expect("runtime");
    let p = Knary {
        depth,
        fanout,
        serial: 1,
        grain_us: 0,
    };
    let (root, inputs) = p.root();
    let report = rt.run(root, inputs).expect("the run");
    assert_eq!(report.tasks, expected_tasks(depth, fanout).unwrap());
    inspect(store, &registry()).expect("inspect")
}

fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

#[test]
fn a_small_run_has_one_row_per_vnode_one_bar_per_task_and_its_graph() {
    let ins = inspected(4, 3, 3);
    let tasks = expected_tasks(4, 3).unwrap() as usize;
    let html = ins.to_html(None, &HTML_LIMITS);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_eq!(count(&html, "<g class=\"row\""), 3);
    assert!(html.contains("data-mode=\"bars\""));
    // Every task is a bar, of one of the classes the legend explains.
    assert_eq!(count(&html, "<rect class=\"task"), tasks);
    // Nothing failed: no re-run and no unfinished task.
    assert_eq!(count(&html, "class=\"task redone\""), 0);
    assert_eq!(count(&html, "class=\"task open\""), 0);
    // Steals are drawn on the thief and marked on the victim, as often as the logs say.
    let c = ins.timeline.counts();
    assert_eq!(count(&html, "class=\"task stolen\""), c.stolen as usize);
    assert_eq!(count(&html, "class=\"mark stolen\""), c.stolen as usize);
    // The graph, laid out, one box per task.
    assert_eq!(count(&html, "class=\"gtask\""), tasks);
    // Self-contained: nothing to fetch (the SVG namespace is a name, never fetched; a link
    // inside the page starts with '#').
    for fetch in ["src=", "https://", "@import", "url(http"] {
        assert!(!html.contains(fetch), "{fetch} in the page");
    }
    assert_eq!(count(&html, "href=\""), count(&html, "href=\"#"));
    assert_eq!(
        count(&html, "http://"),
        count(&html, "http://www.w3.org/2000/svg")
    );
}

#[test]
fn a_large_run_is_binned_and_stays_small() {
    // knary(7, 5): 23,437 tasks on 4 vnodes.
    let ins = inspected(7, 5, 4);
    let tasks = expected_tasks(7, 5).unwrap() as usize;
    let limits = HtmlLimits {
        bars: 1_000,
        cells: 400,
        graph_tasks: 300,
    };
    let html = ins.to_html(None, &limits);
    assert!(html.contains("data-mode=\"bins\""));
    assert_eq!(count(&html, "<g class=\"row\""), 4);
    assert_eq!(count(&html, "<rect class=\"task"), 0);
    let bins = count(&html, "<rect class=\"bin\"");
    assert!(bins > 0 && bins <= limits.cells, "{bins} bins");
    assert!(html.contains(&format!("{tasks} tasks: more than 300 are not drawn")));
    // The default limits: bars up to 10,000 tasks, so this run is binned too, and the page
    // stays far below the bound (rule 3 of inspect/html.rs: 5 MB whatever the run).
    let html = ins.to_html(None, &HTML_LIMITS);
    assert!(html.contains("data-mode=\"bins\""));
    assert!(html.len() < 5 << 20, "{} bytes", html.len());
    // Bins sum to the tasks started (a bin's title says how many).
    let started: usize = html
        .split("<rect class=\"bin\"")
        .skip(1)
        .map(|b| {
            let t = &b[b.find("<title>").unwrap()..];
            let n = t.split(": ").nth(1).unwrap().split(' ').next().unwrap();
            n.parse::<usize>().unwrap()
        })
        .sum();
    assert_eq!(started, tasks);
}

#[test]
fn the_dot_graph_draws_spawn_edges_apart_and_colours_by_vnode() {
    let ins = inspected(4, 3, 3);
    let tasks = expected_tasks(4, 3).unwrap() as usize;
    let dot = ins.to_dot(None, veriflow::DOT_MAX_TASKS);
    assert!(dot.starts_with("digraph"));
    // Every task but the root has a parent: one dashed spawn edge each (plus the legend's).
    let spawn = "style=dashed, color=\"#2b6cb0\", arrowhead=empty";
    assert_eq!(count(&dot, spawn), tasks - 1 + 1);
    // Task boxes filled with the colour of the vnode that ran them: one colour per vnode.
    let boxes: Vec<&str> = dot
        .lines()
        .filter(|l| l.trim_start().starts_with('n') && l.contains("shape=box"))
        .collect();
    assert_eq!(boxes.len(), tasks);
    let mut colour_of: BTreeMap<&str, &str> = BTreeMap::new();
    for l in &boxes {
        let fill = l
            .split("fillcolor=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let label = l.split("label=\"").nth(1).unwrap();
        let mut parts = label.trim_end_matches("\"];").split("\\n");
        let (_, id, vnode) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
        let task = ins
            .timeline
            .vnodes
            .iter()
            .flat_map(|r| r.spans.iter().map(move |s| (s, r.vnode)))
            .find(|(s, _)| s.task.to_string() == id)
            .unwrap_or_else(|| panic!("{id} ran somewhere"));
        assert_eq!(vnode, task.1.to_string(), "{l}");
        assert_eq!(*colour_of.entry(vnode).or_insert(fill), fill, "{l}");
    }
    let mut fills: Vec<&str> = colour_of.values().copied().collect();
    fills.sort_unstable();
    fills.dedup();
    assert_eq!(
        fills.len(),
        colour_of.len(),
        "one colour per vnode: {colour_of:?}"
    );
    assert!(dot.contains("subgraph cluster_legend"));
}

#[test]
fn a_large_dot_graph_is_summarised_per_vnode_and_depth() {
    let ins = inspected(6, 4, 3);
    let tasks = expected_tasks(6, 4).unwrap();
    let dot = ins.to_dot(None, 500);
    assert!(dot.contains(&format!("// {tasks} tasks: more than 500")));
    // No task box: at most vnodes x (depth + 1) summary boxes, whose counts add up.
    let boxes: Vec<&str> = dot
        .lines()
        .filter(|l| l.trim_start().starts_with('c') && l.contains("shape=box"))
        .collect();
    assert!(
        !boxes.is_empty() && boxes.len() <= 3 * 7,
        "{} boxes",
        boxes.len()
    );
    let sum: u64 = boxes
        .iter()
        .map(|l| {
            let label = l.split("\\n").nth(1).unwrap();
            label.split(' ').next().unwrap().parse::<u64>().unwrap()
        })
        .sum();
    assert_eq!(sum, tasks);
    assert!(dot.contains("spawns\"];"));
    assert!(dot.len() < 64 * 1024, "{} bytes", dot.len());
}

//! `inspect --dot`: G in graphviz's dot language, with who spawned whom and where tasks ran.
//!
//! Rules:
//!
//! 1. **Up to [`DOT_MAX_TASKS`] tasks, every vertex.** Tasks are boxes filled with the colour
//!    of the vnode that ran them (`timeline.rs` [`Timeline::ran_on`]), labelled name, id and
//!    vnode; data objects are small ellipses. Data edges (a task reads a datum, writes a
//!    datum) are solid black; spawn edges (parent → child) are dashed blue with an open head,
//!    so the two never look alike.
//! 2. **Marks.** A task that never completed is dashed; one recovered by a new incarnation has a
//!    thick orange border; with a certificate, a task the oracle re-ran (checked) has a double
//!    border, and a forged one (a detection) a red border and label. The vnode colours, edge
//!    styles and marks are explained in a legend cluster.
//! 3. **Beyond [`DOT_MAX_TASKS`], a summary**: one box per (vnode, spawn depth) holding the
//!    count of its tasks (and of those recovered, checked, forged), one dashed edge per pair of
//!    boxes a spawn links (labelled with the number of spawns) and one solid edge per pair a
//!    datum links (writer's box → reader's box, labelled with the number of data). Its size
//!    grows with vnodes × depth, not with tasks: graphviz draws it on one screen where the
//!    whole graph would be an image tens of thousands of pixels wide.
//!
//! [`Timeline::ran_on`]: super::Timeline::ran_on

use std::collections::BTreeMap;
use std::fmt::Write as _;

use petgraph::visit::EdgeRef;
use veriflow_certifier::Certificate;
use veriflow_runtime::graph::{Edge, Vertex};
use veriflow_runtime::{IdMap, IdSet, TaskId, VnodeId};

use super::Inspection;

/// Above this many tasks `--dot` writes the summary (rule 3). Graphviz's dot lays out 2,000
/// boxes in seconds and the picture can still be read when zoomed; at 10,000 it takes minutes.
pub const DOT_MAX_TASKS: usize = 2_000;

/// Twelve colours that differ in print and on screen (ColorBrewer's "Set3"); a vnode's colour
/// is `PALETTE[vnode % 12]` (the oracle's is grey).
pub(crate) const PALETTE: [&str; 12] = [
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
    "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f",
];

/// The colour of a vnode (rule 1).
pub(crate) fn vnode_colour(v: VnodeId) -> &'static str {
    if v == VnodeId::ORACLE {
        "#bdbdbd"
    } else {
        PALETTE[v.0 as usize % PALETTE.len()]
    }
}

/// What a certificate says of tasks (rule 2).
#[derive(Debug, Default)]
pub(crate) struct CertMarks {
    /// Tasks the oracle re-ran.
    pub(crate) checked: IdSet<TaskId>,
    /// Tasks found forged.
    pub(crate) forged: IdSet<TaskId>,
}

impl CertMarks {
    pub(crate) fn of(cert: Option<&Certificate>) -> CertMarks {
        let mut m = CertMarks::default();
        if let Some(c) = cert {
            m.checked = c.checked.iter().filter_map(|t| t.parse().ok()).collect();
            let detections = c
                .detections
                .iter()
                .chain(c.corrections.iter().flat_map(|r| r.detected.iter()));
            m.forged = detections.filter_map(|d| d.task.parse().ok()).collect();
        }
        m
    }
}

/// Per task: the vnode that ran it, whether it was recovered by a new incarnation.
pub(crate) fn task_facts(ins: &Inspection) -> (IdMap<TaskId, VnodeId>, IdSet<TaskId>) {
    let restarted = ins
        .timeline
        .vnodes
        .iter()
        .flat_map(|r| r.spans.iter())
        .filter(|s| s.recovered)
        .map(|s| s.task)
        .collect();
    (ins.timeline.ran_on.clone(), restarted)
}

/// G in dot (rules 1-3), the summary when it has more than `max_tasks` tasks.
pub(crate) fn to_dot(ins: &Inspection, cert: Option<&Certificate>, max_tasks: usize) -> String {
    let marks = CertMarks::of(cert);
    if ins.graph.task_count() > max_tasks {
        summary(ins, &marks, max_tasks)
    } else {
        full(ins, &marks)
    }
}

const SPAWN_STYLE: &str = "style=dashed, color=\"#2b6cb0\", arrowhead=empty";

fn legend(out: &mut String, vnodes: &[VnodeId], cert: bool) {
    out.push_str("  subgraph cluster_legend {\n    label=\"legend\"; fontsize=10;\n");
    for v in vnodes {
        let _ = writeln!(
            out,
            "    legend_{} [shape=box, style=filled, fillcolor=\"{}\", label=\"ran on {v}\"];",
            v.0,
            vnode_colour(*v)
        );
    }
    out.push_str(
        "    legend_a [shape=box, label=\"parent\"]; legend_b [shape=box, label=\"child\"];\n",
    );
    let _ = writeln!(
        out,
        "    legend_a -> legend_b [{SPAWN_STYLE}, label=\"spawns\"];"
    );
    out.push_str(
        "    legend_w [shape=box, label=\"writer\"]; legend_d [shape=ellipse, label=\"datum\"];\n",
    );
    out.push_str("    legend_w -> legend_d [label=\"writes / reads\"];\n");
    out.push_str(
        "    legend_r [shape=box, style=\"filled,bold\", penwidth=3, color=\"#dd6b20\", \
         fillcolor=white, label=\"recovered by a new incarnation\"];\n",
    );
    out.push_str("    legend_i [shape=box, style=dashed, label=\"started, never completed\"];\n");
    if cert {
        out.push_str(
            "    legend_c [shape=box, peripheries=2, label=\"re-run by the oracle (checked)\"];\n",
        );
        out.push_str(
            "    legend_f [shape=box, color=red, fontcolor=red, penwidth=2, label=\"forged\"];\n",
        );
    }
    out.push_str("  }\n");
}

fn vnode_list(ins: &Inspection) -> Vec<VnodeId> {
    ins.timeline.vnodes.iter().map(|r| r.vnode).collect()
}

fn full(ins: &Inspection, marks: &CertMarks) -> String {
    let (ran_on, restarted) = task_facts(ins);
    let g = &ins.graph.graph;
    let mut out = String::from("digraph G {\n  rankdir=TB;\n  node [fontsize=9];\n");
    legend(&mut out, &vnode_list(ins), !marks.checked.is_empty());
    for i in g.node_indices() {
        let _ = match &g[i] {
            Vertex::Task {
                id,
                name,
                vnode,
                completed,
            } => {
                let ran = ran_on.get(id).copied().unwrap_or(*vnode);
                let mut style = vec!["filled"];
                let mut extra = String::new();
                if !completed {
                    style.push("dashed");
                }
                if restarted.contains(id) {
                    style.push("bold");
                    extra.push_str(", penwidth=3, color=\"#dd6b20\"");
                }
                if marks.forged.contains(id) {
                    extra.push_str(", penwidth=2, color=red, fontcolor=red");
                }
                if marks.checked.contains(id) {
                    extra.push_str(", peripheries=2");
                }
                writeln!(
                    out,
                    "  n{} [shape=box, style=\"{}\", fillcolor=\"{}\"{extra}, \
                     label=\"{name}\\n{id}\\n{ran}\"];",
                    i.index(),
                    style.join(","),
                    vnode_colour(ran),
                )
            }
            Vertex::Data { id } => writeln!(
                out,
                "  n{} [shape=ellipse, fontsize=7, label=\"{id}\"];",
                i.index()
            ),
        };
    }
    for e in g.edge_references() {
        let _ = writeln!(out, "  n{} -> n{};", e.source().index(), e.target().index());
    }
    for &(parent, child) in &ins.timeline.spawns {
        if let (Some(p), Some(c)) = (ins.graph.task_index(parent), ins.graph.task_index(child)) {
            let _ = writeln!(out, "  n{} -> n{} [{SPAWN_STYLE}];", p.index(), c.index());
        }
    }
    out.push_str("}\n");
    out
}

/// Spawn depth of every task (the root and tasks whose parent is unknown: 0).
pub(crate) fn depths(spawns: &[(TaskId, TaskId)]) -> IdMap<TaskId, u32> {
    let parent: IdMap<TaskId, TaskId> = spawns.iter().map(|&(p, c)| (c, p)).collect();
    let mut depth: IdMap<TaskId, u32> = IdMap::default();
    let mut chain = Vec::new();
    for &(_, child) in spawns {
        let mut t = child;
        // Up to a task whose depth is known or that has no parent; a cycle (a corrupt log
        // that passed the checks) stops at its first repeat.
        let base = loop {
            if let Some(&d) = depth.get(&t) {
                break d;
            }
            match parent.get(&t) {
                Some(&p) if !chain.contains(&t) => {
                    chain.push(t);
                    t = p;
                }
                _ => {
                    depth.insert(t, 0);
                    break 0;
                }
            }
        };
        for (k, t) in chain.drain(..).rev().enumerate() {
            depth.insert(t, base + 1 + k as u32);
        }
    }
    depth
}

/// A summary box: (vnode, spawn depth).
type CellKey = (VnodeId, u32);

#[derive(Default)]
struct Cell {
    tasks: u64,
    restarted: u64,
    checked: u64,
    forged: u64,
}

fn summary(ins: &Inspection, marks: &CertMarks, max_tasks: usize) -> String {
    let (ran_on, restarted) = task_facts(ins);
    let depth = depths(&ins.timeline.spawns);
    let g = &ins.graph.graph;
    let task_cell = |id: &TaskId, vnode: VnodeId| {
        (
            ran_on.get(id).copied().unwrap_or(vnode),
            depth.get(id).copied().unwrap_or(0),
        )
    };
    let mut cells: BTreeMap<(VnodeId, u32), Cell> = BTreeMap::new();
    for i in g.node_indices() {
        if let Vertex::Task { id, vnode, .. } = &g[i] {
            let c = cells.entry(task_cell(id, *vnode)).or_default();
            c.tasks += 1;
            c.restarted += u64::from(restarted.contains(id));
            c.checked += u64::from(marks.checked.contains(id));
            c.forged += u64::from(marks.forged.contains(id));
        }
    }
    let cell_of = |t: TaskId| -> Option<(VnodeId, u32)> {
        let i = ins.graph.task_index(t)?;
        match &g[i] {
            Vertex::Task { id, vnode, .. } => Some(task_cell(id, *vnode)),
            Vertex::Data { .. } => None,
        }
    };
    let mut spawn_edges: BTreeMap<(CellKey, CellKey), u64> = BTreeMap::new();
    for &(p, c) in &ins.timeline.spawns {
        if let (Some(a), Some(b)) = (cell_of(p), cell_of(c)) {
            *spawn_edges.entry((a, b)).or_default() += 1;
        }
    }
    // Data edges: writer's cell → each reader's cell, per datum.
    let mut data_edges: BTreeMap<(CellKey, CellKey), u64> = BTreeMap::new();
    for d in g.node_indices() {
        if !matches!(g[d], Vertex::Data { .. }) {
            continue;
        }
        let task_of = |n| match &g[n] {
            Vertex::Task { id, vnode, .. } => Some(task_cell(id, *vnode)),
            Vertex::Data { .. } => None,
        };
        let writers: Vec<_> = g
            .edges_directed(d, petgraph::Direction::Incoming)
            .filter(|e| *e.weight() == Edge::Writes)
            .filter_map(|e| task_of(e.source()))
            .collect();
        for r in g
            .edges_directed(d, petgraph::Direction::Outgoing)
            .filter_map(|e| task_of(e.target()))
        {
            for &w in &writers {
                *data_edges.entry((w, r)).or_default() += 1;
            }
        }
    }
    let name = |(v, d): (VnodeId, u32)| format!("c{}_{d}", v.0);
    let mut out = format!(
        "digraph G {{\n  // {} tasks: more than {max_tasks}, so summarised per vnode and spawn \
         depth (src/inspect/dot.rs rule 3)\n  rankdir=TB;\n  node [fontsize=10];\n",
        ins.graph.task_count()
    );
    legend(&mut out, &vnode_list(ins), !marks.checked.is_empty());
    for (&(v, d), c) in &cells {
        let mut label = format!("{v} · depth {d}\\n{} tasks", c.tasks);
        if c.restarted > 0 {
            let _ = write!(label, "\\n{} recovered by a new incarnation", c.restarted);
        }
        if c.checked > 0 {
            let _ = write!(label, "\\n{} checked by the oracle", c.checked);
        }
        if c.forged > 0 {
            let _ = write!(label, "\\n{} forged", c.forged);
        }
        let border = if c.forged > 0 {
            ", color=red, penwidth=2"
        } else if c.restarted > 0 {
            ", color=\"#dd6b20\", penwidth=3"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {} [shape=box, style=filled, fillcolor=\"{}\"{border}, label=\"{label}\"];",
            name((v, d)),
            vnode_colour(v)
        );
    }
    for (&(a, b), n) in &spawn_edges {
        let _ = writeln!(
            out,
            "  {} -> {} [{SPAWN_STYLE}, label=\"{n} spawns\"];",
            name(a),
            name(b)
        );
    }
    for (&(a, b), n) in &data_edges {
        let _ = writeln!(out, "  {} -> {} [label=\"{n} data\"];", name(a), name(b));
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depths_follow_parents_whatever_the_order() {
        let t = |n: u128| TaskId(n);
        // 1 → 2 → 3, 1 → 4; listed child-first.
        let spawns = [(t(2), t(3)), (t(1), t(4)), (t(1), t(2))];
        let d = depths(&spawns);
        assert_eq!(d[&t(1)], 0);
        assert_eq!(d[&t(2)], 1);
        assert_eq!(d[&t(3)], 2);
        assert_eq!(d[&t(4)], 1);
    }

    #[test]
    fn a_cycle_in_a_corrupt_log_ends() {
        let t = |n: u128| TaskId(n);
        let d = depths(&[(t(1), t(2)), (t(2), t(1))]);
        assert_eq!(d.len(), 2);
    }
}

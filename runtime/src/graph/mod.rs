//! The data-flow graph G rebuilt from logs (paper 001 §III): a bipartite DAG of tasks and data
//! objects, in petgraph.
//!
//! Rules:
//!
//! 1. A task vertex comes from its `Declared` event (or `Adopted`, which carries the same
//!    record); a data vertex from any id a task reads or writes.
//! 2. Edges: data → task for each input read; task → data for each value the task itself wrote
//!    (its `Completed` outputs). A delegated output is written, and linked, by the delegate.
//! 3. Building is linear in the number of events.

use std::fmt::Write as _;

use petgraph::graph::{DiGraph, NodeIndex};

use crate::ids::{DataId, IdMap, TaskId, VnodeId};
use crate::log::{Event, VnodeEvents};

/// A vertex of G.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Vertex {
    /// A task, with the vnode whose log declared (or adopted) it.
    Task {
        /// Task id.
        id: TaskId,
        /// Registered name.
        name: String,
        /// Vnode that logged it.
        vnode: VnodeId,
        /// Whether its `Completed` event was found.
        completed: bool,
    },
    /// A data object.
    Data {
        /// Data id.
        id: DataId,
    },
}

/// An edge of G (rule 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edge {
    /// data → task: the task reads it.
    Reads,
    /// task → data: the task wrote it.
    Writes,
}

/// G, with indexes from ids to vertices.
#[derive(Debug, Default)]
pub struct FlowGraph {
    /// The graph.
    pub graph: DiGraph<Vertex, Edge>,
    tasks: IdMap<TaskId, NodeIndex>,
    data: IdMap<DataId, NodeIndex>,
}

impl FlowGraph {
    /// Builds G from the logs of all vnodes (rules 1-3).
    pub fn from_logs(logs: &[VnodeEvents]) -> FlowGraph {
        let mut g = FlowGraph::default();
        for log in logs {
            for e in &log.events {
                let record = match &e.event {
                    Event::Declared(d) => d,
                    Event::Adopted { record, .. } => record,
                    _ => continue,
                };
                let t = g.task(record.task, &record.name, log.vnode);
                for &i in &record.inputs {
                    let d = g.datum(i);
                    g.graph.add_edge(d, t, Edge::Reads);
                }
            }
        }
        for log in logs {
            for e in &log.events {
                if let Event::Completed { task, outputs, .. } = &e.event {
                    let Some(&t) = g.tasks.get(task) else {
                        continue;
                    };
                    if let Vertex::Task { completed, .. } = &mut g.graph[t] {
                        *completed = true;
                    }
                    for o in outputs {
                        let d = g.datum(o.data);
                        g.graph.add_edge(t, d, Edge::Writes);
                    }
                }
            }
        }
        g
    }

    fn task(&mut self, id: TaskId, name: &str, vnode: VnodeId) -> NodeIndex {
        if let Some(&i) = self.tasks.get(&id) {
            return i;
        }
        let i = self.graph.add_node(Vertex::Task {
            id,
            name: name.to_string(),
            vnode,
            completed: false,
        });
        self.tasks.insert(id, i);
        i
    }

    fn datum(&mut self, id: DataId) -> NodeIndex {
        if let Some(&i) = self.data.get(&id) {
            return i;
        }
        let i = self.graph.add_node(Vertex::Data { id });
        self.data.insert(id, i);
        i
    }

    /// Number of task vertices.
    pub fn task_count(&self) -> usize {
        self.tasks.len()
    }

    /// Number of data vertices.
    pub fn data_count(&self) -> usize {
        self.data.len()
    }

    /// The vertex of a task.
    pub fn task_index(&self, id: TaskId) -> Option<NodeIndex> {
        self.tasks.get(&id).copied()
    }

    /// The vertex of a data object.
    pub fn data_index(&self, id: DataId) -> Option<NodeIndex> {
        self.data.get(&id).copied()
    }

    /// G in graphviz's dot language: tasks as boxes (labelled name, id, vnode), data as
    /// ellipses; an uncompleted task is drawn dashed.
    pub fn to_dot(&self) -> String {
        let mut out = String::from("digraph G {\n  rankdir=TB;\n  node [fontsize=9];\n");
        for i in self.graph.node_indices() {
            let _ = match &self.graph[i] {
                Vertex::Task {
                    id,
                    name,
                    vnode,
                    completed,
                } => writeln!(
                    out,
                    "  n{} [shape=box{}, label=\"{name}\\n{id}\\n{vnode}\"];",
                    i.index(),
                    if *completed { "" } else { ", style=dashed" },
                ),
                Vertex::Data { id } => {
                    writeln!(out, "  n{} [shape=ellipse, label=\"{id}\"];", i.index())
                }
            };
        }
        for e in self.graph.edge_indices() {
            if let Some((a, b)) = self.graph.edge_endpoints(e) {
                let _ = writeln!(out, "  n{} -> n{};", a.index(), b.index());
            }
        }
        out.push_str("}\n");
        out
    }
}

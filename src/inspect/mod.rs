//! `inspect`: what a run's logs hold, checked record by record.
//!
//! Every segment of every vnode is read and checked (`log/mod.rs` rule 4): a corrupt segment is
//! an error naming vnode, segment and byte; a torn last segment is reported. Every task record
//! must name a registered task whose arguments decode, or it is an error naming the record.
//! What the logs say happened over time (tasks, steals, recoveries) is the [`Timeline`]
//! (`timeline.rs`); `dot.rs` and `html.rs` draw it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use serde::Serialize;
use serde_json::json;
use veriflow_certifier::Certificate;
use veriflow_checkpoint::Store;
use veriflow_runtime::graph::FlowGraph;
use veriflow_runtime::log::{Event, EventKind, LogReader, Manifest};
use veriflow_runtime::{DataId, Registry, RunError, VnodeId};

mod dot;
mod html;
pub mod timeline;

pub use dot::DOT_MAX_TASKS;
pub use html::{HtmlLimits, HTML_LIMITS};
use timeline::Timeline;

/// One vnode's log, summarised.
#[derive(Clone, Debug, Serialize)]
pub struct VnodeSummary {
    /// The vnode.
    pub vnode: VnodeId,
    /// Segments stored.
    pub segments: u64,
    /// Distinct events.
    pub events: u64,
    /// Durable watermark (highest durable event sequence number).
    pub durable_seq: u64,
    /// Duplicate events dropped on reading.
    pub duplicates: u64,
    /// A torn last segment, if any.
    pub torn: Option<String>,
    /// Events by kind.
    pub kinds: BTreeMap<String, u64>,
}

/// A terminal output as found in the logs.
#[derive(Clone, Debug, Serialize)]
pub struct TerminalValue {
    /// Its id.
    pub id: DataId,
    /// Its value, decoded with the root task's output type.
    pub value: Option<String>,
    /// Its digest.
    pub digest: Option<String>,
    /// The vnode whose log holds it.
    pub vnode: Option<VnodeId>,
}

/// What `inspect` found.
#[derive(Debug)]
pub struct Inspection {
    /// The run manifest.
    pub manifest: Manifest,
    /// Per vnode.
    pub vnodes: Vec<VnodeSummary>,
    /// The terminal outputs.
    pub terminal: Vec<TerminalValue>,
    /// G.
    pub graph: FlowGraph,
    /// What happened on each vnode, in log order.
    pub timeline: Timeline,
}

/// Reads and checks every log in `store`.
pub fn inspect(store: Arc<dyn Store>, registry: &Registry) -> Result<Inspection, RunError> {
    let reader = LogReader::latest(store)?;
    let manifest = reader.manifest()?;
    let logs = reader.read_all()?;
    let mut vnodes = Vec::with_capacity(logs.len());
    let mut terminal: Vec<TerminalValue> = manifest
        .terminal
        .iter()
        .map(|&id| TerminalValue {
            id,
            value: None,
            digest: None,
            vnode: None,
        })
        .collect();
    let root_kind = registry.get(&manifest.root_name).copied();
    for log in &logs {
        let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
        for e in &log.events {
            *kinds.entry(format!("{:?}", e.event.kind())).or_default() += 1;
            let record = match &e.event {
                Event::Declared(d) => Some(d),
                Event::Adopted { record, .. } => Some(record),
                _ => None,
            };
            if let Some(r) = record {
                let place = || {
                    format!(
                        "the {:?} record of task {:#} (log of {}, segment {}, byte {})",
                        e.event.kind(),
                        r.task,
                        log.vnode,
                        e.segment,
                        e.offset
                    )
                };
                let kind = registry
                    .get(&r.name)
                    .ok_or_else(|| RunError::UnknownTaskName {
                        name: r.name.to_string(),
                        context: place(),
                    })?;
                // Large arguments are read from the log's value store (and checked).
                let args =
                    veriflow_runtime::log::values::resolve(&**reader.store(), r.args.clone())?;
                kind.check_args(&args)
                    .map_err(|err| RunError::InputDecode {
                        task: r.name.to_string(),
                        id: r.task,
                        input: usize::MAX,
                        reason: format!("arguments in {} do not decode: {err}", place()),
                    })?;
            }
            let outputs = match &e.event {
                Event::Completed { outputs, .. } => outputs.as_slice(),
                Event::Returned { output } | Event::Input { output } => {
                    std::slice::from_ref(output)
                }
                _ => &[],
            };
            for o in outputs {
                if let Some(i) = manifest.terminal.iter().position(|&t| t == o.data) {
                    let t = &mut terminal[i];
                    if t.value.is_none() {
                        // A large output is read from the log's value store (and checked).
                        let bytes = veriflow_runtime::log::values::resolve(
                            &**reader.store(),
                            o.value.clone(),
                        )?;
                        t.value = root_kind.and_then(|k| k.debug_output(i, &bytes));
                        t.digest = Some(o.digest.to_hex());
                        t.vnode = Some(log.vnode);
                    }
                }
            }
        }
        vnodes.push(VnodeSummary {
            vnode: log.vnode,
            segments: log.segments,
            events: log.events.len() as u64,
            durable_seq: log.durable_seq,
            duplicates: log.duplicates,
            torn: log
                .torn
                .as_ref()
                .map(|t| format!("segment {}: {}", t.segment, t.reason)),
            kinds,
        });
    }
    let graph = FlowGraph::from_logs(&logs);
    let timeline = Timeline::from_logs(&logs);
    Ok(Inspection {
        manifest,
        vnodes,
        terminal,
        graph,
        timeline,
    })
}

fn total(vnodes: &[VnodeSummary], kind: EventKind) -> u64 {
    let k = format!("{kind:?}");
    vnodes
        .iter()
        .map(|v| v.kinds.get(&k).copied().unwrap_or(0))
        .sum()
}

impl Inspection {
    /// Tasks declared, started and completed over all vnodes.
    pub fn task_counts(&self) -> (u64, u64, u64) {
        (
            total(&self.vnodes, EventKind::Declared),
            total(&self.vnodes, EventKind::Started),
            total(&self.vnodes, EventKind::Completed),
        )
    }

    /// As one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let (declared, started, completed) = self.task_counts();
        let m = &self.manifest;
        json!({
            "program": m.program,
            "status": format!("{:?}", m.status),
            "root": format!("{:#}", m.root),
            "root_name": m.root_name,
            "vnodes_configured": m.vnodes,
            "seed": m.seed,
            "generation": m.generation,
            "tasks": { "declared": declared, "started": started, "completed": completed },
            "events": self.vnodes.iter().map(|v| v.events).sum::<u64>(),
            "graph": { "tasks": self.graph.task_count(), "data": self.graph.data_count() },
            "timeline": self.timeline.counts(),
            "vnodes": self.vnodes,
            "terminal": self.terminal.iter().map(|t| json!({
                "id": format!("{:#}", t.id),
                "value": t.value,
                "digest": t.digest,
                "vnode": t.vnode,
            })).collect::<Vec<_>>(),
        })
    }

    /// G in graphviz's dot language, with spawn edges, tasks coloured by the vnode that ran
    /// them and what `certificate` says of them; summarised per vnode and spawn depth above
    /// `max_tasks` tasks (`inspect/dot.rs`; `inspect --dot` uses [`DOT_MAX_TASKS`]).
    pub fn to_dot(&self, certificate: Option<&Certificate>, max_tasks: usize) -> String {
        dot::to_dot(self, certificate, max_tasks)
    }

    /// A self-contained HTML report: the task stream per vnode, failures and recoveries, the
    /// graph of a small run and `certificate` (with the file it came from) if given
    /// (`inspect/html.rs`; `inspect --html` uses [`HTML_LIMITS`]).
    pub fn to_html(
        &self,
        certificate: Option<(&Certificate, &str)>,
        limits: &HtmlLimits,
    ) -> String {
        html::to_html(self, certificate, limits)
    }

    /// As a human summary.
    pub fn to_text(&self) -> String {
        let m = &self.manifest;
        let (declared, started, completed) = self.task_counts();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "run: {}  root {} ({})  status: {:?}  vnodes: {}  seed: {}",
            m.program, m.root, m.root_name, m.status, m.vnodes, m.seed
        );
        if m.generation > 0 {
            let _ = writeln!(
                s,
                "log generation {} (written by the certifier's correction; the run's own log \
                 is generation 0)",
                m.generation
            );
        }
        let _ = writeln!(
            s,
            "tasks: {declared} declared, {started} started, {completed} completed"
        );
        let c = self.timeline.counts();
        let _ = writeln!(
            s,
            "stolen: {}  recovered by a new incarnation: {}  started, never completed: {}  new \
             incarnations: {}",
            c.stolen, c.recovered, c.incomplete, c.incarnations
        );
        let _ = writeln!(
            s,
            "{:<6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>5}  torn",
            "vnode",
            "segments",
            "events",
            "durable",
            "declared",
            "started",
            "completed",
            "stolen",
            "adopted",
            "returned",
            "dups"
        );
        for v in &self.vnodes {
            let k = |kind: EventKind| v.kinds.get(&format!("{kind:?}")).copied().unwrap_or(0);
            let _ = writeln!(
                s,
                "{:<6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>5}  {}",
                v.vnode.to_string(),
                v.segments,
                v.events,
                v.durable_seq,
                k(EventKind::Declared),
                k(EventKind::Started),
                k(EventKind::Completed),
                k(EventKind::Stolen),
                k(EventKind::Adopted),
                k(EventKind::Returned),
                v.duplicates,
                v.torn.as_deref().unwrap_or("-"),
            );
        }
        let _ = writeln!(s, "terminal outputs:");
        for t in &self.terminal {
            let _ = writeln!(
                s,
                "  {:#} = {}  (digest {}, on {})",
                t.id,
                t.value.as_deref().unwrap_or("<not in the logs>"),
                t.digest.as_deref().map_or("-", |d| &d[..16]),
                t.vnode.map_or("-".to_string(), |v| v.to_string()),
            );
        }
        s
    }
}

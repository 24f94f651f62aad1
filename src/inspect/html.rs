//! `inspect --html FILE`: one self-contained page that shows a finished run.
//!
//! Rules:
//!
//! 1. **Self-contained.** CSS, SVG and the little JavaScript there is are inline: the page
//!    fetches nothing, so it opens from a file, offline, years later.
//! 2. **Task stream** (Dask's): one row per vnode, its clock the place of events in its own log
//!    (`timeline.rs` rule 1: the log records no clock time). Up to [`HtmlLimits::bars`] tasks, one
//!    bar per task from its `Started` to its `Completed` event, in lanes where bars overlap;
//!    stolen tasks (run by their thief), tasks recovered by a new incarnation and tasks that never
//!    completed have colours of their own, explained in a legend; steals, restarts, new
//!    incarnations and a torn tail are marks on the row.
//! 3. **Large runs are binned**, so the page stays small whatever the run: above
//!    [`HtmlLimits::bars`] tasks each row is cut into bins (at most [`HtmlLimits::cells`] bins over
//!    all rows), a bin's shade is the number of tasks that started in it, with a stripe for
//!    stolen and one for recovered tasks. At most 3 SVG elements of ≤ 150 bytes per bin, and the
//!    failure list is capped at [`MAX_LISTED`] entries: with the default limits the page is
//!    under 5 MB for any number of tasks (measured: see the report's tests).
//! 4. **Failures and recovery**: the restarts, incarnations, torn tails and tasks that never
//!    completed (`timeline.rs` rules 3-4), listed with the vnode and the place in its log.
//! 5. **The graph**, up to [`HtmlLimits::graph_tasks`] tasks, laid out by layout-rs (a pure-Rust
//!    port of graphviz's dot layout): tasks coloured by the vnode that ran them, spawn edges
//!    dashed, data edges (writer → reader) solid; above it, a sentence pointing to `--dot`.
//!    A layout that fails (a panic inside the crate) leaves that sentence instead of the
//!    picture, never a failed report.
//! 6. **The certificate**, when one is given: its verdict and parameters, the tasks the oracle
//!    checked and what it found. The page does not verify the signature (`certify --verify`
//!    does) and says so.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use petgraph::visit::EdgeRef;
use veriflow_certifier::Certificate;
use veriflow_runtime::graph::{Edge, Vertex};
use veriflow_runtime::{IdMap, VnodeId};

use super::dot::{task_facts, vnode_colour, CertMarks};
use super::timeline::{MarkKind, Span, VnodeTimeline};
use super::Inspection;

/// How much the page draws one by one before it summarises (rules 3 and 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HtmlLimits {
    /// Most task bars; above, the stream is binned.
    pub bars: usize,
    /// Most bins over all rows of a binned stream.
    pub cells: usize,
    /// Most tasks in a drawn graph.
    pub graph_tasks: usize,
}

/// The limits `inspect --html` uses: 10,000 bars of ~200 bytes (2 MB), 16,000 bins of at
/// most ~300 bytes (under 5 MB); layout-rs lays out 300 tasks in about a second.
pub const HTML_LIMITS: HtmlLimits = HtmlLimits {
    bars: 10_000,
    cells: 16_000,
    graph_tasks: 300,
};

/// Most failure points listed one by one (rule 3).
pub(crate) const MAX_LISTED: usize = 200;

/// Most lanes a row splits into where bars overlap; more overlapping bars share the last.
const MAX_LANES: usize = 6;

const STREAM_LEFT: f64 = 70.0;
const STREAM_WIDTH: f64 = 1000.0;
const LANE: f64 = 11.0;

const COLOUR_TASK: &str = "#3b82c4";
const COLOUR_STOLEN: &str = "#8b5cf6";
const COLOUR_REDONE: &str = "#dd6b20";
const COLOUR_OPEN: &str = "#e53e3e";

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f7f7f8;color:#222}
main{max-width:1180px;margin:0 auto;padding:16px 24px}
h1{font-size:22px;margin:8px 0}h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #ddd}
section{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:10px 16px;margin:12px 0}
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;font-variant-numeric:tabular-nums}
th{font-weight:600;color:#555}.note{color:#666;font-size:12px}
.accept{color:#fff;background:#2f855a;padding:2px 8px;border-radius:4px;font-weight:700}
.reject{color:#fff;background:#c53030;padding:2px 8px;border-radius:4px;font-weight:700}
svg text{font:11px system-ui,sans-serif}
#graph-box{overflow:auto;max-height:900px;border:1px solid #eee}
#info{position:fixed;right:12px;bottom:12px;background:#fff;border:1px solid #aaa;padding:6px 10px;
font-size:12px;display:none;max-width:420px}
rect.task:hover,rect.bin:hover{stroke:#000;stroke-width:1}
";

/// The page (rules 1-6).
pub(crate) fn to_html(
    ins: &Inspection,
    cert: Option<(&Certificate, &str)>,
    limits: &HtmlLimits,
) -> String {
    let m = &ins.manifest;
    let mut out = String::with_capacity(64 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>veriflow run: {}</title>\n\
         <script>window.veriflowErrors=[];window.addEventListener('error',function(e){{\
         window.veriflowErrors.push(String(e.message));}});</script>\n<style>{STYLE}</style>\
         </head>\n<body>\n<main>\n",
        esc(&m.program)
    );
    let _ = writeln!(
        out,
        "<h1>{} run: root {} ({})</h1>\n<p class=\"note\">status {:?} · {} vnodes · seed {} · \
         log generation {}</p>",
        esc(&m.program),
        m.root,
        esc(&m.root_name),
        m.status,
        m.vnodes,
        m.seed,
        m.generation
    );
    summary(&mut out, ins);
    stream(&mut out, ins, limits);
    failures(&mut out, ins);
    graph(&mut out, ins, cert.map(|c| c.0), limits);
    certificate(&mut out, cert);
    out.push_str(
        "<div id=\"info\"></div>\n</main>\n<script>\n\
         (function(){var info=document.getElementById('info');\
         document.querySelectorAll('rect.task,rect.bin').forEach(function(r){\
         r.addEventListener('click',function(){var t=r.querySelector('title');\
         info.textContent=t?t.textContent:'';info.style.display='block';});});\
         document.body.dataset.ready='1';})();\n</script>\n</body></html>\n",
    );
    out
}

fn summary(out: &mut String, ins: &Inspection) {
    let (declared, started, completed) = ins.task_counts();
    let c = ins.timeline.counts();
    let events: u64 = ins.vnodes.iter().map(|v| v.events).sum();
    let segments: u64 = ins.vnodes.iter().map(|v| v.segments).sum();
    let dups: u64 = ins.vnodes.iter().map(|v| v.duplicates).sum();
    let torn = ins.vnodes.iter().filter(|v| v.torn.is_some()).count();
    out.push_str("<section id=\"summary\"><h2>Summary</h2><table>\n");
    let rows: [(&str, String); 11] = [
        (
            "tasks",
            format!("{declared} declared, {started} started, {completed} completed"),
        ),
        (
            "graph",
            format!(
                "{} tasks, {} data objects",
                ins.graph.task_count(),
                ins.graph.data_count()
            ),
        ),
        ("events", format!("{events} in {segments} segments")),
        ("stolen tasks", c.stolen.to_string()),
        (
            "tasks recovered from the log (run by a new incarnation)",
            c.recovered.to_string(),
        ),
        ("events logged again (dropped)", dups.to_string()),
        ("tasks started, never completed", c.incomplete.to_string()),
        ("new incarnations (recoveries)", c.incarnations.to_string()),
        ("torn log tails", torn.to_string()),
        ("vnodes with a log", ins.vnodes.len().to_string()),
        (
            "terminal outputs",
            ins.terminal
                .iter()
                .map(|t| {
                    format!(
                        "{} = {}",
                        t.id,
                        t.value.as_deref().unwrap_or("(not logged)")
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(out, "<tr><th>{k}</th><td>{}</td></tr>", esc(&v));
    }
    out.push_str("</table></section>\n");
}

/// Where `at` (a place in a log) is drawn.
fn x_of(at: u64, max: u64) -> f64 {
    STREAM_LEFT + at as f64 * STREAM_WIDTH / max.max(1) as f64
}

/// Lane of each span, in `spans` order, and how many lanes (rule 2).
fn lanes(spans: &[Span], events: u64) -> (Vec<usize>, usize) {
    let mut ends: Vec<u64> = Vec::new();
    let mut out = Vec::with_capacity(spans.len());
    for s in spans {
        let end = s.end.unwrap_or(events);
        let lane = match ends.iter().position(|&e| e <= s.start) {
            Some(l) => l,
            None if ends.len() < MAX_LANES => {
                ends.push(0);
                ends.len() - 1
            }
            None => (0..ends.len()).min_by_key(|&l| ends[l]).unwrap_or(0),
        };
        ends[lane] = ends[lane].max(end.max(s.start + 1));
        out.push(lane);
    }
    let n = ends.len().max(1);
    (out, n)
}

fn legend(out: &mut String) {
    out.push_str("<svg id=\"stream-legend\" width=\"1110\" height=\"22\">");
    let items = [
        (COLOUR_TASK, "task (Started → Completed)"),
        (COLOUR_STOLEN, "stolen: run by its thief"),
        (COLOUR_REDONE, "recovered: run by a new incarnation"),
        (COLOUR_OPEN, "started, never completed"),
    ];
    let mut x = 4.0;
    for (c, label) in items {
        let _ = write!(
            out,
            "<rect x=\"{x}\" y=\"5\" width=\"14\" height=\"10\" fill=\"{c}\"/>\
             <text x=\"{}\" y=\"14\">{label}</text>",
            x + 18.0
        );
        x += 30.0 + 6.2 * label.chars().count() as f64;
    }
    let _ = write!(
        out,
        "<path d=\"M{x} 4 l5 8 l5 -8z\" fill=\"#555\"/><text x=\"{}\" y=\"14\">steal (victim)</text>",
        x + 14.0
    );
    out.push_str("</svg>\n");
}

fn stream(out: &mut String, ins: &Inspection, limits: &HtmlLimits) {
    let rows = &ins.timeline.vnodes;
    let bars: usize = rows.iter().map(|r| r.spans.len()).sum();
    let max = rows.iter().map(|r| r.events).max().unwrap_or(0).max(1);
    let binned = bars > limits.bars;
    let _ = writeln!(
        out,
        "<section id=\"stream\"><h2>Task stream</h2><p class=\"note\">One row per vnode. The \
         log records no clock time: a row's clock is the place of events in that vnode's own \
         log (0 … {max}), so rows are not aligned in time. {}</p>",
        if binned {
            format!(
                "{bars} tasks: more than {}, so each row is cut into bins whose shade is the \
                 number of tasks that started in them.",
                limits.bars
            )
        } else {
            format!("{bars} tasks, one bar each; click a bar for its task.")
        }
    );
    legend(out);
    let mut body = String::new();
    let mut y = 22.0;
    for row in rows {
        let h = if binned {
            binned_row(&mut body, row, max, y, limits.cells / rows.len().max(1))
        } else {
            bar_row(&mut body, row, max, y)
        };
        y += h + 6.0;
    }
    let height = y + 4.0;
    let _ = writeln!(
        out,
        "<svg id=\"stream-svg\" width=\"{}\" height=\"{height}\" data-mode=\"{}\">",
        STREAM_LEFT + STREAM_WIDTH + 40.0,
        if binned { "bins" } else { "bars" }
    );
    for k in 0..=4u64 {
        let at = max * k / 4;
        let x = x_of(at, max);
        let _ = writeln!(
            out,
            "<line x1=\"{x}\" y1=\"16\" x2=\"{x}\" y2=\"{height}\" stroke=\"#eee\"/>\
             <text x=\"{x}\" y=\"12\" text-anchor=\"middle\">event {at}</text>"
        );
    }
    out.push_str(&body);
    out.push_str("</svg></section>\n");
}

fn span_class(s: &Span) -> (&'static str, &'static str) {
    if s.end.is_none() {
        ("task open", COLOUR_OPEN)
    } else if s.recovered {
        ("task redone", COLOUR_REDONE)
    } else if s.adopted {
        ("task stolen", COLOUR_STOLEN)
    } else {
        ("task", COLOUR_TASK)
    }
}

fn row_head(out: &mut String, row: &VnodeTimeline, max: u64, y: f64, h: f64) {
    let _ = writeln!(
        out,
        "<g class=\"row\" data-vnode=\"{}\"><rect x=\"{STREAM_LEFT}\" y=\"{y}\" width=\"{}\" \
         height=\"{h}\" fill=\"{}\" fill-opacity=\"0.18\"/><text x=\"4\" y=\"{}\">{}</text>",
        row.vnode,
        (x_of(row.events, max) - STREAM_LEFT).max(1.0),
        vnode_colour(row.vnode),
        y + h / 2.0 + 4.0,
        row.vnode
    );
}

fn bar_row(out: &mut String, row: &VnodeTimeline, max: u64, y: f64) -> f64 {
    let (lane, n) = lanes(&row.spans, row.events);
    let h = n as f64 * LANE + 4.0;
    row_head(out, row, max, y, h);
    for (s, &l) in row.spans.iter().zip(&lane) {
        let (class, fill) = span_class(s);
        let end = s.end.unwrap_or(row.events);
        let x = x_of(s.start, max);
        let w = (x_of(end, max) - x).max(1.5);
        let _ = writeln!(
            out,
            "<rect class=\"{class}\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{}\" \
             fill=\"{fill}\"><title>{} {} on {}: events {}–{}{}{}</title></rect>",
            y + 2.0 + l as f64 * LANE,
            LANE - 1.0,
            esc(&s.name),
            s.task,
            row.vnode,
            s.start,
            s.end
                .map_or("never completed".to_string(), |e| e.to_string()),
            if s.adopted { ", stolen" } else { "" },
            match (s.recovered, s.restarts) {
                (_, r) if r > 0 => format!(", started {} times (recovered)", r + 1),
                (true, _) => ", recovered from the log by a new incarnation".to_string(),
                _ => String::new(),
            },
        );
    }
    marks(out, row, max, y, h, true);
    out.push_str("</g>\n");
    h
}

fn marks(out: &mut String, row: &VnodeTimeline, max: u64, y: f64, h: f64, each: bool) {
    for m in &row.marks {
        let x = x_of(m.at, max);
        match m.kind {
            MarkKind::Stolen { thief } if each => {
                let _ = writeln!(
                    out,
                    "<path class=\"mark stolen\" d=\"M{:.1} {y} l3 5 l3 -5z\" fill=\"#555\">\
                     <title>{} stolen by {thief} (event {})</title></path>",
                    x - 3.0,
                    m.task.map_or(String::new(), |t| t.to_string()),
                    m.at
                );
            }
            MarkKind::Restart if each => {
                let _ = writeln!(
                    out,
                    "<line class=\"mark restart\" x1=\"{x:.1}\" y1=\"{y}\" x2=\"{x:.1}\" \
                     y2=\"{}\" stroke=\"{COLOUR_REDONE}\" stroke-width=\"2\"><title>{} started \
                     again after a recovery (event {})</title></line>",
                    y + h,
                    m.task.map_or(String::new(), |t| t.to_string()),
                    m.at
                );
            }
            MarkKind::Incarnation { epoch } => {
                let _ = writeln!(
                    out,
                    "<line class=\"mark epoch\" x1=\"{x:.1}\" y1=\"{}\" x2=\"{x:.1}\" y2=\"{}\" \
                     stroke=\"#000\" stroke-dasharray=\"3 2\"><title>incarnation at epoch \
                     {epoch} begins (event {})</title></line>\
                     <text x=\"{:.1}\" y=\"{}\" font-size=\"9\">e{epoch}</text>",
                    y - 2.0,
                    y + h + 2.0,
                    m.at,
                    x + 2.0,
                    y + 8.0
                );
            }
            MarkKind::Torn => {
                let _ = writeln!(
                    out,
                    "<path class=\"mark torn\" d=\"M{:.1} {:.1} l8 8 m0 -8 l-8 8\" \
                     stroke=\"{COLOUR_OPEN}\" stroke-width=\"2\"><title>torn last segment \
                     (event {})</title></path>",
                    x - 4.0,
                    y + h / 2.0 - 4.0,
                    m.at
                );
            }
            _ => {}
        }
    }
}

fn binned_row(out: &mut String, row: &VnodeTimeline, max: u64, y: f64, bins: usize) -> f64 {
    let bins = bins.clamp(1, 400) as u64;
    let h = 3.0 * LANE;
    row_head(out, row, max, y, h);
    let width = max.div_ceil(bins).max(1);
    // per bin: started, stolen, recovered, never completed
    let mut count: BTreeMap<u64, [u64; 4]> = BTreeMap::new();
    for s in &row.spans {
        let c = count.entry(s.start / width).or_default();
        c[0] += 1;
        c[1] += u64::from(s.adopted);
        c[2] += u64::from(s.recovered);
        c[3] += u64::from(s.end.is_none());
    }
    let top = count.values().map(|c| c[0]).max().unwrap_or(1).max(1);
    for (&b, c) in &count {
        let x = x_of(b * width, max);
        let w = (x_of((b + 1) * width, max) - x).max(1.0);
        let _ = write!(
            out,
            "<rect class=\"bin\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{h}\" \
             fill=\"{COLOUR_TASK}\" fill-opacity=\"{:.2}\"><title>events {}–{}: {} started, {} \
             stolen, {} recovered, {} never completed</title></rect>",
            y,
            0.15 + 0.85 * c[0] as f64 / top as f64,
            b * width,
            (b + 1) * width,
            c[0],
            c[1],
            c[2],
            c[3]
        );
        if c[1] > 0 {
            let _ = write!(
                out,
                "<rect class=\"bin-stolen\" x=\"{x:.1}\" y=\"{y}\" width=\"{w:.1}\" \
                 height=\"3\" fill=\"{COLOUR_STOLEN}\"/>"
            );
        }
        if c[2] + c[3] > 0 {
            let _ = write!(
                out,
                "<rect class=\"bin-redone\" x=\"{x:.1}\" y=\"{}\" width=\"{w:.1}\" \
                 height=\"3\" fill=\"{}\"/>",
                y + h - 3.0,
                if c[3] > 0 { COLOUR_OPEN } else { COLOUR_REDONE }
            );
        }
        out.push('\n');
    }
    marks(out, row, max, y, h, false);
    out.push_str("</g>\n");
    h
}

fn failures(out: &mut String, ins: &Inspection) {
    let mut items: Vec<String> = Vec::new();
    let mut more = 0usize;
    let mut push = |s: String| {
        if items.len() < MAX_LISTED {
            items.push(s);
        } else {
            more += 1;
        }
    };
    for row in &ins.timeline.vnodes {
        for m in &row.marks {
            let task = m.task.map_or(String::new(), |t| t.to_string());
            match m.kind {
                MarkKind::Restart => push(format!(
                    "<li class=\"restart\">{}: task {task} started again at event {} (its \
                     vnode was recovered from its log)</li>",
                    row.vnode, m.at
                )),
                MarkKind::Incarnation { epoch } => push(format!(
                    "<li class=\"epoch\">{}: incarnation at epoch {epoch} writes from event {} \
                     on (the previous one was lost)</li>",
                    row.vnode, m.at
                )),
                MarkKind::Torn => push(format!(
                    "<li class=\"torn\">{}: the last segment was torn at event {} (a crash \
                     mid-write); it was skipped</li>",
                    row.vnode, m.at
                )),
                MarkKind::Stolen { .. } => {}
            }
        }
        for s in row.spans.iter().filter(|s| s.end.is_none()) {
            push(format!(
                "<li class=\"open\">{}: task {} ({}) started at event {} and never completed</li>",
                row.vnode,
                s.task,
                esc(&s.name),
                s.start
            ));
        }
    }
    out.push_str("<section id=\"failures\"><h2>Failures and recovery</h2>\n");
    if items.is_empty() {
        out.push_str(
            "<p>None in the log: no vnode was recovered, every task that started completed, no log \
             was torn.</p>\n",
        );
    } else {
        out.push_str("<ul>\n");
        for i in &items {
            out.push_str(i);
            out.push('\n');
        }
        out.push_str("</ul>\n");
        if more > 0 {
            let _ = writeln!(out, "<p class=\"note\">… and {more} more.</p>");
        }
    }
    out.push_str("</section>\n");
}

fn graph(out: &mut String, ins: &Inspection, cert: Option<&Certificate>, limits: &HtmlLimits) {
    let n = ins.graph.task_count();
    out.push_str("<section id=\"graph\"><h2>Graph</h2>\n");
    if n > limits.graph_tasks {
        let _ = writeln!(
            out,
            "<p>{n} tasks: more than {} are not drawn here. <code>inspect --dot FILE</code> \
             writes the graph for graphviz (summarised per vnode and depth above {} tasks).</p>",
            limits.graph_tasks,
            super::dot::DOT_MAX_TASKS
        );
    } else {
        let marks = CertMarks::of(cert);
        let laid_out =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| layout_svg(ins, &marks)));
        match laid_out {
            Ok(svg) => {
                let _ = writeln!(
                    out,
                    "<p class=\"note\">{n} tasks, coloured by the vnode that ran them; dashed \
                     blue: spawns (parent → child); black: data (writer → reader); orange \
                     border: recovered by a new incarnation; red border: forged; thick black: checked \
                     by the oracle.</p><div id=\"graph-box\">{svg}</div>"
                );
            }
            Err(_) => {
                out.push_str(
                    "<p>The layout library failed on this graph: use <code>inspect --dot \
                     FILE</code> and graphviz.</p>\n",
                );
            }
        }
    }
    out.push_str("</section>\n");
}

/// The graph of tasks laid out by layout-rs (rule 5), as an inline `<svg>`.
fn layout_svg(ins: &Inspection, marks: &CertMarks) -> String {
    use layout::backends::svg::SVGWriter;
    use layout::core::base::Orientation;
    use layout::core::color::Color;
    use layout::core::style::{LineStyleKind, StyleAttr};
    use layout::std_shapes::render::get_shape_size;
    use layout::std_shapes::shapes::{Arrow, Element, LineEndKind, ShapeKind};
    use layout::topo::layout::VisualGraph;

    let (ran_on, restarted) = task_facts(ins);
    let g = &ins.graph.graph;
    let dir = Orientation::TopToBottom;
    let mut vg = VisualGraph::new(dir);
    let mut handles = IdMap::default();
    let colour = |hex: &str| {
        let rgb = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap_or(0xcc_cccc);
        Color::new((rgb << 8) | 0xff)
    };
    for i in g.node_indices() {
        if let Vertex::Task {
            id, name, vnode, ..
        } = &g[i]
        {
            let ran = ran_on.get(id).copied().unwrap_or(*vnode);
            // The name without its program prefix, and the short id.
            let short = format!("{id}");
            let name = name.rsplit('.').next().unwrap_or(name);
            let label = format!(
                "{name} {}",
                &short.trim_start_matches("t:")[..6.min(short.len() - 2)]
            );
            let shape = ShapeKind::new_box(&label);
            let (line, width) = if marks.forged.contains(id) {
                ("#e53e3e", 3)
            } else if restarted.contains(id) {
                (COLOUR_REDONE, 3)
            } else if marks.checked.contains(id) {
                ("#000000", 3)
            } else {
                ("#555555", 1)
            };
            let look = StyleAttr::new(colour(line), width, Some(colour(vnode_colour(ran))), 4, 11);
            let size = get_shape_size(dir, &shape, 11, false);
            let mut e = Element::create(shape, look, dir, size);
            e.properties = Some(format!(
                "class=\"gtask\" data-task=\"{id:#}\" data-vnode=\"{ran}\""
            ));
            handles.insert(*id, vg.add_node(e));
        }
    }
    let arrow = |style: LineStyleKind, hex: &str| {
        Arrow::new(
            LineEndKind::None,
            LineEndKind::Arrow,
            style,
            "",
            &StyleAttr::new(colour(hex), 1, None, 0, 9),
            &None,
            &None,
        )
    };
    for &(p, c) in &ins.timeline.spawns {
        if let (Some(&a), Some(&b)) = (handles.get(&p), handles.get(&c)) {
            vg.add_edge(arrow(LineStyleKind::Dashed, "#2b6cb0"), a, b);
        }
    }
    // Data edges, contracted: writer → reader for each datum.
    let task_id = |n| match &g[n] {
        Vertex::Task { id, .. } => Some(*id),
        Vertex::Data { .. } => None,
    };
    for d in g.node_indices() {
        if !matches!(g[d], Vertex::Data { .. }) {
            continue;
        }
        for w in g
            .edges_directed(d, petgraph::Direction::Incoming)
            .filter(|e| *e.weight() == Edge::Writes)
            .filter_map(|e| task_id(e.source()))
        {
            for r in g
                .edges_directed(d, petgraph::Direction::Outgoing)
                .filter_map(|e| task_id(e.target()))
            {
                if let (Some(&a), Some(&b)) = (handles.get(&w), handles.get(&r)) {
                    vg.add_edge(arrow(LineStyleKind::Normal, "#222222"), a, b);
                }
            }
        }
    }
    let mut svg = SVGWriter::new();
    vg.do_it(false, false, false, &mut svg);
    let text = svg.finalize();
    // Inline: without the XML declaration; drawn to fit the page's width, but never below 60 %
    // of its size, where the labels would no longer read (the box scrolls instead).
    let text = text.find("<svg").map_or(text.as_str(), |i| &text[i..]);
    let attr = |name: &str| -> Option<f64> {
        let from = text.find(&format!(" {name}=\""))? + name.len() + 3;
        text[from..].split('"').next()?.parse().ok()
    };
    let scaled = match (attr("width"), attr("height")) {
        (Some(w), Some(h)) if w > 0.0 => {
            let k = (1100.0 / w).clamp(0.6, 1.0);
            format!("width=\"{:.0}\" height=\"{:.0}\"", w * k, h * k)
        }
        _ => String::new(),
    };
    let rest = text
        .find(" viewBox=")
        .map_or(text.trim_start_matches("<svg"), |i| &text[i..]);
    format!("<svg id=\"graph-svg\" {scaled}{rest}")
}

fn certificate(out: &mut String, cert: Option<(&Certificate, &str)>) {
    out.push_str("<section id=\"certificate\"><h2>Certificate</h2>\n");
    let Some((c, path)) = cert else {
        out.push_str(
            "<p>None given. <code>certify --out CERT</code> writes one; <code>inspect --html \
             FILE --certificate CERT</code> shows it here.</p></section>\n",
        );
        return;
    };
    let class = match c.decision {
        veriflow_certifier::Decision::Accept => "accept",
        veriflow_certifier::Decision::Reject => "reject",
    };
    let _ = writeln!(
        out,
        "<p><span class=\"{class}\" id=\"verdict\">{}</span> {} (format {}, generation {}, \
         signed with {}). <span class=\"note\">Shown, not verified: <code>certify --verify {} \
         --public-key PUB</code> checks its signature and that it is this log's.</span></p>",
        c.decision,
        esc(path),
        esc(&c.format),
        c.generation,
        esc(c.signature_scheme.as_deref().unwrap_or("a MAC (format 1)")),
        esc(path)
    );
    let _ = writeln!(
        out,
        "<table><tr><th>ε</th><td>{}</td><th>q</th><td>{}</td><th>n (tasks in G_S)</th>\
         <td>{}</td><th>k (checks)</th><td>{}</td></tr>\n<tr><th>checked</th><td>{}</td>\
         <th>q̂</th><td>{:.3e}</td><th>seed</th><td>{} ({})</td><th>full</th><td>{}</td></tr>\
         </table>",
        c.epsilon,
        c.q,
        c.n,
        c.k,
        c.checked.len(),
        c.q_hat,
        c.seed,
        esc(&c.seed_source),
        c.full
    );
    if !c.detections.is_empty() || !c.structural.is_empty() {
        out.push_str("<p>Found:</p><ul>\n");
        for d in &c.detections {
            let _ = writeln!(
                out,
                "<li class=\"forged\">forged: {} ({}) on {}: {}</li>",
                esc(&d.task),
                esc(&d.name),
                d.vnode.map_or("?".to_string(), |v| VnodeId(v).to_string()),
                esc(&d.reason)
            );
        }
        for s in &c.structural {
            let _ = writeln!(
                out,
                "<li class=\"structural\">{}</li>",
                esc(&format!("{s:?}"))
            );
        }
        out.push_str("</ul>\n");
    }
    for r in &c.corrections {
        let _ = writeln!(
            out,
            "<p>Correction to generation {}: {} forged, {} tasks invalidated, {} re-run by the \
             oracle.</p>",
            r.generation,
            r.detected.len(),
            r.invalidated,
            r.re_executed
        );
    }
    out.push_str("</section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: u64, end: Option<u64>) -> Span {
        Span {
            task: veriflow_runtime::TaskId(start as u128),
            name: String::new(),
            start,
            end,
            adopted: false,
            restarts: 0,
            recovered: false,
        }
    }

    #[test]
    fn overlapping_bars_get_lanes_and_disjoint_ones_share() {
        let spans = [
            span(0, Some(10)),
            span(2, Some(4)),
            span(5, Some(9)),
            span(11, Some(12)),
        ];
        let (l, n) = lanes(&spans, 20);
        assert_eq!(l, vec![0, 1, 1, 0]);
        assert_eq!(n, 2);
    }

    #[test]
    fn lanes_are_capped() {
        let spans: Vec<Span> = (0..20).map(|i| span(i, None)).collect();
        let (l, n) = lanes(&spans, 100);
        assert_eq!(n, MAX_LANES);
        assert!(l.iter().all(|&x| x < MAX_LANES));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}

//! `paper netns`: S0 / S1 / S2 of knary in cluster mode across hosts with a real network
//! (issue 16.3), at several one-way latencies.
//!
//! ```text
//! cargo run --release -p veriflow-bench --bin paper -- netns [--runs N] [--quick]
//!     [--latencies MS,...] [--loss P] [--workers W] [--spares S] [--depth D] [--fanout F]
//!     [--grain-us G] [--knary-bin PATH] [--out DIR] [--timeout SECS]
//! ```
//!
//! `paper cluster` runs every member on loopback; this runs the same job with each member on
//! its own host: network namespaces made by `veriflow_testkit::netns` (root only), the
//! checkpoint server and the client on host 0, the coordinator on host 1, one worker process
//! (one thread, one vnode) per host after that, and the spares last. Between any two hosts
//! every packet is delayed by the latency (one way; a round trip takes twice it) and lost with
//! probability `--loss`; how (netem or the userspace wire) is in the report. Per latency and
//! repetition, in this order, each on a fresh cluster (new server data, new processes):
//!
//! - S0: `submit --no-checkpoint`, the members log nothing;
//! - S1: every task's events logged to the checkpoint server on host 0, with group commit;
//! - S2: S1, and worker [`VICTIM`] SIGKILLed once the coordinator's status shows
//!   [`KILL_AT`] of the tasks completed (`paper cluster`'s kill point); its vnode moves to the
//!   spare, which rebuilds it from its log over the network.
//!
//! The status is polled every [`POLL`] from host 0 in every setting (not only S2), so that all
//! three pay the same for it. Times are the `elapsed_s` of `submit --json` (the job's time as
//! the coordinator measures it). Every run is checked as in `paper cluster`: right result,
//! `tasks` = `knary::expected_tasks` (no completed task ran twice), S0 logs nothing, S1 and S2
//! log, exactly the S2 runs lose one worker. Results: `netns.json`, `netns.md`, `netns.svg`
//! (+ `.png`: the medians against the latency) in `--out` (`netns-quick.*` with `--quick`,
//! `netns-TAG.*` with `--tag TAG`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::{json, Value};
use veriflow_testkit::netns::{available, NetConfig, Network, WireStats};
use veriflow_testkit::{s, Cluster, ClusterOpts};

use crate::cluster::ClusterRun;
use crate::harness::{
    knary_binary, plot, require_runs, Disturbed, Figure, Plots, Quiet, Redo, Rounds, Series,
    Session, Stats, Timed, COLORS,
};
use crate::{Setting, Shape};

/// Options of `paper netns`.
#[derive(clap::Args, Debug, Clone)]
pub struct NetnsArgs {
    /// Repetitions of S0, S1, S2 per latency (medians over them; at least 3 unless --quick).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
    /// One-way latencies between hosts, in ms (0 to 100).
    #[arg(
        long,
        value_name = "MS,...",
        value_delimiter = ',',
        default_value = "0,5,20"
    )]
    pub latencies: Vec<u64>,
    /// Probability that a packet between two hosts is lost (0 to 0.05).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Worker processes (one thread each), each on its own host.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(3..=32))]
    pub workers: u32,
    /// Idle spares, each on its own host (the lost worker's vnode goes to one in S2).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub spares: u32,
    /// Depth of the knary tree [default: 7; --quick: 5].
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=9))]
    pub depth: Option<u32>,
    /// Fanout of the knary tree.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..=10))]
    pub fanout: u32,
    /// Busy loop of every node, in µs (`paper cluster`'s default).
    #[arg(long, default_value_t = crate::cluster::DEFAULT_GRAIN_US,
          value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pub grain_us: u64,
    /// One more option of the coordinator, e.g. `--coordinator-arg=--fd-broken-ms=2000` (the
    /// failure detector's bounds for a WAN); repeatable.
    #[arg(
        long = "coordinator-arg",
        value_name = "ARG",
        allow_hyphen_values = true
    )]
    pub coordinator_args: Vec<String>,
    /// Writes `netns-TAG.*` instead of `netns.*` (another setting beside the first).
    #[arg(long, value_name = "TAG")]
    pub tag: Option<String>,
    /// Small tree, one latency (5 ms) and 1 run: a smoke run (writes netns-quick.*).
    #[arg(long)]
    pub quick: bool,
    /// Directory of the results [default: the package's `results`].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The `knary` binary [default: beside this binary, built first].
    #[arg(long, value_name = "PATH")]
    pub knary_bin: Option<PathBuf>,
    /// A run taking longer than this fails the command.
    #[arg(long, value_name = "SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
}

/// S2 kills when the status shows this fraction of the tasks completed (`paper cluster`'s
/// kill point of `KILL_SEED`, 49.8 %).
const KILL_AT: f64 = 0.498;
/// The worker S2 kills (a non-spare: spares come last).
const VICTIM: usize = 2;
/// Period of the status polls.
const POLL: Duration = Duration::from_millis(100);

/// One run's result with the kill's moment.
#[derive(Clone, Debug, serde::Serialize)]
struct Run {
    #[serde(flatten)]
    run: ClusterRun,
    /// Fraction of the tasks completed in the status that triggered S2's kill.
    killed_at: Option<f64>,
}

impl Timed for Run {
    fn seconds(&self) -> f64 {
        self.run.elapsed_s
    }
    fn foreign_cpu_s(&self) -> Option<f64> {
        self.run.foreign_cpu_s
    }
}

/// All runs at one latency.
#[derive(Debug)]
struct AtLatency {
    latency_ms: u64,
    /// Runs of S0, S1, S2.
    runs: Vec<Vec<Run>>,
    /// Medians (s) of S0, S1, S2.
    time: [Stats; 3],
    wire: Option<WireStats>,
    network: String,
}

impl AtLatency {
    fn ratio(&self, i: usize) -> f64 {
        self.time[i].median / self.time[0].median
    }
}

/// Runs `paper netns` (module docs) and writes its results.
pub fn run(args: &NetnsArgs) -> Result<()> {
    if let Err(why) = available() {
        bail!("no network namespaces here: {why}");
    }
    require_runs(args.runs, 3, args.quick)?;
    if !(0.0..=0.05).contains(&args.loss) {
        bail!("--loss {}: a probability in [0, 0.05]", args.loss);
    }
    if let Some(l) = args.latencies.iter().find(|&&l| l > 100) {
        bail!("--latencies: {l} ms is above 100 ms");
    }
    if let Some(t) = &args.tag {
        if t.is_empty()
            || !t
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            bail!("--tag {t:?}: letters, digits, - and _ only");
        }
    }
    let session = Session::start(args.out.as_deref(), args.quick)?;
    let knary = knary_binary(args.knary_bin.as_deref())?;
    let shape = Shape {
        depth: args.depth.unwrap_or(if args.quick { 5 } else { 7 }),
        fanout: args.fanout,
        serial: 1,
        grain_us: args.grain_us,
    };
    let runs = if args.quick { 1 } else { args.runs as usize };
    let latencies = if args.quick {
        vec![5]
    } else {
        args.latencies.clone()
    };
    let timeout = Duration::from_secs(args.timeout);
    let members = (args.workers + args.spares) as usize;
    eprintln!(
        "netns: knary {shape:?} ({} tasks) on {} workers + {} spare(s), each on its own host; \
         latencies {latencies:?} ms, loss {}; {runs} repetitions of S0, S1, S2",
        shape.tasks()?,
        args.workers,
        args.spares,
        args.loss
    );
    let mut results = Vec::new();
    for &latency_ms in &latencies {
        let net = Arc::new(
            Network::create(&NetConfig {
                hosts: 2 + members,
                latency: Duration::from_millis(latency_ms),
                loss: args.loss,
                seed: latency_ms,
            })
            .context("cannot make the network")?,
        );
        eprintln!("  {}", net.describe());
        let job = |setting: Setting| -> Result<Run> {
            one_run(&knary, &net, args, shape, setting, timeout)
        };
        // Warm-up (binaries in the page cache, the wire's threads running): not counted.
        job(Setting::S0).context("warm-up run")?;
        // No quiet wait and no retries: the namespaces' wire threads are other processes'
        // CPU to the rule, every run would look disturbed.
        let settings = [Setting::S0, Setting::S1, Setting::S2];
        let Series { kept, .. } = Rounds {
            runs,
            quiet: Quiet::secs(0),
            retries: 0,
            disturbed: Disturbed::cores(),
            redo: Redo::Round,
            label: format!("{latency_ms} ms,"),
        }
        .run(
            settings.len(),
            |_, i| job(settings[i]),
            |i, r| format!("{:?} {:.3} s", settings[i], r.run.elapsed_s),
        )?;
        let el = |k: usize| kept[k].iter().map(|r| r.run.elapsed_s).collect::<Vec<_>>();
        let time = [
            Stats::require(&el(0))?,
            Stats::require(&el(1))?,
            Stats::require(&el(2))?,
        ];
        let network = net.describe();
        results.push(AtLatency {
            latency_ms,
            time,
            wire: net.wire_stats(),
            network,
            runs: kept,
        });
    }
    let stem = match (&args.tag, args.quick) {
        (Some(t), _) => format!("netns-{t}"),
        (None, true) => "netns-quick".to_string(),
        (None, false) => "netns".to_string(),
    };
    let stem = stem.as_str();
    let report = Report {
        args: args.clone(),
        shape,
        runs,
        results,
    };
    let drawn = session.plot(stem, &NetnsFigure::of(&report));
    session.write("netns", stem, report.json(&drawn), &report.markdown(&drawn))
}

/// One job on a fresh cluster on `net`: S0, S1 or S2 (module docs).
fn one_run(
    knary: &Path,
    net: &Arc<Network>,
    args: &NetnsArgs,
    shape: Shape,
    setting: Setting,
    timeout: Duration,
) -> Result<Run> {
    let c = Cluster::start_with(
        knary,
        ClusterOpts {
            net: Some(net.clone()),
            workers: args.workers as usize,
            spares: args.spares as usize,
            coordinator_args: args.coordinator_args.clone(),
            ..ClusterOpts::default()
        },
    );
    let members = (args.workers + args.spares) as usize;
    let t0 = Instant::now();
    while status(&c)?["workers"].as_array().map_or(0, Vec::len) < members {
        if t0.elapsed() > timeout {
            bail!("the workers did not join within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let tasks = shape.tasks()?;
    let mut program = vec![
        format!("--depth={}", shape.depth),
        format!("--fanout={}", shape.fanout),
        format!("--serial={}", shape.serial),
        format!("--grain-us={}", shape.grain_us),
        "--seed=1".to_string(),
    ];
    if setting == Setting::S0 {
        program.push("--no-checkpoint".into());
    }
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let mut child = ChildGuard(Some(c.submit(&program)));
    let t0 = Instant::now();
    let mut killed_at = None;
    loop {
        if child.running()?.is_some() {
            break;
        }
        if t0.elapsed() > timeout {
            bail!("{setting:?}: the job did not finish within {timeout:?}");
        }
        let v = status(&c)?;
        let done = v["jobs"][0]["tasks_completed"].as_u64().unwrap_or(0) as f64 / tasks as f64;
        if setting == Setting::S2 && killed_at.is_none() && done >= KILL_AT {
            c.workers[VICTIM].signal("-KILL");
            killed_at = Some(done);
        }
        std::thread::sleep(POLL);
    }
    let out = child.0.take().expect("the submit").wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{setting:?}: submit failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let v: Value = serde_json::from_str(text.trim())
        .with_context(|| format!("{setting:?}: no JSON summary: {text}"))?;
    let num = |k: &str| -> Result<u64> {
        v.get(k)
            .and_then(Value::as_u64)
            .with_context(|| format!("the summary has no integer {k:?}: {text}"))
    };
    let run = ClusterRun {
        elapsed_s: v
            .get("elapsed_s")
            .and_then(Value::as_f64)
            .with_context(|| format!("the summary has no elapsed_s: {text}"))?,
        wall_s: t0.elapsed().as_secs_f64(),
        tasks: num("tasks")?,
        events: num("events")?,
        steals: num("steals")?,
        failures: num("failures")?,
        recovered_tasks: num("recovered_tasks")?,
        reused_tasks: num("reused_tasks")?,
        correct: v.get("correct").and_then(Value::as_bool) == Some(true),
        cpu_s: None,
        foreign_cpu_s: None,
    };
    if setting == Setting::S2 && killed_at.is_none() {
        bail!(
            "S2: the job ended before {:.1} % of its tasks were seen done",
            KILL_AT * 100.0
        );
    }
    run.check(shape, setting)?;
    Ok(Run { run, killed_at })
}

/// `knary status --json` from the clients' host.
fn status(c: &Cluster) -> Result<Value> {
    let out = c.run(&[
        "status",
        "--coordinator",
        &c.addr,
        "--key",
        s(&c.key),
        "--json",
    ]);
    if out.code != 0 {
        bail!("status failed: {out}");
    }
    serde_json::from_str(out.stdout.trim()).with_context(|| format!("status said {out}"))
}

/// The submit process, killed if the run fails half-way.
struct ChildGuard(Option<Child>);

impl ChildGuard {
    fn running(&mut self) -> Result<Option<std::process::ExitStatus>> {
        match self.0.as_mut() {
            Some(c) => Ok(c.try_wait()?),
            None => Ok(None),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Report {
    args: NetnsArgs,
    shape: Shape,
    runs: usize,
    results: Vec<AtLatency>,
}

impl Report {
    fn markdown(&self, plots: &Plots) -> String {
        let a = &self.args;
        let s = self.shape;
        let mut md = String::new();
        let _ = writeln!(
            md,
            "knary depth {} fanout {} serial {} grain {} µs ({} tasks) in cluster mode across \
             hosts: network namespaces, the checkpoint server and the client on host 0, the \
             coordinator on host 1, {} worker processes × 1 thread and {} spare(s) each on its \
             own host; one-way latency between any two hosts as below, loss {} %. Median of {} \
             repetitions (S0, S1, S2 interleaved, each on a fresh cluster); times are the job's \
             `elapsed_s` (`submit --json`). S0 = `--no-checkpoint`; S1 = events logged to the \
             checkpoint server on host 0; S2 = S1 + worker {VICTIM} SIGKILLed at the first \
             status poll (every {} ms, in all settings) showing {:.1} % of the tasks done, its \
             vnode rebuilt on the spare from its log. Coordinator options: {}.\n",
            s.depth,
            s.fanout,
            s.serial,
            s.grain_us,
            s.tasks().unwrap_or(0),
            a.workers,
            a.spares,
            a.loss * 100.0,
            self.runs,
            POLL.as_millis(),
            KILL_AT * 100.0,
            if a.coordinator_args.is_empty() {
                "the defaults".to_string()
            } else {
                format!("`{}`", a.coordinator_args.join(" "))
            },
        );
        md.push_str(
            "| one-way latency | S0 median (s) | S1 median (s) | S2 median (s) | S1/S0 | S2/S0 | \
             S0 min–max (s) | S2 min–max (s) | S2 restarted / reused tasks (median) |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.results {
            let med = |f: fn(&ClusterRun) -> u64| {
                Stats::by(&r.runs[2], |x| f(&x.run) as f64).map_or(0.0, |s| s.median)
            };
            let _ = writeln!(
                md,
                "| {} ms | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3}–{:.3} | {:.3}–{:.3} | \
                 {:.0} / {:.0} |",
                r.latency_ms,
                r.time[0].median,
                r.time[1].median,
                r.time[2].median,
                r.ratio(1),
                r.ratio(2),
                r.time[0].min,
                r.time[0].max,
                r.time[2].min,
                r.time[2].max,
                med(|x| x.recovered_tasks),
                med(|x| x.reused_tasks),
            );
        }
        md.push_str("\nNetworks:\n\n");
        for r in &self.results {
            let _ = writeln!(md, "- {}", r.network);
        }
        let _ = writeln!(
            md,
            "\nEvery run's result was right and completed exactly {} tasks (no completed task \
             ran twice); every S2 run lost one worker, S0 and S1 none.\n\nPlots: {}.",
            s.tasks().unwrap_or(0),
            plots.markdown()
        );
        md
    }

    fn json(&self, plots: &Plots) -> Value {
        let a = &self.args;
        json!({
            "parameters": {
                "runs": self.runs,
                "tree": self.shape,
                "tasks": self.shape.tasks().ok(),
                "workers": a.workers,
                "spares": a.spares,
                "threads_per_worker": 1,
                "loss": a.loss,
                "coordinator_args": a.coordinator_args,
                "placement": "host 0: checkpoint server + client; host 1: coordinator; \
                              hosts 2..: one worker each, spares last",
                "latency": "one-way delay of every packet between two hosts (RTT = 2 x)",
                "kill": {
                    "victim_worker_index": VICTIM,
                    "fraction_of_tasks": KILL_AT,
                    "how": "SIGKILL at the first status poll past the fraction",
                    "poll_ms": POLL.as_millis(),
                },
                "timing": "elapsed_s of submit --json",
                "order": "S0, S1, S2, S0, ... (interleaved), each on a fresh cluster",
            },
            "latencies": self.results.iter().map(|r| json!({
                "latency_ms": r.latency_ms,
                "network": r.network,
                "wire": r.wire.map(|w| json!({
                    "forwarded": w.forwarded, "dropped": w.dropped, "stray": w.stray,
                })),
                "s0_median_s": r.time[0].median,
                "s1_median_s": r.time[1].median,
                "s2_median_s": r.time[2].median,
                "ratio_s1_s0": r.ratio(1),
                "ratio_s2_s0": r.ratio(2),
                "s0": r.runs[0],
                "s1": r.runs[1],
                "s2": r.runs[2],
            })).collect::<Vec<_>>(),
            "checks": "every run: correct result, tasks == knary::expected_tasks, S0 logs \
                       nothing, S1/S2 log, S2 loses exactly one worker and S0/S1 none",
            "plots": plots.json(),
        })
    }
}

/// `netns.png`: the medians of S0, S1, S2 against the latency, with every run as a dot.
pub(crate) struct NetnsFigure {
    caption: String,
    /// Per latency (ms): the medians and every run's time (s) of S0, S1, S2.
    points: Vec<(u64, [f64; 3], [Vec<f64>; 3])>,
}

impl NetnsFigure {
    fn caption(depth: u64, fanout: u64, grain_us: u64, hosts: u64) -> String {
        format!(
            "knary d{depth} k{fanout} {grain_us} µs across {hosts} hosts: job time against \
             one-way latency"
        )
    }

    fn of(r: &Report) -> NetnsFigure {
        let s = r.shape;
        NetnsFigure {
            caption: Self::caption(
                u64::from(s.depth),
                u64::from(s.fanout),
                s.grain_us,
                u64::from(2 + r.args.workers + r.args.spares),
            ),
            points: r
                .results
                .iter()
                .map(|x| {
                    let times = |k: usize| x.runs[k].iter().map(|y| y.run.elapsed_s).collect();
                    (
                        x.latency_ms,
                        [x.time[0].median, x.time[1].median, x.time[2].median],
                        [times(0), times(1), times(2)],
                    )
                })
                .collect(),
        }
    }

    /// The figure of a `netns*.json` (`paper replot`).
    pub(crate) fn from_json(j: &Value) -> Result<NetnsFigure> {
        let p = &j["parameters"];
        let num = |v: &Value, what: &str| v.as_u64().with_context(|| format!("no {what}"));
        let caption = Self::caption(
            num(&p["tree"]["depth"], "parameters.tree.depth")?,
            num(&p["tree"]["fanout"], "parameters.tree.fanout")?,
            num(&p["tree"]["grain_us"], "parameters.tree.grain_us")?,
            2 + num(&p["workers"], "parameters.workers")? + num(&p["spares"], "parameters.spares")?,
        );
        let mut points = Vec::new();
        for l in j["latencies"].as_array().context("no latencies")? {
            let mut medians = [0.0; 3];
            let mut runs: [Vec<f64>; 3] = Default::default();
            for (k, key) in ["s0", "s1", "s2"].iter().enumerate() {
                medians[k] = l[format!("{key}_median_s")]
                    .as_f64()
                    .with_context(|| format!("no {key}_median_s"))?;
                runs[k] = l[*key]
                    .as_array()
                    .with_context(|| format!("no {key}"))?
                    .iter()
                    .filter_map(|r| r["elapsed_s"].as_f64())
                    .collect();
            }
            points.push((num(&l["latency_ms"], "latency_ms")?, medians, runs));
        }
        Ok(NetnsFigure { caption, points })
    }
}

impl Figure for NetnsFigure {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String> {
        let r = self;

        root.fill(&WHITE).map_err(plot::err)?;
        let xmax = r.points.iter().map(|x| x.0).max().unwrap_or(1).max(1) as f64;
        let ymax = r
            .points
            .iter()
            .flat_map(|x| x.2.iter().flatten().copied())
            .fold(0.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption(&r.caption, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5..xmax * 1.05 + 0.5, 0.0..ymax.max(0.1))
            .map_err(plot::err)?;
        chart
            .configure_mesh()
            .x_desc("one-way latency between hosts (ms)")
            .y_desc("job time (s)")
            .draw()
            .map_err(plot::err)?;
        for (k, name) in ["S0 (no log)", "S1 (log)", "S2 (log + 1 kill)"]
            .iter()
            .enumerate()
        {
            let c = COLORS[k % COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    r.points.iter().map(|x| (x.0 as f64, x.1[k])),
                    c.stroke_width(2),
                ))
                .map_err(plot::err)?
                .label(*name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
            chart
                .draw_series(r.points.iter().flat_map(|x| {
                    x.2[k]
                        .iter()
                        .map(move |&y| Circle::new((x.0 as f64, y), 3, c.filled()))
                }))
                .map_err(plot::err)?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE)
            .draw()
            .map_err(plot::err)?;
        root.present().map_err(plot::err)
    }
}

//! `paper replot`: draws the figures again from the JSON results, without running anything.
//!
//! Rules:
//!
//! 1. A figure is drawn from the numbers its benchmark wrote in its JSON (every run's time,
//!    every trial's latency), with the same drawing code the benchmark uses: a plot fixed in
//!    the code is fixed in the results without re-running an hour of measurements.
//! 2. Each figure whose JSON is missing is skipped with a line saying so; a JSON that lacks a
//!    number the figure needs is an error naming the file and the number.
//! 3. Only the figures are written (`<name>.svg` and `<name>.png`); the JSON and markdown
//!    reports stay as measured.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::cluster::{out_dir, plots, Plots};

/// Options of `paper replot`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplotArgs {
    /// Directory of the JSON results, where the figures are written [default: the package's
    /// `results`].
    #[arg(long, value_name = "DIR")]
    pub results: Option<PathBuf>,
}

fn load(dir: &Path, file: &str) -> Result<Option<Value>> {
    let path = dir.join(file);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .with_context(|| format!("{} is not JSON", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("  {file}: not there, its figure is skipped");
            Ok(None)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

fn report(drawn: &Plots) {
    for (file, r) in drawn {
        match r {
            Ok(()) => println!("  wrote {file}"),
            Err(e) => println!("  no {file}: {e}"),
        }
    }
}

/// Draws `cluster`, `detector_latency`, `transport` and `transport-backup*` again (rules 1-3).
pub fn run(args: &ReplotArgs) -> Result<()> {
    let dir = out_dir(args.results.as_deref())?;
    if let Some(j) = load(&dir, "cluster.json")? {
        let f = crate::cluster::RunsFigure::from_json(&j).context("cluster.json")?;
        report(&plots(
            &dir,
            "cluster",
            |a| crate::cluster::draw_runs(a, &f),
            |a| crate::cluster::draw_runs(a, &f),
        ));
    }
    if let Some(j) = load(&dir, "detector.json")? {
        let f = crate::detector::LatencyFigure::from_json(&j).context("detector.json")?;
        report(&plots(
            &dir,
            "detector_latency",
            |a| crate::detector::draw_latency(a, &f),
            |a| crate::detector::draw_latency(a, &f),
        ));
    }
    let mut transports: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("transport") && n.ends_with(".json") && !n.contains("quick"))
        .collect();
    transports.sort();
    for file in transports {
        let Some(j) = load(&dir, &file)? else {
            continue;
        };
        let f = crate::transport::TransportFigure::from_json(&j).context(file.clone())?;
        let stem = file.trim_end_matches(".json");
        report(&plots(
            &dir,
            stem,
            |a| crate::transport::draw(a, &f),
            |a| crate::transport::draw(a, &f),
        ));
    }
    Ok(())
}

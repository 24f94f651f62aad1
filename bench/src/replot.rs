//! `paper replot`: draws the figures again from the JSON results, without running anything.
//!
//! Rules:
//!
//! 1. A figure is drawn from the numbers its benchmark wrote in its JSON (every run's time,
//!    every trial's latency), with the same drawing code the benchmark uses (one
//!    [`crate::harness::Figure`] each): a plot fixed in the code is fixed in the results
//!    without re-running an hour of measurements. Every figure in `bench/results` is one of
//!    these: `cluster`, `detector_latency`, `transport*`, `netns*`, `memory`,
//!    `storage_overhead`, `certify_fig4` and `certify_fig7`.
//! 2. Each figure whose JSON is missing is skipped with a line saying so; a JSON that lacks a
//!    number the figure needs is an error naming the file and the number.
//! 3. Only the figures are written (`<name>.svg` and `<name>.png`); the JSON and markdown
//!    reports stay as measured.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::harness::{out_dir, Plots};

/// Options of `paper replot`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplotArgs {
    /// Directory of the JSON results, where the figures are written [default: the package's
    /// `results`].
    #[arg(long, visible_alias = "dir", value_name = "DIR")]
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

/// The JSON files in `dir` named `<prefix>*.json`, not `-quick` ones, sorted.
fn named(dir: &Path, prefix: &str) -> Result<Vec<String>> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix) && n.ends_with(".json") && !n.contains("quick"))
        .collect();
    files.sort();
    Ok(files)
}

/// Draws every figure again from its JSON (rules 1-3).
pub fn run(args: &ReplotArgs) -> Result<()> {
    let dir = out_dir(args.results.as_deref())?;
    if let Some(j) = load(&dir, "cluster.json")? {
        let f = crate::cluster::RunsFigure::from_json(&j).context("cluster.json")?;
        Plots::draw(&dir, "cluster", &f).print();
    }
    if let Some(j) = load(&dir, "detector.json")? {
        let f = crate::detector::LatencyFigure::from_json(&j).context("detector.json")?;
        Plots::draw(&dir, "detector_latency", &f).print();
    }
    for file in named(&dir, "transport")? {
        let Some(j) = load(&dir, &file)? else {
            continue;
        };
        let f = crate::transport::TransportFigure::from_json(&j).context(file.clone())?;
        Plots::draw(&dir, file.trim_end_matches(".json"), &f).print();
    }
    for file in named(&dir, "netns")? {
        let Some(j) = load(&dir, &file)? else {
            continue;
        };
        let f = crate::netns::NetnsFigure::from_json(&j).context(file.clone())?;
        Plots::draw(&dir, file.trim_end_matches(".json"), &f).print();
    }
    if let Some(j) = load(&dir, "memory.json")? {
        let f = crate::memory::MemoryFigure::from_json(&j).context("memory.json")?;
        Plots::draw(&dir, "memory", &f).print();
    }
    if let Some(j) = load(&dir, "storage.json")? {
        let f = crate::storage::OverheadFigure::from_json(&j).context("storage.json")?;
        Plots::draw(&dir, "storage_overhead", &f).print();
    }
    if let Some(j) = load(&dir, "certify.json")? {
        // Fig. 4 is arithmetic (`certifier::sample`), not a measurement.
        let f = crate::certify::Fig4::compute()?;
        Plots::draw(&dir, "certify_fig4", &f).print();
        let f = crate::certify::Fig7::from_json(&j).context("certify.json")?;
        Plots::draw(&dir, "certify_fig7", &f).print();
    }
    Ok(())
}

//! Figures as an SVG + PNG pair (rule 7 of the harness).

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::{json, Value};

/// One colour per series, readable on white (matplotlib's tab10: blue, green, red, orange,
/// purple, brown).
pub const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Pixels of a figure unless it says otherwise.
pub const PLOT_SIZE: (u32, u32) = (960, 600);

/// A figure that can draw itself on any plotters backend.
pub trait Figure {
    /// Pixels of the picture.
    fn size(&self) -> (u32, u32) {
        PLOT_SIZE
    }

    /// Draws the figure on `root` (and presents it).
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// A plotters error as text (every drawing call's `map_err`).
pub fn err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    e.to_string()
}

/// What was drawn: (file name, `Err(why)` when it could not be).
#[derive(Debug, Default)]
pub struct Plots(pub Vec<(String, Result<(), String>)>);

impl Plots {
    /// Draws `figure` into `<name>.svg` and `<name>.png` in `out` (the PNG needs system fonts:
    /// when the bitmap backend finds none, the PNG is left out and the SVG alone has the
    /// figure; a file that could not be drawn is removed and said so).
    pub fn draw(out: &Path, name: &str, figure: &impl Figure) -> Plots {
        let size = figure.size();
        let svg_path = out.join(format!("{name}.svg"));
        let png_path = out.join(format!("{name}.png"));
        let svg = figure.draw(SVGBackend::new(&svg_path, size).into_drawing_area());
        let png = figure.draw(BitMapBackend::new(&png_path, size).into_drawing_area());
        let mut drawn = Vec::new();
        for (path, r) in [(svg_path, svg), (png_path, png)] {
            if let Err(e) = &r {
                eprintln!("  (cannot draw {}: {e})", path.display());
                let _ = std::fs::remove_file(&path);
            }
            drawn.push((file_name(&path), r));
        }
        Plots(drawn)
    }

    /// Nothing drawn.
    pub fn none() -> Plots {
        Plots(Vec::new())
    }

    /// Adds the files of `other`.
    pub fn extend(&mut self, other: Plots) {
        self.0.extend(other.0);
    }

    /// The files as markdown: the files written, and why any is missing.
    pub fn markdown(&self) -> String {
        self.0
            .iter()
            .map(|(f, r)| match r {
                Ok(()) => format!("`{f}`"),
                Err(e) => format!("no `{f}` ({e})"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The files as JSON: `[{"file": ..., "error": null or why}]`.
    pub fn json(&self) -> Value {
        Value::Array(
            self.0
                .iter()
                .map(|(f, r)| json!({ "file": f, "error": r.as_ref().err() }))
                .collect(),
        )
    }

    /// The files written, in `out`.
    pub fn written(&self, out: &Path) -> Vec<PathBuf> {
        self.0
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(f, _)| out.join(f))
            .collect()
    }

    /// One line per file, as `paper replot` prints them.
    pub fn print(&self) {
        for (file, r) in &self.0 {
            match r {
                Ok(()) => println!("  wrote {file}"),
                Err(e) => println!("  no {file}: {e}"),
            }
        }
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(String::new, |f| f.to_string_lossy().into_owned())
}

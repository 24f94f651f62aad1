//! One invocation's reports: `<stem>.json` and `<stem>.md` with the standard machine block
//! (rule 6 of the harness).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use super::machine::{loadavg, utc_now, Machine};
use super::plot::{Figure, Plots};

/// The results directory: `explicit`, or the package's `results`; created if needed.
pub fn out_dir(explicit: Option<&Path>) -> Result<PathBuf> {
    let out = explicit.map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("results"),
        Path::to_path_buf,
    );
    std::fs::create_dir_all(&out)
        .with_context(|| format!("cannot create the output directory {}", out.display()))?;
    Ok(out)
}

/// A scratch directory: `explicit`, or the system's temporary directory; created if needed.
pub fn scratch_dir(explicit: Option<&Path>) -> Result<PathBuf> {
    let dir = explicit.map_or_else(std::env::temp_dir, Path::to_path_buf);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the scratch directory {}", dir.display()))?;
    Ok(dir)
}

/// Fails unless `runs` is at least `min` (medians need that many) or this is a `--quick`
/// smoke run.
pub fn require_runs(runs: u32, min: u32, quick: bool) -> Result<()> {
    if runs < min && !quick {
        bail!(
            "--runs must be at least {min} (medians of >= {min} runs); use --quick for a smoke run"
        );
    }
    Ok(())
}

/// What every report of one command states besides its measurements: when, where, on what,
/// how long, and how loaded the machine was. Taken before the measurements, so that the commit
/// named is the one that was measured.
#[derive(Debug)]
pub struct Session {
    /// Where the reports go.
    pub out: PathBuf,
    /// A `--quick` smoke run (its files are `<name>-quick.*`).
    pub quick: bool,
    /// Start of the command, UTC.
    pub date: String,
    /// The machine.
    pub machine: Machine,
    started: Instant,
    load_before: Option<String>,
}

impl Session {
    /// Starts a command writing into `out` (or the package's `results`).
    pub fn start(out: Option<&Path>, quick: bool) -> Result<Session> {
        Ok(Session {
            out: out_dir(out)?,
            quick,
            date: utc_now(),
            machine: Machine::now(),
            started: Instant::now(),
            load_before: loadavg(),
        })
    }

    /// `name`, or `name-quick` for a smoke run.
    pub fn stem(&self, name: &str) -> String {
        if self.quick {
            format!("{name}-quick")
        } else {
            name.to_string()
        }
    }

    /// `/proc/loadavg` when the command started.
    pub fn loadavg_before(&self) -> Option<&str> {
        self.load_before.as_deref()
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The first paragraph of a markdown report.
    pub fn header(&self) -> String {
        let m = &self.machine;
        format!(
            "Measured {} at commit {} on {} ({} cores available){}; whole command {:.0} s; \
             load average before/after: {} / {}.\n\n",
            self.date,
            m.git.as_deref().unwrap_or("?"),
            m.cpu.as_deref().unwrap_or("unknown CPU"),
            m.cores,
            if self.quick {
                " (--quick: a smoke run, not the real measurement)"
            } else {
                ""
            },
            self.elapsed().as_secs_f64(),
            self.load_before.as_deref().unwrap_or("?"),
            loadavg().as_deref().unwrap_or("?"),
        )
    }

    /// The fields every JSON report starts with: `benchmark`, `date_utc`, `quick`, `machine`,
    /// `total_seconds`, `loadavg_before`, `loadavg_after`.
    pub fn head(&self, benchmark: &str) -> Map<String, Value> {
        let v = json!({
            "benchmark": benchmark,
            "date_utc": self.date,
            "quick": self.quick,
            "machine": self.machine.json(),
            "total_seconds": self.elapsed().as_secs_f64(),
            "loadavg_before": self.load_before,
            "loadavg_after": loadavg(),
        });
        match v {
            Value::Object(map) => map,
            _ => unreachable!("json! of an object literal"),
        }
    }

    /// Draws `figure` as `<name>.svg` and `<name>.png` in the output directory.
    pub fn plot(&self, name: &str, figure: &impl Figure) -> Plots {
        Plots::draw(&self.out, name, figure)
    }

    /// Writes `<stem>.json` (the standard fields of [`Session::head`] for `benchmark`, then
    /// `body`'s, which win) and `<stem>.md` (`md` with [`Session::header`] first, or after its
    /// `# title` paragraph), and prints the markdown.
    pub fn write(&self, benchmark: &str, stem: &str, body: Value, md: &str) -> Result<()> {
        let mut json = self.head(benchmark);
        match body {
            Value::Object(fields) => json.extend(fields),
            other => bail!("a report's body must be a JSON object, not {other}"),
        }
        write_report(&self.out, stem, &Value::Object(json), &self.with_header(md))
    }

    /// `md` with [`Session::header`] first, or after its `# title` paragraph.
    pub fn with_header(&self, md: &str) -> String {
        match md.split_once("\n\n") {
            Some((title, rest)) if title.starts_with("# ") => {
                format!("{title}\n\n{}{rest}", self.header())
            }
            _ => self.header() + md,
        }
    }
}

/// Writes `<stem>.json` and `<stem>.md` in `out`, and prints the markdown.
pub fn write_report(out: &Path, stem: &str, json: &Value, md: &str) -> Result<()> {
    let text = serde_json::to_string_pretty(json).context("encoding the results")?;
    write_files(out, stem, &(text + "\n"), md)
}

/// Writes `json` (already encoded) as `<stem>.json` and `md` as `<stem>.md` in `out`, and
/// prints the markdown.
pub fn write_files(out: &Path, stem: &str, json: &str, md: &str) -> Result<()> {
    let json_path = out.join(format!("{stem}.json"));
    let md_path = out.join(format!("{stem}.md"));
    std::fs::write(&json_path, json)
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    std::fs::write(&md_path, md).with_context(|| format!("cannot write {}", md_path.display()))?;
    println!("{md}");
    println!("written: {} and {}", json_path.display(), md_path.display());
    Ok(())
}

/// The fields of `a` and of `b` (JSON objects; `b`'s win), as one object: a report's own
/// parameters with the harness's ([`super::Rounds::parameters`]).
pub fn merge(a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Object(mut a), Value::Object(b)) => {
            a.extend(b);
            Value::Object(a)
        }
        (a, Value::Null) => a,
        (_, b) => b,
    }
}

/// `x` rounded, with thousands separators: `1234567.8` as `1,234,568`.
pub fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Milliseconds of `d`, with fractions.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Bytes of the files under `dir` (0 for what cannot be read).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separates() {
        assert_eq!(thousands(1_222_222.0), "1,222,222");
        assert_eq!(thousands(122.0), "122");
        assert_eq!(thousands(1000.4), "1,000");
        assert_eq!(thousands(1_234_567.8), "1,234,568");
    }

    #[test]
    fn a_report_is_written_with_its_head() {
        let dir = tempfile::tempdir().unwrap();
        let session = Session::start(Some(&dir.path().join("out")), true).unwrap();
        assert_eq!(session.stem("x"), "x-quick");
        session
            .write(
                "x",
                "x-quick",
                json!({ "ratio": 1.5, "quick": "mine" }),
                "| a |\n",
            )
            .unwrap();
        let text = std::fs::read_to_string(dir.path().join("out/x-quick.json")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["benchmark"], "x");
        assert_eq!(v["ratio"], 1.5);
        // The body's fields win over the head's.
        assert_eq!(v["quick"], "mine");
        for k in [
            "date_utc",
            "machine",
            "total_seconds",
            "loadavg_before",
            "loadavg_after",
        ] {
            assert!(v.get(k).is_some(), "no {k}");
        }
        assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
        let md = std::fs::read_to_string(dir.path().join("out/x-quick.md")).unwrap();
        assert!(md.starts_with("Measured "), "{md}");
        assert!(md.contains("--quick"));
        assert!(md.ends_with("| a |\n"));
        let titled = session.with_header("# Title\n\nbody\n");
        assert!(titled.starts_with("# Title\n\nMeasured "), "{titled}");
        assert!(titled.ends_with("\n\nbody\n"));
        assert!(session.write("x", "y", json!([1]), "").is_err());
    }

    #[test]
    fn dir_bytes_counts_nested_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/b"), [0u8; 100]).unwrap();
        std::fs::write(dir.path().join("c"), [0u8; 20]).unwrap();
        assert_eq!(dir_bytes(dir.path()), 120);
        assert_eq!(dir_bytes(&dir.path().join("missing")), 0);
    }
}

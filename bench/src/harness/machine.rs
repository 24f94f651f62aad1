//! What the benchmarks record about the machine and the moment of a measurement.

/// What we know of the machine.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Cores available to this process.
    pub cores: usize,
    /// CPU model name.
    pub cpu: Option<String>,
    /// Kernel release.
    pub kernel: Option<String>,
    /// `rustc --version`.
    pub rustc: Option<String>,
    /// `git rev-parse --short=10 HEAD` of the workspace, with ` (dirty)` when tracked files
    /// differ.
    pub git: Option<String>,
}

impl Machine {
    /// Reads it now.
    pub fn now() -> Machine {
        let run = |cmd: &str, args: &[&str]| {
            std::process::Command::new(cmd)
                .args(args)
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let git = run("git", &["rev-parse", "--short=10", "HEAD"]).map(|head| {
            match run("git", &["status", "--porcelain", "--untracked-files=no"]) {
                Some(changes) if !changes.is_empty() => format!("{head} (dirty)"),
                _ => head,
            }
        });
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu: std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            }),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|s| s.trim().to_string()),
            rustc: run(
                &std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()),
                &["--version"],
            ),
            git,
        }
    }

    /// The machine as every report's `machine` field.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "cores": self.cores,
            "cpu_model": self.cpu,
            "os": std::env::consts::OS,
            "arch": std::env::consts::ARCH,
            "kernel": self.kernel,
            "rustc": self.rustc,
            "git_commit": self.git,
        })
    }
}

/// The 1, 5 and 15 minute load averages, if readable.
pub fn loadavg() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The current time in UTC, `YYYY-MM-DDTHH:MM:SSZ` (Howard Hinnant's civil_from_days).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

//! What other processes took from the machine (rules 2 and 3 of the harness), and what this
//! process and its children used.

use std::time::{Duration, Instant};

/// Linux clock ticks per second of `/proc/stat` and `/proc/*/stat` (USER_HZ, 100 on every
/// Linux architecture we run on).
const USER_HZ: f64 = 100.0;

/// Busy ticks of all CPUs (user, nice, system, irq, softirq, steal) from `/proc/stat`.
fn machine_busy() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    Some([0, 1, 2, 5, 6, 7].iter().filter_map(|&i| cpu.get(i)).sum())
}

/// Fields 14.. (utime, stime, cutime, cstime, ...) of `/proc/<pid>/stat`, counted from the one
/// after the command name (which may hold spaces) in parentheses: index 11 is utime.
fn stat_ticks(pid: &str, fields: std::ops::RangeInclusive<usize>) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    fields.map(|i| rest.get(i)?.parse::<u64>().ok()).sum()
}

/// CPU time used so far by the whole machine and by this process (from `/proc`), to tell how
/// much other processes competed with a measurement: on a 2-core machine a concurrent build
/// can halve the cores a run gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSnapshot {
    machine_busy: u64,
    /// User + system ticks of this process (all its threads, live and exited), and with
    /// `children`, of its reaped descendants too.
    own: u64,
    children: bool,
}

impl CpuSnapshot {
    fn take(children: bool) -> Option<CpuSnapshot> {
        let fields = if children { 11..=14 } else { 11..=12 };
        Some(CpuSnapshot {
            machine_busy: machine_busy()?,
            own: stat_ticks("self", fields)?,
            children,
        })
    }

    /// The counters now, this process's threads only; `None` where `/proc` is not readable.
    pub fn now() -> Option<CpuSnapshot> {
        Self::take(false)
    }

    /// The counters now, counting this process's reaped descendants as its own (utime + stime +
    /// cutime + cstime): a cluster run's processes are descendants, counted once `knary
    /// cluster` has reaped its workers and we have reaped it.
    pub fn with_children() -> Option<CpuSnapshot> {
        Self::take(true)
    }

    /// CPU seconds this process (and its reaped children, if `before` counted them) used since
    /// `before` (ticks are 10 ms).
    pub fn own_since(before: Option<CpuSnapshot>) -> Option<f64> {
        Self::since(before).0
    }

    /// CPU seconds other processes used since `before` (0 at best; ticks are 10 ms).
    pub fn foreign_since(before: Option<CpuSnapshot>) -> Option<f64> {
        Self::since(before).1
    }

    /// (own, other processes') CPU seconds since `before`, counted the way `before` was.
    pub fn since(before: Option<CpuSnapshot>) -> (Option<f64>, Option<f64>) {
        let Some((before, now)) = before.and_then(|b| Some((b, Self::take(b.children)?))) else {
            return (None, None);
        };
        let machine = now.machine_busy.saturating_sub(before.machine_busy);
        let own = now.own.saturating_sub(before.own);
        (
            Some(own as f64 / USER_HZ),
            Some(machine.saturating_sub(own) as f64 / USER_HZ),
        )
    }
}

/// User + system CPU seconds of process `pid` so far (ticks of 10 ms); `None` once it is gone.
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    Some(stat_ticks(&pid.to_string(), 11..=12)? as f64 / USER_HZ)
}

/// A field of `/proc/self/status` given in kB (`VmHWM:` the peak resident memory, `VmRSS:`
/// the current one), in MiB.
pub fn status_mib(field: &str) -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// Peak resident memory of this process so far (`VmHWM`), in MiB.
pub fn peak_rss_mib() -> Option<f64> {
    status_mib("VmHWM:")
}

/// Waits until other processes use less than `max_cores` cores over a 1 s window, for at most
/// `limit`; returns whether the machine got quiet (`true` too when `/proc` is unreadable).
pub fn wait_for_quiet(limit: Duration, max_cores: f64) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let before = CpuSnapshot::now();
        std::thread::sleep(Duration::from_secs(1));
        match CpuSnapshot::foreign_since(before) {
            None => return true,
            Some(foreign) if foreign < max_cores => return true,
            Some(_) if Instant::now() >= deadline => return false,
            Some(_) => {}
        }
    }
}

/// Rule 2: before a measurement, wait up to `wait` for other processes to use less than
/// `cores` cores (no wait at all for a zero `wait`).
#[derive(Clone, Copy, Debug)]
pub struct Quiet {
    /// The longest wait.
    pub wait: Duration,
    /// Other processes may use up to this many cores.
    pub cores: f64,
}

/// Other processes may use up to a quarter of a core before a measurement starts (every
/// experiment's default since `paper overhead`).
pub const QUIET_CORES: f64 = 0.25;

impl Quiet {
    /// Waits up to `wait_s` seconds for [`QUIET_CORES`].
    pub fn secs(wait_s: u64) -> Quiet {
        Quiet {
            wait: Duration::from_secs(wait_s),
            cores: QUIET_CORES,
        }
    }

    /// Waits; `false` when the machine was still busy at the end (then the caller measures
    /// anyway and counts it). `true` at once when `wait` is zero.
    pub fn wait(&self) -> bool {
        self.wait.is_zero() || wait_for_quiet(self.wait, self.cores)
    }
}

/// Rule 3: a measurement is disturbed when other processes took more than `floor_s` CPU-s
/// plus `share` of the CPU time `cpus` could give during it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Disturbed {
    /// CPU-seconds other processes may always take (timer ticks, daemons).
    pub floor_s: f64,
    /// Share of the measurement's CPU time they may take besides.
    pub share: f64,
    /// CPUs counted: the threads of the run, or the machine's cores.
    pub cpus: f64,
}

/// 0.05 CPU-s plus 5 % ([`Disturbed::share`]) of the run's CPUs: `paper overhead`'s rule,
/// which every experiment took over.
const FLOOR_S: f64 = 0.05;
const SHARE: f64 = 0.05;

impl Disturbed {
    /// 0.05 CPU-s + 5 % of `threads` × the wall time.
    pub fn threads(threads: usize) -> Disturbed {
        Disturbed {
            floor_s: FLOOR_S,
            share: SHARE,
            cpus: threads as f64,
        }
    }

    /// 0.05 CPU-s + 5 % of every core of the machine × the wall time (a run that uses them
    /// all: a cluster, rayon's global pool).
    pub fn cores() -> Disturbed {
        Self::threads(cores())
    }

    /// 0.05 CPU-s + `cores` × the wall time, whatever the machine (a one-core measurement
    /// beside which another core's work is tolerated).
    pub fn absolute(cores: f64) -> Disturbed {
        Disturbed {
            floor_s: FLOOR_S,
            share: cores,
            cpus: 1.0,
        }
    }

    /// Whether `foreign_cpu_s` (unknown: not disturbed) breaks the rule over `seconds`.
    pub fn is(&self, foreign_cpu_s: Option<f64>, seconds: f64) -> bool {
        foreign_cpu_s.is_some_and(|f| f > self.floor_s + self.share * self.cpus * seconds)
    }

    /// The rule in words, for the reports' parameters.
    pub fn text(&self) -> String {
        if self.cpus == 1.0 {
            format!(
                "a run during which other processes took more than {} CPU-s + {} x its time",
                self.floor_s, self.share
            )
        } else {
            format!(
                "a run during which other processes took more than {} CPU-s + {} x {} CPUs x \
                 its time",
                self.floor_s, self.share, self.cpus
            )
        }
    }
}

/// Cores available to this process.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_read_proc() {
        for before in [CpuSnapshot::now(), CpuSnapshot::with_children()] {
            if before.is_some() {
                let (own, other) = CpuSnapshot::since(before);
                assert!(own.unwrap() >= 0.0 && other.unwrap() >= 0.0);
            }
        }
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(peak_rss_mib().unwrap() > 0.0);
        }
    }

    #[test]
    fn the_disturbed_rule() {
        let d = Disturbed::threads(2);
        // 0.05 + 0.05 x 2 x 1 s = 0.15 CPU-s.
        assert!(!d.is(Some(0.15), 1.0));
        assert!(d.is(Some(0.16), 1.0));
        assert!(!d.is(None, 1.0));
        let one_core = Disturbed::absolute(0.25);
        assert!(!one_core.is(Some(0.3), 1.0));
        assert!(one_core.is(Some(0.31), 1.0));
    }
}

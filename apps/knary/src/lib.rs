//! knary, the Cilk benchmark (paper 001 §VI, ref. [3]) as a veriflow program.
//!
//! `knary(n, k, r)` is a tree of depth `n` and branching factor `k`. In every internal node the
//! first `r` children run one after the other — child `i` (for `1 <= i < r`) reads the count of
//! child `i - 1`, which is written only once that child's whole subtree is done — and the other
//! children run in parallel. Every node busy-loops for a grain of `g` µs. The result is the
//! number of nodes, `(k^n - 1) / (k - 1)`, which the app checks.
//!
//! Each internal node is two tasks: the [`Node`] that spawns the children, and a [`Sum`] that
//! reads their counts and writes the node's count (the node delegates its output to it). So a
//! run has `nodes + internal nodes` tasks: [`expected_tasks`].

use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};
use veriflow::{
    Ctx, InvalidArgs, Program, Read, Registry, RegistryError, Task, TaskResult, Writes, WrongResult,
};

/// One node of the tree.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Node {
    /// Depth of the subtree rooted here (1 = a leaf).
    pub depth: u32,
    /// Branching factor k.
    pub fanout: u32,
    /// Number r of children that run one after the other.
    pub serial: u32,
    /// Busy-loop per node, in µs.
    pub grain_us: u64,
}

impl Task for Node {
    const NAME: &'static str = "knary.node";
    /// The count of the previous serial sibling (empty for the others): a token that orders
    /// the serial children.
    type Inputs = Vec<u64>;
    /// Nodes in this subtree.
    type Outputs = (u64,);

    fn run(self, ctx: &mut Ctx<'_>, _token: Vec<u64>, (count,): Writes<Self>) -> TaskResult {
        spin(Duration::from_micros(self.grain_us));
        if self.depth <= 1 {
            ctx.write(count, 1);
            return Ok(());
        }
        let child = Node {
            depth: self.depth - 1,
            ..self
        };
        let mut counts = Vec::with_capacity(self.fanout as usize);
        let mut previous: Option<Read<u64>> = None;
        for i in 0..self.fanout {
            let token = match previous {
                Some(p) if i < self.serial => vec![p],
                _ => Vec::new(),
            };
            let (c,) = ctx.spawn(child.clone(), token);
            previous = Some(c);
            counts.push(c);
        }
        ctx.spawn_delegate(Sum, counts, (count,));
        Ok(())
    }
}

/// Writes 1 + the sum of the children's counts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Sum;

impl Task for Sum {
    const NAME: &'static str = "knary.sum";
    type Inputs = Vec<u64>;
    type Outputs = (u64,);

    fn run(self, ctx: &mut Ctx<'_>, counts: Vec<u64>, (count,): Writes<Self>) -> TaskResult {
        ctx.write(count, 1 + counts.iter().sum::<u64>());
        Ok(())
    }
}

/// The environment variable that chooses [`spin`]'s clock: `wall` (the default) or `cpu`.
pub const GRAIN_CLOCK_ENV: &str = "KNARY_GRAIN_CLOCK";

/// The clock a node's grain is measured on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrainClock {
    /// The grain ends when that much time has passed, however much of it the node ran: with
    /// more runnable threads than cores, a preempted node does less work, and work the log
    /// takes from the nodes does not show as CPU.
    Wall,
    /// The grain ends when the node's thread has run that long (its CPU clock): every node
    /// does the same work whatever else runs, as the Cilk original's fixed loop, so a run's CPU
    /// beyond its grains is exactly the runtime's (and the log's).
    Cpu,
}

impl GrainClock {
    /// The clock [`GRAIN_CLOCK_ENV`] names (unset: [`GrainClock::Wall`]), or what is wrong with
    /// it.
    pub fn from_env() -> Result<GrainClock, String> {
        match std::env::var(GRAIN_CLOCK_ENV) {
            Err(std::env::VarError::NotPresent) => Ok(GrainClock::Wall),
            Ok(v) => GrainClock::parse(&v),
            Err(e) => Err(format!("{GRAIN_CLOCK_ENV}: {e}")),
        }
    }

    /// `wall` or `cpu`.
    pub fn parse(name: &str) -> Result<GrainClock, String> {
        match name {
            "wall" => Ok(GrainClock::Wall),
            "cpu" => Ok(GrainClock::Cpu),
            other => Err(format!("{GRAIN_CLOCK_ENV}={other:?}: expected wall or cpu")),
        }
    }

    /// The name [`GrainClock::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            GrainClock::Wall => "wall",
            GrainClock::Cpu => "cpu",
        }
    }
}

/// This process's grain clock, read from [`GRAIN_CLOCK_ENV`] once (a wrong value was refused
/// by [`Knary::validate`] before any node ran; here it falls back to the wall clock).
fn grain_clock() -> GrainClock {
    static CLOCK: std::sync::OnceLock<GrainClock> = std::sync::OnceLock::new();
    *CLOCK.get_or_init(|| GrainClock::from_env().unwrap_or(GrainClock::Wall))
}

/// Busy-waits for `grain` on this process's [`GrainClock`] (the Cilk original spins a fixed
/// loop; a time grain keeps the task size the same across machines).
pub fn spin(grain: Duration) {
    spin_on(grain_clock(), grain);
}

/// Busy-waits for `grain` on `clock`.
pub fn spin_on(clock: GrainClock, grain: Duration) {
    if grain.is_zero() {
        return;
    }
    match clock {
        GrainClock::Wall => {
            let t0 = Instant::now();
            while t0.elapsed() < grain {
                std::hint::spin_loop();
            }
        }
        GrainClock::Cpu => {
            // The thread's clock is a system call (the wall clock is not): spin on the wall
            // clock for what is left, at most CPU_SLICE at a time, then ask the thread's clock
            // how much of it ran. Unpreempted, the two agree and the grain ends on time.
            // Without a thread clock (never on Linux), what is left is spun on the wall clock.
            let Some(t0) = thread_cpu_time() else {
                return spin_on(GrainClock::Wall, grain);
            };
            let mut ran = Duration::ZERO;
            while ran < grain {
                spin_on(GrainClock::Wall, (grain - ran).min(CPU_SLICE));
                let Some(now) = thread_cpu_time() else {
                    return spin_on(GrainClock::Wall, grain.saturating_sub(ran));
                };
                ran = now.saturating_sub(t0);
            }
        }
    }
}

/// The longest stretch a CPU grain spins on the wall clock between two reads of the thread's
/// clock.
const CPU_SLICE: Duration = Duration::from_micros(20);

/// CPU time of the calling thread (`None` if the system cannot tell).
pub fn thread_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(ts.tv_sec).ok()?,
        u32::try_from(ts.tv_nsec).ok()?,
    ))
}

/// Nodes of a tree of depth `n` and fanout `k`: `(k^n - 1) / (k - 1)` (`n` when `k = 1`).
pub fn expected_nodes(depth: u32, fanout: u32) -> Option<u64> {
    let k = u64::from(fanout);
    if k == 1 {
        return Some(u64::from(depth));
    }
    let mut total: u64 = 0;
    let mut level: u64 = 1;
    for _ in 0..depth {
        total = total.checked_add(level)?;
        level = level.checked_mul(k)?;
    }
    Some(total)
}

/// Tasks of a run: every node, plus one [`Sum`] per internal node.
pub fn expected_tasks(depth: u32, fanout: u32) -> Option<u64> {
    let internal = if depth <= 1 {
        0
    } else {
        expected_nodes(depth - 1, fanout)?
    };
    expected_nodes(depth, fanout)?.checked_add(internal)
}

/// Largest tree the command line accepts: beyond this a run would not fit in memory anyway.
pub const MAX_TASKS: u64 = 1 << 34;

/// The knary program and its command-line parameters.
#[derive(Args, Clone, Debug, Serialize, Deserialize)]
pub struct Knary {
    /// Depth n of the tree (1 = a single leaf).
    #[arg(long, short = 'n', value_parser = clap::value_parser!(u32).range(1..=64))]
    pub depth: u32,
    /// Branching factor k.
    #[arg(long, short = 'k', value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub fanout: u32,
    /// Number r of children of every node that run one after the other (0..=k).
    #[arg(long, short = 'r', default_value_t = 0)]
    pub serial: u32,
    /// Busy-loop of every node, in µs (on the wall clock; KNARY_GRAIN_CLOCK=cpu measures it on
    /// the node's thread's CPU clock instead, so that every node does the same work)
    #[arg(long, short = 'g', default_value_t = 0)]
    pub grain_us: u64,
}

impl Program for Knary {
    const NAME: &'static str = "knary";
    const ABOUT: &'static str = env!("CARGO_PKG_DESCRIPTION");
    type Root = Node;

    fn register(registry: &mut Registry) -> Result<(), RegistryError> {
        registry.register::<Node>()?;
        registry.register::<Sum>()
    }

    fn validate(&self) -> Result<(), InvalidArgs> {
        GrainClock::from_env().map_err(InvalidArgs)?;
        if self.serial > self.fanout {
            return Err(InvalidArgs(format!(
                "--serial ({}) cannot exceed --fanout ({})",
                self.serial, self.fanout
            )));
        }
        match expected_tasks(self.depth, self.fanout) {
            Some(n) if n <= MAX_TASKS => Ok(()),
            _ => Err(InvalidArgs(format!(
                "a tree of depth {} and fanout {} has more than {MAX_TASKS} tasks",
                self.depth, self.fanout
            ))),
        }
    }

    fn root(&self) -> (Node, Vec<u64>) {
        let root = Node {
            depth: self.depth,
            fanout: self.fanout,
            serial: self.serial,
            grain_us: self.grain_us,
        };
        (root, Vec::new())
    }

    fn expected_tasks(&self) -> Option<u64> {
        expected_tasks(self.depth, self.fanout)
    }

    fn check(&self, (count,): &(u64,)) -> Result<serde_json::Value, WrongResult> {
        let expected = expected_nodes(self.depth, self.fanout).unwrap_or(u64::MAX);
        if *count == expected {
            Ok(serde_json::json!(count))
        } else {
            Err(WrongResult {
                expected: expected.to_string(),
                got: count.to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grain_clocks_parse_by_name() {
        for c in [GrainClock::Wall, GrainClock::Cpu] {
            assert_eq!(GrainClock::parse(c.name()), Ok(c));
        }
        let err = GrainClock::parse("CPU").unwrap_err();
        assert!(
            err.contains("KNARY_GRAIN_CLOCK") && err.contains("wall or cpu"),
            "{err}"
        );
    }

    /// A CPU grain is that much of the thread's CPU even when three spinners share one core,
    /// where a wall grain gives each about a third of it.
    #[test]
    fn a_cpu_grain_runs_its_whole_grain_on_a_shared_core() {
        let grain = Duration::from_millis(30);
        // SAFETY: sched_getcpu has no arguments; it names a CPU this thread may run on.
        let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(0);
        let spinners: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(move || {
                    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it, and
                    // sched_setaffinity(0) pins only the calling thread.
                    let pinned = unsafe {
                        let mut set: libc::cpu_set_t = std::mem::zeroed();
                        libc::CPU_SET(cpu, &mut set);
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
                    };
                    assert_eq!(pinned, 0, "sched_setaffinity");
                    let before = thread_cpu_time().expect("a thread clock");
                    spin_on(GrainClock::Cpu, grain);
                    thread_cpu_time().expect("a thread clock") - before
                })
            })
            .collect();
        for s in spinners {
            let ran = s.join().unwrap();
            assert!(ran >= grain, "a CPU grain of {grain:?} ran {ran:?}");
        }
    }

    #[test]
    fn counts_match_the_closed_form() {
        assert_eq!(expected_nodes(1, 5), Some(1));
        assert_eq!(expected_nodes(3, 2), Some(7));
        assert_eq!(expected_nodes(7, 5), Some((5u64.pow(7) - 1) / 4));
        assert_eq!(expected_nodes(4, 1), Some(4));
        assert_eq!(expected_tasks(3, 2), Some(7 + 3));
        assert_eq!(expected_tasks(1, 9), Some(1));
        assert_eq!(expected_nodes(64, 1_000_000), None);
    }
}

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

/// Busy-waits for `grain` (the Cilk original spins a fixed loop; a time grain keeps the task
/// size the same across machines).
pub fn spin(grain: Duration) {
    if grain.is_zero() {
        return;
    }
    let t0 = Instant::now();
    while t0.elapsed() < grain {
        std::hint::spin_loop();
    }
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
    /// Busy-loop of every node, in µs.
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

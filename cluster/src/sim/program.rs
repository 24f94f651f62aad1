//! The program the simulator runs: a tree of tasks whose leaves hash their path and whose
//! inner nodes combine their children's values in order, so that any lost, duplicated or
//! reordered value changes the result.

use serde::{Deserialize, Serialize};
use veriflow_runtime::{Ctx, Read, Registry, RegistryError, Task, TaskResult, Writes};

/// A node of the tree: a leaf at depth 0, else `fanout` children and a [`Combine`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Node {
    /// Levels below this node.
    pub depth: u32,
    /// Children per inner node.
    pub fanout: u32,
    /// This node's path, folded.
    pub path: u64,
}

impl Task for Node {
    const NAME: &'static str = "sim.node";
    type Inputs = ();
    type Outputs = (u64,);

    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        if self.depth == 0 {
            ctx.write(out, mix(self.path, 0x5eed));
            return Ok(());
        }
        let children: Vec<Read<u64>> = (0..self.fanout)
            .map(|i| {
                let (c,) = ctx.spawn(
                    Node {
                        depth: self.depth - 1,
                        fanout: self.fanout,
                        path: mix(self.path, u64::from(i) + 1),
                    },
                    (),
                );
                c
            })
            .collect();
        ctx.spawn_delegate(Combine { path: self.path }, children, (out,));
        Ok(())
    }
}

/// Combines the children's values in order.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Combine {
    /// The parent's path.
    pub path: u64,
}

impl Task for Combine {
    const NAME: &'static str = "sim.combine";
    type Inputs = Vec<u64>;
    type Outputs = (u64,);

    fn run(self, ctx: &mut Ctx<'_>, values: Vec<u64>, (out,): Writes<Self>) -> TaskResult {
        let v = values.iter().fold(self.path, |acc, &x| mix(acc, x));
        ctx.write(out, v);
        Ok(())
    }
}

/// The registry of the simulator's program.
pub fn registry() -> Result<Registry, RegistryError> {
    Registry::new().with::<Node>()?.with::<Combine>()
}

/// Tasks of a tree of `depth` levels below the root and `fanout` children per inner node.
pub fn tasks(depth: u32, fanout: u32) -> u64 {
    let f = u64::from(fanout);
    let mut level = 1u64;
    let mut nodes = 0u64;
    for _ in 0..=depth {
        nodes += level;
        level *= f;
    }
    let inner = nodes - level / f;
    nodes + inner
}

/// A 64-bit mix (splitmix64's finalizer over the pair).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(b)
        .wrapping_add(0x6a09_e667_f3bc_c909);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

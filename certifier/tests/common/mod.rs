//! The test program of the certifier's tests: a k-ary tree whose leaves write a value that
//! depends on their path and whose inner nodes sum their children.

use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use veriflow_runtime::{Ctx, Registry, Task, TaskResult, Writes};

/// Leaves spin 2 ms first, so that idle vnodes steal (set only while writing the pinned
/// fixture: it changes no byte of the log, only which vnode runs what).
pub(crate) static LEAF_WORK: AtomicBool = AtomicBool::new(false);

/// A k-ary tree: leaves write a value that depends on their path; inner nodes sum children.
#[derive(Serialize, Deserialize)]
pub(crate) struct Node {
    pub(crate) depth: u32,
    pub(crate) fanout: u32,
    pub(crate) path: u64,
}

impl Task for Node {
    const NAME: &'static str = "node";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        if self.depth == 0 {
            if LEAF_WORK.load(Ordering::Relaxed) {
                let start = std::time::Instant::now();
                while start.elapsed() < std::time::Duration::from_millis(2) {
                    std::hint::spin_loop();
                }
            }
            ctx.write(out, self.path.wrapping_mul(2_654_435_761) % 1_000_003);
            return Ok(());
        }
        let parts: Vec<_> = (0..self.fanout)
            .map(|i| {
                let (r,) = ctx.spawn(
                    Node {
                        depth: self.depth - 1,
                        fanout: self.fanout,
                        path: self.path * u64::from(self.fanout) + u64::from(i) + 1,
                    },
                    (),
                );
                r
            })
            .collect();
        ctx.spawn_delegate(Sum, parts, (out,));
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
pub(crate) struct Sum;

impl Task for Sum {
    const NAME: &'static str = "sum";
    type Inputs = Vec<u64>;
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, xs: Vec<u64>, (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, xs.iter().fold(0u64, |a, b| a.wrapping_add(*b)));
        Ok(())
    }
}

/// The registry of [`Node`] and [`Sum`].
pub(crate) fn registry() -> Registry {
    Registry::new()
        .with::<Node>()
        .unwrap()
        .with::<Sum>()
        .unwrap()
}

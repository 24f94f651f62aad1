//! Helpers shared by the integration tests.

use std::sync::Arc;

use veriflow::{Registry, Runtime, Store};

/// A 2-thread runtime for `program` on `vnodes` vnodes, logging into `store` if given.
pub(crate) fn runtime(
    registry: Registry,
    program: &str,
    vnodes: u32,
    seed: u64,
    store: Option<Arc<dyn Store>>,
) -> Runtime {
    let mut b = Runtime::builder(registry)
        .program(program)
        .threads(2)
        .vnodes(vnodes)
        .seed(seed);
    if let Some(s) = store {
        b = b.store(s);
    }
    b.build().unwrap()
}

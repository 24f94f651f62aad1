//! What both simulators share about the network: frames in flight, delivered earliest first
//! and, at one time, in the order they were sent (rule 1 of `sim` and of `sim::iterative`).

use std::time::Duration;

/// A frame in flight, due at `at`; `seq` orders frames due at the same time.
pub(super) struct InFlight<F> {
    pub(super) at: Duration,
    pub(super) seq: u64,
    pub(super) frame: F,
}

impl<F> PartialEq for InFlight<F> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<F> Eq for InFlight<F> {}
impl<F> PartialOrd for InFlight<F> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<F> Ord for InFlight<F> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Earliest first in a max-heap.
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

//! Small shared helpers.

/// Keeps a value on its own cache line pair (128 bytes: adjacent-line prefetch on x86 pulls
/// lines in pairs), so per-vnode counters written by different threads do not bounce.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

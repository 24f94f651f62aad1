//! graph (wip)

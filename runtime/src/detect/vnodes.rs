//! Broken processes as broken vnodes: what programs ask about (paper 004 §5.1).
//!
//! Programs name vnodes, not processes, so the question is "which vnodes of this set are
//! lost" (`ph_get_broken_vps`, `ph_exist_broken_vps`), and a receive from a lost vnode must
//! return an error instead of blocking (`PH_MSG_ERROR`): [`VnodeMap::check`].

use std::collections::BTreeMap;

use super::{Detector, DetectorHandle, DetectorThread, FdError, PeerId};
use crate::ids::VnodeId;

/// Anything that can tell whether a process is broken: a [`Detector`], or the shared view of
/// a [`DetectorThread`].
pub trait Liveness {
    /// Whether `peer` is Broken (rule 7 of `detect/mod.rs`).
    fn is_broken(&self, peer: PeerId) -> bool;
}

impl Liveness for Detector {
    fn is_broken(&self, peer: PeerId) -> bool {
        Detector::is_broken(self, peer)
    }
}

impl Liveness for DetectorHandle {
    fn is_broken(&self, peer: PeerId) -> bool {
        DetectorHandle::is_broken(self, peer)
    }
}

impl Liveness for DetectorThread {
    fn is_broken(&self, peer: PeerId) -> bool {
        self.handle().is_broken(peer)
    }
}

/// Which process runs each vnode (the coordinator's map, or a worker's copy of it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VnodeMap {
    map: BTreeMap<VnodeId, PeerId>,
}

impl VnodeMap {
    /// An empty map.
    pub fn new() -> Self {
        VnodeMap::default()
    }

    /// Maps `vnode` to `peer`; returns the process it was on before.
    pub fn insert(&mut self, vnode: VnodeId, peer: PeerId) -> Option<PeerId> {
        self.map.insert(vnode, peer)
    }

    /// Unmaps `vnode` (its messages are held until it is mapped again).
    pub fn remove(&mut self, vnode: VnodeId) -> Option<PeerId> {
        self.map.remove(&vnode)
    }

    /// The process running `vnode`.
    pub fn peer(&self, vnode: VnodeId) -> Option<PeerId> {
        self.map.get(&vnode).copied()
    }

    /// The vnodes `peer` runs, in increasing order.
    pub fn vnodes_of(&self, peer: PeerId) -> Vec<VnodeId> {
        self.map
            .iter()
            .filter(|&(_, &p)| p == peer)
            .map(|(&v, _)| v)
            .collect()
    }

    /// Number of mapped vnodes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no vnode is mapped.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every (vnode, process) pair, in vnode order.
    pub fn iter(&self) -> impl Iterator<Item = (VnodeId, PeerId)> + '_ {
        self.map.iter().map(|(&v, &p)| (v, p))
    }

    /// The vnodes of `set` that run on a broken process, in the order of `set`
    /// (`ph_get_broken_vps`). Unmapped vnodes are not broken: their messages wait for a map.
    pub fn broken_vnodes<L: Liveness + ?Sized>(
        &self,
        detector: &L,
        set: &[VnodeId],
    ) -> Vec<VnodeId> {
        set.iter()
            .copied()
            .filter(|&v| self.on_broken(detector, v))
            .collect()
    }

    /// Whether any vnode of `set` runs on a broken process (`ph_exist_broken_vps`).
    pub fn any_broken<L: Liveness + ?Sized>(&self, detector: &L, set: &[VnodeId]) -> bool {
        set.iter().any(|&v| self.on_broken(detector, v))
    }

    /// What a receive from `vnode` checks before it blocks: [`FdError::Broken`] if the vnode
    /// runs on a broken process.
    pub fn check<L: Liveness + ?Sized>(&self, detector: &L, vnode: VnodeId) -> Result<(), FdError> {
        if self.on_broken(detector, vnode) {
            Err(FdError::Broken(vnode))
        } else {
            Ok(())
        }
    }

    fn on_broken<L: Liveness + ?Sized>(&self, detector: &L, vnode: VnodeId) -> bool {
        self.peer(vnode).is_some_and(|p| detector.is_broken(p))
    }
}

impl FromIterator<(VnodeId, PeerId)> for VnodeMap {
    fn from_iter<I: IntoIterator<Item = (VnodeId, PeerId)>>(iter: I) -> Self {
        VnodeMap {
            map: iter.into_iter().collect(),
        }
    }
}

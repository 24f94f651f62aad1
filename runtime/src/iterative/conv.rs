//! Decentralized global convergence detection (paper 000 §3.3, its ref. [13]), as a pure state
//! machine: no I/O, no clock. The node loop (`node.rs`) feeds it local convergence, messages and
//! fresh answers, and sends what it returns.
//!
//! # Rules
//!
//! 1. **Tags.** Every message carries the [`Tag`] (step, round) it belongs to. A step is one
//!    phase of the computation (a time step); a round is one detection attempt inside it. The
//!    node loop discards messages of an older tag and leaves newer ones unacknowledged (the
//!    sender resends them once this node has caught up).
//! 2. **Detection.** The vnodes form a fixed spanning tree. A locally converged vnode that has
//!    received [`ConvKind::Partial`] from all its tree neighbours but one sends `Partial` to that
//!    one. A vnode that has it from all of them, and is locally converged, is the leader. When
//!    two neighbours send `Partial` to each other (the messages cross), both have it from all:
//!    the larger id leads.
//! 3. **Verification.** The leader floods [`ConvKind::Verify`] down the tree; every vnode
//!    forwards it to its other tree neighbours, answers once it has a fresh answer of its own
//!    (after a new round of data from every data neighbour, [`Conv::answer`]) and an
//!    [`ConvKind::Answer`] from each of its children, and sends the conjunction to the vnode it
//!    got `Verify` from. The leader floods the [`ConvKind::Verdict`].
//! 4. **Verdicts.** A positive verdict ends the step ([`Out::Verdict`]`(true)`): the caller moves
//!    to the next step and calls [`Conv::reset`]. A negative one starts round + 1 of the same step.
//! 5. **Idempotence.** Receiving a message twice changes nothing, so resending until
//!    acknowledged is safe. The whole state, with the messages not yet acknowledged, is
//!    serializable: it is the status backup that a replacement restores, after which
//!    [`Conv::resend_all`] re-creates every message the state implies.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ids::VnodeId;

/// Which detection attempt a message belongs to (rule 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Tag {
    /// Phase of the computation (a time step).
    pub step: u64,
    /// Detection attempt within the step.
    pub round: u32,
}

/// A convergence message (all are resent until acknowledged).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ConvKind {
    /// "My side of the tree is locally converged" (rule 2).
    Partial,
    /// The leader asks for a verification (rule 3).
    Verify,
    /// A subtree's verification answer (rule 3).
    Answer(bool),
    /// The leader's verdict (rule 4).
    Verdict(bool),
}

/// What the state machine asks its caller to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Out {
    /// Send this message (reliably) to that vnode, with the current tag.
    Send(VnodeId, ConvKind),
    /// A verification started here: compute a fresh answer and call [`Conv::answer`].
    NeedAnswer,
    /// The verdict of the current round reached this vnode.
    Verdict(bool),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Phase {
    Detect,
    Verify {
        /// The vnode `Verify` came from; `None` at the leader.
        parent: Option<VnodeId>,
        /// Children whose answer is still missing.
        waiting: BTreeSet<VnodeId>,
        /// Conjunction of the answers so far.
        all_ok: bool,
        /// This vnode's own answer, once computed.
        mine: Option<bool>,
        /// The answer (or the verdict, at the leader) has gone out.
        done: bool,
    },
}

/// The detection state of one vnode (rules 1-5).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Conv {
    me: VnodeId,
    tree: Vec<VnodeId>,
    tag: Tag,
    partial_from: BTreeSet<VnodeId>,
    partial_sent: Option<VnodeId>,
    phase: Phase,
}

impl Conv {
    /// A vnode with these tree neighbours, at step 0, round 0.
    pub(crate) fn new(me: VnodeId, tree: Vec<VnodeId>) -> Self {
        Conv {
            me,
            tree,
            tag: Tag { step: 0, round: 0 },
            partial_from: BTreeSet::new(),
            partial_sent: None,
            phase: Phase::Detect,
        }
    }

    /// The current tag.
    pub(crate) fn tag(&self) -> Tag {
        self.tag
    }

    /// Its tree neighbours.
    pub(crate) fn tree(&self) -> &[VnodeId] {
        &self.tree
    }

    /// Moves to `tag` with a fresh detection (rule 4).
    pub(crate) fn reset(&mut self, tag: Tag) {
        self.tag = tag;
        self.partial_from.clear();
        self.partial_sent = None;
        self.phase = Phase::Detect;
    }

    /// Rule 2, called once per iteration with the local convergence.
    pub(crate) fn poll(&mut self, locally_converged: bool) -> Vec<Out> {
        if !locally_converged || self.phase != Phase::Detect || self.partial_sent.is_some() {
            return Vec::new();
        }
        let missing: Vec<VnodeId> = self
            .tree
            .iter()
            .copied()
            .filter(|v| !self.partial_from.contains(v))
            .collect();
        match missing.as_slice() {
            [] => self.lead(),
            [only] => {
                self.partial_sent = Some(*only);
                vec![Out::Send(*only, ConvKind::Partial)]
            }
            _ => Vec::new(),
        }
    }

    /// A message of the current tag from `from` (rules 2-4).
    pub(crate) fn on_msg(&mut self, from: VnodeId, kind: ConvKind) -> Vec<Out> {
        match kind {
            ConvKind::Partial => {
                if !self.tree.contains(&from) {
                    return Vec::new();
                }
                self.partial_from.insert(from);
                // Crossing messages: the larger id leads (rule 2).
                if self.phase == Phase::Detect
                    && self.partial_sent == Some(from)
                    && self.me > from
                    && self.tree.iter().all(|v| self.partial_from.contains(v))
                {
                    return self.lead();
                }
                Vec::new()
            }
            ConvKind::Verify => {
                if self.phase != Phase::Detect {
                    return Vec::new(); // a duplicate
                }
                let waiting: BTreeSet<VnodeId> =
                    self.tree.iter().copied().filter(|&v| v != from).collect();
                let mut out: Vec<Out> = waiting
                    .iter()
                    .map(|&c| Out::Send(c, ConvKind::Verify))
                    .collect();
                self.phase = Phase::Verify {
                    parent: Some(from),
                    waiting,
                    all_ok: true,
                    mine: None,
                    done: false,
                };
                out.push(Out::NeedAnswer);
                out
            }
            ConvKind::Answer(ok) => {
                if let Phase::Verify {
                    waiting, all_ok, ..
                } = &mut self.phase
                {
                    if waiting.remove(&from) {
                        *all_ok &= ok;
                    }
                }
                self.complete()
            }
            ConvKind::Verdict(ok) => {
                let mut out: Vec<Out> = self
                    .tree
                    .iter()
                    .copied()
                    .filter(|&v| v != from)
                    .map(|c| Out::Send(c, ConvKind::Verdict(ok)))
                    .collect();
                out.push(Out::Verdict(ok));
                out
            }
        }
    }

    /// This vnode's fresh answer to the current verification (rule 3).
    pub(crate) fn answer(&mut self, ok: bool) -> Vec<Out> {
        if let Phase::Verify { mine, .. } = &mut self.phase {
            if mine.is_none() {
                *mine = Some(ok);
            }
        }
        self.complete()
    }

    /// The messages the state implies, for a replacement that restored it (rule 5).
    pub(crate) fn resend_all(&self) -> Vec<Out> {
        let mut out = Vec::new();
        if let Some(p) = self.partial_sent {
            out.push(Out::Send(p, ConvKind::Partial));
        }
        if let Phase::Verify {
            parent,
            waiting,
            all_ok,
            mine,
            done,
        } = &self.phase
        {
            out.extend(waiting.iter().map(|&c| Out::Send(c, ConvKind::Verify)));
            match (mine, done, parent) {
                (None, _, _) => out.push(Out::NeedAnswer),
                (Some(m), true, Some(p)) => {
                    out.push(Out::Send(*p, ConvKind::Answer(*all_ok && *m)));
                }
                _ => {}
            }
        }
        out
    }

    fn lead(&mut self) -> Vec<Out> {
        let waiting: BTreeSet<VnodeId> = self.tree.iter().copied().collect();
        let mut out: Vec<Out> = waiting
            .iter()
            .map(|&c| Out::Send(c, ConvKind::Verify))
            .collect();
        self.phase = Phase::Verify {
            parent: None,
            waiting,
            all_ok: true,
            mine: None,
            done: false,
        };
        out.push(Out::NeedAnswer);
        out
    }

    fn complete(&mut self) -> Vec<Out> {
        let Phase::Verify {
            parent,
            waiting,
            all_ok,
            mine: Some(mine),
            done,
        } = &mut self.phase
        else {
            return Vec::new();
        };
        if *done || !waiting.is_empty() {
            return Vec::new();
        }
        *done = true;
        let ok = *all_ok && *mine;
        match parent {
            Some(p) => vec![Out::Send(*p, ConvKind::Answer(ok))],
            None => {
                let mut out: Vec<Out> = self
                    .tree
                    .iter()
                    .map(|&c| Out::Send(c, ConvKind::Verdict(ok)))
                    .collect();
                out.push(Out::Verdict(ok));
                out
            }
        }
    }
}

/// The spanning tree of the data-neighbour graph: breadth first from the smallest vnode, each
/// vnode's tree neighbours in increasing order. Every vnode computes the same tree.
pub(crate) fn spanning_tree(neighbours: &[Vec<VnodeId>]) -> Vec<Vec<VnodeId>> {
    let n = neighbours.len();
    let mut tree = vec![Vec::new(); n];
    let mut seen = vec![false; n];
    for root in 0..n {
        if seen[root] {
            continue;
        }
        seen[root] = true;
        let mut queue = std::collections::VecDeque::from([root]);
        while let Some(u) = queue.pop_front() {
            let mut next: Vec<usize> = neighbours[u].iter().map(|v| v.0 as usize).collect();
            next.sort_unstable();
            for v in next {
                if v < n && !seen[v] {
                    seen[v] = true;
                    tree[u].push(VnodeId(v as u32));
                    tree[v].push(VnodeId(u as u32));
                    queue.push_back(v);
                }
            }
        }
        // A disconnected graph still gets one tree: join this component to the previous one.
        if root > 0 {
            let prev = VnodeId(0);
            let r = VnodeId(root as u32);
            tree[0].push(r);
            tree[root].push(prev);
        }
    }
    for t in &mut tree {
        t.sort_unstable();
        t.dedup();
    }
    tree
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    fn v(i: u32) -> VnodeId {
        VnodeId(i)
    }

    fn handle(
        i: usize,
        outs: Vec<Out>,
        answers: &[bool],
        queue: &mut VecDeque<(VnodeId, VnodeId, ConvKind)>,
        nodes: &mut [Conv],
        verdicts: &mut [Option<bool>],
    ) {
        let mut stack = outs;
        while let Some(o) = stack.pop() {
            match o {
                Out::Send(to, k) => queue.push_back((v(i as u32), to, k)),
                Out::NeedAnswer => stack.extend(nodes[i].answer(answers[i])),
                Out::Verdict(ok) => verdicts[i] = Some(ok),
            }
        }
    }

    /// Runs the protocol on a tree with every vnode locally converged and `answers` as their
    /// verification answers, delivering messages in an order drawn from `seed` (and each one
    /// twice, rule 5); returns how many vnodes led and the verdict each vnode saw.
    fn simulate(tree: &[Vec<VnodeId>], answers: &[bool], seed: u64) -> (usize, Vec<bool>) {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(seed);
        let n = tree.len();
        let mut nodes: Vec<Conv> = (0..n)
            .map(|i| Conv::new(v(i as u32), tree[i].clone()))
            .collect();
        let mut queue = VecDeque::new();
        let mut verdicts = vec![None; n];
        let mut led = vec![false; n];
        for _ in 0..10_000 {
            if queue.is_empty() || rng.random_bool(0.3) {
                let i = rng.random_range(0..n);
                let outs = nodes[i].poll(true);
                handle(i, outs, answers, &mut queue, &mut nodes, &mut verdicts);
            } else {
                let k = rng.random_range(0..queue.len());
                let (from, to, kind) = queue.remove(k).expect("in range");
                let i = to.0 as usize;
                let outs = nodes[i].on_msg(from, kind);
                handle(i, outs, answers, &mut queue, &mut nodes, &mut verdicts);
                if !matches!(kind, ConvKind::Verdict(_)) {
                    let snapshot = nodes[i].clone();
                    let again = nodes[i].on_msg(from, kind);
                    assert!(again.is_empty(), "a duplicate {kind:?} made {again:?}");
                    assert_eq!(nodes[i], snapshot);
                }
            }
            for (i, c) in nodes.iter().enumerate() {
                led[i] |= matches!(c.phase, Phase::Verify { parent: None, .. });
            }
            if verdicts.iter().all(Option::is_some) && queue.is_empty() {
                break;
            }
        }
        let verdicts = verdicts
            .into_iter()
            .map(|x| x.expect("every vnode gets the verdict"))
            .collect();
        (led.iter().filter(|&&l| l).count(), verdicts)
    }

    #[test]
    fn one_leader_and_one_verdict_for_all() {
        for n in 1..9u32 {
            let chain: Vec<Vec<VnodeId>> = (0..n)
                .map(|i| {
                    let mut t = Vec::new();
                    if i > 0 {
                        t.push(v(i - 1));
                    }
                    if i + 1 < n {
                        t.push(v(i + 1));
                    }
                    t
                })
                .collect();
            let tree = spanning_tree(&chain);
            assert_eq!(tree, chain);
            for seed in 0..50 {
                let (leaders, verdicts) = simulate(&tree, &vec![true; n as usize], seed);
                assert_eq!(leaders, 1, "n {n} seed {seed}");
                assert!(verdicts.iter().all(|&x| x), "n {n} seed {seed}");
                // One vnode answering no makes the verdict negative everywhere.
                let mut answers = vec![true; n as usize];
                answers[(seed % u64::from(n)) as usize] = false;
                let (_, verdicts) = simulate(&tree, &answers, seed);
                assert!(verdicts.iter().all(|&x| !x), "n {n} seed {seed}");
            }
        }
    }

    #[test]
    fn spanning_tree_of_a_grid_and_of_a_disconnected_graph() {
        // 2 x 3 grid.
        let g: Vec<Vec<VnodeId>> = vec![
            vec![v(1), v(3)],
            vec![v(0), v(2), v(4)],
            vec![v(1), v(5)],
            vec![v(0), v(4)],
            vec![v(1), v(3), v(5)],
            vec![v(2), v(4)],
        ];
        let t = spanning_tree(&g);
        let edges: usize = t.iter().map(Vec::len).sum();
        assert_eq!(edges, 2 * 5, "a tree on 6 vnodes has 5 edges");
        for seed in 0..30 {
            let (leaders, verdicts) = simulate(&t, &[true; 6], seed);
            assert_eq!(leaders, 1);
            assert!(verdicts.iter().all(|&x| x));
        }
        let t = spanning_tree(&[vec![], vec![]]);
        assert_eq!(t, vec![vec![v(1)], vec![v(0)]]);
    }

    #[test]
    fn restored_state_resends_what_it_implies() {
        let mut c = Conv::new(v(1), vec![v(0), v(2)]);
        assert!(c.poll(false).is_empty());
        assert!(c.on_msg(v(2), ConvKind::Partial).is_empty());
        assert_eq!(c.poll(true), vec![Out::Send(v(0), ConvKind::Partial)]);
        assert_eq!(c.resend_all(), vec![Out::Send(v(0), ConvKind::Partial)]);
        let outs = c.on_msg(v(0), ConvKind::Verify);
        assert_eq!(
            outs,
            vec![Out::Send(v(2), ConvKind::Verify), Out::NeedAnswer]
        );
        let bytes = postcard::to_stdvec(&c).unwrap();
        let restored: Conv = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(
            restored.resend_all(),
            vec![
                Out::Send(v(0), ConvKind::Partial),
                Out::Send(v(2), ConvKind::Verify),
                Out::NeedAnswer
            ]
        );
        let mut c = restored;
        assert!(c.answer(true).is_empty(), "waits for the child");
        assert_eq!(
            c.on_msg(v(2), ConvKind::Answer(true)),
            vec![Out::Send(v(0), ConvKind::Answer(true))]
        );
        assert!(
            c.on_msg(v(2), ConvKind::Answer(false)).is_empty(),
            "a duplicate"
        );
        assert_eq!(
            c.on_msg(v(0), ConvKind::Verdict(true)),
            vec![Out::Send(v(2), ConvKind::Verdict(true)), Out::Verdict(true)]
        );
    }
}

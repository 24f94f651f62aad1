//! The order in which the certifier draws tasks (rule 2 of the crate docs).
//!
//! Rules:
//!
//! 1. Every task gets a *priority*: SipHash-2-4 (a PRF made for short inputs) of its id under
//!    a [`DrawKey`], whose 128-bit key is derived with blake3. The draw takes the tasks of G_S
//!    in ascending priority. With the key unknown,
//!    priorities are independent and uniform, so the first k tasks are a uniform sample of k
//!    without replacement (bottom-k sampling), whatever n is.
//! 2. A task's priority depends on the key and its own id only, never on the other tasks: an
//!    online oracle can decide, the moment a task completes, whether it is among the first
//!    draws of whatever run the final log holds (`online.rs`), and anyone holding the key and
//!    the log can recompute the draw afterwards (`certificate.rs` rule 4).
//! 3. Keys: an offline certification's is derived from its 64-bit seed and the generation; an
//!    online oracle's from its 32-byte secret, committed to (blake3 of it) before the run and
//!    revealed in the certificate, and the generation. Spot checks of a worker's credibility
//!    use a separate key from the same secret, so they never bias the uniform draw.
//! 4. Ties (two equal 64-bit priorities) are broken by task id: the order is total.
//! 5. Cost: one SipHash per task (tens of nanoseconds), in parallel for large runs; the order
//!    is sorted lazily, in chunks that double, so taking the first k of n costs O(n), not
//!    O(n log n).

use rayon::prelude::*;
use veriflow_runtime::TaskId;

use crate::track::{Ix, Track};

/// The key of a draw (rules 1 and 3).
#[derive(Clone, PartialEq, Eq)]
pub struct DrawKey([u8; 16]);

impl std::fmt::Debug for DrawKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A draw key may be derived from an oracle's secret: never in a log line.
        f.write_str("DrawKey(..)")
    }
}

impl DrawKey {
    /// An offline certification's key: its seed and the generation drawn (rule 3).
    pub fn from_seed(seed: u64, generation: u32) -> DrawKey {
        let mut h = blake3::Hasher::new_derive_key("veriflow certifier draw seed v3");
        h.update(&seed.to_le_bytes());
        h.update(&generation.to_le_bytes());
        DrawKey(half(h.finalize().as_bytes()))
    }

    /// An online oracle's key for `generation`, from its secret (rule 3).
    pub fn from_secret(secret: &[u8; 32], generation: u32) -> DrawKey {
        let mut h = blake3::Hasher::new_keyed(secret);
        h.update(b"veriflow certifier draw secret v3");
        h.update(&generation.to_le_bytes());
        DrawKey(half(h.finalize().as_bytes()))
    }

    /// The key of an online oracle's credibility spot checks (rule 3).
    pub fn spot(secret: &[u8; 32]) -> DrawKey {
        let mut h = blake3::Hasher::new_keyed(secret);
        h.update(b"veriflow certifier spot check v3");
        DrawKey(half(h.finalize().as_bytes()))
    }

    /// The priority of `task` (rule 1).
    pub fn priority(&self, task: TaskId) -> u64 {
        use std::hash::Hasher;
        let mut h = siphasher::sip::SipHasher24::new_with_key(&self.0);
        h.write(&task.0.to_le_bytes());
        h.finish()
    }

    /// The priority of `task` as a number in [0, 1).
    pub fn uniform(&self, task: TaskId) -> f64 {
        // 53 random bits.
        (self.priority(task) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn half(key: &[u8; 32]) -> [u8; 16] {
    let mut k = [0u8; 16];
    k.copy_from_slice(&key[..16]);
    k
}

/// The commitment to an oracle's secret: blake3 of it (rule 3).
pub fn commitment(secret: &[u8; 32]) -> [u8; 32] {
    *blake3::hash(secret).as_bytes()
}

/// Positions in a list of tasks, in draw order (rules 1, 4 and 5).
#[derive(Debug)]
pub struct Draws {
    keyed: Vec<(u64, TaskId, u32)>,
    next: usize,
    /// `keyed[..sorted]` is sorted and holds the smallest priorities.
    sorted: usize,
}

/// Below this many tasks, priorities are computed on one thread.
const PARALLEL_FROM: usize = 1 << 14;

impl Draws {
    /// The positions of `ids` in draw order under `key`.
    pub fn of(ids: &[TaskId], key: &DrawKey) -> Draws {
        let one = |(i, &id): (usize, &TaskId)| (key.priority(id), id, i as u32);
        let keyed = if ids.len() < PARALLEL_FROM {
            ids.iter().enumerate().map(one).collect()
        } else {
            ids.par_iter().enumerate().map(one).collect()
        };
        Draws {
            keyed,
            next: 0,
            sorted: 0,
        }
    }

    /// The tasks `tasks` of `track` in draw order, as positions in `tasks`.
    pub fn of_track(track: &Track, tasks: &[Ix], key: &DrawKey) -> Draws {
        let ids: Vec<TaskId> = tasks.iter().map(|&t| track.id(t)).collect();
        Draws::of(&ids, key)
    }

    /// 0..n drawn as tasks `TaskId(0..n)` under the key of `seed` (generation 0).
    pub fn new(n: usize, seed: u64) -> Draws {
        let ids: Vec<TaskId> = (0..n as u128).map(TaskId).collect();
        Draws::of(&ids, &DrawKey::from_seed(seed, 0))
    }

    /// Rule 5: sorts the next chunk of smallest priorities.
    fn sort_more(&mut self) {
        let len = self.keyed.len();
        let end = len.min((self.sorted * 2).max(self.sorted + 256));
        let rest = &mut self.keyed[self.sorted..];
        if end < len {
            rest.select_nth_unstable(end - self.sorted - 1);
        }
        self.keyed[self.sorted..end].sort_unstable();
        self.sorted = end;
    }
}

impl Iterator for Draws {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.next >= self.keyed.len() {
            return None;
        }
        if self.next == self.sorted {
            self.sort_more();
        }
        let i = self.keyed[self.next].2;
        self.next += 1;
        Some(i as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_depend_on_the_key_and_the_task_only() {
        let a = DrawKey::from_seed(7, 0);
        assert_eq!(
            a.priority(TaskId(5)),
            DrawKey::from_seed(7, 0).priority(TaskId(5))
        );
        assert_ne!(
            a.priority(TaskId(5)),
            DrawKey::from_seed(7, 1).priority(TaskId(5))
        );
        assert_ne!(
            a.priority(TaskId(5)),
            DrawKey::from_seed(8, 0).priority(TaskId(5))
        );
        let s = [3u8; 32];
        assert_ne!(
            DrawKey::from_secret(&s, 0).priority(TaskId(5)),
            DrawKey::spot(&s).priority(TaskId(5)),
            "spot checks are drawn apart from the uniform draw"
        );
        assert_eq!(commitment(&s), *blake3::hash(&s).as_bytes());
    }

    /// A certificate's draw is re-derived by whoever verifies it, with whatever version they
    /// run: the order of a seed is pinned here, so that a dependency bump (blake3, siphasher;
    /// rand is not used) that changed it would fail this test instead of old certificates.
    #[test]
    fn the_draw_of_a_seed_is_pinned() {
        let order: Vec<usize> = Draws::new(12, 7).take(6).collect();
        assert_eq!(order, PINNED_SEED_7);
        let key = DrawKey::from_secret(&[3u8; 32], 1);
        let ids: Vec<TaskId> = (0..12u128).map(|t| TaskId(t << 64 | 0x5eed)).collect();
        let order: Vec<usize> = Draws::of(&ids, &key).take(6).collect();
        assert_eq!(order, PINNED_SECRET_3);
    }

    #[test]
    fn the_first_k_are_a_uniform_sample() {
        // Each of 20 tasks should be among the first 5 of the order a quarter of the time.
        let n = 20u128;
        let mut hits = [0u32; 20];
        let trials = 4000;
        for seed in 0..trials {
            let key = DrawKey::from_seed(seed, 0);
            let mut v: Vec<(u64, u128)> = (0..n).map(|t| (key.priority(TaskId(t)), t)).collect();
            v.sort_unstable();
            for &(_, t) in &v[..5] {
                hits[t as usize] += 1;
            }
        }
        for (t, &h) in hits.iter().enumerate() {
            let p = f64::from(h) / trials as f64;
            assert!(
                (p - 0.25).abs() < 0.035,
                "task {t} drawn first-5 with frequency {p}"
            );
        }
    }

    const PINNED_SEED_7: [usize; 6] = [3, 9, 10, 1, 7, 0];
    const PINNED_SECRET_3: [usize; 6] = [5, 4, 8, 3, 9, 0];
}

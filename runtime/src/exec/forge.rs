//! Forgery injection (paper 001 §V): a lying vnode that returns and logs wrong outputs, for
//! the certifier's tests and demos.
//!
//! Rules:
//!
//! 1. The choice is a pure function of (seed, task id): the same tasks are forged whatever
//!    the schedule, the number of threads or the failures. A task is forged when it is in
//!    [`Forge::tasks`], or else when it runs on one of [`Forge::vnodes`] (all vnodes if empty)
//!    and its hash falls below [`Forge::rate`].
//! 2. Only the outputs a task writes itself can be forged; a task that delegates all its
//!    outputs is never counted as forged.
//! 3. A forged value is plausible: the same type, a different value, canonically encoded (it
//!    decodes as the declared type and encodes back to the same bytes). It is made by flipping
//!    one bit of the honest encoding, at a seeded position.
//! 4. [`ForgeMode::Consistent`] sends and logs the same wrong value (a lying machine that
//!    covers its tracks: only re-execution finds it); [`ForgeMode::LogOnly`] logs a wrong value
//!    and sends the honest one (the structural check finds it: consumers logged another
//!    digest).

use crate::ids::{IdSet, TaskId, VnodeId};

/// How a forged task lies (rule 4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForgeMode {
    /// Sends and logs the same wrong value.
    #[default]
    Consistent,
    /// Logs a wrong value, sends the honest one.
    LogOnly,
}

/// Which tasks lie, and how (rules 1-4).
#[derive(Clone, Debug, Default)]
pub struct Forge {
    /// Vnodes that lie at `rate` (all vnodes if empty).
    pub vnodes: Vec<VnodeId>,
    /// Probability that a task run on one of `vnodes` is forged.
    pub rate: f64,
    /// Seed of the choice of tasks and of the flipped bits.
    pub seed: u64,
    /// Tasks forged whatever their vnode (e.g. drawn at random from a first run).
    pub tasks: IdSet<TaskId>,
    /// How they lie.
    pub mode: ForgeMode,
}

/// SplitMix64: a fast, well-mixed hash of a 64-bit word.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Forge {
    /// The per-task hash of rule 1.
    pub(crate) fn task_hash(&self, task: TaskId) -> u64 {
        mix(self.seed ^ mix(task.0 as u64) ^ mix((task.0 >> 64) as u64))
    }

    /// Whether `task`, run on `vnode`, lies (rule 1).
    pub fn selects(&self, vnode: VnodeId, task: TaskId) -> bool {
        if self.tasks.contains(&task) {
            return true;
        }
        if self.rate <= 0.0 || !(self.vnodes.is_empty() || self.vnodes.contains(&vnode)) {
            return false;
        }
        // 53 random bits as a uniform number in [0, 1).
        let u = (self.task_hash(task) >> 11) as f64 / (1u64 << 53) as f64;
        u < self.rate
    }
}

/// A plausible forgery of `bytes`, the encoding of a `T` (rule 3); `None` if no one-bit change
/// of it is another canonical `T` (e.g. `()` or `bool`-like types with nothing to flip).
pub(crate) fn forge_as<T: crate::task::Data>(bytes: &[u8], seed: u64) -> Option<Vec<u8>> {
    let n = bytes.len();
    if n == 0 {
        return None;
    }
    let start = (mix(seed) % n as u64) as usize;
    let first_bit = (mix(seed ^ 1) % 8) as u32;
    let mut candidate = bytes.to_vec();
    for j in 0..n.min(256) {
        let pos = (start + j) % n;
        for b in 0..8 {
            let bit = (first_bit + b) % 8;
            candidate[pos] ^= 1 << bit;
            let ok = crate::codec::decode::<T>(&candidate)
                .ok()
                .and_then(|v| crate::codec::encode(&v).ok())
                .is_some_and(|re| re == candidate);
            if ok {
                return Some(candidate);
            }
            candidate[pos] ^= 1 << bit;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;

    #[test]
    fn forged_values_have_the_type_and_differ() {
        for seed in 0..200u64 {
            let honest: u64 = 1_000 + seed;
            let bytes = codec::encode(&honest).unwrap();
            let f = forge_as::<u64>(&bytes, seed).expect("a u64 can be forged");
            let v: u64 = codec::decode(&f).unwrap();
            assert_ne!(v, honest);

            let honest = vec![1.5f64, -2.0, seed as f64];
            let bytes = codec::encode(&honest).unwrap();
            let f = forge_as::<Vec<f64>>(&bytes, seed).expect("floats can be forged");
            let v: Vec<f64> = codec::decode(&f).unwrap();
            assert_eq!(v.len(), 3, "same shape");
            assert_ne!(codec::encode(&v).unwrap(), bytes);

            let s = format!("word{seed}");
            let f = forge_as::<String>(&codec::encode(&s).unwrap(), seed).unwrap();
            let v: String = codec::decode(&f).unwrap();
            assert_ne!(v, s);
        }
        assert_eq!(forge_as::<()>(&[], 3), None);
    }

    #[test]
    fn selection_is_a_function_of_seed_and_task_with_the_asked_rate() {
        let f = Forge {
            vnodes: vec![VnodeId(1)],
            rate: 0.25,
            seed: 9,
            ..Forge::default()
        };
        let mut hits = 0;
        for i in 0..20_000u128 {
            let t = TaskId(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835));
            assert!(!f.selects(VnodeId(0), t), "other vnodes never lie");
            let s = f.selects(VnodeId(1), t);
            assert_eq!(s, f.selects(VnodeId(1), t));
            hits += u32::from(s);
        }
        // Binomial(20000, 0.25): sd ~ 61; 6 sd either side.
        assert!((4_634..=5_366).contains(&hits), "{hits}");
    }
}

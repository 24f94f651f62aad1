//! Identifiers: newtypes from one macro, each with a short `Display` that `Debug` reuses.
//!
//! Logical ids are deterministic (DESIGN.md, "Words"):
//!
//! 1. the root task's id is derived from the program name and the root's argument bytes;
//! 2. a child's id, and the id of its first output, from (parent id, spawn index): re-running a
//!    task re-creates the same ids, which is what makes logging idempotent and recovery
//!    possible;
//! 3. a datum's id is fixed when the task that declares it is spawned (delegating an output
//!    does not change its id): a child's first output by rule 2, its output `i >= 1` from
//!    (child id, `i`); the root's outputs from (root id, `i`), and program inputs from the
//!    root's id with a separate derivation context;
//! 4. the derivations of rules 2 and 3 (all but the root's) hash 20 bytes (an id, an index)
//!    under a derivation key: one blake3 block, whose compression this module computes itself
//!    (`compress`), bit for bit the `blake3` crate's (tests `one_block_compression_is_blake3s*`
//!    and `ids_are_pinned`).
//!
//! Ids are 128 bits from keyed blake3 (one key per derivation, so the name spaces never meet).
//! Rule 2 is the spawn path, so it is one blake3 compression per *pair* of spawns: the 64-byte
//! output block of the keyed hash of (parent, `index / 2`) holds the ids of children `2j` and
//! `2j + 1` and of their first outputs ([`ChildIds`] keeps the last block, so a task spawning
//! `n` children with one output each pays `n / 2` compressions instead of `2n`). Rule 4 is
//! what that compression costs: the crate's `Hasher`, set up, fed and read for one block, took
//! ~100 ns on the benchmark machine (its AVX-512 XOF path for a single block was 18 % of the
//! samples of a no-log knary run), the compression alone ~50 ns.
//!
//! Ids are uniformly distributed, so hash maps keyed by them use [`IdHasher`], which takes the
//! bits as they are instead of hashing them again.

use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

macro_rules! define_id {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        #[derive(Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        define_id!(@common $name($inner));
    };
    ($(#[$doc:meta])* $name:ident($inner:ty), bytes $bytes:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub $inner);

        define_id!(@common $name($inner));

        // Wide ids are random: fixed bytes encode them smaller than a varint would.
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.0.to_le_bytes().serialize(s)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <[u8; $bytes]>::deserialize(d).map(|b| $name(<$inner>::from_le_bytes(b)))
            }
        }

    };
    (@common $name:ident($inner:ty)) => {
        impl $name {
            /// The raw value.
            pub fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }
    };
}

define_id!(
    /// A task's logical id (rules 1-2).
    TaskId(u128), bytes 16
);
define_id!(
    /// A data object's logical id (rule 3).
    DataId(u128), bytes 16
);
define_id!(
    /// A virtual node: the unit that owns part of the graph and one event log.
    VnodeId(u32)
);
impl VnodeId {
    /// The certifier's oracle: where replayed and corrected tasks run (no vnode of a run).
    pub const ORACLE: VnodeId = VnodeId(u32::MAX);
}

define_id!(
    /// A vnode incarnation: messages from an older epoch are dropped (recovery fences with it).
    Epoch(u64)
);

/// Number of hex digits a short id shows: 48 bits tell apart the tasks of any run we print.
const SHORT_HEX: usize = 12;

macro_rules! wide_id_fmt {
    ($name:ident, $prefix:literal) => {
        impl fmt::Display for $name {
            /// `t:3fa9c2d1e0b4`; with `{:#}` all 32 hex digits (what `FromStr` reads back).
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let hex = format!("{:032x}", self.0);
                if f.alternate() {
                    write!(f, "{}:{}", $prefix, hex)
                } else {
                    write!(f, "{}:{}", $prefix, &hex[..SHORT_HEX])
                }
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;
            /// Reads `t:<32 hex digits>` or just the 32 hex digits.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let hex = s.strip_prefix(concat!($prefix, ":")).unwrap_or(s);
                veriflow_checkpoint::hex::decode::<16>(hex)
                    .map(|bytes| $name(u128::from_be_bytes(bytes)))
                    .map_err(|_| ParseIdError {
                        text: s.to_string(),
                    })
            }
        }
    };
}
wide_id_fmt!(TaskId, "t");
wide_id_fmt!(DataId, "d");

impl fmt::Display for VnodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == VnodeId::ORACLE {
            return f.write_str("oracle");
        }
        write!(f, "v{}", self.0)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// An id that could not be read from text.
#[derive(Debug, Clone, thiserror::Error)]
#[error("not a full id (expected 32 hex digits, optionally prefixed `t:` or `d:`): {text:?}")]
pub struct ParseIdError {
    text: String,
}

fn derive(context: &'static str, parts: &[&[u8]]) -> u128 {
    let mut h = blake3::Hasher::new_derive_key(context);
    for p in parts {
        h.update(p);
    }
    let mut out = [0u8; 16];
    h.finalize_xof().fill(&mut out);
    u128::from_le_bytes(out)
}

/// Keys for the per-id derivations below, computed once: `new_keyed` with a fixed key is the
/// cheap form of `new_derive_key` (one compression instead of two) on the per-spawn path.
fn key_for(context: &'static str) -> [u32; 8] {
    key_words(blake3::derive_key(context, b"veriflow ids v1"))
}

/// The first 128 bits of the keyed blake3 hash of `a` then `b`, little-endian (rule 4).
fn keyed(key: &[u32; 8], a: u128, b: u32) -> u128 {
    id_at(&compress(key, a, b), 0)
}

/// The 128-bit id in words `at..at + 4` of an output block (little-endian).
fn id_at(block: &[u32; 16], at: usize) -> u128 {
    u128::from(block[at])
        | u128::from(block[at + 1]) << 32
        | u128::from(block[at + 2]) << 64
        | u128::from(block[at + 3]) << 96
}

/// A derivation key as blake3 words (its chaining value for keyed hashing).
fn key_words(key: [u8; 32]) -> [u32; 8] {
    std::array::from_fn(|i| {
        u32::from_le_bytes([key[4 * i], key[4 * i + 1], key[4 * i + 2], key[4 * i + 3]])
    })
}

static CHILD_KEY: std::sync::OnceLock<[u32; 8]> = std::sync::OnceLock::new();
static OUTPUT_KEY: std::sync::OnceLock<[u32; 8]> = std::sync::OnceLock::new();
static INPUT_KEY: std::sync::OnceLock<[u32; 8]> = std::sync::OnceLock::new();

/// blake3's initialization vector (the SHA-256 one).
const IV: [u32; 8] = [
    0x6A09_E667,
    0xBB67_AE85,
    0x3C6E_F372,
    0xA54F_F53A,
    0x510E_527F,
    0x9B05_688C,
    0x1F83_D9AB,
    0x5BE0_CD19,
];

/// blake3's message schedule: the order of the block's words in each of its seven rounds (the
/// permutation applied round after round, written out so that every round indexes the block
/// by constants: the rounds unroll and the zero padding's additions fold away, 50 ns a
/// compression instead of 62 for a loop permuting the words).
const MSG_SCHEDULE: [[usize; 16]; 7] = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8],
    [3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1],
    [10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6],
    [12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4],
    [9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7],
    [11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13],
];

/// blake3's block flags of a one-block keyed hash: CHUNK_START | CHUNK_END | ROOT | KEYED_HASH.
const ONE_BLOCK_KEYED: u32 = 1 | 2 | 8 | 16;

/// Bytes of the input [`compress`] hashes: a 128-bit id and a 32-bit index.
const INPUT_LEN: u32 = 20;

/// blake3's quarter-round.
#[inline(always)]
fn g(s: &mut [u32; 16], [a, b, c, d]: [usize; 4], x: u32, y: u32) {
    s[a] = s[a].wrapping_add(s[b]).wrapping_add(x);
    s[d] = (s[d] ^ s[a]).rotate_right(16);
    s[c] = s[c].wrapping_add(s[d]);
    s[b] = (s[b] ^ s[c]).rotate_right(12);
    s[a] = s[a].wrapping_add(s[b]).wrapping_add(y);
    s[d] = (s[d] ^ s[a]).rotate_right(8);
    s[c] = s[c].wrapping_add(s[d]);
    s[b] = (s[b] ^ s[c]).rotate_right(7);
}

/// blake3's round `r` (columns, then diagonals).
#[inline(always)]
fn round(s: &mut [u32; 16], m: &[u32; 16], r: usize) {
    let w = &MSG_SCHEDULE[r];
    g(s, [0, 4, 8, 12], m[w[0]], m[w[1]]);
    g(s, [1, 5, 9, 13], m[w[2]], m[w[3]]);
    g(s, [2, 6, 10, 14], m[w[4]], m[w[5]]);
    g(s, [3, 7, 11, 15], m[w[6]], m[w[7]]);
    g(s, [0, 5, 10, 15], m[w[8]], m[w[9]]);
    g(s, [1, 6, 11, 12], m[w[10]], m[w[11]]);
    g(s, [2, 7, 8, 13], m[w[12]], m[w[13]]);
    g(s, [3, 4, 9, 14], m[w[14]], m[w[15]]);
}

/// Rule 4: the 64-byte output block (as little-endian words) of the keyed blake3 hash, with
/// key words `key`, of the 20 bytes `a` then `b` (little-endian): one compression of one
/// block, as blake3 specifies it (its reference implementation's `compress`, counter 0).
fn compress(key: &[u32; 8], a: u128, b: u32) -> [u32; 16] {
    // The block: the input's five words, zero-padded to sixteen. Truncations pick the words.
    let mut m = [0u32; 16];
    m[0] = a as u32;
    m[1] = (a >> 32) as u32;
    m[2] = (a >> 64) as u32;
    m[3] = (a >> 96) as u32;
    m[4] = b;
    let mut s = [
        key[0],
        key[1],
        key[2],
        key[3],
        key[4],
        key[5],
        key[6],
        key[7],
        IV[0],
        IV[1],
        IV[2],
        IV[3],
        0, // counter, low word
        0, // counter, high word
        INPUT_LEN,
        ONE_BLOCK_KEYED,
    ];
    round(&mut s, &m, 0);
    round(&mut s, &m, 1);
    round(&mut s, &m, 2);
    round(&mut s, &m, 3);
    round(&mut s, &m, 4);
    round(&mut s, &m, 5);
    round(&mut s, &m, 6);
    for i in 0..8 {
        s[i] ^= s[i + 8];
        s[i + 8] ^= key[i];
    }
    s
}

/// Children per output block of the spawn hash: the block is 64 bytes, and a child takes 32
/// (its task id and its first output's id).
const CHILDREN_PER_BLOCK: u32 = 2;

/// The ids of the children one parent spawns (rule 2), one compression per pair of spawn
/// indices: asking for `2j` and then `2j + 1` hashes once.
#[derive(Clone)]
pub struct ChildIds {
    parent: TaskId,
    /// Pair index of `block`, or `None` before the first child.
    pair: Option<u32>,
    /// `[task 2j | first output 2j | task 2j+1 | first output 2j+1]`, little-endian words.
    block: [u32; 16],
}

impl ChildIds {
    /// The children of `parent`.
    pub fn new(parent: TaskId) -> ChildIds {
        ChildIds {
            parent,
            pair: None,
            block: [0; 16],
        }
    }

    /// Child `index`: its task id and the id of its first output (used when it has outputs).
    pub fn get(&mut self, index: u32) -> (TaskId, DataId) {
        let pair = index / CHILDREN_PER_BLOCK;
        if self.pair != Some(pair) {
            let key = CHILD_KEY.get_or_init(|| key_for("veriflow 2026 child ids v2"));
            self.block = compress(key, self.parent.0, pair); // rule 4
            self.pair = Some(pair);
        }
        let at = 8 * (index % CHILDREN_PER_BLOCK) as usize;
        (
            TaskId(id_at(&self.block, at)),
            DataId(id_at(&self.block, at + 4)),
        )
    }
}

impl TaskId {
    /// Rule 1: the root of program `program` with encoded arguments `args`.
    pub fn root(program: &str, args: &[u8]) -> TaskId {
        TaskId(derive(
            "veriflow 2026 root task id",
            &[program.as_bytes(), &[0], args],
        ))
    }

    /// Rule 2: the `index`-th child spawned by `parent` (a task spawning many children uses
    /// one [`ChildIds`], which hashes once per pair).
    pub fn child(parent: TaskId, index: u32) -> TaskId {
        ChildIds::new(parent).get(index).0
    }
}

impl DataId {
    /// Rule 3: the id of output `index` of the `spawn`-th child of `parent`.
    pub fn child_output(parent: TaskId, spawn: u32, index: u32) -> DataId {
        let (child, first) = ChildIds::new(parent).get(spawn);
        if index == 0 {
            first
        } else {
            DataId::output(child, index)
        }
    }

    /// Rule 3: output `index` of the root `writer`, or output `index >= 1` of a child `writer`
    /// (a child's first output comes with its id, [`ChildIds::get`]).
    pub fn output(writer: TaskId, index: u32) -> DataId {
        let key = OUTPUT_KEY.get_or_init(|| key_for("veriflow 2026 output data id"));
        DataId(keyed(key, writer.0, index))
    }

    /// Rule 3: program input `index` of the run whose root is `root`.
    pub fn program_input(root: TaskId, index: u32) -> DataId {
        let key = INPUT_KEY.get_or_init(|| key_for("veriflow 2026 program input id"));
        DataId(keyed(key, root.0, index))
    }
}

/// A hasher for maps keyed by ids that are already uniformly random (see the module docs).
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys that are not ids (never in the runtime): mix in FNV style.
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u128(&mut self, v: u128) {
        // Truncation is the point: the low 64 bits of a blake3 output are as good as any.
        self.0 ^= v as u64;
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }
}

/// `HashMap` keyed by ids.
pub type IdMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// `HashSet` of ids.
pub type IdSet<K> = std::collections::HashSet<K, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_deterministic_and_distinct() {
        let root = TaskId::root("knary", b"args");
        assert_eq!(root, TaskId::root("knary", b"args"));
        assert_ne!(root, TaskId::root("knary", b"argz"));
        assert_ne!(
            root,
            TaskId::root("knar", b"yargs"),
            "program and args are separated"
        );
        let c0 = TaskId::child(root, 0);
        assert_eq!(c0, TaskId::child(root, 0));
        assert_ne!(c0, TaskId::child(root, 1));
        assert_ne!(DataId::output(root, 0).0, TaskId::child(root, 0).0);
        assert_ne!(DataId::output(root, 0), DataId::program_input(root, 0));
        assert_ne!(DataId::child_output(root, 0, 0).0, c0.0);
        assert_ne!(DataId::child_output(root, 0, 0), DataId::output(root, 0));
        let mut seen = IdSet::default();
        for i in 0..10_000 {
            assert!(seen.insert(TaskId::child(c0, i)));
        }
    }

    /// Every task id and data id of a tree (children of many parents, each child's outputs
    /// 0-2, the root's outputs and inputs) is distinct, as 128-bit values across the kinds.
    #[test]
    fn ids_of_a_tree_are_distinct_across_tasks_and_data() {
        let root = TaskId::root("knary", b"args");
        let mut seen = std::collections::HashSet::new();
        for i in 0..4 {
            assert!(seen.insert(DataId::output(root, i).0));
            assert!(seen.insert(DataId::program_input(root, i).0));
        }
        assert!(seen.insert(root.0));
        let mut parents = vec![root];
        for _ in 0..3 {
            let mut next = Vec::new();
            for &p in &parents {
                let mut ids = ChildIds::new(p);
                for index in 0..40 {
                    let (t, first) = ids.get(index);
                    assert!(seen.insert(t.0), "task {t:#} twice");
                    assert!(seen.insert(first.0), "data {first:#} twice");
                    for o in 1..3 {
                        assert!(seen.insert(DataId::output(t, o).0));
                    }
                    next.push(t);
                }
            }
            parents = next;
        }
        assert_eq!(seen.len(), 9 + (40 + 1_600 + 64_000) * 4);
    }

    /// The pinned values of the derivations: a change of any of them changes the ids in every
    /// log and certificate (the second and third fix `ids.rs` rule 2's pair blocks).
    #[test]
    fn ids_are_pinned() {
        let root = TaskId::root("knary", b"args");
        let hex = |v: u128| format!("{v:032x}");
        let got = [
            hex(root.0),
            hex(TaskId::child(root, 0).0),
            hex(DataId::child_output(root, 1, 0).0),
            hex(DataId::child_output(root, 2, 1).0),
            hex(DataId::output(root, 0).0),
            hex(DataId::program_input(root, 0).0),
        ];
        assert_eq!(got, PINNED, "{got:#?}");
    }

    const PINNED: [&str; 6] = [
        "d08b040beca26462cc316406e4eec328",
        "2905c066a22048784cfce3a55dddaaaf",
        "c3736c3f2014e2bbd91d46f2515e295a",
        "880b49ea332853198b2bb7fc652dd134",
        "9e7d84adb20842d873207a13b0c196e0",
        "51312c7801a870ac1a09f28ef2705f91",
    ];

    /// Rule 4: the compression here is blake3's: the whole 64-byte output block of a keyed
    /// hash of an id and an index, for any key, id and index (so the ids are those of the
    /// `blake3` crate, and of every log written before the rule).
    fn blake3_block(key: &[u8; 32], a: u128, b: u32) -> [u8; 64] {
        let mut h = blake3::Hasher::new_keyed(key);
        h.update(&a.to_le_bytes());
        h.update(&b.to_le_bytes());
        let mut out = [0u8; 64];
        h.finalize_xof().fill(&mut out);
        out
    }

    fn block_bytes(words: [u32; 16]) -> [u8; 64] {
        let mut out = [0u8; 64];
        for (o, w) in out.chunks_exact_mut(4).zip(words) {
            o.copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    #[test]
    fn one_block_compression_is_blake3s_for_the_derivation_keys() {
        for context in [
            "veriflow 2026 child ids v2",
            "veriflow 2026 output data id",
            "veriflow 2026 program input id",
        ] {
            let key = blake3::derive_key(context, b"veriflow ids v1");
            for (a, b) in [(0, 0), (u128::MAX, u32::MAX), (0x0123_4567_89ab_cdef, 7)] {
                assert_eq!(
                    block_bytes(compress(&key_words(key), a, b)),
                    blake3_block(&key, a, b)
                );
                let mut input = [0u8; 20];
                input[..16].copy_from_slice(&a.to_le_bytes());
                input[16..].copy_from_slice(&b.to_le_bytes());
                let want = blake3::keyed_hash(&key, &input);
                assert_eq!(
                    keyed(&key_words(key), a, b).to_le_bytes(),
                    want.as_bytes()[..16]
                );
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        #[test]
        fn one_block_compression_is_blake3s(
            key in proptest::prelude::any::<[u8; 32]>(),
            a in proptest::prelude::any::<u128>(),
            b in proptest::prelude::any::<u32>(),
        ) {
            proptest::prop_assert_eq!(
                block_bytes(compress(&key_words(key), a, b)),
                blake3_block(&key, a, b)
            );
        }

        /// One `ChildIds` asked in any order gives what a fresh derivation per child gives.
        #[test]
        fn child_ids_cache_agrees_with_fresh_derivation(
            parent in proptest::prelude::any::<u128>(),
            order in proptest::collection::vec(0u32..16, 1..24),
        ) {
            let parent = TaskId(parent);
            let mut ids = ChildIds::new(parent);
            for index in order {
                let (t, first) = ids.get(index);
                proptest::prop_assert_eq!(t, TaskId::child(parent, index));
                proptest::prop_assert_eq!(first, DataId::child_output(parent, index, 0));
                proptest::prop_assert_ne!(t.0, first.0);
            }
        }
    }

    #[test]
    fn ids_print_short_and_parse_full() {
        let id = TaskId::child(TaskId::root("p", b""), 3);
        let short = id.to_string();
        assert!(
            short.starts_with("t:") && short.len() == 2 + SHORT_HEX,
            "{short}"
        );
        let full = format!("{id:#}");
        assert_eq!(full.parse::<TaskId>().unwrap(), id);
        assert!(short.parse::<TaskId>().is_err());
        assert!("t:zz".parse::<TaskId>().is_err());
        // 32 characters, but a sign is not a hex digit (u128::from_str_radix took it).
        let signed = format!("t:+{}", &full[3..]);
        assert_eq!(signed.len(), full.len());
        assert!(signed.parse::<TaskId>().is_err(), "{signed}");
        assert_eq!(format!("{:?}", VnodeId(3)), "v3");
    }

    #[test]
    fn ids_serialize_as_fixed_bytes() {
        let id = DataId(0x0102_0304);
        let bytes = postcard::to_stdvec(&id).unwrap();
        assert_eq!(bytes.len(), 16);
        assert_eq!(postcard::from_bytes::<DataId>(&bytes).unwrap(), id);
    }
}

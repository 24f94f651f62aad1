use super::*;
use proptest::prelude::*;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use std::cell::Cell;
use std::thread::LocalKey;

fn blob(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

fn slots(frags: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    frags.iter().cloned().map(Some).collect()
}

/// Every subset of `n` slots of size at most `max`.
fn subsets(n: usize, max: usize) -> Vec<Vec<usize>> {
    (0u32..1 << n)
        .filter(|mask| mask.count_ones() as usize <= max)
        .map(|mask| (0..n).filter(|i| mask & (1 << i) != 0).collect())
        .collect()
}

/// Checks every pattern of up to K lost fragments, and every pattern of K + 1 lost.
fn exhaustive(codec: &Codec, sizes: &[usize]) -> usize {
    let n = codec.total_fragments();
    let k = codec.parity_fragments();
    let mut patterns = 0;
    for (seed, &len) in sizes.iter().enumerate() {
        let data = blob(len, seed as u64);
        let frags = codec.encode(&data, 7);
        assert_eq!(frags.len(), n);
        for lost in subsets(n, k + 1) {
            let mut s = slots(&frags);
            for &i in &lost {
                s[i] = None;
            }
            let r = codec.decode(&s);
            if lost.len() <= k {
                let d = r.unwrap_or_else(|e| panic!("{codec} len {len} lost {lost:?}: {e}"));
                assert_eq!(d.blob, data, "{codec} len {len} lost {lost:?}");
                assert_eq!(d.repair, lost);
                assert_eq!(d.stamp, 7);
                if len == sizes[0] {
                    patterns += 1;
                }
            } else {
                assert!(
                    matches!(r, Err(ErasureError::TooFewFragments { .. })),
                    "{codec} lost {lost:?}: {r:?}"
                );
            }
        }
    }
    patterns
}

const SIZES: &[usize] = &[
    1000,
    0,
    1,
    3,
    4 * 1024 + 7,
    STRIPE_BYTES + 13,
    3 * STRIPE_BYTES,
];

#[test]
fn rs_4_2_recovers_all_22_patterns() {
    let codec = Codec::ida(4, 2).unwrap();
    // 1 (none lost) + 6 (one lost) + 15 (two lost) = 22.
    assert_eq!(exhaustive(&codec, SIZES), 22);
}

#[test]
fn parity_4_recovers_every_single_loss() {
    let codec = Codec::parity(4).unwrap();
    assert_eq!(exhaustive(&codec, SIZES), 6);
}

#[test]
fn replication_3_recovers_any_two_losses() {
    let codec = Codec::replicate(3).unwrap();
    assert_eq!(exhaustive(&codec, SIZES), 7);
}

#[test]
fn flipped_byte_anywhere_counts_as_lost() {
    for codec in [
        Codec::ida(4, 2).unwrap(),
        Codec::parity(3).unwrap(),
        Codec::replicate(2).unwrap(),
    ] {
        let data = blob(5000, 1);
        let frags = codec.encode(&data, 3);
        for f in 0..frags.len() {
            // Every header byte, and a spread of payload bytes.
            let positions: Vec<usize> = (0..HEADER_LEN)
                .chain((HEADER_LEN..frags[f].len()).step_by(97))
                .chain([frags[f].len() - 1])
                .collect();
            for &pos in &positions {
                let mut s = slots(&frags);
                if let Some(b) = s[f].as_mut() {
                    b[pos] ^= 0x40;
                }
                let d = codec
                    .decode(&s)
                    .unwrap_or_else(|e| panic!("{codec} frag {f} pos {pos}: {e}"));
                assert_eq!(d.blob, data);
                assert_eq!(d.repair, vec![f], "{codec} frag {f} byte {pos}");
                assert_eq!(d.corrupt, vec![f]);
                // With K other fragments gone as well, the flip makes it unrecoverable.
                let k = codec.parity_fragments();
                let others: Vec<usize> = (0..frags.len()).filter(|&i| i != f).take(k).collect();
                for i in others {
                    s[i] = None;
                }
                assert!(matches!(
                    codec.decode(&s),
                    Err(ErasureError::TooFewFragments { .. })
                ));
            }
        }
    }
}

#[test]
fn truncated_extended_and_swapped_fragments_are_refused() {
    let codec = Codec::ida(3, 2).unwrap();
    let data = blob(10_000, 2);
    let frags = codec.encode(&data, 1);
    let mut s = slots(&frags);
    s[0].as_mut().unwrap().truncate(50);
    s[1].as_mut().unwrap().push(0);
    s.swap(2, 3); // a fragment in the wrong slot
    let r = codec.decode(&s);
    assert!(
        matches!(r, Err(ErasureError::TooFewFragments { have: 1, .. })),
        "{r:?}"
    );
    let mut s = slots(&frags);
    s.swap(3, 4);
    let d = codec.decode(&s).unwrap();
    assert_eq!(d.blob, data);
    assert_eq!(d.repair, vec![3, 4]);
}

#[test]
fn fragments_of_another_code_are_refused() {
    let a = Codec::ida(4, 2).unwrap();
    let b = Codec::ida(3, 3).unwrap();
    let frags = slots(&a.encode(b"abc", 1));
    assert!(b.decode(&frags).is_err());
    assert!(matches!(
        a.decode(&frags[..5]),
        Err(ErasureError::WrongFragmentCount {
            got: 5,
            expected: 6
        })
    ));
}

#[test]
fn versions_are_never_mixed() {
    let codec = Codec::ida(4, 2).unwrap();
    let old = blob(3000, 1);
    let new = blob(3000, 2);
    let fo = codec.encode(&old, 1);
    let fnew = codec.encode(&new, 2);
    // Three new fragments and three old: the newest version cannot be rebuilt, and the old one
    // is not returned in its place.
    let s: Vec<Option<Vec<u8>>> = (0..6)
        .map(|i| {
            Some(if i < 3 {
                fnew[i].clone()
            } else {
                fo[i].clone()
            })
        })
        .collect();
    let r = codec.decode(&s);
    assert!(
        matches!(
            r,
            Err(ErasureError::TooFewFragments {
                have: 3,
                need: 4,
                ..
            })
        ),
        "{r:?}"
    );
    // Four new and two old: the new version, with the old slots to repair.
    let s: Vec<Option<Vec<u8>>> = (0..6)
        .map(|i| {
            Some(if i != 1 && i != 4 {
                fnew[i].clone()
            } else {
                fo[i].clone()
            })
        })
        .collect();
    let d = codec.decode(&s).unwrap();
    assert_eq!(d.blob, new);
    assert_eq!(d.repair, vec![1, 4]);
    assert!(d.corrupt.is_empty());
}

#[test]
fn repair_by_reencoding_gives_identical_fragments() {
    let codec = Codec::ida(5, 3).unwrap();
    let data = blob(77_777, 9);
    let frags = codec.encode(&data, 42);
    let mut s = slots(&frags);
    s[0] = None;
    s[6] = None;
    let d = codec.decode(&s).unwrap();
    let again = codec.encode(&d.blob, d.stamp);
    assert_eq!(again, frags);
}

#[test]
fn bad_parameters_are_errors() {
    assert!(Codec::ida(0, 2).is_err());
    assert!(Codec::ida(2, 0).is_err());
    assert!(Codec::ida(200, 57).is_err());
    assert!(Codec::ida(200, 56).is_ok());
    assert!(Codec::parity(0).is_err());
    assert!(Codec::replicate(0).is_err());
}

#[test]
fn garbage_never_panics() {
    let codec = Codec::ida(2, 1).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for len in [0, 1, 93, 94, 95, 200] {
        let mut g = vec![0u8; len];
        rng.fill(&mut g[..]);
        if len >= 5 {
            g[..4].copy_from_slice(b"VFEC");
            g[4] = FORMAT_VERSION;
        }
        let s = vec![Some(g.clone()), Some(g.clone()), Some(g)];
        assert!(codec.decode(&s).is_err());
    }
}

fn code_strategy() -> impl Strategy<Value = Codec> {
    prop_oneof![
        (1usize..=31, 1usize..=31)
            .prop_filter("M + K ≤ 32", |(m, k)| m + k <= 32)
            .prop_map(|(m, k)| Codec::ida(m, k).unwrap()),
        (1usize..=31).prop_map(|m| Codec::parity(m).unwrap()),
        (1usize..=8).prop_map(|r| Codec::replicate(r).unwrap()),
    ]
}

fn len_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1usize),
        1usize..5000,
        (STRIPE_BYTES - 100)..(2 * STRIPE_BYTES + 100),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed), ..ProptestConfig::default() })]

    /// Up to K random losses and flips recover the exact bytes; K + 1 is a clean error.
    #[test]
    fn random_losses_up_to_k_recover(codec in code_strategy(), len in len_strategy(), seed in any::<u64>()) {
        let data = blob(len, seed);
        let frags = codec.encode(&data, seed);
        let n = codec.total_fragments();
        let k = codec.parity_fragments();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let lost = rng.random_range(0..=k);
        let mut s = slots(&frags);
        for &i in &order[..lost] {
            if rng.random_bool(0.5) {
                s[i] = None;
            } else if let Some(f) = s[i].as_mut() {
                let p = rng.random_range(0..f.len());
                f[p] ^= 1 << rng.random_range(0..8);
            }
        }
        let d = codec.decode(&s).map_err(|e| TestCaseError::fail(format!("{codec} len {len}: {e}")))?;
        prop_assert_eq!(&d.blob, &data);
        let mut want: Vec<usize> = order[..lost].to_vec();
        want.sort_unstable();
        prop_assert_eq!(d.repair, want);
        if lost == k && k < n {
            s[order[k]] = None;
            let too_few = matches!(codec.decode(&s), Err(ErasureError::TooFewFragments { .. }));
            prop_assert!(too_few);
        }
    }
}

/// Fragments written by format version 1 before the parallel coder (commit 01e0afb), as blake3
/// of every fragment of one blob in slot order: the bytes on the servers must not change, or
/// stored fragments would no longer read.
const FORMAT_1_FRAGMENTS: &[(&str, usize, &str)] = &[
    (
        "replicate(3)",
        0,
        "f9405b29b5acf59acfbe86798ca07d50767cc4b7f8b4799d9cad4cea170d685f",
    ),
    (
        "replicate(3)",
        1,
        "71a7e81f9829bb3ee97f078603cf59dc5509aded8a826f505b625ccd61f66ab0",
    ),
    (
        "replicate(3)",
        1025,
        "c47862b7f02a1a564cd32a82c8b0340a03b344ffc9ecd4fdfaefc9860b01ef98",
    ),
    (
        "replicate(3)",
        65536,
        "6fe48f5853bd8505abe827783ed549a13d392093270f53426269d8c43daf4aa2",
    ),
    (
        "replicate(3)",
        1048576,
        "13eb199d5392375f79704029db3808de3393031f0a2ff85f7282565bf97159dd",
    ),
    (
        "replicate(3)",
        790531,
        "d872cf774d1efbe279c1da89efdfd9b304bc4a728956a9eb0a2b32f39ed1f6d7",
    ),
    (
        "parity(9)",
        0,
        "166cda249e955018302132719bbb2fdccdd3c9808ec0925cf01b7bd84f4b1633",
    ),
    (
        "parity(9)",
        1,
        "8436aaad1ac02ca7c75ba613cfeeecb5e805e655c577497674371a98fa9e1661",
    ),
    (
        "parity(9)",
        1025,
        "d08cf65c350cf9ad53feb567a845ae24004eaecadc72d5b85151a80b487fd4f9",
    ),
    (
        "parity(9)",
        65536,
        "a7b6a178e2f7e9b4f71e76f36adae64ad68884c756c04866cd8c29f7c23a222c",
    ),
    (
        "parity(9)",
        1048576,
        "ef3733f9fb31ebd750c08e6d1c0fa8c1d5de361e5178f2f7d6134da2c4a42783",
    ),
    (
        "parity(9)",
        790531,
        "4387951088cbace3ef0ce838c811e7baeb82844eff658ce09dd0f9e1645d880d",
    ),
    (
        "ida(8,2)",
        0,
        "e5aa177dcde1ba605746dfa530256aa3ed804795c3dcd25ec260bb647aa590c0",
    ),
    (
        "ida(8,2)",
        1,
        "076ed70d992aed8aa787d9b89996d87e48f938c3e8254a6e2f360475366e6fe9",
    ),
    (
        "ida(8,2)",
        1025,
        "c504133cca4c067c7ac4cb18526149993da4c6a323d202c2ffc75c8cbe8f54f6",
    ),
    (
        "ida(8,2)",
        65536,
        "261ead4262235ffe072991b1488fdba24cac47b206a8f95d208750ec34dddc8b",
    ),
    (
        "ida(8,2)",
        1048576,
        "b59a40cc9665c230840f6e473c697a90971c7da04bcffc29841c55b745b72a51",
    ),
    (
        "ida(8,2)",
        790531,
        "48b6c1e10384fda7b880438bdf12ddaaf37a04bcd956eec3df9d24459fb72afd",
    ),
    (
        "ida(24,8)",
        0,
        "1d5a6a0e7d995dbfbb36a4e6939b5ad293f7a04e4ad6288abd264c71c3c5c5cf",
    ),
    (
        "ida(24,8)",
        1,
        "27d79f15acaf109669fdf7ee75b0bcb17d834e16454f7134c5e7bb038738e880",
    ),
    (
        "ida(24,8)",
        1025,
        "973c478c36648010be3965c019c84f8fa329ba3b7666efb38ea1ef5a4f68097f",
    ),
    (
        "ida(24,8)",
        65536,
        "f986e9dc765b3b5acb82368e68c5189c5e13e5598d848392b93ae50bc71a836d",
    ),
    (
        "ida(24,8)",
        1048576,
        "dd572b253b0d01a24084b273002c0f7bb7f5cec0bb2b2b1b464c118c6e925687",
    ),
    (
        "ida(24,8)",
        790531,
        "26c71a53ab6061606ca4f846c6d8c29edbfd04dadf4f3e1b1679d4481a5da8d2",
    ),
];

fn fragments_digest(codec: &Codec, len: usize) -> String {
    let data = blob(len, len as u64 ^ 0x5eed);
    let mut h = blake3::Hasher::new();
    for f in codec.encode(&data, 42) {
        h.update(&(f.len() as u64).to_le_bytes());
        h.update(&f);
    }
    h.finalize().to_hex().to_string()
}

fn golden_codecs() -> Vec<Codec> {
    vec![
        Codec::replicate(3).unwrap(),
        Codec::parity(9).unwrap(),
        Codec::ida(8, 2).unwrap(),
        Codec::ida(24, 8).unwrap(),
    ]
}

const GOLDEN_SIZES: &[usize] = &[0, 1, 1025, 64 << 10, 1 << 20, 3 * STRIPE_BYTES + 4099];

/// Rule 3: the format is unchanged by the parallel coder, on one thread and on several.
#[test]
fn fragments_are_byte_identical_to_format_1() {
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let codecs = golden_codecs();
            for &(name, len, want) in FORMAT_1_FRAGMENTS {
                let c = codecs.iter().find(|c| c.to_string() == name).unwrap();
                assert_eq!(
                    fragments_digest(c, len),
                    want,
                    "{name} len {len} on {threads} threads"
                );
            }
        });
    }
    assert_eq!(
        FORMAT_1_FRAGMENTS.len(),
        golden_codecs().len() * GOLDEN_SIZES.len()
    );
}

/// Rule 2: a piece's digest assembled from its blocks' chaining values is blake3 of the piece,
/// for every block count (one, powers of two and between) and a short or full last block.
#[test]
fn block_digests_merge_to_blake3_of_the_piece() {
    for w in [MIN_PIECE, 2 * MIN_PIECE, 32 * 1024] {
        for blocks in [1usize, 2, 3, 4, 5, 7, 8, 9, 16, 17] {
            for tail in [1, 1023, 1024, 1025, w - 1, w] {
                let len = (blocks - 1) * w + tail;
                let piece = blob(len, (w + blocks * 31 + tail) as u64);
                let whole = blocks == 1;
                let parts = piece
                    .chunks(w)
                    .enumerate()
                    .map(|(b, p)| block_digest(p, b * w, whole));
                assert_eq!(
                    piece_digest(parts, blocks),
                    *blake3::hash(&piece).as_bytes(),
                    "w {w} blocks {blocks} tail {tail}"
                );
            }
        }
    }
    assert_eq!(
        piece_digest(std::iter::empty(), 0),
        *blake3::hash(&[]).as_bytes()
    );
}

/// Runs `f` in a rayon pool of `threads` threads (the codec codes on the current pool).
fn on_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

/// The parallel path (pieces of many blocks, rule 2) on 1, 2 and 4 threads: encoding gives the
/// same fragments, any K lost data fragments are rebuilt, and a byte flipped in any block of
/// any fragment (the first, a middle and the last block, and the header) is caught by the
/// fragment's digest and counted as lost.
#[test]
fn parallel_coding_rebuilds_k_lost_and_catches_corruption() {
    for codec in [
        Codec::ida(8, 2).unwrap(),
        Codec::parity(9).unwrap(),
        Codec::ida(3, 3).unwrap(),
    ] {
        let (m, k) = (codec.data_fragments(), codec.parity_fragments());
        let data = blob(m * 5 * MIN_PIECE * 4 + 12_345, m as u64);
        let serial = on_threads(1, || codec.encode(&data, 9));
        for threads in [1, 2, 4] {
            on_threads(threads, || {
                let frags = codec.encode(&data, 9);
                assert_eq!(frags, serial, "{codec} on {threads} threads");
                // Every pattern of K lost data fragments that are consecutive, and the last K.
                for first in 0..=m.saturating_sub(k) {
                    let mut s = slots(&frags);
                    for slot in s.iter_mut().skip(first).take(k) {
                        *slot = None;
                    }
                    let d = codec.decode(&s).unwrap_or_else(|e| panic!("{codec}: {e}"));
                    assert_eq!(d.blob, data, "{codec} lost {first}.. on {threads} threads");
                    assert_eq!(d.repair, (first..first + k).collect::<Vec<_>>());
                }
                let len = frags[0].len();
                for f in [0, m - 1, m + k - 1] {
                    for pos in [5, HEADER_LEN, HEADER_LEN + len / 2, len - 1] {
                        let mut s = slots(&frags);
                        if let Some(b) = s[f].as_mut() {
                            b[pos] ^= 1;
                        }
                        let d = codec.decode(&s).unwrap();
                        assert_eq!(d.blob, data);
                        assert_eq!(d.corrupt, vec![f], "{codec} frag {f} byte {pos}");
                        // With K other data fragments gone too, the flip is one loss too many.
                        let mut gone = 0;
                        for (i, slot) in s.iter_mut().enumerate() {
                            if i != f && gone < k {
                                *slot = None;
                                gone += 1;
                            }
                        }
                        assert!(matches!(
                            codec.decode(&s),
                            Err(ErasureError::TooFewFragments { .. })
                        ));
                    }
                }
            });
        }
    }
}

/// Rule 5: a fragment that claims the chosen version's stamp and blob digest with another blob
/// length (a forged header with a valid fragment digest: the fragment digest is not a MAC) is
/// another version: outvoted and reported for repair, never copied into the blob.
#[test]
fn a_forged_length_is_another_version() {
    let codec = Codec::ida(4, 2).unwrap();
    let data = blob(40_000, 4);
    let frags = codec.encode(&data, 5);
    let mut h = parse_header(&frags[1]).unwrap();
    h.blob_len += 4 * 100;
    let mut forged = vec![0u8; HEADER_LEN];
    forged.extend_from_slice(&frags[1][HEADER_LEN..]);
    forged.resize(HEADER_LEN + (h.blob_len as usize).div_ceil(4), 7);
    let piece = *blake3::hash(&forged[HEADER_LEN..]).as_bytes();
    write_header(&mut forged[..HEADER_LEN], &h, &piece);
    assert!(verify_fragment(&forged).is_ok());
    for threads in [1, 2] {
        on_threads(threads, || {
            let mut s = slots(&frags);
            s[1] = Some(forged.clone());
            let d = codec.decode(&s).unwrap();
            assert_eq!(d.blob, data);
            assert_eq!(d.repair, vec![1]);
        });
    }
}

thread_local! {
    /// Calls of `on_coding_pool` from this thread (rule 2).
    pub(super) static DISPATCHED: Cell<u64> = const { Cell::new(0) };
    /// Calls of `Codec::rebuild` (a second pass over the blob) from this thread (rule 2).
    pub(super) static REBUILD_PASSES: Cell<u64> = const { Cell::new(0) };
}

/// Counts one event on this thread (the counters above).
pub(super) fn bump(counter: &'static LocalKey<Cell<u64>>) {
    counter.with(|c| c.set(c.get() + 1));
}

fn dispatched() -> u64 {
    DISPATCHED.with(Cell::get)
}

fn rebuild_passes() -> u64 {
    REBUILD_PASSES.with(Cell::get)
}

/// Rule 2: a log segment written or read back through a replicated store (one fragment, or a
/// few small ones) is coded on the calling thread; only large blobs go to a pool.
#[test]
fn small_or_single_fragment_codings_stay_on_the_calling_thread() {
    let blob: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let replicas = Codec::replicate(3).unwrap();
    let segment = &blob[..64 << 10];
    let before = dispatched();
    let one = Codec::replicate(1).unwrap().encode(segment, 1);
    let two = Codec::replicate(2).unwrap().encode(segment, 1);
    let small = Codec::ida(4, 2).unwrap().encode(segment, 1);
    assert_eq!(dispatched(), before, "a small encode woke the coding pool");
    for (codec, frags) in [(1, one), (2, two)] {
        let got: Vec<Option<Vec<u8>>> = frags.into_iter().map(Some).collect();
        let codec = Codec::replicate(codec).unwrap();
        assert_eq!(codec.decode(&got).unwrap().blob, segment);
    }
    let got: Vec<Option<Vec<u8>>> = small.into_iter().map(Some).collect();
    assert_eq!(
        Codec::ida(4, 2).unwrap().decode(&got).unwrap().blob,
        segment
    );
    let frags = replicas.encode(&blob, 1);
    assert!(dispatched() > before, "a 300 KB encode ran on one thread");
    let one: Vec<Option<&[u8]>> = vec![Some(&frags[0][..]), None, None];
    let ida = Codec::ida(4, 2).unwrap();
    let small: Vec<Option<Vec<u8>>> = ida.encode(&blob, 1).into_iter().map(Some).collect();
    let before = dispatched();
    assert_eq!(replicas.decode(&one).unwrap().blob, blob);
    assert_eq!(ida.decode(&small).unwrap().blob, blob);
    assert_eq!(dispatched(), before, "a small decode woke the coding pool");
    // A large blob in several fragments is still checked and copied in parallel.
    let large: Vec<u8> = (0..4_000_000u32).map(|i| (i % 253) as u8).collect();
    let frags: Vec<Option<Vec<u8>>> = ida.encode(&large, 2).into_iter().map(Some).collect();
    let before = dispatched();
    assert_eq!(ida.decode(&frags).unwrap().blob, large);
    assert!(dispatched() > before, "a large decode ran on one thread");
}

/// The coder of rule 1 and 3 without rule 2: whole pieces copied into zeroed buffers, coded in
/// one call, each hashed with `blake3::hash` after the coding. The fused, block-parallel coder
/// must give the same bytes.
fn reference_encode(codec: &Codec, blob: &[u8], stamp: u64) -> Vec<Vec<u8>> {
    let (m, k) = (codec.data_fragments(), codec.parity_fragments());
    let s = blob.len().div_ceil(m);
    let mut pieces: Vec<Vec<u8>> = (0..m + k).map(|_| vec![0u8; s]).collect();
    for (i, p) in pieces.iter_mut().take(m).enumerate() {
        let start = (i * s).min(blob.len());
        let end = ((i + 1) * s).min(blob.len());
        p[..end - start].copy_from_slice(&blob[start..end]);
    }
    let (data, parity) = pieces.split_at_mut(m);
    let ins: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
    codec.code().encode(&ins, &mut outs);
    let digests: Vec<[u8; 32]> = pieces.iter().map(|p| *blake3::hash(p).as_bytes()).collect();
    let blob_digest = codec.blob_digest(blob.len() as u64, &digests[..m]);
    pieces
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let h = FragmentHeader {
                kind: codec.kind(),
                m,
                k,
                index: i,
                blob_len: blob.len() as u64,
                stamp,
                blob_digest,
            };
            let mut f = vec![0u8; HEADER_LEN];
            write_header(&mut f, &h, &digests[i]);
            f.extend_from_slice(p);
            f
        })
        .collect()
}

/// The decoder of rules 4-6 without rule 2: every fragment checked whole
/// (`Codec::check_fragment`), the newest version chosen, its data pieces copied, lost ones
/// rebuilt from whole pieces in one call and hashed again. The one-pass decoder must give the
/// same answer, error or blob, stamp, repair and corrupt lists.
fn reference_decode(codec: &Codec, fragments: &[Option<Vec<u8>>]) -> Result<Decoded, ErasureError> {
    let (m, n) = (codec.data_fragments(), codec.total_fragments());
    let mut corrupt = Vec::new();
    let valid: Vec<Option<(FragmentHeader, [u8; 32])>> = fragments
        .iter()
        .enumerate()
        .map(
            |(i, f)| match f.as_ref().map(|b| codec.check_fragment(i, b)) {
                Some(Ok(v)) => Some(v),
                Some(Err(_)) => {
                    corrupt.push(i);
                    None
                }
                None => None,
            },
        )
        .collect();
    let best = newest(
        &valid
            .iter()
            .map(|v| v.as_ref().map(|(h, _)| h))
            .collect::<Vec<_>>(),
    );
    let chosen: Vec<bool> = valid
        .iter()
        .map(|v| matches!((v, best), (Some((h, _)), Some((id, _))) if version(h) == id))
        .collect();
    let have = chosen.iter().filter(|&&c| c).count();
    let repair: Vec<usize> = (0..n).filter(|&i| !chosen[i]).collect();
    let Some(((stamp, blob_digest, blob_len), _)) = best.filter(|_| have >= m) else {
        let missing = repair
            .iter()
            .copied()
            .filter(|i| !corrupt.contains(i))
            .collect();
        return Err(ErasureError::TooFewFragments {
            have,
            need: m,
            corrupt,
            missing,
        });
    };
    let s = (blob_len as usize).div_ceil(m);
    let mut pieces: Vec<Vec<u8>> = (0..n)
        .map(|i| match (chosen[i], &fragments[i]) {
            (true, Some(f)) => f[HEADER_LEN..].to_vec(),
            _ => vec![0u8; s],
        })
        .collect();
    let mut refs: Vec<&mut [u8]> = pieces.iter_mut().map(Vec::as_mut_slice).collect();
    codec.code().reconstruct_data(&mut refs, &chosen)?;
    let digests: Vec<[u8; 32]> = pieces[..m]
        .iter()
        .map(|p| *blake3::hash(p).as_bytes())
        .collect();
    if codec.blob_digest(blob_len, &digests) != blob_digest {
        return Err(ErasureError::Inconsistent("reference".into()));
    }
    let mut blob = pieces[..m].concat();
    blob.truncate(blob_len as usize);
    corrupt.retain(|i| repair.contains(i));
    Ok(Decoded {
        blob,
        stamp,
        repair,
        corrupt,
    })
}

/// Blob lengths that give pieces of one block, several blocks and a short last block.
fn fused_len_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..3000,
        3000usize..200_000,
        (4 * STRIPE_BYTES - 5000)..(4 * STRIPE_BYTES + 5000),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, rng_seed: proptest::test_runner::RngSeed::Fixed(0xf05e), ..ProptestConfig::default() })]

    /// Rule 2: the fused coder (copy, code and hash per block, on 1 or 2 threads, output never
    /// zeroed first) writes the same fragments, digests included, as the whole-piece reference.
    #[test]
    fn fused_encode_equals_the_whole_piece_reference(
        codec in code_strategy(), len in fused_len_strategy(), seed in any::<u64>(), threads in 1usize..=2,
    ) {
        let data = blob(len, seed);
        let got = on_threads(threads, || codec.encode(&data, seed));
        prop_assert!(got == reference_encode(&codec, &data, seed), "{} len {} on {} threads", codec, len, threads);
    }

    /// Rule 2: the one-pass decoder (headers first, the named version hashed and copied block by
    /// block) answers as the whole-fragment reference under random damage: lost fragments,
    /// flipped bits in header or piece, and fragments of an older, a newer or a forged-length
    /// version (so that the headers' guess is sometimes wrong).
    #[test]
    fn one_pass_decode_equals_the_whole_fragment_reference(
        codec in code_strategy(), len in fused_len_strategy(), seed in any::<u64>(), threads in 1usize..=2,
    ) {
        let data = blob(len, seed);
        let frags = codec.encode(&data, 10);
        let n = codec.total_fragments();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let other = blob(if rng.random_bool(0.5) { len } else { rng.random_range(0..2 * len + 2) }, !seed);
        let newer = codec.encode(&other, 11);
        let older = codec.encode(&other, 9);
        let mut s = slots(&frags);
        for i in 0..n {
            match rng.random_range(0..10) {
                0 => s[i] = None,
                1 => {
                    if let Some(f) = s[i].as_mut() {
                        let p = rng.random_range(0..f.len());
                        f[p] ^= 1 << rng.random_range(0..8);
                    }
                }
                2 => s[i] = Some(newer[i].clone()),
                3 => s[i] = Some(older[i].clone()),
                4 => {
                    // A newer header whose piece is another one: only the digest can tell.
                    let mut f = newer[i].clone();
                    f.truncate(HEADER_LEN);
                    f.extend(frags[i][HEADER_LEN..].iter().copied());
                    f.resize(newer[i].len(), 0);
                    if f != newer[i] {
                        s[i] = Some(f);
                    }
                }
                _ => {}
            }
        }
        let got = on_threads(threads, || codec.decode(&s));
        let want = reference_decode(&codec, &s);
        prop_assert!(got == want, "{} len {} on {} threads: {:?} vs {:?}", codec, len, threads,
            got.as_ref().map(|d| (d.stamp, &d.repair, &d.corrupt)), want.as_ref().map(|d| (d.stamp, &d.repair, &d.corrupt)));
    }
}

/// gf.rs: the GFNI kernel (where the CPU has it) and the crate's row-by-row products both give
/// the bytes of a byte-by-byte reference: every coefficient, 1 to 9 rows (more than one pass of
/// the kernel's accumulators), and lengths around its 64-byte columns.
#[test]
fn gf_products_equal_the_byte_by_byte_reference() {
    use reed_solomon_erasure::galois_8::mul;
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    eprintln!("GFNI kernel on this CPU: {}", gf::simd());
    let every: Vec<u8> = (0..=255).collect();
    let mut shapes: Vec<(usize, usize, Vec<u8>)> = vec![(1, 256, every)];
    for (rows, cols) in [(1, 1), (2, 8), (4, 4), (5, 3), (9, 7)] {
        let coefs = (0..rows * cols).map(|_| rng.random()).collect();
        shapes.push((rows, cols, coefs));
    }
    for (rows, cols, coefs) in shapes {
        let matrix = gf::GfMatrix::new(rows, cols, coefs.clone());
        for len in [0, 1, 63, 64, 65, 200, 4096 + 17] {
            let ins: Vec<Vec<u8>> = (0..cols)
                .map(|_| (0..len).map(|_| rng.random()).collect())
                .collect();
            let want: Vec<Vec<u8>> = (0..rows)
                .map(|r| {
                    (0..len)
                        .map(|b| {
                            (0..cols).fold(0, |acc, j| acc ^ mul(coefs[r * cols + j], ins[j][b]))
                        })
                        .collect()
                })
                .collect();
            let refs: Vec<&[u8]> = ins.iter().map(|i| &i[..]).collect();
            let mut auto = vec![vec![0xa5u8; len]; rows];
            let mut outs: Vec<&mut [u8]> = auto.iter_mut().map(|o| &mut o[..]).collect();
            matrix.mul_into(&refs, &mut outs).unwrap();
            assert_eq!(auto, want, "{rows}x{cols}, {len} bytes");
            let mut portable = vec![vec![0x5au8; len]; rows];
            let mut outs: Vec<&mut [u8]> = portable.iter_mut().map(|o| &mut o[..]).collect();
            matrix.mul_portable(&refs, &mut outs);
            assert_eq!(portable, want, "{rows}x{cols}, {len} bytes, portable");
        }
        // Unequal lengths or counts are an error, not a panic or a short product.
        let ins = [vec![1u8; 10], vec![2u8; 11]];
        let refs: Vec<&[u8]> = ins.iter().take(cols).map(|i| &i[..]).collect();
        let mut out = vec![vec![0u8; 10]; rows];
        let mut outs: Vec<&mut [u8]> = out.iter_mut().map(|o| &mut o[..]).collect();
        if cols != 1 {
            assert!(matrix.mul_into(&refs, &mut outs).is_err());
        }
    }
}

/// gf.rs: a matrix times its inverse is the identity; a singular matrix has none.
#[test]
fn gf_inverse_inverts() {
    use reed_solomon_erasure::galois_8::mul;
    let mut rng = ChaCha8Rng::seed_from_u64(18);
    let mut inverted = 0;
    for n in [1, 2, 3, 8, 12] {
        for _ in 0..20 {
            let coefs: Vec<u8> = (0..n * n).map(|_| rng.random()).collect();
            let a = gf::GfMatrix::new(n, n, coefs.clone());
            let Some(inv) = a.inverse() else { continue };
            inverted += 1;
            for r in 0..n {
                for c in 0..n {
                    let x = (0..n).fold(0, |acc, t| acc ^ mul(coefs[r * n + t], inv.row(t)[c]));
                    assert_eq!(x, u8::from(r == c), "{n}x{n} at ({r},{c})");
                }
            }
        }
    }
    assert!(inverted > 50);
    let singular = gf::GfMatrix::new(2, 2, vec![3, 5, 3, 5]);
    assert!(singular.inverse().is_none());
}

/// codes.rs: Reed-Solomon through [`gf::GfMatrix`] gives the `reed-solomon-erasure` crate's
/// parity bytes (its matrix read off at construction), and rebuilds every pattern of up to K
/// lost pieces, one pattern after another (the cached decoder follows the pattern), both
/// through `rebuild_data` (pieces read in place) and `reconstruct_data`.
#[test]
fn reed_solomon_code_gives_the_crates_bytes_and_rebuilds_every_pattern() {
    use reed_solomon_erasure::galois_8::ReedSolomon;
    let mut rng = ChaCha8Rng::seed_from_u64(19);
    for (m, k) in [(1, 1), (4, 2), (8, 2), (3, 6), (6, 5)] {
        let code = ReedSolomonCode::new(m, k).unwrap();
        let rs: ReedSolomon = ReedSolomon::new(m, k).unwrap();
        for len in [1, 64, 1000] {
            let data: Vec<Vec<u8>> = (0..m)
                .map(|_| (0..len).map(|_| rng.random()).collect())
                .collect();
            let ins: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            let mut want = vec![vec![0u8; len]; k];
            rs.encode_sep(&ins, &mut want).unwrap();
            let mut got = vec![vec![0u8; len]; k];
            let mut outs: Vec<&mut [u8]> = got.iter_mut().map(|o| &mut o[..]).collect();
            code.encode(&ins, &mut outs);
            assert_eq!(got, want, "ida({m},{k}) parity of {len} bytes");
            let all: Vec<Vec<u8>> = data.iter().chain(&want).cloned().collect();
            for lost in subsets(m + k, k) {
                let present: Vec<bool> = (0..m + k).map(|i| !lost.contains(&i)).collect();
                let pieces: Vec<Option<&[u8]>> = (0..m + k)
                    .map(|i| present[i].then_some(&all[i][..]))
                    .collect();
                let mut rebuilt = vec![vec![0u8; len]; m];
                let mut targets: Vec<(usize, &mut [u8])> = rebuilt
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| !present[*i])
                    .map(|(i, o)| (i, &mut o[..]))
                    .collect();
                code.rebuild_data(&pieces, &mut targets).unwrap();
                for i in (0..m).filter(|&i| !present[i]) {
                    assert_eq!(rebuilt[i], data[i], "ida({m},{k}) lost {lost:?}");
                }
                let mut scratch: Vec<Vec<u8>> = (0..m + k)
                    .map(|i| {
                        if present[i] {
                            all[i].clone()
                        } else {
                            vec![0; len]
                        }
                    })
                    .collect();
                let mut refs: Vec<&mut [u8]> = scratch.iter_mut().map(|p| &mut p[..]).collect();
                code.reconstruct_data(&mut refs, &present).unwrap();
                assert_eq!(&scratch[..m], &data[..], "ida({m},{k}) lost {lost:?}");
            }
            // K + 1 lost is too few.
            let pieces: Vec<Option<&[u8]>> =
                (0..m + k).map(|i| (i > k).then_some(&all[i][..])).collect();
            let mut out = vec![0u8; len];
            let mut targets = vec![(0, &mut out[..])];
            assert!(matches!(
                code.rebuild_data(&pieces, &mut targets),
                Err(ErasureError::TooFewFragments { .. })
            ));
        }
    }
}

/// Rule 2: lost data pieces are rebuilt in the decoder's one pass when the headers' guess
/// holds; when a bad fragment among the guessed ones is found by its digest, the lost pieces
/// are rebuilt again from the chosen ones, and the blob is still exact.
#[test]
fn lost_data_is_rebuilt_in_the_one_pass_unless_a_guessed_fragment_is_bad() {
    for codec in [Codec::ida(8, 2).unwrap(), Codec::ida(4, 3).unwrap()] {
        let data = blob(3 * STRIPE_BYTES + 999, 21);
        let frags = codec.encode(&data, 3);
        for threads in [1, 2] {
            on_threads(threads, || {
                let mut s = slots(&frags);
                s[1] = None;
                let before = rebuild_passes();
                let d = codec.decode(&s).unwrap();
                assert_eq!(d.blob, data);
                assert_eq!(rebuild_passes(), before, "{codec}: a second pass");
                // Fragment 2's header is intact, so the first pass uses it; its digest fails.
                let last = s[2].as_ref().map_or(0, Vec::len) - 1;
                if let Some(b) = s[2].as_mut() {
                    b[last] ^= 0x40;
                }
                let d = codec.decode(&s).unwrap();
                assert_eq!(d.blob, data, "{codec} on {threads} threads");
                assert_eq!(d.repair, vec![1, 2]);
                assert_eq!(d.corrupt, vec![2]);
                assert_eq!(rebuild_passes(), before + 1, "{codec}: no second pass");
            });
        }
    }
}

/// codes.rs: the one-pass XOR of many pieces equals XORing them one by one, tails included.
#[test]
fn xor_all_equals_pairwise_xor() {
    for len in [0, 1, 8, 63, 64, 65, 1000] {
        for count in [0, 1, 2, 9] {
            let ins: Vec<Vec<u8>> = (0..count).map(|i| blob(len, 100 + i as u64)).collect();
            let mut want = vec![0u8; len];
            for i in &ins {
                codes::xor_into(&mut want, i);
            }
            let mut got = vec![0xffu8; len];
            codes::xor_all(ins.iter().map(|i| &i[..]), &mut got);
            assert_eq!(got, want, "{count} pieces of {len} bytes");
        }
    }
}

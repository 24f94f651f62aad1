use super::*;
use proptest::prelude::*;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

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

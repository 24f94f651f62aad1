//! Property tests of the Matrix Market and Harwell-Boeing readers on outside bytes (issue 13
//! point 11): arbitrary bytes, arbitrary headers, and damaged copies of the test matrices never
//! panic, and what parses is no larger than its text can describe (matrix rule 4: sizes are
//! checked against the file's length before anything is allocated).

use proptest::prelude::*;
use veriflow_checkpoint::fuzzing::{damage, damages, Damage};

const MTX: &str = include_str!("data/lund_a.mtx");
const RSA: &str = include_str!("data/lund_a.rsa");
const RUA: &str = include_str!("data/utm300.rua");

/// Parses `bytes` and checks that a matrix read is bounded by the text.
fn check(bytes: &[u8]) {
    if let Ok(m) = cg::matrix::parse("fuzz", bytes) {
        let a = &m.matrix;
        // Every stored entry came from at least one field of the text (symmetric files are
        // mirrored: at most twice).
        assert!(
            a.nnz() <= 2 * bytes.len(),
            "{} entries from {} bytes",
            a.nnz(),
            bytes.len()
        );
        let vectors: usize = m
            .rhs
            .iter()
            .chain(&m.guesses)
            .chain(&m.exact)
            .map(Vec::len)
            .sum();
        assert!(
            vectors <= bytes.len(),
            "{vectors} vector values from {} bytes",
            bytes.len()
        );
    }
}

/// A Matrix Market header with arbitrary size fields, then a few entries.
fn mm_with(size: &str, body: &str, kind: &str) -> String {
    format!("%%MatrixMarket matrix coordinate {kind}\n% c\n{size}\n{body}")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_break_the_matrix_readers(data in prop::collection::vec(any::<u8>(), 0..512)) {
        check(&data);
        let mut mm = b"%%MatrixMarket matrix coordinate real general\n".to_vec();
        mm.extend_from_slice(&data);
        check(&mm);
    }

    #[test]
    fn arbitrary_sizes_never_allocate_beyond_the_text(
        rows in any::<u64>(), cols in any::<u64>(), entries in any::<u64>(),
        kind in prop::sample::select(vec!["real general", "pattern symmetric", "integer skew-symmetric"]),
        body in "([0-9]{1,3} [0-9]{1,3} -?[0-9]\\.[0-9]\n){0,5}",
    ) {
        for size in [format!("{rows} {cols} {entries}"), format!("{} {} {}", rows % 50, cols % 50, entries % 8)] {
            check(mm_with(&size, &body, kind).as_bytes());
        }
    }

    #[test]
    fn damaged_matrix_files_never_break_the_readers(d in damages(), which in 0usize..3) {
        let good = [MTX, RSA, RUA][which];
        check(&damage(good.as_bytes(), &d));
        // Damage aimed at the headers, where the sizes and formats are.
        let head = good.len().min(400);
        let d: Vec<Damage> = d.into_iter().map(|(k, at, len, w)| (k, at % head, len, w)).collect();
        check(&damage(good.as_bytes(), &d));
    }
}

//! Matrix Market and Harwell-Boeing files (the first byte picks a header to prepend, so both
//! readers are reached quickly from any input).
#![no_main]
use libfuzzer_sys::fuzz_target;

fn check(bytes: &[u8]) {
    if let Ok(m) = cg::matrix::parse("fuzz", bytes) {
        assert!(m.matrix.nnz() <= 2 * bytes.len());
        let vectors: usize = m.rhs.iter().chain(&m.guesses).chain(&m.exact).map(Vec::len).sum();
        assert!(vectors <= bytes.len());
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let prefix: &[u8] = match pick % 4 {
        0 => b"",
        1 => b"%%MatrixMarket matrix coordinate real general\n",
        2 => b"%%MatrixMarket matrix coordinate pattern symmetric\n",
        _ => b"TITLE                                                                   KEY     \n",
    };
    let mut bytes = prefix.to_vec();
    bytes.extend_from_slice(rest);
    check(&bytes);
});

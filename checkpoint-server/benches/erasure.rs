//! Encode and decode throughput on one core (paper 003 Fig. 2 analog):
//! `cargo bench -p veriflow-checkpoint --bench erasure`.
//!
//! Decode is measured twice: with every data fragment present (the common case: digests only)
//! and with the first K data fragments lost (the rebuild path).

#![allow(missing_docs)] // criterion's macros generate undocumented items

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use veriflow_checkpoint::erasure::Codec;

fn codecs() -> Vec<(&'static str, Codec)> {
    vec![
        ("parity(9)", Codec::parity(9).expect("valid")),
        ("ida(9,1)", Codec::ida(9, 1).expect("valid")),
        ("ida(8,2)", Codec::ida(8, 2).expect("valid")),
        ("ida(24,8)", Codec::ida(24, 8).expect("valid")),
    ]
}

const SIZES: [(&str, usize); 3] = [("64KiB", 64 << 10), ("1MiB", 1 << 20), ("16MiB", 16 << 20)];

fn bench(c: &mut Criterion) {
    for (name, codec) in codecs() {
        let mut g = c.benchmark_group(name);
        for (label, len) in SIZES {
            let blob: Vec<u8> = (0..len).map(|i| (i * 131 + i / 7) as u8).collect();
            g.throughput(Throughput::Bytes(len as u64));
            g.bench_with_input(BenchmarkId::new("encode", label), &blob, |b, blob| {
                b.iter(|| codec.encode(blob, 1))
            });
            let frags: Vec<Option<Vec<u8>>> =
                codec.encode(&blob, 1).into_iter().map(Some).collect();
            g.bench_with_input(BenchmarkId::new("decode", label), &frags, |b, f| {
                b.iter(|| codec.decode(f).expect("decodes"))
            });
            let mut lost = frags.clone();
            for slot in lost.iter_mut().take(codec.parity_fragments()) {
                *slot = None;
            }
            g.bench_with_input(BenchmarkId::new("rebuild", label), &lost, |b, f| {
                b.iter(|| codec.decode(f).expect("decodes"))
            });
        }
        // The code alone (no framing, no digests): M pieces of 1 MiB / M in, K pieces out.
        let code = codec.code();
        let m = code.data_pieces();
        let piece = (1usize << 20) / m;
        let data: Vec<Vec<u8>> = (0..m).map(|i| vec![i as u8; piece]).collect();
        let ins: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let mut parity: Vec<Vec<u8>> = vec![vec![0u8; piece]; code.parity_pieces()];
        g.throughput(Throughput::Bytes((piece * m) as u64));
        g.bench_function("code-only/1MiB", |b| {
            b.iter(|| {
                let mut outs: Vec<&mut [u8]> =
                    parity.iter_mut().map(|p| p.as_mut_slice()).collect();
                code.encode(&ins, &mut outs)
            })
        });
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(std::time::Duration::from_secs(1)).warm_up_time(std::time::Duration::from_millis(300));
    targets = bench
}
criterion_main!(benches);

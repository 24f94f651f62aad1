//! Cost of one message on the wire (wire.rs), sender and receiver on one core, over an
//! in-memory stream so that only the framing and the cryptography are measured:
//! `cargo bench -p veriflow-checkpoint --bench wire`. Results: bench/results/transport_wire.md.
//!
//! It uses only the public API (`Connection::{client, server, send, recv}`), so the same file
//! measures an older wire.rs built from git, for comparison.

#![allow(missing_docs)] // criterion's macros generate undocumented items

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde::{Deserialize, Serialize};
use tokio::io::DuplexStream;
use veriflow_checkpoint::wire::{Connection, Role};
use veriflow_checkpoint::Key;

/// A payload of bytes, as the log's segments and the cluster's task records travel.
#[derive(Serialize, Deserialize)]
struct Blob(#[serde(with = "serde_bytes")] Vec<u8>);

/// 100 bytes (a small control message: a heartbeat, a steal request) and 64 KiB (a log segment).
const SIZES: [(&str, usize); 2] = [("100B", 100), ("64KiB", 64 << 10)];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn pair(key: &Key) -> (Connection<DuplexStream>, Connection<DuplexStream>) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let k = key.clone();
    let server =
        tokio::spawn(
            async move { Connection::server(b, &k, Role::CheckpointServer, 1 << 20).await },
        );
    let client = Connection::client(a, key, Role::CheckpointServer, 1 << 20)
        .await
        .expect("client");
    (client, server.await.expect("task").expect("server"))
}

fn bench(c: &mut Criterion) {
    let rt = rt();
    let key = Key::from_bytes([7; 32]);
    let mut g = c.benchmark_group("wire");
    for (label, len) in SIZES {
        let msg = Blob((0..len).map(|i| (i * 131 + i / 7) as u8).collect());
        let (mut tx, mut rx) = rt.block_on(pair(&key));
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::new("message", label), &msg, |b, msg| {
            b.iter(|| {
                rt.block_on(async {
                    tx.send(msg).await.expect("send");
                    let got: Blob = rx.recv().await.expect("recv");
                    got
                })
            })
        });
    }
    g.throughput(Throughput::Elements(1));
    g.bench_function("handshake", |b| b.iter(|| rt.block_on(pair(&key))));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

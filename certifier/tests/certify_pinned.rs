//! A fixed small log, stored byte for byte under `tests/data/`, with the log digest, the G_S
//! Merkle root and a signed certificate that an earlier version of the certifier made of it:
//! a faster reader or track must give the same roots, so old certificates still verify.
//!
//! The fixture was written by running this file with `VERIFLOW_WRITE_PINNED=1` once (a knary
//! tree of fanout 3 and depth 4 on 3 vnodes, vnode 1 killed
//! and recovered once); the digests below are what that version printed. It was written again
//! on 2026-11-26 when task ids moved to derivation 2 (`ids.rs`: a log of derivation 1 is
//! refused by name, `log/manifest.rs`), after the faster reader had been checked against the
//! derivation-1 fixture and its pins. The log was written again later on 2026-11-26 when the
//! log format moved to VFM3 (values tagged inline or stored by digest, rule 10 of the runtime's
//! `log/mod.rs`): the same digests, and the certificate made before (kept as it was) verifies.
//! And again when it moved to VFM4 (large task arguments stored by digest too; the leaf hashes
//! the arguments' digest, as before): the same digests, the same certificate.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{registry, Node, LEAF_WORK};
use veriflow_certifier::{certify, Certificate, NoProgress, Options, OracleKey, Track};
use veriflow_checkpoint::Key;
use veriflow_runtime::{Kill, MemoryStore, Runtime, Store, VnodeId};

/// The log digest of the fixture (the Merkle root over all of G).
const LOG_DIGEST: &str = "47f24e0f25e2ec7a7e1ce20a7c8ff2db5d9090cd69f253301d688a43bcc4f600";
/// The Merkle root of G_S for the run's terminal outputs.
const MERKLE_ROOT: &str = "47f24e0f25e2ec7a7e1ce20a7c8ff2db5d9090cd69f253301d688a43bcc4f600";

/// The size and Merkle root of G_S for the datum of lowest id alone.
const PART_TASKS: usize = 8;
const PART_ROOT: &str = "98c10a26b04040449461d4bb9b091d4f2e16ab04d296294e86925d19a38dc86f";

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn oracle() -> OracleKey {
    OracleKey::from(Key::from_bytes([27; 32]))
}

/// Pairs as `u32 count`, then per pair `u32 len, key, u32 len, value` (little-endian).
fn encode(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
    for (k, v) in pairs {
        for part in [k, v] {
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

fn decode(mut bytes: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut take = |n: usize| {
        let (a, b) = bytes.split_at(n);
        bytes = b;
        a.to_vec()
    };
    let count = u32::from_le_bytes(take(4).try_into().unwrap());
    (0..count)
        .map(|_| {
            let klen = u32::from_le_bytes(take(4).try_into().unwrap()) as usize;
            let k = take(klen);
            let vlen = u32::from_le_bytes(take(4).try_into().unwrap()) as usize;
            (k, take(vlen))
        })
        .collect()
}

fn pinned_store() -> Arc<dyn Store> {
    let bytes = std::fs::read(data("pinned_log.bin")).expect("the fixture is committed");
    let store = MemoryStore::default();
    store.put_batch(&decode(&bytes)).unwrap();
    Arc::new(store)
}

/// Writes the fixture (run once, by hand, with `VERIFLOW_WRITE_PINNED=1`).
fn write_fixture() {
    LEAF_WORK.store(true, std::sync::atomic::Ordering::Relaxed);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    Runtime::builder(registry())
        .threads(3)
        .vnodes(3)
        .seed(27)
        .kills(vec![Kill {
            vnode: VnodeId(1),
            after: 20,
            retarget: false,
        }])
        .store(store.clone())
        .build()
        .unwrap()
        .run(
            Node {
                depth: 4,
                fanout: 3,
                path: 0,
            },
            (),
        )
        .unwrap();
    let pairs = store.scan_prefix(b"").unwrap();
    std::fs::create_dir_all(data("")).unwrap();
    std::fs::write(data("pinned_log.bin"), encode(&pairs)).unwrap();
    let opts = Options {
        epsilon: 0.1,
        q: 0.05,
        seed: Some(27),
        ..Options::default()
    };
    let mut cert = certify(store.clone(), &registry(), &opts, &NoProgress).unwrap();
    cert.sign(&oracle()).unwrap();
    std::fs::write(data("pinned_certificate.json"), cert.to_json()).unwrap();
    eprintln!(
        "log digest {}\nmerkle root {}",
        cert.log_digest, cert.merkle_root
    );
}

#[test]
fn the_pinned_log_has_the_pinned_digests() {
    if std::env::var_os("VERIFLOW_WRITE_PINNED").is_some() {
        write_fixture();
    }
    let store = pinned_store();
    let track = Track::load(store).unwrap();
    assert!(track.conflicts.is_empty() && track.torn.is_empty());
    let vnodes: std::collections::BTreeSet<VnodeId> = (0..track.len() as u32)
        .filter_map(|t| track.ran_on(t))
        .collect();
    assert!(vnodes.len() > 1, "the fixture spreads over vnodes");
    let leaves = track.leaves();
    let hex = |b: &[u8; 32]| veriflow_checkpoint::hex::encode(b);
    assert_eq!(hex(&track.log_digest_of(&leaves)), LOG_DIGEST);
    assert_eq!(hex(&track.log_digest()), LOG_DIGEST);
    let (gs, errors) = track.terminal_subgraph(track.terminal());
    assert!(errors.is_empty() && track.structural_check(&gs).is_empty());
    assert_eq!(hex(&track.merkle_root(&gs)), MERKLE_ROOT);
    assert_eq!(hex(&track.merkle_root_of(&gs, &leaves)), MERKLE_ROOT);
    // A G_S smaller than G: the ancestors of the datum with the lowest id.
    let low = track.data_ids().min().unwrap();
    let (part, errors) = track.terminal_subgraph(&[low]);
    assert!(errors.is_empty() && part.len() < gs.len(), "{}", part.len());
    assert_eq!(
        (part.len(), hex(&track.merkle_root_of(&part, &leaves))),
        (PART_TASKS, PART_ROOT.to_string())
    );
    assert_eq!(hex(&track.merkle_root(&part)), PART_ROOT);
}

#[test]
fn a_certificate_of_the_pinned_log_made_before_still_verifies() {
    let store = pinned_store();
    let json = std::fs::read_to_string(data("pinned_certificate.json")).unwrap();
    let cert = Certificate::from_json(&json).unwrap();
    assert_eq!(cert.log_digest, LOG_DIGEST);
    assert_eq!(cert.merkle_root, MERKLE_ROOT);
    cert.verify(&oracle().public(), store.clone())
        .expect("an old certificate verifies against its log");
    // Certifying again gives the same roots and the same draw.
    let opts = Options {
        epsilon: cert.epsilon,
        q: cert.q,
        seed: Some(cert.seed),
        ..Options::default()
    };
    let again = certify(store, &registry(), &opts, &NoProgress).unwrap();
    assert_eq!(again.log_digest, cert.log_digest);
    assert_eq!(again.merkle_root, cert.merkle_root);
    assert_eq!(again.checked, cert.checked);
}

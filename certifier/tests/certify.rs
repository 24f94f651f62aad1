//! Certification of real runs: honest runs accepted, forgeries found, named and corrected,
//! certificates verified against their log.

mod common;

use std::sync::Arc;

use common::{registry, Node};
use veriflow_certifier::{
    certify, Certificate, Decision, NoProgress, Options, OracleKey, OraclePublicKey, Track,
    VerifyError,
};
use veriflow_checkpoint::Key;
use veriflow_runtime::{
    Forge, ForgeMode, IdSet, Kill, MemoryStore, RunReport, Runtime, Store, TaskId, VnodeId,
};

fn run(
    depth: u32,
    vnodes: u32,
    seed: u64,
    forge: Option<Forge>,
) -> (Arc<dyn Store>, RunReport<(u64,)>) {
    run_with(depth, vnodes, seed, forge, Vec::new())
}

fn run_with(
    depth: u32,
    vnodes: u32,
    seed: u64,
    forge: Option<Forge>,
    kills: Vec<Kill>,
) -> (Arc<dyn Store>, RunReport<(u64,)>) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let mut b = Runtime::builder(registry())
        .threads(2)
        .vnodes(vnodes)
        .seed(seed)
        .kills(kills)
        .store(store.clone());
    if let Some(f) = forge {
        b = b.forge(f);
    }
    let report = b
        .build()
        .unwrap()
        .run(
            Node {
                depth,
                fanout: 3,
                path: 0,
            },
            (),
        )
        .unwrap();
    (store, report)
}

fn opts(eps: f64, q: f64) -> Options {
    Options {
        epsilon: eps,
        q,
        ..Options::default()
    }
}

fn terminal_value(store: &Arc<dyn Store>) -> Vec<u8> {
    let t = Track::load(store.clone()).unwrap();
    let d = t.terminal()[0];
    t.resolve(t.value(d).unwrap().0).unwrap()
}

#[test]
fn honest_runs_are_accepted() {
    for seed in 0..12u64 {
        let (store, report) = run(4, 1 + (seed % 4) as u32, seed, None);
        let cert = certify(store, &registry(), &opts(0.05, 0.05), &NoProgress).unwrap();
        assert_eq!(cert.decision, Decision::Accept, "seed {seed}: {cert:?}");
        assert_eq!(
            cert.n, report.tasks,
            "every task is an ancestor of the root output"
        );
        assert_eq!(
            cert.k,
            veriflow_certifier::sample::sample_size(0.05, 0.05, cert.n).unwrap()
        );
        assert_eq!(cert.checked.len() as u64, cert.k);
        assert!(cert.structural.is_empty() && cert.detections.is_empty());
    }
}

#[test]
fn honest_runs_with_failures_and_recovery_are_accepted() {
    for seed in 0..8u64 {
        let kills = vec![
            Kill {
                vnode: VnodeId(1),
                after: 10 + seed * 7,
                retarget: false,
            },
            Kill {
                vnode: VnodeId(2),
                after: 40 + seed * 3,
                retarget: false,
            },
        ];
        let (store, report) = run_with(4, 3, seed, None, kills);
        assert!(report.vnodes.iter().map(|v| v.failures).sum::<u64>() > 0);
        let mut o = opts(0.05, 0.05);
        o.full = true;
        let cert = certify(store, &registry(), &o, &NoProgress).unwrap();
        assert_eq!(cert.decision, Decision::Accept, "seed {seed}: {cert:?}");
        assert_eq!(cert.n, report.tasks);
    }
}

fn forge_tasks(tasks: &[TaskId]) -> Forge {
    Forge {
        tasks: tasks.iter().copied().collect::<IdSet<TaskId>>(),
        seed: 5,
        ..Forge::default()
    }
}

/// Ids of the leaves of an honest run (tasks that write their output themselves).
fn writers(store: &Arc<dyn Store>) -> Vec<TaskId> {
    Track::load(store.clone()).unwrap().writers()
}

#[test]
fn a_forged_task_is_named_and_the_run_rejected() {
    let (honest, _) = run(3, 2, 1, None);
    let victims = writers(&honest);
    let target = victims[victims.len() / 2];
    let (store, report) = run(3, 2, 1, Some(forge_tasks(&[target])));
    assert_eq!(report.forged.len(), 1);
    assert_ne!(
        terminal_value(&store),
        terminal_value(&honest),
        "the lie reaches the output"
    );
    let mut o = opts(0.05, 0.05);
    o.full = true;
    let cert = certify(store, &registry(), &o, &NoProgress).unwrap();
    assert_eq!(cert.decision, Decision::Reject);
    assert_eq!(cert.detections.len(), 1, "{:?}", cert.detections);
    assert_eq!(cert.detections[0].task, format!("{target:#}"));
    assert_eq!(cert.detections[0].vnode, Some(report.forged[0].1 .0));
}

#[test]
fn correction_restores_the_honest_output() {
    let (honest, _) = run(4, 3, 2, None);
    let victims = writers(&honest);
    let lies = [victims[3], victims[victims.len() - 5]];
    let (store, report) = run(4, 3, 2, Some(forge_tasks(&lies)));
    assert_eq!(report.forged.len(), 2);
    let before = terminal_value(&store);
    assert_ne!(before, terminal_value(&honest));
    let mut o = opts(0.05, 0.05);
    o.full = true;
    o.correct = true;
    let cert = certify(store.clone(), &registry(), &o, &NoProgress).unwrap();
    assert_eq!(cert.decision, Decision::Accept, "{cert:?}");
    assert_eq!(cert.generation, 1);
    assert_eq!(cert.corrections.len(), 1);
    assert_eq!(cert.corrections[0].detected.len(), 2);
    assert_eq!(
        terminal_value(&store),
        terminal_value(&honest),
        "corrected = honest"
    );
    // The original generation is kept.
    let g0 = veriflow_runtime::log::LogReader::new(store.clone());
    let t0 = Track::load_from(&g0).unwrap();
    let d = t0.terminal()[0];
    assert_eq!(t0.resolve(t0.value(d).unwrap().0).unwrap(), before);
}

#[test]
fn a_vnode_that_logs_another_value_than_it_sent_fails_the_structural_check() {
    // Chosen tasks, not a rate on one vnode: which vnode runs what depends on the schedule.
    let (honest_store, honest) = run(3, 3, 4, None);
    let f = Forge {
        mode: ForgeMode::LogOnly,
        ..forge_tasks(&writers(&honest_store)[..3])
    };
    let (store, report) = run(3, 3, 4, Some(f));
    assert!(!report.forged.is_empty());
    assert_eq!(
        report.outputs, honest.outputs,
        "the honest values were sent"
    );
    let cert = certify(store, &registry(), &opts(0.05, 0.05), &NoProgress).unwrap();
    assert_eq!(cert.decision, Decision::Reject);
    assert!(!cert.structural.is_empty());
    // The lie shows on whichever edge carried the honest value, which the schedule decides: a
    // local reader's or a thief's input ("... but its producer ... logged") or a copy returned
    // to a victim ("... received digest ..., the writer logged ...").
    let e = &cert.structural[0];
    assert!(
        e.message.contains("its producer") || e.message.contains("the writer logged"),
        "{e:?}"
    );
    assert!(e.data.is_some(), "the edge is named");
}

fn oracle(b: u8) -> OracleKey {
    OracleKey::from(Key::from_bytes([b; 32]))
}

#[test]
fn certificates_verify_and_tampering_is_caught() {
    let key = oracle(7);
    let (store, _) = run(3, 2, 3, None);
    let mut cert = certify(store.clone(), &registry(), &opts(0.1, 0.05), &NoProgress).unwrap();
    cert.sign(&key).unwrap();
    let json = cert.to_json();
    let back = Certificate::from_json(&json).unwrap();
    back.verify(&key.public(), store.clone())
        .expect("a fresh certificate verifies");
    back.verify_with_secret(&key, store.clone())
        .expect("and with the oracle's secret key");

    let other_key = oracle(8);
    assert!(back.verify(&other_key.public(), store.clone()).is_err());
    assert!(back.verify_with_secret(&other_key, store.clone()).is_err());

    let tampered = json.replace("\"ACCEPT\"", "\"REJECT\"");
    let t = Certificate::from_json(&tampered).unwrap();
    let e = t.verify(&key.public(), store.clone()).unwrap_err();
    assert!(matches!(e, VerifyError::BadSignature), "{e}");
    assert!(e.to_string().contains("signature"), "{e}");

    let (other, _) = run(3, 2, 3, Some(forge_tasks(&writers(&store)[..1])));
    let e = back.verify(&key.public(), other).unwrap_err();
    assert!(e.to_string().contains("does not belong"), "{e}");

    assert!(Certificate::from_json("{\"format\": 1}").is_err());
}

/// Issue 18 point 2: the certificate names its scheme and carries the oracle's public key and
/// the signature; the public key alone verifies it (no secret needed).
#[test]
fn a_signed_certificate_verifies_with_the_public_key_only() {
    let key = oracle(21);
    let public = key.public();
    let (store, _) = run(3, 3, 2, None);
    let mut cert = certify(store.clone(), &registry(), &opts(0.1, 0.05), &NoProgress).unwrap();
    cert.sign(&key).unwrap();
    let v: serde_json::Value = serde_json::from_str(&cert.to_json()).unwrap();
    assert_eq!(v["format"], "veriflow-certificate/3");
    assert_eq!(v["signature_scheme"], "ed25519");
    assert_eq!(v["public_key"], public.to_hex());
    assert_eq!(
        v["signature"].as_str().unwrap().len(),
        128,
        "64 bytes in hex"
    );
    assert!(v.get("mac").is_none(), "no MAC in a signed certificate");
    // Only the public key, read back from its file, as a stranger would have it.
    let dir = tempfile::tempdir().unwrap();
    let pub_file = dir.path().join("oracle.pub");
    public.write(&pub_file).unwrap();
    let stranger = OraclePublicKey::load(&pub_file).unwrap();
    let back = Certificate::from_json(&cert.to_json()).unwrap();
    back.verify(&stranger, store)
        .expect("verifies with the public key");
    assert_eq!(back.signer(), Some(public));
}

/// Rule 1 of certificate.rs: every field is signed. Each field of a signed certificate is
/// changed in turn (keeping its type, so that the certificate still reads); none verifies.
#[test]
fn a_certificate_altered_in_any_signed_field_is_refused() {
    let key = oracle(22);
    let (store, _) = run(3, 2, 3, None);
    let mut cert = certify(store.clone(), &registry(), &opts(0.1, 0.05), &NoProgress).unwrap();
    cert.sign(&key).unwrap();
    let good: serde_json::Value = serde_json::from_str(&cert.to_json()).unwrap();
    let fields: Vec<String> = good.as_object().unwrap().keys().cloned().collect();
    assert_eq!(fields.len(), 26, "{fields:?}");
    let other_hex = oracle(23).public().to_hex();
    let mut refused_by_the_seal = 0;
    for field in &fields {
        let mut bad = good.clone();
        let v = &mut bad[field.as_str()];
        *v = match (field.as_str(), &*v) {
            ("public_key", _) => serde_json::Value::String(other_hex.clone()),
            (_, serde_json::Value::String(s)) => {
                let mut s = s.clone();
                let last = s.pop().unwrap_or('x');
                s.push(if last == '0' { '1' } else { '0' });
                serde_json::Value::String(s)
            }
            (_, serde_json::Value::Number(n)) => match n.as_u64() {
                Some(u) => serde_json::json!(u + 1),
                None => serde_json::json!(n.as_f64().unwrap() * 0.5),
            },
            (_, serde_json::Value::Bool(b)) => serde_json::Value::Bool(!b),
            (_, serde_json::Value::Array(a)) if a.is_empty() => continue_with_one(field),
            (_, serde_json::Value::Array(a)) => serde_json::Value::Array(a[1..].to_vec()),
            (_, other) => panic!("field {field}: unexpected {other}"),
        };
        let text = serde_json::to_string(&bad).unwrap();
        let Ok(c) = Certificate::from_json(&text) else {
            continue; // refused when read: fine
        };
        let e = c
            .verify(&key.public(), store.clone())
            .expect_err(&format!("a certificate with {field} changed verified"));
        let expected = if field == "public_key" {
            matches!(e, VerifyError::OtherKey { .. })
        } else {
            matches!(e, VerifyError::BadSignature | VerifyError::Malformed(_))
        };
        assert!(expected, "{field}: {e}");
        refused_by_the_seal += 1;
    }
    assert!(
        refused_by_the_seal >= 20,
        "most changes read as a certificate and reach the signature check"
    );
    // A field added is refused too: nothing unsigned rides along.
    let mut extra = good.clone();
    extra["note"] = serde_json::json!("trust me");
    let e = Certificate::from_json(&serde_json::to_string(&extra).unwrap()).unwrap_err();
    assert!(e.to_string().contains("note"), "{e}");
}

/// An empty list changed into a list of one plausible element.
fn continue_with_one(field: &str) -> serde_json::Value {
    match field {
        "detections" => serde_json::json!([{
            "task": "t:0", "name": "node", "vnode": 0, "reason": "forged"
        }]),
        "structural" => serde_json::json!([{
            "task": "t:0", "name": null, "vnode": null, "data": null, "message": "x"
        }]),
        "corrections" => serde_json::json!([{
            "generation": 1, "detected": [], "invalidated": 0, "re_executed": 0
        }]),
        _ => serde_json::json!(["x"]),
    }
}

/// Rule 2 of certificate.rs: a certificate signed by another oracle is refused, naming both
/// keys; one whose public key was replaced by the trusted one does not verify either.
#[test]
fn a_wrong_public_key_is_refused() {
    let (honest, forger) = (oracle(31), oracle(32));
    let (store, _) = run(3, 2, 2, None);
    let mut cert = certify(store.clone(), &registry(), &opts(0.1, 0.05), &NoProgress).unwrap();
    cert.sign(&forger).unwrap();
    let e = cert.verify(&honest.public(), store.clone()).unwrap_err();
    match &e {
        VerifyError::OtherKey { signed_by, trusted } => {
            assert_eq!(signed_by, &forger.public().fingerprint());
            assert_eq!(trusted, &honest.public().fingerprint());
        }
        other => panic!("expected OtherKey, got {other}"),
    }
    assert!(e.to_string().contains("signed by oracle key"), "{e}");
    // The forger writes the honest oracle's key into the certificate: the signature fails.
    cert.public_key = Some(honest.public().to_hex());
    let e = cert.verify(&honest.public(), store).unwrap_err();
    assert!(matches!(e, VerifyError::BadSignature), "{e}");
}

/// Rule 3 of certificate.rs: a format-1 certificate, sealed with a keyed-blake3 MAC as
/// versions before signatures did, verifies with the oracle's secret key as before, and is
/// refused against a public key with a message that names the format and what to do.
#[test]
fn an_old_mac_certificate_verifies_with_the_secret_key_and_is_refused_with_a_public_key() {
    let secret = Key::from_bytes([41; 32]);
    let key = OracleKey::from(secret.clone());
    let (store, _) = run(3, 2, 2, None);
    let mut cert = certify(store.clone(), &registry(), &opts(0.1, 0.05), &NoProgress).unwrap();
    let old = legacy_mac_certificate(&mut cert, &secret);
    assert!(
        old.contains("\"mac\"") && !old.contains("signature"),
        "{old}"
    );
    let c = Certificate::from_json(&old).unwrap();
    assert!(c.is_legacy());
    c.verify_with_secret(&key, store.clone())
        .expect("an old certificate verifies with the oracle's secret key");
    let e = c.verify(&key.public(), store.clone()).unwrap_err();
    assert!(matches!(e, VerifyError::LegacyMac), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("veriflow-certificate/1") && msg.contains("--oracle-key"),
        "{msg}"
    );
    // Still sealed: changed, or under another key, it fails.
    let t = Certificate::from_json(&old.replace("\"epsilon\": 0.1", "\"epsilon\": 0.5")).unwrap();
    let e = t.verify_with_secret(&key, store.clone()).unwrap_err();
    assert!(matches!(e, VerifyError::BadMac), "{e}");
    let e = c.verify_with_secret(&oracle(42), store).unwrap_err();
    assert!(matches!(e, VerifyError::BadMac), "{e}");
}

/// A format-1 certificate as versions before signatures wrote it: format tag
/// "veriflow-certificate/1", the fields of today's certificate without the signature fields,
/// and `mac`: the keyed blake3 MAC, under the context "veriflow certificate mac v1", of the
/// JSON with `mac` empty.
fn legacy_mac_certificate(cert: &mut Certificate, key: &Key) -> String {
    cert.format = "veriflow-certificate/1".to_string();
    cert.signature_scheme = None;
    cert.public_key = None;
    cert.signature = None;
    cert.mac = Some(String::new());
    let bytes = serde_json::to_vec(&*cert).unwrap();
    let mac = key.mac("veriflow certificate mac v1", &bytes);
    cert.mac = Some(veriflow_checkpoint::hex::encode(&mac));
    cert.to_json()
}

#[test]
fn the_draw_depends_on_the_seed_only() {
    let (store, _) = run(4, 2, 8, None);
    let mut o = opts(0.05, 0.1);
    o.seed = Some(42);
    let a = certify(store.clone(), &registry(), &o, &NoProgress).unwrap();
    let b = certify(store.clone(), &registry(), &o, &NoProgress).unwrap();
    assert_eq!(a.checked, b.checked);
    o.seed = Some(43);
    let c = certify(store.clone(), &registry(), &o, &NoProgress).unwrap();
    assert_ne!(a.checked, c.checked);
    o.seed = None;
    let d = certify(store, &registry(), &o, &NoProgress).unwrap();
    assert_eq!(d.seed_source, "log digest");
}

/// Certificate rule 4: a certifier cannot choose what it checks. A certificate whose list of
/// checked tasks is not its seed's draw is refused, though its signature is good.
#[test]
fn a_certificate_that_checked_other_tasks_than_its_draw_is_refused() {
    let key = oracle(23);
    let (store, _) = run(4, 2, 3, None);
    let mut o = opts(0.1, 0.1);
    o.seed = Some(77);
    let mut cert = certify(store.clone(), &registry(), &o, &NoProgress).unwrap();
    assert!(cert.checked.len() >= 2 && (cert.checked.len() as u64) < cert.n);
    cert.sign(&key).unwrap();
    cert.verify(&key.public(), store.clone())
        .expect("its own draw verifies");
    // Checked in another order, then signed again by the same oracle.
    let mut swapped = cert.clone();
    swapped.checked.swap(0, 1);
    swapped.sign(&key).unwrap();
    let e = swapped.verify(&key.public(), store.clone()).unwrap_err();
    assert!(matches!(e, VerifyError::WrongDraw(_)), "{e}");
    // Another seed claimed for the same checks.
    let mut reseeded = cert.clone();
    reseeded.seed = 78;
    reseeded.sign(&key).unwrap();
    let e = reseeded.verify(&key.public(), store).unwrap_err();
    assert!(matches!(e, VerifyError::WrongDraw(_)), "{e}");
}

/// Certificate rule 5: an online oracle's revealed secret must be the one it committed to.
#[test]
fn a_revealed_secret_must_match_its_commitment() {
    let key = oracle(24);
    let (store, _) = run(3, 2, 4, None);
    let mut o = opts(0.1, 0.1);
    o.secret = Some([9; 32]);
    let mut cert = certify(store.clone(), &registry(), &o, &NoProgress).unwrap();
    assert_eq!(cert.seed_source, "oracle secret");
    assert_eq!(
        cert.commitment.as_deref(),
        Some(blake3::hash(&[9; 32]).to_hex().as_str())
    );
    cert.sign(&key).unwrap();
    let back = Certificate::from_json(&cert.to_json()).unwrap();
    back.verify(&key.public(), store).unwrap();
    let mut other = cert.clone();
    other.secret = Some("0a".repeat(32));
    other.sign(&key).unwrap();
    let e = Certificate::from_json(&other.to_json()).unwrap_err();
    assert!(e.to_string().contains("committed"), "{e}");
}

/// Crate rule 6: what an online oracle learned enters the final certification. Tasks it found
/// clean are not re-run; the tasks of a worker it caught are each checked, and the forged ones
/// corrected with their successors, so the corrected output is the honest one even where the
/// sample would have missed the lie, while the caught worker's honest tasks (the root among
/// them here) are kept.
#[test]
fn an_online_oracles_distrust_corrects_what_the_draw_did_not_check() {
    let (honest, _) = run(4, 3, 6, None);
    let victims = writers(&honest);
    let lie = victims[victims.len() / 3];
    let (store, report) = run(4, 3, 6, Some(forge_tasks(&[lie])));
    assert_eq!(report.forged.len(), 1);
    let track = Track::load(store.clone()).unwrap();
    let root = track.manifest.root;
    let suspects = [lie, root, victims[0]];
    let mut prior = veriflow_certifier::Prior::default();
    // Everything else was found clean during the run.
    for t in 0..track.len() as u32 {
        if !suspects.contains(&track.id(t)) {
            prior.clean.insert(track.leaf(t));
        }
    }
    prior.distrusted.extend(suspects);
    let mut o = opts(0.1, 0.1);
    o.correct = true;
    o.secret = Some([5; 32]);
    let counted = std::sync::atomic::AtomicU64::new(0);
    struct Count<'a>(&'a std::sync::atomic::AtomicU64);
    impl veriflow_certifier::Progress for Count<'_> {
        fn corrected(&self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let cert =
        veriflow_certifier::certify_with(store.clone(), &registry(), &o, &prior, &Count(&counted))
            .unwrap();
    assert_eq!(cert.decision, Decision::Accept, "{cert:?}");
    assert_eq!(
        cert.generation, 1,
        "the distrusted lie is found and corrected"
    );
    let c = &cert.corrections[0];
    assert_eq!(c.detected.len(), 1, "{c:?}");
    assert!(
        c.invalidated < track.len() as u64 / 2,
        "the honest root is kept, not re-run with the whole graph: {c:?}"
    );
    assert!(counted.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    assert_eq!(terminal_value(&store), terminal_value(&honest));
}

/// Follows a finished run's store to its end (`online` rules 1 and 7).
fn followed(store: &Arc<dyn Store>) -> veriflow_certifier::online::Follower {
    followed_with(store, 0.1, 0.02, veriflow_certifier::online::DRAW_AHEAD)
}

fn followed_with(
    store: &Arc<dyn Store>,
    q: f64,
    floor: f64,
    ahead: f64,
) -> veriflow_certifier::online::Follower {
    let mut f = veriflow_certifier::online::Follower::new(
        store.clone(),
        Arc::new(registry()),
        &[7; 32],
        0.1,
        q,
        floor,
    )
    .unwrap()
    .draw_ahead(ahead)
    .unwrap();
    while f.poll().unwrap().events > 0 {}
    f
}

/// `online` rule 2: the draw is checked ahead within its budget, a fraction of the tasks
/// completed, instead of every candidate at once; 1 checks every candidate as it completes.
/// The log is followed as it would grow, one segment of each vnode per poll.
#[test]
fn the_draw_is_checked_ahead_within_its_budget() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let report = Runtime::builder(registry())
        .threads(2)
        .vnodes(3)
        .seed(2)
        .store(store.clone())
        .commit_policy(veriflow_runtime::log::CommitPolicy {
            max_bytes: 2 << 10,
            max_delay: std::time::Duration::from_secs(60),
            ..veriflow_runtime::log::CommitPolicy::default()
        })
        .build()
        .unwrap()
        .run(
            Node {
                depth: 6,
                fanout: 3,
                path: 0,
            },
            (),
        )
        .unwrap();
    let n = report.tasks as f64;
    let n_eps_q = veriflow_certifier::sample::n_eps_q(0.1, 0.02).unwrap();
    assert!(
        2.0 * n_eps_q < n / 4.0,
        "a run long enough to tell: {n} tasks"
    );
    let checked = |ahead: f64| {
        let growing = Through::new(store.clone(), 0);
        let as_store: Arc<dyn Store> = growing.clone();
        let mut f = veriflow_certifier::online::Follower::new(
            as_store,
            Arc::new(registry()),
            &[7; 32],
            0.1,
            0.02,
            1e-9, // spot checks only while a worker is new
        )
        .unwrap()
        .draw_ahead(ahead)
        .unwrap();
        let mut quiet = 0;
        while quiet < 2 {
            growing
                .shown
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            quiet = if f.poll().unwrap().events == 0 {
                quiet + 1
            } else {
                0
            };
        }
        assert_eq!(f.completed() as f64, n, "followed to the end");
        f.checked() as f64
    };
    let (spot, budget, all) = (checked(0.0), checked(0.01), checked(1.0));
    assert!(
        budget <= spot + 0.01 * n + 1.0,
        "{budget} > {spot} + 1 % of {n}"
    );
    assert!(budget > spot, "nothing was checked ahead: {budget}");
    assert!(
        all >= spot + n_eps_q,
        "every candidate is checked at once: {all} (spot {spot}, N {n_eps_q})"
    );
    assert!(veriflow_certifier::online::Follower::new(
        store,
        Arc::new(registry()),
        &[7; 32],
        0.1,
        0.02,
        0.02
    )
    .unwrap()
    .draw_ahead(1.5)
    .is_err());
}

/// `online` rule 7: the final certificate from the log as followed is the certificate of the
/// log loaded again (same roots, draw and decision, corrections included), with the same
/// terminal outputs; a segment past what the tails read makes the oracle load the log.
#[test]
fn a_log_as_followed_certifies_as_the_log_loaded_again() {
    let mut o = opts(0.1, 0.1);
    o.correct = true;
    o.secret = Some([7; 32]);
    let (honest, _) = run(5, 3, 11, None);
    // A quarter of the leaves forged: the draw finds one whatever it draws.
    let lies: Vec<TaskId> = writers(&honest).into_iter().step_by(4).collect();
    for (store, generation) in [
        (honest.clone(), 0),
        (run(5, 3, 11, Some(forge_tasks(&lies))).0, 1),
    ] {
        // Twice the same run: certifying writes the corrected generation into its store.
        let copy: Arc<dyn Store> = Arc::new(MemoryStore::default());
        for (k, v) in store.scan_prefix(b"").unwrap() {
            copy.put(&k, &v).unwrap();
        }
        let mut f = followed(&store);
        let prior = f.prior();
        let track = f.final_track().unwrap();
        assert!(track.is_some(), "every segment was read");
        let counted = Through::new(store.clone(), u64::MAX);
        let got = veriflow_certifier::certify_followed(
            counted.clone(),
            &registry(),
            &o,
            &prior,
            &NoProgress,
            track,
        )
        .unwrap();
        let want =
            veriflow_certifier::certify_with(copy.clone(), &registry(), &o, &prior, &NoProgress)
                .unwrap();
        let c = &got.certificate;
        assert_eq!(c.decision, Decision::Accept, "{c:?}");
        assert_eq!(c.generation, generation);
        // The generation followed is not read again; a corrected one is read once.
        let reads = counted.reads.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(reads > 0, generation > 0, "{reads} segment scans");
        assert_eq!(
            (&c.merkle_root, &c.log_digest, c.n, &c.checked),
            (&want.merkle_root, &want.log_digest, want.n, &want.checked)
        );
        assert_eq!(got.outputs, Some(vec![terminal_value(&honest)]));
    }
    // A torn segment past the tail (a crash's leftover the watermark never covered).
    let f_store = run(4, 2, 3, None).0;
    let mut f = followed(&f_store);
    let last = veriflow_runtime::log::segment::segment_key(VnodeId(1), 1 << 40);
    f_store.put(&last, b"torn").unwrap();
    assert!(f.final_track().unwrap().is_none());
}

/// A store seen through a test: it counts the scans of log segments (`reads`), and shows only
/// the first `shown` segments of each vnode, as a finished run's store looked while it grew.
struct Through {
    inner: Arc<dyn Store>,
    reads: std::sync::atomic::AtomicU64,
    shown: std::sync::atomic::AtomicU64,
}

impl Through {
    fn new(inner: Arc<dyn Store>, shown: u64) -> Arc<Through> {
        Arc::new(Through {
            inner,
            reads: Default::default(),
            shown: shown.into(),
        })
    }
}

impl Store for Through {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), veriflow_checkpoint::StoreError> {
        self.inner.put(key, value)
    }
    fn put_batch(
        &self,
        pairs: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), veriflow_checkpoint::StoreError> {
        self.inner.put_batch(pairs)
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, veriflow_checkpoint::StoreError> {
        self.inner.get(key)
    }
    fn scan_prefix(
        &self,
        prefix: &[u8],
    ) -> Result<veriflow_checkpoint::Pairs, veriflow_checkpoint::StoreError> {
        let all = self.scan_page(
            prefix,
            None,
            veriflow_checkpoint::PageLimit {
                max_keys: usize::MAX,
                max_bytes: u64::MAX,
            },
        )?;
        Ok(all.pairs)
    }
    fn scan_page(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: veriflow_checkpoint::PageLimit,
    ) -> Result<veriflow_checkpoint::Page, veriflow_checkpoint::StoreError> {
        let mut page = self.inner.scan_page(prefix, after, limit)?;
        if prefix.starts_with(b"seg/") {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let shown = self.shown.load(std::sync::atomic::Ordering::Relaxed);
            let before = page.pairs.len();
            page.pairs.retain(|(k, _)| {
                let segno = u64::from_be_bytes(k[k.len() - 8..].try_into().unwrap());
                segno < shown
            });
            page.more &= page.pairs.len() == before;
        }
        Ok(page)
    }
    fn delete(&self, key: &[u8]) -> Result<(), veriflow_checkpoint::StoreError> {
        self.inner.delete(key)
    }
    fn flush(&self) -> Result<(), veriflow_checkpoint::StoreError> {
        self.inner.flush()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

//! Property tests of the certificate reader on outside text (issue 13 point 11): arbitrary text
//! and damaged signed certificates never panic, and a damaged certificate never verifies unless
//! the damage left the same certificate (JSON whitespace, say): the signature covers every field.

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use veriflow_certifier::{certify, Certificate, NoProgress, Options, OracleKey, OraclePublicKey};
use veriflow_checkpoint::fuzzing::{damage, damages};
use veriflow_checkpoint::Key;
use veriflow_runtime::{Ctx, MemoryStore, Registry, Runtime, Store, Task, TaskResult, Writes};

#[derive(Serialize, Deserialize)]
struct Node {
    depth: u32,
    path: u64,
}

impl Task for Node {
    const NAME: &'static str = "node";
    type Inputs = ();
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, (): (), (out,): Writes<Self>) -> TaskResult {
        if self.depth == 0 {
            ctx.write(out, self.path);
            return Ok(());
        }
        let parts: Vec<_> = (0..2)
            .map(|i| {
                let (r,) = ctx.spawn(
                    Node {
                        depth: self.depth - 1,
                        path: self.path * 2 + i + 1,
                    },
                    (),
                );
                r
            })
            .collect();
        ctx.spawn_delegate(Sum, parts, (out,));
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct Sum;

impl Task for Sum {
    const NAME: &'static str = "sum";
    type Inputs = Vec<u64>;
    type Outputs = (u64,);
    fn run(self, ctx: &mut Ctx<'_>, xs: Vec<u64>, (out,): Writes<Self>) -> TaskResult {
        ctx.write(out, xs.iter().sum());
        Ok(())
    }
}

/// One honest run, its signed certificate as JSON, and the oracle's public key.
fn signed() -> &'static (Arc<dyn Store>, String, OraclePublicKey) {
    static CELL: OnceLock<(Arc<dyn Store>, String, OraclePublicKey)> = OnceLock::new();
    CELL.get_or_init(|| {
        let registry = || {
            Registry::new()
                .with::<Node>()
                .unwrap()
                .with::<Sum>()
                .unwrap()
        };
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        Runtime::builder(registry())
            .threads(1)
            .vnodes(2)
            .store(store.clone())
            .build()
            .unwrap()
            .run(Node { depth: 3, path: 0 }, ())
            .unwrap();
        let mut cert =
            certify(store.clone(), &registry(), &Options::default(), &NoProgress).unwrap();
        let key = OracleKey::from(Key::from_bytes([9; 32]));
        cert.sign(&key).unwrap();
        (store, cert.to_json(), key.public())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_breaks_the_certificate_reader(text in "\\PC{0,200}") {
        if let Ok(c) = Certificate::from_json(&text) {
            let (store, _, key) = signed();
            let _ = c.verify(key, store.clone());
        }
    }

    #[test]
    fn a_damaged_certificate_never_verifies(d in damages()) {
        let (store, json, key) = signed();
        let good = Certificate::from_json(json).unwrap();
        prop_assert!(good.verify(key, store.clone()).is_ok());
        let bad = damage(json.as_bytes(), &d);
        let Ok(text) = String::from_utf8(bad) else { return Ok(()) };
        let Ok(c) = Certificate::from_json(&text) else { return Ok(()) };
        if c.verify(key, store.clone()).is_ok() {
            prop_assert_eq!(c.to_json(), good.to_json(), "a changed certificate verified");
        }
    }
}

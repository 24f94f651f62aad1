//! `checkpoint-server --data ENGINE:DIR` keeps the fragments in that engine; a plain DIR is
//! sled's, and a store that is not a directory is bad usage (the binary's module docs).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{ServerProc, Setup};
use veriflow_checkpoint::{open_store, StoreSpec};

fn spec(s: &str) -> StoreSpec {
    s.parse().expect("a store spec")
}

#[test]
fn data_names_the_engine_and_a_restart_reads_what_it_stored() {
    let setup = Setup::new();
    for engine in ["fjall", "redb", "local", "plain"] {
        let dir = setup.dir.path().join(engine);
        let data = match engine {
            "plain" => dir.clone(),
            _ => PathBuf::from(format!("{engine}:{}", dir.display())),
        };
        let mut server = ServerProc::start("127.0.0.1:0", &data, &setup.key_path, false);
        let central = spec(&format!("central:{}", server.addr));
        let store = open_store(&central, Some(&setup.key)).expect("the server answers");
        store.put(b"blob", b"kept by the server").unwrap();
        store.flush().unwrap();
        drop(store);
        server.restart(&setup.key_path);
        let store = open_store(&central, Some(&setup.key)).expect("the server answers again");
        assert_eq!(
            store.get(b"blob").unwrap().as_deref(),
            Some(&b"kept by the server"[..]),
            "{engine}: lost across a restart"
        );
        drop(store);
        server.kill();
        // The directory is the named engine's: opened by it directly, it holds the fragment.
        let own = match engine {
            "plain" => format!("local:{}", dir.display()),
            _ => format!("{engine}:{}", dir.display()),
        };
        let local = open_store(&spec(&own), None).expect("the engine's own directory");
        assert_eq!(local.scan_prefix(b"").unwrap().len(), 1, "{engine}");
    }
}

#[test]
fn data_that_is_not_a_directory_is_bad_usage() {
    let setup = Setup::new();
    for data in ["memory", "central:127.0.0.1:9"] {
        let out = Command::new(Path::new(env!("CARGO_BIN_EXE_checkpoint-server")))
            .args(["--listen", "127.0.0.1:0", "--data", data, "--key"])
            .arg(&setup.key_path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{data}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("a directory of this machine"), "{data}: {err}");
    }
}

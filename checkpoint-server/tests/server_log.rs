//! A checkpoint server says on stderr whom it refused (issue 19.4): without a subscriber its
//! warnings went nowhere.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Setup;

#[test]
fn a_refused_client_is_logged_on_stderr_in_plain_text() {
    let setup = Setup::new();
    let err_path = setup.dir.path().join("server.err");
    let mut child = Command::new(env!("CARGO_BIN_EXE_checkpoint-server"))
        .args(["--listen", "127.0.0.1:0", "--memory", "--key"])
        .arg(&setup.key_path)
        .env_remove("VERIFLOW_LOG")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("checkpoint-server starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_string();
    // Not a veriflow client: 64 bytes of junk instead of a hello.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.write_all(&[0x5a; 64]).unwrap();
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = std::fs::read_to_string(&err_path).unwrap_or_default();
        if log.contains("connection dropped") || Instant::now() > deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    // The client by its address, and why it was turned away.
    assert!(log.contains(": 127.0.0.1:"), "{log:?}");
    assert!(log.contains("connection dropped"), "{log:?}");
    assert!(log.contains("WARN"), "{log:?}");
    assert!(
        !log.contains('\u{1b}'),
        "no colour codes in a file: {log:?}"
    );
}

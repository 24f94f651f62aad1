//! What the `nqueens` command-line tests share: the binary, run through
//! [`veriflow_testkit`] (the helpers every app's tests use).
#![allow(dead_code, unused_imports)] // each test file uses a part of them

use std::path::Path;

use serde_json::Value;
pub(crate) use veriflow_testkit::{s, Out};

/// The `nqueens` binary.
pub(crate) fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_nqueens"))
}

/// Runs `nqueens args` with `TMPDIR` set to `tmp` (fresh log directories and default keys land
/// there).
pub(crate) fn nqueens_in(tmp: &Path, args: &[&str]) -> Out {
    veriflow_testkit::run_bin(bin(), tmp, args)
}

/// Runs `nqueens args` in the system's temporary directory.
pub(crate) fn nqueens(args: &[&str]) -> Out {
    nqueens_in(&std::env::temp_dir(), args)
}

/// A `--json` invocation that must succeed with the right count for `n`; its summary.
pub(crate) fn counted(n: u32, args: &[&str]) -> Value {
    let out = nqueens(args);
    out.expect_code(0);
    let j = out.json();
    assert_eq!(j["correct"], true, "{}\n{out}", out.cmd());
    assert_eq!(
        j["result"],
        nqueens::known_count(n).expect("a known n"),
        "{}\n{out}",
        out.cmd()
    );
    j
}

/// The tasks a run of `p` must complete.
pub(crate) fn tasks_of(p: &nqueens::NQueens) -> u64 {
    use veriflow::Program as _;
    p.expected_tasks().expect("a small run")
}

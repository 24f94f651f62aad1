//! The `cg` command: `cg run --matrix FILE|poisson2d:N|poisson3d:N [--mode dataflow|spmd] ...`,
//! `cg certify --log-dir DIR`.

fn main() -> std::process::ExitCode {
    cg::app::main()
}

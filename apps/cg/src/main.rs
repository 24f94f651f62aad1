//! The `cg` command: `cg run --matrix FILE|poisson2d:N|poisson3d:N ...`, `cg certify --log-dir DIR`.

fn main() -> std::process::ExitCode {
    veriflow::App::<cg::Cg>::main()
}

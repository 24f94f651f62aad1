//! The `transport3d` command: `transport3d run --nx 32 --ny 32 --nz 32 --blocks 4 ...`
//! (`--mode dataflow`, the default, or iterative mode with `--mode async|sync`),
//! `transport3d certify --log-dir DIR`, `transport3d cluster --mode async ...`, and the rest of
//! [`veriflow::App`]. `--mode` is a program option ([`transport3d::Transport3d`]); iterative
//! mode reaches the App through `Program::iterative` ([`transport3d::iterative`]).

fn main() -> std::process::ExitCode {
    veriflow::App::<transport3d::Transport3d>::main()
}

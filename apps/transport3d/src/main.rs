//! The `transport3d` command: `transport3d run --nx 32 --ny 32 --nz 32 --blocks 4 ...`,
//! `transport3d certify --log-dir DIR`, and the rest of [`veriflow::App`].

fn main() -> std::process::ExitCode {
    veriflow::App::<transport3d::Transport3d>::main()
}

//! The `knary` command: `knary run --depth N --fanout K ...`, `knary inspect --log-dir DIR`.

fn main() -> std::process::ExitCode {
    veriflow::App::<knary::Knary>::main()
}

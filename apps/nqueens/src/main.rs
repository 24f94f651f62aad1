//! The `nqueens` command: `nqueens run --n 12 ...`, `nqueens cluster --workers 4 --n 16`,
//! `nqueens certify --log-dir DIR`, and the rest of [`veriflow::App`]'s subcommands.

fn main() -> std::process::ExitCode {
    veriflow::App::<nqueens::NQueens>::main()
}

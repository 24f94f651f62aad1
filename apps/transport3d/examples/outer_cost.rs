//! Cost of the block API on a large mesh: `cargo run --release -p transport3d --example
//! outer_cost -- [n] [blocks] [dt]` (defaults 64, 8, 60). Runs one time step of synchronous
//! block Jacobi with the diurnal model and prints, per outer iteration, the wall time of all
//! blocks' `outer_iteration()` (one thread) and the largest outer residual.

use std::time::Instant;

use transport3d::{Block, Model, Params, Problem};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: f64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let n = arg(0, 64.0) as usize;
    let blocks = arg(1, 8.0) as usize;
    let mut p = Params::new(Model::Diurnal);
    (p.nx, p.ny, p.nz, p.blocks) = (n, n, n, blocks);
    p.dt = arg(2, 60.0);
    p.t_end = 10.0 * p.dt;
    let problem = match Problem::new(p) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut bl = problem.blocks();
    for step in 0..2 {
        for it in 0..50 {
            let t0 = Instant::now();
            let r = bl
                .iter_mut()
                .map(Block::outer_iteration)
                .fold(0.0, f64::max);
            let el = t0.elapsed();
            Problem::exchange_halos(&mut bl);
            println!(
                "step {step} outer {it}: {:.1} ms for {blocks} blocks ({:.2} ms per block), residual {r:.3e}",
                el.as_secs_f64() * 1e3,
                el.as_secs_f64() * 1e3 / blocks as f64
            );
            if r < problem.params().tol {
                break;
            }
        }
        println!(
            "global residual {:.3e}",
            problem.global_residual(&bl).unwrap()
        );
        bl.iter_mut().for_each(|b| {
            b.advance();
        });
    }
}

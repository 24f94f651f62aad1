//! The diurnal model against SUNDIALS: with no y-variation the 3D code is cvDiurnal_kry's 2D
//! problem, whose printed output at t = 7200 s (10 x 10 mesh, CVODE BDF with rtol 1e-5) is the
//! reference.

use transport3d::{Model, Params, Problem, Solution};

/// cvDiurnal_kry's output at t = 7200 s: c1, c2 at mesh points (jx, jz) = (0, 0), (4, 4),
/// (9, 9) (its PrintOutput prints udata[0], udata[NSMX*myh + mxh*2], udata[NSMX*my1 + mx1*2]
/// with mxh = myh = MX/2 - 1 = 4: x index first, the vertical index second).
const SUNDIALS: [((usize, usize), [f64; 2]); 3] = [
    ((0, 0), [1.047e4, 2.527e11]),
    ((4, 4), [2.964e4, 7.154e11]),
    ((9, 9), [1.119e4, 2.700e11]),
];

fn run(model: Model, ny: usize, dt: f64) -> (Problem, Solution) {
    let mut p = Params::new(model);
    (p.nx, p.ny, p.nz, p.blocks) = (10, ny, 10, 1);
    (p.dt, p.t_end, p.tol, p.inner_tol) = (dt, 7200.0, 1e-8, 1e-9);
    let problem = Problem::new(p).unwrap();
    let s = problem.solve_sequential().unwrap();
    (problem, s)
}

fn worst_error(s: &Solution, j: usize) -> f64 {
    let mut worst: f64 = 0.0;
    for ((i, k), want) in SUNDIALS {
        let got = s.at(i, j, k);
        for sp in 0..2 {
            let e = (got[sp] - want[sp]).abs() / want[sp];
            eprintln!(
                "({i},{k}) c{}: {:.4e} vs {:.4e}: {:.2}%",
                sp + 1,
                got[sp],
                want[sp],
                100.0 * e
            );
            worst = worst.max(e);
        }
    }
    worst
}

#[test]
fn no_y_variation_reproduces_cvdiurnal_kry_at_7200_s() {
    let (_, s) = run(Model::Diurnal, 1, 10.0);
    assert_eq!(s.time, 7200.0);
    let e = worst_error(&s, 0);
    assert!(e < 0.05, "worst relative error {e}");
}

#[test]
fn the_error_against_sundials_shrinks_with_the_time_step() {
    // Implicit Euler is first order: the distance to CVODE's answer falls with dt.
    let coarse = worst_error(&run(Model::Diurnal, 1, 240.0).1, 0);
    let fine = worst_error(&run(Model::Diurnal, 1, 60.0).1, 0);
    assert!(fine < coarse / 2.0, "dt 240 s: {coarse}, dt 60 s: {fine}");
}

#[test]
fn a_flat_y_profile_stays_flat_and_matches_the_2d_run() {
    let (_, flat) = run(Model::Diurnal, 1, 60.0);
    let (problem, three) = run(Model::DiurnalFlatY, 5, 60.0);
    let floor = problem.floor();
    for j in 0..5 {
        for k in 0..10 {
            for i in 0..10 {
                let (a, b) = (three.at(i, j, k), flat.at(i, 0, k));
                for s in 0..2 {
                    let d = (a[s] - b[s]).abs() / (b[s].abs() + floor[s]);
                    assert!(d < 1e-7, "({i},{j},{k}) c{}: {} vs {}", s + 1, a[s], b[s]);
                }
            }
        }
    }
}

//! Exact solutions: a Gaussian puff (constant wind, diffusion, first-order decay) against its
//! closed form; a manufactured solution for the orders in space (2, centred advection) and in
//! time (1, implicit Euler); mass conservation of pure transport between zero-flux walls.

use transport3d::{Manufactured, Model, Params, Problem, Puff, Solution};

fn params(model: Model, n: usize, dt: f64, t_end: f64) -> Params {
    let mut p = Params::new(model);
    (p.nx, p.ny, p.nz, p.blocks) = (n, n, n, 1);
    (p.dt, p.t_end, p.tol, p.inner_tol) = (dt, t_end, 1e-10, 1e-11);
    p
}

fn solve(p: Params) -> (Problem, Solution) {
    let problem = Problem::new(p).unwrap();
    let s = problem.solve_sequential().unwrap();
    (problem, s)
}

#[test]
fn the_gaussian_puff_matches_its_closed_form_closer_on_finer_grids() {
    // h and dt shrink together (dt ~ h²), so the bound C (h² + dt) falls by 4 per halving.
    let mut errors = Vec::new();
    for (n, dt) in [(11, 40.0), (21, 10.0), (41, 2.5)] {
        let (problem, s) = solve(params(Model::Puff(Puff::default()), n, dt, 400.0));
        let err = s.error_vs_exact(&problem).unwrap();
        let peak = s.peak();
        let e = (err[0] / peak[0]).max(err[1] / peak[1]);
        let (h, ..) = problem.spacing();
        eprintln!("n {n} h {h} dt {dt}: max error / peak {e:.3e}");
        errors.push((h, dt, e));
    }
    for &(h, _, e) in &errors {
        // The bound of the discretization, C h² (with dt ~ h²): C = 0.12 from the coarsest
        // grid with margin.
        assert!(e < 0.12 * h * h, "{errors:?}");
    }
    for w in errors.windows(2) {
        // Second order: about 4 per halving.
        assert!(w[1].2 < w[0].2 / 3.0, "{errors:?}");
    }
}

fn manufactured(omega: f64) -> Model {
    Model::Manufactured(Manufactured {
        omega,
        ..Manufactured::default()
    })
}

fn relative_error(problem: &Problem, s: &Solution) -> f64 {
    let err = s.error_vs_exact(problem).unwrap();
    let peak = s.peak();
    (err[0] / peak[0]).max(err[1] / peak[1])
}

#[test]
fn a_steady_manufactured_solution_converges_in_second_order_in_space() {
    // omega = 0: the exact solution is steady, so implicit Euler makes no time error and what
    // is left is the spatial error, O(h²) with centred advection.
    let mut errors = Vec::new();
    for n in [9, 17, 33] {
        let (problem, s) = solve(params(manufactured(0.0), n, 500.0, 2000.0));
        let e = relative_error(&problem, &s);
        eprintln!("n {n}: max error / peak {e:.3e}");
        errors.push(e);
    }
    for w in errors.windows(2) {
        let order = (w[0] / w[1]).log2();
        assert!((1.8..2.3).contains(&order), "order {order}: {errors:?}");
    }
}

#[test]
fn a_time_dependent_manufactured_solution_converges_in_first_order_in_time() {
    // On a fixed mesh the differences between runs with dt, dt/2, dt/4 cancel the spatial
    // error: their ratio is 2^order.
    let omega = 2.0 * std::f64::consts::PI / 4000.0;
    let runs: Vec<Solution> = [200.0, 100.0, 50.0, 25.0]
        .iter()
        .map(|&dt| solve(params(manufactured(omega), 9, dt, 2000.0)).1)
        .collect();
    let d: Vec<f64> = runs
        .windows(2)
        .map(|w| {
            let m = w[0].max_abs_diff(&w[1]);
            m[0].max(m[1] / 3.0)
        })
        .collect();
    eprintln!("successive differences {d:?}");
    for w in d.windows(2) {
        let order = (w[0] / w[1]).log2();
        assert!((0.85..1.2).contains(&order), "order {order}: {d:?}");
    }
    // And the error against the exact solution falls with dt on a finer mesh, towards the
    // spatial error.
    let (p1, s1) = solve(params(manufactured(omega), 17, 200.0, 2000.0));
    let (p2, s2) = solve(params(manufactured(omega), 17, 50.0, 2000.0));
    let (e1, e2) = (relative_error(&p1, &s1), relative_error(&p2, &s2));
    assert!(e2 < e1 / 2.0, "dt 200: {e1}, dt 50: {e2}");
}

#[test]
fn pure_transport_between_zero_flux_walls_conserves_mass() {
    let mut p = params(Model::Transport, 12, 300.0, 3000.0);
    p.blocks = 3;
    (p.tol, p.inner_tol) = (1e-12, 1e-13);
    let problem = Problem::new(p).unwrap();
    let start = problem.assemble_accepted(&problem.blocks()).unwrap();
    let run = problem.solve_jacobi().unwrap();
    let (m0, m1) = (start.mass(&problem), run.solution.mass(&problem));
    // The wind moves the profile 3 km towards the x = 0 wall and piles it up there, the
    // vertical diffusion spreads it: the state changes a lot, its mass does not.
    let moved = run.solution.max_abs_diff(&start)[0] / start.peak()[0];
    eprintln!("mass {m0:?} -> {m1:?}, largest change of c1 / peak {moved:.3}");
    assert!(moved > 0.1, "the profile moved: {moved}");
    for s in 0..2 {
        let drift = (m1[s] - m0[s]).abs() / m0[s];
        assert!(drift < 1e-10, "species {}: relative drift {drift:e}", s + 1);
    }
}

//! The equations: coefficients, reactions, walls, initial states and the exact solutions of the
//! verification variants.
//!
//! Every variant solves, for species i = 1, 2, on x, y in [0, 20], z in [30, 50] (km, s),
//!
//! ```text
//! dc_i/dt = K_h (d2/dx2 + d2/dy2) c_i + V dc_i/dx + d/dz (K_v(z) dc_i/dz) + R_i(c, t) + S_i
//! K_v(z) = kv0 exp(kv_rate z)
//! ```
//!
//! Note the sign of the advection term (cvDiurnal's): a profile moves towards -x at speed V.
//!
//! | model | coefficients | R | S | walls | initial state |
//! |---|---|---|---|---|---|
//! | `diurnal` | issue 7: K_h 4e-6, V 1e-3, K_v 1e-8 e^(z/5) | diurnal kinetics | 0 | Neumann | 1e6 a b g, 1e12 a b g |
//! | `diurnal-flat-y` | same | same | 0 | Neumann | same with b = 1 |
//! | `transport` | same | 0 | 0 | zero flux | same as diurnal |
//! | `puff` | constant ([`Puff`]) | -k_i c_i | 0 | zero flux | Gaussian |
//! | `manufactured` | [`Manufactured`] | -k_i c_i | chosen | Neumann | the exact solution |

use std::f64::consts::PI;

use serde::{Deserialize, Serialize};

/// The domain: x in [0, 20], y in [0, 20], z in [30, 50] (cvDiurnal_kry's, with y added).
pub const X_MAX: f64 = 20.0;
/// Upper end of y.
pub const Y_MAX: f64 = 20.0;
/// Lower end of z.
pub const Z_MIN: f64 = 30.0;
/// Upper end of z.
pub const Z_MAX: f64 = 50.0;

/// The diurnal kinetics constants (cvDiurnal_kry.c, issue 7 point 4).
pub mod diurnal {
    /// Horizontal diffusivity K_h.
    pub const KH: f64 = 4.0e-6;
    /// Wind V.
    pub const VEL: f64 = 1.0e-3;
    /// K_v(z) = KV0 exp(z / 5).
    pub const KV0: f64 = 1.0e-8;
    /// The rate of K_v's exponential: 1 / 5.
    pub const KV_RATE: f64 = 0.2;
    /// Rate constant q1.
    pub const Q1: f64 = 1.63e-16;
    /// Rate constant q2.
    pub const Q2: f64 = 4.66e-16;
    /// The fixed concentration c3.
    pub const C3: f64 = 3.7e16;
    /// q3(t) = exp(-A3 / sin(w t)) while sin(w t) > 0.
    pub const A3: f64 = 22.62;
    /// q4(t) = exp(-A4 / sin(w t)) while sin(w t) > 0.
    pub const A4: f64 = 7.601;
    /// w = pi / HALFDAY.
    pub const HALFDAY: f64 = 4.32e4;
    /// Scale of c1's initial bump.
    pub const C1_SCALE: f64 = 1.0e6;
    /// Scale of c2's initial bump.
    pub const C2_SCALE: f64 = 1.0e12;
}

/// Transport coefficients: K_h, V and K_v(z) = kv0 exp(kv_rate z).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Coeffs {
    /// Horizontal diffusivity K_h (km²/s), in x and y.
    pub kh: f64,
    /// Wind V (km/s) of the `+V dc/dx` term.
    pub v: f64,
    /// K_v(z) = kv0 exp(kv_rate z).
    pub kv0: f64,
    /// Rate of K_v's exponential (0: constant K_v = kv0).
    pub kv_rate: f64,
}

impl Coeffs {
    /// The issue's (and cvDiurnal's) coefficients.
    pub const DIURNAL: Coeffs = Coeffs {
        kh: diurnal::KH,
        v: diurnal::VEL,
        kv0: diurnal::KV0,
        kv_rate: diurnal::KV_RATE,
    };

    /// K_v at height z.
    pub fn kv(&self, z: f64) -> f64 {
        self.kv0 * (self.kv_rate * z).exp()
    }

    fn is_valid(&self) -> bool {
        [self.kh, self.v, self.kv0, self.kv_rate]
            .iter()
            .all(|x| x.is_finite())
            && self.kh >= 0.0
            && self.kv0 >= 0.0
    }
}

/// The Gaussian puff variant: constant coefficients, first-order decay, a closed-form solution.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Puff {
    /// Transport (kv_rate should be 0 for the closed form to hold).
    pub coeffs: Coeffs,
    /// Decay rates k_1, k_2 (R_i = -k_i c_i).
    pub decay: [f64; 2],
    /// Centre at t = 0.
    pub centre: [f64; 3],
    /// Standard deviation at t = 0 (km), the same in every direction.
    pub sigma: f64,
}

impl Default for Puff {
    /// A puff that drifts 2 km in 500 s and stays far from the walls.
    fn default() -> Self {
        Puff {
            coeffs: Coeffs {
                kh: 2.0e-3,
                v: 4.0e-3,
                kv0: 2.0e-3,
                kv_rate: 0.0,
            },
            decay: [1.0e-3, 2.0e-3],
            centre: [12.0, 10.0, 40.0],
            sigma: 1.5,
        }
    }
}

/// Amplitudes of the two species of a puff.
pub const PUFF_AMPLITUDE: [f64; 2] = [1.0, 2.0];

/// The manufactured-solution variant: a source S makes
/// `c_i = m_i (1 + cos(w t) P(x, y, z) / 2)`, with
/// `P = cos(pi x / 20) cos(pi y / 20) cos(pi (z - 30) / 20)` (whose normal derivative vanishes on
/// every wall), the exact solution.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manufactured {
    /// Transport.
    pub coeffs: Coeffs,
    /// Decay rates k_1, k_2 (R_i = -k_i c_i).
    pub decay: [f64; 2],
    /// Angular frequency w of the time factor (0: a steady solution, so implicit Euler makes
    /// no time error at all and only the spatial error is left).
    pub omega: f64,
}

/// The scales m_i of the manufactured species.
pub const MANUFACTURED_SCALE: [f64; 2] = [1.0, 3.0];

impl Default for Manufactured {
    fn default() -> Self {
        Manufactured {
            coeffs: Coeffs {
                kh: 1.0e-2,
                v: 2.0e-2,
                kv0: 1.0e-4,
                kv_rate: 0.1,
            },
            decay: [1.0e-3, 2.0e-3],
            omega: 0.0,
        }
    }
}

/// Which equations are solved (the table in the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Model {
    /// Issue 7's two-species diurnal kinetics in 3D.
    Diurnal,
    /// The same with no y-variation in the initial state (b(y) = 1): with any ny it stays
    /// uniform in y and reproduces cvDiurnal_kry's 2D problem.
    DiurnalFlatY,
    /// The diurnal transport with no reaction and zero-flux walls: mass is conserved.
    Transport,
    /// A Gaussian puff with constant coefficients and decay (closed form).
    Puff(Puff),
    /// A manufactured solution.
    Manufactured(Manufactured),
}

/// How the walls close the stencils (rules 3-4 of `grid.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Walls {
    /// cvDiurnal's homogeneous Neumann condition: a mirror ghost node (c_{-1} = c_1).
    Neumann,
    /// No total flux (advective + diffusive) through the walls: half cells at the walls.
    ZeroFlux,
}

/// The reaction term R.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Reaction {
    None,
    Decay([f64; 2]),
    Diurnal,
}

impl Model {
    /// The transport coefficients.
    pub fn coeffs(&self) -> Coeffs {
        match self {
            Model::Diurnal | Model::DiurnalFlatY | Model::Transport => Coeffs::DIURNAL,
            Model::Puff(p) => p.coeffs,
            Model::Manufactured(m) => m.coeffs,
        }
    }

    /// The wall condition.
    pub fn walls(&self) -> Walls {
        match self {
            Model::Diurnal | Model::DiurnalFlatY | Model::Manufactured(_) => Walls::Neumann,
            Model::Transport | Model::Puff(_) => Walls::ZeroFlux,
        }
    }

    pub(crate) fn reaction(&self) -> Reaction {
        match self {
            Model::Diurnal | Model::DiurnalFlatY => Reaction::Diurnal,
            Model::Transport => Reaction::None,
            Model::Puff(p) => Reaction::Decay(p.decay),
            Model::Manufactured(m) => Reaction::Decay(m.decay),
        }
    }

    /// Checks the variant's own parameters.
    pub(crate) fn check(&self) -> Result<(), String> {
        let c = self.coeffs();
        if !c.is_valid() {
            return Err(format!(
                "coefficients {c:?}: all finite, K_h and kv0 non-negative"
            ));
        }
        let decay_ok = |d: &[f64; 2]| d.iter().all(|k| k.is_finite() && *k >= 0.0);
        match self {
            Model::Puff(p) => {
                if !(decay_ok(&p.decay) && p.sigma.is_finite() && p.sigma > 0.0) {
                    return Err(format!("puff {p:?}: decay >= 0 and sigma > 0"));
                }
                if p.centre.iter().any(|x| !x.is_finite()) {
                    return Err(format!("puff centre {:?} is not finite", p.centre));
                }
            }
            Model::Manufactured(m) if !(decay_ok(&m.decay) && m.omega.is_finite()) => {
                return Err(format!("manufactured {m:?}: decay >= 0, omega finite"));
            }
            _ => {}
        }
        Ok(())
    }

    /// The initial concentrations at (x, y, z); `has_y` is false when the grid has one y node
    /// (no y-direction: the y factors drop out).
    pub fn initial(&self, x: f64, y: f64, z: f64, has_y: bool) -> [f64; 2] {
        match self {
            Model::Diurnal | Model::Transport => {
                let b = if has_y { bump(0.1 * (y - 10.0)) } else { 1.0 };
                let abg = bump(0.1 * (x - 10.0)) * b * bump(0.1 * (z - 40.0));
                [diurnal::C1_SCALE * abg, diurnal::C2_SCALE * abg]
            }
            Model::DiurnalFlatY => {
                let ag = bump(0.1 * (x - 10.0)) * bump(0.1 * (z - 40.0));
                [diurnal::C1_SCALE * ag, diurnal::C2_SCALE * ag]
            }
            Model::Puff(p) => puff_exact(p, x, y, z, 0.0, has_y),
            Model::Manufactured(m) => manufactured_exact(m, x, y, z, 0.0, has_y),
        }
    }

    /// The exact solution at time t, for the variants that have one.
    pub fn exact(&self, x: f64, y: f64, z: f64, t: f64, has_y: bool) -> Option<[f64; 2]> {
        match self {
            Model::Puff(p) => Some(puff_exact(p, x, y, z, t, has_y)),
            Model::Manufactured(m) => Some(manufactured_exact(m, x, y, z, t, has_y)),
            _ => None,
        }
    }

    /// The source S at (x, y, z, t) (zero but for the manufactured variant).
    pub(crate) fn source(&self, x: f64, y: f64, z: f64, t: f64, has_y: bool) -> [f64; 2] {
        match self {
            Model::Manufactured(m) => manufactured_source(m, x, y, z, t, has_y),
            _ => [0.0, 0.0],
        }
    }

    /// Whether [`Model::source`] is not identically zero.
    pub(crate) fn has_source(&self) -> bool {
        matches!(self, Model::Manufactured(_))
    }
}

/// SUNDIALS' polynomial bump `1 - s^2 + s^4 / 2`.
pub fn bump(s: f64) -> f64 {
    let s2 = s * s;
    1.0 - s2 + 0.5 * s2 * s2
}

/// The diurnal rates (q3(t), q4(t)): `exp(-A / sin(w t))` while `sin(w t) > 0`, else 0.
pub fn diurnal_rates(t: f64) -> (f64, f64) {
    let s = (PI / diurnal::HALFDAY * t).sin();
    if s > 0.0 {
        ((-diurnal::A3 / s).exp(), (-diurnal::A4 / s).exp())
    } else {
        (0.0, 0.0)
    }
}

fn puff_exact(p: &Puff, x: f64, y: f64, z: f64, t: f64, has_y: bool) -> [f64; 2] {
    let s0 = p.sigma * p.sigma;
    let sh = s0 + 2.0 * p.coeffs.kh * t;
    let sv = s0 + 2.0 * p.coeffs.kv0 * t;
    // The `+V dc/dx` term carries the puff towards -x.
    let dx = x - (p.centre[0] - p.coeffs.v * t);
    let dz = z - p.centre[2];
    let mut arg = dx * dx / (2.0 * sh) + dz * dz / (2.0 * sv);
    let mut amp = (s0 / sh).sqrt() * (s0 / sv).sqrt();
    if has_y {
        let dy = y - p.centre[1];
        arg += dy * dy / (2.0 * sh);
        amp *= (s0 / sh).sqrt();
    }
    let g = amp * (-arg).exp();
    [
        PUFF_AMPLITUDE[0] * g * (-p.decay[0] * t).exp(),
        PUFF_AMPLITUDE[1] * g * (-p.decay[1] * t).exp(),
    ]
}

/// P and its derivatives P_x, P_xx + P_yy, P_z, P_zz at a point.
fn shape(x: f64, y: f64, z: f64, has_y: bool) -> (f64, f64, f64, f64, f64) {
    let k = PI / 20.0;
    let (sx, cx) = (k * x).sin_cos();
    let cy = if has_y { (k * y).cos() } else { 1.0 };
    let (sz, cz) = (k * (z - Z_MIN)).sin_cos();
    let p = cx * cy * cz;
    let dims = if has_y { 2.0 } else { 1.0 };
    (
        p,
        -k * sx * cy * cz,
        -dims * k * k * p,
        -k * cx * cy * sz,
        -k * k * p,
    )
}

fn manufactured_exact(m: &Manufactured, x: f64, y: f64, z: f64, t: f64, has_y: bool) -> [f64; 2] {
    let (p, ..) = shape(x, y, z, has_y);
    let f = 1.0 + 0.5 * (m.omega * t).cos() * p;
    [MANUFACTURED_SCALE[0] * f, MANUFACTURED_SCALE[1] * f]
}

fn manufactured_source(m: &Manufactured, x: f64, y: f64, z: f64, t: f64, has_y: bool) -> [f64; 2] {
    let (p, px, pxy, pz, pzz) = shape(x, y, z, has_y);
    let c = &m.coeffs;
    let kv = c.kv(z);
    let theta = (m.omega * t).cos();
    let dtheta = -m.omega * (m.omega * t).sin();
    // L u = K_h (u_xx + u_yy) + V u_x + K_v' u_z + K_v u_zz, with u = m (1 + theta P / 2).
    let lp = c.kh * pxy + c.v * px + c.kv_rate * kv * pz + kv * pzz;
    let mut s = [0.0; 2];
    for (i, si) in s.iter_mut().enumerate() {
        let mi = MANUFACTURED_SCALE[i];
        let u = mi * (1.0 + 0.5 * theta * p);
        *si = mi * 0.5 * dtheta * p - mi * 0.5 * theta * lp + m.decay[i] * u;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bumps_and_rates_are_sundials() {
        assert_eq!(bump(0.0), 1.0);
        assert!((bump(1.0) - 0.5).abs() < 1e-15);
        assert_eq!(diurnal_rates(0.0), (0.0, 0.0));
        assert_eq!(diurnal_rates(50_000.0), (0.0, 0.0));
        let (q3, q4) = diurnal_rates(7200.0);
        assert!((q4 - (-7.601f64 / 0.5).exp()).abs() < 1e-12 * q4);
        assert!((q3 - (-22.62f64 / 0.5).exp()).abs() < 1e-12 * q3);
    }

    #[test]
    fn the_manufactured_source_balances_the_equation() {
        // Check S = u_t - L u + k u against centred differences of the exact solution.
        let m = Manufactured {
            omega: 1e-3,
            ..Manufactured::default()
        };
        let model = Model::Manufactured(m);
        let (x, y, z, t) = (3.1, 7.3, 41.7, 250.0);
        let h = 1e-3;
        let u = |x: f64, y: f64, z: f64, t: f64| model.exact(x, y, z, t, true).unwrap();
        let s = model.source(x, y, z, t, true);
        let c = m.coeffs;
        for (i, si) in s.iter().enumerate() {
            let f = |x, y, z, t| u(x, y, z, t)[i];
            let ut = (f(x, y, z, t + h) - f(x, y, z, t - h)) / (2.0 * h);
            let uxx = (f(x + h, y, z, t) - 2.0 * f(x, y, z, t) + f(x - h, y, z, t)) / (h * h);
            let uyy = (f(x, y + h, z, t) - 2.0 * f(x, y, z, t) + f(x, y - h, z, t)) / (h * h);
            let ux = (f(x + h, y, z, t) - f(x - h, y, z, t)) / (2.0 * h);
            let flux = |z: f64| c.kv(z) * (f(x, y, z + h / 2.0, t) - f(x, y, z - h / 2.0, t)) / h;
            let dz = (flux(z + h / 2.0) - flux(z - h / 2.0)) / h;
            let lu = c.kh * (uxx + uyy) + c.v * ux + dz;
            let want = ut - lu + m.decay[i] * f(x, y, z, t);
            assert!((si - want).abs() < 1e-6, "species {i}: {si} vs {want}");
        }
    }
}

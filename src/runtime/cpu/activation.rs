//! The SiLU-gated product `silu(gate) · up` of SwiGLU MLPs.

use rayon::prelude::*;

pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.par_iter().zip(up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect()
}

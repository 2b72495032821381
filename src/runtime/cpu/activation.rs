//! The SiLU-gated product `silu(gate) · up` of SwiGLU MLPs: `g / (1 + exp(−g)) · u` with [`crate::runtime::host::exp`], in
//! chunks on the rayon pool, each chunk with AVX-512 or AVX2 where the CPU has them (the same operations in the
//! same order, so the same bits on every instruction set).

use rayon::prelude::*;

use crate::runtime::host::exp::exp;

/// Values per parallel task.
const CHUNK: usize = 16 * 1024;

pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; gate.len()];
    out.par_chunks_mut(CHUNK)
        .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
        .for_each(|(out, (gate, up))| silu_mul_into(gate, up, out));
    out
}

/// transformers' clamped SwiGLU inputs (GLM-5.3-Flash's `Glm5NextTextMLP`/`Glm5NextTextExperts`): the gate
/// clamped to `≤ limit`, the up projection to `[−limit, limit]`, in place.
pub fn clamp_swiglu(gate: &mut [f32], up: &mut [f32], limit: f32) {
    for g in gate.iter_mut() {
        *g = g.min(limit);
    }
    for u in up.iter_mut() {
        *u = u.clamp(-limit, limit);
    }
}

fn silu_mul_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        // SAFETY: the CPU supports AVX-512F (its level).
        crate::simd::Level::Avx512 => return unsafe { silu_mul_avx512(gate, up, out) },
        // SAFETY: the CPU supports AVX2 (its level).
        crate::simd::Level::Avx2 => return unsafe { silu_mul_avx2(gate, up, out) },
        crate::simd::Level::Portable => {}
    }
    silu_mul_portable(gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn silu_mul_avx512(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul_portable(gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn silu_mul_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul_portable(gate, up, out)
}

#[inline(always)]
fn silu_mul_portable(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((out, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *out = g / (1.0 + exp(-g)) * u;
    }
}

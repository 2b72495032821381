//! Importance-weighted INT4 scales (the `imatrix` method): per input channel `j` an importance `imp_j` — the mean
//! of `x_j²` over the calibration tokens that reach the layer, as llama.cpp's imatrix and llm-compressor's
//! `imatrix_mse` observer use it — weights the clip search of the `mse` rule, whose error becomes
//! `Σ_j imp_j · (w_j − ŵ_j)²`: a weight on a channel the activations never excite costs nothing, one on a loud
//! channel costs in proportion.
//!
//! Candidates are the `mse` rule's (`bf16(p · absmax / 7.5)`, `p = 1 − i/grid`, `i < max_shrink · grid`), codes
//! `round_half_even(clamp(w / s, −8, 7))`, ties keep the larger `p`; with every importance equal, the chosen scale
//! is the `mse` search's under the squared-error norm.

use half::bf16;

use super::int4_code::{absmax, code, stored_scale};
use super::scale_rule::MseSearch;

/// Mean of `x²` per input channel, accumulated over calibration inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Importance {
    sum: Vec<f64>,
    samples: u64,
}

impl Importance {
    pub fn new(columns: usize) -> Self {
        Self { sum: vec![0.0; columns], samples: 0 }
    }

    /// Adds input vectors (row-major `[n, columns]`).
    pub fn add(&mut self, inputs: &[f32]) {
        let columns = self.sum.len();
        assert_eq!(inputs.len() % columns.max(1), 0, "inputs are whole rows of {columns}");
        for x in inputs.chunks_exact(columns.max(1)) {
            for (s, &v) in self.sum.iter_mut().zip(x) {
                *s += v as f64 * v as f64;
            }
            self.samples += 1;
        }
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The per-channel means, as f32 weights for [`quantize_row`].
    pub fn weights(&self) -> Vec<f32> {
        let n = self.samples.max(1) as f64;
        self.sum.iter().map(|s| (s / n) as f32).collect()
    }
}

/// Quantizes one row with importance-weighted scales; `importance` has one entry per column of the row. Uses
/// AVX-512 or AVX2 when the CPU has them (the same operations in the same order: bit-identical either way).
pub fn quantize_row(
    weights: &[f32],
    importance: &[f32],
    group_size: usize,
    search: MseSearch,
    q: &mut [i8],
    scales: &mut [bf16],
) {
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        // SAFETY: the CPU supports AVX-512F (its level).
        crate::simd::Level::Avx512 => {
            return unsafe { quantize_row_avx512(weights, importance, group_size, search, q, scales) }
        }
        // SAFETY: the CPU supports AVX2 (its level).
        crate::simd::Level::Avx2 => {
            return unsafe { quantize_row_avx2(weights, importance, group_size, search, q, scales) }
        }
        crate::simd::Level::Portable => {}
    }
    quantize_row_portable(weights, importance, group_size, search, q, scales)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn quantize_row_avx512(
    weights: &[f32],
    importance: &[f32],
    group_size: usize,
    search: MseSearch,
    q: &mut [i8],
    scales: &mut [bf16],
) {
    quantize_row_portable(weights, importance, group_size, search, q, scales)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_row_avx2(
    weights: &[f32],
    importance: &[f32],
    group_size: usize,
    search: MseSearch,
    q: &mut [i8],
    scales: &mut [bf16],
) {
    quantize_row_portable(weights, importance, group_size, search, q, scales)
}

#[inline(always)]
fn quantize_row_portable(
    weights: &[f32],
    importance: &[f32],
    group_size: usize,
    search: MseSearch,
    q: &mut [i8],
    scales: &mut [bf16],
) {
    assert_eq!(weights.len(), importance.len());
    for (((group, imp), q_group), scale) in weights
        .chunks(group_size)
        .zip(importance.chunks(group_size))
        .zip(q.chunks_mut(group_size))
        .zip(scales.iter_mut())
    {
        *scale = quantize_group(group, imp, search, q_group);
    }
}

/// One group: the candidate with the smallest weighted squared error; returns its stored scale.
#[inline(always)]
pub fn quantize_group(group: &[f32], importance: &[f32], search: MseSearch, q: &mut [i8]) -> bf16 {
    let top = absmax(group);
    let steps = (search.max_shrink * search.grid as f32) as u32;
    let mut best_scale = stored_scale(top / 7.5);
    let mut best_error = f32::INFINITY;
    for step in 0..steps.max(1) {
        let shrink = 1.0 - step as f32 / search.grid as f32;
        let scale = stored_scale(shrink * top / 7.5);
        let error = weighted_error(group, importance, scale.to_f32());
        if error < best_error {
            best_error = error;
            best_scale = scale;
        }
    }
    let s = best_scale.to_f32();
    for (value, out) in group.iter().zip(q.iter_mut()) {
        *out = code(*value, s, -8);
    }
    best_scale
}

/// `Σ imp_j · (w_j − q_j·s)²`, element `j` in lane `j % 8`, lanes combined pairwise (fixed order), written over
/// chunks of eight so that it vectorizes.
#[inline(always)]
fn weighted_error(group: &[f32], importance: &[f32], scale: f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (chunks, tail) = group.as_chunks::<8>();
    let (importance_chunks, importance_tail) = importance[..group.len()].as_chunks::<8>();
    for (chunk, imp) in chunks.iter().zip(importance_chunks) {
        for ((lane, &w), &imp) in lanes.iter_mut().zip(chunk).zip(imp) {
            let e = w - code(w, scale, -8) as f32 * scale;
            *lane += imp * e * e;
        }
    }
    for ((lane, &w), &imp) in lanes.iter_mut().zip(tail).zip(importance_tail) {
        let e = w - code(w, scale, -8) as f32 * scale;
        *lane += imp * e * e;
    }
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::ScaleRule;
    use crate::quant::{int4, int4_code};
    use crate::rng::Rng;

    /// The weighted error as first written (one loop, `lanes[j % 8]`), kept as the oracle.
    fn weighted_error_oracle(group: &[f32], importance: &[f32], scale: f32) -> f32 {
        let mut lanes = [0.0f32; 8];
        for (index, (&w, &imp)) in group.iter().zip(importance).enumerate() {
            let e = w - code(w, scale, -8) as f32 * scale;
            lanes[index % 8] += imp * e * e;
        }
        ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
    }

    #[test]
    fn chunked_error_and_dispatched_rows_match_the_oracle() {
        let mut rng = Rng::new(31);
        for group_size in [32usize, 128, 12, 100] {
            let row: Vec<f32> =
                (0..group_size * 64).map(|j| rng.normal() * if j % 17 == 0 { 4.0 } else { 1.0 }).collect();
            let importance: Vec<f32> =
                (0..row.len()).map(|j| rng.uniform() * if j % 5 == 0 { 0.0 } else { 3.0 }).collect();
            let (mut q, mut scales) = (vec![0i8; row.len()], vec![bf16::ZERO; row.len() / group_size]);
            quantize_row(&row, &importance, group_size, MseSearch::default(), &mut q, &mut scales);
            for ((group, imp), scale) in row.chunks(group_size).zip(importance.chunks(group_size)).zip(&scales) {
                let top = absmax(group);
                let steps = (MseSearch::default().max_shrink * MseSearch::default().grid as f32) as u32;
                let mut best = (stored_scale(top / 7.5), f32::INFINITY);
                for step in 0..steps {
                    let candidate = stored_scale((1.0 - step as f32 / 100.0) * top / 7.5);
                    let error = weighted_error_oracle(group, imp, candidate.to_f32());
                    assert_eq!(error.to_bits(), weighted_error(group, imp, candidate.to_f32()).to_bits());
                    if error < best.1 {
                        best = (candidate, error);
                    }
                }
                assert_eq!(scale.to_bits(), best.0.to_bits(), "group size {group_size}");
            }
        }
    }

    #[test]
    fn importance_is_the_mean_square_per_channel() {
        let mut imp = Importance::new(3);
        imp.add(&[1.0, 2.0, 0.0, 3.0, -2.0, 0.0]);
        assert_eq!(imp.samples(), 2);
        assert_eq!(imp.weights(), vec![5.0, 4.0, 0.0]);
    }

    #[test]
    fn never_worse_than_minmax_in_the_weighted_error() {
        let mut rng = Rng::new(9);
        for _ in 0..200 {
            let group: Vec<f32> = (0..32).map(|_| rng.normal()).collect();
            let importance: Vec<f32> = (0..32).map(|_| rng.uniform() * 4.0).collect();
            let mut q = [0i8; 32];
            let chosen = quantize_group(&group, &importance, MseSearch::default(), &mut q).to_f32();
            let minmax = int4::quantize_group(&group, ScaleRule::CtMinmax, &mut [0i8; 32]).to_f32();
            assert!(weighted_error(&group, &importance, chosen) <= weighted_error(&group, &importance, minmax));
            assert!(q.iter().zip(&group).all(|(&c, &w)| c == int4_code::code(w, chosen, -8)));
        }
    }

    #[test]
    fn a_silent_channel_does_not_steer_the_scale() {
        // One outlier on a channel with zero importance: the search ignores it and fits the others (the outlier
        // clips), where the unweighted search must keep it in range.
        let mut group: Vec<f32> = (0..32).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
        group[5] = 5.0;
        let mut importance = vec![1.0f32; 32];
        importance[5] = 0.0;
        let weighted = quantize_group(&group, &importance, MseSearch::default(), &mut [0i8; 32]).to_f32();
        let plain = quantize_group(&group, &[1.0; 32], MseSearch::default(), &mut [0i8; 32]).to_f32();
        let rest = |s: f32| {
            group
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != 5)
                .map(|(_, &w)| (w - int4_code::code(w, s, -8) as f32 * s).powi(2))
                .sum::<f32>()
        };
        assert!(rest(weighted) <= rest(plain));
    }
}

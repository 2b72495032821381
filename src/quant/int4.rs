//! Symmetric INT4 group quantization of one row: per-group BF16 scale chosen by a [`ScaleRule`], then
//! `q = clamp(round_half_even(w / scale), qmin, 7)` computed with the scale *as stored* (BF16-rounded).

use half::bf16;

use super::scale_rule::{MseSearch, ScaleRule};

/// compressed-tensors replaces a zero scale by this (float32 machine epsilon) so that q stays 0.
pub const ZERO_GROUP_SCALE: f32 = f32::EPSILON;

/// Quantizes one row `weights` into `q` (same length) and `scales` (one per group).
pub fn quantize_row(weights: &[f32], group_size: usize, rule: ScaleRule, q: &mut [i8], scales: &mut [bf16]) {
    debug_assert_eq!(weights.len() % group_size, 0);
    debug_assert_eq!(scales.len(), weights.len() / group_size);
    for ((group, q_group), scale) in weights.chunks(group_size).zip(q.chunks_mut(group_size)).zip(scales.iter_mut()) {
        *scale = quantize_group(group, rule, q_group);
    }
}

/// Quantizes one group and returns its stored scale.
pub fn quantize_group(group: &[f32], rule: ScaleRule, q: &mut [i8]) -> bf16 {
    let absmax = group.iter().fold(0.0f32, |acc, &w| acc.max(w.abs()));
    match rule {
        ScaleRule::CtMinmax => {
            let scale = stored_scale(absmax / 7.5);
            round_group(group, scale.to_f32(), -8, q);
            scale
        }
        ScaleRule::Absmax7 => {
            let scale = stored_scale(absmax / 7.0);
            round_group(group, scale.to_f32(), -7, q);
            scale
        }
        ScaleRule::Mse => mse_group(group, absmax, MseSearch::default(), q),
    }
}

/// Rounds a candidate scale to BF16, replacing zero by [`ZERO_GROUP_SCALE`].
fn stored_scale(scale: f32) -> bf16 {
    let scale = if scale > 0.0 { scale } else { ZERO_GROUP_SCALE };
    bf16::from_f32(scale)
}

#[inline]
fn round_group(group: &[f32], scale: f32, q_min: i8, q: &mut [i8]) {
    let (low, high) = (q_min as f32, 7.0f32);
    for (value, out) in group.iter().zip(q.iter_mut()) {
        *out = (value / scale).round_ties_even().clamp(low, high) as i8;
    }
}

/// llm-compressor's mse observer, per group: for shrink `p = 1 - i/grid`, `i < max_shrink·grid`, the scale
/// `bf16(p·absmax/7.5)` is tried and the one with the smallest `Σ|w - q·s|^norm` kept (ties keep the larger `p`).
/// The error is measured with the stored BF16 scale, so it is the error the engine will see.
pub fn mse_group(group: &[f32], absmax: f32, search: MseSearch, q: &mut [i8]) -> bf16 {
    let steps = (search.max_shrink * search.grid as f32) as u32;
    let mut best_scale = stored_scale(absmax / 7.5);
    let mut best_error = f32::INFINITY;
    for step in 0..steps.max(1) {
        let shrink = 1.0 - step as f32 / search.grid as f32;
        let scale = stored_scale(shrink * absmax / 7.5);
        let scale_f32 = scale.to_f32();
        let error: f32 = group
            .iter()
            .map(|&w| {
                let q = (w / scale_f32).round_ties_even().clamp(-8.0, 7.0);
                (w - q * scale_f32).abs().powf(search.norm)
            })
            .sum();
        if error < best_error {
            best_error = error;
            best_scale = scale;
        }
    }
    round_group(group, best_scale.to_f32(), -8, q);
    best_scale
}

/// Dequantizes one row: `w = q · scale` per group.
pub fn dequantize_row(q: &[i8], scales: &[bf16], group_size: usize, out: &mut [f32]) {
    for ((q_group, out_group), scale) in q.chunks(group_size).zip(out.chunks_mut(group_size)).zip(scales) {
        let scale = scale.to_f32();
        for (value, out) in q_group.iter().zip(out_group.iter_mut()) {
            *out = *value as f32 * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_minmax_matches_the_documented_example() {
        // scale 0.0625 = absmax 0.46875 / 7.5; w/s = [-7.5, 7.5, 2.5, 1.5, -0.5, 0, 3.2, -1.7]
        let scale = 0.0625f32;
        let ratios = [-7.5f32, 7.5, 2.5, 1.5, -0.5, 0.0, 3.2, -1.7];
        let group: Vec<f32> = ratios.iter().map(|r| r * scale).collect();
        let mut q = [0i8; 8];
        let stored = quantize_group(&group, ScaleRule::CtMinmax, &mut q);
        assert_eq!(stored.to_f32(), scale);
        assert_eq!(q, [-8, 7, 2, 2, 0, 0, 3, -2]);
    }

    #[test]
    fn absmax7_never_uses_minus_eight() {
        let group: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.013).collect();
        let mut q = [0i8; 64];
        quantize_group(&group, ScaleRule::Absmax7, &mut q);
        assert!(q.iter().all(|&v| (-7..=7).contains(&v)));
        assert!(q.contains(&7) || q.contains(&-7));
    }

    #[test]
    fn mse_is_never_worse_than_minmax_in_its_own_norm() {
        let group: Vec<f32> =
            (0..32).map(|i| ((i * 7919 % 101) as f32 / 101.0 - 0.5) * if i == 3 { 9.0 } else { 1.0 }).collect();
        let error = |rule| {
            let mut q = [0i8; 32];
            let scale = quantize_group(&group, rule, &mut q).to_f32();
            group.iter().zip(q).map(|(w, q)| (w - q as f32 * scale).abs().powf(2.4)).sum::<f32>()
        };
        assert!(error(ScaleRule::Mse) <= error(ScaleRule::CtMinmax));
    }

    #[test]
    fn zero_group_gets_epsilon_scale_and_zero_codes() {
        let mut q = [5i8; 32];
        let scale = quantize_group(&[0.0; 32], ScaleRule::CtMinmax, &mut q);
        assert!(scale.to_f32() > 0.0);
        assert!(q.iter().all(|&v| v == 0));
    }
}

//! Symmetric INT4 group quantization of one row: per-group BF16 scale chosen by a [`ScaleRule`], then
//! `q = clamp(round_half_even(w / scale), qmin, 7)` computed with the scale *as stored* (BF16-rounded).

use half::bf16;

use super::int4_code::{absmax, round_clamped, stored_scale};
use super::scale_rule::{MseSearch, ScaleRule};

/// Quantizes one row `weights` into `q` (same length) and `scales` (one per group). Uses AVX-512 or AVX2 (each
/// with FMA) when the CPU has them: the same IEEE operations in the same order, so the result is bit-identical
/// either way (FMA is used only by the `mse` screen, whose values bound errors and are never stored).
pub fn quantize_row(weights: &[f32], group_size: usize, rule: ScaleRule, q: &mut [i8], scales: &mut [bf16]) {
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        // SAFETY: the CPU supports AVX-512F and FMA (its level).
        crate::simd::Level::Avx512 => return unsafe { quantize_row_avx512(weights, group_size, rule, q, scales) },
        // SAFETY: the CPU supports AVX2 and FMA (its level).
        crate::simd::Level::Avx2 => return unsafe { quantize_row_avx2(weights, group_size, rule, q, scales) },
        crate::simd::Level::Portable => {}
    }
    quantize_row_portable(weights, group_size, rule, q, scales)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn quantize_row_avx512(weights: &[f32], group_size: usize, rule: ScaleRule, q: &mut [i8], scales: &mut [bf16]) {
    quantize_row_portable(weights, group_size, rule, q, scales)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_row_avx2(weights: &[f32], group_size: usize, rule: ScaleRule, q: &mut [i8], scales: &mut [bf16]) {
    quantize_row_portable(weights, group_size, rule, q, scales)
}

#[inline(always)]
fn quantize_row_portable(weights: &[f32], group_size: usize, rule: ScaleRule, q: &mut [i8], scales: &mut [bf16]) {
    debug_assert_eq!(weights.len() % group_size, 0);
    debug_assert_eq!(scales.len(), weights.len() / group_size);
    for ((group, q_group), scale) in weights.chunks(group_size).zip(q.chunks_mut(group_size)).zip(scales.iter_mut()) {
        *scale = quantize_group(group, rule, q_group);
    }
}

/// Quantizes one group and returns its stored scale.
#[inline(always)]
pub fn quantize_group(group: &[f32], rule: ScaleRule, q: &mut [i8]) -> bf16 {
    let absmax = absmax(group);
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
        ScaleRule::Mse => {
            let scale = super::mse::search(group, absmax, MseSearch::default());
            round_group(group, scale.to_f32(), -8, q);
            scale
        }
    }
}

/// The most negative code a rule uses: −8, except `absmax7`'s symmetric −7.
pub fn q_min(rule: ScaleRule) -> i8 {
    match rule {
        ScaleRule::Absmax7 => -7,
        ScaleRule::CtMinmax | ScaleRule::Mse => -8,
    }
}

/// `q = round_half_even(clamp(w / scale, q_min, 7))`, which equals clamping after rounding because the bounds
/// are integers (compressed-tensors clamps first, too). A NaN weight gives q = 0. The rounded value is read
/// straight from the bits of `clamped + 1.5·2^23`, whose low mantissa bits hold the integer.
#[inline(always)]
fn round_group(group: &[f32], scale: f32, q_min: i8, q: &mut [i8]) {
    let low = q_min as f32;
    for (value, out) in group.iter().zip(q.iter_mut()) {
        *out = round_clamped(value / scale, low) as i8;
    }
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

/// Dequantizes one row whose column `j` belongs to group `groups[j]` (contiguous groups, or a GPTQ `g_idx`), with
/// f32 scales per group and, for an asymmetric scheme, a zero point per group: `w = (q − z) · s`, in f32. This is
/// compressed-tensors' `dequantize` (`quantization/lifecycle/forward.py`: the code minus the zero point, times the
/// scale, in the scale's dtype) when the scale is F32, and its value for any other scale dtype rounded once to that
/// dtype (the product of a 5-bit integer and a BF16/F16 scale is exact in f32).
pub fn dequantize_row_grouped(q: &[i8], scales: &[f32], zeros: Option<&[i8]>, groups: &[u32], out: &mut [f32]) {
    for ((value, out), &group) in q.iter().zip(out.iter_mut()).zip(groups) {
        let zero = zeros.map_or(0, |zeros| zeros[group as usize]);
        *out = (*value as i32 - zero as i32) as f32 * scales[group as usize];
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

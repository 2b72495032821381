//! One INT4 code and one stored scale: the grid that the row quantizer (int4.rs), the MSE scale search (mse.rs),
//! importance-weighted scales (imatrix.rs) and GPTQ (gptq.rs) all round to.

use half::bf16;

/// compressed-tensors replaces a zero scale by this (float32 machine epsilon) so that q stays 0.
pub const ZERO_GROUP_SCALE: f32 = f32::EPSILON;

/// One weight's code under a stored scale: `round_half_even(clamp(w / scale, q_min, 7))`, as [`super::int4::quantize_group`]
/// computes it.
#[inline(always)]
pub fn code(value: f32, scale: f32, q_min: i8) -> i8 {
    round_clamped(value / scale, q_min as f32) as i8
}

/// Rounds a candidate scale to BF16, replacing zero by [`ZERO_GROUP_SCALE`].
pub(crate) fn stored_scale(scale: f32) -> bf16 {
    let scale = if scale > 0.0 { scale } else { ZERO_GROUP_SCALE };
    bf16::from_f32(scale)
}

/// Largest magnitude in a group (NaN ignored), in eight independent lanes so that it vectorizes.
#[inline(always)]
pub fn absmax(group: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let chunks = group.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, value) in lanes.iter_mut().zip(chunk) {
            let magnitude = value.abs();
            *lane = if magnitude > *lane { magnitude } else { *lane };
        }
    }
    let mut result = tail.iter().fold(0.0f32, |acc, v| if v.abs() > acc { v.abs() } else { acc });
    for lane in lanes {
        result = if lane > result { lane } else { result };
    }
    result
}

/// 1.5·2^23: see [`round_clamped`].
const ROUNDING_MAGIC: f32 = 12_582_912.0;

/// `round_half_even(clamp(ratio, low, 7))` (NaN gives 0): adding 1.5·2^23 moves
/// the value where the float spacing is 1, so the addition itself rounds, ties to even; the integer is then read
/// from the low mantissa bits. Equal to clamping after rounding because the bounds are integers
/// (compressed-tensors clamps first, too).
#[inline(always)]
pub(crate) fn round_clamped(ratio: f32, low: f32) -> i32 {
    let clamped = if ratio < low {
        low
    } else if ratio > 7.0 {
        7.0
    } else if ratio.is_nan() {
        0.0
    } else {
        ratio
    };
    (clamped + ROUNDING_MAGIC).to_bits() as i32 - ROUNDING_MAGIC.to_bits() as i32
}

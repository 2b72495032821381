//! W4A8-FP8 (INT4 group weights, e4m3 activations quantized per token at run time) as vLLM computes it on Hopper
//! with its CUTLASS W4A8 kernels, the first backend `fused_moe/oracle/w4a8.py` `select_w4a8_moe_backend` tries.
//! The runtime emulates it so that `eval` scores a W4A8 folder as the engine serves it, not as W4A16.
//!
//! - **Weights.** On load, each output row's BF16 group scales become e4m3 group scales and one f32 channel scale
//!   (`quantization/utils/quant_utils.py` `convert_bf16_scales_to_fp8`): the row of scales is quantized to e4m3 as a
//!   token would be ([`quantize_row`]), those values are divided by 8 and rounded to e4m3 again, and the channel
//!   scale is multiplied by 8. The kernel makes each weight from its INT4 code and its group's e4m3 scale in e4m3
//!   (the reference of vLLM's kernel test `tests/kernels/quantization/test_cutlass_w4a8.py`:
//!   `(w_q · w_s.to(fp8)).to(fp8)`; the division by 8 keeps `8 · scale` ≤ 448), so a weight is
//!   `e4m3(q · s₈) · channel`.
//! - **Activations.** Each token's row is quantized to e4m3 under `max|x| / 448`, floored at `1 / (448 · 512)`, by a
//!   product with the scale's reciprocal (`input_quant_fp8.py` `QuantFP8.forward_native`, per token; the CUDA
//!   kernel `dynamic_per_token_scaled_fp8_quant` inverts the scale the same way).
//!
//! Golden: `tests/golden/vllm_w4a8.safetensors` (`scripts/oracle/make-w4a8-golden.py`, which runs those vLLM
//! functions). SGLang's `CompressedTensorsW4AFP8MoE` keeps BF16 group scales and quantizes activations per tensor;
//! this module emulates vLLM's path, the one the checkpoint's `strategy: token` declares.

use super::fp8::{self, E4M3_MAX};

/// The smallest per-token scale (`input_quant_fp8.py` `_FP8_MIN_SCALING_FACTOR`).
pub const MIN_SCALE: f32 = 1.0 / (E4M3_MAX * 512.0);

/// `row` quantized to e4m3 in place under one dynamic scale (returned): each value becomes its code's value,
/// `e4m3(clamp(x · 1/scale, ±448))`, `scale = max(max|x| / 448, MIN_SCALE)`.
pub fn quantize_row(row: &mut [f32]) -> f32 {
    let absmax = row.iter().fold(0f32, |max, value| max.max(value.abs()));
    let scale = (absmax / E4M3_MAX).max(MIN_SCALE);
    let inverse = 1.0 / scale;
    for value in row.iter_mut() {
        *value = fp8::decode(fp8::encode((*value * inverse).clamp(-E4M3_MAX, E4M3_MAX)));
    }
    scale
}

/// Activations `[tokens, width]` quantized to e4m3 per token and back, in place: what the engine multiplies.
pub fn fake_quantize_tokens(values: &mut [f32], width: usize) {
    for row in values.chunks_mut(width.max(1)) {
        let scale = quantize_row(row);
        for value in row.iter_mut() {
            *value *= scale;
        }
    }
}

/// One output row's group scales as the engine keeps them: in place, each becomes its e4m3 scale `s₈`; returns
/// the row's channel scale.
pub fn engine_scales(scales: &mut [f32]) -> f32 {
    let channel = quantize_row(scales);
    for scale in scales.iter_mut() {
        *scale = fp8::decode(fp8::encode(*scale / 8.0));
    }
    channel * 8.0
}

/// One row of a W4A8 weight as the engine computes with it: codes `q` (−8…7), the row's stored group scales
/// (rounded to BF16 first: vLLM makes the scale parameters in the model's dtype), `group_size` columns each.
pub fn dequantize_row(q: &[i8], scales: &[f32], group_size: usize, out: &mut [f32]) {
    let mut engine: Vec<f32> = scales.iter().map(|&scale| half::bf16::from_f32(scale).to_f32()).collect();
    let channel = engine_scales(&mut engine);
    for ((codes, values), &scale) in q.chunks(group_size).zip(out.chunks_mut(group_size)).zip(&engine) {
        for (value, &code) in values.iter_mut().zip(codes) {
            *value = fp8::decode(fp8::encode(code as f32 * scale)) * channel;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_row_keeps_its_largest_value_and_rounds_the_rest_to_e4m3() {
        let mut row = vec![448.0, -1.0, 0.3, 100.0];
        let mut fake = row.clone();
        let scale = quantize_row(&mut row);
        assert_eq!(scale, 1.0);
        // 0.3 → 0.3125 (e4m3 has 3 mantissa bits: 0.3 lies between 0.28125 and 0.3125, nearer the latter);
        // 100 → 96 (steps of 8 between 64 and 128; 100 is a tie between 96 and 104, which goes to the even 96).
        assert_eq!(row, [448.0, -1.0, 0.3125, 96.0]);
        fake_quantize_tokens(&mut fake, 2);
        // Two tokens: [448, −1] keeps scale 1; [0.3, 100] has scale 100/448.
        assert_eq!(&fake[..2], &[448.0, -1.0]);
        assert!((fake[3] - 100.0).abs() < 1e-4, "a token's largest value maps to 448 and back: {}", fake[3]);
    }

    #[test]
    fn an_all_zero_token_takes_the_floor_scale_and_stays_zero() {
        let mut row = vec![0.0; 8];
        assert_eq!(quantize_row(&mut row), MIN_SCALE);
        fake_quantize_tokens(&mut row, 8);
        assert!(row.iter().all(|&value| value == 0.0));
    }

    #[test]
    fn engine_scales_put_the_largest_at_56_and_the_channel_scale_times_8() {
        let mut scales = vec![0.5, 0.25, 0.01];
        let channel = engine_scales(&mut scales);
        assert_eq!(channel, 0.5 / 448.0 * 8.0);
        assert_eq!(scales[0], 56.0);
        assert_eq!(scales[1], 28.0);
        // 0.01 · 896 = 8.96 → e4m3 9 (steps of 1 between 8 and 16) → 9/8 = 1.125, an e4m3 value.
        assert_eq!(scales[2], 1.125);
    }

    #[test]
    fn a_weight_is_the_e4m3_product_of_code_and_scale_times_the_channel() {
        // One group of 4 with scale 0.5: s₈ = 56, channel = 0.5/448·8; the largest code keeps its exact value.
        let (q, scales) = ([-8i8, 7, 1, 0], [0.5f32]);
        let mut out = [0f32; 4];
        dequantize_row(&q, &scales, 4, &mut out);
        let channel = 0.5 / 448.0 * 8.0;
        assert_eq!(out[0], -448.0 * channel);
        // 7 · 56 = 392 → e4m3 384 (steps of 32 between 256 and 512; 392 is nearer 384).
        assert_eq!(out[1], 384.0 * channel);
        assert_eq!(out[2], 56.0 * channel);
        assert_eq!(out[3], 0.0);
    }
}

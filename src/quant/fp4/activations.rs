//! What the engines do to W4A4 NVFP4 activations, which the runtime emulates: one activation global scale per
//! layer from the experts' `input_global_scale`s, and the activations quantized to NVFP4 and back.

use super::{absmax, decode, encode, E2M1_MAX, NVFP4_GROUP};
use crate::quant::fp8;

/// One activation global scale for all experts of a layer from their `input_global_scale`s, as vLLM's NVFP4 MoE
/// takes it (`fused_moe/oracle/nvfp4.py`: `a13_scale = 1 / w13_input_global_scale`, then `1 / a13_scale.max()`):
/// the expert with the widest calibrated range sets it for all. `None` without scales.
pub fn engine_activation_global(input_global_scales: impl IntoIterator<Item = f32>) -> Option<f32> {
    let widest = input_global_scales.into_iter().map(|scale| 1.0 / scale).reduce(f32::max)?;
    Some(1.0 / widest)
}

/// `1 / x`, with vLLM's guard for 0 (`get_reciprocal`: `1 / (x + (x == 0) · 1e8)`).
fn guarded_reciprocal(x: f32) -> f32 {
    1.0 / (x + if x == 0.0 { 1e8 } else { 0.0 })
}

/// NVFP4 activations quantized and dequantized in place (rows of a length that is a multiple of 16) under the
/// activation global scale `global`, exactly as vLLM emulates W4A4 NVFP4 where no FP4 tensor core runs it
/// (`quantization/utils/nvfp4_emulation_utils.py` `ref_nvfp4_quant` + `ref_nvfp4_quant_dequant`, its CPU branch):
///
/// ```text
/// s = e4m3(clamp(global · (absmax(group) · (1/6)), ±448))      a dynamic ("local") scale per group of 16
/// q = e2m1(clamp(x · 1/(s · 1/global), ±6))                     a product by the reciprocal, not a division
/// x ← q · (s / global)
/// ```
/// Golden: `tests/golden/vllm_nvfp4_activations.safetensors` (`scripts/oracle/make-nvfp4-activation-golden.py`).
pub fn nvfp4_fake_quantize_activations(values: &mut [f32], global: f32) {
    let inverse_global = guarded_reciprocal(global);
    for group in values.chunks_mut(NVFP4_GROUP) {
        let wanted = global * (absmax(group) * (1.0 / E2M1_MAX));
        let scale = fp8::decode(fp8::encode(wanted.clamp(-fp8::E4M3_MAX, fp8::E4M3_MAX)));
        let multiplier = guarded_reciprocal(scale * inverse_global);
        let step = scale / global;
        for value in group {
            *value = decode(encode((*value * multiplier).clamp(-E2M1_MAX, E2M1_MAX))) * step;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_activation_global_is_the_widest_experts() {
        assert_eq!(engine_activation_global([2688.0, 1344.0, 5376.0]), Some(1344.0));
        assert_eq!(engine_activation_global(std::iter::empty()), None);
    }
}

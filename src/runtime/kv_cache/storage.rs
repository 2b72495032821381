//! Element encoding of cached KV rows: F32 (exact, for tests), BF16, or FP8 e4m3 with a per-element scale
//! (`fp8 = encode(x / scale)`, `x ≈ decode(fp8) · scale`; the scale is the layer's `k_scale`/`v_scale`).

use crate::format::kv_scales::KvDtype;
use crate::quant::fp8;

/// Encodes `values` into `out` (`values.len() · bytes` bytes); `scales` has one entry per value (FP8 only).
pub fn encode(dtype: KvDtype, values: &[f32], scales: &[f32], out: &mut [u8]) {
    match dtype {
        KvDtype::F32 => {
            for (value, slot) in values.iter().zip(out.chunks_exact_mut(4)) {
                slot.copy_from_slice(&value.to_le_bytes());
            }
        }
        KvDtype::Bf16 => {
            for (value, slot) in values.iter().zip(out.chunks_exact_mut(2)) {
                slot.copy_from_slice(&half::bf16::from_f32(*value).to_bits().to_le_bytes());
            }
        }
        KvDtype::Fp8 => {
            for ((value, scale), slot) in values.iter().zip(scales).zip(out.iter_mut()) {
                *slot = fp8::encode(value / scale);
            }
        }
    }
}

/// Decodes `bytes` into `out` (inverse of [`encode`]).
pub fn decode(dtype: KvDtype, bytes: &[u8], scales: &[f32], out: &mut [f32]) {
    match dtype {
        KvDtype::F32 => {
            for (slot, chunk) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *slot = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            }
        }
        KvDtype::Bf16 => {
            for (slot, chunk) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *slot = half::bf16::from_bits(u16::from_le_bytes([chunk[0], chunk[1]])).to_f32();
            }
        }
        KvDtype::Fp8 => {
            for ((slot, &code), scale) in out.iter_mut().zip(bytes).zip(scales) {
                *slot = fp8::decode(code) * scale;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_within_the_format_precision() {
        let values: Vec<f32> = (0..37).map(|i| ((i * 7919) % 97) as f32 / 13.0 - 3.1).collect();
        let scales = vec![0.02f32; values.len()];
        for dtype in [KvDtype::F32, KvDtype::Bf16, KvDtype::Fp8] {
            let mut bytes = vec![0u8; values.len() * dtype.bytes()];
            encode(dtype, &values, &scales, &mut bytes);
            let mut back = vec![0f32; values.len()];
            decode(dtype, &bytes, &scales, &mut back);
            // Relative step of the format: f32 exact, bf16 2^-8, e4m3 2^-3 (values here are normal in e4m3/0.02).
            let tolerance = match dtype {
                KvDtype::F32 => 0.0,
                KvDtype::Bf16 => 1.0 / 256.0,
                KvDtype::Fp8 => 1.0 / 16.0,
            };
            for (a, b) in values.iter().zip(&back) {
                assert!((a - b).abs() <= tolerance * a.abs() + 1e-6, "{dtype:?}: {a} vs {b}");
            }
        }
    }
}

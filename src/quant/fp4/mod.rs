//! FP4 E2M1 group schemes: NVFP4 (groups of 16 with an FP8 E4M3 scale under one f32 global scale per tensor) and
//! MXFP4 (groups of 32 with a power-of-two E8M0 scale), as compressed-tensors 0.20.1 computes them
//! (`quantization/utils/helpers.py` `generate_gparam`, `calculate_qparams`; `quantization/utils/mxfp_utils.py`
//! `generate_mx_scales`; `quantization/utils/fp4_utils.py` `cast_to_fp4`; `compressors/nvfp4/helpers.py`
//! `pack_fp4_to_uint8`). Golden: `tests/golden/ct_fp4.safetensors` (`scripts/oracle/make-fp4-golden.py`).
//!
//! ```text
//! E2M1 code: bit 3 the sign, bits 0–2 the index into 0, 0.5, 1, 1.5, 2, 3, 4, 6
//! rounding:  to the nearest grid value, ties to the even index (0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2,
//!            2.5 → 2, 3.5 → 4, 5 → 4); beyond ±6 saturates; a negative that rounds to 0 keeps its sign (−0, code 8)
//!
//! NVFP4 global  g = 448 · 6 / max(absmax(W), f32::MIN_POSITIVE)  (f32; not finite → 1)
//!       group   s = e4m3(g · (absmax(group) / 6)), 0 → 0.125;   q = e2m1(w / (s / g))
//!       value   w ≈ e2m1 · (s / g)                              (w = fp4 · weight_scale / weight_global_scale)
//! MXFP4 group   e = clamp(127 + ⌊log2 p⌋ − 2, 0, 255), p = absmax(group) with its mantissa rounded to 1 bit
//!               upward from 1.75 (f32 bits + 2^21, exponent kept); 0 → e = 0
//!               q = e2m1(w / 2^(e − 127));   value w ≈ e2m1 · 2^(e − 127)
//! ```

use super::fp8;

/// NVFP4's group length.
pub const NVFP4_GROUP: usize = 16;
/// MXFP4's group length.
pub const MXFP4_GROUP: usize = 32;
/// The largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// The E2M1 magnitudes by index.
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
/// The NVFP4 scale compressed-tensors substitutes for a zero one (the eps of FP8 E4M3 in its
/// `_get_dtype_eps`).
const NVFP4_ZERO_SCALE: f32 = 0.125;

/// The value of a 4-bit E2M1 code (bits above 3 ignored).
#[inline]
pub fn decode(code: u8) -> f32 {
    let magnitude = E2M1[(code & 7) as usize];
    if code & 8 != 0 {
        -magnitude
    } else {
        magnitude
    }
}

/// The E2M1 code nearest to `x` (ties to the even index, saturating at ±6; a negative rounding to 0 gives −0; NaN
/// gives 0). The index counts the grid's midpoints below `|x|` (`>` where the tie goes down, `>=` where it goes
/// up), in 32-bit lanes without branches, so that a row's loop vectorizes; beyond 5 every midpoint is below, which
/// is the saturation (no clamp needed).
#[inline(always)]
pub fn encode(x: f32) -> u8 {
    encode_wide(x) as u8
}

/// [`encode`] in a 32-bit lane (the width of the f32 it reads, so that a vector of codes needs no narrowing until
/// it is stored).
#[inline(always)]
fn encode_wide(x: f32) -> u32 {
    let m = x.abs();
    u32::from(m > 0.25)
        + u32::from(m >= 0.75)
        + u32::from(m > 1.25)
        + u32::from(m >= 1.75)
        + u32::from(m > 2.5)
        + u32::from(m >= 3.5)
        + u32::from(m > 5.0)
        + (u32::from(x < 0.0) << 3)
}

/// Encodes a group of `N`: `codes[i] = encode(group[i] / step)`, a true division (as torch divides), element by
/// element; the fixed length lets the loop unroll into whole vectors (a shorter last group, which the planned
/// shapes never give, is encoded element by element).
#[inline(always)]
fn encode_group<const N: usize>(group: &[f32], step: f32, codes: &mut [u8]) {
    let (Ok(group), Ok(codes)) = (<&[f32; N]>::try_from(group), <&mut [u8; N]>::try_from(&mut *codes)) else {
        for (code, &w) in codes.iter_mut().zip(group) {
            *code = encode(w / step);
        }
        return;
    };
    let mut wide = [0u32; N];
    for (code, &w) in wide.iter_mut().zip(group) {
        *code = encode_wide(w / step);
    }
    for (code, wide) in codes.iter_mut().zip(wide) {
        *code = wide as u8;
    }
}

/// Packs codes two per byte, the even element in the low nibble.
pub fn pack(codes: &[u8], out: &mut [u8]) {
    for (byte, pair) in out.iter_mut().zip(codes.chunks_exact(2)) {
        *byte = (pair[0] & 0xF) | (pair[1] << 4);
    }
}

/// The codes of packed bytes, the low nibble first.
pub fn unpack(packed: &[u8], out: &mut [u8]) {
    for (pair, byte) in out.chunks_exact_mut(2).zip(packed) {
        pair[0] = byte & 0xF;
        pair[1] = byte >> 4;
    }
}

/// The largest magnitude of `values`, NaN ignored (what [`nvfp4_global_scale`] and each group's scale take).
#[inline(always)]
pub fn absmax(values: &[f32]) -> f32 {
    super::int4_code::absmax(values)
}

/// NVFP4's global scale for a tensor (or fused partners) whose largest magnitude is `absmax`: 448 · 6 / absmax as
/// compressed-tensors' `generate_gparam` evaluates it — a Python number over a tensor, which torch computes as
/// `reciprocal(absmax) · 2688`, two f32 roundings (a plain division differs in the last bit for some absmax).
pub fn nvfp4_global_scale(absmax: f32) -> f32 {
    let global = (1.0 / absmax.max(f32::MIN_POSITIVE)) * (fp8::E4M3_MAX * E2M1_MAX);
    if global.is_finite() {
        global
    } else {
        1.0
    }
}

/// Quantizes one row (length a multiple of 16) under global scale `global`: `codes` one E2M1 code per element,
/// `scales` one E4M3 byte per group. AVX2 when the CPU has it: the same IEEE operations, vectorized (bit-identical).
pub fn nvfp4_quantize_row(weights: &[f32], global: f32, codes: &mut [u8], scales: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() >= crate::simd::Level::Avx2 {
        // SAFETY: the CPU supports AVX2 (its level).
        return unsafe { nvfp4_quantize_row_avx2(weights, global, codes, scales) };
    }
    nvfp4_quantize_row_portable(weights, global, codes, scales)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn nvfp4_quantize_row_avx2(weights: &[f32], global: f32, codes: &mut [u8], scales: &mut [u8]) {
    nvfp4_quantize_row_portable(weights, global, codes, scales)
}

#[inline(always)]
fn nvfp4_quantize_row_portable(weights: &[f32], global: f32, codes: &mut [u8], scales: &mut [u8]) {
    for ((group, codes), scale) in weights.chunks(NVFP4_GROUP).zip(codes.chunks_mut(NVFP4_GROUP)).zip(scales) {
        let mut stored = fp8::encode(global * (absmax(group) / E2M1_MAX));
        if fp8::decode(stored) == 0.0 {
            stored = fp8::encode(NVFP4_ZERO_SCALE);
        }
        *scale = stored;
        encode_group::<NVFP4_GROUP>(group, fp8::decode(stored) / global, codes);
    }
}

/// [`nvfp4_quantize_row`] writing the codes packed two per byte as [`pack`] packs them (`packed` holds half the
/// row's length): the same bytes, without the row of codes in between. AVX2 when the CPU has it: eight groups at a
/// time, their absmaxes, E4M3 scales and steps each one vector, the codes packed in registers ([`avx2`]); the
/// portable version otherwise, and for the last groups of a row that are not a whole eight.
pub fn nvfp4_quantize_row_packed(weights: &[f32], global: f32, packed: &mut [u8], scales: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() >= crate::simd::Level::Avx2 {
        // SAFETY: the CPU supports AVX2 (its level).
        return unsafe { avx2::nvfp4_quantize_row_packed(weights, global, packed, scales) };
    }
    nvfp4_quantize_row_packed_portable(weights, global, packed, scales)
}

/// [`nvfp4_quantize_row_packed`] group by group, as [`nvfp4_quantize_row_portable`] then [`pack`].
fn nvfp4_quantize_row_packed_portable(weights: &[f32], global: f32, packed: &mut [u8], scales: &mut [u8]) {
    let mut codes = [0u8; NVFP4_GROUP];
    for ((group, packed), scale) in
        weights.chunks(NVFP4_GROUP).zip(packed.chunks_mut(NVFP4_GROUP / 2)).zip(scales.iter_mut())
    {
        let codes = &mut codes[..group.len()];
        nvfp4_quantize_row_portable(group, global, codes, std::slice::from_mut(scale));
        pack(codes, packed);
    }
}

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod cast;

pub use activations::{engine_activation_global, nvfp4_fake_quantize_activations};

/// Dequantizes one NVFP4 row: `codes` per element, `scales` E4M3 bytes per group of 16.
pub fn nvfp4_dequantize_row(codes: &[u8], scales: &[u8], global: f32, out: &mut [f32]) {
    for ((out, codes), &scale) in out.chunks_mut(NVFP4_GROUP).zip(codes.chunks(NVFP4_GROUP)).zip(scales) {
        let step = fp8::decode(scale) / global;
        for (value, &code) in out.iter_mut().zip(codes) {
            *value = decode(code) * step;
        }
    }
}

/// The E8M0 exponent of an MXFP4 group whose largest magnitude is `absmax`.
pub fn mxfp4_exponent(absmax: f32) -> u8 {
    // Round the mantissa to one bit, upward from 1.75 (compressed-tensors' round_to_power_2 for E2M1), keep the
    // exponent: a power of two (or 0, or infinity), whose log2 is read off its bits (subnormals computed).
    let power = f32::from_bits(absmax.to_bits().wrapping_add(1 << 21) & 0xFF80_0000);
    let biased = (power.to_bits() >> 23) & 0xFF;
    let log2 = match biased {
        0 if power == 0.0 => return 0,
        0 => power.log2().floor(),
        255 => f32::INFINITY,
        _ => biased as f32 - 127.0,
    };
    (127.0 + log2 - 2.0).clamp(0.0, 255.0) as u8
}

/// `2^(exponent − 127)` (exponent 0 is the subnormal 2^−127, 255 is infinity), from the bits.
pub fn mxfp4_scale(exponent: u8) -> f32 {
    match exponent {
        0 => f32::from_bits(1 << 22),
        e => f32::from_bits(u32::from(e) << 23),
    }
}

/// Quantizes one row (length a multiple of 32): `codes` one E2M1 code per element, `exponents` one E8M0 byte per
/// group. AVX2 when the CPU has it (bit-identical).
pub fn mxfp4_quantize_row(weights: &[f32], codes: &mut [u8], exponents: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() >= crate::simd::Level::Avx2 {
        // SAFETY: the CPU supports AVX2 (its level).
        return unsafe { mxfp4_quantize_row_avx2(weights, codes, exponents) };
    }
    mxfp4_quantize_row_portable(weights, codes, exponents)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn mxfp4_quantize_row_avx2(weights: &[f32], codes: &mut [u8], exponents: &mut [u8]) {
    mxfp4_quantize_row_portable(weights, codes, exponents)
}

#[inline(always)]
fn mxfp4_quantize_row_portable(weights: &[f32], codes: &mut [u8], exponents: &mut [u8]) {
    for ((group, codes), exponent) in weights.chunks(MXFP4_GROUP).zip(codes.chunks_mut(MXFP4_GROUP)).zip(exponents) {
        *exponent = mxfp4_exponent(absmax(group));
        encode_group::<MXFP4_GROUP>(group, mxfp4_scale(*exponent), codes);
    }
}

/// Dequantizes one MXFP4 row: `codes` per element, E8M0 `exponents` per group of 32.
pub fn mxfp4_dequantize_row(codes: &[u8], exponents: &[u8], out: &mut [f32]) {
    for ((out, codes), &exponent) in out.chunks_mut(MXFP4_GROUP).zip(codes.chunks(MXFP4_GROUP)).zip(exponents) {
        let scale = mxfp4_scale(exponent);
        for (value, &code) in out.iter_mut().zip(codes) {
            *value = decode(code) * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_decodes_to_its_grid_value_and_encodes_back() {
        for code in 0u8..16 {
            let value = decode(code);
            // −0 (code 8) encodes as +0: only a negative that rounds to zero keeps the sign.
            let back = if code == 8 { 0 } else { code };
            assert_eq!(encode(value), back, "code {code} = {value}");
        }
    }

    #[test]
    fn rounding_goes_to_the_nearest_value_and_ties_to_even() {
        let cases = [
            (0.25, 0.0),
            (0.26, 0.5),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
            (5.01, 6.0),
            (100.0, 6.0),
            (-2.6, -3.0),
        ];
        for (x, want) in cases {
            assert_eq!(decode(encode(x)), want, "{x}");
        }
        assert_eq!(encode(-0.1), 8, "a small negative rounds to −0");
        assert_eq!(encode(-0.0), 0);
    }

    #[test]
    fn packing_puts_the_even_element_low() {
        let mut packed = [0u8; 2];
        pack(&[1, 2, 15, 8], &mut packed);
        assert_eq!(packed, [0x21, 0x8F]);
        let mut codes = [0u8; 4];
        unpack(&packed, &mut codes);
        assert_eq!(codes, [1, 2, 15, 8]);
    }

    #[test]
    fn an_nvfp4_group_whose_absmax_is_the_tensors_uses_the_largest_scale() {
        let row: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) / 4.0).collect();
        let global = nvfp4_global_scale(absmax(&row));
        let (mut codes, mut scales) = (vec![0u8; 16], vec![0u8; 1]);
        nvfp4_quantize_row(&row, global, &mut codes, &mut scales);
        assert_eq!(fp8::decode(scales[0]), 448.0);
        let mut back = vec![0f32; 16];
        nvfp4_dequantize_row(&codes, &scales, global, &mut back);
        // The absmax comes back within two ulps (448 · 6 / global, divided back): the global scale is rounded twice,
        // reciprocal then times 2688, as compressed-tensors computes it.
        let ulps = (back[0] - row[0]).abs() / (f32::EPSILON * row[0].abs());
        assert!(ulps <= 2.0, "the absmax: {} vs {} ({ulps} ulps)", back[0], row[0]);
        // The widest gap of the grid (4 → 6) is two steps of absmax / 6: no value is further than one.
        for (got, want) in back.iter().zip(&row) {
            assert!((got - want).abs() <= row[0].abs() / 6.0, "{got} vs {want}");
        }
    }

    #[test]
    fn mx_exponents_round_the_group_max_up_from_one_point_seven_five() {
        assert_eq!(mxfp4_exponent(6.0), 127, "6 = 1.5 · 2^2 → 2^2 → 2^0 scale");
        assert_eq!(mxfp4_exponent(1.75), 126, "1.75 rounds to 2 → scale 2^-1");
        assert_eq!(mxfp4_exponent(1.74), 125);
        assert_eq!(mxfp4_exponent(0.0), 0);
        assert_eq!(mxfp4_scale(127), 1.0);
    }

    #[test]
    fn a_short_last_group_is_encoded_too() {
        let row: Vec<f32> = (0..24).map(|i| i as f32 / 4.0 - 3.0).collect();
        let (mut codes, mut scales) = (vec![0xFFu8; 24], vec![0u8; 2]);
        nvfp4_quantize_row(&row, nvfp4_global_scale(absmax(&row)), &mut codes, &mut scales);
        assert!(codes.iter().all(|&c| c < 16), "every code written: {codes:?}");
        assert_eq!(codes[23], encode(row[23] / (fp8::decode(scales[1]) / nvfp4_global_scale(absmax(&row)))));
    }

    #[test]
    fn mx_scales_and_exponents_read_off_the_bits_equal_the_arithmetic() {
        for exponent in 0..=255u8 {
            let want = 2f32.powi(exponent as i32 - 127);
            assert_eq!(mxfp4_scale(exponent).to_bits(), want.to_bits(), "exponent {exponent}");
        }
        let arithmetic = |absmax: f32| {
            let power = f32::from_bits(absmax.to_bits().wrapping_add(1 << 21) & 0xFF80_0000);
            if power == 0.0 {
                0
            } else {
                (127.0 + power.log2().floor() - 2.0).clamp(0.0, 255.0) as u8
            }
        };
        let mut x = f32::from_bits(1);
        while x.is_finite() {
            for v in [x, x * 1.74, x * 1.75, x * 1.9] {
                assert_eq!(mxfp4_exponent(v), arithmetic(v), "absmax {v:e}");
            }
            // Subnormals step by bits (× 1.3 would round back to the same value).
            x = (x * 1.3).max(f32::from_bits(x.to_bits() + 1));
        }
        assert_eq!(mxfp4_exponent(f32::INFINITY), 255);
        assert_eq!(mxfp4_exponent(f32::MAX), arithmetic(f32::MAX));
    }

    #[test]
    fn rows_quantize_as_the_element_by_element_definition() {
        // The definition, one element at a time: clamp to ±6, then the nearest grid value (ties to even).
        let nearest = |x: f32| -> u8 {
            if x.is_nan() {
                return 0;
            }
            let m = x.clamp(-E2M1_MAX, E2M1_MAX).abs();
            let mut best = 0;
            for (i, &g) in E2M1.iter().enumerate() {
                let (d, b) = ((m - g).abs(), (m - E2M1[best]).abs());
                if d < b || (d == b && i % 2 == 0) {
                    best = i;
                }
            }
            best as u8 | (u8::from(x < 0.0) << 3)
        };
        let mut rng = crate::rng::Rng::new(7);
        let mut row: Vec<f32> = (0..512).map(|_| rng.normal() * 0.02).collect();
        row[3] = 0.0;
        row[40] = -0.0;
        row[100] = 1e-30;
        row[200] = -f32::MIN_POSITIVE;
        row[480..512].fill(0.0);
        let global = nvfp4_global_scale(absmax(&row));
        let (mut codes, mut scales) = (vec![0u8; 512], vec![0u8; 32]);
        nvfp4_quantize_row(&row, global, &mut codes, &mut scales);
        for (g, group) in row.chunks(NVFP4_GROUP).enumerate() {
            let step = fp8::decode(scales[g]) / global;
            for (i, &w) in group.iter().enumerate() {
                assert_eq!(codes[g * NVFP4_GROUP + i], nearest(w / step), "nvfp4 element {}", g * 16 + i);
            }
        }
        let mut exponents = vec![0u8; 16];
        mxfp4_quantize_row(&row, &mut codes, &mut exponents);
        for (g, group) in row.chunks(MXFP4_GROUP).enumerate() {
            assert_eq!(exponents[g], mxfp4_exponent(group.iter().fold(0f32, |m, v| m.max(v.abs()))));
            for (i, &w) in group.iter().enumerate() {
                let want = nearest(w / mxfp4_scale(exponents[g]));
                assert_eq!(codes[g * MXFP4_GROUP + i], want, "mxfp4 element {}", g * 32 + i);
            }
        }
    }
}

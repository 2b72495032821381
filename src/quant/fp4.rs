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

/// The E2M1 code nearest to `x` (ties to the even index, saturating at ±6; a negative rounding to 0 gives −0).
/// The index counts the grid's midpoints below `|x|` (`>` where the tie goes down, `>=` where it goes up), without
/// branches, so that a row's loop vectorizes.
#[inline]
pub fn encode(x: f32) -> u8 {
    let m = x.abs();
    let index = u8::from(m > 0.25)
        + u8::from(m >= 0.75)
        + u8::from(m > 1.25)
        + u8::from(m >= 1.75)
        + u8::from(m > 2.5)
        + u8::from(m >= 3.5)
        + u8::from(m > 5.0);
    index | (u8::from(x < 0.0) << 3)
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

/// The largest magnitude of `values` (what [`nvfp4_global_scale`] and each group's scale take).
pub fn absmax(values: &[f32]) -> f32 {
    values.iter().fold(0f32, |max, v| max.max(v.abs()))
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
/// `scales` one E4M3 byte per group.
pub fn nvfp4_quantize_row(weights: &[f32], global: f32, codes: &mut [u8], scales: &mut [u8]) {
    for ((group, codes), scale) in weights.chunks(NVFP4_GROUP).zip(codes.chunks_mut(NVFP4_GROUP)).zip(scales) {
        let mut stored = fp8::encode(global * (absmax(group) / E2M1_MAX));
        if fp8::decode(stored) == 0.0 {
            stored = fp8::encode(NVFP4_ZERO_SCALE);
        }
        *scale = stored;
        let step = fp8::decode(stored) / global;
        for (code, &w) in codes.iter_mut().zip(group) {
            *code = encode((w / step).clamp(-E2M1_MAX, E2M1_MAX));
        }
    }
}

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
    // exponent: a power of two (or 0, or infinity).
    let power = f32::from_bits(absmax.to_bits().wrapping_add(1 << 21) & 0xFF80_0000);
    if power == 0.0 {
        return 0;
    }
    (127.0 + power.log2().floor() - 2.0).clamp(0.0, 255.0) as u8
}

/// `2^(exponent − 127)`.
pub fn mxfp4_scale(exponent: u8) -> f32 {
    2f32.powi(exponent as i32 - 127)
}

/// Quantizes one row (length a multiple of 32): `codes` one E2M1 code per element, `exponents` one E8M0 byte per
/// group.
pub fn mxfp4_quantize_row(weights: &[f32], codes: &mut [u8], exponents: &mut [u8]) {
    for ((group, codes), exponent) in weights.chunks(MXFP4_GROUP).zip(codes.chunks_mut(MXFP4_GROUP)).zip(exponents) {
        *exponent = mxfp4_exponent(absmax(group));
        let scale = mxfp4_scale(*exponent);
        for (code, &w) in codes.iter_mut().zip(group) {
            *code = encode((w / scale).clamp(-E2M1_MAX, E2M1_MAX));
        }
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
}

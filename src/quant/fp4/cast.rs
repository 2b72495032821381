//! MXFP4 → NVFP4 without loss: the E2M1 codes kept, each group's power-of-two E8M0 scale re-expressed as an E4M3
//! block scale under one power-of-two global scale per tensor (shared by an expert's gate and up), as NVIDIA
//! ModelOpt casts MXFP4 releases for Blackwell (Model-Optimizer#1372, #1653, #2206).
//!
//! ```text
//! MXFP4 value   w = e2m1 · 2^(e − 127)                    e: a group's E8M0 byte (32 elements)
//! NVFP4 value   w = e2m1 · s / g                          s: E4M3 byte per 16, g: F32 global (compressed-tensors'
//!                                                            `weight_global_scale`, a divisor)
//! the cast      g = 2^G, G = min(135 − e_max, 127)        e_max: the largest exponent of a group holding a
//!                                                            nonzero code (ModelOpt's scale_2 = 1/g = 2^(k_max − 8))
//!               s = 2^p, p = e − 127 + G ≤ 8              both 16-blocks of a group get the group's scale
//! exact when    p ≥ −9                                    E4M3's smallest power of two (subnormal 2^−9); 2^8 is its
//!                                                            largest, so a tensor's groups are exact while their
//!                                                            exponents lie within 17 of e_max
//! otherwise     s = 2^−9 and each value re-encoded to the nearest E2M1 code at step 2^(−9 − G) (ties to the even
//!               code, as [`super::encode`]): the group is counted as inexact; the caller names it
//! zero groups   (every code ±0) decode to ±0 under any scale: exact, their scale clamped into range
//! ```
//! The decoded values of every exact group equal the source's bit for bit: `s / g` is the power of two
//! 2^(e − 127), which f32 and BF16 both hold for every E8M0 byte below 255 (255 is NaN and refused upstream).

use super::{decode, encode, MXFP4_GROUP, NVFP4_GROUP};

/// E4M3's largest power of two: 2^8 (448 is 1.75 · 2^8).
const MAX_POWER: i32 = 8;
/// E4M3's smallest power of two: the subnormal 2^−9.
const MIN_POWER: i32 = -9;

/// A group of packed E2M1 bytes whose codes are all ±0.
fn is_zero_group(packed: &[u8]) -> bool {
    packed.iter().all(|byte| byte & 0x77 == 0)
}

/// The largest E8M0 exponent among the groups of a row holding a nonzero code (`packed` two codes per byte, one
/// exponent per 32 codes); `None` when every group is zero.
pub fn max_exponent(packed: &[u8], exponents: &[u8]) -> Option<u8> {
    packed.chunks(MXFP4_GROUP / 2).zip(exponents).filter(|(group, _)| !is_zero_group(group)).map(|(_, &e)| e).max()
}

/// log2 of the global scale the cast gives a tensor (or fused partners) whose largest nonzero-group exponent is
/// `max_exponent` (0, a global of 1, when every group is zero).
pub fn global_log2(max_exponent: Option<u8>) -> i32 {
    max_exponent.map_or(0, |e| (135 - i32::from(e)).min(127))
}

/// The F32 global scale `2^global_log2` (in range: −119 ≤ G ≤ 127).
pub fn global_scale(global_log2: i32) -> f32 {
    f32::from_bits(((global_log2 + 127) as u32) << 23)
}

/// The E4M3 byte of 2^`power`, `power` in −9…8.
fn e4m3_power(power: i32) -> u8 {
    debug_assert!((MIN_POWER..=MAX_POWER).contains(&power));
    if power >= -6 {
        ((power + 7) << 3) as u8
    } else {
        1 << (power + 9)
    }
}

/// Casts one row: `packed` E2M1 codes (two per byte, even element low) with one E8M0 `exponents` byte per 32 into
/// NVFP4 bytes `packed_out` and one E4M3 scale per 16 in `scales_out`, under global 2^`global_log2`. Returns the
/// indices (within the row) of the groups that could not be cast exactly, re-encoded by the rule above.
pub fn mxfp4_to_nvfp4_row(
    packed: &[u8],
    exponents: &[u8],
    global_log2: i32,
    packed_out: &mut [u8],
    scales_out: &mut [u8],
) -> Vec<usize> {
    let mut inexact = Vec::new();
    let groups = packed.chunks(MXFP4_GROUP / 2).zip(packed_out.chunks_mut(MXFP4_GROUP / 2));
    let blocks = scales_out.chunks_mut(MXFP4_GROUP / NVFP4_GROUP);
    for (index, (((group, group_out), &exponent), block_scales)) in groups.zip(exponents).zip(blocks).enumerate() {
        let power = i32::from(exponent) - 127 + global_log2;
        if power >= MIN_POWER || is_zero_group(group) {
            group_out.copy_from_slice(group);
            block_scales.fill(e4m3_power(power.clamp(MIN_POWER, MAX_POWER)));
            continue;
        }
        // value / step = e2m1 · 2^(e − 127) / 2^(−9 − G) = e2m1 · 2^(power + 9), power + 9 < 0: a power-of-two
        // scaling (exact in f32 down to its subnormals), then rounded to the grid.
        let shrink = f32::from_bits(((power + 9 + 127).max(0) as u32) << 23);
        for (byte_out, &byte) in group_out.iter_mut().zip(group) {
            let low = encode(decode(byte & 0xF) * shrink);
            let high = encode(decode(byte >> 4) * shrink);
            *byte_out = low | (high << 4);
        }
        block_scales.fill(e4m3_power(MIN_POWER));
        inexact.push(index);
    }
    inexact
}

#[cfg(test)]
mod tests {
    use super::super::{fp8, mxfp4_dequantize_row, nvfp4_dequantize_row, unpack};
    use super::*;

    #[test]
    fn the_e4m3_bytes_of_powers_of_two_decode_to_them() {
        for power in MIN_POWER..=MAX_POWER {
            assert_eq!(fp8::decode(e4m3_power(power)), 2f32.powi(power), "2^{power}");
        }
    }

    /// Decodes a packed MXFP4 and a packed NVFP4 row with the crate's dequantizers (which follow compressed-tensors').
    fn decoded(packed: &[u8], exponents: &[u8], cast: &[u8], scales: &[u8], global: f32) -> (Vec<f32>, Vec<f32>) {
        let n = packed.len() * 2;
        let (mut codes, mut cast_codes) = (vec![0u8; n], vec![0u8; n]);
        unpack(packed, &mut codes);
        unpack(cast, &mut cast_codes);
        let (mut source, mut target) = (vec![0f32; n], vec![0f32; n]);
        mxfp4_dequantize_row(&codes, exponents, &mut source);
        nvfp4_dequantize_row(&cast_codes, scales, global, &mut target);
        (source, target)
    }

    /// Every group whose exponent lies within 17 of the largest decodes to the same bits (signs of zero included),
    /// for every exponent byte 0…254 as the largest; groups further down are named, and re-encoded to the nearest
    /// code of the coarser step.
    #[test]
    fn groups_within_the_e4m3_range_cast_bit_exactly_and_the_others_are_named() {
        let mut rng = crate::rng::Rng::new(46);
        for e_max in 0u8..=254 {
            let groups = 8;
            let mut exponents: Vec<u8> = (0..groups).map(|_| e_max.saturating_sub(rng.below(24) as u8)).collect();
            exponents[3] = e_max;
            let packed: Vec<u8> = (0..groups * 16).map(|_| rng.below(256) as u8).collect();
            let mut packed = packed;
            packed[3 * 16] |= 0x07; // group 3 holds a nonzero code
            let log2 = global_log2(max_exponent(&packed, &exponents));
            let global = global_scale(log2);
            assert!(global.is_finite() && global > 0.0, "e_max {e_max}");
            let (mut out, mut scales) = (vec![0u8; packed.len()], vec![0u8; groups * 2]);
            let inexact = mxfp4_to_nvfp4_row(&packed, &exponents, log2, &mut out, &mut scales);
            let (source, target) = decoded(&packed, &exponents, &out, &scales, global);
            for group in 0..groups {
                let exact = i32::from(exponents[group]) - 127 + log2 >= MIN_POWER;
                assert_eq!(!exact, inexact.contains(&group), "e_max {e_max} group {group}");
                let range = group * 32..(group + 1) * 32;
                if exact {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&source[range.clone()]), bits(&target[range]), "e_max {e_max} group {group}");
                } else {
                    let step = fp8::decode(scales[group * 2]) / global;
                    for (s, t) in source[range.clone()].iter().zip(&target[range]) {
                        assert!((s - t).abs() <= step, "e_max {e_max} group {group}: {s} vs {t}");
                    }
                }
            }
        }
    }

    #[test]
    fn zero_groups_are_exact_whatever_their_exponent_and_an_all_zero_tensor_gets_global_one() {
        let packed = [0x80u8; 32];
        let exponents = [0u8, 254];
        assert_eq!(max_exponent(&packed, &exponents), None);
        assert_eq!(global_scale(global_log2(None)), 1.0);
        let (mut out, mut scales) = ([0u8; 32], [0u8; 4]);
        assert!(mxfp4_to_nvfp4_row(&packed, &exponents, 0, &mut out, &mut scales).is_empty());
        assert_eq!(out, packed);
    }
}

//! NVFP4 rows under AVX2, eight groups of 16 (128 weights, 64 packed bytes, 8 scales) per step, each IEEE operation
//! the portable code's, lane by lane, so that the bytes are the same:
//!
//! ```text
//! absmax   |w| lane by lane, max_ps(|w|, m) keeping m where |w| is NaN (int4_code::absmax's `|w| > m`), then the eight
//!          groups' lanes reduced into one vector (max of non-negative numbers: any order gives the same value)
//! scale    e4m3(global · (absmax / 6)) for 8 groups at once ([`encode_e4m3`], fp8::encode's rounding from the
//!          bits), decoded by gathering from fp8::DECODE, 0 → encode(0.125); step = scale / global, one division
//! codes    w / step, a true division of each weight; encode()'s seven midpoint comparisons counted in 32-bit lanes
//! packing  codes → u16 (packus), pairs joined by madd (even + 16 · odd), → u8 (packus twice), lanes reordered
//! ```

use super::{fp8, nvfp4_quantize_row_packed_portable, E2M1_MAX, NVFP4_GROUP, NVFP4_ZERO_SCALE};
use std::arch::x86_64::*;

/// Groups per step.
const GROUPS: usize = 8;
/// Weights per step.
const STEP: usize = GROUPS * NVFP4_GROUP;

/// # Safety
/// The CPU must support AVX2. `weights.len()` a multiple of 16 gives whole groups; a shorter last group is
/// encoded element by element as [`super::nvfp4_quantize_row`] does.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn nvfp4_quantize_row_packed(weights: &[f32], global: f32, packed: &mut [u8], scales: &mut [u8]) {
    let steps = (weights.len() / STEP).min(packed.len() / (STEP / 2)).min(scales.len() / GROUPS);
    let zero_scale = fp8::encode(NVFP4_ZERO_SCALE);
    let zero_code = _mm256_set1_epi32(i32::from(zero_scale));
    let zero_value = _mm256_set1_ps(fp8::decode(zero_scale));
    let global_lanes = _mm256_set1_ps(global);
    let (chunks, _) = weights[..steps * STEP].as_chunks::<STEP>();
    let (outs, _) = packed.as_chunks_mut::<{ STEP / 2 }>();
    let (scale_groups, _) = scales.as_chunks_mut::<GROUPS>();
    for ((chunk, out), scale_bytes) in chunks.iter().zip(outs).zip(scale_groups) {
        let wanted = _mm256_mul_ps(global_lanes, _mm256_div_ps(group_absmax(chunk), _mm256_set1_ps(E2M1_MAX)));
        let mut code = encode_e4m3(wanted);
        // SAFETY: every code is below 256, the table's length.
        let mut value = unsafe { _mm256_i32gather_ps::<4>(fp8::DECODE.as_ptr(), code) };
        let zero = _mm256_cmp_ps::<_CMP_EQ_OQ>(value, _mm256_setzero_ps());
        code = _mm256_blendv_epi8(code, zero_code, _mm256_castps_si256(zero));
        value = _mm256_blendv_ps(value, zero_value, zero);
        *scale_bytes = low_bytes(code);
        let mut group_steps = [0f32; GROUPS];
        // SAFETY: the array holds eight f32.
        unsafe { _mm256_storeu_ps(group_steps.as_mut_ptr(), _mm256_div_ps(value, global_lanes)) };
        for half in 0..2 {
            let mut codes = [_mm256_setzero_si256(); 8];
            for (vector, codes) in codes.iter_mut().enumerate() {
                let step = _mm256_set1_ps(group_steps[half * 4 + vector / 2]);
                // SAFETY: half · 64 + vector · 8 + 8 ≤ 128.
                let w = unsafe { _mm256_loadu_ps(chunk.as_ptr().add(half * 64 + vector * 8)) };
                *codes = encode_e2m1(_mm256_div_ps(w, step));
            }
            let bytes = pack_64(&codes);
            // SAFETY: half · 32 + 32 ≤ 64.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(half * 32).cast(), bytes) };
        }
    }
    let done = steps * STEP;
    nvfp4_quantize_row_packed_portable(
        &weights[done..],
        global,
        &mut packed[done / 2..],
        &mut scales[done / NVFP4_GROUP..],
    );
}

/// `|x|`.
#[inline]
#[target_feature(enable = "avx2")]
fn abs(x: __m256) -> __m256 {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), x)
}

/// The absmax of each of the eight groups of 16 in `chunk`, group g in lane g, NaN ignored (as
/// [`super::absmax`]).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn group_absmax(chunk: &[f32; STEP]) -> __m256 {
    let zero = _mm256_setzero_ps();
    let mut lanes = [zero; GROUPS];
    for (group, lanes) in lanes.iter_mut().enumerate() {
        // SAFETY: group · 16 + 16 ≤ 128.
        let (a, b) = unsafe {
            let base = chunk.as_ptr().add(group * NVFP4_GROUP);
            (_mm256_loadu_ps(base), _mm256_loadu_ps(base.add(8)))
        };
        // max_ps(x, y) is x > y ? x : y: a NaN x leaves y.
        *lanes = _mm256_max_ps(abs(b), _mm256_max_ps(abs(a), zero));
    }
    // Every lane is now a non-negative number (no NaN, no −0), so the maxima below may pair lanes in any order.
    let pairs = |x: __m256, y: __m256| {
        // [x0 y0 x1 y1 | x4 y4 x5 y5] max [x2 y2 x3 y3 | x6 y6 x7 y7]
        _mm256_max_ps(_mm256_unpacklo_ps(x, y), _mm256_unpackhi_ps(x, y))
    };
    let quads = |xy: __m256, zw: __m256| {
        // [x y z w | x y z w], each the max of four of its vector's lanes
        _mm256_max_ps(_mm256_shuffle_ps::<0b01_00_01_00>(xy, zw), _mm256_shuffle_ps::<0b11_10_11_10>(xy, zw))
    };
    let low = quads(pairs(lanes[0], lanes[1]), pairs(lanes[2], lanes[3]));
    let high = quads(pairs(lanes[4], lanes[5]), pairs(lanes[6], lanes[7]));
    _mm256_max_ps(_mm256_permute2f128_ps::<0x20>(low, high), _mm256_permute2f128_ps::<0x31>(low, high))
}

/// [`fp8::encode`] of eight values, each code in the low byte of its 32-bit lane: NaN → the NaN code, ≥ 448 →
/// 448, below 2^−6 the multiple of 2^−9 nearest (ties to even), else the top three mantissa bits rounded to
/// nearest even from the 20 dropped ones (`bits + 0x7FFFF + kept's low bit`, a carry moving into the exponent);
/// the input's sign bit on top.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn encode_e4m3(x: __m256) -> __m256i {
    let bits = _mm256_castps_si256(x);
    let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(bits), _mm256_set1_epi32(0x80));
    let magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFF_FFFF));
    let odd = _mm256_and_si256(_mm256_srli_epi32::<20>(magnitude), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(_mm256_add_epi32(magnitude, _mm256_set1_epi32(0x7_FFFF)), odd);
    // (biased exponent − 120) << 3 | mantissa, i.e. the bits >> 20 less 120 << 3; at most 0x7E (saturation,
    // infinity included).
    let normal = _mm256_min_epi32(
        _mm256_sub_epi32(_mm256_srli_epi32::<20>(rounded), _mm256_set1_epi32(120 << 3)),
        _mm256_set1_epi32(0x7E),
    );
    // Below 2^−6: |x| · 512 is exact; rounded to the nearest integer, ties to even, 0 to 8.
    let steps = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        _mm256_castsi256_ps(magnitude),
        _mm256_set1_ps(512.0),
    ));
    let subnormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x3C80_0000), magnitude);
    let code = _mm256_blendv_epi8(normal, _mm256_cvttps_epi32(steps), subnormal);
    let nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F80_0000));
    _mm256_or_si256(_mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F), nan), sign)
}

/// The low byte of each 32-bit lane, in lane order.
#[inline]
#[target_feature(enable = "avx2")]
fn low_bytes(x: __m256i) -> [u8; 8] {
    let first = _mm256_shuffle_epi8(
        x,
        _mm256_setr_epi8(
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
        ),
    );
    let joined = _mm_unpacklo_epi32(_mm256_castsi256_si128(first), _mm256_extracti128_si256::<1>(first));
    (_mm_cvtsi128_si64(joined) as u64).to_le_bytes()
}

/// [`encode`] of eight values, each code in its 32-bit lane: the midpoints below `|x|` counted (a comparison
/// is −1 where true, so subtracting it counts), the sign in bit 3 where x < 0; NaN compares false everywhere
/// and gives 0.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn encode_e2m1(x: __m256) -> __m256i {
    let m = abs(x);
    let count = |index: __m256i, below: __m256| _mm256_sub_epi32(index, _mm256_castps_si256(below));
    let mut index = _mm256_setzero_si256();
    index = count(index, _mm256_cmp_ps::<_CMP_GT_OQ>(m, _mm256_set1_ps(0.25)));
    index = count(index, _mm256_cmp_ps::<_CMP_GE_OQ>(m, _mm256_set1_ps(0.75)));
    index = count(index, _mm256_cmp_ps::<_CMP_GT_OQ>(m, _mm256_set1_ps(1.25)));
    index = count(index, _mm256_cmp_ps::<_CMP_GE_OQ>(m, _mm256_set1_ps(1.75)));
    index = count(index, _mm256_cmp_ps::<_CMP_GT_OQ>(m, _mm256_set1_ps(2.5)));
    index = count(index, _mm256_cmp_ps::<_CMP_GE_OQ>(m, _mm256_set1_ps(3.5)));
    index = count(index, _mm256_cmp_ps::<_CMP_GT_OQ>(m, _mm256_set1_ps(5.0)));
    let negative = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps()));
    _mm256_or_si256(index, _mm256_and_si256(negative, _mm256_set1_epi32(8)))
}

/// Packs 64 codes (eight vectors of eight, in element order, each below 16) two per byte as [`super::pack`]
/// does: 32 bytes, byte k = code 2k | code 2k+1 << 4.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn pack_64(codes: &[__m256i; 8]) -> __m256i {
    // Writing P_k for byte k (codes 2k and 2k+1), vector v holds the codes of P_4v .. P_4v+3.
    let pairs = _mm256_set1_epi32(0x0010_0001);
    // packus: [v0 | v1] per 128-bit lane as u16 (c0..c3 of v, c0..c3 of v+1 | c4..c7, c4..c7); madd joins
    // each u16 pair (consecutive elements) into even + 16 · odd: [P0 P1 P4 P5 | P2 P3 P6 P7] for v = 0.
    let joined = |v: usize| _mm256_madd_epi16(_mm256_packus_epi32(codes[v], codes[v + 1]), pairs);
    // → u16 [P0 P1 P4 P5 P8 P9 P12 P13 | P2 P3 P6 P7 P10 P11 P14 P15], and likewise P16..P31.
    let low = _mm256_packus_epi32(joined(0), joined(2));
    let high = _mm256_packus_epi32(joined(4), joined(6));
    // → u8: lane 0 holds the u16 pairs (P0 P1) (P4 P5) … (P28 P29), lane 1 (P2 P3) (P6 P7) … (P30 P31).
    let bytes = _mm256_packus_epi16(low, high);
    // 64-bit quarters [q0 q2 q1 q3]: lane 0 = pairs 0, 4, 8, 12 then 2, 6, 10, 14; interleave them pair by pair.
    let quarters = _mm256_permute4x64_epi64::<0b11_01_10_00>(bytes);
    let order = _mm256_setr_epi8(
        0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15, //
        0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
    );
    _mm256_shuffle_epi8(quarters, order)
}

#[cfg(test)]
mod tests {
    use crate::quant::fp4::*;

    /// E4M3 codes' values and their neighbours: each code's value, one and two ulps either side, the midpoints
    /// between consecutive codes (the rounding ties) and one ulp either side of them, for both signs; then the
    /// special values.
    fn e4m3_edges() -> Vec<f32> {
        let mut values = Vec::new();
        let mut positive: Vec<f32> = (0u8..0x7F).map(fp8::decode).collect();
        positive.push(480.0); // what 0x7F would be were it not NaN
        for pair in positive.windows(2) {
            let (low, high) = (pair[0], pair[1]);
            for x in [low, (low + high) / 2.0] {
                for ulps in -2i32..=2 {
                    let bits = x.to_bits() as i32 + ulps;
                    if bits >= 0 {
                        values.push(f32::from_bits(bits as u32));
                    }
                }
            }
        }
        values.extend([2f32.powi(-6), 2f32.powi(-10), 2f32.powi(-11), f32::MIN_POSITIVE, f32::from_bits(1), 1e-30]);
        values.extend([447.99, 448.0, 448.01, 464.0, 464.01, 479.9, 480.0, 1e6, f32::MAX, f32::INFINITY]);
        values.extend([0.0, f32::NAN, f32::from_bits(0x7FC0_0001), f32::from_bits(0x7F80_0001)]);
        let negative: Vec<f32> = values.iter().map(|v| -v).collect();
        values.extend(negative);
        values
    }

    /// Runs `check` only where the CPU has AVX2 (every x86-64 machine this project builds on does; elsewhere the
    /// vector paths are never called).
    fn with_avx2(check: impl FnOnce()) {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::level() >= crate::simd::Level::Avx2 {
            return check();
        }
        eprintln!("no AVX2: the vector paths are not run here");
    }

    #[cfg(target_arch = "x86_64")]
    fn e4m3_lanes(values: &[f32; 8]) -> [u8; 8] {
        use std::arch::x86_64::*;
        // SAFETY: only called under `with_avx2`; the arrays hold eight lanes.
        unsafe {
            let codes = super::encode_e4m3(_mm256_loadu_ps(values.as_ptr()));
            let mut lanes = [0i32; 8];
            _mm256_storeu_si256(lanes.as_mut_ptr().cast(), codes);
            lanes.map(|lane| u8::try_from(lane).expect("a code is one byte"))
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn e2m1_lanes(values: &[f32; 8]) -> [u8; 8] {
        use std::arch::x86_64::*;
        // SAFETY: only called under `with_avx2`; the arrays hold eight lanes.
        unsafe {
            let codes = super::encode_e2m1(_mm256_loadu_ps(values.as_ptr()));
            let mut lanes = [0i32; 8];
            _mm256_storeu_si256(lanes.as_mut_ptr().cast(), codes);
            lanes.map(|lane| u8::try_from(lane).expect("a code is one byte"))
        }
    }

    /// Feeds `values` eight at a time (the last vector padded with its first values) to `vector` and compares each
    /// lane with `scalar`.
    #[cfg(target_arch = "x86_64")]
    fn lanes_equal(values: &[f32], vector: fn(&[f32; 8]) -> [u8; 8], scalar: fn(f32) -> u8, what: &str) {
        for chunk in values.chunks(8) {
            let mut lanes = [chunk[0]; 8];
            lanes[..chunk.len()].copy_from_slice(chunk);
            let got = vector(&lanes);
            for (lane, &x) in lanes.iter().enumerate() {
                assert_eq!(got[lane], scalar(x), "{what} of {x:e} (bits {:#010x})", x.to_bits());
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_vector_e4m3_encoder_equals_the_scalar_one() {
        with_avx2(|| {
            lanes_equal(&e4m3_edges(), e4m3_lanes, fp8::encode, "e4m3");
            // Every 9973rd bit pattern (all exponents, NaNs and both signs).
            let sampled: Vec<f32> = (0..=u32::MAX / 9973).map(|i| f32::from_bits(i * 9973)).collect();
            lanes_equal(&sampled, e4m3_lanes, fp8::encode, "e4m3");
            // Every f32 from 2^-12 to 2^-5 (the subnormal codes and the first normal ones) by 7 ulps.
            let low: Vec<f32> =
                (2f32.powi(-12).to_bits()..2f32.powi(-5).to_bits()).step_by(7).map(f32::from_bits).collect();
            lanes_equal(&low, e4m3_lanes, fp8::encode, "e4m3");
        });
    }

    /// Every f32 bit pattern (4.3 G, minutes): `cargo test --release --lib fp4 -- --ignored`.
    #[test]
    #[ignore]
    #[cfg(target_arch = "x86_64")]
    fn the_vector_e4m3_encoder_equals_the_scalar_one_on_every_f32() {
        with_avx2(|| {
            let mut lanes = [0f32; 8];
            for high in 0..=u32::MAX >> 3 {
                for (lane, value) in lanes.iter_mut().enumerate() {
                    *value = f32::from_bits(high << 3 | lane as u32);
                }
                let got = e4m3_lanes(&lanes);
                for (lane, &x) in lanes.iter().enumerate() {
                    assert_eq!(got[lane], fp8::encode(x), "e4m3 of {x:e} (bits {:#010x})", x.to_bits());
                }
            }
        });
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_vector_e2m1_encoder_equals_the_scalar_one() {
        with_avx2(|| {
            let mut values = Vec::new();
            for x in [0.0f32, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0] {
                for ulps in -2i32..=2 {
                    let bits = x.to_bits() as i32 + ulps;
                    if bits >= 0 {
                        values.push(f32::from_bits(bits as u32));
                        values.push(-f32::from_bits(bits as u32));
                    }
                }
            }
            values.extend([f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::from_bits(1)]);
            values.extend((0..=u32::MAX / 9973).map(|i| f32::from_bits(i * 9973)));
            lanes_equal(&values, e2m1_lanes, encode, "e2m1");
        });
    }

    /// The reference: [`nvfp4_quantize_row`] (group by group, the scalar scale) then [`pack`].
    fn nvfp4_reference(row: &[f32], global: f32) -> (Vec<u8>, Vec<u8>) {
        let (mut codes, mut scales) = (vec![0u8; row.len()], vec![0u8; row.len().div_ceil(NVFP4_GROUP)]);
        nvfp4_quantize_row_portable(row, global, &mut codes, &mut scales);
        let mut packed = vec![0u8; row.len() / 2];
        pack(&codes, &mut packed);
        (packed, scales)
    }

    /// Rows of random and edge weights: normal at several spreads, all-zero groups, groups far below the tensor's
    /// absmax (subnormal and zero E4M3 scales), groups far above what `global` was taken from (saturating scales
    /// and codes), ±0, subnormal weights, exact grid points and midpoints; lengths that are and are not multiples
    /// of 128 (the vector step) and one with a short last group.
    fn nvfp4_cases() -> Vec<(Vec<f32>, f32)> {
        let mut rng = crate::rng::Rng::new(17);
        let mut cases = Vec::new();
        for (length, spread) in [(128, 1.0), (256, 0.02), (512, 3e4), (1024, 1e-3), (16, 1.0), (144, 0.5), (2000, 1.0)]
        {
            let mut row: Vec<f32> = (0..length).map(|_| rng.normal() * spread).collect();
            let global = nvfp4_global_scale(absmax(&row));
            cases.push((row.clone(), global));
            // Groups scaled down by 2^-6 … 2^-40 (subnormal E4M3 scales, then zero ones → 0.125), one group of
            // zeros, one of ±0 and subnormal weights.
            for (g, group) in row.chunks_mut(NVFP4_GROUP).enumerate() {
                match g % 6 {
                    0 => group.iter_mut().for_each(|w| *w *= 2f32.powi(-6 - 7 * (g as i32 % 5))),
                    1 => group.fill(0.0),
                    2 => group
                        .iter_mut()
                        .enumerate()
                        .for_each(|(i, w)| *w = if i % 2 == 0 { -0.0 } else { f32::from_bits(i as u32) }),
                    _ => {}
                }
            }
            cases.push((row.clone(), global));
            // A global scale taken from a thousandth of the absmax: scales saturate at 448 and codes at ±6.
            cases.push((row.clone(), nvfp4_global_scale(absmax(&row) / 1000.0)));
            // E2M1 grid values and midpoints as weights: under the global scale of absmax 6 a group whose absmax is 6
            // gets the scale 448 and a step of 448 / global, 1 within an ulp or two, so the divisions land on or next
            // to the ties; under 448, steps of other sizes.
            let grid: Vec<f32> = (0..length)
                .map(|i| {
                    let magnitude =
                        [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0][i % 15];
                    if i % 4 == 1 {
                        -magnitude
                    } else {
                        magnitude
                    }
                })
                .collect();
            cases.push((grid.clone(), nvfp4_global_scale(6.0)));
            cases.push((grid, 448.0));
        }
        // A short last group (24 weights: one group and a half).
        cases.push(((0..24).map(|i| i as f32 / 4.0 - 3.0).collect(), nvfp4_global_scale(3.0)));
        cases
    }

    #[test]
    fn packed_nvfp4_rows_equal_codes_then_pack() {
        for (row, global) in nvfp4_cases() {
            let (want_packed, want_scales) = nvfp4_reference(&row, global);
            let (mut packed, mut scales) = (vec![0xAAu8; row.len() / 2], vec![0xAAu8; row.len().div_ceil(16)]);
            nvfp4_quantize_row_packed_portable(&row, global, &mut packed, &mut scales);
            assert_eq!((&packed, &scales), (&want_packed, &want_scales), "portable, {} weights", row.len());
            packed.fill(0x55);
            scales.fill(0x55);
            nvfp4_quantize_row_packed(&row, global, &mut packed, &mut scales);
            assert_eq!(scales, want_scales, "dispatched, {} weights under {global}", row.len());
            assert_eq!(packed, want_packed, "dispatched, {} weights under {global}", row.len());
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vector_nvfp4_rows_equal_the_scalar_ones() {
        with_avx2(|| {
            let mut cases = nvfp4_cases();
            // Non-finite weights too (a checkpoint with them is refused unless --allow-nonfinite): NaN in a group,
            // ±Inf in a group (its scale is NaN under a finite global), and a zero global.
            let mut rng = crate::rng::Rng::new(5);
            let mut row: Vec<f32> = (0..256).map(|_| rng.normal()).collect();
            let global = nvfp4_global_scale(absmax(&row));
            row[3] = f32::NAN;
            row[40] = f32::INFINITY;
            row[77] = f32::NEG_INFINITY;
            row[200..216].fill(f32::NAN);
            cases.push((row.clone(), global));
            cases.push((row.clone(), 0.0));
            cases.push((row, f32::INFINITY));
            for (row, global) in cases {
                let (want_packed, want_scales) = nvfp4_reference(&row, global);
                let (mut packed, mut scales) = (vec![0xAAu8; row.len() / 2], vec![0xAAu8; row.len().div_ceil(16)]);
                // SAFETY: the CPU has AVX2 (`with_avx2`).
                unsafe { super::nvfp4_quantize_row_packed(&row, global, &mut packed, &mut scales) };
                assert_eq!(scales, want_scales, "AVX2 scales, {} weights under {global}", row.len());
                assert_eq!(packed, want_packed, "AVX2 codes, {} weights under {global}", row.len());
            }
        });
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vector_group_absmaxes_equal_the_scalar_ones() {
        use std::arch::x86_64::*;
        with_avx2(|| {
            let mut rng = crate::rng::Rng::new(11);
            for round in 0..200 {
                let mut chunk = [0f32; 128];
                chunk.iter_mut().for_each(|w| *w = rng.normal() * 10f32.powi(round % 7 - 3));
                // The largest magnitude in each position of a group in turn, and edge values.
                chunk[(round as usize * 17) % 128] = -1e3;
                match round % 5 {
                    1 => chunk[..16].fill(-0.0),
                    2 => chunk[16..32].iter_mut().for_each(|w| *w = f32::NAN),
                    3 => chunk[40] = f32::NAN,
                    4 => chunk[100] = f32::NEG_INFINITY,
                    _ => {}
                }
                let mut got = [0f32; 8];
                // SAFETY: the CPU has AVX2 (`with_avx2`); the array holds eight lanes.
                unsafe { _mm256_storeu_ps(got.as_mut_ptr(), super::group_absmax(&chunk)) };
                for (g, group) in chunk.chunks(NVFP4_GROUP).enumerate() {
                    assert_eq!(got[g].to_bits(), absmax(group).to_bits(), "round {round} group {g}");
                }
            }
        });
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vector_packing_equals_pack() {
        use std::arch::x86_64::*;
        with_avx2(|| {
            let mut rng = crate::rng::Rng::new(3);
            for _ in 0..100 {
                let codes: Vec<u8> = (0..64).map(|_| rng.below(16) as u8).collect();
                let mut want = [0u8; 32];
                pack(&codes, &mut want);
                let mut vectors = [[0i32; 8]; 8];
                for (i, &code) in codes.iter().enumerate() {
                    vectors[i / 8][i % 8] = i32::from(code);
                }
                let mut got = [0u8; 32];
                // SAFETY: the CPU has AVX2 (`with_avx2`); the arrays hold 8 lanes and 32 bytes.
                unsafe {
                    let vectors = vectors.map(|v| _mm256_loadu_si256(v.as_ptr().cast()));
                    _mm256_storeu_si256(got.as_mut_ptr().cast(), super::pack_64(&vectors));
                }
                assert_eq!(got, want, "codes {codes:?}");
            }
        });
    }
}

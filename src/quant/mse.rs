//! The `mse` scale rule's clip search: a cheap polynomial screen bounds every candidate's error, and the exact
//! error is computed only for the candidates those bounds cannot tell apart, so the chosen scale is the one the
//! exhaustive search ([`reference_search`]) chooses, bit for bit.
//!
//! The search (llm-compressor's mse observer): for shrink `p = 1 − i/grid`, `i < max_shrink·grid`, the scale
//! `s = bf16(p·absmax/7.5)` is tried and the one with the smallest `E(s) = Σ|w − q·s|^norm` kept, `q` the INT4 code
//! under `s`, ties keeping the larger `p`. `E` is the f32 value [`group_error`] computes, whose summation order is
//! part of the definition (a GPU kernel follows it).
//!
//! The screen: with `r = 1/s` and `f = (w − q·s)·r`, `E(s) = s^2.4 · Σ|f|^2.4` in exact arithmetic, and `|f|^2.4` is
//! replaced by a polynomial in `|f|` (`|f| ≤ ½` for a weight inside the clip range, `½ < |f| ≤ 3` for a clipped
//! one). Each candidate gets an estimate and an error bound covering the polynomial, the reciprocal, and the f32
//! rounding of both sums; a candidate whose lower bound is above the smallest upper bound cannot be the minimum
//! (not even tie with it), so only the others are scored exactly, in the search's order. When one candidate
//! remains, no exact error is computed at all. The screen runs with the candidates in SIMD lanes: each weight is
//! scored under all of them at once.

use std::sync::OnceLock;

use half::bf16;

use super::int4_code::{round_clamped, stored_scale};
use super::pow::abs_pow_2_4;
use super::scale_rule::MseSearch;

/// The clip search's chosen scale for one group (the codes are then `round_group` of it).
#[inline(always)]
pub fn search(group: &[f32], absmax: f32, search: MseSearch) -> bf16 {
    match screened_search(group, absmax, search) {
        Some(scale) => scale,
        None => reference_search(group, absmax, search),
    }
}

/// The exhaustive search: every candidate scored with [`group_error`]. The definition of the rule; used for what
/// the screen does not cover (other norms, huge or tiny groups, long grids) and by the tests as the oracle.
#[inline(always)]
pub fn reference_search(group: &[f32], absmax: f32, search: MseSearch) -> bf16 {
    let steps = (search.max_shrink * search.grid as f32) as u32;
    let mut best_scale = stored_scale(absmax / 7.5);
    let mut best_error = f32::INFINITY;
    for step in 0..steps.max(1) {
        let shrink = 1.0 - step as f32 / search.grid as f32;
        let scale = stored_scale(shrink * absmax / 7.5);
        let error = group_error(group, scale.to_f32(), search.norm);
        if error < best_error {
            best_error = error;
            best_scale = scale;
        }
    }
    best_scale
}

/// `Σ|w − q·scale|^norm` over a group. Element `j` accumulates into lane `j % 8`; the lanes are combined as
/// `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`. The order is part of the definition (a GPU kernel must follow it to
/// choose the same scale), and eight independent sums let the loop vectorize.
#[inline(always)]
pub fn group_error(group: &[f32], scale: f32, norm: f32) -> f32 {
    if norm == 2.4 {
        group_error_with(group, scale, abs_pow_2_4)
    } else {
        group_error_with(group, scale, |e| e.abs().powf(norm))
    }
}

#[inline(always)]
fn group_error_with(group: &[f32], scale: f32, error_norm: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let chunks = group.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &w) in lanes.iter_mut().zip(chunk) {
            let q = round_clamped(w / scale, -8.0) as f32;
            *lane += error_norm(w - q * scale);
        }
    }
    for (lane, &w) in lanes.iter_mut().zip(tail) {
        let q = round_clamped(w / scale, -8.0) as f32;
        *lane += error_norm(w - q * scale);
    }
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

/// Most candidates the screen handles (the default grid has 20).
const MAX_CANDIDATES: usize = 32;
/// Longest group the screen handles (its error bound is derived for sums of at most this many terms).
const MAX_GROUP: usize = 128;
/// The screen runs for `absmax` in this range: every term and sum stays a normal f32 far from overflow, and
/// the polynomial's absolute error bound stays far above f32's subnormal noise.
const MIN_ABSMAX: f32 = 1e-6;
const MAX_ABSMAX: f32 = 1e6;
/// Largest `absmax / s` over the candidates for which the clipped polynomial [`POW_CLIPPED`] holds (`|f| ≤ 3`);
/// the default search reaches 9.3 (`7.5 / 0.81`, and BF16 rounding).
const MAX_RATIO: f32 = 9.9;
/// A weight with `|w| ≤ 7.4·s_min` (`s_min` the smallest candidate) is inside the clip range `|w/s| ≤ 7.5` for
/// every candidate, so `|f| ≤ ½` (the reciprocal's rounding cannot move 7.4 past 7.5).
const INSIDE_RANGE: f32 = 7.4;

/// `|f|^2.4 ≈ |f| · POW_INSIDE(|f|)` for `0 ≤ |f| ≤ 0.5001` (a near-minimax fit of degree 5 with no constant
/// term, coefficients of `x^1 … x^5`), so that a term is added to its sum by one fused multiply-add and a zero
/// weight adds nothing; the test `polynomials_stay_within_their_bounds` measures its error in f32.
const POW_INSIDE: [f32; 5] = [-0.003_376_167_5, 0.299_939_8, 1.487_019_4, -1.574_902_3, 0.919_733_2];
/// `|f|^2.4 ≈ POW_CLIPPED(|f|)` for `0.49 ≤ |f| ≤ 3` (degree 7), the error of a clipped weight.
const POW_CLIPPED: [f32; 8] = [
    0.008_843_587,
    -0.084_411_1,
    0.661_620_7,
    0.516_910_5,
    -0.129_020_95,
    0.030_174_553,
    -0.004_401_352_3,
    0.000_286_556_84,
];
/// Bound on the screen's error per term, in units of `s^2.4`: the polynomials' own error as evaluated in f32
/// (below 2.1e-5 for [`POW_INSIDE`], 9.6e-6 for [`POW_CLIPPED`]: the fit, checked in f32 by a test) plus that of
/// `|f|` itself, which the screen takes as `|u − code|` with `u = w·r`: `u` is within `|w/s|·2^-23 ≤ 1.2e-6` of
/// `w/s`, which moves `|f|^2.4` by at most `2.4·|f|^1.4·1.2e-6` (1.1e-6 inside, 1.4e-5 at `|f| = 3`); where `u`
/// and `w/s` round to different codes they straddle a tie and both leave `|f|` within 2.5e-6 of ½.
const TERM_ERROR: f32 = 3.0e-5;
/// Relative bound on everything else: the screen's sequential f32 sum of at most `2·MAX_GROUP` terms per
/// candidate (`255·2^-24 = 1.5e-5`), [`group_error`]'s sum (`(128/8 + 3)·2^-24`), `abs_pow_2_4`'s error on each
/// exact term and [`ScalePowers`]'s on the bounds' `s^2.4` (below 1e-6 each, their tests), and the f32 roundings
/// of the bounds themselves (a few `2^-24`): ≈ 1.9e-5, with a margin.
const RELATIVE_ERROR: f32 = 5e-5;

/// Horner evaluation with fused multiply-adds (one instruction each in the AVX2/AVX-512 builds of
/// `int4::quantize_row`, which enable FMA; a library call in the portable one). Only the screen uses it: its
/// results bound the exact errors and never become them.
#[inline(always)]
fn polynomial<const N: usize>(coefficients: &[f32; N], x: f32) -> f32 {
    let mut result = coefficients[N - 1];
    for &c in coefficients[..N - 1].iter().rev() {
        result = result.mul_add(x, c);
    }
    result
}

/// The screen's `|f|` for weight `w` under reciprocal scale `r`: `|u − code|`, `u = w·r` (no division), the code
/// rounded and clamped as [`group_error`] does it.
#[inline(always)]
fn screen_offset(w: f32, reciprocal: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    let ratio = w * reciprocal;
    let code = (ratio.clamp(-8.0, 7.0) + MAGIC) - MAGIC;
    (ratio - code).abs()
}

/// The screen's `|f|` for a weight inside every candidate's clip range (`|w·r| < 7.5`, so the code needs no
/// clamp): `|u − round(u)|`, `u = w·r`.
#[inline(always)]
fn inside_offset(w: f32, reciprocal: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    let ratio = w * reciprocal;
    let code = (ratio + MAGIC) - MAGIC;
    (ratio - code).abs()
}

/// `bf16::from_f32(x).to_f32()` (round to nearest, ties to even) for a finite `x`, in integer operations that
/// vectorize.
#[inline(always)]
fn round_to_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    f32::from_bits((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000)
}

/// `s^2.4` for a positive normal BF16 value `s = m·2^e` (7 mantissa bits), as `m^2.4 · 2^(2.4·e)` from two
/// tables computed once in f64 and rounded to f32: relative error at most `3·2^-24` (two roundings and the
/// product's), below the 1e-6 that [`RELATIVE_ERROR`] allows. Only the bounds use it, for `steps` scales a group
/// (it replaced [`abs_pow_2_4`] there, whose division and series were ≈ 12 % of the search).
struct ScalePowers {
    mantissas: [f32; 128],
    exponents: [f32; 256],
}

impl ScalePowers {
    /// The tables, made on first use (fetch them once per group, not per scale: the check is an atomic load).
    fn get() -> &'static Self {
        static TABLES: OnceLock<ScalePowers> = OnceLock::new();
        TABLES.get_or_init(|| ScalePowers {
            mantissas: std::array::from_fn(|i| (1.0 + i as f64 / 128.0).powf(2.4) as f32),
            exponents: std::array::from_fn(|e| (2.4 * (e as f64 - 127.0)).exp2() as f32),
        })
    }

    #[inline(always)]
    fn power(&self, scale: f32) -> f32 {
        let bits = scale.to_bits();
        self.mantissas[(bits >> 16) as usize & 0x7F] * self.exponents[(bits >> 23) as usize & 0xFF]
    }
}

/// The screened search; `None` where it does not apply (then [`reference_search`] runs).
///
/// Layout: the candidates are the SIMD lanes (32 of them, two AVX-512 or four AVX2 registers), so each weight is
/// broadcast once and adds its screen term to every candidate's sum at once; no sum needs a horizontal reduction
/// and the bounds are computed in lanes too.
#[inline(always)]
fn screened_search(group: &[f32], absmax: f32, search: MseSearch) -> Option<bf16> {
    if search.norm != 2.4 || search.grid == 0 || group.len() > MAX_GROUP || !(MIN_ABSMAX..=MAX_ABSMAX).contains(&absmax)
    {
        return None;
    }
    let steps = ((search.max_shrink * search.grid as f32) as u32).max(1) as usize;
    if steps > MAX_CANDIDATES {
        return None;
    }
    // Every candidate's stored scale, as `stored_scale(shrink · absmax / 7.5)` computes it (positive and normal
    // here, so no zero replacement), for all 32 lanes at once so that the loop vectorizes; the lanes past `steps`
    // repeat the last candidate (computed, never chosen).
    let grid = search.grid as f32;
    let last = (steps - 1) as f32;
    // (Plain loops over the arrays: `std::array::from_fn` stayed an out-of-line call here, ≈ 4 % of `mse`'s time.)
    let mut scales = [0.0f32; MAX_CANDIDATES];
    for (step, scale) in scales.iter_mut().enumerate() {
        *scale = round_to_bf16((1.0 - (step as f32).min(last) / grid) * absmax / 7.5);
    }
    // Scales never increase along the search, so a repeated scale follows its first occurrence; a repeat has the
    // same error and, ties keeping the earlier, is never chosen.
    if scales[0] == scales[steps - 1] {
        return Some(bf16::from_f32(scales[0]));
    }
    let smallest = scales[steps - 1];
    if !(smallest > 0.0 && absmax / smallest <= MAX_RATIO) {
        return None;
    }
    let mut reciprocals = [0.0f32; MAX_CANDIDATES];
    for (reciprocal, &scale) in reciprocals.iter_mut().zip(&scales) {
        *reciprocal = 1.0 / scale;
    }

    // The weights inside the clip range of every candidate (the others replaced by zeros, whose screen term is
    // 0, as exact), and the others, at least the largest,
    // gathered for the pass that evaluates both polynomials. A NaN weight is an outer one.
    let inside_limit = INSIDE_RANGE * smallest;
    let mut inside = [0.0f32; MAX_GROUP];
    let mut outer = [0.0f32; MAX_GROUP];
    let mut outer_count = 0;
    for (slot, &w) in inside.iter_mut().zip(group) {
        let is_inside = w.abs() <= inside_limit;
        *slot = if is_inside { w } else { 0.0 };
        outer[outer_count] = w;
        outer_count += usize::from(!is_inside);
    }

    let mut sums = [0.0f32; MAX_CANDIDATES];
    for &w in &inside[..group.len()] {
        for (sum, &reciprocal) in sums.iter_mut().zip(&reciprocals) {
            let offset = inside_offset(w, reciprocal);
            *sum = polynomial(&POW_INSIDE, offset).mul_add(offset, *sum);
        }
    }
    for &w in &outer[..outer_count] {
        for (sum, &reciprocal) in sums.iter_mut().zip(&reciprocals) {
            let offset = screen_offset(w, reciprocal);
            let inside = polynomial(&POW_INSIDE, offset) * offset;
            let clipped = polynomial(&POW_CLIPPED, offset);
            *sum += if offset > 0.5 { clipped } else { inside };
        }
    }
    if sums.iter().any(|sum| sum.is_nan()) {
        // A NaN weight makes every exact error NaN: no candidate beats the first.
        return Some(bf16::from_f32(scales[0]));
    }

    // Bounds: `E(s) ∈ s^2.4 · (Σ ± terms · TERM_ERROR) · (1 ± RELATIVE_ERROR)`, `s^2.4` from [`ScalePowers`].
    // One term per weight (the zeros standing in for the outer weights add exactly 0).
    let spread = group.len() as f32 * TERM_ERROR;
    let tables = ScalePowers::get();
    let mut powers = [0.0f32; MAX_CANDIDATES];
    for (power, &scale) in powers.iter_mut().zip(&scales) {
        *power = tables.power(scale);
    }
    let mut lower = [0.0f32; MAX_CANDIDATES];
    let mut upper = [0.0f32; MAX_CANDIDATES];
    for c in 0..MAX_CANDIDATES {
        lower[c] = powers[c] * (sums[c] - spread) * (1.0 - RELATIVE_ERROR);
        upper[c] = powers[c] * (sums[c] + spread) * (1.0 + RELATIVE_ERROR);
    }
    // The smallest upper bound, halving the lanes (the lanes past `steps` repeat the last candidate, so they change
    // no minimum). Without NaNs the order of the comparisons does not matter; a NaN bound can leave no candidate
    // possible below, and then the exhaustive search decides.
    let mut width = MAX_CANDIDATES / 2;
    while width > 0 {
        for c in 0..width {
            upper[c] = if upper[c + width] < upper[c] { upper[c + width] } else { upper[c] };
        }
        width /= 2;
    }
    let best_upper = upper[0];
    // The candidates whose lower bound does not exceed it, as bits in search order; the one with the smallest
    // upper bound is among them. One bit (most groups) is the answer.
    let mut possible = 0u32;
    for (c, &bound) in lower.iter().enumerate() {
        possible |= u32::from(bound <= best_upper) << c;
    }
    possible &= u32::MAX >> (MAX_CANDIDATES - steps);
    if possible.count_ones() == 1 {
        return Some(bf16::from_f32(scales[possible.trailing_zeros() as usize]));
    }

    // The survivors in search order, each distinct scale once.
    let mut survivors = [0.0f32; MAX_CANDIDATES];
    let mut count = 0;
    for c in (0..steps).filter(|&c| possible >> c & 1 == 1) {
        if count == 0 || scales[c] != survivors[count - 1] {
            survivors[count] = scales[c];
            count += 1;
        }
    }
    match count {
        // Only a NaN bound leaves none: the exhaustive search decides.
        0 => None,
        1 => Some(bf16::from_f32(survivors[0])),
        _ => {
            let mut best = (survivors[0], group_error(group, survivors[0], 2.4));
            for &scale in &survivors[1..count] {
                let error = group_error(group, scale, 2.4);
                if error < best.1 {
                    best = (scale, error);
                }
            }
            Some(bf16::from_f32(best.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::int4_code::absmax;
    use crate::rng::Rng;
    use proptest::prelude::*;

    fn assert_same(group: &[f32]) {
        let top = absmax(group);
        let fast = super::search(group, top, MseSearch::default());
        let exhaustive = reference_search(group, top, MseSearch::default());
        assert_eq!(fast.to_bits(), exhaustive.to_bits(), "group {group:?}");
    }

    #[test]
    fn the_dispatched_row_function_matches_the_exhaustive_search() {
        // `int4::quantize_row` runs the AVX-512 or AVX2 build where the CPU has it (the tests above call the
        // portable one): the same scales, group by group.
        let mut rng = Rng::new(23);
        for group_size in [32usize, 128, 16, 256] {
            let row: Vec<f32> = (0..group_size * 300)
                .map(|j| {
                    rng.normal()
                        * if j % 29 == 0 { 5.0 } else { 0.02 }
                        * if j / group_size % 7 == 0 { 1e3 } else { 1.0 }
                })
                .collect();
            let mut q = vec![0i8; row.len()];
            let mut scales = vec![bf16::ZERO; row.len() / group_size];
            crate::quant::int4::quantize_row(&row, group_size, crate::quant::ScaleRule::Mse, &mut q, &mut scales);
            for (group, scale) in row.chunks(group_size).zip(&scales) {
                let exhaustive = reference_search(group, absmax(group), MseSearch::default());
                assert_eq!(scale.to_bits(), exhaustive.to_bits(), "group size {group_size}");
            }
        }
    }

    #[test]
    fn bf16_rounding_matches_half() {
        let mut rng = Rng::new(5);
        let specials = [1.0f32, 0.1, 1e-6 / 7.5, 1e6 / 7.5, f32::MAX, f32::MIN_POSITIVE, 3.0e-39];
        for x in (0..2_000_000).map(|_| f32::from_bits(rng.next_u64() as u32 & 0x7FFF_FFFF)).chain(specials) {
            if x.is_finite() {
                assert_eq!(round_to_bf16(x).to_bits(), bf16::from_f32(x).to_f32().to_bits(), "{x:e}");
            }
        }
        // Ties to even, both ways.
        assert_eq!(round_to_bf16(f32::from_bits(0x3F80_8000)).to_bits(), 0x3F80_0000);
        assert_eq!(round_to_bf16(f32::from_bits(0x3F81_8000)).to_bits(), 0x3F82_0000);
    }

    #[test]
    fn scale_powers_are_within_the_relative_bound() {
        // Every BF16 scale the screen can meet (absmax in 1e-6..1e6, shrink 0.81..1): ScalePowers' error on
        // `s^2.4`, which RELATIVE_ERROR counts as below 1e-6.
        for bits in 0x3300u16..0x4900 {
            let scale = bf16::from_bits(bits).to_f32();
            let exact = (scale as f64).powf(2.4);
            assert!(((ScalePowers::get().power(scale) as f64 - exact) / exact).abs() < 1e-6, "{scale:e}");
        }
    }

    #[test]
    fn polynomials_stay_within_their_bounds() {
        let check = |coefficients: &[f32], low: f64, high: f64| {
            let mut worst = 0f64;
            for i in 0..=200_000 {
                let x = (low + (high - low) * i as f64 / 200_000.0) as f32;
                let value = match coefficients.len() {
                    5 => polynomial(&POW_INSIDE, x) * x,
                    _ => polynomial(&POW_CLIPPED, x),
                };
                worst = worst.max((value as f64 - (x as f64).powf(2.4)).abs());
            }
            worst
        };
        let inside = check(&POW_INSIDE, 0.0, 0.5001);
        let clipped = check(&POW_CLIPPED, 0.49, 3.0);
        // Plus the error of `|f|` itself (TERM_ERROR's comment): 3.6e-6 inside, 1.4e-5 clipped.
        assert!(inside + 3.6e-6 < TERM_ERROR as f64, "inside polynomial error {inside}");
        assert!(clipped + 1.4e-5 < TERM_ERROR as f64, "clipped polynomial error {clipped}");
    }

    #[test]
    fn matches_the_exhaustive_search_on_random_groups() {
        let mut rng = Rng::new(17);
        for round in 0..20_000 {
            let size = [32, 128, 8, 16, 24, 40, 100, 256][round % 8];
            let spread = [1e-3f32, 0.02, 1.0, 300.0][round / 8 % 4];
            let group: Vec<f32> = (0..size)
                .map(|j| {
                    let v = rng.normal() * spread;
                    // Heavy tails and outliers, as real expert weights have.
                    if j % 13 == round % 13 {
                        v * 6.0
                    } else {
                        v
                    }
                })
                .collect();
            assert_same(&group);
        }
    }

    #[test]
    fn matches_the_exhaustive_search_on_adversarial_groups() {
        let mut rng = Rng::new(3);
        let mut groups: Vec<Vec<f32>> = vec![
            vec![0.0; 32],
            vec![-0.0; 32],
            vec![1.0; 32],
            vec![-1.0; 32],
            (0..32).map(|j| if j == 0 { 1.0 } else { 0.0 }).collect(),
            (0..32).map(|j| if j == 5 { -3.5 } else { 0.0 }).collect(),
            (0..32).map(|j| f32::from_bits(j as u32 + 1)).collect(), // subnormals only
            (0..32).map(|j| if j == 1 { 1.0 } else { f32::from_bits(j as u32 * 1000 + 1) }).collect(),
            (0..32).map(|j| if j == 2 { f32::NAN } else { j as f32 * 0.1 }).collect(),
            (0..32).map(|j| if j == 3 { f32::INFINITY } else { j as f32 * 0.1 }).collect(),
            (0..32).map(|j| if j % 2 == 0 { f32::MAX } else { -f32::MAX }).collect(),
            (0..32).map(|j| (j as f32 - 16.0) * 1e30).collect(),
            (0..32).map(|j| (j as f32 - 16.0) * 1e-30).collect(),
            (0..32).map(|j| (j as f32 - 16.0) * 1e-7).collect(),
            (0..32).map(|j| (j as f32 - 16.0) * 1e6).collect(),
        ];
        // Weights on the code grid of one candidate scale, and on rounding ties of it: the candidates' errors
        // tie or nearly tie.
        for candidate in 0..20 {
            let absmax = 1.0f32;
            let scale = stored_scale((1.0 - candidate as f32 / 100.0) * absmax / 7.5).to_f32();
            let on_grid: Vec<f32> =
                (0..32).map(|j| if j == 0 { absmax } else { ((j % 15) as f32 - 7.0) * scale }).collect();
            let ties: Vec<f32> =
                (0..32).map(|j| if j == 0 { absmax } else { ((j % 15) as f32 - 7.5) * scale }).collect();
            groups.push(on_grid);
            groups.push(ties);
        }
        // Few distinct values, so several candidates give the same codes and nearly the same error.
        for _ in 0..2_000 {
            let levels: Vec<f32> = (0..3).map(|_| rng.normal()).collect();
            groups.push((0..32).map(|j| levels[(j * 7 + rng.below(3)) % 3]).collect());
        }
        for group in &groups {
            assert_same(group);
        }
    }

    proptest! {
        #[test]
        fn matches_the_exhaustive_search_on_arbitrary_bits(bits in proptest::collection::vec(any::<u32>(), 1..200)) {
            let group: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
            let top = absmax(&group);
            let fast = super::search(&group, top, MseSearch::default());
            prop_assert_eq!(fast.to_bits(), reference_search(&group, top, MseSearch::default()).to_bits());
        }

        #[test]
        fn matches_the_exhaustive_search_on_arbitrary_values(
            values in proptest::collection::vec(-10.0f32..10.0, 1..300),
            exponent in -20i32..20,
        ) {
            let group: Vec<f32> = values.iter().map(|v| v * 2f32.powi(exponent)).collect();
            let top = absmax(&group);
            let fast = super::search(&group, top, MseSearch::default());
            prop_assert_eq!(fast.to_bits(), reference_search(&group, top, MseSearch::default()).to_bits());
        }
    }
}

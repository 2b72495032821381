//! `|x|^2.4`, the per-element error norm of the `mse` scale rule, from IEEE basic operations only (no libm), so
//! it vectorizes and a GPU kernel doing the same operations in the same order gets bit-identical results.
//!
//! `x^2.4 = x² · 2^(0.4·log2 x)`: `log2` from the exponent bits plus an odd series in `t = (m−1)/(m+1)` for the
//! mantissa `m ∈ [√½, √2)`; `2^y` from the integer part in the exponent bits plus a degree-6 polynomial for the
//! fraction. Relative error below 1e-6, far finer than the differences the clip search compares.

const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// Below this, `x^2.4` is under 1e-72 and contributes nothing an f32 sum can hold: return 0 (also avoids
/// subnormal inputs, whose exponent bits would mislead the reduction).
const TINY: f32 = 1e-30;

/// 1.5·2^23: adding and subtracting it rounds to the nearest integer (ties to even) for |y| < 2^22.
const ROUND: f32 = 12_582_912.0;

/// `|x|^2.4`. Branch-free (selects only) so that loops over it vectorize.
#[inline(always)]
pub fn abs_pow_2_4(x: f32) -> f32 {
    let x = x.abs();
    // Reduce to mantissa in [√½, √2) and exponent.
    let bits = x.to_bits();
    let raw_exponent = ((bits >> 23) & 0xFF) as i32 - 127;
    let raw_mantissa = f32::from_bits((bits & 0x007F_FFFF) | 0x3F80_0000);
    let high = raw_mantissa > std::f32::consts::SQRT_2;
    let mantissa = if high { raw_mantissa * 0.5 } else { raw_mantissa };
    let exponent = if high { raw_exponent + 1 } else { raw_exponent };
    let t = (mantissa - 1.0) / (mantissa + 1.0);
    let t2 = t * t;
    // ln m = 2·atanh(t) = 2t(1 + t²/3 + t⁴/5 + t⁶/7 + t⁸/9 + …), |t| ≤ 0.172.
    let series = 1.0 + t2 * (1.0 / 3.0 + t2 * (1.0 / 5.0 + t2 * (1.0 / 7.0 + t2 * (1.0 / 9.0))));
    let log2 = exponent as f32 + 2.0 * t * series * LOG2_E;
    // 2^y with y = n + f, n the nearest integer, |f| ≤ ½: 2^f = e^(f·ln2) by its Taylor series to degree 6.
    let y = 0.4 * log2;
    let shifted = y + ROUND;
    let whole = shifted - ROUND;
    let z = (y - whole) * std::f32::consts::LN_2;
    let exp = 1.0 + z * (1.0 + z * (0.5 + z * (1.0 / 6.0 + z * (1.0 / 24.0 + z * (1.0 / 120.0 + z * (1.0 / 720.0))))));
    // The integer `whole` read from the low mantissa bits of `y + 1.5·2^23` (equal to `whole as i32`, |y| < 2^22,
    // but a saturating float-to-int cast does not vectorize: it became eight scalar conversions per vector).
    let whole_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let power_of_two = f32::from_bits(((whole_int + 127).clamp(1, 254) as u32) << 23);
    let result = x * x * exp * power_of_two;
    // Tiny inputs contribute nothing an f32 sum can hold; NaN stays NaN (it never wins a comparison).
    if x >= TINY {
        result
    } else if x.is_nan() {
        x
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The formula before the exponent was read from the rounding bits (`whole as i32`), kept as the oracle.
    fn with_saturating_cast(x: f32) -> f32 {
        let x = x.abs();
        let bits = x.to_bits();
        let raw_exponent = ((bits >> 23) & 0xFF) as i32 - 127;
        let raw_mantissa = f32::from_bits((bits & 0x007F_FFFF) | 0x3F80_0000);
        let high = raw_mantissa > std::f32::consts::SQRT_2;
        let mantissa = if high { raw_mantissa * 0.5 } else { raw_mantissa };
        let exponent = if high { raw_exponent + 1 } else { raw_exponent };
        let t = (mantissa - 1.0) / (mantissa + 1.0);
        let t2 = t * t;
        let series = 1.0 + t2 * (1.0 / 3.0 + t2 * (1.0 / 5.0 + t2 * (1.0 / 7.0 + t2 * (1.0 / 9.0))));
        let log2 = exponent as f32 + 2.0 * t * series * LOG2_E;
        let y = 0.4 * log2;
        let whole = (y + ROUND) - ROUND;
        let z = (y - whole) * std::f32::consts::LN_2;
        let exp =
            1.0 + z * (1.0 + z * (0.5 + z * (1.0 / 6.0 + z * (1.0 / 24.0 + z * (1.0 / 120.0 + z * (1.0 / 720.0))))));
        let power_of_two = f32::from_bits(((whole as i32 + 127).clamp(1, 254) as u32) << 23);
        let result = x * x * exp * power_of_two;
        if x >= TINY {
            result
        } else if x.is_nan() {
            x
        } else {
            0.0
        }
    }

    #[test]
    fn same_bits_as_the_saturating_cast_version() {
        // Every 61st bit pattern (70 M values: all exponents, signs, subnormals, infinities, NaNs).
        for bits in (0..=u32::MAX).step_by(61).chain([0, 0x8000_0000, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 1]) {
            let x = f32::from_bits(bits);
            assert_eq!(abs_pow_2_4(x).to_bits(), with_saturating_cast(x).to_bits(), "x = {x:e} ({bits:#x})");
        }
    }

    #[test]
    fn matches_powf_closely() {
        let mut worst = 0f64;
        let mut x = 1e-12f32;
        while x < 1e6 {
            let exact = (x as f64).powf(2.4);
            let relative = ((abs_pow_2_4(x) as f64 - exact) / exact).abs();
            worst = worst.max(relative);
            assert_eq!(abs_pow_2_4(-x), abs_pow_2_4(x));
            x *= 1.001_37;
        }
        assert!(worst < 1e-6, "worst relative error {worst}");
        assert_eq!(abs_pow_2_4(0.0), 0.0);
        assert_eq!(abs_pow_2_4(1.0), 1.0);
    }
}

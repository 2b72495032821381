//! `e^x` from IEEE basic operations (no libm call, no fused multiply-add), so that a loop over it vectorizes and
//! every instruction set computes the same bits.
//!
//! `e^x = 2^n · e^r` with `n = round(x·log2 e)` and `r = x − n·ln 2` (ln 2 split in a high part exact in f32 times
//! any `|n| ≤ 128` and a low part), `|r| ≤ 0.35`; `e^r` by its Taylor series to degree 7 (the first omitted term is
//! below 6e-9), `2^n` from the exponent bits. Within 2 ulp of the exact value (its test), except that results
//! below f32's normal range (`x < −87`) are 0.

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 = `LN2_HIGH + LN2_LOW`, `LN2_HIGH` with 9 significant bits so that `n·LN2_HIGH` is exact.
const LN2_HIGH: f32 = 0.693_359_4;
const LN2_LOW: f32 = -2.121_944_4e-4;
/// 1.5·2^23: adding and subtracting it rounds to the nearest integer (ties to even) for |y| < 2^22.
const ROUND: f32 = 12_582_912.0;
/// Inputs outside this range give 0 and +∞: `e^−87 ≈ 1.6e-38` is the smallest normal result kept, `e^88` the
/// largest finite one below `2^127`.
const LOWEST: f32 = -87.0;
const HIGHEST: f32 = 88.0;

/// `e^x`; NaN for NaN. Branch-free (selects only) so loops over it vectorize.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let clamped = x.clamp(LOWEST, HIGHEST);
    let shifted = clamped * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (clamped - n * LN2_HIGH) - n * LN2_LOW;
    let mut series = 1.0 / 5040.0;
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        series = series * r + c;
    }
    // The integer n from the low mantissa bits of `shifted` (a float-to-int cast does not vectorize); |n| ≤ 127.
    let whole = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let result = series * f32::from_bits(((whole + 127) as u32) << 23);
    if x < LOWEST {
        0.0
    } else if x > HIGHEST {
        f32::INFINITY
    } else if x.is_nan() {
        x
    } else {
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn within_two_ulp_of_the_exact_value() {
        let mut worst = 0;
        // Every 97th bit pattern of [LOWEST, HIGHEST], both signs (≈ 22 M values).
        for bits in (0..0x42B0_0000u32).step_by(97) {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                if !(LOWEST..=HIGHEST).contains(&x) {
                    continue;
                }
                let exact = (x as f64).exp() as f32;
                worst = worst.max(ulps(exp(x), exact));
            }
        }
        assert!(worst <= 2, "worst error {worst} ulp");
    }

    #[test]
    fn edges() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(LOWEST) > 0.0 && exp(LOWEST).is_normal());
        assert!(exp(HIGHEST).is_finite());
    }
}

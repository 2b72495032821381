//! The FP8 e4m3fn codec: a 256-entry decode table and a saturating round-to-nearest-even encoder.
//!
//! e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities; `0x7F`/`0xFF` are NaN,
//! the largest finite magnitude is 448 (`0x7E`). Subnormals are `mantissa × 2^-9`.

/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;

const fn decode_code(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0f32 };
    let exponent = ((code >> 3) & 0x0F) as u32;
    let mantissa = (code & 0x07) as u32;
    if exponent == 0x0F && mantissa == 0x07 {
        return f32::NAN;
    }
    if exponent == 0 {
        // mantissa × 2^-9, exact in f32.
        return sign * (mantissa as f32) * f32::from_bits((127 - 9) << 23);
    }
    // Re-bias the exponent from 7 to 127 and widen the mantissa from 3 to 23 bits.
    let bits = ((exponent + 127 - 7) << 23) | (mantissa << 20);
    sign * f32::from_bits(bits)
}

const fn build_table() -> [f32; 256] {
    let mut table = [0.0f32; 256];
    let mut code = 0;
    while code < 256 {
        table[code] = decode_code(code as u8);
        code += 1;
    }
    table
}

/// `DECODE[code]` is the value of an e4m3fn byte.
pub static DECODE: [f32; 256] = build_table();

/// Decodes one e4m3fn byte.
#[inline]
pub fn decode(code: u8) -> f32 {
    DECODE[code as usize]
}

/// Encodes `value` to e4m3fn with round-to-nearest-even; magnitudes beyond 448 (and infinities) saturate
/// to ±448, NaN maps to the NaN code with the input's sign.
#[inline]
pub fn encode(value: f32) -> u8 {
    let bits = value.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    if value.is_nan() {
        return sign | 0x7F;
    }
    let magnitude = value.abs();
    if magnitude >= E4M3_MAX {
        return sign | 0x7E;
    }
    let min_normal = f32::from_bits((127 - 6) << 23); // 2^-6
    if magnitude < min_normal {
        // Subnormal range: steps of 2^-9. The product is exact; round half to even onto the integer grid.
        // A result of 8 is the smallest normal code, which is also the byte 0x08.
        let steps = (magnitude * 512.0).round_ties_even() as u8;
        return sign | steps;
    }
    let magnitude_bits = magnitude.to_bits();
    let exponent = (magnitude_bits >> 23) as i32 - 127;
    let mantissa = magnitude_bits & 0x007F_FFFF;
    let dropped = mantissa & 0x000F_FFFF;
    let kept = mantissa >> 20;
    let mut code = ((((exponent + 7) as u32) << 3) | kept) as u8;
    let halfway = 0x0008_0000;
    if dropped > halfway || (dropped == halfway && kept & 1 == 1) {
        code += 1; // a mantissa carry moves into the exponent, which is the correct next value
    }
    sign | code.min(0x7E)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_known_values() {
        assert_eq!(decode(0x00), 0.0);
        assert_eq!(decode(0x38), 1.0);
        assert_eq!(decode(0x7E), 448.0);
        assert_eq!(decode(0xFE), -448.0);
        assert_eq!(decode(0x01), 2f32.powi(-9));
        assert!(decode(0x7F).is_nan() && decode(0xFF).is_nan());
    }

    #[test]
    fn every_finite_code_round_trips() {
        for code in 0..=255u8 {
            let value = decode(code);
            if value.is_nan() {
                continue;
            }
            let back = encode(value);
            // -0.0 encodes to 0x80 which decodes to -0.0: both zero codes round-trip to themselves.
            assert_eq!(back, code, "code {code:#04x} value {value}");
        }
    }

    #[test]
    fn saturates() {
        assert_eq!(encode(1e9), 0x7E);
        assert_eq!(encode(f32::NEG_INFINITY), 0xFE);
        assert_eq!(encode(449.0), 0x7E);
    }
}

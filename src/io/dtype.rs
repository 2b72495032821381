//! Element types the checkpoints use, their byte sizes and safetensors names: the single source of truth for
//! tensor byte counts, used by the writer, the planner and `report` alike.

pub use safetensors::Dtype;

/// Bytes of one element of `dtype` (all dtypes squeeze writes are whole bytes).
pub fn element_bytes(dtype: Dtype) -> usize {
    dtype.bitsize() / 8
}

/// Bytes per parallel task of [`first_nonfinite`] (a multiple of every element width).
const SCAN_CHUNK: usize = 1 << 20;

/// Index of the first NaN or infinite element of little-endian float `bytes` of `dtype` (e4m3fn has no
/// infinities: `0x7F`/`0xFF` are its NaNs); `None` when all are finite or the dtype is not a float. Tensors over
/// a MiB are scanned in parallel on the rayon pool (the first bad element of the first chunk holding one).
pub fn first_nonfinite(dtype: Dtype, bytes: &[u8]) -> Option<usize> {
    use rayon::prelude::*;
    if bytes.len() <= SCAN_CHUNK {
        return first_nonfinite_serial(dtype, bytes);
    }
    let width = element_bytes(dtype).max(1);
    bytes
        .par_chunks(SCAN_CHUNK)
        .enumerate()
        .find_map_first(|(index, chunk)| first_nonfinite_serial(dtype, chunk).map(|at| index * SCAN_CHUNK / width + at))
}

/// [`first_nonfinite`] on this thread.
fn first_nonfinite_serial(dtype: Dtype, bytes: &[u8]) -> Option<usize> {
    match dtype {
        Dtype::F8_E4M3 => first_position(bytes, |&[b]: &[u8; 1]| b & 0x7F == 0x7F),
        Dtype::BF16 => first_position(bytes, |&b: &[u8; 2]| u16::from_le_bytes(b) & 0x7F80 == 0x7F80),
        Dtype::F16 => first_position(bytes, |&b: &[u8; 2]| u16::from_le_bytes(b) & 0x7C00 == 0x7C00),
        Dtype::F32 => first_position(bytes, |&b: &[u8; 4]| u32::from_le_bytes(b) & 0x7F80_0000 == 0x7F80_0000),
        _ => None,
    }
}

/// Index of the first `WIDTH`-byte element for which `is_bad` holds, testing 64 elements at a time without an
/// early exit inside a block so that the scan vectorizes (an exit per element kept it one byte at a time: 8 % of
/// a `ct-minmax` conversion's CPU time).
fn first_position<const WIDTH: usize>(bytes: &[u8], is_bad: impl Fn(&[u8; WIDTH]) -> bool) -> Option<usize> {
    const BLOCK: usize = 64;
    let (elements, _) = bytes.as_chunks::<WIDTH>();
    for (index, block) in elements.chunks(BLOCK).enumerate() {
        if block.iter().fold(false, |any, element| any | is_bad(element)) {
            return block.iter().position(&is_bad).map(|position| index * BLOCK + position);
        }
    }
    None
}

/// The bits of `half::bf16::from_f32(value)` (round to nearest, ties to even; a NaN keeps its sign and top
/// mantissa bits and becomes quiet), with selects instead of branches so that a loop over it vectorizes.
#[inline(always)]
pub fn bf16_bits(value: f32) -> u16 {
    let x = value.to_bits();
    let quiet_nan = (x >> 16) | 0x0040;
    // Round up when the dropped half is above ½ ulp, or exactly ½ with an odd kept part.
    let round_up = u32::from((x & 0x8000) != 0 && (x & 0x17FFF) != 0);
    let rounded = (x >> 16).wrapping_add(round_up);
    (if x & 0x7FFF_FFFF > 0x7F80_0000 { quiet_nan } else { rounded }) as u16
}

/// The values of a little-endian I32 or I64 tensor as i64; `None` for another dtype.
pub fn integers(dtype: Dtype, bytes: &[u8]) -> Option<Vec<i64>> {
    match dtype {
        Dtype::I64 => Some(
            bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect(),
        ),
        Dtype::I32 => {
            Some(bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64).collect())
        }
        _ => None,
    }
}

/// Number of elements of a shape.
pub fn element_count(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Bytes of a tensor of `dtype` and `shape`.
pub fn tensor_bytes(dtype: Dtype, shape: &[usize]) -> u64 {
    // Bits, not bytes: an F4 tensor's shape counts 4-bit elements (two per byte).
    (element_count(shape) * dtype.bitsize()).div_ceil(8) as u64
}

/// The safetensors name of a dtype (`"F8_E4M3"`, `"BF16"`, ...).
pub fn dtype_name(dtype: Dtype) -> String {
    dtype.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_nan_or_infinity() {
        assert_eq!(first_nonfinite(Dtype::F8_E4M3, &[0x00, 0x7E, 0xFE, 0xFF]), Some(3));
        assert_eq!(first_nonfinite(Dtype::F8_E4M3, &[0x7E, 0xFE]), None);
        let bf16: Vec<u8> =
            [1.0f32, f32::INFINITY].iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
        assert_eq!(first_nonfinite(Dtype::BF16, &bf16), Some(1));
        let f32s: Vec<u8> = [0.5f32, -3.0, f32::NAN].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(first_nonfinite(Dtype::F32, &f32s), Some(2));
        assert_eq!(first_nonfinite(Dtype::I32, &[0xFF; 8]), None);
    }

    #[test]
    fn bf16_bits_match_half() {
        // Every 61st bit pattern (all exponents, signs, subnormals, infinities, NaNs) and the rounding edges.
        let edges = [0u32, 0x8000_0000, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0x7F80_0001, 0xFFFF_FFFF, 0x7F7F_FFFF];
        let ties = (0..64u32).flat_map(|m| [(m << 16) | 0x8000, (m << 16) | 0x8001, (m << 16) | 0x7FFF]);
        for bits in (0..=u32::MAX).step_by(61).chain(edges).chain(ties) {
            let value = f32::from_bits(bits);
            assert_eq!(bf16_bits(value), half::bf16::from_f32(value).to_bits(), "{bits:#x}");
        }
    }

    #[test]
    fn parallel_scan_agrees_with_the_serial_one() {
        let mut rng = crate::rng::Rng::new(9);
        for dtype in [Dtype::F8_E4M3, Dtype::BF16, Dtype::F32] {
            for bad in [
                None,
                Some(0),
                Some(SCAN_CHUNK - 1),
                Some(SCAN_CHUNK),
                Some(3 * SCAN_CHUNK + 17),
                Some(4 * SCAN_CHUNK + 4),
            ] {
                let mut bytes: Vec<u8> = (0..4 * SCAN_CHUNK + 12).map(|_| (rng.next_u64() % 0x70) as u8).collect();
                if let Some(at) = bad {
                    bytes[at] = 0xFF;
                    bytes[at + 5] = 0xFF;
                }
                assert_eq!(first_nonfinite(dtype, &bytes), first_nonfinite_serial(dtype, &bytes), "{dtype:?} {bad:?}");
            }
        }
    }

    #[test]
    fn blocked_scan_agrees_with_a_plain_scan() {
        let mut rng = crate::rng::Rng::new(4);
        for length in [0usize, 1, 63, 64, 65, 127, 128, 129, 1000, 4099] {
            for _ in 0..40 {
                let mut bytes: Vec<u8> = (0..length).map(|_| (rng.next_u64() % 0x7F) as u8).collect();
                for _ in 0..rng.below(3) {
                    if length > 0 {
                        let at = rng.below(length);
                        bytes[at] = [0x7F, 0xFF, 0x80, 0x7C][rng.below(4)];
                    }
                }
                let plain_f8 = bytes.iter().position(|b| b & 0x7F == 0x7F);
                let plain_bf16 =
                    bytes.chunks_exact(2).position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7F80 == 0x7F80);
                let plain_f16 = bytes.chunks_exact(2).position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7C00 == 0x7C00);
                assert_eq!(first_nonfinite(Dtype::F8_E4M3, &bytes), plain_f8);
                assert_eq!(first_nonfinite(Dtype::BF16, &bytes), plain_bf16);
                assert_eq!(first_nonfinite(Dtype::F16, &bytes), plain_f16);
            }
        }
    }
}

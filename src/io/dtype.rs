//! Element types the checkpoints use, their byte sizes and safetensors names: the single source of truth for
//! tensor byte counts, used by the writer, the planner and `report` alike.

pub use safetensors::Dtype;

/// Bytes of one element of `dtype` (all dtypes squeeze writes are whole bytes).
pub fn element_bytes(dtype: Dtype) -> usize {
    dtype.bitsize() / 8
}

/// Index of the first NaN or infinite element of little-endian float `bytes` of `dtype` (e4m3fn has no
/// infinities: `0x7F`/`0xFF` are its NaNs); `None` when all are finite or the dtype is not a float.
pub fn first_nonfinite(dtype: Dtype, bytes: &[u8]) -> Option<usize> {
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
    (element_count(shape) * element_bytes(dtype)) as u64
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

//! Block-scaled FP8 weights: `w[i][j] = fp8[i][j] · scale[i / block_rows][j / block_cols]`, partial edge blocks.

use super::fp8::DECODE;

/// The scale grid of an FP8 weight: one f32 multiplier per `block_rows × block_cols` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockGrid {
    pub rows: usize,
    pub columns: usize,
    pub block_rows: usize,
    pub block_columns: usize,
}

impl BlockGrid {
    pub fn new(rows: usize, columns: usize, block_rows: usize, block_columns: usize) -> Self {
        Self { rows, columns, block_rows, block_columns }
    }

    /// Shape of the scale tensor: `[ceil(rows / block_rows), ceil(columns / block_columns)]`.
    pub fn scale_shape(&self) -> [usize; 2] {
        [self.rows.div_ceil(self.block_rows), self.columns.div_ceil(self.block_columns)]
    }
}

/// Dequantizes row `row` of an FP8 weight (`codes` holds that row only) into `out`; AVX-512 or AVX2 when available
/// (the same scalar code vectorized wider: the same bits).
pub fn dequantize_row(grid: &BlockGrid, row: usize, codes: &[u8], scales: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        // SAFETY: the CPU supports AVX-512F and BW (its level).
        crate::simd::Level::Avx512 => return unsafe { dequantize_row_avx512(grid, row, codes, scales, out) },
        // SAFETY: the CPU supports AVX2 (its level).
        crate::simd::Level::Avx2 => return unsafe { dequantize_row_avx2(grid, row, codes, scales, out) },
        crate::simd::Level::Portable => {}
    }
    dequantize_row_portable(grid, row, codes, scales, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn dequantize_row_avx512(grid: &BlockGrid, row: usize, codes: &[u8], scales: &[f32], out: &mut [f32]) {
    dequantize_row_portable(grid, row, codes, scales, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequantize_row_avx2(grid: &BlockGrid, row: usize, codes: &[u8], scales: &[f32], out: &mut [f32]) {
    dequantize_row_portable(grid, row, codes, scales, out)
}

/// `DECODE[code]` from the code's bits, with no table (a table lookup per element is a gather, which kept the
/// row loop slow): the e4m3 sign, exponent and mantissa moved into an f32's places make an f32 that is
/// `2^-120` times the code's value, subnormal codes included (they become f32 subnormals), so one exact product
/// by `2^120` gives it; the two NaN codes take the table's values, passed in as `nans`.
#[inline(always)]
fn decode_from_bits(code: u8, nans: [f32; 2]) -> f32 {
    const TWO_POW_120: f32 = f32::from_bits((127 + 120) << 23);
    let code = u32::from(code);
    let placed = f32::from_bits(((code & 0x80) << 24) | ((code & 0x7F) << 20)) * TWO_POW_120;
    let nan = if code & 0x80 != 0 { nans[1] } else { nans[0] };
    if code & 0x7F == 0x7F {
        nan
    } else {
        placed
    }
}

#[inline(always)]
fn dequantize_row_portable(grid: &BlockGrid, row: usize, codes: &[u8], scales: &[f32], out: &mut [f32]) {
    let scale_columns = grid.scale_shape()[1];
    let scale_row = &scales[(row / grid.block_rows) * scale_columns..][..scale_columns];
    let nans = [DECODE[0x7F], DECODE[0xFF]];
    for ((code_block, out_block), scale) in
        codes.chunks(grid.block_columns).zip(out.chunks_mut(grid.block_columns)).zip(scale_row)
    {
        for (code, value) in code_block.iter().zip(out_block.iter_mut()) {
            *value = decode_from_bits(*code, nans) * scale;
        }
    }
}

/// Quantizes a float matrix to block FP8 the way DeepSeek's `act_quant`/weight conversion does:
/// per block `scale = amax / 448`, codes = `encode(w / scale)`. Used by `synth` to write realistic sources.
pub fn quantize_matrix(grid: &BlockGrid, weights: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let [scale_rows, scale_columns] = grid.scale_shape();
    let mut scales = vec![0.0f32; scale_rows * scale_columns];
    for (row, chunk) in weights.chunks(grid.columns).enumerate() {
        for (block, values) in chunk.chunks(grid.block_columns).enumerate() {
            let amax = values.iter().fold(0.0f32, |acc, v| acc.max(v.abs()));
            let slot = &mut scales[(row / grid.block_rows) * scale_columns + block];
            *slot = slot.max(amax);
        }
    }
    for scale in scales.iter_mut() {
        *scale = if *scale > 0.0 { *scale / super::fp8::E4M3_MAX } else { 1.0 };
    }
    let codes = encode_blocks(grid, weights, &scales);
    (codes, scales)
}

/// [`quantize_matrix`] with power-of-two block scales, as E8M0 bytes (DeepSeek-V4's `scale_fmt: ue8m0`): each
/// block's absmax / 448 rounded up to a power of two, so no code saturates.
pub fn quantize_matrix_e8m0(grid: &BlockGrid, weights: &[f32]) -> (Vec<u8>, Vec<u8>) {
    let (_, scales) = quantize_matrix(grid, weights);
    let exponents: Vec<u8> = scales.iter().map(|s| (s.log2().ceil() as i32 + 127).clamp(1, 254) as u8).collect();
    let powers: Vec<f32> = exponents.iter().map(|&e| f32::from_bits(u32::from(e) << 23)).collect();
    (encode_blocks(grid, weights, &powers), exponents)
}

/// The e4m3 codes of `weights` divided by their block's scale.
fn encode_blocks(grid: &BlockGrid, weights: &[f32], scales: &[f32]) -> Vec<u8> {
    let scale_columns = grid.scale_shape()[1];
    let mut codes = vec![0u8; weights.len()];
    for (row, (values, out)) in weights.chunks(grid.columns).zip(codes.chunks_mut(grid.columns)).enumerate() {
        let scale_row = &scales[(row / grid.block_rows) * scale_columns..][..scale_columns];
        for ((block_values, block_out), scale) in
            values.chunks(grid.block_columns).zip(out.chunks_mut(grid.block_columns)).zip(scale_row)
        {
            for (value, code) in block_values.iter().zip(block_out.iter_mut()) {
                *code = super::fp8::encode(value / scale);
            }
        }
    }
    codes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_from_bits_matches_the_table() {
        let nans = [DECODE[0x7F], DECODE[0xFF]];
        let scales = [1.0f32, 0.5, 3.0e-3, 1.7e-39, 2.5e30, -1.25, f32::MIN_POSITIVE];
        for code in 0..=255u8 {
            assert_eq!(decode_from_bits(code, nans).to_bits(), DECODE[code as usize].to_bits(), "{code:#x}");
            for scale in scales {
                let table = DECODE[code as usize] * scale;
                assert_eq!((decode_from_bits(code, nans) * scale).to_bits(), table.to_bits(), "{code:#x} {scale:e}");
            }
        }
    }

    /// Every code of a row with awkward blocks, through the dispatched (widest vector) path and the scalar one,
    /// is the table's value times its block's scale, bit for bit.
    #[test]
    fn every_instruction_set_dequantizes_like_the_table() {
        let columns = 3 * 256 + 5;
        let grid = BlockGrid::new(2, columns, 1, 37);
        let codes: Vec<u8> = (0..columns).map(|i| (i * 7 % 256) as u8).collect();
        let scales: Vec<f32> = (0..2 * columns.div_ceil(37)).map(|i| 1.5e-3 * (i as f32 + 0.75)).collect();
        let (mut wide, mut scalar) = (vec![0f32; columns], vec![0f32; columns]);
        dequantize_row(&grid, 1, &codes, &scales, &mut wide);
        dequantize_row_portable(&grid, 1, &codes, &scales, &mut scalar);
        for (column, (&code, (got, plain))) in codes.iter().zip(wide.iter().zip(&scalar)).enumerate() {
            let want = DECODE[code as usize] * scales[columns.div_ceil(37) + column / 37];
            for value in [got, plain] {
                assert!(value.to_bits() == want.to_bits() || (value.is_nan() && want.is_nan()), "{code:#x}: {value}");
            }
        }
    }

    #[test]
    fn partial_edge_blocks_use_their_own_scale() {
        let grid = BlockGrid::new(130, 200, 128, 128);
        assert_eq!(grid.scale_shape(), [2, 2]);
        let weights: Vec<f32> =
            (0..130 * 200).map(|i| ((i * 31 % 97) as f32 - 48.0) * if i % 200 > 128 { 10.0 } else { 0.1 }).collect();
        let (codes, scales) = quantize_matrix(&grid, &weights);
        let mut row = vec![0.0f32; 200];
        dequantize_row(&grid, 129, &codes[129 * 200..130 * 200], &scales, &mut row);
        for (got, want) in row.iter().zip(&weights[129 * 200..]) {
            assert!((got - want).abs() <= want.abs() * 0.07 + 1e-6, "{got} vs {want}");
        }
    }
}

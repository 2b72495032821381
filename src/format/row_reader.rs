//! One source item's rows decoded to f32, as every converter and the runtime's loader read them: BF16/F16/F32 as
//! stored, block FP8 codes times their block's multiplier, INT4 codes times their group's BF16 scale and MXFP4
//! codes times their group's power of two (both exact in f32); and the item's largest magnitude taken from its
//! codes without decoding every element.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::io::dtype::Dtype;
use crate::io::{Checkpoint, IoError};
use crate::quant::fp4::{self as fp4, MXFP4_GROUP};
use crate::quant::fp8;
use crate::quant::fp8_block::{dequantize_row, BlockGrid};
use crate::quant::pack::{self, packed_columns};

use super::compressed_tensors::scale_name as int4_scale_name;
use super::vendor_source::{read_scales, SourceItem, SourceKind};

/// The largest magnitude code among e4m3fn bytes, NaN codes (`0x7F`, `0xFF`: e4m3fn has no infinity) counted as 0:
/// |code| is a byte's low seven bits; one more, wrapped to seven bits, is 0 for NaN and |code| + 1 otherwise, so the
/// largest of those less one (0 when none) is the answer. Byte-wise, without a branch, so that it vectorizes.
#[inline(always)]
fn top_code(codes: &[u8]) -> u8 {
    let mut top = 0u8;
    for &code in codes {
        top = top.max((code & 0x7F).wrapping_add(1) & 0x7F);
    }
    top.saturating_sub(1)
}

/// The largest magnitude of an FP8 row's values: per block of `block_columns` codes, [`top_code`] decoded times
/// the block's (positive) multiplier. AVX2 when the CPU has it (the same integer maxima, 32 bytes at a time).
fn row_absmax(codes: &[u8], block_columns: usize, scales: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::level() >= crate::simd::Level::Avx2 {
        // SAFETY: the CPU supports AVX2 (its level).
        return unsafe { row_absmax_avx2(codes, block_columns, scales) };
    }
    row_absmax_portable(codes, block_columns, scales)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_absmax_avx2(codes: &[u8], block_columns: usize, scales: &[f32]) -> f32 {
    row_absmax_portable(codes, block_columns, scales)
}

#[inline(always)]
fn row_absmax_portable(codes: &[u8], block_columns: usize, scales: &[f32]) -> f32 {
    let blocks = codes.chunks(block_columns);
    blocks.zip(scales).fold(0f32, |max, (block, scale)| max.max(fp8::decode(top_code(block)) * scale))
}

/// Decodes row `row` of a source weight into f32.
pub struct RowReader<'a> {
    /// The stored values: the tensor's, or an INT4 module's `weight_packed`.
    bytes: &'a [u8],
    pub rows: usize,
    pub columns: usize,
    decode: Decode<'a>,
}

/// How a [`RowReader`]'s bytes become values.
enum Decode<'a> {
    /// BF16, F16 or F32, as stored.
    Float(Dtype),
    /// FP8 e4m3 codes times their block's multiplier.
    Fp8 { grid: BlockGrid, scales: Vec<f32> },
    /// INT4 codes (eight per little-endian word) times their group's BF16 scale, in f32.
    Int4 { group_size: usize, scales: Vec<bf16> },
    /// E2M1 codes (two per byte, the even element low) times their group's E8M0 power of two: exact in f32.
    Mxfp4 { exponents: &'a [u8] },
}

impl<'a> RowReader<'a> {
    /// A reader over a 2-D item (1-D items read as a single row).
    pub fn new(checkpoint: &'a Checkpoint, item: &SourceItem) -> Result<Self, IoError> {
        let stored = &item.stored_names()[0];
        let shard = checkpoint.shard_of(stored).map(|s| s.path().to_path_buf()).unwrap_or_default();
        let tensor =
            checkpoint.get(stored).ok_or_else(|| IoError::tensor(&shard, stored, "is missing from the checkpoint"))?;
        let decode = match &item.kind {
            SourceKind::Fp8 { scale_name, grid } => {
                let scales = read_scales(checkpoint, scale_name)
                    .ok_or_else(|| IoError::tensor(&shard, scale_name, "scale tensor missing"))?;
                Decode::Fp8 { grid: *grid, scales }
            }
            SourceKind::Int4 { group_size } => {
                let scale_name = int4_scale_name(item.module());
                let scale = checkpoint
                    .get(&scale_name)
                    .ok_or_else(|| IoError::tensor(&shard, &scale_name, "scale tensor missing"))?;
                let scales = scale.bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]])).collect();
                Decode::Int4 { group_size: *group_size, scales }
            }
            SourceKind::Mxfp4 { naming, .. } => {
                let [_, scale_name] = naming.stored_names(item.module());
                let scale = checkpoint
                    .get(&scale_name)
                    .ok_or_else(|| IoError::tensor(&shard, &scale_name, "scale tensor missing"))?;
                Decode::Mxfp4 { exponents: scale.bytes }
            }
            SourceKind::Plain => {
                if !matches!(tensor.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
                    return Err(IoError::tensor(
                        shard,
                        &item.name,
                        format!("has dtype {}, which has no float value", tensor.dtype),
                    ));
                }
                Decode::Float(tensor.dtype)
            }
        };
        let (rows, columns) = match item.shape.as_slice() {
            [rows, columns] => (*rows, *columns),
            other => (1, other.iter().product()),
        };
        Ok(Self { bytes: tensor.bytes, rows, columns, decode })
    }

    /// A block-FP8 tensor's codes `[rows, columns]`, block grid and block multipliers, as stored.
    pub fn fp8_parts(&self) -> Option<(&'a [u8], BlockGrid, &[f32])> {
        match &self.decode {
            Decode::Fp8 { grid, scales } => Some((&self.bytes[..self.rows * self.columns], *grid, scales.as_slice())),
            _ => None,
        }
    }

    /// An MXFP4 module's packed codes `[rows, columns/2]` and E8M0 exponents `[rows, columns/32]`, as stored.
    pub fn mxfp4_parts(&self) -> Option<(&'a [u8], &'a [u8])> {
        match &self.decode {
            Decode::Mxfp4 { exponents } => Some((&self.bytes[..self.rows * self.columns / 2], exponents)),
            _ => None,
        }
    }

    /// The largest magnitude of the decoded values (NaN ignored), equal to the largest `|v|` of [`Self::read`]'s
    /// rows. FP8 and INT4 take it from the codes — the largest magnitude code of each block or group times its
    /// positive scale, which is the largest product since decoding and rounding are monotonic — without decoding
    /// every element; rows in parallel.
    pub fn absmax(&self) -> f32 {
        let width = self.columns;
        let rows = (0..self.rows).into_par_iter();
        match &self.decode {
            Decode::Fp8 { grid, scales } => rows
                .map(|row| {
                    let scale_columns = grid.scale_shape()[1];
                    let scale_row = &scales[(row / grid.block_rows) * scale_columns..][..scale_columns];
                    row_absmax(&self.bytes[row * width..][..width], grid.block_columns, scale_row)
                })
                .reduce(|| 0.0, f32::max),
            Decode::Int4 { group_size, scales } => rows
                .map(|row| {
                    let mut codes = vec![0i8; width];
                    let words = packed_columns(width);
                    let row_bytes = &self.bytes[row * words * 4..][..words * 4];
                    for (word, out) in row_bytes.chunks_exact(4).zip(codes.chunks_mut(8)) {
                        let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                        for (position, code) in out.iter_mut().enumerate() {
                            *code = pack::code(word, position);
                        }
                    }
                    let scales = &scales[row * width.div_ceil(*group_size)..];
                    codes.chunks(*group_size).zip(scales).fold(0f32, |max, (group, scale)| {
                        let top = group.iter().map(|q| q.unsigned_abs()).max().unwrap_or(0);
                        max.max(top as f32 * scale.to_f32())
                    })
                })
                .reduce(|| 0.0, f32::max),
            Decode::Mxfp4 { exponents } => rows
                .map(|row| {
                    let packed = &self.bytes[row * width / 2..][..width / 2];
                    let exponents = &exponents[row * width / MXFP4_GROUP..][..width / MXFP4_GROUP];
                    packed.chunks(MXFP4_GROUP / 2).zip(exponents).fold(0f32, |max, (group, &exponent)| {
                        let top = group.iter().map(|byte| (byte & 7).max((byte >> 4) & 7)).max().unwrap_or(0);
                        max.max(fp4::decode(top) * fp4::mxfp4_scale(exponent))
                    })
                })
                .reduce(|| 0.0, f32::max),
            Decode::Float(_) => rows
                .map_init(
                    || vec![0f32; width],
                    |values, row| {
                        self.read(row, values);
                        values.iter().fold(0f32, |max, v| max.max(v.abs()))
                    },
                )
                .reduce(|| 0.0, f32::max),
        }
    }

    /// The whole tensor as f32, row-major.
    pub fn read_all(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.columns];
        for (row, chunk) in out.chunks_mut(self.columns.max(1)).enumerate() {
            self.read(row, chunk);
        }
        out
    }

    /// Decodes row `row` into `out` (length `columns`).
    pub fn read(&self, row: usize, out: &mut [f32]) {
        let width = self.columns;
        match &self.decode {
            Decode::Fp8 { grid, scales } => dequantize_row(grid, row, &self.bytes[row * width..][..width], scales, out),
            Decode::Int4 { group_size, scales } => {
                let words = packed_columns(width);
                let scales = &scales[row * width.div_ceil(*group_size)..];
                let row_bytes = &self.bytes[row * words * 4..][..words * 4];
                for (word_index, (word, values)) in row_bytes.chunks_exact(4).zip(out.chunks_mut(8)).enumerate() {
                    let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                    for (position, value) in values.iter_mut().enumerate() {
                        let column = word_index * 8 + position;
                        *value = pack::code(word, position) as f32 * scales[column / group_size].to_f32();
                    }
                }
            }
            Decode::Mxfp4 { exponents } => {
                let packed = &self.bytes[row * width / 2..][..width / 2];
                let exponents = &exponents[row * width / MXFP4_GROUP..][..width / MXFP4_GROUP];
                let groups = out.chunks_mut(MXFP4_GROUP).zip(packed.chunks(MXFP4_GROUP / 2)).zip(exponents);
                for ((values, group), &exponent) in groups {
                    let scale = fp4::mxfp4_scale(exponent);
                    for (pair, byte) in values.chunks_exact_mut(2).zip(group) {
                        pair[0] = fp4::decode(byte & 0xF) * scale;
                        pair[1] = fp4::decode(byte >> 4) * scale;
                    }
                }
            }
            Decode::Float(Dtype::BF16) => {
                for (value, b) in out.iter_mut().zip(self.bytes[row * width * 2..][..width * 2].chunks_exact(2)) {
                    *value = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            Decode::Float(Dtype::F16) => {
                for (value, b) in out.iter_mut().zip(self.bytes[row * width * 2..][..width * 2].chunks_exact(2)) {
                    *value = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            Decode::Float(_) => {
                for (value, b) in out.iter_mut().zip(self.bytes[row * width * 4..][..width * 4].chunks_exact(4)) {
                    *value = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::compressed_tensors::{int4_tensors, Int4Args};
    use crate::format::vendor_source::{items_from_checkpoint, stored_item};
    use crate::io::writer::{PlannedTensor, ShardWriter};

    /// `top_code` equals the plain definition (the largest low-seven-bit magnitude, NaN codes as 0) on every single
    /// byte, on blocks mixing NaN codes with others, and on random blocks of several lengths.
    #[test]
    fn the_top_code_is_the_largest_magnitude_code_with_nan_as_zero() {
        let plain = |codes: &[u8]| codes.iter().map(|&c| if c & 0x7F == 0x7F { 0 } else { c & 0x7F }).max();
        for code in 0..=255u8 {
            assert_eq!(top_code(&[code]), plain(&[code]).unwrap(), "{code:#04x}");
            assert_eq!(top_code(&[0x7F, code, 0xFF]), plain(&[0x7F, code, 0xFF]).unwrap(), "{code:#04x}");
        }
        assert_eq!(top_code(&[]), 0);
        assert_eq!(top_code(&[0x7F, 0xFF]), 0);
        let mut rng = crate::rng::Rng::new(9);
        for length in [1, 7, 16, 31, 128, 300] {
            for _ in 0..50 {
                let codes: Vec<u8> = (0..length).map(|_| rng.below(256) as u8).collect();
                assert_eq!(top_code(&codes), plain(&codes).unwrap(), "{codes:?}");
            }
        }
    }

    /// A folder with an FP8 weight `f.weight` [5, 7] in 2×4 blocks (NaN codes included), an INT4 module `q`
    /// [3, 20] in groups of 10 (every code, −8 included; a partial last word) and a BF16 `b.weight` [2, 3].
    fn folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut fp8_codes: Vec<u8> = (0..35u8).map(|i| i.wrapping_mul(73)).collect();
        (fp8_codes[3], fp8_codes[20]) = (0x7F, 0xFF);
        let fp8_scales: Vec<f32> = vec![0.5, 1.0e-3, 3.0, 7.25e-2, 1.0e5, 2.0e-7];
        let q: Vec<i8> = (0..60).map(|i| ((i * 7 + 3) % 16) as i8 - 8).collect();
        let mut words = vec![0u32; 3 * packed_columns(20)];
        for (row, out) in words.chunks_mut(packed_columns(20)).enumerate() {
            pack::pack_row(&q[row * 20..][..20], out);
        }
        let int4_scales: Vec<bf16> = (0..6).map(|i| bf16::from_f32(0.03 + i as f32 * 0.11)).collect();
        let mut tensors = vec![
            PlannedTensor::new("f.weight", Dtype::F8_E4M3, vec![5, 7]),
            PlannedTensor::new("f.weight_scale_inv", Dtype::F32, vec![3, 2]),
            PlannedTensor::new("b.weight", Dtype::BF16, vec![2, 3]),
        ];
        tensors.extend(int4_tensors("q", 3, 20, 10));
        let bytes: Vec<(&str, Vec<u8>)> = vec![
            ("f.weight", fp8_codes),
            ("f.weight_scale_inv", fp8_scales.iter().flat_map(|s| s.to_le_bytes()).collect()),
            (
                "b.weight",
                [-2.5f32, 0.1, 3.0, -7.75, 0.0, 1.0].iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
            ),
            ("q.weight_packed", words.iter().flat_map(|w| w.to_le_bytes()).collect()),
            ("q.weight_scale", int4_scales.iter().flat_map(|s| s.to_le_bytes()).collect()),
            ("q.weight_shape", [3i64, 20].iter().flat_map(|v| v.to_le_bytes()).collect()),
        ];
        let mut writer = ShardWriter::create(&dir.path().join("model.safetensors"), tensors).unwrap();
        for (name, bytes) in &bytes {
            writer.write_tensor(name, bytes).unwrap();
        }
        writer.finish().unwrap();
        let config = serde_json::json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [2, 4]}});
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        dir
    }

    /// The INT4 module is one item named by its weight, read as code × scale in f32; every reader's `absmax` from
    /// codes equals the largest magnitude of its decoded values.
    #[test]
    fn int4_modules_read_exactly_and_absmax_from_codes_equals_the_decoded_one() {
        let dir = folder();
        let checkpoint = Checkpoint::open(dir.path()).unwrap();
        let items = items_from_checkpoint(&checkpoint).unwrap();
        let names: Vec<&str> = items.iter().map(|item| item.name.as_str()).collect();
        assert_eq!(names, ["f.weight", "b.weight", "q.weight"]);
        let int4 = &items[2];
        assert_eq!((&int4.shape, &int4.kind), (&vec![3, 20], &SourceKind::Int4 { group_size: 10 }));
        assert_eq!(int4.stored_names(), ["q.weight_packed", "q.weight_scale", "q.weight_shape"]);
        let module =
            crate::format::compressed_tensors::Int4Module::read(&checkpoint, "q", &Int4Args::group(10)).unwrap();
        let values = RowReader::new(&checkpoint, int4).unwrap().read_all();
        let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&values), bits(&module.dequantize()));
        assert_eq!(stored_item(&checkpoint, "q.weight", [128, 128]).unwrap(), *int4);
        for item in &items {
            let reader = RowReader::new(&checkpoint, item).unwrap();
            let decoded = reader.read_all().iter().fold(0f32, |max, v| max.max(v.abs()));
            assert!(decoded > 0.0, "{}", item.name);
            assert_eq!(reader.absmax().to_bits(), decoded.to_bits(), "{}", item.name);
        }
    }
}

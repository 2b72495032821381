//! Reads one weight of any checkpoint squeeze reads or writes as a runtime matrix, through the format readers
//! ([`crate::format`]): block-FP8 (DeepSeek `weight_scale_inv` or compressed-tensors `weight_scale`),
//! compressed-tensors INT4 `pack-quantized` (dequantized, with its packed words kept), or BF16/F16/F32.

use std::collections::HashSet;

use super::error::tensor_error;
use crate::format::compressed_tensors::{
    fp4_modules, fused_partner, int4_args, int4_modules, Fp4Layout, Fp4Module, Int4Args, Int4Module,
};
use crate::format::row_reader::RowReader;
use crate::format::vendor_source::{declared_block, stored_item, SourceItem, SourceKind};
use crate::io::{Checkpoint, Dtype};
use crate::quant::w4a8;

use crate::runtime::matrix::{Fp8Codes, Fp8Weight, Int4Weight, Matrix};
use crate::runtime::RuntimeError;

/// Whether every value `e4m3(code) · scale` is finite, without making them: no NaN code (`0x7F`/`0xFF`; e4m3fn has
/// no infinity) and every block's multiplier finite with `448 · scale` finite (448 is the largest |e4m3|). False
/// when unsure (an overflowing scale may still give finite values for small codes): the caller then checks values.
fn all_finite(fp8: &Fp8Weight) -> bool {
    crate::io::dtype::first_nonfinite(Dtype::F8_E4M3, &fp8.codes[..]).is_none()
        && fp8.scales.iter().all(|&scale| (scale * 448.0).is_finite())
}

/// A W4A8 module's weight as the engines compute with it ([`crate::quant::w4a8::dequantize_row`]): FP8 group scales
/// and a channel scale made from the stored ones, each weight an FP8 product. vLLM's W4A8 MoE asserts symmetric
/// groups (`compressed_tensors_moe_w4a8_fp8.py`), so zero points and `g_idx` are refused.
fn w4a8_values(int4: &Int4Module) -> Result<Vec<f32>, String> {
    if int4.zero_points.is_some() || int4.g_idx.is_some() {
        return Err("is W4A8 with zero points or a g_idx: the engines' W4A8 kernels take symmetric contiguous groups \
                    only; requantize with a w4a8-fp8 recipe"
            .into());
    }
    Ok(int4.dequantize_rows(|q, scales, _, out| w4a8::dequantize_row(q, scales, int4.group_size, out)))
}

/// Dequantizing reader over an opened checkpoint.
pub struct WeightReader<'a> {
    checkpoint: &'a Checkpoint,
    /// The config's INT4 arguments, or why they cannot be read.
    int4_args: Result<Option<Int4Args>, String>,
    fp8_block: [usize; 2],
    int4_modules: HashSet<String>,
    fp4_modules: HashSet<String>,
}

impl<'a> WeightReader<'a> {
    pub fn new(checkpoint: &'a Checkpoint) -> Self {
        let config = checkpoint.config();
        let int4_modules = int4_modules(checkpoint).into_iter().collect();
        let fp4_modules = fp4_modules(checkpoint).into_iter().collect();
        Self { checkpoint, int4_args: int4_args(config), fp8_block: declared_block(config), int4_modules, fp4_modules }
    }

    pub fn checkpoint(&self) -> &'a Checkpoint {
        self.checkpoint
    }

    fn shard(&self, name: &str) -> std::path::PathBuf {
        self.checkpoint
            .shard_of(name)
            .map(|s| s.path().to_path_buf())
            .unwrap_or_else(|| self.checkpoint.dir().to_path_buf())
    }

    /// The activation global scale of W4A4 NVFP4 module `module` (`None` for any other module).
    pub fn input_global_scale(&self, module: &str) -> Result<Option<f32>, RuntimeError> {
        if !self.fp4_modules.contains(module) {
            return Ok(None);
        }
        let layout = Fp4Layout::read(self.checkpoint, module).map_err(|problem| {
            RuntimeError::Input(format!(
                "{}: {problem}; the FP4 folder is damaged: check it with `squeeze verify` and rerun `squeeze quantize`",
                self.shard(&format!("{module}.weight_packed")).display()
            ))
        })?;
        Ok(layout.input_global_scale)
    }

    /// Refuses an NVFP4 gate/up pair whose global scales differ (another tool's folder, or an edited one): vLLM fuses
    /// the pair into one `w13` and serves both halves with one scale — gate's for a routed expert (its
    /// compressed-tensors NVFP4 MoE method warns "w1_weight_global_scale must match w3_weight_global_scale" and takes
    /// `w13_weight_global_scale[:, 0]`), the larger for a dense or shared-expert pair — and SGLang refuses the
    /// folder, so measuring each half with its own scale would measure a model no engine serves.
    fn check_fused_global_scale(&self, name: &str, global: f32) -> Result<(), RuntimeError> {
        let Some(partner) = fused_partner(name) else { return Ok(()) };
        let partner_module = partner.strip_suffix(".weight").unwrap_or(&partner);
        if !self.fp4_modules.contains(partner_module) {
            return Ok(());
        }
        let Ok(layout) = Fp4Layout::read(self.checkpoint, partner_module) else { return Ok(()) };
        if layout.global_scale.to_bits() == global.to_bits() {
            return Ok(());
        }
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let gate_first = name.ends_with(".gate_proj.weight") || name.ends_with(".w1.weight");
        let ((gate, gate_scale), (up, up_scale)) = if gate_first {
            ((module, global), (partner_module, layout.global_scale))
        } else {
            ((partner_module, layout.global_scale), (module, global))
        };
        let up_scale_name = format!("{up}.weight_global_scale");
        Err(tensor_error(
            self.shard(&up_scale_name),
            up_scale_name,
            format!(
                "is {up_scale}, but its fused partner's `{gate}.weight_global_scale` is {gate_scale}: vLLM serves the \
                 gate/up pair with one scale (a routed expert's gate scale, a dense or shared-expert pair's larger \
                 one; it only warns) and SGLang refuses the folder, so squeeze would measure a model no engine \
                 serves; requantize the folder from its source with an -nvfp4 recipe (one scale per pair), see \
                 `squeeze verify DIR --engine vllm` (rule fp4-fused-global-scale)"
            ),
        ))
    }

    /// Whether the checkpoint has weight `name` (`<module>.weight`) in any supported form.
    pub fn contains(&self, name: &str) -> bool {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        self.checkpoint.contains(name) || self.int4_modules.contains(module) || self.fp4_modules.contains(module)
    }

    /// The weight `name` as a matrix; 1-D tensors come back as one row.
    pub fn matrix(&self, name: &str, expected: [usize; 2]) -> Result<Matrix, RuntimeError> {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        if self.int4_modules.contains(module) {
            let args = match &self.int4_args {
                Ok(Some(args)) => *args,
                Ok(None) => {
                    return Err(tensor_error(
                        self.shard(name),
                        name,
                        "is INT4 packed but config.json has no compressed-tensors INT4 group",
                    ))
                }
                Err(problem) => return Err(RuntimeError::Input(format!("{problem} (read for {name})"))),
            };
            let int4 = Int4Module::read(self.checkpoint, module, &args).map_err(|problem| {
                RuntimeError::Input(format!(
                    "{}: {problem}; the INT4 folder is damaged: check it with `squeeze verify` and rerun `squeeze quantize`",
                    self.shard(name).display()
                ))
            })?;
            // |q − z| ≤ 15: every value is finite when 16 × each scale is.
            if let Some(position) = int4.scales.iter().position(|scale| !(scale * 16.0).is_finite()) {
                return Err(tensor_error(
                    self.shard(name),
                    format!("{module}.weight_scale"),
                    format!(
                        "scale {position} is {}: its values are not finite; the checkpoint is corrupt",
                        int4.scales[position]
                    ),
                ));
            }
            let (rows, columns) = (int4.rows, int4.columns);
            if args.fp8_activations {
                let values = w4a8_values(&int4).map_err(|problem| tensor_error(self.shard(name), name, problem))?;
                return self.checked(name, Matrix::new(rows, columns, values).with_fp8_token_inputs(), expected);
            }
            // Another writer's layout (F16/F32 scales, zero points, g_idx, one scale per row): dequantized on read,
            // exactly (`Int4Module::dequantize`), as compressed-tensors decompresses it.
            let packed_form = int4.bf16_scales().filter(|_| int4.is_squeeze_layout() && args.group_size.is_some());
            let Some(scales) = packed_form else {
                return self.checked(name, Matrix::new(rows, columns, int4.dequantize()), expected);
            };
            let int4 = Int4Weight {
                packed: int4.words,
                scales: scales.iter().map(|scale| scale.to_bits()).collect(),
                group_size: int4.group_size,
            };
            // Packed only: the CPU backend dequantizes on first use, a device backend never does.
            return self.checked(name, Matrix::packed(rows, columns, int4), expected);
        }
        if self.fp4_modules.contains(module) {
            // NVFP4/MXFP4 modules are dequantized on read, as compressed-tensors decompresses them.
            let fp4 = Fp4Module::read(self.checkpoint, module).map_err(|problem| {
                RuntimeError::Input(format!(
                    "{}: {problem}; the FP4 folder is damaged: check it with `squeeze verify` and rerun `squeeze quantize`",
                    self.shard(name).display()
                ))
            })?;
            self.check_fused_global_scale(name, fp4.global_scale)?;
            return self.checked(name, Matrix::new(fp4.rows, fp4.columns, fp4.dequantize()), expected);
        }
        let item = stored_item(self.checkpoint, name, self.fp8_block)?;
        let [rows, columns] = match item.shape.as_slice() {
            [rows, columns] => [*rows, *columns],
            other => [1, other.iter().product()],
        };
        let reader = RowReader::new(self.checkpoint, &item)?;
        if let Some((codes, grid, scales)) =
            reader.fp8_parts().filter(|(_, grid, _)| [grid.rows, grid.columns] == [rows, columns])
        {
            // Codes only: a device backend dequantizes them on the device, the CPU's first `values()` on the host.
            // In place when the checkpoint's mapping holds them (the usual case): no copy of every expert's codes.
            let codes = match self.checkpoint.mapped(&item.name) {
                Some(mapped) if mapped.as_ptr() == codes.as_ptr() => {
                    Fp8Codes::Mapped(std::sync::Arc::new(mapped.prefix(codes.len())))
                }
                _ => Fp8Codes::Owned(codes.to_vec()),
            };
            let fp8 = Fp8Weight { codes, scales: scales.to_vec(), grid };
            return self.checked(name, Matrix::coded_fp8(fp8), expected);
        }
        let data = reader.read_all();
        let bf16 = item.dtype == Dtype::BF16 && matches!(item.kind, SourceKind::Plain);
        self.checked(name, Matrix::new(rows, columns, data).with_bf16_values(bf16), expected)
    }

    /// A 1-D parameter (norm weight, bias) of `length` values as a one-row matrix, the form the ops take.
    pub fn parameter(&self, name: &str, length: usize) -> Result<Matrix, RuntimeError> {
        // f32 on a device too: norms, biases and the router bias are read by f32 kernels.
        Ok(self.matrix(name, [1, length])?.with_bf16_values(false))
    }

    /// A 1-D tensor (norm weight, bias) of `length` values.
    pub fn vector(&self, name: &str, length: usize) -> Result<Vec<f32>, RuntimeError> {
        Ok(self.matrix(name, [1, length])?.values().to_vec())
    }

    fn checked(&self, name: &str, matrix: Matrix, expected: [usize; 2]) -> Result<Matrix, RuntimeError> {
        if [matrix.rows, matrix.columns] != expected {
            return Err(tensor_error(
                self.shard(name),
                name,
                format!("has shape [{}, {}] but config.json implies {expected:?}; the config does not belong to these weights", matrix.rows, matrix.columns),
            ));
        }
        if matrix.int4.is_some() {
            return Ok(matrix);
        }
        if matrix.fp8().is_some_and(|fp8| all_finite(&fp8)) {
            return Ok(matrix);
        }
        // Found non-finite (or a plain matrix): the values say which element.
        if let Some(position) = matrix.values().iter().position(|v| !v.is_finite()) {
            return Err(tensor_error(
                self.shard(name),
                name,
                format!("element {position} dequantizes to {}; the checkpoint is corrupt", matrix.values()[position]),
            ));
        }
        Ok(matrix)
    }

    /// Row `row` of an embedding-like 2-D tensor (BF16/F16/F32/FP8) of width `columns`.
    pub fn rows(&self, name: &str, columns: usize, rows: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        let tensor = self
            .checkpoint
            .get(name)
            .ok_or_else(|| tensor_error(self.checkpoint.dir(), name, "is missing from the checkpoint"))?;
        if tensor.shape.len() != 2 || tensor.shape[1] != columns {
            return Err(tensor_error(
                self.shard(name),
                name,
                format!("has shape {:?} but config.json implies [vocab, {columns}]", tensor.shape),
            ));
        }
        let item = SourceItem {
            name: name.to_string(),
            dtype: tensor.dtype,
            shape: tensor.shape.to_vec(),
            kind: SourceKind::Plain,
        };
        let reader = RowReader::new(self.checkpoint, &item)?;
        let mut out = vec![0f32; rows.len() * columns];
        for (slot, &row) in out.chunks_mut(columns).zip(rows) {
            if row as usize >= reader.rows {
                return Err(RuntimeError::Input(format!(
                    "token id {row} is outside the vocabulary of {} rows of `{name}`",
                    reader.rows
                )));
            }
            reader.read(row as usize, slot);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::dtype::Dtype;
    use crate::io::writer::{PlannedTensor, ShardWriter};
    use proptest::prelude::*;

    /// Writes an INT4 module with the given (possibly inconsistent) shapes and a config with `group`.
    fn int4_folder(packed: [usize; 2], scale: [usize; 2], shape: [i64; 2], group: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let tensors = vec![
            PlannedTensor::new("m.weight_packed", Dtype::I32, packed.to_vec()),
            PlannedTensor::new("m.weight_scale", Dtype::BF16, scale.to_vec()),
            PlannedTensor::new("m.weight_shape", Dtype::I64, vec![2]),
        ];
        let mut writer = ShardWriter::create(&dir.path().join("model.safetensors"), tensors.clone()).unwrap();
        for tensor in &tensors {
            let bytes = match tensor.name.as_str() {
                "m.weight_shape" => shape.iter().flat_map(|v| v.to_le_bytes()).collect(),
                // BF16 1.0 for the scales, arbitrary words for the packed values.
                "m.weight_scale" => [0x80u8, 0x3F].repeat(tensor.bytes() as usize / 2),
                _ => vec![0x5A; tensor.bytes() as usize],
            };
            writer.write_tensor(&tensor.name, &bytes).unwrap();
        }
        writer.finish().unwrap();
        let config = serde_json::json!({"quantization_config": {"quant_method": "compressed-tensors", "config_groups":
            {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": group}}}}});
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        dir
    }

    proptest! {
        /// Whatever shapes an INT4 folder declares, reading it is an error naming a tensor or a consistent matrix.
        #[test]
        fn inconsistent_int4_shapes_never_panic(
            rows in 0usize..6, words in 0usize..6, scale_rows in 0usize..6, scale_columns in 0usize..6,
            out in -2i64..7, columns in -2i64..50, group in 1usize..40,
        ) {
            let dir = int4_folder([rows, words], [scale_rows, scale_columns], [out, columns], group);
            let checkpoint = Checkpoint::open(dir.path()).unwrap();
            let reader = WeightReader::new(&checkpoint);
            let expected = [out.max(0) as usize, columns.max(0) as usize];
            match reader.matrix("m.weight", expected) {
                Ok(matrix) => prop_assert_eq!(matrix.values().len(), expected[0] * expected[1]),
                Err(error) => prop_assert!(error.to_string().contains("m.weight"), "{}", error),
            }
        }
    }

    #[test]
    fn a_consistent_module_reads() {
        let dir = int4_folder([3, 2], [3, 1], [3, 16], 16);
        let checkpoint = Checkpoint::open(dir.path()).unwrap();
        let matrix = WeightReader::new(&checkpoint).matrix("m.weight", [3, 16]).unwrap();
        assert!(matrix.int4.is_some() && matrix.bytes() < 48 * 4, "read packed only: {} bytes", matrix.bytes());
        assert_eq!(matrix.values().len(), 48);
        assert!(matrix.values().iter().all(|v| v.is_finite()));
    }

    /// A block-FP8 weight `m.weight` [5, 7] with 2×4 blocks (partial edge blocks) and its `weight_scale_inv`.
    fn fp8_folder(codes: &[u8], scales: [f32; 6]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let tensors = vec![
            PlannedTensor::new("m.weight", Dtype::F8_E4M3, vec![5, 7]),
            PlannedTensor::new("m.weight_scale_inv", Dtype::F32, vec![3, 2]),
        ];
        let mut writer = ShardWriter::create(&dir.path().join("model.safetensors"), tensors).unwrap();
        writer.write_tensor("m.weight", codes).unwrap();
        writer
            .write_tensor("m.weight_scale_inv", &scales.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<_>>())
            .unwrap();
        writer.finish().unwrap();
        let config = serde_json::json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [2, 4]}});
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        dir
    }

    #[test]
    fn a_block_fp8_weight_reads_as_its_codes_until_the_host_needs_values() {
        // Every code but the two NaNs, and scales of awkward sizes.
        let codes: Vec<u8> = (0..35u8).map(|i| i.wrapping_mul(37) % 0x7F).collect();
        let scales = [0.5, 1.0e-3, 3.0, 7.25e-2, 1.0e5, 2.0e-7];
        let dir = fp8_folder(&codes, scales);
        let checkpoint = Checkpoint::open(dir.path()).unwrap();
        let matrix = WeightReader::new(&checkpoint).matrix("m.weight", [5, 7]).unwrap();
        let fp8 = matrix.fp8().expect("held as codes");
        assert_eq!((&fp8.codes[..], fp8.scales.as_slice()), (codes.as_slice(), scales.as_slice()));
        assert_eq!(matrix.bytes(), 35 + 6 * 4, "no f32 values before they are asked for");
        // The values are what the row reader makes, bit for bit; the codes are dropped then.
        let item = stored_item(&checkpoint, "m.weight", [2, 4]).unwrap();
        let want = RowReader::new(&checkpoint, &item).unwrap().read_all();
        let got: Vec<u32> = matrix.values().iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        assert!(matrix.fp8().is_none());
        assert_eq!(matrix.bytes(), 35 * 4);
    }

    #[test]
    fn a_nan_fp8_code_is_refused_naming_its_element() {
        let mut codes = vec![0x38u8; 35];
        codes[17] = 0xFF;
        let dir = fp8_folder(&codes, [1.0; 6]);
        let checkpoint = Checkpoint::open(dir.path()).unwrap();
        let error = WeightReader::new(&checkpoint).matrix("m.weight", [5, 7]).unwrap_err().to_string();
        assert!(error.contains("m.weight") && error.contains("element 17"), "{error}");
    }
}

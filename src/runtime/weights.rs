//! Reads one weight of any checkpoint squeeze reads or writes as f32: block-FP8 (DeepSeek `weight_scale_inv` or
//! compressed-tensors `weight_scale`), compressed-tensors INT4 `pack-quantized`, or BF16/F16/F32.

use std::collections::HashSet;

use serde_json::Value;

use crate::convert::source::{RowReader, SourceItem, SourceKind};
use crate::io::dtype::Dtype;
use crate::io::Checkpoint;
use crate::quant::fp8_block::BlockGrid;
use crate::verify::{dequantize_int4, int4_group_size};

use super::backend::{Int4Weight, Matrix};
use super::RuntimeError;

/// Dequantizing reader over an opened checkpoint.
pub struct WeightReader<'a> {
    checkpoint: &'a Checkpoint,
    int4_group: Option<usize>,
    fp8_block: [usize; 2],
    int4_modules: HashSet<String>,
}

impl<'a> WeightReader<'a> {
    pub fn new(checkpoint: &'a Checkpoint) -> Self {
        let config = checkpoint.config();
        let quantization = config.and_then(|c| c.get("quantization_config"));
        let pair = |value: Option<&Value>| -> Option<[usize; 2]> {
            let list = value?.as_array()?;
            Some([list.first()?.as_u64()? as usize, list.get(1)?.as_u64()? as usize])
        };
        let block_structure = quantization
            .and_then(|q| q.get("config_groups"))
            .and_then(Value::as_object)
            .and_then(|groups| groups.values().find_map(|group| pair(group.get("weights")?.get("block_structure"))));
        let fp8_block =
            pair(quantization.and_then(|q| q.get("weight_block_size"))).or(block_structure).unwrap_or([128, 128]);
        let int4_modules = checkpoint
            .names_in_file_order()
            .into_iter()
            .filter_map(|name| name.strip_suffix(".weight_packed").map(String::from))
            .collect();
        Self { checkpoint, int4_group: int4_group_size(config), fp8_block, int4_modules }
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

    /// Whether the checkpoint has weight `name` (`<module>.weight`) in any supported form.
    pub fn contains(&self, name: &str) -> bool {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        self.checkpoint.contains(name) || self.int4_modules.contains(module)
    }

    /// The weight `name` as a matrix; 1-D tensors come back as one row.
    pub fn matrix(&self, name: &str, expected: [usize; 2]) -> Result<Matrix, RuntimeError> {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        if self.int4_modules.contains(module) {
            let group = self.int4_group.ok_or_else(|| {
                RuntimeError::tensor(
                    self.shard(name),
                    name,
                    "is INT4 packed but config.json has no compressed-tensors INT4 group size",
                )
            })?;
            let (data, [rows, columns]) = dequantize_int4(self.checkpoint, module, group).map_err(|problem| {
                RuntimeError::Input(format!(
                    "{}: {problem}; the INT4 folder is damaged: check it with `squeeze verify` and rerun `squeeze quantize`",
                    self.shard(name).display()
                ))
            })?;
            let int4 = self.int4_weight(module, group)?;
            return self.checked(name, Matrix::new(rows, columns, data).with_int4(int4), expected);
        }
        let tensor = self
            .checkpoint
            .get(name)
            .ok_or_else(|| RuntimeError::tensor(self.checkpoint.dir(), name, "is missing from the checkpoint"))?;
        let shape = tensor.shape.to_vec();
        let (rows, columns) = match shape.as_slice() {
            [rows, columns] => (*rows, *columns),
            other => (1, other.iter().product()),
        };
        let kind = if tensor.dtype == Dtype::F8_E4M3 {
            let candidates = [format!("{name}_scale_inv"), format!("{module}.weight_scale")];
            let scale_name =
                candidates.iter().find(|candidate| self.checkpoint.contains(candidate)).cloned().ok_or_else(|| {
                    RuntimeError::tensor(
                        self.shard(name),
                        name,
                        "is FP8 but has neither `weight_scale_inv` nor `weight_scale`",
                    )
                })?;
            let scale_elements: usize = self.checkpoint.get(&scale_name).map(|s| s.shape.iter().product()).unwrap_or(0);
            let [block_rows, block_columns] = self.fp8_block;
            let grid = if scale_elements == rows.div_ceil(block_rows) * columns.div_ceil(block_columns) {
                BlockGrid::new(rows, columns, block_rows, block_columns)
            } else if scale_elements == rows {
                BlockGrid::new(rows, columns, 1, columns)
            } else if scale_elements == 1 {
                BlockGrid::new(rows, columns, rows, columns)
            } else {
                return Err(RuntimeError::tensor(
                    self.shard(&scale_name),
                    &scale_name,
                    format!("has {scale_elements} scales, which fit neither {block_rows}x{block_columns} blocks, channels nor one tensor scale of a {rows}x{columns} weight"),
                ));
            };
            SourceKind::Fp8 { scale_name, grid }
        } else {
            SourceKind::Plain
        };
        let item = SourceItem { name: name.to_string(), dtype: tensor.dtype, shape, kind };
        let data = RowReader::new(self.checkpoint, &item)?.read_all();
        self.checked(name, Matrix::new(rows, columns, data), expected)
    }

    /// The packed words and BF16 scale bits of INT4 module `module` as stored.
    fn int4_weight(&self, module: &str, group_size: usize) -> Result<Int4Weight, RuntimeError> {
        let bytes = |suffix: &str| {
            let name = format!("{module}.{suffix}");
            self.checkpoint.get(&name).map(|t| t.bytes).ok_or_else(|| {
                RuntimeError::tensor(self.shard(&name), &name, "is missing next to its INT4 `weight_packed`")
            })
        };
        let packed =
            bytes("weight_packed")?.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let scales = bytes("weight_scale")?.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        Ok(Int4Weight { packed, scales, group_size })
    }

    /// A 1-D tensor (norm weight, bias) of `length` values.
    pub fn vector(&self, name: &str, length: usize) -> Result<Vec<f32>, RuntimeError> {
        Ok(self.matrix(name, [1, length])?.data)
    }

    fn checked(&self, name: &str, matrix: Matrix, expected: [usize; 2]) -> Result<Matrix, RuntimeError> {
        if [matrix.rows, matrix.columns] != expected {
            return Err(RuntimeError::tensor(
                self.shard(name),
                name,
                format!("has shape [{}, {}] but config.json implies {expected:?}; the config does not belong to these weights", matrix.rows, matrix.columns),
            ));
        }
        if let Some(position) = matrix.data.iter().position(|v| !v.is_finite()) {
            return Err(RuntimeError::tensor(
                self.shard(name),
                name,
                format!("element {position} dequantizes to {}; the checkpoint is corrupt", matrix.data[position]),
            ));
        }
        Ok(matrix)
    }

    /// Row `row` of an embedding-like 2-D tensor (BF16/F16/F32/FP8) of width `columns`.
    pub fn rows(&self, name: &str, columns: usize, rows: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        let tensor = self
            .checkpoint
            .get(name)
            .ok_or_else(|| RuntimeError::tensor(self.checkpoint.dir(), name, "is missing from the checkpoint"))?;
        if tensor.shape.len() != 2 || tensor.shape[1] != columns {
            return Err(RuntimeError::tensor(
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
                Ok(matrix) => prop_assert_eq!(matrix.data.len(), expected[0] * expected[1]),
                Err(error) => prop_assert!(error.to_string().contains("m.weight"), "{}", error),
            }
        }
    }

    #[test]
    fn a_consistent_module_reads() {
        let dir = int4_folder([3, 2], [3, 1], [3, 16], 16);
        let checkpoint = Checkpoint::open(dir.path()).unwrap();
        let matrix = WeightReader::new(&checkpoint).matrix("m.weight", [3, 16]).unwrap();
        assert_eq!(matrix.data.len(), 48);
        assert!(matrix.data.iter().all(|v| v.is_finite()));
    }
}

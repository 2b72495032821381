//! Block-scaled FP8 checkpoints (the vendors' releases): scale tensor naming (DeepSeek `weight_scale_inv`,
//! compressed-tensors `weight_scale`), the scale layout `quantization_config` declares or the stored scale count
//! implies, grouping a checkpoint's tensors into logical items (an FP8 weight with its scales, or a plain tensor),
//! and the row reader that decodes an item to f32.

use half::{bf16, f16};
use serde_json::Value;

use crate::io::dtype::{element_bytes, tensor_bytes, Dtype};
use crate::io::{Checkpoint, IoError};
use crate::model::{tensor_specs, ModelConfig, TensorRole};
use crate::quant::fp8_block::{dequantize_row, BlockGrid};

use super::compressed_tensors::packed_name;

/// How a source item is stored.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceKind {
    /// Block-scaled FP8 e4m3: `weight` plus an F32 scale tensor `scale_name` with one multiplier per block.
    Fp8 { scale_name: String, grid: BlockGrid },
    /// Any other tensor, used as stored.
    Plain,
}

/// One logical source tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceItem {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub kind: SourceKind,
}

impl SourceItem {
    /// Bytes the item occupies in the source (weight plus scales).
    pub fn bytes(&self) -> u64 {
        let scale_bytes = match &self.kind {
            SourceKind::Fp8 { grid, .. } => {
                let [rows, columns] = grid.scale_shape();
                tensor_bytes(Dtype::F32, &[rows, columns])
            }
            SourceKind::Plain => 0,
        };
        tensor_bytes(self.dtype, &self.shape) + scale_bytes
    }

    pub fn is_fp8(&self) -> bool {
        matches!(self.kind, SourceKind::Fp8 { .. })
    }
}

/// How FP8 scales are laid out, from `quantization_config`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ScaleLayout {
    /// DeepSeek style: `<weight>_scale_inv`, blocks of `[rows, columns]`.
    DeepseekBlock([usize; 2]),
    /// compressed-tensors `float-quantized`: `<module>.weight_scale`, by strategy.
    CompressedTensors(CtStrategy),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum CtStrategy {
    Block([usize; 2]),
    Channel,
    Tensor,
}

/// A `[rows, columns]` block shape from a JSON pair.
fn pair(value: Option<&Value>) -> Option<[usize; 2]> {
    let list = value?.as_array()?;
    Some([list.first()?.as_u64()? as usize, list.get(1)?.as_u64()? as usize])
}

/// The layout `quantization_config` declares: what `squeeze quantize` holds a source's files to.
fn scale_layout(config: Option<&Value>) -> ScaleLayout {
    let quantization = config.and_then(crate::io::composite::quantization_config);
    let method = quantization.and_then(|q| q.get("quant_method")).and_then(Value::as_str).unwrap_or("fp8");
    if method == "compressed-tensors" {
        let weights = quantization
            .and_then(|q| q.get("config_groups"))
            .and_then(Value::as_object)
            .and_then(|groups| groups.values().find_map(|group| group.get("weights")));
        let strategy = weights.and_then(|w| w.get("strategy")).and_then(Value::as_str).unwrap_or("block");
        let strategy = match strategy {
            "channel" => CtStrategy::Channel,
            "tensor" => CtStrategy::Tensor,
            _ => CtStrategy::Block(pair(weights.and_then(|w| w.get("block_structure"))).unwrap_or([128, 128])),
        };
        ScaleLayout::CompressedTensors(strategy)
    } else {
        ScaleLayout::DeepseekBlock(pair(quantization.and_then(|q| q.get("weight_block_size"))).unwrap_or([128, 128]))
    }
}

/// The scale tensor name of an FP8 weight under a layout.
fn scale_name(weight: &str, layout: ScaleLayout) -> String {
    match layout {
        ScaleLayout::DeepseekBlock(_) => format!("{weight}_scale_inv"),
        ScaleLayout::CompressedTensors(_) => format!("{}_scale", weight),
    }
}

fn is_scale_name(name: &str) -> bool {
    name.ends_with(".weight_scale_inv") || name.ends_with(".weight_scale")
}

/// Groups a checkpoint's tensors into items in file order, validating FP8 scales' presence, dtype and shape.
pub fn items_from_checkpoint(checkpoint: &Checkpoint) -> Result<Vec<SourceItem>, IoError> {
    let layout = scale_layout(checkpoint.config());
    let mut items = Vec::new();
    for name in checkpoint.names_in_file_order() {
        let shard = checkpoint.shard_of(name).map(|s| s.path().to_path_buf()).unwrap_or_default();
        let Some(tensor) = checkpoint.get(name) else { continue };
        if is_scale_name(name) {
            let weight = name.trim_end_matches("_scale_inv").trim_end_matches("_scale");
            let module = weight.trim_end_matches(".weight");
            if checkpoint.contains(&packed_name(module)) {
                // An INT4 pack-quantized module's scale: part of an already quantized output, read as stored.
                items.push(SourceItem {
                    name: name.to_string(),
                    dtype: tensor.dtype,
                    shape: tensor.shape.to_vec(),
                    kind: SourceKind::Plain,
                });
                continue;
            }
            if !checkpoint.contains(weight) {
                return Err(IoError::tensor(shard, name, format!("is a scale without its weight `{weight}`")));
            }
            continue;
        }
        let one_byte = element_bytes(tensor.dtype) == 1 && tensor.dtype != Dtype::BOOL;
        if !one_byte {
            items.push(SourceItem {
                name: name.to_string(),
                dtype: tensor.dtype,
                shape: tensor.shape.to_vec(),
                kind: SourceKind::Plain,
            });
            continue;
        }
        // A one-byte weight: FP8 e4m3 with a scale sibling.
        let scale = scale_name(name, layout);
        let Some(scale_tensor) = checkpoint.get(&scale) else {
            return Err(IoError::tensor(
                shard,
                name,
                format!("is FP8 ({}) but its scale `{scale}` is missing; the checkpoint is incomplete or its quantization_config does not match the files", tensor.dtype),
            ));
        };
        if tensor.dtype != Dtype::F8_E4M3 {
            return Err(IoError::tensor(
                shard,
                name,
                format!("has a scale but dtype {}; only F8_E4M3 FP8 weights are supported", tensor.dtype),
            ));
        }
        if tensor.shape.len() != 2 {
            return Err(IoError::tensor(
                shard,
                name,
                format!("is FP8 with shape {:?}; only 2-D weights are supported", tensor.shape),
            ));
        }
        let (rows, columns) = (tensor.shape[0], tensor.shape[1]);
        let grid = match layout {
            ScaleLayout::DeepseekBlock([br, bc]) | ScaleLayout::CompressedTensors(CtStrategy::Block([br, bc])) => {
                BlockGrid::new(rows, columns, br, bc)
            }
            ScaleLayout::CompressedTensors(CtStrategy::Channel) => BlockGrid::new(rows, columns, 1, columns),
            ScaleLayout::CompressedTensors(CtStrategy::Tensor) => BlockGrid::new(rows, columns, rows, columns),
        };
        let scale_shard = checkpoint.shard_of(&scale).map(|s| s.path().to_path_buf()).unwrap_or_default();
        if scale_tensor.dtype != Dtype::F32 && scale_tensor.dtype != Dtype::BF16 {
            return Err(IoError::tensor(
                scale_shard,
                &scale,
                format!("has dtype {}; FP8 scales must be F32 or BF16", scale_tensor.dtype),
            ));
        }
        let expected = grid.scale_shape();
        let elements: usize = scale_tensor.shape.iter().product();
        if elements != expected[0] * expected[1] || (scale_tensor.shape.len() == 2 && scale_tensor.shape != expected) {
            return Err(IoError::tensor(
                scale_shard,
                &scale,
                format!(
                    "has shape {:?} but weight {:?} with blocks {}x{} needs {:?}",
                    scale_tensor.shape, tensor.shape, grid.block_rows, grid.block_columns, expected
                ),
            ));
        }
        items.push(SourceItem {
            name: name.to_string(),
            dtype: tensor.dtype,
            shape: tensor.shape.to_vec(),
            kind: SourceKind::Fp8 { scale_name: scale, grid },
        });
    }
    Ok(items)
}

/// Reads an FP8 item's scales as f32 (F32 or BF16 on disk).
pub fn read_scales(checkpoint: &Checkpoint, scale_name: &str) -> Option<Vec<f32>> {
    let tensor = checkpoint.get(scale_name)?;
    Some(match tensor.dtype {
        Dtype::BF16 => tensor.bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        _ => tensor.bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
    })
}

/// Checks every FP8 scale is finite and positive; names the first bad one.
pub fn validate_scales(checkpoint: &Checkpoint, items: &[SourceItem]) -> Result<(), IoError> {
    use rayon::prelude::*;
    items.par_iter().try_for_each(|item| {
        let SourceKind::Fp8 { scale_name, .. } = &item.kind else { return Ok(()) };
        let scales = read_scales(checkpoint, scale_name).unwrap_or_default();
        if let Some((index, bad)) = scales.iter().enumerate().find(|(_, s)| !(s.is_finite() && **s > 0.0)) {
            let shard = checkpoint.shard_of(scale_name).map(|s| s.path().to_path_buf()).unwrap_or_default();
            return Err(IoError::tensor(
                shard,
                scale_name,
                format!(
                    "block {index} has scale {bad}; FP8 scales must be finite and positive, the checkpoint is corrupt"
                ),
            ));
        }
        Ok(())
    })
}

/// The items a vendor FP8 release of `config` holds (for `report` from a config alone).
pub fn items_from_config(config: &ModelConfig) -> Vec<SourceItem> {
    let block = config.weight_block_size.unwrap_or([128, 128]);
    tensor_specs(config)
        .into_iter()
        .map(|spec| {
            let (dtype, kind) = match spec.role {
                TensorRole::Linear => {
                    let grid = BlockGrid::new(spec.shape[0], spec.shape[1], block[0], block[1]);
                    let scale_name = scale_name(&spec.name, ScaleLayout::DeepseekBlock(block));
                    (Dtype::F8_E4M3, SourceKind::Fp8 { scale_name, grid })
                }
                TensorRole::RouterBias => (Dtype::F32, SourceKind::Plain),
                _ => (Dtype::BF16, SourceKind::Plain),
            };
            SourceItem { name: spec.name, dtype, shape: spec.shape, kind }
        })
        .collect()
}

/// The FP8 block shape a config declares, as [`stored_item`] takes it: DeepSeek `weight_block_size`, else the first
/// compressed-tensors group with a `block_structure`, else 128×128.
pub fn declared_block(config: Option<&Value>) -> [usize; 2] {
    let quantization = config.and_then(crate::io::composite::quantization_config);
    let block_structure = quantization
        .and_then(|q| q.get("config_groups"))
        .and_then(Value::as_object)
        .and_then(|groups| groups.values().find_map(|group| pair(group.get("weights")?.get("block_structure"))));
    pair(quantization.and_then(|q| q.get("weight_block_size"))).or(block_structure).unwrap_or([128, 128])
}

/// The item of weight `name` as stored, whatever `quantization_config` says (the runtime reads sources and outputs
/// alike): an F8_E4M3 tensor takes `<name>_scale_inv` or `<module>.weight_scale`, its grid inferred from the scale
/// count — blocks of `block`, one scale per row, or one for the tensor; any other tensor is plain.
pub fn stored_item(checkpoint: &Checkpoint, name: &str, block: [usize; 2]) -> Result<SourceItem, IoError> {
    let shard = |name: &str| {
        checkpoint.shard_of(name).map(|s| s.path().to_path_buf()).unwrap_or_else(|| checkpoint.dir().to_path_buf())
    };
    let module = name.strip_suffix(".weight").unwrap_or(name);
    let tensor = checkpoint
        .get(name)
        .ok_or_else(|| IoError::tensor(checkpoint.dir(), name, "is missing from the checkpoint"))?;
    let shape = tensor.shape.to_vec();
    let (rows, columns) = match shape.as_slice() {
        [rows, columns] => (*rows, *columns),
        other => (1, other.iter().product()),
    };
    let kind = if tensor.dtype == Dtype::F8_E4M3 {
        let candidates = [format!("{name}_scale_inv"), format!("{module}.weight_scale")];
        let scale_name =
            candidates.iter().find(|candidate| checkpoint.contains(candidate)).cloned().ok_or_else(|| {
                IoError::tensor(shard(name), name, "is FP8 but has neither `weight_scale_inv` nor `weight_scale`")
            })?;
        let scale_elements: usize = checkpoint.get(&scale_name).map(|s| s.shape.iter().product()).unwrap_or(0);
        let [block_rows, block_columns] = block;
        let grid = if scale_elements == rows.div_ceil(block_rows) * columns.div_ceil(block_columns) {
            BlockGrid::new(rows, columns, block_rows, block_columns)
        } else if scale_elements == rows {
            BlockGrid::new(rows, columns, 1, columns)
        } else if scale_elements == 1 {
            BlockGrid::new(rows, columns, rows, columns)
        } else {
            return Err(IoError::tensor(
                shard(&scale_name),
                &scale_name,
                format!("has {scale_elements} scales, which fit neither {block_rows}x{block_columns} blocks, channels nor one tensor scale of a {rows}x{columns} weight"),
            ));
        };
        SourceKind::Fp8 { scale_name, grid }
    } else {
        SourceKind::Plain
    };
    Ok(SourceItem { name: name.to_string(), dtype: tensor.dtype, shape, kind })
}

/// Decodes row `row` of a source weight into f32.
pub struct RowReader<'a> {
    bytes: &'a [u8],
    dtype: Dtype,
    pub rows: usize,
    pub columns: usize,
    fp8: Option<(BlockGrid, Vec<f32>)>,
}

impl<'a> RowReader<'a> {
    /// A reader over a 2-D item (1-D items read as a single row).
    pub fn new(checkpoint: &'a Checkpoint, item: &SourceItem) -> Result<Self, IoError> {
        let shard = checkpoint.shard_of(&item.name).map(|s| s.path().to_path_buf()).unwrap_or_default();
        let tensor = checkpoint
            .get(&item.name)
            .ok_or_else(|| IoError::tensor(&shard, &item.name, "is missing from the checkpoint"))?;
        let fp8 = match &item.kind {
            SourceKind::Fp8 { scale_name, grid } => {
                let scales = read_scales(checkpoint, scale_name)
                    .ok_or_else(|| IoError::tensor(&shard, scale_name, "scale tensor missing"))?;
                Some((*grid, scales))
            }
            SourceKind::Plain => None,
        };
        let (rows, columns) = match item.shape.as_slice() {
            [rows, columns] => (*rows, *columns),
            other => (1, other.iter().product()),
        };
        if fp8.is_none() && !matches!(tensor.dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32) {
            return Err(IoError::tensor(
                shard,
                &item.name,
                format!("has dtype {}, which has no float value", tensor.dtype),
            ));
        }
        Ok(Self { bytes: tensor.bytes, dtype: tensor.dtype, rows, columns, fp8 })
    }

    /// A block-FP8 tensor's codes `[rows, columns]`, block grid and block multipliers, as stored.
    pub fn fp8_parts(&self) -> Option<(&'a [u8], BlockGrid, &[f32])> {
        self.fp8.as_ref().map(|(grid, scales)| (&self.bytes[..self.rows * self.columns], *grid, scales.as_slice()))
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
        match (&self.fp8, self.dtype) {
            (Some((grid, scales)), _) => dequantize_row(grid, row, &self.bytes[row * width..][..width], scales, out),
            (None, Dtype::BF16) => {
                for (value, b) in out.iter_mut().zip(self.bytes[row * width * 2..][..width * 2].chunks_exact(2)) {
                    *value = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            (None, Dtype::F16) => {
                for (value, b) in out.iter_mut().zip(self.bytes[row * width * 2..][..width * 2].chunks_exact(2)) {
                    *value = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            (None, _) => {
                for (value, b) in out.iter_mut().zip(self.bytes[row * width * 4..][..width * 4].chunks_exact(4)) {
                    *value = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
    }
}

//! The vendors' releases as sources, grouped into logical items: an FP8 weight with its block scales (scale tensor
//! naming — DeepSeek `weight_scale_inv` or V4's E8M0 `scale`, compressed-tensors `weight_scale` — and the layout
//! `quantization_config` declares or the stored scale count implies), a natively INT4 `pack-quantized` module (Kimi
//! K2.5/K2.6/K2.7), an MXFP4 module ([`super::mxfp4_source`]: Kimi K3, DeepSeek-V4), or a plain tensor. Items are
//! decoded to f32 by [`super::row_reader`].

use std::path::Path;

use half::bf16;
use serde_json::Value;

use crate::io::dtype::{element_bytes, tensor_bytes, Dtype};
use crate::io::{Checkpoint, IoError, TensorRef};
use crate::model::{tensor_specs, ModelConfig, TensorRole};
use crate::quant::fp8_block::BlockGrid;

use super::compressed_tensors::{
    check_int4_conventions, int4_group_size, int4_tensors, packed_name, read_shape, Int4Args,
};
use super::compressed_tensors::{scale_name as int4_scale_name, shape_name};
use super::mxfp4_source::{first_nan_exponent, is_e8m0, mxfp4_shape, nan_exponent_error, Mxfp4Naming};
use crate::quant::fp4::{self as fp4, MXFP4_GROUP};

/// How a source item is stored.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceKind {
    /// Block-scaled FP8 e4m3: `weight` plus an F32 scale tensor `scale_name` with one multiplier per block.
    Fp8 { scale_name: String, grid: BlockGrid },
    /// A compressed-tensors `pack-quantized` INT4 module (`weight_packed` I32, `weight_scale` BF16 per group of
    /// `group_size`, `weight_shape`), conventions checked. The item is named `<module>.weight`, which is not
    /// stored, and has the weight's `[out, in]` shape.
    Int4 { group_size: usize },
    /// An MXFP4 module (E2M1 codes, an E8M0 scale per 32) as the FP4-native releases ship it
    /// ([`super::mxfp4_source`]). Named `<module>.weight`, of the weight's logical `[out, in]` shape.
    Mxfp4 { naming: Mxfp4Naming, packed: Dtype, scales: Dtype },
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
        match &self.kind {
            SourceKind::Fp8 { grid, .. } => {
                let [rows, columns] = grid.scale_shape();
                tensor_bytes(self.dtype, &self.shape) + tensor_bytes(Dtype::F32, &[rows, columns])
            }
            SourceKind::Int4 { group_size } => int4_tensors(self.module(), self.shape[0], self.shape[1], *group_size)
                .iter()
                .map(|tensor| tensor.bytes())
                .sum(),
            SourceKind::Mxfp4 { .. } => {
                let elements = self.shape.iter().product::<usize>() as u64;
                elements / 2 + elements / MXFP4_GROUP as u64
            }
            SourceKind::Plain => tensor_bytes(self.dtype, &self.shape),
        }
    }

    pub fn is_fp8(&self) -> bool {
        matches!(self.kind, SourceKind::Fp8 { .. })
    }

    /// The module name (`….down_proj`) of a weight, the tensor name otherwise.
    pub fn module(&self) -> &str {
        self.name.strip_suffix(".weight").unwrap_or(&self.name)
    }

    /// The stored tensors that make up the item, in the order they are written when copied.
    pub fn stored_names(&self) -> Vec<String> {
        match &self.kind {
            SourceKind::Fp8 { scale_name, .. } => vec![self.name.clone(), scale_name.clone()],
            SourceKind::Int4 { .. } => {
                let module = self.module();
                vec![packed_name(module), int4_scale_name(module), shape_name(module)]
            }
            SourceKind::Mxfp4 { naming, .. } => naming.stored_names(self.module()).to_vec(),
            SourceKind::Plain => vec![self.name.clone()],
        }
    }
}

/// The INT4 item of `pack-quantized` module `module`, its conventions checked: in groups of `declared` (the
/// config's), else of the size its scale count implies.
pub fn int4_item(checkpoint: &Checkpoint, module: &str, declared: Option<usize>) -> Result<SourceItem, IoError> {
    let packed = packed_name(module);
    let shard =
        checkpoint.shard_of(&packed).map(|s| s.path().to_path_buf()).unwrap_or_else(|| checkpoint.dir().to_path_buf());
    let invalid = |problem: String| {
        let (name, problem) = problem.split_once(": ").unwrap_or((&packed, &problem));
        IoError::tensor(&shard, name, problem.to_string())
    };
    let shape =
        checkpoint.get(&shape_name(module)).ok_or_else(|| invalid(format!("{}: missing", shape_name(module))))?;
    let [rows, columns] = read_shape(&shape).ok_or_else(|| {
        invalid(format!("{}: must be I32 or I64 [2], got {} {:?}", shape_name(module), shape.dtype, shape.shape))
    })?;
    let scale_columns = checkpoint.get(&int4_scale_name(module)).and_then(|scale| scale.shape.get(1).copied());
    let group_size = match (declared, scale_columns) {
        (Some(group), _) => group,
        (None, Some(groups)) if groups > 0 && columns.is_multiple_of(groups) => columns / groups,
        _ => {
            return Err(invalid(format!(
                "{}: no INT4 group size in quantization_config and none implied by the scales of a [{rows}, \
                 {columns}] weight; the config's compressed-tensors group is missing",
                int4_scale_name(module)
            )))
        }
    };
    let layout = check_int4_conventions(checkpoint, module, Some(&Int4Args::group(group_size))).map_err(invalid)?;
    // The requantizing reader decodes squeeze's own layout (BF16 scales, symmetric, columns in order); `eval` and
    // `verify` read the others.
    let scale_dtype = checkpoint.get(&int4_scale_name(module)).map(|scale| scale.dtype);
    if scale_dtype != Some(Dtype::BF16) || layout.zero_points.is_some() || layout.g_idx.is_some() {
        return Err(invalid(format!(
            "{}: quantize reads INT4 sources with BF16 scales, symmetric and without g_idx (got {}{}{}); squeeze \
             eval and verify read this folder",
            int4_scale_name(module),
            scale_dtype.map_or("no scale".to_string(), |dtype| dtype.to_string()),
            if layout.zero_points.is_some() { ", zero points" } else { "" },
            if layout.g_idx.is_some() { ", g_idx" } else { "" },
        )));
    }
    Ok(SourceItem {
        name: format!("{module}.weight"),
        dtype: Dtype::I32,
        shape: vec![rows, columns],
        kind: SourceKind::Int4 { group_size },
    })
}

/// The MXFP4 item of `module` stored as `naming`, its conventions checked ([`mxfp4_shape`]).
pub fn mxfp4_item(checkpoint: &Checkpoint, module: &str, naming: Mxfp4Naming) -> Result<SourceItem, IoError> {
    let shape = mxfp4_shape(checkpoint, module, naming)?;
    let [packed, scales] = naming.stored_names(module).map(|name| checkpoint.get(&name).map_or(Dtype::U8, |t| t.dtype));
    Ok(SourceItem {
        name: format!("{module}.weight"),
        dtype: Dtype::U8,
        shape: shape.to_vec(),
        kind: SourceKind::Mxfp4 { naming, packed, scales },
    })
}

/// The MXFP4 naming of a stored tensor, if it is an MXFP4 module's codes: a U8 `weight_packed` whose
/// `weight_scale` holds E8M0 bytes (NVFP4's are F8_E4M3), or a one-byte or F4 `weight` with a DeepSeek `scale`
/// sibling holding E8M0 bytes (an FP8 weight's codes are F8_E4M3).
fn mxfp4_naming(checkpoint: &Checkpoint, name: &str, dtype: Dtype) -> Option<(String, Mxfp4Naming)> {
    let e8m0 = |scale: String| checkpoint.get(&scale).is_some_and(|scale| is_e8m0(scale.dtype));
    if let Some(module) = name.strip_suffix(".weight_packed") {
        return (dtype == Dtype::U8 && e8m0(format!("{module}.weight_scale")))
            .then(|| (module.to_string(), Mxfp4Naming::CompressedTensors));
    }
    let module = name.strip_suffix(".weight")?;
    (matches!(dtype, Dtype::I8 | Dtype::U8 | Dtype::F4) && e8m0(format!("{module}.scale")))
        .then(|| (module.to_string(), Mxfp4Naming::Deepseek))
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

/// The weight a scale tensor belongs to: `X.weight` of `X.weight_scale_inv`, `X.weight_scale` or DeepSeek's
/// `X.scale`.
fn scaled_weight(name: &str) -> Option<String> {
    if is_scale_name(name) {
        return Some(name.trim_end_matches("_scale_inv").trim_end_matches("_scale").to_string());
    }
    name.strip_suffix(".scale").map(|module| format!("{module}.weight"))
}

/// Groups a checkpoint's tensors into items in file order, validating FP8 scales' presence, dtype and shape.
pub fn items_from_checkpoint(checkpoint: &Checkpoint) -> Result<Vec<SourceItem>, IoError> {
    let layout = scale_layout(checkpoint.config());
    let int4_group = int4_group_size(checkpoint.config());
    let mut items = Vec::new();
    for name in checkpoint.names_in_file_order() {
        let shard = checkpoint.shard_of(name).map(|s| s.path().to_path_buf()).unwrap_or_default();
        let Some(tensor) = checkpoint.get(name) else { continue };
        // An MXFP4 module is one item at its codes; its scales belong to it.
        if let Some((module, naming)) = mxfp4_naming(checkpoint, name, tensor.dtype) {
            items.push(mxfp4_item(checkpoint, &module, naming)?);
            continue;
        }
        // An INT4 `pack-quantized` module is one item at its `weight_packed`; its scale and shape belong to it.
        if let Some(module) = name.strip_suffix(".weight_packed") {
            if tensor.dtype != Dtype::I32 {
                return Err(IoError::tensor(
                    shard,
                    name,
                    format!(
                        "is {} (an NVFP4 module, or none compressed-tensors writes): quantize converts FP8, BF16, \
                         MXFP4 and INT4 pack-quantized sources",
                        tensor.dtype
                    ),
                ));
            }
            items.push(int4_item(checkpoint, module, int4_group)?);
            continue;
        }
        let module_of_metadata = name.strip_suffix(".weight_shape").or_else(|| name.strip_suffix(".weight_scale"));
        if module_of_metadata.is_some_and(|module| checkpoint.contains(&packed_name(module))) {
            continue;
        }
        if let Some(weight) = scaled_weight(name) {
            if checkpoint.contains(&weight) {
                continue;
            }
            if is_scale_name(name) {
                return Err(IoError::tensor(shard, name, format!("is a scale without its weight `{weight}`")));
            }
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
        items.push(fp8_item(checkpoint, name, &tensor, &shard, layout)?);
    }
    Ok(items)
}

/// A one-byte weight as an FP8 item: e4m3 with a scale sibling (the declared name, or DeepSeek-V4's `.scale`) of a
/// dtype and shape that fit the declared block layout.
fn fp8_item(
    checkpoint: &Checkpoint,
    name: &str,
    tensor: &TensorRef,
    shard: &Path,
    layout: ScaleLayout,
) -> Result<SourceItem, IoError> {
    let declared = scale_name(name, layout);
    let deepseek = name.strip_suffix(".weight").map(|module| format!("{module}.scale"));
    let scale = match deepseek {
        Some(deepseek) if !checkpoint.contains(&declared) && checkpoint.contains(&deepseek) => deepseek,
        _ => declared,
    };
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
    if !matches!(scale_tensor.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F8_E8M0) {
        return Err(IoError::tensor(
            scale_shard,
            &scale,
            format!("has dtype {}; FP8 scales must be F32, BF16 or E8M0 (F8_E8M0)", scale_tensor.dtype),
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
    Ok(SourceItem {
        name: name.to_string(),
        dtype: tensor.dtype,
        shape: tensor.shape.to_vec(),
        kind: SourceKind::Fp8 { scale_name: scale, grid },
    })
}

/// Reads an FP8 item's scales as f32 (F32 or BF16 on disk).
pub fn read_scales(checkpoint: &Checkpoint, scale_name: &str) -> Option<Vec<f32>> {
    let tensor = checkpoint.get(scale_name)?;
    Some(match tensor.dtype {
        Dtype::BF16 => tensor.bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        // E8M0: 2^(e − 127), exactly (255, NaN, comes back infinite and is refused by `validate_scales`).
        Dtype::F8_E8M0 | Dtype::U8 => tensor.bytes.iter().map(|&e| fp4::mxfp4_scale(e)).collect(),
        _ => tensor.bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
    })
}

/// Checks every FP8 scale is finite and positive; names the first bad one.
pub fn validate_scales(checkpoint: &Checkpoint, items: &[SourceItem]) -> Result<(), IoError> {
    use rayon::prelude::*;
    items.par_iter().try_for_each(|item| {
        if let SourceKind::Mxfp4 { naming, .. } = &item.kind {
            let [_, scale_name] = naming.stored_names(item.module());
            let exponents = checkpoint.get(&scale_name).map_or(&[][..], |scale| scale.bytes);
            return match first_nan_exponent(exponents, item.shape[1] / MXFP4_GROUP) {
                Some(at) => Err(nan_exponent_error(checkpoint, &scale_name, at)),
                None => Ok(()),
            };
        }
        let SourceKind::Fp8 { scale_name, .. } = &item.kind else { return Ok(()) };
        if checkpoint.get(scale_name).is_some_and(|scale| is_e8m0(scale.dtype)) {
            let exponents = checkpoint.get(scale_name).map_or(&[][..], |scale| scale.bytes);
            let columns = checkpoint.get(scale_name).and_then(|scale| scale.shape.last().copied()).unwrap_or(1);
            if let Some(at) = first_nan_exponent(exponents, columns) {
                return Err(nan_exponent_error(checkpoint, scale_name, at));
            }
        }
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

/// The items a vendor release of `config` holds (for `report` from a config alone): linears block FP8 (DeepSeek-V4's
/// E8M0 scales counted as F32), MXFP4 experts in their release's naming, the other tensors BF16, F32 or I32.
pub fn items_from_config(config: &ModelConfig) -> Vec<SourceItem> {
    let block = config.weight_block_size.unwrap_or([128, 128]);
    let (naming, packed, scales) = match config.architecture {
        crate::model::Architecture::DeepseekV4 => (Mxfp4Naming::Deepseek, Dtype::I8, Dtype::F8_E8M0),
        _ => (Mxfp4Naming::CompressedTensors, Dtype::U8, Dtype::U8),
    };
    tensor_specs(config)
        .into_iter()
        .map(|spec| {
            let (dtype, kind) = match spec.role {
                TensorRole::Linear => {
                    let grid = BlockGrid::new(spec.shape[0], spec.shape[1], block[0], block[1]);
                    let scale_name = scale_name(&spec.name, ScaleLayout::DeepseekBlock(block));
                    (Dtype::F8_E4M3, SourceKind::Fp8 { scale_name, grid })
                }
                TensorRole::ExpertMxfp4 => (Dtype::U8, SourceKind::Mxfp4 { naming, packed, scales }),
                TensorRole::RouterBias | TensorRole::Float32 => (Dtype::F32, SourceKind::Plain),
                TensorRole::TokenTable => (Dtype::I32, SourceKind::Plain),
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
/// alike): an INT4 `pack-quantized` module stands for its `.weight`; an F8_E4M3 tensor takes `<name>_scale_inv` or `<module>.weight_scale`, its grid inferred from the scale
/// count — blocks of `block`, one scale per row, or one for the tensor; any other tensor is plain.
pub fn stored_item(checkpoint: &Checkpoint, name: &str, block: [usize; 2]) -> Result<SourceItem, IoError> {
    let shard = |name: &str| {
        checkpoint.shard_of(name).map(|s| s.path().to_path_buf()).unwrap_or_else(|| checkpoint.dir().to_path_buf())
    };
    let module = name.strip_suffix(".weight").unwrap_or(name);
    for stored in [packed_name(module), name.to_string()] {
        if let Some((module, naming)) = checkpoint.get(&stored).and_then(|t| mxfp4_naming(checkpoint, &stored, t.dtype))
        {
            return mxfp4_item(checkpoint, &module, naming);
        }
    }
    if !checkpoint.contains(name) && checkpoint.contains(&packed_name(module)) {
        return int4_item(checkpoint, module, int4_group_size(checkpoint.config()));
    }
    let tensor = checkpoint
        .get(name)
        .ok_or_else(|| IoError::tensor(checkpoint.dir(), name, "is missing from the checkpoint"))?;
    let shape = tensor.shape.to_vec();
    let (rows, columns) = match shape.as_slice() {
        [rows, columns] => (*rows, *columns),
        other => (1, other.iter().product()),
    };
    let kind = if tensor.dtype == Dtype::F8_E4M3 {
        let candidates = [format!("{name}_scale_inv"), format!("{module}.weight_scale"), format!("{module}.scale")];
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

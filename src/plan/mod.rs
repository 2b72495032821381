//! The conversion plan: for every source item the action the recipe gives it, the output tensors it produces
//! (names, dtypes, shapes: the one source of output sizes) and the shard it lands in.
//!
//! Shared by the jobs that convert (`quantize`) and that size a conversion (`report`): the source opened and
//! planned ([`prepare`], its shapes checked against the config by [`crate::load::validate::check_source`]), the
//! per-item transform that computes an item's output bytes ([`transform`]), and what a calibrated method hands that
//! transform ([`calibration`], with GPTQ's quantized experts kept on disk: [`expert_spill`]).

pub mod calibration;
pub mod expert_spill;
pub mod prepare;
pub mod transform;

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::format::compressed_tensors::{fp4_tensors, fp8_block_tensors, int4_tensors, Fp4Kind};
use crate::format::vendor_source::{SourceItem, SourceKind};
use crate::io::dtype::Dtype;
use crate::io::writer::{file_bytes, PlannedTensor};
use crate::model::tensor_class::is_routed_expert;
use crate::model::TensorClass;
use crate::quant::fp4::MXFP4_GROUP;
use crate::quant::ScaleRule;
use crate::recipe::{MtpExperts, Recipe, Scheme, Unselected};

/// What is done to one source item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "scheme", rename_all = "kebab-case")]
pub enum Action {
    /// compressed-tensors `pack-quantized` INT4; with `fp8_activations`, declared W4A8 (FP8 per-token dynamic
    /// activations: the same tensors, another kernel).
    Int4 {
        group_size: usize,
        scale_rule: ScaleRule,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        fp8_activations: bool,
    },
    /// compressed-tensors `nvfp4-pack-quantized` or `mxfp4-pack-quantized`; with `fp4_activations` (NVFP4 only),
    /// declared W4A4 with a calibrated `input_global_scale`.
    Fp4 {
        kind: Fp4Kind,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        fp4_activations: bool,
    },
    /// FP8 dequantized to BF16.
    Bf16,
    /// FP8 kept, scale renamed to `weight_scale` (compressed-tensors `float-quantized`).
    Fp8Block,
    /// Copied byte for byte.
    Copy,
}

impl Action {
    pub fn name(&self) -> &'static str {
        match self {
            Action::Int4 { fp8_activations: false, .. } => "int4",
            Action::Int4 { fp8_activations: true, .. } => "w4a8-fp8",
            Action::Fp4 { fp4_activations: true, .. } => "nvfp4-w4a4",
            Action::Fp4 { kind, .. } => kind.name(),
            Action::Bf16 => "bf16",
            Action::Fp8Block => "fp8-block",
            Action::Copy => "copy",
        }
    }
}

#[derive(Debug, Clone)]
pub struct PlannedItem {
    pub source: SourceItem,
    pub class: TensorClass,
    pub action: Action,
    pub outputs: Vec<PlannedTensor>,
    pub shard: usize,
}

impl PlannedItem {
    pub fn bytes_out(&self) -> u64 {
        self.outputs.iter().map(PlannedTensor::bytes).sum()
    }

    /// The module name (`….down_proj`) for weights, the tensor name otherwise.
    pub fn module(&self) -> &str {
        self.source.module()
    }

    /// Whether it converts a natively INT4 source module into another 4-bit format: NVFP4, MXFP4 or W4A8 (an INT4
    /// source planned as INT4 W4A16 or copied stays what it is).
    pub fn requantizes_int4(&self) -> bool {
        matches!(self.source.kind, SourceKind::Int4 { .. })
            && matches!(self.action, Action::Fp4 { .. } | Action::Int4 { fp8_activations: true, .. })
    }

    /// Whether it converts a natively 4-bit source module (INT4, or MXFP4 cast to NVFP4 or converted to INT4) into
    /// another 4-bit format, whose weight error `report` estimates; MXFP4 kept MXFP4 is its bytes.
    pub fn requantizes_source(&self) -> bool {
        self.requantizes_int4()
            || matches!(self.source.kind, SourceKind::Mxfp4 { .. })
                && matches!(self.action, Action::Int4 { .. } | Action::Fp4 { kind: Fp4Kind::Nvfp4, .. })
    }

    /// The group size of a natively 4-bit source module (INT4's, or MXFP4's 32).
    pub fn source_group_size(&self) -> Option<usize> {
        match self.source.kind {
            SourceKind::Int4 { group_size } => Some(group_size),
            SourceKind::Mxfp4 { .. } => Some(MXFP4_GROUP),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct PlannedShard {
    pub file: String,
    pub tensors: Vec<PlannedTensor>,
    pub bytes: u64,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub items: Vec<PlannedItem>,
    pub shards: Vec<PlannedShard>,
    /// The source model's decoder layers, when its config says.
    pub num_hidden_layers: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("tensor `{tensor}` {shape:?}: {problem}")]
    Tensor { tensor: String, shape: Vec<usize>, problem: String },
}

/// Output tensors of one item under an action.
pub fn outputs_for(item: &SourceItem, action: Action) -> Vec<PlannedTensor> {
    let module = item.name.strip_suffix(".weight").unwrap_or(&item.name);
    match action {
        Action::Int4 { group_size, .. } => int4_tensors(module, item.shape[0], item.shape[1], group_size),
        Action::Fp4 { kind, fp4_activations } => {
            fp4_tensors(module, item.shape[0], item.shape[1], kind, fp4_activations)
        }
        Action::Bf16 => vec![PlannedTensor::new(item.name.clone(), Dtype::BF16, item.shape.clone())],
        Action::Fp8Block => {
            let SourceKind::Fp8 { grid, .. } = &item.kind else {
                unreachable!("fp8-block is only planned for FP8 items")
            };
            fp8_block_tensors(&item.name, module, &item.shape, grid.scale_shape())
        }
        Action::Copy => match item.kind {
            SourceKind::Int4 { group_size } => int4_tensors(module, item.shape[0], item.shape[1], group_size),
            SourceKind::Mxfp4 { naming, packed, scales } => {
                let [rows, columns] = [item.shape[0], item.shape[1]];
                let [packed_name, scale_name] = naming.stored_names(module);
                let packed_columns = if packed == Dtype::F4 { columns } else { columns / 2 };
                vec![
                    PlannedTensor::new(packed_name, packed, vec![rows, packed_columns]),
                    PlannedTensor::new(scale_name, scales, vec![rows, columns / MXFP4_GROUP]),
                ]
            }
            _ => vec![PlannedTensor::new(item.name.clone(), item.dtype, item.shape.clone())],
        },
    }
}

/// Chooses the action for one item.
pub fn action_for(item: &SourceItem, recipe: &Recipe, class: TensorClass) -> Result<Action, PlanError> {
    let error = |problem: String| PlanError::Tensor { tensor: item.name.clone(), shape: item.shape.clone(), problem };
    let mtp_kept = recipe.file.mtp == MtpExperts::Bf16
        && class == TensorClass::Mtp
        && item.name.strip_suffix(".weight").is_some_and(is_routed_expert);
    if let Some(rule) = recipe.rule_for(&item.name).filter(|_| !mtp_kept) {
        if class == TensorClass::Vision {
            return Err(error(format!(
                "recipe rule `{}` selects it, but it belongs to the vision tower or projector, which vLLM and SGLang \
                 build without a quantization config (vLLM kimi_k25.py / models/kimi_k3 `_maybe_ignore_quant_config`): \
                 narrow the rule's `match` to the text model, or add the tower's prefix to the recipe's `keep`",
                rule.name
            )));
        }
        let float = matches!(item.dtype, Dtype::F8_E4M3 | Dtype::BF16 | Dtype::F16 | Dtype::F32)
            || matches!(item.kind, SourceKind::Int4 { .. } | SourceKind::Mxfp4 { .. });
        if item.shape.len() != 2 || !float {
            return Err(error(format!(
                "recipe rule `{}` selects it, but {} needs a 2-D float weight (got {})",
                rule.name,
                rule.scheme.name(),
                item.dtype
            )));
        }
        if !item.shape[1].is_multiple_of(rule.group_size) {
            return Err(error(match rule.scheme.fixed_group() {
                Some(group) => format!(
                    "rule `{}`: {}'s group of {group} does not divide the row length {}; the engines take no other \
                     group for it, so these weights cannot be {}: keep them out of the rule or use an int4 recipe",
                    rule.name,
                    rule.scheme.name(),
                    item.shape[1],
                    rule.scheme.name()
                ),
                None => format!(
                    "rule `{}`: group size {} does not divide the row length {}; choose a divisor with --group-size",
                    rule.name, rule.group_size, item.shape[1]
                ),
            }));
        }
        if let Some(kind) = rule.scheme.fp4_kind() {
            return Ok(Action::Fp4 { kind, fp4_activations: rule.scheme == Scheme::Nvfp4W4a4 });
        }
        return Ok(Action::Int4 {
            group_size: rule.group_size,
            scale_rule: rule.scale_rule,
            fp8_activations: rule.scheme == Scheme::W4a8Fp8,
        });
    }
    Ok(match (&item.kind, recipe.file.unselected) {
        (SourceKind::Fp8 { .. }, Unselected::Bf16) => Action::Bf16,
        (SourceKind::Fp8 { .. }, Unselected::Fp8Block) => Action::Fp8Block,
        (SourceKind::Int4 { .. } | SourceKind::Mxfp4 { .. } | SourceKind::Plain, _) => Action::Copy,
    })
}

/// Builds the plan: actions, outputs and shards of at most `max_shard_bytes` (a single larger item gets its own).
pub fn build(
    items: Vec<SourceItem>,
    recipe: &Recipe,
    num_hidden_layers: Option<usize>,
    max_shard_bytes: u64,
) -> Result<Plan, PlanError> {
    let mut planned = Vec::with_capacity(items.len());
    let mut shard_contents: Vec<Vec<PlannedTensor>> = vec![Vec::new()];
    let mut shard_bytes = 0u64;
    for source in items {
        let class = TensorClass::of(&source.name, num_hidden_layers);
        let action = action_for(&source, recipe, class)?;
        let outputs = outputs_for(&source, action);
        let bytes: u64 = outputs.iter().map(PlannedTensor::bytes).sum();
        if shard_bytes > 0 && shard_bytes + bytes > max_shard_bytes {
            shard_contents.push(Vec::new());
            shard_bytes = 0;
        }
        shard_bytes += bytes;
        let shard = shard_contents.len() - 1;
        shard_contents[shard].extend(outputs.iter().cloned());
        planned.push(PlannedItem { source, class, action, outputs, shard });
    }
    let count = shard_contents.len();
    let shards = shard_contents
        .into_iter()
        .enumerate()
        .map(|(index, tensors)| PlannedShard {
            file: format!("model-{:05}-of-{:05}.safetensors", index + 1, count),
            bytes: file_bytes(&tensors),
            tensors,
        })
        .collect();
    Ok(Plan { items: planned, shards, num_hidden_layers })
}

/// Bytes and counts per tensor class, before and after.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ClassSummary {
    pub tensors: usize,
    pub parameters: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Actions used in this class with their counts, e.g. `{"int4": 768}`.
    pub schemes: BTreeMap<String, usize>,
}

impl Plan {
    /// `(layer, expert, projection)` of a routed expert's tensor `name`, the draft layers' included
    /// ([`calibration::routed_expert_in`]).
    pub fn routed_expert(&self, name: &str) -> Option<(usize, usize, &'static str)> {
        calibration::routed_expert_in(name, self.num_hidden_layers)
    }

    /// Sum of output tensor bytes (what `metadata.total_size` of the index holds).
    pub fn tensor_bytes(&self) -> u64 {
        self.items.iter().map(PlannedItem::bytes_out).sum()
    }

    /// Total bytes of the output shard files, headers included.
    pub fn output_bytes(&self) -> u64 {
        self.shards.iter().map(|shard| shard.bytes).sum()
    }

    pub fn input_tensor_bytes(&self) -> u64 {
        self.items.iter().map(|item| item.source.bytes()).sum()
    }

    pub fn by_class(&self) -> BTreeMap<TensorClass, ClassSummary> {
        let mut classes: BTreeMap<TensorClass, ClassSummary> = BTreeMap::new();
        for item in &self.items {
            let summary = classes.entry(item.class).or_default();
            summary.tensors += 1;
            summary.parameters += item.source.shape.iter().product::<usize>() as u64;
            summary.bytes_in += item.source.bytes();
            summary.bytes_out += item.bytes_out();
            *summary.schemes.entry(item.action.name().to_string()).or_default() += 1;
        }
        classes
    }

    /// Digest of everything that determines the output bytes (besides the source's own bytes).
    pub fn sha256(&self, source_fingerprint: &str, recipe_sha256: &str) -> String {
        let mut hasher = Sha256::new();
        hasher.update(env!("CARGO_PKG_VERSION"));
        hasher.update(source_fingerprint);
        hasher.update(recipe_sha256);
        for shard in &self.shards {
            hasher.update(&shard.file);
            for tensor in &shard.tensors {
                hasher.update(format!("{}|{}|{:?};", tensor.name, tensor.dtype, tensor.shape));
            }
        }
        crate::hex::hex(&hasher.finalize())
    }

    pub fn count(&self, predicate: impl Fn(&Action) -> bool) -> usize {
        self.items.iter().filter(|item| predicate(&item.action)).count()
    }
}

//! Checkpoint sizes from a conversion plan: the source (FP8 block with F32 scales, or whatever the folder holds),
//! the same tensors in BF16, and the output of a recipe, in total and by tensor class.

use std::collections::BTreeMap;

use crate::format::vendor_source::SourceKind;
use crate::model::tensor_class::is_routed_expert;
use crate::model::TensorClass;
use crate::plan::{Action, Plan, PlannedItem};

const GIB: f64 = (1u64 << 30) as f64;

/// Bytes of one class (or of the whole checkpoint) in each format.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ClassSize {
    pub tensors: usize,
    pub parameters: u64,
    /// Source tensor bytes (FP8 weights with their scales, others as stored).
    pub source_bytes: u64,
    /// The same tensors with every FP8 weight in BF16 and no scales; other tensors as stored.
    pub bf16_bytes: u64,
    /// Output tensor bytes under the recipe.
    pub output_bytes: u64,
    /// Schemes used with their counts, e.g. `{"int4": 768, "bf16": 12}`.
    pub schemes: BTreeMap<String, usize>,
}

/// A byte count with its decimal and binary gigabytes, for JSON readers.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Bytes {
    pub bytes: u64,
    pub gb: f64,
    pub gib: f64,
}

impl Bytes {
    pub fn new(bytes: u64) -> Self {
        Self { bytes, gb: bytes as f64 / 1e9, gib: bytes as f64 / GIB }
    }
}

/// The sizes of a checkpoint before and after a recipe.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Sizes {
    /// True when counted from the files of a folder with weights; false when computed from `config.json`.
    pub exact: bool,
    pub parameters: u64,
    /// Source bytes: the shard files' bytes for a folder with weights, the tensor bytes for a config.
    pub source: Bytes,
    /// The source tensors' bytes (what a GPU holds), headers excluded.
    pub source_tensors: Bytes,
    pub bf16: Bytes,
    /// Output shard files' bytes, headers included: what `quantize` writes.
    pub output: Bytes,
    /// Output tensor bytes (what a GPU holds; `metadata.total_size` of the index).
    pub output_tensors: Bytes,
    /// Output tensor bytes were the MTP layer's routed experts kept BF16 (recipe `mtp = "bf16"`), where the recipe
    /// quantizes them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tensors_mtp_bf16: Option<Bytes>,
    pub shards: usize,
    pub classes: BTreeMap<String, ClassSize>,
}

impl Sizes {
    /// The sizes of a release that ships as the recipe's output (Kimi K2.5/K2.6/K2.7: natively INT4 experts,
    /// everything else BF16): its source is that output, planned from the FP8 layout of the same model.
    pub fn shipped_as_output(mut self) -> Self {
        self.source = self.output_tensors;
        self.source_tensors = self.output_tensors;
        for class in self.classes.values_mut() {
            class.source_bytes = class.output_bytes;
        }
        self
    }
}

/// Bytes of an item's tensor in BF16 (FP8, INT4 and MXFP4 weights lose their scales; other tensors are unchanged).
pub fn bf16_bytes(item: &PlannedItem) -> u64 {
    match item.source.kind {
        SourceKind::Fp8 { .. } | SourceKind::Int4 { .. } | SourceKind::Mxfp4 { .. } => {
            2 * item.source.shape.iter().product::<usize>() as u64
        }
        SourceKind::Plain => item.source.bytes(),
    }
}

/// Sizes from a plan; `source_file_bytes` is the folder's shard bytes when weights were read.
pub fn from_plan(plan: &Plan, source_file_bytes: Option<u64>) -> Sizes {
    let mut classes: BTreeMap<String, ClassSize> = BTreeMap::new();
    for item in &plan.items {
        let class = classes.entry(item.class.name().to_string()).or_default();
        class.tensors += 1;
        // An INT4 module is one item of its weight's `[out, in]` shape (its scales are metadata).
        class.parameters += item.source.shape.iter().product::<usize>() as u64;
        class.source_bytes += item.source.bytes();
        class.bf16_bytes += bf16_bytes(item);
        class.output_bytes += item.bytes_out();
        *class.schemes.entry(item.action.name().to_string()).or_default() += 1;
    }
    let source_tensor_bytes = plan.input_tensor_bytes();
    let mtp_int4_experts: Vec<&PlannedItem> = plan
        .items
        .iter()
        .filter(|item| {
            item.class == TensorClass::Mtp
                && matches!(item.action, Action::Int4 { .. } | Action::Fp4 { .. })
                && is_routed_expert(item.module())
        })
        .collect();
    let output_tensors_mtp_bf16 = (!mtp_int4_experts.is_empty()).then(|| {
        let int4: u64 = mtp_int4_experts.iter().map(|item| item.bytes_out()).sum();
        let bf16: u64 = mtp_int4_experts.iter().map(|item| bf16_bytes(item)).sum();
        Bytes::new(plan.tensor_bytes() - int4 + bf16)
    });
    Sizes {
        exact: source_file_bytes.is_some(),
        parameters: classes.values().map(|c| c.parameters).sum(),
        source: Bytes::new(source_file_bytes.unwrap_or(source_tensor_bytes)),
        source_tensors: Bytes::new(source_tensor_bytes),
        bf16: Bytes::new(classes.values().map(|c| c.bf16_bytes).sum()),
        output: Bytes::new(plan.output_bytes()),
        output_tensors: Bytes::new(plan.tensor_bytes()),
        output_tensors_mtp_bf16,
        shards: plan.shards.len(),
        classes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::vendor_source;
    use crate::model::ModelConfig;
    use crate::plan;
    use crate::recipe::Recipe;

    fn sizes(preset: &str, recipe: &str) -> Sizes {
        let json: serde_json::Value =
            serde_json::from_str(crate::model::presets::config_text(preset).unwrap()).unwrap();
        let config = ModelConfig::from_json(&json).unwrap();
        let recipe = Recipe::load(recipe).unwrap();
        let plan = plan::build(
            vendor_source::items_from_config(&config),
            &recipe,
            Some(config.num_hidden_layers),
            5_000_000_000,
        )
        .unwrap();
        from_plan(&plan, None)
    }

    #[test]
    fn classes_add_up_to_the_totals() {
        let glm5 = sizes("glm-5", "glm5-int4");
        assert!(!glm5.exact);
        assert_eq!(glm5.classes.values().map(|c| c.source_bytes).sum::<u64>(), glm5.source.bytes);
        assert_eq!(glm5.classes.values().map(|c| c.output_bytes).sum::<u64>(), glm5.output_tensors.bytes);
        assert!(glm5.output.bytes > glm5.output_tensors.bytes, "files add headers");
        assert_eq!(glm5.classes["routed_experts"].schemes.keys().collect::<Vec<_>>(), ["int4"]);
        for class in [
            "routed_experts",
            "shared_experts",
            "attention",
            "indexer",
            "dense_mlp",
            "embeddings",
            "norms_router",
            "mtp",
        ] {
            assert!(glm5.classes.contains_key(class), "{class}");
        }
    }

    #[test]
    fn bf16_is_about_twice_the_fp8_source() {
        let kimi = sizes("kimi-k2", "kimi-k2-int4");
        let ratio = kimi.bf16.bytes as f64 / kimi.source.bytes as f64;
        assert!((1.95..2.0).contains(&ratio), "{ratio}");
        // Kimi K2: about 1.03 T parameters.
        assert!((1.02e12..1.04e12).contains(&(kimi.parameters as f64)), "{}", kimi.parameters);
    }
}

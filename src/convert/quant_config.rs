//! What a plan declares in the output's `quantization_config` (it replaces the FP8 one): the INT4 group's size,
//! observer and targets, whether FP8 modules are kept, and the `ignore` list; the JSON is
//! [`crate::format::compressed_tensors::quantization_config`]'s.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::engines::SGLANG_NEXTN_EXPERTS;
use crate::format::compressed_tensors::{self, Fp4Group, Fp4Kind, Int4Group, QuantizationScheme};
use crate::model::tensor_class::{is_routed_expert, layer_index};
use crate::model::TensorClass;
use crate::recipe::{Recipe, Scheme};

use crate::plan::{Action, Plan};

/// Builds `quantization_config` for a plan. INT4 goes in `group_0` (targets `Linear`, Kimi's layout); with
/// `unselected = "fp8-block"` the kept FP8 modules form `group_1` (`float-quantized`, block 128×128) and the INT4
/// group targets its modules by `re:` pattern so that the more specific target wins in the engines.
/// `ignore` holds the recipe's `config_ignore` plus, by exact name, every unquantized linear it does not cover; an
/// MTP layer whose routed experts stay BF16 (`mtp = "bf16"`) is ignored by pattern under both engines' names for it
/// instead ([`mtp_expert_ignores`]).
pub fn quantization_config(plan: &Plan, recipe: &Recipe) -> Value {
    compressed_tensors::quantization_config(&scheme(plan, recipe))
}

fn scheme(plan: &Plan, recipe: &Recipe) -> QuantizationScheme {
    let mut int4 = None;
    let mut fp4: Vec<(Fp4Kind, bool)> = Vec::new();
    let mut has_fp8 = false;
    let mut ignore: Vec<String> = recipe.file.config_ignore.clone();
    let mut extra: BTreeSet<String> = BTreeSet::new();
    let mut mtp_layers: BTreeSet<usize> = BTreeSet::new();
    for item in &plan.items {
        let module = item.module().to_string();
        if item.class == TensorClass::Mtp
            && is_routed_expert(&module)
            && matches!(item.action, Action::Bf16 | Action::Copy)
        {
            mtp_layers.extend(layer_index(&module));
            continue;
        }
        let is_linear_weight = item.source.name.ends_with(".weight")
            && item.source.shape.len() == 2
            && item.class != TensorClass::Embeddings;
        match item.action {
            Action::Int4 { group_size, scale_rule, fp8_activations } => {
                int4.get_or_insert((group_size, scale_rule, fp8_activations));
            }
            Action::Fp4 { kind, fp4_activations } => {
                if !fp4.contains(&(kind, fp4_activations)) {
                    fp4.push((kind, fp4_activations));
                }
            }
            Action::Fp8Block => has_fp8 = true,
            Action::Bf16 | Action::Copy => {
                let covered = recipe.config_ignores(&module) || module.ends_with("embed_tokens");
                if is_linear_weight && !covered {
                    extra.insert(module);
                }
            }
        }
    }
    ignore.extend(extra);
    ignore.extend(mtp_expert_ignores(&mtp_layers));
    // One group: `Linear` (the `ignore` list leaves the rest out). Several: each targets its rules' modules by
    // pattern, so that the more specific target wins in the engines.
    let groups = usize::from(int4.is_some()) + fp4.len() + usize::from(has_fp8);
    let targets = |scheme: Scheme| -> Vec<String> {
        if groups == 1 {
            return vec!["Linear".to_string()];
        }
        recipe
            .file
            .rules
            .iter()
            .filter(|rule| rule.scheme == scheme)
            .map(|rule| format!("re:.*{}", rule.pattern.trim_end_matches('$').trim_end_matches("\\.weight")))
            .collect()
    };
    let int4 = int4.map(|(group_size, scale_rule, fp8_activations)| Int4Group {
        group_size,
        observer: scale_rule.observer_name(),
        targets: targets(if fp8_activations { Scheme::W4a8Fp8 } else { Scheme::Int4 }),
        fp8_activations,
    });
    let fp4 = fp4
        .into_iter()
        .map(|(kind, fp4_activations)| Fp4Group {
            kind,
            fp4_activations,
            targets: targets(match (kind, fp4_activations) {
                (Fp4Kind::Nvfp4, true) => Scheme::Nvfp4W4a4,
                (Fp4Kind::Nvfp4, false) => Scheme::Nvfp4,
                (Fp4Kind::Mxfp4, _) => Scheme::Mxfp4,
            }),
        })
        .collect();
    QuantizationScheme { int4, fp4, fp8_block: has_fp8, ignore }
}

/// The `ignore` entries that keep the routed experts of MTP layers `layers` unquantized in both engines. vLLM 0.32 builds
/// the MTP decoder layer under the checkpoint's prefix `model.layers.{layer}` (`glm4_moe_mtp.py`,
/// `deepseek_mtp.py`: `*MultiTokenPredictorLayer` passes its own prefix to the decoder layer) and asks the
/// compressed-tensors config about `{prefix}.mlp.experts.0.{gate,up,down}_proj` (`compressed_tensors_moe.py`,
/// `get_moe_method`); SGLang 0.5.23 builds it as `model.decoder` (`glm4_moe_nextn.py`, `deepseek_nextn.py`) and asks
/// about `model.decoder.mlp.experts.0.*` (`compressed_tensors.py`, `get_moe_scheme`). An ignored layer gets the
/// unquantized MoE method in both.
pub fn mtp_expert_ignores(layers: &BTreeSet<usize>) -> Vec<String> {
    let mut entries: Vec<String> =
        layers.iter().map(|layer| format!("re:^model\\.layers\\.{layer}\\.mlp\\.experts\\..*")).collect();
    if !entries.is_empty() {
        entries.push(SGLANG_NEXTN_EXPERTS.to_string());
    }
    entries
}

//! The compressed-tensors `quantization_config` written to the output's `config.json` (it replaces the FP8 one).

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::model::TensorClass;
use crate::recipe::Recipe;

use super::plan::{Action, Plan};

/// Builds `quantization_config` for a plan. INT4 goes in `group_0` (targets `Linear`, Kimi's layout); with
/// `unselected = "fp8-block"` the kept FP8 modules form `group_1` (`float-quantized`, block 128×128) and the INT4
/// group targets its modules by `re:` pattern so that the more specific target wins in the engines.
/// `ignore` holds the recipe's `config_ignore` plus, by exact name, every unquantized linear it does not cover.
pub fn quantization_config(plan: &Plan, recipe: &Recipe) -> Value {
    let mut int4 = None;
    let mut has_fp8 = false;
    let mut ignore: Vec<String> = recipe.file.config_ignore.clone();
    let mut extra: BTreeSet<String> = BTreeSet::new();
    for item in &plan.items {
        let module = item.module().to_string();
        let is_linear_weight = item.source.name.ends_with(".weight")
            && item.source.shape.len() == 2
            && item.class != TensorClass::Embeddings;
        match item.action {
            Action::Int4 { group_size, scale_rule } => {
                int4.get_or_insert((group_size, scale_rule));
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
    let mut groups = serde_json::Map::new();
    if let Some((group_size, scale_rule)) = int4 {
        let targets: Vec<String> = if has_fp8 {
            recipe
                .file
                .rules
                .iter()
                .map(|rule| format!("re:.*{}", rule.pattern.trim_end_matches('$').trim_end_matches("\\.weight")))
                .collect()
        } else {
            vec!["Linear".to_string()]
        };
        groups.insert(
            "group_0".into(),
            json!({
                "targets": targets,
                "weights": {
                    "num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": group_size,
                    "dynamic": false, "observer": scale_rule.observer_name(), "actorder": null, "block_structure": null
                },
                "input_activations": null,
                "output_activations": null,
                "format": "pack-quantized"
            }),
        );
    }
    if has_fp8 {
        groups.insert(
            format!("group_{}", groups.len()),
            json!({
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8, "type": "float", "symmetric": true, "strategy": "block", "block_structure": [128, 128],
                    "dynamic": false, "observer": "minmax", "group_size": null, "actorder": null
                },
                "input_activations": {
                    "num_bits": 8, "type": "float", "symmetric": true, "strategy": "group", "group_size": 128, "dynamic": true, "observer": null
                },
                "output_activations": null,
                "format": "float-quantized"
            }),
        );
    }
    let format = if int4.is_some() && has_fp8 {
        "mixed-precision"
    } else if has_fp8 {
        "float-quantized"
    } else {
        "pack-quantized"
    };
    json!({
        "quant_method": "compressed-tensors",
        "format": format,
        "quantization_status": "compressed",
        "config_groups": groups,
        "ignore": ignore,
        "kv_cache_scheme": null
    })
}

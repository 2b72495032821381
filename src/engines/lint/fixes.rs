//! The config fixes `quantize` applies because they are safe and standard: `topk_method: "noaux_tc"` and
//! `scoring_func: "sigmoid"` added to a config that lacks them when the router has `e_score_correction_bias`
//! (DeepSeek-V4: `topk_method` alone, for its `ffn.gate.bias`), and
//! `index_topk_pattern` added where vLLM would derive another DSA indexer schedule than `indexer_types` says, and
//! GLM-5.3-Flash's `mhc` / `mla_use_nope` / `indexer_rope_interleave`, which vLLM reads without a default.

use serde::Serialize;
use serde_json::Value;

/// One key `quantize` added to the output's `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigFix {
    pub key: String,
    pub value: Value,
    pub reason: String,
}

/// Adds the router keys the engines need when `e_score_correction_bias` tensors exist and the keys are absent
/// (an existing different value is left alone for the `router-topk` rule to report).
/// DeepSeek-V4's bias is `ffn.gate.bias` and its scoring `sqrtsoftplus` (vLLM's V4 default): only `topk_method`.
pub fn router_fixes<'a>(config: &mut Value, tensor_names: impl IntoIterator<Item = &'a str>) -> Vec<ConfigFix> {
    let deepseek_v4 = config.get("model_type").and_then(Value::as_str) == Some("deepseek_v4");
    let Some(bias) = tensor_names.into_iter().find(|name| is_router_bias(name, deepseek_v4)) else {
        return Vec::new();
    };
    if routes_elsewhere(config) {
        return Vec::new();
    }
    let Some(object) = config.as_object_mut() else { return Vec::new() };
    let mut fixes = Vec::new();
    let keys: &[(&str, &str, &str)] = if deepseek_v4 {
        &[("topk_method", "noaux_tc", "vLLM's DeepSeek-V4 model creates the router bias only for noaux_tc")]
    } else {
        &[
            ("topk_method", "noaux_tc", "vLLM's deepseek_v2.py creates the router bias only for noaux_tc"),
            ("scoring_func", "sigmoid", "the engines default to softmax routing scores"),
        ]
    };
    for &(key, value, why) in keys {
        if object.get(key).is_none_or(Value::is_null) {
            object.insert(key.into(), Value::from(value));
            fixes.push(ConfigFix {
                key: key.into(),
                value: Value::from(value),
                reason: format!("{bias} exists and config.json had no `{key}`: {why}"),
            });
        }
    }
    fixes
}

/// Whether `name` is a router's score-correction bias: `….e_score_correction_bias`, or DeepSeek-V4's
/// `….ffn.gate.bias` (vLLM's V4 weights mapper renames it to the former).
pub fn is_router_bias(name: &str, deepseek_v4: bool) -> bool {
    name.ends_with(".e_score_correction_bias") || (deepseek_v4 && name.ends_with(".ffn.gate.bias"))
}

/// Whether the text model routes outside vLLM's `deepseek_v2.py` and needs none of its keys: Kimi-Linear and
/// Kimi K3 (`kimi_linear.py`, `models/kimi_k3/`: `moe_router_activation_func`, the bias always built).
pub fn routes_elsewhere(config: &Value) -> bool {
    let text = crate::io::composite::text_config(config);
    text.get("model_type").and_then(Value::as_str) == Some("kimi_linear")
}

/// Adds `index_topk_pattern` (`F`/`S` per layer) when `indexer_types` marks shared layers, no pattern is given and
/// vLLM, which reads only the pattern or `index_topk_freq`/`index_skip_topk_offset`, would derive another schedule
/// (building indexers the checkpoint has no weights for). SGLang and transformers read `indexer_types` first, so
/// the key changes nothing for them.
pub fn indexer_fixes(config: &mut Value) -> Vec<ConfigFix> {
    let Some(kinds) = config.get("indexer_types").and_then(Value::as_array) else { return Vec::new() };
    let full: Vec<bool> = kinds.iter().map(|kind| kind.as_str() != Some("shared")).collect();
    if config.get("index_topk_pattern").is_some_and(|p| !p.is_null())
        || super::indexer_schedule::vllm_disagreements(config, &full).is_empty()
    {
        return Vec::new();
    }
    let value = Value::from(super::indexer_schedule::pattern(&full));
    let Some(object) = config.as_object_mut() else { return Vec::new() };
    object.insert("index_topk_pattern".into(), value.clone());
    vec![ConfigFix {
        key: "index_topk_pattern".into(),
        value,
        reason: "indexer_types marks shared DSA layers, and vLLM reads only index_topk_pattern or \
                 index_topk_freq/index_skip_topk_offset, from which it would build other indexers"
            .into(),
    }]
}

/// The `glm5_next_text` keys vLLM 0.32 reads as plain attributes (`models/glm5next/common/model.py`
/// `Glm5NextDecoderLayer`: `config.mhc`, `config.mla_use_nope`; `attention.py`: `config.indexer_rope_interleave`)
/// though transformers' `Glm5NextTextConfig` defines none of them: each with its value for this layout and why.
pub fn glm5_next_keys(text: &Value) -> Vec<(&'static str, Value, &'static str)> {
    if text.get("model_type").and_then(Value::as_str) != Some("glm5_next_text") {
        return Vec::new();
    }
    let number = |key: &str, default: u64| text.get(key).and_then(Value::as_u64).unwrap_or(default);
    vec![
        ("mhc", Value::from(number("hc_mult", 4) > 1), "builds the mHC streams (hc_* parameters) only when true"),
        ("mla_use_nope", Value::from(number("qk_rope_head_dim", 0) == 0), "skips MLA's rotary part when true"),
        (
            "indexer_rope_interleave",
            Value::from(false),
            "picks the indexer's rotary style; with qk_rope_head_dim 0 there is no rotary part, so the value changes \
             nothing",
        ),
    ]
}

/// Adds the [`glm5_next_keys`] a GLM-5.3-Flash text config lacks (an existing value is kept).
pub fn glm5_next_fixes(text: &mut Value) -> Vec<ConfigFix> {
    let keys = glm5_next_keys(text);
    let Some(object) = text.as_object_mut() else { return Vec::new() };
    let mut fixes = Vec::new();
    for (key, value, why) in keys {
        if object.get(key).is_none_or(Value::is_null) {
            object.insert(key.into(), value.clone());
            fixes.push(ConfigFix {
                key: key.into(),
                value,
                reason: format!("vLLM's glm5next model reads `{key}` without a default and {why}"),
            });
        }
    }
    fixes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn adds_missing_router_keys_only_when_the_bias_exists() {
        let bias = ["model.layers.1.mlp.gate.e_score_correction_bias"];
        let mut config = json!({"model_type": "glm4_moe"});
        let fixes = router_fixes(&mut config, bias);
        assert_eq!(fixes.len(), 2);
        assert_eq!(config["topk_method"], "noaux_tc");
        assert_eq!(config["scoring_func"], "sigmoid");
        assert!(router_fixes(&mut config, bias).is_empty(), "a second pass adds nothing");

        let mut softmax = json!({"scoring_func": "softmax"});
        let fixes = router_fixes(&mut softmax, bias);
        assert_eq!(fixes.len(), 1, "an existing value is not overwritten");
        assert_eq!(softmax["scoring_func"], "softmax");

        let mut no_bias = json!({});
        assert!(indexer_fixes(&mut no_bias).is_empty());
        assert!(router_fixes(&mut no_bias, ["model.layers.1.mlp.gate.weight"]).is_empty());
        assert_eq!(no_bias, json!({}));

        // DeepSeek-V4: `ffn.gate.bias`, and only topk_method (its scoring is sqrtsoftplus).
        let mut v4 = json!({"model_type": "deepseek_v4", "scoring_func": "sqrtsoftplus"});
        assert!(router_fixes(&mut v4, ["layers.0.ffn.gate.tid2eid"]).is_empty());
        let fixes = router_fixes(&mut v4, ["layers.3.ffn.gate.bias"]);
        assert_eq!(fixes.iter().map(|f| f.key.as_str()).collect::<Vec<_>>(), ["topk_method"]);
        assert_eq!(v4["topk_method"], "noaux_tc");
        assert_eq!(v4["scoring_func"], "sqrtsoftplus");
        let mut glm = json!({"model_type": "glm4_moe"});
        assert!(router_fixes(&mut glm, ["model.layers.1.mlp.gate.bias"]).is_empty(), "a plain bias elsewhere");
    }

    #[test]
    fn adds_the_indexer_pattern_only_where_vllm_would_derive_another_schedule() {
        let mut shared = json!({"indexer_types": ["full", "shared", "full", "shared"]});
        let fixes = indexer_fixes(&mut shared);
        assert_eq!(fixes.len(), 1);
        assert_eq!(shared["index_topk_pattern"], "FSFS");
        assert!(indexer_fixes(&mut shared).is_empty(), "a second pass adds nothing");

        let mut agreeing = json!({"indexer_types": ["full", "shared", "full"], "index_topk_freq": 2,
                                  "index_skip_topk_offset": 1});
        assert!(indexer_fixes(&mut agreeing).is_empty(), "vLLM's frequency gives the same schedule");
        let mut all_full = json!({"indexer_types": ["full", "full"]});
        assert!(indexer_fixes(&mut all_full).is_empty());
    }
}

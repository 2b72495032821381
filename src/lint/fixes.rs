//! The config fixes `quantize` applies because they are safe and standard: `topk_method: "noaux_tc"` and
//! `scoring_func: "sigmoid"` added to a config that lacks them when the router has `e_score_correction_bias`.

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
pub fn router_fixes<'a>(config: &mut Value, tensor_names: impl IntoIterator<Item = &'a str>) -> Vec<ConfigFix> {
    let Some(bias) = tensor_names.into_iter().find(|name| name.ends_with(".e_score_correction_bias")) else {
        return Vec::new();
    };
    let Some(object) = config.as_object_mut() else { return Vec::new() };
    let mut fixes = Vec::new();
    for (key, value, why) in [
        ("topk_method", "noaux_tc", "vLLM's deepseek_v2.py creates the router bias only for noaux_tc"),
        ("scoring_func", "sigmoid", "the engines default to softmax routing scores"),
    ] {
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
        assert!(router_fixes(&mut no_bias, ["model.layers.1.mlp.gate.weight"]).is_empty());
        assert_eq!(no_bias, json!({}));
    }
}

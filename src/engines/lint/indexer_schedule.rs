//! Which decoder layers run their own DSA indexer, as each engine derives it from `config.json` (GLM-5.2 shares
//! the indexer): vLLM 0.32 reads only `index_topk_pattern` or `index_topk_freq`/`index_skip_topk_offset`
//! (`deepseek_v2.py`, `DeepseekV2MLAAttention.__init__`); SGLang 0.5.23 reads `indexer_types` first
//! (`configs/model_config.py::dsa_layer_skips_topk`), and so do transformers and squeeze's runtime.

use serde_json::Value;

/// Per decoder layer, `true` where vLLM builds an indexer: `index_topk_pattern[layer] != "S"` when the pattern is
/// given (layers past its end: full), else `max(layer − offset + 1, 0) % freq == 0` with freq 1, offset 2 by
/// default.
pub fn vllm(config: &Value, layers: usize) -> Vec<bool> {
    if let Some(pattern) = config.get("index_topk_pattern").filter(|p| !p.is_null()) {
        let letter = |layer: usize| match pattern {
            Value::String(text) => text.chars().nth(layer).map(|c| c.to_string()),
            Value::Array(list) => list.get(layer).and_then(Value::as_str).map(str::to_string),
            _ => None,
        };
        return (0..layers).map(|layer| letter(layer).as_deref() != Some("S")).collect();
    }
    let number = |key: &str, default: u64| config.get(key).and_then(Value::as_u64).unwrap_or(default) as usize;
    let (frequency, offset) = (number("index_topk_freq", 1), number("index_skip_topk_offset", 2));
    crate::model::config::Indexer::frequency_schedule(layers, frequency, offset)
}

/// The `index_topk_pattern` string (`F`/`S` per layer) that makes vLLM build exactly the indexers of `full`.
pub fn pattern(full: &[bool]) -> String {
    full.iter().map(|&runs| if runs { 'F' } else { 'S' }).collect()
}

/// The layers whose indexer vLLM derives differently from `expected`, as "layer N: vLLM builds one/none".
pub fn vllm_disagreements(config: &Value, expected: &[bool]) -> Vec<String> {
    vllm(config, expected.len())
        .iter()
        .zip(expected)
        .enumerate()
        .filter(|(_, (vllm, expected))| vllm != expected)
        .map(|(layer, (vllm, _))| {
            if *vllm {
                format!("layer {layer}: vLLM builds an indexer the checkpoint has no weights for")
            } else {
                format!("layer {layer}: vLLM builds no indexer and drops the layer's own top-k")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn vllm_ignores_indexer_types_and_reads_pattern_or_frequency() {
        let glm52 = json!({"indexer_types": ["full", "shared", "full"]});
        assert_eq!(vllm(&glm52, 3), vec![true, true, true], "indexer_types alone: vLLM builds every indexer");
        let with_frequency = json!({"index_topk_freq": 4, "index_skip_topk_offset": 3});
        let schedule = vllm(&with_frequency, 11);
        let full: Vec<usize> = (0..11).filter(|&l| schedule[l]).collect();
        assert_eq!(full, vec![0, 1, 2, 6, 10], "GLM-5.2's schedule: full at 0, 1, 2, then every 4th from 6");
        assert_eq!(vllm(&json!({"index_topk_pattern": "FSF"}), 4), vec![true, false, true, true]);
        assert_eq!(pattern(&[true, false, true]), "FSF");
        assert_eq!(vllm_disagreements(&glm52, &[true, false, true]).len(), 1);
        assert!(vllm_disagreements(&json!({"index_topk_pattern": "FSF"}), &[true, false, true]).is_empty());
    }
}

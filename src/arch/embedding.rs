//! The model's two ends on its weights: the token embedding rows, and the name of the output head's weight.

use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::runtime::RuntimeError;

/// The name of the output head's weight (`lm_head.weight`, or the embedding when tied and absent; DeepSeek-V4's
/// `head.weight`).
pub fn head_name(config: &ModelConfig, reader: &WeightReader) -> &'static str {
    if config.deepseek_v4().is_some() {
        "head.weight"
    } else if config.tie_word_embeddings && !reader.contains("lm_head.weight") {
        config.embed_name()
    } else {
        "lm_head.weight"
    }
}

/// The embeddings `[tokens, hidden]` of `ids`.
pub fn embed(reader: &WeightReader, config: &ModelConfig, ids: &[u32]) -> Result<Vec<f32>, RuntimeError> {
    reader.rows(config.embed_name(), config.hidden_size, ids)
}

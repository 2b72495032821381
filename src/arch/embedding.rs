//! The model's two ends on its weights: the token embedding rows, and the name of the output head's weight.

use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::runtime::RuntimeError;

/// The name of the output head's weight (`lm_head.weight`, or the embedding when tied and absent).
pub fn head_name(config: &ModelConfig, reader: &WeightReader) -> &'static str {
    if config.tie_word_embeddings && !reader.contains("lm_head.weight") {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    }
}

/// The embeddings `[tokens, hidden]` of `ids`.
pub fn embed(reader: &WeightReader, config: &ModelConfig, ids: &[u32]) -> Result<Vec<f32>, RuntimeError> {
    reader.rows("model.embed_tokens.weight", config.hidden_size, ids)
}

//! One decoder layer: its resident weights (norms, attention, router, shared or dense MLP) loaded and dequantized
//! together, and the pre-norm residual forward `h += attn(norm(h)); h += mlp(norm(h))`.

use super::backend::Backend;
use super::gqa::GqaWeights;
use super::indexer::Selection;
use super::mla::MlaWeights;
use super::moe::{DenseMlp, ExpertTimes, MoeWeights};
use super::rope_table::RopeTable;
use super::weights::WeightReader;
use super::{RuntimeError, Spans};
use crate::model::config::Attention;
use crate::model::ModelConfig;

enum AttentionWeights {
    Mla(MlaWeights),
    Gqa(GqaWeights),
}

enum Mlp {
    Dense(DenseMlp),
    Moe(MoeWeights),
}

pub struct Layer {
    input_norm: Vec<f32>,
    attention: AttentionWeights,
    post_norm: Vec<f32>,
    mlp: Mlp,
}

/// What a layer's forward needs besides its weights.
pub struct LayerContext<'a> {
    pub backend: &'a dyn Backend,
    pub reader: &'a WeightReader<'a>,
    pub config: &'a ModelConfig,
    pub table: &'a RopeTable,
    pub mla_scale: f32,
}

impl Layer {
    pub fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let prefix = format!("model.layers.{layer}");
        let hidden = config.hidden_size;
        let attention = match config.attention {
            Attention::Mla { .. } => {
                let with_indexer =
                    config.indexer.as_ref().is_some_and(|i| i.full_layers.get(layer).copied().unwrap_or(true));
                AttentionWeights::Mla(MlaWeights::load(reader, config, &prefix, with_indexer)?)
            }
            Attention::Gqa { .. } => AttentionWeights::Gqa(GqaWeights::load(reader, config, &prefix)?),
        };
        let mlp = if config.runs_moe(layer) {
            Mlp::Moe(MoeWeights::load(reader, config, &prefix)?)
        } else {
            Mlp::Dense(DenseMlp::load(reader, &format!("{prefix}.mlp"), hidden, config.intermediate_size)?)
        };
        Ok(Self {
            input_norm: reader.vector(&format!("{prefix}.input_layernorm.weight"), hidden)?,
            attention,
            post_norm: reader.vector(&format!("{prefix}.post_attention_layernorm.weight"), hidden)?,
            mlp,
        })
    }

    /// Advances `hidden` (`[tokens, hidden]`) through the layer.
    pub fn forward(
        &self,
        context: &LayerContext,
        hidden: &mut [f32],
        spans: &Spans,
        selection: &mut Option<Selection>,
        times: &ExpertTimes,
        near_ties: &mut usize,
    ) -> Result<(), RuntimeError> {
        let LayerContext { backend, reader, config, table, mla_scale } = *context;
        let width = config.hidden_size;
        let eps = config.rms_norm_eps as f32;
        let tokens = spans.total();
        let mut x = hidden.to_vec();
        backend.rms_norm(&mut x, width, &self.input_norm, eps);
        let attended = match &self.attention {
            AttentionWeights::Mla(mla) => {
                mla.forward(backend, config, &x, spans, table, mla_scale, selection, near_ties)?
            }
            AttentionWeights::Gqa(gqa) => gqa.forward(backend, config, &x, spans, table)?,
        };
        hidden.iter_mut().zip(&attended).for_each(|(h, a)| *h += a);
        let mut x = hidden.to_vec();
        backend.rms_norm(&mut x, width, &self.post_norm, eps);
        let mixed = match &self.mlp {
            Mlp::Dense(mlp) => mlp.forward(backend, &x, tokens),
            Mlp::Moe(moe) => moe.forward(backend, reader, config, &x, tokens, times, near_ties)?,
        };
        hidden.iter_mut().zip(&mixed).for_each(|(h, m)| *h += m);
        Ok(())
    }
}

//! The multi-token-prediction (MTP) layer of GLM-4.5/4.6/4.7 and GLM-5/5.1/5.2 (DeepSeek-V3's MTP as the
//! engines serve it), at index `num_hidden_layers`: for position `t` it takes the main model's final hidden state
//! `h_t` and the embedding of the next token `x_{t+1}` and drafts token `x_{t+2}`:
//!
//! ```text
//! e = embed(x_{t+1}), zeroed at position 0           (vLLM deepseek_mtp.py / glm4_moe_mtp.py: "masking inputs at
//!                                                     position 0, as not needed by MTP")
//! h = eh_proj([enorm(e) | hnorm(h_t)])                h_t: the main model's hidden state after its final norm
//! h = decoder layer `num_hidden_layers` (h)           the same [`Layer`] as every other: MLA or GQA, MoE, GLM-5's
//!                                                     own DSA indexer, causal over the MTP inputs at positions t
//! logits = shared_head.head(shared_head.norm(h))
//! ```
//!
//! The embedding and the head are the main model's `embed_tokens` and `lm_head`, whatever the MTP layer stores
//! (GLM-4.5 stores copies, GLM-4.6 and later none): both engines serve MTP that way — vLLM's speculative decoding
//! replaces the drafter's with the target model's (`v1/spec_decode/llm_base_proposer.py`
//! `_maybe_share_embeddings`/`_maybe_share_lm_head`, "Detected MTP model. Sharing target model …"), SGLang 0.5.23's EAGLE
//! worker likewise for NextN drafters (`srt/speculative/eagle_worker_v2.py`: "Share the embedding and lm_head",
//! `set_embed_and_head`). A copy that differs (a damaged or requantized one) is never served.

use std::ops::Range;

use super::context::{LayerContext, LayerState, Residual};
use super::embedding::head_name;
use super::layer::Layer;
use super::moe::ExpertTimes;
use super::tap::KvSource;
use crate::load::layer_stream::StreamedLayer;
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::runtime::backend::Backend;
use crate::runtime::matrix::Matrix;
use crate::runtime::tensor::Tensor;
use crate::runtime::{RuntimeError, Spans};

/// The first MTP layer, loaded.
pub struct MtpLayer {
    enorm: Matrix,
    hnorm: Matrix,
    eh_proj: Matrix,
    layer: Layer,
    head_norm: Matrix,
    head: Matrix,
}

impl MtpLayer {
    /// The model's first MTP layer (`model.layers.{num_hidden_layers}`), or `None` when the config has none.
    pub fn load(reader: &WeightReader, config: &ModelConfig) -> Result<Option<Self>, RuntimeError> {
        if config.num_nextn_predict_layers == 0 {
            return Ok(None);
        }
        let index = config.num_hidden_layers;
        let hidden = config.hidden_size;
        let name = |suffix: &str| format!("model.layers.{index}.{suffix}");
        Ok(Some(Self {
            enorm: reader.parameter(&name("enorm.weight"), hidden)?,
            hnorm: reader.parameter(&name("hnorm.weight"), hidden)?,
            eh_proj: reader.matrix(&name("eh_proj.weight"), [hidden, 2 * hidden])?,
            layer: Layer::load(reader, config, index)?,
            head_norm: reader.parameter(&name("shared_head.norm.weight"), hidden)?,
            head: reader.matrix(head_name(config, reader), [config.vocab_size, hidden])?,
        }))
    }

    /// The MTP layer's hidden states after `shared_head.norm`, `[Σ (len − 1), hidden]` in the returned spans: row `t`
    /// of a sequence of `len` tokens drafts token `t + 2` from `normed` (the main model's hidden states after its
    /// final norm, `[Σ len, hidden]` in `spans`) at row `t` and the sequence's token `t + 1`.
    pub fn hidden(
        &self,
        context: &LayerContext,
        normed: &Tensor,
        sequences: &[Vec<u32>],
        spans: &Spans,
    ) -> Result<(Tensor, Spans), RuntimeError> {
        let (mut hidden, mtp_spans) = self.inputs(context, normed, sequences, spans)?;
        let mut state = LayerState::default();
        let times = ExpertTimes::default();
        let residual = Residual { hidden: &mut hidden, spans: &mtp_spans, state: &mut state };
        self.layer.forward(context, residual, KvSource::Own, &times, None)?;
        let config = context.config;
        context.backend.rms_norm(&mut hidden, config.hidden_size, &self.head_norm, config.rms_norm_eps as f32)?;
        Ok((hidden, mtp_spans))
    }

    /// The decoder layer's inputs for whole sequences (what [`MtpLayer::hidden`] runs through it), `[Σ (len − 1),
    /// hidden]` in the returned spans: row `t` from `normed` at row `t` and the sequence's token `t + 1`.
    pub fn inputs(
        &self,
        context: &LayerContext,
        normed: &Tensor,
        sequences: &[Vec<u32>],
        spans: &Spans,
    ) -> Result<(Tensor, Spans), RuntimeError> {
        let LayerContext { backend, reader, config, .. } = *context;
        let lengths: Vec<usize> = sequences.iter().map(|s| s.len().saturating_sub(1)).collect();
        let mtp_spans = Spans::new(&lengths);
        // The next token of every position but each sequence's last; position 0 is each sequence's first row.
        let next: Vec<u32> = sequences.iter().flat_map(|s| s.iter().skip(1).copied()).collect();
        let mut first = vec![false; next.len()];
        for (start, length) in mtp_spans.iter() {
            if length > 0 {
                first[start] = true;
            }
        }
        let rows: Vec<usize> =
            spans.iter().zip(&lengths).flat_map(|((start, _), &length)| start..start + length).collect();
        let hidden = self.input(backend, reader, config, &next, &first, &backend.gather_rows(normed, &rows)?)?;
        Ok((hidden, mtp_spans))
    }

    /// The decoder layer's input `eh_proj([enorm(embed(next)) | hnorm(previous)])` `[rows, hidden]`: `next` the
    /// token after each row's position, its embedding zeroed where `first` (position 0), `previous` the hidden
    /// state the row drafts from (the main model's after its final norm, or this layer's own output when drafts
    /// are chained).
    pub fn input(
        &self,
        backend: &dyn Backend,
        reader: &WeightReader,
        config: &ModelConfig,
        next: &[u32],
        first: &[bool],
        previous: &Tensor,
    ) -> Result<Tensor, RuntimeError> {
        let width = config.hidden_size;
        let eps = config.rms_norm_eps as f32;
        let mut embedded = reader.rows(config.embed_name(), width, next)?;
        for (row, _) in first.iter().enumerate().filter(|(_, &first)| first) {
            embedded[row * width..(row + 1) * width].fill(0.0);
        }
        let embedded = backend.rms_normed(&backend.upload(&embedded, width)?, &self.enorm, eps)?;
        let previous = backend.rms_normed(previous, &self.hnorm, eps)?;
        backend.linear(&backend.concat_columns(&[&embedded, &previous])?, &self.eh_proj, None)
    }

    /// The decoder layer (index `num_hidden_layers`).
    pub fn layer(&self) -> &Layer {
        &self.layer
    }

    /// The draft logits `[rows, vocab]` of the layer's output `hidden` (before `shared_head.norm`).
    pub fn head_logits(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        hidden: &Tensor,
    ) -> Result<Vec<f32>, RuntimeError> {
        let normed = backend.rms_normed(hidden, &self.head_norm, config.rms_norm_eps as f32)?;
        backend.download(&backend.linear(&normed, &self.head, None)?)
    }

    /// The draft logits `[rows, vocab]` of rows `range` of [`MtpLayer::hidden`]'s states.
    pub fn logits(
        &self,
        backend: &dyn Backend,
        hidden: &Tensor,
        range: Range<usize>,
    ) -> Result<Vec<f32>, RuntimeError> {
        if range.is_empty() {
            return Ok(Vec::new());
        }
        backend.download(&backend.linear(&backend.row_range(hidden, range)?, &self.head, None)?)
    }
}

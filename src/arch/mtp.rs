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
//!
//! DeepSeek-V4's MTP layer (`mtp.0.*`, vLLM 0.32 `models/deepseek_v4/nvidia/mtp.py`
//! `DeepSeekV4MultiTokenPredictorLayer`; transformers drops it) drafts from the main model's mHC streams as they
//! leave its last layer (vLLM's `_mtp_hidden_buffer`, before the hyper-head) and keeps its own streams:
//!
//! ```text
//! x_s    = h_proj(hnorm(stream_s of h_t)) + e_proj(enorm(e))   each of the hc_mult streams; e zeroed at position 0
//! x      = decoder layer `mtp.0` (x)                             its own mHC (hc_attn_*, hc_ffn_*)
//! logits = head(norm(hyper-head(x)))                            `mtp.0.hc_head_*`, `mtp.0.norm`; the main head
//! ```

use std::ops::Range;

use super::context::{LayerContext, LayerState, Residual};
use super::embedding::head_name;
use super::hyper::HyperHead;
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
    join: Join,
    layer: Layer,
    head_norm: Matrix,
    head: Matrix,
}

/// How the layer joins the next token's embedding with the state it drafts from.
enum Join {
    /// `eh_proj([enorm(e) | hnorm(h)])`, `h` the main model's output after its final norm.
    Fused(Matrix),
    /// DeepSeek-V4: `h_proj(hnorm(stream)) + e_proj(enorm(e))` for each mHC stream of the main model's residual;
    /// the layer's output collapsed by its own hyper-head.
    Streams { e_proj: Matrix, h_proj: Matrix, hyper_head: Box<HyperHead> },
}

impl MtpLayer {
    /// The model's first MTP layer (`model.layers.{num_hidden_layers}`, DeepSeek-V4's `mtp.0`), or `None` when the
    /// config has none.
    pub fn load(reader: &WeightReader, config: &ModelConfig) -> Result<Option<Self>, RuntimeError> {
        if config.num_nextn_predict_layers == 0 {
            return Ok(None);
        }
        let index = config.num_hidden_layers;
        let hidden = config.hidden_size;
        let prefix = config.layer_prefix(index);
        let name = |suffix: &str| format!("{prefix}.{suffix}");
        let v4 = config.deepseek_v4().is_some();
        let join = if v4 {
            Join::Streams {
                e_proj: reader.matrix(&name("e_proj.weight"), [hidden, hidden])?,
                h_proj: reader.matrix(&name("h_proj.weight"), [hidden, hidden])?,
                hyper_head: Box::new(HyperHead::load(reader, config, &format!("{prefix}."))?),
            }
        } else {
            Join::Fused(reader.matrix(&name("eh_proj.weight"), [hidden, 2 * hidden])?)
        };
        Ok(Some(Self {
            enorm: reader.parameter(&name("enorm.weight"), hidden)?,
            hnorm: reader.parameter(&name("hnorm.weight"), hidden)?,
            join,
            layer: Layer::load(reader, config, index)?,
            head_norm: reader.parameter(&name(if v4 { "norm.weight" } else { "shared_head.norm.weight" }), hidden)?,
            head: reader.matrix(head_name(config, reader), [config.vocab_size, hidden])?,
        }))
    }

    /// Whether the layer drafts from the main model's mHC streams as they leave its last layer (DeepSeek-V4)
    /// rather than from its output after the final norm.
    pub fn drafts_from_streams(&self) -> bool {
        matches!(self.join, Join::Streams { .. })
    }

    /// The MTP layer's hidden states after `shared_head.norm`, `[Σ (len − 1), hidden]` in the returned spans: row `t`
    /// of a sequence of `len` tokens drafts token `t + 2` from `normed` (the main model's hidden states after its
    /// final norm, `[Σ len, hidden]` in `spans`; DeepSeek-V4: its mHC streams before the hyper-head) at row `t` and
    /// the sequence's token `t + 1`.
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
        if let Join::Streams { hyper_head, .. } = &self.join {
            hidden = hyper_head.collapse(context.backend, &hidden)?;
        }
        context.backend.rms_norm(&mut hidden, config.hidden_size, &self.head_norm, config.rms_norm_eps as f32)?;
        Ok((hidden, mtp_spans))
    }

    /// The decoder layer's inputs for whole sequences (what [`MtpLayer::hidden`] runs through it), `[Σ (len − 1),
    /// residual width]` in the returned spans: row `t` from `normed` at row `t` and the sequence's token `t + 1`.
    /// `normed` is what the layer drafts from ([`MtpLayer::drafts_from_streams`]).
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

    /// The decoder layer's input `eh_proj([enorm(embed(next)) | hnorm(previous)])` `[rows, hidden]` (DeepSeek-V4:
    /// `h_proj(hnorm(stream)) + e_proj(enorm(embed(next)))` per stream, `[rows, hc_mult · hidden]`): `next` the
    /// token after each row's position, its embedding zeroed where `first` (position 0), `previous` the state the
    /// row drafts from (the main model's output after its final norm — V4: its streams — or this layer's own
    /// output when drafts are chained).
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
        let expected = if self.drafts_from_streams() { config.residual_width() } else { width };
        if previous.columns() != expected {
            return Err(RuntimeError::Input(format!(
                "the MTP layer drafts from rows of {expected} values, given {}",
                previous.columns()
            )));
        }
        let mut embedded = reader.rows(config.embed_name(), width, next)?;
        for (row, _) in first.iter().enumerate().filter(|(_, &first)| first) {
            embedded[row * width..(row + 1) * width].fill(0.0);
        }
        let embedded = backend.rms_normed(&backend.upload(&embedded, width)?, &self.enorm, eps)?;
        match &self.join {
            Join::Fused(eh_proj) => {
                let previous = backend.rms_normed(previous, &self.hnorm, eps)?;
                backend.linear(&backend.concat_columns(&[&embedded, &previous])?, eh_proj, None)
            }
            Join::Streams { e_proj, h_proj, .. } => {
                let embedded = backend.download(&backend.linear(&embedded, e_proj, None)?)?;
                // One row per (token, stream): hnorm and h_proj act on each stream alone.
                let mut streams = backend.upload(&backend.download(previous)?, width)?;
                backend.rms_norm(&mut streams, width, &self.hnorm, eps)?;
                let mut joined = backend.download(&backend.linear(&streams, h_proj, None)?)?;
                for (row, e) in joined.chunks_exact_mut(expected).zip(embedded.chunks_exact(width)) {
                    for stream in row.chunks_exact_mut(width) {
                        stream.iter_mut().zip(e).for_each(|(x, e)| *x += e);
                    }
                }
                backend.upload(&joined, expected)
            }
        }
    }

    /// The decoder layer (index `num_hidden_layers`).
    pub fn layer(&self) -> &Layer {
        &self.layer
    }

    /// The draft logits `[rows, vocab]` of the layer's output `hidden` (before `shared_head.norm`; DeepSeek-V4:
    /// its streams, before its hyper-head).
    pub fn head_logits(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        hidden: &Tensor,
    ) -> Result<Vec<f32>, RuntimeError> {
        let collapsed = match &self.join {
            Join::Streams { hyper_head, .. } => Some(hyper_head.collapse(backend, hidden)?),
            Join::Fused(_) => None,
        };
        let normed =
            backend.rms_normed(collapsed.as_ref().unwrap_or(hidden), &self.head_norm, config.rms_norm_eps as f32)?;
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

//! The KDA token mixer (Kimi-Linear's and GLM-5.3-Flash's `linear_attention` layers; transformers
//! `KimiLinearDeltaAttention`, `Glm5NextTextLinearAttention`): the
//! projections on the backend, the short convolution, gates and delta rule through [`Backend::kda`] (chunked over a
//! whole sequence), the output projection. Its per-request state (convolution inputs, delta-rule state) replaces a
//! KV cache: a fixed size however long the context.

use super::context::LayerContext;
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::runtime::backend::{Backend, KdaProjections};
pub use crate::runtime::kda::KdaMode;
use crate::runtime::kda::{KdaParams, KdaShape, KdaState};
use crate::runtime::matrix::Matrix;
use crate::runtime::tensor::Tensor;
use crate::runtime::{RuntimeError, Spans};

pub struct KdaWeights {
    shape: KdaShape,
    /// `q_proj`, `k_proj`, `v_proj` `[width, hidden]`.
    qkv: [Matrix; 3],
    /// `q_conv1d`, `k_conv1d`, `v_conv1d` side by side: `[3 · width, kernel]`.
    conv: Vec<f32>,
    /// The forget gate's low-rank pair `f_a_proj` `[head_dim, hidden]`, `f_b_proj` `[width, head_dim]`.
    forget: [Matrix; 2],
    /// `b_proj` `[heads, hidden]`.
    beta: Matrix,
    /// The output gate's low-rank pair `g_a_proj`, `g_b_proj`.
    gate: [Matrix; 2],
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    o_norm: Vec<f32>,
    o: Matrix,
    eps: f32,
    gate_lower_bound: Option<f32>,
}

/// The KDA sizes of a model (`linear_attn_config`, GLM-5.3-Flash's `linear_*` keys).
pub fn shape(config: &ModelConfig) -> Option<KdaShape> {
    config.kda().map(|kda| KdaShape { heads: kda.heads, head_dim: kda.head_dim, conv_kernel: kda.conv_kernel })
}

impl KdaWeights {
    /// The KDA weights of decoder layer `layer`.
    pub fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let shape = shape(config)
            .ok_or_else(|| RuntimeError::Input(format!("layer {layer}: a KDA layer in a model without KDA keys")))?;
        let (hidden, heads, head_dim, width) = (config.hidden_size, shape.heads, shape.head_dim, shape.width());
        let name = |suffix: &str| format!("model.layers.{layer}.self_attn.{suffix}");
        let projection = |suffix: &str, shape: [usize; 2]| reader.matrix(&name(&format!("{suffix}.weight")), shape);
        let mut conv = Vec::with_capacity(3 * width * shape.conv_kernel);
        for part in ["q_conv1d", "k_conv1d", "v_conv1d"] {
            conv.extend(reader.vector(&name(&format!("{part}.weight")), width * shape.conv_kernel)?);
        }
        Ok(Self {
            qkv: [
                projection("q_proj", [width, hidden])?,
                projection("k_proj", [width, hidden])?,
                projection("v_proj", [width, hidden])?,
            ],
            conv,
            forget: [projection("f_a_proj", [head_dim, hidden])?, projection("f_b_proj", [width, head_dim])?],
            beta: projection("b_proj", [heads, hidden])?,
            gate: [projection("g_a_proj", [head_dim, hidden])?, projection("g_b_proj", [width, head_dim])?],
            a_log: reader.vector(&name("A_log"), heads)?,
            dt_bias: reader.vector(&name("dt_bias"), width)?,
            o_norm: reader.vector(&name("o_norm.weight"), head_dim)?,
            o: projection("o_proj", [hidden, width])?,
            eps: config.rms_norm_eps as f32,
            gate_lower_bound: config.kda().and_then(|kda| kda.gate_lower_bound).map(|bound| bound as f32),
            shape,
        })
    }

    pub fn shape(&self) -> KdaShape {
        self.shape
    }

    /// Every weight matrix (for device prefetch).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all: Vec<&Matrix> = self.qkv.iter().chain(&self.forget).chain(&self.gate).collect();
        all.extend([&self.beta, &self.o]);
        all
    }

    /// The mixer's output `[tokens, hidden]` (after `o_proj`) for normed input `x`, each sequence of `spans` from
    /// the zero state.
    pub fn forward(&self, context: &LayerContext, x: &Tensor, spans: &Spans) -> Result<Tensor, RuntimeError> {
        let mut states: Vec<KdaState> = spans.iter().map(|_| KdaState::new(&self.shape)).collect();
        let mut sequences: Vec<_> = spans
            .iter()
            .zip(states.iter_mut())
            .map(|((start, length), state)| (start..start + length, state))
            .collect();
        self.mix(context.backend, x, &mut sequences, KdaMode::Chunked)
    }

    /// Split prefill/decode ([`super::tap::KvSource::Split`]): each sequence's first `prompt[i]` rows through
    /// `prefill`'s weights on `x_prefill` from the zero state, the state handed over as an engine stores it
    /// ([`KdaState::as_stored`]), the remaining rows through these weights on `x` from it. The result's prompt rows
    /// are the prefill node's.
    pub fn forward_split(
        &self,
        context: &LayerContext,
        x: &Tensor,
        spans: &Spans,
        (prefill, x_prefill, prompt): (&KdaWeights, &Tensor, &[usize]),
    ) -> Result<Tensor, RuntimeError> {
        let backend = context.backend;
        let mut states: Vec<KdaState> = spans.iter().map(|_| KdaState::new(&self.shape)).collect();
        let bounds: Vec<(usize, usize, usize)> = spans
            .iter()
            .zip(prompt)
            .map(|((start, length), &prompt)| (start, start + prompt.min(length), start + length))
            .collect();
        let mut sequences: Vec<_> =
            bounds.iter().zip(states.iter_mut()).map(|(&(start, handoff, _), state)| (start..handoff, state)).collect();
        let prefilled = prefill.mix(backend, x_prefill, &mut sequences, KdaMode::Chunked)?;
        states.iter_mut().for_each(KdaState::as_stored);
        let mut sequences: Vec<_> =
            bounds.iter().zip(states.iter_mut()).map(|(&(_, handoff, end), state)| (handoff..end, state)).collect();
        let mut out = self.mix(backend, x, &mut sequences, KdaMode::Chunked)?;
        for &(start, handoff, _) in &bounds {
            backend.copy_rows(&mut out, &prefilled, start..handoff)?;
        }
        Ok(out)
    }

    /// The mixer over the sequences `(rows, state)` of `x`, continuing from and advancing their states.
    pub(super) fn mix(
        &self,
        backend: &dyn Backend,
        x: &Tensor,
        sequences: &mut [(std::ops::Range<usize>, &mut KdaState)],
        mode: KdaMode,
    ) -> Result<Tensor, RuntimeError> {
        let [q, k, v] = &self.qkv;
        let qkv = backend.concat_columns(&[
            &backend.linear(x, q, None)?,
            &backend.linear(x, k, None)?,
            &backend.linear(x, v, None)?,
        ])?;
        let low_rank = |[a, b]: &[Matrix; 2]| backend.linear(&backend.linear(x, a, None)?, b, None);
        let projections = KdaProjections {
            qkv: &qkv,
            forget: &low_rank(&self.forget)?,
            beta: &backend.linear(x, &self.beta, None)?,
            gate: &low_rank(&self.gate)?,
            shape: self.shape,
        };
        let params = KdaParams {
            conv: &self.conv,
            dt_bias: &self.dt_bias,
            a_log: &self.a_log,
            o_norm: &self.o_norm,
            eps: self.eps,
            gate_lower_bound: self.gate_lower_bound,
        };
        let mixed = backend.kda(&projections, &params, sequences, mode)?;
        backend.linear(&mixed, &self.o, None)
    }
}

//! Grouped-query attention of GLM-4.5: biased q/k/v projections, optional per-head RMSNorm of q and k, rotate-half
//! RoPE on the first `partial_rotary_factor` of each head; over whole sequences, or as the decode step's cache rows
//! and queries at their positions.

use super::context::LayerContext;
use super::tap::{KvSource, KvTap};
use crate::load::weights::WeightReader;
use crate::model::config::Attention;
use crate::model::ModelConfig;
use crate::runtime::backend::{AttentionShape, Backend, RopeCall, RopeStyle};
use crate::runtime::kv_cache::PagedLayout;
use crate::runtime::matrix::Matrix;
use crate::runtime::rope_table::{check_positions, RopeTable};
use crate::runtime::tensor::Tensor;
use crate::runtime::{RuntimeError, Spans};

pub struct GqaWeights {
    q: (Matrix, Option<Matrix>),
    k: (Matrix, Option<Matrix>),
    v: (Matrix, Option<Matrix>),
    o: Matrix,
    qk_norm: Option<(Matrix, Matrix)>,
}

fn dims(config: &ModelConfig) -> (usize, usize, bool, bool) {
    match &config.attention {
        Attention::Gqa { num_key_value_heads, head_dim, attention_bias, use_qk_norm, .. } => {
            (*num_key_value_heads, *head_dim, *attention_bias, *use_qk_norm)
        }
        Attention::Mla { .. } => unreachable!("GQA weights requested for an MLA model"),
    }
}

impl GqaWeights {
    /// Every weight matrix (for device prefetch).
    pub fn matrices(&self) -> [&Matrix; 4] {
        [&self.q.0, &self.k.0, &self.v.0, &self.o]
    }

    /// The attention weights of decoder layer `layer`.
    pub fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let (kv_heads, head_dim, bias, qk_norm) = dims(config);
        let hidden = config.hidden_size;
        let heads = config.num_attention_heads;
        let name = |suffix: &str| format!("model.layers.{layer}.self_attn.{suffix}");
        let projection = |which: &str, out: usize| -> Result<(Matrix, Option<Matrix>), RuntimeError> {
            let weight = reader.matrix(&name(&format!("{which}.weight")), [out, hidden])?;
            let bias = if bias { Some(reader.parameter(&name(&format!("{which}.bias")), out)?) } else { None };
            Ok((weight, bias))
        };
        Ok(Self {
            q: projection("q_proj", heads * head_dim)?,
            k: projection("k_proj", kv_heads * head_dim)?,
            v: projection("v_proj", kv_heads * head_dim)?,
            o: reader.matrix(&name("o_proj.weight"), [hidden, heads * head_dim])?,
            qk_norm: if qk_norm {
                Some((
                    reader.parameter(&name("q_norm.weight"), head_dim)?,
                    reader.parameter(&name("k_norm.weight"), head_dim)?,
                ))
            } else {
                None
            },
        })
    }

    /// Attention output `[tokens, hidden]` for normed input `x`, the cached post-RoPE K and V taken from `kv` and
    /// passed through `tap` (observed, then fake-quantized to FP8 if asked).
    ///
    /// With [`KvSource::Split`] K and V of each sequence's first `prompt[i]` tokens come from `prefill` applied to
    /// `prefill_input`, the rest from `self` applied to `x`; queries and the output projection use `self`. Rows of
    /// prompt positions in the result are not meaningful.
    pub fn forward(
        &self,
        context: &LayerContext,
        x: &Tensor,
        spans: &Spans,
        kv: KvSource<GqaWeights>,
        tap: &mut KvTap,
    ) -> Result<Tensor, RuntimeError> {
        let LayerContext { backend, config, table, .. } = *context;
        let (kv_heads, head_dim, _, _) = dims(config);
        let q = self.queries(backend, config, x, spans, table)?;
        let (mut k, mut v) = self.keys_values(backend, config, x, spans, table)?;
        if let KvSource::Split { prefill, prefill_input: x_prefill, prompt } = kv {
            let (k_prefill, v_prefill) = prefill.keys_values(backend, config, x_prefill, spans, table)?;
            for ((start, _), &length) in spans.iter().zip(prompt) {
                backend.copy_rows(&mut k, &k_prefill, start..start + length)?;
                backend.copy_rows(&mut v, &v_prefill, start..start + length)?;
            }
        }
        tap.apply_gqa(backend, (&mut k, &mut v), kv_heads, head_dim)?;
        self.attend(backend, config, q, &k, &v, spans)
    }

    /// Queries `[tokens, heads·head_dim]`, normed per head (GLM-4.5 `use_qk_norm`) and rotated per sequence.
    fn queries(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &Tensor,
        spans: &Spans,
        table: &RopeTable,
    ) -> Result<Tensor, RuntimeError> {
        let (_, head_dim, _, _) = dims(config);
        let mut q = backend.linear(x, &self.q.0, self.q.1.as_ref())?;
        if let Some((q_norm, _)) = &self.qk_norm {
            backend.rms_norm(&mut q, head_dim, q_norm, config.rms_norm_eps as f32)?;
        }
        rotate_per_sequence(backend, &mut q, head_dim, spans, table)?;
        Ok(q)
    }

    /// Post-RoPE keys and values `[tokens, kv_heads·head_dim]`.
    fn keys_values(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &Tensor,
        spans: &Spans,
        table: &RopeTable,
    ) -> Result<(Tensor, Tensor), RuntimeError> {
        let (_, head_dim, _, _) = dims(config);
        let mut k = backend.linear(x, &self.k.0, self.k.1.as_ref())?;
        let v = backend.linear(x, &self.v.0, self.v.1.as_ref())?;
        if let Some((_, k_norm)) = &self.qk_norm {
            backend.rms_norm(&mut k, head_dim, k_norm, config.rms_norm_eps as f32)?;
        }
        rotate_per_sequence(backend, &mut k, head_dim, spans, table)?;
        Ok((k, v))
    }

    /// Per-sequence causal attention and the output projection.
    fn attend(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        q: Tensor,
        k: &Tensor,
        v: &Tensor,
        spans: &Spans,
    ) -> Result<Tensor, RuntimeError> {
        let (kv_heads, head_dim, _, _) = dims(config);
        let heads = config.num_attention_heads;
        let scale = (head_dim as f32).powf(-0.5);
        let mut output = backend.empty(spans.total(), heads * head_dim)?;
        for (start, length) in spans.iter() {
            let shape = AttentionShape { tokens: length, heads, kv_heads, qk_dim: head_dim, v_dim: head_dim, scale };
            let attended = backend.attention(&q, k, v, start..start + length, &shape, None)?;
            backend.place_rows(&mut output, start, &attended)?;
        }
        backend.linear(&output, &self.o, None)
    }
}

impl GqaWeights {
    /// Cache rows `[tokens, 2·kv_heads·head_dim]` (`[K | V]`, K post-RoPE) of normed input `x` at `positions`, and
    /// the post-RoPE queries of the same tokens.
    pub fn project(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        table: &RopeTable,
        x: &Tensor,
        positions: &[usize],
    ) -> Result<(Tensor, Tensor), RuntimeError> {
        let (_, head_dim, _, _) = dims(config);
        let eps = config.rms_norm_eps as f32;
        let (q, k, v) = (&self.q, &self.k, &self.v);
        let mut queries = backend.linear(x, &q.0, q.1.as_ref())?;
        let mut keys = backend.linear(x, &k.0, k.1.as_ref())?;
        let values = backend.linear(x, &v.0, v.1.as_ref())?;
        if let Some((q_norm, k_norm)) = &self.qk_norm {
            backend.rms_norm(&mut queries, head_dim, q_norm, eps)?;
            backend.rms_norm(&mut keys, head_dim, k_norm, eps)?;
        }
        let rot = table.rotary_dim;
        for (t, &position) in positions.iter().enumerate() {
            let call = RopeCall {
                rows: t..t + 1,
                first_position: position,
                head_dim,
                offset: 0,
                rotary_dim: rot,
                table,
                style: RopeStyle::Half,
            };
            backend.rope(&mut queries, &call)?;
            backend.rope(&mut keys, &call)?;
        }
        Ok((backend.concat_columns(&[&keys, &values])?, queries))
    }

    /// How the paged attention reads the cached rows.
    pub fn layout(config: &ModelConfig) -> PagedLayout {
        let (kv_heads, head_dim, _, _) = dims(config);
        PagedLayout::gqa(config.num_attention_heads, kv_heads, head_dim, (head_dim as f32).powf(-0.5))
    }

    /// `o_proj` of the attention outputs.
    pub fn output(&self, backend: &dyn Backend, attended: &Tensor) -> Result<Tensor, RuntimeError> {
        backend.linear(attended, &self.o, None)
    }
}

/// RoPE (half-rotation style) on every head of `x` `[tokens, heads·head_dim]`, each sequence of `spans` from
/// position 0.
fn rotate_per_sequence(
    backend: &dyn Backend,
    x: &mut Tensor,
    head_dim: usize,
    spans: &Spans,
    table: &RopeTable,
) -> Result<(), RuntimeError> {
    for (start, length) in spans.iter() {
        check_positions(table, length)?;
        let call = RopeCall {
            rows: start..start + length,
            first_position: 0,
            head_dim,
            offset: 0,
            rotary_dim: table.rotary_dim,
            table,
            style: RopeStyle::Half,
        };
        backend.rope(x, &call)?;
    }
    Ok(())
}

//! Grouped-query attention of GLM-4.5: biased q/k/v projections, optional per-head RMSNorm of q and k, rotate-half
//! RoPE on the first `partial_rotary_factor` of each head; over whole sequences, or as the decode step's cache rows
//! and queries at their positions.

use super::tap::{CachedKv, KvSource, KvTap};
use crate::model::config::Attention;
use crate::model::ModelConfig;
use crate::runtime::backend::{AttentionShape, Backend, Matrix, PagedLayout, RopeStyle};
use crate::runtime::rope_table::{check_positions, rope_at, RopeTable};
use crate::runtime::weights::WeightReader;
use crate::runtime::{RuntimeError, Spans};

pub struct GqaWeights {
    q: (Matrix, Option<Vec<f32>>),
    k: (Matrix, Option<Vec<f32>>),
    v: (Matrix, Option<Vec<f32>>),
    o: Matrix,
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
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
        let projection = |which: &str, out: usize| -> Result<(Matrix, Option<Vec<f32>>), RuntimeError> {
            let weight = reader.matrix(&name(&format!("{which}.weight")), [out, hidden])?;
            let bias = if bias { Some(reader.vector(&name(&format!("{which}.bias")), out)?) } else { None };
            Ok((weight, bias))
        };
        Ok(Self {
            q: projection("q_proj", heads * head_dim)?,
            k: projection("k_proj", kv_heads * head_dim)?,
            v: projection("v_proj", kv_heads * head_dim)?,
            o: reader.matrix(&name("o_proj.weight"), [hidden, heads * head_dim])?,
            qk_norm: if qk_norm {
                Some((
                    reader.vector(&name("q_norm.weight"), head_dim)?,
                    reader.vector(&name("k_norm.weight"), head_dim)?,
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
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        spans: &Spans,
        table: &RopeTable,
        kv: KvSource<GqaWeights>,
        tap: &mut KvTap,
    ) -> Result<Vec<f32>, RuntimeError> {
        let (kv_heads, head_dim, _, _) = dims(config);
        let width = kv_heads * head_dim;
        let q = self.queries(backend, config, x, spans, table)?;
        let (mut k, mut v) = self.keys_values(backend, config, x, spans, table)?;
        if let KvSource::Split { prefill, prefill_input: x_prefill, prompt } = kv {
            let (k_prefill, v_prefill) = prefill.keys_values(backend, config, x_prefill, spans, table)?;
            for ((start, _), &length) in spans.iter().zip(prompt) {
                let range = start * width..(start + length) * width;
                k[range.clone()].copy_from_slice(&k_prefill[range.clone()]);
                v[range.clone()].copy_from_slice(&v_prefill[range]);
            }
        }
        tap.apply(CachedKv::Gqa { k: &mut k, v: &mut v, heads: kv_heads, head_dim });
        Ok(self.attend(backend, config, q, &k, &v, spans))
    }

    /// Post-norm, post-RoPE queries `[tokens, heads, head_dim]`.
    fn queries(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        spans: &Spans,
        table: &RopeTable,
    ) -> Result<Vec<f32>, RuntimeError> {
        let (_, head_dim, _, _) = dims(config);
        let heads = config.num_attention_heads;
        let mut q = backend.linear(x, spans.total(), &self.q.0, self.q.1.as_deref());
        if let Some((q_norm, _)) = &self.qk_norm {
            backend.rms_norm(&mut q, head_dim, q_norm, config.rms_norm_eps as f32);
        }
        for (start, length) in spans.iter() {
            check_positions(table, length)?;
            let q_seq = &mut q[start * heads * head_dim..(start + length) * heads * head_dim];
            backend.rope(
                q_seq,
                length,
                heads * head_dim,
                head_dim,
                0,
                table.rotary_dim,
                &table.cos,
                &table.sin,
                RopeStyle::Half,
            );
        }
        Ok(q)
    }

    /// What the engines cache: post-norm, post-RoPE K and V `[tokens, kv_heads, head_dim]`.
    fn keys_values(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        spans: &Spans,
        table: &RopeTable,
    ) -> Result<(Vec<f32>, Vec<f32>), RuntimeError> {
        let (kv_heads, head_dim, _, _) = dims(config);
        let tokens = spans.total();
        let mut k = backend.linear(x, tokens, &self.k.0, self.k.1.as_deref());
        let v = backend.linear(x, tokens, &self.v.0, self.v.1.as_deref());
        if let Some((_, k_norm)) = &self.qk_norm {
            backend.rms_norm(&mut k, head_dim, k_norm, config.rms_norm_eps as f32);
        }
        for (start, length) in spans.iter() {
            check_positions(table, length)?;
            let k_seq = &mut k[start * kv_heads * head_dim..(start + length) * kv_heads * head_dim];
            backend.rope(
                k_seq,
                length,
                kv_heads * head_dim,
                head_dim,
                0,
                table.rotary_dim,
                &table.cos,
                &table.sin,
                RopeStyle::Half,
            );
        }
        Ok((k, v))
    }

    fn attend(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        q: Vec<f32>,
        k: &[f32],
        v: &[f32],
        spans: &Spans,
    ) -> Vec<f32> {
        let (kv_heads, head_dim, _, _) = dims(config);
        let heads = config.num_attention_heads;
        let tokens = spans.total();
        let scale = (head_dim as f32).powf(-0.5);
        let mut output = vec![0f32; tokens * heads * head_dim];
        for (start, length) in spans.iter() {
            let q_seq = &q[start * heads * head_dim..(start + length) * heads * head_dim];
            let k_seq = &k[start * kv_heads * head_dim..(start + length) * kv_heads * head_dim];
            let v_seq = &v[start * kv_heads * head_dim..(start + length) * kv_heads * head_dim];
            let shape = AttentionShape { tokens: length, heads, kv_heads, qk_dim: head_dim, v_dim: head_dim, scale };
            let attended = backend.attention(q_seq, k_seq, v_seq, &shape, None);
            output[start * heads * head_dim..][..length * heads * head_dim].copy_from_slice(&attended);
        }
        backend.linear(&output, tokens, &self.o, None)
    }
}

impl GqaWeights {
    /// Decode step: cache rows `[tokens, 2 · kv_heads · head_dim]` (post-RoPE K, then V) of normed input `x` at
    /// `positions`, and the post-RoPE queries `[tokens, heads, head_dim]` of the same tokens.
    pub fn project(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        table: &RopeTable,
        x: &[f32],
        positions: &[usize],
    ) -> (Vec<f32>, Vec<f32>) {
        let tokens = positions.len();
        let (kv_heads, head_dim, _, _) = dims(config);
        let heads = config.num_attention_heads;
        let eps = config.rms_norm_eps as f32;
        let (q, k, v) = (&self.q, &self.k, &self.v);
        let mut queries = backend.linear(x, tokens, &q.0, q.1.as_deref());
        let mut keys = backend.linear(x, tokens, &k.0, k.1.as_deref());
        let values = backend.linear(x, tokens, &v.0, v.1.as_deref());
        if let Some((q_norm, k_norm)) = &self.qk_norm {
            backend.rms_norm(&mut queries, head_dim, q_norm, eps);
            backend.rms_norm(&mut keys, head_dim, k_norm, eps);
        }
        let width = kv_heads * head_dim;
        let mut rows = Vec::with_capacity(tokens * 2 * width);
        for (t, &position) in positions.iter().enumerate() {
            let rot = table.rotary_dim;
            let q_row = &mut queries[t * heads * head_dim..][..heads * head_dim];
            rope_at(backend, table, q_row, head_dim, 0, rot, position, RopeStyle::Half);
            let k_row = &mut keys[t * width..][..width];
            rope_at(backend, table, k_row, head_dim, 0, rot, position, RopeStyle::Half);
            rows.extend_from_slice(k_row);
            rows.extend_from_slice(&values[t * width..][..width]);
        }
        (rows, queries)
    }

    /// How the paged attention reads the cached rows: GQA heads over `[K | V]`.
    pub fn layout(config: &ModelConfig) -> PagedLayout {
        let (kv_heads, head_dim, _, _) = dims(config);
        PagedLayout::gqa(config.num_attention_heads, kv_heads, head_dim, (head_dim as f32).powf(-0.5))
    }

    /// `o_proj` of the attention outputs.
    pub fn output(&self, backend: &dyn Backend, attended: &[f32], tokens: usize) -> Vec<f32> {
        backend.linear(attended, tokens, &self.o, None)
    }
}

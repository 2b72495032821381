//! Grouped-query attention of GLM-4.5: biased q/k/v projections, optional per-head RMSNorm of q and k, rotate-half
//! RoPE on the first `partial_rotary_factor` of each head.

use super::backend::{AttentionShape, Backend, Matrix, RopeStyle};
use super::layer::{CachedKv, KvTap};
use super::rope_table::RopeTable;
use super::weights::WeightReader;
use super::{RuntimeError, Spans};
use crate::model::config::Attention;
use crate::model::ModelConfig;

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

    pub fn load(reader: &WeightReader, config: &ModelConfig, prefix: &str) -> Result<Self, RuntimeError> {
        let (kv_heads, head_dim, bias, qk_norm) = dims(config);
        let hidden = config.hidden_size;
        let heads = config.num_attention_heads;
        let name = |suffix: &str| format!("{prefix}.self_attn.{suffix}");
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

    #[allow(dead_code)] // the untapped entry point, kept for other callers
    pub fn forward(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        spans: &Spans,
        table: &RopeTable,
    ) -> Result<Vec<f32>, RuntimeError> {
        self.forward_tapped(backend, config, x, spans, table, &mut KvTap::default())
    }

    /// [`Self::forward`] with a tap on the cached post-RoPE K and V: observed, then fake-quantized to FP8 if asked.
    pub fn forward_tapped(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        spans: &Spans,
        table: &RopeTable,
        tap: &mut KvTap,
    ) -> Result<Vec<f32>, RuntimeError> {
        let (kv_heads, head_dim, _, _) = dims(config);
        let q = self.queries(backend, config, x, spans, table)?;
        let (mut k, mut v) = self.keys_values(backend, config, x, spans, table)?;
        tap.apply(CachedKv::Gqa { k: &mut k, v: &mut v, heads: kv_heads, head_dim });
        Ok(self.attend(backend, config, q, &k, &v, spans))
    }

    /// Split prefill/decode: K and V of each sequence's first `prompt[i]` tokens come from `prefill` applied to
    /// `x_prefill`, the rest from `self` applied to `x`; all are fake-quantized with `tap`; queries and the output
    /// projection use `self`. Rows of prompt positions in the result are not meaningful.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_split(
        &self,
        prefill: &GqaWeights,
        backend: &dyn Backend,
        config: &ModelConfig,
        x_prefill: &[f32],
        x: &[f32],
        spans: &Spans,
        prompt: &[usize],
        table: &RopeTable,
        tap: &mut KvTap,
    ) -> Result<Vec<f32>, RuntimeError> {
        let (kv_heads, head_dim, _, _) = dims(config);
        let width = kv_heads * head_dim;
        let q = self.queries(backend, config, x, spans, table)?;
        let (mut k, mut v) = self.keys_values(backend, config, x, spans, table)?;
        let (k_prefill, v_prefill) = prefill.keys_values(backend, config, x_prefill, spans, table)?;
        for ((start, _), &length) in spans.iter().zip(prompt) {
            let range = start * width..(start + length) * width;
            k[range.clone()].copy_from_slice(&k_prefill[range.clone()]);
            v[range.clone()].copy_from_slice(&v_prefill[range]);
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
            super::mla::check_positions(table, length)?;
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
            super::mla::check_positions(table, length)?;
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

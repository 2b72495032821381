//! Multi-head latent attention (DeepSeek-V3 / Kimi K2 / GLM-5): low-rank queries and a compressed KV latent with a
//! shared interleaved-RoPE key part, expanded per head by `kv_b_proj`; GLM-5 adds the DSA index selection.

use super::backend::{AttentionShape, Backend, Matrix, RopeStyle};
use super::indexer::{self, IndexerWeights, Selection};
use super::layer::{CachedKv, KvTap};
use super::rope_table::RopeTable;
use super::weights::WeightReader;
use super::{RuntimeError, Spans};
use crate::model::config::Attention;
use crate::model::ModelConfig;

/// transformers builds `q_a_layernorm`/`kv_a_layernorm` with the RMSNorm default eps, not `rms_norm_eps`.
const LATENT_NORM_EPS: f32 = 1e-6;

pub struct MlaWeights {
    q_a: Option<(Matrix, Vec<f32>)>,
    q_b: Matrix,
    kv_a: Matrix,
    kv_a_norm: Vec<f32>,
    kv_b: Matrix,
    o: Matrix,
    pub indexer: Option<IndexerWeights>,
}

#[derive(Clone, Copy)]
struct Dims {
    heads: usize,
    kv_lora: usize,
    nope: usize,
    rope: usize,
    v: usize,
}

fn dims(config: &ModelConfig) -> (Dims, Option<usize>) {
    match &config.attention {
        Attention::Mla { q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => (
            Dims {
                heads: config.num_attention_heads,
                kv_lora: *kv_lora_rank,
                nope: *qk_nope_head_dim,
                rope: *qk_rope_head_dim,
                v: *v_head_dim,
            },
            *q_lora_rank,
        ),
        Attention::Gqa { .. } => unreachable!("MLA weights requested for a GQA model"),
    }
}

impl MlaWeights {
    /// Every weight matrix (for device prefetch).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all: Vec<&Matrix> = self.q_a.iter().map(|(m, _)| m).collect();
        all.extend([&self.q_b, &self.kv_a, &self.kv_b, &self.o]);
        all.extend(self.indexer.iter().flat_map(IndexerWeights::matrices));
        all
    }

    pub fn load(
        reader: &WeightReader,
        config: &ModelConfig,
        prefix: &str,
        with_indexer: bool,
    ) -> Result<Self, RuntimeError> {
        let (d, q_lora) = dims(config);
        let hidden = config.hidden_size;
        let qk = d.nope + d.rope;
        let name = |suffix: &str| format!("{prefix}.self_attn.{suffix}");
        let (q_a, q_b) = match q_lora {
            Some(rank) => (
                Some((
                    reader.matrix(&name("q_a_proj.weight"), [rank, hidden])?,
                    reader.vector(&name("q_a_layernorm.weight"), rank)?,
                )),
                reader.matrix(&name("q_b_proj.weight"), [d.heads * qk, rank])?,
            ),
            None => (None, reader.matrix(&name("q_proj.weight"), [d.heads * qk, hidden])?),
        };
        let indexer = match (&config.indexer, with_indexer) {
            (Some(settings), true) => {
                Some(IndexerWeights::load(reader, settings, hidden, q_lora.unwrap_or(hidden), &name("indexer"))?)
            }
            _ => None,
        };
        Ok(Self {
            q_a,
            q_b,
            kv_a: reader.matrix(&name("kv_a_proj_with_mqa.weight"), [d.kv_lora + d.rope, hidden])?,
            kv_a_norm: reader.vector(&name("kv_a_layernorm.weight"), d.kv_lora)?,
            kv_b: reader.matrix(&name("kv_b_proj.weight"), [d.heads * (d.nope + d.v), d.kv_lora])?,
            o: reader.matrix(&name("o_proj.weight"), [hidden, d.heads * d.v])?,
            indexer,
        })
    }

    /// Attention output `[tokens, hidden]` for normed input `x`. `selection` carries the DSA top-k between layers:
    /// a layer with an indexer replaces it, a shared layer reuses it.
    #[allow(clippy::too_many_arguments)]
    #[allow(dead_code)] // the untapped entry point, kept for other callers
    pub fn forward(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        spans: &Spans,
        table: &RopeTable,
        scale: f32,
        selection: &mut Option<Selection>,
        near_ties: &mut usize,
    ) -> Result<Vec<f32>, RuntimeError> {
        self.forward_tapped(backend, config, x, spans, table, scale, selection, near_ties, &mut KvTap::default())
    }

    /// [`Self::forward`] with a tap on the cached latent rows: observed, then fake-quantized to FP8 if asked.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_tapped(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        spans: &Spans,
        table: &RopeTable,
        scale: f32,
        selection: &mut Option<Selection>,
        near_ties: &mut usize,
        tap: &mut KvTap,
    ) -> Result<Vec<f32>, RuntimeError> {
        let (d, _) = dims(config);
        let (q, q_resid) = self.queries(backend, x, spans.total());
        let mut rows = self.cache_rows(backend, config, x, spans, table)?;
        tap.apply(CachedKv::Mla { rows: &mut rows, width: d.kv_lora + d.rope });
        self.attend(backend, config, x, q, &q_resid, &rows, spans, table, scale, selection, near_ties)
    }

    /// Split prefill/decode: the cached rows of each sequence's first `prompt[i]` tokens come from `prefill`
    /// (weights) applied to `x_prefill`, the rest from `self` applied to `x`; all rows are fake-quantized to FP8
    /// with `tap` (the handoff and the decode cache), and every query, the latent expansion and the output
    /// projection use `self`. Rows of prompt positions in the result are not meaningful.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_split(
        &self,
        prefill: &MlaWeights,
        backend: &dyn Backend,
        config: &ModelConfig,
        x_prefill: &[f32],
        x: &[f32],
        spans: &Spans,
        prompt: &[usize],
        table: &RopeTable,
        scale: f32,
        selection: &mut Option<Selection>,
        near_ties: &mut usize,
        tap: &mut KvTap,
    ) -> Result<Vec<f32>, RuntimeError> {
        let (d, _) = dims(config);
        let width = d.kv_lora + d.rope;
        let tokens = spans.total();
        let (q, q_resid_decode) = self.queries(backend, x, tokens);
        let (_, q_resid_prefill) = prefill.queries(backend, x_prefill, tokens);
        let mut rows = self.cache_rows(backend, config, x, spans, table)?;
        let rows_prefill = prefill.cache_rows(backend, config, x_prefill, spans, table)?;
        let hidden = config.hidden_size;
        let q_width = q_resid_decode.len() / tokens.max(1);
        let mut x_mixed = x.to_vec();
        let mut q_resid = q_resid_decode;
        for ((start, _), &length) in spans.iter().zip(prompt) {
            let range = start..start + length;
            rows[range.start * width..range.end * width]
                .copy_from_slice(&rows_prefill[range.start * width..range.end * width]);
            x_mixed[range.start * hidden..range.end * hidden]
                .copy_from_slice(&x_prefill[range.start * hidden..range.end * hidden]);
            q_resid[range.start * q_width..range.end * q_width]
                .copy_from_slice(&q_resid_prefill[range.start * q_width..range.end * q_width]);
        }
        tap.apply(CachedKv::Mla { rows: &mut rows, width });
        self.attend(backend, config, &x_mixed, q, &q_resid, &rows, spans, table, scale, selection, near_ties)
    }

    /// Queries `[tokens, heads·qk]` (before RoPE) and the query input of the indexer (the normed q latent).
    fn queries(&self, backend: &dyn Backend, x: &[f32], tokens: usize) -> (Vec<f32>, Vec<f32>) {
        let q_resid = match &self.q_a {
            Some((q_a, norm)) => {
                let mut latent = backend.linear(x, tokens, q_a, None);
                backend.rms_norm(&mut latent, q_a.rows, norm, LATENT_NORM_EPS);
                latent
            }
            None => x.to_vec(),
        };
        (backend.linear(&q_resid, tokens, &self.q_b, None), q_resid)
    }

    /// What the engines cache per token: `[tokens, kv_lora + rope]` rows of the normed latent `kv_c_normed` and
    /// the post-RoPE shared key `k_pe`.
    fn cache_rows(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        spans: &Spans,
        table: &RopeTable,
    ) -> Result<Vec<f32>, RuntimeError> {
        let (d, _) = dims(config);
        let tokens = spans.total();
        let compressed = backend.linear(x, tokens, &self.kv_a, None);
        let mut latent = Vec::with_capacity(tokens * d.kv_lora);
        let mut k_rot = Vec::with_capacity(tokens * d.rope);
        for row in compressed.chunks(d.kv_lora + d.rope) {
            latent.extend_from_slice(&row[..d.kv_lora]);
            k_rot.extend_from_slice(&row[d.kv_lora..]);
        }
        backend.rms_norm(&mut latent, d.kv_lora, &self.kv_a_norm, LATENT_NORM_EPS);
        let style = if config.rope.interleave { RopeStyle::Interleaved } else { RopeStyle::Half };
        for (start, length) in spans.iter() {
            check_positions(table, length)?;
            let k_rot_seq = &mut k_rot[start * d.rope..(start + length) * d.rope];
            backend.rope(k_rot_seq, length, d.rope, d.rope, 0, d.rope, &table.cos, &table.sin, style);
        }
        let mut rows = Vec::with_capacity(tokens * (d.kv_lora + d.rope));
        for (latent_row, rot_row) in latent.chunks(d.kv_lora).zip(k_rot.chunks(d.rope)) {
            rows.extend_from_slice(latent_row);
            rows.extend_from_slice(rot_row);
        }
        Ok(rows)
    }

    /// Attention over cached rows: the latent expanded per head by `kv_b_proj`, the DSA selection, output projection.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        mut q: Vec<f32>,
        q_resid: &[f32],
        rows: &[f32],
        spans: &Spans,
        table: &RopeTable,
        scale: f32,
        selection: &mut Option<Selection>,
        near_ties: &mut usize,
    ) -> Result<Vec<f32>, RuntimeError> {
        let (d, _) = dims(config);
        let tokens = spans.total();
        let qk = d.nope + d.rope;
        let width = d.kv_lora + d.rope;
        let mut latent = Vec::with_capacity(tokens * d.kv_lora);
        for row in rows.chunks(width) {
            latent.extend_from_slice(&row[..d.kv_lora]);
        }
        let kv = backend.linear(&latent, tokens, &self.kv_b, None);

        if let Some(indexer) = &self.indexer {
            let (chosen, ties) = indexer::select(backend, indexer, config, x, q_resid, spans, table)?;
            *near_ties += ties;
            *selection = Some(chosen);
        }
        let style = if config.rope.interleave { RopeStyle::Interleaved } else { RopeStyle::Half };
        let mut output = vec![0f32; tokens * d.heads * d.v];
        for (index, (start, length)) in spans.iter().enumerate() {
            check_positions(table, length)?;
            let q_seq = &mut q[start * d.heads * qk..(start + length) * d.heads * qk];
            backend.rope(q_seq, length, d.heads * qk, qk, d.nope, d.rope, &table.cos, &table.sin, style);
            // Expand the latent per head: k = [k_nope_h, k_rot], v = v_h.
            let mut k = vec![0f32; length * d.heads * qk];
            let mut v = vec![0f32; length * d.heads * d.v];
            for t in 0..length {
                let kv_row = &kv[(start + t) * d.heads * (d.nope + d.v)..][..d.heads * (d.nope + d.v)];
                let k_rot = &rows[(start + t) * width + d.kv_lora..][..d.rope];
                for h in 0..d.heads {
                    let source = &kv_row[h * (d.nope + d.v)..][..d.nope + d.v];
                    let key = &mut k[(t * d.heads + h) * qk..][..qk];
                    key[..d.nope].copy_from_slice(&source[..d.nope]);
                    key[d.nope..].copy_from_slice(k_rot);
                    v[(t * d.heads + h) * d.v..][..d.v].copy_from_slice(&source[d.nope..]);
                }
            }
            let shape =
                AttentionShape { tokens: length, heads: d.heads, kv_heads: d.heads, qk_dim: qk, v_dim: d.v, scale };
            let allowed = match (&config.indexer, selection.as_ref()) {
                (Some(_), Some(chosen)) => Some(chosen.masks[index].as_slice()),
                (Some(_), None) => return Err(RuntimeError::Input("a shared DSA layer needs the top-k of an earlier full indexer layer, but no earlier layer has an indexer".into())),
                _ => None,
            };
            let attended = backend.attention(q_seq, &k, &v, &shape, allowed);
            output[start * d.heads * d.v..][..length * d.heads * d.v].copy_from_slice(&attended);
        }
        Ok(backend.linear(&output, tokens, &self.o, None))
    }
}

pub fn check_positions(table: &RopeTable, length: usize) -> Result<(), RuntimeError> {
    if length > table.positions {
        return Err(RuntimeError::Input(format!(
            "a sequence of {length} tokens is longer than the {} positions the runtime was opened for",
            table.positions
        )));
    }
    Ok(())
}

//! Multi-head latent attention (DeepSeek-V3 / Kimi K2 / GLM-5): low-rank queries and a compressed KV latent with a
//! shared interleaved-RoPE key part, expanded per head by `kv_b_proj` over whole sequences, or absorbed into the
//! queries and outputs for the decode step over cached latent rows; GLM-5 adds the DSA index selection.

use super::indexer::{DsaMasks, IndexQueries, IndexerWeights};
use super::tap::{CachedKv, KvSource, KvTap};
use crate::model::config::Attention;
use crate::model::ModelConfig;
use crate::runtime::backend::{AttentionShape, Backend, Matrix, PagedLayout, RopeStyle};
use crate::runtime::rope_table::{check_positions, rope_at, RopeTable};
use crate::runtime::weights::WeightReader;
use crate::runtime::{RuntimeError, Spans};

/// transformers builds `q_a_layernorm`/`kv_a_layernorm` with the RMSNorm default eps, not `rms_norm_eps`.
const LATENT_NORM_EPS: f32 = 1e-6;

pub struct MlaWeights {
    q_a: Option<(Matrix, Vec<f32>)>,
    q_b: Matrix,
    kv_a: Matrix,
    kv_a_norm: Vec<f32>,
    kv_b: Matrix,
    o: Matrix,
    indexer: Option<IndexerWeights>,
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

    /// The attention weights of decoder layer `layer` (with its DSA indexer where it runs one).
    pub fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let (d, q_lora) = dims(config);
        let hidden = config.hidden_size;
        let qk = d.nope + d.rope;
        let name = |suffix: &str| format!("model.layers.{layer}.self_attn.{suffix}");
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
        let indexer = IndexerWeights::load_layer(reader, config, layer)?;
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

    /// Attention output `[tokens, hidden]` for normed input `x`, the cached rows taken from `kv` and passed through
    /// `tap` (observed, then fake-quantized to FP8 if asked). `selection` carries the DSA top-k between layers: a
    /// layer with an indexer replaces it, a shared layer reuses it.
    ///
    /// With [`KvSource::Split`] the cached rows of each sequence's first `prompt[i]` tokens come from `prefill`
    /// (weights) applied to `prefill_input`, the rest from `self` applied to `x`; all rows go through `tap` (the
    /// handoff and the decode cache), and every query, the latent expansion and the output projection use `self`.
    /// Rows of prompt positions in the result are not meaningful.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        spans: &Spans,
        table: &RopeTable,
        scale: f32,
        kv: KvSource<MlaWeights>,
        selection: &mut Option<DsaMasks>,
        near_ties: &mut usize,
        tap: &mut KvTap,
    ) -> Result<Vec<f32>, RuntimeError> {
        let (d, _) = dims(config);
        let width = d.kv_lora + d.rope;
        let tokens = spans.total();
        let KvSource::Split { prefill, prefill_input: x_prefill, prompt } = kv else {
            let (q, q_resid) = self.queries(backend, x, tokens);
            let mut rows = self.cache_rows(backend, config, x, spans, table)?;
            tap.apply(CachedKv::Mla { rows: &mut rows, width });
            return self.attend(backend, config, x, q, &q_resid, &rows, spans, table, scale, selection, near_ties);
        };
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
        selection: &mut Option<DsaMasks>,
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
            let (chosen, ties) = indexer.select(backend, config, x, q_resid, spans, table)?;
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

/// MLA weights for the decode step, with kv_b split per head for the absorbed form: the query's no-RoPE part goes
/// through `absorb_k[h]` (`W_UK_hᵀ` `[kv_lora, nope]`) to a latent query, and the attended latent through
/// `absorb_v[h]` (`W_UV_h` `[v, kv_lora]`) to the head's value.
pub struct MlaStep {
    q_a: Option<(Matrix, Vec<f32>)>,
    q_b: Matrix,
    kv_a: Matrix,
    kv_a_norm: Vec<f32>,
    absorb_k: Vec<Matrix>,
    absorb_v: Vec<Matrix>,
    o: Matrix,
    indexer: Option<IndexerWeights>,
}

impl MlaStep {
    pub fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let MlaWeights { q_a, q_b, kv_a, kv_a_norm, kv_b, o, indexer } = MlaWeights::load(reader, config, layer)?;
        let (d, _) = dims(config);
        let (heads, kv_lora, nope, v) = (d.heads, d.kv_lora, d.nope, d.v);
        // kv_b rows per head: nope rows of W_UK_h, then v rows of W_UV_h, each kv_lora wide.
        let head_rows = |h: usize| &kv_b.data[h * (nope + v) * kv_lora..][..(nope + v) * kv_lora];
        let absorb_k = (0..heads)
            .map(|h| {
                let w_uk = &head_rows(h)[..nope * kv_lora];
                let transposed = (0..kv_lora * nope).map(|i| w_uk[(i % nope) * kv_lora + i / nope]).collect();
                Matrix::new(kv_lora, nope, transposed)
            })
            .collect();
        let absorb_v = (0..heads).map(|h| Matrix::new(v, kv_lora, head_rows(h)[nope * kv_lora..].to_vec())).collect();
        Ok(Self { q_a, q_b, kv_a, kv_a_norm, absorb_k, absorb_v, o, indexer })
    }

    pub fn has_indexer(&self) -> bool {
        self.indexer.is_some()
    }

    /// Cache rows `[tokens, kv_lora + rope]` (normed latent, post-RoPE `k_pe`) and indexer keys
    /// `[tokens, aux_width]` of normed input `x` at `positions`, and the queries of the same tokens (`[tokens,
    /// heads, qk]` post-RoPE, and the DSA indexer's).
    pub fn project(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        table: &RopeTable,
        x: &[f32],
        positions: &[usize],
        aux_width: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>, Option<IndexQueries>) {
        let tokens = positions.len();
        let MlaStep { q_a, q_b, kv_a, kv_a_norm, indexer, .. } = self;
        let (d, _) = dims(config);
        let (kv_lora, nope, rope, heads) = (d.kv_lora, d.nope, d.rope, d.heads);
        let qk = nope + rope;
        let style = if config.rope.interleave { RopeStyle::Interleaved } else { RopeStyle::Half };
        let q_resid = match q_a {
            Some((q_a, norm)) => {
                let mut latent = backend.linear(x, tokens, q_a, None);
                backend.rms_norm(&mut latent, q_a.rows, norm, LATENT_NORM_EPS);
                latent
            }
            None => x.to_vec(),
        };
        let mut q = backend.linear(&q_resid, tokens, q_b, None);
        let compressed = backend.linear(x, tokens, kv_a, None);
        let mut latent = Vec::with_capacity(tokens * kv_lora);
        for row in compressed.chunks(kv_lora + rope) {
            latent.extend_from_slice(&row[..kv_lora]);
        }
        backend.rms_norm(&mut latent, kv_lora, kv_a_norm, LATENT_NORM_EPS);
        let mut rows = Vec::with_capacity(tokens * (kv_lora + rope));
        for (t, &position) in positions.iter().enumerate() {
            rope_at(backend, table, &mut q[t * heads * qk..][..heads * qk], qk, nope, rope, position, style);
            let mut k_pe = compressed[t * (kv_lora + rope) + kv_lora..][..rope].to_vec();
            rope_at(backend, table, &mut k_pe, rope, 0, rope, position, style);
            rows.extend_from_slice(&latent[t * kv_lora..][..kv_lora]);
            rows.extend_from_slice(&k_pe);
        }
        let (aux, index) = match (indexer, &config.indexer) {
            (Some(weights), Some(settings)) => {
                let (keys, queries) = weights.project(backend, settings, table, x, &q_resid, positions);
                (keys, Some(queries))
            }
            _ => (vec![0f32; tokens * aux_width], None),
        };
        (rows, aux, q, index)
    }

    /// How the paged attention reads the cached rows: in the absorbed form.
    pub fn layout(config: &ModelConfig, mla_scale: f32) -> PagedLayout {
        let (d, _) = dims(config);
        PagedLayout::mla_absorbed(d.heads, d.kv_lora, d.rope, mla_scale)
    }

    /// The queries the paged attention takes, `[tokens, heads, kv_lora + rope]`: each head's `q_nope · W_UK_h`
    /// (kv_lora wide) followed by its `q_pe`.
    pub fn attention_queries(&self, backend: &dyn Backend, config: &ModelConfig, queries: &[f32]) -> Vec<f32> {
        let (d, _) = dims(config);
        let (kv_lora, nope, rope, heads) = (d.kv_lora, d.nope, d.rope, d.heads);
        let (qk, width) = (nope + rope, kv_lora + rope);
        let tokens = queries.len() / (heads * qk);
        let mut absorbed = vec![0f32; tokens * heads * width];
        for (h, absorb_k) in self.absorb_k.iter().enumerate() {
            let q_nope: Vec<f32> =
                (0..tokens).flat_map(|t| &queries[(t * heads + h) * qk..][..nope]).copied().collect();
            let latent = backend.linear(&q_nope, tokens, absorb_k, None);
            for t in 0..tokens {
                let row = &mut absorbed[(t * heads + h) * width..][..width];
                row[..kv_lora].copy_from_slice(&latent[t * kv_lora..][..kv_lora]);
                row[kv_lora..].copy_from_slice(&queries[(t * heads + h) * qk + nope..][..rope]);
            }
        }
        absorbed
    }

    /// The attention outputs `[tokens, heads · v_dim]` that `o_proj` takes, from the paged attention's
    /// `[tokens, heads, kv_lora]`: each head's attended latent through `W_UV_h`.
    pub fn attention_values(&self, backend: &dyn Backend, config: &ModelConfig, attended: Vec<f32>) -> Vec<f32> {
        let (d, _) = dims(config);
        let (kv_lora, v, heads) = (d.kv_lora, d.v, d.heads);
        let tokens = attended.len() / (heads * kv_lora);
        let mut values = vec![0f32; tokens * heads * v];
        for (h, absorb_v) in self.absorb_v.iter().enumerate() {
            let latent: Vec<f32> =
                (0..tokens).flat_map(|t| &attended[(t * heads + h) * kv_lora..][..kv_lora]).copied().collect();
            let head = backend.linear(&latent, tokens, absorb_v, None);
            for t in 0..tokens {
                values[(t * heads + h) * v..][..v].copy_from_slice(&head[t * v..][..v]);
            }
        }
        values
    }

    /// `o_proj` of the attention outputs.
    pub fn output(&self, backend: &dyn Backend, attended: &[f32], tokens: usize) -> Vec<f32> {
        backend.linear(attended, tokens, &self.o, None)
    }
}

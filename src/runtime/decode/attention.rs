//! Incremental attention of one decoder layer over cached rows: new tokens' cache rows (MLA latent + post-RoPE
//! `k_pe`, or GQA post-RoPE K and V) and their queries at their own positions, then single-query softmax attention
//! over a context of rows with the same arithmetic as the full-sequence CPU kernel.

use crate::model::config::{Attention, Indexer};
use crate::model::ModelConfig;
use crate::runtime::backend::{Backend, Matrix, PagedLayout, RopeStyle};
use crate::runtime::cpu::dot;
use crate::runtime::rope_table::RopeTable;
use crate::runtime::weights::WeightReader;
use crate::runtime::RuntimeError;

/// transformers builds `q_a_layernorm`/`kv_a_layernorm` with the RMSNorm default eps.
const LATENT_NORM_EPS: f32 = 1e-6;
/// transformers' indexer `k_norm` is `nn.LayerNorm(head_dim, eps=1e-6)`.
const INDEX_K_NORM_EPS: f32 = 1e-6;

pub struct IndexerStep {
    wq_b: Matrix,
    wk: Matrix,
    k_norm: (Vec<f32>, Vec<f32>),
    weights_proj: Matrix,
}

/// MLA weights, with kv_b split per head for the absorbed form: the query's no-RoPE part goes through
/// `absorb_k[h]` (`W_UK_hᵀ` `[kv_lora, nope]`) to a latent query, and the attended latent through `absorb_v[h]`
/// (`W_UV_h` `[v, kv_lora]`) to the head's value.
pub struct MlaStep {
    q_a: Option<(Matrix, Vec<f32>)>,
    q_b: Matrix,
    kv_a: Matrix,
    kv_a_norm: Vec<f32>,
    absorb_k: Vec<Matrix>,
    absorb_v: Vec<Matrix>,
    o: Matrix,
    indexer: Option<IndexerStep>,
}

pub enum StepAttention {
    Mla(Box<MlaStep>),
    Gqa(Box<GqaStep>),
}

/// GQA weights (projections with their optional biases) and the optional per-head q/k RMSNorm.
pub struct GqaStep {
    q: (Matrix, Option<Vec<f32>>),
    k: (Matrix, Option<Vec<f32>>),
    v: (Matrix, Option<Vec<f32>>),
    o: Matrix,
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
}

/// Per new token: its queries and what the DSA indexer needs to select its keys.
pub struct Queries {
    /// `[tokens, heads, qk]`, post-RoPE.
    pub q: Vec<f32>,
    /// Indexer queries `[tokens, index_heads, index_dim]` (post-RoPE) and head weights `[tokens, index_heads]`.
    pub index: Option<(Vec<f32>, Vec<f32>)>,
}

#[allow(clippy::too_many_arguments)]
fn rope_at(
    backend: &dyn Backend,
    table: &RopeTable,
    row: &mut [f32],
    head_dim: usize,
    offset: usize,
    rotary: usize,
    position: usize,
    style: RopeStyle,
) {
    let half = table.rotary_dim / 2;
    let (cos, sin) = (&table.cos[position * half..][..half], &table.sin[position * half..][..half]);
    backend.rope(row, 1, row.len(), head_dim, offset, rotary, cos, sin, style);
}

impl StepAttention {
    pub fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let hidden = config.hidden_size;
        let heads = config.num_attention_heads;
        let name = |suffix: &str| format!("model.layers.{layer}.self_attn.{suffix}");
        match &config.attention {
            Attention::Mla { q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
                let (kv_lora, nope, rope, v) = (*kv_lora_rank, *qk_nope_head_dim, *qk_rope_head_dim, *v_head_dim);
                let qk = nope + rope;
                let (q_a, q_b) = match q_lora_rank {
                    Some(rank) => (
                        Some((
                            reader.matrix(&name("q_a_proj.weight"), [*rank, hidden])?,
                            reader.vector(&name("q_a_layernorm.weight"), *rank)?,
                        )),
                        reader.matrix(&name("q_b_proj.weight"), [heads * qk, *rank])?,
                    ),
                    None => (None, reader.matrix(&name("q_proj.weight"), [heads * qk, hidden])?),
                };
                let with_indexer =
                    config.indexer.as_ref().is_some_and(|i| i.full_layers.get(layer).copied().unwrap_or(true));
                let indexer = match (&config.indexer, with_indexer) {
                    (Some(Indexer { index_n_heads, index_head_dim, .. }), true) => {
                        let prefix = name("indexer");
                        let q_input = q_lora_rank.unwrap_or(hidden);
                        Some(IndexerStep {
                            wq_b: reader
                                .matrix(&format!("{prefix}.wq_b.weight"), [index_n_heads * index_head_dim, q_input])?,
                            wk: reader.matrix(&format!("{prefix}.wk.weight"), [*index_head_dim, hidden])?,
                            k_norm: (
                                reader.vector(&format!("{prefix}.k_norm.weight"), *index_head_dim)?,
                                reader.vector(&format!("{prefix}.k_norm.bias"), *index_head_dim)?,
                            ),
                            weights_proj: reader
                                .matrix(&format!("{prefix}.weights_proj.weight"), [*index_n_heads, hidden])?,
                        })
                    }
                    _ => None,
                };
                let kv_b = reader.matrix(&name("kv_b_proj.weight"), [heads * (nope + v), kv_lora])?;
                // kv_b rows per head: nope rows of W_UK_h, then v rows of W_UV_h, each kv_lora wide.
                let head_rows = |h: usize| &kv_b.data[h * (nope + v) * kv_lora..][..(nope + v) * kv_lora];
                let absorb_k = (0..heads)
                    .map(|h| {
                        let w_uk = &head_rows(h)[..nope * kv_lora];
                        let transposed = (0..kv_lora * nope).map(|i| w_uk[(i % nope) * kv_lora + i / nope]).collect();
                        Matrix::new(kv_lora, nope, transposed)
                    })
                    .collect();
                let absorb_v =
                    (0..heads).map(|h| Matrix::new(v, kv_lora, head_rows(h)[nope * kv_lora..].to_vec())).collect();
                Ok(StepAttention::Mla(Box::new(MlaStep {
                    q_a,
                    q_b,
                    kv_a: reader.matrix(&name("kv_a_proj_with_mqa.weight"), [kv_lora + rope, hidden])?,
                    kv_a_norm: reader.vector(&name("kv_a_layernorm.weight"), kv_lora)?,
                    absorb_k,
                    absorb_v,
                    o: reader.matrix(&name("o_proj.weight"), [hidden, heads * v])?,
                    indexer,
                })))
            }
            Attention::Gqa { num_key_value_heads, head_dim, attention_bias, use_qk_norm, .. } => {
                let projection = |which: &str, out: usize| -> Result<(Matrix, Option<Vec<f32>>), RuntimeError> {
                    let weight = reader.matrix(&name(&format!("{which}.weight")), [out, hidden])?;
                    let bias =
                        if *attention_bias { Some(reader.vector(&name(&format!("{which}.bias")), out)?) } else { None };
                    Ok((weight, bias))
                };
                Ok(StepAttention::Gqa(Box::new(GqaStep {
                    q: projection("q_proj", heads * head_dim)?,
                    k: projection("k_proj", num_key_value_heads * head_dim)?,
                    v: projection("v_proj", num_key_value_heads * head_dim)?,
                    o: reader.matrix(&name("o_proj.weight"), [hidden, heads * head_dim])?,
                    qk_norm: if *use_qk_norm {
                        Some((
                            reader.vector(&name("q_norm.weight"), *head_dim)?,
                            reader.vector(&name("k_norm.weight"), *head_dim)?,
                        ))
                    } else {
                        None
                    },
                })))
            }
        }
    }

    pub fn has_indexer(&self) -> bool {
        matches!(self, StepAttention::Mla(mla) if mla.indexer.is_some())
    }

    /// Cache rows `[tokens, row_width]` and indexer keys `[tokens, aux_width]` of normed input `x` at `positions`,
    /// and the queries of the same tokens.
    pub fn project(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        table: &RopeTable,
        x: &[f32],
        positions: &[usize],
        aux_width: usize,
    ) -> (Vec<f32>, Vec<f32>, Queries) {
        let tokens = positions.len();
        match (self, &config.attention) {
            (StepAttention::Mla(mla), Attention::Mla { kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, .. }) => {
                let MlaStep { q_a, q_b, kv_a, kv_a_norm, indexer, .. } = mla.as_ref();
                let (kv_lora, nope, rope) = (*kv_lora_rank, *qk_nope_head_dim, *qk_rope_head_dim);
                let heads = config.num_attention_heads;
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
                        let (index_heads, dim) = (settings.index_n_heads, settings.index_head_dim);
                        let mut iq = backend.linear(&q_resid, tokens, &weights.wq_b, None);
                        let mut ik = backend.linear(x, tokens, &weights.wk, None);
                        backend.layer_norm(&mut ik, dim, &weights.k_norm.0, &weights.k_norm.1, INDEX_K_NORM_EPS);
                        let head_weights = backend.linear(x, tokens, &weights.weights_proj, None);
                        for (t, &position) in positions.iter().enumerate() {
                            let rot = table.rotary_dim;
                            let q_row = &mut iq[t * index_heads * dim..][..index_heads * dim];
                            rope_at(backend, table, q_row, dim, 0, rot, position, RopeStyle::Interleaved);
                            rope_at(
                                backend,
                                table,
                                &mut ik[t * dim..][..dim],
                                dim,
                                0,
                                rot,
                                position,
                                RopeStyle::Interleaved,
                            );
                        }
                        (ik, Some((iq, head_weights)))
                    }
                    _ => (vec![0f32; tokens * aux_width], None),
                };
                (rows, aux, Queries { q, index })
            }
            (StepAttention::Gqa(gqa), Attention::Gqa { num_key_value_heads, head_dim, .. }) => {
                let GqaStep { q, k, v, qk_norm, .. } = gqa.as_ref();
                let (kv_heads, head_dim) = (*num_key_value_heads, *head_dim);
                let heads = config.num_attention_heads;
                let eps = config.rms_norm_eps as f32;
                let mut queries = backend.linear(x, tokens, &q.0, q.1.as_deref());
                let mut keys = backend.linear(x, tokens, &k.0, k.1.as_deref());
                let values = backend.linear(x, tokens, &v.0, v.1.as_deref());
                if let Some((q_norm, k_norm)) = qk_norm {
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
                (rows, vec![0f32; tokens * aux_width], Queries { q: queries, index: None })
            }
            _ => unreachable!("attention weights of the other architecture"),
        }
    }

    /// DSA selection of one query over `count` cached indexer keys (`aux`): `None` when every key is kept.
    pub fn select(
        config: &ModelConfig,
        queries: &Queries,
        token: usize,
        aux: &[f32],
        count: usize,
    ) -> Option<Vec<bool>> {
        let settings = config.indexer.as_ref()?;
        let (iq, head_weights) = queries.index.as_ref()?;
        let (heads, dim, topk) = (settings.index_n_heads, settings.index_head_dim, settings.index_topk);
        if count <= topk {
            return None;
        }
        let softmax_scale = (dim as f32).powf(-0.5);
        let head_scale = (heads as f32).powf(-0.5);
        let q = &iq[token * heads * dim..][..heads * dim];
        let w = &head_weights[token * heads..][..heads];
        let mut scored: Vec<(f32, usize)> = (0..count)
            .map(|s| {
                let key = &aux[s * dim..][..dim];
                let score = (0..heads)
                    .map(|h| w[h] * head_scale * (dot(&q[h * dim..][..dim], key) * softmax_scale).max(0.0))
                    .sum::<f32>();
                (score, s)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut mask = vec![false; count];
        for &(_, s) in &scored[..topk] {
            mask[s] = true;
        }
        Some(mask)
    }

    /// How the paged attention reads this layer's cached rows: GQA heads over `[K | V]`, MLA in the absorbed form.
    pub fn layout(config: &ModelConfig, mla_scale: f32) -> PagedLayout {
        let heads = config.num_attention_heads;
        match &config.attention {
            Attention::Mla { kv_lora_rank, qk_rope_head_dim, .. } => {
                PagedLayout::mla_absorbed(heads, *kv_lora_rank, *qk_rope_head_dim, mla_scale)
            }
            Attention::Gqa { num_key_value_heads, head_dim, .. } => {
                PagedLayout::gqa(heads, *num_key_value_heads, *head_dim, (*head_dim as f32).powf(-0.5))
            }
        }
    }

    /// The queries the paged attention takes, `[tokens, heads, layout.qk_dim]`: GQA as projected; MLA absorbed —
    /// each head's `q_nope · W_UK_h` (kv_lora wide) followed by its `q_pe`.
    pub fn attention_queries(&self, backend: &dyn Backend, config: &ModelConfig, queries: &Queries) -> Vec<f32> {
        let (StepAttention::Mla(mla), Attention::Mla { kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, .. }) =
            (self, &config.attention)
        else {
            return queries.q.clone();
        };
        let (kv_lora, nope, rope) = (*kv_lora_rank, *qk_nope_head_dim, *qk_rope_head_dim);
        let heads = config.num_attention_heads;
        let (qk, width) = (nope + rope, kv_lora + rope);
        let tokens = queries.q.len() / (heads * qk);
        let mut absorbed = vec![0f32; tokens * heads * width];
        for (h, absorb_k) in mla.absorb_k.iter().enumerate() {
            let q_nope: Vec<f32> =
                (0..tokens).flat_map(|t| &queries.q[(t * heads + h) * qk..][..nope]).copied().collect();
            let latent = backend.linear(&q_nope, tokens, absorb_k, None);
            for t in 0..tokens {
                let row = &mut absorbed[(t * heads + h) * width..][..width];
                row[..kv_lora].copy_from_slice(&latent[t * kv_lora..][..kv_lora]);
                row[kv_lora..].copy_from_slice(&queries.q[(t * heads + h) * qk + nope..][..rope]);
            }
        }
        absorbed
    }

    /// The attention outputs `[tokens, heads · v_dim]` that `o_proj` takes, from the paged attention's
    /// `[tokens, heads, layout.v_dim]`: GQA as they are; MLA each head's attended latent through `W_UV_h`.
    pub fn attention_values(&self, backend: &dyn Backend, config: &ModelConfig, attended: Vec<f32>) -> Vec<f32> {
        let (StepAttention::Mla(mla), Attention::Mla { kv_lora_rank, v_head_dim, .. }) = (self, &config.attention)
        else {
            return attended;
        };
        let (kv_lora, v) = (*kv_lora_rank, *v_head_dim);
        let heads = config.num_attention_heads;
        let tokens = attended.len() / (heads * kv_lora);
        let mut values = vec![0f32; tokens * heads * v];
        for (h, absorb_v) in mla.absorb_v.iter().enumerate() {
            let latent: Vec<f32> =
                (0..tokens).flat_map(|t| &attended[(t * heads + h) * kv_lora..][..kv_lora]).copied().collect();
            let head = backend.linear(&latent, tokens, absorb_v, None);
            for t in 0..tokens {
                values[(t * heads + h) * v..][..v].copy_from_slice(&head[t * v..][..v]);
            }
        }
        values
    }

    pub fn output(&self, backend: &dyn Backend, attended: &[f32], tokens: usize) -> Vec<f32> {
        let o = match self {
            StepAttention::Mla(mla) => &mla.o,
            StepAttention::Gqa(gqa) => &gqa.o,
        };
        backend.linear(attended, tokens, o, None)
    }
}

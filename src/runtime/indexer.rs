//! GLM-5's DSA lightning indexer: scores every past token for each query with a few ReLU heads and keeps the
//! `index_topk` best; the attention of the layer (and of following `shared` layers) sees only those keys.

use super::backend::{Backend, Matrix, RopeStyle};
use super::rope_table::RopeTable;
use super::weights::WeightReader;
use super::{RuntimeError, Spans};
use crate::model::config::Indexer;
use crate::model::ModelConfig;

/// transformers' indexer `k_norm` is `nn.LayerNorm(head_dim, eps=1e-6)`.
const K_NORM_EPS: f32 = 1e-6;
/// Relative score margin at the top-k boundary under which another f32 implementation may pick differently.
pub const NEAR_TIE_RELATIVE: f32 = 1e-5;

pub struct IndexerWeights {
    wq_b: Matrix,
    wk: Matrix,
    k_norm_weight: Vec<f32>,
    k_norm_bias: Vec<f32>,
    weights_proj: Matrix,
}

/// Per sequence a `[tokens, tokens]` mask of the keys each query may attend to.
pub struct Selection {
    pub masks: Vec<Vec<bool>>,
}

impl IndexerWeights {
    pub fn load(
        reader: &WeightReader,
        settings: &Indexer,
        hidden: usize,
        q_input: usize,
        prefix: &str,
    ) -> Result<Self, RuntimeError> {
        let (heads, dim) = (settings.index_n_heads, settings.index_head_dim);
        Ok(Self {
            wq_b: reader.matrix(&format!("{prefix}.wq_b.weight"), [heads * dim, q_input])?,
            wk: reader.matrix(&format!("{prefix}.wk.weight"), [dim, hidden])?,
            k_norm_weight: reader.vector(&format!("{prefix}.k_norm.weight"), dim)?,
            k_norm_bias: reader.vector(&format!("{prefix}.k_norm.bias"), dim)?,
            weights_proj: reader.matrix(&format!("{prefix}.weights_proj.weight"), [heads, hidden])?,
        })
    }
}

/// Runs the indexer; returns the selection and the number of near-ties at the top-k boundary.
pub fn select(
    backend: &dyn Backend,
    weights: &IndexerWeights,
    config: &ModelConfig,
    x: &[f32],
    q_resid: &[f32],
    spans: &Spans,
    table: &RopeTable,
) -> Result<(Selection, usize), RuntimeError> {
    let settings = config
        .indexer
        .as_ref()
        .ok_or_else(|| RuntimeError::Input("indexer weights without an indexer config".into()))?;
    let (heads, dim, topk) = (settings.index_n_heads, settings.index_head_dim, settings.index_topk);
    let tokens = spans.total();
    let rope = table.rotary_dim;
    let mut q = backend.linear(q_resid, tokens, &weights.wq_b, None);
    let mut k = backend.linear(x, tokens, &weights.wk, None);
    backend.layer_norm(&mut k, dim, &weights.k_norm_weight, &weights.k_norm_bias, K_NORM_EPS);
    let head_weights = backend.linear(x, tokens, &weights.weights_proj, None);
    let softmax_scale = (dim as f32).powf(-0.5);
    let head_scale = (heads as f32).powf(-0.5);
    let mut masks = Vec::with_capacity(spans.lengths.len());
    let mut near_ties = 0;
    for (start, length) in spans.iter() {
        super::mla::check_positions(table, length)?;
        let q_seq = &mut q[start * heads * dim..(start + length) * heads * dim];
        backend.rope(q_seq, length, heads * dim, dim, 0, rope, &table.cos, &table.sin, RopeStyle::Interleaved);
        let k_seq = &mut k[start * dim..(start + length) * dim];
        backend.rope(k_seq, length, dim, dim, 0, rope, &table.cos, &table.sin, RopeStyle::Interleaved);
        let mut mask = vec![false; length * length];
        let keep = topk.min(length);
        for t in 0..length {
            let row = &mut mask[t * length..][..length];
            if t < keep {
                // Every past key fits in the top-k (the rest of the k slots fall on masked future keys).
                row[..=t].iter_mut().for_each(|m| *m = true);
                continue;
            }
            let w = &head_weights[(start + t) * heads..][..heads];
            let mut scored: Vec<(f32, usize)> = (0..=t)
                .map(|s| {
                    let key = &k_seq[s * dim..][..dim];
                    let score = (0..heads)
                        .map(|h| {
                            let logit = super::cpu::dot(&q_seq[(t * heads + h) * dim..][..dim], key) * softmax_scale;
                            w[h] * head_scale * logit.max(0.0)
                        })
                        .sum::<f32>();
                    (score, s)
                })
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let (inside, outside) = (scored[keep - 1].0, scored[keep].0);
            if inside - outside <= NEAR_TIE_RELATIVE * inside.abs().max(outside.abs()).max(f32::MIN_POSITIVE) {
                near_ties += 1;
            }
            for &(_, s) in &scored[..keep] {
                row[s] = true;
            }
        }
        masks.push(mask);
    }
    Ok((Selection { masks }, near_ties))
}

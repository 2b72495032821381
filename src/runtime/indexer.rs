//! GLM-5's DSA lightning indexer: scores every past token for each query with a few ReLU heads and keeps the
//! `index_topk` best; the attention of the layer (and of following `shared` layers) sees only those keys.

use super::backend::{Backend, IndexerShape, Matrix, RopeStyle};
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
    /// Every weight matrix (for device prefetch).
    pub fn matrices(&self) -> [&Matrix; 3] {
        [&self.wq_b, &self.wk, &self.weights_proj]
    }

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
    let mut masks = Vec::with_capacity(spans.lengths.len());
    let mut near_ties = 0;
    for (start, length) in spans.iter() {
        super::mla::check_positions(table, length)?;
        let q_seq = &mut q[start * heads * dim..(start + length) * heads * dim];
        backend.rope(q_seq, length, heads * dim, dim, 0, rope, &table.cos, &table.sin, RopeStyle::Interleaved);
        let k_seq = &mut k[start * dim..(start + length) * dim];
        backend.rope(k_seq, length, dim, dim, 0, rope, &table.cos, &table.sin, RopeStyle::Interleaved);
        let w = &head_weights[start * heads..(start + length) * heads];
        let shape = IndexerShape { tokens: length, heads, head_dim: dim, top_k: topk };
        let selection = backend.indexer_top_k(q_seq, k_seq, w, &shape);
        near_ties += selection.near_ties;
        masks.push(selection.mask);
    }
    Ok((Selection { masks }, near_ties))
}

//! GLM-5's DSA lightning indexer: scores every past token for each query with a few ReLU heads and keeps the
//! `index_topk` best; the attention of the layer (and of following `shared` layers) sees only those keys. The
//! full-sequence selection runs on the backend ([`Backend::indexer_top_k`]); the decode step scores one query
//! against the cached indexer keys.

use crate::load::weights::WeightReader;
use crate::model::config::{Attention, Indexer};
use crate::model::ModelConfig;
use crate::runtime::backend::{Backend, IndexerShape, KeySelection, RopeCall, RopeStyle};
use crate::runtime::kv_cache::KeyChoice;
use crate::runtime::matrix::Matrix;
use crate::runtime::rope_table::{check_positions, RopeTable};
use crate::runtime::tensor::Tensor;
use crate::runtime::{RuntimeError, Spans};

/// transformers' indexer `k_norm` is `nn.LayerNorm(head_dim, eps=1e-6)`.
const K_NORM_EPS: f32 = 1e-6;

pub struct IndexerWeights {
    wq_b: Matrix,
    wk: Matrix,
    k_norm_weight: Matrix,
    k_norm_bias: Matrix,
    weights_proj: Matrix,
    /// GLM-5.3-Flash's k-pool weights: `index_kpool_compress_ape` `[kpool, index_dim]` (host) and
    /// `index_kpool_compress_gate` `[index_dim, hidden]`.
    kpool: Option<(Vec<f32>, Matrix)>,
}

/// Per sequence a `[tokens, tokens]` mask of the keys each query may attend to (carried from a full indexer layer
/// to the `shared` layers after it).
pub struct DsaMasks {
    pub masks: Vec<Vec<bool>>,
}

/// The decode step's indexer queries `[tokens, index_heads · index_dim]` (post-RoPE) and head weights
/// `[tokens, index_heads]`, where the backend keeps them; for the k-pool indexer its pool position embedding.
pub struct IndexQueries {
    q: Tensor,
    head_weights: Tensor,
    ape: Option<Vec<f32>>,
}

impl IndexQueries {
    /// The keys each of a prompt's tokens keeps among the prompt's own indexer keys `keys` `[tokens, index_dim]`
    /// (k-pool: `[tokens, 2 · index_dim]`, each key beside its gate score).
    pub fn select_prompt(
        &self,
        backend: &dyn Backend,
        settings: &Indexer,
        keys: &Tensor,
    ) -> Result<KeySelection, RuntimeError> {
        let tokens = keys.rows();
        let (heads, dim) = (settings.index_n_heads, settings.index_head_dim);
        let shape = IndexerShape { tokens, heads, head_dim: dim, top_k: settings.index_topk };
        let (Some(ape), Some(kpool)) = (&self.ape, settings.kpool) else {
            return backend.indexer_top_k(&self.q, keys, &self.head_weights, 0..tokens, &shape);
        };
        let (k, gates) = crate::runtime::cpu::indexer::split_pooled_rows(&backend.download(keys)?, dim);
        let (q, w) = (backend.download(&self.q)?, backend.download(&self.head_weights)?);
        let pooling = (kpool.size, kpool.select_tail);
        Ok(crate::runtime::cpu::indexer::kpool_top_k((&q, &k, &w), (&gates, ape), &shape, pooling))
    }

    /// The paged decode's key selection by these queries ([`Backend::paged_decode`]).
    pub fn choice<'a>(&'a self, settings: &Indexer) -> KeyChoice<'a> {
        let (q, head_weights) = (&self.q, &self.head_weights);
        let (heads, dim, top_k) = (settings.index_n_heads, settings.index_head_dim, settings.index_topk);
        match (&self.ape, settings.kpool) {
            (Some(ape), Some(kpool)) => KeyChoice::SelectPools {
                q,
                head_weights,
                heads,
                dim,
                top_k,
                size: kpool.size,
                select_tail: kpool.select_tail,
                ape,
            },
            _ => KeyChoice::Select { q, head_weights, heads, dim, top_k },
        }
    }
}

impl IndexerWeights {
    /// Every weight matrix (for device prefetch).
    pub fn matrices(&self) -> [&Matrix; 3] {
        [&self.wq_b, &self.wk, &self.weights_proj]
    }

    /// The indexer of decoder layer `layer`, or `None` where the model has none or the layer reuses another's.
    pub fn load_layer(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Option<Self>, RuntimeError> {
        let (Some(settings), true) = (&config.indexer, config.runs_indexer(layer)) else { return Ok(None) };
        let hidden = config.hidden_size;
        let q_input = match &config.attention {
            Attention::Mla { q_lora_rank, .. } => q_lora_rank.unwrap_or(hidden),
            Attention::Gqa { .. } => hidden,
        };
        let prefix = format!("model.layers.{layer}.self_attn.indexer");
        Self::load(reader, settings, hidden, q_input, &prefix).map(Some)
    }

    fn load(
        reader: &WeightReader,
        settings: &Indexer,
        hidden: usize,
        q_input: usize,
        prefix: &str,
    ) -> Result<Self, RuntimeError> {
        let (heads, dim) = (settings.index_n_heads, settings.index_head_dim);
        let kpool = match settings.kpool {
            Some(kpool) => Some((
                reader.matrix(&format!("{prefix}.index_kpool_compress_ape"), [kpool.size, dim])?.values().to_vec(),
                reader.matrix(&format!("{prefix}.index_kpool_compress_gate"), [dim, hidden])?,
            )),
            None => None,
        };
        Ok(Self {
            kpool,
            wq_b: reader.matrix(&format!("{prefix}.wq_b.weight"), [heads * dim, q_input])?,
            wk: reader.matrix(&format!("{prefix}.wk.weight"), [dim, hidden])?,
            k_norm_weight: reader.parameter(&format!("{prefix}.k_norm.weight"), dim)?,
            k_norm_bias: reader.parameter(&format!("{prefix}.k_norm.bias"), dim)?,
            weights_proj: reader.matrix(&format!("{prefix}.weights_proj.weight"), [heads, hidden])?,
        })
    }

    /// Runs the indexer over whole sequences; returns the selection and the number of near-ties at the top-k
    /// boundary.
    pub fn select(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &Tensor,
        q_resid: &Tensor,
        spans: &Spans,
        table: &RopeTable,
    ) -> Result<(DsaMasks, usize), RuntimeError> {
        let settings = config
            .indexer
            .as_ref()
            .ok_or_else(|| RuntimeError::Input("indexer weights without an indexer config".into()))?;
        let (heads, dim, topk) = (settings.index_n_heads, settings.index_head_dim, settings.index_topk);
        let rope = table.rotary_dim;
        let mut q = backend.linear(q_resid, &self.wq_b, None)?;
        let mut k = backend.linear(x, &self.wk, None)?;
        backend.layer_norm(&mut k, dim, &self.k_norm_weight, &self.k_norm_bias, K_NORM_EPS)?;
        let head_weights = backend.linear(x, &self.weights_proj, None)?;
        if let (Some((ape, gate)), Some(kpool)) = (&self.kpool, settings.kpool) {
            // NoPE: the k-pool indexer's queries and keys take no rotation.
            let gates = backend.download(&backend.linear(x, gate, None)?)?;
            let (q, k, head_weights) = (backend.download(&q)?, backend.download(&k)?, backend.download(&head_weights)?);
            let mut masks = Vec::with_capacity(spans.lengths.len());
            let mut near_ties = 0;
            for (start, length) in spans.iter() {
                let shape = IndexerShape { tokens: length, heads, head_dim: dim, top_k: topk };
                let rows = |values: &[f32], width: usize| values[start * width..(start + length) * width].to_vec();
                let selection = crate::runtime::cpu::indexer::kpool_top_k(
                    (&rows(&q, heads * dim), &rows(&k, dim), &rows(&head_weights, heads)),
                    (&rows(&gates, dim), ape),
                    &shape,
                    (kpool.size, kpool.select_tail),
                );
                near_ties += selection.near_ties;
                masks.push(selection.mask);
            }
            return Ok((DsaMasks { masks }, near_ties));
        }
        let mut masks = Vec::with_capacity(spans.lengths.len());
        let mut near_ties = 0;
        for (start, length) in spans.iter() {
            check_positions(table, length)?;
            let sequence = start..start + length;
            let call = RopeCall {
                rows: sequence.clone(),
                first_position: 0,
                head_dim: dim,
                offset: 0,
                rotary_dim: rope,
                table,
                style: RopeStyle::Interleaved,
            };
            backend.rope(&mut q, &call)?;
            backend.rope(&mut k, &call)?;
            let shape = IndexerShape { tokens: length, heads, head_dim: dim, top_k: topk };
            let selection = backend.indexer_top_k(&q, &k, &head_weights, sequence, &shape)?;
            near_ties += selection.near_ties;
            masks.push(selection.mask);
        }
        Ok((DsaMasks { masks }, near_ties))
    }

    /// Decode step: the indexer keys `[tokens, index_dim]` to cache (k-pool: `[tokens, 2 · index_dim]`, each key
    /// beside its gate score; no rotation) and the queries of new tokens at `positions`.
    pub fn project(
        &self,
        backend: &dyn Backend,
        settings: &Indexer,
        table: &RopeTable,
        x: &Tensor,
        q_resid: &Tensor,
        positions: &[usize],
    ) -> Result<(Tensor, IndexQueries), RuntimeError> {
        let (index_heads, dim) = (settings.index_n_heads, settings.index_head_dim);
        if let Some((ape, gate)) = &self.kpool {
            let q = backend.linear(q_resid, &self.wq_b, None)?;
            let mut k = backend.linear(x, &self.wk, None)?;
            backend.layer_norm(&mut k, dim, &self.k_norm_weight, &self.k_norm_bias, K_NORM_EPS)?;
            let keys = backend.concat_columns(&[&k, &backend.linear(x, gate, None)?])?;
            let head_weights = backend.linear(x, &self.weights_proj, None)?;
            return Ok((keys, IndexQueries { q, head_weights, ape: Some(ape.clone()) }));
        }
        let mut iq = backend.linear(q_resid, &self.wq_b, None)?;
        let mut ik = backend.linear(x, &self.wk, None)?;
        backend.layer_norm(&mut ik, dim, &self.k_norm_weight, &self.k_norm_bias, K_NORM_EPS)?;
        let head_weights = backend.linear(x, &self.weights_proj, None)?;
        let rot = table.rotary_dim;
        for (t, &position) in positions.iter().enumerate() {
            let call = RopeCall {
                rows: t..t + 1,
                first_position: position,
                head_dim: dim,
                offset: 0,
                rotary_dim: rot,
                table,
                style: RopeStyle::Interleaved,
            };
            backend.rope(&mut iq, &call)?;
            backend.rope(&mut ik, &call)?;
        }
        debug_assert_eq!(iq.columns(), index_heads * dim);
        Ok((ik, IndexQueries { q: iq, head_weights, ape: None }))
    }
}

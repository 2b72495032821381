//! DeepSeek-V4's lightning indexer of CSA layers (transformers 5.24 `DeepseekV4Indexer`, `DeepseekV4IndexerScorer`):
//! its own compressor makes `index_head_dim`-wide keys of the same 4-token windows as the layer's entries; each
//! query scores the complete entries `s` by `Σ_h w_h · ReLU(q_h · k_s) / √index_head_dim` (`q` from the query LoRA
//! residual through `indexer.wq_b`, rotated to the query's position by the `compress` RoPE; `w` from
//! `weights_proj` / √index_n_heads) and attends to the `index_topk` best of them (all of them while they are fewer).

use rayon::prelude::*;

use super::compressor::Compressor;
use super::rope::{rotate_tail, Rotations};
use super::v4_kv_fp8::V4Cache;
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::runtime::backend::Backend;
use crate::runtime::cpu::routing::top_k_of;
use crate::runtime::matrix::Matrix;
use crate::runtime::tensor::Tensor;
use crate::runtime::{RuntimeError, Spans};

/// A CSA layer's indexer (`layers.N.attn.indexer.*`).
pub struct EntryIndexer {
    compressor: Compressor,
    /// `wq_b` `[heads · dim, q_lora_rank]`.
    q: Matrix,
    /// `weights_proj` `[heads, hidden]`.
    weights: Matrix,
    heads: usize,
    dim: usize,
    top_k: usize,
}

/// Per sequence, per query position: the entries it attends to.
pub type Selection = Vec<Vec<Vec<usize>>>;

impl EntryIndexer {
    /// The indexer stored under `at` (`layers.N.attn.indexer`).
    pub fn load(reader: &WeightReader, config: &ModelConfig, at: &str) -> Result<Self, RuntimeError> {
        let v4 =
            config.deepseek_v4().ok_or_else(|| RuntimeError::Input("an entry indexer outside DeepSeek-V4".into()))?;
        let (heads, dim, hidden) = (v4.index_n_heads, v4.index_head_dim, config.hidden_size);
        Ok(Self {
            compressor: Compressor::load(reader, &format!("{at}.compressor"), (4, dim, hidden))?,
            q: reader.matrix(&format!("{at}.wq_b.weight"), [heads * dim, v4.q_lora_rank])?,
            weights: reader.matrix(&format!("{at}.weights_proj.weight"), [heads, hidden])?,
            heads,
            dim,
            top_k: v4.index_topk,
        })
    }

    /// An indexer of random weights of `config`'s sizes (benchmarks).
    #[cfg(test)]
    pub(super) fn random(rng: &mut crate::rng::Rng, config: &ModelConfig) -> Self {
        let v4 = config.deepseek_v4().expect("a DeepSeek-V4 config");
        let (heads, dim, hidden) = (v4.index_n_heads, v4.index_head_dim, config.hidden_size);
        Self {
            compressor: Compressor::random(rng, (4, dim, hidden)),
            q: Matrix::new(heads * dim, v4.q_lora_rank, rng.values(heads * dim * v4.q_lora_rank, 0.03)),
            weights: Matrix::new(heads, hidden, rng.values(heads * hidden, 0.03)),
            heads,
            dim,
            top_k: v4.index_topk,
        }
    }

    /// Its weight matrices (for device prefetch).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all = self.compressor.matrices().to_vec();
        all.extend([&self.q, &self.weights]);
        all
    }

    /// Its compressor, which makes its keys.
    pub fn compressor(&self) -> &Compressor {
        &self.compressor
    }

    /// The entries each query of `spans` attends to, from the mixer input `x`, the normed query LoRA residual
    /// `q_residual` and each sequence's keys `[entries, dim]` (its compressor's); counts the near-ties at the top-k
    /// boundaries into `near_ties`.
    pub fn select(
        &self,
        (backend, store): (&dyn Backend, V4Cache),
        (x, q_residual, keys): (&Tensor, &Tensor, &[Vec<f32>]),
        spans: &Spans,
        table: &dyn Rotations,
        near_ties: &mut usize,
    ) -> Result<Selection, RuntimeError> {
        let positions: Vec<usize> = spans.iter().flat_map(|(_, length)| 0..length).collect();
        let (q, weights) = self.queries((backend, store), (x, q_residual), &positions, table)?;
        let (heads, dim) = (self.heads, self.dim);
        let mut selection = Vec::with_capacity(spans.lengths.len());
        for ((start, length), keys) in spans.iter().zip(keys) {
            let chosen: Vec<(Vec<usize>, bool)> = (start..start + length)
                .into_par_iter()
                .map(|row| {
                    let query = (&q[row * heads * dim..][..heads * dim], &weights[row * heads..][..heads]);
                    self.choose(query, keys, positions[row])
                })
                .collect();
            *near_ties += chosen.iter().filter(|(_, tie)| *tie).count();
            selection.push(chosen.into_iter().map(|(entries, _)| entries).collect());
        }
        Ok(selection)
    }

    /// Each row's queries `[rows, heads · dim]` (rotated to its position in `positions`; with an FP8 `store`, each
    /// head as vLLM quantizes it for the FP8 scoring) and head weights `[rows, heads]` (scaled by 1/√heads).
    pub fn queries(
        &self,
        (backend, store): (&dyn Backend, V4Cache),
        (x, q_residual): (&Tensor, &Tensor),
        positions: &[usize],
        table: &dyn Rotations,
    ) -> Result<(Vec<f32>, Vec<f32>), RuntimeError> {
        let mut q = backend.download(&backend.linear(q_residual, &self.q, None)?)?;
        let mut weights = backend.download(&backend.linear(x, &self.weights, None)?)?;
        let weight_scale = (self.heads as f32).powf(-0.5);
        weights.iter_mut().for_each(|w| *w *= weight_scale);
        q.par_chunks_exact_mut(self.heads * self.dim).zip(positions.par_iter()).for_each(|(row, &position)| {
            row.chunks_exact_mut(self.dim).for_each(|head| rotate_tail(head, table, position, false));
        });
        store.store_indexer(&mut q, self.dim);
        Ok((q, weights))
    }

    /// The entries the query `(q, head weights)` at `position` attends to among `keys` `[entries, dim]` (the
    /// complete ones: below `(position + 1) / 4`), and whether the top-k boundary is a near-tie.
    pub fn choose(&self, (query, head_weights): (&[f32], &[f32]), keys: &[f32], position: usize) -> (Vec<usize>, bool) {
        let dim = self.dim;
        let visible = ((position + 1) / 4).min(keys.len() / dim);
        if visible <= self.top_k {
            return ((0..visible).collect(), false);
        }
        let score_scale = (dim as f32).powf(-0.5);
        let scores: Vec<f32> = keys[..visible * dim]
            .chunks_exact(dim)
            .map(|key| {
                query
                    .chunks_exact(dim)
                    .zip(head_weights)
                    .map(|(q, w)| {
                        let dot: f32 = q.iter().zip(key).map(|(a, b)| a * b).sum();
                        dot.max(0.0) * score_scale * w
                    })
                    .sum()
            })
            .collect();
        top_k_of(&scores, self.top_k)
    }
}

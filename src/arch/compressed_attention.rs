//! DeepSeek-V4's attention (transformers 5.24 `DeepseekV4Attention`, eager): one KV head of `head_dim` that is both
//! key and value (`wkv`, `kv_norm`), queries through a LoRA (`wq_a`, `q_norm`, `wq_b`, then an unweighted RMS norm
//! per head), RoPE on the trailing `qk_rope_head_dim` channels in interleaved pairs, a learned sink logit per head in
//! the softmax's denominator, the output's rope channels rotated back to the query's position, and a grouped
//! low-rank output (`wo_a` per group of heads, then `wo_b`). Each query sees the last `sliding_window` tokens and,
//! by its layer type (`compress_ratios`): nothing more (0, the `main` RoPE), every complete HCA entry (128), or the
//! CSA entries its indexer picks (4) — compressed layers rotate with the `compress` RoPE ([`super::compressor`],
//! [`super::entry_indexer`]). Computed on the host, its projections on the backend.

use rayon::prelude::*;

use super::compressor::Compressor;
use super::context::LayerContext;
use super::entry_indexer::EntryIndexer;
use super::rope::{rope_table, rotate_tail};
use crate::load::weights::WeightReader;
use crate::model::config::{Rope, RopeScaling};
use crate::model::ModelConfig;
use crate::runtime::backend::Backend;
use crate::runtime::matrix::Matrix;
use crate::runtime::rope_table::RopeTable;
use crate::runtime::tensor::Tensor;
use crate::runtime::{RuntimeError, Spans};

/// A V4 layer's attention weights (`layers.N.attn.*`).
pub struct CompressedAttention {
    q_a: Matrix,
    q_norm: Matrix,
    q_b: Matrix,
    kv: Matrix,
    kv_norm: Matrix,
    /// `wo_a` split per group: `o_groups` × `[o_lora_rank, heads · head_dim / o_groups]`.
    o_a: Vec<Matrix>,
    o_b: Matrix,
    sinks: Vec<f32>,
    /// The compressor of a CSA or HCA layer.
    compressor: Option<Compressor>,
    /// The indexer of a CSA layer.
    indexer: Option<EntryIndexer>,
}

/// The two RoPEs of a V4 model over the trailing `qk_rope_head_dim` channels: `main` (sliding-window layers,
/// `rope_theta`, no scaling) and `compress` (compressed layers, compressors and indexers: `compress_rope_theta`
/// with the config's YaRN, its attention factor 1 unless given), as transformers' `DeepseekV4Config` builds them.
pub fn v4_ropes(config: &ModelConfig, positions: usize) -> Result<[RopeTable; 2], RuntimeError> {
    let v4 = config.deepseek_v4().ok_or_else(|| RuntimeError::Input("a V4 RoPE outside DeepSeek-V4".into()))?;
    let partial = v4.qk_rope_head_dim as f64 / v4.head_dim as f64;
    let main = Rope {
        theta: config.rope.theta,
        partial_rotary_factor: partial,
        interleave: true,
        scaling: RopeScaling::Default,
    };
    let scaling = match config.rope.scaling.clone() {
        RopeScaling::Yarn {
            attention_factor,
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            truncate,
        } => RopeScaling::Yarn {
            attention_factor: attention_factor.or(Some(1.0)),
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            truncate,
        },
        RopeScaling::Default => RopeScaling::Default,
    };
    let compress = Rope { theta: v4.compress_rope_theta, scaling, ..main.clone() };
    Ok([rope_table(&main, v4.head_dim, positions), rope_table(&compress, v4.head_dim, positions)])
}

impl CompressedAttention {
    pub fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let v4 = config.deepseek_v4().ok_or_else(|| RuntimeError::Input("V4 attention outside DeepSeek-V4".into()))?;
        let at = format!("{}.attn", config.layer_prefix(layer));
        let (hidden, heads, head_dim) = (config.hidden_size, config.num_attention_heads, v4.head_dim);
        let (q_rank, groups, o_rank) = (v4.q_lora_rank, v4.o_groups.max(1), v4.o_lora_rank);
        let group_width = heads * head_dim / groups;
        let o_a = reader.matrix(&format!("{at}.wo_a.weight"), [groups * o_rank, group_width])?;
        let o_a = o_a
            .values()
            .chunks_exact(o_rank * group_width)
            .map(|group| Matrix::new(o_rank, group_width, group.to_vec()))
            .collect();
        let ratio = v4.compress_ratios.get(layer).copied().unwrap_or(0);
        let compressor = match ratio {
            0 => None,
            ratio => Some(Compressor::load(reader, &format!("{at}.compressor"), (ratio, head_dim, hidden))?),
        };
        let indexer = match ratio {
            4 => Some(EntryIndexer::load(reader, config, &format!("{at}.indexer"))?),
            _ => None,
        };
        Ok(Self {
            q_a: reader.matrix(&format!("{at}.wq_a.weight"), [q_rank, hidden])?,
            q_norm: reader.parameter(&format!("{at}.q_norm.weight"), q_rank)?,
            q_b: reader.matrix(&format!("{at}.wq_b.weight"), [heads * head_dim, q_rank])?,
            kv: reader.matrix(&format!("{at}.wkv.weight"), [head_dim, hidden])?,
            kv_norm: reader.parameter(&format!("{at}.kv_norm.weight"), head_dim)?,
            o_a,
            o_b: reader.matrix(&format!("{at}.wo_b.weight"), [hidden, groups * o_rank])?,
            sinks: reader.vector(&format!("{at}.attn_sink"), heads)?,
            compressor,
            indexer,
        })
    }

    /// Its weight matrices (for device prefetch).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all = vec![&self.q_a, &self.q_b, &self.kv, &self.o_b];
        all.extend(&self.o_a);
        all.extend(self.compressor.iter().flat_map(Compressor::matrices));
        all.extend(self.indexer.iter().flat_map(EntryIndexer::matrices));
        all
    }

    /// The key (= value) rows `[tokens, head_dim]` of the mixer input `x`: projected, normed, rotated by `table`.
    fn keys(
        &self,
        backend: &dyn Backend,
        x: &Tensor,
        positions: &[usize],
        (table, eps): (&RopeTable, f32),
    ) -> Result<Vec<f32>, RuntimeError> {
        let head_dim = self.kv_norm.columns;
        let mut kv = backend.linear(x, &self.kv, None)?;
        backend.rms_norm(&mut kv, head_dim, &self.kv_norm, eps)?;
        let mut kv = backend.download(&kv)?;
        kv.par_chunks_exact_mut(head_dim).zip(positions.par_iter()).for_each(|(row, &position)| {
            rotate_tail(row, table, position, false);
        });
        Ok(kv)
    }

    /// The attention output `[tokens, hidden]` (after `wo_b`) of the mixer input `x` over whole sequences `spans`;
    /// near-ties of the indexer's top-k are counted into `near_ties`. With `prefill` (split prefill/decode: the
    /// prefill node's layer, its mixer input, each sequence's prompt length) what the cache holds of the prompt —
    /// key rows and the compressors' per-token projections, from which entries and indexer keys are made — comes
    /// from the prefill node; queries from this layer.
    pub fn forward(
        &self,
        context: &LayerContext,
        x: &Tensor,
        spans: &Spans,
        prefill: Option<(&CompressedAttention, &Tensor, &[usize])>,
        near_ties: &mut usize,
    ) -> Result<Tensor, RuntimeError> {
        let LayerContext { backend, config, .. } = *context;
        let v4 = config.deepseek_v4().ok_or_else(|| RuntimeError::Input("V4 attention outside DeepSeek-V4".into()))?;
        let (heads, head_dim, window) = (config.num_attention_heads, v4.head_dim, v4.sliding_window);
        let eps = config.rms_norm_eps as f32;
        let longest = spans.lengths.iter().copied().max().unwrap_or(0).max(1);
        let [main, compress] = v4_ropes(config, longest)?;
        let table = if self.compressor.is_some() { &compress } else { &main };

        let mut q_residual = backend.linear(x, &self.q_a, None)?;
        backend.rms_norm(&mut q_residual, v4.q_lora_rank, &self.q_norm, eps)?;
        let mut q = backend.download(&backend.linear(&q_residual, &self.q_b, None)?)?;
        let positions: Vec<usize> = spans.iter().flat_map(|(_, length)| 0..length).collect();
        q.par_chunks_exact_mut(heads * head_dim).zip(positions.par_iter()).for_each(|(row, &position)| {
            for head in row.chunks_exact_mut(head_dim) {
                let mean = head.iter().map(|v| v * v).sum::<f32>() / head_dim as f32;
                let inverse = 1.0 / (mean + eps).sqrt();
                head.iter_mut().for_each(|v| *v *= inverse);
                rotate_tail(head, table, position, false);
            }
        });
        let mut kv = self.keys(backend, x, &positions, (table, eps))?;
        // The prompt's share of the cache from the prefill node's weights and inputs.
        let prompt_rows = |mut own: Vec<f32>, theirs: Vec<f32>, prompt: &[usize]| {
            let width = own.len() / x.rows().max(1);
            for ((start, length), &prompt) in spans.iter().zip(prompt) {
                let rows = start * width..(start + prompt.min(length)) * width;
                own[rows.clone()].copy_from_slice(&theirs[rows]);
            }
            own
        };
        let projections = |compressor: &Compressor, other: Option<&Compressor>| -> Result<_, RuntimeError> {
            let [kv, gate] = compressor.project(backend, x)?;
            Ok(match (prefill, other) {
                (Some((_, x_prefill, prompt)), Some(other)) => {
                    let [their_kv, their_gate] = other.project(backend, x_prefill)?;
                    [prompt_rows(kv, their_kv, prompt), prompt_rows(gate, their_gate, prompt)]
                }
                _ => [kv, gate],
            })
        };
        if let Some((layer, x_prefill, prompt)) = prefill {
            kv = prompt_rows(kv, layer.keys(backend, x_prefill, &positions, (table, eps))?, prompt);
        }
        let entries = match &self.compressor {
            Some(compressor) => {
                let other = prefill.and_then(|(layer, ..)| layer.compressor.as_ref());
                compressor.entries(&projections(compressor, other)?, spans, &compress, eps)
            }
            None => vec![Vec::new(); spans.lengths.len()],
        };
        let selection = match &self.indexer {
            Some(indexer) => {
                let other = prefill.and_then(|(layer, ..)| layer.indexer.as_ref()).map(EntryIndexer::compressor);
                let keys =
                    indexer.compressor().entries(&projections(indexer.compressor(), other)?, spans, &compress, eps);
                Some(indexer.select(backend, (x, &q_residual, &keys), spans, &compress, near_ties)?)
            }
            None => None,
        };
        let ratio = self.compressor.as_ref().map_or(0, Compressor::ratio);
        let scale = (head_dim as f32).powf(-0.5);
        let mut out = vec![0f32; x.rows() * heads * head_dim];
        for (sequence, (start, length)) in spans.iter().enumerate() {
            let entries = &entries[sequence];
            let rows = &mut out[start * heads * head_dim..(start + length) * heads * head_dim];
            rows.par_chunks_exact_mut(heads * head_dim).enumerate().for_each(|(position, row)| {
                let window_rows = (position + 1).saturating_sub(window) + start..start + position + 1;
                let mut keys: Vec<&[f32]> = window_rows.map(|r| &kv[r * head_dim..][..head_dim]).collect();
                let complete = (position + 1).checked_div(ratio).unwrap_or(0).min(entries.len() / head_dim);
                let entry = |e: usize| &entries[e * head_dim..][..head_dim];
                match &selection {
                    Some(selection) => keys.extend(selection[sequence][position].iter().map(|&e| entry(e))),
                    None => keys.extend((0..complete).map(entry)),
                }
                let query = &q[(start + position) * heads * head_dim..][..heads * head_dim];
                for (head, (out, q)) in row.chunks_exact_mut(head_dim).zip(query.chunks_exact(head_dim)).enumerate() {
                    attend(out, q, &keys, scale, self.sinks[head]);
                    rotate_tail(out, table, position, true);
                }
            });
        }
        let out = backend.upload(&out, heads * head_dim)?;
        let group_width = heads * head_dim / self.o_a.len();
        let grouped: Vec<Tensor> = self
            .o_a
            .iter()
            .enumerate()
            .map(|(group, o_a)| backend.linear(&backend.columns(&out, group * group_width, group_width)?, o_a, None))
            .collect::<Result<_, _>>()?;
        let grouped = backend.concat_columns(&grouped.iter().collect::<Vec<_>>())?;
        backend.linear(&grouped, &self.o_b, None)
    }
}

/// One head's attention output into `out`: softmax over the scaled logits of query `q` against `keys` (which are
/// also the values) and the head's `sink` logit, which takes its share of the denominator and gives nothing.
fn attend(out: &mut [f32], q: &[f32], keys: &[&[f32]], scale: f32, sink: f32) {
    let logits: Vec<f32> = keys.iter().map(|k| q.iter().zip(*k).map(|(a, b)| a * b).sum::<f32>() * scale).collect();
    let top = logits.iter().copied().fold(sink, f32::max);
    let weights: Vec<f32> = logits.iter().map(|l| (l - top).exp()).collect();
    let total = weights.iter().sum::<f32>() + (sink - top).exp();
    out.fill(0.0);
    for (weight, key) in weights.iter().zip(keys) {
        let p = weight / total;
        out.iter_mut().zip(*key).for_each(|(o, k)| *o += p * k);
    }
}

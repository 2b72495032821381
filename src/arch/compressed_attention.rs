//! DeepSeek-V4's attention (transformers 5.24 `DeepseekV4Attention`, eager): one KV head of `head_dim` that is both
//! key and value (`wkv`, `kv_norm`), queries through a LoRA (`wq_a`, `q_norm`, `wq_b`, then an unweighted RMS norm
//! per head), RoPE on the trailing `qk_rope_head_dim` channels in interleaved pairs, a learned sink logit per head in
//! the softmax's denominator, the output's rope channels rotated back to the query's position, and a grouped
//! low-rank output (`wo_a` per group of heads, then `wo_b`). Each query sees the last `sliding_window` tokens and,
//! by its layer type (`compress_ratios`): nothing more (0, the `main` RoPE), every complete HCA entry (128), or the
//! CSA entries its indexer picks (4) — compressed layers rotate with the `compress` RoPE ([`super::compressor`],
//! [`super::entry_indexer`]). What it caches (key rows, entries, indexer keys and queries) is stored as a
//! [`V4Cache`] says — exactly, or FP8 as vLLM does ([`super::v4_kv_fp8`]) — before anything reads it. Computed on
//! the host, its projections on the backend.

use rayon::prelude::*;

use super::compressor::Compressor;
use super::context::LayerContext;
use super::entry_indexer::EntryIndexer;
use super::rope::{rope_table, rotate_tail, Rotations, SparseRotations};
use super::v4_kv_fp8::V4Cache;
use crate::load::weights::WeightReader;
use crate::model::config::{Rope, RopeScaling};
use crate::model::ModelConfig;
use crate::runtime::backend::Backend;
use crate::runtime::compressed_cache::CompressedCache;
use crate::runtime::matrix::Matrix;
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
pub fn v4_ropes(config: &ModelConfig) -> Result<[Rope; 2], RuntimeError> {
    let v4 = config.deepseek_v4().ok_or_else(|| RuntimeError::Input("a V4 RoPE outside DeepSeek-V4".into()))?;
    let partial = v4.qk_rope_head_dim as f64 / v4.head_dim as f64;
    let main = Rope {
        theta: config.rope.theta,
        partial_rotary_factor: partial,
        interleave: true,
        scaling: RopeScaling::Default,
    };
    let mut scaling = config.rope.scaling.clone();
    if let RopeScaling::Yarn { attention_factor, .. } = &mut scaling {
        attention_factor.get_or_insert(1.0);
    }
    let compress = Rope { theta: v4.compress_rope_theta, scaling, ..main.clone() };
    Ok([main, compress])
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

    /// The layer's RoPE ([`v4_ropes`]): `main` on a sliding-window layer; `compress` on a compressed one, whose
    /// compressor and indexer rotate with it too.
    fn rope(&self, config: &ModelConfig) -> Result<Rope, RuntimeError> {
        let [main, compress] = v4_ropes(config)?;
        Ok(if self.compressor.is_some() { compress } else { main })
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
        (table, eps): (&dyn Rotations, f32),
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

    /// Each row's queries `[rows, heads · head_dim]` (per-head unweighted RMS norm, rotated to its position) and the
    /// normed query LoRA residual the indexer also reads.
    fn queries(
        &self,
        backend: &dyn Backend,
        x: &Tensor,
        positions: &[usize],
        (table, eps): (&dyn Rotations, f32),
    ) -> Result<(Tensor, Vec<f32>), RuntimeError> {
        let head_dim = self.kv_norm.columns;
        let mut q_residual = backend.linear(x, &self.q_a, None)?;
        backend.rms_norm(&mut q_residual, self.q_norm.columns, &self.q_norm, eps)?;
        let mut q = backend.download(&backend.linear(&q_residual, &self.q_b, None)?)?;
        let width = q.len() / positions.len().max(1);
        q.par_chunks_exact_mut(width).zip(positions.par_iter()).for_each(|(row, &position)| {
            for head in row.chunks_exact_mut(head_dim) {
                let mean = head.iter().map(|v| v * v).sum::<f32>() / head_dim as f32;
                let inverse = 1.0 / (mean + eps).sqrt();
                head.iter_mut().for_each(|v| *v *= inverse);
                rotate_tail(head, table, position, false);
            }
        });
        Ok((q_residual, q))
    }

    /// One token's attention output `[heads · head_dim]` into `out`: its query `query` over `keys` (the window's and
    /// the compressed entries it sees), each head's output rotated back to `position`.
    fn attend_token(&self, out: &mut [f32], query: &[f32], keys: &[&[f32]], position: usize, table: &dyn Rotations) {
        let head_dim = self.kv_norm.columns;
        let scale = (head_dim as f32).powf(-0.5);
        for (head, (out, q)) in out.chunks_exact_mut(head_dim).zip(query.chunks_exact(head_dim)).enumerate() {
            attend(out, q, keys, scale, self.sinks[head]);
            rotate_tail(out, table, position, true);
        }
    }

    /// The grouped output projection of the attended heads `out` `[tokens, heads · head_dim]`: `wo_a` per group,
    /// then `wo_b`.
    fn output(&self, backend: &dyn Backend, out: &[f32]) -> Result<Tensor, RuntimeError> {
        let group_width = self.o_a[0].columns;
        let out = backend.upload(out, group_width * self.o_a.len())?;
        let grouped: Vec<Tensor> = self
            .o_a
            .iter()
            .enumerate()
            .map(|(group, o_a)| backend.linear(&backend.columns(&out, group * group_width, group_width)?, o_a, None))
            .collect::<Result<_, _>>()?;
        let grouped = backend.concat_columns(&grouped.iter().collect::<Vec<_>>())?;
        backend.linear(&grouped, &self.o_b, None)
    }

    /// The attention output `[tokens, hidden]` (after `wo_b`) of the mixer input `x` over whole sequences `spans`;
    /// near-ties of the indexer's top-k are counted into `near_ties`. With `prefill` (split prefill/decode: the
    /// prefill node's layer, its mixer input, each sequence's prompt length) what the cache holds of the prompt —
    /// key rows and the compressors' per-token projections, from which entries and indexer keys are made — comes
    /// from the prefill node; queries from this layer.
    pub fn forward(
        &self,
        (context, store): (&LayerContext, V4Cache),
        x: &Tensor,
        spans: &Spans,
        prefill: Option<(&CompressedAttention, &Tensor, &[usize])>,
        near_ties: &mut usize,
    ) -> Result<Tensor, RuntimeError> {
        Ok(self.run((context, store), x, spans, prefill, near_ties)?.0)
    }

    /// A prompt's attention output (`x`: its mixer input, one sequence from position 0) and the request's cache
    /// after it.
    pub fn prefill(
        &self,
        (context, store): (&LayerContext, V4Cache),
        x: &Tensor,
        near_ties: &mut usize,
    ) -> Result<(Tensor, CompressedCache), RuntimeError> {
        let spans = Spans::new(&[x.rows()]);
        let (out, cached) = self.run((context, store), x, &spans, None, near_ties)?;
        let Cached { kv, entries, index } = cached;
        let head_dim = self.kv_norm.columns;
        let window = context.config.deepseek_v4().map_or(1, |v4| v4.sliding_window);
        let kept = x.rows().min(window.saturating_sub(1));
        let cache = CompressedCache {
            tokens: x.rows(),
            window: kv[(x.rows() - kept) * head_dim..].to_vec(),
            entries: entries.and_then(|(projected, mut entries)| {
                let compressor = self.compressor.as_ref()?;
                Some(compressor.cache(&projected, x.rows(), entries.remove(0)))
            }),
            index: index.and_then(|(projected, mut keys)| {
                let indexer = self.indexer.as_ref()?;
                Some(indexer.compressor().cache(&projected, x.rows(), keys.remove(0)))
            }),
        };
        Ok((out, cache))
    }

    /// The attention output of whole sequences and what their caches hold ([`CompressedAttention::forward`]),
    /// stored as `store` says before anything reads them.
    fn run(
        &self,
        (context, store): (&LayerContext, V4Cache),
        x: &Tensor,
        spans: &Spans,
        prefill: Option<(&CompressedAttention, &Tensor, &[usize])>,
        near_ties: &mut usize,
    ) -> Result<(Tensor, Cached), RuntimeError> {
        let LayerContext { backend, config, .. } = *context;
        let v4 = config.deepseek_v4().ok_or_else(|| RuntimeError::Input("V4 attention outside DeepSeek-V4".into()))?;
        let (heads, head_dim, window) = (config.num_attention_heads, v4.head_dim, v4.sliding_window);
        let eps = config.rms_norm_eps as f32;
        let longest = spans.lengths.iter().copied().max().unwrap_or(0).max(1);
        let table = rope_table(&self.rope(config)?, head_dim, longest);
        let (table, compress): (&dyn Rotations, _) = (&table, &table);

        let positions: Vec<usize> = spans.iter().flat_map(|(_, length)| 0..length).collect();
        let (q_residual, q) = self.queries(backend, x, &positions, (table, eps))?;
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
        let rope = v4.qk_rope_head_dim;
        store.store_attention(&mut kv, head_dim, rope);
        let entries = match &self.compressor {
            Some(compressor) => {
                let other = prefill.and_then(|(layer, ..)| layer.compressor.as_ref());
                let projected = projections(compressor, other)?;
                let mut entries = compressor.entries(&projected, spans, compress, eps);
                entries.iter_mut().for_each(|entries| store.store_attention(entries, head_dim, rope));
                Some((projected, entries))
            }
            None => None,
        };
        let (index, selection) = match &self.indexer {
            Some(indexer) => {
                let other = prefill.and_then(|(layer, ..)| layer.indexer.as_ref()).map(EntryIndexer::compressor);
                let projected = projections(indexer.compressor(), other)?;
                let mut keys = indexer.compressor().entries(&projected, spans, compress, eps);
                keys.iter_mut().for_each(|keys| store.store_indexer(keys, v4.index_head_dim));
                let selection =
                    indexer.select((backend, store), (x, &q_residual, &keys), spans, compress, near_ties)?;
                (Some((projected, keys)), Some(selection))
            }
            None => (None, None),
        };
        let ratio = self.compressor.as_ref().map_or(0, Compressor::ratio);
        let mut out = vec![0f32; x.rows() * heads * head_dim];
        for (sequence, (start, length)) in spans.iter().enumerate() {
            let entries = entries.as_ref().map_or(&[][..], |(_, entries)| &entries[sequence][..]);
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
                self.attend_token(row, query, &keys, position, table);
            });
        }
        Ok((self.output(backend, &out)?, Cached { kv, entries, index }))
    }

    /// The decode step: row `r` of the mixer input `x` is the next token of the request whose cache is `caches[r]`
    /// (at position `caches[r].tokens`); each cache takes its token (key row, compressors' projections, any entry
    /// its window closes) and the token attends over what its cache then holds, as [`CompressedAttention::forward`]
    /// attends over the whole sequence.
    pub fn decode(
        &self,
        (backend, config, store): (&dyn Backend, &ModelConfig, V4Cache),
        x: &Tensor,
        caches: &mut [CompressedCache],
        near_ties: &mut usize,
    ) -> Result<Tensor, RuntimeError> {
        let v4 = config.deepseek_v4().ok_or_else(|| RuntimeError::Input("V4 attention outside DeepSeek-V4".into()))?;
        let (heads, head_dim, window) = (config.num_attention_heads, v4.head_dim, v4.sliding_window);
        let eps = config.rms_norm_eps as f32;
        let positions: Vec<usize> = caches.iter().map(|cache| cache.tokens).collect();
        // Only the positions this step rotates to: its tokens', and where each cache's next entry (the compressor's,
        // the indexer's) would be rotated if this token closes its window.
        let next_entries = caches.iter().flat_map(|cache| {
            let entry = self.compressor.as_ref().zip(cache.entries.as_ref()).map(|(c, e)| c.next_entry_position(e));
            let key =
                self.indexer.as_ref().zip(cache.index.as_ref()).map(|(i, e)| i.compressor().next_entry_position(e));
            entry.into_iter().chain(key)
        });
        let table = SparseRotations::new(&self.rope(config)?, head_dim, positions.iter().copied().chain(next_entries));
        let (table, compress): (&dyn Rotations, _) = (&table, &table);
        let (q_residual, q) = self.queries(backend, x, &positions, (table, eps))?;
        let (rope, index_dim) = (v4.qk_rope_head_dim, v4.index_head_dim);
        let mut kv = self.keys(backend, x, &positions, (table, eps))?;
        store.store_attention(&mut kv, head_dim, rope);
        let projected = self.compressor.as_ref().map(|c| c.project(backend, x)).transpose()?;
        let index_projected = self.indexer.as_ref().map(|i| i.compressor().project(backend, x)).transpose()?;
        let index_queries = match &self.indexer {
            Some(indexer) => Some(indexer.queries((backend, store), (x, &q_residual), &positions, compress)?),
            None => None,
        };
        let rows = x.rows();
        fn row_of(values: &[Vec<f32>; 2], row: usize, rows: usize) -> [&[f32]; 2] {
            let width = values[0].len() / rows;
            [&values[0][row * width..][..width], &values[1][row * width..][..width]]
        }
        let mut out = vec![0f32; x.rows() * heads * head_dim];
        let ties: Vec<bool> = out
            .par_chunks_exact_mut(heads * head_dim)
            .zip(caches.par_iter_mut())
            .enumerate()
            .map(|(row, (out, cache))| {
                let position = cache.tokens;
                // An entry this token's window closes is stored as it is written.
                if let (Some(compressor), Some(projected), Some(entries)) =
                    (&self.compressor, &projected, cache.entries.as_mut())
                {
                    let before = entries.entries.len();
                    compressor.append(entries, row_of(projected, row, rows), (compress, eps));
                    store.store_attention(&mut entries.entries[before..], head_dim, rope);
                }
                if let (Some(indexer), Some(projected), Some(index)) =
                    (&self.indexer, &index_projected, cache.index.as_mut())
                {
                    let before = index.entries.len();
                    indexer.compressor().append(index, row_of(projected, row, rows), (compress, eps));
                    store.store_indexer(&mut index.entries[before..], index_dim);
                }
                let token = &kv[row * head_dim..][..head_dim];
                let mut keys: Vec<&[f32]> = cache.window.chunks_exact(head_dim).chain([token]).collect();
                let entries = cache.entries.as_ref().map_or(&[][..], |entries| &entries.entries[..]);
                let entry = |e: usize| &entries[e * head_dim..][..head_dim];
                let mut tie = false;
                match (&self.indexer, &index_queries, &cache.index) {
                    (Some(indexer), Some((q, weights)), Some(index)) => {
                        let (query_width, index_heads) = (q.len() / rows, weights.len() / rows);
                        let query =
                            (&q[row * query_width..][..query_width], &weights[row * index_heads..][..index_heads]);
                        let (chosen, near) = indexer.choose(query, &index.entries, position);
                        tie = near;
                        keys.extend(chosen.into_iter().map(entry));
                    }
                    _ => {
                        let ratio = self.compressor.as_ref().map_or(0, Compressor::ratio);
                        let complete = (position + 1).checked_div(ratio).unwrap_or(0).min(entries.len() / head_dim);
                        keys.extend((0..complete).map(entry));
                    }
                }
                self.attend_token(out, &q[row * heads * head_dim..][..heads * head_dim], &keys, position, table);
                cache.window.extend_from_slice(token);
                let kept = window.saturating_sub(1) * head_dim;
                if cache.window.len() > kept {
                    cache.window.drain(..cache.window.len() - kept);
                }
                cache.tokens += 1;
                tie
            })
            .collect();
        *near_ties += ties.iter().filter(|&&tie| tie).count();
        self.output(backend, &out)
    }
}

/// What a pass over whole sequences computed for their caches: the key rows, and each compressor's per-token
/// projections with the entries made of them (per sequence).
struct Cached {
    kv: Vec<f32>,
    entries: Option<Compressed>,
    index: Option<Compressed>,
}

/// A compressor's per-token projections (values, gates) and the entries made of them, per sequence.
type Compressed = ([Vec<f32>; 2], Vec<Vec<f32>>);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use crate::runtime::kv_cache::{KvDtype, KvPool, LayerState, PoolShape};
    use crate::runtime::Cpu;

    impl CompressedAttention {
        /// A layer of compression `ratio` with random weights of `config`'s sizes.
        fn random(rng: &mut Rng, config: &ModelConfig, ratio: usize) -> Self {
            let v4 = config.deepseek_v4().expect("a DeepSeek-V4 config");
            let (hidden, heads, head_dim) = (config.hidden_size, config.num_attention_heads, v4.head_dim);
            let (q_rank, groups, o_rank) = (v4.q_lora_rank, v4.o_groups, v4.o_lora_rank);
            let mut matrix = |rows: usize, columns: usize| {
                Matrix::new(rows, columns, rng.values(rows * columns, (columns as f32).powf(-0.5)))
            };
            let group_width = heads * head_dim / groups;
            Self {
                q_a: matrix(q_rank, hidden),
                q_norm: Matrix::new(1, q_rank, vec![1.0; q_rank]),
                q_b: matrix(heads * head_dim, q_rank),
                kv: matrix(head_dim, hidden),
                kv_norm: Matrix::new(1, head_dim, vec![1.0; head_dim]),
                o_a: (0..groups).map(|_| matrix(o_rank, group_width)).collect(),
                o_b: matrix(hidden, groups * o_rank),
                sinks: vec![0.0; heads],
                compressor: (ratio > 0).then(|| Compressor::random(rng, (ratio, head_dim, hidden))),
                indexer: (ratio == 4).then(|| EntryIndexer::random(rng, config)),
            }
        }
    }

    /// A pool whose pages hold one request's cache of one V4 layer of `ratio`, with room past `context` tokens.
    fn paged_pool(config: &ModelConfig, ratio: usize, context: usize) -> KvPool {
        let mut shape = crate::arch::paged::compressed_shape(config).expect("a V4 config");
        let layer = shape.layers.iter().position(|layer| layer.ratio == ratio).expect("a layer of that ratio");
        shape.layers = vec![shape.layers[layer]];
        let tokens = PoolShape { layers: 0, row_width: 0, aux_width: 0, page_size: 16, pages: context / 16 + 2 };
        let mut pool = KvPool::new(tokens, KvDtype::F32, Vec::new()).with_compressed_states(shape);
        pool.open(1);
        pool.reserve(1, context + 16).unwrap();
        pool
    }

    /// Per-token decode cost of each DeepSeek-V4-Flash layer type (its real attention sizes, random weights) on the
    /// CPU runtime at the contexts in `V4_BENCH_CONTEXTS` (default 1024,32768), the cache filled as after that many
    /// tokens, and what serve-test's pages add (gathering the layer's rows, writing the step's new ones):
    /// `cargo test --release --lib v4_decode_timing -- --ignored --nocapture` (scripts/bench-v4.sh).
    #[test]
    #[ignore]
    fn v4_decode_timing() {
        let preset = crate::model::presets::config_text("deepseek-v4-flash").expect("the V4-Flash preset");
        let config = ModelConfig::from_json(&serde_json::from_str(preset).unwrap()).unwrap();
        let v4 = config.deepseek_v4().unwrap().clone();
        let contexts: Vec<usize> = std::env::var("V4_BENCH_CONTEXTS")
            .unwrap_or_else(|_| "1024,32768".into())
            .split(',')
            .map(|c| c.trim().parse().expect("a context length"))
            .collect();
        let cpu = Cpu::default();
        let mut rng = Rng::new(7);
        for (kind, ratio) in [("sliding", 0), ("HCA", 128), ("CSA", 4)] {
            let attention = CompressedAttention::random(&mut rng, &config, ratio);
            for &context in &contexts {
                let window = context.min(v4.sliding_window - 1);
                let cache = CompressedCache {
                    tokens: context,
                    window: rng.values(window * v4.head_dim, 1.0),
                    entries: attention.compressor.as_ref().map(|c| c.random_cache(&mut rng, context)),
                    index: attention.indexer.as_ref().map(|i| i.compressor().random_cache(&mut rng, context)),
                };
                let x = cpu.upload(&rng.values(config.hidden_size, 1.0), config.hidden_size).unwrap();
                let mut best = f64::INFINITY;
                for _ in 0..5 {
                    let mut caches = vec![cache.clone()];
                    let started = std::time::Instant::now();
                    attention.decode((&cpu, &config, V4Cache::Exact), &x, &mut caches, &mut 0).unwrap();
                    best = best.min(started.elapsed().as_secs_f64());
                }
                // serve-test's part of the step: the layer's rows gathered from its pages, the new ones written.
                let mut pool = paged_pool(&config, ratio, context);
                pool.store_states(1, vec![LayerState::Compressed(Box::new(cache))]).unwrap();
                let (mut gather, mut write) = (f64::INFINITY, f64::INFINITY);
                for _ in 0..5 {
                    let started = std::time::Instant::now();
                    let Some(LayerState::Compressed(cache)) = pool.take_state(1, 0).unwrap() else { panic!() };
                    gather = gather.min(started.elapsed().as_secs_f64());
                    let mut caches = vec![*cache];
                    attention.decode((&cpu, &config, V4Cache::Exact), &x, &mut caches, &mut 0).unwrap();
                    let started = std::time::Instant::now();
                    let cache = LayerState::Compressed(Box::new(caches.remove(0)));
                    pool.restore_state(1, 0, cache).unwrap();
                    write = write.min(started.elapsed().as_secs_f64());
                }
                println!(
                    "v4-flash {kind:<7} layer, context {context:>6}: {:>8.2} ms/token (best of 5); pages: gather \
                     {:.2} ms, write {:.3} ms",
                    best * 1e3,
                    gather * 1e3,
                    write * 1e3
                );
            }
        }
    }
}

//! The causal LM for token-by-token decoding with a paged KV cache: every decoder [`Layer`] loaded once and kept
//! (routed experts still streamed from the mapped checkpoint), a prefill that runs a whole prompt and returns its
//! cache rows, and a decode step that advances a batch of requests by one token each, writing and reading the
//! [`KvPool`]. The layers are the ones the layer-streamed [`super::Model`] runs; this file only sequences them.
//!
//! # Memory
//! ```text
//! resident ≈ Σ layers (attention + router + shared/dense MLP weights in f32) + lm_head/embeddings in f32
//!          + threads × one routed expert in f32 while a step runs
//! pool     = pages × layers × page_size × (row_width × kv_dtype bytes + aux_width × 4)
//! ```
//! Fine for the tiny and small models `serve-test` smoke-decodes; the full-sequence path stays layer-streamed.

use std::path::Path;

use super::{head_name, Layer};
use crate::format::kv_scales::{KvLayout, KvScales};
use crate::io::Checkpoint;
use crate::model::ModelConfig;
use crate::runtime::backend::{AttentionShape, Backend, KvAt, KvRows, Matrix, PagedLayout, PagedStep};
use crate::runtime::checkpoint::open_checkpoint;
use crate::runtime::kv_cache::{KvPool, PoolError, RequestId};
use crate::runtime::layer_stream::StreamedLayer;
use crate::runtime::rope_table::{rope_setup, RopeTable};
use crate::runtime::weights::WeightReader;
use crate::runtime::{RuntimeError, Tensor};

/// One request's new token in a decode batch.
#[derive(Debug, Clone, Copy)]
pub struct DecodeItem {
    pub request: RequestId,
    pub token: u32,
    /// Its position (= tokens already cached).
    pub position: usize,
}

/// A prompt's prefill result: the last position's logits and the rows to hand to a pool.
pub struct Prefilled {
    pub logits: Vec<f32>,
    /// Per layer `[tokens, row_width]` and `[tokens, aux_width]`, f32, where the backend keeps them (the handoff
    /// converts them to the pool dtype).
    pub rows: Vec<Tensor>,
    pub aux: Vec<Tensor>,
}

/// One decode step's results, in item order: logits `[vocab]`, or why the item's cached mappings cannot be trusted
/// (it was dropped from the step at the first layer that found it).
pub struct DecodeStep {
    pub logits: Vec<Result<Vec<f32>, PoolError>>,
    /// Host time spent verifying mappings (0 where the device verifies inside the attention kernel).
    pub verify_seconds: f64,
}

/// A model opened for incremental decoding.
pub struct PagedModel {
    checkpoint: Checkpoint,
    config: ModelConfig,
    layers: Vec<Layer>,
    norm: Matrix,
    head: Matrix,
    table: RopeTable,
    mla_scale: f32,
}

impl PagedModel {
    /// Loads every layer's resident weights; positions up to `max_positions` are supported.
    pub fn open(dir: &Path, max_positions: usize) -> Result<Self, RuntimeError> {
        let (checkpoint, config) = open_checkpoint(dir)?;
        let reader = WeightReader::new(&checkpoint);
        let layers = (0..config.num_hidden_layers)
            .map(|layer| Layer::load(&reader, &config, layer))
            .collect::<Result<Vec<_>, _>>()?;
        let norm = reader.parameter("model.norm.weight", config.hidden_size)?;
        let head = reader.matrix(head_name(&config, &reader), [config.vocab_size, config.hidden_size])?;
        let (table, mla_scale) = rope_setup(&config, max_positions.max(1));
        drop(reader);
        Ok(Self { checkpoint, config, layers, norm, head, table, mla_scale })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    pub fn max_positions(&self) -> usize {
        self.table.positions
    }

    /// Width of one cached row per token and layer (MLA latent 576 for Kimi/GLM-5; GQA 2 · kv_heads · head_dim).
    pub fn row_width(&self) -> usize {
        match KvLayout::of(&self.config) {
            KvLayout::Mla { row_width } => row_width,
            KvLayout::Gqa { kv_heads, head_dim } => 2 * kv_heads * head_dim,
        }
    }

    /// f32 values kept beside each row: the DSA indexer key (GLM-5), else 0.
    pub fn aux_width(&self) -> usize {
        self.config.indexer.as_ref().map_or(0, |i| i.index_head_dim)
    }

    /// Per layer, the scale of every row element: MLA all `k_scale`; GQA `k_scale` of the head for K, `v_scale` for V.
    pub fn element_scales(&self, scales: &KvScales) -> Vec<Vec<f32>> {
        let width = self.row_width();
        (0..self.config.num_hidden_layers)
            .map(|layer| {
                let layer_scales = &scales.layers[layer];
                match KvLayout::of(&self.config) {
                    KvLayout::Mla { .. } => vec![layer_scales.k_for(0); width],
                    KvLayout::Gqa { kv_heads, head_dim } => (0..width)
                        .map(|e| {
                            let half = kv_heads * head_dim;
                            if e < half {
                                layer_scales.k_for(e / head_dim)
                            } else {
                                layer_scales.v_for((e - half) / head_dim)
                            }
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn check_positions(&self, end: usize) -> Result<(), RuntimeError> {
        if end > self.table.positions {
            return Err(RuntimeError::Input(format!(
                "position {end} is beyond the {} positions the decoder was opened for",
                self.table.positions
            )));
        }
        Ok(())
    }

    /// Runs a whole prompt (causal attention over its own f32 rows) and returns the last position's logits and
    /// every layer's rows.
    pub fn prefill(&self, backend: &dyn Backend, tokens: &[u32]) -> Result<Prefilled, RuntimeError> {
        if tokens.is_empty() {
            return Err(RuntimeError::Input("an empty prompt cannot be prefilled".into()));
        }
        self.check_positions(tokens.len())?;
        let reader = WeightReader::new(&self.checkpoint);
        let count = tokens.len();
        let positions: Vec<usize> = (0..count).collect();
        let width = self.config.hidden_size;
        let mut hidden = backend.upload(&reader.rows("model.embed_tokens.weight", width, tokens)?, width)?;
        let (mut all_rows, mut all_aux) = (Vec::new(), Vec::new());
        // The last DSA selection `[count, count]` (shared layers reuse the last indexer layer's).
        let mut selection: Option<Vec<bool>> = None;
        let layout = Layer::layout(&self.config, self.mla_scale);
        let shape = AttentionShape {
            tokens: count,
            heads: layout.heads,
            kv_heads: layout.kv_heads,
            qk_dim: layout.qk_dim,
            v_dim: layout.v_dim,
            scale: layout.scale,
        };
        for layer in &self.layers {
            let (rows, aux, queries) =
                layer.project(backend, &self.config, &self.table, &hidden, &positions, self.aux_width())?;
            let q = layer.attention_queries(backend, &self.config, &queries)?;
            if let Some(chosen) = Layer::select_prompt(backend, &self.config, &queries, &aux)? {
                selection = Some(chosen.mask);
            }
            // The prompt attends its own f32 rows, as the cache layout reads them, before the handoff rounds them.
            let (k, v) = keys_and_values(backend, &layout, &rows)?;
            let attended = backend.attention(&q, &k, &v, 0..count, &shape, selection.as_deref())?;
            let attended = layer.attention_values(backend, &self.config, attended)?;
            layer.finish(backend, &reader, &self.config, &mut hidden, &attended)?;
            all_rows.push(rows);
            all_aux.push(aux);
        }
        let logits = self.logits(backend, &backend.row_range(&hidden, count - 1..count)?)?;
        Ok(Prefilled { logits, rows: all_rows, aux: all_aux })
    }

    /// Writes a prefilled prompt's rows into `pool` for `request` (converted to the pool's dtype and scales) through
    /// `backend`, whose pages of the pool they go to.
    pub fn hand_over(
        backend: &dyn Backend,
        pool: &mut KvPool,
        request: RequestId,
        prefilled: &Prefilled,
    ) -> Result<(), RuntimeError> {
        let count = prefilled.rows.first().map_or(0, Tensor::rows);
        pool.reserve(request, count)?;
        let at: Vec<KvAt> = (0..count).map(|position| KvAt { request, position }).collect();
        for (layer, (rows, aux)) in prefilled.rows.iter().zip(&prefilled.aux).enumerate() {
            backend.kv_write(pool, layer, &KvRows { rows, aux, at: &at })?;
        }
        Ok(())
    }

    /// Advances every item by one token: writes its rows at its position and attends over positions `0..=position`
    /// of the pool, through [`Backend::paged_decode`], which verifies each item's mappings at the first layer (with
    /// `verify`; a device verifies at every layer inside its attention kernel). An item that fails is dropped from
    /// the rest of the step and gets its fault instead of logits. The residual stream, the cache rows and GLM-5's
    /// DSA selections stay with the backend from the embeddings to the logits.
    pub fn decode(
        &self,
        backend: &dyn Backend,
        pool: &mut KvPool,
        items: &[DecodeItem],
        verify: bool,
    ) -> Result<DecodeStep, RuntimeError> {
        if items.is_empty() {
            return Ok(DecodeStep { logits: Vec::new(), verify_seconds: 0.0 });
        }
        let reader = WeightReader::new(&self.checkpoint);
        for item in items {
            self.check_positions(item.position + 1)?;
            pool.reserve(item.request, item.position + 1)?;
        }
        let tokens: Vec<u32> = items.iter().map(|i| i.token).collect();
        let width = self.config.hidden_size;
        let mut hidden = backend.upload(&reader.rows("model.embed_tokens.weight", width, &tokens)?, width)?;
        let aux_width = self.aux_width();
        let layout = Layer::layout(&self.config, self.mla_scale);
        // Items still in the step (indices into `items`), the last DSA selection (rows in `live` order), and each
        // item's result.
        let mut live: Vec<usize> = (0..items.len()).collect();
        let mut keys: Option<Tensor> = None;
        let mut results: Vec<Option<Result<Vec<f32>, PoolError>>> = vec![None; items.len()];
        let mut verify_seconds = 0.0;
        for (index, layer) in self.layers.iter().enumerate() {
            let positions: Vec<usize> = live.iter().map(|&i| items[i].position).collect();
            let (new_rows, new_aux, queries) =
                layer.project(backend, &self.config, &self.table, &hidden, &positions, aux_width)?;
            let q = layer.attention_queries(backend, &self.config, &queries)?;
            let requests: Vec<KvAt> =
                live.iter().map(|&i| KvAt { request: items[i].request, position: items[i].position }).collect();
            let step = PagedStep {
                layer: index,
                layout,
                verify: verify && index == 0,
                q: &q,
                rows: &new_rows,
                aux: &new_aux,
                requests: &requests,
                keys: Layer::key_choice(&self.config, &queries, keys.as_ref()),
            };
            let decoded = backend.paged_decode(pool, &step)?;
            verify_seconds += decoded.verify_seconds;
            let mut attended = decoded.out;
            keys = decoded.keys.or(keys);
            if decoded.faults.iter().any(Option::is_some) {
                let kept: Vec<usize> = (0..live.len()).filter(|&t| decoded.faults[t].is_none()).collect();
                for (t, fault) in decoded.faults.into_iter().enumerate() {
                    if let Some(fault) = fault {
                        results[live[t]] = Some(Err(fault));
                    }
                }
                live = kept.iter().map(|&t| live[t]).collect();
                if live.is_empty() {
                    break;
                }
                hidden = backend.gather_rows(&hidden, &kept)?;
                attended = backend.gather_rows(&attended, &kept)?;
                keys = keys.map(|keys| backend.gather_rows(&keys, &kept)).transpose()?;
            }
            let attended = layer.attention_values(backend, &self.config, attended)?;
            layer.finish(backend, &reader, &self.config, &mut hidden, &attended)?;
        }
        if !live.is_empty() {
            let logits = self.logits(backend, &hidden)?;
            for (&i, logits) in live.iter().zip(logits.chunks(self.config.vocab_size)) {
                results[i] = Some(Ok(logits.to_vec()));
            }
        }
        let logits = results.into_iter().map(|result| result.expect("every item decoded or faulted")).collect();
        Ok(DecodeStep { logits, verify_seconds })
    }

    /// The logits of every row of `hidden` (final norm and head).
    fn logits(&self, backend: &dyn Backend, hidden: &Tensor) -> Result<Vec<f32>, RuntimeError> {
        let x = backend.rms_normed(hidden, &self.norm, self.config.rms_norm_eps as f32)?;
        backend.download(&backend.linear(&x, &self.head, None)?)
    }
}

/// The keys `[tokens, kv_heads · qk_dim]` and values `[tokens, kv_heads · v_dim]` that `layout` reads in cache rows
/// `rows`: GQA's K and V halves, MLA's whole absorbed row and its latent.
fn keys_and_values(
    backend: &dyn Backend,
    layout: &PagedLayout,
    rows: &Tensor,
) -> Result<(Tensor, Tensor), RuntimeError> {
    let PagedLayout { kv_heads, qk_dim, v_dim, k_stride, v_base, v_stride, .. } = *layout;
    if kv_heads > 1 && (k_stride != qk_dim || v_stride != v_dim) {
        return Err(RuntimeError::Input(format!("a cache layout of {kv_heads} interleaved heads cannot be prefilled")));
    }
    Ok((backend.columns(rows, 0, kv_heads * qk_dim)?, backend.columns(rows, v_base, kv_heads * v_dim)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Model;
    use crate::progress::Silent;
    use crate::runtime::kv_cache::{KvDtype, PoolShape};
    use crate::runtime::Cpu;
    use crate::synth::{synth, SynthArch, SynthOptions, SynthSize};

    /// Decode with an F32 cache repeats the full forward's arithmetic except the order of the MoE/linear batches'
    /// rows (row-independent) and the expansion of cached latents in a different batch: a few f32 ulps of logits
    /// that are O(1), amplified by up to three layers.
    const DECODE_VS_FULL_MAX_ABS: f32 = 2e-4;
    /// With a BF16 cache every cached value is rounded to 8 significant bits: logits move by about 2^-8 relative,
    /// more on GLM-5 where the perturbed hidden states can flip a near-tie of a later layer's DSA top-k (≈0.15 seen).
    const BF16_CACHE_MAX_ABS: f32 = 0.25;

    fn check(arch: SynthArch) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("model");
        synth(&SynthOptions { arch, size: SynthSize::default(), shards: 1, seed: 3, out: out.clone(), force: true })
            .unwrap();
        let tokens: Vec<u32> = (0..14u32).map(|i| (i * 37 + 11) % 250).collect();
        let model = Model::open(&out).unwrap();
        let vocab = model.config().vocab_size;
        let mut full = Vec::new();
        model
            .forward(&Cpu, std::slice::from_ref(&tokens), &Silent, &mut |_, logits| {
                full = logits.to_vec();
                Ok(())
            })
            .unwrap();
        let decoder = PagedModel::open(&out, 32).unwrap();
        let prompt = 5;
        for (dtype, tolerance) in [(KvDtype::F32, DECODE_VS_FULL_MAX_ABS), (KvDtype::Bf16, BF16_CACHE_MAX_ABS)] {
            let shape = PoolShape {
                layers: decoder.config().num_hidden_layers,
                row_width: decoder.row_width(),
                aux_width: decoder.aux_width(),
                page_size: 3,
                pages: 8,
            };
            let scales = KvScales::unit(KvLayout::of(decoder.config()), shape.layers);
            let mut pool = KvPool::new(shape, dtype, decoder.element_scales(&scales));
            pool.open(1);
            let prefilled = decoder.prefill(&Cpu, &tokens[..prompt]).unwrap();
            PagedModel::hand_over(&Cpu, &mut pool, 1, &prefilled).unwrap();
            let mut worst = max_abs(&prefilled.logits, &full[(prompt - 1) * vocab..][..vocab]);
            for position in prompt..tokens.len() {
                let item = DecodeItem { request: 1, token: tokens[position], position };
                let logits = decoder.decode(&Cpu, &mut pool, &[item], true).unwrap().logits.remove(0).unwrap();
                worst = worst.max(max_abs(&logits, &full[position * vocab..][..vocab]));
            }
            assert!(worst <= tolerance, "{arch:?} {dtype:?}: max |Δlogit| {worst} > {tolerance}");
        }
    }

    fn max_abs(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn decode_logits_match_the_full_forward_kimi() {
        check(SynthArch::KimiK2);
    }

    #[test]
    fn decode_logits_match_the_full_forward_glm5_with_dsa() {
        check(SynthArch::Glm5);
    }

    #[test]
    fn decode_logits_match_the_full_forward_glm45_gqa() {
        check(SynthArch::Glm45);
    }
}

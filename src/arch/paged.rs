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

use super::context::LayerContext;
use super::embedding::head_name;
use super::hyper::{narrow, widen};
use super::layer::{Layer, PagedInputs, PrefillCache};
use super::mtp::MtpLayer;
use super::rope::rope_setup;
use super::v4_kv_fp8::V4Cache;
use crate::format::kv_scales::{KvLayout, KvScales};
use crate::io::Checkpoint;
use crate::load::layer_stream::StreamedLayer;
use crate::load::open::open_checkpoint;
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::runtime::backend::Backend;
use crate::runtime::compressed_cache::{CompressedShape, LayerCacheShape};
use crate::runtime::kv_cache::LayerState;
use crate::runtime::kv_cache::{KvAt, KvDtype, KvPool, KvRows, PagedStep, PoolError, PoolShape, RequestId};
use crate::runtime::matrix::Matrix;
use crate::runtime::rope_table::RopeTable;
use crate::runtime::{RuntimeError, Spans, Tensor};

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
    /// Every position's hidden state after the final norm `[tokens, hidden]`, on the host (what the MTP layer drafts
    /// from), when the model was opened [`PagedModel::with_mtp`]; else empty.
    pub normed: Vec<f32>,
    /// Per cached (softmax attention) layer `[tokens, row_width]` and `[tokens, aux_width]`, f32, where the backend
    /// keeps them (the handoff converts them to the pool dtype).
    pub rows: Vec<Tensor>,
    pub aux: Vec<Tensor>,
    /// Per stateful layer (KDA; every DeepSeek-V4 layer), the request's state after the prompt (the handoff stores
    /// it as the engines do).
    pub states: Vec<LayerState>,
    /// The prompt's length.
    pub tokens: usize,
}

/// One decode step's results, in item order: logits `[vocab]`, or why the item's cached mappings cannot be trusted
/// (it was dropped from the step at the first layer that found it).
pub struct DecodeStep {
    pub logits: Vec<Result<Vec<f32>, PoolError>>,
    /// With the MTP layer loaded, each decoded item's hidden state after the final norm `[hidden]` (empty for an
    /// item that faulted, and without the MTP layer).
    pub normed: Vec<Vec<f32>>,
    /// Host time spent verifying mappings (0 where the device verifies inside the attention kernel).
    pub verify_seconds: f64,
}

/// One MTP draft in a [`PagedModel::draft`] batch: the layer at `position` reads the token after it (`next`) and the
/// hidden state `previous` `[hidden]` it drafts from.
#[derive(Debug, Clone)]
pub struct DraftItem {
    pub request: RequestId,
    pub next: u32,
    pub position: usize,
    pub previous: Vec<f32>,
}

/// An MTP draft's logits `[vocab]` and the layer's output `[hidden]` (before `shared_head.norm`), which a chained
/// draft takes as its `previous`.
pub struct Draft {
    pub logits: Vec<f32>,
    pub hidden: Vec<f32>,
}

/// A model opened for incremental decoding.
pub struct PagedModel {
    checkpoint: Checkpoint,
    config: ModelConfig,
    layers: Vec<Layer>,
    /// The MTP layer ([`PagedModel::with_mtp`]), cached in the pool as layer `num_hidden_layers`.
    mtp: Option<MtpLayer>,
    norm: Matrix,
    head: Matrix,
    table: RopeTable,
    mla_scale: f32,
    /// How DeepSeek-V4's caches are stored ([`PagedModel::with_v4_cache`]).
    v4_cache: V4Cache,
}

impl PagedModel {
    /// Loads every layer's resident weights; positions up to `max_positions` are supported.
    pub fn open(dir: &Path, max_positions: usize) -> Result<Self, RuntimeError> {
        let (checkpoint, config) = open_checkpoint(dir)?;
        let reader = WeightReader::new(&checkpoint);
        let layers = (0..config.num_hidden_layers)
            .map(|layer| Layer::load(&reader, &config, layer))
            .collect::<Result<Vec<_>, _>>()?;
        let norm = reader.parameter(config.final_norm_name(), config.hidden_size)?;
        let head = reader.matrix(head_name(&config, &reader), [config.vocab_size, config.hidden_size])?;
        let (table, mla_scale) = rope_setup(&config, max_positions.max(1));
        drop(reader);
        Ok(Self { checkpoint, config, layers, mtp: None, norm, head, table, mla_scale, v4_cache: V4Cache::Exact })
    }

    /// Stores DeepSeek-V4's caches (held in each request's state slot, not in the pool's pages) as `store` says:
    /// FP8 as vLLM writes them for an FP8 pool.
    pub fn with_v4_cache(mut self, store: V4Cache) -> Self {
        self.v4_cache = store;
        self
    }

    /// Loads the MTP layer too (for speculative decoding); `None` when the model has none.
    pub fn with_mtp(mut self) -> Result<Option<Self>, RuntimeError> {
        let reader = WeightReader::new(&self.checkpoint);
        let Some(mtp) = MtpLayer::load(&reader, &self.config)? else { return Ok(None) };
        drop(reader);
        self.mtp = Some(mtp);
        Ok(Some(self))
    }

    /// A pool of `shape` for this model in `dtype` (FP8 elements scaled by `element_scales`,
    /// [`PagedModel::element_scales`]), with the state slots of its KDA layers or the cache pages of DeepSeek-V4.
    pub fn new_pool(&self, shape: PoolShape, dtype: KvDtype, element_scales: Vec<Vec<f32>>) -> KvPool {
        let pool = KvPool::new(shape, dtype, element_scales);
        match (self.kda_layers(), self.compressed_shape()) {
            (Some((kda, layers)), _) => pool.with_states(kda, layers),
            (None, Some(shape)) => pool.with_compressed_states(shape),
            (None, None) => pool,
        }
    }

    /// The shape of a pool of `pages` pages of `page_size` tokens for this model.
    pub fn pool_shape(&self, page_size: usize, pages: usize) -> PoolShape {
        PoolShape {
            layers: self.cached_layers(),
            row_width: self.row_width(),
            aux_width: self.aux_width(),
            page_size,
            pages,
        }
    }

    /// Layers the pool caches: the decoder layers with paged softmax attention (not KDA, not DeepSeek-V4's), and the
    /// MTP layer when loaded.
    pub fn cached_layers(&self) -> usize {
        self.attention_layers() + usize::from(self.mtp.is_some())
    }

    /// Decoder layers with paged softmax attention (cached in the pool in this order; the MTP layer comes after
    /// them).
    fn attention_layers(&self) -> usize {
        self.layers.iter().filter(|layer| !layer.is_kda() && !layer.is_compressed()).count()
    }

    /// The KDA layers' shape and count, for the pool's state slots (`None` without KDA layers).
    pub fn kda_layers(&self) -> Option<(crate::runtime::kda::KdaShape, usize)> {
        let count = self.layers.iter().filter(|layer| layer.is_kda()).count();
        super::kda::shape(&self.config).filter(|_| count > 0).map(|shape| (shape, count))
    }

    /// The sizes of DeepSeek-V4's per-request caches, for the pool's state slots (`None` for other models).
    pub fn compressed_shape(&self) -> Option<CompressedShape> {
        compressed_shape(&self.config)
    }

    /// Whether a prompt prefilled on this model can be decoded on `decoder`: the same cached layers, row and aux
    /// widths, KDA states and DeepSeek-V4 caches (the split deployment's handover).
    pub fn hands_over_to(&self, decoder: &PagedModel) -> bool {
        self.row_width() == decoder.row_width()
            && self.aux_width() == decoder.aux_width()
            && self.config.num_hidden_layers == decoder.config.num_hidden_layers
            && self.kda_layers() == decoder.kda_layers()
            && self.compressed_shape() == decoder.compressed_shape()
    }

    /// Whether requests keep a state slot (KDA states, DeepSeek-V4 caches).
    pub fn has_states(&self) -> bool {
        self.kda_layers().is_some() || self.compressed_shape().is_some()
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
        self.stepping().row_width()
    }

    /// f32 values kept beside each row: the DSA indexer key (GLM-5), else 0.
    pub fn aux_width(&self) -> usize {
        self.stepping().aux_width()
    }

    /// Per cached layer, the scale of every row element: MLA all `k_scale`; GQA `k_scale` of the head for K,
    /// `v_scale` for V; the MTP layer 1.0 (no checkpoint calibrates its cache).
    pub fn element_scales(&self, scales: &KvScales) -> Vec<Vec<f32>> {
        let width = self.row_width();
        let paged = |layer: &usize| !self.config.is_kda_layer(*layer) && self.config.deepseek_v4().is_none();
        let mut all: Vec<Vec<f32>> = (0..self.config.num_hidden_layers)
            .filter(paged)
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
            .collect();
        if self.mtp.is_some() {
            all.push(vec![1.0; width]);
        }
        all
    }

    /// What a decode or draft step needs besides the layers.
    fn stepping(&self) -> Stepping<'_> {
        Stepping { config: &self.config, table: &self.table, mla_scale: self.mla_scale, v4_cache: self.v4_cache }
    }

    /// Runs a whole prompt (causal attention over its own f32 rows) and returns the last position's logits and
    /// every layer's rows.
    pub fn prefill(&self, backend: &dyn Backend, tokens: &[u32]) -> Result<Prefilled, RuntimeError> {
        if tokens.is_empty() {
            return Err(RuntimeError::Input("an empty prompt cannot be prefilled".into()));
        }
        self.stepping().check_positions(tokens.len())?;
        let reader = WeightReader::new(&self.checkpoint);
        let count = tokens.len();
        let width = self.config.hidden_size;
        let embedded = backend.upload(&reader.rows(self.config.embed_name(), width, tokens)?, width)?;
        let mut hidden = widen(backend, &self.config, embedded)?;
        let (mut all_rows, mut all_aux, mut states) = (Vec::new(), Vec::new(), Vec::new());
        // The last DSA selection `[count, count]` (shared layers reuse the last indexer layer's).
        let mut selections = [None];
        let context = LayerContext {
            backend,
            reader: &reader,
            config: &self.config,
            table: &self.table,
            mla_scale: self.mla_scale,
        };
        let spans = Spans::new(&[count]);
        for layer in &self.layers {
            let store = (&context, self.v4_cache);
            for cache in layer.prefill(store, &mut hidden, (&spans, tokens), self.aux_width(), &mut selections)? {
                match cache {
                    PrefillCache::Rows { rows, aux } => {
                        all_rows.push(rows);
                        all_aux.push(aux);
                    }
                    PrefillCache::State(state) => states.push(state),
                }
            }
        }
        let hidden = narrow(backend, &reader, &self.config, hidden)?;
        let normed = backend.rms_normed(&hidden, &self.norm, self.config.rms_norm_eps as f32)?;
        let logits = self.head_logits(backend, &backend.row_range(&normed, count - 1..count)?)?;
        let normed = if self.mtp.is_some() { backend.download(&normed)? } else { Vec::new() };
        Ok(Prefilled { logits, normed, rows: all_rows, aux: all_aux, states, tokens: count })
    }

    /// Writes a prefilled prompt's rows into `pool` for `request` (converted to the pool's dtype and scales) through
    /// `backend`, whose pages of the pool they go to, and its KDA states into a state slot
    /// ([`KvPool::keep_state`]).
    pub fn hand_over(
        backend: &dyn Backend,
        pool: &mut KvPool,
        request: RequestId,
        prefilled: &Prefilled,
    ) -> Result<(), RuntimeError> {
        let count = prefilled.tokens;
        pool.reserve(request, count)?;
        let at: Vec<KvAt> = (0..count).map(|position| KvAt { request, position }).collect();
        for (layer, (rows, aux)) in prefilled.rows.iter().zip(&prefilled.aux).enumerate() {
            backend.kv_write(pool, layer, &KvRows { rows, aux, at: &at })?;
        }
        if pool.state_slots().used() {
            pool.store_states(request, prefilled.states.clone())?;
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
            return Ok(DecodeStep { logits: Vec::new(), normed: Vec::new(), verify_seconds: 0.0 });
        }
        let reader = WeightReader::new(&self.checkpoint);
        let at: Vec<KvAt> = items.iter().map(|i| KvAt { request: i.request, position: i.position }).collect();
        let tokens: Vec<u32> = items.iter().map(|i| i.token).collect();
        let width = self.config.hidden_size;
        let embedded = backend.upload(&reader.rows(self.config.embed_name(), width, &tokens)?, width)?;
        let hidden = widen(backend, &self.config, embedded)?;
        let stepping = self.stepping();
        let mut step = stepping.start_step(pool, &at, hidden)?;
        step.tokens = tokens;
        // Softmax attention layers take the pool's layers in order, KDA and DeepSeek-V4 layers the states of the
        // request's slot.
        let (mut pool_layer, mut state_layer) = (0, 0);
        for (index, layer) in self.layers.iter().enumerate() {
            let verify = verify && index == 0;
            if layer.is_kda() || layer.is_compressed() {
                stepping.step_state_layer(backend, pool, &reader, (state_layer, layer), &mut step, verify)?;
                state_layer += 1;
            } else {
                stepping.step_layer(backend, pool, &reader, (pool_layer, layer), &mut step, verify)?;
                pool_layer += 1;
            }
        }
        let mut normed = vec![Vec::new(); items.len()];
        let mut logits: Vec<Option<Vec<f32>>> = vec![None; items.len()];
        if !step.live.is_empty() {
            // mHC's streams collapse into their mean first (a copy only then: the step keeps its residual stream).
            let collapsed = match self.config.hyper_connections() {
                Some(_) => Some(narrow(
                    backend,
                    &reader,
                    &self.config,
                    backend.row_range(&step.hidden, 0..step.hidden.rows())?,
                )?),
                None => None,
            };
            let hidden = collapsed.as_ref().unwrap_or(&step.hidden);
            let states = backend.rms_normed(hidden, &self.norm, self.config.rms_norm_eps as f32)?;
            let all = self.head_logits(backend, &states)?;
            let states = if self.mtp.is_some() { backend.download(&states)? } else { Vec::new() };
            for (row, &i) in step.live.iter().enumerate() {
                logits[i] = Some(all[row * self.config.vocab_size..][..self.config.vocab_size].to_vec());
                if !states.is_empty() {
                    normed[i] = states[row * width..][..width].to_vec();
                }
            }
        }
        let verify_seconds = step.verify_seconds;
        Ok(DecodeStep { logits: step.results(logits), normed, verify_seconds })
    }

    /// One MTP draft per item through the MTP layer, cached in the pool as layer `num_hidden_layers`
    /// ([`Stepping::draft`]).
    pub fn draft(
        &self,
        backend: &dyn Backend,
        pool: &mut KvPool,
        items: &[DraftItem],
        verify: bool,
    ) -> Result<Vec<Result<Draft, PoolError>>, RuntimeError> {
        let Some(mtp) = &self.mtp else {
            return Err(RuntimeError::Input("the decoder was opened without its MTP layer".into()));
        };
        let reader = WeightReader::new(&self.checkpoint);
        self.stepping().draft(backend, pool, &reader, (self.attention_layers(), mtp), items, verify)
    }

    /// The logits of every row of `normed` (hidden states after the final norm).
    fn head_logits(&self, backend: &dyn Backend, normed: &Tensor) -> Result<Vec<f32>, RuntimeError> {
        backend.download(&backend.linear(normed, &self.head, None)?)
    }
}

/// What a paged decode or draft step needs besides its layers: the config, the RoPE table (its length bounds the
/// positions) and MLA's softmax scale. [`PagedModel`] steps its resident layers with it; `eval --mtp-depth` steps
/// the MTP layer alone over a pool of that one layer ([`super::mtp_chain`]).
#[derive(Clone, Copy)]
pub struct Stepping<'a> {
    pub config: &'a ModelConfig,
    pub table: &'a RopeTable,
    pub mla_scale: f32,
    pub v4_cache: V4Cache,
}

impl Stepping<'_> {
    /// Width of one cached row per token and layer (MLA latent 576 for Kimi/GLM-5; GQA 2 · kv_heads · head_dim).
    pub fn row_width(&self) -> usize {
        match KvLayout::of(self.config) {
            KvLayout::Mla { row_width } => row_width,
            KvLayout::Gqa { kv_heads, head_dim } => 2 * kv_heads * head_dim,
        }
    }

    /// f32 values kept beside each row: the DSA indexer key (GLM-5; GLM-5.3-Flash's k-pool: the key and its gate
    /// score), else 0.
    pub fn aux_width(&self) -> usize {
        self.config.indexer.as_ref().map_or(0, |i| i.index_head_dim * if i.kpool.is_some() { 2 } else { 1 })
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

    /// One MTP draft per item through `mtp`, cached in the pool as layer `pool_layer` (its mappings verified first
    /// with `verify`): the layer's input from each item's `next` token (zeroed at position 0) and `previous` hidden
    /// state, its paged attention over the request's MTP rows `0..=position`, its head. Items of one request may
    /// come several at a time at consecutive positions (a catch-up over newly verified tokens).
    pub fn draft(
        &self,
        backend: &dyn Backend,
        pool: &mut KvPool,
        reader: &WeightReader,
        (pool_layer, mtp): (usize, &MtpLayer),
        items: &[DraftItem],
        verify: bool,
    ) -> Result<Vec<Result<Draft, PoolError>>, RuntimeError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let width = self.config.hidden_size;
        let at: Vec<KvAt> = items.iter().map(|i| KvAt { request: i.request, position: i.position }).collect();
        let next: Vec<u32> = items.iter().map(|i| i.next).collect();
        let first: Vec<bool> = items.iter().map(|i| i.position == 0).collect();
        let mut previous = Vec::with_capacity(items.len() * width);
        for item in items {
            if item.previous.len() != width {
                return Err(RuntimeError::Input(format!(
                    "an MTP draft of request {} at position {} was given a hidden state of {} values; the model's is {width}",
                    item.request,
                    item.position,
                    item.previous.len()
                )));
            }
            previous.extend_from_slice(&item.previous);
        }
        let previous = backend.upload(&previous, width)?;
        let hidden = mtp.input(backend, reader, self.config, &next, &first, &previous)?;
        let mut step = self.start_step(pool, &at, hidden)?;
        self.step_layer(backend, pool, reader, (pool_layer, mtp.layer()), &mut step, verify)?;
        let mut drafts: Vec<Option<Draft>> = (0..items.len()).map(|_| None).collect();
        if !step.live.is_empty() {
            let logits = mtp.head_logits(backend, self.config, &step.hidden)?;
            let states = backend.download(&step.hidden)?;
            let vocab = self.config.vocab_size;
            for (row, &i) in step.live.iter().enumerate() {
                drafts[i] = Some(Draft {
                    logits: logits[row * vocab..][..vocab].to_vec(),
                    hidden: states[row * width..][..width].to_vec(),
                });
            }
        }
        Ok(step.results(drafts))
    }

    /// A step over `at`, its positions checked and reserved in the pool, starting from the residual stream `hidden`.
    fn start_step(&self, pool: &mut KvPool, at: &[KvAt], hidden: Tensor) -> Result<Step, RuntimeError> {
        for item in at {
            self.check_positions(item.position + 1)?;
            pool.reserve(item.request, item.position + 1)?;
        }
        Ok(Step {
            at: at.to_vec(),
            tokens: Vec::new(),
            live: (0..at.len()).collect(),
            hidden,
            keys: None,
            faults: vec![None; at.len()],
            verify_seconds: 0.0,
        })
    }

    /// Stateful layer `state_index` (among the KDA or DeepSeek-V4 layers) of a step: checks each live item's state
    /// slot (all its mappings with `verify`), drops the items that fail with their fault, advances the others'
    /// states (caches) by their token and gives them back ([`KvPool::take_state`], [`KvPool::restore_state`]).
    fn step_state_layer(
        &self,
        backend: &dyn Backend,
        pool: &mut KvPool,
        reader: &WeightReader,
        (state_index, layer): (usize, &Layer),
        step: &mut Step,
        verify: bool,
    ) -> Result<(), RuntimeError> {
        let started = std::time::Instant::now();
        let mut kept = Vec::with_capacity(step.live.len());
        let mut states = Vec::with_capacity(step.live.len());
        for (row, &item) in step.live.iter().enumerate() {
            let request = step.at[item].request;
            let checked = if verify { pool.verify(request).map_err(PoolError::from) } else { Ok(()) };
            // Moved out of the slot (not copied) and given back below.
            match checked.and_then(|()| pool.take_state(request, state_index)) {
                Ok(Some(state)) => {
                    kept.push(row);
                    states.push(state);
                }
                Ok(None) => {
                    return Err(RuntimeError::Input(format!(
                        "request {request} has no state for state layer {state_index}"
                    )))
                }
                Err(fault) => step.faults[item] = Some(fault),
            }
        }
        step.verify_seconds += started.elapsed().as_secs_f64();
        if kept.len() < step.live.len() {
            step.live = kept.iter().map(|&row| step.live[row]).collect();
            if step.live.is_empty() {
                return Ok(());
            }
            step.hidden = backend.gather_rows(&step.hidden, &kept)?;
            step.keys = step.keys.take().map(|keys| backend.gather_rows(&keys, &kept)).transpose()?;
        }
        let context =
            LayerContext { backend, reader, config: self.config, table: self.table, mla_scale: self.mla_scale };
        let states = if layer.is_compressed() {
            let mut caches = states
                .into_iter()
                .map(|state| match state {
                    LayerState::Compressed(cache) => Ok(*cache),
                    _ => Err(RuntimeError::Input(format!("state layer {state_index} holds no DeepSeek-V4 cache"))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let ids: Vec<u32> = step.live.iter().filter_map(|&item| step.tokens.get(item).copied()).collect();
            layer.decode_caches((&context, self.v4_cache), &mut step.hidden, &mut caches, &ids)?;
            caches.into_iter().map(|cache| LayerState::Compressed(Box::new(cache))).collect::<Vec<_>>()
        } else {
            let mut kda = states
                .into_iter()
                .map(|state| match state {
                    LayerState::Kda(state) => Ok(state),
                    _ => Err(RuntimeError::Input(format!("state layer {state_index} holds no KDA state"))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            layer.decode_states(&context, &mut step.hidden, &mut kda)?;
            kda.into_iter().map(LayerState::Kda).collect()
        };
        for (state, &item) in states.into_iter().zip(&step.live) {
            pool.restore_state(step.at[item].request, state_index, state)?;
        }
        Ok(())
    }

    /// Layer `index` of a step: writes each live item's rows at its position and attends over positions
    /// `0..=position` of the pool through [`Backend::paged_decode`], which verifies each item's mappings (with
    /// `verify`; a device verifies at every layer inside its attention kernel). An item that fails is dropped from
    /// the rest of the step with its fault. The residual stream, the cache rows and GLM-5's DSA selections stay
    /// with the backend.
    fn step_layer(
        &self,
        backend: &dyn Backend,
        pool: &mut KvPool,
        reader: &WeightReader,
        (index, layer): (usize, &Layer),
        step: &mut Step,
        verify: bool,
    ) -> Result<(), RuntimeError> {
        if step.live.is_empty() {
            return Ok(());
        }
        let layout = Layer::layout(self.config, self.mla_scale);
        let positions: Vec<usize> = step.live.iter().map(|&i| step.at[i].position).collect();
        let requests: Vec<KvAt> = step.live.iter().map(|&i| step.at[i]).collect();
        let context =
            LayerContext { backend, reader, config: self.config, table: self.table, mla_scale: self.mla_scale };
        // What the paged attention hands back besides its rows: the layer's DSA selection, and the rows kept when
        // some requests faulted.
        let (mut selected, mut kept) = (None, None);
        let (live, faults, verify_seconds) = (&mut step.live, &mut step.faults, &mut step.verify_seconds);
        type Attended = Option<(Tensor, Option<Vec<usize>>)>;
        let attend = |hidden: &mut Tensor, inputs: PagedInputs| -> Result<Attended, RuntimeError> {
            let PagedInputs { q, rows, aux, keys } = inputs;
            let paged = PagedStep { layer: index, layout, verify, q, rows, aux, requests: &requests, keys };
            let decoded = backend.paged_decode(pool, &paged)?;
            *verify_seconds += decoded.verify_seconds;
            let mut attended = decoded.out;
            selected = decoded.keys;
            if decoded.faults.iter().any(Option::is_some) {
                let rows: Vec<usize> = (0..live.len()).filter(|&t| decoded.faults[t].is_none()).collect();
                for (t, fault) in decoded.faults.into_iter().enumerate() {
                    if let Some(fault) = fault {
                        faults[live[t]] = Some(fault);
                    }
                }
                *live = rows.iter().map(|&t| live[t]).collect();
                if live.is_empty() {
                    return Ok(None);
                }
                *hidden = backend.gather_rows(hidden, &rows)?;
                attended = backend.gather_rows(&attended, &rows)?;
                kept = Some(rows.clone());
                return Ok(Some((attended, Some(rows))));
            }
            Ok(Some((attended, None)))
        };
        layer.decode(&context, &mut step.hidden, (&positions, self.aux_width()), step.keys.as_ref(), attend)?;
        if selected.is_some() {
            step.keys = selected;
        }
        if let (Some(rows), false) = (kept, step.live.is_empty()) {
            step.keys = step.keys.take().map(|keys| backend.gather_rows(&keys, &rows)).transpose()?;
        }
        Ok(())
    }
}

/// Where a decode or draft step stands: its items, those still in it (indices into `at`), their residual stream
/// (rows in `live` order), the last DSA selection, and the faults of the items dropped.
struct Step {
    at: Vec<KvAt>,
    /// Each item's token (DeepSeek-V4's hash-routed layers read it); empty where the step has none to give.
    tokens: Vec<u32>,
    live: Vec<usize>,
    hidden: Tensor,
    keys: Option<Tensor>,
    faults: Vec<Option<PoolError>>,
    verify_seconds: f64,
}

impl Step {
    /// Per item, its output (`outputs[i]`, set for every live item) or its fault.
    fn results<T>(self, outputs: Vec<Option<T>>) -> Vec<Result<T, PoolError>> {
        outputs
            .into_iter()
            .zip(self.faults)
            .zip(self.at)
            .map(|((output, fault), at)| match (output, fault) {
                (_, Some(fault)) => Err(fault),
                (Some(output), None) => Ok(output),
                // Unreachable: an item is either live to the end or dropped with its fault.
                (None, None) => Err(PoolError::Unknown(at.request)),
            })
            .collect()
    }
}

/// The sizes of a DeepSeek-V4 model's per-request caches, layer by layer (`None` for other models).
pub fn compressed_shape(config: &ModelConfig) -> Option<CompressedShape> {
    let v4 = config.deepseek_v4()?;
    let overlap = |ratio: usize, dim: usize| [dim, if ratio == 4 { 2 * dim } else { dim }];
    let layers = (0..config.num_hidden_layers)
        .map(|layer| {
            let ratio = v4.compress_ratios.get(layer).copied().unwrap_or(0);
            LayerCacheShape {
                ratio,
                entry: if ratio == 0 { [0, 0] } else { overlap(ratio, v4.head_dim) },
                index: if ratio == 4 { overlap(4, v4.index_head_dim) } else { [0, 0] },
            }
        })
        .collect();
    Some(CompressedShape { window: v4.sliding_window, head_dim: v4.head_dim, layers })
}

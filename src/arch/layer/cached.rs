//! A decoder layer's uses with a cache: prompts prefilled into the caches its decode step reads ([`Layer::prefill`]:
//! attention rows and DSA indexer keys, KDA states, DeepSeek-V4's caches) and the decode step around them
//! ([`Layer::decode`] around the paged attention the caller passes in; [`Layer::decode_states`] and
//! [`Layer::extend_states`] for KDA, [`Layer::decode_caches`] and [`Layer::step_caches`] for DeepSeek-V4), each
//! ending in the layer's one residual and MLP.

use std::ops::Range;

use super::{Layer, Mixer, MlpRows};
use crate::arch::compressed_attention::CompressedAttention;
use crate::arch::context::LayerContext;
use crate::arch::gqa::GqaWeights;
use crate::arch::hyper::HyperMix;
use crate::arch::indexer::IndexQueries;
use crate::arch::kda::{KdaMode, KdaWeights};
use crate::arch::mla::MlaWeights;
use crate::arch::moe::ExpertTimes;
use crate::arch::tap::LayerTap;
use crate::arch::v4_kv_fp8::V4Cache;
use crate::model::config::Attention;
use crate::model::ModelConfig;
use crate::runtime::backend::{AttentionShape, Backend, KeySelection};
use crate::runtime::compressed_cache::CompressedCache;
use crate::runtime::kda::KdaState;
use crate::runtime::kv_cache::{KeyChoice, LayerState as CachedState, PagedLayout};
use crate::runtime::rope_table::RopeTable;
use crate::runtime::tensor::Tensor;
use crate::runtime::{RuntimeError, Spans};

/// Why a KDA layer cannot take the paged attention path (it is stepped through its state instead).
const KDA_NOT_PAGED: &str = "a KDA layer has no paged KV cache rows; it is prefilled and decoded through its state";
/// Why a DeepSeek-V4 layer cannot take the paged attention path (it is stepped through its caches instead).
const V4_NOT_PAGED: &str = "a DeepSeek-V4 layer has no paged KV cache rows; it is prefilled and decoded through its \
                            caches per layer type (Layer::prefill_cache, Layer::decode_caches)";

/// A decode step's queries of its new tokens: `[tokens, heads, qk]` post-RoPE, and the DSA indexer's.
struct Queries {
    q: Tensor,
    index: Option<IndexQueries>,
}

/// What a decode step's paged attention takes from the layer: the new tokens' queries `[tokens, heads,
/// layout.qk_dim]`, their cache rows and indexer keys, and how their keys are chosen on a DSA model.
pub struct PagedInputs<'a> {
    pub q: &'a Tensor,
    pub rows: &'a Tensor,
    pub aux: &'a Tensor,
    pub keys: Option<KeyChoice<'a>>,
}

/// A sequence's cache of one layer after its prefill: what the layer's decode step reads.
pub enum PrefillCache {
    /// Softmax attention (MLA, GQA): the cache rows `[tokens, row_width]` and indexer keys `[tokens, aux_width]`,
    /// f32, where the backend keeps them.
    Rows { rows: Tensor, aux: Tensor },
    /// KDA's state, DeepSeek-V4's caches.
    State(CachedState),
}

/// Prompts prefilled through any layer.
impl Layer {
    /// Prompts' prefill through the layer: each sequence of `spans` (rows of `hidden`; `ids` their token ids) through
    /// the mixer from an empty cache — softmax attention causally over its own rows as the paged cache reads them
    /// ([`Layer::attend_prompt`], `selections[i]` the sequence's DSA mask of the last indexer layer), KDA chunked
    /// from the zero state, DeepSeek-V4's attention filling its caches — then the residual and MLP of all the rows
    /// together. Returns each sequence's cache of the layer.
    pub fn prefill(
        &self,
        (context, store): (&LayerContext, V4Cache),
        hidden: &mut Tensor,
        (spans, ids): (&Spans, &[u32]),
        aux_width: usize,
        selections: &mut [Option<Vec<bool>>],
    ) -> Result<Vec<PrefillCache>, RuntimeError> {
        let backend = context.backend;
        let (x, mix) = self.mixer_input(context, hidden)?;
        if let Mixer::Kda(kda) = &self.mixer {
            let mut states: Vec<KdaState> = spans.iter().map(|_| KdaState::new(&kda.shape())).collect();
            let mut sequences: Vec<_> =
                spans.iter().zip(&mut states).map(|((start, length), state)| (start..start + length, state)).collect();
            let mixed = kda.mix(backend, &x, &mut sequences, KdaMode::Chunked)?;
            self.finish_mixed(context, hidden, (&mixed, mix), ids)?;
            return Ok(states.into_iter().map(|state| PrefillCache::State(CachedState::Kda(state))).collect());
        }
        let whole = spans.starts.len() == 1;
        let (mut blocks, mut caches) = (Vec::with_capacity(spans.starts.len()), Vec::with_capacity(spans.starts.len()));
        for (index, (start, length)) in spans.iter().enumerate() {
            let part;
            let x = if whole {
                &x
            } else {
                part = backend.row_range(&x, start..start + length)?;
                &part
            };
            let (block, cache) = match &self.mixer {
                Mixer::Compressed(attention) => {
                    let (mixed, cache) = attention.prefill((context, store), x, &mut 0)?;
                    (mixed, PrefillCache::State(CachedState::Compressed(Box::new(cache))))
                }
                _ => {
                    let (attended, rows, aux) = self.attend_prompt(context, x, aux_width, &mut selections[index])?;
                    (attended, PrefillCache::Rows { rows, aux })
                }
            };
            blocks.push(block);
            caches.push(cache);
        }
        let output = match <[Tensor; 1]>::try_from(blocks) {
            Ok([block]) => block,
            Err(blocks) => {
                let Some(first) = blocks.first() else { return Ok(caches) };
                let mut output = backend.empty(spans.total(), first.columns())?;
                for ((start, _), block) in spans.iter().zip(&blocks) {
                    backend.place_rows(&mut output, start, block)?;
                }
                output
            }
        };
        match &self.mixer {
            Mixer::Compressed(_) => self.finish_mixed(context, hidden, (&output, mix), ids)?,
            _ => self.finish(context, hidden, (&output, mix))?,
        }
        Ok(caches)
    }
}

/// The paged uses of a KDA layer: the decode step from the states.
impl Layer {
    /// Whether the layer's mixer is KDA (a state per request instead of cached rows).
    pub fn is_kda(&self) -> bool {
        matches!(self.mixer, Mixer::Kda(_))
    }

    /// The layer's KDA mixer, or an error for a softmax attention layer.
    fn kda(&self) -> Result<&KdaWeights, RuntimeError> {
        match &self.mixer {
            Mixer::Kda(kda) => Ok(kda),
            _ => Err(RuntimeError::Input("a softmax attention layer was stepped as a KDA layer".into())),
        }
    }

    /// The decode step through a KDA layer: row `r` of `hidden` advances `states[r]` by one token (recurrent),
    /// then the layer's residual and MLP.
    pub fn decode_states(
        &self,
        context: &LayerContext,
        hidden: &mut Tensor,
        states: &mut [KdaState],
    ) -> Result<(), RuntimeError> {
        let mut runs: Vec<_> = states.iter_mut().enumerate().map(|(row, state)| (row..row + 1, state)).collect();
        self.extend_states(context, hidden, &mut runs)
    }

    /// Tokens through a KDA layer from states: each run `(rows, state)` of `hidden` advances its state token by
    /// token (recurrent, as decode steps do), then the layer's residual and MLP of all the rows together.
    pub fn extend_states(
        &self,
        context: &LayerContext,
        hidden: &mut Tensor,
        runs: &mut [(Range<usize>, &mut KdaState)],
    ) -> Result<(), RuntimeError> {
        let kda = self.kda()?;
        let (x, mix) = self.mixer_input(context, hidden)?;
        let mixed = kda.mix(context.backend, &x, runs, KdaMode::Recurrent)?;
        self.finish_mixed(context, hidden, (&mixed, mix), &[])
    }

    /// `hidden += mixed` (the mixer's output after its projection; with mHC put back by `mix`), then
    /// `hidden += mlp(norm(hidden))` (`ids`: each row's token id, for hash routing; may be empty).
    fn finish_mixed(
        &self,
        context: &LayerContext,
        hidden: &mut Tensor,
        mixed: (&Tensor, Option<HyperMix>),
        ids: &[u32],
    ) -> Result<(), RuntimeError> {
        let times = ExpertTimes::default();
        let mlp = MlpRows { only: None, times: &times, near_ties: &mut 0, ids, tap: &mut LayerTap::default() };
        self.residual(context, hidden, mixed, mlp, None)
    }
}

/// The cached uses of a DeepSeek-V4 layer: the decode step from the caches.
impl Layer {
    /// Whether the layer's mixer is DeepSeek-V4's compressed attention (a cache per request of its own kinds).
    pub fn is_compressed(&self) -> bool {
        matches!(self.mixer, Mixer::Compressed(_))
    }

    fn compressed(&self) -> Result<&CompressedAttention, RuntimeError> {
        match &self.mixer {
            Mixer::Compressed(attention) => Ok(attention),
            _ => Err(RuntimeError::Input("a layer without DeepSeek-V4's attention was stepped as one".into())),
        }
    }

    /// The decode step through the layer: row `r` of `hidden` (token `ids[r]`) is the next token of the request
    /// whose cache is `caches[r]`, then the layer's residual and MLP.
    pub fn decode_caches(
        &self,
        context: (&LayerContext, V4Cache),
        hidden: &mut Tensor,
        caches: &mut [CompressedCache],
        ids: &[u32],
    ) -> Result<(), RuntimeError> {
        let steps = [caches.len()];
        self.step_caches(context, hidden, caches, (ids, &steps))
    }

    /// Decode steps through the layer's attention, one after the other, then the residual and MLP of all their rows
    /// together: `hidden`'s rows (tokens `ids`) are the steps' in order, step `t` taking `steps[t]` rows, row `r` of
    /// it the next token of the request whose cache is `caches[r]`.
    pub fn step_caches(
        &self,
        (context, store): (&LayerContext, V4Cache),
        hidden: &mut Tensor,
        caches: &mut [CompressedCache],
        (ids, steps): (&[u32], &[usize]),
    ) -> Result<(), RuntimeError> {
        let attention = self.compressed()?;
        let backend = context.backend;
        let (x, mix) = self.mixer_input(context, hidden)?;
        let mixed = match steps {
            [count] => attention.decode((backend, context.config, store), &x, &mut caches[..*count], &mut 0)?,
            _ => {
                let mut mixed = backend.empty(x.rows(), context.config.hidden_size)?;
                let mut start = 0;
                for &count in steps {
                    let rows = backend.row_range(&x, start..start + count)?;
                    let step =
                        attention.decode((backend, context.config, store), &rows, &mut caches[..count], &mut 0)?;
                    backend.place_rows(&mut mixed, start, &step)?;
                    start += count;
                }
                mixed
            }
        };
        self.finish_mixed(context, hidden, (&mixed, mix), ids)
    }
}

/// The paged uses of the layer: a prompt's prefill and the decode step around the paged attention.
impl Layer {
    /// How the paged attention reads a layer's cached rows: GQA heads over `[K | V]`, MLA in the absorbed form.
    pub fn layout(config: &ModelConfig, mla_scale: f32) -> PagedLayout {
        match &config.attention {
            Attention::Mla { .. } => MlaWeights::layout(config, mla_scale),
            Attention::Gqa { .. } => GqaWeights::layout(config),
        }
    }

    /// Cache rows `[tokens, row_width]` and indexer keys `[tokens, aux_width]` of the mixer input `x` (the residual
    /// stream normed, [`Layer::mixer_input`]) at `positions`, and the queries of the same tokens.
    fn project(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        table: &RopeTable,
        x: &Tensor,
        positions: &[usize],
        aux_width: usize,
    ) -> Result<(Tensor, Tensor, Queries), RuntimeError> {
        Ok(match &self.mixer {
            Mixer::Mla(mla) => {
                let (rows, aux, q, index) = mla.project(backend, config, table, x, positions, aux_width)?;
                (rows, aux, Queries { q, index })
            }
            Mixer::Gqa(gqa) => {
                let (rows, q) = gqa.project(backend, config, table, x, positions)?;
                (rows, backend.zeros(positions.len(), aux_width)?, Queries { q, index: None })
            }
            Mixer::Kda(_) => return Err(RuntimeError::Input(KDA_NOT_PAGED.into())),
            Mixer::Compressed(_) => return Err(RuntimeError::Input(V4_NOT_PAGED.into())),
        })
    }

    /// A prompt's DSA selection by this layer's indexer (`None` for a layer without one): its queries over the
    /// prompt's own indexer keys `keys` `[tokens, index_dim]`, causal, as the full-sequence forward selects.
    fn select_prompt(
        backend: &dyn Backend,
        config: &ModelConfig,
        queries: &Queries,
        keys: &Tensor,
    ) -> Result<Option<KeySelection>, RuntimeError> {
        let (Some(index), Some(settings)) = (&queries.index, &config.indexer) else { return Ok(None) };
        index.select_prompt(backend, settings, keys).map(Some)
    }

    /// How this layer's paged attention picks its keys on a DSA model: its own indexer's selection, or `earlier`
    /// (the last indexer layer's mask in this step) reused; `None` where every key is attended.
    fn key_choice<'a>(
        config: &ModelConfig,
        queries: &'a Queries,
        earlier: Option<&'a Tensor>,
    ) -> Option<KeyChoice<'a>> {
        match (&queries.index, &config.indexer) {
            (Some(index), Some(settings)) => Some(index.choice(settings)),
            _ => earlier.map(KeyChoice::Reuse),
        }
    }

    /// The queries the paged attention takes, `[tokens, heads, layout.qk_dim]`: GQA as projected; MLA absorbed.
    fn attention_queries(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        queries: &Queries,
    ) -> Result<Tensor, RuntimeError> {
        match &self.mixer {
            Mixer::Mla(mla) => mla.attention_queries(backend, config, &queries.q),
            Mixer::Gqa(_) => backend.row_range(&queries.q, 0..queries.q.rows()),
            Mixer::Kda(_) => Err(RuntimeError::Input(KDA_NOT_PAGED.into())),
            Mixer::Compressed(_) => Err(RuntimeError::Input(V4_NOT_PAGED.into())),
        }
    }

    /// The attention outputs `[tokens, heads · v_dim]` that `o_proj` takes, from the paged attention's
    /// `[tokens, heads · layout.v_dim]`: GQA as they are; MLA each head's attended latent through `W_UV_h`.
    fn attention_values(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        attended: Tensor,
    ) -> Result<Tensor, RuntimeError> {
        match &self.mixer {
            Mixer::Mla(mla) => mla.attention_values(backend, config, &attended),
            Mixer::Gqa(_) => Ok(attended),
            Mixer::Kda(_) => Err(RuntimeError::Input(KDA_NOT_PAGED.into())),
            Mixer::Compressed(_) => Err(RuntimeError::Input(V4_NOT_PAGED.into())),
        }
    }

    /// The rest of the layer after the paged attention: `hidden += o_proj(attended)` (with mHC put back by `mix`),
    /// then `hidden += mlp(norm(hidden))`.
    fn finish(
        &self,
        context: &LayerContext,
        hidden: &mut Tensor,
        (attended, mix): (&Tensor, Option<HyperMix>),
    ) -> Result<(), RuntimeError> {
        let projected = match &self.mixer {
            Mixer::Mla(mla) => mla.output(context.backend, attended)?,
            Mixer::Gqa(gqa) => gqa.output(context.backend, attended)?,
            Mixer::Kda(_) => return Err(RuntimeError::Input(KDA_NOT_PAGED.into())),
            Mixer::Compressed(_) => return Err(RuntimeError::Input(V4_NOT_PAGED.into())),
        };
        self.finish_mixed(context, hidden, (&projected, mix), &[])
    }

    /// One prompt's attention through a softmax attention layer (`x`: its mixer input): its rows for the cache
    /// (`[tokens, row_width]`, and the indexer keys `[tokens, aux_width]`) and its attention over them causally as the
    /// paged cache layout reads them (the f32 rows, before a hand-over rounds them) with `selection` the DSA mask of
    /// the last indexer layer (updated by this layer's own indexer). Returns the attended values `o_proj` takes and
    /// the rows.
    fn attend_prompt(
        &self,
        context: &LayerContext,
        x: &Tensor,
        aux_width: usize,
        selection: &mut Option<Vec<bool>>,
    ) -> Result<(Tensor, Tensor, Tensor), RuntimeError> {
        let LayerContext { backend, config, table, mla_scale, .. } = *context;
        let count = x.rows();
        let positions: Vec<usize> = (0..count).collect();
        let layout = Self::layout(config, mla_scale);
        let shape = AttentionShape {
            tokens: count,
            heads: layout.heads,
            kv_heads: layout.kv_heads,
            qk_dim: layout.qk_dim,
            v_dim: layout.v_dim,
            scale: layout.scale,
        };
        let (rows, aux, queries) = self.project(backend, config, table, x, &positions, aux_width)?;
        let q = self.attention_queries(backend, config, &queries)?;
        if let Some(chosen) = Self::select_prompt(backend, config, &queries, &aux)? {
            *selection = Some(chosen.mask);
        }
        let (k, v) = keys_and_values(backend, &layout, &rows)?;
        let attended = backend.attention(&q, &k, &v, 0..count, &shape, selection.as_deref())?;
        Ok((self.attention_values(backend, config, attended)?, rows, aux))
    }

    /// The decode step through the layer: the new tokens' cache rows and queries from the residual stream `hidden`
    /// at `positions` (the keys chosen by this layer's indexer, or `earlier`: the last indexer layer's selection in
    /// this step), `attend` (the paged attention over the pool, which may drop rows of `hidden` whose requests
    /// faulted; it returns the attended rows of those left with the rows kept when it dropped some, `None` when
    /// none is left), then [`Layer::finish`].
    pub fn decode(
        &self,
        context: &LayerContext,
        hidden: &mut Tensor,
        (positions, aux_width): (&[usize], usize),
        earlier: Option<&Tensor>,
        attend: impl FnOnce(&mut Tensor, PagedInputs) -> Result<Option<(Tensor, Option<Vec<usize>>)>, RuntimeError>,
    ) -> Result<(), RuntimeError> {
        let LayerContext { backend, config, table, .. } = *context;
        let (x, mix) = self.mixer_input(context, hidden)?;
        let (rows, aux, queries) = self.project(backend, config, table, &x, positions, aux_width)?;
        let q = self.attention_queries(backend, config, &queries)?;
        let keys = Self::key_choice(config, &queries, earlier);
        let Some((attended, kept)) = attend(hidden, PagedInputs { q: &q, rows: &rows, aux: &aux, keys })? else {
            return Ok(());
        };
        let mix = match (mix, kept) {
            (Some(mix), Some(kept)) => Some(mix.rows(&kept)),
            (mix, _) => mix,
        };
        let attended = self.attention_values(backend, config, attended)?;
        self.finish(context, hidden, (&attended, mix))
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

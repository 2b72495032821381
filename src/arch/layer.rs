//! One decoder layer: its resident weights (norms, token mixer, router, shared or dense MLP, mHC) loaded and
//! dequantized together, and the pre-norm residual forward `h += mix(norm(h)); h += mlp(norm(h))` (with mHC the streams
//! collapsed into each block's input and its output expanded back, [`super::hyper`]): its mixer (MLA, GQA, KDA or
//! DeepSeek-V4's) over whole sequences ([`Layer::forward`]), over prompts into the caches a decode step reads
//! ([`Layer::prefill`]) or around a decode step's cache ([`Layer::decode`] around the paged attention;
//! [`Layer::decode_states`] for KDA, [`Layer::decode_caches`] for DeepSeek-V4), then the one residual and MLP they
//! all share.

use std::ops::Range;

use super::compressed_attention::CompressedAttention;
use super::context::{LayerContext, Residual};
use super::gqa::GqaWeights;
use super::hyper::{self, HyperMix, HyperWeights};
use super::indexer::IndexQueries;
use super::kda::{KdaMode, KdaWeights};
use super::mla::MlaWeights;
use super::moe::{DenseMlp, ExpertTimes, MoeWeights};
use super::tap::{KvSource, LayerTap};
use super::v4_kv_fp8::V4Cache;
use crate::load::layer_stream::StreamedLayer;
use crate::load::weights::WeightReader;
use crate::model::config::Attention;
use crate::model::ModelConfig;
use crate::runtime::backend::{AttentionShape, Backend, KeySelection};
use crate::runtime::compressed_cache::CompressedCache;
use crate::runtime::kda::KdaState;
use crate::runtime::kv_cache::{KeyChoice, LayerState as CachedState, PagedLayout};
use crate::runtime::matrix::Matrix;
use crate::runtime::rope_table::RopeTable;
use crate::runtime::tensor::Tensor;
use crate::runtime::{RuntimeError, Spans};

/// A layer's token mixer: softmax attention (MLA, GQA, DeepSeek-V4's compressed attention) or KDA linear attention.
enum Mixer {
    Mla(Box<MlaWeights>),
    Gqa(Box<GqaWeights>),
    Kda(Box<KdaWeights>),
    Compressed(Box<CompressedAttention>),
}

/// Why a KDA layer cannot take the paged attention path (it is stepped through its state instead).
const KDA_NOT_PAGED: &str = "a KDA layer has no paged KV cache rows; it is prefilled and decoded through its state";
/// Why a DeepSeek-V4 layer cannot take the paged attention path (it is stepped through its caches instead).
const V4_NOT_PAGED: &str = "a DeepSeek-V4 layer has no paged KV cache rows; it is prefilled and decoded through its \
                            caches per layer type (Layer::prefill_cache, Layer::decode_caches)";

enum Mlp {
    Dense(Box<DenseMlp>),
    Moe(Box<MoeWeights>),
}

impl Mlp {
    fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let prefix = config.layer_prefix(layer);
        Ok(if config.runs_moe(layer) {
            Mlp::Moe(Box::new(MoeWeights::load(reader, config, &prefix, layer)?))
        } else {
            Mlp::Dense(Box::new(DenseMlp::load(reader, config, &format!("{prefix}.mlp"), config.intermediate_size)?))
        })
    }

    fn matrices(&self) -> Vec<&Matrix> {
        match self {
            Mlp::Dense(mlp) => mlp.matrices().to_vec(),
            Mlp::Moe(moe) => moe.matrices(),
        }
    }
}

fn norm_weights(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<[Matrix; 2], RuntimeError> {
    let [input, post] = config.layer_norm_names(layer);
    Ok([reader.parameter(&input, config.hidden_size)?, reader.parameter(&post, config.hidden_size)?])
}

/// `hidden` RMS-normed with `weight` (a copy).
fn normed(
    backend: &dyn Backend,
    config: &ModelConfig,
    hidden: &Tensor,
    weight: &Matrix,
) -> Result<Tensor, RuntimeError> {
    backend.rms_normed(hidden, weight, config.rms_norm_eps as f32)
}

pub struct Layer {
    input_norm: Matrix,
    mixer: Mixer,
    post_norm: Matrix,
    mlp: Mlp,
    /// mHC around the mixer and the MLP (GLM-5.3-Flash); `None`: the plain residual sum.
    hyper: Option<Box<[HyperWeights; 2]>>,
}

/// What a probed forward ([`Layer::forward_probed`]) shows its probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The attention's output (after `o_proj`), before it is added to the residual stream.
    Attention,
    /// The residual stream after the attention's output was added.
    AttentionResidual,
    /// The residual stream after the MLP's output was added: the layer's output.
    MlpResidual,
}

/// Looks at a tensor of a probed forward; an error stops the forward.
pub type Probe<'a> = dyn FnMut(Stage, &Tensor) -> Result<(), RuntimeError> + 'a;

/// How the MLP runs in a layer's forward: on all rows or the rows listed in `only` (split: the decoded rows), timing
/// its routed experts, counting router near-ties and tapped.
struct MlpRows<'a, 'b> {
    only: Option<&'a [usize]>,
    times: &'a ExpertTimes,
    near_ties: &'a mut usize,
    /// The token id of each row of the residual stream (for hash routing; may be empty).
    ids: &'a [u32],
    tap: &'a mut LayerTap<'b>,
}

impl StreamedLayer for Layer {
    fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let mixer = match config.attention {
            _ if config.is_kda_layer(layer) => Mixer::Kda(Box::new(KdaWeights::load(reader, config, layer)?)),
            _ if config.deepseek_v4().is_some() => {
                Mixer::Compressed(Box::new(CompressedAttention::load(reader, config, layer)?))
            }
            Attention::Mla { .. } => Mixer::Mla(Box::new(MlaWeights::load(reader, config, layer)?)),
            Attention::Gqa { .. } => Mixer::Gqa(Box::new(GqaWeights::load(reader, config, layer)?)),
        };
        let mlp = Mlp::load(reader, config, layer)?;
        let [input_norm, post_norm] = norm_weights(reader, config, layer)?;
        let hyper = match config.layer_hyper_connections(layer) {
            Some(_) => Some(Box::new([
                HyperWeights::load(reader, config, layer, "attn")?,
                HyperWeights::load(reader, config, layer, "ffn")?,
            ])),
            None => None,
        };
        Ok(Self { input_norm, mixer, post_norm, mlp, hyper })
    }

    /// The layer's resident weight matrices (routed experts excluded), for device prefetch.
    fn matrices(&self) -> Vec<&Matrix> {
        let mut all = match &self.mixer {
            Mixer::Mla(mla) => mla.matrices(),
            Mixer::Gqa(gqa) => gqa.matrices().to_vec(),
            Mixer::Kda(kda) => kda.matrices(),
            Mixer::Compressed(attention) => attention.matrices(),
        };
        all.extend(self.mlp.matrices());
        all.extend(self.hyper.iter().flat_map(|hyper| hyper.iter().map(HyperWeights::matrix)));
        all
    }
}

impl Layer {
    /// Advances the batch's residual stream through the layer, the attention's cached rows taken from `kv` and
    /// passed through `tap` (with its routed experts recorded) when one is given.
    ///
    /// With [`KvSource::Split`] (split prefill/decode through this decode layer and `prefill`, teacher-forced) the
    /// first `prompt[i]` rows of each sequence of the residual stream are replaced by `prefill_input` (the prefill
    /// node's residual stream entering this layer); the cache of those rows is computed with `prefill`'s weights,
    /// and only the remaining rows go through this layer's MLP.
    pub fn forward(
        &self,
        context: &LayerContext,
        residual: Residual,
        kv: KvSource<Layer>,
        times: &ExpertTimes,
        tap: Option<&mut LayerTap>,
    ) -> Result<(), RuntimeError> {
        self.forward_observed(context, residual, kv, times, tap, None)
    }

    /// [`Layer::forward`] of the layer's own input, showing `probe` each [`Stage`] (to find where a value first
    /// stops being finite).
    pub fn forward_probed(
        &self,
        context: &LayerContext,
        residual: Residual,
        probe: &mut Probe,
    ) -> Result<(), RuntimeError> {
        let times = ExpertTimes::default();
        self.forward_observed(context, residual, KvSource::Own, &times, None, Some(probe))
    }

    fn forward_observed(
        &self,
        context: &LayerContext,
        residual: Residual,
        kv: KvSource<Layer>,
        times: &ExpertTimes,
        tap: Option<&mut LayerTap>,
        probe: Option<&mut Probe>,
    ) -> Result<(), RuntimeError> {
        let LayerContext { backend, .. } = *context;
        let Residual { hidden, spans, state } = residual;
        let mut untapped = LayerTap::default();
        let tap = tap.unwrap_or(&mut untapped);
        let split = match kv {
            KvSource::Own => None,
            KvSource::Split { prefill, prefill_input, prompt } => {
                for ((start, _), &length) in spans.iter().zip(prompt) {
                    backend.copy_rows(hidden, prefill_input, start..start + length)?;
                }
                Some((prefill, prefill.mixer_input(context, prefill_input)?.0, prompt))
            }
        };
        let (x, mix) = self.mixer_input(context, hidden)?;
        let attended = match (&self.mixer, &split) {
            (Mixer::Mla(mla), None) => mla.forward(context, &x, spans, KvSource::Own, state, &mut tap.kv)?,
            (Mixer::Gqa(gqa), None) => gqa.forward(context, &x, spans, KvSource::Own, &mut tap.kv)?,
            (Mixer::Kda(kda), None) => kda.forward(context, &x, spans)?,
            (Mixer::Compressed(attention), None) => {
                attention.forward((context, tap.kv.v4_cache()), &x, spans, None, &mut state.near_ties)?
            }
            (
                Mixer::Compressed(attention),
                Some((Layer { mixer: Mixer::Compressed(prefill), .. }, x_prefill, prompt)),
            ) => {
                let prefill = Some((prefill.as_ref(), x_prefill, *prompt));
                attention.forward((context, tap.kv.v4_cache()), &x, spans, prefill, &mut state.near_ties)?
            }
            (Mixer::Kda(kda), Some((Layer { mixer: Mixer::Kda(prefill), .. }, x_prefill, prompt))) => {
                kda.forward_split(context, &x, spans, (prefill, x_prefill, prompt))?
            }
            (Mixer::Mla(mla), Some((Layer { mixer: Mixer::Mla(prefill), .. }, x_prefill, prompt))) => {
                let kv = KvSource::Split { prefill: prefill.as_ref(), prefill_input: x_prefill, prompt };
                mla.forward(context, &x, spans, kv, state, &mut tap.kv)?
            }
            (Mixer::Gqa(gqa), Some((Layer { mixer: Mixer::Gqa(prefill), .. }, x_prefill, prompt))) => {
                let kv = KvSource::Split { prefill: prefill.as_ref(), prefill_input: x_prefill, prompt };
                gqa.forward(context, &x, spans, kv, &mut tap.kv)?
            }
            _ => {
                return Err(RuntimeError::Input(
                    "the prefill and decode checkpoints have different attention types".into(),
                ))
            }
        };
        // Split: only the decoded rows go through the decode node's MLP.
        let decoded = split.map(|(_, _, prompt)| {
            let mut decoded = Vec::new();
            for ((start, length), &prompt_length) in spans.iter().zip(prompt) {
                decoded.extend(start + prompt_length.min(length)..start + length);
            }
            decoded
        });
        let mlp = MlpRows { only: decoded.as_deref(), times, near_ties: &mut state.near_ties, ids: &state.tokens, tap };
        self.residual(context, hidden, (&attended, mix), mlp, probe)
    }

    /// The mixer's input: the residual stream normed by the input norm (with mHC: the streams collapsed first),
    /// and with mHC the weights that put the mixer's output back ([`Layer::add_block`]).
    fn mixer_input(&self, context: &LayerContext, hidden: &Tensor) -> Result<(Tensor, Option<HyperMix>), RuntimeError> {
        let LayerContext { backend, config, .. } = *context;
        match &self.hyper {
            None => Ok((normed(backend, config, hidden, &self.input_norm)?, None)),
            Some(hyper) => {
                let (input, mix) = hyper[0].enter(backend, hidden)?;
                Ok((normed(backend, config, &input, &self.input_norm)?, Some(mix)))
            }
        }
    }

    /// The residual stream after a block's output `out`: `hidden += out`, or with mHC the streams expanded and
    /// mixed by `mix`.
    fn add_block(
        backend: &dyn Backend,
        hidden: &mut Tensor,
        out: &Tensor,
        mix: Option<HyperMix>,
    ) -> Result<(), RuntimeError> {
        match mix {
            None => backend.add(hidden, out),
            Some(mix) => hyper::exit(backend, hidden, out, &mix),
        }
    }

    /// The layer after its attention, the same for every use of the layer (sequence forward, paged prefill, decode
    /// step): `hidden += attended` (the attention's output after `o_proj`; with mHC the streams expanded and mixed
    /// by `mix`), then `hidden += mlp(norm(hidden))`, showing `probe` each [`Stage`].
    fn residual(
        &self,
        context: &LayerContext,
        hidden: &mut Tensor,
        (attended, mix): (&Tensor, Option<HyperMix>),
        mlp: MlpRows,
        mut probe: Option<&mut Probe>,
    ) -> Result<(), RuntimeError> {
        if let Some(probe) = probe.as_mut() {
            probe(Stage::Attention, attended)?;
        }
        Self::add_block(context.backend, hidden, attended, mix)?;
        if let Some(probe) = probe.as_mut() {
            probe(Stage::AttentionResidual, hidden)?;
        }
        self.mlp_residual(context, hidden, mlp)?;
        match probe {
            Some(probe) => probe(Stage::MlpResidual, hidden),
            None => Ok(()),
        }
    }

    /// `hidden += mlp(norm(hidden))` on all rows or on the rows listed in `only`; records the routed experts of
    /// each row (an empty list for rows not run or a dense layer) and shows the routed experts' inputs to the tap.
    fn mlp_residual(&self, context: &LayerContext, hidden: &mut Tensor, mlp: MlpRows) -> Result<(), RuntimeError> {
        let MlpRows { only, times, near_ties, ids, tap } = mlp;
        let LayerTap { routes, experts, .. } = tap;
        let (routes, experts) = (routes.as_deref_mut(), experts.as_mut());
        let LayerContext { backend, config, .. } = *context;
        let eps = config.rms_norm_eps as f32;
        let all_rows = hidden.rows();
        let (input, mix) = match &self.hyper {
            Some(hyper) => {
                let (input, mix) = hyper[1].enter(backend, hidden)?;
                (Some(input), Some(mix))
            }
            None => (None, None),
        };
        let input = input.as_ref().unwrap_or(hidden);
        let mut x = match only {
            None => backend.row_range(input, 0..all_rows)?,
            Some(rows) => backend.gather_rows(input, rows)?,
        };
        backend.rms_norm(&mut x, config.hidden_size, &self.post_norm, eps)?;
        let ids: Vec<u32> = match only {
            Some(rows) if !ids.is_empty() => rows.iter().map(|&row| ids[row]).collect(),
            _ => ids.to_vec(),
        };
        let mixed = match &self.mlp {
            Mlp::Dense(mlp) => {
                if let Some(routes) = routes {
                    routes.clear();
                }
                mlp.forward(backend, &x)?
            }
            Mlp::Moe(moe) => {
                if let Some(routes) = routes {
                    let (chosen, _) = moe.route(backend, config, &x, &ids)?;
                    let mut expanded = vec![Vec::new(); all_rows];
                    for (index, route) in chosen.into_iter().enumerate() {
                        let row = only.map_or(index, |rows| rows[index]);
                        expanded[row] = route.into_iter().map(|(expert, _)| expert).collect();
                    }
                    *routes = expanded;
                }
                moe.forward(context, (&x, &ids), times, near_ties, experts)?
            }
        };
        match (only, mix) {
            (None, mix) => Self::add_block(backend, hidden, &mixed, mix),
            (Some(rows), None) => backend.add_rows(hidden, rows, &mixed),
            (Some(rows), Some(mix)) => {
                // The rows not run add nothing (split: they are the prefill node's, replaced at the next layer).
                let mut all = backend.zeros(all_rows, config.hidden_size)?;
                backend.add_rows(&mut all, rows, &mixed)?;
                hyper::exit(backend, hidden, &all, &mix)
            }
        }
    }
}

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

//! One decoder layer: its resident weights (norms, token mixer, router, shared or dense MLP, mHC) loaded and
//! dequantized together, and the pre-norm residual forward `h += mix(norm(h)); h += mlp(norm(h))` (with mHC the streams
//! collapsed into each block's input and its output expanded back, [`super::hyper`]) over whole sequences
//! ([`Layer::forward`]): its mixer (MLA, GQA, KDA or DeepSeek-V4's), then the one residual and MLP every use of the
//! layer shares. Its uses with a cache (prompts prefilled, decode steps) are [`cached`].

pub mod cached;

pub use cached::{PagedInputs, PrefillCache};

use super::compressed_attention::CompressedAttention;
use super::context::{LayerContext, Residual};
use super::gqa::GqaWeights;
use super::hyper::{self, HyperMix, HyperWeights};
use super::kda::KdaWeights;
use super::mla::MlaWeights;
use super::moe::{DenseMlp, ExpertTimes, MoeWeights};
use super::tap::{KvSource, LayerTap};
use crate::load::layer_stream::StreamedLayer;
use crate::load::weights::WeightReader;
use crate::model::config::Attention;
use crate::model::ModelConfig;
use crate::runtime::backend::Backend;
use crate::runtime::matrix::Matrix;
use crate::runtime::tensor::Tensor;
use crate::runtime::RuntimeError;

/// A layer's token mixer: softmax attention (MLA, GQA, DeepSeek-V4's compressed attention) or KDA linear attention.
enum Mixer {
    Mla(Box<MlaWeights>),
    Gqa(Box<GqaWeights>),
    Kda(Box<KdaWeights>),
    Compressed(Box<CompressedAttention>),
}

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

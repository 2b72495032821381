//! One decoder layer: its resident weights (norms, attention, router, shared or dense MLP) loaded and dequantized
//! together, and the pre-norm residual forward `h += attn(norm(h)); h += mlp(norm(h))`.

use super::backend::{Backend, Matrix};
use super::gqa::GqaWeights;
use super::indexer::Selection;
use super::mla::MlaWeights;
use super::moe::{DenseMlp, ExpertTimes, MoeWeights};
use super::rope_table::RopeTable;
use super::weights::WeightReader;
use super::{RuntimeError, Spans};
use crate::format::kv_scales::LayerKvScales;
use crate::model::config::Attention;
use crate::model::ModelConfig;
use crate::quant::fp8;

enum AttentionWeights {
    Mla(MlaWeights),
    Gqa(GqaWeights),
}

enum Mlp {
    Dense(DenseMlp),
    Moe(MoeWeights),
}

pub struct Layer {
    input_norm: Vec<f32>,
    attention: AttentionWeights,
    post_norm: Vec<f32>,
    mlp: Mlp,
}

/// What a layer's forward needs besides its weights.
pub struct LayerContext<'a> {
    pub backend: &'a dyn Backend,
    pub reader: &'a WeightReader<'a>,
    pub config: &'a ModelConfig,
    pub table: &'a RopeTable,
    pub mla_scale: f32,
}

impl Layer {
    /// The layer's resident weight matrices (routed experts excluded), for device prefetch.
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all = match &self.attention {
            AttentionWeights::Mla(mla) => mla.matrices(),
            AttentionWeights::Gqa(gqa) => gqa.matrices().to_vec(),
        };
        match &self.mlp {
            Mlp::Dense(mlp) => all.extend(mlp.matrices()),
            Mlp::Moe(moe) => all.extend(moe.matrices()),
        }
        all
    }

    pub fn load(reader: &WeightReader, config: &ModelConfig, layer: usize) -> Result<Self, RuntimeError> {
        let prefix = format!("model.layers.{layer}");
        let hidden = config.hidden_size;
        let attention = match config.attention {
            Attention::Mla { .. } => {
                let with_indexer =
                    config.indexer.as_ref().is_some_and(|i| i.full_layers.get(layer).copied().unwrap_or(true));
                AttentionWeights::Mla(MlaWeights::load(reader, config, &prefix, with_indexer)?)
            }
            Attention::Gqa { .. } => AttentionWeights::Gqa(GqaWeights::load(reader, config, &prefix)?),
        };
        let mlp = if config.runs_moe(layer) {
            Mlp::Moe(MoeWeights::load(reader, config, &prefix)?)
        } else {
            Mlp::Dense(DenseMlp::load(reader, &format!("{prefix}.mlp"), hidden, config.intermediate_size)?)
        };
        Ok(Self {
            input_norm: reader.vector(&format!("{prefix}.input_layernorm.weight"), hidden)?,
            attention,
            post_norm: reader.vector(&format!("{prefix}.post_attention_layernorm.weight"), hidden)?,
            mlp,
        })
    }

    /// Advances `hidden` (`[tokens, hidden]`) through the layer.
    pub fn forward(
        &self,
        context: &LayerContext,
        hidden: &mut [f32],
        spans: &Spans,
        selection: &mut Option<Selection>,
        times: &ExpertTimes,
        near_ties: &mut usize,
    ) -> Result<(), RuntimeError> {
        self.forward_tapped(context, hidden, spans, selection, times, near_ties, &mut LayerTap::default())
    }

    /// [`Self::forward`] with a tap: the cached KV observed and/or fake-quantized, the routed experts recorded.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_tapped(
        &self,
        context: &LayerContext,
        hidden: &mut [f32],
        spans: &Spans,
        selection: &mut Option<Selection>,
        times: &ExpertTimes,
        near_ties: &mut usize,
        tap: &mut LayerTap,
    ) -> Result<(), RuntimeError> {
        let LayerContext { backend, config, table, mla_scale, .. } = *context;
        let width = config.hidden_size;
        let eps = config.rms_norm_eps as f32;
        let mut x = hidden.to_vec();
        backend.rms_norm(&mut x, width, &self.input_norm, eps);
        let attended = match &self.attention {
            AttentionWeights::Mla(mla) => {
                mla.forward_tapped(backend, config, &x, spans, table, mla_scale, selection, near_ties, &mut tap.kv)?
            }
            AttentionWeights::Gqa(gqa) => gqa.forward_tapped(backend, config, &x, spans, table, &mut tap.kv)?,
        };
        hidden.iter_mut().zip(&attended).for_each(|(h, a)| *h += a);
        self.mlp_residual(context, hidden, None, times, near_ties, tap.routes.as_deref_mut())
    }

    /// Split prefill/decode through this (decode) layer and `prefill`, teacher-forced: for each sequence the first
    /// `prompt[i]` rows of `hidden` are replaced by `prefill_hidden` (the prefill node's residual stream entering
    /// this layer); the cache of those rows is computed with `prefill`'s weights, every cached row is fake-quantized
    /// with `tap.kv` (the FP8 handoff and the decode cache), and the remaining rows advance on this layer's weights.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_split(
        &self,
        prefill: &Layer,
        context: &LayerContext,
        prefill_hidden: &[f32],
        hidden: &mut [f32],
        spans: &Spans,
        prompt: &[usize],
        selection: &mut Option<Selection>,
        times: &ExpertTimes,
        near_ties: &mut usize,
        tap: &mut LayerTap,
    ) -> Result<(), RuntimeError> {
        let LayerContext { backend, config, table, mla_scale, .. } = *context;
        let width = config.hidden_size;
        let eps = config.rms_norm_eps as f32;
        for ((start, _), &length) in spans.iter().zip(prompt) {
            hidden[start * width..(start + length) * width]
                .copy_from_slice(&prefill_hidden[start * width..(start + length) * width]);
        }
        let mut x_prefill = prefill_hidden.to_vec();
        backend.rms_norm(&mut x_prefill, width, &prefill.input_norm, eps);
        let mut x = hidden.to_vec();
        backend.rms_norm(&mut x, width, &self.input_norm, eps);
        let attended = match (&self.attention, &prefill.attention) {
            (AttentionWeights::Mla(mla), AttentionWeights::Mla(prefill_mla)) => mla.forward_split(
                prefill_mla,
                backend,
                config,
                &x_prefill,
                &x,
                spans,
                prompt,
                table,
                mla_scale,
                selection,
                near_ties,
                &mut tap.kv,
            )?,
            (AttentionWeights::Gqa(gqa), AttentionWeights::Gqa(prefill_gqa)) => {
                gqa.forward_split(prefill_gqa, backend, config, &x_prefill, &x, spans, prompt, table, &mut tap.kv)?
            }
            _ => {
                return Err(RuntimeError::Input(
                    "the prefill and decode checkpoints have different attention types".into(),
                ))
            }
        };
        hidden.iter_mut().zip(&attended).for_each(|(h, a)| *h += a);
        // Only the decoded rows go through the decode node's MLP.
        let mut decoded = Vec::new();
        for ((start, length), &prompt_length) in spans.iter().zip(prompt) {
            decoded.extend(start + prompt_length.min(length)..start + length);
        }
        self.mlp_residual(context, hidden, Some(&decoded), times, near_ties, tap.routes.as_deref_mut())
    }

    /// `hidden += mlp(norm(hidden))` on all rows or on the rows listed in `only`; records the routed experts of
    /// each row (an empty list for rows not run or a dense layer).
    fn mlp_residual(
        &self,
        context: &LayerContext,
        hidden: &mut [f32],
        only: Option<&[usize]>,
        times: &ExpertTimes,
        near_ties: &mut usize,
        routes: Option<&mut Vec<Vec<usize>>>,
    ) -> Result<(), RuntimeError> {
        let LayerContext { backend, reader, config, .. } = *context;
        let width = config.hidden_size;
        let eps = config.rms_norm_eps as f32;
        let all_rows = hidden.len() / width;
        let mut x = match only {
            None => hidden.to_vec(),
            Some(rows) => rows.iter().flat_map(|&r| hidden[r * width..(r + 1) * width].iter().copied()).collect(),
        };
        let tokens = x.len() / width;
        backend.rms_norm(&mut x, width, &self.post_norm, eps);
        let mixed = match &self.mlp {
            Mlp::Dense(mlp) => {
                if let Some(routes) = routes {
                    routes.clear();
                }
                mlp.forward(backend, &x, tokens)
            }
            Mlp::Moe(moe) => {
                if let Some(routes) = routes {
                    let (chosen, _) = moe.route(backend, config, &x, tokens);
                    let mut expanded = vec![Vec::new(); all_rows];
                    for (index, route) in chosen.into_iter().enumerate() {
                        let row = only.map_or(index, |rows| rows[index]);
                        expanded[row] = route.into_iter().map(|(expert, _)| expert).collect();
                    }
                    *routes = expanded;
                }
                moe.forward(backend, reader, config, &x, tokens, times, near_ties)?
            }
        };
        for (index, m) in mixed.chunks(width).enumerate() {
            let row = only.map_or(index, |rows| rows[index]);
            hidden[row * width..(row + 1) * width].iter_mut().zip(m).for_each(|(h, v)| *h += v);
        }
        Ok(())
    }
}

/// The values an attention layer caches per token, as the engines store them.
pub enum CachedKv<'a> {
    /// MLA: `[tokens, width]` rows of the normed latent `kv_c_normed` and the post-RoPE `k_pe`, one scale.
    Mla { rows: &'a mut [f32], width: usize },
    /// GQA: post-RoPE K and V, `[tokens, heads, head_dim]` each.
    Gqa { k: &'a mut [f32], v: &'a mut [f32], heads: usize, head_dim: usize },
}

/// Receives the cached values of one layer before any fake quantization.
pub type KvObserver<'a> = dyn FnMut(&CachedKv) + 'a;

/// How a tap stores the cached values as FP8.
#[derive(Debug, Clone, Copy)]
pub enum KvFp8<'a> {
    /// Static per-tensor or per-head scales (the checkpoint's, or 1.0): `x ← decode(encode(x / s)) · s`.
    Static(&'a LayerKvScales),
    /// MLA rows with a dynamic scale per `tile` elements of the first `latent` elements of each row, computed from
    /// that tile (`max(amax / 448, f32::MIN_POSITIVE)`); the rest of the row (RoPE) is left as it is (the
    /// runtime's 16-bit cache is f32). vLLM's `fp8_ds_mla` and SGLang's DSA cache.
    DynamicTiles { tile: usize, latent: usize },
}

/// A tap on an attention layer's cache: an observer (calibration), then FP8 fake quantization (the engines'
/// store/read).
#[derive(Default)]
pub struct KvTap<'a> {
    pub observer: Option<&'a mut KvObserver<'a>>,
    pub fp8: Option<KvFp8<'a>>,
}

impl KvTap<'_> {
    pub fn apply(&mut self, mut cached: CachedKv) {
        if let Some(observer) = self.observer.as_mut() {
            observer(&cached);
        }
        let Some(fp8) = self.fp8 else { return };
        match (&mut cached, fp8) {
            (CachedKv::Mla { rows, .. }, KvFp8::Static(scales)) => fake_fp8(rows, scales.k_for(0)),
            (CachedKv::Mla { rows, width }, KvFp8::DynamicTiles { tile, latent }) => {
                for row in rows.chunks_mut(*width) {
                    for values in row[..latent.min(*width)].chunks_mut(tile.max(1)) {
                        let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        fake_fp8(values, (amax / fp8::E4M3_MAX).max(f32::MIN_POSITIVE));
                    }
                }
            }
            (CachedKv::Gqa { k, v, heads, head_dim }, KvFp8::Static(scales)) => {
                for (index, chunk) in k.chunks_mut(*head_dim).enumerate() {
                    fake_fp8(chunk, scales.k_for(index % *heads));
                }
                for (index, chunk) in v.chunks_mut(*head_dim).enumerate() {
                    fake_fp8(chunk, scales.v_for(index % *heads));
                }
            }
            // No engine stores a GQA cache with dynamic tiles; callers resolve the mode from the cache layout.
            (CachedKv::Gqa { .. }, KvFp8::DynamicTiles { .. }) => {
                debug_assert!(false, "dynamic-tile FP8 applies to MLA rows only")
            }
        }
    }
}

/// Stores `values` as FP8 e4m3 with `scale` and reads them back.
pub fn fake_fp8(values: &mut [f32], scale: f32) {
    for value in values {
        *value = fp8::decode(fp8::encode(*value / scale)) * scale;
    }
}

/// Everything a layer's forward can be tapped for.
#[derive(Default)]
pub struct LayerTap<'a> {
    pub kv: KvTap<'a>,
    /// Filled with each row's routed experts (empty for a dense layer's rows).
    pub routes: Option<&'a mut Vec<Vec<usize>>>,
}

//! What a caller plugs into one decoder layer's forward besides its input: where the attention's cached rows come
//! from ([`KvSource`]), and taps that observe them (calibration), store them as FP8 (the engines' store/read),
//! record the routed experts, observe each routed expert's inputs and replace its weights (calibration).

use super::v4_kv_fp8::V4Cache;
use crate::format::kv_scales::LayerKvScales;
use crate::quant::fp8;
use crate::runtime::matrix::Matrix;
use crate::runtime::{Backend, RuntimeError, Tensor};

/// Where an attention layer's cached rows come from.
pub enum KvSource<'a, W> {
    /// From the layer's own input: every token attends over rows this layer computed from it.
    Own,
    /// Split prefill/decode, teacher-forced: the rows of each sequence's first `prompt[i]` tokens come from
    /// `prefill` (the prefill node's weights) applied to `prefill_input`, the rest from the layer's own input.
    Split { prefill: &'a W, prefill_input: &'a Tensor, prompt: &'a [usize] },
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
    /// DeepSeek-V4's caches as vLLM stores them (`fp8_ds_mla` rows and FP8 indexer keys, scales computed per
    /// row: [`super::v4_kv_fp8`]); its compressed attention applies them, not [`KvTap::apply`].
    DeepseekV4,
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
            (_, KvFp8::DeepseekV4) => debug_assert!(false, "DeepSeek-V4's layers store their own caches"),
        }
    }
}

/// Stores `values` as FP8 e4m3 with `scale` and reads them back.
impl KvTap<'_> {
    /// How a DeepSeek-V4 layer stores its caches under this tap.
    pub fn v4_cache(&self) -> V4Cache {
        match self.fp8 {
            Some(KvFp8::DeepseekV4) => V4Cache::Fp8,
            _ => V4Cache::Exact,
        }
    }

    /// Whether the tap looks at or changes the cached rows (the rows then visit the host).
    pub fn active(&self) -> bool {
        self.observer.is_some() || self.fp8.is_some()
    }

    /// [`KvTap::apply`] to MLA rows `[tokens, width]` held by `backend`: downloaded when the tap is active, uploaded
    /// back when it stores them as FP8.
    pub fn apply_mla(&mut self, backend: &dyn Backend, rows: &mut Tensor, width: usize) -> Result<(), RuntimeError> {
        if !self.active() {
            return Ok(());
        }
        let mut host = backend.download(rows)?;
        self.apply(CachedKv::Mla { rows: &mut host, width });
        if self.fp8.is_some() {
            *rows = backend.upload(&host, rows.columns())?;
        }
        Ok(())
    }

    /// [`KvTap::apply`] to GQA keys and values held by `backend` (see [`KvTap::apply_mla`]).
    pub fn apply_gqa(
        &mut self,
        backend: &dyn Backend,
        (k, v): (&mut Tensor, &mut Tensor),
        heads: usize,
        head_dim: usize,
    ) -> Result<(), RuntimeError> {
        if !self.active() {
            return Ok(());
        }
        let (mut k_host, mut v_host) = (backend.download(k)?, backend.download(v)?);
        self.apply(CachedKv::Gqa { k: &mut k_host, v: &mut v_host, heads, head_dim });
        if self.fp8.is_some() {
            *k = backend.upload(&k_host, k.columns())?;
            *v = backend.upload(&v_host, v.columns())?;
        }
        Ok(())
    }
}

pub fn fake_fp8(values: &mut [f32], scale: f32) {
    for value in values {
        *value = fp8::decode(fp8::encode(*value / scale)) * scale;
    }
}

/// What one routed expert of a MoE layer saw in one forward: the hidden states of the tokens routed to it (the
/// input of `gate_proj` and `up_proj`) and its intermediate activations `act(gate) · up` (the input of
/// `down_proj`), row-major, one row per token in ascending token order.
pub struct ExpertActivations<'a> {
    pub expert: usize,
    pub tokens: usize,
    /// `[tokens, hidden]`.
    pub input: &'a [f32],
    /// `[tokens, moe_intermediate]`.
    pub intermediate: &'a [f32],
}

/// Receives each routed expert's activations (experts that received no token are not reported).
pub type ExpertObserver<'a> = dyn FnMut(&ExpertActivations) + 'a;

/// Routed expert `expert`'s `[gate, up, down]` weights to use instead of the checkpoint's (`None`: the
/// checkpoint's), e.g. its already-quantized form during sequential GPTQ calibration.
pub type ExpertReplacement<'a> = dyn Fn(usize) -> Result<Option<[Matrix; 3]>, RuntimeError> + Sync + 'a;

/// A tap on a MoE layer's routed experts. Observing computes the activations a second time beside the forward
/// (the forward's own numbers are untouched).
#[derive(Default)]
pub struct ExpertTap<'a> {
    pub observer: Option<&'a mut ExpertObserver<'a>>,
    /// Statistics only: every token of the layer is shown to every expert (the forward still routes as the
    /// router says), so that no expert is left without calibration inputs.
    pub route_all: bool,
    /// Filled with the MoE block's normed input `[tokens, hidden]` (what every routed expert reads).
    pub input: Option<&'a mut Vec<f32>>,
    /// Weights the forward uses for routed experts instead of the checkpoint's.
    pub replacement: Option<&'a ExpertReplacement<'a>>,
}

/// Everything a layer's forward can be tapped for.
#[derive(Default)]
pub struct LayerTap<'a> {
    pub kv: KvTap<'a>,
    /// Filled with each row's routed experts (empty for a dense layer's rows).
    pub routes: Option<&'a mut Vec<Vec<usize>>>,
    /// Observes each routed expert's inputs (MoE layers only).
    pub experts: Option<ExpertTap<'a>>,
}

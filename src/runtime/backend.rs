//! The op surface every backend implements: the arithmetic of one decoder layer on host buffers.
//!
//! Layouts (row-major, f32): activations `[tokens, width]`; a linear weight `[out_features, in_features]` as
//! PyTorch stores it (`y = x·Wᵀ + b`); attention inputs per sequence `[tokens, heads, head_dim]`.

use std::sync::atomic::{AtomicU64, Ordering};

/// A dequantized weight matrix `[rows, columns]` (f32, row-major), with its packed INT4 form when it was read from a
/// compressed-tensors INT4 checkpoint (the CUDA backend multiplies by that directly, W4A16).
#[derive(Debug, Clone)]
pub struct Matrix {
    pub rows: usize,
    pub columns: usize,
    pub data: Vec<f32>,
    pub int4: Option<Box<Int4Weight>>,
    /// Unique per loaded matrix: the key of device-resident copies.
    pub id: u64,
}

/// compressed-tensors `pack-quantized` INT4: `weight_packed` words `[rows, ceil(columns / 8)]` (nibble `j % 8` of
/// word `j / 8` holds `q + 8`) and BF16 `weight_scale` bits `[rows, ceil(columns / group_size)]`; `w = q · scale`.
#[derive(Debug, Clone)]
pub struct Int4Weight {
    pub packed: Vec<u32>,
    pub scales: Vec<u16>,
    pub group_size: usize,
}

impl Int4Weight {
    /// `weights` `[rows, columns]` through squeeze's INT4 quantizer (ct-minmax): the packed form and the dequantized
    /// values it stands for (what the CPU multiplies by). For tests and the self-test.
    pub fn quantize(weights: &[f32], columns: usize, group_size: usize) -> (Self, Vec<f32>) {
        use crate::quant::{int4, pack, ScaleRule};
        let (mut packed, mut scales, mut values) = (Vec::new(), Vec::new(), vec![0f32; weights.len()]);
        let mut q = vec![0i8; columns];
        let mut row_scales = vec![half::bf16::ZERO; columns.div_ceil(group_size)];
        let mut words = vec![0u32; pack::packed_columns(columns)];
        for (row, out) in weights.chunks(columns).zip(values.chunks_mut(columns)) {
            int4::quantize_row(row, group_size, ScaleRule::CtMinmax, &mut q, &mut row_scales);
            int4::dequantize_row(&q, &row_scales, group_size, out);
            pack::pack_row(&q, &mut words);
            packed.extend_from_slice(&words);
            scales.extend(row_scales.iter().map(|s| s.to_bits()));
        }
        (Self { packed, scales, group_size }, values)
    }
}

static NEXT_MATRIX_ID: AtomicU64 = AtomicU64::new(1);

impl Matrix {
    /// A matrix with a fresh id.
    pub fn new(rows: usize, columns: usize, data: Vec<f32>) -> Self {
        Self { rows, columns, data, int4: None, id: NEXT_MATRIX_ID.fetch_add(1, Ordering::Relaxed) }
    }

    /// The same matrix carrying its packed INT4 form.
    pub fn with_int4(mut self, int4: Int4Weight) -> Self {
        self.int4 = Some(Box::new(int4));
        self
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4 + self.int4.as_ref().map_or(0, |w| w.packed.len() * 4 + w.scales.len() * 2)
    }
}

/// Rotation style of RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// DeepSeek interleaved pairs `(x0,x1),(x2,x3),…`; output laid out as transformers'
    /// `apply_rotary_pos_emb_interleave` does (rotated evens, then rotated odds).
    Interleaved,
    /// Llama/GLM rotate-half: pairs `(x_i, x_{i+d/2})`.
    Half,
}

/// One causal attention problem for one sequence.
pub struct AttentionShape {
    pub tokens: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub qk_dim: usize,
    pub v_dim: usize,
    pub scale: f32,
}

/// One MoE routing problem (sigmoid scores, group-limited top-k): the settings of [`crate::model::config::Routing`]
/// resolved for a layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutingShape {
    pub experts: usize,
    /// Experts chosen per token (`num_experts_per_tok`), at most `experts`.
    pub top_k: usize,
    /// Expert groups (`n_group`, at most `experts`, at least 1); group `g` holds experts `g·per_group..` with
    /// `per_group = experts / groups`.
    pub groups: usize,
    /// Groups kept per token (`topk_group`); grouping applies when `1 < groups` and `topk_group < groups`.
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
}

/// The experts chosen per token, in rank order.
#[derive(Debug, Clone, PartialEq)]
pub struct Routes {
    pub top_k: usize,
    /// `[tokens, top_k]` expert indices.
    pub experts: Vec<usize>,
    /// `[tokens, top_k]` gate weights (normalized when asked, times `routed_scaling_factor`).
    pub weights: Vec<f32>,
    /// Tokens whose top-k boundary margin is within [`ROUTING_NEAR_TIE_RELATIVE`].
    pub near_ties: usize,
}

/// Relative score margin at the expert top-k boundary under which another f32 implementation may pick differently.
pub const ROUTING_NEAR_TIE_RELATIVE: f32 = 1e-5;

/// One DSA indexer top-k problem for one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerShape {
    pub tokens: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Keys kept per query (`index_topk`).
    pub top_k: usize,
}

/// The keys each query of a sequence may attend to.
#[derive(Debug, Clone, PartialEq)]
pub struct KeySelection {
    /// `[tokens, tokens]`, only causal keys set.
    pub mask: Vec<bool>,
    /// Queries whose top-k boundary margin is within [`INDEXER_NEAR_TIE_RELATIVE`].
    pub near_ties: usize,
}

/// Relative score margin at the DSA indexer's top-k boundary under which another f32 implementation may pick
/// differently.
pub const INDEXER_NEAR_TIE_RELATIVE: f32 = 1e-5;

/// Weight bytes a device backend uploaded and the seconds the uploads took (summed over threads).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Uploads {
    pub bytes: u64,
    pub seconds: f64,
}

/// Moves weights to where a backend computes, ahead of their use, from another thread.
pub trait Prefetch: Send + Sync {
    fn prefetch(&self, matrices: &[&Matrix]);
}

/// The operations a decoder layer needs. The CPU backend is the reference (and the oracle for other backends).
pub trait Backend: Sync {
    fn name(&self) -> &'static str;
    /// The first error a device backend hit since it was created (its ops return NaNs after one); the runtime checks
    /// after each layer. The CPU backend never fails.
    fn failure(&self) -> Option<String> {
        None
    }
    /// A handle the layer loader thread uploads the next layer's weights through while this layer computes (device
    /// backends); `None` where weights need no upload (the CPU).
    fn prefetcher(&self) -> Option<std::sync::Arc<dyn Prefetch>> {
        None
    }
    /// Weight uploads so far (device backends).
    fn uploads(&self) -> Option<Uploads> {
        None
    }
    /// Host↔device copies and kernel launches so far (device backends).
    fn device_counters(&self) -> Option<crate::runtime::device::DeviceCounters> {
        None
    }
    /// The backend and its device in words, for reports.
    fn describe(&self) -> String {
        self.name().to_string()
    }
    /// `y[rows, out] = x[rows, in]·Wᵀ (+ bias)`.
    fn linear(&self, input: &[f32], rows: usize, weight: &Matrix, bias: Option<&[f32]>) -> Vec<f32>;
    /// RMSNorm over each `width`-row in place: `w · x / sqrt(mean(x²) + eps)`.
    fn rms_norm(&self, data: &mut [f32], width: usize, weight: &[f32], eps: f32);
    /// LayerNorm over each `width`-row in place: `w · (x − μ) / sqrt(var + eps) + b`.
    fn layer_norm(&self, data: &mut [f32], width: usize, weight: &[f32], bias: &[f32], eps: f32);
    /// `silu(gate) · up`, elementwise.
    fn silu_mul(&self, gate: &[f32], up: &[f32]) -> Vec<f32>;
    /// Rotates `rotary_dim` values starting at `offset` of every `head_dim`-slice of each token row
    /// (`data` is `[tokens, row_width]`); `cos`/`sin` are `[positions, rotary_dim/2]`, token `t` at position `t`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        data: &mut [f32],
        tokens: usize,
        row_width: usize,
        head_dim: usize,
        offset: usize,
        rotary_dim: usize,
        cos: &[f32],
        sin: &[f32],
        style: RopeStyle,
    );
    /// Causal softmax attention for one sequence. `q` `[tokens, heads, qk_dim]`, `k` `[tokens, kv_heads, qk_dim]`,
    /// `v` `[tokens, kv_heads, v_dim]` → `[tokens, heads, v_dim]`. `allowed`, when given, is a `[tokens, tokens]`
    /// mask of the keys each query may attend to in addition to causality (DSA top-k selection).
    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], shape: &AttentionShape, allowed: Option<&[bool]>) -> Vec<f32>;
    /// MoE routing from router logits `[tokens, experts]` (before the sigmoid): `σ(logit) + correction_bias` picks the
    /// groups and experts (ties to the lower index), `σ(logit)` of the chosen experts are the weights.
    fn route(&self, logits: &[f32], tokens: usize, correction_bias: &[f32], shape: &RoutingShape) -> Routes;
    /// DSA indexer selection for one sequence: `q` `[tokens, heads, head_dim]`, `k` `[tokens, head_dim]`,
    /// `head_weights` `[tokens, heads]`; score of key `s` for query `t` is
    /// `Σ_h w[t,h]·heads^-½ · ReLU(q[t,h]·k[s]·head_dim^-½)`, and each query keeps its `top_k` best causal keys
    /// (ties to the lower key; all of them while `t < top_k`).
    fn indexer_top_k(&self, q: &[f32], k: &[f32], head_weights: &[f32], shape: &IndexerShape) -> KeySelection;
    /// Writes cached rows of `layer` into `pool` (encoded in its dtype), and into the backend's resident copy of the
    /// pool's pages where it keeps one.
    fn kv_write(&self, pool: &mut KvPool, layer: usize, rows: &[KvRow<'_>]) -> Result<(), PoolError>;
    /// One layer of a decode step over the paged cache: writes each request's new row at its position, verifies its
    /// mappings ([`KvPool::verify`]; when `step.verify`, or always where the check is fused into the attention) and
    /// attends its query over positions `0..=position` (only the `selection` keys when given). A request whose
    /// mappings fail is neither written through a bad mapping nor attended: its output is NaN and its fault given.
    fn paged_decode(&self, pool: &mut KvPool, step: &PagedStep<'_>) -> PagedDecode;
    /// Applies a batch of routed MoE experts to their tokens and adds the results to `output`: `x` and `output` are
    /// `[tokens, hidden]`; for each expert in slice order and each of its `(token, weight)` pairs in list order,
    /// `output[token] += weight · down(silu(gate · x[token]) ⊙ (up · x[token]))` (the product rounded, then added),
    /// so each token sums its experts in slice order whatever the backend computes in between.
    fn routed_experts(&self, x: &[f32], hidden: usize, experts: &[RoutedExpert<'_>], output: &mut [f32]);
}

/// One routed expert of a batch: its SwiGLU weights (`gate`, `up` `[inner, hidden]`, `down` `[hidden, inner]`) and
/// the `(token, routing weight)` pairs routed to it.
#[derive(Debug, Clone, Copy)]
pub struct RoutedExpert<'a> {
    pub gate: &'a Matrix,
    pub up: &'a Matrix,
    pub down: &'a Matrix,
    pub tokens: &'a [(usize, f32)],
}

use super::kv_cache::{KvPool, PoolError, RequestId};

/// Where each query head of a paged decode finds its key and value in a cached row: key head `g` at `g · k_stride`
/// (`qk_dim` wide), its value at `v_base + g · v_stride` (`v_dim` wide); query head `h` reads key head
/// `h / (heads / kv_heads)`; `score = scale · q · key`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PagedLayout {
    pub heads: usize,
    pub kv_heads: usize,
    pub qk_dim: usize,
    pub v_dim: usize,
    pub k_stride: usize,
    pub v_base: usize,
    pub v_stride: usize,
    pub scale: f32,
}

impl PagedLayout {
    /// GQA rows `[K kv_heads·head_dim | V kv_heads·head_dim]`.
    pub fn gqa(heads: usize, kv_heads: usize, head_dim: usize, scale: f32) -> Self {
        Self {
            heads,
            kv_heads,
            qk_dim: head_dim,
            v_dim: head_dim,
            k_stride: head_dim,
            v_base: kv_heads * head_dim,
            v_stride: head_dim,
            scale,
        }
    }

    /// MLA in the absorbed form: rows `[latent kv_lora | k_pe rope]`; each query head is `kv_lora + rope` wide
    /// (q_nope through kv_b's K part, then q_pe) and its output `kv_lora` wide (kv_b's V part and o_proj follow).
    pub fn mla_absorbed(heads: usize, kv_lora: usize, rope: usize, scale: f32) -> Self {
        Self { heads, kv_heads: 1, qk_dim: kv_lora + rope, v_dim: kv_lora, k_stride: 0, v_base: 0, v_stride: 0, scale }
    }
}

/// One cached row: `request`'s `position` (`row` `[row_width]`, `aux` `[aux_width]`, f32).
#[derive(Debug, Clone, Copy)]
pub struct KvRow<'a> {
    pub request: RequestId,
    pub position: usize,
    pub row: &'a [f32],
    pub aux: &'a [f32],
}

/// One request of a paged decode step: its new row (written at `row.position`, then attended with positions before
/// it) and, on DSA layers, the keys it may attend to (`[position + 1]`).
#[derive(Debug, Clone, Copy)]
pub struct PagedRequest<'a> {
    pub row: KvRow<'a>,
    pub selection: Option<&'a [bool]>,
}

/// One layer of a decode step: queries `q` `[requests, heads, qk_dim]` laid out as `layout`.
#[derive(Debug, Clone, Copy)]
pub struct PagedStep<'a> {
    pub layer: usize,
    pub layout: PagedLayout,
    /// Verify every mapping of each request (the step's first layer); counted in the pool's counters.
    pub verify: bool,
    pub q: &'a [f32],
    pub requests: &'a [PagedRequest<'a>],
}

/// A paged decode's result.
#[derive(Debug)]
pub struct PagedDecode {
    /// `[requests, heads, v_dim]`; NaN rows for faulted requests.
    pub out: Vec<f32>,
    /// Per request, why its mappings cannot be trusted.
    pub faults: Vec<Option<PoolError>>,
    /// Host time spent verifying (0 where the check runs inside the attention kernel).
    pub verify_seconds: f64,
}

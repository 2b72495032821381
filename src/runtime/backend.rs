//! The op surface every backend implements ([`Backend`]): the arithmetic of one decoder layer on tensors the backend
//! owns (host memory or a device buffer), and the shapes of the problems its ops take.
//!
//! Layouts (row-major, f32): activations `[tokens, width]`; a linear weight `[out_features, in_features]` as
//! PyTorch stores it (`y = x·Wᵀ + b`); attention inputs per sequence `[tokens, heads, head_dim]`.

use std::ops::Range;

use super::error::RuntimeError;
use super::kda::{KdaInputs, KdaMode, KdaParams, KdaShape, KdaState};
use super::kv_cache::{KvPool, KvRows, PagedDecode, PagedStep};
use super::matrix::Matrix;
use super::rope_table::RopeTable;
use super::tensor::{Block, Tensor};

/// Rotation style of RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// DeepSeek interleaved pairs `(x0,x1),(x2,x3),…`; output laid out as transformers'
    /// `apply_rotary_pos_emb_interleave` does (rotated evens, then rotated odds).
    Interleaved,
    /// Llama/GLM rotate-half: pairs `(x_i, x_{i+d/2})`.
    Half,
}

/// One RoPE problem: rotates `rotary_dim` values starting at `offset` of every `head_dim`-slice of the rows `rows`
/// of a tensor; row `rows.start + t` is at position `first_position + t` of `table`.
#[derive(Debug, Clone)]
pub struct RopeCall<'a> {
    pub rows: Range<usize>,
    pub first_position: usize,
    pub head_dim: usize,
    pub offset: usize,
    pub rotary_dim: usize,
    pub table: &'a RopeTable,
    pub style: RopeStyle,
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

/// One MoE routing problem (sigmoid scores, group-limited top-k): the config's routing settings resolved for a
/// layer.
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

/// The operations a decoder layer needs, on tensors the backend owns ([`Tensor`]). The CPU backend is the reference
/// (and the oracle for other backends). Values cross between host and backend only through [`Backend::upload`]
/// and [`Backend::download`]; decisions the host takes (routes, DSA key masks) come back from the ops that make
/// them. A device error is an `Err` of the op that hit it.
pub trait Backend: Sync {
    fn name(&self) -> &'static str;
    /// A handle the layer loader thread readies the next layer's weights through while this layer computes (a device
    /// uploads them, the CPU makes their f32 values); `None`: nothing to ready.
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
    /// The device the backend runs on (device backends), for work beside its ops (GPTQ's algebra).
    fn device(&self) -> Option<&dyn crate::runtime::device::Device> {
        None
    }
    /// The backend and its device in words, for reports.
    fn describe(&self) -> String {
        self.name().to_string()
    }
    /// A tensor `[values.len() / columns, columns]` holding `values`.
    fn upload(&self, values: &[f32], columns: usize) -> Result<Tensor, RuntimeError>;
    /// A tensor's values.
    fn download(&self, tensor: &Tensor) -> Result<Vec<f32>, RuntimeError>;
    /// A `[rows, columns]` tensor of zeros.
    fn zeros(&self, rows: usize, columns: usize) -> Result<Tensor, RuntimeError>;
    /// A `[rows, columns]` tensor the caller overwrites whole (contents unspecified; no fill on a device).
    fn empty(&self, rows: usize, columns: usize) -> Result<Tensor, RuntimeError> {
        self.zeros(rows, columns)
    }
    /// Copies the `[outer, inner, width]` block `at` of `from` into the block `to` of `into`.
    fn copy(
        &self,
        into: &mut Tensor,
        to: Block,
        from: &Tensor,
        at: Block,
        shape: [usize; 3],
    ) -> Result<(), RuntimeError>;
    /// `into += from`, elementwise.
    fn add(&self, into: &mut Tensor, from: &Tensor) -> Result<(), RuntimeError>;
    /// The rows `rows` of `x`, in that order.
    fn gather_rows(&self, x: &Tensor, rows: &[usize]) -> Result<Tensor, RuntimeError>;
    /// `into[targets[r]] += from[r]` for each row `r` of `from`, in row order.
    fn add_rows(&self, into: &mut Tensor, targets: &[usize], from: &Tensor) -> Result<(), RuntimeError>;
    /// `y[rows, out] = x[rows, in]·Wᵀ (+ bias)`; `bias` is one row of `out` values.
    fn linear(&self, x: &Tensor, weight: &Matrix, bias: Option<&Matrix>) -> Result<Tensor, RuntimeError>;
    /// RMSNorm over each `width`-wide slice of each row in place: `w · x / sqrt(mean(x²) + eps)`.
    fn rms_norm(&self, x: &mut Tensor, width: usize, weight: &Matrix, eps: f32) -> Result<(), RuntimeError>;
    /// LayerNorm over each `width`-wide slice in place: `w · (x − μ) / sqrt(var + eps) + b`.
    fn layer_norm(
        &self,
        x: &mut Tensor,
        width: usize,
        weight: &Matrix,
        bias: &Matrix,
        eps: f32,
    ) -> Result<(), RuntimeError>;
    /// `silu(gate) · up`, elementwise.
    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor, RuntimeError>;
    /// RoPE in place on `x` as `call` says ([`RopeCall`]).
    fn rope(&self, x: &mut Tensor, call: &RopeCall<'_>) -> Result<(), RuntimeError>;
    /// Causal softmax attention for the sequence in rows `rows`: `q` `[tokens, heads·qk_dim]`, `k`
    /// `[tokens, kv_heads·qk_dim]`, `v` `[tokens, kv_heads·v_dim]` → `[rows.len(), heads·v_dim]`. `allowed`, when
    /// given, is a `[len, len]` mask of the keys each query may attend to besides causality (DSA top-k selection).
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        rows: Range<usize>,
        shape: &AttentionShape,
        allowed: Option<&[bool]>,
    ) -> Result<Tensor, RuntimeError>;
    /// MoE routing from router logits `[tokens, experts]` (before the sigmoid): `σ(logit) + correction_bias` picks the
    /// groups and experts (ties to the lower index), `σ(logit)` of the chosen experts are the weights.
    fn route(&self, logits: &Tensor, correction_bias: &Matrix, shape: &RoutingShape) -> Result<Routes, RuntimeError>;
    /// DSA indexer selection for the sequence in rows `rows`: `q` `[tokens, heads·head_dim]`, `k`
    /// `[tokens, head_dim]`, `head_weights` `[tokens, heads]`; score of key `s` for query `t` is
    /// `Σ_h w[t,h]·heads^-½ · ReLU(q[t,h]·k[s]·head_dim^-½)`, and each query keeps its `top_k` best causal keys
    /// (ties to the lower key; all of them while `t < top_k`).
    fn indexer_top_k(
        &self,
        q: &Tensor,
        k: &Tensor,
        head_weights: &Tensor,
        rows: Range<usize>,
        shape: &IndexerShape,
    ) -> Result<KeySelection, RuntimeError>;
    /// Writes cached rows of `layer` into the backend's pages of `pool` (encoded in the pool's dtype). A position
    /// that is not reserved is an error naming the request.
    fn kv_write(&self, pool: &mut KvPool, layer: usize, rows: &KvRows<'_>) -> Result<(), RuntimeError>;
    /// One layer of a decode step over the paged cache: writes each request's new row at its position, verifies its
    /// mappings ([`KvPool::verify`]; when `step.verify`, or always where the check is fused into the attention) and
    /// attends its query over positions `0..=position` (only the DSA-chosen keys with `step.keys`). A request whose
    /// mappings fail is neither written through a bad mapping nor attended: its output is NaN and its fault given.
    fn paged_decode(&self, pool: &mut KvPool, step: &PagedStep<'_>) -> Result<PagedDecode, RuntimeError>;
    /// Applies a batch of routed MoE experts to their tokens and adds the results to `output`: `x` and `output` are
    /// `[tokens, hidden]`; for each expert in slice order and each of its `(token, weight)` pairs in list order,
    /// `output[token] += weight · down(silu(gate · x[token]) ⊙ (up · x[token]))` (the product rounded, then added),
    /// so each token sums its experts in slice order whatever the backend computes in between.
    fn routed_experts(&self, x: &Tensor, experts: &[RoutedExpert<'_>], output: &mut Tensor)
        -> Result<(), RuntimeError>;
    /// The KDA mixer ([`crate::runtime::kda`]) of each sequence `(rows, state)` of `sequences`, continuing from its
    /// state and advancing it: `[tokens, width]` (what `o_proj` takes; rows in no sequence are zeros). Computed on
    /// the host by every backend for now (a device backend downloads the projections and uploads the result).
    fn kda(
        &self,
        projections: &KdaProjections<'_>,
        params: &KdaParams<'_>,
        sequences: &mut [(Range<usize>, &mut KdaState)],
        mode: KdaMode,
    ) -> Result<Tensor, RuntimeError> {
        let KdaProjections { qkv, forget, beta, gate, shape } = *projections;
        let [qkv, forget, beta, gate] = [qkv, forget, beta, gate].map(|tensor| self.download(tensor));
        let (qkv, forget, beta, gate) = (qkv?, forget?, beta?, gate?);
        let (width, heads) = (shape.width(), shape.heads);
        let mut out = vec![0f32; forget.len()];
        for (rows, state) in sequences.iter_mut() {
            let inputs = KdaInputs {
                qkv: &qkv[rows.start * 3 * width..rows.end * 3 * width],
                forget: &forget[rows.start * width..rows.end * width],
                beta: &beta[rows.start * heads..rows.end * heads],
                gate: &gate[rows.start * width..rows.end * width],
            };
            let mixed = super::kda::kda(&shape, params, &inputs, state, mode);
            out[rows.start * width..rows.end * width].copy_from_slice(&mixed);
        }
        self.upload(&out, width)
    }
}

/// A batch's KDA projections `[tokens, …]` on the backend: `qkv` `[tokens, 3 · width]` (before the convolution),
/// `forget` `[tokens, width]`, `beta` `[tokens, heads]`, `gate` `[tokens, width]` ([`KdaInputs`]).
#[derive(Clone, Copy)]
pub struct KdaProjections<'a> {
    pub qkv: &'a Tensor,
    pub forget: &'a Tensor,
    pub beta: &'a Tensor,
    pub gate: &'a Tensor,
    pub shape: KdaShape,
}

impl dyn Backend + '_ {
    /// Columns `start..start + width` of `x`.
    pub fn columns(&self, x: &Tensor, start: usize, width: usize) -> Result<Tensor, RuntimeError> {
        let mut out = self.empty(x.rows(), width)?;
        self.copy(&mut out, Block::columns(0, width), x, Block::columns(start, x.columns()), [x.rows(), 1, width])?;
        Ok(out)
    }

    /// The parts side by side: `[rows, Σ columns]`.
    pub fn concat_columns(&self, parts: &[&Tensor]) -> Result<Tensor, RuntimeError> {
        let rows = parts.first().map_or(0, |part| part.rows());
        let columns = parts.iter().map(|part| part.columns()).sum();
        let mut out = self.empty(rows, columns)?;
        let mut start = 0;
        for part in parts {
            let shape = [rows, 1, part.columns()];
            self.copy(&mut out, Block::columns(start, columns), part, Block::columns(0, part.columns()), shape)?;
            start += part.columns();
        }
        Ok(out)
    }

    /// Rows `range` of `x`.
    pub fn row_range(&self, x: &Tensor, range: Range<usize>) -> Result<Tensor, RuntimeError> {
        let columns = x.columns();
        let mut out = self.empty(range.len(), columns)?;
        let at = Block { offset: range.start * columns, outer_stride: columns, inner_stride: 0 };
        self.copy(&mut out, Block::columns(0, columns), x, at, [range.len(), 1, columns])?;
        Ok(out)
    }

    /// Rows `range` of `into` replaced by the same rows of `from` (same width).
    pub fn copy_rows(&self, into: &mut Tensor, from: &Tensor, range: Range<usize>) -> Result<(), RuntimeError> {
        let columns = into.columns();
        let block = Block { offset: range.start * columns, outer_stride: columns, inner_stride: 0 };
        self.copy(into, block, from, block, [range.len(), 1, columns])
    }

    /// `from` written into `into` from row `at_row` on (same width).
    pub fn place_rows(&self, into: &mut Tensor, at_row: usize, from: &Tensor) -> Result<(), RuntimeError> {
        let columns = into.columns();
        let to = Block { offset: at_row * columns, outer_stride: columns, inner_stride: 0 };
        self.copy(into, to, from, Block::columns(0, columns), [from.rows(), 1, columns])
    }

    /// `x` RMS-normed with `weight` over rows of its width (a copy).
    pub fn rms_normed(&self, x: &Tensor, weight: &Matrix, eps: f32) -> Result<Tensor, RuntimeError> {
        let mut out = self.empty(x.rows(), x.columns())?;
        self.copy_rows(&mut out, x, 0..x.rows())?;
        self.rms_norm(&mut out, x.columns(), weight, eps)?;
        Ok(out)
    }
}

/// One routed expert of a batch: its SwiGLU weights (`gate`, `up` `[inner, hidden]`, `down` `[hidden, inner]`),
/// the `(token, routing weight)` pairs routed to it, and how the engines quantize its inputs.
#[derive(Debug, Clone, Copy)]
pub struct RoutedExpert<'a> {
    pub gate: &'a Matrix,
    pub up: &'a Matrix,
    pub down: &'a Matrix,
    pub tokens: &'a [(usize, f32)],
    pub inputs: ExpertInputs,
    /// GLM-5.3-Flash's `swiglu_limit`: the gate clamped to `≤ limit` and the up projection to `±limit` before
    /// `silu(gate) · up` ([`crate::runtime::cpu::activation::clamp_swiglu`]).
    pub swiglu_limit: Option<f32>,
}

/// What the engines do to a routed expert's inputs before its products, which the runtime emulates.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ExpertInputs {
    /// Used as they are (weights-only schemes: W4A16, BF16, FP8 source).
    #[default]
    Exact,
    /// W4A4 NVFP4: quantized to NVFP4 and back under the layer's activation global scales, of the gate/up input
    /// and of the down input ([`crate::quant::fp4::nvfp4_fake_quantize_activations`]).
    Nvfp4 { gate_up: f32, down: f32 },
}

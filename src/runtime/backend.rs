//! The op surface every backend implements: the arithmetic of one decoder layer on host buffers.
//!
//! Layouts (row-major, f32): activations `[tokens, width]`; a linear weight `[out_features, in_features]` as
//! PyTorch stores it (`y = x·Wᵀ + b`); attention inputs per sequence `[tokens, heads, head_dim]`.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use super::rope_table::RopeTable;
use super::tensor::{Block, Tensor};
use super::RuntimeError;

/// A weight matrix `[rows, columns]` (f32, row-major), or, read from a compressed-tensors INT4 checkpoint, its
/// packed INT4 form only: the CUDA backend multiplies by that directly (W4A16), and the f32 values are made from it
/// on the first [`Matrix::values`] (the CPU backend's), so a device run holds no host f32 copy of INT4 weights.
/// A block-FP8 weight is read as its codes and block scales ([`Fp8Weight`]): a device backend uploads those (a
/// quarter of the f32 bytes) and dequantizes on the device; the first [`Matrix::values`] dequantizes on the host
/// and drops the codes, so the CPU holds the f32 values only, as before.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub rows: usize,
    pub columns: usize,
    /// The f32 values given at construction (empty for a packed-only INT4 matrix).
    data: Vec<f32>,
    /// The f32 values of a packed-only matrix, dequantized on first use.
    dequantized: std::sync::OnceLock<Vec<f32>>,
    pub int4: Option<Box<Int4Weight>>,
    /// The FP8 form of a block-FP8 weight until its f32 values are made.
    fp8: CodedFp8,
    /// Every value is a BF16 number (read from a BF16 linear weight): a device may hold it as BF16 without loss.
    pub bf16_values: bool,
    /// W4A8: the engines quantize this weight's inputs to FP8 per token before multiplying
    /// ([`crate::quant::w4a8::fake_quantize_tokens`]), which the CPU's linear emulates.
    pub fp8_token_inputs: bool,
    /// Unique per loaded matrix.
    pub id: u64,
    /// Its copy on a device, kept by the device backend that uploaded it and freed with the matrix: a dropped
    /// layer frees its device memory.
    device_copy: DeviceCopy,
}

/// A matrix's FP8 codes and scales, taken when the host dequantizes them.
#[derive(Debug, Default)]
struct CodedFp8(std::sync::Mutex<Option<std::sync::Arc<Fp8Weight>>>);

impl CodedFp8 {
    fn get(&self) -> Option<std::sync::Arc<Fp8Weight>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    fn take(&self) -> Option<std::sync::Arc<Fp8Weight>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
    }
}

impl Clone for CodedFp8 {
    fn clone(&self) -> Self {
        Self(std::sync::Mutex::new(self.get()))
    }
}

/// Block-scaled FP8 e4m3 as a checkpoint stores it: codes `[rows, columns]` and one f32 multiplier per block of
/// `grid` (`w = e4m3(code) · scale`, [`crate::quant::fp8_block::dequantize_row`]).
#[derive(Debug, Clone)]
pub struct Fp8Weight {
    pub codes: Fp8Codes,
    pub scales: Vec<f32>,
    pub grid: crate::quant::fp8_block::BlockGrid,
}

/// An FP8 weight's codes: read in place from the checkpoint's mapping (no copy: the CPU decodes them block by
/// block as it multiplies), or owned.
#[derive(Debug, Clone)]
pub enum Fp8Codes {
    Mapped(crate::io::MappedBytes),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Fp8Codes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Mapped(bytes) => bytes,
            Self::Owned(bytes) => bytes,
        }
    }
}

impl Fp8Weight {
    /// The f32 values, row-major: what a checkpoint reader dequantizing row by row gives, bit for bit.
    pub fn dequantize(&self) -> Vec<f32> {
        let columns = self.grid.columns;
        let mut out = vec![0f32; self.grid.rows * columns];
        for (row, values) in out.chunks_mut(columns.max(1)).enumerate().take(self.grid.rows) {
            crate::quant::fp8_block::dequantize_row(
                &self.grid,
                row,
                &self.codes[row * columns..][..columns],
                &self.scales,
                values,
            );
        }
        out
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.codes.len() + self.scales.len() * 4
    }
}

/// A matrix's device copy: the device it lives on (by address) and the backend's own weight type.
#[derive(Default)]
struct DeviceCopy(std::sync::Mutex<Option<(usize, std::sync::Arc<dyn std::any::Any + Send + Sync>)>>);

impl Clone for DeviceCopy {
    /// A clone is a new matrix: it uploads its own copy.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for DeviceCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.0.lock().map(|slot| slot.is_some()).unwrap_or(false);
        write!(f, "DeviceCopy({})", if kept { "kept" } else { "none" })
    }
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

    /// The values `q · scale` of a `[rows, columns]` matrix.
    pub fn dequantize(&self, rows: usize, columns: usize) -> Vec<f32> {
        use crate::quant::{int4, pack};
        let (words_per_row, groups_per_row) = (pack::packed_columns(columns), columns.div_ceil(self.group_size));
        let mut out = vec![0f32; rows * columns];
        let mut q = vec![0i8; columns];
        for (row, values) in out.chunks_mut(columns.max(1)).enumerate().take(rows) {
            pack::unpack_row(&self.packed[row * words_per_row..][..words_per_row], columns, &mut q);
            let scales: Vec<half::bf16> = self.scales[row * groups_per_row..][..groups_per_row]
                .iter()
                .map(|&bits| half::bf16::from_bits(bits))
                .collect();
            int4::dequantize_row(&q, &scales, self.group_size, values);
        }
        out
    }
}

static NEXT_MATRIX_ID: AtomicU64 = AtomicU64::new(1);

impl Matrix {
    /// A matrix with a fresh id.
    pub fn new(rows: usize, columns: usize, data: Vec<f32>) -> Self {
        let id = NEXT_MATRIX_ID.fetch_add(1, Ordering::Relaxed);
        Self {
            rows,
            columns,
            data,
            dequantized: std::sync::OnceLock::new(),
            int4: None,
            fp8: CodedFp8::default(),
            bf16_values: false,
            fp8_token_inputs: false,
            id,
            device_copy: DeviceCopy::default(),
        }
    }

    /// The copy a device backend keeps on device `device` (an address), if it made one.
    pub(crate) fn device_copy(&self, device: usize) -> Option<std::sync::Arc<dyn std::any::Any + Send + Sync>> {
        let slot = self.device_copy.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.as_ref().filter(|(on, _)| *on == device).map(|(_, copy)| copy.clone())
    }

    /// Keeps `copy` as this matrix's copy on device `device` (replacing one on another device).
    pub(crate) fn keep_device_copy(&self, device: usize, copy: std::sync::Arc<dyn std::any::Any + Send + Sync>) {
        let mut slot = self.device_copy.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *slot = Some((device, copy));
    }

    /// A packed-only INT4 matrix: no f32 values until [`Matrix::values`] asks.
    pub fn packed(rows: usize, columns: usize, int4: Int4Weight) -> Self {
        Self::new(rows, columns, Vec::new()).with_int4(int4)
    }

    /// A block-FP8 matrix held as its codes and scales: no f32 values until [`Matrix::values`] asks.
    pub fn coded_fp8(fp8: Fp8Weight) -> Self {
        let matrix = Self::new(fp8.grid.rows, fp8.grid.columns, Vec::new());
        *matrix.fp8.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(std::sync::Arc::new(fp8));
        matrix
    }

    /// The FP8 codes and scales, while the values have not been made from them on the host.
    pub fn fp8(&self) -> Option<std::sync::Arc<Fp8Weight>> {
        self.fp8.get()
    }

    /// The f32 values `[rows · columns]`: as given, or dequantized from the INT4 form or the FP8 codes (once, then
    /// kept; the FP8 codes are dropped then).
    pub fn values(&self) -> &[f32] {
        if !self.data.is_empty() || self.rows * self.columns == 0 {
            return &self.data;
        }
        match &self.int4 {
            Some(int4) => self.dequantized.get_or_init(|| int4.dequantize(self.rows, self.columns)),
            None => self.dequantized.get_or_init(|| self.fp8.take().map(|fp8| fp8.dequantize()).unwrap_or_default()),
        }
    }

    /// The same matrix, marked as holding BF16 numbers only (or not).
    pub fn with_bf16_values(mut self, bf16_values: bool) -> Self {
        self.bf16_values = bf16_values;
        self
    }

    /// The same matrix, its inputs quantized to FP8 per token as the engines do for W4A8.
    pub fn with_fp8_token_inputs(mut self) -> Self {
        self.fp8_token_inputs = true;
        self
    }

    /// The same matrix carrying its packed INT4 form.
    pub fn with_int4(mut self, int4: Int4Weight) -> Self {
        self.int4 = Some(Box::new(int4));
        self
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let dense = self.data.len() + self.dequantized.get().map_or(0, Vec::len);
        dense * 4
            + self.int4.as_ref().map_or(0, |w| w.packed.len() * 4 + w.scales.len() * 2)
            + self.fp8.get().map_or(0, |w| w.bytes())
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
    /// Rotates `rotary_dim` values starting at `offset` of every `head_dim`-slice of the rows `rows` of `x`; row
    /// `rows.start + t` is at position `first_position + t` of `table`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut Tensor,
        rows: Range<usize>,
        first_position: usize,
        head_dim: usize,
        offset: usize,
        rotary_dim: usize,
        table: &RopeTable,
        style: RopeStyle,
    ) -> Result<(), RuntimeError>;
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

/// Where a cached row belongs: `request`'s `position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvAt {
    pub request: RequestId,
    pub position: usize,
}

/// Rows to cache in one layer: row `r` of `rows` `[n, row_width]` and of `aux` `[n, aux_width]` at `at[r]`.
#[derive(Debug, Clone, Copy)]
pub struct KvRows<'a> {
    pub rows: &'a Tensor,
    pub aux: &'a Tensor,
    pub at: &'a [KvAt],
}

/// One layer of a decode step: per request (in order) where its new row goes (written there, then attended with
/// the positions before it), its query row of `q` `[requests, heads · qk_dim]` laid out as `layout`, and its new
/// cache row of `rows` `[requests, row_width]` and `aux` `[requests, aux_width]`.
#[derive(Debug, Clone, Copy)]
pub struct PagedStep<'a> {
    pub layer: usize,
    pub layout: PagedLayout,
    /// Verify every mapping of each request (the step's first layer); counted in the pool's counters.
    pub verify: bool,
    pub q: &'a Tensor,
    pub rows: &'a Tensor,
    pub aux: &'a Tensor,
    pub requests: &'a [KvAt],
    /// DSA (GLM-5): the keys each request attends to, chosen in this step by this layer's indexer over the cached
    /// indexer keys (the aux values, the new ones included), or an earlier layer's choice reused.
    pub keys: Option<KeyChoice<'a>>,
}

impl PagedStep<'_> {
    /// Columns of the step's DSA key mask ([`PagedDecode::keys`]): the longest context.
    pub fn key_columns(&self) -> usize {
        self.requests.iter().map(|at| at.position + 1).max().unwrap_or(0)
    }
}

/// How a DSA layer of a decode step picks the keys its requests attend to.
#[derive(Debug, Clone, Copy)]
pub enum KeyChoice<'a> {
    /// This layer's indexer: request `r`'s query row of `q` `[requests, heads · dim]` and head weights `[requests,
    /// heads]` score each cached key `s ≤ position` as [`Backend::indexer_top_k`] does; the `top_k` best are kept
    /// (every key while `position < top_k`).
    Select { q: &'a Tensor, head_weights: &'a Tensor, heads: usize, dim: usize, top_k: usize },
    /// The keys an earlier layer chose in this step ([`PagedDecode::keys`], rows in request order).
    Reuse(&'a Tensor),
}

/// A paged decode's result.
#[derive(Debug)]
pub struct PagedDecode {
    /// `[requests, heads · v_dim]`; NaN rows for faulted requests.
    pub out: Tensor,
    /// Per request, why its mappings cannot be trusted.
    pub faults: Vec<Option<PoolError>>,
    /// The keys each request attended to when this layer chose them ([`KeyChoice::Select`]): `[requests, stride]`,
    /// 1.0 for a kept key, for the next layers that reuse it ([`KeyChoice::Reuse`]).
    pub keys: Option<Tensor>,
    /// Host time spent verifying (0 where the check runs inside the attention kernel).
    pub verify_seconds: f64,
}

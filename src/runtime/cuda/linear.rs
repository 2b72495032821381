//! Linear layers on the device: dense f32, BF16 and BF16-pair weights (kernels/linear.cu; over many rows as split
//! BF16 GEMMs on cuBLAS) and INT4 W4A16 (kernels/w4a16.cu).
//!
//! The host-level [`linear`] serves [`crate::runtime::Backend::linear`]; the device-level functions
//! ([`linear_f32`], [`dense_bf16`], [`linear_bf16`], [`linear_bf16_gemm`], [`linear_bf16_pair`], [`w4a16_linear`],
//! [`w4a16_grouped`]) take device-resident buffers, check shapes and sizes, and launch (no copies), so the MoE path
//! and benchmarks can chain them.

use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, GemmBf16, LaunchShape};
use crate::runtime::matrix::Matrix;

use crate::runtime::tensor::Tensor;

use super::checks::unsupported;
pub use super::split::Activations;
use super::split::{grid_stride, holds, round, split};
use super::state::CudaBackend;
use super::tensor::{alloc, buffer};
use crate::runtime::device::DeviceWeight;

/// Threads per block of the matrix kernels: 8 warps, one output feature each.
const THREADS: u32 = 256;
/// Output features per block.
const FEATURES_PER_BLOCK: usize = 8;
/// Output features per block of `w4a16_grouped` (4 per warp).
const GROUPED_FEATURES_PER_BLOCK: usize = 32;
/// Input rows one warp handles at once (kRowTile in kernels/row_tile.cuh).
const ROW_TILE: usize = 16;
/// From this many rows on, BF16 weights run as a split BF16 GEMM ([`linear_bf16_gemm`]: tensor cores, the weight
/// read once) instead of the matrix-vector kernel (CUDA cores, the weight read once per 16 rows). Two row tiles:
/// below it the kernel reads the weight no more often than the GEMM does.
pub const GEMM_MIN_ROWS: usize = 2 * ROW_TILE;

/// `value` as a kernel `int`.
fn int(tensor: &str, what: &str, value: usize) -> Result<i32, CudaError> {
    i32::try_from(value).map_err(|_| unsupported(tensor, format!("{what} {value} does not fit a 32-bit kernel index")))
}

/// The grid of a matrix kernel: output features over x, row tiles (or segments) over y.
fn grid(out_features: usize, y_blocks: usize) -> Result<LaunchShape, CudaError> {
    grid_of(out_features, FEATURES_PER_BLOCK, y_blocks)
}

/// [`grid`] for a kernel whose block computes `per_block` output features.
fn grid_of(out_features: usize, per_block: usize, y_blocks: usize) -> Result<LaunchShape, CudaError> {
    let x_blocks = out_features.div_ceil(per_block);
    let x = u32::try_from(x_blocks).map_err(|_| unsupported("linear", format!("{out_features} output features")))?;
    let y = u32::try_from(y_blocks)
        .ok()
        .filter(|&y| y < 65_536)
        .ok_or_else(|| unsupported("linear", format!("{y_blocks} row tiles exceed the grid's y limit 65535")))?;
    Ok(LaunchShape { grid: [x.max(1), y.max(1), 1], block: [THREADS, 1, 1], shared_bytes: 0 })
}

/// Checks the INT4 layout constraints of the W4A16 kernels.
fn check_int4(tensor: &str, in_features: usize, group_size: usize) -> Result<(), CudaError> {
    if group_size == 0 || !group_size.is_multiple_of(8) {
        return Err(unsupported(
            tensor,
            format!("W4A16 needs a group size that is a multiple of 8, got {group_size}; use the CPU backend"),
        ));
    }
    if !in_features.is_multiple_of(group_size) {
        return Err(unsupported(
            tensor,
            format!(
                "W4A16 needs input features ({in_features}) to be a multiple of the group size {group_size}; \
                 use the CPU backend"
            ),
        ));
    }
    Ok(())
}

/// `y = x · Wᵀ + bias` for the rows of `x`: W4A16 when the weight is INT4 on the device, dense BF16 or f32
/// otherwise (as uploaded).
pub fn linear(backend: &CudaBackend, x: &Tensor, weight: &Matrix, bias: Option<&Matrix>) -> Result<Tensor, CudaError> {
    let (out_features, in_features, rows) = (weight.rows, weight.columns, x.rows());
    if x.columns() != in_features {
        return Err(unsupported(
            "linear",
            format!("input rows have {} values, the weight takes {in_features}", x.columns()),
        ));
    }
    if let Some(bias) = bias.filter(|b| b.values().len() != out_features) {
        return Err(unsupported("linear", format!("bias has {} values, expected {out_features}", bias.values().len())));
    }
    let device = backend.device();
    let y = alloc(device, rows, out_features)?;
    if rows == 0 || out_features == 0 {
        return Ok(y);
    }
    if in_features == 0 {
        // An empty dot product: y = 0 + bias, as on the CPU (and no zero-byte device allocation).
        let values: Vec<f32> =
            (0..rows).flat_map(|_| (0..out_features).map(|o| 0.0 + bias.map_or(0.0, |b| b.values()[o]))).collect();
        return Ok(Tensor::device(device.upload(&values)?, rows, out_features));
    }
    let weight = backend.weight(weight)?;
    let bias = bias.map(|b| backend.weight(b)).transpose()?;
    let bias_buffer = match bias.as_deref() {
        None => None,
        Some(DeviceWeight::Dense(buffer)) => Some(buffer),
        Some(DeviceWeight::Int4 { .. } | DeviceWeight::Bf16(_) | DeviceWeight::Bf16Pair(_)) => {
            return Err(unsupported("linear", "the bias is not an f32 parameter"))
        }
    };
    let (x, y_buffer) = (buffer(x)?, buffer(&y)?);
    match weight.as_ref() {
        DeviceWeight::Dense(w) => {
            linear_f32(device, x, w, bias_buffer, y_buffer, LinearShape::new(rows, in_features, out_features))?
        }
        DeviceWeight::Bf16(w) => {
            let out = (y_buffer, LinearShape::new(rows, in_features, out_features));
            dense_bf16(device, x, w, bias_buffer, out, backend.activations)?
        }
        DeviceWeight::Bf16Pair(w) => {
            let out = (y_buffer, LinearShape::new(rows, in_features, out_features));
            linear_bf16_pair(device, x, w, bias_buffer, out, backend.activations)?
        }
        DeviceWeight::Int4 { packed, scales, group_size } => {
            check_int4("linear", in_features, *group_size)?;
            w4a16_linear(
                device,
                x,
                &W4a16Weight { packed, scales, group_size: *group_size },
                bias_buffer,
                y_buffer,
                LinearShape::new(rows, in_features, out_features),
            )?
        }
    }
    Ok(y)
}

/// The dimensions of one dense product `y[rows, out] = x[rows, in] · W[out, in]ᵀ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearShape {
    pub rows: usize,
    pub in_features: usize,
    pub out_features: usize,
}

impl LinearShape {
    pub fn new(rows: usize, in_features: usize, out_features: usize) -> Self {
        Self { rows, in_features, out_features }
    }
}

/// A dense kernel and the bytes of one of its weight elements.
#[derive(Debug, Clone, Copy)]
pub struct DenseKernel {
    pub name: &'static str,
    pub weight_bytes: usize,
}

impl DenseKernel {
    const F32: Self = Self { name: "linear_f32", weight_bytes: 4 };
    const BF16: Self = Self { name: "linear_bf16", weight_bytes: 2 };
}

/// A W4A16 weight on the device: `packed` u32 `[out, in / 8]`, `scales` BF16 bits `[out, in / group_size]`.
#[derive(Debug, Clone, Copy)]
pub struct W4a16Weight<'a> {
    pub packed: &'a DeviceBuffer,
    pub scales: &'a DeviceBuffer,
    pub group_size: usize,
}

/// Launches a dense kernel (`linear_f32` or `linear_bf16`) after the shape checks.
fn dense(
    kernel: DenseKernel,
    device: &dyn Device,
    x: &DeviceBuffer,
    weight: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    y: &DeviceBuffer,
    shape: LinearShape,
) -> Result<(), CudaError> {
    let LinearShape { rows, in_features, out_features } = shape;
    let DenseKernel { name: kernel, weight_bytes } = kernel;
    holds(kernel, "x", x, rows * in_features, 4)?;
    holds(kernel, "weight", weight, out_features * in_features, weight_bytes)?;
    holds(kernel, "y", y, rows * out_features, 4)?;
    if let Some(bias) = bias {
        holds(kernel, "bias", bias, out_features, 4)?;
    }
    if rows == 0 || out_features == 0 {
        return Ok(());
    }
    let args = [
        Arg::Buffer(x),
        Arg::Buffer(weight),
        bias.map_or(Arg::Null, Arg::Buffer),
        Arg::Buffer(y),
        Arg::I32(int(kernel, "rows", rows)?),
        Arg::I32(int(kernel, "input features", in_features)?),
        Arg::I32(int(kernel, "output features", out_features)?),
    ];
    device.launch(kernel, grid(out_features, rows.div_ceil(ROW_TILE))?, &args)
}

/// Device-level dense linear: `y[rows, out] = x[rows, in] · W[out, in]ᵀ (+ bias[out])`, all f32.
pub fn linear_f32(
    device: &dyn Device,
    x: &DeviceBuffer,
    weight: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    y: &DeviceBuffer,
    shape: LinearShape,
) -> Result<(), CudaError> {
    dense(DenseKernel::F32, device, x, weight, bias, y, shape)
}

/// Device-level dense linear with BF16 weight bits (u16 `[out, in]`); x, bias and y f32. BF16 linear weights run on
/// it below [`GEMM_MIN_ROWS`] rows ([`dense_bf16`]), and it is the bandwidth baseline the W4A16 kernels are compared
/// with.
pub fn linear_bf16(
    device: &dyn Device,
    x: &DeviceBuffer,
    weight: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    y: &DeviceBuffer,
    shape: LinearShape,
) -> Result<(), CudaError> {
    dense(DenseKernel::BF16, device, x, weight, bias, y, shape)
}

/// Device-level dense linear on BF16 weight bits: on [`linear_bf16`] below [`GEMM_MIN_ROWS`] rows (f32 activations
/// as they are), as [`linear_bf16_gemm`] with `activations` from there on.
pub fn dense_bf16(
    device: &dyn Device,
    x: &DeviceBuffer,
    weight: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    (y, shape): (&DeviceBuffer, LinearShape),
    activations: Activations,
) -> Result<(), CudaError> {
    if shape.rows < GEMM_MIN_ROWS {
        linear_bf16(device, x, weight, bias, y, shape)
    } else {
        linear_bf16_gemm(device, x, weight, bias, (y, shape), activations)
    }
}

/// Device-level dense linear on BF16 weight bits as one BF16 GEMM ([`Device::gemm_bf16`]: cuBLAS on a GPU), the
/// weight read once. [`Activations::Split`]: over the activations split in two BF16 halves, `x = hi + lo` ([`split`]:
/// 16 significant bits, within 2⁻¹⁸ of x), stacked as 2·rows rows, then `y = x_hi·Wᵀ + x_lo·Wᵀ (+ bias)`: twice the
/// GEMM's flops for f32-faithful activations; temporary device memory 2·rows·in BF16 + 2·rows·out f32.
/// [`Activations::Bf16`]: over x rounded to BF16 once, written straight into y (through the join only to add a
/// bias); temporary memory rows·in BF16 (+ rows·out f32 with a bias).
pub fn linear_bf16_gemm(
    device: &dyn Device,
    x: &DeviceBuffer,
    weight: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    (y, shape): (&DeviceBuffer, LinearShape),
    activations: Activations,
) -> Result<(), CudaError> {
    let LinearShape { rows, in_features, out_features } = shape;
    if !checked_dense("linear_bf16_gemm", x, bias, y, rows, in_features, out_features)? {
        return Ok(());
    }
    if activations == Activations::Bf16 {
        let rounded = round(device, x, rows * in_features)?;
        let Some(bias) = bias else {
            return device.gemm_bf16(&GemmBf16 { weight, x: &rounded, c: y, rows, in_features, out_features });
        };
        let products = device.alloc_for::<f32>(rows * out_features)?;
        device.gemm_bf16(&GemmBf16 { weight, x: &rounded, c: &products, rows, in_features, out_features })?;
        let layout = Join { ld: out_features, second: None, third: None };
        return join(device, y, &products, Some(bias), rows, out_features, layout);
    }
    let halves = split(device, x, rows * in_features)?;
    let products = device.alloc_for::<f32>(2 * rows * out_features)?;
    device.gemm_bf16(&GemmBf16 { weight, x: &halves, c: &products, rows: 2 * rows, in_features, out_features })?;
    let layout = Join { ld: out_features, second: Some(rows * out_features), third: None };
    join(device, y, &products, bias, rows, out_features, layout)
}

/// Device-level dense linear on a BF16 weight pair `W = W_hi + W_lo` (u16 `[2, out, in]`: an f32 weight split as
/// [`split`] does, e.g. block-FP8 dequantized on the device; within 2⁻¹⁸ of W): below [`GEMM_MIN_ROWS`] rows the
/// matrix-vector kernel over both halves as one `[2·out, in]` weight (the f32 weight's bytes); from there on one
/// BF16 GEMM of the pair by the activations: split ([`Activations::Split`]), `x_hi·W_hiᵀ + x_lo·W_hiᵀ + x_hi·W_loᵀ`
/// (the fourth product, x_lo·W_lo, below 2⁻¹⁸, is computed and left out; temporary memory 2·rows·in BF16 +
/// 4·rows·out f32), or rounded once ([`Activations::Bf16`]), `x·W_hiᵀ + x·W_loᵀ` (rows·in BF16 + 2·rows·out f32).
pub fn linear_bf16_pair(
    device: &dyn Device,
    x: &DeviceBuffer,
    pair: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    (y, shape): (&DeviceBuffer, LinearShape),
    activations: Activations,
) -> Result<(), CudaError> {
    let LinearShape { rows, in_features, out_features } = shape;
    if !checked_dense("linear_bf16_pair", x, bias, y, rows, in_features, out_features)? {
        return Ok(());
    }
    let pair_out = 2 * out_features;
    let (products, layout) = if rows < GEMM_MIN_ROWS {
        let products = device.alloc_for::<f32>(rows * pair_out)?;
        linear_bf16(device, x, pair, None, &products, LinearShape::new(rows, in_features, pair_out))?;
        (products, Join { ld: pair_out, second: Some(out_features), third: None })
    } else if activations == Activations::Bf16 {
        let rounded = round(device, x, rows * in_features)?;
        let products = device.alloc_for::<f32>(rows * pair_out)?;
        let gemm = GemmBf16 { weight: pair, x: &rounded, c: &products, rows, in_features, out_features: pair_out };
        device.gemm_bf16(&gemm)?;
        (products, Join { ld: pair_out, second: Some(out_features), third: None })
    } else {
        let halves = split(device, x, rows * in_features)?;
        let products = device.alloc_for::<f32>(2 * rows * pair_out)?;
        let gemm =
            GemmBf16 { weight: pair, x: &halves, c: &products, rows: 2 * rows, in_features, out_features: pair_out };
        device.gemm_bf16(&gemm)?;
        (products, Join { ld: pair_out, second: Some(rows * pair_out), third: Some(out_features) })
    };
    join(device, y, &products, bias, rows, out_features, layout)
}

/// Checks x, bias and y of a dense product; false when there is nothing to compute.
fn checked_dense(
    kernel: &str,
    x: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    y: &DeviceBuffer,
    rows: usize,
    in_features: usize,
    out_features: usize,
) -> Result<bool, CudaError> {
    holds(kernel, "x", x, rows * in_features, 4)?;
    holds(kernel, "y", y, rows * out_features, 4)?;
    if let Some(bias) = bias {
        holds(kernel, "bias", bias, out_features, 4)?;
    }
    Ok(rows > 0 && out_features > 0)
}

/// Where a split form's partial products lie (kernels/linear.cu `join_products_f32`): row stride `ld`, the second
/// and third terms' offsets in values (when there are such terms).
struct Join {
    ld: usize,
    second: Option<usize>,
    third: Option<usize>,
}

/// `y[rows, out] = the layout's terms summed (+ bias)`.
fn join(
    device: &dyn Device,
    y: &DeviceBuffer,
    products: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    rows: usize,
    out: usize,
    layout: Join,
) -> Result<(), CudaError> {
    let long = |value: usize| Arg::I64(value as i64);
    let args = [
        Arg::Buffer(y),
        Arg::Buffer(products),
        bias.map_or(Arg::Null, Arg::Buffer),
        long(rows),
        long(out),
        long(layout.ld),
        Arg::I64(layout.second.map_or(-1, |second| second as i64)),
        Arg::I64(layout.third.map_or(-1, |third| third as i64)),
    ];
    device.launch("join_products_f32", grid_stride(rows * out), &args)
}

/// Device-level W4A16 linear: `packed` u32 `[out, in / 8]`, `scales` BF16 bits `[out, in / group_size]`
/// (compressed-tensors layout), x f32 `[rows, in]`, optional f32 bias `[out]`, y f32 `[rows, out]`.
pub fn w4a16_linear(
    device: &dyn Device,
    x: &DeviceBuffer,
    weight: &W4a16Weight,
    bias: Option<&DeviceBuffer>,
    y: &DeviceBuffer,
    shape: LinearShape,
) -> Result<(), CudaError> {
    let LinearShape { rows, in_features, out_features } = shape;
    let W4a16Weight { packed, scales, group_size } = *weight;
    const KERNEL: &str = "w4a16_linear";
    check_int4(KERNEL, in_features, group_size)?;
    holds(KERNEL, "x", x, rows * in_features, 4)?;
    holds(KERNEL, "weight_packed", packed, out_features * (in_features / 8), 4)?;
    holds(KERNEL, "weight_scale", scales, out_features * (in_features / group_size), 2)?;
    holds(KERNEL, "y", y, rows * out_features, 4)?;
    if let Some(bias) = bias {
        holds(KERNEL, "bias", bias, out_features, 4)?;
    }
    if rows == 0 || out_features == 0 {
        return Ok(());
    }
    let args = [
        Arg::Buffer(x),
        Arg::Buffer(packed),
        Arg::Buffer(scales),
        bias.map_or(Arg::Null, Arg::Buffer),
        Arg::Buffer(y),
        Arg::I32(int(KERNEL, "rows", rows)?),
        Arg::I32(int(KERNEL, "input features", in_features)?),
        Arg::I32(int(KERNEL, "output features", out_features)?),
        Arg::I32(int(KERNEL, "group size", group_size)?),
    ];
    device.launch(KERNEL, grid(out_features, rows.div_ceil(ROW_TILE))?, &args)
}

/// The experts' INT4 weights of one MoE projection, concatenated on the device: `packed` u32
/// `[experts, out, in / 8]`, `scales` BF16 bits `[experts, out, in / group_size]`.
pub struct GroupedInt4<'a> {
    pub packed: &'a DeviceBuffer,
    pub scales: &'a DeviceBuffer,
    pub group_size: usize,
    pub experts: usize,
    pub in_features: usize,
    pub out_features: usize,
}

/// The segments of a grouped launch, both i32 lists in one buffer (one upload): segment `s` uses expert
/// `segment_expert[s]` (at byte `expert_at`, `count` of them) over rows `segment_start[s] .. segment_start[s + 1]`
/// (at byte `start_at`, `count + 1` of them).
#[derive(Clone, Copy)]
pub struct Segments<'a> {
    pub lists: &'a DeviceBuffer,
    pub expert_at: usize,
    pub start_at: usize,
    pub count: usize,
}

/// Device-level grouped W4A16 for MoE experts: x f32 `[rows, in]` holds the routed tokens sorted by expert;
/// segment `s` covers rows `segment_start[s] .. segment_start[s + 1]` (i32 `[segments + 1]`) and uses expert
/// `segment_expert[s]` (i32 `[segments]`); y f32 `[rows, out]` in the same row order. Segment contents live on the
/// device and are not checked here: a segment with an expert out of range or rows outside `0..=rows` gets NaN
/// rows (rows no segment covers are left unwritten).
pub fn w4a16_grouped(
    device: &dyn Device,
    x: &DeviceBuffer,
    weights: &GroupedInt4,
    segments: &Segments,
    rows: usize,
    y: &DeviceBuffer,
) -> Result<(), CudaError> {
    const KERNEL: &str = "w4a16_grouped";
    let GroupedInt4 { packed, scales, group_size, experts, in_features, out_features } = *weights;
    let Segments { lists, expert_at, start_at, count } = *segments;
    check_int4(KERNEL, in_features, group_size)?;
    holds(KERNEL, "x", x, rows * in_features, 4)?;
    holds(KERNEL, "weight_packed", packed, experts * out_features * (in_features / 8), 4)?;
    holds(KERNEL, "weight_scale", scales, experts * out_features * (in_features / group_size), 2)?;
    holds(KERNEL, "segment_expert", lists, expert_at / 4 + count, 4)?;
    holds(KERNEL, "segment_start", lists, start_at / 4 + count + 1, 4)?;
    holds(KERNEL, "y", y, rows * out_features, 4)?;
    if count == 0 || rows == 0 || out_features == 0 {
        return Ok(());
    }
    let args = [
        Arg::Buffer(x),
        Arg::Buffer(packed),
        Arg::Buffer(scales),
        Arg::At(lists, expert_at),
        Arg::At(lists, start_at),
        Arg::Buffer(y),
        Arg::I32(int(KERNEL, "rows", rows)?),
        Arg::I32(int(KERNEL, "experts", experts)?),
        Arg::I32(int(KERNEL, "input features", in_features)?),
        Arg::I32(int(KERNEL, "output features", out_features)?),
        Arg::I32(int(KERNEL, "group size", group_size)?),
    ];
    device.launch(KERNEL, grid_of(out_features, GROUPED_FEATURES_PER_BLOCK, count)?, &args)
}

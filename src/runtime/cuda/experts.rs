//! Routed MoE experts on the device: a batch of INT4 experts concatenated on the device and applied to its
//! expert-sorted tokens with grouped W4A16 launches (kernels/w4a16.cu, kernels/activation.cu).
//!
//! Per batch: gather the tokens' rows sorted by expert (one segment per expert with tokens) on the device; copy
//! the experts' packed weights and scales from their device copies (where the expert loader's prefetch put them
//! while the previous batch computed) side by side (`[experts, out, in / 8]`, `[experts, out, in / group_size]`), then
//! `w4a16_grouped` gate and up, `silu_mul_f32`, `w4a16_grouped` down: four launches for the whole batch. The
//! weighted sum runs on the device in the CPU combine's order (kernels/tensor.cu `accumulate_rows_f32`), so each
//! token adds its experts in batch order exactly as the CPU does. Only the row lists cross the bus (as decisions).
//! A batch whose experts are not all INT4 with one readable group size (FP8/BF16 checkpoints) runs expert by expert
//! on the dense f32 weights instead (gate, up, SiLU-gate and down chained on the device).

use std::sync::Arc;

use crate::runtime::backend::{ExpertInputs, RoutedExpert};
use crate::runtime::device::{CudaError, DeviceBuffer};
use crate::runtime::matrix::{Int4Weight, Matrix};
use crate::runtime::tensor::Tensor;

use super::activation::silu_mul_f32;
use super::checks::unsupported;
use super::linear::{dense_bf16, linear_bf16_pair, linear_f32, w4a16_grouped, GroupedInt4, LinearShape, Segments};
use super::state::CudaBackend;
use super::tensor::{accumulate_rows, alloc, buffer, gather_rows, DecisionPack};
use crate::runtime::device::DeviceWeight;

/// [`crate::runtime::Backend::routed_experts`] on the device.
pub fn routed_experts(
    backend: &CudaBackend,
    x: &Tensor,
    experts: &[RoutedExpert<'_>],
    output: &mut Tensor,
) -> Result<(), CudaError> {
    let active: Vec<&RoutedExpert> = experts.iter().filter(|expert| !expert.tokens.is_empty()).collect();
    let Some(first) = active.first() else { return Ok(()) };
    if active.iter().any(|expert| expert.inputs != ExpertInputs::Exact) {
        return Err(unsupported(
            "routed_experts",
            "W4A4 NVFP4 experts: the device backend has no activation quantization yet; run with --device cpu",
        ));
    }
    if active.iter().any(|expert| expert.swiglu_limit.is_some()) {
        return Err(unsupported(
            "routed_experts",
            "clamped SwiGLU (swiglu_limit) experts: the device kernels do not clamp yet; run with --device cpu",
        ));
    }
    let (hidden, inner) = (x.columns(), first.gate.rows);
    check(x, inner, &active, output)?;
    match common_group_size(&active, hidden, inner) {
        Some(group_size) => grouped(backend, x, inner, group_size, &active, output),
        None => {
            for expert in active {
                dense(backend, x, inner, expert, output)?;
            }
            Ok(())
        }
    }
}

/// Shapes: every expert `[inner, hidden]` gate/up and `[hidden, inner]` down, tokens inside `x`.
fn check(x: &Tensor, inner: usize, experts: &[&RoutedExpert], output: &Tensor) -> Result<(), CudaError> {
    let (hidden, tokens) = (x.columns(), x.rows());
    if hidden == 0 || inner == 0 || output.rows() != tokens || output.columns() != hidden {
        return Err(unsupported(
            "routed_experts",
            format!(
                "x is {tokens}×{hidden} and output {}×{}, expected equal shapes (inner {inner})",
                output.rows(),
                output.columns()
            ),
        ));
    }
    for (index, expert) in experts.iter().enumerate() {
        let shapes = [(expert.gate, inner, hidden), (expert.up, inner, hidden), (expert.down, hidden, inner)];
        if let Some((matrix, rows, columns)) =
            shapes.into_iter().find(|(m, rows, columns)| m.rows != *rows || m.columns != *columns)
        {
            return Err(unsupported(
                "routed_experts",
                format!(
                    "expert {index} of the batch has a {}×{} matrix, expected {rows}×{columns}",
                    matrix.rows, matrix.columns
                ),
            ));
        }
        if let Some(&(token, _)) = expert.tokens.iter().find(|(token, _)| *token >= tokens) {
            return Err(unsupported(
                "routed_experts",
                format!("expert {index} of the batch names token {token} of {tokens}"),
            ));
        }
    }
    Ok(())
}

/// `output[token] += weight · rows[r]` for the experts' `(token, weight)` pairs in order, row `r` counting the
/// pairs of all `experts` (the CPU combine's order, on the device).
fn combine(
    backend: &CudaBackend,
    output: &mut Tensor,
    rows: &Tensor,
    experts: &[&RoutedExpert],
) -> Result<(), CudaError> {
    let pairs = experts.iter().flat_map(|expert| expert.tokens.iter());
    let entries: Vec<(usize, usize, f32)> =
        pairs.enumerate().map(|(row, &(token, weight))| (token, row, weight)).collect();
    accumulate_rows(backend, output, rows, &entries)
}

/// The INT4 form of `matrix` when the grouped kernel can read it with `group_size`.
fn readable_int4(matrix: &Matrix, group_size: usize) -> Option<&Int4Weight> {
    let int4 = matrix.int4.as_deref()?;
    let fits = int4.group_size == group_size
        && matrix.columns.is_multiple_of(group_size)
        && int4.packed.len() == matrix.rows * (matrix.columns / 8)
        && int4.scales.len() == matrix.rows * (matrix.columns / group_size);
    fits.then_some(int4)
}

/// The group size every matrix of the batch shares, when all are INT4 and the W4A16 kernels can read them (a
/// multiple of 8 dividing `hidden` and `inner`).
fn common_group_size(experts: &[&RoutedExpert], hidden: usize, inner: usize) -> Option<usize> {
    let group_size = experts.first()?.gate.int4.as_ref()?.group_size;
    let usable = group_size > 0
        && group_size.is_multiple_of(8)
        && hidden.is_multiple_of(group_size)
        && inner.is_multiple_of(group_size);
    let all = experts.iter().all(|expert| {
        [expert.gate, expert.up, expert.down].into_iter().all(|m| readable_int4(m, group_size).is_some())
    });
    (usable && all).then_some(group_size)
}

/// One projection of the batch concatenated on the device: packed words and scales of every expert in batch order.
struct Concatenated {
    packed: DeviceBuffer,
    scales: DeviceBuffer,
}

fn concatenate<'a>(
    backend: &CudaBackend,
    experts: &[&RoutedExpert<'a>],
    pick: impl Fn(&RoutedExpert<'a>) -> &'a Matrix,
) -> Result<Concatenated, CudaError> {
    // Each expert's packed weights come from its device copy (uploaded ahead by the expert loader's
    // prefetch), then are copied side by side on the device.
    let weights = experts.iter().map(|expert| backend.weight(pick(expert))).collect::<Result<Vec<_>, _>>()?;
    let mut parts = Vec::with_capacity(weights.len());
    for weight in &weights {
        match weight.as_ref() {
            DeviceWeight::Int4 { packed, scales, .. } => parts.push((packed, scales)),
            DeviceWeight::Dense(_) | DeviceWeight::Bf16(_) | DeviceWeight::Bf16Pair(_) => {
                return Err(unsupported("routed_experts", "an expert of an INT4 batch has no INT4 form"))
            }
        }
    }
    let device = backend.device();
    let packed = device.alloc(parts.iter().map(|(packed, _)| packed.bytes()).sum())?;
    let scales = device.alloc(parts.iter().map(|(_, scales)| scales.bytes()).sum())?;
    let (mut packed_offset, mut scales_offset) = (0, 0);
    for (part_packed, part_scales) in parts {
        device.copy(part_packed, &packed, packed_offset)?;
        device.copy(part_scales, &scales, scales_offset)?;
        packed_offset += part_packed.bytes();
        scales_offset += part_scales.bytes();
    }
    Ok(Concatenated { packed, scales })
}

/// The INT4 batch: the tokens' rows gathered in expert order, four launches over them, the weighted combine.
fn grouped(
    backend: &CudaBackend,
    x: &Tensor,
    inner: usize,
    group_size: usize,
    experts: &[&RoutedExpert],
    output: &mut Tensor,
) -> Result<(), CudaError> {
    let hidden = x.columns();
    let order: Vec<usize> = experts.iter().flat_map(|expert| expert.tokens.iter().map(|&(token, _)| token)).collect();
    let rows = order.len();
    let mut segment_start = Vec::with_capacity(experts.len() + 1);
    segment_start.push(0i32);
    let mut end = 0usize;
    for expert in experts {
        end += expert.tokens.len();
        segment_start.push(i32::try_from(end).map_err(|_| {
            unsupported("routed_experts", format!("{rows} routed rows do not fit a 32-bit kernel index"))
        })?);
    }
    let segment_expert: Vec<i32> = (0..experts.len() as i32).collect();

    let gate_weights = concatenate(backend, experts, |e| e.gate)?;
    let up_weights = concatenate(backend, experts, |e| e.up)?;
    let down_weights = concatenate(backend, experts, |e| e.down)?;
    let device = backend.device();
    let x_sorted = gather_rows(backend, x, &order)?;
    let mut pack = DecisionPack::default();
    let (expert_at, start_at) = (pack.push_i32(&segment_expert), pack.push_i32(&segment_start));
    let lists = pack.upload(backend)?;
    let segments = Segments { lists: &lists, expert_at, start_at, count: experts.len() };
    let gate = device.alloc_for::<f32>(rows * inner)?;
    let up = device.alloc_for::<f32>(rows * inner)?;
    let activated = device.alloc_for::<f32>(rows * inner)?;
    let down = alloc(device, rows, hidden)?;

    let projection = |weights: &Concatenated, in_features, out_features, input: &DeviceBuffer, y: &DeviceBuffer| {
        let shape = GroupedInt4 {
            packed: &weights.packed,
            scales: &weights.scales,
            group_size,
            experts: experts.len(),
            in_features,
            out_features,
        };
        w4a16_grouped(device, input, &shape, &segments, rows, y)
    };
    projection(&gate_weights, hidden, inner, buffer(&x_sorted)?, &gate)?;
    projection(&up_weights, hidden, inner, buffer(&x_sorted)?, &up)?;
    silu_mul_f32(device, &gate, &up, &activated, rows * inner)?;
    projection(&down_weights, inner, hidden, &activated, buffer(&down)?)?;
    combine(backend, output, &down, experts)
}

/// A dense f32 weight on the device: the cached copy (prefetched by the expert loader), or, for a matrix whose
/// cached copy is its packed INT4 form, its f32 values uploaded for this use.
enum DenseWeight {
    Cached(Arc<DeviceWeight>),
    Owned(DeviceBuffer),
}

impl DenseWeight {
    fn of(backend: &CudaBackend, matrix: &Matrix) -> Result<Self, CudaError> {
        if matrix.int4.is_none() {
            return Ok(DenseWeight::Cached(backend.weight(matrix)?));
        }
        Ok(DenseWeight::Owned(backend.device().upload(matrix.values())?))
    }

    /// `y = x · Wᵀ` on the f32, BF16 or BF16-pair product, as the weight is held.
    fn linear(
        &self,
        backend: &CudaBackend,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
        shape: LinearShape,
    ) -> Result<(), CudaError> {
        let (device, activations) = (backend.device(), backend.activations);
        match self {
            DenseWeight::Cached(weight) => match weight.as_ref() {
                DeviceWeight::Dense(w) => linear_f32(device, x, w, None, y, shape),
                DeviceWeight::Bf16(w) => dense_bf16(device, x, w, None, (y, shape), activations),
                DeviceWeight::Bf16Pair(w) => linear_bf16_pair(device, x, w, None, (y, shape), activations),
                DeviceWeight::Int4 { .. } => {
                    Err(unsupported("routed_experts", "a dense expert weight is cached packed"))
                }
            },
            DenseWeight::Owned(w) => linear_f32(device, x, w, None, y, shape),
        }
    }
}

/// One expert on its dense f32 weights: its rows gathered, gate, up, SiLU-gate and down chained on the device, the
/// weighted combine.
fn dense(
    backend: &CudaBackend,
    x: &Tensor,
    inner: usize,
    expert: &RoutedExpert,
    output: &mut Tensor,
) -> Result<(), CudaError> {
    let (rows, hidden) = (expert.tokens.len(), x.columns());
    let tokens: Vec<usize> = expert.tokens.iter().map(|&(token, _)| token).collect();
    let device = backend.device();
    let x_rows = gather_rows(backend, x, &tokens)?;
    let (gate_weight, up_weight, down_weight) = (
        DenseWeight::of(backend, expert.gate)?,
        DenseWeight::of(backend, expert.up)?,
        DenseWeight::of(backend, expert.down)?,
    );
    let gate = device.alloc_for::<f32>(rows * inner)?;
    let up = device.alloc_for::<f32>(rows * inner)?;
    let activated = device.alloc_for::<f32>(rows * inner)?;
    let down = alloc(device, rows, hidden)?;
    let x_rows = buffer(&x_rows)?;
    gate_weight.linear(backend, x_rows, &gate, LinearShape::new(rows, hidden, inner))?;
    up_weight.linear(backend, x_rows, &up, LinearShape::new(rows, hidden, inner))?;
    silu_mul_f32(device, &gate, &up, &activated, rows * inner)?;
    down_weight.linear(backend, &activated, buffer(&down)?, LinearShape::new(rows, inner, hidden))?;
    combine(backend, output, &down, &[expert])
}

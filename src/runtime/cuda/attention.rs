//! Causal prefill attention on the device: kernels/attention.cu.

use crate::runtime::backend::AttentionShape;
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape, Traffic};

use super::checks::buffers_hold;
use std::ops::Range;

use crate::runtime::tensor::Tensor;

use super::checks::unsupported;
use super::state::CudaBackend;
use super::tensor::{alloc, buffer, sequence_inputs};

/// Threads per block of `attention_causal`: 4 warps, one (query, head) pair each.
const THREADS: u32 = 128;
const PAIRS_PER_BLOCK: usize = 4;
/// Register tiles of the kernel: the q row and the output row spread over 32 lanes.
pub const MAX_QK_DIM: usize = 1024;
pub const MAX_V_DIM: usize = 512;

/// Checks what the kernel supports: grouping, head widths, the int range of its indices.
pub fn check_shape(shape: &AttentionShape) -> Result<(), CudaError> {
    let AttentionShape { tokens, heads, kv_heads, qk_dim, v_dim, .. } = *shape;
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(unsupported(
            "attention",
            format!("{heads} query heads cannot be grouped over {kv_heads} key/value heads"),
        ));
    }
    if qk_dim == 0 || qk_dim > MAX_QK_DIM || v_dim == 0 || v_dim > MAX_V_DIM {
        return Err(unsupported(
            "attention",
            format!("head widths qk {qk_dim} / v {v_dim}: the kernel supports 1..={MAX_QK_DIM} / 1..={MAX_V_DIM}"),
        ));
    }
    if tokens.saturating_mul(heads) > i32::MAX as usize {
        return Err(unsupported(
            "attention",
            format!("{tokens} tokens × {heads} heads exceed the kernel's 32-bit indices"),
        ));
    }
    Ok(())
}

/// Launches `attention_causal` on device-resident data: `q` `[tokens, heads, qk_dim]`, `k` `[tokens, kv_heads,
/// qk_dim]`, `v` `[tokens, kv_heads, v_dim]` f32, `allowed` u8 `[tokens, tokens]` (or none), `out` `[tokens, heads,
/// v_dim]` f32.
///
/// `q`, `k` and `v` start at row `first_row` of their buffers.
pub fn causal_on(
    device: &dyn Device,
    [q, k, v]: [&DeviceBuffer; 3],
    first_row: usize,
    allowed: Option<&DeviceBuffer>,
    out: &DeviceBuffer,
    shape: &AttentionShape,
) -> Result<(), CudaError> {
    check_shape(shape)?;
    let AttentionShape { tokens, heads, kv_heads, qk_dim, v_dim, scale } = *shape;
    let end = first_row + tokens;
    let sizes = [
        ("q", q.bytes(), end * heads * qk_dim * 4),
        ("k", k.bytes(), end * kv_heads * qk_dim * 4),
        ("v", v.bytes(), end * kv_heads * v_dim * 4),
        ("out", out.bytes(), tokens * heads * v_dim * 4),
        ("allowed", allowed.map_or(usize::MAX, DeviceBuffer::bytes), tokens * tokens),
    ];
    buffers_hold("attention", &sizes)?;
    if tokens == 0 {
        return Ok(());
    }
    let blocks = (tokens * heads).div_ceil(PAIRS_PER_BLOCK) as u32;
    device.launch(
        "attention_causal",
        LaunchShape::linear(blocks, THREADS),
        &[
            Arg::At(q, first_row * heads * qk_dim * 4),
            Arg::At(k, first_row * kv_heads * qk_dim * 4),
            Arg::At(v, first_row * kv_heads * v_dim * 4),
            allowed.map_or(Arg::Null, Arg::Buffer),
            Arg::Buffer(out),
            Arg::I32(tokens as i32),
            Arg::I32(heads as i32),
            Arg::I32(kv_heads as i32),
            Arg::I32(qk_dim as i32),
            Arg::I32(v_dim as i32),
            Arg::F32(scale),
        ],
    )
}

/// [`crate::runtime::Backend::attention`] on the device: the sequence in rows `rows`, optionally restricted by
/// `allowed` (uploaded as a decision).
pub fn causal(
    backend: &CudaBackend,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    rows: Range<usize>,
    shape: &AttentionShape,
    allowed: Option<&[bool]>,
) -> Result<Tensor, CudaError> {
    check_shape(shape)?;
    let AttentionShape { tokens, heads, kv_heads, qk_dim, v_dim, .. } = *shape;
    let widths = [("q", q, heads * qk_dim), ("k", k, kv_heads * qk_dim), ("v", v, kv_heads * v_dim)];
    sequence_inputs("attention", &widths, &rows, tokens)?;
    if let Some(mask) = allowed.filter(|mask| mask.len() != tokens * tokens) {
        return Err(unsupported(
            "attention",
            format!("the mask has {} cells, {tokens} tokens need {}", mask.len(), tokens * tokens),
        ));
    }
    let device = backend.device();
    let out = alloc(device, tokens, heads * v_dim)?;
    if tokens == 0 || heads == 0 || v_dim == 0 {
        return Ok(out);
    }
    let mask = match allowed {
        Some(mask) => {
            let mask: Vec<u8> = mask.iter().map(|&keep| u8::from(keep)).collect();
            Some(backend.counted().upload_as(Traffic::Decisions, &mask)?)
        }
        None => None,
    };
    causal_on(device, [buffer(q)?, buffer(k)?, buffer(v)?], rows.start, mask.as_ref(), buffer(&out)?, shape)?;
    Ok(out)
}

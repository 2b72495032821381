//! Causal prefill attention on the device: kernels/attention.cu.

use crate::runtime::backend::AttentionShape;
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape, Traffic};

use super::checks::buffers_hold;
use super::CudaBackend;

/// Threads per block of `attention_causal`: 4 warps, one (query, head) pair each.
const THREADS: u32 = 128;
const PAIRS_PER_BLOCK: usize = 4;
/// Register tiles of the kernel: the q row and the output row spread over 32 lanes.
pub const MAX_QK_DIM: usize = 1024;
pub const MAX_V_DIM: usize = 512;

fn unsupported(problem: String) -> CudaError {
    CudaError::Unsupported { tensor: "attention".into(), problem }
}

/// Checks what the kernel supports: grouping, head widths, the int range of its indices.
pub fn check_shape(shape: &AttentionShape) -> Result<(), CudaError> {
    let AttentionShape { tokens, heads, kv_heads, qk_dim, v_dim, .. } = *shape;
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(unsupported(format!("{heads} query heads cannot be grouped over {kv_heads} key/value heads")));
    }
    if qk_dim == 0 || qk_dim > MAX_QK_DIM || v_dim == 0 || v_dim > MAX_V_DIM {
        return Err(unsupported(format!(
            "head widths qk {qk_dim} / v {v_dim}: the kernel supports 1..={MAX_QK_DIM} / 1..={MAX_V_DIM}"
        )));
    }
    if tokens.saturating_mul(heads) > i32::MAX as usize {
        return Err(unsupported(format!("{tokens} tokens × {heads} heads exceed the kernel's 32-bit indices")));
    }
    Ok(())
}

/// Launches `attention_causal` on device-resident data: `q` `[tokens, heads, qk_dim]`, `k` `[tokens, kv_heads,
/// qk_dim]`, `v` `[tokens, kv_heads, v_dim]` f32, `allowed` u8 `[tokens, tokens]` (or none), `out` `[tokens, heads,
/// v_dim]` f32.
pub fn causal_on(
    device: &dyn Device,
    q: &DeviceBuffer,
    k: &DeviceBuffer,
    v: &DeviceBuffer,
    allowed: Option<&DeviceBuffer>,
    out: &DeviceBuffer,
    shape: &AttentionShape,
) -> Result<(), CudaError> {
    check_shape(shape)?;
    let AttentionShape { tokens, heads, kv_heads, qk_dim, v_dim, scale } = *shape;
    let sizes = [
        ("q", q.bytes(), tokens * heads * qk_dim * 4),
        ("k", k.bytes(), tokens * kv_heads * qk_dim * 4),
        ("v", v.bytes(), tokens * kv_heads * v_dim * 4),
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
            Arg::Buffer(q),
            Arg::Buffer(k),
            Arg::Buffer(v),
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

/// `Backend::attention`: causal softmax attention of one sequence, optionally restricted by `allowed`.
pub fn causal(
    backend: &CudaBackend,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: &AttentionShape,
    allowed: Option<&[bool]>,
) -> Result<Vec<f32>, CudaError> {
    check_shape(shape)?;
    let AttentionShape { tokens, heads, kv_heads, qk_dim, v_dim, .. } = *shape;
    let lengths = [
        ("q", q.len(), tokens * heads * qk_dim),
        ("k", k.len(), tokens * kv_heads * qk_dim),
        ("v", v.len(), tokens * kv_heads * v_dim),
        ("allowed", allowed.map_or(tokens * tokens, <[bool]>::len), tokens * tokens),
    ];
    for (name, have, need) in lengths {
        if have != need {
            return Err(unsupported(format!("{name} has {have} values, the shape needs {need}")));
        }
    }
    let count = tokens * heads * v_dim;
    if count == 0 {
        return Ok(Vec::new());
    }
    let device = backend.device();
    let q_buffer = device.upload(q)?;
    let k_buffer = device.upload(k)?;
    let v_buffer = device.upload(v)?;
    let mask = match allowed {
        Some(mask) => {
            let mask: Vec<u8> = mask.iter().map(|&keep| u8::from(keep)).collect();
            Some(backend.counted().upload_as(Traffic::Decisions, &mask)?)
        }
        None => None,
    };
    let out = device.alloc_for::<f32>(count)?;
    causal_on(device, &q_buffer, &k_buffer, &v_buffer, mask.as_ref(), &out, shape)?;
    device.download(&out, count)
}

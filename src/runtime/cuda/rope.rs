//! RoPE on the device: kernels/rope.cu.

use crate::runtime::backend::RopeStyle;
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

use super::CudaBackend;

/// Threads per block: 8 warps, one (token, head) each.
const THREADS: u32 = 256;
/// (token, head) items per block.
const HEADS_PER_BLOCK: usize = 8;
/// Largest rotary_dim: a lane holds at most 4 pairs of a head (kMaxPairsPerLane in kernels/rope.cu).
const MAX_ROTARY_DIM: usize = 2 * 32 * 4;

/// One RoPE problem: `tokens` rows of `row_width` values, heads of `head_dim`, rotating
/// `[offset, offset + rotary_dim)` of each head; token `t` uses row `t` of the `[positions, rotary_dim / 2]` tables.
#[derive(Debug, Clone, Copy)]
pub struct RopeShape {
    pub tokens: usize,
    pub row_width: usize,
    pub head_dim: usize,
    pub offset: usize,
    pub rotary_dim: usize,
    pub style: RopeStyle,
}

fn unsupported(problem: String) -> CudaError {
    CudaError::Unsupported { tensor: "rope".into(), problem }
}

impl RopeShape {
    /// Checks the shape; the values `data` and each table must hold.
    fn check(&self) -> Result<(usize, usize), CudaError> {
        let RopeShape { tokens, row_width, head_dim, offset, rotary_dim, .. } = *self;
        if head_dim == 0 || !row_width.is_multiple_of(head_dim) {
            return Err(unsupported(format!("row width {row_width} is not a whole number of heads of {head_dim}")));
        }
        if !rotary_dim.is_multiple_of(2) || rotary_dim > MAX_ROTARY_DIM {
            return Err(unsupported(format!("rotary dim {rotary_dim} must be even and at most {MAX_ROTARY_DIM}")));
        }
        if offset + rotary_dim > head_dim {
            return Err(unsupported(format!(
                "rotary slice {offset}..{} runs past the head dim {head_dim}",
                offset + rotary_dim
            )));
        }
        if i32::try_from(tokens * row_width).is_err() {
            return Err(unsupported(format!("{tokens} tokens × {row_width} values exceed 32-bit kernel indices")));
        }
        Ok((tokens * row_width, tokens * rotary_dim / 2))
    }
}

/// Device-level RoPE in place on `data[tokens, row_width]` with `cos`/`sin` tables of at least
/// `tokens · rotary_dim / 2` values.
pub fn rope_f32(
    device: &dyn Device,
    data: &DeviceBuffer,
    cos: &DeviceBuffer,
    sin: &DeviceBuffer,
    shape: &RopeShape,
) -> Result<(), CudaError> {
    let (values, table) = shape.check()?;
    if data.bytes() < values * 4 || cos.bytes() < table * 4 || sin.bytes() < table * 4 {
        return Err(unsupported(format!("a buffer is smaller than {values} values or tables of {table}")));
    }
    let items = shape.tokens * (shape.row_width / shape.head_dim);
    if items == 0 || shape.rotary_dim == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(items.div_ceil(HEADS_PER_BLOCK))
        .map_err(|_| unsupported(format!("{items} heads exceed the grid")))?;
    let style = match shape.style {
        RopeStyle::Interleaved => 0,
        RopeStyle::Half => 1,
    };
    // The check above bounds every number by tokens · row_width < 2^31.
    let args = [
        Arg::Buffer(data),
        Arg::Buffer(cos),
        Arg::Buffer(sin),
        Arg::I32(shape.tokens as i32),
        Arg::I32(shape.row_width as i32),
        Arg::I32(shape.head_dim as i32),
        Arg::I32(shape.offset as i32),
        Arg::I32(shape.rotary_dim as i32),
        Arg::I32(style),
    ];
    device.launch("rope_f32", LaunchShape::linear(blocks, THREADS), &args)
}

/// RoPE on the first `tokens` rows of `data`, in place (see [`crate::runtime::Backend::rope`]).
#[allow(clippy::too_many_arguments)]
pub fn apply(
    backend: &CudaBackend,
    data: &mut [f32],
    tokens: usize,
    row_width: usize,
    head_dim: usize,
    offset: usize,
    rotary_dim: usize,
    cos: &[f32],
    sin: &[f32],
    style: RopeStyle,
) -> Result<(), CudaError> {
    let shape = RopeShape { tokens, row_width, head_dim, offset, rotary_dim, style };
    let (values, table) = shape.check()?;
    if data.len() < values || cos.len() < table || sin.len() < table {
        return Err(unsupported(format!(
            "data has {} values (needs {values}), cos {} and sin {} (need {table})",
            data.len(),
            cos.len(),
            sin.len()
        )));
    }
    if values == 0 || rotary_dim == 0 {
        return Ok(());
    }
    let device = backend.device();
    let buffer = device.upload(&data[..values])?;
    let cos_buffer = device.upload(&cos[..table])?;
    let sin_buffer = device.upload(&sin[..table])?;
    rope_f32(device, &buffer, &cos_buffer, &sin_buffer, &shape)?;
    data[..values].copy_from_slice(&device.download(&buffer, values)?);
    Ok(())
}

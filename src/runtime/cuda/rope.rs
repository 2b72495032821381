//! RoPE on the device: kernels/rope.cu.

use crate::runtime::backend::{RopeCall, RopeStyle};
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

use crate::runtime::tensor::Tensor;

use super::checks::unsupported;
use super::state::CudaBackend;
use super::tensor::buffer;
use crate::runtime::device::DeviceWeight;

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

impl RopeShape {
    /// Checks the shape; the values `data` and each table must hold.
    fn check(&self) -> Result<(usize, usize), CudaError> {
        let RopeShape { tokens, row_width, head_dim, offset, rotary_dim, .. } = *self;
        if head_dim == 0 || !row_width.is_multiple_of(head_dim) {
            return Err(unsupported(
                "rope",
                format!("row width {row_width} is not a whole number of heads of {head_dim}"),
            ));
        }
        if !rotary_dim.is_multiple_of(2) || rotary_dim > MAX_ROTARY_DIM {
            return Err(unsupported(
                "rope",
                format!("rotary dim {rotary_dim} must be even and at most {MAX_ROTARY_DIM}"),
            ));
        }
        if offset + rotary_dim > head_dim {
            return Err(unsupported(
                "rope",
                format!("rotary slice {offset}..{} runs past the head dim {head_dim}", offset + rotary_dim),
            ));
        }
        if i32::try_from(tokens * row_width).is_err() {
            return Err(unsupported(
                "rope",
                format!("{tokens} tokens × {row_width} values exceed 32-bit kernel indices"),
            ));
        }
        Ok((tokens * row_width, tokens * rotary_dim / 2))
    }
}

/// Device-level RoPE in place on `data[tokens, row_width]` with `cos`/`sin` tables of at least
/// `tokens · rotary_dim / 2` values.
///
/// The rows start `data_offset` values into `data`, the tables' rows `table_offset` values into `cos`/`sin`.
pub fn rope_f32(
    device: &dyn Device,
    (data, data_offset): (&DeviceBuffer, usize),
    (cos, sin, table_offset): (&DeviceBuffer, &DeviceBuffer, usize),
    shape: &RopeShape,
) -> Result<(), CudaError> {
    let (values, table) = shape.check()?;
    let (values, table) = (data_offset + values, table_offset + table);
    if data.bytes() < values * 4 || cos.bytes() < table * 4 || sin.bytes() < table * 4 {
        return Err(unsupported("rope", format!("a buffer is smaller than {values} values or tables of {table}")));
    }
    let items = shape.tokens * (shape.row_width / shape.head_dim);
    if items == 0 || shape.rotary_dim == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(items.div_ceil(HEADS_PER_BLOCK))
        .map_err(|_| unsupported("rope", format!("{items} heads exceed the grid")))?;
    let style = match shape.style {
        RopeStyle::Interleaved => 0,
        RopeStyle::Half => 1,
    };
    // The check above bounds every number by tokens · row_width < 2^31.
    let args = [
        Arg::At(data, data_offset * 4),
        Arg::At(cos, table_offset * 4),
        Arg::At(sin, table_offset * 4),
        Arg::I32(shape.tokens as i32),
        Arg::I32(shape.row_width as i32),
        Arg::I32(shape.head_dim as i32),
        Arg::I32(shape.offset as i32),
        Arg::I32(shape.rotary_dim as i32),
        Arg::I32(style),
    ];
    device.launch("rope_f32", LaunchShape::linear(blocks, THREADS), &args)
}

/// [`crate::runtime::Backend::rope`] on the device: the rows `rows` of `x`, row `rows.start + t` at position
/// `first_position + t` of the table (kept resident like a weight).
pub fn apply(backend: &CudaBackend, x: &mut Tensor, call: &RopeCall<'_>) -> Result<(), CudaError> {
    let RopeCall { ref rows, first_position, head_dim, offset, rotary_dim, table, style } = *call;
    let row_width = x.columns();
    let shape = RopeShape { tokens: rows.len(), row_width, head_dim, offset, rotary_dim, style };
    let (_, needed) = shape.check()?;
    let half = table.cos.columns;
    if rows.end > x.rows() || (first_position + rows.len()) * half > table.cos.values().len() || rotary_dim / 2 > half {
        return Err(unsupported("rope", format!(
            "rows {rows:?} of {} at position {first_position} run past the tensor or the {}-position table (needs {needed})",
            x.rows(),
            table.positions
        )));
    }
    if rows.is_empty() || rotary_dim == 0 {
        return Ok(());
    }
    let (cos, sin) = (backend.weight(&table.cos)?, backend.weight(&table.sin)?);
    let (DeviceWeight::Dense(cos), DeviceWeight::Dense(sin)) = (cos.as_ref(), sin.as_ref()) else {
        return Err(unsupported("rope", "the RoPE table is not dense"));
    };
    rope_f32(backend.device(), (buffer(x)?, rows.start * row_width), (cos, sin, first_position * half), &shape)
}

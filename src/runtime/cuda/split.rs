//! The BF16 split of f32 values on the device (`W = W_hi + W_lo`), which the split-activation linear kernels and the
//! weight store's dequantized FP8 weights both use, and the single BF16 rounding of BF16 activations, with the
//! grid-stride launch shape and buffer check they need.

use super::checks::unsupported;
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

/// How the BF16 GEMMs of src/runtime/cuda/linear.rs (from `GEMM_MIN_ROWS` rows on) take their f32 activations.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Activations {
    /// `x = hi + lo`, both BF16 ([`split`]): 16 significant bits, within the CPU oracle's tolerance, at twice the
    /// GEMM's work. The runtime's commands use it: their logits, scales and tokens are compared with the CPU's.
    #[default]
    Split,
    /// `x` rounded to BF16 once (kernels/linear.cu `round_bf16`), as the engines compute: one GEMM, 2⁻⁹ relative
    /// per activation. `quantize --bf16-activations` runs its calibration pass on it (statistics over thousands of
    /// rows, as llm-compressor's BF16 forward gathers them); no command's default, since it moves results off the
    /// CPU's (0.7–1.6 % of a GPTQ pass's codes on the trained tiny models).
    Bf16,
}

/// Threads per block of the grid-stride kernels (split, join).
const THREADS: u32 = 256;
/// Grid-stride kernels (split, join) launch at most this many blocks.
const MAX_BLOCKS: usize = 1 << 16;

/// Fails unless `buffer` holds at least `count` elements of `element_bytes` bytes.
pub(super) fn holds(
    tensor: &str,
    what: &str,
    buffer: &DeviceBuffer,
    count: usize,
    element_bytes: usize,
) -> Result<(), CudaError> {
    let need = count.checked_mul(element_bytes).ok_or_else(|| unsupported(tensor, format!("{what} size overflows")))?;
    if buffer.bytes() < need {
        return Err(unsupported(tensor, format!("{what} buffer has {} bytes, needs {need}", buffer.bytes())));
    }
    Ok(())
}

/// A grid-stride launch over `count` elements.
pub(super) fn grid_stride(count: usize) -> LaunchShape {
    LaunchShape::linear(count.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32, THREADS)
}

/// `count` f32 values as BF16 halves (kernels/linear.cu `split_bf16`): u16 `[2, count]`, hi then lo.
pub fn split(device: &dyn Device, values: &DeviceBuffer, count: usize) -> Result<DeviceBuffer, CudaError> {
    to_bf16(device, ("split_bf16", 2), values, count)
}

/// `count` f32 values rounded to BF16 once (kernels/linear.cu `round_bf16`): u16 `[count]`.
pub fn round(device: &dyn Device, values: &DeviceBuffer, count: usize) -> Result<DeviceBuffer, CudaError> {
    to_bf16(device, ("round_bf16", 1), values, count)
}

/// Launches `kernel`, which writes `terms` BF16 values per f32 value, into a new buffer.
fn to_bf16(
    device: &dyn Device,
    (kernel, terms): (&str, usize),
    values: &DeviceBuffer,
    count: usize,
) -> Result<DeviceBuffer, CudaError> {
    holds(kernel, "values", values, count, 4)?;
    let out = device.alloc_for::<u16>((terms * count).max(1))?;
    device.launch(kernel, grid_stride(count), &[Arg::Buffer(values), Arg::Buffer(&out), Arg::I64(count as i64)])?;
    Ok(out)
}

//! Block-FP8 dequantization on the device (kernels/fp8_dequant.cu): the one launch of `fp8_block_dequant_f32` /
//! `_bf16`, shared by the runtime's FP8 weight uploads ([`super::weights`]) and the quantize command's device path
//! (`src/runtime/cuda/int4_quantize.rs`).

use super::checks::unsupported;
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

const THREADS: u32 = 256;
/// The kernel is grid-stride: at most this many blocks.
const MAX_BLOCKS: usize = 1 << 20;

/// One block-FP8 tensor (or a slice of its whole rows) on the device.
pub struct Fp8OnDevice<'a> {
    /// u8 e4m3 codes `[rows, columns]`, starting at row `first_row` of the tensor.
    pub codes: &'a DeviceBuffer,
    /// f32 multipliers of the whole tensor's block grid.
    pub scales: &'a DeviceBuffer,
    pub rows: usize,
    pub columns: usize,
    pub first_row: usize,
    /// `[block_rows, block_columns]`.
    pub block: [usize; 2],
}

/// Writes the tensor's values into `out`: f32 (`bf16` false) or BF16 bits, `[rows, columns]`.
pub fn dequantize(device: &dyn Device, tensor: &Fp8OnDevice, out: &DeviceBuffer, bf16: bool) -> Result<(), CudaError> {
    let elements = tensor.rows * tensor.columns;
    let need = elements * if bf16 { 2 } else { 4 };
    if out.bytes() < need || tensor.codes.bytes() < elements {
        return Err(unsupported(
            "fp8_block_dequant",
            format!("buffers of {} code and {} output bytes for {elements} values", tensor.codes.bytes(), out.bytes()),
        ));
    }
    let kernel = if bf16 { "fp8_block_dequant_bf16" } else { "fp8_block_dequant_f32" };
    let args = [
        Arg::Buffer(tensor.codes),
        Arg::Buffer(tensor.scales),
        Arg::Buffer(out),
        Arg::I64(tensor.rows as i64),
        Arg::I64(tensor.columns as i64),
        Arg::I64(tensor.first_row as i64),
        Arg::I32(tensor.block[0] as i32),
        Arg::I32(tensor.block[1] as i32),
    ];
    let blocks = elements.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32;
    device.launch(kernel, LaunchShape::linear(blocks, THREADS), &args)
}

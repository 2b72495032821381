//! FP4 dequantization on the device (kernels/fp4_dequant.cu): compressed-tensors NVFP4 and MXFP4 weights to f32,
//! bit-identical to [`crate::quant::fp4`]'s `nvfp4_dequantize_row` / `mxfp4_dequantize_row` (checked in the op
//! table, `src/opcheck/fp4_ops.rs`).

use super::checks::unsupported;
use crate::format::compressed_tensors::Fp4Kind;
use crate::quant::fp4::{MXFP4_GROUP, NVFP4_GROUP};
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

const THREADS: u32 = 256;
/// The kernels are grid-stride: at most this many blocks.
const MAX_BLOCKS: usize = 1 << 20;

/// One FP4 weight on the device: `packed` u8 `[rows, columns / 2]` (even element in the low nibble), `scales` u8
/// per group (NVFP4: e4m3 per 16, MXFP4: E8M0 per 32), and NVFP4's global scale (a divisor).
pub struct Fp4OnDevice<'a> {
    pub kind: Fp4Kind,
    pub packed: &'a DeviceBuffer,
    pub scales: &'a DeviceBuffer,
    /// NVFP4's `weight_global_scale` (ignored for MXFP4).
    pub global: f32,
    pub rows: usize,
    pub columns: usize,
}

/// Writes the weight's f32 values `[rows, columns]` into `out`.
pub fn dequantize(device: &dyn Device, weight: &Fp4OnDevice, out: &DeviceBuffer) -> Result<(), CudaError> {
    let (rows, columns) = (weight.rows, weight.columns);
    let (kernel, group) = match weight.kind {
        Fp4Kind::Nvfp4 => ("nvfp4_dequant_f32", NVFP4_GROUP),
        Fp4Kind::Mxfp4 => ("mxfp4_dequant_f32", MXFP4_GROUP),
    };
    if !columns.is_multiple_of(group) {
        return Err(unsupported(kernel, format!("{columns} columns are not a whole number of groups of {group}")));
    }
    let elements = rows * columns;
    let sizes = [("packed", weight.packed.bytes(), elements / 2), ("scales", weight.scales.bytes(), elements / group)];
    super::checks::buffers_hold(kernel, &[sizes[0], sizes[1], ("out", out.bytes(), elements * 4)])?;
    if elements == 0 {
        return Ok(());
    }
    let mut args = vec![Arg::Buffer(weight.packed), Arg::Buffer(weight.scales)];
    if weight.kind == Fp4Kind::Nvfp4 {
        args.push(Arg::F32(weight.global));
    }
    args.extend([Arg::Buffer(out), Arg::I64(rows as i64), Arg::I64(columns as i64)]);
    let blocks = elements.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32;
    device.launch(kernel, LaunchShape::linear(blocks, THREADS), &args)
}

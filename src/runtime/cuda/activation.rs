//! SiLU-gate on the device: kernels/activation.cu.

use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

use crate::runtime::tensor::Tensor;

use super::checks::unsupported;
use super::state::CudaBackend;
use super::tensor::{alloc, buffer};

/// Threads per block of the elementwise kernels.
const THREADS: u32 = 256;

/// `silu(gate) · up`, elementwise.
pub fn silu_mul(backend: &CudaBackend, gate: &Tensor, up: &Tensor) -> Result<Tensor, CudaError> {
    if gate.len() != up.len() {
        return Err(unsupported("silu_mul", format!("gate has {} values, up {}", gate.len(), up.len())));
    }
    let device = backend.device();
    let out = alloc(device, gate.rows(), gate.columns())?;
    silu_mul_f32(device, buffer(gate)?, buffer(up)?, buffer(&out)?, gate.len())?;
    Ok(out)
}

/// Device-level `out[i] = silu(gate[i]) · up[i]` for `count` f32 values.
pub fn silu_mul_f32(
    device: &dyn Device,
    gate: &DeviceBuffer,
    up: &DeviceBuffer,
    out: &DeviceBuffer,
    count: usize,
) -> Result<(), CudaError> {
    let need = count * 4;
    for (what, buffer) in [("gate", gate), ("up", up), ("out", out)] {
        if buffer.bytes() < need {
            return Err(unsupported(
                "silu_mul_f32",
                format!("{what} buffer has {} bytes, needs {need}", buffer.bytes()),
            ));
        }
    }
    if count == 0 {
        return Ok(());
    }
    let blocks = (count.div_ceil(THREADS as usize)).min(1 << 16) as u32;
    device.launch(
        "silu_mul_f32",
        LaunchShape::linear(blocks, THREADS),
        &[Arg::Buffer(gate), Arg::Buffer(up), Arg::Buffer(out), Arg::I64(count as i64)],
    )
}

//! SiLU-gate on the device: kernels/activation.cu.

use crate::cuda::device::LaunchShape;
use crate::cuda::CudaError;

use super::CudaBackend;

/// Threads per block of the elementwise kernels.
const THREADS: u32 = 256;

/// `silu(gate) · up`, elementwise.
pub fn silu_mul(backend: &CudaBackend, gate: &[f32], up: &[f32]) -> Result<Vec<f32>, CudaError> {
    use crate::cuda::device::Arg;
    if gate.len() != up.len() {
        return Err(CudaError::Unsupported {
            tensor: "silu_mul".into(),
            problem: format!("gate has {} values, up {}", gate.len(), up.len()),
        });
    }
    let device = backend.device();
    let count = gate.len();
    let gate_buffer = device.upload(gate)?;
    let up_buffer = device.upload(up)?;
    let out = device.alloc_for::<f32>(count)?;
    let blocks = (count.div_ceil(THREADS as usize)).min(1 << 16) as u32;
    device.launch(
        "silu_mul_f32",
        LaunchShape::linear(blocks, THREADS),
        &[Arg::Buffer(&gate_buffer), Arg::Buffer(&up_buffer), Arg::Buffer(&out), Arg::I64(count as i64)],
    )?;
    device.download(&out, count)
}

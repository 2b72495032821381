//! RoPE on the device: kernels/rope.cu.
use crate::cuda::CudaError;
use crate::runtime::backend::RopeStyle;

use super::CudaBackend;

#[allow(clippy::too_many_arguments)]
pub fn apply(
    _backend: &CudaBackend,
    _data: &mut [f32],
    _tokens: usize,
    _row_width: usize,
    _head_dim: usize,
    _offset: usize,
    _rotary_dim: usize,
    _cos: &[f32],
    _sin: &[f32],
    _style: RopeStyle,
) -> Result<(), CudaError> {
    Err(CudaError::Unsupported { tensor: "rope".into(), problem: "not written yet".into() })
}

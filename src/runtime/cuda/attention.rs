//! Causal prefill attention on the device: kernels/attention.cu.
use crate::cuda::CudaError;
use crate::runtime::backend::AttentionShape;

use super::CudaBackend;

pub fn causal(
    _backend: &CudaBackend,
    _q: &[f32],
    _k: &[f32],
    _v: &[f32],
    _shape: &AttentionShape,
    _allowed: Option<&[bool]>,
) -> Result<Vec<f32>, CudaError> {
    Err(CudaError::Unsupported { tensor: "attention".into(), problem: "not written yet".into() })
}

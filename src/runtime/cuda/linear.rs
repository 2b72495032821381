//! Linear layers on the device: dense f32 (kernels/linear.cu) and INT4 W4A16 (kernels/w4a16.cu).
use crate::cuda::CudaError;
use crate::runtime::backend::Matrix;

use super::CudaBackend;

pub fn linear(
    _backend: &CudaBackend,
    _input: &[f32],
    _rows: usize,
    _weight: &Matrix,
    _bias: Option<&[f32]>,
) -> Result<Vec<f32>, CudaError> {
    Err(CudaError::Unsupported { tensor: "linear".into(), problem: "not written yet".into() })
}

//! Launch-wrapper checks shared by the kernel families: device buffers large enough for a launch's shape.

use crate::runtime::device::CudaError;

/// Fails, naming `op` and the buffer, unless each `(buffer name, bytes it holds, bytes the shape needs)` holds enough.
pub(crate) fn buffers_hold(op: &str, sizes: &[(&str, usize, usize)]) -> Result<(), CudaError> {
    match sizes.iter().find(|(_, have, need)| have < need) {
        Some((name, have, need)) => Err(CudaError::Unsupported {
            tensor: op.into(),
            problem: format!("the {name} buffer holds {have} bytes, the shape needs {need}"),
        }),
        None => Ok(()),
    }
}

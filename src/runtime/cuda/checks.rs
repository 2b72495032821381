//! Launch-wrapper checks shared by the kernel families: the one "unsupported" error, device buffers large enough for
//! a launch's shape.

use crate::runtime::device::CudaError;

/// What the device backend cannot run: `op` (the op or tensor) and why, with the remedy where there is one.
pub(crate) fn unsupported(op: &str, problem: impl Into<String>) -> CudaError {
    CudaError::Unsupported { tensor: op.into(), problem: problem.into() }
}

/// Fails, naming `op` and the buffer, unless each `(buffer name, bytes it holds, bytes the shape needs)` holds enough.
pub(crate) fn buffers_hold(op: &str, sizes: &[(&str, usize, usize)]) -> Result<(), CudaError> {
    match sizes.iter().find(|(_, have, need)| have < need) {
        Some((name, have, need)) => {
            Err(unsupported(op, format!("the {name} buffer holds {have} bytes, the shape needs {need}")))
        }
        None => Ok(()),
    }
}

//! What loading fails with, as the runtime's callers see it: the io floor's error (the file, tensor and problem)
//! carried whole in [`RuntimeError::Load`], so that the runtime itself names no loader type.

use std::path::PathBuf;

use crate::io::IoError;
use crate::runtime::RuntimeError;

impl From<IoError> for RuntimeError {
    fn from(error: IoError) -> Self {
        RuntimeError::Load(Box::new(error))
    }
}

/// A tensor of the checkpoint at `path` that cannot be loaded as it is stored.
pub fn tensor_error(path: impl Into<PathBuf>, tensor: impl Into<String>, problem: impl Into<String>) -> RuntimeError {
    IoError::tensor(path, tensor, problem).into()
}

//! Errors of the checkpoint layer: each names the file and, where there is one, the tensor, and says what to do.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The I/O error is part of the message, not a `source()`: a chain printer (`{:#}`) would say it twice.
    #[error("{}: {error}", path.display())]
    File { path: PathBuf, error: std::io::Error },
    #[error("{}: invalid safetensors header: {reason}; the file is corrupt or truncated, download it again", path.display())]
    Header { path: PathBuf, reason: String },
    #[error("{}: tensor `{tensor}`: {problem}", path.display())]
    Tensor { path: PathBuf, tensor: String, problem: String },
    #[error("{}: {problem}", path.display())]
    Folder { path: PathBuf, problem: String },
}

impl IoError {
    pub fn file(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        IoError::File { path: path.into(), error }
    }

    pub fn tensor(path: impl Into<PathBuf>, tensor: impl Into<String>, problem: impl Into<String>) -> Self {
        IoError::Tensor { path: path.into(), tensor: tensor.into(), problem: problem.into() }
    }

    pub fn folder(path: impl Into<PathBuf>, problem: impl Into<String>) -> Self {
        IoError::Folder { path: path.into(), problem: problem.into() }
    }
}

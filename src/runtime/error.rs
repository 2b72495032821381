//! What a runtime op or a run on the runtime fails with.

use super::kv_cache::PoolError;

/// Errors of the runtime: each names the file and tensor or the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// What the runtime was given could not be read (the loader's error, [`crate::load::error`]: the file, tensor
    /// and problem), kept whole: the runtime sees bytes and shapes, not files.
    #[error(transparent)]
    Load(Box<dyn std::error::Error + Send + Sync>),
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Output(String),
    #[error("the device failed: {0}; rerun with --device cpu")]
    Device(String),
    /// The pool's error is part of the message, not a `source()`: `{:#}` would print it twice.
    #[error("kv cache: {0}")]
    Kv(PoolError),
}

impl From<PoolError> for RuntimeError {
    fn from(error: PoolError) -> Self {
        RuntimeError::Kv(error)
    }
}

//! What a job that runs a model over token chunks fails with: `eval` (perplexity, parity, MTP drafts,
//! `merge-eval`) and `calibrate-kv` (and `merge-calib`) share it.

use crate::chunks::ChunkError;
use crate::runtime::RuntimeError;

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Chunks(#[from] ChunkError),
    #[error(transparent)]
    Io(#[from] crate::io::IoError),
    #[error("{0}")]
    Input(String),
}

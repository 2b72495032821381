//! The reference runtime's machinery, knowing no architecture and no model folder: one op surface ([`Backend`]) on
//! backend-owned tensors ([`Tensor`]) with a CPU backend (rayon, f32, the oracle) and a CUDA backend ([`cuda`], on
//! a GPU or the emulated device, its tensors in device memory), weight matrices ([`Matrix`]), the paged KV pool and
//! RoPE tables. Model folders are opened, their weights read as matrices and streamed one decoder layer at a time in
//! [`crate::load`]; the architectures that run on it are in [`crate::arch`].

pub mod allocator;
pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod kv_cache;
pub mod matrix;
pub mod rope_table;
pub mod tensor;

use std::path::PathBuf;

pub use backend::{AttentionShape, Backend, RopeStyle};
pub use cpu::Cpu;
pub use matrix::Matrix;
pub use tensor::{Block, Tensor};

use crate::io::IoError;

/// Errors of the runtime: each names the file and tensor or the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Output(String),
    #[error("the device failed: {0}; rerun with --device cpu")]
    Device(String),
    /// The pool's error is part of the message, not a `source()`: `{:#}` would print it twice.
    #[error("kv cache: {0}")]
    Kv(kv_cache::PoolError),
}

impl From<kv_cache::PoolError> for RuntimeError {
    fn from(error: kv_cache::PoolError) -> Self {
        RuntimeError::Kv(error)
    }
}

impl RuntimeError {
    pub fn tensor(path: impl Into<PathBuf>, tensor: impl Into<String>, problem: impl Into<String>) -> Self {
        RuntimeError::Io(IoError::tensor(path, tensor, problem))
    }
}

/// Token positions of each sequence inside the flat `[tokens, width]` activations of a batch.
#[derive(Debug, Clone)]
pub struct Spans {
    pub starts: Vec<usize>,
    pub lengths: Vec<usize>,
}

impl Spans {
    pub fn new(lengths: &[usize]) -> Self {
        let mut starts = Vec::with_capacity(lengths.len());
        let mut next = 0;
        for length in lengths {
            starts.push(next);
            next += length;
        }
        Self { starts, lengths: lengths.to_vec() }
    }

    pub fn total(&self) -> usize {
        self.lengths.iter().sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.starts.iter().copied().zip(self.lengths.iter().copied())
    }
}

//! The reference runtime: one op surface ([`Backend`]) with a CPU backend (rayon, f32, the oracle) and a CUDA
//! backend ([`cuda`], on a GPU or the emulated device), and a layer-streamed
//! forward pass of `DeepseekV3ForCausalLM` (Kimi K2), `GlmMoeDsaForCausalLM` (GLM-5) and `Glm4MoeForCausalLM`
//! (GLM-4.5) that matches HF transformers' float32 logits.
//!
//! # Layer-streamed execution and memory
//! Weights are read one decoder layer at a time (mmap → dequantize to f32), every sequence of the batch advances
//! through that layer, then the layer is dropped; a loader thread ([`layer_stream`]) reads — and on a device
//! uploads — layer `i + 1` while layer `i` computes. Routed experts are streamed further: the experts hit by some token
//! are read in batches of at most `EXPERT_BATCH_BYTES` (2 GiB, ~10 Kimi K2 experts; at least one expert), a loader
//! thread reading batch `b + 1` while the backend applies batch `b` ([`Backend::routed_experts`]: grouped W4A16 on
//! the device for INT4 checkpoints), and each batch is dropped after use. Peak memory is
//!
//! ```text
//! peak ≈ two layers' dequantized f32 weights without routed experts      (attention + router + shared/dense MLP;
//!                                                                          the one computing and the one loaded ahead)
//!      + 2 × one batch of routed experts: ≤ 2 × max(2 GiB, one expert)    (expert ≤ 3 · moe_intermediate · hidden · 5 B:
//!                                                                          f32 + packed INT4 + scales)
//!      + activations: tokens × hidden × 4 B × ~6  (+ MLA keys/values tokens × heads × (qk+v) × 4 B)
//!      + logits of one sequence: ctx × vocab × 4 B  (+ lm_head in f32: vocab × hidden × 4 B)
//! ```
//! where `tokens = sequences × ctx`, independent of the number of layers, so a 705 GiB model runs in the memory of
//! one layer. The checkpoint itself stays memory-mapped (page cache, not process memory).

pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod decode;
pub mod device;
#[cfg(test)]
mod golden;
mod gqa;
mod indexer;
pub mod kv_cache;
mod layer;
pub mod layer_stream;
mod mla;
pub mod model;
mod moe;
pub mod rope_table;
pub mod validate;
pub mod weights;

use std::path::PathBuf;

pub use backend::{AttentionShape, Backend, Matrix, RopeStyle};
pub use cpu::Cpu;
pub use model::{ForwardStats, Model};

use crate::io::IoError;
use crate::model::ConfigError;

/// Errors of the runtime: each names the file and tensor or the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Output(String),
    #[error("the device failed: {0}; rerun with --device cpu")]
    Device(String),
}

impl RuntimeError {
    /// The backend's first failure as an error (device backends keep going with NaNs after one).
    pub fn check(backend: &dyn Backend) -> Result<(), RuntimeError> {
        backend.failure().map_or(Ok(()), |failure| Err(RuntimeError::Device(failure)))
    }

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

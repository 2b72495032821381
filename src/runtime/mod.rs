//! The reference runtime's machinery, knowing no architecture and no model folder: one op surface ([`Backend`]) on
//! backend-owned tensors ([`Tensor`]) with a CPU backend (rayon, f32, the oracle) and a CUDA backend ([`cuda`], on
//! a GPU or the emulated device, its tensors in device memory), weight matrices ([`Matrix`]), the paged KV pool and
//! RoPE tables. Model folders are opened, their weights read as matrices and streamed one decoder layer at a time in
//! [`crate::load`]; the architectures that run on it are in [`crate::arch`].

pub mod allocator;
pub mod backend;
pub mod compressed_cache;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod error;
pub mod host;
pub mod kda;
pub mod kv_cache;
pub mod matrix;
pub mod open_backend;
pub mod rope_table;
pub mod spans;
pub mod tensor;
pub use backend::{AttentionShape, Backend, RopeStyle};
pub use cpu::Cpu;
pub use error::RuntimeError;
pub use matrix::Matrix;
pub use spans::Spans;
pub use tensor::{Block, Tensor};

//! Checkpoint files: validated, memory-mapped safetensors shards; model folders; the streaming shard writer;
//! atomic small-file writes; the conversion manifest; Hugging Face repo ids resolved in the local hub cache.

pub mod atomic;
pub mod card_record;
pub mod checkpoint;
pub mod composite;
pub mod direct_file;
pub mod dtype;
pub mod error;
pub mod hub;
pub mod interrupt;
pub mod journal;
pub mod lock;
pub mod manifest;
pub mod shard;
pub mod stats_file;
pub mod writer;

pub use checkpoint::Checkpoint;
pub use dtype::Dtype;
pub use error::IoError;
pub use shard::{MappedBytes, ShardFile, TensorRef};

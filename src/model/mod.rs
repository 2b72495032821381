//! Model knowledge: `config.json` parsing, the tensors each architecture has, checkpoints checked against them,
//! and tensor classes.

pub mod arch;
pub mod config;
pub mod tensor_class;
pub mod tokenizer;
pub mod validate;

pub use arch::{tensor_specs, TensorRole, TensorSpec};
pub use config::{Architecture, Attention, ConfigError, ModelConfig};
pub use tensor_class::TensorClass;

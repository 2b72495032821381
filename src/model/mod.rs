//! Model knowledge: `config.json` parsing, the tensors each architecture has, and tensor classes.

pub mod arch;
pub mod config;
pub mod tensor_class;
pub mod tokenizer;

pub use arch::{tensor_specs, TensorRole, TensorSpec};
pub use config::{Architecture, Attention, ConfigError, ModelConfig};
pub use tensor_class::TensorClass;

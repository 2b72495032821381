//! Model knowledge: `config.json` parsing, the tensors each architecture has, checkpoints checked against them,
//! tensor classes, and the built-in presets (public `config.json`s for `report`).

pub mod config;
pub mod presets;
pub mod tensor_class;
pub mod tensors;
pub mod tokenizer;
pub mod validate;

pub use config::{Architecture, Attention, ConfigError, ModelConfig};
pub use tensor_class::TensorClass;
pub use tensors::{tensor_specs, TensorRole, TensorSpec};

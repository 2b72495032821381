//! Model knowledge: `config.json` parsing, the tensors each architecture has, tensor classes, and the built-in presets (public `config.json`s for `report`).

pub mod config;
pub mod deepseek_v4;
pub mod kimi_linear;
pub mod layout;
pub mod presets;
pub mod tensor_class;
pub mod tensors;
pub mod tokenizer;

pub use config::{Architecture, Attention, ConfigError, ModelConfig};
pub use tensor_class::TensorClass;
pub use tensors::{tensor_specs, TensorRole, TensorSpec};

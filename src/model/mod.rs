//! Model knowledge: `config.json` parsing, the tensors each architecture has, tensor classes, and the built-in presets (public `config.json`s for `report`).

pub mod config;
pub mod config_error;
pub mod deepseek_v4;
pub mod glm5_next;
pub mod hybrid;
pub mod keys;
pub mod kimi_linear;
pub mod parse;
pub mod part_keys;
pub mod presets;
pub mod tensor_class;
pub mod tensor_spec;
pub mod tensors;
pub mod tokenizer;

pub use config::{Architecture, Attention, ModelConfig};
pub use config_error::ConfigError;
pub use tensor_class::TensorClass;
pub use tensor_spec::{TensorRole, TensorSpec};
pub use tensors::tensor_specs;

//! `squeeze quantize`: source tensors → plan (recipe applied, shards laid out) → streamed execution → output
//! folder with config, index, companions and manifest.

pub mod activation_pass;
pub mod calibrate;
pub mod calibrated;
pub mod engine_check;
pub mod execute;
pub mod gptq_algebra;
pub mod gptq_pass;
pub mod imatrix_pass;
pub mod merge;
pub mod options;
pub mod output_files;
pub mod output_folder;
pub mod parts;
pub mod quant_config;

pub use execute::{quantize, QuantizeReport};
pub use options::{ConvertError, QuantizeOptions};

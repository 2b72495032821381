//! squeeze: FP8 mixture-of-experts checkpoints (Kimi K2, GLM-5, GLM-4.5) to INT4 compressed-tensors, with
//! checkpoint inspection, verification, synthetic models and serving budgets.
//!
//! Data flow: `io` (read/write checkpoints) → `quant` (math) → `recipe` (what gets which scheme) → `model`
//! (configs, architectures) → `format` (on-disk conventions: FP8 blocks, compressed-tensors, KV scales) → `lint`
//! (engine load rules) → jobs (`convert`, `inspect`, `verify`, `synth`, `report`) → `cli`.

pub mod arch;
pub mod calib;
pub mod chunks;
pub mod cli;
pub mod convert;
pub mod demo_model;
pub mod engines;
pub mod eval;
pub mod format;
pub mod inspect;
pub mod io;
pub mod lint;
pub mod metrics;
pub mod model;
pub mod opcheck;
pub mod progress;
pub mod quant;
pub mod recipe;
pub mod report;
pub mod rng;
pub mod runtime;
pub mod serve;
pub mod synth;
pub mod units;
pub mod verify;

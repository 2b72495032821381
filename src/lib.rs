//! squeeze: FP8 mixture-of-experts checkpoints (Kimi K2, GLM-5, GLM-4.5) to INT4 compressed-tensors, with
//! checkpoint inspection, verification, synthetic models and serving budgets.
//!
//! Data flow: `io` (read/write checkpoints) → `quant` (math) → `model` (configs) → `format` (on-disk conventions:
//! FP8 blocks, compressed-tensors, KV scales) → `recipe` (what gets which scheme) → `engines` (vLLM/SGLang: what
//! they do with KV-cache scales, their load rules in `engines::lint`) → `runtime` (op surface, backends, devices,
//! matrices, KV pool) → `load` (model folders opened for the runtime, weights read, layers streamed) → `arch` (the
//! three architectures on it) → `plan` (a conversion planned: items, actions, the per-item transform, calibration
//! results) → `card` (the model card every output folder carries) → jobs (`convert`, `eval`, `calib`, `serve`,
//! `inspect`, `verify`, `synth`, `report`; `squeeze card` is `card::refresh`) → `cli`. A job imports the floors
//! below it, never another job; what two jobs share lives a floor down (`plan`, `card`, and `parity`: the parity
//! modes and gates `eval` measures and the card shows).

pub mod arch;
pub mod calib;
pub mod card;
pub mod chunks;
pub mod cli;
pub mod convert;
pub mod demo_model;
pub mod engines;
pub mod eval;
pub mod format;
pub mod hex;
pub mod inspect;
pub mod io;
pub mod job_error;
pub mod load;
pub mod metrics;
pub mod model;
pub mod opcheck;
pub mod parity;
pub mod part;
pub mod plan;
pub mod progress;
pub mod quant;
pub mod recipe;
pub mod report;
pub mod rng;
pub mod runtime;
pub mod serve;
pub mod simd;
pub mod synth;
pub mod units;
pub mod verify;

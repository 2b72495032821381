//! What `quantize` is asked ([`QuantizeOptions`]) and what it fails with ([`ConvertError`]).

use std::path::PathBuf;

use crate::engines::EngineChoice;
use crate::io::IoError;
use crate::plan::calibration::{CalibrationError, CalibrationOptions};
use crate::plan::prepare::PrepareError;
use crate::quant::ScaleRule;
use crate::recipe::RecipeError;
use crate::runtime::device::{CudaError, DeviceChoice};

use super::parts::Part;

#[derive(Debug, Clone)]
pub struct QuantizeOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Built-in recipe name or TOML path; `None` picks the architecture's default.
    pub recipe: Option<String>,
    pub group_size: Option<usize>,
    pub scale_rule: Option<ScaleRule>,
    pub max_shard_bytes: u64,
    pub resume: bool,
    pub force: bool,
    pub dry_run: bool,
    /// Where INT4 quantization runs (`auto`: the GPU when usable, else the CPU with a notice).
    pub device: DeviceChoice,
    /// Carry NaN/infinite source elements into the output instead of refusing.
    pub allow_nonfinite: bool,
    /// Cast the MXFP4 groups NVFP4 cannot hold exactly by the stated rule instead of refusing them.
    pub allow_inexact_cast: bool,
    /// Whose load rules the plan must pass before anything is written (`none`: skip them).
    pub engine: EngineChoice,
    /// Tensor-parallel size for the rules; `None`: `lint::default_tp` of the model.
    pub tp: Option<usize>,
    /// `--method imatrix|gptq`: the calibration pass (`None`: round to nearest, `--method rtn`).
    pub calibration: Option<CalibrationOptions>,
    /// `--part I/N`: write only part I's shards and its part manifest, for `squeeze merge`.
    pub part: Option<Part>,
    /// `--base-model ORG/NAME`: the model card's `base_model` (`None`: guessed, [`crate::card::facts::base_model`]).
    pub base_model: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Io(#[from] IoError),
    /// Opening and planning the source ([`crate::plan::prepare`]).
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    #[error("{}: {problem}", path.display())]
    Output { path: PathBuf, problem: String },
    #[error("--device")]
    Device(#[from] CudaError),
    /// An engine load rule failed on the plan (the message names each rule and its remedy).
    #[error("{0}")]
    EngineRules(String),
    #[error(transparent)]
    Calibration(#[from] CalibrationError),
}

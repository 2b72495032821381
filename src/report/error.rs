//! What can go wrong in `squeeze report`, each message naming the input and the remedy.

use std::path::PathBuf;

use super::budget::LayoutError;
use crate::io::IoError;
use crate::model::ConfigError;
use crate::plan::prepare::PrepareError;
use crate::plan::PlanError;
use crate::recipe::RecipeError;

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("`{name}` is not a model folder, a config.json file or a preset; known presets: {presets}")]
    UnknownModel { name: String, presets: String },
    #[error("{}: has neither config.json nor safetensors weights; point at a model folder, its config.json or a preset", path.display())]
    EmptyFolder { path: PathBuf },
    #[error("{}: has weights but no config.json; report needs the config for the KV cache and classes", path.display())]
    NoConfig { path: PathBuf },
    #[error("preset `{name}` is corrupt: {problem}")]
    Preset { name: String, problem: String },
    /// The config's problem is part of the message, not a `source()`: `{:#}` would print it twice.
    #[error("{origin}: {error}")]
    Config { origin: String, error: ConfigError },
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("{0}")]
    DoesNotFit(String),
    /// `--group-size` on a folder that is already INT4: no conversion, so no other group (quantize's refusal).
    #[error("--group-size {group}: {error}")]
    GroupSizeOnInt4 { group: usize, error: PrepareError },
    /// A quantized module whose tensors disagree: the folder cannot be loaded, so its sizes and budget say nothing.
    #[error(
        "{}: malformed checkpoint: {}{}; it cannot be loaded as it is: check it with `squeeze verify {}` and rewrite it",
        path.display(),
        problems.first().map_or("", String::as_str),
        if problems.len() > 1 { format!("; and {} more malformed module(s)", problems.len() - 1) } else { String::new() },
        path.display()
    )]
    Malformed { path: PathBuf, problems: Vec<String> },
}

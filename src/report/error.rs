//! What can go wrong in `squeeze report`, each message naming the input and the remedy.

use std::path::PathBuf;

use super::budget::LayoutError;
use crate::convert::execute::ConvertError;
use crate::convert::PlanError;
use crate::io::IoError;
use crate::model::ConfigError;
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
    #[error("{origin}: {source}")]
    Config { origin: String, source: ConfigError },
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Convert(#[from] ConvertError),
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("{0}")]
    DoesNotFit(String),
}

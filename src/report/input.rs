//! Resolving the MODEL argument: a model folder with weights, a folder with only `config.json`, a `config.json`
//! file, or a preset name.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::ReportError;
use crate::io::checkpoint::{read_json, CONFIG_FILE, INDEX_FILE, SINGLE_FILE};
use crate::model::presets;

/// Where the report's numbers come from.
#[derive(Debug, Clone)]
pub enum Input {
    /// A folder with safetensors weights: sizes are counted from its files.
    Weights(PathBuf),
    /// A parsed `config.json` (from a file, a folder without weights, or a preset): sizes are computed.
    Config { origin: Origin, json: Value },
}

/// Where a config came from, for messages and the report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
pub enum Origin {
    Preset(String),
    File(PathBuf),
}

impl Origin {
    /// How errors name the config.
    pub fn describe(&self) -> String {
        match self {
            Origin::Preset(name) => format!("preset `{name}`"),
            Origin::File(path) => path.display().to_string(),
        }
    }
}

/// Whether a folder holds safetensors weights (an index or a single file).
pub fn has_weights(dir: &Path) -> bool {
    dir.join(INDEX_FILE).is_file() || dir.join(SINGLE_FILE).is_file()
}

/// Resolves MODEL: an existing path wins over a preset of the same name.
pub fn resolve(model: &str) -> Result<Input, ReportError> {
    let path = Path::new(model);
    if path.is_dir() {
        if has_weights(path) {
            return Ok(Input::Weights(path.to_path_buf()));
        }
        let config = path.join(CONFIG_FILE);
        if !config.is_file() {
            return Err(ReportError::EmptyFolder { path: path.to_path_buf() });
        }
        return Ok(Input::Config { json: read_json(&config)?, origin: Origin::File(config) });
    }
    if path.is_file() {
        return Ok(Input::Config { json: read_json(path)?, origin: Origin::File(path.to_path_buf()) });
    }
    match presets::config_text(model) {
        Some(text) => {
            let json = serde_json::from_str(text)
                .map_err(|e| ReportError::Preset { name: model.into(), problem: e.to_string() })?;
            Ok(Input::Config { json, origin: Origin::Preset(model.into()) })
        }
        None => Err(ReportError::UnknownModel { name: model.into(), presets: presets::names().join(", ") }),
    }
}

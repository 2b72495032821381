//! A model folder opened for the runtime: the checkpoint mapped, its `config.json` parsed, and both checked
//! before any layer is read (no unfinished folder edit, a router the runtime implements, tensors that match).

use std::path::Path;

use crate::io::checkpoint::CONFIG_FILE;
use crate::io::Checkpoint;
use crate::model::ModelConfig;
use crate::runtime::RuntimeError;

/// Opens a model folder for the runtime: the validated checkpoint and its config, refusing routers it does not run.
pub fn open_checkpoint(dir: &Path) -> Result<(Checkpoint, ModelConfig), RuntimeError> {
    if let Some(problem) = crate::io::journal::pending(dir) {
        return Err(RuntimeError::Input(problem));
    }
    let checkpoint = Checkpoint::open(dir)?;
    let json = checkpoint.config().ok_or_else(|| {
        RuntimeError::Input(format!("{}: has no config.json; the runtime needs the model's config", dir.display()))
    })?;
    // The config's problem as the error, word for word (the runtime's errors name no model type).
    let config = ModelConfig::from_json(json)
        .map_err(|error| RuntimeError::Input(format!("{}: {error}", dir.join(CONFIG_FILE).display())))?;
    if let Some(gap) = config.runtime_gap() {
        return Err(RuntimeError::Input(format!(
            "{}: {} ({}) is read, converted, verified and sized by squeeze (quantize, inspect, verify, report), but \
             the reference runtime does not run its layers yet ({gap}), so eval, calibrate-kv and serve-test cannot \
             measure it; check a conversion with `squeeze verify OUT --source {}` instead",
            dir.display(),
            config.architecture.name(),
            config.model_type,
            dir.display()
        )));
    }
    let scoring = if config.deepseek_v4().is_some() { "sqrtsoftplus" } else { "sigmoid" };
    if config.routing.scoring_func != scoring {
        return Err(RuntimeError::Input(format!(
            "config.json: scoring_func {:?} is not supported; the runtime implements the sigmoid router of \
             DeepSeek-V3/Kimi K2/GLM and DeepSeek-V4's sqrtsoftplus one ({scoring:?} for {})",
            config.routing.scoring_func,
            config.architecture.name()
        )));
    }
    if let Some(problem) = crate::load::validate::describe(&checkpoint, &config) {
        return Err(RuntimeError::Input(problem));
    }
    Ok((checkpoint, config))
}

/// Refuses a model whose KV caches KV calibration does not model yet ([`ModelConfig::kv_cache_gap`]); `command`
/// names the refusing subcommand.
pub fn check_kv_cache(dir: &Path, config: &ModelConfig, command: &str) -> Result<(), RuntimeError> {
    match config.kv_cache_gap() {
        Some(gap) => Err(RuntimeError::Input(format!(
            "{}: {command} cannot run {} yet: {gap}; `squeeze eval` (perplexity, and parity with --reference/--candidate) \
             and `squeeze serve-test` run it",
            dir.display(),
            config.architecture.name()
        ))),
        None => Ok(()),
    }
}

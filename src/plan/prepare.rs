//! A source opened, validated and planned: what `quantize` runs and `report` sizes.

use std::path::{Path, PathBuf};

use crate::format::vendor_source::{self, SourceKind};
use crate::io::checkpoint::CONFIG_FILE;
use crate::io::{Checkpoint, IoError};
use crate::model::{Architecture, ConfigError, ModelConfig};
use crate::quant::ScaleRule;
use crate::recipe::{Recipe, RecipeError};

use super::{Plan, PlanError, PlannedItem};

/// What opening and planning a source can fail with (`convert::ConvertError::Prepare` in a conversion).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Recipe(#[from] RecipeError),
    /// `config.json` named once, with its problem in the message (not a `source()`, which `{:#}` would repeat).
    #[error("{}: {error}", path.display())]
    Config { path: PathBuf, error: ConfigError },
    /// No `config.json`, so no default recipe.
    #[error("{}: {problem}", path.display())]
    Output { path: PathBuf, problem: String },
    #[error(
        "{}: is already INT4 ({modules} compressed-tensors pack-quantized modules, group size {group}){}, and the \
         recipe would keep it INT4, so there is nothing to do: {}",
        path.display(),
        architecture.map_or("", |a| if a == Architecture::DeepseekV3 { ", as Moonshot ships Kimi K2.5/K2.6/K2.7" } else { "" }),
        already_int4_remedy(*architecture),
        group = group_size.map_or("unknown".to_string(), |g| g.to_string())
    )]
    AlreadyInt4 { path: PathBuf, modules: usize, group_size: Option<usize>, architecture: Option<Architecture> },
}

/// A checkpoint opened and planned, ready to run or to report on.
pub struct Prepared {
    pub checkpoint: Checkpoint,
    pub config: Option<ModelConfig>,
    pub recipe: Recipe,
    pub plan: Plan,
}

/// Opens the source, validates it (headers, scales, shapes against the config) and builds the plan.
pub fn prepare(
    input: &Path,
    recipe: Option<&str>,
    group_size: Option<usize>,
    scale_rule: Option<ScaleRule>,
    max_shard_bytes: u64,
) -> Result<Prepared, PrepareError> {
    let checkpoint = Checkpoint::open(input)?;
    let config = match checkpoint.config() {
        Some(json) => Some(
            ModelConfig::from_json(json)
                .map_err(|error| PrepareError::Config { path: input.join(CONFIG_FILE), error })?,
        ),
        None => None,
    };
    let recipe_name = match (recipe, &config) {
        (Some(name), _) => name.to_string(),
        (None, Some(config)) => config.default_recipe().to_string(),
        (None, None) => {
            return Err(PrepareError::Output {
                path: input.join(CONFIG_FILE),
                problem: "missing, so no default recipe can be chosen; pass --recipe NAME|PATH".into(),
            })
        }
    };
    let recipe = Recipe::load(&recipe_name)?.with_overrides(group_size, scale_rule)?;
    let items = vendor_source::items_from_checkpoint(&checkpoint)?;
    if let Some(config) = &config {
        crate::load::validate::check_source(&checkpoint, config)?;
    }
    vendor_source::validate_scales(&checkpoint, &items)?;
    let plan = super::build(items, &recipe, config.as_ref().map(|c| c.num_hidden_layers), max_shard_bytes)?;
    Ok(Prepared { checkpoint, config, recipe, plan })
}

/// What to do with a folder already INT4 of `architecture` (`None`: no config.json): use it as it is (the commands
/// that run or check it), or requantize it with the architecture's own recipes.
fn already_int4_remedy(architecture: Option<Architecture>) -> String {
    // Kimi K3 (the `kimi_linear` release shipped quantized) does not run; Kimi-Linear ships BF16.
    let runs = !matches!(architecture, Some(Architecture::DeepseekV4 | Architecture::KimiLinear));
    let as_it_is = if runs {
        "evaluate or serve it as it is with `squeeze eval`, `squeeze eval --reference DIR --candidate DIR` (BF16 vs \
         FP8 KV), `squeeze calibrate-kv`, `squeeze serve-test`, and check it with `squeeze verify DIR --engine vllm`"
    } else {
        "serve it as it is, and check it with `squeeze verify DIR --engine vllm`"
    };
    let Some(architecture) = architecture else {
        return format!(
            "{as_it_is}; to requantize it, add the model's config.json and pass --recipe with a recipe of its \
             architecture that writes NVFP4, MXFP4 or W4A8"
        );
    };
    let recipes = crate::recipe::int4_requantizing(architecture);
    if recipes.is_empty() {
        return format!(
            "{as_it_is}; no built-in recipe requantizes {} to another format: write a recipe whose routed-expert \
             rule has an nvfp4, mxfp4 or w4a8 scheme and pass it with --recipe PATH",
            architecture.name()
        );
    }
    let named: Vec<String> = recipes.iter().map(|(name, nodes)| format!("{name} ({nodes})")).collect();
    let list = match named.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => unreachable!("not empty"),
    };
    format!("{as_it_is}; to requantize it for other nodes pass --recipe {list}")
}

/// An INT4 source (Kimi K2.6) is requantized only into another format: NVFP4, MXFP4 or W4A8 (dequantized
/// exactly, then quantized as an FP8 source is). A plan that keeps every INT4 module INT4 has nothing to do; one
/// that keeps some would need two INT4 declarations the config cannot tell apart, so it is refused (`report`
/// refuses a `--group-size` for a source kept INT4 the same way).
pub fn check_int4_source(
    plan: &Plan,
    recipe: &Recipe,
    input: &Path,
    config: Option<&ModelConfig>,
) -> Result<(), PrepareError> {
    let int4: Vec<&PlannedItem> =
        plan.items.iter().filter(|item| matches!(item.source.kind, SourceKind::Int4 { .. })).collect();
    let Some(kept) = int4.iter().find(|item| !item.requantizes_int4()) else { return Ok(()) };
    if !int4.iter().any(|item| item.requantizes_int4()) {
        let SourceKind::Int4 { group_size } = kept.source.kind else { unreachable!("filtered above") };
        return Err(PrepareError::AlreadyInt4 {
            path: input.to_path_buf(),
            modules: int4.len(),
            group_size: Some(group_size),
            architecture: config.map(|c| c.architecture),
        });
    }
    Err(PrepareError::Recipe(RecipeError::Invalid {
        source_name: recipe.name().to_string(),
        message: format!(
            "requantizes some of the source's INT4 modules but keeps `{}` as {}; an output holds one 4-bit format \
             for them, so select every INT4 module (the routed experts) with the same rule",
            kept.module(),
            kept.action.name()
        ),
    }))
}

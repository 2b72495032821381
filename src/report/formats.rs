//! `squeeze report --formats`: the architecture's 4-bit formats side by side — for each of its format recipes
//! (routed experts INT4 W4A16, NVFP4, W4A4 NVFP4, MXFP4, W4A8), the output size and the decode node's budget on the
//! same layout. Each row is the report one `--recipe` gives; a recipe whose weights do not fit says so in its row.

use super::{budget, does_not_fit, plan_model, NodeBudget, ReportError, ReportOptions};
use crate::format::kv_scales::KvDtype;

/// The format suffixes of the built-in recipes (`<arch>-int4`, `<arch>-nvfp4`, …), in the order they are listed.
pub const FORMAT_SUFFIXES: [&str; 5] = ["int4", "nvfp4", "nvfp4-w4a4", "mxfp4", "w4a8"];

/// One format's row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FormatRow {
    pub recipe: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_gib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode: Option<NodeBudget>,
    /// Why this format has no budget (its weights do not fit the layout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The formats of one model on one layout.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FormatComparison {
    pub model: String,
    pub architecture: String,
    pub source_gib: f64,
    pub formats: Vec<FormatRow>,
}

/// Plans the model once per format recipe of its architecture (`options.recipe` is ignored: the architecture's
/// default recipe names the prefix) and sizes the decode node of each (recipe weights, FP8 KV) on the layout.
pub fn compare(options: &ReportOptions) -> Result<FormatComparison, ReportError> {
    options.layout.check()?;
    let default = plan_model(&ReportOptions { recipe: None, ..options.clone() })?;
    let prefix = default.recipe.strip_suffix("-int4").unwrap_or(&default.recipe).to_string();
    let mut formats = Vec::new();
    for suffix in FORMAT_SUFFIXES {
        let recipe = format!("{prefix}-{suffix}");
        // The architecture's default recipe (its int4 one) is planned once.
        let planned_here;
        let planned = if recipe == default.recipe {
            &default
        } else {
            planned_here = plan_model(&ReportOptions { recipe: Some(recipe.clone()), ..options.clone() })?;
            &planned_here
        };
        let output = planned.sizes.output_tensors.bytes;
        let row = match budget::node(&planned.config, &options.layout, &recipe, output, KvDtype::Fp8) {
            Ok(decode) => FormatRow {
                recipe,
                output_bytes: Some(planned.sizes.output.bytes),
                output_gib: Some(planned.sizes.output.gib),
                decode: Some(decode),
                error: None,
            },
            Err(shortfall) => {
                let error = does_not_fit("decode", &recipe, output, &shortfall, &options.layout);
                FormatRow { recipe, output_bytes: None, output_gib: None, decode: None, error: Some(error) }
            }
        };
        formats.push(row);
    }
    Ok(FormatComparison {
        model: options.model.clone(),
        architecture: default.config.architecture.name().to_string(),
        source_gib: default.sizes.source.gib,
        formats,
    })
}

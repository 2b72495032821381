//! `squeeze report`: checkpoint size before and after a recipe, and the GPU memory budget of a prefill node
//! (source weights, BF16 KV) beside a decode node (recipe weights, FP8 KV), from a model folder, a `config.json`
//! or a built-in preset.

pub mod budget;
pub mod conversion;
mod error;
pub mod formats;
pub mod gpu;
pub mod input;
pub mod kv;
pub mod requantization;
pub mod size;

pub use budget::{Layout, NodeBudget};
pub use conversion::{ConversionEstimate, Machine, QuantizeOn};
pub use error::ReportError;
pub use formats::{compare as compare_formats, FormatComparison};
pub use gpu::{parse_gpu_memory, GpuMemory};
pub use kv::KvPerToken;
pub use requantization::Requantization;
pub use size::Sizes;

use crate::format::kv_scales::KvDtype;
use crate::format::vendor_source;
use crate::model::{ModelConfig, TensorClass};
use crate::plan::prepare::{check_int4_source, prepare};
use crate::plan::{self, Action, Plan};
use crate::quant::ScaleRule;
use crate::recipe::Recipe;
use crate::units::both_units;
use input::{Input, Origin};

/// What to report on and how the nodes are laid out.
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// A model folder (with or without weights), a `config.json` file or a preset name.
    pub model: String,
    /// Built-in recipe name or TOML path; `None` picks the architecture's default.
    pub recipe: Option<String>,
    pub group_size: Option<usize>,
    /// `--scale-rule` of every rule, as quantize's (changes the conversion time, not the sizes).
    pub scale_rule: Option<ScaleRule>,
    /// Largest output shard, as `quantize --max-shard-size` (headers per shard change the file bytes).
    pub max_shard_bytes: u64,
    pub layout: Layout,
    /// The machine the conversion time is estimated for.
    pub machine: Machine,
}

/// KV bytes per token on one GPU for both cache types, at the layout's attention tensor parallelism.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KvSummary {
    /// `mla` or `gqa`.
    pub attention: &'static str,
    pub bf16: KvPerToken,
    pub fp8: KvPerToken,
}

/// Everything `squeeze report` prints.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub model: String,
    /// `checkpoint` (a folder with weights), `config` (a config.json) or `preset`.
    pub input: &'static str,
    pub architecture: String,
    pub model_type: String,
    pub recipe: String,
    /// Sizes counted from files (true) or computed from the config (false).
    pub exact: bool,
    pub parameters: u64,
    pub source_bytes: u64,
    pub source_gib: f64,
    pub bf16_bytes: u64,
    pub bf16_gib: f64,
    pub output_bytes: u64,
    pub output_gib: f64,
    pub sizes: Sizes,
    pub layout: Layout,
    pub kv: KvSummary,
    pub prefill: NodeBudget,
    pub decode: NodeBudget,
    /// How long `quantize` takes on the given machine, and in how many parts it can run.
    pub conversion: ConversionEstimate,
    /// A natively INT4 source requantized by the recipe (Kimi K2.6 → NVFP4/MXFP4/W4A8): its weight error, sampled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requantization: Option<Requantization>,
}

/// A model resolved into a config and a plan.
struct Planned {
    config: ModelConfig,
    recipe: String,
    sizes: Sizes,
    input: &'static str,
    /// Source tensor bytes the `mse` search quantizes.
    mse_bytes: u64,
    requantization: Option<Requantization>,
}

/// Source bytes of the items quantized with the `mse` rule.
fn mse_bytes(plan: &Plan) -> u64 {
    plan.items
        .iter()
        .filter(|item| matches!(item.action, Action::Int4 { scale_rule: ScaleRule::Mse, .. }))
        .map(|item| item.source.bytes())
        .sum()
}

fn plan_model(options: &ReportOptions) -> Result<Planned, ReportError> {
    match input::resolve(&options.model)? {
        Input::Weights(dir) => {
            // Every malformed packed module, named as the engines name it, before planning stops at the first.
            let problems = crate::format::compressed_tensors::layout_problems(&crate::io::Checkpoint::open(&dir)?);
            if !problems.is_empty() {
                return Err(ReportError::Malformed { path: dir, problems });
            }
            let prepared = prepare(
                &dir,
                options.recipe.as_deref(),
                options.group_size,
                options.scale_rule,
                options.max_shard_bytes,
            )?;
            if let Some(group) = options.group_size {
                // A folder already INT4 is reported as stored: quantize refuses it, so no other group size exists.
                check_int4_source(&prepared.plan, &prepared.recipe, &dir, prepared.config.as_ref())
                    .map_err(|error| ReportError::GroupSizeOnInt4 { group, error })?;
            }
            if prepared.config.is_none() {
                return Err(ReportError::NoConfig { path: dir.clone() });
            }
            let sizes = size::from_plan(&prepared.plan, Some(prepared.checkpoint.shard_bytes()));
            let mse_bytes = mse_bytes(&prepared.plan);
            let requantization = requantization::estimate(&prepared)?;
            let config = prepared.config.ok_or_else(|| ReportError::NoConfig { path: dir.clone() })?;
            let recipe = prepared.recipe.name().to_string();
            Ok(Planned { config, recipe, sizes, input: "checkpoint", mse_bytes, requantization })
        }
        Input::Config { origin, json } => {
            let config = ModelConfig::from_json(&json)
                .map_err(|error| ReportError::Config { origin: origin.describe(), error })?;
            let recipe_name = options.recipe.clone().unwrap_or_else(|| config.default_recipe().to_string());
            let recipe = Recipe::load(&recipe_name)?.with_overrides(options.group_size, options.scale_rule)?;
            let plan = plan::build(
                vendor_source::items_from_config(&config),
                &recipe,
                Some(config.num_hidden_layers),
                options.max_shard_bytes,
            )?;
            let input = match origin {
                Origin::Preset(_) => "preset",
                Origin::File(_) => "config",
            };
            let mse_bytes = mse_bytes(&plan);
            let sizes = size::from_plan(&plan, None);
            // A config declaring INT4 groups describes a natively INT4 release (Kimi K2.6): the recipe's output.
            let native_int4 = crate::format::compressed_tensors::int4_group_size(Some(&json)).is_some();
            Ok(Planned {
                config,
                recipe: recipe.name().to_string(),
                sizes: if native_int4 { sizes.shipped_as_output() } else { sizes },
                input,
                mse_bytes,
                requantization: None,
            })
        }
    }
}

/// Builds the report: sizes from the plan, then both nodes' budgets.
pub fn report(options: &ReportOptions) -> Result<Report, ReportError> {
    options.layout.check()?;
    let Planned { config, recipe, sizes, input, mse_bytes, requantization } = plan_model(options)?;
    let layout = &options.layout;
    // FP8 weights are the only tensors whose BF16 form differs from the source (a natively INT4 release is
    // its own recipe's output).
    let fp8_source =
        sizes.bf16.bytes != sizes.source_tensors.bytes && sizes.source_tensors.bytes != sizes.output_tensors.bytes;
    let source_name = if fp8_source && config.layout.is_none() { "fp8 source" } else { "source" };
    let prefill = budget::node(&config, layout, source_name, sizes.source_tensors.bytes, KvDtype::Bf16);
    let decode = budget::node(&config, layout, &recipe, sizes.output_tensors.bytes, KvDtype::Fp8);
    let (prefill, decode) = match (prefill, decode) {
        (Ok(prefill), Ok(decode)) => (prefill, decode),
        (prefill, decode) => {
            let mut problems = Vec::new();
            if let Err(shortfall) = &prefill {
                problems.push(does_not_fit("prefill", source_name, sizes.source_tensors.bytes, shortfall, layout));
            }
            if let Err(shortfall) = &decode {
                let mut problem = does_not_fit("decode", &recipe, sizes.output_tensors.bytes, shortfall, layout);
                // What would fit on these GPUs: the routed experts' bits per weight (scales included) that leave
                // the rest of the output as it is.
                if let Some(experts) = sizes.classes.get(TensorClass::RoutedExperts.name()) {
                    let free = shortfall.available_bytes_per_gpu * layout.tp as u64;
                    let rest = sizes.output_tensors.bytes.saturating_sub(experts.output_bytes);
                    let bits = free.saturating_sub(rest) as f64 * 8.0 / experts.parameters.max(1) as f64;
                    problem.push_str(&format!(
                        "; on these {} GPUs the routed experts would fit at {bits:.2} bits per weight, scales \
                         included (this recipe: {:.2}), the rest as the recipe leaves it",
                        layout.tp,
                        experts.output_bytes as f64 * 8.0 / experts.parameters.max(1) as f64
                    ));
                }
                problems.push(problem);
            }
            return Err(ReportError::DoesNotFit(format!(
                "{}; use more GPUs (--gpus with --tp), a larger --gpu-memory, a higher --mem-fraction or a smaller --reserve",
                problems.join("; ")
            )));
        }
    };
    let attention = match (&config.layout, &config.attention) {
        (Some(crate::model::config::Layout::KimiLinear(_)), _) => "mla layers beside kda",
        (Some(crate::model::config::Layout::Glm5Next(_)), _) => "nope mla with k-pool dsa layers beside kda",
        (Some(crate::model::config::Layout::DeepseekV4(_)), _) => "compressed csa/hca layers, sliding window",
        (None, crate::model::Attention::Mla { .. }) => "mla",
        (None, crate::model::Attention::Gqa { .. }) => "gqa",
    };
    let kv = KvSummary {
        attention,
        bf16: kv::per_token(&config, KvDtype::Bf16, layout.attention_tp()),
        fp8: kv::per_token(&config, KvDtype::Fp8, layout.attention_tp()),
    };
    let conversion =
        conversion::estimate(sizes.source.bytes, mse_bytes, sizes.output.bytes, sizes.shards, options.machine);
    Ok(Report {
        model: options.model.clone(),
        input,
        architecture: config.architecture.name().to_string(),
        model_type: config.model_type.clone(),
        recipe,
        exact: sizes.exact,
        parameters: sizes.parameters,
        source_bytes: sizes.source.bytes,
        source_gib: sizes.source.gib,
        bf16_bytes: sizes.bf16.bytes,
        bf16_gib: sizes.bf16.gib,
        output_bytes: sizes.output.bytes,
        output_gib: sizes.output.gib,
        sizes,
        layout: layout.clone(),
        kv,
        prefill,
        decode,
        conversion,
        requantization,
    })
}

/// One node's "weights do not fit" sentence, with the GPU count that would fit at this memory.
fn does_not_fit(
    node: &str,
    weights: &str,
    weight_bytes: u64,
    shortfall: &budget::Shortfall,
    layout: &Layout,
) -> String {
    let needed = if shortfall.available_bytes_per_gpu == 0 {
        "no GPU count fits".to_string()
    } else {
        format!("at least {} GPUs of this size would fit", weight_bytes.div_ceil(shortfall.available_bytes_per_gpu))
    };
    format!(
        "{node} node: weights do not fit: {weights} is {} over tp {}, {} per GPU, but only {} per GPU is free \
         ({} × {} minus {} reserve); short by {} per GPU ({needed})",
        both_units(weight_bytes),
        layout.tp,
        both_units(shortfall.weight_bytes_per_gpu),
        both_units(shortfall.available_bytes_per_gpu),
        layout.gpu_memory.name,
        layout.mem_fraction,
        both_units(layout.reserve_bytes),
        both_units(shortfall.bytes),
    )
}

//! What the calibrated methods (`imatrix`, `gptq`) share: the method and its options, the calibration set and
//! its digest, the one layer-streamed calibration pass over the source model ([`run_pass`]: each layer's
//! forward and what the method does with it), the per-layer, per-expert coverage, and the rule each routed-expert
//! tensor is then quantized with. The methods' own per-layer work is in [`super::imatrix_pass`] and
//! [`super::gptq_pass`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::arch::mtp::MtpLayer;
use crate::arch::{
    embed, run_layers, ExpertActivations, ExpertTap, ExpertTimes, KvSource, Layer, LayerContext, LayerState, LayerTap,
    Model,
};
use crate::chunks::{load_sequences, EvalInput, Fit};
use crate::model::ModelConfig;
use crate::progress::Reporter;
use crate::runtime::device::DeviceChoice;
use crate::runtime::rope_table::rope_setup;
use crate::runtime::weights::WeightReader;
use crate::runtime::{RuntimeError, Spans, Tensor};

use super::expert_spill::SpillEntry;
use super::plan::{Action, Plan};

/// Calibration chunks read at most (`--samples`).
pub const DEFAULT_SAMPLES: usize = 128;
/// Tokens per calibration chunk of a text file (`--seq-len`).
pub const DEFAULT_SEQ_LEN: usize = 512;
/// An expert shown fewer calibration tokens than this falls back to the `mse` rule (`--min-expert-tokens`): with
/// fewer rows the mean of x² per channel is too noisy to steer a 32-element group's scale.
pub const DEFAULT_MIN_EXPERT_TOKENS: u64 = 16;
/// The `observer` written into `quantization_config` for an imatrix run: llm-compressor's name for the same
/// method. compressed-tensors' `QuantizationArgs.observer` is a free string (`Optional[str]`) that only
/// calibration looks up, and vLLM/SGLang parse it with `QuantizationArgs.model_validate` and never read it.
pub const OBSERVER: &str = "imatrix_mse";

/// How `quantize` chooses INT4 scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Round to nearest with the recipe's scale rule, from the weights alone.
    #[default]
    Rtn,
    /// Routed experts' scales weighted by their calibration inputs' mean x² per channel.
    Imatrix,
    /// Routed experts quantized by GPTQ against their calibration inputs' Hessian.
    Gptq,
}

/// What the calibration pass reads and how its statistics are used.
#[derive(Debug, Clone)]
pub struct CalibrationOptions {
    pub input: EvalInput,
    pub samples: usize,
    pub min_expert_tokens: u64,
    /// Statistics only: every calibration token is shown to every expert of its layer.
    pub route_all: bool,
    /// Where the runtime runs the pass.
    pub device: DeviceChoice,
    pub method: Method,
    /// GPTQ: the inputs of layer L + 1 come from layer L run with its already-quantized experts (else every
    /// layer's inputs come from the FP8 model).
    pub sequential: bool,
    /// `--allow-long-context`: chunks longer than the model's context window are run, with a warning.
    pub allow_long_context: bool,
}

/// Calibration tokens per expert of one MoE layer, and the experts that fell back to `mse`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LayerCoverage {
    pub layer: usize,
    /// Calibration tokens the router sent to each expert (index = expert); they sum to tokens × top_k.
    pub routed: Vec<u64>,
    /// Experts quantized with the `mse` rule: fewer than `min_expert_tokens` statistics rows.
    pub fallback: Vec<usize>,
}

/// Coverage of the calibration over the routed experts (`expert_coverage` in `--json` and the manifest).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ExpertCoverage {
    pub method: Method,
    pub sequences: usize,
    pub tokens: u64,
    pub top_k: usize,
    pub min_expert_tokens: u64,
    pub force_route_all: bool,
    /// Routed experts with INT4 tensors in the plan.
    pub experts: usize,
    /// Of those, quantized with their calibration statistics (importance, or GPTQ).
    pub calibrated: usize,
    /// Of those, quantized with the `mse` rule.
    pub fell_back: usize,
    pub layers: Vec<LayerCoverage>,
    /// Layers with INT4 routed experts the calibration pass does not run: all fall back to `mse` (empty since the
    /// pass runs the MTP layer too).
    pub uncalibrated_layers: Vec<usize>,
}

/// What calibration made of one routed expert.
pub enum ExpertResult {
    /// imatrix: importance over its `hidden` input channels (gate_proj, up_proj, which read the same hidden
    /// states) and its `moe_intermediate` ones (down_proj).
    Importance { gate_up: Vec<f32>, down: Vec<f32> },
    /// GPTQ: its planned projections (`gate`, `up`, `down`) already quantized, kept on disk until written.
    Quantized(BTreeMap<String, SpillEntry>),
    /// W4A4 NVFP4 (`--method rtn` with `--calibration`): the largest magnitude of its gate/up input and of its
    /// down input ([`super::activation_pass`]).
    InputAbsmax { gate_up: f32, down: f32 },
}

/// What a method's pass hands back.
pub struct PassResult {
    /// The result of every planned `(layer, expert)` calibrated.
    pub experts: BTreeMap<(usize, usize), ExpertResult>,
    /// The MoE layers' coverage.
    pub layers: Vec<LayerCoverage>,
    /// GPTQ with `--resume`: layers whose quantized experts a previous run had finished.
    pub layers_reused: usize,
}

/// The rule a routed-expert tensor is quantized with.
pub enum ExpertRule<'a> {
    /// Importance-weighted scales, one weight per input channel.
    Importance(&'a [f32]),
    /// Already quantized (GPTQ): the packed codes and scales are read back.
    Quantized(&'a SpillEntry),
    /// Too few calibration tokens (or a layer the pass does not run): the `mse` rule.
    Fallback,
    /// The largest magnitude of the tensor's inputs (W4A4 NVFP4: its `input_global_scale`).
    InputAbsmax(f32),
}

/// Everything the quantize pass needs from calibration.
pub struct Calibration {
    experts: BTreeMap<(usize, usize), ExpertResult>,
    pub coverage: ExpertCoverage,
    /// Digest of the calibration tokens and options (part of the plan digest, so `--resume` needs the same).
    pub digest: String,
    /// GPTQ with `--resume`: layers whose quantized experts a previous run had finished.
    pub layers_reused: usize,
}

/// `(layer, expert, projection)` of `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`, also under a
/// vision-language wrapper's names (`language_model.model.layers.…`).
pub fn routed_expert(name: &str) -> Option<(usize, usize, &'static str)> {
    let text = crate::io::composite::text_name(name);
    let rest = text.as_deref().unwrap_or(name).strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest.strip_prefix("mlp.experts.")?;
    let (expert, rest) = rest.split_once('.')?;
    let projection = ["gate", "up", "down"].into_iter().find(|p| rest.strip_suffix("_proj.weight") == Some(*p))?;
    Some((layer.parse().ok()?, expert.parse().ok()?, projection))
}

impl Calibration {
    /// The rule of tensor `name`; `None` when it is not a routed expert's projection (the recipe's rule applies).
    pub fn rule_for(&self, name: &str) -> Option<ExpertRule<'_>> {
        let (layer, expert, projection) = routed_expert(name)?;
        Some(match (self.experts.get(&(layer, expert)), projection) {
            (Some(ExpertResult::Importance { down, .. }), "down") => ExpertRule::Importance(down),
            (Some(ExpertResult::Importance { gate_up, .. }), _) => ExpertRule::Importance(gate_up),
            (Some(ExpertResult::InputAbsmax { down, .. }), "down") => ExpertRule::InputAbsmax(*down),
            (Some(ExpertResult::InputAbsmax { gate_up, .. }), _) => ExpertRule::InputAbsmax(*gate_up),
            (Some(ExpertResult::Quantized(projections)), projection) => match projections.get(projection) {
                Some(entry) => ExpertRule::Quantized(entry),
                None => ExpertRule::Fallback,
            },
            (None, _) => ExpertRule::Fallback,
        })
    }

    /// "N of M experts calibrated, K fell back to mse: L1 e3 e5, L2 e0".
    pub fn summary(coverage: &ExpertCoverage) -> String {
        let mut listed: Vec<String> = coverage
            .layers
            .iter()
            .filter(|layer| !layer.fallback.is_empty())
            .map(|layer| {
                let experts: Vec<String> = layer.fallback.iter().map(|e| format!("e{e}")).collect();
                format!("L{} {}", layer.layer, experts.join(" "))
            })
            .collect();
        listed.extend(coverage.uncalibrated_layers.iter().map(|layer| format!("L{layer} all (not run)")));
        let fallback = match coverage.method {
            Method::Rtn => "saw no token (their activation scale is their layer's largest)",
            _ => "fell back to mse",
        };
        format!(
            "{} of {} experts calibrated ({} calibration tokens{}), {} {fallback}{}",
            coverage.calibrated,
            coverage.experts,
            coverage.tokens,
            if coverage.force_route_all { ", every token shown to every expert" } else { "" },
            coverage.fell_back,
            if listed.is_empty() { String::new() } else { format!(": {}", listed.join(", ")) }
        )
    }
}

/// Sets the INT4 group's `observer` to [`OBSERVER`] in a `quantization_config` (imatrix runs). A GPTQ run keeps
/// the scale rule's observer (`minmax` for ct-minmax/absmax7, `mse`), as llm-compressor's GPTQ does: GPTQ is a
/// modifier there, not an observer, and its W4A16 output declares the scheme's `observer: "minmax"`.
pub fn mark_observer(quantization_config: &mut serde_json::Value) {
    if let Some(weights) = quantization_config.pointer_mut("/config_groups/group_0/weights") {
        weights["observer"] = serde_json::Value::String(OBSERVER.into());
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    /// The calibration chunks could not be read (the message names the flag and the file).
    #[error("{0}")]
    Chunks(String),
    /// No backend for the pass.
    #[error("--device: {0}")]
    Device(String),
}

/// The calibration chunks and the digest of them and of the options (part of the plan digest, so `--resume` needs
/// the same); read before the output folder is prepared, the pass runs after.
pub struct CalibrationSet {
    pub sequences: Vec<Vec<u32>>,
    pub digest: String,
    /// Chunks beyond the context window under `--allow-long-context`, said when the pass runs.
    pub warnings: Vec<String>,
}

impl CalibrationSet {
    pub fn load(dir: &Path, options: &CalibrationOptions) -> Result<Self, CalibrationError> {
        let model = Model::open(dir)?;
        let config = model.config();
        let fit = Fit {
            vocab: config.vocab_size,
            windows: &[&config.window],
            min_ctx: 2,
            allow_long_context: options.allow_long_context,
        };
        let loaded = load_sequences(&options.input, dir, Some(options.samples), &fit)
            .map_err(|e| CalibrationError::Chunks(e.to_string()))?;
        let (sequences, warnings) = (loaded.sequences, loaded.warnings);
        let mut hasher = Sha256::new();
        hasher.update(match options.method {
            Method::Gptq => {
                let settings = crate::quant::gptq::GptqSettings::default();
                format!(
                    "gptq|{}|{}|{}|{}|{}|",
                    options.min_expert_tokens, options.route_all, options.sequential, settings.damping, settings.block
                )
            }
            Method::Rtn => format!("activations|{}|", options.route_all),
            Method::Imatrix => format!(
                "imatrix|{}|{}|{}|",
                options.min_expert_tokens,
                options.route_all,
                crate::quant::scale_rule::MseSearch::default().grid
            ),
        });
        for sequence in &sequences {
            hasher.update((sequence.len() as u64).to_le_bytes());
            for id in sequence {
                hasher.update(id.to_le_bytes());
            }
        }
        Ok(Self { sequences, digest: crate::hex::hex(&hasher.finalize()), warnings })
    }
}

/// One decoder layer of the calibration pass, as a method's per-layer work sees it.
pub struct LayerRun<'a, 'b> {
    pub index: usize,
    /// Whether the layer has routed experts.
    pub moe: bool,
    pub layer: &'a Layer,
    pub context: &'a LayerContext<'b>,
    spans: &'a Spans,
    state: &'a mut LayerState,
}

impl LayerRun<'_, '_> {
    /// Advances `hidden` through the layer, tapped.
    pub fn forward(&mut self, hidden: &mut Tensor, tap: Option<&mut LayerTap>) -> Result<(), RuntimeError> {
        let times = ExpertTimes::default();
        self.layer.forward(self.context, hidden, self.spans, KvSource::Own, self.state, &times, tap)
    }
}

/// A method's work on one layer: given the layer and its input hidden states, advance them to the next layer's
/// input and return the layer's coverage (MoE layers).
pub type LayerWork<'a> = dyn FnMut(&mut LayerRun, &mut Tensor) -> Result<Option<LayerCoverage>, RuntimeError> + 'a;

/// Whether the plan quantizes routed experts of the model's MTP layer (`model.layers.{num_hidden_layers}`), which
/// the pass then runs after the decoder layers.
pub fn calibrates_mtp(plan: &Plan, config: &ModelConfig) -> bool {
    config.num_nextn_predict_layers > 0
        && planned_experts(plan).iter().any(|(layer, _)| *layer == config.num_hidden_layers)
}

/// The layers [`run_pass`] runs: the decoder layers, and the MTP layer where the plan quantizes its experts.
pub fn pass_layers(plan: &Plan, config: &ModelConfig) -> usize {
    config.num_hidden_layers + usize::from(calibrates_mtp(plan, config))
}

/// The one calibration pass: the source model in `dir` runs over the calibration chunks, layer by layer through
/// the layer-streamed runtime on the chosen backend; `work` does the method's part of each layer. Where the plan
/// quantizes the MTP layer's experts, the MTP layer runs last, as the engines run it: over the main model's final
/// hidden states (after its norm, from the layers as `work` left them) and each next token ([`MtpLayer::inputs`]).
/// The reporter's phase (begun by the caller with [`pass_layers`] units at least) advances one unit per layer.
pub fn run_pass(
    dir: &Path,
    options: &CalibrationOptions,
    set: &CalibrationSet,
    plan: &Plan,
    reporter: &dyn Reporter,
    work: &mut LayerWork,
) -> Result<Vec<LayerCoverage>, CalibrationError> {
    let model = Model::open(dir)?;
    let config = model.config();
    let (backend, notice) =
        crate::runtime::device::open_backend(options.device).map_err(|e| CalibrationError::Device(e.to_string()))?;
    if let Some(notice) = notice {
        reporter.warn(&format!("calibration: {notice}"));
    }
    for warning in &set.warnings {
        reporter.warn(&format!("calibration: {warning}"));
    }
    let backend = backend.as_ref();
    let reader = WeightReader::new(model.checkpoint());
    let lengths: Vec<usize> = set.sequences.iter().map(Vec::len).collect();
    let spans = Spans::new(&lengths);
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let (table, mla_scale) = rope_setup(config, longest);
    let ids: Vec<u32> = set.sequences.concat();
    let mut hidden = backend.upload(&embed(&reader, config, &ids)?, config.hidden_size)?;
    let context = LayerContext { backend, reader: &reader, config, table: &table, mla_scale };
    let mut state = LayerState::default();
    let mut layers = Vec::new();
    run_layers(&[&model], backend, reporter, &mut |step| {
        let mut run = LayerRun {
            index: step.index,
            moe: config.runs_moe(step.index),
            layer: &step.layers[0],
            context: &context,
            spans: &spans,
            state: &mut state,
        };
        if let Some(coverage) = work(&mut run, &mut hidden)? {
            layers.push(coverage);
        }
        Ok(())
    })?;
    if calibrates_mtp(plan, config) {
        let width = config.hidden_size;
        let no_mtp = || RuntimeError::Input(format!("{}: the MTP layer's tensors are missing", dir.display()));
        let mtp = MtpLayer::load(&reader, config)?.ok_or_else(no_mtp)?;
        backend.rms_norm(
            &mut hidden,
            width,
            &reader.parameter("model.norm.weight", width)?,
            config.rms_norm_eps as f32,
        )?;
        let (mut inputs, mtp_spans) = mtp.inputs(&context, &hidden, &set.sequences, &spans)?;
        let mut state = LayerState::default();
        let mut run = LayerRun {
            index: config.num_hidden_layers,
            moe: true,
            layer: mtp.layer(),
            context: &context,
            spans: &mtp_spans,
            state: &mut state,
        };
        if let Some(coverage) = work(&mut run, &mut inputs)? {
            layers.push(coverage);
        }
        reporter.advance(1);
    }
    Ok(layers)
}

/// What a statistics pass gathers per routed expert: a copy of `fresh` for each expert of a MoE layer, `observe`d
/// on what the expert sees, then `finish(statistics)` gives the layer's expert results and the experts that fell
/// back.
pub struct ExpertStatistics<S, O, F> {
    pub fresh: S,
    pub observe: O,
    pub finish: F,
}

/// A statistics pass (imatrix, W4A4 activation scales): [`run_pass`] with every MoE layer's routed experts shown to
/// the statistics through an expert tap. Results are kept for the planned experts only.
pub fn expert_statistics_pass<S, O, F>(
    dir: &Path,
    options: &CalibrationOptions,
    set: &CalibrationSet,
    plan: &Plan,
    reporter: &dyn Reporter,
    statistics: ExpertStatistics<S, O, F>,
) -> Result<PassResult, CalibrationError>
where
    S: Clone,
    O: Fn(&mut S, &ExpertActivations),
    F: FnMut(&[S]) -> (Vec<(usize, ExpertResult)>, Vec<usize>),
{
    let ExpertStatistics { fresh, observe, mut finish } = statistics;
    let config = Model::open(dir)?.config().clone();
    let count = config.n_routed_experts;
    let mut experts = BTreeMap::new();
    reporter.begin("calibration", pass_layers(plan, &config) as u64);
    let layers = run_pass(dir, options, set, plan, reporter, &mut |run, hidden| {
        let mut statistics: Vec<S> = if run.moe { vec![fresh.clone(); count] } else { Vec::new() };
        let mut routes = Vec::new();
        let mut observer = |seen: &ExpertActivations| {
            if let Some(statistic) = statistics.get_mut(seen.expert) {
                observe(statistic, seen);
            }
        };
        let mut tap = LayerTap {
            routes: Some(&mut routes),
            experts: run.moe.then_some(ExpertTap {
                observer: Some(&mut observer),
                route_all: options.route_all,
                ..Default::default()
            }),
            ..LayerTap::default()
        };
        run.forward(hidden, Some(&mut tap))?;
        if !run.moe {
            return Ok(None);
        }
        let (results, fallback) = finish(&statistics);
        experts.extend(results.into_iter().map(|(expert, result)| ((run.index, expert), result)));
        Ok(Some(LayerCoverage { layer: run.index, routed: routed_counts(&routes, count), fallback }))
    });
    reporter.end();
    let layers = layers?;
    let planned = planned_experts(plan);
    experts.retain(|key, _| planned.contains(key));
    Ok(PassResult { experts, layers, layers_reused: 0 })
}

/// Calibration tokens the router sent to each of `count` experts.
pub fn routed_counts(routes: &[Vec<usize>], count: usize) -> Vec<u64> {
    let mut routed = vec![0u64; count];
    for expert in routes.iter().flatten() {
        routed[*expert] += 1;
    }
    routed
}

/// The `(layer, expert)`s whose routed-expert tensors the plan calibrates: INT4 (imatrix, GPTQ) or W4A4 NVFP4
/// (activation scales).
pub fn planned_experts(plan: &Plan) -> BTreeSet<(usize, usize)> {
    plan.items
        .iter()
        .filter(|item| matches!(item.action, Action::Int4 { .. } | Action::Fp4 { fp4_activations: true, .. }))
        .filter_map(|item| routed_expert(&item.source.name).map(|(layer, expert, _)| (layer, expert)))
        .collect()
}

/// The coverage over the experts the plan quantizes to INT4, from the pass's layers; `calibrated` experts got
/// their method's rule.
pub fn coverage(
    options: &CalibrationOptions,
    set: &CalibrationSet,
    config: &ModelConfig,
    plan: &Plan,
    mut layers: Vec<LayerCoverage>,
    calibrated: usize,
) -> ExpertCoverage {
    let planned = planned_experts(plan);
    let run: BTreeSet<usize> = layers.iter().map(|layer| layer.layer).collect();
    let uncalibrated_layers: Vec<usize> = planned
        .iter()
        .map(|(layer, _)| *layer)
        .filter(|layer| !run.contains(layer))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    for layer in &mut layers {
        layer.fallback.retain(|expert| planned.contains(&(layer.layer, *expert)));
    }
    ExpertCoverage {
        method: options.method,
        sequences: set.sequences.len(),
        tokens: set.sequences.iter().map(|s| s.len() as u64).sum(),
        top_k: config.num_experts_per_tok,
        min_expert_tokens: options.min_expert_tokens,
        force_route_all: options.route_all,
        experts: planned.len(),
        calibrated,
        fell_back: planned.len() - calibrated,
        layers,
        uncalibrated_layers,
    }
}

/// Runs the method's calibration pass over the model in `dir`; `plan` says which experts have INT4 tensors (the
/// coverage counts those), `out` is the output folder (GPTQ keeps its quantized experts there until they are
/// written), `plan_sha256` the run's plan digest (a resumed GPTQ run reuses the layers it finished).
pub fn calibrate(
    dir: &Path,
    options: &CalibrationOptions,
    set: &CalibrationSet,
    plan: &Plan,
    output: CalibrationOutput,
    reporter: &dyn Reporter,
) -> Result<Calibration, CalibrationError> {
    let model = Model::open(dir)?;
    let config = model.config().clone();
    let PassResult { experts, layers, layers_reused } = match options.method {
        Method::Gptq => super::gptq_pass::calibrate(dir, options, set, plan, output, reporter)?,
        Method::Imatrix => super::imatrix_pass::calibrate(dir, options, set, plan, reporter)?,
        Method::Rtn => super::activation_pass::calibrate(dir, options, set, plan, reporter)?,
    };
    // W4A4's pass gives every planned expert a scale; those no token reached took their layer's (`fallback`).
    let planned = planned_experts(plan);
    let unreached = match options.method {
        Method::Rtn => layers
            .iter()
            .map(|layer| layer.fallback.iter().filter(|e| planned.contains(&(layer.layer, **e))).count())
            .sum(),
        _ => 0,
    };
    let calibrated = experts.len() - unreached;
    Ok(Calibration {
        experts,
        coverage: coverage(options, set, &config, plan, layers, calibrated),
        digest: set.digest.clone(),
        layers_reused,
    })
}

/// Where a calibrated run may keep files and whether it resumes.
#[derive(Debug, Clone, Copy)]
pub struct CalibrationOutput<'a> {
    pub dir: &'a Path,
    pub plan_sha256: &'a str,
    pub resume: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routed_expert_names_parse() {
        assert_eq!(routed_expert("model.layers.3.mlp.experts.17.down_proj.weight"), Some((3, 17, "down")));
        assert_eq!(routed_expert("model.layers.3.mlp.experts.17.gate_proj.weight"), Some((3, 17, "gate")));
        assert_eq!(routed_expert("model.layers.3.mlp.shared_experts.down_proj.weight"), None);
        assert_eq!(routed_expert("model.layers.3.mlp.experts.17.down_proj.weight_scale_inv"), None);
        assert_eq!(routed_expert("model.layers.3.self_attn.o_proj.weight"), None);
    }
}

//! What the calibrated methods (`imatrix`, `gptq`) share: the one layer-streamed calibration pass over the source
//! model ([`run_pass`]: each layer's forward and what the method does with it) and the per-layer, per-expert
//! coverage. The method, its options, the calibration set and the rule each routed-expert tensor is then
//! quantized with are the plan's ([`crate::plan::calibration`]). The methods' own per-layer work is in
//! [`super::imatrix_pass`] and [`super::gptq_pass`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::arch::hyper::{narrow, widen};
use crate::arch::mtp::MtpLayer;
use crate::arch::rope::rope_setup;
use crate::arch::{
    embed, run_layers, ExpertActivations, ExpertTap, ExpertTimes, KvSource, Layer, LayerContext, LayerState, LayerTap,
    Model, Residual,
};
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::plan::calibration::{CalibrationError, CalibrationOptions, CalibrationSet, ExpertResult, LayerCoverage};
use crate::plan::{Action, Plan};
use crate::progress::Reporter;
use crate::runtime::cpu::Products;
use crate::runtime::cuda::linear::Activations;
use crate::runtime::{RuntimeError, Spans, Tensor};

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

/// What a method's pass hands back.
pub struct PassResult {
    /// The result of every planned `(layer, expert)` calibrated.
    pub experts: BTreeMap<(usize, usize), ExpertResult>,
    /// The MoE layers' coverage.
    pub layers: Vec<LayerCoverage>,
    /// GPTQ with `--resume`: layers whose quantized experts a previous run had finished.
    pub layers_reused: usize,
    /// GPTQ: where its algebra ran (`host` or `device`), when any layer ran it.
    pub gptq_algebra: Option<&'static str>,
}

/// Sets the INT4 group's `observer` to [`OBSERVER`] in a `quantization_config` (imatrix runs). A GPTQ run keeps
/// the scale rule's observer (`minmax` for ct-minmax/absmax7, `mse`), as llm-compressor's GPTQ does: GPTQ is a
/// modifier there, not an observer, and its W4A16 output declares the scheme's `observer: "minmax"`.
pub fn mark_observer(quantization_config: &mut serde_json::Value) {
    if let Some(weights) = quantization_config.pointer_mut("/config_groups/group_0/weights") {
        weights["observer"] = serde_json::Value::String(OBSERVER.into());
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
        let residual = Residual { hidden, spans: self.spans, state: self.state };
        self.layer.forward(self.context, residual, KvSource::Own, &times, tap)
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
/// hidden states (after its norm, from the layers as `work` left them; DeepSeek-V4's: its mHC streams before the
/// hyper-head) and each next token ([`MtpLayer::inputs`]).
/// The reporter's phase (begun by the caller with [`pass_layers`] units at least) advances one unit per layer.
/// On the CPU the forward multiplies as `products` says ([`Products::Blocked`]: 1.7–2.6× the kernel's rate on
/// thousands of rows at GLM-5 width, rounding differently from the runtime's commands).
pub fn run_pass(
    dir: &Path,
    (options, products): (&CalibrationOptions, Products),
    set: &CalibrationSet,
    plan: &Plan,
    reporter: &dyn Reporter,
    work: &mut LayerWork,
) -> Result<Vec<LayerCoverage>, CalibrationError> {
    let model = Model::open(dir)?;
    let config = model.config();
    let activations = if options.bf16_activations { Activations::Bf16 } else { Activations::Split };
    let (backend, notice) = crate::runtime::open_backend::open_backend_with(options.device, products, activations)
        .map_err(|e| CalibrationError::Device(e.to_string()))?;
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
    let mut hidden = widen(backend, config, backend.upload(&embed(&reader, config, &ids)?, config.hidden_size)?)?;
    let context = LayerContext { backend, reader: &reader, config, table: &table, mla_scale };
    let mut state = LayerState { tokens: ids, ..LayerState::default() };
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
        // What the layer drafts from: DeepSeek-V4's the streams as they leave the last layer, the others' the
        // output after the final norm.
        let source = if mtp.drafts_from_streams() {
            hidden
        } else {
            let mut hidden = narrow(backend, &reader, config, hidden)?;
            let norm = reader.parameter(config.final_norm_name(), width)?;
            backend.rms_norm(&mut hidden, width, &norm, config.rms_norm_eps as f32)?;
            hidden
        };
        let (mut inputs, mtp_spans) = mtp.inputs(&context, &source, &set.sequences, &spans)?;
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
    (options, products): (&CalibrationOptions, Products),
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
    let layers = run_pass(dir, (options, products), set, plan, reporter, &mut |run, hidden| {
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
    Ok(PassResult { experts, layers, layers_reused: 0, gptq_algebra: None })
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
        .filter_map(|item| plan.routed_expert(&item.source.name).map(|(layer, expert, _)| (layer, expert)))
        .collect()
}

/// Where a calibrated run may keep files and whether it resumes.
#[derive(Debug, Clone, Copy)]
pub struct CalibrationOutput<'a> {
    pub dir: &'a Path,
    pub plan_sha256: &'a str,
    pub resume: bool,
}

//! The `imatrix` method's calibration pass: the source model runs once over the calibration chunks through the
//! layer-streamed runtime, each routed expert's inputs are accumulated into importance vectors
//! ([`crate::quant::imatrix::Importance`]), and each routed-expert tensor gets its rule from them (importance, or
//! the `mse` fallback for an expert with too few tokens), with the per-layer, per-expert coverage.
//!
//! Statistics come from the FP8 source model for every layer (not sequential): importance vectors are small and
//! need one pass, and each layer's inputs are those the unquantized model produces. Sequential calibration
//! (inputs from the already-quantized layers below) matters for GPTQ, whose error feedback compounds.
//!
//! Memory: one layer's f64 accumulators during the pass (`experts × (hidden + moe_intermediate) × 8 B`), then the
//! f32 importance of every MoE layer while quantizing: `MoE layers × experts × (hidden + moe_intermediate) × 4 B`
//! (gate_proj and up_proj share one vector: both read the same hidden states) — Kimi K2: 60 × 384 × 9216 × 4 B =
//! 0.85 GB; plus the runtime's activations for `samples × seq_len` tokens (see [`crate::arch`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::arch::{
    embed, run_layers, ExpertActivations, ExpertTap, ExpertTimes, KvSource, LayerContext, LayerState, LayerTap, Model,
};
use crate::chunks::{load_sequences, EvalInput};
use crate::progress::Reporter;
use crate::quant::imatrix::Importance;
use crate::runtime::device::DeviceChoice;
use crate::runtime::rope_table::rope_setup;
use crate::runtime::weights::WeightReader;
use crate::runtime::Spans;

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
    /// Of those, quantized with their importance.
    pub calibrated: usize,
    /// Of those, quantized with the `mse` rule.
    pub fell_back: usize,
    pub layers: Vec<LayerCoverage>,
    /// Layers with INT4 routed experts the calibration pass does not run (an MTP layer): all fall back to `mse`.
    pub uncalibrated_layers: Vec<usize>,
}

/// One expert's importance: over its `hidden` input channels (gate_proj, up_proj) and its `moe_intermediate`
/// ones (down_proj).
struct ExpertWeights {
    gate_up: Vec<f32>,
    down: Vec<f32>,
}

/// The rule a routed-expert tensor is quantized with.
pub enum ExpertRule<'a> {
    /// Importance-weighted scales, one weight per input channel.
    Importance(&'a [f32]),
    /// Too few calibration tokens (or a layer the pass does not run): the `mse` rule.
    Fallback,
}

/// Everything the quantize pass needs from calibration.
pub struct Calibration {
    experts: BTreeMap<(usize, usize), ExpertWeights>,
    pub coverage: ExpertCoverage,
    /// Digest of the calibration tokens and options (part of the plan digest, so `--resume` needs the same).
    pub digest: String,
}

/// `(layer, expert, projection)` of `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`.
pub fn routed_expert(name: &str) -> Option<(usize, usize, &str)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest.strip_prefix("mlp.experts.")?;
    let (expert, rest) = rest.split_once('.')?;
    let projection = rest.strip_suffix("_proj.weight")?;
    matches!(projection, "gate" | "up" | "down").then_some(())?;
    Some((layer.parse().ok()?, expert.parse().ok()?, projection))
}

impl Calibration {
    /// The rule of tensor `name`; `None` when it is not a routed expert's projection (the recipe's rule applies).
    pub fn rule_for(&self, name: &str) -> Option<ExpertRule<'_>> {
        let (layer, expert, projection) = routed_expert(name)?;
        Some(match self.experts.get(&(layer, expert)) {
            Some(weights) if projection == "down" => ExpertRule::Importance(&weights.down),
            Some(weights) => ExpertRule::Importance(&weights.gate_up),
            None => ExpertRule::Fallback,
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
        format!(
            "{} of {} experts calibrated ({} calibration tokens{}), {} fell back to mse{}",
            coverage.calibrated,
            coverage.experts,
            coverage.tokens,
            if coverage.force_route_all { ", every token shown to every expert" } else { "" },
            coverage.fell_back,
            if listed.is_empty() { String::new() } else { format!(": {}", listed.join(", ")) }
        )
    }
}

/// Sets the INT4 group's `observer` to [`OBSERVER`] in a `quantization_config`.
pub fn mark_observer(quantization_config: &mut serde_json::Value) {
    if let Some(weights) = quantization_config.pointer_mut("/config_groups/group_0/weights") {
        weights["observer"] = serde_json::Value::String(OBSERVER.into());
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    /// The calibration chunks could not be read (the message names the file).
    #[error("--calibration: {0}")]
    Chunks(String),
    /// No backend for the pass.
    #[error("--device: {0}")]
    Device(String),
}

/// Runs the calibration pass over the model in `dir` and derives each routed expert's importance; `plan` says
/// which experts have INT4 tensors (the coverage counts those).
pub fn calibrate(
    dir: &Path,
    options: &CalibrationOptions,
    plan: &Plan,
    reporter: &dyn Reporter,
) -> Result<Calibration, CalibrationError> {
    let model = Model::open(dir)?;
    let config = model.config();
    let sequences = load_sequences(&options.input, dir, Some(options.samples), 2, config.vocab_size)
        .map_err(|e| CalibrationError::Chunks(e.to_string()))?;
    let (backend, notice) =
        crate::runtime::device::open_backend(options.device).map_err(|e| CalibrationError::Device(e.to_string()))?;
    if let Some(notice) = notice {
        reporter.warn(&format!("calibration: {notice}"));
    }
    let backend = backend.as_ref();
    let reader = WeightReader::new(model.checkpoint());
    let lengths: Vec<usize> = sequences.iter().map(Vec::len).collect();
    let spans = Spans::new(&lengths);
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let (table, mla_scale) = rope_setup(config, longest);
    let ids: Vec<u32> = sequences.concat();
    let mut hidden = backend.upload(&embed(&reader, config, &ids)?, config.hidden_size)?;
    let context = LayerContext { backend, reader: &reader, config, table: &table, mla_scale };
    let mut state = LayerState::default();
    let (width, inner, count) = (config.hidden_size, config.moe_intermediate_size, config.n_routed_experts);

    let mut experts = BTreeMap::new();
    let mut layers = Vec::new();
    reporter.begin("calibration", config.num_hidden_layers as u64);
    run_layers(&[&model], backend, reporter, &mut |step| {
        let moe = config.runs_moe(step.index);
        let mut statistics: Vec<(Importance, Importance)> = if moe {
            (0..count).map(|_| (Importance::new(width), Importance::new(inner))).collect()
        } else {
            Vec::new()
        };
        let mut routes = Vec::new();
        let mut observer = |seen: &ExpertActivations| {
            if let Some((gate_up, down)) = statistics.get_mut(seen.expert) {
                gate_up.add(seen.input);
                down.add(seen.intermediate);
            }
        };
        let mut tap = LayerTap {
            routes: Some(&mut routes),
            experts: moe.then_some(ExpertTap { observer: &mut observer, route_all: options.route_all }),
            ..LayerTap::default()
        };
        let times = ExpertTimes::default();
        step.layers[0].forward(&context, &mut hidden, &spans, KvSource::Own, &mut state, &times, Some(&mut tap))?;
        if !moe {
            return Ok(());
        }
        let mut routed = vec![0u64; count];
        for expert in routes.iter().flatten() {
            routed[*expert] += 1;
        }
        let mut fallback = Vec::new();
        for (expert, (gate_up, down)) in statistics.iter().enumerate() {
            if gate_up.samples() >= options.min_expert_tokens.max(1) {
                experts
                    .insert((step.index, expert), ExpertWeights { gate_up: gate_up.weights(), down: down.weights() });
            } else {
                fallback.push(expert);
            }
        }
        layers.push(LayerCoverage { layer: step.index, routed, fallback });
        Ok(())
    })?;
    reporter.end();

    // Coverage over the experts the plan quantizes to INT4.
    let planned: BTreeSet<(usize, usize)> = plan
        .items
        .iter()
        .filter(|item| matches!(item.action, Action::Int4 { .. }))
        .filter_map(|item| routed_expert(&item.source.name).map(|(layer, expert, _)| (layer, expert)))
        .collect();
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
    experts.retain(|key, _| planned.contains(key));
    let calibrated = experts.len();

    let mut hasher = Sha256::new();
    hasher.update(format!(
        "imatrix|{}|{}|{}|",
        options.min_expert_tokens,
        options.route_all,
        crate::quant::scale_rule::MseSearch::default().grid
    ));
    for sequence in &sequences {
        hasher.update((sequence.len() as u64).to_le_bytes());
        for id in sequence {
            hasher.update(id.to_le_bytes());
        }
    }
    Ok(Calibration {
        experts,
        coverage: ExpertCoverage {
            method: Method::Imatrix,
            sequences: sequences.len(),
            tokens: ids.len() as u64,
            top_k: config.num_experts_per_tok,
            min_expert_tokens: options.min_expert_tokens,
            force_route_all: options.route_all,
            experts: planned.len(),
            calibrated,
            fell_back: planned.len() - calibrated,
            layers,
            uncalibrated_layers,
        },
        digest: crate::io::writer::hex(&hasher.finalize()),
    })
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

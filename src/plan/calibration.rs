//! What a calibrated conversion hands the per-item transform ([`super::transform`]) and records: the method and
//! its options, the calibration set and its digest, each routed expert's result and the rule its tensors are then
//! quantized with, and the coverage over the experts. The calibration pass itself is `convert`'s
//! (`convert::calibrated`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::arch::Model;
use crate::chunks::{load_sequences, EvalInput, Fit};
use crate::runtime::device::DeviceChoice;

use super::expert_spill::SpillEntry;

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
    /// `--bf16-activations`: on a device, the pass's GEMMs take activations rounded to BF16 once.
    pub bf16_activations: bool,
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
    pub(crate) experts: BTreeMap<(usize, usize), ExpertResult>,
    pub coverage: ExpertCoverage,
    /// Digest of the calibration tokens and options (part of the plan digest, so `--resume` needs the same).
    pub digest: String,
    /// GPTQ with `--resume`: layers whose quantized experts a previous run had finished.
    pub layers_reused: usize,
    /// GPTQ: where its algebra ran (`host` or `device`), when any layer ran it.
    pub gptq_algebra: Option<&'static str>,
    /// The model's decoder layers (DeepSeek-V4's draft experts `mtp.N.*` are layer `num_hidden_layers + N`).
    pub num_hidden_layers: Option<usize>,
}

/// `(layer, expert, projection)` of `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`, or Kimi-Linear's
/// `model.layers.L.block_sparse_moe.experts.E.w{1,3,2}.weight` (w1 the gate, w3 the up, w2 the down projection) and
/// DeepSeek-V4's `layers.L.ffn.experts.E.w{1,3,2}.weight`, also under a vision-language wrapper's names
/// (`language_model.model.layers.…`).
pub fn routed_expert(name: &str) -> Option<(usize, usize, &'static str)> {
    routed_expert_in(name, None)
}

/// [`routed_expert`], and with the model's `num_hidden_layers` also DeepSeek-V4's draft layers'
/// `mtp.N.ffn.experts.E.w{1,3,2}.weight`, as layer `num_hidden_layers + N` (where the runtime runs them).
pub fn routed_expert_in(name: &str, num_hidden_layers: Option<usize>) -> Option<(usize, usize, &'static str)> {
    let text = crate::io::composite::text_name(name);
    let name = text.as_deref().unwrap_or(name);
    let (rest, deepseek_v4, base) = match (name.strip_prefix("model.layers."), name.strip_prefix("mtp.")) {
        (Some(rest), _) => (rest, false, 0),
        (None, Some(rest)) => (rest, true, num_hidden_layers?),
        (None, None) => (name.strip_prefix("layers.")?, true, 0),
    };
    let (layer, rest) = rest.split_once('.')?;
    let (rest, kimi) = match (rest.strip_prefix("mlp.experts."), deepseek_v4) {
        (Some(rest), false) => (rest, false),
        (_, true) => (rest.strip_prefix("ffn.experts.")?, true),
        (None, false) => (rest.strip_prefix("block_sparse_moe.experts.")?, true),
    };
    let (expert, rest) = rest.split_once('.')?;
    let projection = if kimi {
        [("w1", "gate"), ("w3", "up"), ("w2", "down")]
            .into_iter()
            .find(|(stored, _)| rest.strip_suffix(".weight") == Some(*stored))?
            .1
    } else {
        ["gate", "up", "down"].into_iter().find(|p| rest.strip_suffix("_proj.weight") == Some(*p))?
    };
    Some((base + layer.parse::<usize>().ok()?, expert.parse().ok()?, projection))
}

impl Calibration {
    /// The rule of tensor `name`; `None` when it is not a routed expert's projection (the recipe's rule applies).
    pub fn rule_for(&self, name: &str) -> Option<ExpertRule<'_>> {
        let (layer, expert, projection) = routed_expert_in(name, self.num_hidden_layers)?;
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
        // Kimi-Linear: w1 the gate, w3 the up, w2 the down projection.
        assert_eq!(routed_expert("model.layers.2.block_sparse_moe.experts.5.w1.weight"), Some((2, 5, "gate")));
        assert_eq!(routed_expert("layers.2.ffn.experts.5.w2.weight"), Some((2, 5, "down")));
        assert_eq!(routed_expert("layers.2.ffn.shared_experts.w2.weight"), None);
        assert_eq!(routed_expert("mtp.0.ffn.experts.5.w2.weight"), None, "a draft layer needs the layer count");
        assert_eq!(routed_expert_in("mtp.0.ffn.experts.5.w2.weight", Some(43)), Some((43, 5, "down")));
        assert_eq!(routed_expert_in("mtp.1.ffn.experts.5.w1.weight", Some(43)), Some((44, 5, "gate")));
        assert_eq!(routed_expert_in("layers.2.ffn.experts.5.w3.weight", Some(43)), Some((2, 5, "up")));
        assert_eq!(routed_expert_in("mtp.0.ffn.shared_experts.w1.weight", Some(43)), None);
        assert_eq!(routed_expert("model.layers.2.block_sparse_moe.experts.5.w3.weight"), Some((2, 5, "up")));
        assert_eq!(routed_expert("model.layers.2.block_sparse_moe.experts.5.w2.weight"), Some((2, 5, "down")));
        assert_eq!(routed_expert("model.layers.2.block_sparse_moe.shared_experts.down_proj.weight"), None);
    }
}

//! A calibrated conversion's calibration: the method's own pass ([`super::gptq_pass`], [`super::imatrix_pass`],
//! [`super::activation_pass`], each on the shared pass of [`super::calibrated`]) and the coverage it reached.

use std::collections::BTreeSet;
use std::path::Path;

use super::calibrated::{planned_experts, CalibrationOutput, PassResult};
use crate::arch::Model;
use crate::model::ModelConfig;
use crate::plan::calibration::{
    Calibration, CalibrationError, CalibrationOptions, CalibrationSet, ExpertCoverage, LayerCoverage, Method,
};
use crate::plan::Plan;
use crate::progress::Reporter;

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
    let PassResult { experts, layers, layers_reused, gptq_algebra } = match options.method {
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
        gptq_algebra,
        num_hidden_layers: plan.num_hidden_layers,
    })
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

//! The `imatrix` method's per-layer work in the calibration pass: each routed expert's inputs are accumulated
//! into importance vectors ([`crate::quant::imatrix::Importance`]) as the FP8 source model runs, and each expert
//! with enough tokens keeps its vectors for the quantize pass (the rest fall back to `mse`).
//!
//! Statistics come from the FP8 source model for every layer (not sequential): importance vectors are small and
//! need one pass, and each layer's inputs are those the unquantized model produces. Sequential calibration
//! (inputs from the already-quantized layers below) matters for GPTQ, whose error feedback compounds.
//!
//! Memory: one layer's f64 accumulators during the pass (`experts × (hidden + moe_intermediate) × 8 B`), then the
//! f32 importance of every MoE layer while quantizing: `MoE layers × experts × (hidden + moe_intermediate) × 4 B`
//! (gate_proj and up_proj share one vector: both read the same hidden states) — Kimi K2: 60 × 384 × 9216 × 4 B =
//! 0.85 GB; plus the runtime's activations for `samples × seq_len` tokens (see [`crate::arch`]).

use std::collections::BTreeMap;
use std::path::Path;

use crate::arch::{ExpertActivations, ExpertTap, LayerTap, Model};
use crate::progress::Reporter;
use crate::quant::imatrix::Importance;

use super::calibrated::{
    pass_layers, planned_experts, routed_counts, run_pass, CalibrationError, CalibrationOptions, CalibrationSet,
    ExpertResult, LayerCoverage, PassResult,
};
use super::plan::Plan;

/// Runs the pass; returns the importance of every planned expert with enough tokens, and the layers' coverage.
pub fn calibrate(
    dir: &Path,
    options: &CalibrationOptions,
    set: &CalibrationSet,
    plan: &Plan,
    reporter: &dyn Reporter,
) -> Result<PassResult, CalibrationError> {
    let config = Model::open(dir)?.config().clone();
    let (width, inner, count) = (config.hidden_size, config.moe_intermediate_size, config.n_routed_experts);
    let mut experts = BTreeMap::new();
    reporter.begin("calibration", pass_layers(plan, &config) as u64);
    let layers = run_pass(dir, options, set, plan, reporter, &mut |run, hidden| {
        let mut statistics: Vec<(Importance, Importance)> = if run.moe {
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
            experts: run.moe.then_some(ExpertTap {
                observer: Some(&mut observer),
                route_all: options.route_all,
                ..ExpertTap::default()
            }),
            ..LayerTap::default()
        };
        run.forward(hidden, Some(&mut tap))?;
        if !run.moe {
            return Ok(None);
        }
        let mut fallback = Vec::new();
        for (expert, (gate_up, down)) in statistics.iter().enumerate() {
            if gate_up.samples() >= options.min_expert_tokens.max(1) {
                let result = ExpertResult::Importance { gate_up: gate_up.weights(), down: down.weights() };
                experts.insert((run.index, expert), result);
            } else {
                fallback.push(expert);
            }
        }
        Ok(Some(LayerCoverage { layer: run.index, routed: routed_counts(&routes, count), fallback }))
    });
    reporter.end();
    let layers = layers?;
    let planned = planned_experts(plan);
    experts.retain(|key, _| planned.contains(key));
    Ok(PassResult { experts, layers, layers_reused: 0 })
}

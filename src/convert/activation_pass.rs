//! The calibration pass of W4A4 NVFP4 rules (`scheme = "nvfp4-w4a4"`): the largest magnitude each routed expert's
//! inputs reach as the source model runs over the calibration set — its tokens' hidden states (the input of
//! `gate_proj` and `up_proj`) and its `act(gate) · up` (the input of `down_proj`) — from which each module's
//! `input_global_scale` = 448 · 6 / absmax, as compressed-tensors' `static_minmax` observer and `generate_gparam`
//! compute it. Experts see the tokens the router sends them (what they see when served; `--force-route-all` shows
//! them every token, llm-compressor's default). An expert no calibration token reaches takes its layer's largest
//! absmax: vLLM and SGLang quantize every expert's inputs with the layer's widest scale anyway
//! ([`crate::quant::fp4::engine_activation_global`]), so it changes nothing they compute.
//!
//! Memory: two f32 per expert of a layer, plus the runtime's activations for `samples × seq_len` tokens.

use std::collections::BTreeMap;
use std::path::Path;

use crate::arch::{ExpertActivations, ExpertTap, LayerTap, Model};
use crate::progress::Reporter;
use crate::quant::fp4;

use super::calibrated::{
    pass_layers, planned_experts, routed_counts, run_pass, CalibrationError, CalibrationOptions, CalibrationSet,
    ExpertResult, LayerCoverage, PassResult,
};
use super::plan::Plan;

/// Runs the pass; returns every planned expert's input absmaxes, and the layers' coverage (`fallback`: the experts
/// no token reached, which took the layer's largest).
pub fn calibrate(
    dir: &Path,
    options: &CalibrationOptions,
    set: &CalibrationSet,
    plan: &Plan,
    reporter: &dyn Reporter,
) -> Result<PassResult, CalibrationError> {
    let count = Model::open(dir)?.config().n_routed_experts;
    let mut experts = BTreeMap::new();
    reporter.begin("calibration", pass_layers(plan, Model::open(dir)?.config()) as u64);
    let layers = run_pass(dir, options, set, plan, reporter, &mut |run, hidden| {
        // Per expert: tokens seen, absmax of its gate/up input, absmax of its down input.
        let mut seen: Vec<(u64, f32, f32)> = vec![(0, 0.0, 0.0); if run.moe { count } else { 0 }];
        let mut routes = Vec::new();
        let mut observer = |activations: &ExpertActivations| {
            if let Some((tokens, gate_up, down)) = seen.get_mut(activations.expert) {
                *tokens += activations.tokens as u64;
                *gate_up = gate_up.max(fp4::absmax(activations.input));
                *down = down.max(fp4::absmax(activations.intermediate));
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
        let widest = seen.iter().fold((0f32, 0f32), |(a, b), &(_, gate_up, down)| (a.max(gate_up), b.max(down)));
        let mut fallback = Vec::new();
        for (expert, &(tokens, gate_up, down)) in seen.iter().enumerate() {
            let (gate_up, down) = if tokens == 0 {
                fallback.push(expert);
                widest
            } else {
                (gate_up, down)
            };
            experts.insert((run.index, expert), ExpertResult::InputAbsmax { gate_up, down });
        }
        Ok(Some(LayerCoverage { layer: run.index, routed: routed_counts(&routes, count), fallback }))
    });
    reporter.end();
    let layers = layers?;
    let planned = planned_experts(plan);
    experts.retain(|key, _| planned.contains(key));
    Ok(PassResult { experts, layers, layers_reused: 0 })
}

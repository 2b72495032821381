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

use std::path::Path;

use crate::arch::ExpertActivations;
use crate::progress::Reporter;
use crate::quant::fp4;

use crate::plan::calibration::{CalibrationError, CalibrationOptions, CalibrationSet, ExpertResult};
use crate::plan::Plan;

use super::calibrated::{expert_statistics_pass, ExpertStatistics, PassResult};
use crate::runtime::cpu::Products;

/// Runs the pass; returns every planned expert's input absmaxes, and the layers' coverage (`fallback`: the experts
/// no token reached, which took the layer's largest).
pub fn calibrate(
    dir: &Path,
    options: &CalibrationOptions,
    set: &CalibrationSet,
    plan: &Plan,
    reporter: &dyn Reporter,
) -> Result<PassResult, CalibrationError> {
    // Per expert: tokens seen, absmax of its gate/up input, absmax of its down input. The runtime's exact products:
    // the scales are bytes vLLM was checked to load and score (tests/golden/vllm, nvfp4-w4a4), and one forward with
    // no GPTQ after it costs little either way.
    expert_statistics_pass(
        dir,
        (options, Products::Exact),
        set,
        plan,
        reporter,
        ExpertStatistics {
            fresh: (0u64, 0f32, 0f32),
            observe: |(tokens, gate_up, down): &mut (u64, f32, f32), seen: &ExpertActivations| {
                *tokens += seen.tokens as u64;
                *gate_up = gate_up.max(fp4::absmax(seen.input));
                *down = down.max(fp4::absmax(seen.intermediate));
            },
            finish: |statistics: &[(u64, f32, f32)]| {
                let widest =
                    statistics.iter().fold((0f32, 0f32), |(a, b), &(_, gate_up, down)| (a.max(gate_up), b.max(down)));
                let (mut results, mut fallback) = (Vec::new(), Vec::new());
                for (expert, &(tokens, gate_up, down)) in statistics.iter().enumerate() {
                    let (gate_up, down) = if tokens == 0 {
                        fallback.push(expert);
                        widest
                    } else {
                        (gate_up, down)
                    };
                    results.push((expert, ExpertResult::InputAbsmax { gate_up, down }));
                }
                (results, fallback)
            },
        },
    )
}

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

use std::path::Path;

use crate::arch::ExpertActivations;
use crate::arch::Model;
use crate::progress::Reporter;
use crate::quant::imatrix::Importance;

use crate::plan::calibration::{CalibrationError, CalibrationOptions, CalibrationSet, ExpertResult};
use crate::plan::Plan;

use super::calibrated::{expert_statistics_pass, ExpertStatistics, PassResult};
use crate::runtime::cpu::Products;

/// Runs the pass; returns the importance of every planned expert with enough tokens, and the layers' coverage.
pub fn calibrate(
    dir: &Path,
    options: &CalibrationOptions,
    set: &CalibrationSet,
    plan: &Plan,
    reporter: &dyn Reporter,
) -> Result<PassResult, CalibrationError> {
    let config = Model::open(dir)?.config().clone();
    let (width, inner) = (config.hidden_size, config.moe_intermediate_size);
    expert_statistics_pass(
        dir,
        (options, Products::Blocked),
        set,
        plan,
        reporter,
        ExpertStatistics {
            fresh: (Importance::new(width), Importance::new(inner)),
            observe: |(gate_up, down): &mut (Importance, Importance), seen: &ExpertActivations| {
                gate_up.add(seen.input);
                down.add(seen.intermediate);
            },
            finish: |statistics: &[(Importance, Importance)]| {
                let (mut results, mut fallback) = (Vec::new(), Vec::new());
                for (expert, (gate_up, down)) in statistics.iter().enumerate() {
                    if gate_up.samples() >= options.min_expert_tokens.max(1) {
                        results.push((
                            expert,
                            ExpertResult::Importance { gate_up: gate_up.weights(), down: down.weights() },
                        ));
                    } else {
                        fallback.push(expert);
                    }
                }
                (results, fallback)
            },
        },
    )
}

//! The `gptq` method's per-layer work in the calibration pass: each MoE layer's normed MoE input and routes are
//! kept from its forward, then its routed experts are streamed in batches — for each expert of a batch the
//! Hessians `H = XᵀX` of its inputs are accumulated (gate_proj and up_proj share the one of the hidden states of
//! the tokens routed to it; down_proj gets its own, of its intermediate activations `silu(gate x) · (up x)`),
//! its three projections are quantized by GPTQ ([`crate::quant::gptq`]: damping 1 % of the mean diagonal,
//! feedback in blocks of 128 columns, each group's scale chosen by the recipe's rule from the updated weights
//! when the group starts, no act-order), written to the layer's spill file ([`crate::plan::expert_spill`]) and dropped.
//! Experts shown fewer than `--min-expert-tokens` rows fall back to `mse` (listed in the coverage). The Hessians,
//! factors and column loops run where [`Algebra::for_backend`] says: on the pass's device when it has one, else on
//! the host's cores.
//!
//! `--sequential` (the default, chosen by measurement: BENCHMARKS.md): once a layer's experts are quantized the
//! layer is run again from its input with those experts (dequantized INT4), and that output feeds the next layer,
//! so each layer's Hessians see the inputs the quantized layers below produce, as GPTQ's reference
//! implementations calibrate. `--no-sequential`: every layer's inputs come from the FP8 model (one forward per
//! layer).
//!
//! # Memory
//! Hessians are never held for a whole layer (GLM-5: 256 experts × (6144² + 2048²) × 8 B = 86 GB); at most one
//! batch of experts is worked on at once, the batch sized so that its working set stays under
//! [`GPTQ_BATCH_BYTES`] (at least one expert):
//!
//! ```text
//! peak ≈ the runtime's pass working set (see crate::arch: two layers without routed experts, 2 expert batches,
//!        activations of tokens = samples × seq_len)
//!      + the layer's MoE input and, sequential, its input copy:   2 × tokens × hidden × 4 B
//!      + routes: tokens × top_k × 8 B
//!      + one GPTQ batch: experts_per_batch × per_expert, per_expert =
//!          (hidden² + moe_intermediate²) × 8 B                  (the two f64 Hessians)
//!        + 6 × max(hidden, moe_intermediate)² × 8 B             (damped inverse and its Cholesky factors; one
//!                                                                for gate_proj and up_proj together)
//!        + 3 × hidden × moe_intermediate × 13 B                 (f32 weights, f64 working rows, i8 codes)
//!        + rows_e × (hidden + moe_intermediate) × 4 B           (its gathered inputs; with --force-route-all
//!                                                                the layer's own, not gathered)
//!      + with --force-route-all: hidden² × 8 B                  (the hidden states' factor, the same for every
//!                                                                expert: computed once per layer)
//! ```
//! GLM-5 (hidden 6144, moe_intermediate 2048): per_expert ≈ 0.34 + 1.81 + 0.49 = 2.6 GB, one expert per 4 GiB
//! batch; Kimi K2 (7168, 2048): ≈ 3.5 GB. The quantized experts go to disk as they are done (the output folder
//! holds one extra copy of the routed experts' INT4 bytes until the run completes).

use std::collections::BTreeMap;
use std::path::Path;

use rayon::prelude::*;

use crate::arch::{ExpertTap, LayerTap, Model};
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::progress::Reporter;
use crate::quant::gptq::{GptqSettings, Quantized};
use crate::quant::ScaleRule;
use crate::runtime::backend::Backend;
use crate::runtime::cpu::Products;
use crate::runtime::matrix::Matrix;
use crate::runtime::RuntimeError;

use crate::plan::calibration::{CalibrationError, CalibrationOptions, CalibrationSet, ExpertResult, LayerCoverage};
use crate::plan::expert_spill::{self, LayerEntries, LayerSpill};
use crate::plan::{Action, Plan};

use super::calibrated::{pass_layers, routed_counts, run_pass, CalibrationOutput, PassResult};
use super::gptq_algebra::{Algebra, Factor};

/// Bytes one GPTQ batch of experts may take (see the module doc); at least one expert per batch.
pub const GPTQ_BATCH_BYTES: usize = 4 << 30;

/// The working set of one expert in a GPTQ batch, without its gathered inputs.
pub fn expert_working_bytes(hidden: usize, inner: usize) -> usize {
    let widest = hidden.max(inner);
    (hidden * hidden + inner * inner) * 8 + 6 * widest * widest * 8 + 3 * hidden * inner * 13
}

/// Experts per GPTQ batch.
pub fn experts_per_batch(hidden: usize, inner: usize) -> usize {
    (GPTQ_BATCH_BYTES / expert_working_bytes(hidden, inner).max(1)).max(1)
}

/// One planned INT4 projection of a routed expert.
#[derive(Debug, Clone, Copy)]
struct Target {
    group_size: usize,
    rule: ScaleRule,
}

/// `projection → target` per `(layer, expert)` of the plan.
type Targets = BTreeMap<(usize, usize), BTreeMap<&'static str, Target>>;

fn targets(plan: &Plan) -> Targets {
    let mut targets = Targets::new();
    for item in &plan.items {
        let Action::Int4 { group_size, scale_rule, .. } = item.action else { continue };
        let Some((layer, expert, projection)) = plan.routed_expert(&item.source.name) else { continue };
        let projection = match projection {
            "gate" => "gate",
            "up" => "up",
            _ => "down",
        };
        targets.entry((layer, expert)).or_default().insert(projection, Target { group_size, rule: scale_rule });
    }
    targets
}

/// Runs the pass; returns every planned expert GPTQ quantized (its spill entries) and the layers' coverage.
pub fn calibrate(
    dir: &Path,
    options: &CalibrationOptions,
    set: &CalibrationSet,
    plan: &Plan,
    output: CalibrationOutput,
    reporter: &dyn Reporter,
) -> Result<PassResult, CalibrationError> {
    let config = Model::open(dir)?.config().clone();
    let targets = targets(plan);
    let settings = GptqSettings::default();
    let mut experts = BTreeMap::new();
    let mut layers_reused = 0;
    let mut algebra_used = None;
    // Progress: one unit per layer and one per planned expert.
    reporter.begin("gptq", (pass_layers(plan, &config) + targets.len()) as u64);
    let layers = run_pass(dir, (options, Products::Blocked), set, plan, reporter, &mut |run, hidden| {
        if !run.moe {
            run.forward(hidden, None)?;
            return Ok(None);
        }
        let backend = run.context.backend;
        let input = if options.sequential { Some(backend.row_range(hidden, 0..hidden.rows())?) } else { None };
        let (mut x, mut routes) = (Vec::new(), Vec::new());
        let mut tap = LayerTap {
            routes: Some(&mut routes),
            experts: Some(ExpertTap { input: Some(&mut x), ..ExpertTap::default() }),
            ..LayerTap::default()
        };
        run.forward(hidden, Some(&mut tap))?;
        let count = config.n_routed_experts;
        let tokens = routes.len();
        let mut rows: Vec<Vec<usize>> = vec![Vec::new(); count];
        for (token, route) in routes.iter().enumerate() {
            for &expert in route {
                rows[expert].push(token);
            }
        }
        if options.route_all {
            rows = vec![(0..tokens).collect(); count];
        }
        let enough = |expert: usize| rows[expert].len() as u64 >= options.min_expert_tokens.max(1);
        let fallback: Vec<usize> = (0..count).filter(|&expert| !enough(expert)).collect();
        let chosen: Vec<usize> = (0..count).filter(|&e| enough(e) && targets.contains_key(&(run.index, e))).collect();
        let skipped = targets.range((run.index, 0)..(run.index + 1, 0)).count() - chosen.len();
        reporter.advance(skipped as u64);

        let reused =
            if output.resume { expert_spill::finished(output.dir, run.index, output.plan_sha256) } else { None };
        let entries = match reused.filter(|entries| covers(entries, &chosen, &targets, run.index)) {
            Some(entries) => {
                reporter.advance(chosen.len() as u64);
                layers_reused += 1;
                entries
            }
            None => {
                let mut spill = LayerSpill::create(output.dir, run.index)?;
                let per_batch = experts_per_batch(config.hidden_size, config.moe_intermediate_size);
                let groups = targets.values().flat_map(|projections| projections.values().map(|t| t.group_size));
                let algebra = Algebra::for_backend(backend, groups);
                if algebra_used.is_none() && backend.device().is_some() && matches!(algebra, Algebra::Host) {
                    reporter.warn("gptq: a group is wider than the device's GPTQ block; its algebra runs on the host");
                }
                algebra_used = Some(algebra.name());
                // With --force-route-all every expert reads every token: one Hessian of the hidden states, one factor.
                let shared = match options.route_all && !chosen.is_empty() {
                    true => Some(shared_hidden_factor(&algebra, &x, config.hidden_size, settings, run.index)?),
                    false => None,
                };
                for batch in chosen.chunks(per_batch) {
                    let layer = run.index;
                    let shared = shared.as_ref();
                    let work =
                        Work { layer, x: &x, rows: &rows, targets: &targets, settings, shared, algebra: &algebra };
                    let done = work.batch(batch, run.context.reader, run.context.backend, &config)?;
                    for (expert, projections) in done {
                        for (projection, target, columns, quantized) in projections {
                            spill.append(
                                expert,
                                projection,
                                columns,
                                target.group_size,
                                &quantized.codes,
                                &quantized.scales,
                            )?;
                        }
                    }
                    reporter.advance(batch.len() as u64);
                }
                spill.finish(output.plan_sha256)?
            }
        };
        let mut by_expert: BTreeMap<usize, BTreeMap<String, expert_spill::SpillEntry>> = BTreeMap::new();
        for ((expert, projection), entry) in &entries {
            by_expert.entry(*expert).or_default().insert(projection.clone(), entry.clone());
        }
        if let Some(input) = input {
            // Sequential: the next layer's input is this layer's output with its quantized experts.
            *hidden = input;
            let replacement = |expert: usize| -> Result<Option<[Matrix; 3]>, RuntimeError> {
                let Some(projections) = by_expert.get(&expert) else { return Ok(None) };
                let matrix = |name: &str| projections.get(name).map(|entry| entry.matrix()).transpose();
                Ok(match (matrix("gate")?, matrix("up")?, matrix("down")?) {
                    (Some(gate), Some(up), Some(down)) => Some([gate, up, down]),
                    _ => None,
                })
            };
            let mut tap = LayerTap {
                experts: Some(ExpertTap { replacement: Some(&replacement), ..ExpertTap::default() }),
                ..LayerTap::default()
            };
            run.forward(hidden, Some(&mut tap))?;
        }
        for (expert, projections) in by_expert {
            experts.insert((run.index, expert), ExpertResult::Quantized(projections));
        }
        Ok(Some(LayerCoverage { layer: run.index, routed: routed_counts(&routes, count), fallback }))
    });
    reporter.end();
    Ok(PassResult { experts, layers: layers?, layers_reused, gptq_algebra: algebra_used })
}

/// Whether reused entries hold every projection the plan quantizes for the chosen experts.
fn covers(entries: &LayerEntries, chosen: &[usize], targets: &Targets, layer: usize) -> bool {
    let wanted: usize = chosen.iter().map(|&expert| targets.get(&(layer, expert)).map_or(0, BTreeMap::len)).sum();
    wanted == entries.len()
        && chosen.iter().all(|&expert| {
            targets.get(&(layer, expert)).is_some_and(|projections| {
                projections.keys().all(|projection| entries.contains_key(&(expert, projection.to_string())))
            })
        })
}

/// The damped inverse Hessian's factor of a layer's hidden states over all its tokens: what gate_proj and up_proj of
/// every expert read under `--force-route-all` (computed once per layer, not once per expert).
fn shared_hidden_factor(
    algebra: &Algebra,
    x: &[f32],
    hidden: usize,
    settings: GptqSettings,
    layer: usize,
) -> Result<Factor, RuntimeError> {
    algebra
        .factor(x, hidden, settings.damping)
        .map_err(|e| RuntimeError::Output(format!("gptq model.layers.{layer}.mlp.experts (all tokens): {e}")))
}

/// One projection GPTQ quantized: its name, target, columns and codes/scales.
type Done = (&'static str, Target, usize, Quantized);

/// What one layer's experts are quantized from.
struct Work<'a> {
    layer: usize,
    /// The layer's normed MoE input `[tokens, hidden]`.
    x: &'a [f32],
    /// The tokens each expert's statistics read.
    rows: &'a [Vec<usize>],
    targets: &'a Targets,
    settings: GptqSettings,
    /// The factor every expert's gate_proj and up_proj share when every expert reads every token.
    shared: Option<&'a Factor>,
    /// Where the Hessians, factors and column loops run.
    algebra: &'a Algebra<'a>,
}

impl Work<'_> {
    /// Accumulates the Hessians of the batch's experts and quantizes their planned projections; experts in order.
    fn batch(
        &self,
        batch: &[usize],
        reader: &WeightReader,
        backend: &dyn Backend,
        config: &ModelConfig,
    ) -> Result<Vec<(usize, Vec<Done>)>, RuntimeError> {
        batch.par_iter().map(|&expert| Ok((expert, self.expert(expert, reader, backend, config)?))).collect()
    }

    fn expert(
        &self,
        expert: usize,
        reader: &WeightReader,
        backend: &dyn Backend,
        config: &ModelConfig,
    ) -> Result<Vec<Done>, RuntimeError> {
        let (hidden, inner) = (config.hidden_size, config.moe_intermediate_size);
        let names = config.moe_names();
        let module = format!("{}.{}.experts.{expert}", config.layer_prefix(self.layer), names.block);
        let [gate_name, up_name, down_name] = names.expert;
        let stored = |projection: &str| match projection {
            "gate" => gate_name,
            "up" => up_name,
            _ => down_name,
        };
        let rows = &self.rows[expert];
        let planned = self.targets.get(&(self.layer, expert)).cloned().unwrap_or_default();
        let failed = |projection: &str, e: String| {
            RuntimeError::Output(format!("gptq {module}.{}.weight: {e}", stored(projection)))
        };
        let factor = |inputs: &[f32], width: usize, projection: &str| {
            self.algebra.factor(inputs, width, self.settings.damping).map_err(|e| failed(projection, e))
        };
        // With a shared factor every token is the expert's: its inputs are the layer's, not gathered.
        let gathered: Vec<f32>;
        let inputs = match self.shared {
            Some(_) => self.x,
            None => {
                gathered =
                    rows.iter().flat_map(|&row| self.x[row * hidden..(row + 1) * hidden].iter().copied()).collect();
                &gathered
            }
        };
        let gate = reader.matrix(&format!("{module}.{gate_name}.weight"), [inner, hidden])?;
        let up = reader.matrix(&format!("{module}.{up_name}.weight"), [inner, hidden])?;
        let down = reader.matrix(&format!("{module}.{down_name}.weight"), [hidden, inner])?;
        // gate_proj and up_proj share one factor of the damped inverse Hessian.
        let own_hidden_factor;
        let hidden_factor = match (planned.contains_key("gate") || planned.contains_key("up"), self.shared) {
            (false, _) => None,
            (true, Some(shared)) => Some(shared),
            (true, None) => {
                own_hidden_factor = factor(inputs, hidden, "gate")?;
                Some(&own_hidden_factor)
            }
        };
        let x = backend.upload(inputs, hidden)?;
        let intermediate =
            backend.download(&backend.silu_mul(&backend.linear(&x, &gate, None)?, &backend.linear(&x, &up, None)?)?)?;
        drop(x);
        let inner_factor = match planned.contains_key("down") {
            true => Some(factor(&intermediate, inner, "down")?),
            false => None,
        };
        drop(intermediate);
        let mut done = Vec::new();
        for (projection, weights, factor) in
            [("gate", &gate, hidden_factor), ("up", &up, hidden_factor), ("down", &down, inner_factor.as_ref())]
        {
            let (Some(target), Some(factor)) = (planned.get(projection).copied(), factor) else { continue };
            let quantized = self
                .algebra
                .quantize(
                    weights.values(),
                    (weights.rows, weights.columns),
                    factor,
                    (target.group_size, target.rule),
                    self.settings.block,
                )
                .map_err(|e| failed(projection, e))?;
            done.push((projection, target, weights.columns, quantized));
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_batch_arithmetic_holds() {
        // GLM-5 and Kimi K2 experts: one per batch, ≈ 2.6 GB and ≈ 3.5 GB (the module doc).
        assert_eq!((expert_working_bytes(6144, 2048) as f64 / 1e8).round(), 26.0);
        assert_eq!((expert_working_bytes(7168, 2048) as f64 / 1e8).round(), 35.0);
        assert_eq!(experts_per_batch(6144, 2048), 1);
        assert_eq!(experts_per_batch(7168, 2048), 1);
        // The tiny trained model's experts (192, 96) all fit in one batch.
        assert!(experts_per_batch(192, 96) >= 8);
    }
}

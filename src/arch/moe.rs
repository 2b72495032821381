//! SwiGLU MLPs: the dense MLP of the first layers, and the MoE block — sigmoid router with
//! `e_score_correction_bias` for selection only, group-limited top-k, `norm_topk_prob`, `routed_scaling_factor`
//! (DeepSeek-V4: its own scores and hash routing, [`super::router`]), routed experts
//! streamed in double-buffered batches (read ahead on a loader thread), plus shared experts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use rayon::prelude::*;

use super::context::LayerContext;
use super::router::{TokenRoutes, V4Selection};
use super::tap::{ExpertActivations, ExpertTap};
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::quant::fp4::engine_activation_global;
use crate::runtime::backend::{Backend, ExpertInputs, RoutedExpert, RoutingShape};
use crate::runtime::matrix::Matrix;
use crate::runtime::tensor::Tensor;
use crate::runtime::RuntimeError;

pub struct DenseMlp {
    gate: Matrix,
    up: Matrix,
    down: Matrix,
    /// The SwiGLU clamp ([`ModelConfig::swiglu_limit`]).
    limit: Option<f32>,
}

impl DenseMlp {
    /// Every weight matrix (for device prefetch).
    pub fn matrices(&self) -> [&Matrix; 3] {
        [&self.gate, &self.up, &self.down]
    }

    /// The MLP `module` with `{gate,up,down}_proj` of a model of `config`.
    pub fn load(reader: &WeightReader, config: &ModelConfig, module: &str, inner: usize) -> Result<Self, RuntimeError> {
        Self::load_named(reader, config, module, ["gate_proj", "up_proj", "down_proj"], inner)
    }

    /// The MLP `module` whose gate, up and down projections are named `projections`.
    fn load_named(
        reader: &WeightReader,
        config: &ModelConfig,
        module: &str,
        [gate, up, down]: [&str; 3],
        inner: usize,
    ) -> Result<Self, RuntimeError> {
        let hidden = config.hidden_size;
        Ok(Self {
            gate: reader.matrix(&format!("{module}.{gate}.weight"), [inner, hidden])?,
            up: reader.matrix(&format!("{module}.{up}.weight"), [inner, hidden])?,
            down: reader.matrix(&format!("{module}.{down}.weight"), [hidden, inner])?,
            limit: config.swiglu_limit(),
        })
    }

    pub fn forward(&self, backend: &dyn Backend, x: &Tensor) -> Result<Tensor, RuntimeError> {
        backend.linear(&self.intermediate(backend, x)?, &self.down, None)
    }

    /// The activations `down_proj` takes: `silu(gate) · up` (their inputs clamped where the model clamps them).
    fn intermediate(&self, backend: &dyn Backend, x: &Tensor) -> Result<Tensor, RuntimeError> {
        let gate = backend.linear(x, &self.gate, None)?;
        let up = backend.linear(x, &self.up, None)?;
        let Some(limit) = self.limit else { return backend.silu_mul(&gate, &up) };
        // The clamp visits the host (a GLM-5.3-Flash-only step).
        let (mut gate_values, mut up_values) = (backend.download(&gate)?, backend.download(&up)?);
        crate::runtime::cpu::activation::clamp_swiglu(&mut gate_values, &mut up_values, limit);
        let columns = gate.columns();
        backend.silu_mul(&backend.upload(&gate_values, columns)?, &backend.upload(&up_values, columns)?)
    }
}

/// Shows each expert of a loaded batch its tokens' rows of `x` and its intermediate activations `act(gate) · up`
/// (every token with `tap.route_all`); experts without a token are skipped.
fn observe_experts(
    backend: &dyn Backend,
    x: &Tensor,
    batch: &[(usize, DenseMlp)],
    assigned: &[Vec<(usize, f32)>],
    tap: &mut ExpertTap,
) -> Result<(), RuntimeError> {
    let tokens = x.rows();
    let Some(observer) = tap.observer.as_mut() else { return Ok(()) };
    for (expert, mlp) in batch {
        let rows: Vec<usize> = if tap.route_all {
            (0..tokens).collect()
        } else {
            assigned[*expert].iter().map(|&(token, _)| token).collect()
        };
        if rows.is_empty() {
            continue;
        }
        let input = backend.gather_rows(x, &rows)?;
        let intermediate = mlp.intermediate(backend, &input)?;
        observer(&ExpertActivations {
            expert: *expert,
            tokens: rows.len(),
            input: &backend.download(&input)?,
            intermediate: &backend.download(&intermediate)?,
        });
    }
    Ok(())
}

/// How the engines quantize the inputs of a layer's routed experts: W4A4 NVFP4 when they have `input_global_scale`s
/// (all of them, or the folder is refused), each operand's global scale the one the engines make of all experts'
/// ([`engine_activation_global`]: one for the fused gate/up, one for down).
fn expert_inputs(
    reader: &WeightReader,
    experts_module: &str,
    [gate, up, down]: [&str; 3],
    experts: usize,
) -> Result<ExpertInputs, RuntimeError> {
    let module = |expert: usize, projection: &str| format!("{experts_module}.{expert}.{projection}");
    if reader.input_global_scale(&module(0, gate))?.is_none() {
        return Ok(ExpertInputs::Exact);
    }
    let mut scales = [Vec::new(), Vec::new()];
    for expert in 0..experts {
        for (projection, into) in [(gate, 0), (up, 0), (down, 1)] {
            let name = module(expert, projection);
            let scale = reader.input_global_scale(&name)?.ok_or_else(|| {
                RuntimeError::Input(format!(
                    "{name}.input_global_scale: missing, while {first}.input_global_scale exists (W4A4 NVFP4 needs \
                     every routed expert's); the folder is damaged: check it with `squeeze verify` and rerun `squeeze \
                     quantize`",
                    first = module(0, gate)
                ))
            })?;
            scales[into].push(scale);
        }
    }
    let [gate_up, down] = scales.map(|scales| engine_activation_global(scales).unwrap_or(1.0));
    Ok(ExpertInputs::Nvfp4 { gate_up, down })
}

pub struct MoeWeights {
    router: Matrix,
    correction_bias: Matrix,
    /// DeepSeek-V4's expert selection (sqrtsoftplus scores, hash or learned); `None`: the sigmoid router.
    v4: Option<V4Selection>,
    shared: Option<DenseMlp>,
    /// `model.layers.N.mlp.experts` (or the architecture's name for it), the routed experts' common prefix.
    experts_module: String,
    /// Each routed expert's gate, up and down projection names.
    expert_projections: [&'static str; 3],
    /// How the engines quantize the routed experts' inputs (W4A4 NVFP4: from their `input_global_scale`s).
    inputs: ExpertInputs,
}

/// Host bytes of routed experts read in one batch. Two batches are in memory at once (one computing, one read
/// ahead), so routed experts take at most 2 × 2 GiB (or two experts when one alone is larger). A Kimi K2 / GLM-5
/// expert (3 × 2048 × 7168 / 6144 weights) is ~150–180 MiB in f32 plus its packed INT4 form, so a batch holds ~10:
/// enough experts to keep the CPU's threads busy and to amortize the device's launches and copies over a batch.
/// (Streaming one expert per worker thread, as before, held 64 × 176 MiB = 11 GiB on a 64-core host.)
pub const EXPERT_BATCH_BYTES: usize = 2 << 30;

/// Host bytes one routed expert takes once read: f32 values (4 B) plus, for INT4 checkpoints, the packed nibbles
/// (½ B) and BF16 scales (2 B per group of at least 8 weights, ≤ ¼ B): at most 5 B per weight.
fn expert_bytes(hidden: usize, inner: usize) -> usize {
    3 * hidden * inner * 5
}

/// Routed experts read per batch under [`EXPERT_BATCH_BYTES`] (at least one).
pub fn experts_per_batch(hidden: usize, inner: usize) -> usize {
    (EXPERT_BATCH_BYTES / expert_bytes(hidden, inner).max(1)).max(1)
}

/// Where the routed-expert phase spends its time (nanoseconds, summed over the layer's MoE calls).
#[derive(Default)]
pub struct ExpertTimes {
    /// Waiting for the loader thread to finish reading a batch: the reading not hidden behind compute.
    pub load_nanos: AtomicU64,
    /// Applying routed experts (and the shared experts).
    pub compute_nanos: AtomicU64,
    /// Wall nanoseconds of the routed-expert phase.
    pub phase_nanos: AtomicU64,
}

impl MoeWeights {
    /// The resident weight matrices: router and shared experts (routed experts stream separately).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all = vec![&self.router];
        all.extend(self.shared.iter().flat_map(DenseMlp::matrices));
        all
    }

    /// The MoE block of layer `layer` (stored under `prefix`).
    pub fn load(reader: &WeightReader, config: &ModelConfig, prefix: &str, layer: usize) -> Result<Self, RuntimeError> {
        let (hidden, experts) = (config.hidden_size, config.n_routed_experts);
        let names = config.moe_names();
        let block = format!("{prefix}.{}", names.block);
        let shared = match config.n_shared_experts {
            0 => None,
            n => Some(DenseMlp::load_named(
                reader,
                config,
                &format!("{block}.shared_experts"),
                names.shared,
                config.moe_intermediate_size * n,
            )?),
        };
        let v4 = match config.deepseek_v4() {
            Some(_) => Some(V4Selection::load(reader, config, &block, layer)?),
            None => None,
        };
        let experts_module = format!("{block}.experts");
        Ok(Self {
            router: reader.matrix(&format!("{block}.gate.weight"), [experts, hidden])?,
            correction_bias: if reader.contains(&format!("{block}.gate.e_score_correction_bias")) {
                reader.parameter(&format!("{block}.gate.e_score_correction_bias"), experts)?
            } else {
                Matrix::new(1, experts, vec![0.0; experts])
            },
            shared,
            v4,
            inputs: expert_inputs(reader, &experts_module, names.expert, experts)?,
            experts_module,
            expert_projections: names.expert,
        })
    }

    /// `(experts, weights)` per token (`ids`: each row's token id, which a hash-routed layer needs), and the number
    /// of near-ties at the top-k boundary.
    pub(super) fn route(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &Tensor,
        ids: &[u32],
    ) -> Result<(TokenRoutes, usize), RuntimeError> {
        let experts = config.n_routed_experts;
        let routing = &config.routing;
        let logits = backend.linear(x, &self.router, None)?;
        let shape = RoutingShape {
            experts,
            top_k: config.num_experts_per_tok,
            groups: routing.n_group.min(experts).max(1),
            topk_group: routing.topk_group,
            norm_topk_prob: routing.norm_topk_prob,
            routed_scaling_factor: routing.routed_scaling_factor as f32,
        };
        if let Some(v4) = &self.v4 {
            return v4.route(&backend.download(&logits)?, ids, &shape);
        }
        let routes = backend.route(&logits, &self.correction_bias, &shape)?;
        let chosen = routes
            .experts
            .chunks(routes.top_k.max(1))
            .zip(routes.weights.chunks(routes.top_k.max(1)))
            .map(|(experts, weights)| experts.iter().copied().zip(weights.iter().copied()).collect())
            .collect();
        Ok((chosen, routes.near_ties))
    }

    /// The MoE output `[tokens, hidden]` for normed input `x`.
    ///
    /// The experts hit by some token are read in ascending order, in batches of [`experts_per_batch`]: a loader
    /// thread reads batch `b + 1` while the backend applies batch `b` ([`Backend::routed_experts`]), so at most two
    /// batches are in memory. Each token sums its experts in ascending expert order (as transformers' expert loop
    /// does), whatever the batching. With an expert tap each expert of a batch is shown its tokens' rows of `x`
    /// and its intermediate activations after the batch is applied (with `route_all`, every token and every
    /// expert of the layer, read for the tap alone); the tap may also take a copy of `x` and replace experts'
    /// weights with its own.
    pub fn forward(
        &self,
        context: &LayerContext,
        (x, ids): (&Tensor, &[u32]),
        times: &ExpertTimes,
        near_ties: &mut usize,
        mut tap: Option<&mut ExpertTap>,
    ) -> Result<Tensor, RuntimeError> {
        let LayerContext { backend, reader, config, .. } = *context;
        let hidden = config.hidden_size;
        let inner = config.moe_intermediate_size;
        let tokens = x.rows();
        let (routes, ties) = self.route(backend, config, x, ids)?;
        *near_ties += ties;
        // Tokens and weights per expert.
        let mut assigned: Vec<Vec<(usize, f32)>> = vec![Vec::new(); config.n_routed_experts];
        for (token, route) in routes.iter().enumerate() {
            for &(expert, weight) in route {
                assigned[expert].push((token, weight));
            }
        }
        let route_all = tap.as_ref().is_some_and(|tap| tap.route_all);
        let replacement = tap.as_ref().and_then(|tap| tap.replacement);
        if let Some(input) = tap.as_mut().and_then(|tap| tap.input.as_deref_mut()) {
            // A tap: the MoE input visits the host.
            *input = backend.download(x)?;
        }
        let hit: Vec<usize> = (0..assigned.len()).filter(|&expert| route_all || !assigned[expert].is_empty()).collect();
        let per_batch = experts_per_batch(hidden, inner);
        let mut output = backend.zeros(tokens, hidden)?;
        let phase = Instant::now();
        std::thread::scope(|scope| -> Result<(), RuntimeError> {
            // Rendezvous: the loader holds the batch it read until the previous one is done (two in memory).
            let (sender, receiver) = sync_channel::<Result<Vec<(usize, DenseMlp)>, RuntimeError>>(0);
            let hit = &hit;
            // On a device backend the loader also uploads each batch it read, overlapping the previous batch.
            let prefetch = backend.prefetcher();
            scope.spawn(move || {
                for batch in hit.chunks(per_batch) {
                    let loaded: Result<Vec<_>, _> = batch
                        .par_iter()
                        .map(|&expert| {
                            if let Some([gate, up, down]) =
                                replacement.map(|replace| replace(expert)).transpose()?.flatten()
                            {
                                return Ok((expert, DenseMlp { gate, up, down, limit: config.swiglu_limit() }));
                            }
                            let module = format!("{}.{expert}", self.experts_module);
                            let projections = self.expert_projections;
                            Ok((expert, DenseMlp::load_named(reader, config, &module, projections, inner)?))
                        })
                        .collect();
                    if let (Ok(batch), Some(prefetch)) = (&loaded, &prefetch) {
                        let matrices: Vec<&Matrix> = batch.iter().flat_map(|(_, mlp)| mlp.matrices()).collect();
                        prefetch.prefetch(&matrices);
                    }
                    let failed = loaded.is_err();
                    if sender.send(loaded).is_err() || failed {
                        return;
                    }
                }
            });
            for _ in hit.chunks(per_batch) {
                let waiting = Instant::now();
                let batch = receiver.recv().map_err(|_| {
                    RuntimeError::Input("the expert loader stopped early (it panicked; see stderr)".into())
                })??;
                let computing = Instant::now();
                times.load_nanos.fetch_add((computing - waiting).as_nanos() as u64, Ordering::Relaxed);
                let experts: Vec<RoutedExpert> = batch
                    .iter()
                    .filter(|(expert, _)| !assigned[*expert].is_empty())
                    .map(|(expert, mlp)| RoutedExpert {
                        gate: &mlp.gate,
                        up: &mlp.up,
                        down: &mlp.down,
                        tokens: &assigned[*expert],
                        inputs: self.inputs,
                        swiglu_limit: mlp.limit,
                    })
                    .collect();
                backend.routed_experts(x, &experts, &mut output)?;
                if let Some(tap) = tap.as_deref_mut() {
                    observe_experts(backend, x, &batch, &assigned, tap)?;
                }
                times.compute_nanos.fetch_add(computing.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            Ok(())
        })?;
        times.phase_nanos.fetch_add(phase.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Some(shared) = &self.shared {
            let started = Instant::now();
            let extra = shared.forward(backend, x)?;
            backend.add(&mut output, &extra)?;
            times.compute_nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        Ok(output)
    }
}

//! SwiGLU MLPs: the dense MLP of the first layers, and the MoE block — sigmoid router with
//! `e_score_correction_bias` for selection only, group-limited top-k, `norm_topk_prob`, `routed_scaling_factor`,
//! routed experts streamed one at a time per worker, plus shared experts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use super::backend::{Backend, Matrix, RoutingShape};
use super::weights::WeightReader;
use super::RuntimeError;
use crate::model::ModelConfig;

/// Relative score margin at the expert top-k boundary under which another f32 implementation may pick differently.
pub const NEAR_TIE_RELATIVE: f32 = 1e-5;

pub struct DenseMlp {
    gate: Matrix,
    up: Matrix,
    down: Matrix,
}

impl DenseMlp {
    /// Every weight matrix (for device prefetch).
    pub fn matrices(&self) -> [&Matrix; 3] {
        [&self.gate, &self.up, &self.down]
    }

    pub fn load(reader: &WeightReader, module: &str, hidden: usize, inner: usize) -> Result<Self, RuntimeError> {
        Ok(Self {
            gate: reader.matrix(&format!("{module}.gate_proj.weight"), [inner, hidden])?,
            up: reader.matrix(&format!("{module}.up_proj.weight"), [inner, hidden])?,
            down: reader.matrix(&format!("{module}.down_proj.weight"), [hidden, inner])?,
        })
    }

    pub fn forward(&self, backend: &dyn Backend, x: &[f32], tokens: usize) -> Vec<f32> {
        let gate = backend.linear(x, tokens, &self.gate, None);
        let up = backend.linear(x, tokens, &self.up, None);
        backend.linear(&backend.silu_mul(&gate, &up), tokens, &self.down, None)
    }
}

pub struct MoeWeights {
    router: Matrix,
    correction_bias: Vec<f32>,
    shared: Option<DenseMlp>,
    prefix: String,
}

/// Nanoseconds spent dequantizing and computing routed experts, summed over worker threads.
#[derive(Default)]
pub struct ExpertTimes {
    pub load_nanos: AtomicU64,
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

    pub fn load(reader: &WeightReader, config: &ModelConfig, prefix: &str) -> Result<Self, RuntimeError> {
        let (hidden, experts) = (config.hidden_size, config.n_routed_experts);
        let shared = match config.n_shared_experts {
            0 => None,
            n => Some(DenseMlp::load(
                reader,
                &format!("{prefix}.mlp.shared_experts"),
                hidden,
                config.moe_intermediate_size * n,
            )?),
        };
        Ok(Self {
            router: reader.matrix(&format!("{prefix}.mlp.gate.weight"), [experts, hidden])?,
            correction_bias: if reader.contains(&format!("{prefix}.mlp.gate.e_score_correction_bias")) {
                reader.vector(&format!("{prefix}.mlp.gate.e_score_correction_bias"), experts)?
            } else {
                vec![0.0; experts]
            },
            shared,
            prefix: prefix.to_string(),
        })
    }

    /// `(experts, weights)` per token, and the number of near-ties at the top-k boundary.
    pub(super) fn route(
        &self,
        backend: &dyn Backend,
        config: &ModelConfig,
        x: &[f32],
        tokens: usize,
    ) -> (Vec<Vec<(usize, f32)>>, usize) {
        let experts = config.n_routed_experts;
        let routing = &config.routing;
        let logits = backend.linear(x, tokens, &self.router, None);
        let shape = RoutingShape {
            experts,
            top_k: config.num_experts_per_tok,
            groups: routing.n_group.min(experts).max(1),
            topk_group: routing.topk_group,
            norm_topk_prob: routing.norm_topk_prob,
            routed_scaling_factor: routing.routed_scaling_factor as f32,
        };
        let routes = backend.route(&logits, tokens, &self.correction_bias, &shape);
        let chosen = routes
            .experts
            .chunks(routes.top_k.max(1))
            .zip(routes.weights.chunks(routes.top_k.max(1)))
            .map(|(experts, weights)| experts.iter().copied().zip(weights.iter().copied()).collect())
            .collect();
        (chosen, routes.near_ties)
    }

    /// The MoE output `[tokens, hidden]` for normed input `x`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        backend: &dyn Backend,
        reader: &WeightReader,
        config: &ModelConfig,
        x: &[f32],
        tokens: usize,
        times: &ExpertTimes,
        near_ties: &mut usize,
    ) -> Result<Vec<f32>, RuntimeError> {
        let hidden = config.hidden_size;
        let inner = config.moe_intermediate_size;
        let (routes, ties) = self.route(backend, config, x, tokens);
        *near_ties += ties;
        // Tokens and weights per expert.
        let mut assigned: Vec<Vec<(usize, f32)>> = vec![Vec::new(); config.n_routed_experts];
        for (token, route) in routes.iter().enumerate() {
            for &(expert, weight) in route {
                assigned[expert].push((token, weight));
            }
        }
        let phase = Instant::now();
        let results: Vec<Result<(usize, Vec<f32>), RuntimeError>> = assigned
            .par_iter()
            .enumerate()
            .filter(|(_, members)| !members.is_empty())
            .map(|(expert, members)| {
                let started = Instant::now();
                let mlp = DenseMlp::load(reader, &format!("{}.mlp.experts.{expert}", self.prefix), hidden, inner)?;
                let loaded = Instant::now();
                let mut gathered = Vec::with_capacity(members.len() * hidden);
                for &(token, _) in members {
                    gathered.extend_from_slice(&x[token * hidden..][..hidden]);
                }
                let out = mlp.forward(backend, &gathered, members.len());
                times.load_nanos.fetch_add((loaded - started).as_nanos() as u64, Ordering::Relaxed);
                times.compute_nanos.fetch_add(loaded.elapsed().as_nanos() as u64, Ordering::Relaxed);
                Ok((expert, out))
            })
            .collect();
        times.phase_nanos.fetch_add(phase.elapsed().as_nanos() as u64, Ordering::Relaxed);
        // Accumulate in expert order, as transformers' expert loop does.
        let mut output = vec![0f32; tokens * hidden];
        for result in results {
            let (expert, out) = result?;
            for (&(token, weight), row) in assigned[expert].iter().zip(out.chunks(hidden)) {
                for (o, value) in output[token * hidden..][..hidden].iter_mut().zip(row) {
                    *o += value * weight;
                }
            }
        }
        if let Some(shared) = &self.shared {
            let started = Instant::now();
            let extra = shared.forward(backend, x, tokens);
            times.compute_nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            output.iter_mut().zip(extra).for_each(|(o, e)| *o += e);
        }
        Ok(output)
    }
}

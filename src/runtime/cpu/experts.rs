//! Routed MoE experts on the CPU: each expert's SwiGLU on its gathered tokens, then the weighted sum in expert order.

use rayon::prelude::*;

use super::activation;
use super::linear::{self, Products};
use crate::quant::fp4::nvfp4_fake_quantize_activations;
use crate::runtime::backend::{ExpertInputs, RoutedExpert};

/// [`crate::runtime::Backend::routed_experts`]: the experts run in parallel, their outputs are added in slice order.
pub fn apply(x: &[f32], hidden: usize, experts: &[RoutedExpert<'_>], output: &mut [f32], products: Products) {
    let outs: Vec<Vec<f32>> = experts
        .par_iter()
        .map(|expert| {
            let rows = expert.tokens.len();
            if rows == 0 {
                return Vec::new();
            }
            let mut gathered = Vec::with_capacity(rows * hidden);
            for &(token, _) in expert.tokens {
                gathered.extend_from_slice(&x[token * hidden..][..hidden]);
            }
            if let ExpertInputs::Nvfp4 { gate_up, .. } = expert.inputs {
                nvfp4_fake_quantize_activations(&mut gathered, gate_up);
            }
            let mut gate = linear::linear(&gathered, rows, expert.gate, None, products);
            let mut up = linear::linear(&gathered, rows, expert.up, None, products);
            if let Some(limit) = expert.swiglu_limit {
                activation::clamp_swiglu(&mut gate, &mut up, limit);
            }
            let mut intermediate = activation::silu_mul(&gate, &up);
            if let ExpertInputs::Nvfp4 { down, .. } = expert.inputs {
                nvfp4_fake_quantize_activations(&mut intermediate, down);
            }
            linear::linear(&intermediate, rows, expert.down, None, products)
        })
        .collect();
    for (expert, out) in experts.iter().zip(&outs) {
        accumulate(output, hidden, expert.tokens, out);
    }
}

/// `output[token] += weight · row` for one expert's `(token, weight)` pairs and its output rows `[pairs, hidden]`
/// (each product rounded, then added): the combine every backend shares, so per-token sums keep one order.
pub(crate) fn accumulate(output: &mut [f32], hidden: usize, tokens: &[(usize, f32)], rows: &[f32]) {
    for (&(token, weight), row) in tokens.iter().zip(rows.chunks(hidden)) {
        for (o, value) in output[token * hidden..][..hidden].iter_mut().zip(row) {
            *o += value * weight;
        }
    }
}

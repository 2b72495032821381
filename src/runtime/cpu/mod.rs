//! The CPU backend: rayon-parallel f32 arithmetic, always built; the reference the other backends are tested against.

mod activation;
pub mod attention;
pub(crate) mod experts;
mod indexer;
mod matmul;
mod norm;
pub mod paged;
mod rope;
mod routing;

use super::backend::{
    AttentionShape, Backend, IndexerShape, KeySelection, Matrix, RopeStyle, RoutedExpert, Routes, RoutingShape,
};

/// The CPU backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu;

impl Backend for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn linear(&self, input: &[f32], rows: usize, weight: &Matrix, bias: Option<&[f32]>) -> Vec<f32> {
        matmul::linear(input, rows, weight, bias)
    }

    fn rms_norm(&self, data: &mut [f32], width: usize, weight: &[f32], eps: f32) {
        norm::rms_norm(data, width, weight, eps)
    }

    fn layer_norm(&self, data: &mut [f32], width: usize, weight: &[f32], bias: &[f32], eps: f32) {
        norm::layer_norm(data, width, weight, bias, eps)
    }

    fn silu_mul(&self, gate: &[f32], up: &[f32]) -> Vec<f32> {
        activation::silu_mul(gate, up)
    }

    fn rope(
        &self,
        data: &mut [f32],
        tokens: usize,
        row_width: usize,
        head_dim: usize,
        offset: usize,
        rotary_dim: usize,
        cos: &[f32],
        sin: &[f32],
        style: RopeStyle,
    ) {
        rope::apply(data, tokens, row_width, head_dim, offset, rotary_dim, cos, sin, style)
    }

    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], shape: &AttentionShape, allowed: Option<&[bool]>) -> Vec<f32> {
        attention::causal(q, k, v, shape, allowed)
    }

    fn route(&self, logits: &[f32], tokens: usize, correction_bias: &[f32], shape: &RoutingShape) -> Routes {
        routing::route(logits, tokens, correction_bias, shape)
    }

    fn indexer_top_k(&self, q: &[f32], k: &[f32], head_weights: &[f32], shape: &IndexerShape) -> KeySelection {
        indexer::top_k(q, k, head_weights, shape)
    }

    fn kv_write(
        &self,
        pool: &mut crate::runtime::kv_cache::KvPool,
        layer: usize,
        rows: &[super::backend::KvRow<'_>],
    ) -> Result<(), crate::runtime::kv_cache::PoolError> {
        paged::kv_write(pool, layer, rows)
    }

    fn paged_decode(
        &self,
        pool: &mut crate::runtime::kv_cache::KvPool,
        step: &super::backend::PagedStep<'_>,
    ) -> super::backend::PagedDecode {
        paged::decode(pool, step)
    }

    fn routed_experts(&self, x: &[f32], hidden: usize, experts: &[RoutedExpert<'_>], output: &mut [f32]) {
        experts::apply(x, hidden, experts, output)
    }
}

/// Dot product with eight independent accumulators (vectorizes; summation order fixed).
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut a_chunks = a.chunks_exact(8);
    let mut b_chunks = b.chunks_exact(8);
    for (x, y) in (&mut a_chunks).zip(&mut b_chunks) {
        for lane in 0..8 {
            lanes[lane] += x[lane] * y[lane];
        }
    }
    let mut tail = 0f32;
    for (x, y) in a_chunks.remainder().iter().zip(b_chunks.remainder()) {
        tail += x * y;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7])) + tail
}

//! The op surface on host values, for the op cases: each call uploads its inputs to the backend, runs the op and
//! downloads the result, so one case compares the CUDA backend with the CPU backend on the same slices. A failed
//! op gives NaNs (the case fails) and prints its error.

use crate::runtime::backend::{
    AttentionShape, Backend, IndexerShape, KeySelection, RopeCall, RoutedExpert, Routes, RoutingShape,
};
use crate::runtime::matrix::Matrix;
use crate::runtime::RuntimeError;

/// A backend driven with host values.
pub(super) struct Host<'a> {
    backend: &'a dyn Backend,
}

impl<'a> Host<'a> {
    pub fn new(backend: &'a dyn Backend) -> Self {
        Self { backend }
    }

    fn settle<T>(&self, result: Result<T, RuntimeError>, fallback: impl FnOnce() -> T) -> T {
        result.unwrap_or_else(|error| {
            eprintln!("op check: {} failed: {error}", self.backend.describe());
            fallback()
        })
    }

    fn in_place(
        &self,
        data: &mut [f32],
        columns: usize,
        op: impl FnOnce(&mut crate::runtime::Tensor) -> Result<(), RuntimeError>,
    ) {
        let result = (|| {
            let mut tensor = self.backend.upload(data, columns)?;
            op(&mut tensor)?;
            self.backend.download(&tensor)
        })();
        let values = self.settle(result, || vec![f32::NAN; data.len()]);
        data.copy_from_slice(&values);
    }

    pub fn linear(&self, x: &[f32], rows: usize, weight: &Matrix, bias: Option<&[f32]>) -> Vec<f32> {
        let result = (|| {
            let bias = bias.map(|b| Matrix::new(1, b.len(), b.to_vec()));
            let input = self.backend.upload(x, x.len().checked_div(rows).unwrap_or(weight.columns))?;
            self.backend.download(&self.backend.linear(&input, weight, bias.as_ref())?)
        })();
        self.settle(result, || vec![f32::NAN; rows * weight.rows])
    }

    pub fn rms_norm(&self, data: &mut [f32], width: usize, weight: &[f32], eps: f32) {
        let weight = Matrix::new(1, weight.len(), weight.to_vec());
        self.in_place(data, width, |x| self.backend.rms_norm(x, width, &weight, eps));
    }

    pub fn layer_norm(&self, data: &mut [f32], width: usize, weight: &[f32], bias: &[f32], eps: f32) {
        let (weight, bias) = (Matrix::new(1, weight.len(), weight.to_vec()), Matrix::new(1, bias.len(), bias.to_vec()));
        self.in_place(data, width, |x| self.backend.layer_norm(x, width, &weight, &bias, eps));
    }

    pub fn silu_mul(&self, gate: &[f32], up: &[f32]) -> Vec<f32> {
        let result = (|| {
            let (gate, up) = (self.backend.upload(gate, gate.len().max(1))?, self.backend.upload(up, up.len().max(1))?);
            self.backend.download(&self.backend.silu_mul(&gate, &up)?)
        })();
        self.settle(result, || vec![f32::NAN; gate.len()])
    }

    /// RoPE of `data` `[rows, row_width]` as `call` says.
    pub fn rope(&self, data: &mut [f32], row_width: usize, call: &RopeCall<'_>) {
        self.in_place(data, row_width, |x| self.backend.rope(x, call));
    }

    pub fn attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        shape: &AttentionShape,
        allowed: Option<&[bool]>,
    ) -> Vec<f32> {
        let result = (|| {
            let q = self.backend.upload(q, shape.heads * shape.qk_dim)?;
            let k = self.backend.upload(k, shape.kv_heads * shape.qk_dim)?;
            let v = self.backend.upload(v, shape.kv_heads * shape.v_dim)?;
            self.backend.download(&self.backend.attention(&q, &k, &v, 0..shape.tokens, shape, allowed)?)
        })();
        self.settle(result, || vec![f32::NAN; shape.tokens * shape.heads * shape.v_dim])
    }

    pub fn route(
        &self,
        logits: &[f32],
        tokens: usize,
        bias: &[f32],
        shape: &RoutingShape,
    ) -> Result<Routes, RuntimeError> {
        let logits = self.backend.upload(logits, logits.len().checked_div(tokens).unwrap_or(shape.experts))?;
        self.backend.route(&logits, &Matrix::new(1, bias.len(), bias.to_vec()), shape)
    }

    pub fn indexer_top_k(&self, q: &[f32], k: &[f32], head_weights: &[f32], shape: &IndexerShape) -> KeySelection {
        let result = (|| {
            let q = self.backend.upload(q, shape.heads * shape.head_dim)?;
            let k = self.backend.upload(k, shape.head_dim)?;
            let w = self.backend.upload(head_weights, shape.heads)?;
            self.backend.indexer_top_k(&q, &k, &w, 0..shape.tokens, shape)
        })();
        self.settle(result, || KeySelection { mask: Vec::new(), near_ties: usize::MAX })
    }

    /// [`Backend::routed_experts`] on `x` `[tokens, hidden]`, adding into `output`.
    pub fn routed_experts(&self, x: &[f32], hidden: usize, experts: &[RoutedExpert<'_>], output: &mut [f32]) {
        self.in_place(output, hidden, |out| {
            let x = self.backend.upload(x, hidden)?;
            self.backend.routed_experts(&x, experts, out)
        });
    }
}

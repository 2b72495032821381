//! The CUDA backend: the runtime's op surface ([`Backend`]) on a [`Device`] — a GPU, or the emulated device that runs
//! the same kernels on the host (how CI checks this backend against the CPU oracle).
//!
//! Tensors live on the device ([`Tensor`]): each op launches the kernels of its family (one file per family here,
//! one `.cu` per family in kernels/) on device buffers and returns a device tensor; values cross the bus only in
//! [`Backend::upload`] / [`Backend::download`] and as decisions (routes, DSA masks, row lists), all counted by the
//! [`Counted`] device. Weights are uploaded once per loaded [`Matrix`] and kept with it (freed when it is dropped);
//! INT4 matrices stay packed on the device (W4A16). An op's device error is its `Err`. The paged KV cache's rows
//! live in device pages kept with the pool (paged_decode.rs).

mod activation;
pub mod attention;
mod checks;
pub mod experts;
pub mod fp4;
pub mod fp8;
pub mod gptq;
pub mod indexer;
pub mod int4_quantize;
pub mod linear;
pub mod norm;
pub mod paged;
mod paged_decode;
pub mod rope;
pub mod routing;
pub mod split;
mod state;
mod tensor;
mod weights;

pub use state::CudaBackend;

use std::sync::Arc;

use crate::runtime::device::{CudaError, Device, DeviceCounters};

use std::ops::Range;

use super::backend::{AttentionShape, Backend, IndexerShape, KeySelection, Prefetch, RopeCall, Routes, RoutingShape};
use super::matrix::Matrix;
use super::tensor::{Block, Tensor};
use crate::runtime::device::{Arg, LaunchShape};
use crate::runtime::error::RuntimeError;

impl CudaBackend {
    /// A device error as the runtime's error, naming the device.
    fn failed(&self, error: CudaError) -> RuntimeError {
        RuntimeError::Device(format!("{} ({error})", self.device.describe()))
    }

    fn run<T>(&self, result: Result<T, CudaError>) -> Result<T, RuntimeError> {
        result.map_err(|error| self.failed(error))
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn describe(&self) -> String {
        format!("cuda: {}", self.device.describe())
    }

    fn device(&self) -> Option<&dyn Device> {
        Some(CudaBackend::device(self))
    }

    fn prefetcher(&self) -> Option<Arc<dyn Prefetch>> {
        Some(self.weights.clone())
    }

    fn uploads(&self) -> Option<super::backend::Uploads> {
        Some(self.weights.uploads())
    }

    fn device_counters(&self) -> Option<DeviceCounters> {
        Some(self.device.counters_now())
    }

    fn upload(&self, values: &[f32], columns: usize) -> Result<Tensor, RuntimeError> {
        let rows = values.len().checked_div(columns).unwrap_or(0);
        let device = self.device();
        // One element at least: an empty tensor still has a buffer to pass.
        let buffer = if values.is_empty() { device.alloc_for::<f32>(1) } else { device.upload(values) };
        Ok(Tensor::device(self.run(buffer)?, rows, columns))
    }

    fn download(&self, tensor: &Tensor) -> Result<Vec<f32>, RuntimeError> {
        if tensor.is_empty() {
            return Ok(Vec::new());
        }
        let buffer = self.run(tensor::buffer(tensor))?;
        self.run(self.device().download(buffer, tensor.len()))
    }

    fn zeros(&self, rows: usize, columns: usize) -> Result<Tensor, RuntimeError> {
        // Zeros made on the device: an empty block copy leaves the buffer as allocated, so fill it with a kernel.
        let device = self.device();
        let out = self.run(tensor::alloc(device, rows, columns))?;
        let buffer = self.run(tensor::buffer(&out))?;
        self.run(device.launch(
            "fill_f32",
            LaunchShape::linear(((rows * columns).max(1)).div_ceil(256).min(1 << 16) as u32, 256),
            &[Arg::Buffer(buffer), Arg::F32(0.0), Arg::I64((rows * columns) as i64)],
        ))?;
        Ok(out)
    }

    fn empty(&self, rows: usize, columns: usize) -> Result<Tensor, RuntimeError> {
        self.run(tensor::alloc(self.device(), rows, columns))
    }

    fn copy(
        &self,
        into: &mut Tensor,
        to: Block,
        from: &Tensor,
        at: Block,
        shape: [usize; 3],
    ) -> Result<(), RuntimeError> {
        self.run(tensor::copy(self.device(), into, to, from, at, shape))
    }

    fn add(&self, into: &mut Tensor, from: &Tensor) -> Result<(), RuntimeError> {
        self.run(tensor::add(self.device(), into, from))
    }

    fn gather_rows(&self, x: &Tensor, rows: &[usize]) -> Result<Tensor, RuntimeError> {
        self.run(tensor::gather_rows(self, x, rows))
    }

    fn add_rows(&self, into: &mut Tensor, targets: &[usize], from: &Tensor) -> Result<(), RuntimeError> {
        let entries: Vec<(usize, usize, f32)> =
            targets.iter().enumerate().map(|(row, &target)| (target, row, 1.0)).collect();
        self.run(tensor::accumulate_rows(self, into, from, &entries))
    }

    fn linear(&self, x: &Tensor, weight: &Matrix, bias: Option<&Matrix>) -> Result<Tensor, RuntimeError> {
        self.run(linear::linear(self, x, weight, bias))
    }

    fn rms_norm(&self, x: &mut Tensor, width: usize, weight: &Matrix, eps: f32) -> Result<(), RuntimeError> {
        self.run(norm::rms_norm(self, x, width, weight, eps))
    }

    fn layer_norm(
        &self,
        x: &mut Tensor,
        width: usize,
        weight: &Matrix,
        bias: &Matrix,
        eps: f32,
    ) -> Result<(), RuntimeError> {
        self.run(norm::layer_norm(self, x, width, weight, bias, eps))
    }

    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor, RuntimeError> {
        self.run(activation::silu_mul(self, gate, up))
    }

    fn rope(&self, x: &mut Tensor, call: &RopeCall<'_>) -> Result<(), RuntimeError> {
        self.run(rope::apply(self, x, call))
    }

    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        rows: Range<usize>,
        shape: &AttentionShape,
        allowed: Option<&[bool]>,
    ) -> Result<Tensor, RuntimeError> {
        self.run(attention::causal(self, (q, k, v), rows, shape, allowed))
    }

    fn route(&self, logits: &Tensor, correction_bias: &Matrix, shape: &RoutingShape) -> Result<Routes, RuntimeError> {
        self.run(routing::route(self, logits, correction_bias, shape))
    }

    fn indexer_top_k(
        &self,
        q: &Tensor,
        k: &Tensor,
        head_weights: &Tensor,
        rows: Range<usize>,
        shape: &IndexerShape,
    ) -> Result<KeySelection, RuntimeError> {
        self.run(indexer::top_k(self, (q, k, head_weights), rows, shape))
    }

    fn routed_experts(
        &self,
        x: &Tensor,
        experts: &[super::backend::RoutedExpert<'_>],
        output: &mut Tensor,
    ) -> Result<(), RuntimeError> {
        self.run(experts::routed_experts(self, x, experts, output))
    }

    fn kv_write(
        &self,
        pool: &mut super::kv_cache::KvPool,
        layer: usize,
        rows: &super::kv_cache::KvRows<'_>,
    ) -> Result<(), RuntimeError> {
        Ok(self.run(paged_decode::kv_write(self, pool, layer, rows))??)
    }

    fn paged_decode(
        &self,
        pool: &mut super::kv_cache::KvPool,
        step: &super::kv_cache::PagedStep<'_>,
    ) -> Result<super::kv_cache::PagedDecode, RuntimeError> {
        self.run(paged_decode::decode(self, pool, step))
    }
}

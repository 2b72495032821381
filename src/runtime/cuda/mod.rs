//! The CUDA backend: the runtime's op surface ([`Backend`]) on a [`Device`] — a GPU, or the emulated device that runs
//! the same kernels on the host (how CI checks this backend against the CPU oracle).
//!
//! Each op uploads its activations, launches the kernels of its family (one file per family here, one `.cu` per
//! family in kernels/) and downloads the result. Weights are uploaded once per loaded [`Matrix`] and kept in a
//! bounded cache keyed by the matrix id; INT4 matrices stay packed on the device (W4A16). A device error does not
//! panic: the op returns NaNs and the error is kept until the runtime asks for it with [`Backend::failure`]
//! after each layer.

mod activation;
pub mod attention;
mod checks;
pub mod experts;
pub mod indexer;
pub mod linear;
pub mod norm;
pub mod paged;
mod paged_decode;
pub mod rope;
pub mod routing;
mod weights;

pub(crate) use weights::DeviceWeight;
use weights::WeightStore;

use std::sync::{Arc, Mutex};

use crate::runtime::device::{Counted, CudaError, Device, DeviceCounters};

use super::backend::{
    AttentionShape, Backend, IndexerShape, KeySelection, Matrix, Prefetch, RopeStyle, Routes, RoutingShape,
};

/// The CUDA backend over a device.
pub struct CudaBackend {
    device: Arc<Counted>,
    weights: Arc<WeightStore>,
    failure: Mutex<Option<CudaError>>,
}

impl CudaBackend {
    pub fn new(device: Arc<dyn Device>) -> Self {
        let device = Arc::new(Counted::new(device));
        Self { weights: Arc::new(WeightStore::new(device.clone())), device, failure: Mutex::default() }
    }

    /// The device every op runs on (counting its copies and launches).
    pub fn device(&self) -> &dyn Device {
        self.device.as_ref()
    }

    /// The same device, for copies of a stated kind ([`Counted::upload_as`]).
    pub(crate) fn counted(&self) -> &Counted {
        &self.device
    }

    /// The kept failure, as [`Backend::failure`] words it, cleared (the op checks run case after case on one backend).
    pub fn take_failure(&self) -> Option<String> {
        let mut failure = self.failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        failure.take().map(|error| format!("{} ({error})", self.device.describe()))
    }

    /// The device copy of `matrix`, uploading it on first use (packed when it carries its INT4 form).
    pub(crate) fn weight(&self, matrix: &Matrix) -> Result<Arc<DeviceWeight>, CudaError> {
        self.weights.get(matrix)
    }

    /// Keeps the first error; the op that failed returns `fallback`.
    fn settle<T>(&self, result: Result<T, CudaError>, fallback: impl FnOnce() -> T) -> T {
        match result {
            Ok(value) => value,
            Err(error) => {
                let mut failure = self.failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                failure.get_or_insert(error);
                fallback()
            }
        }
    }
}

fn nans(count: usize) -> Vec<f32> {
    vec![f32::NAN; count]
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn describe(&self) -> String {
        format!("cuda: {}", self.device.describe())
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

    fn failure(&self) -> Option<String> {
        let failure = self.failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        failure.as_ref().map(|error| format!("{} ({error})", self.device.describe()))
    }

    fn linear(&self, input: &[f32], rows: usize, weight: &Matrix, bias: Option<&[f32]>) -> Vec<f32> {
        self.settle(linear::linear(self, input, rows, weight, bias), || nans(rows * weight.rows))
    }

    fn rms_norm(&self, data: &mut [f32], width: usize, weight: &[f32], eps: f32) {
        let result = norm::rms_norm(self, data, width, weight, eps);
        self.settle(result, || data.fill(f32::NAN))
    }

    fn layer_norm(&self, data: &mut [f32], width: usize, weight: &[f32], bias: &[f32], eps: f32) {
        let result = norm::layer_norm(self, data, width, weight, bias, eps);
        self.settle(result, || data.fill(f32::NAN))
    }

    fn silu_mul(&self, gate: &[f32], up: &[f32]) -> Vec<f32> {
        self.settle(activation::silu_mul(self, gate, up), || nans(gate.len()))
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
        let result = rope::apply(self, data, tokens, row_width, head_dim, offset, rotary_dim, cos, sin, style);
        self.settle(result, || data.fill(f32::NAN))
    }

    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], shape: &AttentionShape, allowed: Option<&[bool]>) -> Vec<f32> {
        let result = attention::causal(self, q, k, v, shape, allowed);
        self.settle(result, || nans(shape.tokens * shape.heads * shape.v_dim))
    }

    fn route(&self, logits: &[f32], tokens: usize, correction_bias: &[f32], shape: &RoutingShape) -> Routes {
        let result = routing::route(self, logits, tokens, correction_bias, shape);
        // The first experts with NaN weights: the layer's output turns NaN and the failure is reported after it.
        let top_k = shape.top_k.min(shape.experts);
        self.settle(result, || Routes {
            top_k,
            experts: (0..tokens).flat_map(|_| 0..top_k).collect(),
            weights: nans(tokens * top_k),
            near_ties: 0,
        })
    }

    fn indexer_top_k(&self, q: &[f32], k: &[f32], head_weights: &[f32], shape: &IndexerShape) -> KeySelection {
        let result = indexer::top_k(self, q, k, head_weights, shape);
        let tokens = shape.tokens;
        // Every causal key: the failure is reported after the layer.
        self.settle(result, || KeySelection {
            mask: (0..tokens * tokens).map(|cell| cell % tokens <= cell / tokens).collect(),
            near_ties: 0,
        })
    }

    fn routed_experts(
        &self,
        x: &[f32],
        hidden: usize,
        experts: &[super::backend::RoutedExpert<'_>],
        output: &mut [f32],
    ) {
        let result = experts::routed_experts(self, x, hidden, experts, output);
        // A NaN output: the failure is reported after the layer.
        self.settle(result, || output.fill(f32::NAN))
    }

    fn kv_write(
        &self,
        pool: &mut super::kv_cache::KvPool,
        layer: usize,
        rows: &[super::backend::KvRow<'_>],
    ) -> Result<(), super::kv_cache::PoolError> {
        // A device error: the host pool holds the rows, the failure is reported after the step.
        let result = paged_decode::kv_write(self, pool, layer, rows);
        self.settle(result, || Ok(()))
    }

    fn paged_decode(
        &self,
        pool: &mut super::kv_cache::KvPool,
        step: &super::backend::PagedStep<'_>,
    ) -> super::backend::PagedDecode {
        let result = paged_decode::decode(self, pool, step);
        // NaN outputs, no faults: the failure is reported after the layer.
        self.settle(result, || super::backend::PagedDecode {
            out: nans(step.requests.len() * step.layout.heads * step.layout.v_dim),
            faults: vec![None; step.requests.len()],
            verify_seconds: 0.0,
        })
    }
}

//! The CPU backend: rayon-parallel f32 arithmetic, always built; the reference the other backends are tested against.

pub mod activation;
pub mod attention;
mod dots;
pub(crate) mod experts;
pub(crate) mod indexer;
mod linear;
mod norm;
pub mod paged;
mod rope;
pub(crate) mod routing;

use std::ops::Range;

pub use linear::Products;

use super::backend::{
    AttentionShape, Backend, IndexerShape, KeySelection, Prefetch, RopeCall, RoutedExpert, Routes, RoutingShape,
};
use super::kv_cache::{KeyChoice, KvPool, KvRows, PagedDecode, PagedStep};
use super::matrix::Matrix;
use super::tensor::{copy_block, Block, Storage, Tensor};
use crate::runtime::error::RuntimeError;

/// The CPU backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu {
    /// How its linear layers multiply: [`Products::Exact`] (the default) for the runtime's commands,
    /// [`Products::Blocked`] for the calibration passes.
    pub products: Products,
}

/// The CPU's prefetch: the f32 values of the next layer's (or expert batch's) INT4 weights made on the loader
/// thread, so compute never waits for them. Block-FP8 weights stay coded: the linear layers decode them block by
/// block into cache ([`linear::linear`]), which costs less than writing and reading back a full f32 copy.
struct HostValues;

impl Prefetch for HostValues {
    fn prefetch(&self, matrices: &[&Matrix]) {
        use rayon::prelude::*;
        matrices.par_iter().filter(|matrix| matrix.fp8().is_none()).for_each(|matrix| {
            matrix.values();
        });
    }
}

/// A CPU tensor's values.
fn values(tensor: &Tensor) -> &[f32] {
    match &tensor.storage {
        Storage::Host(values) => &values[..tensor.len()],
        Storage::Device(_) => panic!("a device tensor was handed to the CPU backend"),
    }
}

fn values_mut(tensor: &mut Tensor) -> &mut [f32] {
    let len = tensor.len();
    match &mut tensor.storage {
        Storage::Host(values) => &mut values[..len],
        Storage::Device(_) => panic!("a device tensor was handed to the CPU backend"),
    }
}

/// Rows `rows` of a `columns`-wide slice.
fn rows_of<'a>(values: &'a [f32], columns: usize, rows: &Range<usize>) -> &'a [f32] {
    &values[rows.start * columns..rows.end * columns]
}

impl Backend for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn prefetcher(&self) -> Option<std::sync::Arc<dyn Prefetch>> {
        Some(std::sync::Arc::new(HostValues))
    }

    fn upload(&self, values: &[f32], columns: usize) -> Result<Tensor, RuntimeError> {
        Ok(Tensor::host(values.to_vec(), columns))
    }

    fn download(&self, tensor: &Tensor) -> Result<Vec<f32>, RuntimeError> {
        Ok(values(tensor).to_vec())
    }

    fn zeros(&self, rows: usize, columns: usize) -> Result<Tensor, RuntimeError> {
        Ok(Tensor::host(vec![0f32; rows * columns], columns))
    }

    fn copy(
        &self,
        into: &mut Tensor,
        to: Block,
        from: &Tensor,
        at: Block,
        shape: [usize; 3],
    ) -> Result<(), RuntimeError> {
        copy_block(values_mut(into), to, values(from), at, shape);
        Ok(())
    }

    fn add(&self, into: &mut Tensor, from: &Tensor) -> Result<(), RuntimeError> {
        values_mut(into).iter_mut().zip(values(from)).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn gather_rows(&self, x: &Tensor, rows: &[usize]) -> Result<Tensor, RuntimeError> {
        let (source, columns) = (values(x), x.columns());
        let gathered =
            rows.iter().flat_map(|&row| source[row * columns..(row + 1) * columns].iter().copied()).collect();
        Ok(Tensor::host(gathered, columns))
    }

    fn add_rows(&self, into: &mut Tensor, targets: &[usize], from: &Tensor) -> Result<(), RuntimeError> {
        let columns = into.columns();
        let target = values_mut(into);
        for (row, &index) in values(from).chunks(columns).zip(targets) {
            target[index * columns..(index + 1) * columns].iter_mut().zip(row).for_each(|(h, v)| *h += v);
        }
        Ok(())
    }

    fn linear(&self, x: &Tensor, weight: &Matrix, bias: Option<&Matrix>) -> Result<Tensor, RuntimeError> {
        let bias = bias.map(|bias| bias.values());
        Ok(Tensor::host(linear::linear(values(x), x.rows(), weight, bias, self.products), weight.rows))
    }

    fn rms_norm(&self, x: &mut Tensor, width: usize, weight: &Matrix, eps: f32) -> Result<(), RuntimeError> {
        norm::rms_norm(values_mut(x), width, weight.values(), eps);
        Ok(())
    }

    fn layer_norm(
        &self,
        x: &mut Tensor,
        width: usize,
        weight: &Matrix,
        bias: &Matrix,
        eps: f32,
    ) -> Result<(), RuntimeError> {
        norm::layer_norm(values_mut(x), width, weight.values(), bias.values(), eps);
        Ok(())
    }

    fn silu_mul(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor, RuntimeError> {
        Ok(Tensor::host(activation::silu_mul(values(gate), values(up)), gate.columns()))
    }

    fn rope(&self, x: &mut Tensor, call: &RopeCall<'_>) -> Result<(), RuntimeError> {
        let columns = x.columns();
        rope::apply(&mut values_mut(x)[call.rows.start * columns..call.rows.end * columns], columns, call);
        Ok(())
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
        let (q, k, v) = (
            rows_of(values(q), q.columns(), &rows),
            rows_of(values(k), k.columns(), &rows),
            rows_of(values(v), v.columns(), &rows),
        );
        Ok(Tensor::host(attention::causal(q, k, v, shape, allowed), shape.heads * shape.v_dim))
    }

    fn route(&self, logits: &Tensor, correction_bias: &Matrix, shape: &RoutingShape) -> Result<Routes, RuntimeError> {
        Ok(routing::route(values(logits), logits.rows(), correction_bias.values(), shape))
    }

    fn indexer_top_k(
        &self,
        q: &Tensor,
        k: &Tensor,
        head_weights: &Tensor,
        rows: Range<usize>,
        shape: &IndexerShape,
    ) -> Result<KeySelection, RuntimeError> {
        let q = rows_of(values(q), q.columns(), &rows);
        let k = rows_of(values(k), k.columns(), &rows);
        let w = rows_of(values(head_weights), head_weights.columns(), &rows);
        Ok(indexer::top_k(q, k, w, shape))
    }

    fn kv_write(&self, pool: &mut KvPool, layer: usize, rows: &KvRows<'_>) -> Result<(), RuntimeError> {
        Ok(paged::kv_write(pool, layer, values(rows.rows), values(rows.aux), rows.at)?)
    }

    fn paged_decode(&self, pool: &mut KvPool, step: &PagedStep<'_>) -> Result<PagedDecode, RuntimeError> {
        let keys = step.keys.map(|choice| match choice {
            KeyChoice::Select { q, head_weights, .. } | KeyChoice::SelectPools { q, head_weights, .. } => {
                (values(q), values(head_weights))
            }
            KeyChoice::Reuse(mask) => (values(mask), &[][..]),
        });
        let decoded = paged::decode(pool, step, (values(step.q), values(step.rows), values(step.aux)), keys);
        Ok(PagedDecode {
            out: Tensor::host(decoded.out, step.layout.heads * step.layout.v_dim),
            faults: decoded.faults,
            keys: decoded.keys.map(|(mask, stride)| Tensor::host(mask, stride)),
            verify_seconds: decoded.verify_seconds,
        })
    }

    fn routed_experts(
        &self,
        x: &Tensor,
        experts: &[RoutedExpert<'_>],
        output: &mut Tensor,
    ) -> Result<(), RuntimeError> {
        experts::apply(values(x), x.columns(), experts, values_mut(output), self.products);
        Ok(())
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

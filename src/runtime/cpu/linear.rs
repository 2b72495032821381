//! Linear layers `y = x·Wᵀ + b`: parallel over blocks of output features (and of rows, where the features give
//! too few tasks), each block running the register-tiled kernel of [`super::dots`] over its input rows (a block's
//! weight rows are read from memory once per task) and writing its part of `y` in place. A block-FP8 weight is multiplied straight from its codes: each task decodes its
//! block's rows into a per-thread buffer that stays in cache (the values [`Matrix::values`] would make, bit for
//! bit), so no f32 copy of the matrix is made.
//!
//! [`Products::Blocked`] (the calibration passes) sends inputs of many rows through faer's cache-blocked GEMM instead.

use std::cell::RefCell;

use rayon::prelude::*;

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

use super::dots;
use crate::quant::fp8_block::dequantize_row;
use crate::runtime::matrix::Matrix;

/// How the CPU linear layers multiply.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    /// The kernel of [`super::dots`] for every input: one summation order whatever the number of rows, so a
    /// prefill and the decode steps after it agree bit for bit. The runtime's commands use it.
    #[default]
    Exact,
    /// Inputs of [`BLOCKED_ROWS`] rows or more through faer's cache-blocked GEMM, which keeps blocks of the input
    /// and the weights in cache while it works on them (the kernel streams every input row past every weight row
    /// from L2; BENCHMARKS.md "The calibration forward on a blocked GEMM"); fewer rows as `Exact`. Its sums run in
    /// another order, so they round differently from `Exact`'s: the calibration passes use it, whose products are
    /// thousands of rows feeding statistics, never logits compared bit for bit.
    Blocked,
}

/// Fewest input rows [`Products::Blocked`] sends to the blocked GEMM (below it the kernel was as fast or faster).
const BLOCKED_ROWS: usize = 64;
/// Weight rows of a block-FP8 matrix decoded to f32 per blocked product: 1024 × 6144 × 4 B = 25 MB at GLM-5 width.
const BLOCKED_FEATURES: usize = 1024;
/// Rows × features of one thread's GEMM in a blocked product.
const BLOCKED_TILE: [usize; 2] = [512, 256];

/// Weight rows per parallel task (a multiple of the kernel's tile of weight rows).
const FEATURE_BLOCK: usize = 32;
/// Tasks per thread a linear layer aims for at least, splitting rows where its feature blocks are fewer.
const TASKS_PER_THREAD: usize = 2;
/// Fewest rows of a task that splits rows (each such task decodes its block's FP8 weight rows again).
const MIN_CHUNK_ROWS: usize = 256;

thread_local! {
    /// A task's FP8 weight rows decoded to f32 (`FEATURE_BLOCK × width`), reused by every task on this thread.
    static DECODED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The output `[rows, features]`, shared by the tasks, each of which writes its own columns only.
#[derive(Clone, Copy)]
struct Columns(*mut f32);
// SAFETY: the tasks write disjoint columns of one buffer that outlives them (see `linear`).
unsafe impl Send for Columns {}
// SAFETY: as above.
unsafe impl Sync for Columns {}

impl Columns {
    /// The address of element `index` (row-major).
    fn at(&self, index: usize) -> *mut f32 {
        self.0.wrapping_add(index)
    }
}

pub fn linear(input: &[f32], rows: usize, weight: &Matrix, bias: Option<&[f32]>, products: Products) -> Vec<f32> {
    let (features, width) = (weight.rows, weight.columns);
    debug_assert_eq!(input.len(), rows * width);
    let quantized;
    let input = if weight.fp8_token_inputs {
        quantized = {
            let mut copy = input.to_vec();
            crate::quant::w4a8::fake_quantize_tokens(&mut copy, width);
            copy
        };
        &quantized[..]
    } else {
        input
    };
    let mut out = vec![0f32; rows * features];
    if rows == 0 || features == 0 {
        return out;
    }
    if products == Products::Blocked && rows >= BLOCKED_ROWS && width > 0 {
        blocked(input, rows, weight, &mut out);
        add_bias(&mut out, bias);
        return out;
    }
    // Coded FP8 while no one asked for the f32 values; the values otherwise (plain, INT4, or FP8 already made).
    let fp8 = weight.fp8();
    let values = if fp8.is_some() { &[][..] } else { weight.values() };
    let columns = Columns(out.as_mut_ptr());
    // Tasks: blocks of output features, and where they are too few to keep every thread busy (a 96-wide
    // projection is three blocks; the router one), chunks of rows too. Each output is the kernel's value either way.
    let blocks = features.div_ceil(FEATURE_BLOCK);
    let chunks = (TASKS_PER_THREAD * rayon::current_num_threads()).div_ceil(blocks).min(rows.div_ceil(MIN_CHUNK_ROWS));
    let chunk_rows = rows.div_ceil(chunks.max(1));
    (0..blocks * rows.div_ceil(chunk_rows)).into_par_iter().for_each(|task| {
        let (block, chunk) = (task % blocks, task / blocks);
        let first = block * FEATURE_BLOCK;
        let count = (features - first).min(FEATURE_BLOCK);
        let (first_row, chunk_rows) = (chunk * chunk_rows, chunk_rows.min(rows - chunk * chunk_rows));
        let input = &input[first_row * width..][..chunk_rows * width];
        // SAFETY: `out` is `[rows, features]` and lives until the loop ends; this task alone writes columns
        // `first..first + count` of rows `first_row..first_row + chunk_rows` of it (stride `features`), and
        // nothing reads `out` meanwhile.
        let run = |w: &[f32]| unsafe {
            dots::block_into(input, chunk_rows, w, count, width, columns.at(first_row * features + first), features)
        };
        match &fp8 {
            Some(fp8) => DECODED.with(|decoded| {
                let mut decoded = decoded.borrow_mut();
                decoded.resize(FEATURE_BLOCK * width, 0.0);
                for (local, row) in decoded.chunks_mut(width.max(1)).take(count).enumerate() {
                    let index = first + local;
                    dequantize_row(&fp8.grid, index, &fp8.codes[index * width..][..width], &fp8.scales, row);
                }
                run(&decoded[..count * width]);
            }),
            None => run(&values[first * width..][..count * width]),
        }
    });
    add_bias(&mut out, bias);
    out
}

fn add_bias(out: &mut [f32], bias: Option<&[f32]>) {
    if let Some(bias) = bias {
        out.par_chunks_mut(bias.len()).for_each(|row| row.iter_mut().zip(bias).for_each(|(value, b)| *value += b));
    }
}

/// `out = input · weightᵀ` `[rows, features]` by faer's GEMM, a block-FP8 weight decoded [`BLOCKED_FEATURES`] rows
/// at a time (the values [`Matrix::values`] would make, bit for bit). The threads take tiles of
/// [`BLOCKED_TILE`] rows × features, each one sequential GEMM: faer's own parallel f32 GEMM, called from inside the
/// rayon tasks of the routed experts, aborted a GLM-5-width run with "double free or corruption" (cause not
/// pinned down; the sequential GEMM per tile has not failed). Each output's sum runs over the whole width in
/// faer's order for this machine, whatever the tiles and threads.
fn blocked(input: &[f32], rows: usize, weight: &Matrix, out: &mut [f32]) {
    let (features, width) = (weight.rows, weight.columns);
    let fp8 = weight.fp8();
    let values = if fp8.is_some() { &[][..] } else { weight.values() };
    let columns = Columns(out.as_mut_ptr());
    let [tile_rows, tile_features] = BLOCKED_TILE;
    let mut decoded = Vec::new();
    for first in (0..features).step_by(BLOCKED_FEATURES) {
        let count = (features - first).min(BLOCKED_FEATURES);
        let w = match &fp8 {
            Some(fp8) => {
                decoded.resize(count * width, 0.0);
                decoded.par_chunks_mut(width).enumerate().for_each(|(local, row)| {
                    let index = first + local;
                    dequantize_row(&fp8.grid, index, &fp8.codes[index * width..][..width], &fp8.scales, row);
                });
                &decoded[..]
            }
            None => &values[first * width..][..count * width],
        };
        let strips = count.div_ceil(tile_features);
        (0..strips * rows.div_ceil(tile_rows)).into_par_iter().for_each(|task| {
            let (f0, r0) = (task % strips * tile_features, task / strips * tile_rows);
            let (fc, rc) = ((count - f0).min(tile_features), (rows - r0).min(tile_rows));
            let x = MatRef::from_row_major_slice(&input[r0 * width..][..rc * width], rc, width);
            let w = MatRef::from_row_major_slice(&w[f0 * width..][..fc * width], fc, width).transpose();
            // SAFETY: `out` is `[rows, features]` and outlives the loop; this task alone writes its rows
            // `r0..r0 + rc` × columns `first + f0..first + f0 + fc` (row stride `features`), nothing reads `out`.
            let y = unsafe {
                MatMut::from_raw_parts_mut(columns.at(r0 * features + first + f0), rc, fc, features as isize, 1)
            };
            matmul(y, Accum::Replace, x, w, 1.0, Par::Seq);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fp8_block::BlockGrid;
    use crate::rng::Rng;
    use crate::runtime::matrix::{Fp8Codes, Fp8Weight};

    /// A block-FP8 weight of random finite codes (e4m3fn: every code but ±0x7F) and 128 × 128 block scales.
    fn fp8_weight(rng: &mut Rng, features: usize, width: usize) -> Matrix {
        let grid = BlockGrid::new(features, width, 128, 128);
        let codes = (0..features * width).map(|_| rng.below(0x7F) as u8 | (rng.below(2) as u8) << 7).collect();
        let [blocks_down, blocks_across] = grid.scale_shape();
        let scales = (0..blocks_down * blocks_across).map(|_| 0.01 + rng.uniform() * 0.02).collect();
        Matrix::coded_fp8(Fp8Weight { codes: Fp8Codes::Owned(codes), scales, grid })
    }

    /// Blocked products are the kernel's within f32 rounding — plain and block-FP8 weights (decoded
    /// `BLOCKED_FEATURES` rows at a time), with a bias, across tile edges —, the kernel's own bits below
    /// `BLOCKED_ROWS`, and the same bits at any number of threads.
    #[test]
    fn blocked_products_are_the_kernels_within_rounding() {
        let mut rng = Rng::new(5);
        for (rows, width, features) in [(BLOCKED_ROWS - 1, 48, 40), (BLOCKED_ROWS, 200, 300), (700, 130, 1100)] {
            let x = rng.values(rows * width, 1.0);
            let bias = rng.values(features, 1.0);
            let plain = Matrix::new(features, width, rng.values(features * width, 0.1));
            for weight in [plain, fp8_weight(&mut rng, features, width)] {
                let exact = linear(&x, rows, &weight, Some(&bias), Products::Exact);
                let blocked = linear(&x, rows, &weight, Some(&bias), Products::Blocked);
                if rows < BLOCKED_ROWS {
                    assert_eq!(exact, blocked, "{rows} rows: the kernel's");
                    continue;
                }
                let error = exact.iter().zip(&blocked).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
                let norm = exact.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
                assert!(error <= 1e-6 * norm, "{rows}x{width}x{features}: rel L2 {}", error / norm);
                let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
                let alone = one_thread.install(|| linear(&x, rows, &weight, Some(&bias), Products::Blocked));
                assert!(alone.iter().zip(&blocked).all(|(a, b)| a.to_bits() == b.to_bits()), "thread count");
            }
        }
    }
}

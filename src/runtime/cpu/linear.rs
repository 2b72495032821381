//! Linear layers `y = x·Wᵀ + b`: parallel over blocks of output features (and of rows, where the features give
//! too few tasks), each block running the register-tiled kernel of [`super::dots`] over its input rows (a block's
//! weight rows are read from memory once per task) and writing its part of `y` in place. A block-FP8 weight is multiplied straight from its codes: each task decodes its
//! block's rows into a per-thread buffer that stays in cache (the values [`Matrix::values`] would make, bit for
//! bit), so no f32 copy of the matrix is made.

use std::cell::RefCell;

use rayon::prelude::*;

use super::dots;
use crate::quant::fp8_block::dequantize_row;
use crate::runtime::matrix::Matrix;

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

pub fn linear(input: &[f32], rows: usize, weight: &Matrix, bias: Option<&[f32]>) -> Vec<f32> {
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
    if let Some(bias) = bias {
        out.par_chunks_mut(features).for_each(|row| row.iter_mut().zip(bias).for_each(|(value, b)| *value += b));
    }
    out
}

//! Linear layers `y = x·Wᵀ + b`: parallel over blocks of output features, each block running the register-tiled
//! kernel of [`super::dots`] over every input row (a block's weight rows are read from memory once).

use rayon::prelude::*;

use super::dots;
use crate::runtime::backend::Matrix;

/// Weight rows per parallel task.
const FEATURE_BLOCK: usize = 32;

pub fn linear(input: &[f32], rows: usize, weight: &Matrix, bias: Option<&[f32]>) -> Vec<f32> {
    let (features, width) = (weight.rows, weight.columns);
    debug_assert_eq!(input.len(), rows * width);
    // Computed transposed (`[features, rows]`) so each task owns a contiguous slice, then transposed back.
    let values = weight.values();
    let mut transposed = vec![0f32; features * rows];
    transposed.par_chunks_mut(FEATURE_BLOCK * rows.max(1)).enumerate().for_each(|(block, out)| {
        let first = block * FEATURE_BLOCK;
        let count = out.len() / rows.max(1);
        dots::block(input, rows, &values[first * width..][..count * width], count, width, out);
        if let Some(bias) = bias {
            for (local, feature_out) in out.chunks_mut(rows.max(1)).enumerate() {
                feature_out.iter_mut().for_each(|value| *value += bias[first + local]);
            }
        }
    });
    let mut out = vec![0f32; rows * features];
    out.par_chunks_mut(features.max(1)).enumerate().for_each(|(row, y)| {
        for (feature, value) in y.iter_mut().enumerate() {
            *value = transposed[feature * rows + row];
        }
    });
    out
}

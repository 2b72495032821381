//! Linear layers `y = x·Wᵀ + b`: parallel over blocks of output features, each block reusing an input row
//! from cache across its weight rows.

use rayon::prelude::*;

use super::dot;
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
        for row in 0..rows {
            let x = &input[row * width..][..width];
            for local in 0..count {
                let feature = first + local;
                let w = &values[feature * width..][..width];
                out[local * rows + row] = dot(x, w) + bias.map_or(0.0, |b| b[feature]);
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

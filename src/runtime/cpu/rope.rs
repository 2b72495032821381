//! Rotary position embedding, interleaved (DeepSeek MLA, DSA indexer) or rotate-half (GLM-4.5 GQA), on a slice
//! of every head. `cos`/`sin` already carry YaRN's attention factor.

use rayon::prelude::*;

use crate::runtime::backend::RopeStyle;

#[allow(clippy::too_many_arguments)]
pub fn apply(
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
    let half = rotary_dim / 2;
    data[..tokens * row_width].par_chunks_mut(row_width).enumerate().for_each(|(position, row)| {
        let (cos, sin) = (&cos[position * half..][..half], &sin[position * half..][..half]);
        let mut scratch = vec![0f32; rotary_dim];
        for head in row.chunks_mut(head_dim) {
            let x = &mut head[offset..offset + rotary_dim];
            match style {
                RopeStyle::Interleaved => {
                    for i in 0..half {
                        let (even, odd) = (x[2 * i], x[2 * i + 1]);
                        scratch[i] = even * cos[i] - odd * sin[i];
                        scratch[half + i] = odd * cos[i] + even * sin[i];
                    }
                }
                RopeStyle::Half => {
                    for i in 0..half {
                        let (first, second) = (x[i], x[half + i]);
                        scratch[i] = first * cos[i] - second * sin[i];
                        scratch[half + i] = second * cos[i] + first * sin[i];
                    }
                }
            }
            x.copy_from_slice(&scratch);
        }
    });
}

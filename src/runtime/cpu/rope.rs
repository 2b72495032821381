//! Rotary position embedding, interleaved (DeepSeek MLA, DSA indexer) or rotate-half (GLM-4.5 GQA), on a slice
//! of every head. `cos`/`sin` already carry YaRN's attention factor.

use rayon::prelude::*;

use crate::runtime::backend::{RopeCall, RopeStyle};

/// [`RopeCall`] on `data`, the call's rows (`row_width` values each) only.
pub fn apply(data: &mut [f32], row_width: usize, call: &RopeCall<'_>) {
    let RopeCall { ref rows, first_position, head_dim, offset, rotary_dim, table, style } = *call;
    if rotary_dim == 0 || row_width == 0 {
        return; // NoPE (GLM-5.3-Flash's MLA has no rotary part)
    }
    let (tokens, half) = (rows.len(), rotary_dim / 2);
    let table_half = table.cos.columns;
    let (cos, sin) =
        (&table.cos.values()[first_position * table_half..], &table.sin.values()[first_position * table_half..]);
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

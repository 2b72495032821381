//! RMSNorm and LayerNorm over the last dimension, in place.

use rayon::prelude::*;

pub fn rms_norm(data: &mut [f32], width: usize, weight: &[f32], eps: f32) {
    data.par_chunks_mut(width).for_each(|row| {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
        let inverse = 1.0 / (mean_square + eps).sqrt();
        for (value, w) in row.iter_mut().zip(weight) {
            *value = w * (*value * inverse);
        }
    });
}

pub fn layer_norm(data: &mut [f32], width: usize, weight: &[f32], bias: &[f32], eps: f32) {
    data.par_chunks_mut(width).for_each(|row| {
        let mean = row.iter().sum::<f32>() / width as f32;
        let variance = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / width as f32;
        let inverse = 1.0 / (variance + eps).sqrt();
        for ((value, w), b) in row.iter_mut().zip(weight).zip(bias) {
            *value = (*value - mean) * inverse * w + b;
        }
    });
}

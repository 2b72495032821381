//! Deterministic random weights that look like trained ones: Gaussian rows with per-row gain, a few outlier
//! input channels and rare large single weights (what makes absmax scaling hard in real checkpoints).

use half::bf16;

pub use crate::rng::Rng;

/// A `[rows, columns]` weight matrix scaled like an initialised-then-trained linear layer.
pub fn linear_weights(rng: &mut Rng, rows: usize, columns: usize) -> Vec<f32> {
    let base = 1.0 / (columns as f32).sqrt();
    let column_gain: Vec<f32> =
        (0..columns).map(|_| if rng.uniform() < 0.01 { 6.0 + 4.0 * rng.uniform() } else { 1.0 }).collect();
    let mut weights = Vec::with_capacity(rows * columns);
    for _ in 0..rows {
        let row_gain = (0.25 * rng.normal()).exp();
        for gain in &column_gain {
            let spike = if rng.uniform() < 0.0005 { 8.0 } else { 1.0 };
            weights.push(rng.normal() * base * row_gain * gain * spike);
        }
    }
    weights
}

pub fn to_bf16_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect()
}

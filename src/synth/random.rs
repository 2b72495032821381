//! Deterministic random weights that look like trained ones: Gaussian rows with per-row gain, a few outlier
//! input channels and rare large single weights (what makes absmax scaling hard in real checkpoints).

use half::bf16;

/// SplitMix64: small, fast, reproducible across platforms.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from the run seed and the tensor name, so each tensor is reproducible on its own.
    pub fn for_tensor(seed: u64, name: &str) -> Self {
        let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
        for byte in name.bytes() {
            state = (state ^ byte as u64).wrapping_mul(0x1000_0000_01B3);
        }
        Rng(state)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

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

//! SplitMix64 random numbers: small, seedable and reproducible across platforms; used for synthetic weights, sampling,
//! fault-injection victims and self-test inputs.

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator seeded from `seed` and a name (e.g. a tensor's), so each named stream is reproducible on its own.
    pub fn for_name(seed: u64, name: &str) -> Self {
        let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
        for byte in name.bytes() {
            state = (state ^ byte as u64).wrapping_mul(0x1000_0000_01B3);
        }
        Self(state)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`, 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in the open interval `(0, 1)` as f32 (never 0, so its logarithm is finite).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }

    /// Uniform in `(-1, 1)`.
    pub fn signed(&mut self) -> f32 {
        self.uniform() * 2.0 - 1.0
    }

    /// `count` values uniform in `(-scale, scale)`.
    pub fn values(&mut self, count: usize, scale: f32) -> Vec<f32> {
        (0..count).map(|_| self.signed() * scale).collect()
    }

    /// Uniform integer in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

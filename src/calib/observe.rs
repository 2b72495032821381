//! Running statistics of the absolute values a KV cache would store: exact amax and count, and a log2 histogram
//! (32 bins per octave) for percentiles and the share of values above a threshold.

/// Bins per power of two; a percentile read from the histogram is within 2^(1/32) ≈ 2.2 % of the exact value.
const BINS_PER_OCTAVE: f64 = 32.0;
/// Smallest binned magnitude 2^-64; anything smaller (and zero) goes to the first bin.
const LOWEST_EXPONENT: f64 = -64.0;
const BINS: usize = 128 * 32;

/// Absolute-value statistics of one cached tensor (one layer's K, V or MLA latent row; or one head of them).
#[derive(Debug, Clone)]
pub struct AbsStats {
    pub amax: f32,
    pub count: u64,
    histogram: Vec<u64>,
}

impl Default for AbsStats {
    fn default() -> Self {
        Self { amax: 0.0, count: 0, histogram: vec![0; BINS] }
    }
}

fn bin_of(magnitude: f32) -> usize {
    if magnitude <= 0.0 || !magnitude.is_finite() {
        return if magnitude.is_finite() { 0 } else { BINS - 1 };
    }
    let position = ((magnitude as f64).log2() - LOWEST_EXPONENT) * BINS_PER_OCTAVE;
    position.clamp(0.0, (BINS - 1) as f64) as usize
}

fn upper_edge(bin: usize) -> f64 {
    2f64.powf((bin + 1) as f64 / BINS_PER_OCTAVE + LOWEST_EXPONENT)
}

impl AbsStats {
    pub fn add(&mut self, values: &[f32]) {
        for value in values {
            let magnitude = value.abs();
            if magnitude > self.amax || magnitude.is_nan() {
                self.amax = if magnitude.is_nan() { f32::INFINITY } else { magnitude };
            }
            self.histogram[bin_of(magnitude)] += 1;
        }
        self.count += values.len() as u64;
    }

    /// The histogram's counts, bin by bin (what a part of a split calibration saves).
    pub fn histogram(&self) -> &[u64] {
        &self.histogram
    }

    /// Statistics from saved parts (`None` when the histogram is not of this build's bins).
    pub fn from_parts(amax: f32, count: u64, histogram: Vec<u64>) -> Option<Self> {
        (histogram.len() == BINS).then_some(Self { amax, count, histogram })
    }

    pub fn merge(&mut self, other: &AbsStats) {
        self.amax = self.amax.max(other.amax);
        self.count += other.count;
        self.histogram.iter_mut().zip(&other.histogram).for_each(|(a, b)| *a += b);
    }

    /// The `percent`-th percentile of |x| (upper edge of its histogram bin, never above amax); 100 gives amax.
    pub fn percentile(&self, percent: f64) -> f32 {
        if percent >= 100.0 || self.count == 0 {
            return self.amax;
        }
        let wanted = (percent / 100.0 * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (bin, &count) in self.histogram.iter().enumerate() {
            seen += count;
            if seen >= wanted {
                return (upper_edge(bin) as f32).min(self.amax);
            }
        }
        self.amax
    }

    /// Share of values with |x| below `threshold` (exact when the threshold is above amax; else resolved to histogram
    /// bins, counting a bin that straddles the threshold as not below it). Zeros count as below.
    pub fn share_below(&self, threshold: f32) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        if threshold > self.amax {
            return 1.0;
        }
        let first = bin_of(threshold);
        let below: u64 = self.histogram[..first].iter().sum();
        below as f64 / self.count as f64
    }

    /// Share of values with |x| above `threshold` (exact when the threshold is at or above amax; else resolved to
    /// histogram bins, counting a bin that straddles the threshold as above it).
    pub fn share_above(&self, threshold: f32) -> f64 {
        if self.count == 0 || threshold >= self.amax {
            return 0.0;
        }
        let first = bin_of(threshold);
        let above: u64 = self.histogram[first..].iter().sum();
        above as f64 / self.count as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amax_percentile_and_share() {
        let mut stats = AbsStats::default();
        let values: Vec<f32> =
            (1..=1000).map(|i| if i % 2 == 0 { i as f32 * 0.01 } else { -(i as f32) * 0.01 }).collect();
        stats.add(&values);
        assert_eq!(stats.amax, 10.0);
        assert_eq!(stats.percentile(100.0), 10.0);
        let p99 = stats.percentile(99.0);
        assert!((p99 / 9.9 - 1.0).abs() < 0.025, "p99 {p99}");
        assert_eq!(stats.share_above(10.0), 0.0);
        let share = stats.share_above(9.0);
        assert!((0.09..0.13).contains(&share), "share {share}");
        let below = stats.share_below(1.0);
        assert!((0.09..0.11).contains(&below), "share below {below}");
        assert_eq!(stats.share_below(0.001), 0.0);
        assert_eq!(stats.share_below(11.0), 1.0);
    }
}

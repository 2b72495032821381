//! llama.cpp `--kl-divergence` statistics (tools/perplexity/perplexity.cpp) of a mode's scored tokens against the
//! reference's: PPL(Q), PPL(base), their correlation, ratio and difference; KLD mean ± and percentiles; Δp mean ±,
//! percentiles and RMS ±; same top-1 ±. Same definitions and uncertainty formulas, with one difference: the base
//! log-probabilities are exact f64 over the whole vocabulary, not llama.cpp's 16-bit file clamped at max − 16.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::metrics::argmax;

/// Per scored token, the values the summary is built from.
#[derive(Debug, Clone, Default)]
pub struct TokenSamples {
    pub nll: Vec<f64>,
    pub nll_base: Vec<f64>,
    pub kld: Vec<f64>,
    /// p_Q(correct) − p_base(correct), as a probability (not %).
    pub p_diff: Vec<f64>,
    pub same_top: Vec<bool>,
}

impl TokenSamples {
    /// Adds one scored position: `base` and `candidate` logits rows, `target` the correct next token.
    pub fn add(&mut self, base: &[f32], candidate: &[f32], target: usize) {
        let base_log = log_softmax(base);
        let candidate_log = log_softmax(candidate);
        let kld: f64 = base_log
            .iter()
            .zip(&candidate_log)
            .map(|(&b, &q)| if b.is_finite() { b.exp() * (b - q) } else { 0.0 })
            .sum();
        self.kld.push(kld.max(0.0));
        self.nll.push(-candidate_log[target]);
        self.nll_base.push(-base_log[target]);
        self.p_diff.push(candidate_log[target].exp() - base_log[target].exp());
        self.same_top.push(argmax(base) == argmax(candidate));
    }

    pub fn len(&self) -> usize {
        self.kld.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kld.is_empty()
    }
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let total: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    let log_total = max + total.ln();
    row.iter().map(|&v| v as f64 - log_total).collect()
}

/// llama.cpp `mean_and_uncertainty`: mean and `sqrt(var / (n − 1))`, the latter 0 for n ≤ 10.
fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count == 0 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let mean = sum / n;
    let variance = sum2 / n - mean * mean;
    let uncertainty = if variance > 0.0 && count > 10 { (variance / (n - 1.0)).sqrt() } else { 0.0 };
    (mean, uncertainty)
}

/// llama.cpp `covariance` of two means (0 for n < 10).
fn covariance(sum_a: f64, sum_b: f64, sum_ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sum_ab / n - (sum_a / n) * (sum_b / n)) / (n - 1.0)
}

/// llama.cpp's interpolated percentile of sorted values (`fraction` in [0, 1]).
fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    if fraction <= 0.0 {
        return sorted[0];
    }
    if fraction >= 1.0 {
        return sorted[sorted.len() - 1];
    }
    let position = fraction * (sorted.len() - 1) as f64;
    let index = position as usize;
    let part = position - index as f64;
    (1.0 - part) * sorted[index] + part * sorted[(index + 1).min(sorted.len() - 1)]
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n == 0 {
        f64::NAN
    } else if n.is_multiple_of(2) {
        0.5 * (sorted[n / 2] + sorted[n / 2 - 1])
    } else {
        sorted[n / 2]
    }
}

fn percentile_map(sorted: &[f64], levels: &[f64], scale: f64) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("max".into(), Value::from(sorted.last().copied().unwrap_or(f64::NAN) * scale));
    for &level in levels {
        let value = if level == 50.0 { median(sorted) } else { percentile(sorted, level / 100.0) };
        let key = if level == 50.0 { "median".to_string() } else { format!("{level}") };
        map.insert(key, Value::from(value * scale));
    }
    map.insert("min".into(), Value::from(sorted.first().copied().unwrap_or(f64::NAN) * scale));
    map
}

/// The summary of one mode against the reference.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub tokens: usize,
    pub ppl: f64,
    pub ppl_stderr: f64,
    pub ppl_base: f64,
    pub ppl_base_stderr: f64,
    /// Cor(ln PPL(Q), ln PPL(base)), in [−1, 1].
    pub cor_ln_ppl: f64,
    pub mean_ln_ppl_ratio: f64,
    pub mean_ln_ppl_ratio_stderr: f64,
    pub ppl_ratio: f64,
    pub ppl_ratio_stderr: f64,
    pub ppl_diff: f64,
    pub ppl_diff_stderr: f64,
    pub mean_kld: f64,
    pub mean_kld_stderr: f64,
    /// max, 99.9, 99, 95, 90, median, 10, 5, 1, 0.1, min.
    pub kld_percentiles: Map<String, Value>,
    /// Δp in percent (as llama.cpp prints it).
    pub mean_dp: f64,
    pub mean_dp_stderr: f64,
    /// max, 99.9, 99, 95, 90, 75, median, 25, 10, 5, 1, 0.1, min — percent.
    pub dp_percentiles: Map<String, Value>,
    pub rms_dp: f64,
    pub rms_dp_stderr: f64,
    /// Same top-1 token, percent.
    pub same_top: f64,
    pub same_top_stderr: f64,
}

impl Summary {
    pub fn of(samples: &TokenSamples) -> Self {
        let count = samples.len();
        let n = count as f64;
        let sum = |values: &[f64]| values.iter().sum::<f64>();
        let sum2 = |values: &[f64]| values.iter().map(|v| v * v).sum::<f64>();
        let (log_ppl, log_ppl_unc) = mean_and_uncertainty(sum(&samples.nll), sum2(&samples.nll), count);
        let (log_base, log_base_unc) = mean_and_uncertainty(sum(&samples.nll_base), sum2(&samples.nll_base), count);
        let sum_cross: f64 = samples.nll.iter().zip(&samples.nll_base).map(|(a, b)| a * b).sum();
        let log_cov = covariance(sum(&samples.nll), sum(&samples.nll_base), sum_cross, count);
        let cor_ln_ppl =
            if log_ppl_unc > 0.0 && log_base_unc > 0.0 { log_cov / (log_ppl_unc * log_base_unc) } else { f64::NAN };
        let (ppl, ppl_base) = (log_ppl.exp(), log_base.exp());
        let (ppl_stderr, ppl_base_stderr) = (ppl * log_ppl_unc, ppl_base * log_base_unc);
        let mean_ln_ppl_ratio = log_ppl - log_base;
        let mean_ln_ppl_ratio_stderr =
            (log_ppl_unc * log_ppl_unc + log_base_unc * log_base_unc - 2.0 * log_cov).max(0.0).sqrt();
        let ppl_ratio = mean_ln_ppl_ratio.exp();
        let ppl_cov = ppl * ppl_base * log_cov;
        let ppl_diff_stderr =
            (ppl_stderr * ppl_stderr + ppl_base_stderr * ppl_base_stderr - 2.0 * ppl_cov).max(0.0).sqrt();

        let (mean_kld, mean_kld_stderr) = mean_and_uncertainty(sum(&samples.kld), sum2(&samples.kld), count);
        let mut kld = samples.kld.clone();
        kld.sort_by(f64::total_cmp);
        let (mean_dp, mean_dp_stderr) = mean_and_uncertainty(sum(&samples.p_diff), sum2(&samples.p_diff), count);
        let p2: Vec<f64> = samples.p_diff.iter().map(|d| d * d).collect();
        let (mse, mse_unc) = mean_and_uncertainty(sum(&p2), sum2(&p2), count);
        let rms_dp = mse.sqrt();
        let rms_dp_stderr = if rms_dp > 0.0 { 0.5 / rms_dp * mse_unc } else { 0.0 };
        let mut dp = samples.p_diff.clone();
        dp.sort_by(f64::total_cmp);
        let top = samples.same_top.iter().filter(|&&same| same).count() as f64 / n.max(1.0);
        let top_stderr = if count > 1 { (top * (1.0 - top) / (n - 1.0)).sqrt() } else { 0.0 };
        Summary {
            tokens: count,
            ppl,
            ppl_stderr,
            ppl_base,
            ppl_base_stderr,
            cor_ln_ppl,
            mean_ln_ppl_ratio,
            mean_ln_ppl_ratio_stderr,
            ppl_ratio,
            ppl_ratio_stderr: ppl_ratio * mean_ln_ppl_ratio_stderr,
            ppl_diff: ppl - ppl_base,
            ppl_diff_stderr,
            mean_kld,
            mean_kld_stderr,
            kld_percentiles: percentile_map(&kld, &[99.9, 99.0, 95.0, 90.0, 50.0, 10.0, 5.0, 1.0, 0.1], 1.0),
            mean_dp: 100.0 * mean_dp,
            mean_dp_stderr: 100.0 * mean_dp_stderr,
            dp_percentiles: percentile_map(
                &dp,
                &[99.9, 99.0, 95.0, 90.0, 75.0, 50.0, 25.0, 10.0, 5.0, 1.0, 0.1],
                100.0,
            ),
            rms_dp: 100.0 * rms_dp,
            rms_dp_stderr: 100.0 * rms_dp_stderr,
            same_top: 100.0 * top,
            same_top_stderr: 100.0 * top_stderr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_logits_give_zero_kld_and_full_agreement() {
        let mut samples = TokenSamples::default();
        for t in 0..20 {
            let row: Vec<f32> = (0..37).map(|i| ((i * 7 + t * 3) % 11) as f32 * 0.3 - 1.0).collect();
            samples.add(&row, &row, t % 37);
        }
        let summary = Summary::of(&samples);
        assert_eq!(summary.mean_kld, 0.0);
        assert_eq!(summary.same_top, 100.0);
        assert_eq!(summary.ppl_ratio, 1.0);
        assert_eq!(summary.rms_dp, 0.0);
        assert!((summary.cor_ln_ppl - 1.0).abs() < 1e-9);
    }

    #[test]
    fn percentiles_interpolate_like_llama_cpp() {
        let sorted = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&sorted, 0.5), 2.5);
        assert!((percentile(&sorted, 0.9) - 3.7).abs() < 1e-12);
        assert_eq!(median(&sorted), 2.5);
        let mut samples = TokenSamples::default();
        samples.add(&[0.0, 1.0], &[1.0, 0.0], 1);
        let kld = samples.kld[0];
        let (p, q) = (1.0 / (1.0 + (-1f64).exp()), 1.0 / (1.0 + 1f64.exp()));
        let expected = p * (p / q).ln() + (1.0 - p) * ((1.0 - p) / (1.0 - q)).ln();
        assert!((kld - expected).abs() < 1e-12);
        assert!(!samples.same_top[0]);
    }
}

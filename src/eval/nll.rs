//! Negative log-likelihood of each next token under the logits (log-softmax in f64), accumulated as mean and
//! standard error (llama.cpp `perplexity` statistics).

/// Running sums of per-token NLL, and the NLLs themselves (what a part of a split evaluation saves).
#[derive(Debug, Clone, Default)]
pub struct NllStats {
    pub count: usize,
    sum: f64,
    sum_squares: f64,
    /// Every position's NLL, in order.
    pub values: Vec<f64>,
}

impl NllStats {
    /// Adds every position of one sequence: logits row `t` predicts token `t + 1`.
    pub fn add_sequence(&mut self, tokens: &[u32], logits: &[f32], vocab: usize) {
        for (position, row) in logits.chunks(vocab).enumerate().take(tokens.len().saturating_sub(1)) {
            self.add(token_nll(row, tokens[position + 1] as usize));
        }
    }

    /// Adds one position's NLL.
    pub fn add(&mut self, nll: f64) {
        self.count += 1;
        self.sum += nll;
        self.sum_squares += nll * nll;
        self.values.push(nll);
    }

    /// The statistics of these NLLs, accumulated in their order (so equal to the bit to adding them one by one).
    pub fn from_values(values: Vec<f64>) -> Self {
        let mut stats = NllStats::default();
        for nll in values {
            stats.add(nll);
        }
        stats
    }

    /// Mean NLL and its standard error.
    pub fn mean_and_stderr(&self) -> (f64, f64) {
        if self.count == 0 {
            return (f64::NAN, f64::NAN);
        }
        let n = self.count as f64;
        let mean = self.sum / n;
        let variance =
            if self.count > 1 { ((self.sum_squares / n - mean * mean) * n / (n - 1.0)).max(0.0) } else { 0.0 };
        (mean, (variance / n).sqrt())
    }
}

/// `−log softmax(row)[target]`.
pub fn token_nll(row: &[f32], target: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let total: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + total.ln() - row[target] as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_logits_give_log_vocab() {
        let mut stats = NllStats::default();
        stats.add_sequence(&[1, 2, 3], &[0.5; 3 * 7], 7);
        let (mean, stderr) = stats.mean_and_stderr();
        assert_eq!(stats.count, 2);
        assert!((mean - 7f64.ln()).abs() < 1e-12 && stderr.abs() < 1e-12);
    }
}

//! Two models on the same items: per task and metric both accuracies with their standard errors, the items that
//! flipped (right → wrong, wrong → right), how often both predicted the same, and McNemar's exact test on the
//! flips (two-sided binomial on the discordant pairs: is one model right where the other is wrong more often than
//! chance says?). Accuracy alone hides flips that cancel out (Dutta et al. 2024, "Accuracy is Not All You Need").

use serde::{Deserialize, Serialize};

use super::{mean_and_stderr, TaskScore};

/// One task's metric on both models.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairedMetric {
    pub task: String,
    pub metric: String,
    pub items: usize,
    pub reference: f64,
    pub reference_stderr: f64,
    pub candidate: f64,
    pub candidate_stderr: f64,
    /// Right on the reference, wrong on the candidate.
    pub right_to_wrong: usize,
    pub wrong_to_right: usize,
    /// Share of items where both predicted the same (choice, or extracted answer).
    pub agreement: f64,
    /// McNemar's exact two-sided p-value on the flips (1 without flips).
    pub mcnemar_p: f64,
    /// The 1-based lines of the items that flipped right → wrong.
    pub right_to_wrong_lines: Vec<usize>,
}

/// Pairs the metrics of `reference` and `candidate` (the same tasks of the same file, item by item).
pub fn compare(reference: &[TaskScore], candidate: &[TaskScore]) -> Vec<PairedMetric> {
    let mut paired = Vec::new();
    for (r, c) in reference.iter().zip(candidate) {
        let metrics: Vec<String> =
            r.items.first().map_or(Vec::new(), |item| item.metrics.iter().map(|m| m.metric.clone()).collect());
        for (index, metric) in metrics.into_iter().enumerate() {
            let flags =
                |task: &TaskScore| -> Vec<bool> { task.items.iter().map(|i| i.metrics[index].correct).collect() };
            let (ours, theirs) = (flags(r), flags(c));
            let right_to_wrong: Vec<usize> = r
                .items
                .iter()
                .zip(ours.iter().zip(&theirs))
                .filter(|(_, (a, b))| **a && !**b)
                .map(|(i, _)| i.line)
                .collect();
            let wrong_to_right = ours.iter().zip(&theirs).filter(|(a, b)| !**a && **b).count();
            let same = r
                .items
                .iter()
                .zip(&c.items)
                .filter(|(a, b)| a.metrics[index].prediction == b.metrics[index].prediction);
            let same = same.count();
            let (reference, reference_stderr) = mean_and_stderr(&ours);
            let (candidate, candidate_stderr) = mean_and_stderr(&theirs);
            paired.push(PairedMetric {
                task: r.task.clone(),
                metric,
                items: ours.len(),
                reference,
                reference_stderr,
                candidate,
                candidate_stderr,
                mcnemar_p: mcnemar_exact(right_to_wrong.len(), wrong_to_right),
                right_to_wrong: right_to_wrong.len(),
                wrong_to_right,
                agreement: same as f64 / ours.len().max(1) as f64,
                right_to_wrong_lines: right_to_wrong,
            });
        }
    }
    paired
}

/// McNemar's exact test: the two-sided binomial p-value of `b` flips one way and `c` the other under p = ½,
/// `min(1, 2 · P(X ≤ min(b, c)))` for X ~ Binomial(b + c, ½); 1 without flips.
pub fn mcnemar_exact(b: usize, c: usize) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    // log C(n, i) · ½^n summed in log space (n may be thousands).
    let log_half_n = -(n as f64) * std::f64::consts::LN_2;
    let mut log_choose = 0.0f64;
    let mut tail = 0.0f64;
    for i in 0..=b.min(c) {
        if i > 0 {
            log_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        tail += (log_choose + log_half_n).exp();
    }
    (2.0 * tail).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcnemar_matches_the_binomial_tail() {
        // scipy.stats.binomtest(1, 10, 0.5).pvalue = 0.021484375 (= 2 · 11 / 1024).
        assert!((mcnemar_exact(1, 9) - 22.0 / 1024.0).abs() < 1e-12);
        assert!((mcnemar_exact(9, 1) - 22.0 / 1024.0).abs() < 1e-12);
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        assert_eq!(mcnemar_exact(3, 3), 1.0);
        // 0 of 20 one way: 2 · 2^-20.
        assert!((mcnemar_exact(0, 20) - 2.0 / 1_048_576.0).abs() < 1e-15);
        assert!(mcnemar_exact(400, 600) < 1e-9 && mcnemar_exact(400, 600) > 0.0);
    }
}

/// `--max-flips N` and `--max-acc-drop POINTS`: a paired metric fails when more than N items flipped (both ways)
/// or the candidate's accuracy is more than POINTS percentage points below the reference's.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct TaskGates {
    pub max_flips: Option<usize>,
    pub max_acc_drop: Option<f64>,
}

/// The gates `paired` fails, each said in words.
pub fn failures(paired: &[PairedMetric], gates: TaskGates) -> Vec<String> {
    let mut failed = Vec::new();
    for metric in paired {
        let flips = metric.right_to_wrong + metric.wrong_to_right;
        if let Some(limit) = gates.max_flips.filter(|&limit| flips > limit) {
            failed.push(format!(
                "gate max-flips failed: task {} {}: {flips} items flipped ({} right → wrong, {} wrong → right), \
                 limit {limit}",
                metric.task, metric.metric, metric.right_to_wrong, metric.wrong_to_right
            ));
        }
        let drop = (metric.reference - metric.candidate) * 100.0;
        if let Some(limit) = gates.max_acc_drop.filter(|&limit| drop > limit) {
            failed.push(format!(
                "gate max-acc-drop failed: task {} {}: {:.2} % → {:.2} % ({drop:.2} points lower), limit {limit} \
                 points",
                metric.task,
                metric.metric,
                metric.reference * 100.0,
                metric.candidate * 100.0
            ));
        }
    }
    failed
}

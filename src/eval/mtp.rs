//! `eval --mtp`: the draft acceptance of a model's MTP layer on held-out text, before anyone deploys speculative
//! decoding. Depth 1, as vLLM and SGLang run one MTP layer per step: at position `t` the MTP layer drafts token
//! `t + 2` (from the main model's hidden state at `t` and token `t + 1`, see [`crate::arch::mtp`]), and the main
//! model's own prediction of that token is its logits at `t + 1`. A greedy draft is accepted when both argmaxes
//! agree; the report gives that share, the KLD of the draft distribution from the main model's, and both models'
//! perplexity on the true token `t + 2` — llama.cpp's statistics (same top-1 = acceptance) through
//! [`crate::eval::kld_stats::Summary`].
//!
//! With `--mtp-depth K` above 1 the layer also drafts `K` tokens in a chain from every position, as the engines
//! chain it ([`crate::arch::mtp_chain`]), and the report gives the mean accepted length per step of greedy
//! speculative decoding: `1 +` the drafts the main model accepts in a row. The main model's choices are its
//! argmaxes on the held-out text, so where the text leaves the model's own greedy path the chain is checked against
//! what the model would predict after the text's token, not after its own: an estimate of the length `serve-test
//! --speculative mtp=K` measures on the model's own continuation.

use serde::Serialize;

use super::kld_stats::{Summary, TokenSamples};
use crate::metrics::argmax;
use crate::parity::GateFailure;

/// The MTP layer's drafts against the main model.
#[derive(Debug, Clone, Serialize)]
pub struct DraftReport {
    /// The MTP layer's index (`num_hidden_layers`).
    pub layer: usize,
    /// Positions scored: every `t` whose token `t + 2` is in the chunk.
    pub positions: usize,
    /// Greedy drafts the main model accepts (its argmax at `t + 1` equals the draft's at `t`), percent.
    pub acceptance: f64,
    pub acceptance_stderr: f64,
    /// Mean tokens per step of greedy speculative decoding with one draft: `1 + acceptance / 100`.
    pub mean_accepted_length: f64,
    /// KLD(main ‖ draft) in nats.
    pub mean_kld: f64,
    pub mean_kld_stderr: f64,
    /// Perplexity of the draft and of the main model on the true token `t + 2`.
    pub draft_ppl: f64,
    pub main_ppl: f64,
    /// `--mtp-depth K` above 1: the chained drafts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainReport>,
}

/// `K` chained greedy drafts from every chain start.
#[derive(Debug, Clone, Serialize)]
pub struct ChainReport {
    pub depth: usize,
    /// Chain starts scored: every `t` with `t + K` inside the chunk.
    pub starts: usize,
    /// Per depth `j = 1..=K`: the share of chains whose first `j` drafts the main model all accepts, percent.
    pub accepted_through: Vec<f64>,
    /// Mean tokens per step of greedy speculative decoding with `K` chained drafts: `1 +` the mean drafts accepted
    /// in a row.
    pub mean_accepted_length: f64,
    pub mean_accepted_length_stderr: f64,
}

/// The scored drafts of an MTP layer (one run's, or merged parts').
#[derive(Debug, Clone, Default)]
pub struct DraftStats {
    /// Depth 1 at every position whose token `t + 2` is in the chunk.
    pub samples: TokenSamples,
    /// With chains (`--mtp-depth` above 1), per chain start: how many of its drafts the main model accepts in a
    /// row.
    pub accepted: Vec<u64>,
}

/// `eval --reference --candidate --mtp`: both models' drafts and the candidate's drop in acceptance.
#[derive(Debug, Clone, Serialize)]
pub struct DraftParity {
    pub reference: DraftReport,
    pub candidate: DraftReport,
    /// Reference acceptance minus the candidate's, percentage points (negative: the candidate accepts more).
    pub drop: f64,
    /// The gate: fail when `drop` exceeds this.
    pub max_drop: f64,
}

impl DraftParity {
    pub fn new(reference: DraftReport, candidate: DraftReport, max_drop: f64) -> Self {
        let drop = reference.acceptance - candidate.acceptance;
        Self { reference, candidate, drop, max_drop }
    }

    /// The `max-mtp-drop` gate's failure, if the candidate lost more acceptance than allowed.
    pub fn failure(&self) -> Option<GateFailure> {
        (self.drop > self.max_drop).then(|| GateFailure {
            gate: "max-mtp-drop".into(),
            mode: "mtp".into(),
            value: self.drop,
            limit: self.max_drop,
        })
    }
}

/// Collects a forward pass's main and draft logits, one sequence at a time.
pub struct DraftSamples {
    stats: DraftStats,
    /// Chained drafts per start (1: none).
    depth: usize,
    /// The main logits of the sequence whose drafts come next.
    main: Vec<f32>,
}

impl DraftSamples {
    /// Drafts chained `depth` deep (1: depth 1 only).
    pub fn new(depth: usize) -> Self {
        Self { stats: DraftStats::default(), depth, main: Vec::new() }
    }

    /// Keeps a sequence's main logits `[len, vocab]` until its drafts arrive.
    pub fn main(&mut self, logits: &[f32]) {
        self.main.clear();
        self.main.extend_from_slice(logits);
    }

    /// Scores a sequence's drafts `[len − 1, vocab]` and its chained greedy drafts `[starts, depth]` against the
    /// main logits kept last: draft `j` (1-based) from start `t` against the main model's argmax at row `t + j`.
    pub fn drafts(&mut self, tokens: &[u32], drafts: &[f32], chains: &[u32], vocab: usize) {
        for t in 0..tokens.len().saturating_sub(2) {
            let main = &self.main[(t + 1) * vocab..][..vocab];
            let draft = &drafts[t * vocab..][..vocab];
            self.stats.samples.add(main, draft, tokens[t + 2] as usize);
        }
        if self.depth > 1 {
            for (t, chain) in chains.chunks(self.depth).enumerate() {
                let main = |row: usize| argmax(&self.main[row * vocab..][..vocab]);
                let accepted = chain.iter().enumerate().take_while(|&(j, &token)| main(t + j + 1) == token).count();
                self.stats.accepted.push(accepted as u64);
            }
        }
    }

    pub fn report(&self, layer: usize) -> DraftReport {
        report_of(&self.stats, layer, self.depth)
    }

    /// The scored drafts, in the order the sequences came.
    pub fn stats(&self) -> &DraftStats {
        &self.stats
    }
}

/// The report of the MTP layer `layer`'s scored drafts `stats`, chained `depth` deep (one run's, or merged parts').
pub fn report_of(stats: &DraftStats, layer: usize, depth: usize) -> DraftReport {
    let summary = Summary::of(&stats.samples);
    DraftReport {
        layer,
        positions: summary.tokens,
        acceptance: summary.same_top,
        acceptance_stderr: summary.same_top_stderr,
        mean_accepted_length: 1.0 + summary.same_top / 100.0,
        mean_kld: summary.mean_kld,
        mean_kld_stderr: summary.mean_kld_stderr,
        draft_ppl: summary.ppl,
        main_ppl: summary.ppl_base,
        chain: (depth > 1).then(|| chain_report(&stats.accepted, depth)),
    }
}

fn chain_report(accepted: &[u64], depth: usize) -> ChainReport {
    let starts = accepted.len();
    let share = |j: u64| 100.0 * accepted.iter().filter(|&&a| a >= j).count() as f64 / starts.max(1) as f64;
    let mean = accepted.iter().sum::<u64>() as f64 / starts.max(1) as f64;
    let variance =
        accepted.iter().map(|&a| (a as f64 - mean).powi(2)).sum::<f64>() / starts.saturating_sub(1).max(1) as f64;
    ChainReport {
        depth,
        starts,
        accepted_through: (1..=depth as u64).map(share).collect(),
        mean_accepted_length: 1.0 + mean,
        mean_accepted_length_stderr: (variance / starts.max(1) as f64).sqrt(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_gate_fails_only_past_its_limit() {
        let report = |acceptance: f64| DraftReport {
            layer: 3,
            positions: 10,
            acceptance,
            acceptance_stderr: 0.0,
            mean_accepted_length: 1.0 + acceptance / 100.0,
            mean_kld: 0.0,
            mean_kld_stderr: 0.0,
            draft_ppl: 1.0,
            main_ppl: 1.0,
            chain: None,
        };
        let failed = DraftParity::new(report(80.0), report(70.0), 5.0).failure().expect("a 10-point drop fails");
        assert_eq!((failed.gate.as_str(), failed.value, failed.limit), ("max-mtp-drop", 10.0, 5.0));
        assert!(DraftParity::new(report(80.0), report(76.0), 5.0).failure().is_none());
        assert!(DraftParity::new(report(70.0), report(80.0), 0.0).failure().is_none(), "a gain is no drop");
    }

    #[test]
    fn a_draft_equal_to_the_next_main_row_is_always_accepted_and_a_shifted_one_is_not() {
        let vocab = 4;
        let tokens = [0u32, 1, 2, 3];
        // Main rows predict 1, 2, 3, 0 (argmax at the token index).
        let main: Vec<f32> = [1usize, 2, 3, 0]
            .iter()
            .flat_map(|&hot| (0..vocab).map(move |i| if i == hot { 5.0 } else { 0.0 }))
            .collect();
        let mut samples = DraftSamples::new(1);
        samples.main(&main);
        samples.drafts(&tokens, &main[vocab..], &[], vocab);
        let report = samples.report(3);
        assert_eq!(report.positions, 2);
        assert_eq!(report.acceptance, 100.0);
        assert!(report.mean_kld.abs() < 1e-12, "{}", report.mean_kld);
        assert_eq!(report.mean_accepted_length, 2.0);

        let mut samples = DraftSamples::new(1);
        samples.main(&main);
        samples.drafts(&tokens, &main[..3 * vocab], &[], vocab);
        let report = samples.report(3);
        assert_eq!(report.acceptance, 0.0);
        assert!(report.mean_kld > 1.0);
    }

    #[test]
    fn a_chain_counts_the_drafts_accepted_in_a_row() {
        let vocab = 4;
        let tokens = [0u32, 1, 2, 3, 0];
        // The main model's argmax at rows 0..5: 1, 2, 3, 0, 1.
        let main: Vec<f32> = [1usize, 2, 3, 0, 1]
            .iter()
            .flat_map(|&hot| (0..vocab).map(move |i| if i == hot { 5.0 } else { 0.0 }))
            .collect();
        let mut samples = DraftSamples::new(2);
        samples.main(&main);
        let drafts = main[vocab..].to_vec();
        // Starts 0, 1, 2 (t + 2 ≤ 4): draft j from t is checked against row t + j.
        // t = 0: rows 1, 2 want 2, 3 → both accepted; t = 1: rows 2, 3 want 3, 0 → first only; t = 2: rows 3, 4
        // want 0, 1 → none (a later match after a miss does not count).
        let chains = [2u32, 3, 3, 1, 2, 1];
        samples.drafts(&tokens, &drafts, &chains, vocab);
        assert_eq!(samples.stats().accepted, vec![2, 1, 0]);
        let chain = samples.report(3).chain.expect("a chain report at depth 2");
        assert_eq!((chain.depth, chain.starts), (2, 3));
        assert_eq!(chain.mean_accepted_length, 2.0);
        assert!((chain.accepted_through[0] - 200.0 / 3.0).abs() < 1e-9);
        assert!((chain.accepted_through[1] - 100.0 / 3.0).abs() < 1e-9);
        assert!(DraftSamples::new(1).report(3).chain.is_none());
    }
}

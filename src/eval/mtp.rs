//! `eval --mtp`: the draft acceptance of a model's MTP layer on held-out text, before anyone deploys speculative
//! decoding. Depth 1, as vLLM and SGLang run one MTP layer per step: at position `t` the MTP layer drafts token
//! `t + 2` (from the main model's hidden state at `t` and token `t + 1`, see [`crate::arch::mtp`]), and the main
//! model's own prediction of that token is its logits at `t + 1`. A greedy draft is accepted when both argmaxes
//! agree; the report gives that share, the KLD of the draft distribution from the main model's, and both models'
//! perplexity on the true token `t + 2` — llama.cpp's statistics (same top-1 = acceptance) through
//! [`crate::eval::parity::Summary`].

use serde::Serialize;

use super::parity::{GateFailure, Summary, TokenSamples};

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
#[derive(Default)]
pub struct DraftSamples {
    samples: TokenSamples,
    /// The main logits of the sequence whose drafts come next.
    main: Vec<f32>,
}

impl DraftSamples {
    /// Keeps a sequence's main logits `[len, vocab]` until its drafts arrive.
    pub fn main(&mut self, logits: &[f32]) {
        self.main.clear();
        self.main.extend_from_slice(logits);
    }

    /// Scores a sequence's drafts `[len − 1, vocab]` against the main logits kept last.
    pub fn drafts(&mut self, tokens: &[u32], drafts: &[f32], vocab: usize) {
        for t in 0..tokens.len().saturating_sub(2) {
            let main = &self.main[(t + 1) * vocab..][..vocab];
            let draft = &drafts[t * vocab..][..vocab];
            self.samples.add(main, draft, tokens[t + 2] as usize);
        }
    }

    pub fn report(&self, layer: usize) -> DraftReport {
        report_of(&self.samples, layer)
    }

    /// The scored positions, in the order the sequences came.
    pub fn samples(&self) -> &TokenSamples {
        &self.samples
    }
}

/// The report of the MTP layer `layer`'s scored positions `samples` (one run's, or merged parts').
pub fn report_of(samples: &TokenSamples, layer: usize) -> DraftReport {
    let summary = Summary::of(samples);
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
        let mut samples = DraftSamples::default();
        samples.main(&main);
        samples.drafts(&tokens, &main[vocab..], vocab);
        let report = samples.report(3);
        assert_eq!(report.positions, 2);
        assert_eq!(report.acceptance, 100.0);
        assert!(report.mean_kld.abs() < 1e-12, "{}", report.mean_kld);
        assert_eq!(report.mean_accepted_length, 2.0);

        let mut samples = DraftSamples::default();
        samples.main(&main);
        samples.drafts(&tokens, &main[..3 * vocab], vocab);
        let report = samples.report(3);
        assert_eq!(report.acceptance, 0.0);
        assert!(report.mean_kld > 1.0);
    }
}

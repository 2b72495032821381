//! What speculative decoding carries beside a batch: a request's MTP positions not yet cached ([`Pending`]) and a
//! run's drafts made and accepted ([`SpeculationStats`]). The steps themselves are [`super::speculate`]'s.

use serde::Serialize;

/// The MTP positions of a request not yet cached: `from …` with the main model's hidden state of each (after its
/// final norm).
pub struct Pending {
    pub from: usize,
    pub hidden: Vec<Vec<f32>>,
}

impl Pending {
    /// After a prefill: every prompt position, from `normed` `[tokens, width]`.
    pub fn prompt(normed: &[f32], width: usize) -> Self {
        Self { from: 0, hidden: normed.chunks(width.max(1)).map(<[f32]>::to_vec).collect() }
    }
}

/// Drafts made and accepted over a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpeculationStats {
    /// Drafts chained per step (K).
    pub depth: usize,
    /// Request-steps: passes of the main model over one request's token and its drafts.
    pub verifications: u64,
    /// Tokens those passes emitted (accepted drafts + one token of the main model each).
    pub emitted: u64,
    /// Drafts compared with the main model's token (a draft past an EOS or the budget is not compared).
    pub drafted: u64,
    pub accepted: u64,
    /// Per draft depth 1 … K: drafts compared and accepted at that depth.
    pub drafted_by_depth: Vec<u64>,
    pub accepted_by_depth: Vec<u64>,
    /// Seconds spent in the MTP layer (part of the decode time).
    pub draft_seconds: f64,
}

impl SpeculationStats {
    pub fn new(depth: usize) -> Self {
        Self { depth, drafted_by_depth: vec![0; depth], accepted_by_depth: vec![0; depth], ..Self::default() }
    }
}

//! Parity's vocabulary, shared by the job that measures it (`squeeze eval --reference REF --candidate CAND`:
//! [`crate::eval::parity`], whose module docs describe the modes) and the model card that shows its results
//! ([`crate::card`]): the evaluation modes, the pass/fail gates and a gate that failed.

use serde::{Deserialize, Serialize};

/// An evaluation mode (the table in [`crate::eval::parity`]'s docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Reference,
    Kv,
    Weights,
    Split,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Reference, Mode::Kv, Mode::Weights, Mode::Split];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Reference => "reference",
            Mode::Kv => "kv",
            Mode::Weights => "weights",
            Mode::Split => "split",
        }
    }

    /// Whether the mode caches FP8 KV (`kv`, `split`).
    pub fn fp8_kv(self) -> bool {
        matches!(self, Mode::Kv | Mode::Split)
    }
}

/// Pass/fail thresholds, applied to every mode but `reference`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Gates {
    pub max_mean_kld: f64,
    /// Percent.
    pub min_same_top: f64,
    pub max_ppl_ratio: f64,
}

/// A failed gate.
#[derive(Debug, Clone, Serialize)]
pub struct GateFailure {
    pub gate: String,
    pub mode: String,
    pub value: f64,
    pub limit: f64,
}

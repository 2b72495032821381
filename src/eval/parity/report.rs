//! The types of a parity run: what it is asked (modes, gates, KV scales, options) and what it answers (the report
//! with its per-mode and per-layer results, and the raw statistics parts merge from).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Map;

use crate::chunks::EvalInput;
use crate::engines::kv_scales::{CacheLayout, ScaleUse};
use crate::engines::Engine;
use crate::parity::{Gates, Mode};
use crate::part::Part;

use super::stats::{Summary, TokenSamples};

/// Which scales the FP8-KV modes (`kv`, `split`) cache with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvScaleChoice {
    /// What the chosen engine really uses for this cache layout.
    Engine,
    /// The candidate's `k_scale`/`v_scale` (1.0 where missing).
    Calibrated,
    /// 1.0 everywhere.
    One,
}

#[derive(Debug, Clone)]
pub struct ParityOptions {
    pub reference: PathBuf,
    pub candidate: PathBuf,
    pub input: EvalInput,
    pub chunks: Option<usize>,
    pub modes: Vec<Mode>,
    pub gates: Gates,
    pub kv_scales: KvScaleChoice,
    /// The engine whose behaviour `KvScaleChoice::Engine` follows.
    pub engine: Engine,
    /// `--part I/N`: score only part I's chunks (the report covers those).
    pub part: Option<Part>,
    /// `--save-stats FILE`: write the raw per-position and per-layer statistics for `squeeze merge-eval`.
    pub save_stats: Option<PathBuf>,
    /// `--mtp`: also measure both models' MTP draft acceptance, gated on the candidate's drop (percentage points).
    pub max_mtp_drop: Option<f64>,
    /// `--mtp-depth K`: with `--mtp`, also chain `K` drafts from every position (1: depth 1 only).
    pub mtp_depth: usize,
    /// `--allow-long-context`: chunks longer than either model's context window are run, with a warning.
    pub allow_long_context: bool,
}

/// The KV scales the FP8-KV modes used, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvScalesUsed {
    pub choice: KvScaleChoice,
    pub engine: Engine,
    pub layout: CacheLayout,
    /// `checkpoint`, `unit` or `dynamic-tiles`.
    pub applied: ScaleUse,
    pub reason: String,
}

/// Per decoder layer, one mode against the reference on the scored positions.
#[derive(Debug, Clone, Serialize)]
pub struct LayerError {
    pub layer: usize,
    /// ‖h_mode − h_ref‖ / ‖h_ref‖ of the residual stream leaving the layer.
    pub hidden_rel_l2: f64,
    /// Share of scored tokens whose routed top-k expert set equals the reference's (`null` on dense layers).
    pub expert_agreement: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModeReport {
    #[serde(flatten)]
    pub summary: Summary,
    pub layers: Vec<LayerError>,
    /// Sorted per-token KLD (for the plot; not serialized).
    #[serde(skip)]
    pub kld_sorted: Vec<f64>,
}

/// A failed gate.
#[derive(Debug, Clone, Serialize)]
pub struct GateFailure {
    pub gate: String,
    pub mode: String,
    pub value: f64,
    pub limit: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ParityReport {
    pub reference: String,
    pub candidate: String,
    pub architecture: String,
    pub chunks: usize,
    pub ctx: usize,
    /// Prompt tokens per chunk (the first half); the rest minus the last are scored.
    pub prompt: usize,
    /// KV scale layers missing in CAND (1.0 used), when the FP8-KV modes read CAND's scales.
    pub missing_kv_scales: Vec<usize>,
    pub kv_scales: KvScalesUsed,
    pub modes: Map<String, serde_json::Value>,
    pub gates: Gates,
    pub failures: Vec<GateFailure>,
    /// `--mtp`: both models' MTP drafts on every position of the chunks (one extra forward of each model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp: Option<crate::eval::mtp::DraftParity>,
    /// What the numbers should be read with (chunks beyond the context window under `--allow-long-context`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    pub seconds: f64,
    #[serde(skip)]
    pub mode_reports: Vec<(Mode, ModeReport)>,
}

/// Per decoder layer, one mode's error sums against the reference, per chunk: summed over a chunk's scored rows,
/// then over the chunks in order ([`LayerSums::error`]), so that the parts of a split evaluation merge to the bit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerSums {
    /// Σ (h_mode − h_ref)² of the residual stream leaving the layer, per chunk.
    pub difference: Vec<f64>,
    /// Σ h_ref², per chunk.
    pub norm: Vec<f64>,
    /// Scored rows whose routed top-k expert set equals the reference's, per chunk (MoE layers; else empty).
    pub same_routes: Vec<u64>,
}

impl LayerSums {
    /// The layer's error from its sums; `rows`: scored rows of all chunks; `moe`: whether the layer routes.
    pub fn error(&self, layer: usize, rows: u64, moe: bool) -> LayerError {
        let difference = self.difference.iter().fold(0f64, |total, value| total + value);
        let norm = self.norm.iter().fold(0f64, |total, value| total + value);
        let same: u64 = self.same_routes.iter().sum();
        LayerError {
            layer,
            hidden_rel_l2: if norm > 0.0 { (difference / norm).sqrt() } else { difference.sqrt() },
            expert_agreement: moe.then(|| if rows == 0 { 1.0 } else { same as f64 / rows as f64 }),
        }
    }
}

/// One mode's raw statistics: per scored token and per layer and chunk.
#[derive(Debug, Clone)]
pub struct ModeStats {
    pub mode: Mode,
    pub samples: TokenSamples,
    pub layers: Vec<LayerSums>,
}

/// Every stream's raw statistics (the reference first), what a report is summarized from.
#[derive(Debug, Clone)]
pub struct ParityStats {
    pub streams: Vec<ModeStats>,
    /// Scored rows per chunk (`ctx − prompt`) the expert agreement is a share of.
    pub rows_per_chunk: u64,
    /// Per decoder layer, whether it routes (its agreement is reported).
    pub moe_layers: Vec<bool>,
}

//! The types of a parity run: what it is asked (modes, gates, KV scales, options) and what it answers (the report
//! with its per-mode and per-layer results, and the raw statistics parts merge from).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Map;

use crate::job_error::JobError;

use crate::chunks::EvalInput;
use crate::engines::kv_scales::{CacheLayout, ScaleUse};
use crate::engines::Engine;
use crate::parity::{GateFailure, Gates, Mode};
use crate::part::Part;

use crate::eval::kld_stats::{Summary, TokenSamples};

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

/// Each requested mode's report (sorted by mode), the same as JSON by mode name, and the failed gates.
pub(crate) struct Summaries {
    pub mode_reports: Vec<(Mode, ModeReport)>,
    pub json_modes: Map<String, serde_json::Value>,
    pub failures: Vec<GateFailure>,
}

pub(crate) fn summarize(stats: &ParityStats, modes: &[Mode], gates: &Gates) -> Result<Summaries, JobError> {
    let mut mode_reports = Vec::new();
    let mut json_modes = Map::new();
    let mut failures = Vec::new();
    for stream in &stats.streams {
        if !modes.contains(&stream.mode) {
            continue;
        }
        let sample = &stream.samples;
        let summary = Summary::of(sample);
        let mut kld_sorted = sample.kld.clone();
        kld_sorted.sort_by(f64::total_cmp);
        let layers = stream
            .layers
            .iter()
            .enumerate()
            .map(|(layer, sums)| {
                let rows = stats.rows_per_chunk * sums.difference.len() as u64;
                sums.error(layer, rows, stats.moe_layers.get(layer).copied().unwrap_or(false))
            })
            .collect();
        let report = ModeReport { summary, layers, kld_sorted };
        if stream.mode != Mode::Reference {
            failures.extend(check_gates(stream.mode, &report.summary, gates));
        }
        json_modes.insert(
            stream.mode.name().into(),
            serde_json::to_value(&report).map_err(|e| JobError::Input(e.to_string()))?,
        );
        mode_reports.push((stream.mode, report));
    }
    mode_reports.sort_by_key(|(mode, _)| *mode);
    Ok(Summaries { mode_reports, json_modes, failures })
}

fn check_gates(mode: Mode, summary: &Summary, gates: &Gates) -> Vec<GateFailure> {
    let mut failures = Vec::new();
    let mut fail = |gate: &str, value: f64, limit: f64| {
        failures.push(GateFailure { gate: gate.into(), mode: mode.name().into(), value, limit })
    };
    // NaN statistics fail every gate.
    if summary.mean_kld.is_nan() || summary.mean_kld > gates.max_mean_kld {
        fail("max-mean-kld", summary.mean_kld, gates.max_mean_kld);
    }
    if summary.same_top.is_nan() || summary.same_top < gates.min_same_top {
        fail("min-same-top", summary.same_top, gates.min_same_top);
    }
    if summary.ppl_ratio.is_nan() || summary.ppl_ratio > gates.max_ppl_ratio {
        fail("max-ppl-ratio", summary.ppl_ratio, gates.max_ppl_ratio);
    }
    failures
}

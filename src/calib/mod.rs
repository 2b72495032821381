//! `squeeze calibrate-kv MODEL`: runs calibration text through the layer-streamed reference runtime, observes per
//! layer exactly the values the engines store in an FP8 KV cache (MLA: the normed latent `kv_c_normed` and the
//! post-RoPE `k_pe` of each token's 576-wide row, under one scale; GQA: post-RoPE K and V, per tensor or per KV
//! head), and derives `scale = amax / 448` (or a percentile of |x| / 448).

mod observe;
pub mod part_stats;
pub mod per_row;
mod write;

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

pub use observe::AbsStats;
pub use write::{open_for_edit, write_scales, WrittenFiles, SCALES_FILE};

use crate::arch::hyper::widen;
use crate::arch::rope::rope_setup;
use crate::arch::{
    embed, run_layers, CachedKv, ExpertTimes, KvSource, KvTap, LayerContext, LayerState, LayerTap, Model, Residual,
};
use crate::chunks::{load_sequences, EvalInput, Fit};
use crate::engines::kv_scales::{kv_scale_handling, kv_scale_names, CacheLayout, KvScaleHandling};
use crate::engines::Engine;
use crate::job_error::JobError;
use crate::load::weights::WeightReader;
use crate::model::ModelConfig;
use crate::part::Part;
use crate::progress::Reporter;
use crate::runtime::{Backend, Spans};

/// Largest finite FP8 e4m3 magnitude.
pub const FP8_MAX: f32 = 448.0;
/// Smallest normal FP8 e4m3 magnitude (2^-6); below it values are subnormal (3 bits of precision at most, fewer
/// further down) and below 2^-10 they round to zero.
pub const FP8_MIN_NORMAL: f32 = 0.015625;
/// A layer whose amax differs from the geometric mean of its neighbours' by more than this factor is flagged.
pub const NEIGHBOUR_FACTOR: f32 = 8.0;

/// One scale per layer or one per KV head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    Tensor,
    Head,
}

#[derive(Debug, Clone)]
pub struct CalibOptions {
    pub model: PathBuf,
    pub input: EvalInput,
    pub samples: usize,
    /// Percentile of |x| the scale maps to 448; `None` is amax.
    pub percentile: Option<f64>,
    pub strategy: Strategy,
    /// The engines the scales are written for (their tensor names; the report says what each does with them).
    pub engines: Vec<Engine>,
    /// `--part I/N`: observe only part I's calibration sequences.
    pub part: Option<Part>,
    /// `--save-stats FILE`: write the per-layer amax, counts and histograms for `squeeze merge-calib`.
    pub save_stats: Option<std::path::PathBuf>,
    /// `--allow-long-context`: sequences longer than the model's context window are run, with a warning.
    pub allow_long_context: bool,
}

/// Calibrated scales and statistics of one layer.
#[derive(Debug, Clone, Serialize)]
pub struct LayerReport {
    pub layer: usize,
    /// amax of K (MLA: of the whole latent row) — the maximum over heads for per-head scales.
    pub k_amax: f32,
    pub v_amax: f32,
    /// One value, or one per KV head.
    pub k_scale: Vec<f32>,
    pub v_scale: Vec<f32>,
    /// Share of the observed values that would saturate at ±448 with these scales (the clip rate).
    pub k_saturated: f64,
    pub v_saturated: f64,
    /// Share that would land in the e4m3 subnormal range (|x / scale| < 2^-6, zeros included) with these scales.
    pub k_subnormal: f64,
    pub v_subnormal: f64,
    /// The same two shares at scale 1.0: what a cache that ignores the checkpoint's scales stores.
    pub k_saturated_at_one: f64,
    pub v_saturated_at_one: f64,
    pub k_subnormal_at_one: f64,
    pub v_subnormal_at_one: f64,
    /// Tokens observed.
    pub tokens: u64,
    /// Why this layer looks suspicious, if it does.
    pub warning: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CalibReport {
    pub model: String,
    pub architecture: String,
    /// `mla` (one scale covers the latent row; v_scale = k_scale) or `gqa`.
    pub cache: String,
    pub strategy: Strategy,
    pub rule: String,
    pub samples: usize,
    pub seq_len: usize,
    pub layers: Vec<LayerReport>,
    /// What each target engine does with the scales of this cache layout.
    pub engines: Vec<KvScaleHandling>,
    /// Tensor-name suffixes (after `model.layers.N.`) the scales are written under, K then V per pair.
    pub tensor_names: Vec<(String, String)>,
    pub seconds: f64,
    /// Files written, filled in by the caller.
    pub written: Vec<String>,
    /// What the scales should be read with (sequences beyond the context window under `--allow-long-context`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Decoder layers that cache no keys and values (KDA linear attention: a fixed-size state per request, which
    /// vLLM keeps in BF16 (convolution inputs) and F32 (recurrent state) with no FP8 scale): no scales for them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub state_layers: Vec<usize>,
}

/// Per layer: K and V statistics per KV head (MLA: one "head", K only).
#[derive(Debug, Clone)]
pub struct LayerObservation {
    pub k: Vec<AbsStats>,
    pub v: Vec<AbsStats>,
}

/// What a calibration observed: per layer statistics (exact integer counts and maxima, so parts merge exactly),
/// the sequences and the longest of them.
#[derive(Debug, Clone)]
pub struct Observations {
    pub layers: Vec<LayerObservation>,
    pub samples: usize,
    pub seq_len: usize,
}

/// Runs the calibration and returns the report (nothing is written; see [`write_scales`]).
pub fn calibrate(
    options: &CalibOptions,
    backend: &dyn Backend,
    reporter: &dyn Reporter,
) -> Result<CalibReport, JobError> {
    let started = Instant::now();
    let model = Model::open(&options.model)?;
    let config = model.config();
    crate::load::open::check_kv_cache(&options.model, config, "calibrate-kv")?;
    // At least two tokens per sequence, as eval asks: a one-token sequence attends only to itself.
    let fit = Fit {
        vocab: config.vocab_size,
        windows: &[&config.window],
        min_ctx: 2,
        allow_long_context: options.allow_long_context,
    };
    let loaded = load_sequences(&options.input, &options.model, Some(options.samples), &fit)?;
    let all = loaded.sequences;
    let (sequences, chunk_range) = crate::part::select(&all, options.part).map_err(JobError::Input)?;
    if let Some(p) = options.percentile {
        if !(p > 0.0 && p <= 100.0) {
            return Err(JobError::Input(format!("--percentile {p} must be in (0, 100]")));
        }
    }
    let mla = matches!(config.attention, crate::model::config::Attention::Mla { .. });
    let heads = match (&config.attention, options.strategy) {
        (crate::model::config::Attention::Gqa { num_key_value_heads, .. }, Strategy::Head) => *num_key_value_heads,
        _ => 1,
    };
    if mla && options.strategy == Strategy::Head {
        reporter.warn("MLA caches one latent row per token under one scale; --strategy head is ignored");
    }

    let reader = WeightReader::new(model.checkpoint());
    let lengths: Vec<usize> = sequences.iter().map(Vec::len).collect();
    let spans = Spans::new(&lengths);
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let (table, mla_scale) = rope_setup(config, longest);
    let ids: Vec<u32> = sequences.concat();
    let mut hidden = widen(backend, config, backend.upload(&embed(&reader, config, &ids)?, config.hidden_size)?)?;
    let context = LayerContext { backend, reader: &reader, config, table: &table, mla_scale };
    let mut state = LayerState { tokens: ids, ..LayerState::default() };
    let mut observations = Vec::with_capacity(config.num_hidden_layers);
    reporter.begin("layers", config.num_hidden_layers as u64);
    run_layers(&[&model], backend, reporter, &mut |step| {
        let mut observation =
            LayerObservation { k: vec![AbsStats::default(); heads], v: vec![AbsStats::default(); heads] };
        let mut observer = |cached: &CachedKv| match cached {
            CachedKv::Mla { rows, .. } => observation.k[0].add(rows),
            CachedKv::Gqa { k, v, heads: kv_heads, head_dim } => {
                for (row, chunk) in k.chunks(*head_dim).enumerate() {
                    observation.k[(row % kv_heads) % heads].add(chunk);
                }
                for (row, chunk) in v.chunks(*head_dim).enumerate() {
                    observation.v[(row % kv_heads) % heads].add(chunk);
                }
            }
        };
        let mut tap = LayerTap { kv: KvTap { observer: Some(&mut observer), fp8: None }, routes: None, experts: None };
        // The last layer's MLP does not change what is cached; it still runs (cheap next to loading).
        let times = ExpertTimes::default();
        let residual = Residual { hidden: &mut hidden, spans: &spans, state: &mut state };
        step.layers[0].forward(&context, residual, KvSource::Own, &times, Some(&mut tap))?;
        observations.push(observation);
        Ok(())
    })?;
    reporter.end();
    let observed = Observations { layers: observations, samples: sequences.len(), seq_len: longest };
    if let Some(path) = &options.save_stats {
        let identity = crate::part::PartIdentity::of(
            &all,
            &[model.checkpoint()],
            options.part.unwrap_or(Part::WHOLE),
            chunk_range,
        );
        part_stats::write(path, &identity, options, &observed, started.elapsed().as_secs_f64())?;
    }
    let mut report = summarize(config, options, &observed, started.elapsed().as_secs_f64());
    report.warnings = loaded.warnings;
    for layer in &report.layers {
        if let Some(warning) = &layer.warning {
            reporter.warn(&format!("layer {}: {warning}", layer.layer));
        }
    }
    Ok(report)
}

/// The report (scales and statistics per layer) of what was observed.
pub fn summarize(config: &ModelConfig, options: &CalibOptions, observed: &Observations, seconds: f64) -> CalibReport {
    let mla = matches!(config.attention, crate::model::config::Attention::Mla { .. });
    let percent = options.percentile.unwrap_or(100.0);
    let mut layers: Vec<LayerReport> = observed
        .layers
        .iter()
        .enumerate()
        .filter(|(layer, _)| !config.is_kda_layer(*layer))
        .map(|(layer, observation)| {
            let scales = |stats: &[AbsStats]| -> Vec<f32> {
                stats.iter().map(|s| (s.percentile(percent) / FP8_MAX).max(f32::MIN_POSITIVE)).collect()
            };
            // Share of values above (saturating) or below (subnormal) a threshold given in FP8 units, per scale.
            let share = |stats: &[AbsStats], scale: &[f32], threshold: f32, above: bool| -> f64 {
                let total: u64 = stats.iter().map(|s| s.count).sum();
                let part: f64 = stats
                    .iter()
                    .zip(scale.iter().cycle())
                    .map(|(s, &c)| {
                        let share = if above { s.share_above(c * threshold) } else { s.share_below(c * threshold) };
                        share * s.count as f64
                    })
                    .sum();
                if total == 0 {
                    0.0
                } else {
                    part / total as f64
                }
            };
            let saturated = |stats: &[AbsStats], scale: &[f32]| share(stats, scale, FP8_MAX, true);
            let subnormal = |stats: &[AbsStats], scale: &[f32]| share(stats, scale, FP8_MIN_NORMAL, false);
            let k_scale = scales(&observation.k);
            let v_stats = if mla { &observation.k } else { &observation.v };
            let v_scale = if mla { k_scale.clone() } else { scales(&observation.v) };
            let v_amax = v_stats.iter().map(|s| s.amax).fold(0.0, f32::max);
            let row_values: u64 = observation.k.iter().map(|s| s.count).sum();
            let per_token = match &config.attention {
                crate::model::config::Attention::Mla { kv_lora_rank, qk_rope_head_dim, .. } => {
                    kv_lora_rank + qk_rope_head_dim
                }
                crate::model::config::Attention::Gqa { num_key_value_heads, head_dim, .. } => {
                    num_key_value_heads * head_dim
                }
            };
            LayerReport {
                layer,
                k_amax: observation.k.iter().map(|s| s.amax).fold(0.0, f32::max),
                v_amax,
                k_saturated: saturated(&observation.k, &k_scale),
                v_saturated: saturated(v_stats, &v_scale),
                k_subnormal: subnormal(&observation.k, &k_scale),
                v_subnormal: subnormal(v_stats, &v_scale),
                k_saturated_at_one: saturated(&observation.k, &[1.0]),
                v_saturated_at_one: saturated(v_stats, &[1.0]),
                k_subnormal_at_one: subnormal(&observation.k, &[1.0]),
                v_subnormal_at_one: subnormal(v_stats, &[1.0]),
                k_scale,
                v_scale,
                tokens: row_values / per_token.max(1) as u64,
                warning: None,
            }
        })
        .collect();
    flag_outliers(&mut layers);
    CalibReport {
        model: options.model.display().to_string(),
        architecture: config.architecture.name().to_string(),
        cache: if mla { "mla".into() } else { "gqa".into() },
        strategy: if mla { Strategy::Tensor } else { options.strategy },
        rule: match options.percentile {
            Some(p) => format!("p{p} / 448"),
            None => "amax / 448".into(),
        },
        samples: observed.samples,
        seq_len: observed.seq_len,
        layers,
        engines: options.engines.iter().map(|&engine| kv_scale_handling(engine, CacheLayout::of(config))).collect(),
        tensor_names: kv_scale_names(&options.engines, CacheLayout::of(config))
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        seconds,
        written: Vec::new(),
        warnings: Vec::new(),
        state_layers: (0..observed.layers.len()).filter(|&layer| config.is_kda_layer(layer)).collect(),
    }
}

/// Flags layers whose K or V amax is far (×[`NEIGHBOUR_FACTOR`]) from the geometric mean of their neighbours'.
fn flag_outliers(layers: &mut [LayerReport]) {
    let amax: Vec<(f32, f32)> = layers.iter().map(|l| (l.k_amax, l.v_amax)).collect();
    for (index, layer) in layers.iter_mut().enumerate() {
        let neighbours: Vec<usize> =
            [index.checked_sub(1), Some(index + 1)].into_iter().flatten().filter(|&n| n < amax.len()).collect();
        if neighbours.is_empty() {
            continue;
        }
        let mut notes = Vec::new();
        for (label, pick) in [("K", 0usize), ("V", 1)] {
            let value = if pick == 0 { amax[index].0 } else { amax[index].1 };
            let logs: Vec<f32> = neighbours
                .iter()
                .map(|&n| if pick == 0 { amax[n].0 } else { amax[n].1 })
                .map(|a| a.max(f32::MIN_POSITIVE).ln())
                .collect();
            let mean = (logs.iter().sum::<f32>() / logs.len() as f32).exp();
            let ratio = value.max(f32::MIN_POSITIVE) / mean;
            if !(1.0 / NEIGHBOUR_FACTOR..=NEIGHBOUR_FACTOR).contains(&ratio) {
                notes.push(format!("{label} amax {value:.4} is {ratio:.1}× its neighbours' ({mean:.4})"));
            }
        }
        if !notes.is_empty() {
            layer.warning = Some(format!("{}; check the calibration text covers this layer's range", notes.join(", ")));
        }
    }
}

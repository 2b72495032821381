//! What `calibrate-kv` says for a model whose FP8 KV caches take no stored scales: DeepSeek-V4, whose
//! `fp8_ds_mla` rows and indexer keys get their scales from each row as it is written
//! ([`crate::arch::v4_kv_fp8`]). Per layer type, what the engines cache and in what format; nothing is calibrated
//! and nothing written. What FP8 storage costs in accuracy is parity's `kv` mode (`squeeze eval --reference
//! --candidate`).

use std::path::Path;

use serde::Serialize;

use crate::engines::kv_scales::{kv_scale_handling, CacheLayout, KvScaleHandling};
use crate::engines::Engine;
use crate::model::ModelConfig;

/// The cache of one layer type.
#[derive(Debug, Clone, Serialize)]
pub struct LayerTypeCache {
    /// `sliding`, `csa` or `hca`.
    pub kind: &'static str,
    /// Decoder layers of this type.
    pub layers: usize,
    /// What each such layer caches per request, as the engines store it.
    pub stores: String,
}

/// `calibrate-kv`'s report on a model with per-row FP8 scales.
#[derive(Debug, Clone, Serialize)]
pub struct PerRowScales {
    pub model: String,
    pub architecture: String,
    pub layer_types: Vec<LayerTypeCache>,
    pub engines: Vec<KvScaleHandling>,
    /// Always empty: there is no scale to write.
    pub written: Vec<String>,
}

/// The report for `config` when its caches take per-row scales, else `None` (calibration applies).
pub fn per_row_scales(model: &Path, config: &ModelConfig, engines: &[Engine]) -> Option<PerRowScales> {
    let v4 = config.deepseek_v4()?;
    let ratios = &v4.compress_ratios[..config.num_hidden_layers.min(v4.compress_ratios.len())];
    let (window, rope) = (v4.sliding_window, v4.qk_rope_head_dim);
    let nope = v4.head_dim - rope.min(v4.head_dim);
    let row = format!(
        "fp8_ds_mla rows of {} values: {nope} NoPE e4m3 with a UE8M0 scale per 64, {rope} RoPE BF16",
        v4.head_dim
    );
    let window_rows = format!("the last {window} key rows (sliding window)");
    let of_kind = |ratio: usize| ratios.iter().filter(|&&r| r == ratio).count();
    let kinds = [
        ("sliding", 0, format!("{window_rows}; {row}")),
        (
            "csa",
            4,
            format!(
                "{window_rows}, one compressed entry per 4 tokens, and one indexer key of {} e4m3 with a power-of-two \
                 FP32 scale per 4 tokens; {row}",
                v4.index_head_dim
            ),
        ),
        ("hca", 128, format!("{window_rows} and one compressed entry per 128 tokens; {row}")),
    ];
    let layer_types = kinds
        .into_iter()
        .map(|(kind, ratio, stores)| LayerTypeCache { kind, layers: of_kind(ratio), stores })
        .filter(|cache| cache.layers > 0)
        .collect();
    Some(PerRowScales {
        model: model.display().to_string(),
        architecture: config.architecture.name().to_string(),
        layer_types,
        engines: engines.iter().map(|&engine| kv_scale_handling(engine, CacheLayout::Compressed)).collect(),
        written: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepseek_v4_says_what_each_layer_type_stores_and_others_calibrate() {
        let preset = crate::model::presets::config_text("deepseek-v4-flash").expect("the V4-Flash preset");
        let config = ModelConfig::from_json(&serde_json::from_str(preset).unwrap()).unwrap();
        let report = per_row_scales(Path::new("v4"), &config, &[Engine::Vllm, Engine::Sglang]).expect("V4");
        let kinds: Vec<(&str, usize)> = report.layer_types.iter().map(|t| (t.kind, t.layers)).collect();
        let layers: usize = kinds.iter().map(|(_, n)| n).sum();
        assert_eq!(layers, config.num_hidden_layers, "{kinds:?}");
        assert!(kinds.iter().all(|(_, n)| *n > 0) && kinds.len() == 3, "V4-Flash has all three types: {kinds:?}");
        assert!(report.layer_types[1].stores.contains("indexer key of 128 e4m3"), "{:?}", report.layer_types[1]);
        assert!(report.engines.iter().all(|e| e.loads.is_empty()), "no engine loads a V4 KV scale");
        let glm = crate::model::presets::config_text("glm-5").expect("the GLM-5 preset");
        let glm = ModelConfig::from_json(&serde_json::from_str(glm).unwrap()).unwrap();
        assert!(per_row_scales(Path::new("glm"), &glm, &[Engine::Vllm]).is_none());
    }
}

//! FP8 KV-cache scales on disk: the element type of a KV cache ([`KvDtype`]), the cache row layout the scales
//! apply to ([`KvLayout`]), the tensor names (`model.layers.N.self_attn.k_scale` / `.v_scale` and the variants
//! engines load), the reader of a checkpoint's per-layer scales and the writer side's shapes and
//! `kv_cache_scheme`. Which engine loads which names, and what it does with them, is engine policy:
//! [`crate::engines`].
//!
//! Shapes `[1]` (per tensor) or `[kv_heads, 1, 1]` (per head), F32, BF16 or F16. MLA models cache one latent row
//! per token (kv_lora + rope, one "head"), quantized with `k_scale` only, as vLLM and SGLang do. A stored value `s`
//! means `fp8 = encode(x / s)`, `x ≈ decode(fp8) · s`. When the checkpoint has no scale for a layer the scale is
//! 1.0 (what the engines silently use) and [`KvScales::missing_layers`] says so, so that the caller can warn with
//! [`KvScales::warning`].

use std::path::Path;

use serde_json::{json, Value};

use crate::io::dtype::Dtype;
use crate::io::{Checkpoint, IoError};
use crate::model::config::Attention;
use crate::model::ModelConfig;

use super::row_reader::RowReader;
use super::vendor_source::{SourceItem, SourceKind};

/// The element type of a KV cache: F32 (exact, for tests), BF16, or FP8 e4m3 with the layer's scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    F32,
    Bf16,
    Fp8,
}

impl KvDtype {
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 => 2,
            KvDtype::Fp8 => 1,
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "f32" => Some(KvDtype::F32),
            "bf16" => Some(KvDtype::Bf16),
            "fp8" | "fp8_e4m3" => Some(KvDtype::Fp8),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8 => "fp8",
        }
    }
}

/// The `(k, v)` name suffixes squeeze always writes and its runtime reads first.
pub const CANONICAL_NAMES: (&str, &str) = ("self_attn.k_scale", "self_attn.v_scale");

/// Name variants engines have used for the same scale, preferred first (docs/engines.md, "Which names load"); the
/// reader takes the first one present.
const K_NAMES: [&str; 4] =
    ["self_attn.k_scale", "self_attn.attn.k_scale", "self_attn.attn_mqa.k_scale", "self_attn.kv_scale"];
const V_NAMES: [&str; 3] = ["self_attn.v_scale", "self_attn.attn.v_scale", "self_attn.kv_scale"];

/// The cache layout the scales apply to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// One latent row per token: `kv_lora + rope` wide, quantized with `k_scale`.
    Mla { row_width: usize },
    /// K and V per KV head.
    Gqa { kv_heads: usize, head_dim: usize },
}

impl KvLayout {
    pub fn of(config: &ModelConfig) -> Self {
        match &config.attention {
            Attention::Mla { kv_lora_rank, qk_rope_head_dim, .. } => {
                KvLayout::Mla { row_width: kv_lora_rank + qk_rope_head_dim }
            }
            Attention::Gqa { num_key_value_heads, head_dim, .. } => {
                KvLayout::Gqa { kv_heads: *num_key_value_heads, head_dim: *head_dim }
            }
        }
    }

    /// Heads a per-head scale must cover.
    pub fn heads(self) -> usize {
        match self {
            KvLayout::Mla { .. } => 1,
            KvLayout::Gqa { kv_heads, .. } => kv_heads,
        }
    }
}

/// One layer's scales, each either one value or one per KV head.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerKvScales {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

impl LayerKvScales {
    pub fn unit() -> Self {
        Self { k: vec![1.0], v: vec![1.0] }
    }

    /// The K scale of KV head `head` (the MLA latent row: head 0).
    pub fn k_for(&self, head: usize) -> f32 {
        pick(&self.k, head)
    }

    /// The V scale of KV head `head`. Not used for MLA (the latent row uses `k_scale`).
    pub fn v_for(&self, head: usize) -> f32 {
        pick(&self.v, head)
    }
}

fn pick(values: &[f32], head: usize) -> f32 {
    if values.len() == 1 {
        values[0]
    } else {
        values[head]
    }
}

/// Scales for every decoder layer.
#[derive(Debug, Clone)]
pub struct KvScales {
    pub layout: KvLayout,
    pub layers: Vec<LayerKvScales>,
    /// Layers that had no scale in the checkpoint (filled with 1.0).
    pub missing_layers: Vec<usize>,
}

impl KvScales {
    /// All-1.0 scales for `layers` layers (used for BF16 caches, where scales do not apply).
    pub fn unit(layout: KvLayout, layers: usize) -> Self {
        Self { layout, layers: vec![LayerKvScales::unit(); layers], missing_layers: Vec::new() }
    }

    /// Reads the scales of the first `config.num_hidden_layers` layers of `checkpoint` (a KDA layer, which caches
    /// no keys and values, has none and is not missing one).
    pub fn read(checkpoint: &Checkpoint, config: &ModelConfig) -> Result<Self, IoError> {
        let mut scales = read_kv_scales(checkpoint, config.num_hidden_layers, KvLayout::of(config))?;
        scales.missing_layers.retain(|&layer| !config.is_kda_layer(layer));
        Ok(scales)
    }

    /// Whether any layer fell back to 1.0.
    pub fn any_missing(&self) -> bool {
        !self.missing_layers.is_empty()
    }

    /// The latent-row scale of an MLA layer (its `k_scale`).
    pub fn latent(&self, layer: usize) -> f32 {
        self.layers[layer].k_for(0)
    }

    /// A warning for stderr when some layer has no scale, naming the model and the remedy; `None` when all were found.
    pub fn warning(&self, model: &Path) -> Option<String> {
        if self.missing_layers.is_empty() {
            return None;
        }
        let which = if self.missing_layers.len() == self.layers.len() {
            "has no FP8 KV-cache scales (self_attn.k_scale/v_scale)".to_string()
        } else {
            format!(
                "has no FP8 KV-cache scales for {} of {} layers (first: layer {})",
                self.missing_layers.len(),
                self.layers.len(),
                self.missing_layers[0]
            )
        };
        Some(format!(
            "warning: {} {which}; using scale 1.0, so cached values above 448 saturate and small ones lose precision — \
             accuracy may suffer. Calibrate them with `squeeze calibrate-kv {}`",
            model.display(),
            model.display()
        ))
    }
}

/// `model.layers.<layer>.<suffix>`: the full name of a layer's scale tensor.
pub fn tensor_name(layer: usize, suffix: &str) -> String {
    format!("model.layers.{layer}.{suffix}")
}

/// Reads `k_scale`/`v_scale` for `layers` layers. Errors name the tensor when a scale has a wrong shape, dtype or a
/// non-finite or non-positive value; a missing scale is not an error (1.0, recorded in `missing_layers`).
pub fn read_kv_scales(checkpoint: &Checkpoint, layers: usize, layout: KvLayout) -> Result<KvScales, IoError> {
    let mut out = Vec::with_capacity(layers);
    let mut missing_layers = Vec::new();
    for layer in 0..layers {
        let k = read_one(checkpoint, layer, &K_NAMES, layout)?;
        let v = read_one(checkpoint, layer, &V_NAMES, layout)?;
        let scales = match (k, layout) {
            (None, _) => {
                missing_layers.push(layer);
                LayerKvScales::unit()
            }
            // MLA: only k_scale matters; mirror it into v so either accessor returns the latent scale.
            (Some(k), KvLayout::Mla { .. }) => LayerKvScales { v: k.clone(), k },
            (Some(k), KvLayout::Gqa { .. }) => {
                let v = match v {
                    Some(v) => v,
                    None => {
                        missing_layers.push(layer);
                        vec![1.0]
                    }
                };
                LayerKvScales { k, v }
            }
        };
        out.push(scales);
    }
    Ok(KvScales { layout, layers: out, missing_layers })
}

fn read_one(
    checkpoint: &Checkpoint,
    layer: usize,
    names: &[&str],
    layout: KvLayout,
) -> Result<Option<Vec<f32>>, IoError> {
    let Some(name) = names.iter().map(|suffix| tensor_name(layer, suffix)).find(|n| checkpoint.contains(n)) else {
        return Ok(None);
    };
    let shard = checkpoint.shard_of(&name).map(|s| s.path().to_path_buf()).unwrap_or_default();
    let tensor = checkpoint.get(&name).ok_or_else(|| IoError::tensor(&shard, &name, "is unreadable"))?;
    if !matches!(tensor.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
        return Err(IoError::tensor(
            &shard,
            &name,
            format!("has dtype {:?}; a KV-cache scale must be F32, BF16 or F16", tensor.dtype),
        ));
    }
    let elements: usize = tensor.shape.iter().product();
    let heads = layout.heads();
    let per_head_shape = tensor.shape.len() == 3 && tensor.shape[1] == 1 && tensor.shape[2] == 1;
    let valid = elements == 1 || (elements == heads && (per_head_shape || tensor.shape.len() == 1));
    if !valid {
        return Err(IoError::tensor(
            &shard,
            &name,
            format!(
                "has shape {:?}; expected [1] (per tensor) or [{heads}, 1, 1] (per KV head); regenerate it with `squeeze calibrate-kv`",
                tensor.shape
            ),
        ));
    }
    let item =
        SourceItem { name: name.clone(), dtype: tensor.dtype, shape: tensor.shape.to_vec(), kind: SourceKind::Plain };
    let values = RowReader::new(checkpoint, &item)?.read_all();
    if let Some(position) = values.iter().position(|v| !v.is_finite()) {
        return Err(IoError::tensor(
            &shard,
            &name,
            format!("element {position} dequantizes to {}; the checkpoint is corrupt", values[position]),
        ));
    }
    if let Some(bad) = values.iter().find(|v| !v.is_finite() || **v <= 0.0) {
        return Err(IoError::tensor(
            &shard,
            &name,
            format!(
                "holds {bad}; a KV-cache scale must be finite and positive; regenerate it with `squeeze calibrate-kv`"
            ),
        ));
    }
    Ok(Some(values))
}

/// The stored shape of `values` scales of one tensor: `[1]` per tensor, `[values, 1, 1]` per KV head.
pub fn tensor_shape(values: usize, per_head: bool) -> Vec<usize> {
    if per_head {
        vec![values, 1, 1]
    } else {
        vec![1]
    }
}

/// The compressed-tensors `kv_cache_scheme` of static FP8 scales, per tensor or per head (`attn_head`).
pub fn kv_cache_scheme(per_head: bool) -> Value {
    json!({
        "num_bits": 8,
        "type": "float",
        "strategy": if per_head { "attn_head" } else { "tensor" },
        "dynamic": false,
        "symmetric": true,
    })
}

/// SGLang/vLLM `--quantization-param-path`: `{"model_type", "kv_cache": {"dtype": "float8_e4m3fn",
/// "scaling_factor": {"<tp rank>": {"<layer>": scale}}}}` with one scale per layer, for rank 0 only (the scales do
/// not depend on the rank).
pub fn quantization_param_json(model_type: Value, layers: impl IntoIterator<Item = (usize, f32)>) -> Value {
    let layers: serde_json::Map<String, Value> =
        layers.into_iter().map(|(layer, scale)| (layer.to_string(), Value::from(scale as f64))).collect();
    json!({
        "model_type": model_type,
        "kv_cache": { "dtype": "float8_e4m3fn", "scaling_factor": { "0": layers } },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_head_pick_and_unit() {
        let scales = LayerKvScales { k: vec![0.5, 2.0], v: vec![3.0] };
        assert_eq!(scales.k_for(1), 2.0);
        assert_eq!(scales.v_for(1), 3.0);
        let unit = KvScales::unit(KvLayout::Mla { row_width: 576 }, 3);
        assert_eq!(unit.latent(2), 1.0);
        assert!(unit.warning(Path::new("m")).is_none());
    }

    #[test]
    fn warning_names_the_remedy() {
        let scales = KvScales {
            layout: KvLayout::Gqa { kv_heads: 2, head_dim: 8 },
            layers: vec![LayerKvScales::unit(); 2],
            missing_layers: vec![0, 1],
        };
        let text = scales.warning(Path::new("/m/x")).unwrap();
        assert!(text.contains("accuracy may suffer") && text.contains("squeeze calibrate-kv /m/x"), "{text}");
    }
    #[test]
    fn reads_bf16_per_tensor_f32_per_head_and_flags_missing() {
        use crate::io::dtype::Dtype;
        use crate::io::writer::{PlannedTensor, ShardWriter};
        let dir = tempfile::tempdir().unwrap();
        let bf16 = half::bf16::from_f32(0.25).to_bits().to_le_bytes().to_vec();
        let per_head: Vec<u8> = [0.5f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let tensors = vec![
            (PlannedTensor::new("model.layers.0.self_attn.k_scale", Dtype::BF16, vec![1]), bf16.clone()),
            (PlannedTensor::new("model.layers.0.self_attn.v_scale", Dtype::BF16, vec![1]), bf16),
            (PlannedTensor::new("model.layers.1.self_attn.k_scale", Dtype::F32, vec![2, 1, 1]), per_head.clone()),
            (PlannedTensor::new("model.layers.1.self_attn.v_scale", Dtype::F32, vec![2, 1, 1]), per_head),
        ];
        let mut writer =
            ShardWriter::create(&dir.path().join("model.safetensors"), tensors.iter().map(|t| t.0.clone()).collect())
                .unwrap();
        for (planned, bytes) in &tensors {
            writer.write_tensor(&planned.name, bytes).unwrap();
        }
        writer.finish().unwrap();
        let checkpoint = Checkpoint::open(dir.path()).unwrap();
        let scales = read_kv_scales(&checkpoint, 3, KvLayout::Gqa { kv_heads: 2, head_dim: 4 }).unwrap();
        assert_eq!(scales.layers[0].k_for(1), 0.25);
        assert_eq!(scales.layers[1].k, vec![0.5, 2.0]);
        assert_eq!(scales.layers[2], LayerKvScales::unit());
        assert_eq!(scales.missing_layers, vec![2]);
        // An MLA latent row is one head: a per-head scale of 2 heads is rejected with the tensor named.
        let error = read_kv_scales(&checkpoint, 2, KvLayout::Mla { row_width: 576 }).unwrap_err().to_string();
        assert!(error.contains("model.layers.1.self_attn.k_scale"), "{error}");
    }
}

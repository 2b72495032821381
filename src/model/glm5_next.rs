//! GLM-5.3-Flash (`glm5_next`, `Glm5NextForConditionalGeneration`, text model `glm5_next_text`): the keys squeeze
//! reads beside GLM-5's and the tensors its decoder layers add, by the text model's names (`model.layers.N.…`; the
//! release stores them under `model.language_model.`, which [`crate::io::composite`] maps).
//!
//! From transformers 5.24 `models/glm5_next/` (`configuration_glm5_next.py`, `modeling_glm5_next.py`, and the
//! `glm5_next` entry of `conversion_mapping.py`, which says how the stored names become its modules):
//! - `layer_types`: `linear_attention` (KDA) or `indexed_attention` (NoPE MLA with the DSA indexer;
//!   `full_attention` is read as `indexed_attention`); by default every layer KDA but each fourth (3, 7, …);
//! - KDA as Kimi-Linear stores it (`q/k/v_proj`, `q/k/v_conv1d` `[P, 1, K]` F32, `f_a_proj`/`f_b_proj`, `b_proj`,
//!   `g_a_proj`/`g_b_proj`, `A_log` `[heads]` F32, `dt_bias` `[P]` F32, `o_norm`, `o_proj`) with the sizes in
//!   `linear_head_dim`/`linear_num_heads`/`linear_conv_kernel_dim` (or `linear_attn_config`), and a *safe* forget
//!   gate `g = linear_lower_bound · sigmoid(exp(A_log) · (f + dt_bias))` (lower bound −5 by default);
//! - the indexer pools its keys (`index_kpool`, default 16): `index_kpool_compress_ape` `[kpool, index_head_dim]`
//!   and `index_kpool_compress_gate` `[index_head_dim, hidden]` beside GLM-5's `wq_b`/`wk`/`k_norm`/`weights_proj`;
//!   `indexer_types` as GLM-5.2's (`full`/`shared`), all full by default;
//! - mHC (`hc_mult` streams, default 4): per layer `hc_attn_{fn,base,scale}` and `hc_ffn_{fn,base,scale}` (`fn`
//!   `[(2 + N)·N, N·hidden]`, `base` `[(2 + N)·N]` F32, `scale` `[3]` F32);
//! - `mlp_layer_types` (the first three dense by default), SwiGLU clamped at `swiglu_limit` (default 10) in every
//!   MLP and expert; the MTP layer after the last decoder layer (transformers skips `layers.45.` on load).

use serde_json::Value;

use super::config_error::ConfigError;
use super::hybrid::{kda_layer_types, HyperConnections, KdaKeys};
use super::keys::Keys;
use super::tensor_spec::{TensorRole, TensorSpec};

/// The GLM-5.3-Flash keys beside GLM-5's.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Glm5Next {
    /// Per decoder layer: `true` for KDA, `false` for indexed (NoPE MLA) attention.
    pub kda_layers: Vec<bool>,
    #[serde(skip)]
    pub kda: KdaKeys,
    pub hyper: HyperConnections,
    pub swiglu_limit: f64,
}

impl Glm5Next {
    /// Reads the keys from the text config `config` of a model of `layers` decoder layers.
    pub(super) fn parse(config: &Value, layers: usize) -> Result<Self, ConfigError> {
        let reader = Keys(config);
        let kda_layers = match config.get("layer_types") {
            Some(types) => kda_layer_types(
                types,
                layers,
                &["indexed_attention", "full_attention"],
                "\"indexed_attention\" (MLA with the DSA indexer)",
            )?,
            None => (0..layers).map(|layer| layer % 4 != 3).collect(),
        };
        // `linear_attn_config` overrides the flat keys, as transformers' `__post_init__` reads it.
        let linear = config.get("linear_attn_config").filter(|v| v.is_object());
        let linear_usize = |inner: &str, flat: &str, default: usize| -> Result<usize, ConfigError> {
            match linear.and_then(|l| l.get(inner)).and_then(Value::as_u64) {
                Some(value) => Ok(value as usize),
                None => Ok(reader.optional_usize(flat)?.unwrap_or(default)),
            }
        };
        let number_or_null = |key: &str, value: &Value| -> Result<Option<f64>, ConfigError> {
            match value {
                Value::Null => Ok(None),
                value => value.as_f64().map(Some).ok_or_else(|| ConfigError::Unsupported {
                    key: key.into(),
                    value: value.to_string(),
                    hint: "expected a number (the safe forget gate's lower bound, −5 by default) or null".into(),
                }),
            }
        };
        let flat_bound = match config.get("linear_lower_bound") {
            None => Some(-5.0),
            Some(value) => number_or_null("linear_lower_bound", value)?,
        };
        let gate_lower_bound = match linear {
            None => flat_bound,
            Some(linear) => {
                let bound = match linear.get("gate_lower_bound") {
                    None => flat_bound,
                    Some(value) => number_or_null("linear_attn_config.gate_lower_bound", value)?,
                };
                let safe_gate = linear.get("safe_gate").and_then(Value::as_bool).unwrap_or(true);
                bound.or(safe_gate.then_some(-5.0))
            }
        };
        let streams = reader.optional_usize("hc_mult")?.unwrap_or(4);
        if streams == 0 {
            return Err(ConfigError::Unsupported {
                key: "hc_mult".into(),
                value: "0".into(),
                hint: "the residual stream needs at least one mHC stream (GLM-5.3-Flash: 4)".into(),
            });
        }
        Ok(Self {
            kda_layers,
            kda: KdaKeys {
                heads: linear_usize("num_heads", "linear_num_heads", 64)?,
                head_dim: linear_usize("head_dim", "linear_head_dim", 128)?,
                conv_kernel: linear_usize("short_conv_kernel_size", "linear_conv_kernel_dim", 4)?,
                gate_lower_bound,
            },
            hyper: HyperConnections {
                streams,
                eps: reader.f64_or("hc_eps", 1e-6)?,
                sinkhorn_iters: reader.optional_usize("hc_sinkhorn_iters")?.unwrap_or(20).max(1),
            },
            swiglu_limit: reader.f64_or("swiglu_limit", 10.0)?,
        })
    }

    /// The first indexed-attention layer (whose indexer must run: a shared one has no earlier selection).
    pub fn first_attention_layer(&self) -> Option<usize> {
        self.kda_layers.iter().position(|kda| !kda)
    }
}

/// A GLM-5.3-Flash KDA layer's tensors under `attention` (`model.layers.N.self_attn`), as the release stores them.
pub fn kda_specs(kda: &KdaKeys, hidden: usize, attention: &str, specs: &mut Vec<TensorSpec>) {
    use TensorRole::*;
    let (heads, head_dim) = (kda.heads, kda.head_dim);
    let width = heads * head_dim;
    let mut push = |name: String, shape: Vec<usize>, role: TensorRole| specs.push(TensorSpec { name, shape, role });
    for projection in ["q_proj", "k_proj", "v_proj"] {
        push(format!("{attention}.{projection}.weight"), vec![width, hidden], Linear);
    }
    for conv in ["q_conv1d", "k_conv1d", "v_conv1d"] {
        push(format!("{attention}.{conv}.weight"), vec![width, 1, kda.conv_kernel], Float32);
    }
    push(format!("{attention}.f_a_proj.weight"), vec![head_dim, hidden], LinearBf16);
    push(format!("{attention}.f_b_proj.weight"), vec![width, head_dim], LinearBf16);
    push(format!("{attention}.b_proj.weight"), vec![heads, hidden], LinearBf16);
    push(format!("{attention}.g_a_proj.weight"), vec![head_dim, hidden], LinearBf16);
    push(format!("{attention}.g_b_proj.weight"), vec![width, head_dim], LinearBf16);
    push(format!("{attention}.A_log"), vec![heads], Float32);
    push(format!("{attention}.dt_bias"), vec![width], Float32);
    push(format!("{attention}.o_norm.weight"), vec![head_dim], Norm);
    push(format!("{attention}.o_proj.weight"), vec![hidden, width], Linear);
}

/// A layer's mHC tensors under `prefix` (`model.layers.N`): `hc_attn_*` and `hc_ffn_*`.
pub fn hyper_specs(hyper: &HyperConnections, hidden: usize, prefix: &str, specs: &mut Vec<TensorSpec>) {
    let n = hyper.streams;
    for site in ["attn", "ffn"] {
        let name = |part: &str| format!("{prefix}.hc_{site}_{part}");
        specs.push(TensorSpec { name: name("fn"), shape: vec![(2 + n) * n, n * hidden], role: TensorRole::LinearBf16 });
        specs.push(TensorSpec { name: name("base"), shape: vec![(2 + n) * n], role: TensorRole::Float32 });
        specs.push(TensorSpec { name: name("scale"), shape: vec![3], role: TensorRole::Float32 });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_follow_transformers() {
        let glm = Glm5Next::parse(&json!({}), 8).unwrap();
        assert_eq!(glm.kda_layers, [true, true, true, false, true, true, true, false]);
        assert_eq!((glm.kda.heads, glm.kda.head_dim, glm.kda.conv_kernel), (64, 128, 4));
        assert_eq!(glm.kda.gate_lower_bound, Some(-5.0));
        assert_eq!((glm.hyper.streams, glm.hyper.sinkhorn_iters, glm.swiglu_limit), (4, 20, 10.0));
        let unbounded = Glm5Next::parse(&json!({ "linear_lower_bound": null }), 4).unwrap();
        assert_eq!(unbounded.kda.gate_lower_bound, None);
        let nested = Glm5Next::parse(&json!({ "linear_attn_config": { "num_heads": 2, "gate_lower_bound": -3.0 } }), 4);
        assert_eq!(nested.unwrap().kda.gate_lower_bound, Some(-3.0));
    }

    #[test]
    fn layer_types_are_checked() {
        let types = json!({ "layer_types": ["linear_attention", "full_attention", "indexed_attention"] });
        assert_eq!(Glm5Next::parse(&types, 3).unwrap().kda_layers, [true, false, false]);
        let error = Glm5Next::parse(&types, 4).unwrap_err().to_string();
        assert!(error.contains("layer_types") && error.contains("3 entries"), "{error}");
        let error = Glm5Next::parse(&json!({ "layer_types": ["linear_attention", "mamba"] }), 2).unwrap_err();
        assert!(error.to_string().contains("\"mamba\""), "{error}");
        let error = Glm5Next::parse(&json!({ "hc_mult": 0 }), 2).unwrap_err().to_string();
        assert!(error.contains("hc_mult"), "{error}");
    }
}

//! Kimi-Linear (`kimi_linear`, `KimiLinearForCausalLM`) and the text stack of Kimi K3 (`kimi_k3`, whose
//! `text_config` is a `kimi_linear` config with K3's keys): the layout keys squeeze reads and every tensor the
//! checkpoint holds, by the text model's names (`model.layers.N.…`; K3 stores them under `language_model.model.`,
//! which [`crate::io::composite`] maps).
//!
//! From transformers 5.24 `models/kimi_linear/` and vLLM's `model_executor/layers/kda.py` (KDA),
//! `models/kimi_k3/nvidia/{model,kda,mla}.py` (K3) and SGLang `models/kimi_k3.py`:
//! - layers are KDA (`linear_attn_config.kda_layers`) or MLA (`full_attn_layers`), both lists **1-indexed**
//!   (transformers reads `layer_types[layer - 1]`): KDA keeps `q/k/v_proj`, depthwise causal convolutions
//!   `q/k/v_conv1d` `[P, 1, K]`, the forget gate `f_a_proj`/`f_b_proj`, `b_proj`, the output gate (`g_a_proj`/
//!   `g_b_proj`, or K3's full-rank `g_proj` with `use_full_rank_gate`), `A_log` (K3 stores `[head_dim]`, SGLang and
//!   vLLM take the first `num_heads`; Kimi-Linear `[1, 1, num_heads, 1]`), `dt_bias` `[P]`, `o_norm`, `o_proj`;
//!   MLA layers are DeepSeek's (K3 adds the output gate `g_proj`, `mla_use_output_gate`);
//! - the MoE is `block_sparse_moe` (`gate`, `experts.E.w{1,2,3}`, `shared_experts.{gate,up,down}_proj`); K3's latent
//!   MoE runs its experts at `routed_expert_hidden_size` between `routed_expert_down_proj` and
//!   `routed_expert_up_proj` (`routed_expert_norm` with `latent_moe_use_norm`);
//! - K3's attention residuals (`attn_res_block_size`): `self_attention_res_{norm,proj}` and `mlp_res_{norm,proj}` per
//!   layer, `output_attn_res_{norm,proj}` at the top, each projection `[1, hidden]`.
//!
//! A KDA layer keeps a fixed-size state per request instead of a KV cache.

use serde_json::Value;

use super::config_error::ConfigError;
use super::hybrid::kda_layer_types;
use super::tensor_spec::{TensorRole, TensorSpec};

/// The Kimi-Linear / K3 keys beside the common ones.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KimiLinear {
    /// Per decoder layer: `true` for KDA, `false` for MLA.
    pub kda_layers: Vec<bool>,
    pub kda_heads: usize,
    pub kda_head_dim: usize,
    pub conv_kernel: usize,
    /// K3's one full-rank output gate `g_proj` instead of the low-rank `g_a_proj`/`g_b_proj`.
    pub full_rank_gate: bool,
    /// K3's latent MoE: the routed experts' width.
    pub routed_expert_hidden_size: Option<usize>,
    pub latent_norm: bool,
    /// K3's attention residuals (`attn_res_block_size` set).
    pub attention_residuals: bool,
    /// K3's MLA output gate `g_proj`.
    pub mla_output_gate: bool,
    /// Routed experts ship MXFP4 (compressed-tensors `mxfp4-pack-quantized`, K3) rather than BF16 (Kimi-Linear).
    pub experts_mxfp4: bool,
}

impl KimiLinear {
    /// Reads the keys from the text config `config` of a model of `layers` decoder layers; `quantization` is the
    /// checkpoint's `quantization_config`.
    pub fn parse(config: &Value, layers: usize, quantization: Option<&Value>) -> Result<Self, ConfigError> {
        let linear = config.get("linear_attn_config").filter(|v| v.is_object());
        let key = |name: &str| linear.and_then(|l| l.get(name));
        let number = |name: &str| -> Result<usize, ConfigError> {
            key(name)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| ConfigError::Missing(format!("linear_attn_config.{name}")))
        };
        let list = |name: &str| -> Result<Vec<usize>, ConfigError> {
            let Some(values) = key(name).and_then(Value::as_array) else {
                return Err(ConfigError::Missing(format!("linear_attn_config.{name}")));
            };
            values
                .iter()
                .map(|v| {
                    v.as_u64().map(|v| v as usize).ok_or_else(|| ConfigError::Unsupported {
                        key: format!("linear_attn_config.{name}"),
                        value: v.to_string(),
                        hint: "expected layer numbers".into(),
                    })
                })
                .collect()
        };
        // transformers' precedence: `layer_types` when the config gives it, else the 1-indexed lists.
        let kda_layers = match config.get("layer_types") {
            Some(types) => {
                let kinds = kda_layer_types(types, layers, &["full_attention"], "\"full_attention\" (MLA)")?;
                if let (Ok(kda), Ok(full)) = (list("kda_layers"), list("full_attn_layers")) {
                    if layer_kinds(&kda, &full, layers).ok().as_ref() != Some(&kinds) {
                        return Err(ConfigError::Unsupported {
                            key: "layer_types".into(),
                            value: format!("{types}"),
                            hint: format!(
                                "disagrees with linear_attn_config.kda_layers {kda:?} / full_attn_layers {full:?} \
                                 (1-indexed); transformers follows layer_types: make the lists agree with it or \
                                 remove one of them"
                            ),
                        });
                    }
                }
                kinds
            }
            None => layer_kinds(&list("kda_layers")?, &list("full_attn_layers")?, layers)?,
        };
        let format = quantization
            .map(|q| {
                let groups = q.get("config_groups").and_then(Value::as_object);
                let nested = groups.into_iter().flat_map(|g| g.values()).filter_map(|g| g.get("format"));
                q.get("format").into_iter().chain(nested).filter_map(Value::as_str).collect::<Vec<_>>()
            })
            .unwrap_or_default();
        Ok(Self {
            kda_layers,
            kda_heads: number("num_heads")?,
            kda_head_dim: number("head_dim")?,
            conv_kernel: number("short_conv_kernel_size")?,
            full_rank_gate: key("use_full_rank_gate").and_then(Value::as_bool).unwrap_or(false),
            routed_expert_hidden_size: config
                .get("routed_expert_hidden_size")
                .and_then(Value::as_u64)
                .map(|v| v as usize),
            latent_norm: config.get("latent_moe_use_norm").and_then(Value::as_bool).unwrap_or(false),
            attention_residuals: config.get("attn_res_block_size").is_some_and(|v| v.as_u64().is_some_and(|v| v > 0)),
            mla_output_gate: config.get("mla_use_output_gate").and_then(Value::as_bool).unwrap_or(false),
            experts_mxfp4: format.contains(&"mxfp4-pack-quantized"),
        })
    }
}

/// Per layer `true` for KDA, from the 1-indexed lists: together they must name every layer 1…`layers` once.
fn layer_kinds(kda: &[usize], full: &[usize], layers: usize) -> Result<Vec<bool>, ConfigError> {
    let mut kinds: Vec<Option<bool>> = vec![None; layers];
    let unsupported = |value: String, hint: String| ConfigError::Unsupported {
        key: "linear_attn_config.kda_layers / full_attn_layers".into(),
        value,
        hint,
    };
    for (list, is_kda) in [(kda, true), (full, false)] {
        for &number in list {
            let slot = number.checked_sub(1).and_then(|index| kinds.get_mut(index)).ok_or_else(|| {
                unsupported(
                    format!("layer {number}"),
                    format!(
                        "the lists are 1-indexed (transformers reads layer_types[layer - 1]): every entry lies in \
                         1…{layers} (num_hidden_layers); a 0 or {layers} means the lists were written 0-indexed — \
                         add 1 to each entry"
                    ),
                )
            })?;
            if slot.replace(is_kda).is_some() {
                return Err(unsupported(format!("layer {number}"), "is listed twice".into()));
            }
        }
    }
    match kinds.iter().position(Option::is_none) {
        Some(missing) => Err(unsupported(
            format!("layer {}", missing + 1),
            format!("is in neither list; together they must name each of the {layers} layers once"),
        )),
        None => Ok(kinds.into_iter().map(|kind| kind.unwrap_or(false)).collect()),
    }
}

/// The sizes every layer shares, from the common keys.
pub struct Dims {
    pub hidden: usize,
    pub vocab: usize,
    pub heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub experts: usize,
    pub moe_intermediate: usize,
    pub shared_experts: usize,
    pub intermediate: usize,
    pub tie_word_embeddings: bool,
}

/// Every tensor of a Kimi-Linear / K3 text model, by the text model's names; `moe` says which layers are MoE.
pub fn tensor_specs(kimi: &KimiLinear, dims: &Dims, moe: &dyn Fn(usize) -> bool) -> Vec<TensorSpec> {
    use TensorRole::*;
    let mut specs = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, role: TensorRole| specs.push(TensorSpec { name, shape, role });
    let hidden = dims.hidden;
    push("model.embed_tokens.weight".into(), vec![dims.vocab, hidden], Embedding);
    for (layer, &is_kda) in kimi.kda_layers.iter().enumerate() {
        let prefix = format!("model.layers.{layer}");
        push(format!("{prefix}.input_layernorm.weight"), vec![hidden], Norm);
        let attn = format!("{prefix}.self_attn");
        if is_kda {
            let (heads, head_dim) = (kimi.kda_heads, kimi.kda_head_dim);
            let width = heads * head_dim;
            for projection in ["q_proj", "k_proj", "v_proj"] {
                push(format!("{attn}.{projection}.weight"), vec![width, hidden], LinearBf16);
            }
            for conv in ["q_conv1d", "k_conv1d", "v_conv1d"] {
                push(format!("{attn}.{conv}.weight"), vec![width, 1, kimi.conv_kernel], Float32);
            }
            push(format!("{attn}.f_a_proj.weight"), vec![head_dim, hidden], LinearBf16);
            push(format!("{attn}.f_b_proj.weight"), vec![width, head_dim], LinearBf16);
            push(format!("{attn}.b_proj.weight"), vec![heads, hidden], LinearBf16);
            if kimi.full_rank_gate {
                push(format!("{attn}.g_proj.weight"), vec![width, hidden], LinearBf16);
                push(format!("{attn}.A_log"), vec![head_dim], Float32);
            } else {
                push(format!("{attn}.g_a_proj.weight"), vec![head_dim, hidden], LinearBf16);
                push(format!("{attn}.g_b_proj.weight"), vec![width, head_dim], LinearBf16);
                push(format!("{attn}.A_log"), vec![1, 1, heads, 1], Float32);
            }
            push(format!("{attn}.dt_bias"), vec![width], Float32);
            push(format!("{attn}.o_norm.weight"), vec![head_dim], Norm);
            push(format!("{attn}.o_proj.weight"), vec![hidden, width], LinearBf16);
        } else {
            let query = dims.heads * (dims.qk_nope_head_dim + dims.qk_rope_head_dim);
            match dims.q_lora_rank {
                Some(rank) => {
                    push(format!("{attn}.q_a_proj.weight"), vec![rank, hidden], LinearBf16);
                    push(format!("{attn}.q_a_layernorm.weight"), vec![rank], Norm);
                    push(format!("{attn}.q_b_proj.weight"), vec![query, rank], LinearBf16);
                }
                None => push(format!("{attn}.q_proj.weight"), vec![query, hidden], LinearBf16),
            }
            let kv = dims.kv_lora_rank;
            push(format!("{attn}.kv_a_proj_with_mqa.weight"), vec![kv + dims.qk_rope_head_dim, hidden], LinearBf16);
            push(format!("{attn}.kv_a_layernorm.weight"), vec![kv], Norm);
            let kv_b = dims.heads * (dims.qk_nope_head_dim + dims.v_head_dim);
            push(format!("{attn}.kv_b_proj.weight"), vec![kv_b, kv], LinearBf16);
            push(format!("{attn}.o_proj.weight"), vec![hidden, dims.heads * dims.v_head_dim], LinearBf16);
            if kimi.mla_output_gate {
                push(format!("{attn}.g_proj.weight"), vec![dims.heads * dims.v_head_dim, hidden], LinearBf16);
            }
        }
        push(format!("{prefix}.post_attention_layernorm.weight"), vec![hidden], Norm);
        if kimi.attention_residuals {
            for site in ["self_attention_res", "mlp_res"] {
                push(format!("{prefix}.{site}_norm.weight"), vec![hidden], Norm);
                push(format!("{prefix}.{site}_proj.weight"), vec![1, hidden], LinearBf16);
            }
        }
        let gated = |push: &mut dyn FnMut(String, Vec<usize>, TensorRole), at: String, inner: usize, width: usize| {
            push(format!("{at}.gate_proj.weight"), vec![inner, width], LinearBf16);
            push(format!("{at}.up_proj.weight"), vec![inner, width], LinearBf16);
            push(format!("{at}.down_proj.weight"), vec![width, inner], LinearBf16);
        };
        if !moe(layer) {
            gated(&mut push, format!("{prefix}.mlp"), dims.intermediate, hidden);
            continue;
        }
        let block = format!("{prefix}.block_sparse_moe");
        push(format!("{block}.gate.weight"), vec![dims.experts, hidden], LinearBf16);
        push(format!("{block}.gate.e_score_correction_bias"), vec![dims.experts], RouterBias);
        let width = kimi.routed_expert_hidden_size.unwrap_or(hidden);
        if let Some(latent) = kimi.routed_expert_hidden_size {
            push(format!("{block}.routed_expert_down_proj.weight"), vec![latent, hidden], LinearBf16);
            if kimi.latent_norm {
                push(format!("{block}.routed_expert_norm.weight"), vec![latent], Norm);
            }
            push(format!("{block}.routed_expert_up_proj.weight"), vec![hidden, latent], LinearBf16);
        }
        let expert = if kimi.experts_mxfp4 { ExpertMxfp4 } else { LinearBf16 };
        let inner = dims.moe_intermediate;
        for e in 0..dims.experts {
            push(format!("{block}.experts.{e}.w1.weight"), vec![inner, width], expert);
            push(format!("{block}.experts.{e}.w2.weight"), vec![width, inner], expert);
            push(format!("{block}.experts.{e}.w3.weight"), vec![inner, width], expert);
        }
        if dims.shared_experts > 0 {
            gated(&mut push, format!("{block}.shared_experts"), inner * dims.shared_experts, hidden);
        }
    }
    push("model.norm.weight".into(), vec![hidden], Norm);
    if kimi.attention_residuals {
        push("model.output_attn_res_norm.weight".into(), vec![hidden], Norm);
        push("model.output_attn_res_proj.weight".into(), vec![1, hidden], LinearBf16);
    }
    if !dims.tie_word_embeddings {
        push("lm_head.weight".into(), vec![dims.vocab, hidden], Embedding);
    }
    specs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_lists_are_one_indexed_and_cover_every_layer_once() {
        assert_eq!(layer_kinds(&[1, 2, 4], &[3], 4).unwrap(), [true, true, false, true]);
        let message = |kda: &[usize], full: &[usize]| layer_kinds(kda, full, 4).unwrap_err().to_string();
        assert!(message(&[0, 1, 3], &[2]).contains("1-indexed"), "{}", message(&[0, 1, 3], &[2]));
        assert!(message(&[1, 2, 3], &[5]).contains("1-indexed"));
        assert!(message(&[1, 2], &[2, 3, 4]).contains("twice"));
        assert!(message(&[1, 2], &[4]).contains("layer 3"));
    }

    #[test]
    fn layer_types_take_precedence_and_must_agree_with_the_lists() {
        let config = |extra: Value| {
            let mut config = serde_json::json!({ "linear_attn_config": {
                "num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 4 } });
            for (key, value) in extra.as_object().unwrap() {
                if key.starts_with("kda") || key.starts_with("full") {
                    config["linear_attn_config"][key] = value.clone();
                } else {
                    config[key] = value.clone();
                }
            }
            KimiLinear::parse(&config, 3, None)
        };
        let types = serde_json::json!(["linear_attention", "full_attention", "linear_attention"]);
        let parsed = config(serde_json::json!({ "layer_types": types })).unwrap();
        assert_eq!(parsed.kda_layers, [true, false, true]);
        let agreeing =
            config(serde_json::json!({ "layer_types": types, "kda_layers": [1, 3], "full_attn_layers": [2] }));
        assert_eq!(agreeing.unwrap().kda_layers, [true, false, true]);
        let error = config(serde_json::json!({ "layer_types": types, "kda_layers": [1, 2], "full_attn_layers": [3] }))
            .unwrap_err()
            .to_string();
        assert!(error.contains("layer_types") && error.contains("disagrees"), "{error}");
        let error = config(serde_json::json!({ "layer_types": ["linear_attention"] })).unwrap_err().to_string();
        assert!(error.contains("1 entries") && error.contains("num_hidden_layers is 3"), "{error}");
        let error = config(serde_json::json!({ "layer_types": ["linear_attention", "mamba", "full_attention"] }))
            .unwrap_err()
            .to_string();
        assert!(error.contains("mamba"), "{error}");
    }
}

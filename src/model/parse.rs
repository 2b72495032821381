//! `config.json` parsed into a [`ModelConfig`]: the runtime's architectures (`deepseek_v3`/`kimi_k2`,
//! `glm_moe_dsa`, `glm4_moe`) and the FP4-native generation's (DeepSeek-V4; Kimi-Linear and Kimi K3's text model),
//! whose own keys go into a [`Layout`] read by [`super::deepseek_v4`] and [`super::kimi_linear`].

use serde_json::Value;

use super::config::{
    Architecture, Attention, ContextWindow, Indexer, Kpool, Layout, ModelConfig, Routing, DEFAULT_MAX_POSITIONS,
};
use super::config_error::ConfigError;
use super::keys::{pair_of, Keys};

impl ModelConfig {
    /// Parses a `config.json` value: a causal LM's, or the text model's inside a vision-language wrapper
    /// (`text_config`, [`crate::io::composite`]), whose missing keys are then named `text_config.KEY`.
    pub fn from_json(config: &Value) -> Result<Self, ConfigError> {
        if crate::io::composite::wrapper(config).is_none() {
            return Self::from_text_json(config, config, "");
        }
        let text = crate::io::composite::text_config(config);
        Self::from_text_json(text, config, "text_config.").map_err(|error| match error {
            ConfigError::Missing(key) => ConfigError::Missing(format!("text_config.{key}")),
            ConfigError::Unsupported { key, value, hint } => {
                ConfigError::Unsupported { key: format!("text_config.{key}"), value, hint }
            }
        })
    }

    /// Parses the text model's keys from `config`; `quantization_config` may sit in `whole` (the wrapper), and
    /// `prefix` is how messages reach `config` from the top (`text_config.` inside a wrapper).
    fn from_text_json(config: &Value, whole: &Value, prefix: &str) -> Result<Self, ConfigError> {
        let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or_default().to_string();
        let architecture_names: Vec<&str> = config
            .get("architectures")
            .and_then(Value::as_array)
            .map(|list| list.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let architecture = match model_type.as_str() {
            "deepseek_v3" | "kimi_k2" => Architecture::DeepseekV3,
            "glm_moe_dsa" => Architecture::GlmMoeDsa,
            "glm4_moe" => Architecture::Glm4Moe,
            "deepseek_v4" => Architecture::DeepseekV4,
            "kimi_linear" => Architecture::KimiLinear,
            "glm5_next" | "glm5_next_text" => Architecture::Glm5Next,
            _ if architecture_names.contains(&"Glm5NextForConditionalGeneration") => Architecture::Glm5Next,
            _ if architecture_names.contains(&"KimiLinearForCausalLM") => Architecture::KimiLinear,
            _ if architecture_names.contains(&"DeepseekV4ForCausalLM") => Architecture::DeepseekV4,
            _ if architecture_names.contains(&"DeepseekV3ForCausalLM") => Architecture::DeepseekV3,
            _ if architecture_names.contains(&"GlmMoeDsaForCausalLM") => Architecture::GlmMoeDsa,
            _ if architecture_names.contains(&"Glm4MoeForCausalLM") => Architecture::Glm4Moe,
            _ => {
                return Err(ConfigError::Unsupported {
                    key: "model_type".into(),
                    value: format!("{model_type:?} (architectures {architecture_names:?})"),
                    hint: "squeeze supports deepseek_v3/kimi_k2, glm_moe_dsa, glm4_moe, deepseek_v4, kimi_linear (Kimi K3's text model) and glm5_next (GLM-5.3-Flash)".into(),
                })
            }
        };
        let reader = Keys(config);
        if architecture == Architecture::DeepseekV4 {
            return Self::deepseek_v4_config(config, whole, prefix, model_type);
        }
        if architecture == Architecture::KimiLinear {
            return Self::kimi_linear(config, whole, prefix, model_type);
        }
        let hidden_size = reader.usize("hidden_size")?;
        let num_attention_heads = reader.usize("num_attention_heads")?;
        let num_hidden_layers = reader.usize("num_hidden_layers")?;
        let glm5_next = match architecture {
            Architecture::Glm5Next => Some(super::glm5_next::Glm5Next::parse(config, num_hidden_layers)?),
            _ => None,
        };
        let attention = match architecture {
            Architecture::DeepseekV3 | Architecture::GlmMoeDsa => Attention::Mla {
                q_lora_rank: reader.optional_usize("q_lora_rank")?,
                kv_lora_rank: reader.usize("kv_lora_rank")?,
                qk_nope_head_dim: reader.usize("qk_nope_head_dim")?,
                qk_rope_head_dim: reader.usize("qk_rope_head_dim")?,
                v_head_dim: reader.usize("v_head_dim")?,
            },
            // transformers' `Glm5NextTextConfig.validate_architecture`: query LoRA required, NoPE.
            Architecture::Glm5Next => Attention::Mla {
                q_lora_rank: Some(reader.usize("q_lora_rank")?),
                kv_lora_rank: reader.usize("kv_lora_rank")?,
                qk_nope_head_dim: reader.usize("qk_nope_head_dim")?,
                qk_rope_head_dim: match reader.optional_usize("qk_rope_head_dim")?.unwrap_or(0) {
                    0 => 0,
                    other => {
                        return Err(ConfigError::Unsupported {
                            key: "qk_rope_head_dim".into(),
                            value: other.to_string(),
                            hint: "GLM-5.3-Flash's attention is NoPE: transformers requires 0".into(),
                        })
                    }
                },
                v_head_dim: reader.usize("v_head_dim")?,
            },
            Architecture::Glm4Moe | Architecture::DeepseekV4 | Architecture::KimiLinear => Attention::Gqa {
                num_key_value_heads: reader.usize("num_key_value_heads")?,
                head_dim: reader.optional_usize("head_dim")?.unwrap_or(hidden_size / num_attention_heads.max(1)),
                attention_bias: reader.bool_or("attention_bias", false),
                use_qk_norm: reader.bool_or("use_qk_norm", false),
                partial_rotary_factor: reader.partial_rotary_factor().unwrap_or(0.5),
            },
        };
        let indexer = match architecture {
            Architecture::GlmMoeDsa => Some(Indexer {
                index_n_heads: reader.usize("index_n_heads")?,
                index_head_dim: reader.usize("index_head_dim")?,
                index_topk: reader.usize("index_topk")?,
                full_layers: reader.indexer_full_layers(num_hidden_layers, 0)?,
                kpool: None,
            }),
            Architecture::Glm5Next => {
                let first = glm5_next.as_ref().and_then(|glm| glm.first_attention_layer()).unwrap_or(0);
                let kpool = Kpool {
                    size: reader.optional_usize("index_kpool")?.unwrap_or(16),
                    select_tail: reader.bool_or("index_kpool_always_select_tail", true),
                };
                let index_topk = reader.optional_usize("index_topk")?.unwrap_or(2048);
                if kpool.size == 0 || index_topk % kpool.size != 0 {
                    return Err(ConfigError::Unsupported {
                        key: "index_kpool".into(),
                        value: kpool.size.to_string(),
                        hint: format!(
                            "index_topk ({index_topk}) must be a positive multiple of it, as transformers requires"
                        ),
                    });
                }
                Some(Indexer {
                    index_n_heads: reader.optional_usize("index_n_heads")?.unwrap_or(32),
                    index_head_dim: reader.optional_usize("index_head_dim")?.unwrap_or(128),
                    index_topk,
                    full_layers: reader.indexer_full_layers(num_hidden_layers, first)?,
                    kpool: Some(kpool),
                })
            }
            _ => None,
        };
        let rope = reader.rope(architecture)?;
        let declared_positions = reader.optional_usize("max_position_embeddings")?;
        let window = ContextWindow::of(declared_positions, &rope.scaling, prefix);
        let routing = Routing {
            n_group: reader.optional_usize("n_group")?.unwrap_or(1).max(1),
            topk_group: reader.optional_usize("topk_group")?.unwrap_or(1).max(1),
            norm_topk_prob: reader.bool_or("norm_topk_prob", true),
            routed_scaling_factor: reader
                .f64_or("routed_scaling_factor", if architecture == Architecture::Glm4Moe { 1.0 } else { 2.5 })?,
            scoring_func: config.get("scoring_func").and_then(Value::as_str).unwrap_or("sigmoid").to_string(),
        };
        let (first_k_dense_replace, moe_layers) = if architecture == Architecture::Glm5Next {
            // transformers' default: the first three layers dense.
            let moe_layers = match config.get("mlp_layer_types") {
                Some(kinds) => mlp_layer_types(kinds, num_hidden_layers)?,
                None => (0..num_hidden_layers).map(|layer| layer >= 3).collect(),
            };
            (moe_layers.iter().position(|&moe| moe).unwrap_or(num_hidden_layers), moe_layers)
        } else {
            let first_k_dense_replace = reader.optional_usize("first_k_dense_replace")?.unwrap_or(0);
            let moe_layers = match config.get("mlp_layer_types").and_then(Value::as_array) {
                Some(kinds) => kinds.iter().map(|kind| kind.as_str() == Some("sparse")).collect(),
                None => (0..num_hidden_layers).map(|layer| layer >= first_k_dense_replace).collect(),
            };
            (first_k_dense_replace, moe_layers)
        };
        let default_eps = if architecture == Architecture::DeepseekV3 { 1e-6 } else { 1e-5 };
        let weight_block_size = pair_of(crate::io::composite::quantization_config(whole), "weight_block_size");
        Ok(Self {
            architecture,
            model_type,
            hidden_size,
            num_hidden_layers,
            vocab_size: reader.usize("vocab_size")?,
            num_attention_heads,
            intermediate_size: reader.usize("intermediate_size")?,
            moe_intermediate_size: reader.usize("moe_intermediate_size")?,
            n_routed_experts: reader.usize("n_routed_experts")?,
            n_shared_experts: reader.optional_usize("n_shared_experts")?.unwrap_or(0),
            num_experts_per_tok: reader.usize("num_experts_per_tok")?,
            first_k_dense_replace,
            num_nextn_predict_layers: reader.optional_usize("num_nextn_predict_layers")?.unwrap_or(0),
            tie_word_embeddings: reader.bool_or("tie_word_embeddings", false),
            attention,
            indexer,
            weight_block_size,
            rope,
            rms_norm_eps: reader.f64_or("rms_norm_eps", default_eps)?,
            max_position_embeddings: declared_positions.unwrap_or(DEFAULT_MAX_POSITIONS),
            window,
            routing,
            moe_layers,
            layout: glm5_next.map(Layout::Glm5Next),
        })
    }

    /// A Kimi-Linear / Kimi K3 text config: the common keys under their Kimi names (`num_experts`,
    /// `num_experts_per_token`, `num_shared_experts`, with the DeepSeek names accepted), MLA for the full-attention
    /// layers, the KDA and K3 keys in [`Layout::KimiLinear`].
    pub(super) fn kimi_linear(
        config: &Value,
        whole: &Value,
        prefix: &str,
        model_type: String,
    ) -> Result<Self, ConfigError> {
        let reader = Keys(config);
        let either = |kimi: &str, deepseek: &str| -> Result<Option<usize>, ConfigError> {
            Ok(reader.optional_usize(kimi)?.or(reader.optional_usize(deepseek)?))
        };
        let num_hidden_layers = reader.usize("num_hidden_layers")?;
        let kimi = super::kimi_linear::KimiLinear::parse(
            config,
            num_hidden_layers,
            crate::io::composite::quantization_config(whole),
        )?;
        let rope = reader.rope(Architecture::KimiLinear)?;
        let declared_positions = reader.optional_usize("max_position_embeddings")?;
        // transformers' default (`KimiLinearConfig`): the first layer dense.
        let first_k_dense_replace = reader.optional_usize("first_k_dense_replace")?.unwrap_or(1);
        let frequency = reader.optional_usize("moe_layer_freq")?.unwrap_or(1).max(1);
        let moe_layers = match config.get("mlp_layer_types") {
            Some(kinds) => mlp_layer_types(kinds, num_hidden_layers)?,
            None => {
                (0..num_hidden_layers).map(|layer| layer >= first_k_dense_replace && layer % frequency == 0).collect()
            }
        };
        let n_routed_experts =
            either("num_experts", "n_routed_experts")?.ok_or_else(|| ConfigError::Missing("num_experts".into()))?;
        let num_experts_per_tok = either("num_experts_per_token", "num_experts_per_tok")?
            .ok_or_else(|| ConfigError::Missing("num_experts_per_token".into()))?;
        Ok(Self {
            architecture: Architecture::KimiLinear,
            model_type,
            hidden_size: reader.usize("hidden_size")?,
            num_hidden_layers,
            vocab_size: reader.usize("vocab_size")?,
            num_attention_heads: reader.usize("num_attention_heads")?,
            intermediate_size: reader.usize("intermediate_size")?,
            moe_intermediate_size: reader.usize("moe_intermediate_size")?,
            n_routed_experts,
            n_shared_experts: either("num_shared_experts", "n_shared_experts")?.unwrap_or(0),
            num_experts_per_tok,
            first_k_dense_replace,
            num_nextn_predict_layers: reader.optional_usize("num_nextn_predict_layers")?.unwrap_or(0),
            tie_word_embeddings: reader.bool_or("tie_word_embeddings", false),
            attention: Attention::Mla {
                q_lora_rank: reader.optional_usize("q_lora_rank")?,
                kv_lora_rank: reader.usize("kv_lora_rank")?,
                qk_nope_head_dim: reader.usize("qk_nope_head_dim")?,
                qk_rope_head_dim: reader.optional_usize("qk_rope_head_dim")?.unwrap_or(0),
                v_head_dim: reader.usize("v_head_dim")?,
            },
            indexer: None,
            weight_block_size: None,
            window: ContextWindow::of(declared_positions, &rope.scaling, prefix),
            rope,
            rms_norm_eps: reader.f64_or("rms_norm_eps", 1e-5)?,
            max_position_embeddings: declared_positions.unwrap_or(DEFAULT_MAX_POSITIONS),
            routing: Routing {
                n_group: reader.optional_usize("num_expert_group")?.unwrap_or(1).max(1),
                topk_group: reader.optional_usize("topk_group")?.unwrap_or(1).max(1),
                norm_topk_prob: reader.bool_or("moe_renormalize", true),
                routed_scaling_factor: reader.f64_or("routed_scaling_factor", 1.0)?,
                scoring_func: config
                    .get("moe_router_activation_func")
                    .and_then(Value::as_str)
                    .unwrap_or("sigmoid")
                    .to_string(),
            },
            moe_layers,
            layout: Some(Layout::KimiLinear(kimi)),
        })
    }

    /// A DeepSeek-V4 config: the common keys (experts, sizes) read as its config names them, its attention
    /// described as MLA with one `head_dim`-wide KV entry per token (what its caches store), and its own keys in
    /// [`Layout::DeepseekV4`].
    pub(super) fn deepseek_v4_config(
        config: &Value,
        whole: &Value,
        prefix: &str,
        model_type: String,
    ) -> Result<Self, ConfigError> {
        let reader = Keys(config);
        let num_hidden_layers = reader.usize("num_hidden_layers")?;
        let num_nextn_predict_layers = reader.optional_usize("num_nextn_predict_layers")?.unwrap_or(0);
        let get = |key: &str| reader.optional_usize(key);
        let float = |key: &str, default: f64| reader.f64_or(key, default);
        let v4 = super::deepseek_v4::DeepseekV4::parse(
            config,
            num_hidden_layers,
            num_hidden_layers + num_nextn_predict_layers,
            &get,
            &float,
        )?;
        let rope = reader.rope(Architecture::DeepseekV4)?;
        let declared_positions = reader.optional_usize("max_position_embeddings")?;
        let moe_intermediate_size = reader.usize("moe_intermediate_size")?;
        let rope_dims = v4.qk_rope_head_dim.min(v4.head_dim);
        Ok(Self {
            architecture: Architecture::DeepseekV4,
            model_type,
            hidden_size: reader.usize("hidden_size")?,
            num_hidden_layers,
            vocab_size: reader.usize("vocab_size")?,
            num_attention_heads: reader.usize("num_attention_heads")?,
            intermediate_size: moe_intermediate_size,
            moe_intermediate_size,
            n_routed_experts: reader.usize("n_routed_experts")?,
            n_shared_experts: reader.optional_usize("n_shared_experts")?.unwrap_or(1),
            num_experts_per_tok: reader.usize("num_experts_per_tok")?,
            first_k_dense_replace: 0,
            num_nextn_predict_layers,
            tie_word_embeddings: reader.bool_or("tie_word_embeddings", false),
            attention: Attention::Mla {
                q_lora_rank: Some(v4.q_lora_rank),
                kv_lora_rank: v4.head_dim - rope_dims,
                qk_nope_head_dim: v4.head_dim - rope_dims,
                qk_rope_head_dim: rope_dims,
                v_head_dim: v4.head_dim,
            },
            indexer: None,
            weight_block_size: pair_of(crate::io::composite::quantization_config(whole), "weight_block_size"),
            window: ContextWindow::of(declared_positions, &rope.scaling, prefix),
            rope,
            rms_norm_eps: reader.f64_or("rms_norm_eps", 1e-6)?,
            max_position_embeddings: declared_positions.unwrap_or(DEFAULT_MAX_POSITIONS),
            routing: Routing {
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: reader.bool_or("norm_topk_prob", true),
                routed_scaling_factor: reader.f64_or("routed_scaling_factor", 1.5)?,
                scoring_func: config.get("scoring_func").and_then(Value::as_str).unwrap_or("sqrtsoftplus").to_string(),
            },
            moe_layers: vec![true; num_hidden_layers],
            layout: Some(Layout::DeepseekV4(v4)),
        })
    }
}

/// `mlp_layer_types`: one `"dense"` or `"sparse"` per decoder layer.
fn mlp_layer_types(kinds: &Value, layers: usize) -> Result<Vec<bool>, ConfigError> {
    let unsupported = |value: String, hint: &str| ConfigError::Unsupported {
        key: "mlp_layer_types".into(),
        value,
        hint: hint.into(),
    };
    let Some(kinds) = kinds.as_array() else {
        return Err(unsupported(kinds.to_string(), "expected a list of \"dense\" / \"sparse\", one per layer"));
    };
    if kinds.len() != layers {
        return Err(unsupported(
            format!("{} entries", kinds.len()),
            &format!("expected one per decoder layer: num_hidden_layers is {layers}"),
        ));
    }
    kinds
        .iter()
        .map(|kind| match kind.as_str() {
            Some("sparse") => Ok(true),
            Some("dense") => Ok(false),
            _ => Err(unsupported(kind.to_string(), "each entry is \"dense\" (an MLP) or \"sparse\" (MoE)")),
        })
        .collect()
}

//! `config.json` for `deepseek_v3`/`kimi_k2`, `glm_moe_dsa` and `glm4_moe`: the keys squeeze needs, with errors
//! naming a missing or unsupported key.

use serde_json::Value;

/// The architectures squeeze knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// `DeepseekV3ForCausalLM`: Kimi K2 (`kimi_k2`) and DeepSeek-V3 (`deepseek_v3`).
    DeepseekV3,
    /// `GlmMoeDsaForCausalLM`: GLM-5 (MLA + DSA indexer).
    GlmMoeDsa,
    /// `Glm4MoeForCausalLM`: GLM-4.5/4.6/4.7 (GQA).
    Glm4Moe,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::DeepseekV3 => "DeepseekV3ForCausalLM",
            Architecture::GlmMoeDsa => "GlmMoeDsaForCausalLM",
            Architecture::Glm4Moe => "Glm4MoeForCausalLM",
        }
    }

    /// The built-in recipe for this architecture.
    pub fn default_recipe(self) -> &'static str {
        match self {
            Architecture::DeepseekV3 => "kimi-k2-int4",
            Architecture::GlmMoeDsa => "glm5-int4",
            Architecture::Glm4Moe => "glm45-int4",
        }
    }
}

/// Attention layout.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Attention {
    /// Multi-head latent attention (DeepSeek-V3 / Kimi K2 / GLM-5).
    Mla { q_lora_rank: Option<usize>, kv_lora_rank: usize, qk_nope_head_dim: usize, qk_rope_head_dim: usize, v_head_dim: usize },
    /// Grouped-query attention (GLM-4.5).
    Gqa { num_key_value_heads: usize, head_dim: usize, attention_bias: bool, use_qk_norm: bool, partial_rotary_factor: f64 },
}

/// The DSA lightning indexer of GLM-5.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Indexer {
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub model_type: String,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub vocab_size: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub first_k_dense_replace: usize,
    pub num_nextn_predict_layers: usize,
    pub tie_word_embeddings: bool,
    pub attention: Attention,
    pub indexer: Option<Indexer>,
    /// FP8 block size from `quantization_config.weight_block_size`, if the source declares one.
    pub weight_block_size: Option<[usize; 2]>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config.json: missing key `{0}` (needed for this architecture); add it or use a complete config")]
    Missing(String),
    #[error("config.json: key `{key}` has an unsupported value {value}: {hint}")]
    Unsupported { key: String, value: String, hint: String },
}

impl ModelConfig {
    /// Parses a `config.json` value.
    pub fn from_json(config: &Value) -> Result<Self, ConfigError> {
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
            _ if architecture_names.contains(&"DeepseekV3ForCausalLM") => Architecture::DeepseekV3,
            _ if architecture_names.contains(&"GlmMoeDsaForCausalLM") => Architecture::GlmMoeDsa,
            _ if architecture_names.contains(&"Glm4MoeForCausalLM") => Architecture::Glm4Moe,
            _ => {
                return Err(ConfigError::Unsupported {
                    key: "model_type".into(),
                    value: format!("{model_type:?} (architectures {architecture_names:?})"),
                    hint: "squeeze supports deepseek_v3/kimi_k2, glm_moe_dsa and glm4_moe".into(),
                })
            }
        };
        let reader = Keys(config);
        let hidden_size = reader.usize("hidden_size")?;
        let num_attention_heads = reader.usize("num_attention_heads")?;
        let attention = match architecture {
            Architecture::DeepseekV3 | Architecture::GlmMoeDsa => Attention::Mla {
                q_lora_rank: reader.optional_usize("q_lora_rank")?,
                kv_lora_rank: reader.usize("kv_lora_rank")?,
                qk_nope_head_dim: reader.usize("qk_nope_head_dim")?,
                qk_rope_head_dim: reader.usize("qk_rope_head_dim")?,
                v_head_dim: reader.usize("v_head_dim")?,
            },
            Architecture::Glm4Moe => Attention::Gqa {
                num_key_value_heads: reader.usize("num_key_value_heads")?,
                head_dim: reader.optional_usize("head_dim")?.unwrap_or(hidden_size / num_attention_heads.max(1)),
                attention_bias: reader.bool_or("attention_bias", false),
                use_qk_norm: reader.bool_or("use_qk_norm", false),
                partial_rotary_factor: reader.partial_rotary_factor(),
            },
        };
        let indexer = match architecture {
            Architecture::GlmMoeDsa => Some(Indexer {
                index_n_heads: reader.usize("index_n_heads")?,
                index_head_dim: reader.usize("index_head_dim")?,
                index_topk: reader.usize("index_topk")?,
            }),
            _ => None,
        };
        let weight_block_size = config
            .get("quantization_config")
            .and_then(|q| q.get("weight_block_size"))
            .and_then(Value::as_array)
            .and_then(|list| match list.as_slice() {
                [rows, columns] => Some([rows.as_u64()? as usize, columns.as_u64()? as usize]),
                _ => None,
            });
        Ok(Self {
            architecture,
            model_type,
            hidden_size,
            num_hidden_layers: reader.usize("num_hidden_layers")?,
            vocab_size: reader.usize("vocab_size")?,
            num_attention_heads,
            intermediate_size: reader.usize("intermediate_size")?,
            moe_intermediate_size: reader.usize("moe_intermediate_size")?,
            n_routed_experts: reader.usize("n_routed_experts")?,
            n_shared_experts: reader.optional_usize("n_shared_experts")?.unwrap_or(0),
            num_experts_per_tok: reader.usize("num_experts_per_tok")?,
            first_k_dense_replace: reader.optional_usize("first_k_dense_replace")?.unwrap_or(0),
            num_nextn_predict_layers: reader.optional_usize("num_nextn_predict_layers")?.unwrap_or(0),
            tie_word_embeddings: reader.bool_or("tie_word_embeddings", false),
            attention,
            indexer,
            weight_block_size,
        })
    }

    /// Decoder layers stored in the checkpoint, MTP layers included.
    pub fn stored_layers(&self) -> usize {
        self.num_hidden_layers + self.num_nextn_predict_layers
    }

    /// Whether layer `layer` is a MoE layer (the first `first_k_dense_replace` layers are dense).
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        layer >= self.first_k_dense_replace
    }
}

struct Keys<'a>(&'a Value);

impl Keys<'_> {
    fn optional_usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value.as_u64().map(|v| Some(v as usize)).ok_or_else(|| ConfigError::Unsupported {
                key: key.into(),
                value: value.to_string(),
                hint: "expected a non-negative integer".into(),
            }),
        }
    }

    fn usize(&self, key: &str) -> Result<usize, ConfigError> {
        self.optional_usize(key)?.ok_or_else(|| ConfigError::Missing(key.into()))
    }

    fn bool_or(&self, key: &str, default: bool) -> bool {
        self.0.get(key).and_then(Value::as_bool).unwrap_or(default)
    }

    /// `partial_rotary_factor` at top level or inside `rope_parameters` (transformers v5 style).
    fn partial_rotary_factor(&self) -> f64 {
        self.0
            .get("partial_rotary_factor")
            .or_else(|| self.0.get("rope_parameters").and_then(|r| r.get("partial_rotary_factor")))
            .and_then(Value::as_f64)
            .unwrap_or(1.0)
    }
}

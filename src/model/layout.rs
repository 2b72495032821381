//! The FP4-native generation's configs (DeepSeek-V4, Kimi-Linear / Kimi K3): the common `ModelConfig` keys read
//! under these releases' own names, and the [`Layout`] that lists their tensors through their own modules
//! ([`super::deepseek_v4`], [`super::kimi_linear`]).

use serde_json::Value;

use super::config::{
    pair_of, Architecture, Attention, ConfigError, ContextWindow, Keys, ModelConfig, Routing, DEFAULT_MAX_POSITIONS,
};

/// What an architecture of the FP4-native generation stores beyond the common keys: its tensors are listed by
/// its own module.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Layout {
    DeepseekV4(super::deepseek_v4::DeepseekV4),
    KimiLinear(super::kimi_linear::KimiLinear),
}

impl Layout {
    pub fn tensor_specs(&self, config: &ModelConfig) -> Vec<super::tensors::TensorSpec> {
        match self {
            Layout::DeepseekV4(v4) => {
                let dims = super::deepseek_v4::Dims {
                    hidden: config.hidden_size,
                    heads: config.num_attention_heads,
                    vocab: config.vocab_size,
                    experts: config.n_routed_experts,
                    top_k: config.num_experts_per_tok,
                    moe_intermediate: config.moe_intermediate_size,
                    shared_experts: config.n_shared_experts,
                    num_hidden_layers: config.num_hidden_layers,
                    stored_layers: config.stored_layers(),
                };
                super::deepseek_v4::tensor_specs(v4, &dims)
            }
            Layout::KimiLinear(kimi) => {
                let Attention::Mla { q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } =
                    config.attention
                else {
                    unreachable!("a Kimi-Linear config is parsed with MLA")
                };
                let dims = super::kimi_linear::Dims {
                    hidden: config.hidden_size,
                    vocab: config.vocab_size,
                    heads: config.num_attention_heads,
                    q_lora_rank,
                    kv_lora_rank,
                    qk_nope_head_dim,
                    qk_rope_head_dim,
                    v_head_dim,
                    experts: config.n_routed_experts,
                    moe_intermediate: config.moe_intermediate_size,
                    shared_experts: config.n_shared_experts,
                    intermediate: config.intermediate_size,
                    tie_word_embeddings: config.tie_word_embeddings,
                };
                super::kimi_linear::tensor_specs(kimi, &dims, &|layer| config.runs_moe(layer))
            }
        }
    }
}

impl ModelConfig {
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
        let first_k_dense_replace = reader.optional_usize("first_k_dense_replace")?.unwrap_or(0);
        let frequency = reader.optional_usize("moe_layer_freq")?.unwrap_or(1).max(1);
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
            moe_layers: (0..num_hidden_layers)
                .map(|layer| layer >= first_k_dense_replace && layer % frequency == 0)
                .collect(),
            layout: Some(Layout::KimiLinear(kimi)),
        })
    }

    /// A DeepSeek-V4 config: the common keys (experts, sizes) read as its config names them, its attention
    /// described as MLA with one `head_dim`-wide KV entry per token (what its caches store), and its own keys in
    /// [`Layout::DeepseekV4`].
    pub(super) fn deepseek_v4(
        config: &Value,
        whole: &Value,
        prefix: &str,
        model_type: String,
    ) -> Result<Self, ConfigError> {
        let reader = Keys(config);
        let num_hidden_layers = reader.usize("num_hidden_layers")?;
        let num_nextn_predict_layers = reader.optional_usize("num_nextn_predict_layers")?.unwrap_or(0);
        let get = |key: &str| reader.optional_usize(key);
        let v4 = super::deepseek_v4::DeepseekV4::parse(
            config,
            num_hidden_layers,
            num_hidden_layers + num_nextn_predict_layers,
            &get,
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

//! Tensor classes for plans and reports: routed experts, shared experts, attention, indexer, dense MLP,
//! embeddings/lm_head, norms/router, MTP, a wrapper's vision tower.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorClass {
    RoutedExperts,
    SharedExperts,
    Attention,
    Indexer,
    DenseMlp,
    Embeddings,
    NormsRouter,
    Mtp,
    /// A vision-language wrapper's vision tower and projector (carried, never quantized or run).
    Vision,
    Other,
}

impl TensorClass {
    pub const ALL: [TensorClass; 10] = [
        TensorClass::RoutedExperts,
        TensorClass::SharedExperts,
        TensorClass::Attention,
        TensorClass::Indexer,
        TensorClass::DenseMlp,
        TensorClass::Embeddings,
        TensorClass::NormsRouter,
        TensorClass::Mtp,
        TensorClass::Vision,
        TensorClass::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TensorClass::RoutedExperts => "routed_experts",
            TensorClass::SharedExperts => "shared_experts",
            TensorClass::Attention => "attention",
            TensorClass::Indexer => "indexer",
            TensorClass::DenseMlp => "dense_mlp",
            TensorClass::Embeddings => "embeddings",
            TensorClass::NormsRouter => "norms_router",
            TensorClass::Mtp => "mtp",
            TensorClass::Vision => "vision",
            TensorClass::Other => "other",
        }
    }

    /// Classifies a tensor (or module) name; layers at or past `num_hidden_layers` are MTP layers.
    pub fn of(name: &str, num_hidden_layers: Option<usize>) -> TensorClass {
        if crate::io::composite::is_carried(name) {
            return TensorClass::Vision;
        }
        let text_name = crate::io::composite::text_name(name);
        let name = text_name.as_deref().unwrap_or(name);
        if let (Some(limit), Some(layer)) = (num_hidden_layers, layer_index(name)) {
            if layer >= limit {
                return TensorClass::Mtp;
            }
        }
        // DeepSeek-V4's own names: draft layers `mtp.N.`, `attn.`, `ffn.`, `embed`/`head`, mHC `hc_*`; Kimi's MoE
        // `block_sparse_moe.`.
        if name.starts_with("mtp.") {
            return TensorClass::Mtp;
        }
        let moe = |part: &str| {
            [".mlp.", ".ffn.", ".block_sparse_moe."].iter().any(|at| name.contains(&format!("{at}{part}")))
        };
        if moe("experts.") {
            TensorClass::RoutedExperts
        } else if name.contains(".shared_experts.") {
            TensorClass::SharedExperts
        } else if name.contains(".indexer.") {
            TensorClass::Indexer
        } else if name.contains("norm.")
            || name.contains("norm_")
            || name.ends_with("norm")
            || moe("gate.")
            || name.contains("hc_")
            || name.contains("_res_proj")
        {
            TensorClass::NormsRouter
        } else if name.contains(".self_attn.") || name.contains(".attn.") {
            TensorClass::Attention
        } else if name.contains(".mlp.") || name.contains(".ffn.") || name.contains(".block_sparse_moe.") {
            TensorClass::DenseMlp
        } else if name.contains("embed_tokens")
            || name.starts_with("lm_head")
            || name == "embed.weight"
            || name == "head.weight"
        {
            TensorClass::Embeddings
        } else {
            TensorClass::Other
        }
    }
}

impl fmt::Display for TensorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The decoder layer index in a `model.layers.N.…` name.
pub fn layer_index(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("model.layers.")?;
    rest.split('.').next()?.parse().ok()
}

/// `…mlp.experts.E.{gate,up,down}_proj`, or the vendors' `…ffn.experts.E.w{1,2,3}` (DeepSeek-V4) and
/// `…block_sparse_moe.experts.E.w{1,2,3}` (Kimi-Linear, K3).
pub fn is_routed_expert(module: &str) -> bool {
    let Some((prefix, projection)) = module.rsplit_once('.') else { return false };
    let Some((experts, expert)) = prefix.rsplit_once('.') else { return false };
    [".mlp.experts", ".ffn.experts", ".block_sparse_moe.experts"].iter().any(|at| experts.ends_with(at))
        && expert.parse::<usize>().is_ok()
        && matches!(projection, "gate_proj" | "up_proj" | "down_proj" | "w1" | "w2" | "w3")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_real_names() {
        let case = |name, class| assert_eq!(TensorClass::of(name, Some(61)), class, "{name}");
        case("model.layers.3.mlp.experts.17.down_proj.weight", TensorClass::RoutedExperts);
        case("model.layers.3.mlp.shared_experts.up_proj.weight", TensorClass::SharedExperts);
        case("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", TensorClass::Attention);
        case("model.layers.3.self_attn.kv_a_layernorm.weight", TensorClass::NormsRouter);
        case("model.layers.3.self_attn.indexer.k_norm.bias", TensorClass::Indexer);
        case("model.layers.0.mlp.down_proj.weight", TensorClass::DenseMlp);
        case("model.layers.3.mlp.gate.e_score_correction_bias", TensorClass::NormsRouter);
        case("model.embed_tokens.weight", TensorClass::Embeddings);
        case("lm_head.weight", TensorClass::Embeddings);
        case("model.norm.weight", TensorClass::NormsRouter);
        case("model.layers.61.eh_proj.weight", TensorClass::Mtp);
        // DeepSeek-V4 and Kimi K3 names.
        case("layers.3.ffn.experts.17.w1.weight", TensorClass::RoutedExperts);
        case("layers.3.ffn.shared_experts.w2.weight", TensorClass::SharedExperts);
        case("layers.3.ffn.gate.tid2eid", TensorClass::NormsRouter);
        case("layers.3.attn.wq_a.weight", TensorClass::Attention);
        case("layers.3.attn.compressor.wkv.weight", TensorClass::Attention);
        case("layers.3.attn.indexer.weights_proj.weight", TensorClass::Indexer);
        case("layers.3.hc_attn_fn", TensorClass::NormsRouter);
        case("mtp.0.ffn.experts.0.w1.weight", TensorClass::Mtp);
        case("embed.weight", TensorClass::Embeddings);
        case("head.weight", TensorClass::Embeddings);
        case("language_model.model.layers.2.block_sparse_moe.experts.5.w3.weight", TensorClass::RoutedExperts);
        case("language_model.model.layers.2.block_sparse_moe.routed_expert_down_proj.weight", TensorClass::DenseMlp);
        case("language_model.model.layers.2.self_attn.q_conv1d.weight", TensorClass::Attention);
        assert!(is_routed_expert("layers.1.ffn.experts.0.w2"));
        assert!(is_routed_expert("model.layers.1.block_sparse_moe.experts.3.w1"));
        assert!(!is_routed_expert("layers.1.ffn.shared_experts.w2"));
    }
}

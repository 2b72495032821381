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
        if name.contains(".mlp.experts.") {
            TensorClass::RoutedExperts
        } else if name.contains(".shared_experts.") {
            TensorClass::SharedExperts
        } else if name.contains(".indexer.") {
            TensorClass::Indexer
        } else if name.contains("norm.")
            || name.contains("norm_")
            || name.ends_with("norm")
            || name.contains(".mlp.gate.")
        {
            TensorClass::NormsRouter
        } else if name.contains(".self_attn.") {
            TensorClass::Attention
        } else if name.contains(".mlp.") {
            TensorClass::DenseMlp
        } else if name.contains("embed_tokens") || name.starts_with("lm_head") {
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

/// `…mlp.experts.E.{gate,up,down}_proj`.
pub fn is_routed_expert(module: &str) -> bool {
    let Some((prefix, projection)) = module.rsplit_once('.') else { return false };
    let Some((experts, expert)) = prefix.rsplit_once('.') else { return false };
    experts.ends_with(".mlp.experts")
        && expert.parse::<usize>().is_ok()
        && matches!(projection, "gate_proj" | "up_proj" | "down_proj")
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
    }
}

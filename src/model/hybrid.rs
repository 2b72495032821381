//! The keys of hybrid layers shared by several architectures: KDA's sizes and forget gate (Kimi-Linear,
//! GLM-5.3-Flash) and mHC's stream count and Sinkhorn settings (GLM-5.3-Flash; DeepSeek-V4 keeps its own), and
//! their `layer_types` list.

use serde_json::Value;

use super::config_error::ConfigError;

/// Per layer `true` for KDA, from `layer_types`: one entry per decoder layer, `"linear_attention"` (KDA) or one of
/// `attention` (softmax attention, named in the error as `attention_hint`).
pub fn kda_layer_types(
    types: &Value,
    layers: usize,
    attention: &[&str],
    attention_hint: &str,
) -> Result<Vec<bool>, ConfigError> {
    let unsupported = |value: String, hint: String| ConfigError::Unsupported { key: "layer_types".into(), value, hint };
    let Some(types) = types.as_array() else {
        return Err(unsupported(types.to_string(), "expected a list with one entry per decoder layer".into()));
    };
    if types.len() != layers {
        return Err(unsupported(
            format!("{} entries", types.len()),
            format!("expected one per decoder layer: num_hidden_layers is {layers}"),
        ));
    }
    types
        .iter()
        .map(|kind| match kind.as_str() {
            Some("linear_attention") => Ok(true),
            Some(other) if attention.contains(&other) => Ok(false),
            _ => Err(unsupported(
                kind.to_string(),
                format!("each entry is \"linear_attention\" (KDA) or {attention_hint}"),
            )),
        })
        .collect()
}

/// A model's KDA sizes and forget gate (`linear_attn_config`, GLM-5.3-Flash's `linear_*` keys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdaKeys {
    pub heads: usize,
    pub head_dim: usize,
    pub conv_kernel: usize,
    /// GLM-5.3-Flash's safe gate `g = lower_bound · sigmoid(exp(A_log) · (f + dt_bias))`; `None`: Kimi-Linear's
    /// `g = −exp(A_log) · softplus(f + dt_bias)`.
    pub gate_lower_bound: Option<f64>,
}

/// mHC hyper-connections (`hc_mult`, `hc_eps`, `hc_sinkhorn_iters`): the residual stream widened to `streams`
/// copies, mixed around each block by Sinkhorn-normalized weights.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct HyperConnections {
    pub streams: usize,
    pub eps: f64,
    pub sinkhorn_iters: usize,
}

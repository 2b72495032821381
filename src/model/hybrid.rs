//! The keys of hybrid layers shared by several architectures: KDA's sizes and forget gate (Kimi-Linear,
//! GLM-5.3-Flash) and mHC's stream count and Sinkhorn settings (GLM-5.3-Flash; DeepSeek-V4 keeps its own).

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

//! One stored tensor as an architecture lists it: its name, shape and [`TensorRole`].

/// What a tensor is, which decides its dtype in a vendor FP8 release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// A linear projection stored as block FP8 in the vendor release.
    Linear,
    /// A linear projection the vendor keeps in BF16 (router gate, indexer `weights_proj`, MTP `eh_proj`).
    LinearBf16,
    /// Embedding table or output head (BF16).
    Embedding,
    /// Norm weight or bias (BF16).
    Norm,
    /// Projection bias (BF16).
    Bias,
    /// Router `e_score_correction_bias` (F32).
    RouterBias,
    /// A routed expert shipped as MXFP4 (E2M1 codes, E8M0 scale per 32): DeepSeek-V4 and Kimi K3.
    ExpertMxfp4,
    /// An F32 parameter that is no linear (mHC `hc_*`, attention sinks, compressor position biases, KDA `A_log`).
    Float32,
    /// An I32 lookup table (DeepSeek-V4's hash router `tid2eid`: token id → expert ids).
    TokenTable,
}

/// One stored tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub role: TensorRole,
}

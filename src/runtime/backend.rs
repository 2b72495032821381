//! The op surface every backend implements: the arithmetic of one decoder layer on host buffers.
//!
//! Layouts (row-major, f32): activations `[tokens, width]`; a linear weight `[out_features, in_features]` as
//! PyTorch stores it (`y = x·Wᵀ + b`); attention inputs per sequence `[tokens, heads, head_dim]`.

/// A dequantized weight matrix `[rows, columns]` (f32, row-major).
#[derive(Debug, Clone)]
pub struct Matrix {
    pub rows: usize,
    pub columns: usize,
    pub data: Vec<f32>,
}

impl Matrix {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }
}

/// Rotation style of RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// DeepSeek interleaved pairs `(x0,x1),(x2,x3),…`; output laid out as transformers'
    /// `apply_rotary_pos_emb_interleave` does (rotated evens, then rotated odds).
    Interleaved,
    /// Llama/GLM rotate-half: pairs `(x_i, x_{i+d/2})`.
    Half,
}

/// One causal attention problem for one sequence.
pub struct AttentionShape {
    pub tokens: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub qk_dim: usize,
    pub v_dim: usize,
    pub scale: f32,
}

/// The operations a decoder layer needs. The CPU backend is the reference (and the oracle for other backends).
pub trait Backend: Sync {
    fn name(&self) -> &'static str;
    /// `y[rows, out] = x[rows, in]·Wᵀ (+ bias)`.
    fn linear(&self, input: &[f32], rows: usize, weight: &Matrix, bias: Option<&[f32]>) -> Vec<f32>;
    /// RMSNorm over each `width`-row in place: `w · x / sqrt(mean(x²) + eps)`.
    fn rms_norm(&self, data: &mut [f32], width: usize, weight: &[f32], eps: f32);
    /// LayerNorm over each `width`-row in place: `w · (x − μ) / sqrt(var + eps) + b`.
    fn layer_norm(&self, data: &mut [f32], width: usize, weight: &[f32], bias: &[f32], eps: f32);
    /// `silu(gate) · up`, elementwise.
    fn silu_mul(&self, gate: &[f32], up: &[f32]) -> Vec<f32>;
    /// Rotates `rotary_dim` values starting at `offset` of every `head_dim`-slice of each token row
    /// (`data` is `[tokens, row_width]`); `cos`/`sin` are `[positions, rotary_dim/2]`, token `t` at position `t`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        data: &mut [f32],
        tokens: usize,
        row_width: usize,
        head_dim: usize,
        offset: usize,
        rotary_dim: usize,
        cos: &[f32],
        sin: &[f32],
        style: RopeStyle,
    );
    /// Causal softmax attention for one sequence. `q` `[tokens, heads, qk_dim]`, `k` `[tokens, kv_heads, qk_dim]`,
    /// `v` `[tokens, kv_heads, v_dim]` → `[tokens, heads, v_dim]`. `allowed`, when given, is a `[tokens, tokens]`
    /// mask of the keys each query may attend to in addition to causality (DSA top-k selection).
    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], shape: &AttentionShape, allowed: Option<&[bool]>) -> Vec<f32>;
}

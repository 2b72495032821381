//! RoPE of the architectures from their config — inverse frequencies and softmax scales, default and YaRN
//! (transformers' `_compute_yarn_parameters`, `yarn_get_mscale`) — made into the runtime's [`RopeTable`].

use crate::model::config::{Attention, Rope, RopeScaling};
use crate::model::ModelConfig;
use crate::runtime::rope_table::RopeTable;

/// `0.1 · mscale · ln(scale) + 1` for `scale > 1`, else 1.
pub fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// Inverse frequencies (f32, as torch computes them) and the cos/sin attention factor.
pub fn inverse_frequencies(rope: &Rope, head_dim: usize) -> (Vec<f32>, f64) {
    let dim = (head_dim as f64 * rope.partial_rotary_factor) as usize;
    let base = rope.theta;
    let half = dim / 2;
    // torch: base ** (arange(0, dim, 2).float() / dim) in float32.
    let position_frequency: Vec<f32> = (0..half).map(|i| (base as f32).powf((2 * i) as f32 / dim as f32)).collect();
    match &rope.scaling {
        RopeScaling::Default => (position_frequency.iter().map(|p| 1.0 / p).collect(), 1.0),
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            attention_factor,
            truncate,
        } => {
            let factor = *factor;
            let attention = attention_factor.unwrap_or(
                match (mscale.filter(|m| *m != 0.0), mscale_all_dim.filter(|m| *m != 0.0)) {
                    (Some(m), Some(all)) => yarn_mscale(factor, m) / yarn_mscale(factor, all),
                    _ => yarn_mscale(factor, 1.0),
                },
            );
            let correction_dim = |rotations: f64| {
                (dim as f64
                    * (*original_max_position_embeddings as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln())
                    / (2.0 * base.ln())
            };
            let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
            if *truncate {
                low = low.floor();
                high = high.ceil();
            }
            let low = low.max(0.0);
            let mut high = high.min(dim as f64 - 1.0);
            if low == high {
                high += 0.001;
            }
            let frequencies = (0..half)
                .map(|i| {
                    let ramp = (((i as f32) - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                    let extrapolation_weight = 1.0 - ramp;
                    let extrapolation = 1.0 / position_frequency[i];
                    let interpolation = 1.0 / (factor as f32 * position_frequency[i]);
                    interpolation * (1.0 - extrapolation_weight) + extrapolation * extrapolation_weight
                })
                .collect();
            (frequencies, attention)
        }
    }
}

/// The table for `positions` positions of heads whose rotary part is `head_dim · partial_rotary_factor`.
pub fn rope_table(rope: &Rope, head_dim: usize, positions: usize) -> RopeTable {
    let (frequencies, attention) = inverse_frequencies(rope, head_dim);
    RopeTable::new(&frequencies, attention, positions)
}

/// The MLA softmax scale: `qk_head_dim^-½`, times `yarn_mscale(factor, mscale_all_dim)²` under YaRN.
pub fn mla_softmax_scale(rope: &Rope, qk_head_dim: usize) -> f32 {
    let base = (qk_head_dim as f64).powf(-0.5);
    match &rope.scaling {
        RopeScaling::Yarn { factor, mscale_all_dim: Some(all), .. } if *all != 0.0 => {
            let m = yarn_mscale(*factor, *all);
            (base * m * m) as f32
        }
        _ => base as f32,
    }
}

/// The RoPE table for `positions` positions and the MLA softmax scale (1.0 for GQA) of a model; the identity
/// rotation for a model whose attention has no RoPE ([`ModelConfig::nope_attention`]).
pub fn rope_setup(config: &ModelConfig, positions: usize) -> (RopeTable, f32) {
    let (rope_head, mla_scale) = match &config.attention {
        Attention::Mla { qk_nope_head_dim, qk_rope_head_dim, .. } => {
            (*qk_rope_head_dim, mla_softmax_scale(&config.rope, qk_nope_head_dim + qk_rope_head_dim))
        }
        Attention::Gqa { head_dim, .. } => (*head_dim, 1.0),
    };
    if config.nope_attention() {
        // NoPE: the identity rotation (cos 1, sin 0 at every position), so the ops that rotate change nothing, and
        // the plain `qk_head_dim^-½` softmax scale (no YaRN mscale).
        let plain = match &config.attention {
            Attention::Mla { qk_nope_head_dim, qk_rope_head_dim, .. } => {
                ((qk_nope_head_dim + qk_rope_head_dim) as f64).powf(-0.5) as f32
            }
            Attention::Gqa { .. } => 1.0,
        };
        return (RopeTable::new(&vec![0.0; rope_head / 2], 1.0, positions), plain);
    }
    (rope_table(&config.rope, rope_head, positions), mla_scale)
}

/// The cos/sin rows of the positions a RoPE rotates to.
pub trait Rotations: Sync {
    /// `[cos, sin]` of `position`, `rotary_dim / 2` each.
    fn at(&self, position: usize) -> [&[f32]; 2];
}

impl Rotations for RopeTable {
    fn at(&self, position: usize) -> [&[f32]; 2] {
        let half = self.rotary_dim / 2;
        [&self.cos.values()[position * half..][..half], &self.sin.values()[position * half..][..half]]
    }
}

/// The cos/sin of a few positions only (a decode step's), the same values as a [`RopeTable`] of them all.
pub struct SparseRotations {
    /// Sorted, without repeats.
    positions: Vec<usize>,
    table: RopeTable,
}

impl SparseRotations {
    /// `rope`'s rotations of heads of `head_dim` at `positions`.
    pub fn new(rope: &Rope, head_dim: usize, positions: impl IntoIterator<Item = usize>) -> Self {
        let mut positions: Vec<usize> = positions.into_iter().collect();
        positions.sort_unstable();
        positions.dedup();
        let (frequencies, attention) = inverse_frequencies(rope, head_dim);
        let table = RopeTable::of_positions(&frequencies, attention, positions.iter().copied());
        Self { positions, table }
    }
}

impl Rotations for SparseRotations {
    fn at(&self, position: usize) -> [&[f32]; 2] {
        let row = self.positions.binary_search(&position).expect("a position the rotations were made for");
        self.table.at(row)
    }
}

/// Rotates the trailing `rotary_dim` channels of the head `x` in interleaved pairs to `position` (DeepSeek-V4's
/// `[nope | rope]` heads, transformers' `apply_rotary_pos_emb` of `deepseek_v4`); `inverse` rotates back (`−sin`).
pub fn rotate_tail(x: &mut [f32], rotations: &dyn Rotations, position: usize, inverse: bool) {
    let [cos, sin] = rotations.at(position);
    let offset = x.len() - 2 * cos.len();
    for (i, pair) in x[offset..].chunks_exact_mut(2).enumerate() {
        let (a, b) = (pair[0], pair[1]);
        let sin = if inverse { -sin[i] } else { sin[i] };
        pair[0] = a * cos[i] - b * sin;
        pair[1] = b * cos[i] + a * sin;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kimi_yarn_softmax_scale_matches_the_documented_formula() {
        let rope = Rope {
            theta: 50000.0,
            partial_rotary_factor: 1.0,
            interleave: true,
            scaling: RopeScaling::Yarn {
                factor: 40.0,
                original_max_position_embeddings: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                mscale: Some(1.0),
                mscale_all_dim: Some(1.0),
                attention_factor: None,
                truncate: true,
            },
        };
        let expected = 192f64.powf(-0.5) * (0.1 * 40f64.ln() + 1.0).powi(2);
        assert!((mla_softmax_scale(&rope, 192) as f64 - expected).abs() < 1e-7);
        // mscale == mscale_all_dim: cos/sin are not rescaled.
        assert_eq!(inverse_frequencies(&rope, 64).1, 1.0);
    }
}

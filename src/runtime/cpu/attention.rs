//! Causal softmax attention for one sequence, optionally restricted to a per-query key selection (DSA).
//! Grouped heads: query head `h` reads key/value head `h / (heads / kv_heads)`.

use rayon::prelude::*;

use super::dot;
use crate::runtime::backend::AttentionShape;

pub fn causal(q: &[f32], k: &[f32], v: &[f32], shape: &AttentionShape, allowed: Option<&[bool]>) -> Vec<f32> {
    let AttentionShape { tokens, heads, kv_heads, qk_dim, v_dim, scale } = *shape;
    let group = heads / kv_heads.max(1);
    let mut out = vec![0f32; tokens * heads * v_dim];
    // One task per (query token, head): out row `[t, h, :]` is contiguous.
    out.par_chunks_mut(v_dim).enumerate().for_each(|(index, y)| {
        let (query, head) = (index / heads, index % heads);
        let kv_head = head / group.max(1);
        let q_row = &q[(query * heads + head) * qk_dim..][..qk_dim];
        let keys = KeyValues { k, v, kv_heads, kv_head, qk_dim, v_dim };
        attend(q_row, &keys, query + 1, scale, |key| allowed.is_none_or(|mask| mask[query * tokens + key]), y);
    });
    out
}

/// The keys and values one query head reads: rows `[key, kv_heads, dim]`, head `kv_head`.
pub struct KeyValues<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub kv_heads: usize,
    pub kv_head: usize,
    pub qk_dim: usize,
    pub v_dim: usize,
}

/// Softmax attention of one query row over the first `count` keys that `allowed` admits, accumulated into `y`.
/// Shared by the full-sequence path and token-by-token decode so that both do the same arithmetic.
pub fn attend(
    q_row: &[f32],
    keys: &KeyValues,
    count: usize,
    scale: f32,
    allowed: impl Fn(usize) -> bool,
    y: &mut [f32],
) {
    let KeyValues { k, v, kv_heads, kv_head, qk_dim, v_dim } = *keys;
    let mut weights = Vec::with_capacity(count);
    let mut max = f32::NEG_INFINITY;
    for key in 0..count {
        if !allowed(key) {
            weights.push(f32::NEG_INFINITY);
            continue;
        }
        let score = dot(q_row, &k[(key * kv_heads + kv_head) * qk_dim..][..qk_dim]) * scale;
        max = max.max(score);
        weights.push(score);
    }
    let mut total = 0f32;
    for weight in weights.iter_mut() {
        *weight = if *weight == f32::NEG_INFINITY { 0.0 } else { (*weight - max).exp() };
        total += *weight;
    }
    for (key, weight) in weights.iter().enumerate() {
        if *weight == 0.0 {
            continue;
        }
        let p = weight / total;
        let v_row = &v[(key * kv_heads + kv_head) * v_dim..][..v_dim];
        for (o, value) in y.iter_mut().zip(v_row) {
            *o += p * value;
        }
    }
}

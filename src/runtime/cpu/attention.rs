//! Causal softmax attention for one sequence, optionally restricted to a per-query key selection (DSA), and the
//! same arithmetic for one decode query over its cached rows ([`super::paged`]). Grouped heads: query head `h`
//! reads key/value head `h / (heads / kv_heads)`.
//!
//! The arithmetic, one definition for both paths ([`attend_block`]): the scores `q·k` by the broadcast kernel
//! ([`crate::runtime::host::gemm`]: fused multiply-adds in dimension order) against the keys stored transposed (`[qk_dim, keys]`),
//! times `scale`; per query the softmax over the keys it sees, `w = exp(s − max)` ([`crate::runtime::host::exp`]) and
//! `p = w / Σw` (the sum in 16 lanes, [`normalize`]); then `y = Σ p·v` by the same kernel against the values as
//! stored (`[keys, v_dim]`, in key order), a key the query does not see having `p = 0`.

use rayon::prelude::*;

use crate::runtime::backend::AttentionShape;
use crate::runtime::host::exp::exp;
use crate::runtime::host::gemm::gemm;

/// Queries per task of the full-sequence path (eight of the kernel's 6-row tiles): their scores and the values
/// they read stay in L2 for a few thousand keys.
const QUERY_BLOCK: usize = 48;

pub fn causal(q: &[f32], k: &[f32], v: &[f32], shape: &AttentionShape, allowed: Option<&[bool]>) -> Vec<f32> {
    let AttentionShape { tokens, heads, kv_heads, qk_dim, v_dim, scale } = *shape;
    let group = heads / kv_heads.max(1);
    let by_head: Vec<KeysValues> = (0..kv_heads)
        .into_par_iter()
        .map(|head| {
            KeysValues::gather(
                tokens,
                qk_dim,
                v_dim,
                |key| &k[(key * kv_heads + head) * qk_dim..][..qk_dim],
                |key| &v[(key * kv_heads + head) * v_dim..][..v_dim],
            )
        })
        .collect();
    // One task per (block of queries, head); each returns its rows `[queries, v_dim]`.
    let blocks = tokens.div_ceil(QUERY_BLOCK);
    let pieces: Vec<Vec<f32>> = (0..blocks * heads)
        .into_par_iter()
        .map(|task| {
            let (first, head) = (task / heads * QUERY_BLOCK, task % heads);
            let rows = (tokens - first).min(QUERY_BLOCK);
            let mut q_block = Vec::with_capacity(rows * qk_dim);
            for query in first..first + rows {
                q_block.extend_from_slice(&q[(query * heads + head) * qk_dim..][..qk_dim]);
            }
            let mut y = vec![0f32; rows * v_dim];
            let seen = |row: usize| first + row + 1;
            let admits = |row: usize, key: usize| allowed.is_none_or(|mask| mask[(first + row) * tokens + key]);
            attend_block((&q_block, rows), &by_head[head / group.max(1)], first + rows, seen, admits, scale, &mut y);
            y
        })
        .collect();
    let mut out = vec![0f32; tokens * heads * v_dim];
    for (task, y) in pieces.iter().enumerate() {
        let (first, head) = (task / heads * QUERY_BLOCK, task % heads);
        for (row, values) in y.chunks(v_dim).enumerate() {
            out[((first + row) * heads + head) * v_dim..][..v_dim].copy_from_slice(values);
        }
    }
    out
}

/// One key/value head's keys transposed `[qk_dim, count]` and values `[count, v_dim]`, the layouts the kernel reads.
pub struct KeysValues {
    keys_t: Vec<f32>,
    values: Vec<f32>,
    count: usize,
    qk_dim: usize,
    v_dim: usize,
}

impl KeysValues {
    /// From `count` keys and values, key `i` being `key(i)` (`qk_dim` values) and its value `value(i)` (`v_dim`).
    pub fn gather<'a>(
        count: usize,
        qk_dim: usize,
        v_dim: usize,
        key: impl Fn(usize) -> &'a [f32],
        value: impl Fn(usize) -> &'a [f32],
    ) -> Self {
        let mut keys_t = vec![0f32; qk_dim * count];
        let mut values = Vec::with_capacity(count * v_dim);
        for index in 0..count {
            for (dim, &x) in key(index).iter().enumerate() {
                keys_t[dim * count + index] = x;
            }
            values.extend_from_slice(value(index));
        }
        Self { keys_t, values, count, qk_dim, v_dim }
    }
}

/// Softmax attention of `rows` queries `q` `[rows, qk_dim]` over the first `keys` of `kv`, written to `y`
/// `[rows, v_dim]`: query `r` sees keys `0..seen(r)` (`seen(r) ≤ keys`) that `admits(r, key)`.
pub fn attend_block(
    (q, rows): (&[f32], usize),
    kv: &KeysValues,
    keys: usize,
    seen: impl Fn(usize) -> usize,
    admits: impl Fn(usize, usize) -> bool,
    scale: f32,
    y: &mut [f32],
) {
    let KeysValues { qk_dim, v_dim, .. } = *kv;
    assert!(keys <= kv.count && q.len() >= rows * qk_dim && y.len() >= rows * v_dim);
    let mut p = vec![0f32; rows * keys];
    gemm((q, qk_dim), (&kv.keys_t, kv.count), (&mut p, keys), [rows, qk_dim, keys]);
    for (row, scores) in p.chunks_mut(keys.max(1)).enumerate().take(rows) {
        softmax(scores, seen(row), scale, |key| admits(row, key));
    }
    gemm((&p, keys), (&kv.values, v_dim), (y, v_dim), [rows, keys, v_dim]);
}

/// Scores in, attention weights out: the first `seen` scores `s` (the admitted ones) become `p = w / Σw` with
/// `w = exp(s·scale − max)`; the others, and those past `seen`, become 0.
fn softmax(scores: &mut [f32], seen: usize, scale: f32, admits: impl Fn(usize) -> bool) {
    for (key, score) in scores[..seen].iter_mut().enumerate() {
        *score = if admits(key) { *score * scale } else { f32::NEG_INFINITY };
    }
    normalize(&mut scores[..seen]);
    scores[seen..].fill(0.0);
}

/// `s → exp(s − max) / Σ exp(s − max)` in place (all zeros when every `s` is −∞), with AVX-512 or AVX2 where the
/// CPU has them: the same basic operations in the same order, so the same bits on every instruction set.
fn normalize(scores: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        // SAFETY: the CPU supports AVX-512F (its level).
        crate::simd::Level::Avx512 => return unsafe { normalize_avx512(scores) },
        // SAFETY: the CPU supports AVX2 (its level).
        crate::simd::Level::Avx2 => return unsafe { normalize_avx2(scores) },
        crate::simd::Level::Portable => {}
    }
    normalize_portable(scores)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn normalize_avx512(scores: &mut [f32]) {
    normalize_portable(scores)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn normalize_avx2(scores: &mut [f32]) {
    normalize_portable(scores)
}

/// Lanes of the max and the sum: score `j` goes to lane `j % 16`; the lanes are combined pairwise
/// (`l_i + l_{i+8}`, then `+4`, `+2`, `+1`), the order the sum is defined by.
const LANES: usize = 16;

#[inline(always)]
fn normalize_portable(scores: &mut [f32]) {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for chunk in scores.chunks(LANES) {
        for (lane, &s) in lanes.iter_mut().zip(chunk) {
            *lane = if s > *lane { s } else { *lane };
        }
    }
    let max = combine(lanes, |a, b| if b > a { b } else { a });
    if max == f32::NEG_INFINITY {
        scores.fill(0.0);
        return;
    }
    let mut lanes = [0f32; LANES];
    for chunk in scores.chunks_mut(LANES) {
        for (lane, s) in lanes.iter_mut().zip(chunk) {
            *s = exp(*s - max);
            *lane += *s;
        }
    }
    let total = combine(lanes, |a, b| a + b);
    for s in scores {
        *s /= total;
    }
}

/// `l_i ∘ l_{i+8}`, then `∘ +4`, `∘ +2`, `∘ +1`: lane 0 holds the result.
#[inline(always)]
fn combine(mut lanes: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            lanes[i] = op(lanes[i], lanes[i + width]);
        }
        width /= 2;
    }
    lanes[0]
}

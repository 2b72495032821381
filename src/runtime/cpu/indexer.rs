//! The DSA lightning indexer's top-k selection on the host: ReLU head scores of every causal key, the best `top_k`
//! per query (kernels/indexer.cu is its device twin).

use crate::runtime::backend::INDEXER_NEAR_TIE_RELATIVE as NEAR_TIE_RELATIVE;
use crate::runtime::backend::{IndexerShape, KeySelection};

/// The `[tokens, tokens]` mask of the keys each query keeps.
pub fn top_k(q: &[f32], k: &[f32], head_weights: &[f32], shape: &IndexerShape) -> KeySelection {
    let IndexerShape { tokens: length, heads, head_dim: dim, .. } = *shape;
    let mut near_ties = 0;
    let mut mask = vec![false; length * length];
    for t in 0..length {
        let query = &q[t * heads * dim..][..heads * dim];
        let near_tie =
            select(query, &head_weights[t * heads..][..heads], k, t + 1, shape, &mut mask[t * length..][..t + 1]);
        near_ties += near_tie as usize;
    }
    KeySelection { mask, near_ties }
}

/// One query's selection among its `count` keys `keys` `[count, head_dim]` (`shape.tokens` unused): `query`
/// `[heads, head_dim]` with head weights `w` `[heads]` scores key `s` as
/// `Σ_h w[h]·heads^-½ · ReLU(q[h]·k[s]·head_dim^-½)`; the `top_k` best (ties to the lower key) are set in `kept`
/// `[count]`, or every key while `count ≤ top_k`. Returns whether the top-k boundary is a near tie.
pub fn select(query: &[f32], w: &[f32], keys: &[f32], count: usize, shape: &IndexerShape, kept: &mut [bool]) -> bool {
    let IndexerShape { heads, head_dim: dim, top_k: topk, .. } = *shape;
    if count <= topk {
        // Every past key fits in the top-k (the rest of the k slots fall on masked future keys).
        kept[..count].iter_mut().for_each(|m| *m = true);
        return false;
    }
    let softmax_scale = (dim as f32).powf(-0.5);
    let head_scale = (heads as f32).powf(-0.5);
    let mut scored: Vec<(f32, usize)> = (0..count)
        .map(|s| {
            let key = &keys[s * dim..][..dim];
            let score = (0..heads)
                .map(|h| {
                    let logit = super::dot(&query[h * dim..][..dim], key) * softmax_scale;
                    w[h] * head_scale * logit.max(0.0)
                })
                .sum::<f32>();
            (score, s)
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let (inside, outside) = (scored[topk - 1].0, scored[topk].0);
    for &(_, s) in &scored[..topk] {
        kept[s] = true;
    }
    inside - outside <= NEAR_TIE_RELATIVE * inside.abs().max(outside.abs()).max(f32::MIN_POSITIVE)
}

/// GLM-5.3-Flash's k-pool keys (transformers' `Glm5NextTextIndexer.get_pooled_states`): the keys `k`
/// `[tokens, head_dim]` of each of the first `pools` complete pools of `size` tokens averaged channel by channel with
/// the softmax over the pool's tokens of `gates + ape` (`gates` `[tokens, head_dim]`, `ape` `[size, head_dim]`);
/// `[pools, head_dim]`.
pub fn pooled_keys(k: &[f32], gates: &[f32], ape: &[f32], (size, dim, pools): (usize, usize, usize)) -> Vec<f32> {
    let mut pooled = vec![0f32; pools * dim];
    let mut weights = vec![0f32; size];
    for (pool, out) in pooled.chunks_exact_mut(dim).enumerate() {
        for (c, out) in out.iter_mut().enumerate() {
            let logit = |j: usize| gates[(pool * size + j) * dim + c] + ape[j * dim + c];
            let top = (0..size).map(logit).fold(f32::NEG_INFINITY, f32::max);
            weights.iter_mut().enumerate().for_each(|(j, w)| *w = (logit(j) - top).exp());
            let total: f32 = weights.iter().sum();
            *out = (0..size).map(|j| weights[j] / total * k[(pool * size + j) * dim + c]).sum();
        }
    }
    pooled
}

/// The keys and gate scores `([tokens, dim], [tokens, dim])` of k-pool indexer rows `[tokens, 2 · dim]` (each key
/// beside its gate score, as the paged cache keeps them).
pub fn split_pooled_rows(rows: &[f32], dim: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut keys, mut gates) = (Vec::with_capacity(rows.len() / 2), Vec::with_capacity(rows.len() / 2));
    for row in rows.chunks_exact(2 * dim) {
        keys.extend_from_slice(&row[..dim]);
        gates.extend_from_slice(&row[dim..]);
    }
    (keys, gates)
}

/// One query's k-pool selection among the `context` tokens before and at it: the complete pools (`context / size`
/// of `pooled`) scored as [`select`] scores keys, the `pool_shape.top_k` best kept; their tokens set in `kept`
/// `[context]`, and with `select_tail` the query's own incomplete pool. Returns whether the boundary is a near tie.
pub fn select_pools(
    (query, w): (&[f32], &[f32]),
    pooled: &[f32],
    pool_shape: &IndexerShape,
    (size, select_tail): (usize, bool),
    kept: &mut [bool],
) -> bool {
    let context = kept.len();
    let visible = context / size;
    let mut chosen = vec![false; visible];
    let near_tie = visible > 0 && select(query, w, pooled, visible, pool_shape, &mut chosen);
    for pool in (0..visible).filter(|&pool| chosen[pool]) {
        kept[pool * size..(pool + 1) * size].iter_mut().for_each(|m| *m = true);
    }
    if select_tail {
        kept[visible * size..].iter_mut().for_each(|m| *m = true);
    }
    near_tie
}

/// GLM-5.3-Flash's k-pool selection over one sequence (transformers' `Glm5NextTextIndexer`): each query keeps the
/// `top_k / size` best complete pools up to it ([`pooled_keys`], [`select_pools`]); the `[tokens, tokens]` mask.
pub fn kpool_top_k(
    (q, k, head_weights): (&[f32], &[f32], &[f32]),
    (gates, ape): (&[f32], &[f32]),
    shape: &IndexerShape,
    (size, select_tail): (usize, bool),
) -> KeySelection {
    let IndexerShape { tokens, heads, head_dim: dim, top_k } = *shape;
    let pools = tokens / size;
    let pooled = pooled_keys(k, gates, ape, (size, dim, pools));
    let pool_shape = IndexerShape { tokens: pools, heads, head_dim: dim, top_k: top_k / size };
    let (mut mask, mut near_ties) = (vec![false; tokens * tokens], 0);
    for t in 0..tokens {
        let query = (&q[t * heads * dim..][..heads * dim], &head_weights[t * heads..][..heads]);
        let kept = &mut mask[t * tokens..][..t + 1];
        near_ties += select_pools(query, &pooled, &pool_shape, (size, select_tail), kept) as usize;
    }
    KeySelection { mask, near_ties }
}

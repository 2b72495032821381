//! The DSA lightning indexer's top-k selection on the host: ReLU head scores of every causal key, the best `top_k`
//! per query (kernels/indexer.cu is its device twin).

use crate::runtime::backend::INDEXER_NEAR_TIE_RELATIVE as NEAR_TIE_RELATIVE;
use crate::runtime::backend::{IndexerShape, KeySelection};

/// The `[tokens, tokens]` mask of the keys each query keeps.
pub fn top_k(q: &[f32], k: &[f32], head_weights: &[f32], shape: &IndexerShape) -> KeySelection {
    let IndexerShape { tokens: length, heads, head_dim: dim, top_k: topk } = *shape;
    let softmax_scale = (dim as f32).powf(-0.5);
    let head_scale = (heads as f32).powf(-0.5);
    let mut near_ties = 0;
    let mut mask = vec![false; length * length];
    let keep = topk.min(length);
    for t in 0..length {
        let row = &mut mask[t * length..][..length];
        if t < keep {
            // Every past key fits in the top-k (the rest of the k slots fall on masked future keys).
            row[..=t].iter_mut().for_each(|m| *m = true);
            continue;
        }
        let w = &head_weights[t * heads..][..heads];
        let mut scored: Vec<(f32, usize)> = (0..=t)
            .map(|s| {
                let key = &k[s * dim..][..dim];
                let score = (0..heads)
                    .map(|h| {
                        let logit = super::dot(&q[(t * heads + h) * dim..][..dim], key) * softmax_scale;
                        w[h] * head_scale * logit.max(0.0)
                    })
                    .sum::<f32>();
                (score, s)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let (inside, outside) = (scored[keep - 1].0, scored[keep].0);
        if inside - outside <= NEAR_TIE_RELATIVE * inside.abs().max(outside.abs()).max(f32::MIN_POSITIVE) {
            near_ties += 1;
        }
        for &(_, s) in &scored[..keep] {
            row[s] = true;
        }
    }
    KeySelection { mask, near_ties }
}

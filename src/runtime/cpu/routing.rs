//! MoE routing on the host: sigmoid scores, `e_score_correction_bias` for selection only, group-limited top-k,
//! `norm_topk_prob`, `routed_scaling_factor` (kernels/routing.cu is its device twin).

use crate::runtime::backend::ROUTING_NEAR_TIE_RELATIVE as NEAR_TIE_RELATIVE;
use crate::runtime::backend::{Routes, RoutingShape};

/// The experts and weights of each `[experts]`-row of `logits`.
pub fn route(logits: &[f32], tokens: usize, correction_bias: &[f32], shape: &RoutingShape) -> Routes {
    let (experts, top_k, groups) = (shape.experts, shape.top_k, shape.groups);
    let per_group = experts / groups;
    let mut near_ties = 0;
    let mut chosen_experts = Vec::with_capacity(tokens * top_k);
    let mut chosen_weights = Vec::with_capacity(tokens * top_k);
    for row in logits.chunks(experts).take(tokens) {
        let scores: Vec<f32> = row.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
        let mut choice: Vec<f32> = scores.iter().zip(correction_bias).map(|(s, b)| s + b).collect();
        if groups > 1 && shape.topk_group < groups {
            let mut group_scores: Vec<(f32, usize)> = (0..groups)
                .map(|g| {
                    let mut members: Vec<f32> = choice[g * per_group..][..per_group].to_vec();
                    members.sort_by(|a, b| b.total_cmp(a));
                    (members.iter().take(2).sum(), g)
                })
                .collect();
            group_scores.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            for &(_, g) in &group_scores[shape.topk_group..] {
                choice[g * per_group..][..per_group].iter_mut().for_each(|c| *c = f32::NEG_INFINITY);
            }
        }
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
        if top_k < experts {
            let (inside, outside) = (choice[order[top_k - 1]], choice[order[top_k]]);
            if outside.is_finite() && inside - outside <= NEAR_TIE_RELATIVE * inside.abs().max(outside.abs()) {
                near_ties += 1;
            }
        }
        let chosen = &order[..top_k];
        let mut weights: Vec<f32> = chosen.iter().map(|&e| scores[e]).collect();
        if shape.norm_topk_prob {
            let denominator = weights.iter().sum::<f32>() + 1e-20;
            weights.iter_mut().for_each(|w| *w /= denominator);
        }
        chosen_experts.extend_from_slice(chosen);
        chosen_weights.extend(weights.into_iter().map(|w| w * shape.routed_scaling_factor));
    }
    Routes { top_k, experts: chosen_experts, weights: chosen_weights, near_ties }
}

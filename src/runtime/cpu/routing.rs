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
        let (chosen, near_tie) = top_k_of(&choice, top_k);
        near_ties += usize::from(near_tie);
        chosen_weights.extend(weights_of(&scores, &chosen, shape));
        chosen_experts.extend(chosen);
    }
    Routes { top_k, experts: chosen_experts, weights: chosen_weights, near_ties }
}

/// The `top_k` largest entries of `choice` (ties to the lower index), in rank order, and whether the boundary
/// between the last one in and the first one out is a near-tie.
pub fn top_k_of(choice: &[f32], top_k: usize) -> (Vec<usize>, bool) {
    let mut order: Vec<usize> = (0..choice.len()).collect();
    order.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
    let near_tie = top_k > 0 && top_k < choice.len() && {
        let (inside, outside) = (choice[order[top_k - 1]], choice[order[top_k]]);
        outside.is_finite() && inside - outside <= NEAR_TIE_RELATIVE * inside.abs().max(outside.abs())
    };
    order.truncate(top_k);
    (order, near_tie)
}

/// The chosen experts' weights: their scores, normalized to sum 1 when `norm_topk_prob`, times
/// `routed_scaling_factor`.
pub fn weights_of<'a>(scores: &'a [f32], chosen: &'a [usize], shape: &RoutingShape) -> impl Iterator<Item = f32> + 'a {
    let denominator = if shape.norm_topk_prob { chosen.iter().map(|&e| scores[e]).sum::<f32>() + 1e-20 } else { 1.0 };
    let scale = shape.routed_scaling_factor;
    chosen.iter().map(move |&e| scores[e] / denominator * scale)
}

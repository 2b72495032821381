//! MoE routing and the DSA indexer's top-k selection on the CUDA backend against the CPU backend: the same experts
//! and keys chosen (ties included), gate weights within a named tolerance.

use squeeze::runtime::backend::{IndexerShape, RoutingShape};
use squeeze::runtime::{Backend, Cpu};

use crate::cuda_ops::{cuda_backends, errors, Rng};

/// Gate weights differ from the CPU's only through the sigmoid's exponential: the same libm function under
/// emulation (0 difference), within 2 ulp for CUDA's expf, and a normalization over at most 32 weights keeps that
/// relative size.
const ROUTE_WEIGHT_REL_L2: f64 = 1e-6;

struct RoutingCase {
    name: &'static str,
    shape: RoutingShape,
    /// Logits rounded to multiples of 1/4 and a zero bias: many exact ties, broken by the lower expert.
    exact_ties: bool,
}

fn routing_cases() -> Vec<RoutingCase> {
    let shape = |experts, top_k, groups, topk_group, norm_topk_prob, routed_scaling_factor| RoutingShape {
        experts,
        top_k,
        groups,
        topk_group,
        norm_topk_prob,
        routed_scaling_factor,
    };
    vec![
        // The tiny synthetic DeepseekV3 (src/synth/config.rs): 8 experts, 2 per token, no groups.
        RoutingCase { name: "kimi-synth", shape: shape(8, 2, 1, 1, true, 2.827), exact_ties: false },
        // Kimi K2 / GLM-5 / GLM-4.5 presets: one group, 8 per token.
        RoutingCase { name: "kimi-k2", shape: shape(384, 8, 1, 1, true, 2.827), exact_ties: false },
        RoutingCase { name: "glm-4.5", shape: shape(160, 8, 1, 1, true, 2.5), exact_ties: false },
        // DeepSeek-V3-style group-limited routing on awkward sizes: 26 experts in 4 groups of 6 (the last two
        // experts belong to no group and are never masked, as on the CPU).
        RoutingCase { name: "grouped", shape: shape(26, 5, 4, 2, true, 2.5), exact_ties: false },
        RoutingCase { name: "grouped-unnormalized", shape: shape(24, 6, 4, 3, false, 1.0), exact_ties: false },
        // One expert per group (the group score is that expert's alone), and exact ties everywhere.
        RoutingCase { name: "singleton-groups-ties", shape: shape(12, 3, 12, 5, true, 2.5), exact_ties: true },
        RoutingCase { name: "glm-4.5-ties", shape: shape(160, 8, 1, 1, true, 2.5), exact_ties: true },
    ]
}

#[test]
fn routing_matches_cpu() {
    let backends = cuda_backends();
    let mut rng = Rng(0x5EED_0017);
    for case in routing_cases() {
        let experts = case.shape.experts;
        for tokens in [1, 37] {
            let mut logits = rng.values(tokens * experts, 4.0);
            let mut bias = rng.values(experts, 0.05);
            if case.exact_ties {
                logits.iter_mut().for_each(|l| *l = (*l * 4.0).round() / 4.0);
                bias.fill(0.0);
            }
            let want = Cpu.route(&logits, tokens, &bias, &case.shape);
            for backend in &backends {
                let got = backend.route(&logits, tokens, &bias, &case.shape);
                let label = format!("{} {} tokens {tokens}", backend.describe(), case.name);
                assert_eq!(backend.failure(), None, "{label}");
                assert_eq!(got.top_k, want.top_k, "{label}");
                assert_eq!(got.experts, want.experts, "{label}: chosen experts");
                let (rel, max_abs) = errors(&got.weights, &want.weights);
                eprintln!("{label}: weights rel L2 {rel:e}, max abs {max_abs:e}, near ties {}", want.near_ties);
                assert!(rel < ROUTE_WEIGHT_REL_L2, "{label}: weights rel L2 {rel:e} (max abs {max_abs:e})");
                assert_eq!(got.near_ties, want.near_ties, "{label}: near ties");
            }
        }
    }
}

#[test]
fn routing_beyond_the_kernel_is_a_reported_failure() {
    let shape = RoutingShape {
        experts: 513,
        top_k: 8,
        groups: 1,
        topk_group: 1,
        norm_topk_prob: true,
        routed_scaling_factor: 2.5,
    };
    let logits = Rng(3).values(2 * 513, 1.0);
    for backend in cuda_backends() {
        let routes = backend.route(&logits, 2, &[0.0; 513], &shape);
        assert!(routes.weights.iter().all(|w| w.is_nan()), "a failed route returns NaN weights");
        let failure = backend.failure().expect("the failure is kept");
        assert!(failure.contains("513 experts"), "{failure}");
    }
}

#[test]
fn indexer_top_k_matches_cpu() {
    let backends = cuda_backends();
    let mut rng = Rng(0x1DE7_0005);
    // (tokens, heads, head_dim, top_k): the synthetic GLM-5's 4×32 heads and an awkward 3×36 (a dot-product tail).
    let cases = [(5, 4, 32, 3), (33, 3, 36, 8), (70, 4, 32, 13), (70, 3, 36, 64), (300, 3, 36, 200)];
    for (tokens, heads, head_dim, top_k) in cases {
        let shape = IndexerShape { tokens, heads, head_dim, top_k };
        let q = rng.values(tokens * heads * head_dim, 1.0);
        let k = rng.values(tokens * head_dim, 1.0);
        // Signed head weights: negative and zero (all-ReLU-off) scores, so ties at ±0 are common.
        let head_weights = rng.values(tokens * heads, 1.0);
        let want = Cpu.indexer_top_k(&q, &k, &head_weights, &shape);
        let kept = want.mask.iter().filter(|&&m| m).count();
        let expected: usize = (0..tokens).map(|t| (t + 1).min(top_k)).sum();
        assert_eq!(kept, expected, "the CPU keeps min(t + 1, top_k) keys per query");
        for backend in &backends {
            let got = backend.indexer_top_k(&q, &k, &head_weights, &shape);
            let label = format!("{} tokens {tokens} heads {heads}×{head_dim} top-k {top_k}", backend.describe());
            assert_eq!(backend.failure(), None, "{label}");
            let differing = got.mask.iter().zip(&want.mask).filter(|(g, w)| g != w).count();
            assert_eq!(got.mask.len(), want.mask.len(), "{label}");
            assert_eq!(differing, 0, "{label}: {differing} mask cells differ");
            assert_eq!(got.near_ties, want.near_ties, "{label}: near ties");
            eprintln!("{label}: masks identical, near ties {}", want.near_ties);
        }
    }
}

// MoE routing of DeepSeek-V3 / Kimi K2 / GLM: sigmoid scores, `e_score_correction_bias` for selection only,
// group-limited top-k, `norm_topk_prob`, `routed_scaling_factor`. Matches src/runtime/cpu/routing.rs bit for bit up
// to the exponential (expf here, Rust's f32::exp there: the same libm function under emulation, within 2 ulp on a GPU).
//
// Layout: logits f32 `[tokens, experts]`, bias f32 `[experts]`; out experts i32 `[tokens, top_k]` and weights f32
// `[tokens, top_k]` in rank order, near_tie i32 `[tokens]` (0/1).
// Equations, per token (one warp per token, 4 tokens per 128-thread block):
//   s_e = 1 / (1 + exp(-logit_e));  c_e = s_e + bias_e
//   groups > 1 and topk_group < groups: group score = sum of the two largest c_e of the group (-0.0 + c1 + c2);
//     the topk_group best groups (ties: lower group) stay, the others' c_e become -inf
//     (group of e is e / (experts / groups); experts past groups·per_group are never masked, as on the CPU)
//   chosen = the top_k largest c_e in `total_cmp` order, ties to the lower expert
//   w_r = s_{chosen r};  norm: w_r /= (-0.0 + w_0 + … + w_{k-1}) + 1e-20;  out w_r · scaling
//   near_tie = top_k < experts, c_out finite and c_in − c_out <= rel · max(|c_in|, |c_out|) for the last chosen c_in
//     and the best unchosen c_out.
// Limits (checked by the Rust wrapper): experts <= 512, groups <= 32, 1 <= top_k <= min(32, experts).
#include "common.cuh"
#include "total_order.cuh"

namespace squeeze {

constexpr int kRouteMaxExperts = 512;
constexpr int kRoutePerLane = kRouteMaxExperts / 32;
constexpr int kRouteWarps = 4;

// Expert e's selection key: its choice score in total order above, the complement of its index below (so the
// largest key is the best score with the lowest index); 0 marks "taken or absent" (no real expert has key 0).
__device__ __forceinline__ unsigned long long route_key(float choice, int expert) {
    return ((unsigned long long)order_key(choice) << 32) | (unsigned long long)(0xFFFFFFFFu - (uint32_t)expert);
}

__device__ __forceinline__ float route_sigmoid(float logit) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-logit))); }

}  // namespace squeeze

extern "C" __global__ void __launch_bounds__(128)
    route_sigmoid_topk(const float* __restrict__ logits, const float* __restrict__ bias, int* __restrict__ experts_out,
                       float* __restrict__ weights_out, int* __restrict__ near_tie_out, int tokens, int experts,
                       int groups, int topk_group, int top_k, int normalize, float scaling, float near_tie_relative) {
    using namespace squeeze;
    __shared__ float choice_all[kRouteWarps][kRouteMaxExperts];
    const unsigned full = 0xFFFFFFFFu;
    const int warp = (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32);
    const int token = (int)blockIdx.x * kRouteWarps + warp;
    if (token >= tokens) return;  // the whole warp leaves; only warp-level synchronization below
    const float* row = logits + (long long)token * experts;
    float* choice = choice_all[warp];
    for (int e = lane; e < experts; e += 32) choice[e] = __fadd_rn(route_sigmoid(__ldg(row + e)), __ldg(bias + e));
    __syncwarp();

    if (groups > 1 && topk_group < groups) {
        const int per_group = experts / groups;
        // Lane g scores group g by its two largest members.
        float group_score = 0.0f;
        if (lane < groups) {
            float first = 0.0f, second = 0.0f;
            uint32_t first_key = 0, second_key = 0;
            int seen = 0;
            for (int i = 0; i < per_group; ++i) {
                const float value = choice[lane * per_group + i];
                const uint32_t key = order_key(value);
                if (seen == 0 || key > first_key) {
                    second = first, second_key = first_key;
                    first = value, first_key = key;
                } else if (seen == 1 || key > second_key) {
                    second = value, second_key = key;
                }
                seen += 1;
            }
            group_score = __fadd_rn(-0.0f, first);
            if (per_group > 1) group_score = __fadd_rn(group_score, second);
        }
        const uint32_t group_key = order_key(group_score);
        int rank = 0;
        for (int other = 0; other < groups; ++other) {
            const uint32_t other_key = __shfl_sync(full, group_key, other);
            if (other_key > group_key || (other_key == group_key && other < lane)) rank += 1;
        }
        const unsigned kept = __ballot_sync(full, lane < groups && rank < topk_group);
        __syncwarp();
        for (int e = lane; e < experts; e += 32) {
            const int group = e / per_group;
            if (group < groups && ((kept >> group) & 1u) == 0u) choice[e] = __uint_as_float(0xFF800000u);  // -inf
        }
        __syncwarp();
    }

    unsigned long long keys[kRoutePerLane];
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
        const int e = lane + 32 * i;
        keys[i] = e < experts ? route_key(choice[e], e) : 0ull;
    }
    // Round r finds the rank-r expert; one extra round finds the best unchosen one for the near-tie check.
    const int rounds = top_k < experts ? top_k + 1 : top_k;
    int mine = 0;  // lane r < top_k keeps the rank-r expert
    unsigned long long last_key = 0, outside_key = 0;
    for (int r = 0; r < rounds; ++r) {
        unsigned long long best = 0;
#pragma unroll
        for (int i = 0; i < kRoutePerLane; ++i) best = keys[i] > best ? keys[i] : best;
        for (int offset = 16; offset > 0; offset >>= 1) {
            const unsigned long long other = __shfl_xor_sync(full, best, offset);
            best = other > best ? other : best;
        }
        const int winner = (int)(0xFFFFFFFFu - (uint32_t)(best & 0xFFFFFFFFull));
        if (r == lane) mine = winner;
        if (r == top_k - 1) last_key = best;
        if (r == top_k) outside_key = best;
#pragma unroll
        for (int i = 0; i < kRoutePerLane; ++i)
            if (lane + 32 * i == winner) keys[i] = 0ull;
    }

    // Weights: every lane sums the chosen scores in rank order, as the CPU does.
    const float score = lane < top_k ? route_sigmoid(__ldg(row + mine)) : 0.0f;
    float weight = score;
    if (normalize) {
        float sum = -0.0f;
        for (int r = 0; r < top_k; ++r) sum = __fadd_rn(sum, __shfl_sync(full, score, r));
        weight = __fdiv_rn(weight, __fadd_rn(sum, 1e-20f));
    }
    if (lane < top_k) {
        experts_out[(long long)token * top_k + lane] = mine;
        weights_out[(long long)token * top_k + lane] = __fmul_rn(weight, scaling);
    }
    if (lane == 0) {
        int tie = 0;
        if (top_k < experts) {
            const float inside = order_value((uint32_t)(last_key >> 32));
            const float outside = order_value((uint32_t)(outside_key >> 32));
            if (finite_value(outside) &&
                __fsub_rn(inside, outside) <= __fmul_rn(near_tie_relative, fmaxf(fabsf(inside), fabsf(outside))))
                tie = 1;
        }
        near_tie_out[token] = tie;
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(route_sigmoid_topk);
#endif

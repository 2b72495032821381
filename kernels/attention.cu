// Causal prefill attention for one sequence (src/runtime/cpu/attention.rs `causal`, `Backend::attention`).
//
// Layout: q f32 `[tokens, heads, qk_dim]`, k f32 `[tokens, kv_heads, qk_dim]`, v f32 `[tokens, kv_heads, v_dim]`,
// out f32 `[tokens, heads, v_dim]`; query head h reads key/value head h / (heads / kv_heads). `allowed` (optional,
// null for none) u8 `[tokens, tokens]`: key j is admitted for query i when j ≤ i and allowed[i · tokens + j] ≠ 0
// (DSA top-k selection on top of causality).
//
// Equation: out[i, h] = Σ_j softmax_j(scale · q[i, h] · k[j, g]) · v[j, g] over the admitted keys, computed with an
// online (running max) softmax: m' = max(m, s), l' = l · e^(m − m') + e^(s − m'), acc' = acc · e^(m − m') +
// e^(s − m') · v. Same result as the CPU's two-pass softmax up to f32 rounding (dot-product order, exp). A query
// with no admitted key gets zeros, as on the CPU.
//
// Launch: 128 threads per block = 4 warps, one warp per (query, head) pair (pair = block · 4 + warp, pairs ordered
// query-major); lane l owns elements l, l + 32, … of the q row (registers, qk_dim ≤ 1024) and of the output
// (v_dim ≤ 512). No shared memory.
#include "common.cuh"

namespace squeeze {
constexpr int kAttentionWarps = 4;
constexpr int kAttentionQkPerLane = 1024 / 32;
constexpr int kAttentionVPerLane = 512 / 32;

__device__ __forceinline__ float attention_warp_sum(float value) {
    for (int offset = 16; offset > 0; offset >>= 1) value = __fadd_rn(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
    return value;
}
}  // namespace squeeze

extern "C" __global__ void __launch_bounds__(128)
    attention_causal(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                     const unsigned char* __restrict__ allowed, float* __restrict__ out, int tokens, int heads,
                     int kv_heads, int qk_dim, int v_dim, float scale) {
    using namespace squeeze;
    const int lane = threadIdx.x % 32;
    const int pair = blockIdx.x * kAttentionWarps + threadIdx.x / 32;
    if (pair >= tokens * heads) return;  // whole warps leave together
    const int query = pair / heads, head = pair % heads;
    const int group = heads / kv_heads;
    const int kv_head = head / group;

    float q_lane[kAttentionQkPerLane];
#pragma unroll
    for (int j = 0; j < kAttentionQkPerLane; ++j) {
        const int e = lane + 32 * j;
        q_lane[j] = e < qk_dim ? q[((long long)query * heads + head) * qk_dim + e] : 0.0f;
    }
    float acc[kAttentionVPerLane];
#pragma unroll
    for (int j = 0; j < kAttentionVPerLane; ++j) acc[j] = 0.0f;
    float running_max = -INFINITY, running_sum = 0.0f;

    for (int key = 0; key <= query; ++key) {
        if (allowed != nullptr && allowed[(long long)query * tokens + key] == 0) continue;  // uniform over the warp
        const float* k_row = k + ((long long)key * kv_heads + kv_head) * qk_dim;
        float partial = 0.0f;
#pragma unroll
        for (int j = 0; j < kAttentionQkPerLane; ++j) {
            const int e = lane + 32 * j;
            if (e < qk_dim) partial = __fadd_rn(partial, __fmul_rn(q_lane[j], k_row[e]));
        }
        const float score = __fmul_rn(attention_warp_sum(partial), scale);
        const float new_max = fmaxf(running_max, score);
        const float correction = expf(__fsub_rn(running_max, new_max));  // 0 on the first admitted key
        const float weight = expf(__fsub_rn(score, new_max));
        running_sum = __fadd_rn(__fmul_rn(running_sum, correction), weight);
        running_max = new_max;
        const float* v_row = v + ((long long)key * kv_heads + kv_head) * v_dim;
#pragma unroll
        for (int j = 0; j < kAttentionVPerLane; ++j) {
            const int e = lane + 32 * j;
            if (e < v_dim) acc[j] = __fadd_rn(__fmul_rn(acc[j], correction), __fmul_rn(weight, v_row[e]));
        }
    }
    const float inverse = running_sum > 0.0f ? __fdiv_rn(1.0f, running_sum) : 0.0f;
    float* out_row = out + ((long long)query * heads + head) * v_dim;
#pragma unroll
    for (int j = 0; j < kAttentionVPerLane; ++j) {
        const int e = lane + 32 * j;
        if (e < v_dim) out_row[e] = __fmul_rn(acc[j], inverse);
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(attention_causal);
#endif

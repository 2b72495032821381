// GLM-5's DSA lightning indexer for one sequence: index scores of every query over its causal keys, then the
// top-k keys per query as a mask. Matches src/runtime/cpu/indexer.rs bit for bit (same summation orders, explicitly
// rounded operations, `total_cmp` order with ties to the lower key), so the masks are identical.
//
// Layout: q f32 `[tokens, heads, dim]` (after RoPE), k f32 `[tokens, dim]` (after LayerNorm and RoPE), head weights
// f32 `[tokens, heads]`; scores f32 `[tokens, tokens]` (only s <= t written); mask u8 `[tokens, tokens]`,
// near_tie i32 `[tokens]`.
// Equations:
//   dot(a, b) = ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)) + tail, l_j = Σ_c a[8c+j]·b[8c+j], tail = Σ of the dim % 8 rest
//     (src/runtime/cpu/mod.rs `dot`);
//   score[t, s] = -0.0 + Σ_h (w[t,h] · head_scale) · max(dot(q[t,h], k[s]) · softmax_scale, 0), h in order;
//   mask[t, s] = s <= t and (t < top_k, or s among the top_k scores of row t in (score desc, s asc) order);
//   near_tie[t] = t >= top_k and in − out <= rel · max(|in|, |out|, MIN_POSITIVE) for the last kept score `in` and the
//     best dropped one `out`.
// indexer_scores: one 256-thread block per query, the query row in shared memory (heads·dim <= 4096), a thread per key.
// indexer_top_k_mask: one 256-thread block per query; radix select of the top_k-th key (4 passes of 8 bits over the
// `total_cmp` keys), then the equal keys taken in index order with a block scan.
#include "common.cuh"
#include "total_order.cuh"

namespace squeeze {

constexpr int kIndexerMaxQuery = 4096;
constexpr int kIndexerMaxHeads = 128;
constexpr int kIndexerThreads = 256;

// src/runtime/cpu/mod.rs `dot`: eight independent accumulators, then a fixed tree, then the tail.
__device__ __forceinline__ float indexer_dot(const float* a, const float* __restrict__ b, int dim) {
    float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const int whole = dim / 8 * 8;
    for (int c = 0; c < whole; c += 8) {
#pragma unroll
        for (int j = 0; j < 8; ++j) lanes[j] = __fadd_rn(lanes[j], __fmul_rn(a[c + j], __ldg(b + c + j)));
    }
    float tail = 0.0f;
    for (int c = whole; c < dim; ++c) tail = __fadd_rn(tail, __fmul_rn(a[c], __ldg(b + c)));
    const float left = __fadd_rn(__fadd_rn(lanes[0], lanes[4]), __fadd_rn(lanes[1], lanes[5]));
    const float right = __fadd_rn(__fadd_rn(lanes[2], lanes[6]), __fadd_rn(lanes[3], lanes[7]));
    return __fadd_rn(__fadd_rn(left, right), tail);
}

}  // namespace squeeze

extern "C" __global__ void __launch_bounds__(256)
    indexer_scores(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ head_weights,
                   float* __restrict__ scores, int tokens, int heads, int dim, float softmax_scale, float head_scale) {
    using namespace squeeze;
    __shared__ float query[kIndexerMaxQuery];
    __shared__ float weight[kIndexerMaxHeads];
    const int t = (int)blockIdx.x;
    const int width = heads * dim;
    for (int i = (int)threadIdx.x; i < width; i += (int)blockDim.x) query[i] = __ldg(q + (long long)t * width + i);
    for (int h = (int)threadIdx.x; h < heads; h += (int)blockDim.x)
        weight[h] = __fmul_rn(__ldg(head_weights + (long long)t * heads + h), head_scale);
    __syncthreads();
    for (int s = (int)threadIdx.x; s <= t; s += (int)blockDim.x) {
        const float* key = k + (long long)s * dim;
        float score = -0.0f;
        for (int h = 0; h < heads; ++h) {
            const float logit = __fmul_rn(indexer_dot(query + h * dim, key, dim), softmax_scale);
            score = __fadd_rn(score, __fmul_rn(weight[h], fmaxf(logit, 0.0f)));
        }
        scores[(long long)t * tokens + s] = score;
    }
}

extern "C" __global__ void __launch_bounds__(256)
    indexer_top_k_mask(const float* __restrict__ scores, unsigned char* __restrict__ mask, int* __restrict__ near_tie,
                       int tokens, int top_k, float near_tie_relative) {
    using namespace squeeze;
    __shared__ unsigned histogram[256];
    __shared__ unsigned warp_counts[kIndexerThreads / 32];
    __shared__ unsigned chosen_prefix, chosen_remaining, inside_inverse, outside_key;
    const unsigned full = 0xFFFFFFFFu;
    const int t = (int)blockIdx.x, thread = (int)threadIdx.x;
    const int lane = thread % 32, warp = thread / 32;
    const int count = t + 1;  // causal keys 0..=t
    const float* row = scores + (long long)t * tokens;
    unsigned char* out = mask + (long long)t * tokens;
    if (count <= top_k) {
        // Every past key fits in the top-k.
        for (int s = thread; s < tokens; s += (int)blockDim.x) out[s] = s <= t ? 1 : 0;
        if (thread == 0) near_tie[t] = 0;
        return;
    }

    // Radix select: the key of the top_k-th largest score, and how many keys equal to it are taken.
    unsigned prefix = 0, prefix_mask = 0, remaining = (unsigned)top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = thread; i < 256; i += (int)blockDim.x) histogram[i] = 0u;
        __syncthreads();
        for (int s = thread; s < count; s += (int)blockDim.x) {
            const uint32_t key = order_key(row[s]);
            if ((key & prefix_mask) == prefix) atomicAdd(&histogram[(key >> shift) & 0xFFu], 1u);
        }
        __syncthreads();
        if (thread == 0) {
            unsigned above = 0;
            for (int digit = 255; digit >= 0; --digit) {
                if (above + histogram[digit] >= remaining) {
                    chosen_prefix = prefix | ((unsigned)digit << shift);
                    chosen_remaining = remaining - above;
                    break;
                }
                above += histogram[digit];
            }
            inside_inverse = 0u;
            outside_key = 0u;
        }
        __syncthreads();
        prefix = chosen_prefix;
        remaining = chosen_remaining;
        prefix_mask |= 0xFFu << shift;
        __syncthreads();
    }

    // Keys above the threshold are taken; equal ones in index order until `remaining` are.
    unsigned equal_before = 0;
    for (int base = 0; base < tokens; base += (int)blockDim.x) {
        const int s = base + thread;
        const uint32_t key = s < count ? order_key(row[s]) : 0u;
        const bool equal = s < count && key == prefix;
        const unsigned ballot = __ballot_sync(full, equal);
        if (lane == 0) warp_counts[warp] = (unsigned)__popc(ballot);
        __syncthreads();
        unsigned before = equal_before + (unsigned)__popc(ballot & ((1u << lane) - 1u)), total = 0;
        for (int w = 0; w < (int)(blockDim.x / 32); ++w) {
            if (w < warp) before += warp_counts[w];
            total += warp_counts[w];
        }
        const bool selected = s < count && (key > prefix || (equal && before < remaining));
        if (s < tokens) out[s] = selected ? 1 : 0;
        if (s < count) {
            if (selected) {
                atomicMax(&inside_inverse, ~key);
            } else {
                atomicMax(&outside_key, key);
            }
        }
        equal_before += total;
        __syncthreads();
    }
    // Some key is dropped since count > top_k; both extremes are complete after the last barrier.
    if (thread == 0) {
        const float inside = order_value(~inside_inverse);
        const float outside = order_value(outside_key);
        const float floor = fmaxf(fmaxf(fabsf(inside), fabsf(outside)), 1.17549435e-38f);
        near_tie[t] = __fsub_rn(inside, outside) <= __fmul_rn(near_tie_relative, floor) ? 1 : 0;
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(indexer_scores);
SQUEEZE_EMULATION_KERNEL(indexer_top_k_mask);
#endif

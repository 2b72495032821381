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
// paged_index_scores / paged_index_top_k: the same score and selection for a decode step's queries over their keys in
// a paged cache.
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

namespace squeeze {

// The mask of the top_k of `count` scores `row` into `out[0, out_len)` (1 kept, 0 dropped or s >= count; every key
// while count <= top_k) and, when `near_tie` is given, whether the top-k boundary is a near tie. One 256-thread block.
template <typename Out>
__device__ void indexer_select_row(const float* __restrict__ row, Out* __restrict__ out, int out_len, int count,
                                   int top_k, float near_tie_relative, int* __restrict__ near_tie) {
    __shared__ unsigned histogram[256];
    __shared__ unsigned warp_counts[kIndexerThreads / 32];
    __shared__ unsigned chosen_prefix, chosen_remaining, inside_inverse, outside_key;
    const unsigned full = 0xFFFFFFFFu;
    const int thread = (int)threadIdx.x;
    const int lane = thread % 32, warp = thread / 32;
    if (count <= top_k) {
        // Every past key fits in the top-k.
        for (int s = thread; s < out_len; s += (int)blockDim.x) out[s] = (Out)(s < count ? 1 : 0);
        if (thread == 0 && near_tie != nullptr) *near_tie = 0;
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
    for (int base = 0; base < out_len; base += (int)blockDim.x) {
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
        if (s < out_len) out[s] = (Out)(selected ? 1 : 0);
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
    if (thread == 0 && near_tie != nullptr) {
        const float inside = order_value(~inside_inverse);
        const float outside = order_value(outside_key);
        const float floor = fmaxf(fmaxf(fabsf(inside), fabsf(outside)), 1.17549435e-38f);
        *near_tie = __fsub_rn(inside, outside) <= __fmul_rn(near_tie_relative, floor) ? 1 : 0;
    }
}

}  // namespace squeeze

extern "C" __global__ void __launch_bounds__(256)
    indexer_top_k_mask(const float* __restrict__ scores, unsigned char* __restrict__ mask, int* __restrict__ near_tie,
                       int tokens, int top_k, float near_tie_relative) {
    const long long t = blockIdx.x;  // causal keys 0..=t
    squeeze::indexer_select_row(scores + t * tokens, mask + t * tokens, tokens, (int)t + 1, top_k, near_tie_relative,
                                near_tie + t);
}

// Decode over a paged cache: request r's index query `q` `[requests, heads, dim]` and head weights
// `[requests, heads]` scored against its cached keys 0..context in `aux` (f32 pages `[pool_pages, layers, page_size,
// dim]`, reached through the paged attention's request descriptors and mappings; context = descriptor word 2) into
// `scores` `[requests, stride]` (-inf past the context or through a mapping outside the pool: the attention's
// verification faults that request). Grid (ceil(stride / 256), requests).
extern "C" __global__ void __launch_bounds__(256)
    paged_index_scores(const float* __restrict__ q, const float* __restrict__ head_weights,
                       const float* __restrict__ aux, const uint32_t* __restrict__ requests,
                       const uint32_t* __restrict__ mappings, float* __restrict__ scores, int stride, int pool_pages,
                       int layers, int layer, int page_size, int heads, int dim, float softmax_scale,
                       float head_scale) {
    using namespace squeeze;
    __shared__ float query[kIndexerMaxQuery];
    __shared__ float weight[kIndexerMaxHeads];
    const long long r = blockIdx.y;
    const int width = heads * dim;
    for (int i = (int)threadIdx.x; i < width; i += (int)blockDim.x) query[i] = __ldg(q + r * width + i);
    for (int h = (int)threadIdx.x; h < heads; h += (int)blockDim.x)
        weight[h] = __fmul_rn(__ldg(head_weights + r * heads + h), head_scale);
    __syncthreads();
    const uint32_t* descriptor = requests + r * 8;  // kRequestWords of kernels/paged_attention.cu
    const int context = (int)descriptor[2];
    const long long first_mapping = descriptor[3];
    const int mapping_count = (int)descriptor[4];
    for (int s = (int)(blockIdx.x * blockDim.x + threadIdx.x); s < stride; s += (int)(gridDim.x * blockDim.x)) {
        float score = -INFINITY;
        const int logical = s / page_size;
        const uint32_t page = s < context && logical < mapping_count ? mappings[(first_mapping + logical) * 4] : 0xFFFFFFFFu;
        if (page < (uint32_t)pool_pages) {
            const float* key = aux + (((long long)page * layers + layer) * page_size + s % page_size) * dim;
            score = -0.0f;
            for (int h = 0; h < heads; ++h) {
                const float logit = __fmul_rn(indexer_dot(query + h * dim, key, dim), softmax_scale);
                score = __fadd_rn(score, __fmul_rn(weight[h], fmaxf(logit, 0.0f)));
            }
        }
        scores[r * stride + s] = score;
    }
}

// Decode: each request's top_k keys of its `scores` row as an f32 0/1 mask `[requests, stride]` (the paged
// attention's `allowed`); every key while context <= top_k. Grid (requests), 256 threads.
extern "C" __global__ void __launch_bounds__(256)
    paged_index_top_k(const float* __restrict__ scores, const uint32_t* __restrict__ requests,
                      float* __restrict__ mask, int stride, int top_k) {
    const long long r = blockIdx.x;
    const int context = (int)requests[r * 8 + 2];
    squeeze::indexer_select_row(scores + r * stride, mask + r * stride, stride, context < stride ? context : stride,
                                top_k, 0.0f, nullptr);
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(indexer_scores);
SQUEEZE_EMULATION_KERNEL(indexer_top_k_mask);
SQUEEZE_EMULATION_KERNEL(paged_index_scores);
SQUEEZE_EMULATION_KERNEL(paged_index_top_k);
#endif

// Paged single-query decode attention for a batch of requests, with the page-tag check of
// src/runtime/kv_cache/mod.rs `KvPool::verify` fused into the same launch (matches src/runtime/cpu/attention.rs
// `attend` over the rows `KvPool::read` decodes).
//
// Layout:
//   pages   the pool's bytes `[pool_pages, layers, page_size, row_width]` of `dtype` (kernels/kv_write.cu);
//           element e of a cached row is `kv_load` (f32, BF16, or FP8 `decode(byte) · scales[e]`).
//   scales  f32 `[row_width]`, this layer's per-element scales (read for FP8 only).
//   tags, requests, mappings: the page table as kernels/paged_common.cuh describes it.
//   q       f32 `[requests, heads, qk_dim]`; out f32 `[requests, heads, v_dim]`; faults i32 `[requests]`.
//   allowed f32 `[requests, allowed_stride]`: with allowed_stride > 0, request r attends only the keys t with
//           allowed[r · allowed_stride + t] != 0 (GLM-5's DSA top-k selection, kernels/indexer.cu
//           `paged_index_top_k`); allowed_stride 0 attends every key.
//   Key head g (query heads g·group … g·group + group − 1, group = heads / kv_heads) reads its key at row element
//   g · k_stride and its value at v_base + g · v_stride. GQA rows [K | V]: k_stride = v_stride = head_dim,
//   v_base = kv_heads · head_dim. MLA absorbed: kv_heads = 1, the key is the whole 576-wide [latent | k_pe] row
//   (qk_dim 576, the query is q_nope·W_UK concatenated with q_pe) and the value its first 512 (v_base 0).
//
// Equation: out[r, h] = Σ_t softmax_t(scale · q[r, h] · key_t) · value_t over allowed t < context, as an online softmax
// per warp, merged per block, then per request across splits (flash-decoding):
//   m = max_s m_s, out = Σ_s e^(m_s − m) · acc_s / Σ_s e^(m_s − m) · l_s.
//
// Verification: kernels/paged_common.cuh `paged_verify_split`, every mapping of the table; a split whose mappings
// are bad skips its attention.
// faults[r] = 0 when clean, else 1 + the first bad logical page; a faulted request's output is written as NaN
// (never computed); the other requests are unaffected (their blocks do not read the faulted one's data).
//
// Absorbed MLA over a BF16 or FP8 cache runs kernels/paged_mla_decode.cu instead (tensor cores); this kernel serves
// GQA, F32 caches and widths past that kernel's.
//
// Launch: `paged_decode_partial` grid (splits, kv_heads · ceil(group / 4), requests), 256 threads = 8 warps; split s
// owns logical pages [s · pages_per_split, (s + 1) · pages_per_split); a block serves up to 4 query heads of one key
// head (queries in shared memory, qk_dim ≤ 1024, v_dim ≤ 512), warp w takes keys w, w + 8, … of the split, lane l
// elements l, l + 32, … of each row. Partials `[requests, splits, heads]` (max, sum) and `[requests, splits, heads,
// v_dim]` (acc), split faults `[requests, splits]`. `paged_decode_combine` grid (heads, requests), 128 threads.
#include "paged_common.cuh"

namespace squeeze {
constexpr int kDecodeWarps = 8;
constexpr int kDecodeHeads = 4;
constexpr int kDecodeMaxQk = 1024;
constexpr int kDecodeMaxV = 512;
constexpr int kDecodeVPerLane = kDecodeMaxV / 32;
}  // namespace squeeze

extern "C" __global__ void __launch_bounds__(256)
    paged_decode_partial(const float* __restrict__ q, const unsigned char* __restrict__ pages,
                         const float* __restrict__ scales, const uint32_t* __restrict__ tags,
                         const uint32_t* __restrict__ requests, const uint32_t* __restrict__ mappings,
                         float* __restrict__ partial_max, float* __restrict__ partial_sum,
                         float* __restrict__ partial_acc, int* __restrict__ split_faults,
                         const float* __restrict__ allowed, int allowed_stride, int pool_pages, int layers,
                         int layer, int page_size, int row_width, int dtype, int heads, int kv_heads, int qk_dim,
                         int v_dim, int k_stride, int v_base, int v_stride, float scale, int pages_per_split,
                         int verify) {
    using namespace squeeze;
    __shared__ float q_shared[kDecodeHeads][kDecodeMaxQk];
    __shared__ float acc_shared[kDecodeHeads][kDecodeMaxV];
    __shared__ float warp_max[kDecodeWarps][kDecodeHeads];
    __shared__ float warp_total[kDecodeWarps][kDecodeHeads];
    __shared__ int warp_bad[kDecodeWarps];

    const int split = blockIdx.x, splits = gridDim.x, request = blockIdx.z;
    const int thread = threadIdx.x, lane = thread % 32, warp = thread / 32;
    const int group = heads / kv_heads;
    const int blocks_per_kv = (group + kDecodeHeads - 1) / kDecodeHeads;
    const int kv_head = blockIdx.y / blocks_per_kv;
    const int first_head = kv_head * group + (blockIdx.y % blocks_per_kv) * kDecodeHeads;
    const int head_count = paged_min(kDecodeHeads, kv_head * group + group - first_head);

    const PagedRequest descriptor = paged_request(requests, request);
    const int context = descriptor.context;
    const long long first_mapping = descriptor.first_mapping;

    // 1. Verify the mappings this block owns before reading through any of them.
    const int check_begin = split * pages_per_split;
    const int bad = paged_verify_split(tags, mappings, descriptor, pool_pages, page_size, split, splits,
                                       pages_per_split, verify, warp_bad);
    const long long slot = (long long)request * splits + split;
    if (blockIdx.y == 0 && thread == 0) split_faults[slot] = bad == kNoFault ? 0 : 1 + bad;
    if (bad != kNoFault) {
        paged_empty_partials(partial_max, partial_sum, partial_acc, slot * heads + first_head, head_count, v_dim);
        return;  // the whole block: `bad` is uniform
    }

    // 2. Queries of this block's heads into shared memory (rows past head_count are zero and never written out).
    for (int i = thread; i < kDecodeHeads * qk_dim; i += blockDim.x) {
        const int h = i / qk_dim, e = i % qk_dim;
        q_shared[h][e] = h < head_count ? q[((long long)request * heads + first_head + h) * qk_dim + e] : 0.0f;
    }
    __syncthreads();

    // 3. Online softmax over this split's keys, warp w taking keys w, w + 8, ….
    const int k_offset = kv_head * k_stride;
    const int v_offset = v_base + kv_head * v_stride;
    const long long row_bytes = (long long)row_width * kv_element_bytes(dtype);
    const int key_begin = check_begin * page_size;
    const int key_end = paged_min(context, (check_begin + pages_per_split) * page_size);
    float running_max[kDecodeHeads], running_sum[kDecodeHeads], acc[kDecodeHeads][kDecodeVPerLane];
#pragma unroll
    for (int h = 0; h < kDecodeHeads; ++h) {
        running_max[h] = -INFINITY;
        running_sum[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < kDecodeVPerLane; ++j) acc[h][j] = 0.0f;
    }
    for (int key = key_begin + warp; key < key_end; key += kDecodeWarps) {
        // Uniform across the warp (one key per warp): the shuffles below stay converged.
        if (allowed_stride > 0 && allowed[(long long)request * allowed_stride + key] == 0.0f) continue;
        const int logical = key / page_size, offset = key % page_size;
        const long long page = mappings[(first_mapping + logical) * kMappingWords];
        const unsigned char* row = pages + ((page * layers + layer) * page_size + offset) * row_bytes;
        float dot[kDecodeHeads];
#pragma unroll
        for (int h = 0; h < kDecodeHeads; ++h) dot[h] = 0.0f;
        for (int e = lane; e < qk_dim; e += 32) {
            const int element = k_offset + e;
            const float x = kv_load(row, element, dtype, dtype == kKvFp8 ? scales[element] : 1.0f);
#pragma unroll
            for (int h = 0; h < kDecodeHeads; ++h) dot[h] = __fadd_rn(dot[h], __fmul_rn(q_shared[h][e], x));
        }
        float correction[kDecodeHeads], weight[kDecodeHeads];
#pragma unroll
        for (int h = 0; h < kDecodeHeads; ++h) {
            const float score = __fmul_rn(paged_warp_sum(dot[h]), scale);
            const float new_max = fmaxf(running_max[h], score);
            correction[h] = expf(__fsub_rn(running_max[h], new_max));  // 0 on the warp's first key
            weight[h] = expf(__fsub_rn(score, new_max));
            running_sum[h] = __fadd_rn(__fmul_rn(running_sum[h], correction[h]), weight[h]);
            running_max[h] = new_max;
        }
#pragma unroll
        for (int j = 0; j < kDecodeVPerLane; ++j) {
            const int e = lane + 32 * j;
            if (e >= v_dim) break;
            const int element = v_offset + e;
            const float value = kv_load(row, element, dtype, dtype == kKvFp8 ? scales[element] : 1.0f);
#pragma unroll
            for (int h = 0; h < kDecodeHeads; ++h) {
                acc[h][j] = __fadd_rn(__fmul_rn(acc[h][j], correction[h]), __fmul_rn(weight[h], value));
            }
        }
    }

    // 4. Merge the warps: block max, each warp's state rescaled into shared memory in warp order (deterministic).
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < kDecodeHeads; ++h) {
            warp_max[warp][h] = running_max[h];
            warp_total[warp][h] = running_sum[h];
        }
    }
    for (int i = thread; i < kDecodeHeads * kDecodeMaxV; i += blockDim.x) acc_shared[i / kDecodeMaxV][i % kDecodeMaxV] = 0.0f;
    __syncthreads();
    float block_max[kDecodeHeads], factor[kDecodeHeads];
#pragma unroll
    for (int h = 0; h < kDecodeHeads; ++h) {
        block_max[h] = -INFINITY;
        for (int w = 0; w < kDecodeWarps; ++w) {
            if (warp_total[w][h] > 0.0f) block_max[h] = fmaxf(block_max[h], warp_max[w][h]);
        }
        factor[h] = running_sum[h] > 0.0f ? expf(__fsub_rn(running_max[h], block_max[h])) : 0.0f;
    }
    for (int w = 0; w < kDecodeWarps; ++w) {
        if (warp == w) {
#pragma unroll
            for (int h = 0; h < kDecodeHeads; ++h) {
#pragma unroll
                for (int j = 0; j < kDecodeVPerLane; ++j) {
                    const int e = lane + 32 * j;
                    if (e < v_dim) acc_shared[h][e] = __fadd_rn(acc_shared[h][e], __fmul_rn(acc[h][j], factor[h]));
                }
            }
        }
        __syncthreads();
    }
    if (thread < head_count) {
        float total = 0.0f;
        for (int w = 0; w < kDecodeWarps; ++w) {
            if (warp_total[w][thread] > 0.0f) {
                total = __fadd_rn(total, __fmul_rn(warp_total[w][thread],
                                                   expf(__fsub_rn(warp_max[w][thread], block_max[thread]))));
            }
        }
        partial_max[slot * heads + first_head + thread] = block_max[thread];
        partial_sum[slot * heads + first_head + thread] = total;
    }
    for (int i = thread; i < head_count * v_dim; i += blockDim.x) {
        partial_acc[(slot * heads + first_head + i / v_dim) * v_dim + i % v_dim] = acc_shared[i / v_dim][i % v_dim];
    }
}

extern "C" __global__ void __launch_bounds__(128)
    paged_decode_combine(const float* __restrict__ partial_max, const float* __restrict__ partial_sum,
                         const float* __restrict__ partial_acc, const int* __restrict__ split_faults,
                         int* __restrict__ faults, float* __restrict__ out, int heads, int v_dim, int splits) {
    const int head = blockIdx.x, request = blockIdx.y;
    int fault = 0;
    for (int s = 0; s < splits; ++s) {
        const int code = split_faults[(long long)request * splits + s];
        if (code != 0 && (fault == 0 || code < fault)) fault = code;
    }
    if (head == 0 && threadIdx.x == 0) faults[request] = fault;
    float* out_row = out + ((long long)request * heads + head) * v_dim;
    if (fault != 0) {
        for (int e = threadIdx.x; e < v_dim; e += blockDim.x) out_row[e] = __uint_as_float(0x7FC00000u);
        return;
    }
    float best = -INFINITY;
    for (int s = 0; s < splits; ++s) {
        const long long at = ((long long)request * splits + s) * heads + head;
        if (partial_sum[at] > 0.0f) best = fmaxf(best, partial_max[at]);
    }
    float total = 0.0f;
    for (int s = 0; s < splits; ++s) {
        const long long at = ((long long)request * splits + s) * heads + head;
        if (partial_sum[at] > 0.0f) total = __fadd_rn(total, __fmul_rn(partial_sum[at], expf(__fsub_rn(partial_max[at], best))));
    }
    const float inverse = total > 0.0f ? __fdiv_rn(1.0f, total) : 0.0f;
    for (int e = threadIdx.x; e < v_dim; e += blockDim.x) {
        float value = 0.0f;
        for (int s = 0; s < splits; ++s) {
            const long long at = ((long long)request * splits + s) * heads + head;
            if (partial_sum[at] > 0.0f) {
                value = __fadd_rn(value, __fmul_rn(partial_acc[at * v_dim + e], expf(__fsub_rn(partial_max[at], best))));
            }
        }
        out_row[e] = __fmul_rn(value, inverse);
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(paged_decode_partial);
SQUEEZE_EMULATION_KERNEL(paged_decode_combine);
#endif

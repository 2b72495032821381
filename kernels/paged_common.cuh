// What both paged decode kernels share (kernels/paged_attention.cu, kernels/paged_mla_decode.cu): the device words of
// page tags, request descriptors and block-table mappings, and the page-tag verification of one split's mappings
// (src/runtime/kv_cache/mod.rs `KvPool::verify`'s semantics).
//
// Layout:
//   tags     u32 `[pool_pages, 8]`: owner lo, owner hi, logical index, generation lo, generation hi, state
//            (bit 0 tagged, bit 1 on the free list), 0, 0.
//   requests u32 `[requests, 8]`: request id lo, id hi, context tokens, first mapping, mapping count, 0, 0, 0.
//   mappings u32 `[total, 4]`: physical page, generation lo, generation hi, 0; request r's logical page i is
//            mapping `first + i`.
//
// Verification: a mapping is bad when its page is outside the pool, on the free list, untagged, or its tag's owner,
// logical index or generation differ from the request id, the entry's index and the generation in the table; a table
// shorter than ceil(context / page_size) is bad at its first missing entry. Split s of a request checks the mappings
// of its own pages [s · pages_per_split, (s + 1) · pages_per_split) (the last split also every entry past them)
// BEFORE its block reads any row through them.
#pragma once

#include "common.cuh"

namespace squeeze {
constexpr int kTagWords = 8;
constexpr int kRequestWords = 8;
constexpr int kMappingWords = 4;
constexpr uint32_t kTagged = 1u;
constexpr uint32_t kOnFreeList = 2u;
constexpr int kNoFault = 0x7FFFFFFF;

// Whether mapping `index` of request (owner_lo, owner_hi) disagrees with its page's tag (`verify`'s checks).
__device__ __forceinline__ bool paged_mapping_bad(const uint32_t* __restrict__ tags,
                                                  const uint32_t* __restrict__ mapping, int pool_pages,
                                                  uint32_t owner_lo, uint32_t owner_hi, int index) {
    const uint32_t page = mapping[0];
    if (page >= (uint32_t)pool_pages) return true;
    const uint32_t* tag = tags + (long long)page * kTagWords;
    const uint32_t state = tag[5];
    if ((state & kOnFreeList) != 0u || (state & kTagged) == 0u) return true;
    if (tag[0] != owner_lo || tag[1] != owner_hi) return true;
    if (tag[2] != (uint32_t)index) return true;
    return tag[3] != mapping[1] || tag[4] != mapping[2];
}

__device__ __forceinline__ int paged_min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int paged_max(int a, int b) { return a > b ? a : b; }

__device__ __forceinline__ float paged_warp_sum(float value) {
    for (int offset = 16; offset > 0; offset >>= 1) value = __fadd_rn(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
    return value;
}

__device__ __forceinline__ int paged_warp_min(int value) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const int other = __shfl_xor_sync(0xFFFFFFFFu, value, offset);
        value = other < value ? other : value;
    }
    return value;
}

// One request as a block sees it: its descriptor's words.
struct PagedRequest {
    uint32_t owner_lo, owner_hi;
    int context;
    long long first_mapping;
    int mapping_count;
};

__device__ __forceinline__ PagedRequest paged_request(const uint32_t* __restrict__ requests, int request) {
    const uint32_t* descriptor = requests + (long long)request * kRequestWords;
    return PagedRequest{descriptor[0], descriptor[1], (int)descriptor[2], (long long)descriptor[3], (int)descriptor[4]};
}

// The first bad logical page among the mappings split `split` of `splits` owns (kNoFault when clean), the same in
// every thread of the block. `warp_bad` is shared scratch of blockDim.x / 32 ints. verify == 0 skips the checks:
// only the self-test's timing of the verification share uses it.
__device__ __forceinline__ int paged_verify_split(const uint32_t* __restrict__ tags,
                                                  const uint32_t* __restrict__ mappings, const PagedRequest& request,
                                                  int pool_pages, int page_size, int split, int splits,
                                                  int pages_per_split, int verify, int* warp_bad) {
    const int thread = threadIdx.x, lane = thread % 32, warp = thread / 32, warps = blockDim.x / 32;
    const int needed = (request.context + page_size - 1) / page_size;
    const int check_begin = split * pages_per_split;
    const int table_end = paged_max(request.mapping_count, needed);
    const int check_end = !verify                ? check_begin
                          : split == splits - 1 ? table_end
                                                : paged_min(table_end, check_begin + pages_per_split);
    int bad = kNoFault;
    for (int index = check_begin + thread; index < check_end; index += blockDim.x) {
        const bool missing = index >= request.mapping_count;  // only reached for index < needed: the table is short
        if (missing || paged_mapping_bad(tags, mappings + (request.first_mapping + index) * kMappingWords, pool_pages,
                                         request.owner_lo, request.owner_hi, index)) {
            bad = paged_min(bad, index);
        }
    }
    bad = paged_warp_min(bad);
    if (lane == 0) warp_bad[warp] = bad;
    __syncthreads();
    bad = kNoFault;
    for (int w = 0; w < warps; ++w) bad = paged_min(bad, warp_bad[w]);
    return bad;
}
// The partials of a split that attends nothing (its mappings are bad): max −∞, sum 0, accumulators 0 for the
// `head_count` heads from partial row `first` (request · splits + split) · heads + first head.
__device__ __forceinline__ void paged_empty_partials(float* __restrict__ partial_max, float* __restrict__ partial_sum,
                                                     float* __restrict__ partial_acc, long long first, int head_count,
                                                     int v_dim) {
    const int thread = threadIdx.x;
    for (int i = thread; i < head_count * v_dim; i += blockDim.x) partial_acc[(first + i / v_dim) * v_dim + i % v_dim] = 0.0f;
    if (thread < head_count) {
        partial_max[first + thread] = -INFINITY;
        partial_sum[first + thread] = 0.0f;
    }
}
}  // namespace squeeze

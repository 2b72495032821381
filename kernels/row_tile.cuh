// Warp helpers of the matrix-vector kernels (kernels/linear.cu, kernels/w4a16.cu): a warp owns one output feature
// and keeps the partial dot products of up to kRowTile input rows, one accumulator per row in every lane.
#pragma once

#include "common.cuh"

namespace squeeze {

// Input rows one warp handles at once (the decode batch; prefill tiles rows over grid.y).
constexpr int kRowTile = 16;
// Warps (= output features) per 256-thread block.
constexpr int kWarpsPerBlock = 8;

// One butterfly step over the first 2·kHalf accumulators: lanes with bit 2·kHalf set keep (and receive their
// partner's share of) the upper kHalf rows, the others the lower ones.
template <int kHalf>
__device__ __forceinline__ void reduce_scatter_step(float (&partial)[kRowTile], unsigned lane) {
    const bool upper = (lane & (unsigned)(2 * kHalf)) != 0u;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? partial[i] : partial[i + kHalf];
        const float keep = upper ? partial[i + kHalf] : partial[i];
        partial[i] = __fadd_rn(keep, __shfl_xor_sync(0xFFFFFFFFu, send, 2 * kHalf));
    }
}

// Sums `partial[r]` over the warp's 32 lanes for all 16 rows with 8 + 4 + 2 + 1 + 1 = 16 shuffles instead of
// 16 · 5 (a reduce-scatter butterfly). Afterwards lane l holds the full sum of row l / 2 in partial[0] (lanes 2r
// and 2r + 1 hold the same value).
__device__ __forceinline__ void warp_sum_row_tile(float (&partial)[kRowTile]) {
    static_assert(kRowTile == 16, "the butterfly below is written for 16 rows over 32 lanes");
    const unsigned lane = threadIdx.x & 31u;
    reduce_scatter_step<8>(partial, lane);
    reduce_scatter_step<4>(partial, lane);
    reduce_scatter_step<2>(partial, lane);
    reduce_scatter_step<1>(partial, lane);
    partial[0] = __fadd_rn(partial[0], __shfl_xor_sync(0xFFFFFFFFu, partial[0], 1));
}

// The row of the tile whose sum lane `lane` holds after warp_sum_row_tile.
__device__ __forceinline__ int row_tile_row(unsigned lane) { return (int)(lane >> 1); }

// partial[r] += Σ_k w[k] · x[r, column + k] over k < kWidth, for the tile's first `count` rows of `x` (row stride
// `in`), as a chain of fused multiply-adds (one rounding each; the decode case is instruction-bound on W4A16).
// `x + column` must be 16-byte aligned for every row when kWidth is a multiple of 4.
template <int kWidth>
__device__ __forceinline__ void accumulate_rows(const float* __restrict__ x, long long in, int count, long long column,
                                                const float (&w)[kWidth], float (&partial)[kRowTile]) {
#pragma unroll
    for (int r = 0; r < kRowTile; ++r) {
        if (r < count) {
            const float* row = x + r * in + column;
            float sum = partial[r];
            if constexpr (kWidth % 4 == 0) {
#pragma unroll
                for (int k = 0; k < kWidth; k += 4) {
                    const float4 v = __ldg(reinterpret_cast<const float4*>(row + k));
                    sum = __fmaf_rn(w[k], v.x, sum);
                    sum = __fmaf_rn(w[k + 1], v.y, sum);
                    sum = __fmaf_rn(w[k + 2], v.z, sum);
                    sum = __fmaf_rn(w[k + 3], v.w, sum);
                }
            } else {
#pragma unroll
                for (int k = 0; k < kWidth; ++k) sum = __fmaf_rn(w[k], __ldg(row + k), sum);
            }
            partial[r] = sum;
        }
    }
}

}  // namespace squeeze

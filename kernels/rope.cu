// Rotary position embedding in place on f32 `data[tokens, row_width]`: every row is row_width / head_dim heads;
// in each head the slice [offset, offset + rotary_dim) rotates by the angles of the token's position t (its row):
// cos/sin tables [positions, rotary_dim / 2], pair i uses c = cos[t, i], s = sin[t, i], half = rotary_dim / 2.
//   style 0 (Interleaved, DeepSeek): pair (x[2i], x[2i+1]); out[i] = x[2i]·c − x[2i+1]·s,
//                                     out[half + i] = x[2i+1]·c + x[2i]·s  (rotated evens, then rotated odds)
//   style 1 (Half, rotate-half):      pair (x[i], x[half+i]); out[i] = x[i]·c − x[half+i]·s,
//                                     out[half + i] = x[half+i]·c + x[i]·s
// Bit-identical to src/runtime/cpu/rope.rs (same products and sums, explicitly rounded, in the CPU's order).
//
// Launch: 256 threads = 8 warps, one (token, head) per warp; grid.x = ceil(tokens · heads / 8). A lane handles
// pairs lane, lane + 32, … (at most kMaxPairsPerLane of them, so rotary_dim ≤ 256): the warp reads the whole
// slice into registers before it writes any of it, so the interleaved reordering works in place.
#include "common.cuh"

namespace squeeze {
namespace rope {
constexpr int kMaxPairsPerLane = 4;
}
}  // namespace squeeze

extern "C" __global__ void __launch_bounds__(256)
    rope_f32(float* __restrict__ data, const float* __restrict__ cos_table, const float* __restrict__ sin_table,
             int tokens, int row_width, int head_dim, int offset, int rotary_dim, int style) {
    using squeeze::rope::kMaxPairsPerLane;
    const int heads = row_width / head_dim;
    const long long item = (long long)blockIdx.x * 8 + threadIdx.x / 32u;
    if (item >= (long long)tokens * heads) return;  // the whole warp leaves together
    const int token = (int)(item / heads), head = (int)(item % heads);
    const int lane = (int)(threadIdx.x & 31u), half = rotary_dim / 2;
    float* x = data + (long long)token * row_width + (long long)head * head_dim + offset;
    const float* c = cos_table + (long long)token * half;
    const float* s = sin_table + (long long)token * half;
    float first[kMaxPairsPerLane], second[kMaxPairsPerLane];
#pragma unroll
    for (int k = 0; k < kMaxPairsPerLane; ++k) {
        const int i = lane + 32 * k;
        if (i < half) {
            const float a = style == 0 ? x[2 * i] : x[i];
            const float b = style == 0 ? x[2 * i + 1] : x[half + i];
            first[k] = __fsub_rn(__fmul_rn(a, c[i]), __fmul_rn(b, s[i]));
            second[k] = __fadd_rn(__fmul_rn(b, c[i]), __fmul_rn(a, s[i]));
        }
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kMaxPairsPerLane; ++k) {
        const int i = lane + 32 * k;
        if (i < half) {
            x[i] = first[k];
            x[half + i] = second[k];
        }
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(rope_f32);
#endif

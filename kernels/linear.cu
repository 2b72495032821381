// Dense linear layers: y[rows, out] = x[rows, in] · W[out, in]ᵀ (+ bias[out]), x and y f32 row-major, W f32
// (linear_f32) or BF16 bits (linear_bf16, w = bits << 16 as f32). Matches src/runtime/cpu/linear.rs `linear` up to
// the summation order of each dot product (the CPU sums 16 strided lanes of fused multiply-adds, src/runtime/cpu/
// dots.rs; here 32 lanes × 4 or 8 then a butterfly), both with fused multiply-adds.
//
// Launch: 256 threads = 8 warps, one output feature per warp; grid.x = ceil(out / 8), grid.y = ceil(rows / 16).
// __launch_bounds__(256, 4): at most 64 registers, 4 blocks per SM, no spills.
// A warp streams its weight row once per 16-row tile with 16-byte loads (4 f32 or 8 BF16 per lane; when `in` is
// not a multiple of that, one element per lane) and keeps the 16 rows' partial sums in registers; x is read
// through the read-only cache, shared by the block's 8 warps. bias may be null.
//
// Below them: the pieces of the BF16 GEMM path for many rows (split, join, and the GEMM's reference kernel).
#include "row_tile.cuh"

namespace squeeze {
namespace linear {

template <bool kBf16>
__device__ __forceinline__ void dense_tile(const float* __restrict__ x, const void* __restrict__ weight,
                                           const float* __restrict__ bias, float* __restrict__ y, int rows, int in,
                                           int out) {
    const unsigned lane = threadIdx.x & 31u;
    const int feature = (int)(blockIdx.x * kWarpsPerBlock + threadIdx.x / 32u);
    if (feature >= out) return;  // the whole warp leaves together
    const int first_row = (int)blockIdx.y * kRowTile;
    const int count = rows - first_row < kRowTile ? rows - first_row : kRowTile;
    const float* tile = x + (long long)first_row * in;
    float partial[kRowTile];
#pragma unroll
    for (int r = 0; r < kRowTile; ++r) partial[r] = 0.0f;

    if constexpr (kBf16) {
        const uint16_t* w = static_cast<const uint16_t*>(weight) + (long long)feature * in;
        if (in % 8 == 0) {
            for (long long column = lane * 8ll; column < in; column += 32 * 8) {
                const uint4 bits = __ldg(reinterpret_cast<const uint4*>(w + column));
                const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
                float values[8];
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    values[2 * k] = __uint_as_float(words[k] << 16);
                    values[2 * k + 1] = __uint_as_float(words[k] & 0xFFFF0000u);
                }
                accumulate_rows<8>(tile, in, count, column, values, partial);
            }
        } else {
            for (long long column = lane; column < in; column += 32) {
                const float values[1] = {bf16_value(__ldg(w + column))};
                accumulate_rows<1>(tile, in, count, column, values, partial);
            }
        }
    } else {
        const float* w = static_cast<const float*>(weight) + (long long)feature * in;
        if (in % 4 == 0) {
            for (long long column = lane * 4ll; column < in; column += 32 * 4) {
                const float4 v = __ldg(reinterpret_cast<const float4*>(w + column));
                const float values[4] = {v.x, v.y, v.z, v.w};
                accumulate_rows<4>(tile, in, count, column, values, partial);
            }
        } else {
            for (long long column = lane; column < in; column += 32) {
                const float values[1] = {__ldg(w + column)};
                accumulate_rows<1>(tile, in, count, column, values, partial);
            }
        }
    }

    warp_sum_row_tile(partial);
    const int r = row_tile_row(lane);
    if ((lane & 1u) == 0u && r < count) {
        // + 0 without a bias, as the CPU does (it turns a -0 sum into +0).
        y[(long long)(first_row + r) * out + feature] = __fadd_rn(partial[0], bias ? bias[feature] : 0.0f);
    }
}

}  // namespace linear
}  // namespace squeeze

extern "C" __global__ void __launch_bounds__(256, 4)
    linear_f32(const float* __restrict__ x, const float* __restrict__ weight, const float* __restrict__ bias,
               float* __restrict__ y, int rows, int in, int out) {
    squeeze::linear::dense_tile<false>(x, weight, bias, y, rows, in, out);
}

extern "C" __global__ void __launch_bounds__(256, 4)
    linear_bf16(const float* __restrict__ x, const uint16_t* __restrict__ weight, const float* __restrict__ bias,
                float* __restrict__ y, int rows, int in, int out) {
    squeeze::linear::dense_tile<true>(x, weight, bias, y, rows, in, out);
}

// The split BF16 products (src/runtime/cuda/linear.rs `linear_bf16_gemm`, `linear_bf16_pair`): f32 activations x = hi + lo with
// hi = bf16(x) and lo = bf16(x − hi) (x − hi is exact in f32), both rounded to nearest even, so hi + lo keeps 16
// significant bits (|x − hi − lo| ≤ 2⁻¹⁸·|x|) and W·hi + W·lo stays within the CPU oracle's tolerance where one BF16
// rounding of x (2⁻⁹) would not. hi and lo are stacked as the 2·rows rows of one BF16 GEMM input, so the weight is
// read once. One thread per value: halves[e] = hi, halves[count + e] = lo. The same split of an f32 weight (FP8
// dequantized on the device) gives the weight pair W = W_hi + W_lo.
extern "C" __global__ void __launch_bounds__(256)
    split_bf16(const float* __restrict__ x, uint16_t* __restrict__ halves, long long count) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += stride) {
        const uint16_t high = squeeze::bf16_bits(x[e]);
        halves[e] = high;
        halves[count + e] = squeeze::bf16_bits(__fsub_rn(x[e], squeeze::bf16_value(high)));
    }
}

// BF16 activations (src/runtime/cuda/linear.rs `Activations::Bf16`): x rounded to BF16 once, to nearest even — the
// split's hi half alone, for the one GEMM the engines compute (2⁻⁹ relative per activation).
extern "C" __global__ void __launch_bounds__(256)
    round_bf16(const float* __restrict__ x, uint16_t* __restrict__ rounded, long long count) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += stride) {
        rounded[e] = squeeze::bf16_bits(x[e]);
    }
}

// y[r, o] = (p[r·ld + o] (+ p[second + r·ld + o] when second ≥ 0) (+ p[third + r·ld + o] when third ≥ 0)) + bias[o]
// (+ 0 without a bias, as the CPU does): the partial products of the split forms summed, for `rows` rows of `out`
// values. Layouts (src/runtime/cuda/linear.rs): x split over a BF16 weight, p [2·rows, out] (second = rows·out); a
// BF16 weight pair (hi rows then lo rows) on the matrix-vector kernel or times BF16 x, p [rows, 2·out] (second =
// out); a pair times split x, p [2·rows, 2·out] (second = 2·rows·out: x_lo·W_hi, third = out: x_hi·W_lo; x_lo·W_lo
// is left out); BF16 x over a BF16 weight with a bias, p [rows, out] (second = −1).
extern "C" __global__ void __launch_bounds__(256)
    join_products_f32(float* __restrict__ y, const float* __restrict__ p, const float* __restrict__ bias,
                      long long rows, long long out, long long ld, long long second, long long third) {
    const long long count = rows * out;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += stride) {
        const long long at = (e / out) * ld + e % out;
        float sum = second >= 0 ? __fadd_rn(p[at], p[second + at]) : p[at];
        if (third >= 0) sum = __fadd_rn(sum, p[third + at]);
        y[e] = __fadd_rn(sum, bias ? bias[e % out] : 0.0f);
    }
}

// The reference of `Device::gemm_bf16` (the emulated device, and a GPU where libcublas cannot be loaded):
// c[r, o] = Σ_k x[r, k]·w[o, k] with BF16 bits x [rows, in] and w [out, in] and f32 c [rows, out], summed in k
// order with fused multiply-adds; one thread per output value (slow, but any shape).
extern "C" __global__ void __launch_bounds__(256)
    gemm_bf16_reference(const uint16_t* __restrict__ w, const uint16_t* __restrict__ x, float* __restrict__ c, int rows,
                        int in, int out) {
    const long long count = (long long)rows * out;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += stride) {
        const long long r = e / out, o = e % out;
        float sum = 0.0f;
        for (int k = 0; k < in; ++k) {
            sum = __fmaf_rn(squeeze::bf16_value(x[r * in + k]), squeeze::bf16_value(w[o * in + k]), sum);
        }
        c[e] = sum;
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(linear_f32);
SQUEEZE_EMULATION_KERNEL(linear_bf16);
SQUEEZE_EMULATION_KERNEL(split_bf16);
SQUEEZE_EMULATION_KERNEL(round_bf16);
SQUEEZE_EMULATION_KERNEL(join_products_f32);
SQUEEZE_EMULATION_KERNEL(gemm_bf16_reference);
#endif

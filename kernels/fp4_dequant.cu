// FP4 (E2M1) dequantization: compressed-tensors NVFP4 and MXFP4 packed weights to f32.
//
// Layout (row-major): packed u8 [rows, columns / 2], the even element in the low nibble; NVFP4: scales e4m3 u8
// [rows, columns / 16] and one f32 global scale (a divisor); MXFP4: scales E8M0 u8 [rows, columns / 32].
// Equations: NVFP4 w[i][j] = e2m1(q) · (e4m3(s[i][j / 16]) / global); MXFP4 w[i][j] = e2m1(q) · 2^(s[i][j / 32] − 127)
// (exponent 0 is the subnormal 2^−127). Matches src/quant/fp4/mod.rs `nvfp4_dequantize_row` / `mxfp4_dequantize_row`
// bit for bit: the group's step is one correctly rounded division, then one product.
// Index legend: e = flat element index, i = row, j = column.
#include "common.cuh"

namespace squeeze {

// The E2M1 value of a 4-bit code (bit 3 the sign; 0, 0.5, 1, 1.5, 2, 3, 4, 6 by magnitude index m), built from the
// f32 bits without a table in local memory: exponent 126 + m / 2, the half mantissa bit for odd m ≥ 3.
__device__ __forceinline__ float e2m1_decode(uint32_t code) {
    const uint32_t m = code & 7u;
    const uint32_t magnitude = m == 0u ? 0u : ((126u + (m >> 1)) << 23) | ((m > 1u ? (m & 1u) : 0u) << 22);
    return __uint_as_float(magnitude | ((code & 8u) << 28));
}

// Element e's 4-bit code.
__device__ __forceinline__ uint32_t fp4_code(const uint8_t* __restrict__ packed, long long e) {
    const uint32_t byte = packed[e >> 1];
    return (e & 1) ? (byte >> 4) : (byte & 15u);
}

// 2^(exponent − 127) from the bits (exponent 0: 2^−127, a subnormal).
__device__ __forceinline__ float e8m0_scale(uint32_t exponent) {
    return __uint_as_float(exponent == 0 ? (1u << 22) : (exponent << 23));
}

}  // namespace squeeze

// One thread per element, grid-stride loop.
extern "C" __global__ void nvfp4_dequant_f32(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scales,
                                             float global, float* __restrict__ out, long long rows,
                                             long long columns) {
    const long long total = rows * columns;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long i = e / columns;
        const long long j = e - i * columns;
        const float step = __fdiv_rn(squeeze::e4m3_decode(scales[i * (columns / 16) + j / 16]), global);
        out[e] = __fmul_rn(squeeze::e2m1_decode(squeeze::fp4_code(packed, e)), step);
    }
}

extern "C" __global__ void mxfp4_dequant_f32(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scales,
                                             float* __restrict__ out, long long rows, long long columns) {
    const long long total = rows * columns;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long i = e / columns;
        const long long j = e - i * columns;
        const float scale = squeeze::e8m0_scale(scales[i * (columns / 32) + j / 32]);
        out[e] = __fmul_rn(squeeze::e2m1_decode(squeeze::fp4_code(packed, e)), scale);
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(nvfp4_dequant_f32);
SQUEEZE_EMULATION_KERNEL(mxfp4_dequant_f32);
#endif

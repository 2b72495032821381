// Row normalizations in place over f32 `data[rows, width]`, one 256-thread block per row (grid.x = rows):
//   rms_norm_f32:   x ← w · (x · 1 / sqrt(Σx² / width + eps))
//   layer_norm_f32: μ = Σx / width, var = Σ(x − μ)² / width, x ← (x − μ) · 1 / sqrt(var + eps) · w + b
// Matches src/runtime/cpu/norm.rs operation for operation (explicitly rounded, no FMA) except the order of the
// sums: the CPU adds left to right, here each thread sums a strided slice, then the warp and the block reduce.
#include "common.cuh"

namespace squeeze {
namespace norm {

// The sum of `value` over the block (256 threads), returned to every thread.
__device__ __forceinline__ float block_sum(float value) {
    __shared__ float warp_sums[8];
    __shared__ float total;
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32u;
#pragma unroll
    for (int mask = 16; mask >= 1; mask /= 2) value = __fadd_rn(value, __shfl_xor_sync(0xFFFFFFFFu, value, mask));
    if (lane == 0u) warp_sums[warp] = value;
    __syncthreads();
    if (warp == 0u) {
        float sum = lane < blockDim.x / 32u ? warp_sums[lane] : 0.0f;
#pragma unroll
        for (int mask = 4; mask >= 1; mask /= 2) sum = __fadd_rn(sum, __shfl_xor_sync(0xFFFFFFFFu, sum, mask));
        if (lane == 0u) total = sum;
    }
    __syncthreads();
    const float result = total;
    __syncthreads();  // warp_sums and total are reused by the next call
    return result;
}

}  // namespace norm
}  // namespace squeeze

extern "C" __global__ void __launch_bounds__(256)
    rms_norm_f32(float* __restrict__ data, const float* __restrict__ weight, int width, float eps) {
    float* row = data + (long long)blockIdx.x * width;
    float squares = 0.0f;
    for (int i = (int)threadIdx.x; i < width; i += (int)blockDim.x)
        squares = __fadd_rn(squares, __fmul_rn(row[i], row[i]));
    const float mean_square = __fdiv_rn(squeeze::norm::block_sum(squares), (float)width);
    const float inverse = __fdiv_rn(1.0f, sqrtf(__fadd_rn(mean_square, eps)));
    for (int i = (int)threadIdx.x; i < width; i += (int)blockDim.x)
        row[i] = __fmul_rn(weight[i], __fmul_rn(row[i], inverse));
}

extern "C" __global__ void __launch_bounds__(256)
    layer_norm_f32(float* __restrict__ data, const float* __restrict__ weight, const float* __restrict__ bias,
                   int width, float eps) {
    float* row = data + (long long)blockIdx.x * width;
    float sum = 0.0f;
    for (int i = (int)threadIdx.x; i < width; i += (int)blockDim.x) sum = __fadd_rn(sum, row[i]);
    const float mean = __fdiv_rn(squeeze::norm::block_sum(sum), (float)width);
    float squares = 0.0f;
    for (int i = (int)threadIdx.x; i < width; i += (int)blockDim.x) {
        const float centered = __fsub_rn(row[i], mean);
        squares = __fadd_rn(squares, __fmul_rn(centered, centered));
    }
    const float variance = __fdiv_rn(squeeze::norm::block_sum(squares), (float)width);
    const float inverse = __fdiv_rn(1.0f, sqrtf(__fadd_rn(variance, eps)));
    for (int i = (int)threadIdx.x; i < width; i += (int)blockDim.x)
        row[i] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(row[i], mean), inverse), weight[i]), bias[i]);
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(rms_norm_f32);
SQUEEZE_EMULATION_KERNEL(layer_norm_f32);
#endif

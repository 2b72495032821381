// FP8 block dequantization: block-scaled e4m3fn weights to f32 or BF16.
//
// Layout (row-major): codes u8 [rows, columns] (a slice of the tensor starting at absolute row `first_row`);
// block_scales f32 [ceil(total_rows / block_rows), ceil(columns / block_columns)] for the whole tensor;
// out f32 or BF16 bits [rows, columns].
// Equation: w[i][j] = e4m3(codes[i][j]) · block_scales[(first_row + i) / block_rows][j / block_columns]
// (a multiplier despite the checkpoint name `weight_scale_inv`); edge blocks are partial. Matches
// src/quant/fp8_block.rs `dequantize_row` bit for bit (NaN codes give NaN).
// Index legend: e = flat element index in the slice, i = row, j = column.
#include "common.cuh"

namespace squeeze {

__device__ __forceinline__ float fp8_block_value(const uint8_t* __restrict__ codes, const float* __restrict__ block_scales,
                                                 long long e, long long columns, long long first_row, int block_rows,
                                                 int block_columns) {
    const long long i = e / columns;
    const long long j = e - i * columns;
    const long long scale_columns = (columns + block_columns - 1) / block_columns;
    const float scale = block_scales[((first_row + i) / block_rows) * scale_columns + j / block_columns];
    return __fmul_rn(e4m3_decode(codes[e]), scale);
}

}  // namespace squeeze

// One thread per element, grid-stride loop.
extern "C" __global__ void fp8_block_dequant_f32(const uint8_t* __restrict__ codes,
                                                 const float* __restrict__ block_scales, float* __restrict__ out,
                                                 long long rows, long long columns, long long first_row,
                                                 int block_rows, int block_columns) {
    const long long total = rows * columns;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        out[e] = squeeze::fp8_block_value(codes, block_scales, e, columns, first_row, block_rows, block_columns);
    }
}

// Same as fp8_block_dequant_f32, rounded to BF16 (what the quantize path writes for tensors kept in BF16).
extern "C" __global__ void fp8_block_dequant_bf16(const uint8_t* __restrict__ codes,
                                                  const float* __restrict__ block_scales, uint16_t* __restrict__ out,
                                                  long long rows, long long columns, long long first_row,
                                                  int block_rows, int block_columns) {
    const long long total = rows * columns;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        out[e] = squeeze::bf16_bits(
            squeeze::fp8_block_value(codes, block_scales, e, columns, first_row, block_rows, block_columns));
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(fp8_block_dequant_f32);
SQUEEZE_EMULATION_KERNEL(fp8_block_dequant_bf16);
#endif

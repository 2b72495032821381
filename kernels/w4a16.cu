// INT4 W4A16 linear layers reading compressed-tensors `pack-quantized` tensors directly:
//   weight_packed u32 [out, in / 8]: element j of a row is nibble j % 8 (bits 4·(j % 8)) of word j / 8, holding q + 8;
//   weight_scale BF16 bits [out, in / group_size];  w[o, j] = q · scale[o, j / group_size]  (exact in f32);
//   y[rows, out] = x[rows, in] · Wᵀ (+ bias[out]), x and y f32 row-major.
// Matches src/runtime/cpu/linear.rs `linear` on the dequantized matrix (src/quant/int4.rs `dequantize_row`) up to
// the summation order (and fused multiply-adds): the weights themselves are the CPU's bit
// for bit. group_size is a multiple of 8 (a word never straddles two groups) and divides `in`; the Rust wrappers
// check both.
//
// w4a16_linear: 256 threads = 8 warps, one output feature per warp; grid.x = ceil(out / 8),
// grid.y = ceil(rows / 16).
// A lane loads 4 words (32 weights) with one 16-byte load when in is a multiple of 32, else one word, unpacks them
// once and applies them to the tile's up to 16 rows (partial sums in registers).
// w4a16_grouped (MoE experts, all of a batch in one launch): packed [experts, out, in / 8], scales
// [experts, out, in / group_size]; x rows sorted by expert; segment s covers rows segment_start[s] ..
// segment_start[s + 1] and uses expert segment_expert[s]; grid.x = ceil(out / 32), grid.y = segments: 4 features per
// warp, x staged in shared memory (below). A segment naming an expert out of range, or a row range outside
// [0, rows], writes NaN to the rows it can name (a visible fault).
// w4a16_linear: __launch_bounds__(256, 4): at most 64 registers (ptxas spills 8 bytes), 4 blocks per SM;
// w4a16_grouped: (256, 2), its 32 partial sums per lane in registers.
#include "row_tile.cuh"

namespace squeeze {
namespace w4a16 {

// The 8 weights of one packed word, all in one group of scale `scale`. Nibble u becomes the float 2^23 + u by
// OR-ing it into the mantissa of 2^23 (no integer-to-float conversion), minus 2^23 + 8 gives q exactly, and
// q · scale is exact (4-bit times 8-bit significands), so w equals the CPU's dequantized value bit for bit.
__device__ __forceinline__ void unpack_word(uint32_t word, float scale, float (&values)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const float biased = __uint_as_float(0x4B000000u | ((word >> (4 * k)) & 0xFu));
        values[k] = __fmul_rn(__fsub_rn(biased, 8388616.0f), scale);
    }
}

// Rows [first_row, first_row + count) of x against output feature `feature` of one weight matrix; writes y rows.
__device__ __forceinline__ void feature_tile(const float* __restrict__ x, const uint32_t* __restrict__ packed_row,
                                             const uint16_t* __restrict__ scale_row, float bias, float* __restrict__ y,
                                             int first_row, int count, int in, int out, int feature, int group_size) {
    const unsigned lane = threadIdx.x & 31u;
    const int words = in / 8;
    const int words_per_group = group_size / 8;
    const bool same_group = words_per_group % 4 == 0;
    const float* tile = x + (long long)first_row * in;
    float partial[kRowTile];
#pragma unroll
    for (int r = 0; r < kRowTile; ++r) partial[r] = 0.0f;

    if (words % 4 == 0) {
        for (int word = (int)lane * 4; word < words; word += 32 * 4) {
            const uint4 quad = __ldg(reinterpret_cast<const uint4*>(packed_row + word));
            // One scale for the 4 words when groups are multiples of 32 (the usual 32/128), else one per word.
            const float shared_scale = bf16_value(__ldg(scale_row + word / words_per_group));
            // Not unrolled: one word's 8 weights and x values live at a time (unrolling spills at 64 registers).
#pragma unroll 1
            for (int k = 0; k < 4; ++k) {
                const uint32_t bits = k == 0 ? quad.x : k == 1 ? quad.y : k == 2 ? quad.z : quad.w;
                const float scale =
                    same_group ? shared_scale : bf16_value(__ldg(scale_row + (word + k) / words_per_group));
                float values[8];
                unpack_word(bits, scale, values);
                accumulate_rows<8>(tile, in, count, (long long)(word + k) * 8, values, partial);
            }
        }
    } else {
        for (int word = (int)lane; word < words; word += 32) {
            float values[8];
            unpack_word(__ldg(packed_row + word), bf16_value(__ldg(scale_row + word / words_per_group)), values);
            accumulate_rows<8>(tile, in, count, (long long)word * 8, values, partial);
        }
    }

    warp_sum_row_tile(partial);
    const int r = row_tile_row(lane);
    if ((lane & 1u) == 0u && r < count) y[(long long)(first_row + r) * out + feature] = __fadd_rn(partial[0], bias);
}

}  // namespace w4a16
}  // namespace squeeze

extern "C" __global__ void __launch_bounds__(256, 4)
    w4a16_linear(const float* __restrict__ x, const uint32_t* __restrict__ packed, const uint16_t* __restrict__ scales,
                 const float* __restrict__ bias, float* __restrict__ y, int rows, int in, int out, int group_size) {
    const int feature = (int)(blockIdx.x * squeeze::kWarpsPerBlock + threadIdx.x / 32u);
    if (feature >= out) return;
    const int first_row = (int)blockIdx.y * squeeze::kRowTile;
    const int count = rows - first_row < squeeze::kRowTile ? rows - first_row : squeeze::kRowTile;
    squeeze::w4a16::feature_tile(x, packed + (long long)feature * (in / 8),
                                 scales + (long long)feature * (in / group_size), bias ? bias[feature] : 0.0f, y,
                                 first_row, count, in, out, feature, group_size);
}

namespace squeeze {
namespace w4a16 {

// The grouped kernel's tile: kStagedFeatures output features per warp (32 per block of 8 warps), kStagedRows rows,
// the input walked in chunks of kChunkColumns staged in shared memory once per block.
constexpr int kStagedFeatures = 4;
constexpr int kStagedRows = 8;
constexpr int kChunkColumns = 1024;
// A lane's share of a chunk: 32 columns (4 words, one 16-byte load per feature).
constexpr int kLaneColumns = kChunkColumns / 32;
// Staged x: column c of a chunk (lane c / 32, step c % 32) of row r at r·kRowStride + (c % 32)·33 + c / 32, so the
// 32 lanes of one step read 32 banks and the staging writes of 32 consecutive columns do too.
constexpr int kRowStride = kLaneColumns * 33;

// Sums v[i] over the warp for all 32 i with 16 + 8 + 4 + 2 + 1 shuffles (a reduce-scatter butterfly): afterwards
// lane l holds the sum of v[l] in v[0].
template <int kHalf>
__device__ __forceinline__ void scatter_step(float (&v)[32], unsigned lane) {
    const bool upper = (lane & (unsigned)kHalf) != 0u;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = __fadd_rn(keep, __shfl_xor_sync(0xFFFFFFFFu, send, kHalf));
    }
}

__device__ __forceinline__ void warp_sum_32(float (&v)[32], unsigned lane) {
    scatter_step<16>(v, lane);
    scatter_step<8>(v, lane);
    scatter_step<4>(v, lane);
    scatter_step<2>(v, lane);
    scatter_step<1>(v, lane);
}

}  // namespace w4a16
}  // namespace squeeze

// w4a16_grouped: one block per (32 output features, segment); the segment's rows in tiles of kStagedRows. Per
// chunk of 1024 input columns the block stages the tile's x rows in shared memory (each x value read once per
// block, not once per feature), then each warp reads its 4 features' packed words with one 16-byte load per lane
// and feature (512 contiguous bytes per warp; the lane's 32 columns share one scale when the group is a multiple
// of 32) and multiplies them into 8 × 4 partial sums per lane, summed over the warp at the tile's end.
extern "C" __global__ void __launch_bounds__(256, 2)
    w4a16_grouped(const float* __restrict__ x, const uint32_t* __restrict__ packed,
                  const uint16_t* __restrict__ scales, const int* __restrict__ segment_expert,
                  const int* __restrict__ segment_start, float* __restrict__ y, int rows, int experts, int in, int out,
                  int group_size) {
    using namespace squeeze;
    using namespace squeeze::w4a16;
    __shared__ float staged[kStagedRows * kRowStride];
    const unsigned lane = threadIdx.x & 31u;
    const int first_feature = (int)blockIdx.x * 32 + (int)(threadIdx.x / 32u) * kStagedFeatures;
    const int segment = (int)blockIdx.y;
    const int expert = segment_expert[segment];
    int start = segment_start[segment];
    int end = segment_start[segment + 1];
    const bool valid = expert >= 0 && expert < experts && start >= 0 && start <= end && end <= rows;
    if (!valid) {
        start = start < 0 ? 0 : start;
        end = end > rows ? rows : end;
        for (int f = 0; f < kStagedFeatures; ++f) {
            const int feature = first_feature + f;
            if (lane == 0u && feature < out)
                for (int row = start; row < end; ++row) y[(long long)row * out + feature] = __uint_as_float(0x7FC00000u);
        }
        return;
    }
    const int words = in / 8;
    const int groups = in / group_size;
    const bool wide = in % 32 == 0;
    for (int tile = start; tile < end; tile += kStagedRows) {
        const int count = end - tile < kStagedRows ? end - tile : kStagedRows;
        float partial[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) partial[i] = 0.0f;
        for (int chunk = 0; chunk < in; chunk += kChunkColumns) {
            const int width = in - chunk < kChunkColumns ? in - chunk : kChunkColumns;
            __syncthreads();  // the previous chunk's reads are done
            for (int e = (int)threadIdx.x; e < count * kChunkColumns; e += (int)blockDim.x) {
                const int r = e / kChunkColumns, c = e % kChunkColumns;
                staged[r * kRowStride + (c % 32) * 33 + c / 32] =
                    c < width ? x[(long long)(tile + r) * in + chunk + c] : 0.0f;
            }
            __syncthreads();
            const int first_word = chunk / 8 + (int)lane * 4;
#pragma unroll
            for (int f = 0; f < kStagedFeatures; ++f) {
                const int feature = first_feature + f;
                if (feature >= out) continue;
                const long long matrix = (long long)expert * out + feature;
                const uint32_t* packed_row = packed + matrix * words;
                const uint16_t* scale_row = scales + matrix * groups;
                uint4 quad = make_uint4(0u, 0u, 0u, 0u);
                if (wide && first_word < words) {
                    quad = __ldg(reinterpret_cast<const uint4*>(packed_row + first_word));
                } else if (first_word < words) {
                    const int left = words - first_word;
                    quad.x = __ldg(packed_row + first_word);
                    if (left > 1) quad.y = __ldg(packed_row + first_word + 1);
                    if (left > 2) quad.z = __ldg(packed_row + first_word + 2);
                    if (left > 3) quad.w = __ldg(packed_row + first_word + 3);
                }
#pragma unroll 1
                for (int k = 0; k < 4; ++k) {
                    const int word = first_word + k;
                    if (word >= words) break;
                    float values[8];
                    const uint32_t bits = k == 0 ? quad.x : k == 1 ? quad.y : k == 2 ? quad.z : quad.w;
                    unpack_word(bits, bf16_value(__ldg(scale_row + word * 8 / group_size)), values);
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const float* column = staged + (k * 8 + j) * 33 + lane;
#pragma unroll
                        for (int r = 0; r < kStagedRows; ++r)
                            if (r < count)
                                partial[r * kStagedFeatures + f] =
                                    __fmaf_rn(values[j], column[r * kRowStride], partial[r * kStagedFeatures + f]);
                    }
                }
            }
        }
        warp_sum_32(partial, lane);
        const int r = (int)lane / kStagedFeatures, feature = first_feature + (int)lane % kStagedFeatures;
        if (r < count && feature < out) y[(long long)(tile + r) * out + feature] = partial[0];
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(w4a16_linear);
SQUEEZE_EMULATION_KERNEL(w4a16_grouped);
#endif

// INT4 group quantization with compressed-tensors `pack-quantized` packing, fused with the FP8 block dequant.
//
// Layout (row-major): the source is either FP8 codes u8 [rows, columns] with f32 block scales (see fp8_dequant.cu;
// `first_row` is the slice's absolute first row) or f32 values [rows, columns]. Outputs: packed u32
// [rows, columns / 8] and scales BF16 bits [rows, columns / group_size]. `columns % group_size == 0` and
// `group_size % 8 == 0`, so a group never straddles a row or a word and group g's words are g·group_size/8 onward.
// One thread quantizes one group (groups are independent), keeping the group in registers when its size is a
// compile-time constant (kernels *_g32/_g64) and re-reading it through L1 otherwise (*_gany;
// a 128-value group in registers needs ~160 registers, one block per SM, so larger groups take that path).
//
// Scale equations (src/quant/int4.rs, all f32, BF16 as stored, zero → f32::EPSILON before rounding):
//   ct-minmax: s = bf16(absmax / 7.5), q = clamp(rne(w / s), -8, 7)
//   absmax7:   s = bf16(absmax / 7),   q = clamp(rne(w / s), -7, 7)
//   mse:       for step in 0..max(steps, 1): p = 1 - step / grid, c = bf16(p · absmax / 7.5),
//              E(c) = Σ_j |w_j - clamp(rne(w_j / c), -8, 7) · c|^norm summed in 8 lanes (j % 8); the first c with the
//              smallest E wins (strict <); then q as ct-minmax with s = c. |x|^2.4 from basic ops (abs_pow_2_4).
// Packing: u = q + 8, element j of a row in bits 4·(j % 8) of word j / 8.
// Index legend: g = flat group index, e = flat element index, j = column, w = group values.
#include "common.cuh"
#include "int4_scale.cuh"

namespace squeeze {

// FP8 rows with block scales.
struct Fp8Rows {
    const uint8_t* __restrict__ codes;
    const float* __restrict__ block_scales;
    long long columns;
    long long first_row;
    int block_rows;
    int block_columns;

    __device__ __forceinline__ const float* scale_row(long long e) const {
        const long long scale_columns = (columns + block_columns - 1) / block_columns;
        return block_scales + ((first_row + e / columns) / block_rows) * scale_columns;
    }

    // Element e, on its own (the generic path).
    __device__ __forceinline__ float value(long long e) const {
        const long long j = e % columns;
        return __fmul_rn(e4m3_decode(codes[e]), scale_row(e)[j / block_columns]);
    }

    // N values from e0 (N % 16 == 0, e0 % 16 == 0), with 16-byte loads.
    template <int N>
    __device__ __forceinline__ void load(long long e0, float* out) const {
        const float* scales = scale_row(e0);
        const long long j0 = e0 % columns;
        long long block = j0 / block_columns;
        long long boundary = (block + 1) * block_columns;
        float scale = scales[block];
#pragma unroll
        for (int c = 0; c < N; c += 16) {
            const uint4 chunk = *reinterpret_cast<const uint4*>(codes + e0 + c);
            const uint32_t words[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
            for (int k = 0; k < 16; ++k) {
                if (j0 + c + k == boundary) {
                    block += 1;
                    boundary += block_columns;
                    scale = scales[block];
                }
                out[c + k] = __fmul_rn(e4m3_decode((words[k / 4] >> (8 * (k % 4))) & 0xFFu), scale);
            }
        }
    }
};

// f32 rows (BF16/F16/F32 sources widened on the host, and the self-test).
struct F32Rows {
    const float* __restrict__ values;

    __device__ __forceinline__ float value(long long e) const { return values[e]; }

    template <int N>
    __device__ __forceinline__ void load(long long e0, float* out) const {
#pragma unroll
        for (int c = 0; c < N; c += 4) {
            const float4 chunk = *reinterpret_cast<const float4*>(values + e0 + c);
            out[c] = chunk.x;
            out[c + 1] = chunk.y;
            out[c + 2] = chunk.z;
            out[c + 3] = chunk.w;
        }
    }
};

// A group held in registers.
template <int N>
struct RegisterGroup {
    float w[N];
    __device__ __forceinline__ float operator()(int j) const { return w[j]; }
    static constexpr bool kFixed = true;
};

// A group read from the source on every pass.
template <class Source>
struct SourceGroup {
    const Source* source;
    long long e0;
    __device__ __forceinline__ float operator()(int j) const { return source->value(e0 + j); }
    static constexpr bool kFixed = false;
};

// Quantizes and packs one group into its n / 8 words.
template <int N, class Group>
__device__ __forceinline__ void pack_group(const Group& w, int n, float s, float q_min, uint32_t* __restrict__ words) {
    if constexpr (N > 0 && N % 32 == 0) {
#pragma unroll
        for (int word = 0; word < N / 8; word += 4) {
            uint32_t packed[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                packed[k] = 0u;
#pragma unroll
                for (int p = 0; p < 8; ++p) packed[k] |= int4_nibble(int4_code(w(8 * (word + k) + p), s, q_min), p);
            }
            *reinterpret_cast<uint4*>(words + word) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        }
    } else {
        for (int word = 0; word < n / 8; ++word) {
            uint32_t packed = 0u;
#pragma unroll
            for (int p = 0; p < 8; ++p) packed |= int4_nibble(int4_code(w(8 * word + p), s, q_min), p);
            words[word] = packed;
        }
    }
}

// One thread per group; N is the compile-time group size or 0 for `group_size` at run time.
template <int N, class Source>
__device__ __forceinline__ void quantize_groups(const Source& source, uint32_t* __restrict__ packed,
                                                uint16_t* __restrict__ scales, long long groups, int group_size,
                                                int rule, int mse_steps, int mse_grid, float mse_norm) {
    const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= groups) return;
    const int n = N > 0 ? N : group_size;
    float q_min;
    uint16_t scale;
    if constexpr (N > 0) {
        RegisterGroup<N> w;
        source.template load<N>(g * N, w.w);
        scale = choose_scale<N>(w, n, rule, mse_steps, mse_grid, mse_norm, &q_min);
        pack_group<N>(w, n, bf16_value(scale), q_min, packed + g * (N / 8));
    } else {
        const SourceGroup<Source> w{&source, g * group_size};
        scale = choose_scale<0>(w, n, rule, mse_steps, mse_grid, mse_norm, &q_min);
        pack_group<0>(w, n, bf16_value(scale), q_min, packed + g * (group_size / 8));
    }
    scales[g] = scale;
}

}  // namespace squeeze

#define SQUEEZE_INT4_FP8_KERNEL(NAME, N)                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                                \
        NAME(const uint8_t* __restrict__ codes, const float* __restrict__ block_scales,                              \
             uint32_t* __restrict__ packed, uint16_t* __restrict__ scales, long long rows, long long columns,         \
             long long first_row, int group_size, int block_rows, int block_columns, int rule, int mse_steps,         \
             int mse_grid, float mse_norm) {                                                                         \
        const squeeze::Fp8Rows source{codes, block_scales, columns, first_row, block_rows, block_columns};           \
        squeeze::quantize_groups<N>(source, packed, scales, rows * columns / group_size, group_size, rule,           \
                                    mse_steps, mse_grid, mse_norm);                                                  \
    }

#define SQUEEZE_INT4_F32_KERNEL(NAME, N)                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                                \
        NAME(const float* __restrict__ values, uint32_t* __restrict__ packed, uint16_t* __restrict__ scales,          \
             long long rows, long long columns, int group_size, int rule, int mse_steps, int mse_grid,                \
             float mse_norm) {                                                                                       \
        const squeeze::F32Rows source{values};                                                                       \
        squeeze::quantize_groups<N>(source, packed, scales, rows * columns / group_size, group_size, rule,           \
                                    mse_steps, mse_grid, mse_norm);                                                  \
    }

SQUEEZE_INT4_FP8_KERNEL(int4_quantize_fp8_g32, 32)
SQUEEZE_INT4_FP8_KERNEL(int4_quantize_fp8_g64, 64)
SQUEEZE_INT4_FP8_KERNEL(int4_quantize_fp8_gany, 0)
SQUEEZE_INT4_F32_KERNEL(int4_quantize_f32_g32, 32)
SQUEEZE_INT4_F32_KERNEL(int4_quantize_f32_g64, 64)
SQUEEZE_INT4_F32_KERNEL(int4_quantize_f32_gany, 0)

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(int4_quantize_fp8_g32);
SQUEEZE_EMULATION_KERNEL(int4_quantize_fp8_g64);
SQUEEZE_EMULATION_KERNEL(int4_quantize_fp8_gany);
SQUEEZE_EMULATION_KERNEL(int4_quantize_f32_g32);
SQUEEZE_EMULATION_KERNEL(int4_quantize_f32_g64);
SQUEEZE_EMULATION_KERNEL(int4_quantize_f32_gany);
#endif

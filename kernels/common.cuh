// Shared device helpers for squeeze's kernels: the FP8 e4m3fn decoder, BF16 rounding, INT4 rounding and packing.
//
// Every helper reproduces the CPU reference in src/quant/ bit for bit: each float operation is an explicitly
// rounded intrinsic (__fmul_rn, __fdiv_rn, __fadd_rn, __fsub_rn) so the compiler cannot contract a product and a
// sum into one FMA, rintf rounds half to even, and NaN/zero corner cases follow Rust's semantics (`NaN as i8 == 0`,
// `f32::max` ignores NaN, `f32::clamp` keeps NaN).
//
// Layouts and equations:
//   e4m3fn byte: s eeee mmm, bias 7, no infinities, 0x7F/0xFF NaN; subnormal = m · 2^-9.
//   BF16: the upper 16 bits of an f32, rounded to nearest even (the `half` crate's `bf16::from_f32`).
//   INT4: q = clamp(rne(w / scale), q_min, 7); packed u = q + 8, element j of a row in bits 4·(j%8) of word j/8.
#pragma once

#ifdef SQUEEZE_EMULATION
#include "emulation/cuda_emulation.h"
#else
#include <stdint.h>
#endif

namespace squeeze {

// Rules for choosing an INT4 group scale; the numbers are the launch parameter `rule`.
enum ScaleRule : int { kCtMinmax = 0, kAbsmax7 = 1, kMse = 2 };

// float32 machine epsilon: compressed-tensors replaces a zero group scale by it.
constexpr float kZeroGroupScale = 1.1920929e-07f;

// The value of an e4m3fn byte (src/quant/fp8.rs `decode`). NaN codes decode to the positive quiet NaN 0x7FC00000
// whatever their sign, as Rust's `f32::NAN`.
__device__ __forceinline__ float e4m3_decode(uint32_t code) {
    const uint32_t sign = (code & 0x80u) << 24;
    const uint32_t exponent = (code >> 3) & 0x0Fu;
    const uint32_t mantissa = code & 0x07u;
    if (exponent == 0x0Fu && mantissa == 0x07u) return __uint_as_float(0x7FC00000u);
    if (exponent == 0u) {
        // mantissa · 2^-9 is exact; the sign is applied after, so 0x80 decodes to -0.0.
        const float magnitude = __fmul_rn((float)mantissa, 0.001953125f);
        return sign ? -magnitude : magnitude;
    }
    return __uint_as_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// BF16 bits of an f32: round to nearest even; NaN keeps its high bits and sets the quiet bit.
__device__ __forceinline__ uint16_t bf16_bits(float value) {
    const uint32_t x = __float_as_uint(value);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040u);
    const uint32_t round_bit = 0x00008000u;
    if ((x & round_bit) != 0u && (x & (3u * round_bit - 1u)) != 0u) return (uint16_t)((x >> 16) + 1u);
    return (uint16_t)(x >> 16);
}

__device__ __forceinline__ float bf16_value(uint16_t bits) { return __uint_as_float((uint32_t)bits << 16); }

// A candidate scale as stored: zero (or NaN) becomes kZeroGroupScale, then BF16 rounding.
__device__ __forceinline__ uint16_t stored_scale(float scale) {
    return bf16_bits(scale > 0.0f ? scale : kZeroGroupScale);
}

// `(w / scale).round_ties_even().clamp(q_min, 7.0)` as a float: NaN stays NaN like Rust's `f32::clamp`.
__device__ __forceinline__ float int4_level(float w, float scale, float q_min) {
    float r = rintf(__fdiv_rn(w, scale));
    if (r < q_min) r = q_min;
    if (r > 7.0f) r = 7.0f;
    return r;
}

// The stored INT4 code of `w`: the level as an integer, NaN → 0 as Rust's saturating `as i8`.
__device__ __forceinline__ int int4_code(float w, float scale, float q_min) {
    const float level = int4_level(w, scale, q_min);
    return level != level ? 0 : (int)level;
}

// The nibble of code q (in [-8, 7]) at position `position` (0..8) of its word.
__device__ __forceinline__ uint32_t int4_nibble(int q, int position) {
    return ((uint32_t)(q + 8) & 0xFu) << (4 * position);
}

// ---- KV cache element codecs (kernels/kv_write.cu, kernels/paged_attention.cu; src/runtime/kv_cache/storage.rs) ----

// How cached KV elements are stored; the numbers are the launch parameter `dtype` (Rust `KvDtype`).
enum KvElement : int { kKvF32 = 0, kKvBf16 = 1, kKvFp8 = 2 };

// Bytes of one cached element of `dtype`.
__device__ __forceinline__ int kv_element_bytes(int dtype) { return dtype == kKvF32 ? 4 : dtype == kKvBf16 ? 2 : 1; }

// The e4m3fn byte of `value` (src/quant/fp8.rs `encode`): round to nearest even, magnitudes >= 448 and infinities
// saturate to ±448 (0x7E), NaN becomes 0x7F with the input's sign bit, subnormals round onto the 2^-9 grid.
__device__ __forceinline__ uint32_t e4m3_encode(float value) {
    const uint32_t bits = __float_as_uint(value);
    const uint32_t sign = (bits >> 24) & 0x80u;
    if (value != value) return sign | 0x7Fu;
    const float magnitude = fabsf(value);
    if (magnitude >= 448.0f) return sign | 0x7Eu;
    if (magnitude < 0.015625f) {
        // steps of 2^-9: the product is exact; rintf rounds half to even; 8 steps is the smallest normal, 0x08.
        return sign | (uint32_t)rintf(__fmul_rn(magnitude, 512.0f));
    }
    const uint32_t magnitude_bits = __float_as_uint(magnitude);
    const int exponent = (int)(magnitude_bits >> 23) - 127;
    const uint32_t mantissa = magnitude_bits & 0x007FFFFFu;
    const uint32_t dropped = mantissa & 0x000FFFFFu;
    const uint32_t kept = mantissa >> 20;
    uint32_t code = ((uint32_t)(exponent + 7) << 3) | kept;
    const uint32_t halfway = 0x00080000u;
    if (dropped > halfway || (dropped == halfway && (kept & 1u) == 1u)) code += 1u;  // a carry moves into the exponent
    return sign | (code < 0x7Eu ? code : 0x7Eu);
}

// Element `e` of a cached row at `row` (storage.rs `decode`): f32 as is, BF16 widened, FP8 `decode(byte) · scale`.
__device__ __forceinline__ float kv_load(const unsigned char* row, int e, int dtype, float scale) {
    if (dtype == kKvFp8) return __fmul_rn(e4m3_decode(row[e]), scale);
    if (dtype == kKvBf16) return bf16_value(reinterpret_cast<const uint16_t*>(row)[e]);
    return reinterpret_cast<const float*>(row)[e];
}

}  // namespace squeeze

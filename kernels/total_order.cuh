// Rust's `f32::total_cmp` order as an unsigned key, for top-k selections that must pick exactly what the CPU picks.
//
// key(v) = bits ^ (sign ? 0xFFFFFFFF : 0x80000000): a larger key is a larger value in `total_cmp` (-NaN < -inf <
// … < -0.0 < +0.0 < … < +inf < +NaN); the map is a bijection, so `order_value(order_key(v))` gives v back bit for bit.
#pragma once

#include "common.cuh"

namespace squeeze {

__device__ __forceinline__ uint32_t order_key(float value) {
    const uint32_t bits = __float_as_uint(value);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ float order_value(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? (key ^ 0x80000000u) : ~key);
}

// `value.is_finite()`: false for infinities and NaN.
__device__ __forceinline__ bool finite_value(float value) { return (__float_as_uint(value) & 0x7F800000u) != 0x7F800000u; }

}  // namespace squeeze

// The INT4 scale rules on the device, as src/quant/int4.rs and src/quant/mse.rs compute them (bit for bit): the
// stored BF16 scale of one group under ct-minmax, absmax7 or mse. Shared by the quantize command's INT4 kernels
// (kernels/int4_quantize.cu) and GPTQ's column loop (kernels/gptq.cu). A group is read through an accessor `w(j)`.
#pragma once

#include "common.cuh"

namespace squeeze {

// |x|^2.4 exactly as src/quant/pow.rs computes it, operation by operation (x^2.4 = x² · 2^(0.4·log2 x), log2 from the
// exponent bits plus an atanh series of the mantissa reduced to [√½, √2), 2^f by a degree-6 Taylor polynomial).
__device__ __forceinline__ float abs_pow_2_4(float x) {
    x = fabsf(x);
    const uint32_t bits = __float_as_uint(x);
    const int raw_exponent = (int)((bits >> 23) & 0xFFu) - 127;
    const float raw_mantissa = __uint_as_float((bits & 0x007FFFFFu) | 0x3F800000u);
    const bool high = raw_mantissa > 1.41421356237309504880f;
    const float mantissa = high ? __fmul_rn(raw_mantissa, 0.5f) : raw_mantissa;
    const int exponent = high ? raw_exponent + 1 : raw_exponent;
    const float t = __fdiv_rn(__fsub_rn(mantissa, 1.0f), __fadd_rn(mantissa, 1.0f));
    const float t2 = __fmul_rn(t, t);
    float series = __fadd_rn(1.0f / 7.0f, __fmul_rn(t2, 1.0f / 9.0f));
    series = __fadd_rn(1.0f / 5.0f, __fmul_rn(t2, series));
    series = __fadd_rn(1.0f / 3.0f, __fmul_rn(t2, series));
    series = __fadd_rn(1.0f, __fmul_rn(t2, series));
    const float log2 = __fadd_rn((float)exponent, __fmul_rn(__fmul_rn(__fmul_rn(2.0f, t), series), 1.44269504088896340736f));
    const float y = __fmul_rn(0.4f, log2);
    const float whole = __fsub_rn(__fadd_rn(y, 12582912.0f), 12582912.0f);
    const float z = __fmul_rn(__fsub_rn(y, whole), 0.693147180559945309417f);
    float e = __fadd_rn(1.0f / 120.0f, __fmul_rn(z, 1.0f / 720.0f));
    e = __fadd_rn(1.0f / 24.0f, __fmul_rn(z, e));
    e = __fadd_rn(1.0f / 6.0f, __fmul_rn(z, e));
    e = __fadd_rn(0.5f, __fmul_rn(z, e));
    e = __fadd_rn(1.0f, __fmul_rn(z, e));
    e = __fadd_rn(1.0f, __fmul_rn(z, e));
    int biased = (int)whole + 127;
    biased = biased < 1 ? 1 : (biased > 254 ? 254 : biased);
    const float power_of_two = __uint_as_float((uint32_t)biased << 23);
    const float result = __fmul_rn(__fmul_rn(__fmul_rn(x, x), e), power_of_two);
    if (x >= 1e-30f) return result;
    return x != x ? x : 0.0f;
}

// Σ_j |w_j - q_j · s|^norm over the group as src/quant/int4.rs sums it: element j into lane j % 8 (in order),
// lanes combined ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). norm 2.4 uses abs_pow_2_4, any other norm powf.
template <int N, class Group>
__device__ __forceinline__ float mse_error(const Group& w, int n, float s, float norm) {
    float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const bool fast = norm == 2.4f;
#pragma unroll
    for (int j = 0; j < (N > 0 ? N : n); ++j) {
        const float q = int4_level(w(j), s, -8.0f);
        const float difference = __fsub_rn(w(j), __fmul_rn(q, s));
        const float term = fast ? abs_pow_2_4(difference) : powf(fabsf(difference), norm);
        lanes[j & 7] = __fadd_rn(lanes[j & 7], term);
    }
    return __fadd_rn(__fadd_rn(__fadd_rn(lanes[0], lanes[1]), __fadd_rn(lanes[2], lanes[3])),
                     __fadd_rn(__fadd_rn(lanes[4], lanes[5]), __fadd_rn(lanes[6], lanes[7])));
}

// Chooses the stored BF16 scale of a group and its lowest level.
template <int N, class Group>
__device__ __forceinline__ uint16_t choose_scale(const Group& w, int n, int rule, int mse_steps, int mse_grid,
                                                 float mse_norm, float* q_min) {
    float absmax = 0.0f;
#pragma unroll
    for (int j = 0; j < (N > 0 ? N : n); ++j) absmax = fmaxf(absmax, fabsf(w(j)));
    *q_min = -8.0f;
    if (rule == kAbsmax7) {
        *q_min = -7.0f;
        return stored_scale(__fdiv_rn(absmax, 7.0f));
    }
    uint16_t best = stored_scale(__fdiv_rn(absmax, 7.5f));
    if (rule != kMse) return best;
    float best_error = __uint_as_float(0x7F800000u);  // +infinity
    const int steps = mse_steps < 1 ? 1 : mse_steps;
    for (int step = 0; step < steps; ++step) {
        const float shrink = __fsub_rn(1.0f, __fdiv_rn((float)step, (float)mse_grid));
        const uint16_t candidate = stored_scale(__fdiv_rn(__fmul_rn(shrink, absmax), 7.5f));
        const float error = mse_error<N>(w, n, bf16_value(candidate), mse_norm);
        if (error < best_error) {
            best_error = error;
            best = candidate;
        }
    }
    return best;
}

}  // namespace squeeze

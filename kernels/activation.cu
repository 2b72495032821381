// SiLU-gate: out = silu(gate) · up = gate / (1 + exp(-gate)) · up, elementwise over f32 `[count]`.
// Matches src/runtime/cpu/activation.rs up to the exponential (expf here, Rust's f32::exp there: both correctly
// rounded to within 1 ulp); grid-stride loop, one thread per element.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
    silu_mul_f32(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out, long long count) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += stride) {
        const float g = gate[e];
        out[e] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[e]);
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(silu_mul_f32);
#endif

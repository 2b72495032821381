// Data movement of device-resident activations (src/runtime/cuda/tensor.rs): strided block copies, elementwise
// adds, row gathers and in-order weighted row accumulation. Every float operation is an explicitly rounded
// intrinsic, so the results equal the CPU backend's (src/runtime/cpu/mod.rs, src/runtime/cpu/experts.rs) bit for bit.
#include "common.cuh"

// out[to + i·to_outer + j·to_inner + w] = in[at + i·at_outer + j·at_inner + w] over a [outer, inner, width] block;
// one thread per element, grid-stride.
extern "C" __global__ void __launch_bounds__(256)
    copy_block_f32(float* __restrict__ out, long long to, long long to_outer, long long to_inner,
                   const float* __restrict__ in, long long at, long long at_outer, long long at_inner, long long outer,
                   long long inner, long long width) {
    const long long count = outer * inner * width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += stride) {
        const long long w = e % width;
        const long long j = (e / width) % inner;
        const long long i = e / (width * inner);
        out[to + i * to_outer + j * to_inner + w] = in[at + i * at_outer + j * at_inner + w];
    }
}

// out[e] = value over `count` values.
extern "C" __global__ void __launch_bounds__(256) fill_f32(float* __restrict__ out, float value, long long count) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += stride) out[e] = value;
}

// out[e] += in[e] over `count` values.
extern "C" __global__ void __launch_bounds__(256)
    add_f32(float* __restrict__ out, const float* __restrict__ in, long long count) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += stride) {
        out[e] = __fadd_rn(out[e], in[e]);
    }
}

// out[r] = in[rows[r]] for `count` rows of `columns` values.
extern "C" __global__ void __launch_bounds__(256)
    gather_rows_f32(float* __restrict__ out, const float* __restrict__ in, const int* __restrict__ rows, long long count,
                    long long columns) {
    const long long total = count * columns;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long r = e / columns;
        out[e] = in[(long long)rows[r] * columns + e % columns];
    }
}

// For each target row t and column c: out[targets[t]][c] += weights[k] · in[sources[k]][c] for k in
// starts[t]..starts[t + 1], in that order (the product rounded, then added, as the CPU combine does). One thread
// per (target, column): the entries of one target row are summed in list order.
extern "C" __global__ void __launch_bounds__(256)
    accumulate_rows_f32(float* __restrict__ out, const float* __restrict__ in, const int* __restrict__ targets,
                        const int* __restrict__ starts, const int* __restrict__ sources,
                        const float* __restrict__ weights, long long target_count, long long columns) {
    const long long total = target_count * columns;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const long long t = e / columns;
        const long long c = e % columns;
        float* slot = out + (long long)targets[t] * columns + c;
        float value = *slot;
        for (int k = starts[t]; k < starts[t + 1]; ++k) {
            value = __fadd_rn(value, __fmul_rn(weights[k], in[(long long)sources[k] * columns + c]));
        }
        *slot = value;
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(copy_block_f32);
SQUEEZE_EMULATION_KERNEL(fill_f32);
SQUEEZE_EMULATION_KERNEL(add_f32);
SQUEEZE_EMULATION_KERNEL(gather_rows_f32);
SQUEEZE_EMULATION_KERNEL(accumulate_rows_f32);
#endif

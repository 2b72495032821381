// The one tensor-core instruction squeeze's kernels use, and the dynamic shared memory they stage its operands in.
//
// mma_bf16_m16n8k16(d, a, b): D += A · B with A 16×16 and B 16×8 BF16, D f32 (PTX `mma.sync.aligned.m16n8k16.row.col
// .f32.bf16.bf16.f32`, sm_80+), every lane of the warp taking part. With g = lane / 4, t = lane % 4, each 32-bit
// register holding two BF16 values (the lower-indexed one in the low 16 bits), as the PTX ISA lays the fragments out:
//   a[0] A[g][2t, 2t+1]   a[1] A[g+8][2t, 2t+1]   a[2] A[g][2t+8, 2t+9]   a[3] A[g+8][2t+8, 2t+9]
//   b[0] B[2t, 2t+1][g]   b[1] B[2t+8, 2t+9][g]
//   d[0] D[g][2t]  d[1] D[g][2t+1]  d[2] D[g+8][2t]  d[3] D[g+8][2t+1]
// Products of BF16 values are exact in f32; the hardware's order and rounding of the sums is its own, so results
// are compared with a tolerance (the emulator adds the 16 products in k order, then D).
#pragma once

#include "common.cuh"

namespace squeeze {

__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef SQUEEZE_EMULATION
    cuda_emulation::mma_bf16_m16n8k16(d, a, b);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// The two BF16 values `low`, `high` as one register (low in bits 0..15).
__device__ __forceinline__ uint32_t bf16_pair(uint16_t low, uint16_t high) { return (uint32_t)low | ((uint32_t)high << 16); }

// The launch's dynamic shared memory and its size in bytes.
#ifdef SQUEEZE_EMULATION
#define SQUEEZE_DYNAMIC_SHARED(name) unsigned char* name = ::cuda_emulation::state().dynamic_shared.data()
__device__ __forceinline__ uint32_t dynamic_shared_bytes() {
    return (uint32_t)::cuda_emulation::state().dynamic_shared.size();
}
#else
#define SQUEEZE_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
__device__ __forceinline__ uint32_t dynamic_shared_bytes() {
    uint32_t bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}
#endif

}  // namespace squeeze

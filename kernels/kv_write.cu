// KV cache write: new tokens' cache rows into their pages (src/runtime/kv_cache/mod.rs `KvPool::write` with
// storage.rs `encode`, bit for bit).
//
// Layout (the CPU pool's): `pages` bytes are `[pool_pages, layers, page_size, row_width]` elements of `dtype`
// (f32 / BF16 / FP8 e4m3fn); token t's row goes to slot `slots[t]` = physical page · page_size + offset, i.e. element
// row ((page · layers + layer) · page_size + offset). `rows` f32 `[tokens, row_width]`: MLA the 576-wide
// [latent 512 | k_pe 64], GQA [K kv_heads·head_dim | V kv_heads·head_dim]. `scales` f32 `[row_width]`: the layer's
// per-element scale (one per K/V head, repeated over the head's elements; one per layer for MLA).
//
// Equations: BF16 `bf16_bits(x)` (round to nearest even); FP8 `e4m3_encode(x / scale)` (saturating to ±448; a NaN
// x encodes with its own sign, as the CPU's division keeps it);
// f32 copied. A slot outside the pool (negative or ≥ pool_pages · page_size) is skipped; the launch wrapper rejects
// such slots before launching.
//
// Launch: grid-stride over tokens · row_width elements, 256 threads per block; one thread per element, so a warp
// writes 32 consecutive elements of a row (coalesced).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
    kv_write_rows(const float* __restrict__ rows, const int* __restrict__ slots, const float* __restrict__ scales,
                  unsigned char* __restrict__ pages, int tokens, int row_width, int pool_pages, int layers, int layer,
                  int page_size, int dtype) {
    using namespace squeeze;
    const long long count = (long long)tokens * row_width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long slot_count = (long long)pool_pages * page_size;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        const int token = (int)(i / row_width);
        const int e = (int)(i % row_width);
        const int slot = slots[token];
        if (slot < 0 || (long long)slot >= slot_count) continue;
        const long long page = slot / page_size, offset = slot % page_size;
        const long long element = ((page * layers + layer) * page_size + offset) * row_width + e;
        const float x = rows[i];
        if (dtype == kKvFp8) {
            // A NaN keeps its sign through the division on the host (x86) but not on the GPU: pass it through.
            pages[element] = (unsigned char)e4m3_encode(x != x ? x : __fdiv_rn(x, scales[e]));
        } else if (dtype == kKvBf16) {
            reinterpret_cast<uint16_t*>(pages)[element] = bf16_bits(x);
        } else {
            reinterpret_cast<float*>(pages)[element] = x;
        }
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(kv_write_rows);
#endif

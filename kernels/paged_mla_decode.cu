// Paged decode attention for absorbed MLA over a BF16 or FP8 cache, on tensor cores, with the page-tag verification
// of kernels/paged_common.cuh fused into the same launch (the way FlashMLA restructures decode: a block serves a
// group of 64 query heads, so each cached row is read once per head group, not once per head; the query products
// and the value sums are BF16 MMAs with f32 accumulation). Same inputs, partial outputs and combine
// (`paged_decode_combine`) as kernels/paged_attention.cu `paged_decode_partial`, restricted to one key head whose
// key is row elements [0, qk_dim) and whose value is [v_base, v_base + v_dim) of the same row.
//
// Exactness: every cached element is exact in BF16 (an e4m3 code is; a BF16 cache is), so the cache enters the MMAs
// unrounded. Its per-element FP8 scales move to the other side: the query is multiplied by the key's scales before
// the products (q'[e] = q[e] · scales[e]), and the value sums by the value's scales after them
// (out[e] = scales[v_base + e] · Σ_t p_t · code_t[e]). The f32 side (q', and the softmax weights p) is carried as two
// BF16 terms, hi = bf16(x) and lo = bf16(x − hi), each multiplied by the exact cache operand and accumulated in f32,
// so its relative error is about 2^-17 instead of BF16's 2^-9: the outputs stay within the CPU's f32 path's tolerance
// (src/opcheck/kv_ops.rs), at twice the MMAs.
//
// Layout (as paged_attention.cu): pages `[pool_pages, layers, page_size, row_width]` of `dtype` (1 BF16, 2 FP8),
// scales f32 `[row_width]` (this layer's), q f32 `[requests, heads, qk_dim]`, allowed f32 `[requests, allowed_stride]`
// (allowed_stride 0: every key), partials `[requests, splits, heads]` (max, sum), `[requests, splits, heads, v_dim]`
// (acc), split faults `[requests, splits]`.
//
// Launch: grid (ceil(heads / 64), splits, requests) — the head groups of one split next to each other, so a row read
// by the first is still in L2 for the second — 256 threads = 8 warps, `mla_decode_shared_bytes(width)` bytes of
// dynamic shared memory (src/runtime/cuda/paged.rs computes the same), width = qk_dim and v_base + v_dim rounded up
// to 16, at most 576. Per tile of 32 keys of the split:
//   1. which keys count (inside the split and the context, allowed), then the tile's rows staged in shared memory as
//      BF16 (FP8 codes through a 256-entry table), disallowed keys as zeros;
//   2. scores S[64 heads × 32 keys] = Q' · Kᵀ: warp w the 16 heads of row tile w % 4 and the 16 keys of column tiles
//      2 · (w / 4) and +1, over width / 16 k-steps, hi and lo;
//   3. online softmax: warp w heads 8w … 8w + 7, lane = key: running max and sum per head, the tile's weights as
//      hi/lo BF16, the correction of the earlier accumulators;
//   4. acc[64 heads × v_dim] = acc · correction + P · V: warp w the value columns 8 · (w + 8j), j < 8, of every head,
//      in registers across the tiles.
// Heads past `heads` are zero queries whose rows are computed and never written; row tiles wholly past it are skipped.
#include "mma.cuh"
#include "paged_common.cuh"

namespace squeeze {
constexpr int kMlaWarps = 8;
constexpr int kMlaHeads = 64;                      // query heads per block: 4 row tiles of 16
constexpr int kMlaRowTiles = kMlaHeads / 16;
constexpr int kMlaKeys = 32;                       // keys per tile
constexpr int kMlaMaxWidth = 576;                  // staged row elements
constexpr int kMlaMaxV = 512;
constexpr int kMlaValueTiles = kMlaMaxV / 8 / kMlaWarps;  // value column tiles per warp
constexpr int kMlaRowPad = 8;                      // BF16 elements after each staged row (spreads the banks)
constexpr int kMlaScorePitch = kMlaKeys + 1;
constexpr int kMlaWeightPitch = kMlaKeys + 8;

// Where each array lives in the dynamic shared memory of a launch with `width` staged elements (a multiple of 16).
struct MlaShared {
    uint16_t* q_hi;        // [kMlaHeads][pitch]
    uint16_t* q_lo;        // [kMlaHeads][pitch]
    uint16_t* keys;        // [kMlaKeys][pitch]
    float* scores;         // [kMlaHeads][kMlaScorePitch]
    uint16_t* p_hi;        // [kMlaHeads][kMlaWeightPitch]
    uint16_t* p_lo;        // [kMlaHeads][kMlaWeightPitch]
    float* row_max;        // [kMlaHeads]
    float* row_sum;        // [kMlaHeads]
    float* correction;     // [kMlaHeads]
    uint16_t* fp8_bf16;    // [256]
    int* key_counts;       // [kMlaKeys]
    int* warp_bad;         // [kMlaWarps]
    uint32_t bytes;
};

__device__ __forceinline__ MlaShared mla_shared(unsigned char* base, int width) {
    const int pitch = width + kMlaRowPad;
    MlaShared s;
    uint32_t at = 0;
    auto take = [&](uint32_t bytes) {
        unsigned char* p = base + at;
        at += (bytes + 15u) & ~15u;
        return p;
    };
    s.q_hi = reinterpret_cast<uint16_t*>(take(kMlaHeads * pitch * 2));
    s.q_lo = reinterpret_cast<uint16_t*>(take(kMlaHeads * pitch * 2));
    s.keys = reinterpret_cast<uint16_t*>(take(kMlaKeys * pitch * 2));
    s.scores = reinterpret_cast<float*>(take(kMlaHeads * kMlaScorePitch * 4));
    s.p_hi = reinterpret_cast<uint16_t*>(take(kMlaHeads * kMlaWeightPitch * 2));
    s.p_lo = reinterpret_cast<uint16_t*>(take(kMlaHeads * kMlaWeightPitch * 2));
    s.row_max = reinterpret_cast<float*>(take(kMlaHeads * 4));
    s.row_sum = reinterpret_cast<float*>(take(kMlaHeads * 4));
    s.correction = reinterpret_cast<float*>(take(kMlaHeads * 4));
    s.fp8_bf16 = reinterpret_cast<uint16_t*>(take(256 * 2));
    s.key_counts = reinterpret_cast<int*>(take(kMlaKeys * 4));
    s.warp_bad = reinterpret_cast<int*>(take(kMlaWarps * 4));
    s.bytes = at;
    return s;
}

// x as hi + lo BF16 terms.
__device__ __forceinline__ void bf16_split(float x, uint16_t& hi, uint16_t& lo) {
    hi = bf16_bits(x);
    lo = bf16_bits(__fsub_rn(x, bf16_value(hi)));
}

__device__ __forceinline__ uint32_t shared_word(const uint16_t* row, int element) {
    return *reinterpret_cast<const uint32_t*>(row + element);
}

// The A fragment of row tile `tile` (16 rows of `matrix`, `pitch` elements apart) at columns [k, k + 16).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* matrix, int pitch, int tile, int k,
                                       int lane) {
    const int g = lane / 4, t = lane % 4;
    const uint16_t* top = matrix + (tile * 16 + g) * pitch + k + 2 * t;
    const uint16_t* bottom = top + 8 * pitch;
    a[0] = shared_word(top, 0);
    a[1] = shared_word(bottom, 0);
    a[2] = shared_word(top, 8);
    a[3] = shared_word(bottom, 8);
}
}  // namespace squeeze

extern "C" __global__ void __launch_bounds__(256, 1)
    paged_mla_decode_partial(const float* __restrict__ q, const unsigned char* __restrict__ pages,
                             const float* __restrict__ scales, const uint32_t* __restrict__ tags,
                             const uint32_t* __restrict__ requests, const uint32_t* __restrict__ mappings,
                             float* __restrict__ partial_max, float* __restrict__ partial_sum,
                             float* __restrict__ partial_acc, int* __restrict__ split_faults,
                             const float* __restrict__ allowed, int allowed_stride, int pool_pages, int layers,
                             int layer, int page_size, int row_width, int dtype, int heads, int qk_dim, int v_dim,
                             int v_base, float scale, int pages_per_split, int verify) {
    using namespace squeeze;
    const int head_group = blockIdx.x, split = blockIdx.y, splits = gridDim.y, request = blockIdx.z;
    const int thread = threadIdx.x, lane = thread % 32, warp = thread / 32;
    const int g = lane / 4, t = lane % 4;
    const int first_head = head_group * kMlaHeads;
    const int head_count = paged_min(kMlaHeads, heads - first_head);
    const int row_tiles = (head_count + 15) / 16;
    const int width = ((paged_max(qk_dim, v_base + v_dim) + 15) / 16) * 16;
    const int pitch = width + kMlaRowPad;
    const int qk_steps = (qk_dim + 15) / 16;
    const bool fp8 = dtype == kKvFp8;

    SQUEEZE_DYNAMIC_SHARED(shared_base);
    const MlaShared s = mla_shared(shared_base, width);
    if (width > kMlaMaxWidth || v_dim > kMlaMaxV || s.bytes > dynamic_shared_bytes()) __trap();

    // 1. Verify the mappings this split owns before reading through any of them.
    const PagedRequest descriptor = paged_request(requests, request);
    const int bad = paged_verify_split(tags, mappings, descriptor, pool_pages, page_size, split, splits,
                                       pages_per_split, verify, s.warp_bad);
    const long long slot = (long long)request * splits + split;
    if (head_group == 0 && thread == 0) split_faults[slot] = bad == kNoFault ? 0 : 1 + bad;
    if (bad != kNoFault) {
        paged_empty_partials(partial_max, partial_sum, partial_acc, slot * heads + first_head, head_count, v_dim);
        return;  // the whole block: `bad` is uniform
    }

    // 2. The scaled queries as hi/lo BF16 (zeros past qk_dim and past the heads), the FP8 table, the running state.
    for (int i = thread; i < kMlaHeads * width; i += blockDim.x) {
        const int h = i / width, e = i % width;
        float value = 0.0f;
        if (h < head_count && e < qk_dim) {
            value = q[((long long)request * heads + first_head + h) * qk_dim + e];
            if (fp8) value = __fmul_rn(value, scales[e]);
        }
        bf16_split(value, s.q_hi[h * pitch + e], s.q_lo[h * pitch + e]);
    }
    for (int i = thread; i < 256; i += blockDim.x) s.fp8_bf16[i] = bf16_bits(e4m3_decode((uint32_t)i));
    if (thread < kMlaHeads) {
        s.row_max[thread] = -INFINITY;
        s.row_sum[thread] = 0.0f;
    }
    float acc[kMlaRowTiles][kMlaValueTiles][4];
#pragma unroll
    for (int m = 0; m < kMlaRowTiles; ++m)
#pragma unroll
        for (int j = 0; j < kMlaValueTiles; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[m][j][c] = 0.0f;
    __syncthreads();

    const long long element_bytes = fp8 ? 1 : 2;
    const long long row_bytes = (long long)row_width * element_bytes;
    const int key_begin = split * pages_per_split * page_size;
    const int key_end = paged_min(descriptor.context, (split + 1) * pages_per_split * page_size);
    // 16-byte loads when every row starts 16-byte aligned and the staged width stays inside the row.
    const bool wide = row_bytes % 16 == 0 && width <= row_width;
    for (int tile = key_begin; tile < key_end; tile += kMlaKeys) {
        // 1. Which keys count, then the tile's rows as BF16.
        if (thread < kMlaKeys) {
            const int key = tile + thread;
            s.key_counts[thread] = key < key_end &&
                                   (allowed_stride == 0 || allowed[(long long)request * allowed_stride + key] != 0.0f);
        }
        __syncthreads();
        if (wide) {
            const int per_load = fp8 ? 16 : 8;  // elements in 16 bytes
            const int loads_per_row = width / per_load;
            for (int i = thread; i < kMlaKeys * loads_per_row; i += blockDim.x) {
                const int k = i / loads_per_row, first = (i % loads_per_row) * per_load;
                uint16_t* target = s.keys + k * pitch + first;
                uint4 bytes = make_uint4(0u, 0u, 0u, 0u);
                if (s.key_counts[k]) {
                    const int key = tile + k;
                    const long long page = mappings[(descriptor.first_mapping + key / page_size) * kMappingWords];
                    const unsigned char* row =
                        pages + ((page * layers + layer) * page_size + key % page_size) * row_bytes;
                    bytes = *reinterpret_cast<const uint4*>(row + first * element_bytes);
                }
                if (fp8) {
                    const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
                    uint32_t packed[8];
#pragma unroll
                    for (int w = 0; w < 4; ++w) {
                        packed[2 * w] = bf16_pair(s.fp8_bf16[words[w] & 0xFFu], s.fp8_bf16[(words[w] >> 8) & 0xFFu]);
                        packed[2 * w + 1] =
                            bf16_pair(s.fp8_bf16[(words[w] >> 16) & 0xFFu], s.fp8_bf16[words[w] >> 24]);
                    }
                    reinterpret_cast<uint4*>(target)[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
                    reinterpret_cast<uint4*>(target)[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
                } else {
                    *reinterpret_cast<uint4*>(target) = bytes;
                }
            }
        } else {
            for (int i = thread; i < kMlaKeys * width; i += blockDim.x) {
                const int k = i / width, e = i % width;
                uint16_t bits = 0;
                if (s.key_counts[k] && e < row_width) {
                    const int key = tile + k;
                    const long long page = mappings[(descriptor.first_mapping + key / page_size) * kMappingWords];
                    const unsigned char* row =
                        pages + ((page * layers + layer) * page_size + key % page_size) * row_bytes;
                    bits = fp8 ? s.fp8_bf16[row[e]] : reinterpret_cast<const uint16_t*>(row)[e];
                }
                s.keys[k * pitch + e] = bits;
            }
        }
        __syncthreads();

        // 2. Scores: row tile warp % 4, key column tiles 2 · (warp / 4) and + 1.
        const int score_tile = warp % kMlaRowTiles;
        if (score_tile < row_tiles) {
            float score[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
            const int first_key = 16 * (warp / kMlaRowTiles);
            for (int step = 0; step < qk_steps; ++step) {
                uint32_t a_hi[4], a_lo[4];
                load_a(a_hi, s.q_hi, pitch, score_tile, 16 * step, lane);
                load_a(a_lo, s.q_lo, pitch, score_tile, 16 * step, lane);
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                    const uint16_t* key_row = s.keys + (first_key + 8 * n + g) * pitch + 16 * step + 2 * t;
                    const uint32_t b[2] = {shared_word(key_row, 0), shared_word(key_row, 8)};
                    mma_bf16_m16n8k16(score[n], a_hi, b);
                    mma_bf16_m16n8k16(score[n], a_lo, b);
                }
            }
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const int head = score_tile * 16 + g, key = first_key + 8 * n + 2 * t;
                s.scores[head * kMlaScorePitch + key] = score[n][0];
                s.scores[head * kMlaScorePitch + key + 1] = score[n][1];
                s.scores[(head + 8) * kMlaScorePitch + key] = score[n][2];
                s.scores[(head + 8) * kMlaScorePitch + key + 1] = score[n][3];
            }
        }
        __syncthreads();

        // 3. Online softmax: warp w heads 8w … 8w + 7, lane = key of the tile.
        for (int h = warp * (kMlaHeads / kMlaWarps); h < (warp + 1) * (kMlaHeads / kMlaWarps); ++h) {
            if (h >= row_tiles * 16) break;  // uniform across the warp
            const float score =
                s.key_counts[lane] ? __fmul_rn(s.scores[h * kMlaScorePitch + lane], scale) : -INFINITY;
            float tile_max = score;
            for (int offset = 16; offset > 0; offset >>= 1) {
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, offset));
            }
            const float old_max = s.row_max[h];
            const float new_max = fmaxf(old_max, tile_max);
            float weight = 0.0f, correction = 1.0f;
            if (new_max != -INFINITY) {
                weight = expf(__fsub_rn(score, new_max));          // 0 for a key that does not count
                correction = expf(__fsub_rn(old_max, new_max));    // 0 before the first counted key
            }
            const float tile_sum = paged_warp_sum(weight);
            bf16_split(weight, s.p_hi[h * kMlaWeightPitch + lane], s.p_lo[h * kMlaWeightPitch + lane]);
            if (lane == 0) {
                s.row_sum[h] = __fadd_rn(__fmul_rn(s.row_sum[h], correction), tile_sum);
                s.row_max[h] = new_max;
                s.correction[h] = correction;
            }
        }
        __syncthreads();

        // 4. acc = acc · correction + P · V over value column tiles warp + 8j.
#pragma unroll
        for (int m = 0; m < kMlaRowTiles; ++m) {
            if (m >= row_tiles) break;
            const float top = s.correction[m * 16 + g], bottom = s.correction[m * 16 + g + 8];
#pragma unroll
            for (int j = 0; j < kMlaValueTiles; ++j) {
                acc[m][j][0] = __fmul_rn(acc[m][j][0], top);
                acc[m][j][1] = __fmul_rn(acc[m][j][1], top);
                acc[m][j][2] = __fmul_rn(acc[m][j][2], bottom);
                acc[m][j][3] = __fmul_rn(acc[m][j][3], bottom);
            }
        }
#pragma unroll
        for (int step = 0; step < kMlaKeys / 16; ++step) {
            const uint16_t* value_rows = s.keys + (16 * step + 2 * t) * pitch + v_base;
#pragma unroll
            for (int m = 0; m < kMlaRowTiles; ++m) {
                if (m >= row_tiles) break;
                uint32_t a_hi[4], a_lo[4];
                load_a(a_hi, s.p_hi, kMlaWeightPitch, m, 16 * step, lane);
                load_a(a_lo, s.p_lo, kMlaWeightPitch, m, 16 * step, lane);
#pragma unroll
                for (int j = 0; j < kMlaValueTiles; ++j) {
                    const int column = 8 * (warp + kMlaWarps * j) + g;
                    if (8 * (warp + kMlaWarps * j) >= v_dim) break;  // uniform across the warp
                    const uint16_t* v = value_rows + column;
                    const bool inside = column < v_dim;
                    const uint32_t b[2] = {
                        inside ? bf16_pair(v[0], v[pitch]) : 0u,
                        inside ? bf16_pair(v[8 * pitch], v[9 * pitch]) : 0u,
                    };
                    mma_bf16_m16n8k16(acc[m][j], a_hi, b);
                    mma_bf16_m16n8k16(acc[m][j], a_lo, b);
                }
            }
        }
        __syncthreads();
    }

    // Partials of the real heads: the running max and sum, the accumulators times the value scales.
    if (thread < head_count) {
        partial_max[slot * heads + first_head + thread] = s.row_max[thread];
        partial_sum[slot * heads + first_head + thread] = s.row_sum[thread];
    }
#pragma unroll
    for (int m = 0; m < kMlaRowTiles; ++m) {
#pragma unroll
        for (int j = 0; j < kMlaValueTiles; ++j) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int head = m * 16 + g + 8 * (c / 2);
                const int column = 8 * (warp + kMlaWarps * j) + 2 * t + c % 2;
                if (head >= head_count || column >= v_dim) continue;
                const float value_scale = fp8 ? scales[v_base + column] : 1.0f;
                partial_acc[(slot * heads + first_head + head) * v_dim + column] = __fmul_rn(acc[m][j][c], value_scale);
            }
        }
    }
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(paged_mla_decode_partial);
#endif

// GPTQ's algebra on the device, driven by src/runtime/cuda/gptq.rs and checked there against the CPU path
// (src/quant/gptq.rs, src/quant/gptq_linalg.rs). Every matrix is f64 and row-major; `n` is the Hessian's width.
//
// - The Hessian sum `H += XᵀX` is a GEMM (gemm_f64_reference here, cuBLAS DGEMM on a GPU) over inputs widened from
//   f32 by gptq_widen.
// - The factor `U` (upper, Uᵀ U = (H/samples + λI)⁻¹) comes, as on the CPU, from the Cholesky factorization of the
//   damped mean Hessian with rows and columns reversed (J A J = L Lᵀ, U = J L⁻¹ J): gptq_diagonal_mean and
//   gptq_damped_reversed build J A J; the factorization runs in blocks of kPanel columns (gptq_cholesky_diagonal
//   factors the diagonal block, gptq_cholesky_panel solves the rows below it, a GEMM updates the rest); the inverse
//   of L in block rows (gptq_invert_diagonal inverts every diagonal block, then per block row two GEMMs:
//   M[i, :i] = −M[i, i] · (L[i, :i] · M[:i, :i])); gptq_reverse_upper writes U = J M J.
// - The column loop (gptq_quantize_block): one warp per weight row; a block's columns in order, each group's scale
//   chosen at its first column from the row as updated so far (or given), each column's error fed back into the
//   block's later columns at once; the block's errors then reach the later columns as one GEMM.
#include "common.cuh"
#include "int4_scale.cuh"

namespace squeeze {

// Columns per block of the blocked factorization and inverse (the host passes block starts in these units).
constexpr int kPanel = 32;
// Weight rows (warps) per block of gptq_quantize_block, and the most columns one GPTQ block may hold.
constexpr int kGptqWarps = 4;
constexpr int kGptqMaxBlock = 512;
constexpr int kGemmTile = 16;

// A group held in shared memory (the working row's values rounded to f32, as src/quant/gptq.rs hands them to the
// scale rule).
struct SharedGroup {
    const float* values;
    __device__ __forceinline__ float operator()(int j) const { return values[j]; }
};

// The stored scale of one group as src/quant/int4.rs `quantize_group` chooses it, computed by a whole warp: the
// absmax from every lane's share (max is exact in any order), the mse candidates split over lanes and the first
// smallest error kept (the CPU's strict `<` over steps in order: smaller error, then lower step).
__device__ __forceinline__ uint16_t warp_group_scale(const float* group_values, int n, int rule, int mse_steps,
                                                     int mse_grid, float mse_norm, unsigned lane) {
    float absmax = 0.0f;
    for (int j = (int)lane; j < n; j += 32) absmax = fmaxf(absmax, fabsf(group_values[j]));
    for (int mask = 16; mask > 0; mask /= 2) absmax = fmaxf(absmax, __shfl_xor_sync(0xFFFFFFFFu, absmax, mask));
    if (rule == kAbsmax7) return stored_scale(__fdiv_rn(absmax, 7.0f));
    const uint16_t minmax = stored_scale(__fdiv_rn(absmax, 7.5f));
    if (rule != kMse) return minmax;
    const float infinity = __uint_as_float(0x7F800000u);
    float best_error = infinity;
    int best_step = 0x7FFFFFFF;
    const int steps = mse_steps < 1 ? 1 : mse_steps;
    const SharedGroup group{group_values};
    for (int step = (int)lane; step < steps; step += 32) {
        const float shrink = __fsub_rn(1.0f, __fdiv_rn((float)step, (float)mse_grid));
        const uint16_t candidate = stored_scale(__fdiv_rn(__fmul_rn(shrink, absmax), 7.5f));
        const float error = mse_error<0>(group, n, bf16_value(candidate), mse_norm);
        if (error < best_error) {
            best_error = error;
            best_step = step;
        }
    }
    for (int mask = 16; mask > 0; mask /= 2) {
        const float other_error = __shfl_xor_sync(0xFFFFFFFFu, best_error, mask);
        const int other_step = __shfl_xor_sync(0xFFFFFFFFu, best_step, mask);
        if (other_error < best_error || (other_error == best_error && other_step < best_step)) {
            best_error = other_error;
            best_step = other_step;
        }
    }
    if (!(best_error < infinity)) return minmax;
    const float shrink = __fsub_rn(1.0f, __fdiv_rn((float)best_step, (float)mse_grid));
    return stored_scale(__fdiv_rn(__fmul_rn(shrink, absmax), 7.5f));
}

}  // namespace squeeze

using namespace squeeze;

// c[m, n] = alpha · op(a) · op(b) + beta · c (c not read when beta is 0), op(x) = x or xᵀ; lda, ldb, ldc: the row
// strides of the matrices as stored. Tiles of 16 × 16 outputs, one per thread; grid (⌈n/16⌉, ⌈m/16⌉).
extern "C" __global__ void __launch_bounds__(256)
    gemm_f64_reference(const double* __restrict__ a, const double* __restrict__ b, double* __restrict__ c, int m, int n,
                       int k, int lda, int ldb, int ldc, int trans_a, int trans_b, double alpha, double beta) {
    __shared__ double a_tile[kGemmTile][kGemmTile + 1];
    __shared__ double b_tile[kGemmTile][kGemmTile + 1];
    const int tx = (int)(threadIdx.x % kGemmTile), ty = (int)(threadIdx.x / kGemmTile);
    const int row = (int)blockIdx.y * kGemmTile + ty, column = (int)blockIdx.x * kGemmTile + tx;
    double sum = 0.0;
    for (int k0 = 0; k0 < k; k0 += kGemmTile) {
        const int ak = k0 + tx, bk = k0 + ty;
        a_tile[ty][tx] = row < m && ak < k ? (trans_a ? a[(long long)ak * lda + row] : a[(long long)row * lda + ak]) : 0.0;
        b_tile[ty][tx] =
            bk < k && column < n ? (trans_b ? b[(long long)column * ldb + bk] : b[(long long)bk * ldb + column]) : 0.0;
        __syncthreads();
        for (int p = 0; p < kGemmTile; ++p) sum += a_tile[ty][p] * b_tile[p][tx];
        __syncthreads();
    }
    if (row < m && column < n) {
        double* out = c + (long long)row * ldc + column;
        *out = beta == 0.0 ? alpha * sum : alpha * sum + beta * *out;
    }
}

// out[e] = in[e] for e < count, f32 → f64 (grid-stride).
extern "C" __global__ void __launch_bounds__(256) gptq_widen(const float* __restrict__ in, double* __restrict__ out,
                                                            long long count) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += (long long)gridDim.x * blockDim.x)
        out[e] = (double)in[e];
}

// out[0] = the mean diagonal of the mean Hessian sum / samples, zero entries counted as 1 (src/quant/gptq.rs
// `inverse_factor`: summed in column order by one thread, as the CPU does; the block loads the diagonal in chunks).
// One block of 256 threads.
extern "C" __global__ void __launch_bounds__(256) gptq_diagonal_mean(const double* __restrict__ sum, int n,
                                                                    double samples, double* __restrict__ out) {
    constexpr int kChunk = 1024;
    __shared__ double diagonal[kChunk];
    double total = 0.0;
    for (int first = 0; first < n; first += kChunk) {
        const int count = n - first < kChunk ? n - first : kChunk;
        for (int i = (int)threadIdx.x; i < count; i += (int)blockDim.x) {
            const double v = sum[(long long)(first + i) * n + first + i] / samples;
            diagonal[i] = v == 0.0 ? 1.0 : v;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (int i = 0; i < count; ++i) total += diagonal[i];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = total / (double)(n > 0 ? n : 1);
}

// a[i][j] = (H/samples + λI)[n−1−i][n−1−j], H read from its upper triangle (`sum`), a zero diagonal entry taken as
// 1 and λ = damping · mean_diagonal[0] (grid-stride over the n² entries).
extern "C" __global__ void __launch_bounds__(256)
    gptq_damped_reversed(const double* __restrict__ sum, int n, double samples, const double* __restrict__ mean_diagonal,
                         double damping, double* __restrict__ a) {
    const double lambda = damping * mean_diagonal[0];
    const long long count = (long long)n * n;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += (long long)gridDim.x * blockDim.x) {
        const int i = n - 1 - (int)(e / n), j = n - 1 - (int)(e % n);
        const int low = i < j ? i : j, high = i < j ? j : i;
        double v = sum[(long long)low * n + high] / samples;
        if (i == j) v = (v == 0.0 ? 1.0 : v) + lambda;
        a[e] = v;
    }
}

// Factors the diagonal block a[k:k+kb, k:k+kb] (kb ≤ kPanel; the columns before k already applied) in place into
// its lower Cholesky factor. A pivot that is not positive (or NaN) becomes NaN, and status[0], if still −1, takes
// the column of the original (unreversed) matrix: n − 1 − (k + j). One block of 256 threads.
extern "C" __global__ void __launch_bounds__(256) gptq_cholesky_diagonal(double* __restrict__ a, int n, int k, int kb,
                                                                        int* __restrict__ status) {
    __shared__ double block[kPanel][kPanel + 1];
    const int t = (int)threadIdx.x;
    for (int e = t; e < kb * kb; e += (int)blockDim.x) block[e / kb][e % kb] = a[(long long)(k + e / kb) * n + k + e % kb];
    __syncthreads();
    for (int j = 0; j < kb; ++j) {
        if (t == 0) {
            const double pivot = block[j][j];
            if (!(pivot > 0.0) && status[0] < 0) status[0] = n - 1 - (k + j);
            block[j][j] = sqrt(pivot > 0.0 ? pivot : -1.0);
        }
        __syncthreads();
        for (int i = j + 1 + t; i < kb; i += (int)blockDim.x) block[i][j] /= block[j][j];
        __syncthreads();
        // The rest of the block: block[i][l] −= block[i][j] · block[l][j] for j < l ≤ i.
        const int rest = kb - j - 1;
        for (int e = t; e < rest * rest; e += (int)blockDim.x) {
            const int i = j + 1 + e / rest, l = j + 1 + e % rest;
            if (l <= i) block[i][l] -= block[i][j] * block[l][j];
        }
        __syncthreads();
    }
    for (int e = t; e < kb * kb; e += (int)blockDim.x) {
        const int i = e / kb, l = e % kb;
        a[(long long)(k + i) * n + k + l] = l <= i ? block[i][l] : 0.0;
    }
}

// The rows below the diagonal block: a[i, k:k+kb] ← a[i, k:k+kb] · L⁻ᵀ for i in k+kb..n, L the factored diagonal
// block (forward substitution, one thread per row).
extern "C" __global__ void __launch_bounds__(256) gptq_cholesky_panel(double* __restrict__ a, int n, int k, int kb) {
    __shared__ double l[kPanel][kPanel + 1];
    const int t = (int)threadIdx.x;
    for (int e = t; e < kb * kb; e += (int)blockDim.x) l[e / kb][e % kb] = a[(long long)(k + e / kb) * n + k + e % kb];
    __syncthreads();
    const int i = k + kb + (int)blockIdx.x * (int)blockDim.x + t;
    if (i >= n) return;
    double* row = a + (long long)i * n + k;
    double x[kPanel];
    for (int j = 0; j < kb; ++j) {
        double v = row[j];
        for (int p = 0; p < j; ++p) v -= x[p] * l[j][p];
        x[j] = v / l[j][j];
    }
    for (int j = 0; j < kb; ++j) row[j] = x[j];
}

// m's diagonal blocks (kPanel wide, the last one narrower) ← the inverses of l's lower triangular diagonal blocks,
// zeros above their diagonal; one block of threads per diagonal block, one thread per column of the inverse.
extern "C" __global__ void __launch_bounds__(256) gptq_invert_diagonal(const double* __restrict__ l,
                                                                      double* __restrict__ m, int n) {
    __shared__ double source[kPanel][kPanel + 1];
    __shared__ double inverse[kPanel][kPanel + 1];
    const int k = (int)blockIdx.x * kPanel;
    const int kb = n - k < kPanel ? n - k : kPanel;
    const int t = (int)threadIdx.x;
    for (int e = t; e < kb * kb; e += (int)blockDim.x) source[e / kb][e % kb] = l[(long long)(k + e / kb) * n + k + e % kb];
    __syncthreads();
    if (t < kb) {
        const int c = t;
        for (int i = 0; i < c; ++i) inverse[i][c] = 0.0;
        inverse[c][c] = 1.0 / source[c][c];
        for (int i = c + 1; i < kb; ++i) {
            double v = 0.0;
            for (int p = c; p < i; ++p) v += source[i][p] * inverse[p][c];
            inverse[i][c] = -v / source[i][i];
        }
    }
    __syncthreads();
    for (int e = t; e < kb * kb; e += (int)blockDim.x) m[(long long)(k + e / kb) * n + k + e % kb] = inverse[e / kb][e % kb];
}

// x[e] = 0 for e < count (grid-stride).
extern "C" __global__ void __launch_bounds__(256) gptq_zero(double* __restrict__ x, long long count) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += (long long)gridDim.x * blockDim.x)
        x[e] = 0.0;
}

// u[i][j] = m[n−1−i][n−1−j] for j ≥ i, 0 below the diagonal (m lower triangular; grid-stride).
extern "C" __global__ void __launch_bounds__(256) gptq_reverse_upper(const double* __restrict__ m,
                                                                    double* __restrict__ u, int n) {
    const long long count = (long long)n * n;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < count; e += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(e / n), j = (int)(e % n);
        u[e] = j >= i ? m[(long long)(n - 1 - i) * n + (n - 1 - j)] : 0.0;
    }
}

// The columns start..end of every row of w [rows, columns] (end − start ≤ kGptqMaxBlock, group ≤ kGptqMaxBlock):
// column i's code under its group's scale, its error (w − code·scale) / u[i][i] into errors [rows, end − start]
// and, times u[i][j], subtracted from the block's later columns j of the row. A group's scale: rule ≥ 0 chooses it
// when the group starts from the row as updated so far (a group reaching past the block reads those columns as the
// earlier blocks left them, as the CPU does) and writes it to scales [rows, columns / group]; a block starting
// inside a group, and rule −1 (codes in [−8, 7]), read it from there. Codes i8 [rows, columns]. One warp per row,
// kGptqWarps rows per block.
extern "C" __global__ void __launch_bounds__(128)
    gptq_quantize_block(double* __restrict__ w, const double* __restrict__ u, signed char* __restrict__ codes,
                        uint16_t* __restrict__ scales, double* __restrict__ errors, int rows, int columns, int group,
                        int start, int end, int rule, int mse_steps, int mse_grid, float mse_norm) {
    __shared__ double row_block[kGptqWarps][kGptqMaxBlock];
    __shared__ float group_values[kGptqWarps][kGptqMaxBlock];
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r = (int)blockIdx.x * kGptqWarps + (int)warp;
    if (r >= rows) return;
    const int width = end - start, groups = columns / group;
    double* row = w + (long long)r * columns + start;
    double* values = row_block[warp];
    for (int j = (int)lane; j < width; j += 32) values[j] = row[j];
    __syncwarp();
    float scale = 0.0f, low = -8.0f;
    for (int i = start; i < end; ++i) {
        const int local = i - start;
        if (i % group == 0 || i == start) {
            uint16_t* stored = scales + (long long)r * groups + i / group;
            low = rule == kAbsmax7 ? -7.0f : -8.0f;
            if (rule >= 0 && i % group == 0) {
                for (int j = (int)lane; j < group; j += 32)
                    group_values[warp][j] = (float)(local + j < width ? values[local + j] : row[local + j]);
                __syncwarp();
                const uint16_t chosen =
                    warp_group_scale(group_values[warp], group, rule, mse_steps, mse_grid, mse_norm, lane);
                __syncwarp();
                if (lane == 0) *stored = chosen;
                scale = bf16_value(chosen);
            } else {
                scale = bf16_value(*stored);
            }
        }
        const double value = values[local];
        const int q = int4_code((float)value, scale, low);
        const double error = (value - (double)__fmul_rn((float)q, scale)) / u[(long long)i * columns + i];
        if (lane == 0) {
            codes[(long long)r * columns + i] = (signed char)q;
            errors[(long long)r * width + local] = error;
        }
        const double* factor_row = u + (long long)i * columns + start;
        for (int j = local + 1 + (int)lane; j < width; j += 32) values[j] -= error * factor_row[j];
        __syncwarp();
    }
    for (int j = (int)lane; j < width; j += 32) row[j] = values[j];
}

#ifdef SQUEEZE_EMULATION
SQUEEZE_EMULATION_KERNEL(gemm_f64_reference);
SQUEEZE_EMULATION_KERNEL(gptq_widen);
SQUEEZE_EMULATION_KERNEL(gptq_diagonal_mean);
SQUEEZE_EMULATION_KERNEL(gptq_damped_reversed);
SQUEEZE_EMULATION_KERNEL(gptq_cholesky_diagonal);
SQUEEZE_EMULATION_KERNEL(gptq_cholesky_panel);
SQUEEZE_EMULATION_KERNEL(gptq_invert_diagonal);
SQUEEZE_EMULATION_KERNEL(gptq_zero);
SQUEEZE_EMULATION_KERNEL(gptq_reverse_upper);
SQUEEZE_EMULATION_KERNEL(gptq_quantize_block);
#endif

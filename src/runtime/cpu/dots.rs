//! The register-tiled inner-product kernel of the CPU linear layers: `out[r·stride + f] = x[r]·w[f]` for a block of
//! weight rows `w` `[count, width]` against every input row `x` `[rows, width]` (both row-major), with AVX-512F or
//! AVX2 + FMA chosen at run time, [`fused_dot`] per pair otherwise.
//!
//! Layout of the tile: `R` input rows × `F` weight rows share one pass over `width`; each step loads `F` weight
//! vectors and `R` input vectors of 16 values for `R·F` fused multiply-adds into independent 16-lane accumulators
//! (on AVX2 a 16-lane accumulator is a pair of 8-lane registers). A partial tile at the edge repeats its last row
//! and drops those results. Input rows are taken [`ROW_BLOCK`] at a time so a block of `x` stays in L2 while every
//! weight row of the call passes over it.
//! Equation and order, the same on every instruction set ([`fused_dot`] is the scalar statement): lane `l` starts
//! at +0 and takes `acc = fma(x[k], w[k], acc)` for `k ≡ l (mod 16)` in ascending order, the last partial vector
//! padded with zeros; then `s_i = l_i + l_{i+8}` and `((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))`. This is
//! not [`super::dot`]'s order (8 lanes, multiply then add): the linear layers' sums differ from it by rounding.

/// Input rows per cache block: 128 rows of a 1024-wide layer are 512 KiB, a quarter of this machine's L2.
const ROW_BLOCK: usize = 128;

use crate::simd::{self, Level};

/// The kernel's value for one pair of rows (see the module comment): 16 fused multiply-add lanes, zero-padded
/// tail, a fixed reduction tree.
pub(crate) fn fused_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for (x, y) in a.chunks(16).zip(b.chunks(16)) {
        for (lane, acc) in lanes.iter_mut().enumerate() {
            let (x, y) = (x.get(lane).copied().unwrap_or(0.0), y.get(lane).copied().unwrap_or(0.0));
            *acc = x.mul_add(y, *acc);
        }
    }
    let s: [f32; 8] = std::array::from_fn(|i| lanes[i] + lanes[i + 8]);
    ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

/// `out[r * stride + f] = x[r]·w[f]` for `r < rows`, `f < count` (`x` `[rows, width]`, `w` `[count, width]`).
///
/// # Safety
/// `out` points at `(rows - 1) * stride + count` writable values (when `rows`, `count` > 0) that nothing else
/// reads or writes during the call; `stride ≥ count`.
pub unsafe fn block_into(x: &[f32], rows: usize, w: &[f32], count: usize, width: usize, out: *mut f32, stride: usize) {
    assert!(x.len() >= rows * width && w.len() >= count * width && stride >= count);
    if rows == 0 || count == 0 {
        return;
    }
    for first in (0..rows).step_by(ROW_BLOCK) {
        let block_rows = (rows - first).min(ROW_BLOCK);
        let x = &x[first * width..][..block_rows * width];
        // SAFETY: row `first` of `out` lies inside the caller's region.
        let out = unsafe { out.add(first * stride) };
        match simd::level() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU supports AVX-512F (its level); the slice lengths were checked above, `out` is the
            // caller's.
            Level::Avx512 => unsafe { x86::block_avx512(x, block_rows, w, count, width, out, stride) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU supports AVX2 and FMA (its level); as above.
            Level::Avx2 => unsafe { x86::block_avx2(x, block_rows, w, count, width, out, stride) },
            // SAFETY: as above.
            Level::Portable => unsafe { portable(x, block_rows, w, count, width, out, stride) },
        }
    }
}

/// [`block_into`] on a slice `[rows, stride]` (for the tests).
#[cfg(test)]
pub fn block(x: &[f32], rows: usize, w: &[f32], count: usize, width: usize, out: &mut [f32], stride: usize) {
    assert!(rows == 0 || out.len() >= (rows - 1) * stride + count);
    // SAFETY: `out` is borrowed mutably and long enough (checked above).
    unsafe { block_into(x, rows, w, count, width, out.as_mut_ptr(), stride) }
}

/// # Safety
/// As [`block_into`], with the lengths of `x` and `w` checked by the caller.
unsafe fn portable(x: &[f32], rows: usize, w: &[f32], count: usize, width: usize, out: *mut f32, stride: usize) {
    for feature in 0..count {
        let w_row = &w[feature * width..][..width];
        for row in 0..rows {
            // SAFETY: `row * stride + feature` lies inside the caller's region.
            unsafe { *out.add(row * stride + feature) = fused_dot(&x[row * width..][..width], w_row) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Start pointers of a tile's `N` rows from `first`, the last valid row repeated past `valid`.
    ///
    /// # Safety
    /// `base` points at `(first + valid) * width` readable values, `valid ≥ 1`.
    #[inline(always)]
    unsafe fn starts<const N: usize>(base: *const f32, first: usize, valid: usize, width: usize) -> [*const f32; N] {
        let mut pointers = [base; N];
        for (index, pointer) in pointers.iter_mut().enumerate() {
            // SAFETY: row `first + min(index, valid - 1)` lies inside the caller's slice.
            *pointer = unsafe { base.add((first + index.min(valid - 1)) * width) };
        }
        pointers
    }

    /// The reduction of a 16-lane accumulator held as lanes 0–7 and 8–15: `s_i = l_i + l_{i+8}`, then
    /// `((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))`.
    #[inline]
    #[target_feature(enable = "avx")]
    fn sum_lanes(low: __m256, high: __m256) -> f32 {
        let v = _mm256_add_ps(low, high);
        // [s0+s4, s1+s5, s2+s6, s3+s7] = [a, b, c, d]
        let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        // [a+b, b+a, c+d, d+c] (IEEE addition commutes exactly)
        let pairs = _mm_add_ps(quad, _mm_shuffle_ps(quad, quad, 0b10_11_00_01));
        _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehl_ps(pairs, pairs)))
    }

    /// Runs `tile` over every `R × F` tile of the call and stores the valid part of each: the tiles are computed
    /// by a function of their own, whose accumulators are indexed by constants only and so stay in registers (an
    /// edge tile's variable bounds in the same function made the compiler keep some of them in memory).
    ///
    /// # Safety
    /// `tile` may be called with `R` and `F` row pointers of `width` readable values; `out` as in
    /// [`super::block_into`]; `x`, `w` hold at least `rows·width`, `count·width` values.
    #[inline(always)]
    unsafe fn tiles<const R: usize, const F: usize>(
        (x, rows): (&[f32], usize),
        (w, count): (&[f32], usize),
        width: usize,
        (out, stride): (*mut f32, usize),
        tile: impl Fn(&[*const f32; R], &[*const f32; F], usize) -> [[f32; F]; R],
    ) {
        let mut f0 = 0;
        while f0 < count {
            let f_valid = (count - f0).min(F);
            // SAFETY: rows f0..f0 + f_valid of `w` exist.
            let w_rows: [*const f32; F] = unsafe { starts(w.as_ptr(), f0, f_valid, width) };
            let mut r0 = 0;
            while r0 < rows {
                let r_valid = (rows - r0).min(R);
                // SAFETY: rows r0..r0 + r_valid of `x` exist.
                let x_rows: [*const f32; R] = unsafe { starts(x.as_ptr(), r0, r_valid, width) };
                let sums = tile(&x_rows, &w_rows, width);
                for (i, row) in sums.iter().enumerate().take(r_valid) {
                    for (j, &sum) in row.iter().enumerate().take(f_valid) {
                        // SAFETY: row r0 + i < rows, feature f0 + j < count: inside the caller's region.
                        unsafe { *out.add((r0 + i) * stride + f0 + j) = sum };
                    }
                }
                r0 += R;
            }
            f0 += F;
        }
    }

    /// AVX-512F: 6 × 4 tiles of 16-lane accumulators (24 accumulators + 4 weight vectors + input of the 32
    /// registers); the last partial vector of a row is a masked load (zeros past the end).
    ///
    /// # Safety
    /// The CPU must support AVX-512F; `x`, `w` hold at least `rows·width`, `count·width` values; `out` as in
    /// [`super::block_into`].
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn block_avx512(
        x: &[f32],
        rows: usize,
        w: &[f32],
        count: usize,
        width: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY: the caller's guarantees; the CPU supports AVX-512F, and `tiles` passes rows of `width` values.
        unsafe {
            tiles::<6, 4>((x, rows), (w, count), width, (out, stride), |x, w, width| tile_avx512::<6>(x, w, width))
        }
    }

    /// One tile's sums on AVX-512F: its accumulators stay in registers and are reduced by [`sums_avx512`] here
    /// (returning them through memory to be reduced by the caller cost a 1.5 KiB clear, store and reload per tile,
    /// as much as the multiply-adds at widths of 32–64: the tiny models' narrow projections).
    ///
    /// # Safety
    /// The CPU must support AVX-512F; every pointer points at `width` readable values.
    #[inline(never)]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn tile_avx512<const R: usize>(
        x_rows: &[*const f32; R],
        w_rows: &[*const f32; 4],
        width: usize,
    ) -> [[f32; 4]; R] {
        const F: usize = 4;
        const LANES: usize = 16;
        let full = width / LANES * LANES;
        let mut acc = [[_mm512_setzero_ps(); F]; R];
        let mut k = 0;
        while k < full {
            let mut wv = [_mm512_setzero_ps(); F];
            for j in 0..F {
                // SAFETY: k + 16 ≤ width, inside row j.
                wv[j] = unsafe { _mm512_loadu_ps(w_rows[j].add(k)) };
            }
            for i in 0..R {
                // SAFETY: k + 16 ≤ width, inside row i.
                let xv = unsafe { _mm512_loadu_ps(x_rows[i].add(k)) };
                for j in 0..F {
                    acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
                }
            }
            k += LANES;
        }
        if full < width {
            let tail = ((1u32 << (width - full)) - 1) as __mmask16;
            let mut wv = [_mm512_setzero_ps(); F];
            for j in 0..F {
                // SAFETY: the unmasked lanes full..width lie inside row j; the others are not read.
                wv[j] = unsafe { _mm512_maskz_loadu_ps(tail, w_rows[j].add(full)) };
            }
            for i in 0..R {
                // SAFETY: as above, for row i.
                let xv = unsafe { _mm512_maskz_loadu_ps(tail, x_rows[i].add(full)) };
                for j in 0..F {
                    acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
                }
            }
        }
        sums_avx512(&acc)
    }

    /// The sums of a tile's 16-lane accumulators, four of a row at a time: the same tree as [`sum_lanes`] with
    /// every step done for four accumulators by one vector addition (128-bit blocks `A0..A3` of accumulator `A`).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn sums_avx512<const R: usize>(acc: &[[__m512; 4]; R]) -> [[f32; 4]; R] {
        let mut sums = [[0f32; 4]; R];
        for (row, [a, b, c, d]) in sums.iter_mut().zip(acc) {
            // s = l_i + l_{i+8}: [A0 + A2, A1 + A3, B0 + B2, B1 + B3] and the same for C, D.
            let ab =
                _mm512_add_ps(_mm512_shuffle_f32x4(*a, *b, 0b01_00_01_00), _mm512_shuffle_f32x4(*a, *b, 0b11_10_11_10));
            let cd =
                _mm512_add_ps(_mm512_shuffle_f32x4(*c, *d, 0b01_00_01_00), _mm512_shuffle_f32x4(*c, *d, 0b11_10_11_10));
            // q = s_i + s_{i+4}, one 128-bit block per accumulator: [qA, qB, qC, qD].
            let q =
                _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0b10_00_10_00), _mm512_shuffle_f32x4(ab, cd, 0b11_01_11_01));
            // [q0 + q1, q1 + q0, q2 + q3, q3 + q2] per block (IEEE addition commutes exactly), then
            // (q0 + q1) + (q2 + q3) in lane 0 of each block.
            let pairs = _mm512_add_ps(q, _mm512_permute_ps(q, 0b10_11_00_01));
            let total = _mm512_add_ps(pairs, _mm512_permute_ps(pairs, 0b01_00_11_10));
            // Lanes 0, 4, 8, 12.
            let picked =
                _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), total);
            // SAFETY: `row` holds four values.
            unsafe { _mm_storeu_ps(row.as_mut_ptr(), _mm512_castps512_ps128(picked)) };
        }
        sums
    }

    /// Loads lanes `from..from + 8` of a row whose values end at `end` (zeros past it).
    ///
    /// # Safety
    /// `row` points at `end` readable values.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load_8(row: *const f32, from: usize, end: usize) -> __m256 {
        if from + 8 <= end {
            // SAFETY: from + 8 ≤ end.
            return unsafe { _mm256_loadu_ps(row.add(from)) };
        }
        let valid = end.saturating_sub(from) as i32;
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        // SAFETY: only lanes below `valid` (inside the row) are read.
        unsafe { _mm256_maskload_ps(row.add(from.min(end)), mask) }
    }

    /// AVX2 + FMA, the same 16-lane arithmetic as [`block_avx512`] with each accumulator a pair of 8-lane registers:
    /// 2 × 2 tiles = 8 registers of accumulators + 2 weight vectors + input, of the 16.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; otherwise as [`block_avx512`].
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn block_avx2(
        x: &[f32],
        rows: usize,
        w: &[f32],
        count: usize,
        width: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY: the caller's guarantees; the CPU supports AVX2 and FMA, and `tiles` passes rows of `width` values.
        unsafe { tiles::<2, 2>((x, rows), (w, count), width, (out, stride), |x, w, width| tile_avx2(x, w, width)) }
    }

    /// One tile's sums on AVX2 + FMA (the accumulators reduced here by [`sums_avx2`], as on AVX-512).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; every pointer points at `width` readable values.
    #[inline(never)]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)] // constant indices: the accumulators stay in registers
    unsafe fn tile_avx2<const R: usize, const F: usize>(
        x_rows: &[*const f32; R],
        w_rows: &[*const f32; F],
        width: usize,
    ) -> [[f32; F]; R] {
        const LANES: usize = 16;
        let full = width / LANES * LANES;
        let mut acc = [[[_mm256_setzero_ps(); 2]; F]; R];
        let mut k = 0;
        while k < full {
            for half in 0..2 {
                let mut wv = [_mm256_setzero_ps(); F];
                for j in 0..F {
                    // SAFETY: k + 16 ≤ width, inside row j.
                    wv[j] = unsafe { _mm256_loadu_ps(w_rows[j].add(k + 8 * half)) };
                }
                for i in 0..R {
                    // SAFETY: as above, for row i.
                    let xv = unsafe { _mm256_loadu_ps(x_rows[i].add(k + 8 * half)) };
                    for j in 0..F {
                        acc[i][j][half] = _mm256_fmadd_ps(xv, wv[j], acc[i][j][half]);
                    }
                }
            }
            k += LANES;
        }
        if full < width {
            for half in 0..2 {
                let mut wv = [_mm256_setzero_ps(); F];
                for j in 0..F {
                    // SAFETY: row j holds `width` values.
                    wv[j] = unsafe { load_8(w_rows[j], full + 8 * half, width) };
                }
                for i in 0..R {
                    // SAFETY: row i holds `width` values.
                    let xv = unsafe { load_8(x_rows[i], full + 8 * half, width) };
                    for j in 0..F {
                        acc[i][j][half] = _mm256_fmadd_ps(xv, wv[j], acc[i][j][half]);
                    }
                }
            }
        }
        sums_avx2(&acc)
    }

    /// The sums of a tile's 16-lane accumulators held as pairs of 8-lane registers.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn sums_avx2<const R: usize, const F: usize>(acc: &[[[__m256; 2]; F]; R]) -> [[f32; F]; R] {
        std::array::from_fn(|i| std::array::from_fn(|j| sum_lanes(acc[i][j][0], acc[i][j][1])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(seed: &mut u64, count: usize) -> Vec<f32> {
        (0..count)
            .map(|_| {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Every output equals `fused_dot` of its two rows, bit for bit, and lies within rounding of a float64 sum.
    fn check(run: impl Fn(&[f32], usize, &[f32], usize, usize, &mut [f32], usize)) {
        let mut seed = 7;
        // Awkward shapes: partial tiles in both directions, widths with and without a vector tail, more rows than
        // a cache block.
        for &(rows, count, width) in
            &[(1, 1, 1), (5, 7, 37), (3, 4, 16), (13, 9, 203), (4, 11, 1000), (2, 3, 8), (131, 13, 45), (7, 5, 24)]
        {
            let x = values(&mut seed, rows * width);
            let w = values(&mut seed, count * width);
            let stride = count + 3;
            let mut out = vec![f32::NAN; rows * stride];
            run(&x, rows, &w, count, width, &mut out, stride);
            for f in 0..count {
                for r in 0..rows {
                    let (x_row, w_row) = (&x[r * width..][..width], &w[f * width..][..width]);
                    let want = fused_dot(x_row, w_row);
                    let got = out[r * stride + f];
                    assert_eq!(got.to_bits(), want.to_bits(), "rows {rows} count {count} width {width} at ({r}, {f})");
                    let exact: f64 = x_row.iter().zip(w_row).map(|(a, b)| *a as f64 * *b as f64).sum();
                    assert!((got as f64 - exact).abs() < 1e-4, "fused_dot itself is off: {got} vs {exact}");
                }
                for r in 0..rows {
                    for pad in count..stride {
                        assert!(out[r * stride + pad].is_nan(), "wrote outside the block at ({r}, {pad})");
                    }
                }
            }
        }
    }

    #[test]
    fn chosen_kernel_is_fused_dot_bit_for_bit() {
        check(block);
    }

    #[test]
    fn portable_kernel_is_fused_dot_bit_for_bit() {
        // SAFETY: `check` sizes `out` as `[rows, stride]`.
        check(|x, rows, w, count, width, out, stride| unsafe {
            portable(x, rows, w, count, width, out.as_mut_ptr(), stride)
        });
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_kernel_is_fused_dot_bit_for_bit() {
        if crate::simd::level() < crate::simd::Level::Avx2 {
            eprintln!("skipped: this CPU has no AVX2 with FMA");
            return;
        }
        // SAFETY: AVX2 and FMA are present; `check` sizes the slices as the kernel requires.
        check(|x, rows, w, count, width, out, stride| unsafe {
            x86::block_avx2(x, rows, w, count, width, out.as_mut_ptr(), stride)
        });
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_kernel_is_fused_dot_bit_for_bit() {
        if crate::simd::level() < crate::simd::Level::Avx512 {
            eprintln!("skipped: this CPU has no AVX-512F");
            return;
        }
        // SAFETY: AVX-512F is present; `check` sizes the slices as the kernel requires.
        check(|x, rows, w, count, width, out, stride| unsafe {
            x86::block_avx512(x, rows, w, count, width, out.as_mut_ptr(), stride)
        });
    }
}

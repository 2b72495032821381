//! The broadcast kernel of the attention's two products and of KDA's chunk products, `C = A·B` with `B` row-major
//! (scores against keys stored transposed, weights against values as stored): `c[r][j] = Σ_k a[r][k]·b[k][j]`, each
//! `a[r][k]` broadcast against a row of `b` held in vectors, so no sum needs a horizontal reduction (which dominated
//! the inner-product kernel of the CPU backend's `dots` at the attention's widths of 32–64).
//!
//! Equation and order, the same on every instruction set ([`portable`] is the scalar statement): every output
//! starts at +0 and takes `acc = fma(a[r][k], b[k][j], acc)` for `k` ascending. AVX-512F runs tiles of 6 rows × 64
//! columns (24 accumulators), AVX2 + FMA tiles of 4 rows × 16 columns; columns past the end are masked.

/// `c[r·ldc + j] = Σ_{k < depth} a[r·lda + k] · b[k·ldb + j]` for `r < rows`, `j < cols` (see the module comment
/// for the order): each operand with its row stride, `[rows, depth, cols]` the problem. Writes nothing else of `c`.
pub fn gemm(
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    [rows, depth, cols]: [usize; 3],
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(lda >= depth && ldb >= cols && ldc >= cols);
    assert!(a.len() >= (rows - 1) * lda + depth && c.len() >= (rows - 1) * ldc + cols);
    assert!(depth == 0 || b.len() >= (depth - 1) * ldb + cols);
    #[cfg(target_arch = "x86_64")]
    match crate::simd::level() {
        crate::simd::Level::Avx512 => {
            // SAFETY: the CPU supports AVX-512F; the extents of `a`, `b`, `c` were checked above.
            return unsafe {
                x86::gemm_avx512((a.as_ptr(), lda), (b.as_ptr(), ldb), (c.as_mut_ptr(), ldc), [rows, depth, cols])
            };
        }
        crate::simd::Level::Avx2 => {
            // SAFETY: the CPU supports AVX2 and FMA; as above.
            return unsafe {
                x86::gemm_avx2((a.as_ptr(), lda), (b.as_ptr(), ldb), (c.as_mut_ptr(), ldc), [rows, depth, cols])
            };
        }
        crate::simd::Level::Portable => {}
    }
    portable((a, lda), (b, ldb), (c, ldc), [rows, depth, cols])
}

/// The definition, one output at a time.
fn portable(
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    [rows, depth, cols]: [usize; 3],
) {
    for r in 0..rows {
        for j in 0..cols {
            let mut acc = 0f32;
            for k in 0..depth {
                acc = a[r * lda + k].mul_add(b[k * ldb + j], acc);
            }
            c[r * ldc + j] = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX-512F; `a`, `b`, `c` cover the extents [`super::gemm`] checks.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gemm_avx512(
        (a, lda): (*const f32, usize),
        (b, ldb): (*const f32, usize),
        (c, ldc): (*mut f32, usize),
        [rows, depth, cols]: [usize; 3],
    ) {
        const R: usize = 6;
        let mut col = 0;
        while col < cols {
            let width = (cols - col).min(64);
            let mut masks = [0 as __mmask16; 4];
            for (v, mask) in masks.iter_mut().enumerate() {
                let lanes = width.saturating_sub(16 * v).min(16);
                *mask = ((1u32 << lanes) - 1) as __mmask16;
            }
            let mut row = 0;
            while row < rows {
                // SAFETY: rows row..row + R (or row alone) and columns col..col + width lie inside the extents.
                unsafe {
                    let (a, b, c) = (a.add(row * lda), b.add(col), c.add(row * ldc + col));
                    match (rows - row >= R, width.div_ceil(16)) {
                        (true, 4) => tile_avx512::<R, 4>((a, lda), (b, ldb), depth, (c, ldc), masks),
                        (true, 3) => tile_avx512::<R, 3>((a, lda), (b, ldb), depth, (c, ldc), masks),
                        (true, 2) => tile_avx512::<R, 2>((a, lda), (b, ldb), depth, (c, ldc), masks),
                        (true, _) => tile_avx512::<R, 1>((a, lda), (b, ldb), depth, (c, ldc), masks),
                        (false, 4) => tile_avx512::<1, 4>((a, lda), (b, ldb), depth, (c, ldc), masks),
                        (false, 3) => tile_avx512::<1, 3>((a, lda), (b, ldb), depth, (c, ldc), masks),
                        (false, 2) => tile_avx512::<1, 2>((a, lda), (b, ldb), depth, (c, ldc), masks),
                        (false, _) => tile_avx512::<1, 1>((a, lda), (b, ldb), depth, (c, ldc), masks),
                    }
                }
                row += if rows - row >= R { R } else { 1 };
            }
            col += 64;
        }
    }

    /// `R` rows × `V` vectors of 16 columns (lanes outside `masks` neither read nor written).
    ///
    /// # Safety
    /// The CPU must support AVX-512F; rows `0..R` of `a` hold `depth` values, rows `0..depth` of `b` and rows
    /// `0..R` of `c` the unmasked lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile_avx512<const R: usize, const V: usize>(
        (a, lda): (*const f32, usize),
        (b, ldb): (*const f32, usize),
        depth: usize,
        (c, ldc): (*mut f32, usize),
        masks: [__mmask16; 4],
    ) {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for k in 0..depth {
            let mut bv = [_mm512_setzero_ps(); V];
            for v in 0..V {
                // SAFETY: the unmasked lanes of row k lie inside `b` (the caller's extents).
                bv[v] = unsafe { _mm512_maskz_loadu_ps(masks[v], b.add(k * ldb + 16 * v)) };
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: row r holds `depth` values.
                let av = _mm512_set1_ps(unsafe { *a.add(r * lda + k) });
                for v in 0..V {
                    acc[v] = _mm512_fmadd_ps(av, bv[v], acc[v]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for v in 0..V {
                // SAFETY: the unmasked lanes of row r lie inside `c`.
                unsafe { _mm512_mask_storeu_ps(c.add(r * ldc + 16 * v), masks[v], acc[v]) };
            }
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; `a`, `b`, `c` cover the extents [`super::gemm`] checks.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gemm_avx2(
        (a, lda): (*const f32, usize),
        (b, ldb): (*const f32, usize),
        (c, ldc): (*mut f32, usize),
        [rows, depth, cols]: [usize; 3],
    ) {
        const R: usize = 4;
        let mut col = 0;
        while col < cols {
            let width = (cols - col).min(16);
            let mut masks = [_mm256_setzero_si256(); 2];
            for (v, mask) in masks.iter_mut().enumerate() {
                let lanes = width.saturating_sub(8 * v).min(8) as i32;
                *mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            }
            let mut row = 0;
            while row < rows {
                // SAFETY: as in `gemm_avx512`.
                unsafe {
                    let (a, b, c) = (a.add(row * lda), b.add(col), c.add(row * ldc + col));
                    if rows - row >= R {
                        tile_avx2::<R>((a, lda), (b, ldb), depth, (c, ldc), masks);
                    } else {
                        tile_avx2::<1>((a, lda), (b, ldb), depth, (c, ldc), masks);
                    }
                }
                row += if rows - row >= R { R } else { 1 };
            }
            col += 16;
        }
    }

    /// `R` rows × 16 columns as two 8-lane vectors (lanes outside `masks` neither read nor written).
    ///
    /// # Safety
    /// As [`tile_avx512`], on AVX2 with FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const R: usize>(
        (a, lda): (*const f32, usize),
        (b, ldb): (*const f32, usize),
        depth: usize,
        (c, ldc): (*mut f32, usize),
        masks: [__m256i; 2],
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for k in 0..depth {
            let mut bv = [_mm256_setzero_ps(); 2];
            for v in 0..2 {
                // SAFETY: the unmasked lanes of row k lie inside `b`.
                bv[v] = unsafe { _mm256_maskload_ps(b.add(k * ldb + 8 * v), masks[v]) };
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: row r holds `depth` values.
                let av = _mm256_set1_ps(unsafe { *a.add(r * lda + k) });
                for v in 0..2 {
                    acc[v] = _mm256_fmadd_ps(av, bv[v], acc[v]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for v in 0..2 {
                // SAFETY: the unmasked lanes of row r lie inside `c`.
                unsafe { _mm256_maskstore_ps(c.add(r * ldc + 8 * v), masks[v], acc[v]) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    type Run = dyn Fn(&[f32], usize, &[f32], usize, usize, usize, usize, &mut [f32], usize);

    /// Every output equals the scalar definition bit for bit, nothing outside the block is written, and the
    /// definition itself is within rounding of a float64 sum.
    fn check(run: &Run) {
        let mut rng = Rng::new(11);
        for &(rows, depth, cols) in
            &[(1, 1, 1), (7, 48, 33), (6, 32, 64), (13, 5, 130), (1, 300, 17), (12, 0, 9), (25, 64, 80), (5, 17, 15)]
        {
            let (lda, ldb, ldc) = (depth + 3, cols + 5, cols + 2);
            let a: Vec<f32> = (0..rows * lda).map(|_| rng.normal()).collect();
            let b: Vec<f32> = (0..depth.max(1) * ldb).map(|_| rng.normal()).collect();
            let mut want = vec![f32::NAN; rows * ldc];
            portable((&a, lda), (&b, ldb), (&mut want, ldc), [rows, depth, cols]);
            let mut got = vec![f32::NAN; rows * ldc];
            run(&a, lda, &b, ldb, rows, depth, cols, &mut got, ldc);
            for r in 0..rows {
                for j in 0..ldc {
                    let (w, g) = (want[r * ldc + j], got[r * ldc + j]);
                    if j >= cols {
                        assert!(g.is_nan(), "wrote outside the block at ({r}, {j})");
                        continue;
                    }
                    assert_eq!(g.to_bits(), w.to_bits(), "{rows}x{depth}x{cols} at ({r}, {j})");
                    let exact: f64 = (0..depth).map(|k| a[r * lda + k] as f64 * b[k * ldb + j] as f64).sum();
                    assert!((w as f64 - exact).abs() < 1e-4 * (1.0 + depth as f64), "{w} vs {exact}");
                }
            }
        }
    }

    #[test]
    fn chosen_kernel_is_the_definition_bit_for_bit() {
        check(&|a, lda, b, ldb, rows, depth, cols, c, ldc| gemm((a, lda), (b, ldb), (c, ldc), [rows, depth, cols]));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_kernel_is_the_definition_bit_for_bit() {
        if crate::simd::level() < crate::simd::Level::Avx2 {
            eprintln!("skipped: this CPU has no AVX2 with FMA");
            return;
        }
        // SAFETY: AVX2 and FMA are present; `check` sizes the slices as `gemm` requires.
        check(&|a, lda, b, ldb, rows, depth, cols, c, ldc| unsafe {
            x86::gemm_avx2((a.as_ptr(), lda), (b.as_ptr(), ldb), (c.as_mut_ptr(), ldc), [rows, depth, cols])
        });
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_kernel_is_the_definition_bit_for_bit() {
        if crate::simd::level() < crate::simd::Level::Avx512 {
            eprintln!("skipped: this CPU has no AVX-512F");
            return;
        }
        // SAFETY: AVX-512F is present; `check` sizes the slices as `gemm` requires.
        check(&|a, lda, b, ldb, rows, depth, cols, c, ldc| unsafe {
            x86::gemm_avx512((a.as_ptr(), lda), (b.as_ptr(), ldb), (c.as_mut_ptr(), ldc), [rows, depth, cols])
        });
    }
}

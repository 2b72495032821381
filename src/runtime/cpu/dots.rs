//! The register-tiled inner-product kernel of the CPU linear layers: `out[f·rows + r] = x[r]·w[f]` for a block of
//! weight rows `w` `[count, width]` against every input row `x` `[rows, width]` (both row-major), with AVX2 (or
//! AVX2 on AVX-512VL's 32 registers) chosen at run time, [`super::dot`] per pair otherwise.
//!
//! Layout of the tile: `R` input rows × `F` weight rows share one pass over `width`; each step loads `F` weight
//! vectors and `R` input vectors of 8 values for `R·F` products into independent 8-lane accumulators. A partial
//! tile at the edge repeats its last row and drops those results.
//! Equation and order: every value is [`super::dot`]'s, bit for bit — lane `l` adds the rounded products of the
//! elements `k ≡ l (mod 8)` in order (multiply, then add; no fused multiply-add), the lanes are reduced as
//! `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`, then the scalar tail is added. So the CPU backend's
//! linear layers keep the arithmetic the goldens and the CUDA backend's checks were made against.

use super::dot;

/// Which instruction set the kernel runs on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

fn isa() -> Isa {
    static CHOSEN: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512vl")
            {
                return Isa::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    })
}

/// `out[f * rows + r] = x[r]·w[f]` for `r < rows`, `f < count` (`x` `[rows, width]`, `w` `[count, width]`).
pub fn block(x: &[f32], rows: usize, w: &[f32], count: usize, width: usize, out: &mut [f32]) {
    assert!(x.len() >= rows * width && w.len() >= count * width && out.len() >= rows * count);
    if rows == 0 || count == 0 {
        return;
    }
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU supports AVX2, AVX-512F and VL (checked in `isa`); the slice lengths were checked above.
        Isa::Avx512 => unsafe { x86::block_avx512(x, rows, w, count, width, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU supports AVX2 (checked in `isa`); the slice lengths were checked above.
        Isa::Avx2 => unsafe { x86::block_avx2(x, rows, w, count, width, out) },
        Isa::Portable => portable(x, rows, w, count, width, out),
    }
}

fn portable(x: &[f32], rows: usize, w: &[f32], count: usize, width: usize, out: &mut [f32]) {
    for feature in 0..count {
        let w_row = &w[feature * width..][..width];
        for row in 0..rows {
            out[feature * rows + row] = dot(&x[row * width..][..width], w_row);
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

    /// [`super::dot`]'s reduction of its eight lanes: `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`.
    #[inline]
    #[target_feature(enable = "avx")]
    fn sum_lanes(v: __m256) -> f32 {
        // [l0+l4, l1+l5, l2+l6, l3+l7] = [a, b, c, d]
        let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        // [a+b, b+a, c+d, d+c] (IEEE addition commutes exactly)
        let pairs = _mm_add_ps(quad, _mm_shuffle_ps(quad, quad, 0b10_11_00_01));
        _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehl_ps(pairs, pairs)))
    }

    /// One tiled kernel per instruction set: `R` × `F` tiles of 8-lane accumulators, each lane adding its rounded
    /// products in [`super::dot`]'s order (multiply, then add: no fused multiply-add, so the sums are dot's).
    macro_rules! exact_kernel {
        ($name:ident, $features:literal, $rows:literal, $weights:literal) => {
            /// # Safety
            #[doc = concat!("The CPU must support ", $features, "; `x`, `w`, `out` hold at least `rows·width`, ")]
            /// `count·width`, `rows·count` values.
            #[target_feature(enable = $features)]
            pub unsafe fn $name(x: &[f32], rows: usize, w: &[f32], count: usize, width: usize, out: &mut [f32]) {
                const R: usize = $rows;
                const F: usize = $weights;
                const LANES: usize = 8;
                let full = width / LANES * LANES;
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
                        let mut acc = [[_mm256_setzero_ps(); F]; R];
                        let mut k = 0;
                        while k < full {
                            let mut wv = [_mm256_setzero_ps(); F];
                            for j in 0..F {
                                // SAFETY: k + 8 ≤ width, inside row j.
                                wv[j] = unsafe { _mm256_loadu_ps(w_rows[j].add(k)) };
                            }
                            for i in 0..R {
                                // SAFETY: k + 8 ≤ width, inside row i.
                                let xv = unsafe { _mm256_loadu_ps(x_rows[i].add(k)) };
                                for j in 0..F {
                                    acc[i][j] = _mm256_add_ps(acc[i][j], _mm256_mul_ps(xv, wv[j]));
                                }
                            }
                            k += LANES;
                        }
                        for i in 0..r_valid {
                            for j in 0..f_valid {
                                let mut tail = 0f32;
                                for t in full..width {
                                    tail += x[(r0 + i) * width + t] * w[(f0 + j) * width + t];
                                }
                                out[(f0 + j) * rows + r0 + i] = sum_lanes(acc[i][j]) + tail;
                            }
                        }
                        r0 += R;
                    }
                    f0 += F;
                }
            }
        };
    }

    // AVX2: 3 × 3 accumulators + 3 weight vectors + input + product: 14 of the 16 registers.
    exact_kernel!(block_avx2, "avx2", 3, 3);
    // With AVX-512VL the same 256-bit code has 32 registers: 4 × 4 accumulators + 4 weights + input + product.
    exact_kernel!(block_avx512, "avx2,avx512f,avx512vl", 4, 4);
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

    /// Every output equals `dot` of its two rows, bit for bit (and so lies within rounding of a float64 sum).
    fn check(run: impl Fn(&[f32], usize, &[f32], usize, usize, &mut [f32])) {
        let mut seed = 7;
        // Awkward shapes: partial tiles in both directions, widths with and without a vector tail.
        for &(rows, count, width) in &[(1, 1, 1), (5, 7, 37), (3, 4, 16), (13, 9, 203), (4, 11, 1000), (2, 3, 8)] {
            let x = values(&mut seed, rows * width);
            let w = values(&mut seed, count * width);
            let mut out = vec![f32::NAN; rows * count];
            run(&x, rows, &w, count, width, &mut out);
            for f in 0..count {
                for r in 0..rows {
                    let (x_row, w_row) = (&x[r * width..][..width], &w[f * width..][..width]);
                    let want = dot(x_row, w_row);
                    let got = out[f * rows + r];
                    assert_eq!(got.to_bits(), want.to_bits(), "rows {rows} count {count} width {width} at ({r}, {f})");
                    let exact: f64 = x_row.iter().zip(w_row).map(|(a, b)| *a as f64 * *b as f64).sum();
                    assert!((got as f64 - exact).abs() < 1e-4, "dot itself is off: {got} vs {exact}");
                }
            }
        }
    }

    #[test]
    fn chosen_kernel_is_dot_bit_for_bit() {
        check(block);
    }

    #[test]
    fn portable_kernel_is_dot_bit_for_bit() {
        check(portable);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_kernel_is_dot_bit_for_bit() {
        if !std::is_x86_feature_detected!("avx2") {
            eprintln!("skipped: this CPU has no AVX2");
            return;
        }
        // SAFETY: AVX2 is present; `check` sizes the slices as the kernel requires.
        check(|x, rows, w, count, width, out| unsafe { x86::block_avx2(x, rows, w, count, width, out) });
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_kernel_is_dot_bit_for_bit() {
        if !(std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vl")) {
            eprintln!("skipped: this CPU has no AVX-512F with VL");
            return;
        }
        // SAFETY: AVX2, AVX-512F and VL are present; `check` sizes the slices as the kernel requires.
        check(|x, rows, w, count, width, out| unsafe { x86::block_avx512(x, rows, w, count, width, out) });
    }
}

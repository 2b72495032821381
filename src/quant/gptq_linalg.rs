//! GPTQ's dense linear algebra on `faer`: the Hessian accumulation `H += XᵀX` (a SYRK into one triangle), the
//! factor `U` with `Uᵀ U = (H + λI)⁻¹` (one Cholesky factorization and one triangular inverse) and the deferred
//! block updates `W[:, later] −= E · U[block, later]` (GEMMs).
//!
//! The factor comes from the Cholesky factorization of `H` with rows and columns in reverse order: with `J` the
//! reversal, `J H J = L Lᵀ` gives `H⁻¹ = (J L⁻¹ J)ᵀ (J L⁻¹ J)`, and `J L⁻¹ J` is upper triangular, so it is `U`
//! (the reference implementations compute `H⁻¹` and factor it again: twice the work, the same `U` up to rounding).
//!
//! faer blocks and vectorizes these products (AVX2/AVX-512 with FMA where the CPU has them), so the float
//! summation order is faer's, not the textbook loop's: results are deterministic for a given CPU kind, the same
//! whatever the thread count (faer splits the work by output blocks, never a sum; the tests check it), but may
//! differ in the last bits between CPUs with different vector units.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch, LltError};
use faer::linalg::matmul::matmul;
use faer::linalg::matmul::triangular::{self, BlockStructure};
use faer::linalg::triangular_inverse::invert_lower_triangular;
use std::ops::Range;

use faer::{Accum, MatMut, MatRef, Par};

/// Calibration inputs converted to f64 and multiplied per pass of the Hessian accumulation (bounds the f64 copy:
/// `TOKENS_PER_PASS × columns × 8` bytes, 25 MB at 6144 columns).
const TOKENS_PER_PASS: usize = 512;

/// All the threads of the current rayon pool.
pub(super) fn all_threads() -> Par {
    Par::rayon(0)
}

/// Adds `Σ_t x_t x_tᵀ` over the rows `x_t` of `inputs` (row-major `[tokens, n]`) to the upper triangle (`j ≥ i`)
/// of the row-major `[n, n]` `sum`, in f64.
pub(super) fn add_outer_products(sum: &mut [f64], n: usize, inputs: &[f32], par: Par) {
    if n == 0 {
        return;
    }
    // The row-major upper triangle is the lower triangle of the same memory read column-major.
    let mut target = MatMut::from_column_major_slice_mut(sum, n, n);
    let mut wide = Vec::with_capacity(TOKENS_PER_PASS.min(inputs.len() / n) * n);
    for chunk in inputs.chunks(TOKENS_PER_PASS * n) {
        wide.clear();
        wide.extend(chunk.iter().map(|&v| v as f64));
        // Column t of `xt` is input row t.
        let xt = MatRef::from_column_major_slice(&wide, n, chunk.len() / n);
        triangular::matmul(
            target.as_mut(),
            BlockStructure::TriangularLower,
            Accum::Add,
            xt,
            BlockStructure::Rectangular,
            xt.transpose(),
            BlockStructure::Rectangular,
            1.0,
            par,
        );
    }
}

/// `U`, upper triangular with `Uᵀ U = a⁻¹`, row-major `[n, n]`, from the symmetric positive-definite `a`
/// (row-major, overwritten); or a column where `a` is not positive definite: the first row holding a non-finite
/// entry, else the column whose pivot failed (the factorization runs from the last column to the first).
pub(super) fn inverse_upper_factor(a: &mut [f64], n: usize, par: Par) -> Result<Vec<f64>, usize> {
    // A non-finite entry (in row-major order, the first is in the lowest row of any, and `a` is symmetric).
    if let Some(index) = a.iter().position(|v| !v.is_finite()) {
        return Err(index / n);
    }
    let mut upper = vec![0.0; n * n];
    if n == 0 {
        return Ok(upper);
    }
    let mut a = MatMut::from_column_major_slice_mut(a, n, n);
    let mut buffer = MemBuffer::new(cholesky_in_place_scratch::<f64>(n, par, Default::default()));
    cholesky_in_place(
        a.as_mut().reverse_rows_and_cols_mut(),
        Default::default(),
        par,
        MemStack::new(&mut buffer),
        Default::default(),
    )
    .map_err(|LltError::NonPositivePivot { index }| n - 1 - index)?;
    let target = MatMut::from_row_major_slice_mut(&mut upper, n, n);
    invert_lower_triangular(target.reverse_rows_and_cols_mut(), a.as_ref().reverse_rows_and_cols(), par);
    Ok(upper)
}

/// GPTQ's errors of the columns `first..first + stride` of a few rows: row-major `[rows, stride]`.
pub(super) struct BlockErrors<T> {
    pub values: T,
    pub first: usize,
    pub stride: usize,
}

/// `w[:, to] −= errors[:, from] · factor[from, to]` (GPTQ's deferred feedback of the columns `from` to the later
/// columns `to`) for the rows of `w` (row-major `[rows, columns]`) and `errors`, `factor` row-major
/// `[columns, columns]`, on `par`.
pub(super) fn subtract_feedback(
    w: &mut [f64],
    columns: usize,
    factor: &[f64],
    errors: BlockErrors<&[f64]>,
    from: Range<usize>,
    to: Range<usize>,
    par: Par,
) {
    let rows = w.len() / columns.max(1);
    if rows == 0 || from.is_empty() || to.is_empty() {
        return;
    }
    let target = MatMut::from_row_major_slice_mut(w, rows, columns).subcols_mut(to.start, to.len());
    let errors = MatRef::from_row_major_slice(&errors.values[..rows * errors.stride], rows, errors.stride)
        .subcols(from.start - errors.first, from.len());
    let factor =
        MatRef::from_row_major_slice(factor, columns, columns).submatrix(from.start, to.start, from.len(), to.len());
    matmul(target, Accum::Add, errors, factor, -1.0, par);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.normal()).collect()
    }

    /// The textbook accumulation, Cholesky, inverse and second Cholesky in f64 (the reference implementations'
    /// path to `U`), for comparison within rounding.
    fn reference_upper(a: &[f64], n: usize) -> Vec<f64> {
        let cholesky = |a: &[f64]| {
            let mut l = vec![0.0; n * n];
            for i in 0..n {
                for j in 0..=i {
                    let dot: f64 = (0..j).map(|k| l[i * n + k] * l[j * n + k]).sum();
                    l[i * n + j] =
                        if i == j { (a[i * n + i] - dot).sqrt() } else { (a[i * n + j] - dot) / l[j * n + j] };
                }
            }
            l
        };
        let l = cholesky(a);
        let mut m = vec![0.0; n * n];
        for c in 0..n {
            m[c * n + c] = 1.0 / l[c * n + c];
            for i in c + 1..n {
                m[i * n + c] = -(c..i).map(|k| l[i * n + k] * m[k * n + c]).sum::<f64>() / l[i * n + i];
            }
        }
        let mut inverse = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                inverse[i * n + j] = (i.max(j)..n).map(|k| m[k * n + i] * m[k * n + j]).sum();
            }
        }
        let second = cholesky(&inverse);
        (0..n * n).map(|index| second[(index % n) * n + index / n]).collect()
    }

    fn damped(inputs: &[f32], n: usize) -> Vec<f64> {
        let mut sum = vec![0.0; n * n];
        add_outer_products(&mut sum, n, inputs, Par::Seq);
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in i..n {
                a[i * n + j] = sum[i * n + j];
                a[j * n + i] = sum[i * n + j];
            }
        }
        let mean = (0..n).map(|i| a[i * n + i]).sum::<f64>() / n as f64;
        for i in 0..n {
            a[i * n + i] += 0.01 * mean;
        }
        a
    }

    #[test]
    fn outer_products_fill_the_upper_triangle() {
        let (n, tokens) = (37, TOKENS_PER_PASS + 9);
        let mut rng = Rng::new(1);
        let inputs = random(&mut rng, tokens * n);
        let mut sum = vec![0.0; n * n];
        add_outer_products(&mut sum, n, &inputs, Par::Seq);
        for i in 0..n {
            for j in 0..n {
                let expected: f64 = inputs.chunks(n).map(|x| x[i] as f64 * x[j] as f64).sum();
                if j >= i {
                    assert!((sum[i * n + j] - expected).abs() <= 1e-12 * tokens as f64, "({i}, {j})");
                } else {
                    assert_eq!(sum[i * n + j], 0.0, "({i}, {j}) is below the diagonal");
                }
            }
        }
    }

    #[test]
    fn factor_equals_the_textbook_one_within_rounding() {
        for (seed, n) in [1usize, 2, 7, 33, 130].into_iter().enumerate() {
            let mut rng = Rng::new(10 + seed as u64);
            // Fewer samples than columns: rank-deficient, the damping makes it definite.
            let a = damped(&random(&mut rng, (n / 2 + 3) * n), n);
            let expected = reference_upper(&a, n);
            let upper = inverse_upper_factor(&mut a.clone(), n, Par::Seq).unwrap();
            let scale = expected.iter().fold(0f64, |m, v| m.max(v.abs()));
            for i in 0..n {
                for j in 0..n {
                    let (got, want) = (upper[i * n + j], if j >= i { expected[i * n + j] } else { 0.0 });
                    assert!((got - want).abs() <= 1e-9 * scale, "n={n} ({i}, {j}): {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        // Sizes past faer's blocking and parallel thresholds, and more tokens than one pass.
        let (n, tokens) = (700, 2 * TOKENS_PER_PASS + 77);
        let mut rng = Rng::new(3);
        let inputs = random(&mut rng, tokens * n);
        let run = |par: Par| {
            let mut sum = vec![0.0; n * n];
            add_outer_products(&mut sum, n, &inputs, par);
            let mut a = sum.clone();
            for i in 0..n {
                for j in 0..i {
                    a[i * n + j] = a[j * n + i];
                }
                a[i * n + i] += 1.0;
            }
            (sum, inverse_upper_factor(&mut a, n, par).unwrap())
        };
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let (sum, upper) = run(Par::Seq);
        for threads in [2, 3, 8] {
            let (other_sum, other_upper) = run(Par::rayon(threads));
            assert!(bits(&sum) == bits(&other_sum), "hessian differs at {threads} threads");
            assert!(bits(&upper) == bits(&other_upper), "factor differs at {threads} threads");
        }
    }

    #[test]
    fn not_positive_definite_names_a_column() {
        let n = 9;
        let mut rng = Rng::new(4);
        let a = damped(&random(&mut rng, 20 * n), n);
        let mut bad = a.clone();
        bad[5 * n + 5] = -1.0;
        assert_eq!(inverse_upper_factor(&mut bad, n, Par::Seq), Err(5));
        let mut nan = a.clone();
        nan[3 * n + 6] = f64::NAN;
        nan[6 * n + 3] = f64::NAN;
        assert_eq!(inverse_upper_factor(&mut nan, n, Par::Seq), Err(3));
    }

    /// A benchmark, not a test (run by `scripts/bench-methods-large.sh --factor`; asserts nothing about time): the
    /// Hessian accumulation of `GPTQ_TOKENS` (default 2048) inputs and the factor, at GLM-5's expert widths (6144
    /// for gate/up, 2048 for down; `GPTQ_FACTOR_SIZES=a,b` for others), on all the pool's threads.
    #[test]
    #[ignore = "benchmark; prints timings"]
    fn factor_timing() {
        let sizes: Vec<usize> = std::env::var("GPTQ_FACTOR_SIZES")
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|_| vec![2048, 6144]);
        let tokens: usize = std::env::var("GPTQ_TOKENS").ok().and_then(|v| v.parse().ok()).unwrap_or(2048);
        let threads = rayon::current_num_threads();
        for n in sizes {
            let mut rng = Rng::new(7);
            let inputs = random(&mut rng, tokens * n);
            let started = std::time::Instant::now();
            let mut sum = vec![0.0; n * n];
            add_outer_products(&mut sum, n, &inputs, all_threads());
            let hessian = started.elapsed().as_secs_f64();
            for i in 0..n {
                for j in 0..i {
                    sum[i * n + j] = sum[j * n + i];
                }
                sum[i * n + i] += 1.0;
            }
            let started = std::time::Instant::now();
            let upper = inverse_upper_factor(&mut sum, n, all_threads()).unwrap();
            let factor = started.elapsed().as_secs_f64();
            println!(
                "factor n={n}: hessian of {tokens} tokens {hessian:.3} s, factor {factor:.3} s on {threads} threads \
                 (U[0][0] = {:e})",
                upper[0]
            );
        }
    }
}

//! The factor GPTQ's error feedback needs, in cache-sized parallel pieces: the Cholesky factorization of a
//! symmetric positive-definite f64 matrix and the inverse `(L Lᵀ)⁻¹` from its factor. Every element is the same
//! sequence of f64 operations as the plain sequential algorithm (each dot product summed in ascending order from
//! the value `sum()` starts from, no fused multiply-add), so results are bit-identical to it and independent of the
//! thread count (the tests keep the sequential algorithm as the reference).

use rayon::prelude::*;

use super::gptq::GptqError;

/// Independent sums advanced together in the factor's dot products (instruction-level parallelism, and one load
/// of the shared operand for all of them); each is still added in ascending order.
const CHAINS: usize = 8;

/// Columns of a Cholesky factor computed per pass over the rows below them (their pivot rows stay in cache).
const PANEL: usize = 16;

/// The value an f64 `Iterator::sum` starts from (−0.0 in current Rust). The interleaved sums start from it too,
/// so each equals the sequential `sum()` of the same products bit for bit.
fn sum_start() -> f64 {
    std::iter::empty::<f64>().sum()
}

/// `Σ_{k ∈ range} a[k]·b[k]`, summed in ascending `k` by `sum()`.
fn dot(a: &[f64], b: &[f64], range: std::ops::Range<usize>) -> f64 {
    a[range.clone()].iter().zip(&b[range]).map(|(x, y)| x * y).sum()
}

/// `CHAINS` sums `Σ_{k = starts[t] .. end} rows[t][k] · shared[k]` advanced together, each in ascending `k`: bit
/// for bit `dot(rows[t], shared, starts[t]..end)`. `starts` must be ascending and at most `end`.
fn dots(shared: &[f64], rows: [&[f64]; CHAINS], starts: [usize; CHAINS], end: usize) -> [f64; CHAINS] {
    let mut sums = [sum_start(); CHAINS];
    let last = starts[CHAINS - 1];
    // The staggered heads: chain t joins at its own start.
    for k in starts[0]..last {
        for t in 0..CHAINS {
            if k >= starts[t] {
                sums[t] += rows[t][k] * shared[k];
            }
        }
    }
    let shared = &shared[last..end];
    let rows: [&[f64]; CHAINS] = std::array::from_fn(|t| &rows[t][last..end]);
    for (k, &value) in shared.iter().enumerate() {
        for t in 0..CHAINS {
            sums[t] += rows[t][k] * value;
        }
    }
    sums
}

/// Lower-triangular `L` with `L Lᵀ = a` (row-major; only the lower triangle of `a` is read), or the first column
/// where `a` is not positive definite. Element `(i, j)`: `(a[i][j] − Σ_{k<j} L[i][k] L[j][k]) / L[j][j]`, the
/// diagonal `√(a[j][j] − Σ_{k<j} L[j][k]²)`. Columns go in panels of [`PANEL`]: the panel's diagonal block row by
/// row, then the rows below it in parallel groups of [`CHAINS`].
pub(super) fn cholesky(a: &[f64], n: usize) -> Result<Vec<f64>, GptqError> {
    let mut l = vec![0.0; n * n];
    for first in (0..n).step_by(PANEL) {
        let last = (first + PANEL).min(n);
        for i in first..last {
            for j in first..=i {
                let value = a[i * n + j] - dot(&l[i * n..], &l[j * n..], 0..j);
                if i == j {
                    if !value.is_finite() || value <= 0.0 {
                        return Err(GptqError::NotPositiveDefinite { column: i });
                    }
                    l[i * n + i] = value.sqrt();
                } else {
                    l[i * n + j] = value / l[j * n + j];
                }
            }
        }
        let (done, below) = l.split_at_mut(last * n);
        let done = &*done;
        below.par_chunks_mut(CHAINS * n).enumerate().for_each(|(group, rows)| {
            let top = last + group * CHAINS;
            let count = rows.len() / n;
            for j in first..last {
                let pivot = &done[j * n..j * n + j];
                let diagonal = done[j * n + j];
                if count == CHAINS {
                    let sums = {
                        let view = &*rows;
                        dots(pivot, std::array::from_fn(|t| &view[t * n..t * n + j]), [0; CHAINS], j)
                    };
                    for (t, sum) in sums.into_iter().enumerate() {
                        rows[t * n + j] = (a[(top + t) * n + j] - sum) / diagonal;
                    }
                } else {
                    for t in 0..count {
                        let sum = dot(&rows[t * n..], pivot, 0..j);
                        rows[t * n + j] = (a[(top + t) * n + j] - sum) / diagonal;
                    }
                }
            }
        });
    }
    Ok(l)
}

/// `(L Lᵀ)⁻¹ = L⁻ᵀ L⁻¹` from the Cholesky factor `L`; only the lower triangle is filled (all [`cholesky`] reads).
pub(super) fn inverse_from_cholesky(l: &[f64], n: usize) -> Vec<f64> {
    if n == 0 {
        return Vec::new();
    }
    // M = L⁻¹ (lower triangular) by forward substitution, column by column of the identity:
    // M[c][c] = 1 / L[c][c], M[i][c] = −(Σ_{k=c..i-1} L[i][k] M[k][c]) / L[i][i]. Stored transposed (row c of
    // `columns` is column c of M), so each column's sums read contiguous memory; groups of CHAINS columns in
    // parallel share each row of L.
    let mut columns = vec![0.0; n * n];
    columns.par_chunks_mut(CHAINS * n).enumerate().for_each(|(group, block)| {
        let left = group * CHAINS;
        let count = block.len() / n;
        for i in left..n {
            if count == CHAINS && i >= left + CHAINS {
                let sums = {
                    let view = &*block;
                    let rows = std::array::from_fn(|t| &view[t * n..(t + 1) * n]);
                    dots(&l[i * n..(i + 1) * n], rows, std::array::from_fn(|t| left + t), i)
                };
                for (t, sum) in sums.into_iter().enumerate() {
                    block[t * n + i] = -sum / l[i * n + i];
                }
                continue;
            }
            for t in 0..count.min(i + 1 - left) {
                let c = left + t;
                block[t * n + i] =
                    if i == c { 1.0 / l[c * n + c] } else { -dot(&l[i * n..], &block[t * n..], c..i) / l[i * n + i] };
            }
        }
    });
    // (Mᵀ M)[i][j] = Σ_k M[k][i] M[k][j], k ≥ max(i, j) = i for j ≤ i; groups of CHAINS rows in parallel share
    // each column of M.
    let columns = &columns;
    let mut inverse = vec![0.0; n * n];
    inverse.par_chunks_mut(CHAINS * n).enumerate().for_each(|(group, block)| {
        let top = group * CHAINS;
        let count = block.len() / n;
        for j in 0..top + count {
            if count == CHAINS && j <= top {
                let rows = std::array::from_fn(|t| &columns[(top + t) * n..(top + t + 1) * n]);
                let sums = dots(&columns[j * n..(j + 1) * n], rows, std::array::from_fn(|t| top + t), n);
                for (t, sum) in sums.into_iter().enumerate() {
                    block[t * n + j] = sum;
                }
                continue;
            }
            for t in 0..count {
                let i = top + t;
                if j <= i {
                    block[t * n + j] = dot(&columns[i * n..], &columns[j * n..], i..n);
                }
            }
        }
    });
    inverse
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::gptq::Hessian;
    use crate::rng::Rng;

    fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.normal()).collect()
    }

    /// The sequential factorization the parallel one must reproduce bit for bit.
    fn sequential_cholesky(a: &[f64], n: usize) -> Result<Vec<f64>, GptqError> {
        let mut l = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                let dot: f64 = l[i * n..i * n + j].iter().zip(&l[j * n..j * n + j]).map(|(x, y)| x * y).sum();
                let value = a[i * n + j] - dot;
                if i == j {
                    if !value.is_finite() || value <= 0.0 {
                        return Err(GptqError::NotPositiveDefinite { column: i });
                    }
                    l[i * n + i] = value.sqrt();
                } else {
                    l[i * n + j] = value / l[j * n + j];
                }
            }
        }
        Ok(l)
    }

    fn sequential_inverse(l: &[f64], n: usize) -> Vec<f64> {
        let mut m = vec![0.0; n * n];
        for c in 0..n {
            m[c * n + c] = 1.0 / l[c * n + c];
            for i in c + 1..n {
                let dot: f64 = (c..i).map(|k| l[i * n + k] * m[k * n + c]).sum();
                m[i * n + c] = -dot / l[i * n + i];
            }
        }
        let mut inverse = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                let value: f64 = (i..n).map(|k| m[k * n + i] * m[k * n + j]).sum();
                inverse[i * n + j] = value;
                inverse[j * n + i] = value;
            }
        }
        inverse
    }

    #[test]
    fn parallel_factor_is_bit_identical_to_the_sequential_one() {
        // Sizes around the panel and chain widths, and one larger than several panels.
        for (seed, n) in [1usize, 2, 7, 8, 9, 17, 37, 130, 261].into_iter().enumerate() {
            let mut rng = Rng::new(40 + seed as u64);
            let mut hessian = Hessian::new(n);
            // Fewer samples than columns for some sizes: rank-deficient, the damping makes it definite.
            hessian.add(&random(&mut rng, (n / 2 + 3) * n));
            let mut h = hessian.mean();
            let mean = (0..n).map(|i| h[i * n + i]).sum::<f64>() / n as f64;
            for i in 0..n {
                h[i * n + i] += 0.01 * mean;
            }
            let expected_lower = sequential_cholesky(&h, n).unwrap();
            let lower = cholesky(&h, n).unwrap();
            assert!(lower.iter().zip(&expected_lower).all(|(a, b)| a.to_bits() == b.to_bits()), "cholesky n={n}");
            let expected_inverse = sequential_inverse(&lower, n);
            let inverse = inverse_from_cholesky(&lower, n);
            for i in 0..n {
                for j in 0..=i {
                    let (a, b) = (inverse[i * n + j], expected_inverse[i * n + j]);
                    assert_eq!(a.to_bits(), b.to_bits(), "inverse n={n} ({i}, {j})");
                }
            }
            let second = cholesky(&inverse, n).unwrap();
            let expected_second = sequential_cholesky(&expected_inverse, n).unwrap();
            assert!(second.iter().zip(&expected_second).all(|(a, b)| a.to_bits() == b.to_bits()), "second n={n}");
            // Not positive definite: the same first column as the sequential algorithm.
            let mut bad = h.clone();
            let column = n * 2 / 3;
            bad[column * n + column] = -1.0;
            assert_eq!(cholesky(&bad, n), sequential_cholesky(&bad, n), "n={n}");
        }
    }

    /// A benchmark, not a test (run by `scripts/bench-methods-large.sh`; asserts nothing about time): the factor of
    /// GLM-5 expert Hessians (6144 for gate/up, 2048 for down; `GPTQ_FACTOR_SIZES=a,b` for others), parallel and
    /// then the sequential reference (skipped with `GPTQ_FACTOR_SEQUENTIAL=0`).
    #[test]
    #[ignore = "benchmark; prints timings"]
    fn factor_timing() {
        let sizes: Vec<usize> = std::env::var("GPTQ_FACTOR_SIZES")
            .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
            .unwrap_or_else(|_| vec![2048, 6144]);
        for n in sizes {
            let mut rng = Rng::new(7);
            let mut hessian = Hessian::new(n);
            hessian.add(&random(&mut rng, 64 * n));
            let mut h = hessian.mean();
            let mean = (0..n).map(|i| h[i * n + i]).sum::<f64>() / n as f64;
            for i in 0..n {
                h[i * n + i] += 0.01 * mean;
            }
            let started = std::time::Instant::now();
            let parallel_lower = cholesky(&h, n).unwrap();
            let parallel_inverse = inverse_from_cholesky(&parallel_lower, n);
            let parallel_second = cholesky(&parallel_inverse, n).unwrap();
            let parallel = started.elapsed().as_secs_f64();
            let threads = rayon::current_num_threads();
            if std::env::var("GPTQ_FACTOR_SEQUENTIAL").as_deref() == Ok("0") {
                println!("factor n={n}: parallel {parallel:.2} s on {threads} threads");
                continue;
            }
            let started = std::time::Instant::now();
            let lower = sequential_cholesky(&h, n).unwrap();
            let inverse = sequential_inverse(&lower, n);
            let second = sequential_cholesky(&inverse, n).unwrap();
            let sequential = started.elapsed().as_secs_f64();
            let same = second.iter().zip(&parallel_second).all(|(a, b)| a.to_bits() == b.to_bits());
            println!(
                "factor n={n}: parallel {parallel:.2} s on {threads} threads, sequential {sequential:.2} s, \
                 bit-identical: {same}"
            );
        }
    }
}

//! GPTQ for one weight matrix `W [rows, columns]` (a linear layer `y = x Wᵀ`): columns are quantized in order and
//! each one's rounding error is fed back into the columns not yet quantized, weighted by the inverse of the input
//! Hessian `H = Σ x xᵀ` of the calibration tokens, so the error of the layer's *outputs* on those inputs is what is
//! minimised, not the weights' own error (Frantar et al., "GPTQ", 2022).
//!
//! This implementation: by default ([`quantize`]) a group's scales are chosen (by the [`ScaleRule`]) from the
//! already-updated weights when its first column is reached, as in the GPTQ paper's code with groups;
//! [`quantize_with_scales`] instead takes scales fixed beforehand ("static groups"), which is what llm-compressor
//! 0.14 does (its observer sets the scales from the original weights before GPTQ runs); no act-order
//! (columns in their natural order, so the output is plain compressed-tensors `pack-quantized` with
//! `actorder: null`); damping `λ = damping · mean(diag H)` added to the diagonal; the feedback applied in blocks of
//! columns (`block`). Rows are independent of each other given `H`, so they are processed in parallel chunks.
//!
//! Input channels no calibration token excites (`H[i][i] = 0`) keep their weights: the reference implementations
//! zero such columns, which would delete a channel that real traffic may use; here the diagonal is set to 1 and the
//! column is rounded to nearest. With `H` diagonal the feedback is zero and the result equals round-to-nearest
//! bit for bit.

use std::ops::Range;

use faer::Par;
use half::bf16;
use rayon::prelude::*;

use super::gptq_linalg::{add_outer_products, all_threads, inverse_upper_factor, subtract_feedback, BlockErrors};
use super::int4::{q_min, quantize_group};
use super::int4_code::code;
use super::ScaleRule;

/// Sum of `x xᵀ` over calibration inputs of one linear layer, in f64. Memory: `columns² · 8` bytes.
#[derive(Debug, Clone)]
pub struct Hessian {
    columns: usize,
    /// Row-major `[columns, columns]`; only the upper triangle (`j ≥ i`) is accumulated.
    sum: Vec<f64>,
    samples: u64,
}

impl Hessian {
    pub fn new(columns: usize) -> Self {
        Self { columns, sum: vec![0.0; columns * columns], samples: 0 }
    }

    pub fn columns(&self) -> usize {
        self.columns
    }

    /// Number of input vectors added.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Adds the input vectors `inputs` (row-major `[n, columns]`).
    pub fn add(&mut self, inputs: &[f32]) {
        let columns = self.columns;
        assert_eq!(inputs.len() % columns.max(1), 0, "inputs are whole rows of {columns}");
        add_outer_products(&mut self.sum, columns, inputs, all_threads());
        self.samples += (inputs.len() / columns.max(1)) as u64;
    }

    /// The sums of `x xᵀ`, row-major `[columns, columns]`, upper triangle (`j ≥ i`) only.
    pub fn upper_sums(&self) -> &[f64] {
        &self.sum
    }

    /// Adds another accumulator of the same width (e.g. from another part of the calibration set).
    pub fn merge(&mut self, other: &Hessian) {
        assert_eq!(self.columns, other.columns);
        for (a, b) in self.sum.iter_mut().zip(&other.sum) {
            *a += b;
        }
        self.samples += other.samples;
    }

    /// The full symmetric matrix divided by the number of samples.
    pub(super) fn mean(&self) -> Vec<f64> {
        let c = self.columns;
        let n = self.samples.max(1) as f64;
        let mut h = vec![0.0; c * c];
        for i in 0..c {
            for j in i..c {
                let v = self.sum[i * c + j] / n;
                h[i * c + j] = v;
                h[j * c + i] = v;
            }
        }
        h
    }
}

/// GPTQ's two knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GptqSettings {
    /// Damping as a share of the mean Hessian diagonal (the reference implementations' default, 1 %).
    pub damping: f64,
    /// Columns per block of deferred feedback (128 as in the reference implementations; any value gives the same
    /// result up to float summation order).
    pub block: usize,
}

impl Default for GptqSettings {
    fn default() -> Self {
        Self { damping: 0.01, block: 128 }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GptqError {
    #[error("weights have {got} values, not {rows} × {columns}")]
    Shape { rows: usize, columns: usize, got: usize },
    #[error("the Hessian is {hessian} wide but the weight has {columns} columns")]
    Width { hessian: usize, columns: usize },
    #[error("group size {group} does not divide the {columns} columns")]
    Group { group: usize, columns: usize },
    #[error("{got} fixed scales given, not {rows} rows × {groups} groups")]
    Scales { rows: usize, groups: usize, got: usize },
    #[error("the damped Hessian is not positive definite at column {column} (non-finite calibration inputs?)")]
    NotPositiveDefinite { column: usize },
}

/// Codes `[rows, columns]` (one i8 per weight, in `[q_min, 7]`) and BF16 scales `[rows, columns / group]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantized {
    pub codes: Vec<i8>,
    pub scales: Vec<bf16>,
}

/// Rows quantized together, so that each row of the inverse-Hessian factor is read once per chunk.
const ROW_CHUNK: usize = 16;

/// Columns of a block whose feedback to each other is applied column by column; the block's later columns get a
/// sub-block's feedback as one product (the same sums in another order, as GPTQ's blocks do for the columns after
/// a block).
const SUB_BLOCK: usize = 16;

/// Quantizes `weights` (row-major `[rows, columns]`) with GPTQ against `hessian`; each group's scales are chosen by
/// `rule` from the weights as updated by the feedback so far.
pub fn quantize(
    weights: &[f32],
    rows: usize,
    columns: usize,
    hessian: &Hessian,
    group: usize,
    rule: ScaleRule,
    settings: GptqSettings,
) -> Result<Quantized, GptqError> {
    check_shapes(weights, rows, columns, hessian.columns, group)?;
    let factor = InverseFactor::new(hessian, settings.damping)?;
    quantize_factored(weights, rows, columns, &factor, group, rule, settings.block)
}

/// The damped inverse Hessian's factor, computed once for every weight that reads the same inputs (an expert's
/// gate_proj and up_proj).
#[derive(Debug, Clone)]
pub struct InverseFactor {
    columns: usize,
    /// `U`, upper triangular with `Uᵀ U = (H + λI)⁻¹`, row-major.
    upper: Vec<f64>,
}

impl InverseFactor {
    pub fn new(hessian: &Hessian, damping: f64) -> Result<Self, GptqError> {
        Ok(Self { columns: hessian.columns, upper: inverse_factor(hessian, damping)? })
    }

    /// `U`, row-major `[columns, columns]`, zeros below the diagonal.
    pub fn upper(&self) -> &[f64] {
        &self.upper
    }
}

/// [`quantize`] with the factor already computed (the result is the same bit for bit).
pub fn quantize_factored(
    weights: &[f32],
    rows: usize,
    columns: usize,
    factor: &InverseFactor,
    group: usize,
    rule: ScaleRule,
    block: usize,
) -> Result<Quantized, GptqError> {
    check_shapes(weights, rows, columns, factor.columns, group)?;
    let scales = vec![bf16::ZERO; rows * (columns / group)];
    Ok(run(weights, rows, Columns::new(&factor.upper, columns, group, GroupScales::Chosen(rule), block), scales))
}

/// Quantizes `weights` with GPTQ against `hessian` using the given scales (`[rows, columns / group]`, codes in
/// `[-8, 7]`): "static groups", as llm-compressor 0.14 runs GPTQ with the scales its observer took from the
/// original weights.
pub fn quantize_with_scales(
    weights: &[f32],
    rows: usize,
    columns: usize,
    hessian: &Hessian,
    group: usize,
    scales: &[bf16],
    settings: GptqSettings,
) -> Result<Quantized, GptqError> {
    check_shapes(weights, rows, columns, hessian.columns, group)?;
    let groups = columns / group;
    if scales.len() != rows * groups {
        return Err(GptqError::Scales { rows, groups, got: scales.len() });
    }
    let factor = inverse_factor(hessian, settings.damping)?;
    let columns_of = Columns::new(&factor, columns, group, GroupScales::Fixed, settings.block);
    Ok(run(weights, rows, columns_of, scales.to_vec()))
}

/// Where the scale of each group comes from.
#[derive(Debug, Clone, Copy)]
enum GroupScales {
    /// Chosen by the rule from the updated weights when the group's first column is reached.
    Chosen(ScaleRule),
    /// Already in the output scales; codes in `[-8, 7]`.
    Fixed,
}

pub(crate) fn check_shapes(
    weights: &[f32],
    rows: usize,
    columns: usize,
    hessian_columns: usize,
    group: usize,
) -> Result<(), GptqError> {
    if weights.len() != rows * columns {
        return Err(GptqError::Shape { rows, columns, got: weights.len() });
    }
    if hessian_columns != columns {
        return Err(GptqError::Width { hessian: hessian_columns, columns });
    }
    if group == 0 || !columns.is_multiple_of(group) {
        return Err(GptqError::Group { group, columns });
    }
    Ok(())
}

/// GPTQ over `weights` (row-major `[rows, columns_of.columns]`) into codes and `scales` (`[rows, groups]`: filled
/// as chosen, or already holding the fixed ones), block by block.
fn run(weights: &[f32], rows: usize, columns_of: Columns, mut scales: Vec<bf16>) -> Quantized {
    let Columns { factor, columns, group, block, .. } = columns_of;
    let groups = columns / group;
    let mut codes = vec![0i8; rows * columns];
    let mut w: Vec<f64> = weights.par_iter().map(|&v| v as f64).collect();
    let mut errors = vec![0f64; rows * block];
    let chunk = ROW_CHUNK.min(rows.max(1));
    for start in (0..columns).step_by(block) {
        let end = (start + block).min(columns);
        w.par_chunks_mut(chunk * columns)
            .zip(errors.par_chunks_mut(chunk * block))
            .zip(codes.par_chunks_mut(chunk * columns))
            .zip(scales.par_chunks_mut(chunk * groups))
            .for_each(|(((w, errors), codes), scales)| {
                let errors = BlockErrors { values: errors, first: start, stride: block };
                columns_of.quantize_block(w, errors, codes, scales, start..end)
            });
        // The columns after the block get its feedback at once, every row in one product.
        let errors = BlockErrors { values: &errors[..], first: start, stride: block };
        subtract_feedback(&mut w, columns, factor, errors, start..end, end..columns, all_threads());
    }
    Quantized { codes, scales }
}

/// What every row's column loop shares: `factor` is the upper Cholesky factor `U` of `H⁻¹` (`H⁻¹ = Uᵀ U`), row-major
/// `[columns, columns]`; the columns are quantized `block` at a time; group starts are sub-block starts (`sub`
/// divides the group and the block), so every group sees the feedback of all the columns before it.
struct Columns<'a> {
    factor: &'a [f64],
    columns: usize,
    group: usize,
    source: GroupScales,
    block: usize,
    sub: usize,
}

impl<'a> Columns<'a> {
    /// `block` is at least 1.
    fn new(factor: &'a [f64], columns: usize, group: usize, source: GroupScales, block: usize) -> Self {
        let block = block.max(1);
        Self { factor, columns, group, source, block, sub: gcd(gcd(group, block), SUB_BLOCK) }
    }
}

impl Columns<'_> {
    /// The columns `block` of a few rows (`w`, `codes` row-major `[rows, columns]`, `scales` `[rows, groups]`):
    /// codes and errors column by column, the feedback within a sub-block at once, to the block's later columns
    /// as one product per sub-block.
    fn quantize_block(
        &self,
        w: &mut [f64],
        errors: BlockErrors<&mut [f64]>,
        codes: &mut [i8],
        scales: &mut [bf16],
        block: Range<usize>,
    ) {
        let (columns, group, factor) = (self.columns, self.group, self.factor);
        let rows = w.len() / columns;
        let groups = columns / group;
        let low = match self.source {
            GroupScales::Chosen(rule) => q_min(rule),
            GroupScales::Fixed => -8,
        };
        let BlockErrors { values: errors, first, stride } = errors;
        let mut row_scales = vec![0f32; rows];
        let mut scratch_group = vec![0f32; group];
        let mut scratch_codes = vec![0i8; group];
        for sub_start in block.clone().step_by(self.sub) {
            let sub_end = (sub_start + self.sub).min(block.end);
            for i in sub_start..sub_end {
                let g = i / group;
                // A group's scales at its start; a block starting inside a group reads them back.
                for r in (0..rows).filter(|_| i.is_multiple_of(group) || i == block.start) {
                    if let (GroupScales::Chosen(rule), true) = (self.source, i.is_multiple_of(group)) {
                        // The group's scales from the weights as updated so far.
                        let updated = &w[r * columns + i..r * columns + i + group];
                        for (dst, &src) in scratch_group.iter_mut().zip(updated) {
                            *dst = src as f32;
                        }
                        scales[r * groups + g] = quantize_group(&scratch_group, rule, &mut scratch_codes);
                    }
                    row_scales[r] = scales[r * groups + g].to_f32();
                }
                let diagonal = factor[i * columns + i];
                let u = &factor[i * columns..(i + 1) * columns];
                for r in 0..rows {
                    let value = w[r * columns + i];
                    let q = code(value as f32, row_scales[r], low);
                    codes[r * columns + i] = q;
                    let error = (value - (q as f32 * row_scales[r]) as f64) / diagonal;
                    errors[r * stride + i - first] = error;
                    // Feedback into the rest of this sub-block now; the block's later columns get it below.
                    for (wj, &uj) in w[r * columns + i + 1..r * columns + sub_end].iter_mut().zip(&u[i + 1..sub_end]) {
                        *wj -= error * uj;
                    }
                }
            }
            let errors = BlockErrors { values: &*errors, first, stride };
            subtract_feedback(w, columns, factor, errors, sub_start..sub_end, sub_end..block.end, Par::Seq);
        }
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `U`, upper triangular with `Uᵀ U = (H + λI)⁻¹`, row-major `[columns, columns]` (`gptq_linalg`: one Cholesky
/// factorization of `H + λI` in reverse order and one triangular inverse, on all threads; the same for every thread
/// count).
fn inverse_factor(hessian: &Hessian, damping: f64) -> Result<Vec<f64>, GptqError> {
    let n = hessian.columns;
    let mut h = hessian.mean();
    for i in 0..n {
        if h[i * n + i] == 0.0 {
            h[i * n + i] = 1.0;
        }
    }
    let mean_diagonal = (0..n).map(|i| h[i * n + i]).sum::<f64>() / n.max(1) as f64;
    for i in 0..n {
        h[i * n + i] += damping * mean_diagonal;
    }
    inverse_upper_factor(&mut h, n, all_threads()).map_err(|column| GptqError::NotPositiveDefinite { column })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::int4::quantize_row;
    use crate::rng::Rng;

    fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.normal()).collect()
    }

    fn rtn(weights: &[f32], rows: usize, columns: usize, group: usize, rule: ScaleRule) -> Quantized {
        let mut codes = vec![0i8; rows * columns];
        let mut scales = vec![bf16::ZERO; rows * columns / group];
        for r in 0..rows {
            quantize_row(
                &weights[r * columns..(r + 1) * columns],
                group,
                rule,
                &mut codes[r * columns..(r + 1) * columns],
                &mut scales[r * columns / group..(r + 1) * columns / group],
            );
        }
        Quantized { codes, scales }
    }

    fn dequantize(q: &Quantized, group: usize) -> Vec<f32> {
        q.codes.iter().enumerate().map(|(index, &c)| c as f32 * q.scales[index / group].to_f32()).collect()
    }

    /// ‖X Wᵀ − X Ŵᵀ‖² over the calibration inputs.
    fn output_error(inputs: &[f32], weights: &[f32], approx: &[f32], columns: usize) -> f64 {
        let rows = weights.len() / columns;
        let mut total = 0.0;
        for x in inputs.chunks(columns) {
            for r in 0..rows {
                let w = &weights[r * columns..(r + 1) * columns];
                let a = &approx[r * columns..(r + 1) * columns];
                let d: f64 = x.iter().zip(w.iter().zip(a)).map(|(&x, (&w, &a))| x as f64 * (w - a) as f64).sum();
                total += d * d;
            }
        }
        total
    }

    #[test]
    fn identity_like_inputs_reproduce_round_to_nearest() {
        // Inputs that are scaled unit vectors: H is diagonal (unequal entries), so no error is fed back.
        let (rows, columns, group) = (24, 96, 32);
        let mut rng = Rng::new(7);
        let weights = random(&mut rng, rows * columns);
        let mut hessian = Hessian::new(columns);
        let mut inputs = vec![0f32; columns * columns];
        for i in 0..columns {
            inputs[i * columns + i] = 0.5 + (i % 5) as f32;
        }
        hessian.add(&inputs);
        for rule in ScaleRule::ALL {
            let gptq = quantize(&weights, rows, columns, &hessian, group, rule, GptqSettings::default()).unwrap();
            assert_eq!(gptq, rtn(&weights, rows, columns, group, rule), "{rule}");
        }
        let round = rtn(&weights, rows, columns, group, ScaleRule::CtMinmax);
        let fixed =
            quantize_with_scales(&weights, rows, columns, &hessian, group, &round.scales, GptqSettings::default());
        assert_eq!(fixed.unwrap(), round, "fixed scales");
    }

    #[test]
    fn low_rank_inputs_give_smaller_output_error_than_round_to_nearest() {
        // Calibration inputs in a 12-dimensional subspace of 128 (plus a little noise): GPTQ moves the rounding
        // error into directions the inputs do not excite.
        let (rows, columns, group, rank, samples) = (32, 128, 32, 12, 400);
        let mut rng = Rng::new(11);
        let weights = random(&mut rng, rows * columns);
        let basis = random(&mut rng, rank * columns);
        let mut inputs = vec![0f32; samples * columns];
        for x in inputs.chunks_mut(columns) {
            let coefficients = random(&mut rng, rank);
            for (k, c) in coefficients.iter().enumerate() {
                for (xi, b) in x.iter_mut().zip(&basis[k * columns..(k + 1) * columns]) {
                    *xi += c * b;
                }
            }
            for xi in x.iter_mut() {
                *xi += 0.01 * rng.normal();
            }
        }
        let mut hessian = Hessian::new(columns);
        hessian.add(&inputs);
        let rule = ScaleRule::CtMinmax;
        let gptq = quantize(&weights, rows, columns, &hessian, group, rule, GptqSettings::default()).unwrap();
        let round = rtn(&weights, rows, columns, group, rule);
        let gptq_error = output_error(&inputs, &weights, &dequantize(&gptq, group), columns);
        let rtn_error = output_error(&inputs, &weights, &dequantize(&round, group), columns);
        assert!(gptq_error < 0.5 * rtn_error, "gptq {gptq_error} vs rtn {rtn_error}");
        assert!(gptq.codes.iter().all(|&c| (-8..=7).contains(&c)));
    }

    #[test]
    fn block_size_changes_nothing_but_summation_order() {
        let (rows, columns, group) = (8, 64, 16);
        let mut rng = Rng::new(3);
        let weights = random(&mut rng, rows * columns);
        let mut hessian = Hessian::new(columns);
        hessian.add(&random(&mut rng, 50 * columns));
        let run = |block| {
            let settings = GptqSettings { block, ..GptqSettings::default() };
            quantize(&weights, rows, columns, &hessian, group, ScaleRule::CtMinmax, settings).unwrap()
        };
        let a = run(64);
        // 16: blocks of whole groups; 8: blocks inside groups, which read their group's scales back.
        for b in [run(16), run(8)] {
            let differing = a.codes.iter().zip(&b.codes).filter(|(x, y)| x != y).count();
            assert!(differing <= rows * columns / 100, "{differing} codes differ between block sizes");
            assert_eq!(a.scales.len(), b.scales.len());
        }
    }

    #[test]
    fn factor_inverts_the_damped_hessian() {
        let columns = 20;
        let mut rng = Rng::new(5);
        let mut hessian = Hessian::new(columns);
        hessian.add(&random(&mut rng, 30 * columns));
        let u = inverse_factor(&hessian, 0.01).unwrap();
        let mut h = hessian.mean();
        let mean = (0..columns).map(|i| h[i * columns + i]).sum::<f64>() / columns as f64;
        for i in 0..columns {
            h[i * columns + i] += 0.01 * mean;
        }
        // (Uᵀ U) H = I.
        for i in 0..columns {
            for j in 0..columns {
                let mut v = 0.0;
                for k in 0..columns {
                    let inv_ik: f64 = (0..columns).map(|m| u[m * columns + i] * u[m * columns + k]).sum();
                    v += inv_ik * h[k * columns + j];
                }
                let expected = if i == j { 1.0 } else { 0.0 };
                assert!((v - expected).abs() < 1e-9, "({i}, {j}): {v}");
            }
        }
    }

    #[test]
    fn errors_name_the_problem() {
        let hessian = Hessian::new(8);
        assert_eq!(
            quantize(&[0.0; 10], 2, 8, &hessian, 4, ScaleRule::CtMinmax, GptqSettings::default()),
            Err(GptqError::Shape { rows: 2, columns: 8, got: 10 })
        );
        assert_eq!(
            quantize(&[0.0; 16], 2, 8, &hessian, 3, ScaleRule::CtMinmax, GptqSettings::default()),
            Err(GptqError::Group { group: 3, columns: 8 })
        );
        assert_eq!(
            quantize_with_scales(&[0.0; 16], 2, 8, &hessian, 4, &[bf16::ONE; 3], GptqSettings::default()),
            Err(GptqError::Scales { rows: 2, groups: 2, got: 3 })
        );
        let mut bad = Hessian::new(8);
        bad.add(&[f32::NAN; 8]);
        assert_eq!(
            quantize(&[0.0; 16], 2, 8, &bad, 4, ScaleRule::CtMinmax, GptqSettings::default()),
            Err(GptqError::NotPositiveDefinite { column: 0 })
        );
    }
}

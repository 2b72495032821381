//! GPTQ's algebra on a [`Device`] (kernels/gptq.cu; a GPU or the emulated device): the Hessian sum `H += XᵀX`,
//! the factor `U` of the damped inverse and the column loop with its deferred block updates — the work
//! src/quant/gptq.rs and gptq_linalg.rs do on the host, the same algorithm in f64 with another summation order
//! (the GEMMs are cuBLAS DGEMM on a GPU, `gemm_f64_reference` elsewhere). The codes equal the CPU path's but where
//! a working value lands within rounding of a code boundary (and the cascade along its row); the tests bound the
//! share.
//!
//! Differences from the CPU path that change no result beyond that: each column's feedback reaches the block's later
//! columns at once (the CPU applies it in sub-blocks), a block holds at most [`MAX_BLOCK`] columns and a group as
//! many, and a Hessian that is not positive definite is named by the column where the factorization failed (the CPU
//! names the first row holding a non-finite entry, where there is one).

use half::bf16;

use super::checks::unsupported;
use super::int4_quantize::{rule_code, MseParams};
use crate::quant::gptq::{check_shapes, GptqError, Hessian, Quantized};
use crate::quant::scale_rule::{MseSearch, ScaleRule};
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, F64Matrix, GemmF64, LaunchShape};

/// Columns of one block of the blocked factorization (`kPanel` in kernels/gptq.cu).
const PANEL: usize = 32;
/// The most columns one GPTQ block may hold (`kGptqMaxBlock`); also the largest group.
pub const MAX_BLOCK: usize = 512;
/// Weight rows per block of `gptq_quantize_block` (`kGptqWarps`: one warp each).
const ROWS_PER_LAUNCH_BLOCK: usize = 4;
/// Input rows widened to f64 and multiplied per GEMM of the Hessian sum (bounds the staging buffers:
/// `TOKENS_PER_PASS × columns × 12` bytes, 302 MB at 6144 columns).
const TOKENS_PER_PASS: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum DeviceGptqError {
    #[error(transparent)]
    Gptq(#[from] GptqError),
    #[error(transparent)]
    Device(#[from] CudaError),
}

/// The sum `Σ x xᵀ` of one linear layer's inputs on the device (f64, row-major `[columns, columns]`; both
/// triangles, the upper one read).
pub struct DeviceHessian {
    sum: DeviceBuffer,
    columns: usize,
    samples: u64,
}

impl DeviceHessian {
    pub fn columns(&self) -> usize {
        self.columns
    }
}

/// `U`, upper triangular with `Uᵀ U = (H / samples + λI)⁻¹`, on the device (f64, row-major `[columns, columns]`).
pub struct DeviceFactor {
    upper: DeviceBuffer,
    columns: usize,
}

/// GPTQ on one device.
pub struct DeviceGptq<'a> {
    device: &'a dyn Device,
}

/// A grid-stride launch over `count` elements (256 threads per block).
fn grid_stride(count: usize) -> LaunchShape {
    LaunchShape::linear(count.div_ceil(256).clamp(1, 65_535) as u32, 256)
}

fn int(what: &str, value: usize) -> Result<i32, CudaError> {
    i32::try_from(value).map_err(|_| unsupported("gptq", format!("{what} {value} does not fit a 32-bit int")))
}

impl<'a> DeviceGptq<'a> {
    pub fn new(device: &'a dyn Device) -> Self {
        Self { device }
    }

    /// Whether the column loop takes groups of `group` columns (at most [`MAX_BLOCK`]).
    pub fn supports_group(group: usize) -> bool {
        (1..=MAX_BLOCK).contains(&group)
    }

    /// An empty sum for inputs of `columns` values.
    pub fn hessian(&self, columns: usize) -> Result<DeviceHessian, CudaError> {
        let sum = self.device.alloc_for::<f64>(columns * columns)?;
        self.zero(&sum, columns * columns)?;
        Ok(DeviceHessian { sum, columns, samples: 0 })
    }

    /// The CPU's sum, uploaded (its upper triangle is what the factor reads).
    pub fn upload_hessian(&self, hessian: &Hessian) -> Result<DeviceHessian, CudaError> {
        let sum = self.device.upload(hessian.upper_sums())?;
        Ok(DeviceHessian { sum, columns: hessian.columns(), samples: hessian.samples() })
    }

    /// The sum downloaded (row-major, both triangles).
    pub fn download_hessian(&self, hessian: &DeviceHessian) -> Result<Vec<f64>, CudaError> {
        self.device.download(&hessian.sum, hessian.columns * hessian.columns)
    }

    /// Adds the input rows `inputs` (row-major `[n, columns]`), `TOKENS_PER_PASS` rows per GEMM.
    pub fn add(&self, hessian: &mut DeviceHessian, inputs: &[f32]) -> Result<(), CudaError> {
        let n = hessian.columns;
        if n == 0 || inputs.is_empty() {
            return Ok(());
        }
        if !inputs.len().is_multiple_of(n) {
            return Err(unsupported("gptq hessian", format!("{} inputs are not whole rows of {n}", inputs.len())));
        }
        let chunk_rows = TOKENS_PER_PASS.min(inputs.len() / n);
        let staged = self.device.alloc_for::<f32>(chunk_rows * n)?;
        let wide = self.device.alloc_for::<f64>(chunk_rows * n)?;
        for chunk in inputs.chunks(chunk_rows * n) {
            let tokens = chunk.len() / n;
            self.device.write_values(&staged, chunk)?;
            let count = chunk.len();
            self.device.launch(
                "gptq_widen",
                grid_stride(count),
                &[Arg::Buffer(&staged), Arg::Buffer(&wide), Arg::I64(count as i64)],
            )?;
            let x = F64Matrix::at(&wide, 0, n);
            self.device.gemm_f64(&GemmF64 {
                a: x.t(),
                b: x,
                c: F64Matrix::at(&hessian.sum, 0, n),
                m: n,
                n,
                k: tokens,
                alpha: 1.0,
                beta: 1.0,
            })?;
            hessian.samples += tokens as u64;
        }
        Ok(())
    }

    /// The factor of `(H / samples + λI)⁻¹`, `λ = damping · mean diagonal` (a zero diagonal entry taken as 1), as
    /// src/quant/gptq.rs `inverse_factor` defines it.
    pub fn factor(&self, hessian: &DeviceHessian, damping: f64) -> Result<DeviceFactor, DeviceGptqError> {
        let n = hessian.columns;
        let device = self.device;
        let samples = hessian.samples.max(1) as f64;
        let width = int("columns", n)?;
        let mean = device.alloc_for::<f64>(1)?;
        device.launch(
            "gptq_diagonal_mean",
            LaunchShape::linear(1, 256),
            &[Arg::Buffer(&hessian.sum), Arg::I32(width), Arg::F64(samples), Arg::Buffer(&mean)],
        )?;
        // The damped mean Hessian with rows and columns reversed, factored in place into L (J A J = L Lᵀ).
        let factored = device.alloc_for::<f64>(n * n)?;
        device.launch(
            "gptq_damped_reversed",
            grid_stride(n * n),
            &[
                Arg::Buffer(&hessian.sum),
                Arg::I32(width),
                Arg::F64(samples),
                Arg::Buffer(&mean),
                Arg::F64(damping),
                Arg::Buffer(&factored),
            ],
        )?;
        let status = device.upload(&[-1i32])?;
        for k in (0..n).step_by(PANEL) {
            let kb = PANEL.min(n - k);
            let (first, panel) = (int("column", k)?, kb as i32);
            let args = [Arg::Buffer(&factored), Arg::I32(width), Arg::I32(first), Arg::I32(panel)];
            device.launch(
                "gptq_cholesky_diagonal",
                LaunchShape::linear(1, 256),
                &[args[0], args[1], args[2], args[3], Arg::Buffer(&status)],
            )?;
            let below = n - k - kb;
            if below == 0 {
                continue;
            }
            device.launch("gptq_cholesky_panel", LaunchShape::linear(below.div_ceil(256) as u32, 256), &args)?;
            let solved = F64Matrix::at(&factored, (k + kb) * n + k, n);
            device.gemm_f64(&GemmF64 {
                a: solved,
                b: solved.t(),
                c: F64Matrix::at(&factored, (k + kb) * n + k + kb, n),
                m: below,
                n: below,
                k: kb,
                alpha: -1.0,
                beta: 1.0,
            })?;
        }
        let failed = device.download::<i32>(&status, 1)?[0];
        if failed >= 0 {
            return Err(GptqError::NotPositiveDefinite { column: failed as usize }.into());
        }
        // M = L⁻¹ block row by block row: M[i, :i] = −M[i, i] · (L[i, :i] · M[:i, :i]).
        let inverse = device.alloc_for::<f64>(n * n)?;
        self.zero(&inverse, n * n)?;
        device.launch(
            "gptq_invert_diagonal",
            LaunchShape::linear(n.div_ceil(PANEL) as u32, 256),
            &[Arg::Buffer(&factored), Arg::Buffer(&inverse), Arg::I32(width)],
        )?;
        let product = device.alloc_for::<f64>(PANEL * n.max(1))?;
        for start in (PANEL..n).step_by(PANEL) {
            let kb = PANEL.min(n - start);
            device.gemm_f64(&GemmF64 {
                a: F64Matrix::at(&factored, start * n, n),
                b: F64Matrix::at(&inverse, 0, n),
                c: F64Matrix::at(&product, 0, n),
                m: kb,
                n: start,
                k: start,
                alpha: 1.0,
                beta: 0.0,
            })?;
            device.gemm_f64(&GemmF64 {
                a: F64Matrix::at(&inverse, start * n + start, n),
                b: F64Matrix::at(&product, 0, n),
                c: F64Matrix::at(&inverse, start * n, n),
                m: kb,
                n: start,
                k: kb,
                alpha: -1.0,
                beta: 0.0,
            })?;
        }
        // U = J M J, into the factorization's buffer.
        device.launch(
            "gptq_reverse_upper",
            grid_stride(n * n),
            &[Arg::Buffer(&inverse), Arg::Buffer(&factored), Arg::I32(width)],
        )?;
        Ok(DeviceFactor { upper: factored, columns: n })
    }

    /// The factor downloaded (row-major `[columns, columns]`, zeros below the diagonal).
    pub fn download_factor(&self, factor: &DeviceFactor) -> Result<Vec<f64>, CudaError> {
        self.device.download(&factor.upper, factor.columns * factor.columns)
    }

    /// GPTQ of `weights` (row-major `[rows, columns]`) against `factor`, each group's scale chosen by `rule` from
    /// the weights as updated when the group starts ([`crate::quant::gptq::quantize_factored`] on the device).
    pub fn quantize(
        &self,
        weights: &[f32],
        (rows, columns): (usize, usize),
        factor: &DeviceFactor,
        (group, rule): (usize, ScaleRule),
        block: usize,
    ) -> Result<Quantized, DeviceGptqError> {
        check_shapes(weights, rows, columns, factor.columns, group)?;
        let scales = self.device.alloc_for::<u16>(rows * (columns / group))?;
        self.run(weights, (rows, columns), factor, (group, Some(rule)), block, scales)
    }

    /// GPTQ with the given scales (`[rows, columns / group]`, codes in `[-8, 7]`), as
    /// [`crate::quant::gptq::quantize_with_scales`].
    pub fn quantize_with_scales(
        &self,
        weights: &[f32],
        (rows, columns): (usize, usize),
        factor: &DeviceFactor,
        (group, scales): (usize, &[bf16]),
        block: usize,
    ) -> Result<Quantized, DeviceGptqError> {
        check_shapes(weights, rows, columns, factor.columns, group)?;
        let groups = columns / group;
        if scales.len() != rows * groups {
            return Err(GptqError::Scales { rows, groups, got: scales.len() }.into());
        }
        let bits: Vec<u16> = scales.iter().map(|s| s.to_bits()).collect();
        let scales = self.device.upload(&bits)?;
        self.run(weights, (rows, columns), factor, (group, None), block, scales)
    }

    /// The column loop block by block: `gptq_quantize_block` over the block's columns, then the block's errors
    /// into the later columns as one GEMM (`W[:, end..] −= E · U[block, end..]`).
    fn run(
        &self,
        weights: &[f32],
        (rows, columns): (usize, usize),
        factor: &DeviceFactor,
        (group, rule): (usize, Option<ScaleRule>),
        block: usize,
        scales: DeviceBuffer,
    ) -> Result<Quantized, DeviceGptqError> {
        if !Self::supports_group(group) {
            return Err(unsupported("gptq", format!("group {group} is wider than {MAX_BLOCK} columns")).into());
        }
        let block = block.clamp(1, MAX_BLOCK);
        let device = self.device;
        let staged = device.upload(weights)?;
        let w = device.alloc_for::<f64>(rows * columns)?;
        device.launch(
            "gptq_widen",
            grid_stride(weights.len()),
            &[Arg::Buffer(&staged), Arg::Buffer(&w), Arg::I64(weights.len() as i64)],
        )?;
        drop(staged);
        let codes = device.alloc_for::<i8>(rows * columns)?;
        let errors = device.alloc_for::<f64>(rows * block)?;
        let mse = MseParams::from(MseSearch::default());
        let (row_count, width, group_width) = (int("rows", rows)?, int("columns", columns)?, int("group", group)?);
        let launch_blocks = int("rows", rows.div_ceil(ROWS_PER_LAUNCH_BLOCK))? as u32;
        for start in (0..columns).step_by(block) {
            let end = (start + block).min(columns);
            device.launch(
                "gptq_quantize_block",
                LaunchShape::linear(launch_blocks, 32 * ROWS_PER_LAUNCH_BLOCK as u32),
                &[
                    Arg::Buffer(&w),
                    Arg::Buffer(&factor.upper),
                    Arg::Buffer(&codes),
                    Arg::Buffer(&scales),
                    Arg::Buffer(&errors),
                    Arg::I32(row_count),
                    Arg::I32(width),
                    Arg::I32(group_width),
                    Arg::I32(start as i32),
                    Arg::I32(end as i32),
                    Arg::I32(rule.map_or(-1, rule_code)),
                    Arg::I32(mse.steps),
                    Arg::I32(mse.grid),
                    Arg::F32(mse.norm),
                ],
            )?;
            if end < columns && rows > 0 {
                device.gemm_f64(&GemmF64 {
                    a: F64Matrix::at(&errors, 0, end - start),
                    b: F64Matrix::at(&factor.upper, start * columns + end, columns),
                    c: F64Matrix::at(&w, end, columns),
                    m: rows,
                    n: columns - end,
                    k: end - start,
                    alpha: -1.0,
                    beta: 1.0,
                })?;
            }
        }
        let codes = device.download::<i8>(&codes, rows * columns)?;
        let scales = device.download::<u16>(&scales, rows * (columns / group))?;
        Ok(Quantized { codes, scales: scales.into_iter().map(bf16::from_bits).collect() })
    }

    fn zero(&self, buffer: &DeviceBuffer, count: usize) -> Result<(), CudaError> {
        self.device.launch("gptq_zero", grid_stride(count), &[Arg::Buffer(buffer), Arg::I64(count as i64)])
    }
}

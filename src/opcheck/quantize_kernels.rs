//! The quantize command's kernels (FP8 block dequant, INT4 quantize from FP8 and f32) on a device against the CPU
//! path on fresh random inputs with awkward shapes (outputs poisoned first), then benchmarks against the measured
//! device copy bandwidth and the CPU.

use std::time::Instant;

use half::bf16;
use rayon::prelude::*;

use crate::quant::fp8_block::{dequantize_row, BlockGrid};
use crate::quant::scale_rule::{MseSearch, ScaleRule};
use crate::quant::{int4, pack};
use crate::runtime::cuda::int4_quantize::{
    dequantize_fp8, launch_int4, quantize_int4, Fp8Tensor, Int4Buffers, Int4Output, Int4Settings, Source,
};
use crate::runtime::device::{CudaError, Device, DeviceBuffer};

use super::SelftestRow;

/// `mse` groups may choose a different candidate only when the two candidates' errors, both measured on the CPU,
/// agree to this relative tolerance (device and host `powf` differ in the last ulp; the sum of 32 terms then
/// differs by a few ulps, which can flip a strict `<` between near-equal candidates).
pub const MSE_TIE_TOLERANCE: f64 = 1e-5;

use crate::rng::Rng;

/// An owned FP8 tensor.
struct Fp8Owned {
    name: String,
    codes: Vec<u8>,
    block_scales: Vec<f32>,
    grid: BlockGrid,
}

impl Fp8Owned {
    fn random(rng: &mut Rng, rows: usize, columns: usize, block_rows: usize, block_columns: usize) -> Self {
        let grid = BlockGrid::new(rows, columns, block_rows, block_columns);
        let [scale_rows, scale_columns] = grid.scale_shape();
        let codes = (0..rows * columns)
            .map(|_| match rng.below(5000) {
                0 => 0x7F,
                1 => 0xFF,
                _ => (rng.below(0x7E) as u8) | if rng.below(2) == 0 { 0x80 } else { 0 },
            })
            .collect();
        let block_scales = (0..scale_rows * scale_columns).map(|_| 1e-4 + rng.unit() as f32 * 1e-2).collect();
        Self { name: format!("selftest.{rows}x{columns}"), codes, block_scales, grid }
    }
    fn view(&self) -> Fp8Tensor<'_> {
        Fp8Tensor {
            name: &self.name,
            codes: &self.codes,
            block_scales: &self.block_scales,
            rows: self.grid.rows,
            columns: self.grid.columns,
            block_rows: self.grid.block_rows,
            block_columns: self.grid.block_columns,
        }
    }
    fn bytes(&self) -> usize {
        self.codes.len() + self.block_scales.len() * 4
    }
    fn dequantize_cpu(&self) -> Vec<f32> {
        let columns = self.grid.columns;
        let mut out = vec![0f32; self.codes.len()];
        out.par_chunks_mut(columns).enumerate().for_each(|(row, values)| {
            dequantize_row(&self.grid, row, &self.codes[row * columns..][..columns], &self.block_scales, values)
        });
        out
    }
}

/// The CPU path's INT4 output of f32 rows `[len / columns, columns]`.
pub fn quantize_cpu(weights: &[f32], columns: usize, group_size: usize, rule: ScaleRule) -> Int4Output {
    let rows = weights.len() / columns;
    let mut output = Int4Output { packed: vec![0; rows * columns / 8], scales: vec![0; rows * columns / group_size] };
    output
        .packed
        .par_chunks_mut(columns / 8)
        .zip(output.scales.par_chunks_mut(columns / group_size))
        .enumerate()
        .for_each(|(row, (words, scale_bits))| {
            let mut q = vec![0i8; columns];
            let mut scales = vec![bf16::ZERO; columns / group_size];
            int4::quantize_row(&weights[row * columns..][..columns], group_size, rule, &mut q, &mut scales);
            pack::pack_row(&q, words);
            for (bits, scale) in scale_bits.iter_mut().zip(&scales) {
                *bits = scale.to_bits();
            }
        });
    output
}

/// `Σ|w − q·s|^2.4` of a group at scale `scale`, as the CPU's mse rule measures it.
fn group_error(group: &[f32], scale: f32, norm: f32) -> f64 {
    group
        .iter()
        .map(|&w| {
            let q = (w / scale).round_ties_even().clamp(-8.0, 7.0);
            (w - q * scale).abs().powf(norm)
        })
        .sum::<f32>() as f64
}

/// Compares a kernel's INT4 output of `weights` with the CPU's: (groups that differ, groups that differ other than
/// by an `mse` tie within [`MSE_TIE_TOLERANCE`], max |Δŵ| / max |w|). Also used by the emulation tests.
pub fn compare_int4(
    weights: &[f32],
    group_size: usize,
    rule: ScaleRule,
    gpu: &Int4Output,
    cpu: &Int4Output,
) -> (usize, usize, f64) {
    let words_per_group = group_size / 8;
    let max_abs = weights.iter().filter(|w| w.is_finite()).fold(0f32, |a, w| a.max(w.abs())).max(f32::MIN_POSITIVE);
    let norm = MseSearch::default().norm;
    let (mut different, mut unexplained, mut max_error) = (0, 0, 0f64);
    for group in 0..cpu.scales.len() {
        let words = group * words_per_group..(group + 1) * words_per_group;
        if gpu.scales[group] == cpu.scales[group] && gpu.packed[words.clone()] == cpu.packed[words.clone()] {
            continue;
        }
        different += 1;
        let values = &weights[group * group_size..(group + 1) * group_size];
        let (gpu_scale, cpu_scale) =
            (bf16::from_bits(gpu.scales[group]).to_f32(), bf16::from_bits(cpu.scales[group]).to_f32());
        // Dequantized difference.
        let mut q_gpu = vec![0i8; group_size];
        let mut q_cpu = vec![0i8; group_size];
        let mut unpacked = vec![0i8; group_size];
        pack::unpack_row(&gpu.packed[words.clone()], group_size, &mut q_gpu);
        pack::unpack_row(&cpu.packed[words], group_size, &mut q_cpu);
        for (a, b) in q_gpu.iter().zip(&q_cpu) {
            let error = ((*a as f32 * gpu_scale) - (*b as f32 * cpu_scale)).abs() as f64 / max_abs as f64;
            max_error = max_error.max(error);
        }
        // Explained only for mse, when the GPU's codes are the CPU's rounding at the GPU's scale and both
        // candidates' errors tie within rounding.
        let tie = rule == ScaleRule::Mse && {
            let (e_gpu, e_cpu) = (group_error(values, gpu_scale, norm), group_error(values, cpu_scale, norm));
            let mut words_at_gpu_scale = vec![0u32; words_per_group];
            for (value, q) in values.iter().zip(unpacked.iter_mut()) {
                let level = (value / gpu_scale).round_ties_even().clamp(-8.0, 7.0);
                *q = level as i8;
            }
            pack::pack_row(&unpacked, &mut words_at_gpu_scale);
            let mut packed_gpu = vec![0u32; words_per_group];
            pack::pack_row(&q_gpu, &mut packed_gpu);
            words_at_gpu_scale == packed_gpu
                && (e_gpu - e_cpu).abs() <= MSE_TIE_TOLERANCE * e_cpu.abs().max(f64::MIN_POSITIVE)
        };
        if !tie {
            unexplained += 1;
        }
    }
    (different, unexplained, max_error)
}

fn row(op: String, shape: String, max_rel_error: f64, mismatches: usize, passed: bool, note: String) -> SelftestRow {
    SelftestRow { op, shape, max_rel_error, mismatches, passed, seconds: None, gb_per_s: None, copy_share: None, note }
}

/// The quantize settings of one self-test case (outputs poisoned).
fn settings(group_size: usize, rule: ScaleRule, search: MseSearch) -> Int4Settings {
    Int4Settings { group_size, rule, search, poison_outputs: true }
}

/// Device-to-device copy bandwidth over `bytes` (read + write bytes per second), best of a few copies.
fn copy_bandwidth(device: &dyn Device, bytes: usize) -> Result<f64, CudaError> {
    let (source, target) = (device.alloc(bytes)?, device.alloc(bytes)?);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        device.download::<u8>(&target, 1)?;
        let started = Instant::now();
        device.copy(&source, &target, 0)?;
        device.download::<u8>(&target, 1)?;
        best = best.min(started.elapsed().as_secs_f64());
    }
    Ok(2.0 * bytes as f64 / best)
}

/// Seconds one INT4 kernel launch takes over a device-resident FP8 tensor (best of `repeats`), without copies.
fn time_int4_fp8_kernel(
    device: &dyn Device,
    tensor: &Fp8Tensor<'_>,
    settings: &Int4Settings,
    repeats: usize,
) -> Result<f64, CudaError> {
    let (codes, block_scales) = (device.upload(tensor.codes)?, device.upload(tensor.block_scales)?);
    let elements = tensor.rows * tensor.columns;
    let packed: DeviceBuffer = device.alloc_for::<u32>(elements / 8)?;
    let scales = device.alloc_for::<u16>(elements / settings.group_size)?;
    let buffers = Int4Buffers {
        input: &codes,
        block_scales: Some((&block_scales, tensor.block_rows, tensor.block_columns)),
        packed: &packed,
        scales: &scales,
    };
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        device.download::<u8>(&packed, 1)?;
        let started = Instant::now();
        launch_int4(device, &buffers, tensor.rows, tensor.columns, 0, settings)?;
        device.download::<u8>(&packed, 1)?;
        best = best.min(started.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// An FP8 tensor of the kernels' awkward cases: `[rows, columns]` with its own block grid, the codes of rows
/// `first_row..first_row + slice_rows` handed to the kernel (the block scales whole).
struct Fp8Case {
    tensor: Fp8Owned,
    first_row: usize,
    slice_rows: usize,
}

impl Fp8Case {
    /// The tensor with the edge cases the CPU twin must reproduce: rare NaN codes (from [`Fp8Owned::random`]), one
    /// all-zero row (±0 codes), one block scale that overflows 448·s to infinity and one tiny one.
    fn new(rng: &mut Rng, shape: (usize, usize, usize, usize), first_row: usize, slice_rows: usize) -> Self {
        let (rows, columns, block_rows, block_columns) = shape;
        let mut tensor = Fp8Owned::random(rng, rows, columns, block_rows, block_columns);
        if rows > 2 {
            for (j, code) in tensor.codes[columns..2 * columns].iter_mut().enumerate() {
                *code = if j % 3 == 0 { 0x80 } else { 0x00 };
            }
        }
        let count = tensor.block_scales.len();
        if count > 2 {
            tensor.block_scales[count / 2] = 1e36;
            tensor.block_scales[count - 1] = 1e-30;
        }
        Self { tensor, first_row, slice_rows }
    }
    fn columns(&self) -> usize {
        self.tensor.grid.columns
    }
    fn codes(&self) -> &[u8] {
        let columns = self.columns();
        &self.tensor.codes[self.first_row * columns..(self.first_row + self.slice_rows) * columns]
    }
    /// The slice as the kernels take it.
    fn view(&self) -> Fp8Tensor<'_> {
        Fp8Tensor { codes: self.codes(), rows: self.slice_rows, ..self.tensor.view() }
    }
    /// The CPU's dequantized values of the slice.
    fn dequantize_cpu(&self) -> Vec<f32> {
        let columns = self.columns();
        let mut out = vec![0f32; self.slice_rows * columns];
        for (local, values) in out.chunks_mut(columns).enumerate() {
            let codes = &self.codes()[local * columns..][..columns];
            dequantize_row(&self.tensor.grid, self.first_row + local, codes, &self.tensor.block_scales, values);
        }
        out
    }
    fn shape(&self) -> String {
        let grid = &self.tensor.grid;
        let slice = if self.slice_rows == grid.rows {
            String::new()
        } else {
            format!(" rows {}..{}", self.first_row, self.first_row + self.slice_rows)
        };
        format!("{}x{} blocks {}x{}{slice}", grid.rows, grid.columns, grid.block_rows, grid.block_columns)
    }
}

/// A random shape of at most `max_rows` rows of `columns`, with 128×128 blocks or an awkward block.
fn random_case(rng: &mut Rng, max_rows: usize, columns: usize) -> Fp8Case {
    let rows = 1 + rng.below(max_rows);
    let (block_rows, block_columns) =
        if rng.below(2) == 0 { (128, 128) } else { (1 + rng.below(40), 1 + rng.below(200)) };
    Fp8Case::new(rng, (rows, columns, block_rows, block_columns), 0, rows)
}

/// FP8 block dequant to f32 and to BF16, bit-identical to the CPU (NaN equal to NaN): fixed awkward cases (a
/// partial 128-block, blocks of 3×16 and 4×5, a slice starting at row 6, one-row blocks) and three random shapes.
pub fn fp8_block_dequant(device: &dyn Device, rng: &mut Rng) -> Result<Vec<SelftestRow>, CudaError> {
    let fixed =
        [((130, 200, 128, 128), 0, 130), ((7, 45, 3, 16), 0, 7), ((20, 33, 4, 5), 6, 9), ((5, 64, 1, 64), 0, 5)];
    let mut cases: Vec<Fp8Case> =
        fixed.iter().map(|&(shape, first, rows)| Fp8Case::new(rng, shape, first, rows)).collect();
    for _ in 0..3 {
        let columns = 1 + rng.below(700);
        cases.push(random_case(rng, 300, columns));
    }
    let mut rows_out = Vec::new();
    for case in &cases {
        let cpu = case.dequantize_cpu();
        let max_abs = cpu.iter().filter(|w| w.is_finite()).fold(0f32, |a, w| a.max(w.abs())).max(f32::MIN_POSITIVE);
        for bf16_out in [false, true] {
            let bytes = dequantize_fp8(device, &case.view(), case.first_row, bf16_out)?;
            let (mut mismatches, mut max_error) = (0, 0f64);
            for (index, want) in cpu.iter().enumerate() {
                let (got, want) = if bf16_out {
                    let bits = u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]);
                    (bf16::from_bits(bits).to_f32(), bf16::from_f32(*want).to_f32())
                } else {
                    let word = [bytes[4 * index], bytes[4 * index + 1], bytes[4 * index + 2], bytes[4 * index + 3]];
                    (f32::from_le_bytes(word), *want)
                };
                if got.to_bits() != want.to_bits() && !(got.is_nan() && want.is_nan()) {
                    mismatches += 1;
                    max_error = max_error.max(((got - want).abs() / max_abs) as f64);
                }
            }
            let op = if bf16_out { "fp8_block_dequant_bf16" } else { "fp8_block_dequant_f32" };
            rows_out.push(row(op.into(), case.shape(), max_error, mismatches, mismatches == 0, String::new()));
        }
    }
    Ok(rows_out)
}

/// What one INT4 comparison quantized, and how.
#[derive(Clone, Copy)]
struct Int4Input<'a> {
    weights: &'a [f32],
    group_size: usize,
    rule: ScaleRule,
}

/// The row of one INT4 comparison. `exact` (the emulated device, whose `mse` |x|^2.4 and lane-ordered sums are the
/// CPU's operations in the CPU's order): every rule bit-identical; on a GPU an `mse` group may differ by a tie
/// within [`MSE_TIE_TOLERANCE`].
fn int4_row(
    op: String,
    shape: String,
    input: Int4Input,
    got: &Int4Output,
    want: &Int4Output,
    exact: bool,
) -> SelftestRow {
    let Int4Input { weights, group_size, rule } = input;
    let same_length = got.packed.len() == want.packed.len() && got.scales.len() == want.scales.len();
    if !same_length {
        return row(op, shape, f64::INFINITY, want.scales.len(), false, "output length differs".into());
    }
    let (different, unexplained, max_error) = compare_int4(weights, group_size, rule, got, want);
    let passed = unexplained == 0 && (!exact || different == 0);
    let note = if different > unexplained { format!("{different} mse tie(s)") } else { String::new() };
    row(op, shape, max_error, different, passed, note)
}

/// INT4 quantize of block-scaled FP8 for every rule and group size (32/64 in registers, others re-read): fixed
/// awkward cases (a partial 128-block of 131 rows, groups 16/24 under blocks of 3×40 and 4×7, one-row blocks, a
/// slice from row 6 launched directly) and random shapes; outputs poisoned first.
pub fn int4_quantize_fp8(device: &dyn Device, rng: &mut Rng, exact: bool) -> Result<Vec<SelftestRow>, CudaError> {
    let search = MseSearch::default();
    let mut cases: Vec<(Fp8Case, usize)> = [
        ((131, 96, 128, 128), 32, 0, 131),
        ((9, 320, 128, 128), 64, 0, 9),
        ((5, 384, 128, 128), 128, 0, 5),
        ((7, 48, 3, 40), 16, 0, 7),
        ((11, 72, 4, 7), 24, 0, 11),
        ((3, 64, 1, 64), 32, 0, 3),
        ((20, 160, 4, 48), 32, 6, 9),
    ]
    .into_iter()
    .map(|(shape, group, first, rows)| (Fp8Case::new(rng, shape, first, rows), group))
    .collect();
    for group_size in [32usize, 64, 128, 48] {
        let columns = group_size * (1 + rng.below(24));
        cases.push((random_case(rng, 200, columns), group_size));
    }
    let mut rows_out = Vec::new();
    for (case, group_size) in &cases {
        let (group_size, columns) = (*group_size, case.columns());
        let weights = case.dequantize_cpu();
        for rule in ScaleRule::ALL {
            let settings = settings(group_size, rule, search);
            let got = if case.first_row == 0 {
                quantize_int4(device, &Source::Fp8(&case.view()), &settings)?
            } else {
                launch_slice(device, case, &settings)?
            };
            let want = quantize_cpu(&weights, columns, group_size, rule);
            let op = format!("int4_quantize_fp8 {rule} g{group_size}");
            let input = Int4Input { weights: &weights, group_size, rule };
            rows_out.push(int4_row(op, case.shape(), input, &got, &want, exact));
        }
    }
    Ok(rows_out)
}

/// One INT4 launch over a slice that starts inside the block grid (`first_row` > 0), on poisoned outputs.
fn launch_slice(device: &dyn Device, case: &Fp8Case, settings: &Int4Settings) -> Result<Int4Output, CudaError> {
    let (rows, columns) = (case.slice_rows, case.columns());
    let (words, groups) = (rows * columns / 8, rows * columns / settings.group_size);
    let (codes, block_scales) = (device.upload(case.codes())?, device.upload(&case.tensor.block_scales)?);
    let packed = device.upload(&vec![0xA5A5_A5A5u32; words])?;
    let scales = device.upload(&vec![0xA5A5u16; groups])?;
    let grid = &case.tensor.grid;
    let buffers = Int4Buffers {
        input: &codes,
        block_scales: Some((&block_scales, grid.block_rows, grid.block_columns)),
        packed: &packed,
        scales: &scales,
    };
    launch_int4(device, &buffers, rows, columns, case.first_row, settings)?;
    Ok(Int4Output { packed: device.download(&packed, words)?, scales: device.download(&scales, groups)? })
}

/// A roughly normal weight (sum of uniforms) with a rare 20× outlier.
fn weight(rng: &mut Rng) -> f32 {
    let value: f32 = (0..4).map(|_| rng.uniform() - 0.5).sum::<f32>() * 0.05;
    if rng.below(97) == 0 {
        value * 20.0
    } else {
        value
    }
}

/// INT4 quantize of f32 values for every rule: fixed shapes with groups 32/64/128/8 (each with a zero group and
/// outliers) and one random shape per group size 32/64/128/48.
pub fn int4_quantize_f32(device: &dyn Device, rng: &mut Rng, exact: bool) -> Result<Vec<SelftestRow>, CudaError> {
    let search = MseSearch::default();
    let mut cases: Vec<(usize, usize, usize, Vec<f32>)> = Vec::new();
    for (rows, columns, group_size) in [(67, 160, 32), (13, 192, 64), (6, 256, 128), (9, 40, 8)] {
        let mut values: Vec<f32> = (0..rows * columns).map(|_| weight(rng)).collect();
        values[..group_size].fill(0.0);
        cases.push((rows, columns, group_size, values));
    }
    for group_size in [32usize, 64, 128, 48] {
        let (rows, columns) = (1 + rng.below(200), group_size * (1 + rng.below(24)));
        let values: Vec<f32> = (0..rows * columns).map(|_| (rng.unit() as f32 - 0.5) * 0.1).collect();
        cases.push((rows, columns, group_size, values));
    }
    let mut rows_out = Vec::new();
    for (rows, columns, group_size, values) in &cases {
        let (rows, columns, group_size) = (*rows, *columns, *group_size);
        for rule in ScaleRule::ALL {
            let source = Source::F32 { name: "selftest.f32", values, rows, columns };
            let got = quantize_int4(device, &source, &settings(group_size, rule, search))?;
            let want = quantize_cpu(values, columns, group_size, rule);
            let op = format!("int4_quantize_f32 {rule} g{group_size}");
            let input = Int4Input { weights: values, group_size, rule };
            rows_out.push(int4_row(op, format!("{rows}x{columns}"), input, &got, &want, exact));
        }
    }
    Ok(rows_out)
}

/// The quantize kernels' benchmarks and the device copy bandwidth they are measured against (read + write GB/s).
pub struct QuantizeBench {
    pub rows: Vec<SelftestRow>,
    pub copy_gb_per_s: f64,
}

/// Perf mode: the device copy bandwidth, the INT4 kernel alone over a `[bench_rows, 6144]` FP8 tensor (a stack of
/// GLM-5 routed experts' gate/up rows) for every rule, and the whole chunked path end to end, checked.
pub fn bench(device: &dyn Device, rng: &mut Rng, bench_rows: usize) -> Result<QuantizeBench, CudaError> {
    let search = MseSearch::default();
    let mut rows_out = Vec::new();

    let copy = copy_bandwidth(device, 1 << 30)? / 1e9;
    rows_out.push(SelftestRow {
        seconds: Some(2.0 * (1u64 << 30) as f64 / 1e9 / copy),
        gb_per_s: Some(copy),
        copy_share: Some(1.0),
        ..row("device copy (DtoD)".into(), "1 GiB".into(), 0.0, 0, true, "read + write bytes".into())
    });
    // A stack of GLM-5 routed experts' gate/up rows: [bench_rows, 6144], 128×128 blocks, group 32.
    let columns = 6144;
    let tensor = Fp8Owned::random(rng, bench_rows, columns, 128, 128);
    let elements = bench_rows * columns;
    let moved = (tensor.bytes() + elements / 2 + elements / 32 * 2) as f64;
    let weights = tensor.dequantize_cpu();
    for rule in ScaleRule::ALL {
        let seconds = time_int4_fp8_kernel(device, &tensor.view(), &settings(32, rule, search), 5)?;
        let gb_per_s = moved / seconds / 1e9;
        let mut note = "kernel only, device-resident".to_string();
        if rule == ScaleRule::Mse {
            // The CPU's mse on 64 rows, one thread, scaled to 2 cores and to the whole tensor.
            let sample = 64.min(bench_rows);
            let started = Instant::now();
            let mut q = vec![0i8; columns];
            let mut scales = vec![bf16::ZERO; columns / 32];
            for row in weights.chunks(columns).take(sample) {
                int4::quantize_row(row, 32, rule, &mut q, &mut scales);
            }
            let cpu_two_cores = started.elapsed().as_secs_f64() * (bench_rows as f64 / sample as f64) / 2.0;
            note = format!("{:.0}x the 2-core CPU path (estimated from 1 thread)", cpu_two_cores / seconds);
        }
        rows_out.push(SelftestRow {
            seconds: Some(seconds),
            gb_per_s: Some(gb_per_s),
            copy_share: Some(gb_per_s / copy),
            ..row(format!("int4_quantize_fp8 {rule} g32"), format!("{bench_rows}x{columns}"), 0.0, 0, true, note)
        });
    }
    // End to end through the pinned two-stream pipeline, checked against the CPU.
    for rule in [ScaleRule::CtMinmax, ScaleRule::Mse] {
        let started = Instant::now();
        let got = quantize_int4(device, &Source::Fp8(&tensor.view()), &settings(32, rule, search))?;
        let seconds = started.elapsed().as_secs_f64();
        let want = quantize_cpu(&weights, columns, 32, rule);
        let (different, unexplained, max_error) = compare_int4(&weights, 32, rule, &got, &want);
        let gb_per_s = moved / seconds / 1e9;
        rows_out.push(SelftestRow {
            seconds: Some(seconds),
            gb_per_s: Some(gb_per_s),
            copy_share: Some(gb_per_s / copy),
            ..row(
                format!("quantize pipeline {rule} g32"),
                format!("{bench_rows}x{columns}"),
                max_error,
                different,
                unexplained == 0,
                "host→device→host in row chunks".into(),
            )
        });
    }
    Ok(QuantizeBench { rows: rows_out, copy_gb_per_s: copy })
}

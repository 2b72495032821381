//! Perf mode on a real GPU: the dense BF16 products on GLM-5's attention shapes (issue 16's cuBLAS target). For each
//! weight shape at 4096 tokens: one plain BF16 GEMM ([`Device::gemm_bf16`], cuBLAS), the runtime's split product
//! ([`linear_bf16_gemm`]: the same GEMM over 2 × 4096 rows, plus the split and join kernels) as useful TFLOP/s, the
//! same on activations rounded to BF16 once ([`Activations::Bf16`]: one GEMM and the rounding kernel; target ≥ 70 %
//! of the plain GEMM), the block-FP8 weights' pair form ([`linear_bf16_pair`]) both ways, and the matrix-vector kernel it replaced from [`GEMM_MIN_ROWS`] rows on ([`linear_bf16`]). Shares are against the
//! best rate cuBLAS reaches in this run on a large square BF16 GEMM ("peak").

use crate::rng::Rng;
use crate::runtime::cuda::linear::{
    linear_bf16, linear_bf16_gemm, linear_bf16_pair, Activations, LinearShape, GEMM_MIN_ROWS,
};
use crate::runtime::device::{CudaError, Device, DeviceBuffer, GemmBf16};

use super::timing::time_launches;
use super::SelftestRow;

/// GLM-5 (hidden 6144, 64 heads, q LoRA 2048, KV LoRA 512 + RoPE 64, q/k head 192 + 64, v head 256) dense weights
/// `[out, in]`: the attention projections and the dense layers' MLP.
const SHAPES: [(&str, usize, usize); 6] = [
    ("q_a_proj", 2048, 6144),
    ("q_b_proj", 16384, 2048),
    ("kv_a_proj", 576, 6144),
    ("kv_b_proj", 28672, 512),
    ("o_proj", 6144, 16384),
    ("mlp gate/up", 12288, 6144),
];
const TOKENS: usize = 4096;
/// The square GEMM that sets the peak.
const PEAK: usize = 8192;

fn tflops(rows: usize, inner: usize, out: usize, seconds: f64) -> f64 {
    2.0 * (rows * inner * out) as f64 / seconds / 1e12
}

fn timed_row(op: &str, shape: String, seconds: f64, note: String) -> SelftestRow {
    SelftestRow {
        op: op.into(),
        shape,
        max_rel_error: 0.0,
        mismatches: 0,
        passed: true,
        seconds: Some(seconds),
        gb_per_s: None,
        copy_share: None,
        note,
    }
}

/// Random BF16 bits of small values (timing does not depend on them).
fn bf16_buffer(device: &dyn Device, rng: &mut Rng, count: usize) -> Result<DeviceBuffer, CudaError> {
    let bits: Vec<u16> = (0..count).map(|_| half::bf16::from_f32(rng.uniform() - 0.5).to_bits()).collect();
    device.upload(&bits)
}

pub fn bench(device: &dyn Device, fence: &DeviceBuffer) -> Result<Vec<SelftestRow>, CudaError> {
    let mut rng = Rng::new(0xBE7C_0002);
    let mut rows = Vec::new();
    let square = bf16_buffer(device, &mut rng, PEAK * PEAK)?;
    let square_c = device.alloc_for::<f32>(PEAK * PEAK)?;
    let gemm =
        GemmBf16 { weight: &square, x: &square, c: &square_c, rows: PEAK, in_features: PEAK, out_features: PEAK };
    let seconds = time_launches(device, fence, 10, || device.gemm_bf16(&gemm))?;
    let peak = tflops(PEAK, PEAK, PEAK, seconds);
    rows.push(timed_row(
        "gemm_bf16 peak",
        format!("[{PEAK}, {PEAK}]·[{PEAK}, {PEAK}]ᵀ"),
        seconds,
        format!("{peak:.0} TFLOP/s"),
    ));
    drop((square, square_c));
    for (name, out, inner) in SHAPES {
        let weight = bf16_buffer(device, &mut rng, out * inner)?;
        let shape = format!("{name} [{out}, {inner}] × {TOKENS} tokens");
        let halves = bf16_buffer(device, &mut rng, 2 * TOKENS * inner)?;
        let products = device.alloc_for::<f32>(2 * TOKENS * out)?;
        let plain =
            GemmBf16 { weight: &weight, x: &halves, c: &products, rows: TOKENS, in_features: inner, out_features: out };
        let seconds = time_launches(device, fence, 20, || device.gemm_bf16(&plain))?;
        let rate = tflops(TOKENS, inner, out, seconds);
        rows.push(timed_row(
            "gemm_bf16 plain",
            shape.clone(),
            seconds,
            format!("{rate:.0} TFLOP/s, {:.0}% of peak", 100.0 * rate / peak),
        ));
        drop((halves, products));
        let x = device.upload(&rng.values(TOKENS * inner, 1.0))?;
        let y = device.alloc_for::<f32>(TOKENS * out)?;
        let linear_shape = LinearShape::new(TOKENS, inner, out);
        let seconds = time_launches(device, fence, 20, || {
            linear_bf16_gemm(device, &x, &weight, None, (&y, linear_shape), Activations::Split)
        })?;
        let split = tflops(TOKENS, inner, out, seconds);
        rows.push(timed_row(
            "linear bf16 split gemm",
            shape.clone(),
            seconds,
            format!(
                "{split:.0} useful TFLOP/s (2 GEMM rows per token), {:.0}% of peak, {:.0}% of the plain GEMM; target >= 80% of peak",
                100.0 * split / peak,
                100.0 * split / rate
            ),
        ));
        let seconds_bf16 = time_launches(device, fence, 20, || {
            linear_bf16_gemm(device, &x, &weight, None, (&y, linear_shape), Activations::Bf16)
        })?;
        let bf16_rate = tflops(TOKENS, inner, out, seconds_bf16);
        rows.push(timed_row(
            "linear bf16 gemm, bf16 x",
            shape.clone(),
            seconds_bf16,
            format!(
                "{bf16_rate:.0} TFLOP/s (x rounded once: quantize's calibration passes), {:.0}% of the plain GEMM; \
                 target >= 70% of the plain GEMM",
                100.0 * bf16_rate / rate
            ),
        ));
        let pair = bf16_buffer(device, &mut rng, 2 * out * inner)?;
        let seconds_pair = time_launches(device, fence, 10, || {
            linear_bf16_pair(device, &x, &pair, None, (&y, linear_shape), Activations::Split)
        })?;
        let pair_rate = tflops(TOKENS, inner, out, seconds_pair);
        rows.push(timed_row(
            "linear bf16 pair gemm",
            shape.clone(),
            seconds_pair,
            format!(
                "{pair_rate:.0} useful TFLOP/s (block-FP8 weights: a BF16 pair by split x, 4 GEMM flops per useful one), {:.0}% of peak",
                100.0 * pair_rate / peak
            ),
        ));
        let seconds_pair_bf16 = time_launches(device, fence, 10, || {
            linear_bf16_pair(device, &x, &pair, None, (&y, linear_shape), Activations::Bf16)
        })?;
        let pair_bf16_rate = tflops(TOKENS, inner, out, seconds_pair_bf16);
        rows.push(timed_row(
            "linear bf16 pair gemm, bf16 x",
            shape.clone(),
            seconds_pair_bf16,
            format!(
                "{pair_bf16_rate:.0} useful TFLOP/s (a BF16 pair by x rounded once, 2 GEMM flops per useful one), {:.0}% \
                 of the plain GEMM",
                100.0 * pair_bf16_rate / rate
            ),
        ));
        drop(pair);
        let kernel = time_launches(device, fence, 3, || {
            linear_bf16(device, &x, &weight, None, &y, LinearShape::new(TOKENS, inner, out))
        })?;
        rows.push(timed_row(
            "linear bf16 kernel",
            shape,
            kernel,
            format!(
                "{:.1} TFLOP/s; the split GEMM is {:.1}x faster (it takes over from {GEMM_MIN_ROWS} rows)",
                tflops(TOKENS, inner, out, kernel),
                kernel / seconds
            ),
        ));
    }
    Ok(rows)
}

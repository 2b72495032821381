//! GPTQ's algebra on a device (runtime/cuda/gptq.rs over kernels/gptq.cu) against the host path (quant/gptq.rs):
//! the factor of the damped inverse Hessian and the codes of every scale rule on awkward widths, then the
//! benchmarks of one GLM-5 routed expert's GPTQ work (device against the host's cores, the same calls).

use std::time::Instant;

use crate::quant::gptq::{quantize_factored, GptqSettings, Hessian, InverseFactor};
use crate::quant::ScaleRule;
use crate::rng::Rng;
use crate::runtime::cuda::gptq::{DeviceGptq, DeviceGptqError};
use crate::runtime::device::{CudaError, Device};

use super::SelftestRow;

/// The factor's largest difference from the host's, relative to its largest entry: f64 in another summation order.
const FACTOR_TOLERANCE: f64 = 1e-9;
/// Share of codes equal to the host's from the same Hessian (the llm-compressor goldens' bound for the same
/// algorithm in another summation order; tests/integration/gptq_golden.rs).
const MIN_CODE_AGREEMENT: f64 = 0.999;

fn device_error(e: DeviceGptqError) -> CudaError {
    match e {
        DeviceGptqError::Device(e) => e,
        DeviceGptqError::Gptq(e) => CudaError::Unsupported { tensor: "gptq".into(), problem: e.to_string() },
    }
}

fn row(op: &str, shape: String, max_rel_error: f64, mismatches: usize, passed: bool, note: String) -> SelftestRow {
    SelftestRow {
        op: op.into(),
        shape,
        max_rel_error,
        mismatches,
        passed,
        seconds: None,
        gb_per_s: None,
        copy_share: None,
        note,
    }
}

/// Correlated inputs: a few shared directions plus noise, one channel never excited.
fn inputs(rng: &mut Rng, samples: usize, columns: usize) -> Vec<f32> {
    let basis = rng.values(8 * columns, 1.0);
    let mut x = rng.values(samples * columns, 0.3);
    for row in x.chunks_mut(columns) {
        for k in 0..8 {
            let weight = rng.normal();
            for (v, b) in row.iter_mut().zip(&basis[k * columns..(k + 1) * columns]) {
                *v += weight * b;
            }
        }
        row[1] = 0.0;
    }
    x
}

/// The factor at widths around the 32-column panels (its Hessian summed on the device too), and GPTQ's codes per rule at group 32 and 96 (a block edge
/// inside a group), each against the host from the same Hessian.
pub fn gptq(device: &dyn Device, rng: &mut Rng) -> Result<Vec<SelftestRow>, CudaError> {
    let gptq = DeviceGptq::new(device);
    let settings = GptqSettings::default();
    let mut rows = Vec::new();
    for columns in [31usize, 75] {
        let x = inputs(rng, columns + 9, columns);
        let mut hessian = Hessian::new(columns);
        hessian.add(&x);
        let mut on_device = gptq.hessian(columns)?;
        gptq.add(&mut on_device, &x)?;
        let factor = gptq.factor(&on_device, settings.damping).map_err(device_error)?;
        let got = gptq.download_factor(&factor)?;
        let expected = InverseFactor::new(&hessian, settings.damping).map_err(|e| device_error(e.into()))?;
        let scale = expected.upper().iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = got.iter().zip(expected.upper()).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max) / scale;
        let passed = worst <= FACTOR_TOLERANCE;
        rows.push(row(
            "gptq factor",
            format!("[{columns}, {columns}]"),
            worst,
            !passed as usize,
            passed,
            String::new(),
        ));
    }
    for (weight_rows, columns, group) in [(19usize, 160usize, 32usize), (7, 288, 96)] {
        let weights = rng.values(weight_rows * columns, 1.0);
        let mut hessian = Hessian::new(columns);
        hessian.add(&inputs(rng, columns / 2, columns));
        let factor = gptq.factor(&gptq.upload_hessian(&hessian)?, settings.damping).map_err(device_error)?;
        let host_factor = InverseFactor::new(&hessian, settings.damping).map_err(|e| device_error(e.into()))?;
        for rule in ScaleRule::ALL {
            let shape = (weight_rows, columns);
            let got = gptq.quantize(&weights, shape, &factor, (group, rule), settings.block).map_err(device_error)?;
            let expected = quantize_factored(&weights, weight_rows, columns, &host_factor, group, rule, settings.block)
                .map_err(|e| device_error(e.into()))?;
            let differ = got.codes.iter().zip(&expected.codes).filter(|(a, b)| a != b).count();
            let scales_differ = got.scales.iter().zip(&expected.scales).filter(|(a, b)| a != b).count();
            let share = 1.0 - differ as f64 / got.codes.len() as f64;
            rows.push(row(
                "gptq quantize",
                format!("[{weight_rows}, {columns}] g{group} {rule}"),
                1.0 - share,
                differ,
                share >= MIN_CODE_AGREEMENT,
                format!("{scales_differ} scales differ"),
            ));
        }
    }
    Ok(rows)
}

/// GLM-5's routed experts (GLM-5.2's too): hidden 6144, expert width 2048.
const GLM5_EXPERT: (usize, usize) = (6144, 2048);
/// GLM-5.2's routed experts: 75 MoE layers × 256 (its MTP layer's 256 more where a recipe quantizes them).
const GLM52_ROUTED_EXPERTS: usize = 75 * 256;

/// One GLM-5 routed expert's GPTQ work at `tokens` calibration rows, and GLM-5.2's projected from it (below).
pub fn bench(device: &dyn Device, tokens: usize) -> Result<Vec<SelftestRow>, CudaError> {
    bench_expert(device, tokens, GLM5_EXPERT, GLM52_ROUTED_EXPERTS)
}

/// One routed expert's GPTQ work at `tokens` calibration rows, as the `gptq` method does it: the Hessian of its
/// hidden-state inputs and its factor (shared by gate_proj and up_proj), two column loops `[inner, hidden]`, the
/// Hessian and factor of its intermediate activations and down_proj's column loop `[hidden, inner]`; device
/// against the host's cores, wall seconds of the same calls (values random: the time does not depend on them),
/// and the algebra of `experts` such experts at the device's rate (the forward not included).
pub fn bench_expert(
    device: &dyn Device,
    tokens: usize,
    (hidden, inner): (usize, usize),
    experts: usize,
) -> Result<Vec<SelftestRow>, CudaError> {
    let gptq = DeviceGptq::new(device);
    let settings = GptqSettings::default();
    let host_error = |e: crate::quant::gptq::GptqError| device_error(e.into());
    let mut rng = Rng::new(0x6717_0001);
    let mut rows = Vec::new();
    let (mut device_total, mut host_total) = (0.0, 0.0);
    let threads = rayon::current_num_threads();
    for (name, weight_rows, columns, loops) in [("gate/up", inner, hidden, 2), ("down", hidden, inner, 1)] {
        let x = rng.values(tokens * columns, 1.0);
        let weights = rng.values(weight_rows * columns, 0.02);
        let started = Instant::now();
        let mut hessian = gptq.hessian(columns)?;
        gptq.add(&mut hessian, &x)?;
        let factor = gptq.factor(&hessian, settings.damping).map_err(device_error)?;
        let factored = started.elapsed().as_secs_f64();
        let started = Instant::now();
        gptq.quantize(&weights, (weight_rows, columns), &factor, (32, ScaleRule::CtMinmax), settings.block)
            .map_err(device_error)?;
        let quantized = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let mut host = Hessian::new(columns);
        host.add(&x);
        let host_factor = InverseFactor::new(&host, settings.damping).map_err(host_error)?;
        let host_factored = started.elapsed().as_secs_f64();
        let started = Instant::now();
        quantize_factored(&weights, weight_rows, columns, &host_factor, 32, ScaleRule::CtMinmax, settings.block)
            .map_err(host_error)?;
        let host_quantized = started.elapsed().as_secs_f64();
        device_total += factored + loops as f64 * quantized;
        host_total += host_factored + loops as f64 * host_quantized;
        for (what, seconds, host_seconds) in [
            (format!("hessian of {tokens} rows + factor [{columns}, {columns}]"), factored, host_factored),
            (format!("column loop [{weight_rows}, {columns}] g32"), quantized, host_quantized),
        ] {
            rows.push(SelftestRow {
                seconds: Some(seconds),
                note: format!("host ({threads} threads) {host_seconds:.3} s: device {:.1}x", host_seconds / seconds),
                ..row(&format!("gptq {name}"), what, 0.0, 0, true, String::new())
            });
        }
    }
    rows.push(SelftestRow {
        seconds: Some(device_total),
        note: format!(
            "host {host_total:.3} s: device {:.1}x; {experts} such experts {:.2} h of algebra on this device",
            host_total / device_total,
            experts as f64 * device_total / 3600.0
        ),
        ..row("gptq expert", format!("hidden {hidden}, width {inner}, {tokens} rows"), 0.0, 0, true, String::new())
    });
    Ok(rows)
}

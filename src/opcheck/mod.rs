//! One table of op checks, in the spirit of llama.cpp's `test-backend-ops`: one [`Case`] per op, each running the
//! device under test (the GPU or the emulated device, through the CUDA backend or the quantize command's device
//! path) against the CPU path on seeded inputs of awkward shapes (odd sizes, not multiples of 32 or 128), each
//! with a named tolerance stating its reason. [`Mode::Test`] runs the table; [`Mode::Perf`] adds the benchmarks.
//! `squeeze selftest` and tests/integration/device_ops.rs run the same table.

pub mod backend_ops;
mod dense_bench;
pub mod expert_ops;
pub mod fp4_ops;
pub mod gptq_ops;
mod host;
pub mod kv_ops;
pub mod quantize_kernels;
mod timing;

use crate::rng::Rng;
use crate::runtime::cuda::CudaBackend;
use crate::runtime::device::{CudaError, DeviceCounters, DeviceInfo};

/// What a run does: every case against the CPU, or that and then the benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Test,
    /// Benchmarks on a `[bench_rows, 6144]` FP8 tensor and GLM-5-shaped device data (a real GPU).
    Perf {
        bench_rows: usize,
    },
}

/// One line of the self-test table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SelftestRow {
    pub op: String,
    pub shape: String,
    /// The case's error measure: relative L2 vs the CPU, or for the quantize kernels max |Δ| / max |cpu| of the
    /// dequantized values; 0 when bit-identical.
    pub max_rel_error: f64,
    /// Elements, groups, selections or checks that differ from the CPU.
    pub mismatches: usize,
    pub passed: bool,
    pub seconds: Option<f64>,
    pub gb_per_s: Option<f64>,
    /// Share of the measured device copy bandwidth.
    pub copy_share: Option<f64>,
    pub note: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SelftestReport {
    pub device: SelftestDevice,
    pub image: String,
    pub seed: u64,
    pub copy_gb_per_s: Option<f64>,
    pub rows: Vec<SelftestRow>,
    pub passed: bool,
}

/// The device a self-test ran on: the GPU's facts (none on the emulated device), and the run's host↔device copies
/// by kind and kernel launches (`device.transfers`, `device.launches`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct SelftestDevice {
    #[serde(flatten)]
    pub info: Option<DeviceInfo>,
    #[serde(flatten)]
    pub counters: DeviceCounters,
}

/// The device under test.
pub struct Target<'a> {
    pub backend: &'a CudaBackend,
    /// The emulated device: the kernels use the host's libm, so the quantize kernels' `mse` must be bit-identical
    /// too (a GPU may differ by a tie within rounding).
    pub exact: bool,
}

/// One op of the table.
pub struct Case {
    /// The op family, as `--op` selects it.
    pub op: &'static str,
    check: fn(&Target, &mut Rng) -> Result<Vec<SelftestRow>, CudaError>,
}

/// Every op, each once. No op's name contains another's, so a filter of one whole name runs that case alone.
pub const CASES: [Case; 20] = [
    Case { op: "fp4_dequant", check: |target, rng| fp4_ops::fp4_dequant(target.backend.device(), rng) },
    Case {
        op: "fp8_block_dequant",
        check: |target, rng| quantize_kernels::fp8_block_dequant(target.backend.device(), rng),
    },
    Case {
        op: "int4_quantize_fp8",
        check: |target, rng| quantize_kernels::int4_quantize_fp8(target.backend.device(), rng, target.exact),
    },
    Case {
        op: "int4_quantize_f32",
        check: |target, rng| quantize_kernels::int4_quantize_f32(target.backend.device(), rng, target.exact),
    },
    Case { op: "linear f32", check: |target, rng| Ok(backend_ops::linear_f32(target.backend, rng)) },
    Case { op: "linear bf16", check: |target, rng| backend_ops::linear_bf16_weights(target.backend, rng) },
    Case { op: "gemm_bf16", check: |target, rng| backend_ops::linear_bf16_split_gemm(target.backend, rng) },
    Case { op: "linear w4a16", check: |target, rng| Ok(backend_ops::linear_w4a16(target.backend, rng)) },
    Case { op: "w4a16_grouped", check: |target, rng| expert_ops::w4a16_grouped_experts(target.backend, rng) },
    Case { op: "norm", check: |target, rng| Ok(backend_ops::norms(target.backend, rng)) },
    Case { op: "rope", check: |target, rng| Ok(backend_ops::rope(target.backend, rng)) },
    Case { op: "silu_mul", check: |target, rng| Ok(backend_ops::silu_mul(target.backend, rng)) },
    Case { op: "attention", check: |target, rng| Ok(backend_ops::attention(target.backend, rng)) },
    Case { op: "kv_write", check: |target, rng| kv_ops::kv_write(target.backend, rng) },
    Case { op: "paged_decode", check: |target, rng| kv_ops::paged_decode(target.backend, rng) },
    Case { op: "paged_select", check: |target, rng| kv_ops::paged_select(target.backend, rng) },
    Case { op: "route", check: |target, rng| Ok(backend_ops::route(target.backend, rng)) },
    Case { op: "moe_experts", check: |target, rng| Ok(expert_ops::moe_experts(target.backend, rng)) },
    Case { op: "indexer", check: |target, rng| Ok(backend_ops::indexer_top_k(target.backend, rng)) },
    Case { op: "gptq", check: |target, rng| gptq_ops::gptq(target.backend.device(), rng) },
];

/// A failed row naming what went wrong.
fn failure_row(op: &str, note: String) -> SelftestRow {
    SelftestRow {
        op: op.into(),
        shape: String::new(),
        max_rel_error: f64::INFINITY,
        mismatches: 1,
        passed: false,
        seconds: None,
        gb_per_s: None,
        copy_share: None,
        note,
    }
}

/// Calibration rows of the GPTQ benchmark's expert (32 × 256 tokens routed top-8 of 256 experts reach about 256;
/// `--force-route-all` gives each all 8192).
const GPTQ_BENCH_TOKENS: usize = 2048;

/// What a run found: its rows and, in perf mode, the device copy bandwidth the benchmarks are measured against.
pub struct Checked {
    pub rows: Vec<SelftestRow>,
    pub copy_gb_per_s: Option<f64>,
}

/// Runs the cases whose op contains one of the comma-separated names in `filter` (all without one), each on its
/// own generator from `seed` and its name; a device error becomes a failed row of that case. In perf mode the benchmarks
/// follow (an error there is returned: timings are not checks).
pub fn run(target: &Target, seed: u64, filter: Option<&str>, mode: Mode) -> Result<Checked, CudaError> {
    let mut rows = Vec::new();
    let selected = |case: &&Case| filter.is_none_or(|filter| filter.split(',').any(|name| case.op.contains(name)));
    for case in CASES.iter().filter(selected) {
        let mut rng = Rng::for_name(seed, case.op);
        match (case.check)(target, &mut rng) {
            Ok(case_rows) => rows.extend(case_rows),
            Err(error) => rows.push(failure_row(case.op, format!("device error: {error}"))),
        }
    }
    let Mode::Perf { bench_rows } = mode else { return Ok(Checked { rows, copy_gb_per_s: None }) };
    let backend = target.backend;
    let quantize = quantize_kernels::bench(backend.device(), &mut Rng::new(0xBE7C_0001), bench_rows)?;
    rows.extend(quantize.rows);
    rows.extend(backend_ops::bench(backend, quantize.copy_gb_per_s)?);
    rows.extend(expert_ops::bench_grouped(backend.device(), quantize.copy_gb_per_s)?);
    rows.extend(gptq_ops::bench(backend.device(), GPTQ_BENCH_TOKENS)?);
    Ok(Checked { rows, copy_gb_per_s: Some(quantize.copy_gb_per_s) })
}

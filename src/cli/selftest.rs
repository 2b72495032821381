//! `squeeze selftest` arguments and table.

use anyhow::Context;

use std::sync::Arc;

use crate::opcheck::{self, Checked, Mode, SelftestDevice, SelftestReport, Target};
use crate::runtime::cuda::CudaBackend;
use crate::runtime::device::emulated::Emulator;
use crate::runtime::device::{select, Device, DeviceChoice, DeviceSelection};
use crate::runtime::Backend;

use super::output::{print_json, Outcome};
use super::table::Table;

#[derive(clap::Args)]
pub struct Args {
    /// Device to test: cuda, auto or emulated.
    ///
    /// Device to test: cuda (or auto, which fails the same way when no GPU is usable), or emulated (the kernels
    /// compiled for the host; no benchmarks).
    #[arg(long, default_value = "cuda")]
    pub device: DeviceChoice,
    /// Seed of the random inputs; default: fresh from the clock.
    #[arg(long, value_parser = super::values::whole::<u64>)]
    pub seed: Option<u64>,
    /// Skip the benchmarks (correctness only).
    #[arg(long)]
    pub no_bench: bool,
    /// Rows of the benchmark tensor (6144 columns of FP8).
    #[arg(long, default_value_t = 16384, value_parser = super::values::count)]
    pub bench_rows: usize,
    /// Run only the ops whose name contains one of these names.
    ///
    /// Run only the ops whose name contains one of these comma-separated names (e.g. `silu_mul,int4_quantize`);
    /// default: every op.
    #[arg(long)]
    pub op: Option<String>,
    /// Print one JSON report on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    let report = match args.device {
        DeviceChoice::Cpu => {
            anyhow::bail!("selftest compares the GPU kernels with the CPU path; use --device cuda (or emulated)")
        }
        DeviceChoice::Emulated => emulated_report(&args, seed)?,
        DeviceChoice::Auto | DeviceChoice::Cuda => gpu_report(&args, seed)?,
    };
    if args.json {
        print_json(&report)?;
    } else {
        let mut table =
            Table::new(&["op", "shape", "max rel err", "mismatches", "ok", "time", "GB/s", "of copy bw", "note"]);
        let optional = |value: Option<f64>, format: fn(f64) -> String| value.map(format).unwrap_or_else(|| "-".into());
        for row in &report.rows {
            table.row(vec![
                row.op.clone(),
                row.shape.clone(),
                format!("{:.1e}", row.max_rel_error),
                row.mismatches.to_string(),
                if row.passed { "ok".into() } else { "FAIL".into() },
                optional(row.seconds, |s| format!("{:.3} ms", s * 1e3)),
                optional(row.gb_per_s, |g| format!("{g:.0}")),
                optional(row.copy_share, |c| format!("{:.0}%", c * 100.0)),
                row.note.clone(),
            ]);
        }
        println!("{}", table.render());
        let device = report.device.info.as_ref().map_or_else(|| report.image.clone(), |device| device.to_string());
        println!("\n{device}: {}", if report.passed { "all kernels match the CPU path" } else { "MISMATCH" });
    }
    Ok(if report.passed { Outcome::Success } else { Outcome::GateFailed })
}

/// The op table and (unless --no-bench) the benchmarks on the GPU.
fn gpu_report(args: &Args, seed: u64) -> anyhow::Result<SelftestReport> {
    let gpu = match select(DeviceChoice::Cuda).context("selftest")? {
        DeviceSelection::Gpu(gpu) => *gpu,
        _ => anyhow::bail!("selftest: no GPU selected"),
    };
    eprintln!("selftest on {} ({}), seed {seed}", gpu.info(), gpu.image());
    let (info, image) = (gpu.info().clone(), gpu.image().to_string());
    let backend = CudaBackend::new(Arc::new(gpu));
    let mode = if args.no_bench { Mode::Test } else { Mode::Perf { bench_rows: args.bench_rows } };
    let target = Target { backend: &backend, exact: false };
    let Checked { rows, copy_gb_per_s } = opcheck::run(&target, seed, args.op.as_deref(), mode).context("selftest")?;
    let passed = rows.iter().all(|row| row.passed);
    let device = SelftestDevice { info: Some(info), counters: backend.device_counters().unwrap_or_default() };
    Ok(SelftestReport { device, image, seed, copy_gb_per_s, rows, passed })
}

/// The op table on the emulated device (no benchmarks: its timings mean nothing).
fn emulated_report(args: &Args, seed: u64) -> anyhow::Result<SelftestReport> {
    let emulator = Emulator::start().context("starting the kernel emulator")?;
    let image = emulator.describe();
    let backend = CudaBackend::new(Arc::new(emulator));
    let target = Target { backend: &backend, exact: true };
    let rows = opcheck::run(&target, seed, args.op.as_deref(), Mode::Test).context("selftest")?.rows;
    let passed = rows.iter().all(|row| row.passed);
    let device = SelftestDevice { info: None, counters: backend.device_counters().unwrap_or_default() };
    Ok(SelftestReport { device, image, seed, copy_gb_per_s: None, rows, passed })
}

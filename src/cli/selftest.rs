//! `squeeze selftest` arguments and table.

use anyhow::Context;

use crate::cuda::{select, selftest, DeviceChoice, Selection};

use super::table::Table;
use super::{print_json, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// Device to test: cuda (or auto, which fails the same way when no GPU is usable).
    #[arg(long, default_value = "cuda")]
    pub device: DeviceChoice,
    /// Seed of the random inputs; default: fresh from the clock.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Skip the benchmarks (correctness only).
    #[arg(long)]
    pub no_bench: bool,
    /// Rows of the benchmark tensor (6144 columns of FP8).
    #[arg(long, default_value_t = 16384)]
    pub bench_rows: usize,
    /// Print one JSON report on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    if args.device == DeviceChoice::Cpu {
        anyhow::bail!("selftest compares the GPU kernels with the CPU path; use --device cuda");
    }
    let gpu = match select(DeviceChoice::Cuda).context("selftest")? {
        Selection::Gpu(gpu) => gpu,
        Selection::Cpu | Selection::CpuFallback(_) => anyhow::bail!("selftest: no GPU selected"),
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    eprintln!("selftest on {} ({}), seed {seed}", gpu.info(), gpu.image());
    let report = selftest::run(&gpu, seed, !args.no_bench, args.bench_rows).context("selftest")?;
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
        println!("\n{}: {}", report.device, if report.passed { "all kernels match the CPU path" } else { "MISMATCH" });
    }
    Ok(if report.passed { Outcome::Success } else { Outcome::GateFailed })
}

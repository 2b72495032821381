//! `squeeze demo`: synth → quantize → verify → inspect on a tiny GLM-5-shaped model in a temporary folder.

use std::path::PathBuf;

use crate::convert::{quantize, QuantizeOptions};
use crate::inspect::inspect;
use crate::progress::Silent;
use crate::synth::{synth, SynthArch, SynthOptions, SynthSize};
use crate::units::both_units;
use crate::verify::{verify, VerifyOptions, DEFAULT_MAX_INT4_ERROR};

use super::Outcome;

#[derive(clap::Args)]
pub struct Args {
    /// Architecture of the demo model: kimi-k2, glm5 or glm45.
    #[arg(long, default_value = "glm5")]
    pub arch: SynthArch,
    /// Keep the demo folder here instead of a temporary one.
    #[arg(long)]
    pub keep: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let temporary = std::env::temp_dir().join(format!("squeeze-demo-{}", std::process::id()));
    let base = args.keep.clone().unwrap_or(temporary.clone());
    let result = stages(&args, &base);
    if args.keep.is_none() {
        let _ = std::fs::remove_dir_all(&temporary);
    }
    result
}

fn stages(args: &Args, base: &std::path::Path) -> anyhow::Result<Outcome> {
    let source = base.join("fp8");
    let output = base.join("int4");
    println!("[1/4] synth: tiny {} checkpoint in the vendor FP8 block format", args.arch.name());
    let made = synth(&SynthOptions {
        arch: args.arch,
        size: SynthSize::default(),
        shards: 2,
        seed: 0,
        out: source.clone(),
        force: true,
    })?;
    println!("      {} tensors, {} parameters, {}", made.tensors, made.parameters, both_units(made.bytes));

    println!("[2/4] quantize: routed experts → INT4 g32, rest BF16");
    let options = QuantizeOptions {
        input: source.clone(),
        output: output.clone(),
        recipe: None,
        group_size: None,
        scale_rule: None,
        max_shard_bytes: 5_000_000,
        resume: false,
        force: true,
        dry_run: false,
        device: crate::cuda::DeviceChoice::Cpu,
    };
    let report = quantize(&options, &Silent)?;
    println!(
        "      recipe {}: {} quantized, {} converted, {} copied; {} → {} in {} shards ({:.2} s)",
        report.recipe,
        report.tensors_quantized,
        report.tensors_converted,
        report.tensors_copied,
        both_units(report.input_bytes),
        both_units(report.output_bytes),
        report.shards,
        report.seconds
    );

    println!("[3/4] verify: manifest hashes, compressed-tensors conventions, error against the FP8 source");
    let checked = verify(&VerifyOptions {
        output: output.clone(),
        source: Some(source.clone()),
        max_int4_error: DEFAULT_MAX_INT4_ERROR,
        worst: 3,
    })?;
    let worst =
        checked.worst.first().map(|w| format!("worst {} rel L2 {:.4}", w.name, w.relative_l2)).unwrap_or_default();
    println!(
        "      {} tensors compared, {}; {}",
        checked.compared_tensors,
        if checked.passed { "OK" } else { "FAILED" },
        worst
    );
    for problem in &checked.problems {
        println!("      mismatch: {problem}");
    }

    println!("[4/4] inspect: the INT4 output");
    let seen = inspect(&output)?;
    let dtypes = seen.dtypes.iter().map(|(d, c)| format!("{d}×{}", c.tensors)).collect::<Vec<_>>().join(", ");
    println!("      {} tensors: {dtypes}", seen.tensors);
    if args.keep.is_some() {
        println!("\nfolders kept: {} (FP8) and {} (INT4)", source.display(), output.display());
    }
    Ok(if checked.passed { Outcome::Success } else { Outcome::GateFailed })
}

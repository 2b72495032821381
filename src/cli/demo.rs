//! `squeeze demo`: synth → quantize → verify → inspect → eval → calibrate-kv → parity → serve-test on a tiny GLM-5-shaped model in a temporary folder.

use std::path::PathBuf;

use crate::calib::{calibrate, write_scales, CalibOptions, Strategy};
use crate::convert::{quantize, QuantizeOptions};
use crate::eval::parity::{evaluate_parity, Gates, Mode, ParityOptions};
use crate::eval::{evaluate, EvalInput, EvalOptions};
use crate::inspect::inspect;
use crate::progress::Silent;
use crate::runtime::kv_cache::KvDtype;
use crate::runtime::Cpu;
use crate::serve::sampling::Sampling;
use crate::serve::{serve_test, ServeOptions};
use crate::synth::{synth, SynthArch, SynthOptions, SynthSize};
use crate::units::both_units;
use crate::verify::{verify, VerifyOptions, DEFAULT_MAX_INT4_ERROR};

use super::eval::{DEFAULT_MAX_MEAN_KLD, DEFAULT_MAX_PPL_RATIO, DEFAULT_MIN_SAME_TOP};
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

/// The demo's evaluation text: public-domain sonnets shipped in `eval/`.
const SONNETS: &str = include_str!("../../eval/sonnets.txt");

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
    println!("[1/8] synth: tiny {} checkpoint in the vendor FP8 block format", args.arch.name());
    let made = synth(&SynthOptions {
        arch: args.arch,
        size: SynthSize::default(),
        shards: 2,
        seed: 0,
        out: source.clone(),
        force: true,
    })?;
    println!("      {} tensors, {} parameters, {}", made.tensors, made.parameters, both_units(made.bytes));

    println!("[2/8] quantize: routed experts → INT4 g32, rest BF16");
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
        engine: crate::lint::EngineChoice::All,
        tp: None,
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

    println!(
        "[3/8] verify: manifest hashes, compressed-tensors conventions, vLLM/SGLang load rules, error against the FP8 source"
    );
    let checked = verify(&VerifyOptions {
        output: output.clone(),
        source: Some(source.clone()),
        max_int4_error: DEFAULT_MAX_INT4_ERROR,
        worst: 3,
        engine: crate::lint::EngineChoice::All,
        tp: None,
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

    println!("[4/8] inspect: the INT4 output");
    let seen = inspect(&output)?;
    let dtypes = seen.dtypes.iter().map(|(d, c)| format!("{d}×{}", c.tensors)).collect::<Vec<_>>().join(", ");
    println!("      {} tensors: {dtypes}", seen.tensors);
    println!("[5/8] eval: perplexity of the FP8 source and the INT4 output on eval/sonnets.txt (64-token chunks)");
    let text = base.join("sonnets.txt");
    std::fs::write(&text, SONNETS)?;
    let mut perplexities = Vec::new();
    for (label, model) in [("FP8", &source), ("INT4", &output)] {
        let options = EvalOptions {
            model: model.clone(),
            input: EvalInput::Text { path: text.clone(), ctx: 64 },
            chunks: Some(4),
            save_logits: None,
        };
        let report = evaluate(&options, &Cpu, &Silent)?;
        println!(
            "      {label:<4} ppl {:.3} ± {:.3} over {} tokens ({:.0} tokens/s)",
            report.ppl, report.ppl_stderr, report.tokens, report.tokens_per_second
        );
        perplexities.push(report.ppl);
    }
    println!(
        "      INT4 / FP8 perplexity ratio {:.4} (random weights: only the ratio is meaningful)",
        perplexities[1] / perplexities[0]
    );

    println!("[6/8] calibrate-kv: FP8 KV scales of the INT4 model from the same text, written into its folder");
    let calibration = calibrate(
        &CalibOptions {
            model: output.clone(),
            input: EvalInput::Text { path: text.clone(), ctx: 64 },
            samples: 8,
            percentile: None,
            strategy: Strategy::Tensor,
        },
        &Cpu,
        &Silent,
    )?;
    write_scales(&calibration, &output, None, None)?;
    let scales: Vec<String> = calibration.layers.iter().map(|l| format!("{:.3e}", l.k_scale[0])).collect();
    println!("      {} layers, k_scale per layer: {}", calibration.layers.len(), scales.join(" "));

    println!("[7/8] eval parity: FP8 reference vs the split deployment (prefill FP8 + BF16 KV, decode INT4 + FP8 KV)");
    let parity = evaluate_parity(
        &ParityOptions {
            reference: source.clone(),
            candidate: output.clone(),
            input: EvalInput::Text { path: text.clone(), ctx: 64 },
            chunks: Some(4),
            modes: Mode::ALL.to_vec(),
            gates: Gates {
                max_mean_kld: DEFAULT_MAX_MEAN_KLD,
                min_same_top: DEFAULT_MIN_SAME_TOP,
                max_ppl_ratio: DEFAULT_MAX_PPL_RATIO,
            },
        },
        &Cpu,
        &Silent,
    )?;
    for (mode, report) in &parity.mode_reports {
        println!(
            "      {:<9} mean KLD {:.5}  same top {:.1} %  PPL ratio {:.4}",
            mode.name(),
            report.summary.mean_kld,
            report.summary.same_top,
            report.summary.ppl_ratio
        );
    }
    let gates = if parity.failures.is_empty() {
        "gates passed".to_string()
    } else {
        format!("{} gate(s) failed", parity.failures.len())
    };
    println!("      {gates} (random tiny weights: the numbers show the machinery, not a real model's accuracy)");

    println!("[8/8] serve-test: two prompts decoded on the INT4 model through the paged FP8 KV cache, pages verified");
    let served = serve_test(
        &Cpu,
        &ServeOptions {
            model: output.clone(),
            prefill_model: Some(source.clone()),
            prompts: vec!["Shall I compare thee".into(), "From fairest creatures".into()],
            max_new_tokens: 12,
            concurrency: 2,
            page_size: 16,
            kv_pages: None,
            kv_dtype: KvDtype::Fp8,
            sampling: Sampling { temperature: 0.0, top_p: 1.0 },
            seed: 0,
            fault: None,
            verify: true,
        },
    )?;
    println!(
        "      {} completed, {} aborted; {} mappings verified, {} faults; verification {:.3} % of decode time",
        served.completed,
        served.aborted,
        served.mappings_verified,
        served.faults_detected,
        100.0 * served.verify_share
    );
    for request in &served.requests {
        println!("      {:?} → {:?}", request.prompt, request.text);
    }
    if args.keep.is_some() {
        println!("\nfolders kept: {} (FP8) and {} (INT4)", source.display(), output.display());
    }
    let passed = checked.passed && served.passed();
    Ok(if passed { Outcome::Success } else { Outcome::GateFailed })
}

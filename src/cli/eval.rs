//! `squeeze eval` arguments and output: one model's perplexity, or `--reference REF --candidate CAND` parity with
//! gates (exit 1 naming the failed gate).

use std::path::PathBuf;

use anyhow::Context;

use crate::runtime::device::{DeviceChoice, DeviceCounters};

use crate::chunks::EvalInput;
use crate::engines::Engine;
use crate::eval::parity::{plot, KvScaleChoice, ParityOptions, ParityReport};
use crate::eval::parity_pass::evaluate_parity;
use crate::eval::{evaluate, EvalOptions};
use crate::parity::{Gates, Mode};

use super::output::{print_json, ContextUnlessNamed, Outcome};
use super::progress::Bar;
use super::table::Table;

#[derive(clap::Args)]
pub struct Args {
    /// Model to evaluate: folder or Hugging Face repo id.
    ///
    /// Model (FP8, INT4 compressed-tensors or BF16 checkpoint with config.json): folder or Hugging Face repo id
    /// (ORG/NAME[@REV]) in the local cache.
    #[arg(required_unless_present = "reference", conflicts_with = "reference", value_parser = super::values::model_dir)]
    pub model: Option<PathBuf>,
    /// Parity: the reference model (the prefill checkpoint).
    ///
    /// Parity: the reference model (the prefill checkpoint, e.g. the FP8 release): folder or Hugging Face repo id
    /// (ORG/NAME[@REV]) in the local cache.
    #[arg(long, requires = "candidate", value_parser = super::values::model_dir)]
    pub reference: Option<PathBuf>,
    /// Parity: the candidate model (the decode checkpoint).
    ///
    /// Parity: the candidate (the decode checkpoint, e.g. INT4), whose k_scale/v_scale set the FP8 KV cache: folder
    /// or Hugging Face repo id (ORG/NAME[@REV]) in the local cache.
    #[arg(long, requires = "reference", value_parser = super::values::model_dir)]
    pub candidate: Option<PathBuf>,
    /// Parity modes to run (comma-separated); default all.
    ///
    /// Parity modes to run (comma-separated); default all: reference, kv, weights, split.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub modes: Vec<Mode>,
    /// Gate: a mode's largest mean KLD (nats).
    ///
    /// Gate: fail when a mode's mean KLD against the reference exceeds this (nats).
    #[arg(long, default_value_t = DEFAULT_MAX_MEAN_KLD, value_parser = super::values::non_negative)]
    pub max_mean_kld: f64,
    /// Gate: a mode's smallest same-top-1 share (percent).
    ///
    /// Gate: fail when a mode's same-top-1 share is below this (percent).
    #[arg(long, default_value_t = DEFAULT_MIN_SAME_TOP, value_parser = super::values::percent)]
    pub min_same_top: f64,
    /// Gate: a mode's largest PPL ratio to the reference.
    ///
    /// Gate: fail when a mode's PPL(Q)/PPL(reference) exceeds this.
    #[arg(long, default_value_t = DEFAULT_MAX_PPL_RATIO, value_parser = super::values::positive)]
    pub max_ppl_ratio: f64,
    /// Parity: the scales the FP8-KV modes cache with.
    ///
    /// Parity: the scales the FP8-KV modes (kv, split) cache with — engine: what --engine really uses for this
    /// cache layout (the candidate's k_scale/v_scale for GQA; 1.0 for MLA in vLLM 0.32 and SGLang's Hopper
    /// backends; per-128 dynamic tiles for GLM-5's sparse MLA), calibrated: the candidate's scales, one: 1.0.
    #[arg(long, value_enum, default_value = "engine", requires = "reference")]
    pub kv_scales: KvScaleChoice,
    /// Parity: the engine --kv-scales engine follows.
    ///
    /// Parity: the serving engine whose KV-cache behaviour --kv-scales engine follows.
    #[arg(long, value_enum, default_value = "vllm", requires = "reference")]
    pub engine: Engine,
    /// Parity: draw the KLD and per-layer error into this SVG.
    ///
    /// Parity: draw the KLD distribution and per-layer error of each mode into this SVG file.
    #[arg(long, requires = "reference")]
    pub plot: Option<PathBuf>,
    /// UTF-8 text file, cut into --ctx chunks.
    ///
    /// UTF-8 text file, tokenized with the model's tokenizer and cut into --ctx chunks.
    #[arg(long, conflicts_with = "tokens", required_unless_present_any = ["tokens", "task"])]
    pub data: Option<PathBuf>,
    /// Task benchmark: a JSON Lines file of items (multiple choice or generation).
    ///
    /// Task benchmark instead of perplexity: a JSON Lines file of items, scored as lm-evaluation-harness scores them
    /// — multiple choice by log-likelihood (acc, acc_norm) or greedy generation with exact match — one model, or
    /// with --reference/--candidate both, paired per item (flips, McNemar's exact test). Schema:
    /// docs/subcommands.md#task-files.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["data", "tokens", "modes", "mtp", "save_logits"])]
    pub task: Option<PathBuf>,
    /// With --task: few-shot examples before each item.
    ///
    /// With --task: the first K items marked "fewshot": true of each task go before every scored item, as
    /// `context answer` blocks separated by blank lines (the harness's first_n sampler).
    #[arg(long, value_name = "K", default_value_t = 0, requires = "task")]
    pub num_fewshot: usize,
    /// With --task and --reference/--candidate: prefill the candidate's generations on the reference.
    ///
    /// With --task and --reference/--candidate: each generation item's prompt is prefilled on the reference and
    /// decoded on the candidate, as the split deployment serves it (the KV cache handed over in f32; the
    /// multiple-choice scores are the candidate's own forward).
    #[arg(long, requires = "task")]
    pub split: bool,
    /// Gate with --task: most items that may flip per task.
    ///
    /// Gate with --task and --reference/--candidate: fail (exit 1) when more than N items of a task flipped
    /// between the models (right → wrong plus wrong → right), per metric.
    #[arg(long, value_name = "N", requires = "task")]
    pub max_flips: Option<usize>,
    /// Gate with --task: largest accuracy drop (points).
    ///
    /// Gate with --task and --reference/--candidate: fail (exit 1) when the candidate's accuracy on a task is more
    /// than this many percentage points below the reference's, per metric.
    #[arg(long, value_name = "POINTS", requires = "task", value_parser = super::values::non_negative)]
    pub max_acc_drop: Option<f64>,
    /// safetensors file with `input_ids` [n, ctx], used as given.
    ///
    /// safetensors file with an integer tensor `input_ids` [n, ctx] (I32 or I64), used as given (no BOS added).
    #[arg(long)]
    pub tokens: Option<PathBuf>,
    /// Tokens per chunk for --data.
    ///
    /// Tokens per chunk for --data (at least 2: the first token of a chunk is never scored; parity needs 4).
    #[arg(long, default_value_t = 512, value_parser = super::values::at_least(2))]
    pub ctx: usize,
    /// Run chunks longer than the context window, with a warning.
    ///
    /// Run chunks longer than the model's context window (max_position_embeddings, or YaRN's
    /// original_max_position_embeddings × factor where that is smaller; parity: either model's), with a warning in
    /// the report, instead of refusing.
    #[arg(long)]
    pub allow_long_context: bool,
    /// Evaluate at most this many chunks.
    #[arg(long, value_parser = super::values::count)]
    pub chunks: Option<usize>,
    /// Write all logits to this safetensors file.
    ///
    /// Write all logits as an F32 tensor `logits` [n, ctx, vocab] to this safetensors file.
    #[arg(long)]
    pub save_logits: Option<PathBuf>,
    /// Print the report as JSON (keys include ppl, mean_nll, tokens, seconds).
    #[arg(long)]
    pub json: bool,
    /// Score only part I of N of the chunks.
    ///
    /// Score only part I of N of the chunks (a contiguous run, the parts as even as whole chunks allow), e.g.
    /// $SLURM_ARRAY_TASK_ID/8; the report covers those chunks. With --save-stats, `squeeze merge-eval` joins the
    /// parts into the report one run gives. Gates are not applied to a part (merge-eval applies them).
    #[arg(long, value_name = "I/N", requires = "save_stats", allow_hyphen_values = true)]
    pub part: Option<crate::part::Part>,
    /// Write the raw statistics for `squeeze merge-eval`.
    ///
    /// Write the raw statistics (per-position NLLs; parity: per-position KLD, Δp, NLLs, top-1 flags and per-layer,
    /// per-chunk error sums), a small safetensors file, for `squeeze merge-eval FILE…`.
    #[arg(long, value_name = "FILE")]
    pub save_stats: Option<PathBuf>,
    /// Also measure the MTP layer's speculative-decoding drafts.
    ///
    /// Also measure the MTP layer's speculative-decoding drafts (GLM-4.5+ and GLM-5+ checkpoints): the share of
    /// greedy drafts the main model accepts, the mean accepted length per step, the draft's KLD from the main model.
    /// In parity, both models' drafts side by side (one extra forward of each), gated by --max-mtp-drop.
    #[arg(long)]
    pub mtp: bool,
    /// Parity gate with --mtp: largest drop in accepted drafts (points).
    ///
    /// Parity gate with --mtp: fail when the candidate accepts this many percentage points fewer drafts than the
    /// reference.
    #[arg(long, default_value_t = DEFAULT_MAX_MTP_DROP, value_parser = super::values::non_negative, requires = "mtp")]
    pub max_mtp_drop: f64,
    /// With --mtp: also chain K drafts from every position.
    ///
    /// With --mtp: also chain K drafts from every position, as vLLM chains its MTP layer with
    /// num_speculative_tokens K, and report the mean accepted length per step (an estimate on the text; serve-test
    /// --speculative mtp=K measures it on the model's own continuation). K = 1 … 16; one MTP-layer step per
    /// position and depth.
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = parse_mtp_depth, requires = "mtp")]
    pub mtp_depth: usize,
    /// Where the runtime computes: auto, cpu, cuda or emulated.
    ///
    /// Where the runtime computes: auto (the GPU when one is usable, else the CPU), cpu, cuda, or emulated (the
    /// CUDA kernels run on the host under emulation: slow, for tests on machines without a GPU).
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
}

/// Default gates, measured (BENCHMARKS.md, "eval parity"): see the constants' notes.
pub const DEFAULT_MAX_MEAN_KLD: f64 = 0.05;
pub const DEFAULT_MIN_SAME_TOP: f64 = 90.0;
pub const DEFAULT_MAX_PPL_RATIO: f64 = 1.05;
/// Provisional: no trained MTP head has measured what INT4 costs in acceptance yet (issue 30, item 5); 5 points of
/// acceptance are ~5 % of the decode speed-up of one-draft speculative decoding.
pub const DEFAULT_MAX_MTP_DROP: f64 = 5.0;

fn parse_mtp_depth(text: &str) -> Result<usize, String> {
    use crate::arch::mtp_chain::MAX_DEPTH as MAX_SPECULATIVE_DEPTH;
    let depth: usize =
        text.parse().map_err(|_| format!("must be a whole number 1 … {MAX_SPECULATIVE_DEPTH}, got {text}"))?;
    if !(1..=MAX_SPECULATIVE_DEPTH).contains(&depth) {
        return Err(format!("must be 1 … {MAX_SPECULATIVE_DEPTH}, got {depth}"));
    }
    Ok(depth)
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    if let Some(task) = &args.task {
        let task_args = super::eval_task::TaskArgs {
            model: args.model.as_deref(),
            reference: args.reference.as_deref(),
            candidate: args.candidate.as_deref(),
            num_fewshot: args.num_fewshot,
            max_flips: args.max_flips,
            max_acc_drop: args.max_acc_drop,
            split: args.split,
            json: args.json,
            device: args.device,
            part: args.part,
            save_stats: args.save_stats.as_deref(),
        };
        return super::eval_task::run_tasks(task_args, task);
    }
    let input = match (&args.data, &args.tokens) {
        (Some(path), _) => EvalInput::Text { path: path.clone(), ctx: args.ctx, flag: "--data", ctx_flag: "--ctx" },
        (None, Some(path)) => EvalInput::Tokens { path: path.clone(), flag: "--tokens" },
        (None, None) => anyhow::bail!("give --data TEXT_FILE or --tokens SAFETENSORS_FILE"),
    };
    if let (Some(reference), Some(candidate)) = (&args.reference, &args.candidate) {
        return run_parity(&args, reference.clone(), candidate.clone(), input);
    }
    let Some(model) = args.model.clone() else { anyhow::bail!("give MODEL, or --reference REF --candidate CAND") };
    if !args.modes.is_empty() {
        anyhow::bail!("--modes needs --reference and --candidate");
    }
    if args.part.is_some() && args.save_logits.is_some() {
        anyhow::bail!("--save-logits writes the whole evaluation's logits; drop it or drop --part");
    }
    let options = EvalOptions {
        model: model.clone(),
        input,
        chunks: args.chunks,
        save_logits: args.save_logits.clone(),
        part: args.part,
        save_stats: args.save_stats.clone(),
        mtp: args.mtp,
        mtp_depth: args.mtp_depth,
        allow_long_context: args.allow_long_context,
    };
    let backend = super::output::open_backend(args.device)?;
    let report = evaluate(&options, backend.as_ref(), &Bar::new(false))
        .context_unless_named(&model.display().to_string(), || format!("evaluating {}", model.display()))?;
    if args.json {
        print_json(&report)?;
        return Ok(Outcome::Success);
    }
    print_eval(&report);
    Ok(Outcome::Success)
}

/// The human table of a one-model evaluation.
pub(super) fn print_eval(report: &crate::eval::EvalReport) {
    let mut table = Table::new(&["eval", ""]);
    table.row(vec!["model".into(), format!("{} ({})", report.model, report.architecture)]);
    table.row(vec!["backend".into(), report.backend.clone()]);
    table.row(vec!["chunks × ctx".into(), format!("{} × {}", report.chunks, report.ctx)]);
    table.row(vec!["tokens predicted".into(), report.tokens.to_string()]);
    table.row(vec!["perplexity".into(), format!("{:.4} ± {:.4}", report.ppl, report.ppl_stderr)]);
    table.row(vec!["mean NLL (nats)".into(), format!("{:.5} ± {:.5}", report.mean_nll, report.mean_nll_stderr)]);
    table.row(vec![
        "seconds".into(),
        format!(
            "{:.2} (load/dequant {:.2}, compute {:.2})",
            report.seconds, report.load_seconds, report.compute_seconds
        ),
    ]);
    table.row(vec!["tokens/s".into(), format!("{:.1}", report.tokens_per_second)]);
    if let Some(mtp) = &report.mtp {
        table.row(vec![
            format!("MTP layer {} drafts", mtp.layer),
            format!(
                "{:.2} ± {:.2} % accepted over {} positions (mean accepted length {:.3}), KLD from the main model \
                 {:.5} ± {:.5}, draft PPL {:.3} vs main {:.3} on token t+2",
                mtp.acceptance,
                mtp.acceptance_stderr,
                mtp.positions,
                mtp.mean_accepted_length,
                mtp.mean_kld,
                mtp.mean_kld_stderr,
                mtp.draft_ppl,
                mtp.main_ppl
            ),
        ]);
        if let Some(chain) = &mtp.chain {
            table.row(vec![format!("MTP chains of {}", chain.depth), chain_summary(chain)]);
        }
    }
    if let Some(uploads) = report.uploads {
        table.row(vec![
            "weight uploads".into(),
            format!(
                "{:.3} GB in {:.2} s ({:.1} GB/s; per layer {:.3} s of {:.3} s wall)",
                uploads.bytes as f64 / 1e9,
                uploads.seconds,
                uploads.bytes as f64 / 1e9 / uploads.seconds.max(1e-9),
                uploads.seconds / report.layers.max(1) as f64,
                report.seconds / report.layers.max(1) as f64
            ),
        ]);
    }
    if let Some(device) = &report.device {
        table.row(vec!["device copies".into(), device_copies(device, report.layers)]);
    }
    if report.near_ties > 0 {
        table.row(vec!["top-k near-ties".into(), report.near_ties.to_string()]);
    }
    if let Some(file) = &report.logits_file {
        table.row(vec!["logits".into(), file.clone()]);
    }
    println!("{}", table.render().trim_end());
    for warning in &report.warnings {
        println!("warning: {warning}");
    }
}

fn run_parity(args: &Args, reference: PathBuf, candidate: PathBuf, input: EvalInput) -> anyhow::Result<Outcome> {
    if args.save_logits.is_some() {
        anyhow::bail!("--save-logits applies to single-model eval; drop it or drop --reference/--candidate");
    }
    let options = ParityOptions {
        reference: reference.clone(),
        candidate: candidate.clone(),
        input,
        chunks: args.chunks,
        modes: args.modes.clone(),
        gates: Gates {
            max_mean_kld: args.max_mean_kld,
            min_same_top: args.min_same_top,
            max_ppl_ratio: args.max_ppl_ratio,
        },
        kv_scales: args.kv_scales,
        engine: args.engine,
        part: args.part,
        save_stats: args.save_stats.clone(),
        max_mtp_drop: args.mtp.then_some(args.max_mtp_drop),
        mtp_depth: args.mtp_depth,
        allow_long_context: args.allow_long_context,
    };
    let backend = super::output::open_backend(args.device)?;
    let report = evaluate_parity(&options, backend.as_ref(), &Bar::new(false))
        .with_context(|| format!("evaluating {} against {}", candidate.display(), reference.display()))?;
    if let Some(path) = &args.plot {
        crate::io::atomic::write_file(path, plot::render(&report).as_bytes())
            .with_context(|| format!("writing the plot {}", path.display()))?;
    }
    if args.json {
        print_json(&report)?;
    } else {
        print_parity(&report);
    }
    if let Some(part) = args.part {
        eprintln!(
            "part {part}: statistics of its {} chunk(s) saved; gates are applied by `squeeze merge-eval` over all parts",
            report.chunks
        );
        return Ok(Outcome::Success);
    }
    report_failures(&report);
    Ok(if report.failures.is_empty() { Outcome::Success } else { Outcome::GateFailed })
}

/// The failed gates on stderr.
pub(super) fn report_failures(report: &ParityReport) {
    for failure in &report.failures {
        eprintln!(
            "gate {} failed: mode {} has {} {:.6}, limit {}",
            failure.gate,
            failure.mode,
            match failure.gate.as_str() {
                "max-mean-kld" => "mean KLD",
                "min-same-top" => "same top-1 %",
                "max-mtp-drop" => "MTP acceptance drop (points)",
                _ => "PPL ratio",
            },
            failure.value,
            failure.limit
        );
    }
}

pub(super) fn print_parity(report: &ParityReport) {
    println!(
        "parity: {} (candidate) against {} (reference), {}: {} chunks × {} tokens, prompt {} (prefill), {} scored per chunk",
        report.candidate,
        report.reference,
        report.architecture,
        report.chunks,
        report.ctx,
        report.prompt,
        report.ctx - 1 - report.prompt
    );
    println!(
        "FP8 KV (kv, split modes): {} — {}",
        match report.kv_scales.applied {
            crate::engines::kv_scales::ScaleUse::Checkpoint => "the candidate's k_scale/v_scale",
            crate::engines::kv_scales::ScaleUse::Unit => "scale 1.0",
            crate::engines::kv_scales::ScaleUse::DynamicTiles => "dynamic per-128 tile scales",
            crate::engines::kv_scales::ScaleUse::PowerOfTwoTiles => "UE8M0 scales computed per row (fp8_ds_mla)",
        },
        report.kv_scales.reason
    );
    if !report.missing_kv_scales.is_empty() {
        println!(
            "FP8 KV scales missing in the candidate for {} of its layers: scale 1.0 used (as the engines do)",
            report.missing_kv_scales.len()
        );
    }
    let modes: Vec<&str> = report.mode_reports.iter().map(|(mode, _)| mode.name()).collect();
    let mut header = vec!["statistic"];
    header.extend(modes.iter().copied());
    let mut table = Table::new(&header);
    let percentile = |map: &serde_json::Map<String, serde_json::Value>, key: &str| {
        map.get(key).and_then(serde_json::Value::as_f64).unwrap_or(f64::NAN)
    };
    type Cell = Box<dyn Fn(&crate::eval::kld_stats::Summary) -> String>;
    let rows: Vec<(&str, Cell)> = vec![
        ("Mean PPL(Q)", Box::new(|s| format!("{:.4} ± {:.4}", s.ppl, s.ppl_stderr))),
        ("Mean PPL(base)", Box::new(|s| format!("{:.4} ± {:.4}", s.ppl_base, s.ppl_base_stderr))),
        ("Cor(ln PPL(Q), ln PPL(base))", Box::new(|s| format!("{:.2} %", 100.0 * s.cor_ln_ppl))),
        (
            "Mean ln(PPL(Q)/PPL(base))",
            Box::new(|s| format!("{:.6} ± {:.6}", s.mean_ln_ppl_ratio, s.mean_ln_ppl_ratio_stderr)),
        ),
        ("Mean PPL(Q)/PPL(base)", Box::new(|s| format!("{:.6} ± {:.6}", s.ppl_ratio, s.ppl_ratio_stderr))),
        ("Mean PPL(Q)-PPL(base)", Box::new(|s| format!("{:.6} ± {:.6}", s.ppl_diff, s.ppl_diff_stderr))),
        ("Mean KLD", Box::new(|s| format!("{:.6} ± {:.6}", s.mean_kld, s.mean_kld_stderr))),
    ];
    for (label, cell) in &rows {
        let mut row = vec![label.to_string()];
        row.extend(report.mode_reports.iter().map(|(_, m)| cell(&m.summary)));
        table.row(row);
    }
    for key in ["max", "99.9", "99", "95", "90", "median", "10", "5", "1", "0.1", "min"] {
        let mut row = vec![format!("KLD {key}")];
        row.extend(
            report.mode_reports.iter().map(|(_, m)| format!("{:.6}", percentile(&m.summary.kld_percentiles, key))),
        );
        table.row(row);
    }
    let rows: Vec<(&str, Cell)> = vec![
        ("Mean Δp", Box::new(|s| format!("{:.3} ± {:.3} %", s.mean_dp, s.mean_dp_stderr))),
        ("RMS Δp", Box::new(|s| format!("{:.3} ± {:.3} %", s.rms_dp, s.rms_dp_stderr))),
        ("Same top p", Box::new(|s| format!("{:.3} ± {:.3} %", s.same_top, s.same_top_stderr))),
    ];
    for key in ["max", "99.9", "99", "95", "90", "75", "median", "25", "10", "5", "1", "0.1", "min"] {
        let mut row = vec![format!("Δp {key}")];
        row.extend(
            report.mode_reports.iter().map(|(_, m)| format!("{:.3} %", percentile(&m.summary.dp_percentiles, key))),
        );
        table.row(row);
    }
    for (label, cell) in &rows {
        let mut row = vec![label.to_string()];
        row.extend(report.mode_reports.iter().map(|(_, m)| cell(&m.summary)));
        table.row(row);
    }
    println!("{}", table.render().trim_end());
    let mut header = vec!["layer".to_string()];
    for (mode, _) in &report.mode_reports {
        if *mode != Mode::Reference {
            header.push(format!("{} rel L2", mode.name()));
            header.push(format!("{} experts", mode.name()));
        }
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut layers = Table::new(&header);
    let count = report.mode_reports.first().map_or(0, |(_, m)| m.layers.len());
    for index in 0..count {
        let mut row = vec![index.to_string()];
        for (mode, m) in &report.mode_reports {
            if *mode == Mode::Reference {
                continue;
            }
            let layer = &m.layers[index];
            row.push(format!("{:.3e}", layer.hidden_rel_l2));
            row.push(layer.expert_agreement.map_or("-".into(), |a| format!("{:.1} %", 100.0 * a)));
        }
        layers.row(row);
    }
    println!("{}", layers.render().trim_end());
    if let Some(mtp) = &report.mtp {
        let mut table = Table::new(&[&format!("MTP layer {} drafts", mtp.reference.layer), "reference", "candidate"]);
        let (r, c) = (&mtp.reference, &mtp.candidate);
        table.row(vec!["positions".into(), r.positions.to_string(), c.positions.to_string()]);
        table.row(vec![
            "accepted (greedy, depth 1)".into(),
            format!("{:.2} ± {:.2} %", r.acceptance, r.acceptance_stderr),
            format!("{:.2} ± {:.2} %", c.acceptance, c.acceptance_stderr),
        ]);
        table.row(vec![
            "mean accepted length".into(),
            format!("{:.3}", r.mean_accepted_length),
            format!("{:.3}", c.mean_accepted_length),
        ]);
        table.row(vec![
            "KLD from own main model".into(),
            format!("{:.5} ± {:.5}", r.mean_kld, r.mean_kld_stderr),
            format!("{:.5} ± {:.5}", c.mean_kld, c.mean_kld_stderr),
        ]);
        table.row(vec!["draft PPL on t+2".into(), format!("{:.3}", r.draft_ppl), format!("{:.3}", c.draft_ppl)]);
        if let (Some(r), Some(c)) = (&r.chain, &c.chain) {
            table.row(vec![format!("chains of {}", r.depth), chain_summary(r), chain_summary(c)]);
        }
        println!("{}", table.render().trim_end());
        println!("MTP acceptance drop {:.2} points (gate ≤ {})", mtp.drop, mtp.max_drop);
    }
    for warning in &report.warnings {
        println!("warning: {warning}");
    }
    let gates = &report.gates;
    println!(
        "gates (every mode but reference): mean KLD ≤ {}, same top ≥ {} %, PPL ratio ≤ {} — {}",
        gates.max_mean_kld,
        gates.min_same_top,
        gates.max_ppl_ratio,
        if report.failures.is_empty() { "pass".to_string() } else { format!("{} failed", report.failures.len()) }
    );
}

/// A device backend's copies in words: activations per layer, decisions, weights, launches.
fn device_copies(device: &DeviceCounters, layers: usize) -> String {
    let transfers = &device.transfers;
    let mb = |bytes: u64| bytes as f64 / 1e6;
    let activations = &transfers.activations;
    format!(
        "activations {} in ({:.1} MB) / {} out ({:.1} MB), {:.1} per layer; decisions {}; weights {} ({:.1} MB); {} launches; \
         {:.1} ms copying activations and decisions",
        activations.h2d_count,
        mb(activations.h2d_bytes),
        activations.d2h_count,
        mb(activations.d2h_bytes),
        activations.count() as f64 / layers.max(1) as f64,
        transfers.decisions.count(),
        transfers.weights.h2d_count,
        mb(transfers.weights.h2d_bytes),
        device.launches,
        device.copy_seconds * 1e3
    )
}

/// A chain report in one cell: the mean accepted length and the share accepted through each depth.
fn chain_summary(chain: &crate::eval::mtp::ChainReport) -> String {
    let through: Vec<String> = chain.accepted_through.iter().map(|share| format!("{share:.1}")).collect();
    format!(
        "mean accepted length {:.3} ± {:.3} over {} starts; accepted through depth 1…{}: {} %",
        chain.mean_accepted_length,
        chain.mean_accepted_length_stderr,
        chain.starts,
        chain.depth,
        through.join(" / ")
    )
}

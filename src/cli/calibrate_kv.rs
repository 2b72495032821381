//! `squeeze calibrate-kv` arguments and output.

use std::path::PathBuf;

use anyhow::Context;

use crate::runtime::device::DeviceChoice;

use crate::calib::{calibrate, open_for_edit, write_scales, CalibOptions, CalibReport, Strategy};
use crate::chunks::EvalInput;
use crate::engines::kv_scales::ScaleUse;
use crate::engines::EngineChoice;

use super::output::{print_json, ContextUnlessNamed, Outcome};
use super::progress::Bar;
use super::table::Table;

#[derive(clap::Args)]
pub struct Args {
    /// Model to calibrate: folder or Hugging Face repo id; the scales are written into it.
    ///
    /// Model to calibrate (its weights produce the observed KV values; the scales are written into it): folder or
    /// Hugging Face repo id (ORG/NAME[@REV]) in the local cache.
    #[arg(value_parser = super::values::model_dir)]
    pub model: PathBuf,
    /// UTF-8 calibration text, cut into --seq-len chunks.
    ///
    /// UTF-8 calibration text, tokenized with the model's tokenizer and cut into --seq-len chunks.
    #[arg(long, conflicts_with = "tokens", required_unless_present = "tokens")]
    pub data: Option<PathBuf>,
    /// safetensors file with `input_ids` [n, seq], used as given.
    ///
    /// safetensors file with an integer tensor `input_ids` [n, seq] (I32 or I64), used as given.
    #[arg(long)]
    pub tokens: Option<PathBuf>,
    /// Calibration sequences (chunks) to run.
    #[arg(long, default_value_t = 128, value_parser = super::values::count)]
    pub samples: usize,
    /// Tokens per sequence for --data (at least 2, as eval's --ctx).
    #[arg(long, default_value_t = 512, value_parser = super::values::at_least(2))]
    pub seq_len: usize,
    /// Map this percentile of |x| (not the amax) to 448.
    ///
    /// Map this percentile of |x| (not the amax) to 448, clipping the rarer outliers; the clip rate is reported.
    #[arg(long, value_parser = super::values::positive)]
    pub percentile: Option<f64>,
    /// One scale per layer (tensor) or per KV head (head).
    ///
    /// One scale per layer (tensor) or per KV head (head; GQA only — MLA has one latent row).
    #[arg(long, value_enum, default_value = "tensor")]
    pub strategy: Strategy,
    /// Engines to write scale names for: vllm, sglang, all or none.
    ///
    /// The engines to write for (vllm, sglang, all or none): each engine's loadable tensor names are written
    /// besides self_attn.k_scale/v_scale, and the report says what each engine does with the scales of this cache
    /// layout (MLA: ignored).
    #[arg(long, default_value = "all")]
    pub engine: EngineChoice,
    /// Write the scales into this folder instead of the model folder.
    ///
    /// Write config.json, the index and kv-scales.safetensors into this folder instead of the model folder.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write SGLang's --quantization-param-path JSON here.
    #[arg(long)]
    pub sglang_json: Option<PathBuf>,
    /// Compute and report only; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Run sequences longer than the context window, with a warning.
    ///
    /// Run sequences longer than the model's context window (max_position_embeddings, or YaRN's
    /// original_max_position_embeddings × factor where that is smaller), with a warning in the report, instead of
    /// refusing.
    #[arg(long)]
    pub allow_long_context: bool,
    /// Where the runtime computes: auto, cpu, cuda or emulated.
    ///
    /// Where the runtime computes: auto (the GPU when one is usable, else the CPU), cpu, cuda, or emulated (the
    /// CUDA kernels run on the host under emulation: slow, for tests on machines without a GPU).
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
    /// Observe only part I of N of the sequences; write the statistics, not the scales.
    ///
    /// Observe only part I of N of the calibration sequences (a contiguous run, the parts as even as whole
    /// sequences allow), e.g. $SLURM_ARRAY_TASK_ID/8, and write nothing into the model: the part's statistics go to
    /// --save-stats, and `squeeze merge-calib MODEL FILE…` writes the scales one run writes.
    #[arg(long, value_name = "I/N", requires = "save_stats", allow_hyphen_values = true)]
    pub part: Option<crate::part::Part>,
    /// Write the raw observations for `squeeze merge-calib`.
    ///
    /// Write the raw observations (per layer and head: amax, count and |x| histogram of K and V), a small
    /// safetensors file, for `squeeze merge-calib`.
    #[arg(long, value_name = "FILE")]
    pub save_stats: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let input = match (&args.data, &args.tokens) {
        (Some(path), _) => {
            EvalInput::Text { path: path.clone(), ctx: args.seq_len, flag: "--data", ctx_flag: "--seq-len" }
        }
        (None, Some(path)) => EvalInput::Tokens { path: path.clone(), flag: "--tokens" },
        (None, None) => anyhow::bail!("give --data TEXT_FILE or --tokens SAFETENSORS_FILE"),
    };
    let options = CalibOptions {
        model: args.model.clone(),
        input,
        samples: args.samples,
        percentile: args.percentile,
        strategy: args.strategy,
        engines: args.engine.engines(),
        part: args.part,
        save_stats: args.save_stats.clone(),
        allow_long_context: args.allow_long_context,
    };
    if per_row_report(&args)? {
        return Ok(Outcome::Success);
    }
    if args.part.is_some() && (args.out.is_some() || args.sglang_json.is_some()) {
        anyhow::bail!("a --part writes only its --save-stats file; give --out/--sglang-json to `squeeze merge-calib`");
    }
    let writes = !args.dry_run && args.part.is_none();
    if writes && args.out.is_none() && crate::io::hub::in_snapshot(&args.model) {
        anyhow::bail!(
            "{} is a snapshot in the Hugging Face cache: its files are links into blobs other snapshots share, so \
             calibrate-kv does not write into it; pass --out DIR to write config.json, the index and the scales \
             into a folder of your own (or --dry-run to see the scales only)",
            args.model.display()
        );
    }
    let target = args.out.clone().unwrap_or_else(|| args.model.clone());
    let _lock = if !writes {
        None
    } else {
        crate::io::interrupt::set_hint(format!("the folder {} is unchanged", target.display()));
        Some(open_for_edit(&target).with_context(|| format!("opening {} for the scales", target.display()))?)
    };
    let bar = Bar::new(false);
    let mut report = calibrate(&options, super::output::open_backend(args.device)?.as_ref(), &bar)
        .context_unless_named(&args.model.display().to_string(), || {
            format!("calibrating KV scales of {}", args.model.display())
        })?;
    if writes {
        let written = write_scales(&report, &args.model, args.out.as_deref(), args.sglang_json.as_deref())
            .with_context(|| format!("writing KV scales for {}", args.model.display()))?;
        report.written = written.files.iter().map(|p| p.display().to_string()).collect();
    }
    if args.json {
        print_json(&report)?;
        return Ok(Outcome::Success);
    }
    print_report(&report);
    if let Some(part) = args.part {
        eprintln!("part {part}: observations saved; `squeeze merge-calib MODEL FILE…` writes the scales of all parts");
    }
    Ok(Outcome::Success)
}

/// A model whose FP8 caches take per-row scales (DeepSeek-V4): what the engines store per layer type, printed, and
/// nothing calibrated or written. `false` for the others.
fn per_row_report(args: &Args) -> anyhow::Result<bool> {
    // A folder that does not open (an interrupted edit to complete, a bad config) is the calibration path's to
    // handle and report.
    let Ok((_, config)) = crate::load::open::open_checkpoint(&args.model) else { return Ok(false) };
    let Some(report) = crate::calib::per_row::per_row_scales(&args.model, &config, &args.engine.engines()) else {
        return Ok(false);
    };
    if args.part.is_some() || args.save_stats.is_some() {
        anyhow::bail!(
            "{}: {} takes no KV scales, so there are no observations to save; drop --part/--save-stats",
            args.model.display(),
            report.architecture
        );
    }
    if args.json {
        print_json(&report)?;
        return Ok(true);
    }
    println!(
        "{} ({}): nothing to calibrate — its FP8 KV caches take no stored scales",
        report.model, report.architecture
    );
    for cache in &report.layer_types {
        println!("  {:<8} {:>3} layer(s): {}", cache.kind, cache.layers, cache.stores);
    }
    for engine in &report.engines {
        println!("  {}: {}", engine.engine.label(), engine.summary);
    }
    println!(
        "nothing written. What FP8 storage costs: `squeeze eval --reference {} --candidate OUT --modes kv` (the \
         engines' default for this model)",
        report.model
    );
    Ok(true)
}

/// The human report of a calibration (one run's or merged parts').
pub(super) fn print_report(report: &CalibReport) {
    println!(
        "{} ({}, {} cache, {} scales, {}): {} sequences × {} tokens",
        report.model,
        report.architecture,
        report.cache,
        format!("{:?}", report.strategy).to_lowercase(),
        report.rule,
        report.samples,
        report.seq_len
    );
    for engine in &report.engines {
        let verdict = match engine.uses {
            ScaleUse::Checkpoint => "uses these scales",
            ScaleUse::Unit => "ignores these scales (caches with 1.0)",
            ScaleUse::DynamicTiles => "ignores these scales (dynamic per-128 tile scales)",
            ScaleUse::PowerOfTwoTiles => "ignores these scales (UE8M0 scales computed per row)",
        };
        println!("{}: {verdict} — {} [{}]", engine.engine.label(), engine.summary, engine.source);
    }
    let names: Vec<String> = report.tensor_names.iter().map(|(k, v)| format!("{k}/{v}")).collect();
    println!("tensor names per layer: {}", names.join(", "));
    if !report.state_layers.is_empty() {
        println!(
            "layers {:?}: KDA linear attention, no KV cache and no scale: a fixed-size state per request, which vLLM \
             keeps in BF16 (convolution inputs) and F32 (recurrent state) [vllm/model_executor/layers/mamba/\
             mamba_utils.py kda_state_dtype]",
            report.state_layers
        );
    }
    let mut table = Table::new(&[
        "layer",
        "K amax",
        "k_scale",
        "K sat %",
        "K sub %",
        "V amax",
        "v_scale",
        "V sat %",
        "V sub %",
        "@1.0 sat %",
        "@1.0 sub %",
        "tokens",
    ]);
    let show = |values: &[f32]| {
        if values.len() == 1 {
            format!("{:.6}", values[0])
        } else {
            format!(
                "{:.6}…{:.6}",
                values.iter().copied().fold(f32::MAX, f32::min),
                values.iter().copied().fold(0.0, f32::max)
            )
        }
    };
    let percent = |share: f64| format!("{:.4}", share * 100.0);
    for layer in &report.layers {
        table.row(vec![
            layer.layer.to_string(),
            format!("{:.4}", layer.k_amax),
            show(&layer.k_scale),
            percent(layer.k_saturated),
            percent(layer.k_subnormal),
            format!("{:.4}", layer.v_amax),
            show(&layer.v_scale),
            percent(layer.v_saturated),
            percent(layer.v_subnormal),
            format!("{}/{}", percent(layer.k_saturated_at_one), percent(layer.v_saturated_at_one)),
            format!("{}/{}", percent(layer.k_subnormal_at_one), percent(layer.v_subnormal_at_one)),
            layer.tokens.to_string(),
        ]);
    }
    println!("{}", table.render().trim_end());
    println!(
        "sat: share saturating at ±448; sub: share in the e4m3 subnormal range (|x / scale| < 2^-6); @1.0: the same \
         for K/V at scale 1.0, what a cache that ignores the scales stores"
    );
    for file in &report.written {
        println!("wrote {file}");
    }
    for warning in &report.warnings {
        println!("warning: {warning}");
    }
}

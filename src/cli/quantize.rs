//! `squeeze quantize` arguments and output.

use std::path::PathBuf;

use crate::chunks::EvalInput;
use crate::convert::calibrated::{DEFAULT_MIN_EXPERT_TOKENS, DEFAULT_SAMPLES, DEFAULT_SEQ_LEN};
use crate::convert::parts::Part;
use crate::convert::{quantize, QuantizeOptions, QuantizeReport};
use crate::engines::EngineChoice;
use crate::plan::calibration::{Calibration, CalibrationOptions, Method};
use crate::quant::ScaleRule;
use crate::runtime::device::DeviceChoice;
use crate::units::{both_units, human, parse_bytes};

use super::engine_rules::{parse_tp, print_fixes, print_rules, print_warnings};
use super::output::{print_json, ContextUnlessNamed, Outcome};
use super::progress::Bar;
use super::table::Table;

#[derive(clap::Args)]
pub struct Args {
    /// Source model (FP8, compressed-tensors FP8 or BF16): folder or Hugging Face repo id.
    ///
    /// Source model (FP8 block-scaled, compressed-tensors FP8, or BF16): folder or Hugging Face repo id
    /// (ORG/NAME[@REV]) in the local cache.
    #[arg(value_parser = super::values::model_dir)]
    pub input: PathBuf,
    /// Output folder (must be new or empty unless --resume/--force).
    pub output: PathBuf,
    /// Built-in recipe or TOML file; default: the -int4 one of the architecture.
    ///
    /// Built-in recipe (kimi-k2-int4, glm5-int4, glm45-int4; the same with -nvfp4 for Blackwell FP4, -mxfp4 for
    /// AMD/OCP MX, -w4a8 for Hopper prefill; kimi-k26-nvfp4|mxfp4|w4a8 requantize Kimi K2.5/K2.6's shipped INT4;
    /// glm52-* are glm5-*) or a TOML file; default: the -int4 one chosen from config.json.
    #[arg(long)]
    pub recipe: Option<String>,
    /// Override the INT4 group size of every rule (must divide the rows it applies to).
    #[arg(long, value_parser = super::values::count)]
    pub group_size: Option<usize>,
    /// Override the scale rule of every rule: ct-minmax, absmax7 or mse.
    #[arg(long)]
    pub scale_rule: Option<ScaleRule>,
    /// Largest output shard (64MB, 5GB, 2GiB or plain bytes).
    #[arg(long, default_value = "5GB", value_parser = parse_bytes)]
    pub max_shard_size: u64,
    /// Continue an interrupted run, keeping the shards that verify.
    ///
    /// Continue an interrupted run: shards whose manifest entry verifies are kept, the rest redone.
    #[arg(long)]
    pub resume: bool,
    /// Write into a non-empty output folder, replacing what is there.
    #[arg(long)]
    pub force: bool,
    /// Print the plan, output size and engine rule results; write nothing.
    ///
    /// Print the plan, the predicted output size and the engine rule results without writing anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Carry NaN or infinite source weights into the output.
    ///
    /// Carry NaN or infinite source weights into the output (default: refuse, naming the tensor and element).
    #[arg(long)]
    pub allow_nonfinite: bool,
    /// Cast MXFP4 groups NVFP4 cannot hold exactly by re-encoding them (lossy) instead of refusing.
    ///
    /// MXFP4 → NVFP4 keeps every E2M1 code of a group whose E8M0 exponent lies within 17 of the weight's largest
    /// (the range of E4M3's powers of two); a group further down cannot be scaled exactly. Default: refuse, naming
    /// the tensor and its first such group. With this flag such a group gets E4M3's smallest scale and each value
    /// the nearest E2M1 code at that step; every other group stays bit-exact.
    #[arg(long)]
    pub allow_inexact_cast: bool,
    /// Print one JSON report on stdout.
    #[arg(long)]
    pub json: bool,
    /// Where INT4 quantization runs: auto, cpu, cuda or emulated.
    ///
    /// Where INT4 quantization runs: auto (the GPU when one is usable, else the CPU with a notice), cpu, cuda, or
    /// emulated (the GPU kernels compiled for the host; slow, byte-identical: tests and development).
    #[arg(long, default_value = "auto")]
    pub device: DeviceChoice,
    /// Engines whose load rules the plan must pass: vllm, sglang, all or none.
    ///
    /// Engines whose load rules (read from vLLM 0.32 and SGLang sources) the planned output must pass before anything is written: vllm,
    /// sglang, all (both) or none (skip, for layouts outside the rules such as unselected = "fp8-block").
    /// A failed rule refuses with exit 2; with --dry-run the rules are printed and a failure exits 1.
    #[arg(long, default_value = "all")]
    pub engine: EngineChoice,
    /// Tensor-parallel size the rules check against.
    ///
    /// Tensor-parallel size the rules check against (moe_intermediate_size / tp must be a multiple of the group
    /// size). Default: 8 when the model's hidden_size and moe_intermediate_size are those of a built-in preset
    /// (a real-size Kimi K2, GLM-5 or GLM-4.5), 1 otherwise (tiny and synthetic models).
    #[arg(long, value_parser = parse_tp)]
    pub tp: Option<usize>,
    /// How INT4 scales are chosen.
    ///
    /// rtn: round to nearest with the recipe's --scale-rule, from the weights alone. imatrix: routed experts' scales
    /// minimise the importance-weighted error Σ_j imp_j·(w_j − ŵ_j)² over the mse grid, imp_j = mean x_j² of the
    /// expert's calibration inputs (its tokens' hidden states for gate_proj/up_proj, its act(gate)·up for down_proj),
    /// from one pass of the FP8 source model over --calibration through the reference runtime (--device); never
    /// sequential (importance vectors need one pass over the unquantized model). Memory: MoE layers × experts ×
    /// (hidden + moe_intermediate) × 4 B of importance. gptq: each routed expert is quantized by GPTQ against the Hessian H =
    /// XᵀX of its calibration inputs (gate_proj and up_proj share that of its tokens' hidden states, down_proj gets
    /// that of its act(gate)·up), damping 1 % of the mean diagonal, error feedback in blocks of 128 columns, each
    /// group's scale chosen by the recipe's --scale-rule from the updated weights, no act-order (output: plain
    /// pack-quantized, actorder null, observer of the scale rule). Experts are streamed in batches, so memory stays at
    /// the pass's working set plus one batch: 2 × tokens × hidden × 4 B (the layer's MoE input; with --sequential its
    /// input copy) + experts_per_batch × ((hidden² + moe_intermediate²) × 8 B + 6 × max(hidden, moe_intermediate)² × 8
    /// B + 3 × hidden × moe_intermediate × 13 B), batches of at most 4 GiB (GLM-5: one expert, ≈ 2.6 GB); the output
    /// folder holds the quantized experts once more until the run completes. Other INT4 tensors keep the recipe's rule
    /// in every method.
    #[arg(long, value_enum, default_value = "rtn")]
    pub method: Method,
    /// Calibration input: UTF-8 text or a safetensors file of `input_ids`.
    ///
    /// imatrix, gptq, and recipes with nvfp4-w4a4 rules (their activation scales): calibration input, a UTF-8 text
    /// file (cut into --seq-len token chunks) or a safetensors file with `input_ids` [n, ctx] (I32/I64, used as
    /// given); keep it disjoint from your evaluation text.
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// imatrix, gptq: calibration chunks used at most.
    #[arg(long, default_value_t = DEFAULT_SAMPLES, value_parser = super::values::count)]
    pub samples: usize,
    /// imatrix, gptq: tokens per chunk of a text --calibration.
    #[arg(long, default_value_t = DEFAULT_SEQ_LEN, value_parser = super::values::at_least(2))]
    pub seq_len: usize,
    /// imatrix, gptq: fewer calibration tokens than this fall back to mse.
    ///
    /// imatrix, gptq: an expert shown fewer calibration tokens than this is quantized with the mse rule and listed.
    #[arg(long, default_value_t = DEFAULT_MIN_EXPERT_TOKENS, value_parser = super::values::whole::<u64>)]
    pub min_expert_tokens: u64,
    /// imatrix, gptq: show every calibration token to every expert (statistics only).
    ///
    /// imatrix, gptq, statistics only: show every calibration token to every expert of its layer (the forward
    /// still routes as the router says; coverage still counts routed tokens), so no expert falls back.
    #[arg(long)]
    pub force_route_all: bool,
    /// imatrix, gptq: run chunks longer than the context window, with a warning.
    ///
    /// imatrix, gptq: run calibration chunks longer than the model's context window (max_position_embeddings, or
    /// YaRN's original_max_position_embeddings × factor where that is smaller), with a warning, instead of refusing.
    #[arg(long)]
    pub allow_long_context: bool,
    /// imatrix, gptq on a device: activations rounded to BF16 once in the calibration pass's GEMMs.
    ///
    /// imatrix, gptq on a device (--device cuda or emulated): the calibration pass's GEMMs take activations
    /// rounded to BF16 once, as the engines and llm-compressor's BF16 forward compute, instead of split in two
    /// BF16 halves (16 significant bits, the CPU's results within tolerance): one GEMM instead of two. The
    /// statistics change by the rounding: on the three trained tiny models 0.7–1.6 % of GPTQ's codes differ from
    /// the CPU pass's and the mean KLD moved by +15 %, −0.3 %, −1.3 % (each about one standard error;
    /// BENCHMARKS.md). No effect on the CPU.
    #[arg(long)]
    pub bf16_activations: bool,
    /// gptq: calibrate each layer on the quantized layers below it (the default).
    ///
    /// gptq (the default): layer L + 1 is calibrated on the output of layer L run with its already-quantized
    /// experts (as llm-compressor and GPTQModel do), at the cost of a second forward of every MoE layer and one
    /// more copy of the hidden states. Chosen by measurement on the trained tiny model (BENCHMARKS.md, paired over
    /// 8 held-out blocks): with coarse groups (96), whose errors reach the next layer as larger shifts, sequential
    /// has 0.962 ± 0.005× the KLD of --no-sequential; at the recipe's group 32 it has 1.010 ± 0.003× (both 0.22×
    /// ct-minmax's). A 60-layer model accumulates far more error below its upper layers than this 3-layer one,
    /// which is where sequential calibration pays.
    #[arg(long, overrides_with = "no_sequential")]
    pub sequential: bool,
    /// gptq: calibrate every layer on the FP8 model's activations.
    ///
    /// gptq: every layer is calibrated on the FP8 model's activations (one forward per layer, the layers'
    /// statistics independent of each other's quantization).
    #[arg(long, overrides_with = "sequential")]
    pub no_sequential: bool,
    /// Write only part I of N of the output shards, for `squeeze merge`.
    ///
    /// Write only part I of N (1 ≤ I ≤ N; e.g. 2/8 or $SLURM_ARRAY_TASK_ID/8): every part computes the same plan
    /// and writes its own contiguous run of the output shards plus `squeeze-part-0000I-of-0000N.json`, into OUTPUT
    /// (shared by all parts, or one folder each); `squeeze merge` then checks the parts and writes the index,
    /// config and manifest. Parts run anywhere (on other machines, in any order) with the same source, recipe and
    /// flags; --resume and --force act on this part's files only. Round to nearest only (--method rtn).
    #[arg(long, value_name = "I/N", allow_hyphen_values = true)]
    pub part: Option<Part>,
    /// Hugging Face repo id of the source, for the model card's `base_model`.
    ///
    /// The Hugging Face repo id of the source (ORG/NAME), for the model card's `base_model` (README.md; the
    /// source's own README is kept as README.source.md). Default: config.json's `_name_or_path` when it is a repo
    /// id, else ORG/NAME of a source in the Hugging Face cache, else none (a local folder: the card names the folder
    /// in its text, not as `base_model`, which the Hub reads as a repo id).
    /// `squeeze card OUT --base-model ORG/NAME` changes it later.
    #[arg(long, value_name = "ORG/NAME", value_parser = super::card::repo_id)]
    pub base_model: Option<String>,
}

fn method_name(method: Method) -> &'static str {
    match method {
        Method::Rtn => "rtn",
        Method::Imatrix => "imatrix",
        Method::Gptq => "gptq",
    }
}

/// The calibration input: a safetensors token file by extension, else text.
fn calibration_input(path: &std::path::Path, seq_len: usize) -> EvalInput {
    if path.extension().is_some_and(|extension| extension == "safetensors") {
        EvalInput::Tokens { path: path.to_path_buf(), flag: "--calibration" }
    } else {
        EvalInput::Text { path: path.to_path_buf(), ctx: seq_len, flag: "--calibration", ctx_flag: "--seq-len" }
    }
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let calibrated = matches!(args.method, Method::Imatrix | Method::Gptq);
    if (args.sequential || args.no_sequential) && args.method != Method::Gptq {
        let flag = if args.sequential { "--sequential" } else { "--no-sequential" };
        anyhow::bail!("{flag} needs --method gptq (only GPTQ's calibration depends on the layers below)");
    }
    // With rtn, a calibration file calibrates W4A4 activation scales (the recipe must have such rules: checked
    // once the plan is known).
    let calibration = match (&args.calibration, calibrated) {
        (Some(path), _) => Some(CalibrationOptions {
            input: calibration_input(path, args.seq_len),
            samples: args.samples,
            min_expert_tokens: args.min_expert_tokens,
            route_all: args.force_route_all,
            device: args.device,
            method: args.method,
            sequential: !args.no_sequential,
            allow_long_context: args.allow_long_context,
            bf16_activations: args.bf16_activations,
        }),
        (None, true) => anyhow::bail!("--method {} needs --calibration FILE", method_name(args.method)),
        (None, false) if args.force_route_all => anyhow::bail!(
            "--force-route-all needs --calibration FILE (with --method imatrix or gptq, or a recipe with nvfp4-w4a4 \
             rules)"
        ),
        (None, false) => None,
    };
    if let (Some(part), Some(calibration)) = (args.part, &calibration) {
        anyhow::bail!(
            "--part {part} splits round-to-nearest conversions without calibration only (--method rtn, no \
             --calibration): --calibration{} needs one calibration pass over the whole model; run it in one process",
            if calibrated { format!(" with --method {}", method_name(calibration.method)) } else { String::new() }
        );
    }
    let options = QuantizeOptions {
        base_model: args.base_model.clone(),
        part: args.part,
        calibration,
        allow_nonfinite: args.allow_nonfinite,
        allow_inexact_cast: args.allow_inexact_cast,
        input: args.input.clone(),
        output: args.output.clone(),
        recipe: args.recipe.clone(),
        group_size: args.group_size,
        scale_rule: args.scale_rule,
        max_shard_bytes: args.max_shard_size,
        resume: args.resume,
        force: args.force,
        dry_run: args.dry_run,
        device: args.device,
        engine: args.engine,
        tp: args.tp,
    };
    let input = args.input.display().to_string();
    let report = quantize(&options, &Bar::new(true)).context_unless_named(&input, || format!("quantize {input}"))?;
    print_fixes(&report.config_fixes, report.dry_run);
    if let Some(rules) = &report.engine_rules {
        print_warnings(rules);
    }
    if args.json {
        print_json(&report)?;
    } else {
        print_human(&report);
    }
    // Only a dry run gets here with a failed rule (a real run refuses before writing).
    let failed = report.engine_rules.as_ref().is_some_and(|rules| !rules.passed);
    Ok(if failed { Outcome::GateFailed } else { Outcome::Success })
}

pub fn print_human(report: &QuantizeReport) {
    let mut table = Table::new(&["class", "tensors", "schemes", "before", "after"]);
    for (class, summary) in &report.classes {
        let schemes = summary.schemes.iter().map(|(s, n)| format!("{s}×{n}")).collect::<Vec<_>>().join(" ");
        table.row(vec![
            class.clone(),
            summary.tensors.to_string(),
            schemes,
            human(summary.bytes_in),
            human(summary.bytes_out),
        ]);
    }
    println!("{}", table.render());
    let verb = if report.dry_run { "would write" } else { "wrote" };
    if let Some(part) = &report.part {
        println!(
            "part {}: {verb} {} in {} of the plan's {} shard(s) ({} … {}) and {}; merge the parts with `squeeze merge`",
            part.part,
            both_units(part.output_bytes),
            part.shards.len(),
            report.shards,
            part.shards.first().map_or("", String::as_str),
            part.shards.last().map_or("", String::as_str),
            part.manifest
        );
    }
    println!(
        "\n{} with recipe {}: {} in, {verb} {} in {} shard(s){}",
        report.architecture.as_deref().unwrap_or("model"),
        report.recipe,
        both_units(report.input_bytes),
        both_units(report.output_bytes),
        report.shards,
        if report.shards_reused > 0 {
            format!(" ({} reused from the interrupted run)", report.shards_reused)
        } else {
            String::new()
        }
    );
    if report.dry_run {
        if let Some(rules) = &report.engine_rules {
            println!();
            print_rules(rules);
        }
    } else {
        println!(
            "{} quantized, {} converted, {} copied in {:.1} s ({:.0} MB/s input), peak RSS {}",
            report.tensors_quantized,
            report.tensors_converted,
            report.tensors_copied,
            report.seconds,
            report.input_bytes as f64 / 1e6 / report.seconds.max(1e-9),
            report.peak_rss_bytes.map(human).unwrap_or_else(|| "unknown".into())
        );
        if let Some(coverage) = &report.expert_coverage {
            println!("{}", Calibration::summary(coverage));
        }
        if let Some(reused) = report.calibration_layers_reused.filter(|reused| *reused > 0) {
            println!("{reused} MoE layer(s) of GPTQ-quantized experts reused from the interrupted run");
        }
        if report.gptq_algebra == Some("device") {
            println!("GPTQ's algebra (Hessians, factors, column loops) ran on the device");
        }
    }
}

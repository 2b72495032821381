//! `squeeze report` arguments and output.

use crate::quant::ScaleRule;
use crate::report::{
    compare_formats, parse_gpu_memory, report, ConversionEstimate, FormatComparison, GpuMemory, Layout, Machine,
    NodeBudget, QuantizeOn, Report, ReportOptions,
};
use crate::units::{both_units, human, parse_bytes};

use super::output::{print_json, ContextUnlessNamed, Outcome};
use super::table::Table;

#[derive(clap::Args)]
pub struct Args {
    /// Model folder, config.json, preset (kimi-k2, glm-5.2, glm-5.3-flash, …) or Hugging Face repo id.
    ///
    /// Model folder (with or without weights), a config.json file, a preset (kimi-k2, kimi-k2.6, glm-5, glm-5.2,
    /// glm-4.5, glm-5.3, glm-5.3-flash, kimi-k3, deepseek-v4-flash, deepseek-v4-pro), or a Hugging Face repo id
    /// (ORG/NAME[@REV]) in the local cache; in that order.
    #[arg(value_parser = super::values::report_model)]
    pub model: String,
    /// Built-in recipe name or TOML file; default: chosen from the config.
    ///
    /// Built-in recipe name (e.g. glm5-int4, glm5-nvfp4, kimi-k26-w4a8; `squeeze quantize --help` lists them) or a
    /// TOML file; default: chosen from the config.
    #[arg(long)]
    pub recipe: Option<String>,
    /// Compare the formats side by side: one row per format recipe.
    ///
    /// The formats side by side: one row per format recipe of the architecture (int4, nvfp4, nvfp4-w4a4, mxfp4,
    /// w4a8: routed experts), each with its output size and the decode node's budget on this layout.
    #[arg(long, conflicts_with = "recipe")]
    pub formats: bool,
    /// Override the INT4 group size of every rule, as quantize does.
    #[arg(long, value_parser = super::values::count)]
    pub group_size: Option<usize>,
    /// Largest output shard, as quantize's (shard headers count in the output bytes).
    #[arg(long, default_value = "5GB", value_parser = parse_bytes)]
    pub max_shard_size: u64,
    /// GPUs per node (one serving deployment; may span machines).
    #[arg(long, default_value_t = 8, value_parser = super::values::count)]
    pub gpus: usize,
    /// Memory of one GPU: h100-80g, h200-141g, b200-180g or a size.
    ///
    /// Memory of one GPU: h100-80g, h200-141g, b200-180g (nvidia-smi totals) or a size such as 141GiB.
    #[arg(long, default_value = "h200-141g", value_parser = parse_gpu_memory)]
    pub gpu_memory: GpuMemory,
    /// Tensor-parallel size; default: --gpus. gpus/tp replicas serve side by side.
    #[arg(long, value_parser = super::values::count)]
    pub tp: Option<usize>,
    /// Data-parallel attention (dp = tp): each rank keeps the KV of its own requests only.
    #[arg(long)]
    pub dp_attention: bool,
    /// Share of GPU memory for weights, reserve and KV pool.
    ///
    /// Share of GPU memory for weights, reserve and KV pool (SGLang --mem-fraction-static).
    #[arg(long, default_value_t = 0.9, value_parser = super::values::finite)]
    pub mem_fraction: f64,
    /// Per-GPU bytes held back inside that share.
    ///
    /// Per-GPU bytes held back inside that share: CUDA context, NCCL and all-to-all buffers.
    #[arg(long, default_value = "4GiB", value_parser = parse_reserve)]
    pub reserve: u64,
    /// Tokens per request (prompt + output) for the concurrency figure.
    #[arg(long, default_value_t = 8192, value_parser = super::values::whole::<u64>)]
    pub context: u64,
    /// Use this KV pool per GPU instead of computing it.
    ///
    /// Use this KV pool per GPU (e.g. what the engine logged) instead of computing it; skips the fit check.
    #[arg(long, value_parser = parse_bytes)]
    pub kv_pool: Option<u64>,
    /// Conversion estimate: the scale rule of every rule.
    ///
    /// Conversion estimate: the scale rule of every rule, as quantize's --scale-rule (mse costs ≈ 4.5× the CPU
    /// time of ct-minmax per GB; BENCHMARKS.md).
    #[arg(long)]
    pub scale_rule: Option<ScaleRule>,
    /// Conversion estimate: source read speed of one part, e.g. 2GB.
    ///
    /// Conversion estimate: bytes per second one part reads the source at (its disk, or its share of shared
    /// storage), e.g. 2GB for one NVMe drive.
    #[arg(long, default_value = "2GB", value_parser = parse_bytes)]
    pub read_speed: u64,
    /// Conversion estimate: bytes per second one part writes the output at.
    #[arg(long, default_value = "1GB", value_parser = parse_bytes)]
    pub write_speed: u64,
    /// Conversion estimate: CPU cores per part; default: this machine's.
    #[arg(long, value_parser = super::values::count)]
    pub cores: Option<usize>,
    /// Conversion estimate: where INT4 quantization runs.
    ///
    /// Conversion estimate: where INT4 quantization runs (cpu: measured core-seconds per GB; gpu: the kernels are
    /// taken as faster than the disk).
    #[arg(long, value_enum, default_value = "cpu")]
    pub quantize_on: QuantizeOn,
    /// Conversion estimate: machines the conversion is split over.
    ///
    /// Conversion estimate: machines the conversion is split over (`quantize --part I/N`); at most the plan's
    /// shard count (reported).
    #[arg(long, default_value_t = 1, value_parser = super::values::count)]
    pub parts: usize,
    /// Print one JSON report on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `--reserve` accepts 0.
fn parse_reserve(text: &str) -> Result<u64, String> {
    if text.trim() == "0" {
        return Ok(0);
    }
    parse_bytes(text)
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    if args.formats {
        let comparison = compare_formats(&options(&args))
            .context_unless_named(&args.model, || format!("report {} --formats", args.model))?;
        if args.json {
            print_json(&comparison)?;
        } else {
            print_formats(&comparison, &args);
        }
        return Ok(Outcome::Success);
    }
    let report = build(&args)?;
    if args.json {
        print_json(&report)?;
    } else {
        print_human(&report);
    }
    Ok(Outcome::Success)
}

/// The report the arguments ask for (also what `squeeze demo` shows).
pub(crate) fn build(args: &Args) -> anyhow::Result<Report> {
    report(&options(args)).context_unless_named(&args.model, || format!("report {}", args.model))
}

/// The report options of the arguments.
fn options(args: &Args) -> ReportOptions {
    ReportOptions {
        model: args.model.clone(),
        recipe: args.recipe.clone(),
        group_size: args.group_size,
        scale_rule: args.scale_rule,
        max_shard_bytes: args.max_shard_size,
        machine: Machine {
            read_bytes_per_second: args.read_speed as f64,
            write_bytes_per_second: args.write_speed as f64,
            cores: args.cores.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            quantize_on: args.quantize_on,
            parts: args.parts,
        },
        layout: Layout {
            gpus: args.gpus,
            tp: args.tp.unwrap_or(args.gpus),
            dp_attention: args.dp_attention,
            gpu_memory: args.gpu_memory.clone(),
            mem_fraction: args.mem_fraction,
            reserve_bytes: args.reserve,
            context: args.context,
            kv_pool_bytes: args.kv_pool,
        },
    }
}

/// `--formats`: one row per format, the decode node's budget on the layout.
fn print_formats(comparison: &FormatComparison, args: &Args) {
    println!(
        "{} ({}): source {:.2} GiB; decode node {} × {}, tp {}, FP8 KV, context {} tokens\n",
        comparison.model,
        comparison.architecture,
        comparison.source_gib,
        args.gpus,
        args.gpu_memory.name,
        args.tp.unwrap_or(args.gpus),
        count(args.context)
    );
    let requests = format!("requests of {}", count(args.context));
    let mut table =
        Table::new(&["recipe", "output", "weights per GPU", "KV tokens per GPU", "KV tokens per node", &requests]);
    for row in &comparison.formats {
        match (&row.decode, row.output_bytes) {
            (Some(decode), Some(output)) => table.row(vec![
                row.recipe.clone(),
                gib(output),
                human(decode.weight_bytes_per_gpu),
                count(decode.kv_capacity_tokens_per_gpu),
                count(decode.kv_capacity_tokens),
                count(decode.max_concurrency),
            ]),
            _ => table.row(vec![
                row.recipe.clone(),
                "does not fit".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]),
        }
    }
    println!("{}", table.render());
    for row in comparison.formats.iter().filter(|row| row.error.is_some()) {
        println!("{}: {}", row.recipe, row.error.as_deref().unwrap_or_default());
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// A duration in seconds as `42 s`, `7.5 min` or `2.3 h`.
fn duration(seconds: f64) -> String {
    if seconds < 90.0 {
        format!("{seconds:.0} s")
    } else if seconds < 5400.0 {
        format!("{:.1} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

/// The conversion estimate paragraph.
fn print_conversion(estimate: &ConversionEstimate) {
    let machine = &estimate.machine;
    let compute = match machine.quantize_on {
        QuantizeOn::Cpu => format!("compute {} on {} cores", duration(estimate.compute_seconds), machine.cores),
        QuantizeOn::Gpu => "compute on the GPU (taken as faster than the disk)".into(),
    };
    println!(
        "conversion in {} part(s) (at most {}: one per shard of the plan{}): per part read {} at {}/s in {}, write {} at \
         {}/s in {}, {compute} → ≈ {} per part, bound by {}; {} of machine time",
        machine.parts,
        estimate.max_parts,
        if estimate.capped { "; fewer parts than asked" } else { "" },
        human(estimate.read_bytes_per_part),
        human(machine.read_bytes_per_second as u64),
        duration(estimate.read_seconds),
        human(estimate.write_bytes_per_part),
        human(machine.write_bytes_per_second as u64),
        duration(estimate.write_seconds),
        duration(estimate.seconds_per_part),
        estimate.bound_by,
        duration(estimate.machine_seconds)
    );
    println!(
        "(reading, computing and writing overlap; CPU cost {} core-s/GB, mse {} core-s/GB, from BENCHMARKS.md)\n",
        crate::report::conversion::MINMAX_CORE_SECONDS_PER_GB,
        crate::report::conversion::MSE_CORE_SECONDS_PER_GB
    );
}

/// `1234567` as `1,234,567`.
pub(super) fn count(value: u64) -> String {
    let digits = value.to_string();
    let mut text = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            text.push(',');
        }
        text.push(digit);
    }
    text
}

pub fn print_human(report: &Report) {
    let how = if report.exact { "counted from the weights" } else { "computed from config.json" };
    println!("{} ({} {}, {} input; sizes {how})\n", report.model, report.architecture, report.model_type, report.input);
    let mut classes = Table::new(&["class", "parameters", "source", "as bf16", &report.recipe]);
    for (class, size) in &report.sizes.classes {
        classes.row(vec![
            class.clone(),
            count(size.parameters),
            gib(size.source_bytes),
            gib(size.bf16_bytes),
            gib(size.output_bytes),
        ]);
    }
    let sizes = &report.sizes;
    classes.row(vec![
        "total tensors".into(),
        count(sizes.parameters),
        gib(sizes.source_tensors.bytes),
        gib(sizes.bf16.bytes),
        gib(sizes.output_tensors.bytes),
    ]);
    println!("{}\n", classes.render());
    println!("source:          {}", both_units(report.source_bytes));
    println!("source as BF16:  {}", both_units(report.bf16_bytes));
    println!("after {}: {} in {} shard file(s)", report.recipe, both_units(report.output_bytes), sizes.shards);
    if let Some(kept) = &sizes.output_tensors_mtp_bf16 {
        println!(
            "  with the MTP layer's routed experts kept BF16 (recipe mtp = \"bf16\"): {:.2} GiB of tensors ({:+.2} GiB)",
            kept.gib,
            kept.gib - sizes.output_tensors.gib
        );
    }
    if let Some(requantization) = &report.requantization {
        println!(
            "requantization of the shipped {} (group {}) to {}: relative L2 error {:.4} mean, {:.4} max (`{}`) over \
             {} of {} requantized tensors, round to nearest; every tensor: `squeeze verify OUT --source SRC`, the \
             logits: `squeeze eval --reference SRC --candidate OUT`",
            requantization.source_format.to_uppercase(),
            requantization.source_group_size,
            requantization.scheme,
            requantization.mean_relative_l2,
            requantization.max_relative_l2,
            requantization.worst,
            requantization.sampled,
            requantization.requantized
        );
    }
    println!();
    print_conversion(&report.conversion);

    let layout = &report.layout;
    println!(
        "budget: {} × {} ({}), tp {}{}, {} replica(s), mem fraction {}, reserve {} per GPU, context {} tokens",
        layout.gpus,
        layout.gpu_memory.name,
        human(layout.gpu_memory.bytes),
        layout.tp,
        if layout.dp_attention { ", dp attention" } else { "" },
        layout.replicas(),
        layout.mem_fraction,
        human(layout.reserve_bytes),
        count(layout.context)
    );
    println!(
        "KV per token per GPU ({}, {} layers, MTP excluded): bf16 {} B, fp8 {} B{}\n",
        report.kv.attention,
        report.kv.bf16.layers,
        count(report.kv.bf16.bytes_per_token),
        count(report.kv.fp8.bytes_per_token),
        if report.kv.bf16.state_bytes_per_request > 0 {
            let kda = report.kv.attention.contains("kda");
            format!(
                " at length ({}), plus per request whatever its length: {} (bf16 cache) / {} (fp8 cache){}",
                match (kda, report.kv.bf16.indexer_layers > 0) {
                    (true, true) => format!(
                        "the MLA layers' rows, each with the DSA indexer's {} B FP8 key{} in the {} layers that run \
                         an indexer",
                        report.kv.bf16.indexer_bytes_per_layer,
                        match report.kv.bf16.indexer_pool {
                            1 => String::new(),
                            pool => format!(" per pool of {pool} tokens"),
                        },
                        report.kv.bf16.indexer_layers
                    ),
                    (true, false) => "the MLA layers' rows".to_string(),
                    (false, _) => format!(
                        "one entry per 4 or 128 tokens, CSA layers with their indexer's {} B FP8 key",
                        report.kv.bf16.indexer_bytes_per_layer
                    ),
                },
                human(report.kv.bf16.state_bytes_per_request),
                human(report.kv.fp8.state_bytes_per_request),
                if kda && report.kv.bf16.indexer_pool > 1 {
                    " of KDA recurrent state (F32) and convolution tail (BF16), and the indexer's unfinished pool \
                     (BF16 keys and gate scores), as vLLM keeps them"
                } else if kda {
                    " of KDA recurrent state (F32) and convolution tail (BF16), as vLLM keeps them"
                } else {
                    " for the last sliding-window tokens of every layer"
                },
            )
        } else if report.kv.bf16.indexer_bytes_per_layer > 0 {
            format!(
                " (each includes the DSA indexer's {} B FP8 key row in the {} of {} layers that run an indexer)",
                report.kv.bf16.indexer_bytes_per_layer, report.kv.bf16.indexer_layers, report.kv.bf16.layers
            )
        } else {
            String::new()
        }
    );
    let (prefill, decode) = (&report.prefill, &report.decode);
    let mut nodes = Table::new(&["per node", "prefill node", "decode node"]);
    let mut row =
        |label: &str, cell: &dyn Fn(&NodeBudget) -> String| nodes.row(vec![label.into(), cell(prefill), cell(decode)]);
    row("weights", &|n| n.weights.clone());
    row("weights per GPU", &|n| human(n.weight_bytes_per_gpu));
    row("KV dtype", &|n| n.kv_dtype.name().into());
    row("KV bytes/token/layer", &|n| count(n.kv_bytes_per_token_per_layer));
    row("KV bytes/token", &|n| count(n.kv_bytes_per_token));
    row("KV pool per GPU", &|n| human(n.kv_pool_bytes_per_gpu));
    row("KV tokens per GPU", &|n| count(n.kv_capacity_tokens_per_gpu));
    row("KV tokens per node", &|n| count(n.kv_capacity_tokens));
    row(&format!("requests of {}", count(layout.context)), &|n| count(n.max_concurrency));
    println!("{}", nodes.render());
    if layout.kv_pool_bytes.is_some() {
        println!("\n(KV pool given with --kv-pool; weights were not checked against GPU memory)");
    }
}

//! Command-line interface: argument parsing, printing and exit codes (0 ok, 1 a gate failed, 2 error). No logic.

/// Every result line the CLI prints goes through this `println!` (it shadows std's in this module and its children):
/// a closed stdout (`squeeze report glm-5 | head -1`) ends the process quietly with exit 0, as ripgrep does, instead
/// of panicking. Jobs print only after their folder is complete, so nothing is left half-written.
macro_rules! println {
    () => {
        $crate::cli::output::print_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::cli::output::print_line(format_args!($($arg)*))
    };
}

mod calibrate_kv;
mod card;
mod demo;
mod engine_rules;
mod eval;
mod eval_task;
mod inspect;
mod merge;
mod merge_calib;
mod merge_eval;
mod output;
mod progress;
mod quantize;
mod report;
mod selftest;
mod serve_test;
mod synth;
mod table;
mod values;
mod verify;

use clap::{Parser, Subcommand};

use output::Outcome;

#[derive(Parser)]
#[command(
    name = "squeeze",
    disable_version_flag = true,
    about = "Converts FP8, INT4 and FP4-native MoE checkpoints (Kimi K2/K2.5–K2.7/K3, GLM-4.5/5/5.2, DeepSeek-V3/V4) \
             to 4-bit group-quantized safetensors SGLang and vLLM load, and proves their accuracy with a reference \
             runtime",
    long_about = None
)]
pub struct Cli {
    /// Print the version; with --verbose also whether CUDA support is built in and which device the probe finds.
    #[arg(short = 'V', long)]
    version: bool,
    /// With --version: CUDA build and device details.
    #[arg(long, requires = "version")]
    verbose: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Convert an FP8, INT4 or MXFP4 checkpoint to 4-bit (INT4, NVFP4, MXFP4, W4A8) compressed-tensors safetensors.
    Quantize(quantize::Args),
    /// Join the parts of a `quantize --part I/N` conversion into one output folder.
    ///
    /// Join the parts of a `quantize --part I/N` conversion into the folder one run writes (exit 2 naming the part
    /// that is missing, duplicated or made differently).
    Merge(merge::Args),
    /// Rewrite the model card (README.md) of a squeeze output folder.
    ///
    /// (Re)write the model card (README.md) of a squeeze output folder: Hugging Face front matter, recipe, method,
    /// calibration digest, serve commands, and the accuracy of `squeeze eval --json` reports given with --eval.
    Card(card::Args),
    /// Show what a checkpoint holds: architecture, dtypes, quantization config, bytes by tensor class.
    Inspect(inspect::Args),
    /// Re-check an output against its manifest, the compressed-tensors conventions and (optionally) its source.
    Verify(verify::Args),
    /// Write a tiny random checkpoint of a real architecture in the vendor's format (FP8, INT4 or MXFP4).
    Synth(synth::Args),
    /// Run every stage on a built-in tiny model in a temporary folder.
    Demo(demo::Args),
    /// Calibrate per-layer FP8 KV-cache scales (k_scale/v_scale) and write them where vLLM and SGLang read them.
    CalibrateKv(calibrate_kv::Args),
    /// Join the `--save-stats` files of the parts of a `calibrate-kv --part I/N` into the scales one run writes.
    MergeCalib(merge_calib::Args),
    /// Perplexity of one model on text or token chunks, computed by the layer-streamed reference runtime.
    Eval(eval::Args),
    /// Join the `--save-stats` files of the parts of an `eval --part I/N` into the report one run gives.
    MergeEval(merge_eval::Args),
    /// Checkpoint sizes and GPU memory budgets, from config.json alone.
    ///
    /// Checkpoint size before/after a recipe and GPU memory budgets (KV capacity, concurrency) from config.json alone.
    Report(report::Args),
    /// Check every GPU kernel against the CPU path on random data, then benchmark (needs a CUDA build and a GPU).
    Selftest(selftest::Args),
    /// Decode prompts through the paged KV cache with continuous batching and page-tag integrity checks.
    ServeTest(serve_test::Args),
}

impl Command {
    /// Whether the command runs the model's layers over tokens (the layer-streamed passes of
    /// [`crate::runtime::allocator`]'s notes): evaluation, calibration, serving, and calibrated quantization.
    fn runs_layer_passes(&self) -> bool {
        match self {
            Command::Eval(_) | Command::CalibrateKv(_) | Command::ServeTest(_) | Command::Demo(_) => true,
            Command::Quantize(args) => args.method != crate::plan::calibration::Method::Rtn,
            _ => false,
        }
    }
}

/// Parses the arguments, runs the subcommand and returns the process exit code.
pub fn run() -> i32 {
    crate::io::interrupt::install();
    let cli = parse();
    if cli.version {
        print_version(cli.verbose);
        return 0;
    }
    let Some(command) = cli.command else {
        use clap::CommandFactory;
        let _ = Cli::command().print_help();
        return 2;
    };
    if command.runs_layer_passes() {
        // Before any worker thread starts, so that glibc's arena cap holds for every thread.
        crate::runtime::allocator::retain_freed_memory();
    }
    let result = match command {
        Command::Quantize(args) => quantize::run(args),
        Command::Merge(args) => merge::run(args),
        Command::Card(args) => card::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Eval(args) => eval::run(args),
        Command::MergeEval(args) => merge_eval::run(args),
        Command::CalibrateKv(args) => calibrate_kv::run(args),
        Command::MergeCalib(args) => merge_calib::run(args),
        Command::Report(args) => report::run(args),
        Command::Selftest(args) => selftest::run(args),
        Command::ServeTest(args) => serve_test::run(args),
    };
    match result {
        Ok(Outcome::Success) => 0,
        Ok(Outcome::GateFailed) => 1,
        Err(error) => {
            eprintln!("error: {error:#}");
            2
        }
    }
}

/// The command line, with negative numbers taken as the values of the flags they follow: `--ctx -1` reaches the
/// flag's parser, which names the flag and its rule ("invalid value '-1' for '--ctx <CTX>': must be at least 2,
/// got -1"), instead of clap reading `-1` as an unknown flag. Only numbers: `--out -x` still fails as before.
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let command = Cli::command().mut_subcommands(|subcommand| {
        subcommand.mut_args(|arg| {
            let arg = without_restated_summary(arg);
            if arg.get_action().takes_values() {
                arg.allow_negative_numbers(true)
            } else {
                arg
            }
        })
    });
    Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|error| error.exit())
}

/// A flag's doc comment is a one-line summary (what `-h` prints) and, where there is more to say, the full text
/// (what `--help` prints). clap's derive prints the two one after the other under `--help`; where the full text
/// restates the summary (it starts with the summary's first two words) only the full text is kept there.
fn without_restated_summary(arg: clap::Arg) -> clap::Arg {
    fn opening(text: &str) -> Vec<&str> {
        text.split_whitespace().take(2).map(|word| word.trim_matches(|c: char| !c.is_alphanumeric())).collect()
    }
    let (Some(summary), Some(long)) = (arg.get_help(), arg.get_long_help()) else { return arg };
    let (summary, long) = (summary.to_string(), long.to_string());
    let Some((first, full)) = long.split_once("\n\n") else { return arg };
    let restated = first.trim_end_matches('.') == summary.trim_end_matches('.') && opening(first) == opening(full);
    if restated {
        let full = full.to_string();
        arg.long_help(full)
    } else {
        arg
    }
}

/// `--version [--verbose]`: the version, and with --verbose the CUDA build and what the device probe finds.
fn print_version(verbose: bool) {
    println!("squeeze {}", env!("CARGO_PKG_VERSION"));
    if !verbose {
        return;
    }
    if crate::runtime::device::BUILT_WITH_CUDA {
        println!("cuda: built in (kernels: sm_90a cubins and sm_90 PTX from CUDA 13.0; driver loaded at run time)");
    } else {
        println!("cuda: not built in (rebuild with `cargo build --release --features cuda`)");
    }
    match crate::runtime::device::probe() {
        Ok(device) => println!("device: {device}"),
        Err(crate::runtime::device::CudaError::BuiltWithoutCuda) => println!("device: cpu only"),
        Err(reason) => println!("device: none usable ({reason})"),
    }
}

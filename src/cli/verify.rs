//! `squeeze verify` arguments and output; exit 1 on any mismatch.

use std::path::PathBuf;

use crate::engines::EngineChoice;
use crate::verify::{verify, VerifyOptions, VerifyReport, DEFAULT_MAX_INT4_ERROR};

use super::engine_rules::{parse_tp, print_rules};
use super::output::{print_json, Outcome};
use super::table::Table;

#[derive(clap::Args)]
pub struct Args {
    /// Output of `squeeze quantize`: folder or Hugging Face repo id.
    ///
    /// Output of `squeeze quantize`: folder or Hugging Face repo id (ORG/NAME[@REV]) in the local cache.
    #[arg(value_parser = super::values::model_dir)]
    pub output: PathBuf,
    /// Source to dequantize against, reporting per-tensor error.
    ///
    /// The source (folder or Hugging Face repo id (ORG/NAME[@REV]) in the local cache): dequantize both and report
    /// per-tensor error.
    #[arg(long, value_parser = super::values::model_dir)]
    pub source: Option<PathBuf>,
    /// Largest relative L2 error an INT4 tensor may have against its source.
    ///
    /// Largest relative L2 error an INT4 tensor may have against its source (routed experts of a `--method gptq`
    /// output: at least 0.75, since GPTQ moves rounding error into input directions calibration hardly excites).
    #[arg(long, default_value_t = DEFAULT_MAX_INT4_ERROR, value_parser = super::values::positive)]
    pub max_int4_error: f64,
    /// How many of the worst tensors to list.
    #[arg(long, default_value_t = 10, value_parser = super::values::whole::<usize>)]
    pub worst: usize,
    /// Also check the engine load rules: vllm, sglang or all.
    ///
    /// Also check the engine load rules (read from vLLM 0.32 and SGLang sources) for vllm, sglang or all (both); a failed rule exits 1.
    #[arg(long, default_value = "none", hide_default_value = true)]
    pub engine: EngineChoice,
    /// Tensor-parallel size for the rules.
    ///
    /// Tensor-parallel size for the rules (moe_intermediate_size / tp must be a multiple of the group size).
    /// Default: 8 when the model's hidden_size and moe_intermediate_size are those of a built-in preset (a
    /// real-size Kimi K2, GLM-5 or GLM-4.5), 1 otherwise.
    #[arg(long, value_parser = parse_tp)]
    pub tp: Option<usize>,
    /// Print a JSON report.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let report = verify(&VerifyOptions {
        output: args.output,
        source: args.source,
        max_int4_error: args.max_int4_error,
        worst: args.worst,
        engine: args.engine,
        tp: args.tp,
    })?;
    if args.json {
        print_json(&report)?;
    } else {
        print_human(&report);
    }
    Ok(if report.passed { Outcome::Success } else { Outcome::GateFailed })
}

pub fn print_human(report: &VerifyReport) {
    println!(
        "{}: {} shard(s) re-hashed, {} INT4 tensors checked, {} tensors compared with the source",
        report.output, report.shards_checked, report.quantized_tensors, report.compared_tensors
    );
    if !report.worst.is_empty() {
        let mut table = Table::new(&["worst tensors", "scheme", "rel L2", "max |Δ|"]);
        for error in &report.worst {
            table.row(vec![
                error.name.clone(),
                error.scheme.clone(),
                format!("{:.5}", error.relative_l2),
                format!("{:.3e}", error.max_abs),
            ]);
        }
        println!("{}", table.render());
    }
    if let Some(rules) = &report.engine_rules {
        print_rules(rules);
    }
    for note in &report.notes {
        println!("note: {note}");
    }
    if report.passed {
        println!("verify: OK");
    } else {
        for problem in &report.problems {
            println!("mismatch: {problem}");
        }
        let rules = report.engine_rules.as_ref().map_or(0, |rules| rules.failed);
        println!("verify: FAILED ({} problem(s), {rules} engine rule(s) failed)", report.problems.len());
    }
}

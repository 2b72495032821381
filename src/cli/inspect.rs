//! `squeeze inspect` arguments and output.

use std::path::PathBuf;

use crate::inspect::{inspect, InspectReport};
use crate::units::{both_units, human};

use super::output::{print_json, Outcome};
use super::table::Table;

#[derive(clap::Args)]
pub struct Args {
    /// Model: folder or Hugging Face repo id (ORG/NAME[@REV]) in the local cache.
    #[arg(value_parser = super::values::model_dir)]
    pub dir: PathBuf,
    /// Print a JSON report.
    #[arg(long)]
    pub json: bool,
}

/// Malformed modules listed one per line before "and N more".
const PROBLEMS_SHOWN: usize = 5;

/// Prints what the folder holds; a malformed checkpoint (a quantized module whose tensors disagree) still gets its
/// tables — they help to see what is there — then a warning line per problem on stderr and exit 1, as a failed
/// check: the folder cannot be loaded as it is, and `squeeze verify` says more.
pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let report = inspect(&args.dir)?;
    if args.json {
        print_json(&report)?;
    } else {
        print_human(&report);
    }
    if report.problems.is_empty() {
        return Ok(Outcome::Success);
    }
    for problem in report.problems.iter().take(PROBLEMS_SHOWN) {
        eprintln!("warning: {}: malformed checkpoint: {problem}", report.path);
    }
    if report.problems.len() > PROBLEMS_SHOWN {
        eprintln!("warning: … and {} more malformed module(s)", report.problems.len() - PROBLEMS_SHOWN);
    }
    eprintln!(
        "inspect: {} cannot be loaded as it is; `squeeze verify {}` checks every tensor",
        report.path, report.path
    );
    Ok(Outcome::GateFailed)
}

pub fn print_human(report: &InspectReport) {
    println!("{}", report.path);
    match &report.architecture {
        Some(architecture) => println!(
            "  {architecture} ({}): {} layers + {} MTP, {} routed experts, top-{}",
            report.model_type.as_deref().unwrap_or("?"),
            report.layers.unwrap_or(0),
            report.mtp_layers.unwrap_or(0),
            report.routed_experts.unwrap_or(0),
            report.experts_per_token.unwrap_or(0)
        ),
        None => println!("  architecture unknown: {}", report.config_problem.as_deref().unwrap_or("")),
    }
    if let Some(wrapper) = &report.wrapper {
        println!(
            "  inside {} ({}): the {} text model under text_config; vision tower and projector carried, never run",
            wrapper.architecture, wrapper.model_type, wrapper.text_model_type
        );
    }
    println!("  {} tensors in {} shard(s), {}", report.tensors, report.shards, both_units(report.file_bytes));
    let method = report
        .quantization_config
        .as_ref()
        .map(|q| {
            format!(
                "{} {}",
                q.get("quant_method").and_then(|v| v.as_str()).unwrap_or("?"),
                q.get("format").and_then(|v| v.as_str()).unwrap_or("")
            )
        })
        .unwrap_or_else(|| "none".into());
    println!("  quantization_config: {}\n", method.trim());
    let mut dtypes = Table::new(&["dtype", "tensors", "bytes"]);
    for (dtype, count) in &report.dtypes {
        dtypes.row(vec![dtype.clone(), count.tensors.to_string(), human(count.bytes)]);
    }
    println!("{}\n", dtypes.render());
    let mut classes = Table::new(&["class", "tensors", "bytes"]);
    for (class, count) in &report.classes {
        classes.row(vec![class.clone(), count.tensors.to_string(), human(count.bytes)]);
    }
    println!("{}", classes.render());
}

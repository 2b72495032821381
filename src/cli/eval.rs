//! `squeeze eval` arguments and output.

use std::path::PathBuf;

use anyhow::Context;

use crate::eval::{evaluate, EvalInput, EvalOptions};

use super::progress::Bar;
use super::table::Table;
use super::{print_json, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// Model folder (FP8, INT4 compressed-tensors or BF16 checkpoint with config.json).
    pub model: PathBuf,
    /// UTF-8 text file, tokenized with the model's tokenizer and cut into --ctx chunks.
    #[arg(long, conflicts_with = "tokens", required_unless_present = "tokens")]
    pub data: Option<PathBuf>,
    /// safetensors file with an integer tensor `input_ids` [n, ctx] (I32 or I64), used as given (no BOS added).
    #[arg(long)]
    pub tokens: Option<PathBuf>,
    /// Tokens per chunk for --data.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Evaluate at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Write all logits as an F32 tensor `logits` [n, ctx, vocab] to this safetensors file.
    #[arg(long)]
    pub save_logits: Option<PathBuf>,
    /// Print the report as JSON (keys include ppl, mean_nll, tokens, seconds).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let input = match (&args.data, &args.tokens) {
        (Some(path), _) => EvalInput::Text { path: path.clone(), ctx: args.ctx },
        (None, Some(path)) => EvalInput::Tokens { path: path.clone() },
        (None, None) => anyhow::bail!("give --data TEXT_FILE or --tokens SAFETENSORS_FILE"),
    };
    let options =
        EvalOptions { model: args.model.clone(), input, chunks: args.chunks, save_logits: args.save_logits.clone() };
    let report =
        evaluate(&options, &Bar::new(false)).with_context(|| format!("evaluating {}", args.model.display()))?;
    if args.json {
        print_json(&report)?;
        return Ok(Outcome::Success);
    }
    let mut table = Table::new(&["eval", ""]);
    table.row(vec!["model".into(), format!("{} ({})", report.model, report.architecture)]);
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
    if report.near_ties > 0 {
        table.row(vec!["top-k near-ties".into(), report.near_ties.to_string()]);
    }
    if let Some(file) = &report.logits_file {
        table.row(vec!["logits".into(), file.clone()]);
    }
    println!("{}", table.render().trim_end());
    Ok(Outcome::Success)
}

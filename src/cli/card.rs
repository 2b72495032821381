//! `squeeze card` arguments and output: (re)write a squeeze output folder's model card, README.md.

use std::path::PathBuf;

use anyhow::Context;

use crate::card::{refresh, CardOptions, CardReport};

use super::output::{print_json, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// Output folder of `squeeze quantize` or `squeeze merge`.
    ///
    /// Output folder `squeeze quantize` or `squeeze merge` wrote (not a Hugging Face cache snapshot, whose files other
    /// snapshots share). The card is rendered from its squeeze-manifest.json, config.json and README.source.md; a
    /// README.md that is not a squeeze card is moved to README.source.md when that is free (older squeeze
    /// versions copied the source's README there), else refused (exit 2).
    pub dir: PathBuf,
    /// An `eval --json` report to show in the accuracy section (repeatable).
    ///
    /// The JSON of `squeeze eval … --json` (or `merge-eval --json`) to show in the card's accuracy section: a
    /// parity report whose candidate is DIR (`eval --reference SOURCE --candidate DIR`), or a perplexity report of
    /// DIR or of another model (the source, for comparison). Repeat for several; they replace the results recorded
    /// before. The results are kept in the manifest's `card` record, so that a later `squeeze card DIR` (after
    /// `calibrate-kv`, say) keeps them; a new `quantize` into DIR starts without.
    #[arg(long = "eval", value_name = "REPORT")]
    pub evals: Vec<PathBuf>,
    /// Drop the accuracy results recorded before.
    #[arg(long, conflicts_with = "evals")]
    pub no_eval: bool,
    /// The card's `base_model`: the source's Hugging Face repo id.
    ///
    /// The card's `base_model`: the source's Hugging Face repo id (recorded in the manifest).
    #[arg(long, value_name = "ORG/NAME", value_parser = repo_id)]
    pub base_model: Option<String>,
    /// Tensor-parallel size of the card's serve commands.
    ///
    /// The tensor-parallel size of the card's serve commands (recorded in the manifest; default: what
    /// `quantize --tp` recorded, else 8 for real-size models, 1 for smaller ones).
    #[arg(long, value_parser = super::engine_rules::parse_tp)]
    pub tp: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `ORG/NAME` as the Hub spells repo ids (no revision).
pub fn repo_id(text: &str) -> Result<String, String> {
    match crate::io::hub::RepoId::parse(text) {
        Ok(id) if id.revision.is_none() => Ok(id.without_revision()),
        Ok(_) => Err(format!("`{text}`: give ORG/NAME without @REV (the card names the repo, not a revision)")),
        Err(error) => Err(error.to_string()),
    }
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let options = CardOptions { evals: args.evals, no_eval: args.no_eval, base_model: args.base_model, tp: args.tp };
    let report =
        refresh(&args.dir, &options).with_context(|| format!("writing the model card of {}", args.dir.display()))?;
    if args.json {
        print_json(&report)?;
    } else {
        print_human(&report);
    }
    Ok(Outcome::Success)
}

fn print_human(report: &CardReport) {
    if report.moved_source_readme {
        println!("moved the README.md that was not a squeeze card to README.source.md");
    }
    println!(
        "wrote {}: {}, pipeline_tag {}, tags {}",
        report.readme.display(),
        match &report.base_model {
            Some(id) => format!("base_model {id} (from {})", report.base_model_from.describe()),
            None => "no base_model (the source was a local folder; name its repo with --base-model ORG/NAME)".into(),
        },
        report.pipeline_tag,
        report.tags.join(", ")
    );
    if report.evals.is_empty() {
        println!("no accuracy results (add `squeeze eval … --json` reports with --eval REPORT)");
    } else {
        println!("accuracy from {}", report.evals.join(", "));
    }
    if report.manifest_updated {
        println!("recorded in squeeze-manifest.json (`card`)");
    }
}

//! `squeeze merge` arguments and output: the parts of a `quantize --part I/N` conversion joined into one folder.

use std::path::PathBuf;

use anyhow::Context;

use crate::convert::merge::{merge, MergeReport};
use crate::units::both_units;

use super::output::{print_json, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// The merged output folder (new, or the folder the parts shared).
    pub output: PathBuf,
    /// Folders the parts wrote (default: OUTPUT itself).
    ///
    /// Folders the parts wrote (each holds one or more squeeze-part-0000I-of-0000N.json with its shards);
    /// default: OUTPUT itself, when every part wrote there. Checked before anything is written: every part of
    /// 1..N present once, finished, of the same squeeze version, source, recipe, flags and plan digest, each
    /// shard's SHA-256 as its part recorded. Shards are hard-linked into OUTPUT (copied across file systems).
    #[arg(value_name = "PART_DIR")]
    pub parts: Vec<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let report = merge(&args.output, &args.parts).with_context(|| format!("merge into {}", args.output.display()))?;
    if args.json {
        print_json(&report)?;
    } else {
        print_human(&report);
    }
    Ok(Outcome::Success)
}

fn print_human(report: &MergeReport) {
    println!(
        "merged {} part(s) into {}: {} shard(s), {} ({} linked, {} copied, {} in place), plan {}",
        report.parts,
        report.output.display(),
        report.shards,
        both_units(report.output_bytes),
        report.shards_linked,
        report.shards_copied,
        report.shards_in_place,
        &report.plan_sha256[..report.plan_sha256.len().min(12)]
    );
}

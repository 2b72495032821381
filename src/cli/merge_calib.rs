//! `squeeze merge-calib` arguments and output: the `--save-stats` files of the parts of a split `calibrate-kv`
//! joined into the scales one run writes, written as `calibrate-kv` writes them.

use std::path::PathBuf;

use anyhow::Context;

use crate::calib::part_stats::merge;
use crate::calib::{open_for_edit, write_scales};

use super::output::{print_json, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// The model the parts calibrated; the scales are written into it.
    ///
    /// The model the parts calibrated (checked against their records); the scales are written into it: folder or
    /// Hugging Face repo id (ORG/NAME[@REV]) in the local cache.
    #[arg(value_parser = super::values::model_dir)]
    pub model: PathBuf,
    /// The statistics files of every part, in any order.
    ///
    /// The statistics files of every part (`calibrate-kv --part I/N --save-stats FILE`), in any order. Checked
    /// first: each part of 1..N present once, all of the same squeeze version, model, input and flags.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Write the scales into this folder instead of the model folder.
    ///
    /// Write config.json, the index and kv-scales.safetensors into this folder instead of the model folder.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also write SGLang's --quantization-param-path JSON here.
    #[arg(long)]
    pub sglang_json: Option<PathBuf>,
    /// Merge and report only; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON (the keys `calibrate-kv --json` prints).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let target = args.out.clone().unwrap_or_else(|| args.model.clone());
    let _lock = if args.dry_run {
        None
    } else {
        crate::io::interrupt::set_hint(format!("the folder {} is unchanged", target.display()));
        Some(open_for_edit(&target).with_context(|| format!("opening {} for the scales", target.display()))?)
    };
    let mut report = merge(&args.model, &args.files)?;
    for layer in &report.layers {
        if let Some(warning) = &layer.warning {
            eprintln!("warning: layer {}: {warning}", layer.layer);
        }
    }
    if !args.dry_run {
        let written = write_scales(&report, &args.model, args.out.as_deref(), args.sglang_json.as_deref())
            .with_context(|| format!("writing KV scales for {}", args.model.display()))?;
        report.written = written.files.iter().map(|p| p.display().to_string()).collect();
    }
    if args.json {
        print_json(&report)?;
    } else {
        println!("merged {} statistics file(s)", args.files.len());
        super::calibrate_kv::print_report(&report);
    }
    Ok(Outcome::Success)
}

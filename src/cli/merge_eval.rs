//! `squeeze merge-eval` arguments and output: the `--save-stats` files of the parts of a split `eval` joined into
//! the report one run gives (gates applied as `eval` applies them: exit 1 naming a failed gate).

use std::path::PathBuf;

use crate::eval::part_stats::{merge, Merged};

use super::output::{print_json, Outcome};

#[derive(clap::Args)]
pub struct Args {
    /// The statistics files of every part (`eval --part I/N --save-stats FILE`), in any order.
    ///
    /// Checked first: each part of 1..N present once, all of the same squeeze version, models, input chunks and flags.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Print the report as JSON (the keys `eval --json` prints, times summed over the parts).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<Outcome> {
    let json = args.json;
    match merge(&args.files)? {
        Merged::Eval { report, parts } => {
            if args.json {
                print_json(&report)?;
            } else {
                println!("merged {parts} part(s)");
                super::eval::print_eval(&report);
            }
            Ok(Outcome::Success)
        }
        Merged::Tasks { report, parts } => {
            eprintln!("merged {parts} part(s)");
            super::eval_task::show(&report, json, true)
        }
        Merged::Parity { report, parts } => {
            if args.json {
                print_json(&report)?;
            } else {
                println!("merged {parts} part(s)");
                super::eval::print_parity(&report);
            }
            super::eval::report_failures(&report);
            Ok(if report.failures.is_empty() { Outcome::Success } else { Outcome::GateFailed })
        }
    }
}

//! `squeeze eval --task FILE`: the task benchmarks' arguments (on `eval`'s [`super::eval::Args`]) and output — one
//! model's accuracies, or two models' paired comparison with its gates (exit 1 naming the failed gate).

use std::path::Path;

use anyhow::Context;
use serde_json::json;

use crate::arch::Model;
use crate::eval::tasks::paired::TaskGates;
use crate::eval::tasks::parts::{self, TaskMerge};
use crate::eval::tasks::{file, run, run_paired, PairedOptions, PairedReport, TaskReport};
use crate::part::{Part, PartIdentity};
use crate::runtime::device::DeviceChoice;

use super::output::{print_json, Outcome};
use super::progress::Bar;
use super::table::Table;

/// What `eval --task` was given (from `eval`'s arguments).
pub struct TaskArgs<'a> {
    pub model: Option<&'a Path>,
    pub reference: Option<&'a Path>,
    pub candidate: Option<&'a Path>,
    pub num_fewshot: usize,
    pub max_flips: Option<usize>,
    pub max_acc_drop: Option<f64>,
    pub split: bool,
    pub json: bool,
    pub device: DeviceChoice,
    /// `--part I/N`: score only that share of the scored items (with `--save-stats`).
    pub part: Option<Part>,
    pub save_stats: Option<&'a Path>,
}

pub fn run_tasks(args: TaskArgs, path: &Path) -> anyhow::Result<Outcome> {
    let whole = file::read(path).map_err(anyhow::Error::msg)?;
    let part = args.part.unwrap_or(Part::WHOLE);
    let (tasks, range, items) = parts::select(&whole, part);
    let backend = super::output::open_backend(args.device)?;
    let bar = Bar::new(false);
    let paired = args.reference.is_some();
    let models: Vec<&Path> = match (args.model, args.reference, args.candidate) {
        (_, Some(reference), Some(candidate)) => vec![reference, candidate],
        (Some(model), None, None) if !(args.max_flips.is_some() || args.max_acc_drop.is_some() || args.split) => {
            vec![model]
        }
        (Some(_), None, None) => anyhow::bail!(
            "--max-flips, --max-acc-drop and --split compare two models: give --reference REF --candidate CAND"
        ),
        _ => anyhow::bail!("give MODEL, or --reference REF --candidate CAND"),
    };
    let gates = TaskGates { max_flips: args.max_flips, max_acc_drop: args.max_acc_drop };
    let report = if paired {
        let options = PairedOptions { num_fewshot: args.num_fewshot, gates, split: args.split };
        let report = run_paired((models[0], models[1]), &tasks, options, backend.as_ref(), &bar);
        TaskMerge::Paired(Box::new(report.with_context(|| format!("--task {}", path.display()))?))
    } else {
        let report = run((models[0], None), &tasks, args.num_fewshot, backend.as_ref(), &bar);
        TaskMerge::One(report.with_context(|| format!("--task {}", path.display()))?)
    };
    if let Some(stats) = args.save_stats {
        let checkpoints = models.iter().map(|dir| Model::open(dir)).collect::<Result<Vec<_>, _>>()?;
        let checkpoints: Vec<_> = checkpoints.iter().map(Model::checkpoint).collect();
        let identity = PartIdentity::of(&items, &checkpoints, part, range.clone());
        let options = json!({ "paired": paired, "num_fewshot": args.num_fewshot, "split": args.split, "gates": gates });
        let report = match &report {
            TaskMerge::One(report) => serde_json::to_value(report)?,
            TaskMerge::Paired(report) => serde_json::to_value(report)?,
        };
        parts::write(stats, &identity, options, report).with_context(|| format!("--save-stats {}", stats.display()))?;
    }
    if let Some(part) = args.part {
        eprintln!(
            "part {part}: items {}..{} of {} scored and saved; `squeeze merge-eval` joins the parts and applies the \
             gates",
            range.start,
            range.end,
            items.len()
        );
    }
    // A part applies no gate: merge-eval does, over all the items.
    show(&report, args.json, args.part.is_none())
}

/// Prints `report` (JSON or tables) and, when `gated`, the failed gates; the outcome they make.
pub(super) fn show(report: &TaskMerge, json: bool, gated: bool) -> anyhow::Result<Outcome> {
    match report {
        TaskMerge::One(report) => {
            if json {
                print_json(report)?;
            } else {
                print_report(report);
            }
            Ok(Outcome::Success)
        }
        TaskMerge::Paired(report) => {
            if json {
                print_json(report)?;
            } else {
                print_paired(report);
            }
            if !gated {
                return Ok(Outcome::Success);
            }
            for failure in &report.failures {
                eprintln!("{failure}");
            }
            Ok(if report.failures.is_empty() { Outcome::Success } else { Outcome::GateFailed })
        }
    }
}

fn percent(value: f64, stderr: f64) -> String {
    format!("{:.2} ± {:.2} %", value * 100.0, stderr * 100.0)
}

fn print_report(report: &TaskReport) {
    let mut table = Table::new(&["task", "kind", "items", "metric", "score"]);
    for task in &report.tasks {
        for metric in &task.metrics {
            table.row(vec![
                task.task.clone(),
                task.kind.clone(),
                task.items.len().to_string(),
                metric.metric.clone(),
                percent(metric.value, metric.stderr),
            ]);
        }
    }
    println!("{}", table.render().trim_end());
    println!(
        "{}: {} items, {}-shot, {:.1} s ({:.2} items/s, {:.0} tokens/s through the model) on {}",
        report.model,
        report.items,
        report.num_fewshot,
        report.seconds,
        report.items_per_second,
        report.tokens_per_second,
        report.backend
    );
}

fn print_paired(report: &PairedReport) {
    let mut table = Table::new(&[
        "task",
        "metric",
        "items",
        "reference",
        "candidate",
        "right→wrong",
        "wrong→right",
        "agree",
        "McNemar p",
    ]);
    for metric in &report.comparison {
        table.row(vec![
            metric.task.clone(),
            metric.metric.clone(),
            metric.items.to_string(),
            percent(metric.reference, metric.reference_stderr),
            percent(metric.candidate, metric.candidate_stderr),
            metric.right_to_wrong.to_string(),
            metric.wrong_to_right.to_string(),
            format!("{:.1} %", metric.agreement * 100.0),
            format!("{:.3}", metric.mcnemar_p),
        ]);
    }
    println!("{}", table.render().trim_end());
    println!(
        "reference {} ({:.1} s), candidate {} ({:.1} s{}); {}-shot; McNemar's exact test on the flipped items: a \
         small p says the flips lean one way more than chance would",
        report.reference.model,
        report.reference.seconds,
        report.candidate.model,
        report.candidate.seconds,
        if report.split { ", its generations prefilled on the reference" } else { "" },
        report.num_fewshot
    );
}

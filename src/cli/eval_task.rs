//! `squeeze eval --task FILE`: the task benchmarks' arguments (on `eval`'s [`super::eval::Args`]) and output — one
//! model's accuracies, or two models' paired comparison with its gates (exit 1 naming the failed gate).

use std::path::Path;

use anyhow::Context;

use crate::eval::tasks::paired::TaskGates;
use crate::eval::tasks::{file, run, run_paired, PairedOptions, PairedReport, TaskReport};
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
}

pub fn run_tasks(args: TaskArgs, path: &Path) -> anyhow::Result<Outcome> {
    let tasks = file::read(path).map_err(anyhow::Error::msg)?;
    let backend = super::output::open_backend(args.device)?;
    let bar = Bar::new(false);
    if let (Some(reference), Some(candidate)) = (args.reference, args.candidate) {
        let gates = TaskGates { max_flips: args.max_flips, max_acc_drop: args.max_acc_drop };
        let options = PairedOptions { num_fewshot: args.num_fewshot, gates, split: args.split };
        let report = run_paired((reference, candidate), &tasks, options, backend.as_ref(), &bar)
            .with_context(|| format!("--task {}", path.display()))?;
        if args.json {
            print_json(&report)?;
        } else {
            print_paired(&report);
        }
        for failure in &report.failures {
            eprintln!("{failure}");
        }
        return Ok(if report.failures.is_empty() { Outcome::Success } else { Outcome::GateFailed });
    }
    if args.max_flips.is_some() || args.max_acc_drop.is_some() || args.split {
        anyhow::bail!(
            "--max-flips, --max-acc-drop and --split compare two models: give --reference REF --candidate CAND"
        );
    }
    let Some(model) = args.model else { anyhow::bail!("give MODEL, or --reference REF --candidate CAND") };
    let report = run((model, None), &tasks, args.num_fewshot, backend.as_ref(), &bar)
        .with_context(|| format!("--task {}", path.display()))?;
    if args.json {
        print_json(&report)?;
    } else {
        print_report(&report);
    }
    Ok(Outcome::Success)
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
                task.kind.into(),
                task.items.len().to_string(),
                metric.metric.into(),
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

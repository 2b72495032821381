//! `eval --task FILE --part I/N --save-stats FILE`: a part scores a contiguous run of the file's scored items (in
//! file order, across its tasks; every part keeps every task's few-shot examples) and saves its per-item results;
//! `merge-eval` joins the parts' items into the report one run gives — metrics, pairing and gates recomputed from
//! the items, in file order.

use std::ops::Range;
use std::path::Path;

use serde_json::{json, Value};

use super::file::TaskFile;
use super::{paired, score_task, PairedReport, TaskReport, TaskScore};
use crate::io::stats_file::StatsFile;
use crate::io::IoError;
use crate::part::{Part, PartIdentity};

/// What merged parts make: one model's report, or two models' paired one.
#[derive(Debug, Clone)]
pub enum TaskMerge {
    One(TaskReport),
    Paired(Box<PairedReport>),
}

/// The items part `part` scores: `file` with each task's scored items cut to the part's share of all scored items
/// (tasks left without one dropped), the range of that share, and every scored item as bytes (for the identity).
pub fn select(file: &TaskFile, part: Part) -> (TaskFile, Range<usize>, Vec<Vec<u32>>) {
    let total: usize = file.tasks.iter().map(|task| task.items.len()).sum();
    let range = part.range(total);
    let mut index = 0;
    let mut selected = file.clone();
    for task in &mut selected.tasks {
        task.items.retain(|_| {
            index += 1;
            range.contains(&(index - 1))
        });
    }
    selected.tasks.retain(|task| !task.items.is_empty());
    let items = file
        .tasks
        .iter()
        .flat_map(|task| &task.items)
        .map(|item| format!("{}\u{0}{}", item.context, item.answer.shown()).bytes().map(u32::from).collect())
        .collect();
    (selected, range, items)
}

/// Writes part `identity`'s statistics file: `options` (what must agree between parts) and its `report`.
pub fn write(path: &Path, identity: &PartIdentity, options: Value, report: Value) -> Result<(), IoError> {
    StatsFile::new(json!({ "kind": "tasks", "identity": identity, "run": options, "report": report })).write(path)
}

/// Joins the parts' reports (in part order) made with `options` (`{"paired", "gates", …}`).
pub fn merge(reports: &[&Value], options: &Value) -> Result<TaskMerge, String> {
    if options.get("paired").and_then(Value::as_bool).unwrap_or(false) {
        let parts: Vec<PairedReport> = reports
            .iter()
            .map(|report| {
                serde_json::from_value((*report).clone()).map_err(|e| format!("not a paired task report: {e}"))
            })
            .collect::<Result<_, String>>()?;
        let reference = join(parts.iter().map(|part| &part.reference).collect())?;
        let candidate = join(parts.iter().map(|part| &part.candidate).collect())?;
        let shape = |report: &TaskReport| -> Vec<(String, usize)> {
            report.tasks.iter().map(|task| (task.task.clone(), task.items.len())).collect()
        };
        if shape(&reference) != shape(&candidate) {
            return Err("its reference and candidate scored different tasks or items".into());
        }
        let gates: paired::TaskGates = serde_json::from_value(options["gates"].clone()).unwrap_or_default();
        let comparison = paired::compare(&reference.tasks, &candidate.tasks);
        let failures = paired::failures(&comparison, gates);
        let first = &parts[0];
        return Ok(TaskMerge::Paired(Box::new(PairedReport {
            task_file: first.task_file.clone(),
            num_fewshot: first.num_fewshot,
            split: first.split,
            reference,
            candidate,
            comparison,
            failures,
        })));
    }
    let parts: Vec<TaskReport> = reports
        .iter()
        .map(|report| serde_json::from_value((*report).clone()).map_err(|e| format!("not a task report: {e}")))
        .collect::<Result<_, String>>()?;
    Ok(TaskMerge::One(join(parts.iter().collect())?))
}

/// One report from the parts' reports of one model: each task's items in part order, its metrics recomputed; times
/// summed.
fn join(parts: Vec<&TaskReport>) -> Result<TaskReport, String> {
    let first = parts.first().ok_or("no part")?;
    let mut tasks: Vec<(String, String, Vec<super::ItemScore>)> = Vec::new();
    for task in parts.iter().flat_map(|part| &part.tasks) {
        let TaskScore { task: name, kind, items, .. } = task.clone();
        match tasks.iter_mut().find(|(known, _, _)| *known == name) {
            Some((_, _, known)) => known.extend(items),
            None => tasks.push((name, kind, items)),
        }
    }
    for (name, _, items) in &tasks {
        let metrics =
            |item: &super::ItemScore| -> Vec<String> { item.metrics.iter().map(|m| m.metric.clone()).collect() };
        if let Some(first) = items.first() {
            if items.iter().any(|item| metrics(item) != metrics(first)) {
                return Err(format!("task `{name}` has items scored on different metrics"));
            }
        }
    }
    let tasks: Vec<TaskScore> = tasks.into_iter().map(|(name, kind, items)| score_task(name, kind, items)).collect();
    let seconds: f64 = parts.iter().map(|part| part.seconds).sum();
    let names = (first.model.clone(), first.task_file.clone(), first.backend.clone());
    Ok(TaskReport::new(names, first.num_fewshot, tasks, seconds))
}

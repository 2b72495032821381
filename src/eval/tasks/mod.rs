//! `squeeze eval --task FILE`: task benchmarks on the reference runtime, scored as lm-evaluation-harness scores
//! them — multiple choice by log-likelihood (`acc`, `acc_norm`, [`choice`]) and generation with exact match
//! ([`generate`]) — on items the user brings in a JSON Lines file ([`file`]); with two models, paired per item
//! ([`paired`]): the flips both ways and McNemar's exact test.

pub mod choice;
pub mod file;
pub mod generate;
pub mod paired;
pub mod parts;
pub mod prompt;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::arch::paged::PagedModel;
use crate::arch::Model;
use crate::job_error::JobError;
use crate::model::tokenizer::Tokenizer;
use crate::progress::Reporter;
use crate::runtime::Backend;
use file::TaskFile;

/// One metric's outcome on one item: what the model predicted for it (a choice index, or the extracted answer)
/// and whether that is right.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricOutcome {
    pub metric: String,
    pub prediction: String,
    pub correct: bool,
}

/// One item's scores.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemScore {
    /// 1-based line of the task file.
    pub line: usize,
    pub metrics: Vec<MetricOutcome>,
    /// Tokens run through the model for it: its context once and each choice's continuation but the last token
    /// (multiple choice), the prompt and the generated tokens (generation).
    pub tokens: usize,
    /// Multiple choice: each choice's summed log-likelihood, and whether greedy decoding would produce it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loglikelihoods: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub greedy: Vec<bool>,
    /// Generation: the completion, cut before its stop sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<String>,
}

/// A metric over a task's items: the mean and its standard error (the harness's: sample variance over n − 1).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricScore {
    pub metric: String,
    pub value: f64,
    pub stderr: f64,
}

/// One task on one model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskScore {
    pub task: String,
    /// `multiple_choice` or `generate_until` (the harness's output types).
    pub kind: String,
    pub metrics: Vec<MetricScore>,
    pub items: Vec<ItemScore>,
}

/// One model on a task file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskReport {
    pub model: String,
    pub task_file: String,
    pub backend: String,
    pub num_fewshot: usize,
    pub tasks: Vec<TaskScore>,
    pub items: usize,
    /// Tokens run through the model ([`ItemScore::tokens`] summed).
    pub tokens: usize,
    pub seconds: f64,
    pub items_per_second: f64,
    pub tokens_per_second: f64,
}

/// Two models on a task file, item by item.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairedReport {
    pub task_file: String,
    pub num_fewshot: usize,
    /// `--split`: the candidate's generations were prefilled on the reference.
    pub split: bool,
    pub reference: TaskReport,
    pub candidate: TaskReport,
    pub comparison: Vec<paired::PairedMetric>,
    /// The failed gates (`--max-flips`, `--max-acc-drop`), in words; empty when all passed.
    pub failures: Vec<String>,
}

/// How a paired run goes: few-shot examples, gates, and whether the candidate's generations are prefilled on the
/// reference (`--split`).
#[derive(Debug, Clone, Copy, Default)]
pub struct PairedOptions {
    pub num_fewshot: usize,
    pub gates: paired::TaskGates,
    pub split: bool,
}

/// Runs `file` on `reference` and `candidate` and pairs their items.
pub fn run_paired(
    (reference_dir, candidate_dir): (&Path, &Path),
    file: &TaskFile,
    options: PairedOptions,
    backend: &dyn Backend,
    reporter: &dyn Reporter,
) -> Result<PairedReport, JobError> {
    let PairedOptions { num_fewshot, gates, split } = options;
    let reference = run((reference_dir, None), file, num_fewshot, backend, reporter)?;
    let prefill = split.then_some(reference_dir);
    let candidate = run((candidate_dir, prefill), file, num_fewshot, backend, reporter)?;
    let comparison = paired::compare(&reference.tasks, &candidate.tasks);
    let failures = paired::failures(&comparison, gates);
    Ok(PairedReport {
        task_file: file.path.display().to_string(),
        num_fewshot,
        split,
        reference,
        candidate,
        comparison,
        failures,
    })
}

/// Runs every task of `file` on the model in `dir`, `num_fewshot` examples before each item; with `prefill`, the
/// generation tasks' prompts are prefilled on that model and decoded on `dir`'s (the split deployment).
pub fn run(
    (dir, prefill): (&Path, Option<&Path>),
    file: &TaskFile,
    num_fewshot: usize,
    backend: &dyn Backend,
    reporter: &dyn Reporter,
) -> Result<TaskReport, JobError> {
    let started = Instant::now();
    let tokenizer = Tokenizer::from_dir(dir).map_err(|e| JobError::Input(e.to_string()))?;
    let input = JobError::Input;
    let model = Model::open(dir)?;
    let raw = model.checkpoint().config();
    let eos: BTreeSet<u32> = crate::serve::eos_ids(raw);
    let bos = raw.and_then(|c| c.get("bos_token_id")).and_then(serde_json::Value::as_u64).map(|v| v as u32);
    let prefix = bos.or_else(|| eos.first().copied());
    let mut tasks = Vec::with_capacity(file.tasks.len());
    for task in &file.tasks {
        let items = if task.is_generation() {
            let longest = generate::longest(task, &tokenizer, num_fewshot).map_err(input)?;
            let decoder = PagedModel::open(dir, longest)?;
            let prefiller = prefill.map(|prefill| PagedModel::open(prefill, longest)).transpose()?;
            if let (Some(prefiller), Some(prefill)) = (&prefiller, prefill) {
                if !prefiller.hands_over_to(&decoder) {
                    return Err(input(format!(
                        "--split: {} and {} cache different layers or widths; prefill and decode must be the same \
                         architecture",
                        prefill.display(),
                        dir.display()
                    )));
                }
            }
            let models = (&decoder, prefiller.as_ref());
            generate::score(models, backend, &tokenizer, (task, num_fewshot), &eos).map_err(input)?
        } else {
            choice::score(&model, backend, &tokenizer, (task, num_fewshot, prefix), reporter).map_err(input)?
        };
        tasks.push(summarize(task, items));
    }
    let (model, task_file) = (dir.display().to_string(), file.path.display().to_string());
    let seconds = started.elapsed().as_secs_f64();
    Ok(TaskReport::new((model, task_file, backend.describe()), num_fewshot, tasks, seconds))
}

impl TaskReport {
    /// The report of `tasks` on `model` (its name, the task file's and the backend's), with the item and token
    /// counts and rates.
    pub fn new(
        (model, task_file, backend): (String, String, String),
        num_fewshot: usize,
        tasks: Vec<TaskScore>,
        seconds: f64,
    ) -> Self {
        let items: usize = tasks.iter().map(|t| t.items.len()).sum();
        let tokens: usize = tasks.iter().flat_map(|t| &t.items).map(|item| item.tokens).sum();
        Self {
            model,
            task_file,
            backend,
            num_fewshot,
            tasks,
            items,
            tokens,
            seconds,
            items_per_second: items as f64 / seconds.max(1e-9),
            tokens_per_second: tokens as f64 / seconds.max(1e-9),
        }
    }
}

/// The task's metrics over its items.
fn summarize(task: &file::Task, items: Vec<ItemScore>) -> TaskScore {
    let kind = if task.is_generation() { "generate_until" } else { "multiple_choice" };
    score_task(task.name.clone(), kind.into(), items)
}

/// A task's score from its items: each metric's mean and standard error.
pub fn score_task(task: String, kind: String, items: Vec<ItemScore>) -> TaskScore {
    let names: Vec<String> = items.first().map_or(Vec::new(), |i| i.metrics.iter().map(|m| m.metric.clone()).collect());
    let metrics = names
        .into_iter()
        .enumerate()
        .map(|(index, metric)| {
            let flags: Vec<bool> = items.iter().map(|item| item.metrics[index].correct).collect();
            let (value, stderr) = mean_and_stderr(&flags);
            MetricScore { metric, value, stderr }
        })
        .collect();
    TaskScore { task, kind, metrics, items }
}

/// The share of `true` and its standard error `sqrt(s² / n)` with the sample variance `s²` (n − 1), as the
/// harness's `mean_stderr`; 0 for fewer than two items.
pub fn mean_and_stderr(flags: &[bool]) -> (f64, f64) {
    let n = flags.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = flags.iter().filter(|&&f| f).count() as f64 / n as f64;
    if n < 2 {
        return (mean, 0.0);
    }
    let variance = flags.iter().map(|&f| (f as u8 as f64 - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, (variance / n as f64).sqrt())
}

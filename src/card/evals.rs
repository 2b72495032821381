//! The `squeeze eval --json` reports a card shows: a parity report whose candidate is the folder, or a perplexity
//! report of the folder or of another model (the source, say, for comparison), read and summarized.

use std::fs;
use std::path::Path;

use serde_json::Value;

use super::facts::model_name;
use crate::io::card_record::{EvalRecord, EvalResult, ParityMode, TaskRow};
use crate::io::checkpoint::read_json;
use crate::io::IoError;
use crate::parity::{Gates, Mode};

/// Reads the report at `path` for the folder `dir`: a parity report must have `dir` as its candidate (the path it
/// names is the folder, or no longer exists and has its name).
pub fn read(path: &Path, dir: &Path) -> Result<EvalRecord, IoError> {
    let report = read_json(path)?;
    let refuse = |problem: String| IoError::folder(path, problem);
    let file = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let text = |key: &str| -> Result<String, IoError> {
        report
            .get(key)
            .and_then(Value::as_str)
            .map(String::from)
            .ok_or_else(|| refuse(format!("has no string `{key}`; give the JSON of `squeeze eval … --json`")))
    };
    let count = |value: &Value, key: &str| -> Result<usize, IoError> {
        value
            .get(key)
            .and_then(Value::as_u64)
            .map(|n| n as usize)
            .ok_or_else(|| refuse(format!("has no count `{key}`; give the JSON of `squeeze eval … --json`")))
    };
    let number = |value: &Value, key: &str| -> Result<f64, IoError> {
        value
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| refuse(format!("has no number `{key}`; give the JSON of `squeeze eval … --json`")))
    };
    let result = if let Some(modes) = report.get("modes").and_then(Value::as_object) {
        let (reference, candidate) = (text("reference")?, text("candidate")?);
        if !names_folder(&candidate, dir) {
            return Err(refuse(format!(
                "is the parity of {candidate} against {reference}, not of {}; give the JSON of `squeeze eval \
                 --reference REF --candidate {} --json`",
                dir.display(),
                dir.display()
            )));
        }
        let mut rows = Vec::new();
        for mode in Mode::ALL {
            let Some(summary) = modes.get(mode.name()) else { continue };
            rows.push(ParityMode {
                mode: mode.name().to_string(),
                tokens: count(summary, "tokens")?,
                mean_kld: number(summary, "mean_kld")?,
                mean_kld_stderr: number(summary, "mean_kld_stderr")?,
                same_top: number(summary, "same_top")?,
                same_top_stderr: number(summary, "same_top_stderr")?,
                ppl: number(summary, "ppl")?,
                ppl_stderr: number(summary, "ppl_stderr")?,
                ppl_ratio: number(summary, "ppl_ratio")?,
                ppl_ratio_stderr: number(summary, "ppl_ratio_stderr")?,
            });
        }
        if rows.is_empty() {
            return Err(refuse("has no parity mode (reference, kv, weights, split) in `modes`".into()));
        }
        let gates: Gates = report
            .get("gates")
            .cloned()
            .and_then(|gates| serde_json::from_value(gates).ok())
            .ok_or_else(|| refuse("has no `gates`; give the JSON of `squeeze eval … --json`".into()))?;
        let kv = report.get("kv_scales").cloned().unwrap_or(Value::Null);
        let field = |key: &str| kv.get(key).and_then(Value::as_str).unwrap_or("unknown").to_string();
        let failed = report
            .get("failures")
            .and_then(Value::as_array)
            .map(|failures| {
                failures
                    .iter()
                    .map(|failure| {
                        let field = |key: &str| failure.get(key).and_then(Value::as_str).unwrap_or("?");
                        format!("{} ({})", field("gate"), field("mode"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        EvalResult::Parity {
            reference: model_name(&reference),
            chunks: count(&report, "chunks")?,
            ctx: count(&report, "ctx")?,
            prompt: count(&report, "prompt")?,
            kv_scales: field("applied"),
            engine: field("engine"),
            modes: rows,
            gates,
            failed,
        }
    } else if let Some(rows) = report.get("comparison").and_then(Value::as_array) {
        let side = |key: &str| report.get(key).and_then(|side| side.get("model")).and_then(Value::as_str);
        let (Some(reference), Some(candidate)) = (side("reference"), side("candidate")) else {
            return Err(refuse(
                "names no `reference.model` and `candidate.model`; give the JSON of `squeeze eval \
                               --reference REF --candidate CAND --task FILE --json`"
                    .into(),
            ));
        };
        if !names_folder(candidate, dir) {
            return Err(refuse(format!(
                "compares {candidate} with {reference} on tasks, not {}; give the JSON of `squeeze eval --reference \
                 REF --candidate {} --task FILE --json`",
                dir.display(),
                dir.display()
            )));
        }
        let rows = rows
            .iter()
            .map(|row| serde_json::from_value::<TaskRow>(row.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| refuse(format!("has a `comparison` row that is not a task comparison: {e}")))?;
        let failed = report
            .get("failures")
            .and_then(Value::as_array)
            .map(|failures| failures.iter().filter_map(Value::as_str).map(String::from).collect())
            .unwrap_or_default();
        EvalResult::Tasks {
            reference: model_name(reference),
            task_file: model_name(&text("task_file")?),
            num_fewshot: count(&report, "num_fewshot")?,
            rows,
            failed,
        }
    } else if report.get("ppl").is_some() {
        let model = text("model")?;
        EvalResult::Perplexity {
            model: (!names_folder(&model, dir)).then(|| model_name(&model)),
            chunks: count(&report, "chunks")?,
            ctx: count(&report, "ctx")?,
            tokens: count(&report, "tokens")?,
            ppl: number(&report, "ppl")?,
            ppl_stderr: number(&report, "ppl_stderr")?,
            mean_nll: number(&report, "mean_nll")?,
            mean_nll_stderr: number(&report, "mean_nll_stderr")?,
        }
    } else {
        return Err(refuse(
            "is neither a parity report (`modes`), a task comparison (`comparison`) nor a perplexity report (`ppl`) \
             of `squeeze eval --json`"
                .into(),
        ));
    };
    Ok(EvalRecord { report: file, result })
}

/// Whether the model path a report recorded is the folder `dir`: the same folder when the path exists, else
/// (moved, or recorded relative to another working folder) the same folder name.
fn names_folder(recorded: &str, dir: &Path) -> bool {
    let recorded = Path::new(recorded);
    match (fs::canonicalize(recorded), fs::canonicalize(dir)) {
        (Ok(a), Ok(b)) => a == b,
        (Err(_), Ok(b)) => recorded.file_name().is_some() && recorded.file_name() == b.file_name(),
        _ => false,
    }
}

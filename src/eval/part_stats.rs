//! The raw statistics of one part of a split evaluation (`eval --part I/N --save-stats FILE`): which chunks it
//! scored and of what input and models, its per-position NLLs (one model) or per-position KLD, Δp, NLLs and top-1
//! flags plus per-layer, per-chunk error sums (parity), and with `--mtp` the MTP drafts' per-position statistics
//! (one model's, or both models'); and `merge-eval`, which checks the parts against each other and recomputes the
//! report one run gives, in the same order of summation, so to the bit.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::kld_stats::TokenSamples;
use super::mtp::{report_of, DraftParity, DraftStats};
use super::parity::{summarize, KvScalesUsed, LayerSums, ModeStats, ParityReport, ParityStats, Summaries};
use super::{EvalReport, NllStats};
use crate::io::stats_file::StatsFile;
use crate::io::IoError;
use crate::job_error::JobError;
use crate::parity::{Gates, Mode};
use crate::part::{check_parts, PartEntry, PartIdentity as Identity, PartsError};

/// The chunks a part scores, and their range.
pub fn select(
    all: &[Vec<u32>],
    part: Option<crate::part::Part>,
) -> Result<(Vec<Vec<u32>>, std::ops::Range<usize>), JobError> {
    crate::part::select(all, part).map_err(JobError::Input)
}

/// The fields of a one-model report that are not statistics (part 1's are kept; times are summed).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalRun {
    pub model: String,
    pub architecture: String,
    pub backend: String,
    pub ctx: usize,
    pub layers: usize,
    pub seconds: f64,
    pub load_seconds: f64,
    pub compute_seconds: f64,
    pub near_ties: usize,
    /// `--mtp`: the MTP layer whose drafts the part scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp_layer: Option<usize>,
    /// `--mtp-depth`: the chained drafts' depth (1: none).
    #[serde(default = "depth_one")]
    pub mtp_depth: usize,
    /// The report's warnings (chunks beyond the context window under `--allow-long-context`), kept by merge-eval.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `--mtp` in parity: the MTP layer, the chained drafts' depth and the drop gate.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct MtpRun {
    pub layer: usize,
    #[serde(default = "depth_one")]
    pub depth: usize,
    pub max_drop: f64,
}

/// The depth of part files written before `--mtp-depth`.
fn depth_one() -> usize {
    1
}

/// The fields of a parity report that are not statistics.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ParityRun {
    reference: String,
    candidate: String,
    architecture: String,
    ctx: usize,
    prompt: usize,
    missing_kv_scales: Vec<usize>,
    kv_scales: KvScalesUsed,
    gates: Gates,
    /// The requested modes.
    modes: Vec<Mode>,
    seconds: f64,
    /// The streams in file order (the reference first).
    streams: Vec<Mode>,
    rows_per_chunk: u64,
    moe_layers: Vec<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mtp: Option<MtpRun>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
}

/// Writes a one-model part's statistics (with `--mtp`, `drafts`: its drafts' scored positions).
pub fn write_eval(
    path: &Path,
    identity: &Identity,
    run: &EvalRun,
    stats: &NllStats,
    drafts: Option<&DraftStats>,
) -> Result<(), IoError> {
    let mut file = StatsFile::new(json!({ "kind": "eval", "identity": identity, "run": run }));
    file.put_f64("nll", stats.values.clone());
    if let Some(drafts) = drafts {
        put_drafts(&mut file, "mtp", drafts);
    }
    file.write(path)
}

/// Stores `samples` as `{prefix}.nll`, `.nll_base`, `.kld`, `.p_diff`, `.same_top`.
fn put_samples(file: &mut StatsFile, prefix: &str, samples: &TokenSamples) {
    file.put_f64(format!("{prefix}.nll"), samples.nll.clone());
    file.put_f64(format!("{prefix}.nll_base"), samples.nll_base.clone());
    file.put_f64(format!("{prefix}.kld"), samples.kld.clone());
    file.put_f64(format!("{prefix}.p_diff"), samples.p_diff.clone());
    file.put_u64(format!("{prefix}.same_top"), samples.same_top.iter().map(|&same| same as u64).collect());
}

/// Stores `drafts` as [`put_samples`] and, with chains, `{prefix}.accepted`.
fn put_drafts(file: &mut StatsFile, prefix: &str, drafts: &DraftStats) {
    put_samples(file, prefix, &drafts.samples);
    if !drafts.accepted.is_empty() {
        file.put_u64(format!("{prefix}.accepted"), drafts.accepted.clone());
    }
}

/// Appends a part's `{prefix}.*` drafts ([`put_drafts`]) chained `depth` deep to `drafts`.
fn extend_drafts(
    file: &StatsFile,
    path: &Path,
    prefix: &str,
    depth: usize,
    drafts: &mut DraftStats,
) -> Result<(), IoError> {
    extend_samples(file, path, prefix, &mut drafts.samples)?;
    if depth > 1 {
        drafts.accepted.extend_from_slice(file.u64(path, &format!("{prefix}.accepted"))?);
    }
    Ok(())
}

/// Appends a part's `{prefix}.*` samples ([`put_samples`]) to `samples`.
fn extend_samples(file: &StatsFile, path: &Path, prefix: &str, samples: &mut TokenSamples) -> Result<(), IoError> {
    samples.nll.extend_from_slice(file.f64(path, &format!("{prefix}.nll"))?);
    samples.nll_base.extend_from_slice(file.f64(path, &format!("{prefix}.nll_base"))?);
    samples.kld.extend_from_slice(file.f64(path, &format!("{prefix}.kld"))?);
    samples.p_diff.extend_from_slice(file.f64(path, &format!("{prefix}.p_diff"))?);
    samples.same_top.extend(file.u64(path, &format!("{prefix}.same_top"))?.iter().map(|&same| same != 0));
    Ok(())
}

/// Writes a parity part's statistics (with `--mtp`, `drafts`: the reference's and the candidate's drafts' scored
/// positions).
pub fn write_parity(
    path: &Path,
    identity: &Identity,
    modes: &[Mode],
    report: &ParityReport,
    stats: &ParityStats,
    drafts: Option<(&DraftStats, &DraftStats)>,
) -> Result<(), IoError> {
    let run = ParityRun {
        reference: report.reference.clone(),
        candidate: report.candidate.clone(),
        architecture: report.architecture.clone(),
        ctx: report.ctx,
        prompt: report.prompt,
        missing_kv_scales: report.missing_kv_scales.clone(),
        kv_scales: report.kv_scales.clone(),
        gates: report.gates,
        modes: modes.to_vec(),
        seconds: report.seconds,
        streams: stats.streams.iter().map(|stream| stream.mode).collect(),
        rows_per_chunk: stats.rows_per_chunk,
        moe_layers: stats.moe_layers.clone(),
        mtp: report.mtp.as_ref().map(|mtp| MtpRun {
            layer: mtp.reference.layer,
            depth: mtp.reference.chain.as_ref().map_or(1, |chain| chain.depth),
            max_drop: mtp.max_drop,
        }),
        warnings: report.warnings.clone(),
    };
    let mut file = StatsFile::new(json!({ "kind": "parity", "identity": identity, "run": run }));
    for stream in &stats.streams {
        let name = stream.mode.name();
        put_samples(&mut file, name, &stream.samples);
        for (layer, sums) in stream.layers.iter().enumerate() {
            file.put_f64(format!("{name}.layer.{layer}.difference"), sums.difference.clone());
            file.put_f64(format!("{name}.layer.{layer}.norm"), sums.norm.clone());
            file.put_u64(format!("{name}.layer.{layer}.same_routes"), sums.same_routes.clone());
        }
    }
    if let Some((reference, candidate)) = drafts {
        put_drafts(&mut file, "mtp.reference", reference);
        put_drafts(&mut file, "mtp.candidate", candidate);
    }
    file.write(path)
}

#[derive(Debug, thiserror::Error)]
pub enum MergeEvalError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Eval(#[from] JobError),
    #[error(transparent)]
    Parts(#[from] PartsError),
    #[error("{}: {problem}; the files were not written by `squeeze eval --save-stats`", path.display())]
    Format { path: PathBuf, problem: String },
}

/// The merged report.
#[derive(Debug, Clone)]
pub enum Merged {
    Eval {
        report: EvalReport,
        parts: usize,
    },
    Parity {
        report: ParityReport,
        parts: usize,
    },
    /// `eval --task` parts ([`super::tasks::parts`]).
    Tasks {
        report: super::tasks::parts::TaskMerge,
        parts: usize,
    },
}

struct PartFile {
    path: PathBuf,
    identity: Identity,
    kind: String,
    run: Value,
    file: StatsFile,
}

/// Reads, checks and merges the statistics files of every part of one evaluation (the part's number is read from
/// each file, so the order of `paths` does not matter).
pub fn merge(paths: &[PathBuf]) -> Result<Merged, MergeEvalError> {
    let parts = read_parts(paths)?;
    let first = &parts[0];
    let parts_count = first.identity.part.count;
    if first.kind == "tasks" {
        let reports: Vec<&Value> = parts.iter().map(|part| &part.file.header["report"]).collect();
        let report = super::tasks::parts::merge(&reports, &first.run)
            .map_err(|problem| MergeEvalError::Format { path: first.path.clone(), problem })?;
        return Ok(Merged::Tasks { report, parts: parts_count });
    }
    if first.kind == "eval" {
        let mut values = Vec::new();
        let mut drafts = DraftStats::default();
        let mut run: Option<EvalRun> = None;
        for part in &parts {
            values.extend_from_slice(part.file.f64(&part.path, "nll")?);
            let this: EvalRun = parse_run(part)?;
            if this.mtp_layer.is_some() {
                extend_drafts(&part.file, &part.path, "mtp", this.mtp_depth, &mut drafts)?;
            }
            run = Some(match run {
                None => this,
                Some(mut total) => {
                    total.seconds += this.seconds;
                    total.load_seconds += this.load_seconds;
                    total.compute_seconds += this.compute_seconds;
                    total.near_ties += this.near_ties;
                    total
                }
            });
        }
        let run = run.expect("at least one part");
        let stats = NllStats::from_values(values);
        let mut report = super::report(&run, first.identity.total_chunks, &stats, None);
        report.mtp = run.mtp_layer.map(|layer| report_of(&drafts, layer, run.mtp_depth));
        return Ok(Merged::Eval { report, parts: parts_count });
    }
    let runs: Vec<ParityRun> = parts.iter().map(parse_run).collect::<Result<_, _>>()?;
    let run = &runs[0];
    let mut streams: Vec<ModeStats> = run
        .streams
        .iter()
        .map(|&mode| ModeStats {
            mode,
            samples: TokenSamples::default(),
            layers: vec![LayerSums::default(); run.moe_layers.len()],
        })
        .collect();
    let (mut reference_drafts, mut candidate_drafts) = (DraftStats::default(), DraftStats::default());
    for part in &parts {
        let (file, path) = (&part.file, &part.path);
        for stream in &mut streams {
            let name = stream.mode.name();
            extend_samples(file, path, name, &mut stream.samples)?;
            for (layer, sums) in stream.layers.iter_mut().enumerate() {
                sums.difference.extend_from_slice(file.f64(path, &format!("{name}.layer.{layer}.difference"))?);
                sums.norm.extend_from_slice(file.f64(path, &format!("{name}.layer.{layer}.norm"))?);
                sums.same_routes.extend_from_slice(file.u64(path, &format!("{name}.layer.{layer}.same_routes"))?);
            }
        }
        if let Some(mtp) = run.mtp {
            extend_drafts(file, path, "mtp.reference", mtp.depth, &mut reference_drafts)?;
            extend_drafts(file, path, "mtp.candidate", mtp.depth, &mut candidate_drafts)?;
        }
    }
    let stats = ParityStats { streams, rows_per_chunk: run.rows_per_chunk, moe_layers: run.moe_layers.clone() };
    let Summaries { mode_reports, json_modes, mut failures } = summarize(&stats, &run.modes, &run.gates)?;
    let mtp = run.mtp.map(|MtpRun { layer, depth, max_drop }| {
        let (reference, candidate) =
            (report_of(&reference_drafts, layer, depth), report_of(&candidate_drafts, layer, depth));
        DraftParity::new(reference, candidate, max_drop)
    });
    failures.extend(mtp.as_ref().and_then(DraftParity::failure));
    let report = ParityReport {
        reference: run.reference.clone(),
        candidate: run.candidate.clone(),
        architecture: run.architecture.clone(),
        chunks: first.identity.total_chunks,
        ctx: run.ctx,
        prompt: run.prompt,
        missing_kv_scales: run.missing_kv_scales.clone(),
        kv_scales: run.kv_scales.clone(),
        modes: json_modes,
        gates: run.gates,
        failures,
        mtp,
        warnings: run.warnings.clone(),
        seconds: runs.iter().map(|run| run.seconds).sum(),
        mode_reports,
    };
    Ok(Merged::Parity { report, parts: parts_count })
}

fn parse_run<T: serde::de::DeserializeOwned>(part: &PartFile) -> Result<T, MergeEvalError> {
    serde_json::from_value(part.run.clone()).map_err(|e| MergeEvalError::Format {
        path: part.path.clone(),
        problem: format!("its header does not parse ({e})"),
    })
}

/// Reads every file and checks the parts (one kind of evaluation, then [`check_parts`]); returns them by part.
fn read_parts(paths: &[PathBuf]) -> Result<Vec<PartFile>, MergeEvalError> {
    let mut files = Vec::new();
    for path in paths {
        let file = StatsFile::read(path)?;
        let format = |problem: String| MergeEvalError::Format { path: path.clone(), problem };
        let kind = file.header.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
        if !["eval", "parity", "tasks"].contains(&kind.as_str()) {
            return Err(format(format!("it holds `{kind}` statistics, not eval's")));
        }
        let identity: Identity = serde_json::from_value(file.header.get("identity").cloned().unwrap_or_default())
            .map_err(|e| format(format!("its header has no part identity ({e})")))?;
        let run = file.header.get("run").cloned().unwrap_or_default();
        files.push(PartFile { path: path.clone(), identity, kind, run, file });
    }
    let entries = files
        .iter()
        .map(|file| PartEntry {
            path: file.path.clone(),
            identity: file.identity.clone(),
            options: serde_json::json!({ "kind": file.kind, "run": options_of(&file.run) }),
        })
        .collect();
    let ordered = check_parts(entries, "kind of evaluation or flags (--modes, --kv-scales, --engine, gates)")?;
    let mut by_path: Vec<Option<PartFile>> = files.into_iter().map(Some).collect();
    Ok(ordered
        .iter()
        .map(|entry| {
            let index = by_path
                .iter()
                .position(|file| {
                    file.as_ref().is_some_and(|file| file.identity == entry.identity && file.path == entry.path)
                })
                .expect("check_parts returns the entries it was given");
            by_path[index].take().expect("each entry once")
        })
        .collect())
}

/// The parts of a run header that decide the statistics (times and paths aside).
fn options_of(run: &Value) -> Value {
    let mut options = run.clone();
    if let Some(map) = options.as_object_mut() {
        for key in
            ["seconds", "load_seconds", "compute_seconds", "near_ties", "model", "reference", "candidate", "backend"]
        {
            map.remove(key);
        }
    }
    options
}

//! The raw statistics of one part of a split evaluation (`eval --part I/N --save-stats FILE`): which chunks it
//! scored and of what input and models, its per-position NLLs (one model) or per-position KLD, Δp, NLLs and top-1
//! flags plus per-layer, per-chunk error sums (parity); and `merge-eval`, which checks the parts against each
//! other and recomputes the report one run gives, in the same order of summation, so to the bit.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::parity::{
    summarize, Gates, KvScalesUsed, LayerSums, Mode, ModeStats, ParityReport, ParityStats, Summaries, TokenSamples,
};
use super::{EvalError, EvalReport, NllStats};
use crate::io::stats_file::StatsFile;
use crate::io::{Checkpoint, IoError};
use crate::part::Part;

/// What every part of one evaluation must agree on, and which chunks this one scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    pub version: String,
    pub part: Part,
    /// `[start, end)` of the chunks of the whole input.
    pub chunks: [usize; 2],
    pub total_chunks: usize,
    /// SHA-256 of every chunk's token ids (all parts read the whole input).
    pub input_sha256: String,
    /// The models' fingerprints (shard names, sizes and headers).
    pub models: Vec<String>,
}

impl Identity {
    pub fn of(all: &[Vec<u32>], models: &[&Checkpoint], part: Part, chunks: Range<usize>) -> Self {
        let mut hasher = Sha256::new();
        for sequence in all {
            hasher.update((sequence.len() as u64).to_le_bytes());
            for id in sequence {
                hasher.update(id.to_le_bytes());
            }
        }
        Identity {
            version: env!("CARGO_PKG_VERSION").into(),
            part,
            chunks: [chunks.start, chunks.end],
            total_chunks: all.len(),
            input_sha256: crate::io::writer::hex(&hasher.finalize()),
            models: models.iter().map(|checkpoint| checkpoint.fingerprint()).collect(),
        }
    }
}

/// The chunks `part` scores (all without a part), and their range.
pub fn select(all: &[Vec<u32>], part: Option<Part>) -> Result<(Vec<Vec<u32>>, Range<usize>), EvalError> {
    let part = part.unwrap_or(Part::WHOLE);
    if part.count > all.len() {
        return Err(EvalError::Input(format!(
            "--part {part}: the input has only {} chunk(s), so some parts would score nothing; use at most {} parts",
            all.len(),
            all.len()
        )));
    }
    let range = part.range(all.len());
    Ok((all[range.clone()].to_vec(), range))
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
}

/// Writes a one-model part's statistics.
pub fn write_eval(path: &Path, identity: &Identity, run: &EvalRun, stats: &NllStats) -> Result<(), IoError> {
    let mut file = StatsFile::new(json!({ "kind": "eval", "identity": identity, "run": run }));
    file.put_f64("nll", stats.values.clone());
    file.write(path)
}

/// Writes a parity part's statistics.
pub fn write_parity(
    path: &Path,
    identity: &Identity,
    modes: &[Mode],
    report: &ParityReport,
    stats: &ParityStats,
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
    };
    let mut file = StatsFile::new(json!({ "kind": "parity", "identity": identity, "run": run }));
    for stream in &stats.streams {
        let name = stream.mode.name();
        let samples = &stream.samples;
        file.put_f64(format!("{name}.nll"), samples.nll.clone());
        file.put_f64(format!("{name}.nll_base"), samples.nll_base.clone());
        file.put_f64(format!("{name}.kld"), samples.kld.clone());
        file.put_f64(format!("{name}.p_diff"), samples.p_diff.clone());
        file.put_u64(format!("{name}.same_top"), samples.same_top.iter().map(|&same| same as u64).collect());
        for (layer, sums) in stream.layers.iter().enumerate() {
            file.put_f64(format!("{name}.layer.{layer}.difference"), sums.difference.clone());
            file.put_f64(format!("{name}.layer.{layer}.norm"), sums.norm.clone());
            file.put_u64(format!("{name}.layer.{layer}.same_routes"), sums.same_routes.clone());
        }
    }
    file.write(path)
}

#[derive(Debug, thiserror::Error)]
pub enum MergeEvalError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Eval(#[from] EvalError),
    #[error("no statistics files given; pass the --save-stats FILE of every part")]
    Empty,
    #[error("{}: {problem}; the files were not written by `squeeze {command} --save-stats`", path.display())]
    Format { path: PathBuf, command: &'static str, problem: String },
    #[error("part {part} is missing: none of the files scored chunks {start}..{end}; run that part with --part {part} --save-stats FILE and merge again")]
    Missing { part: Part, start: usize, end: usize },
    #[error("part {part} appears twice, in {} and {}; give each part's file once", first.display(), second.display())]
    Duplicate { part: Part, first: PathBuf, second: PathBuf },
    #[error("part {part} ({}) was made with a different {what} than part {reference} ({}); rerun part {part} with the same models, input and flags as the others", path.display(), reference_path.display())]
    Mismatch { part: Part, path: PathBuf, reference: Part, reference_path: PathBuf, what: &'static str },
}

/// The merged report.
#[derive(Debug, Clone)]
pub enum Merged {
    Eval { report: EvalReport, parts: usize },
    Parity { report: ParityReport, parts: usize },
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
    let parts = read_parts(paths, "eval")?;
    let first = parts.values().next().expect("read_parts returns at least one part");
    let parts_count = first.identity.part.count;
    if first.kind == "eval" {
        let mut values = Vec::new();
        let mut run: Option<EvalRun> = None;
        for part in parts.values() {
            values.extend_from_slice(part.file.f64(&part.path, "nll")?);
            let this: EvalRun = parse_run(part, "eval")?;
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
        let report = super::report(&run, first.identity.total_chunks, &stats, None);
        return Ok(Merged::Eval { report, parts: parts_count });
    }
    let runs: Vec<ParityRun> = parts.values().map(|part| parse_run(part, "eval")).collect::<Result<_, _>>()?;
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
    for part in parts.values() {
        let (file, path) = (&part.file, &part.path);
        for stream in &mut streams {
            let name = stream.mode.name();
            let samples = &mut stream.samples;
            samples.nll.extend_from_slice(file.f64(path, &format!("{name}.nll"))?);
            samples.nll_base.extend_from_slice(file.f64(path, &format!("{name}.nll_base"))?);
            samples.kld.extend_from_slice(file.f64(path, &format!("{name}.kld"))?);
            samples.p_diff.extend_from_slice(file.f64(path, &format!("{name}.p_diff"))?);
            samples.same_top.extend(file.u64(path, &format!("{name}.same_top"))?.iter().map(|&same| same != 0));
            for (layer, sums) in stream.layers.iter_mut().enumerate() {
                sums.difference.extend_from_slice(file.f64(path, &format!("{name}.layer.{layer}.difference"))?);
                sums.norm.extend_from_slice(file.f64(path, &format!("{name}.layer.{layer}.norm"))?);
                sums.same_routes.extend_from_slice(file.u64(path, &format!("{name}.layer.{layer}.same_routes"))?);
            }
        }
    }
    let stats = ParityStats { streams, rows_per_chunk: run.rows_per_chunk, moe_layers: run.moe_layers.clone() };
    let Summaries { mode_reports, json_modes, failures } = summarize(&stats, &run.modes, &run.gates)?;
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
        seconds: runs.iter().map(|run| run.seconds).sum(),
        mode_reports,
    };
    Ok(Merged::Parity { report, parts: parts_count })
}

fn parse_run<T: serde::de::DeserializeOwned>(part: &PartFile, command: &'static str) -> Result<T, MergeEvalError> {
    serde_json::from_value(part.run.clone()).map_err(|e| MergeEvalError::Format {
        path: part.path.clone(),
        command,
        problem: format!("its header does not parse ({e})"),
    })
}

/// Reads every file and checks the parts: one kind, one version, input, model set and part count, flags that
/// decide the statistics equal, each part once, none missing, each with the chunks its number gives it.
fn read_parts(paths: &[PathBuf], command: &'static str) -> Result<BTreeMap<usize, PartFile>, MergeEvalError> {
    if paths.is_empty() {
        return Err(MergeEvalError::Empty);
    }
    let mut parts: BTreeMap<usize, PartFile> = BTreeMap::new();
    for path in paths {
        let file = StatsFile::read(path)?;
        let format = |problem: String| MergeEvalError::Format { path: path.clone(), command, problem };
        let kind = file.header.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
        if kind != "eval" && kind != "parity" {
            return Err(format(format!("it holds `{kind}` statistics, not eval's")));
        }
        let identity: Identity = serde_json::from_value(file.header.get("identity").cloned().unwrap_or_default())
            .map_err(|e| format(format!("its header has no part identity ({e})")))?;
        let run = file.header.get("run").cloned().unwrap_or_default();
        let part = identity.part;
        if let Some(first) = parts.get(&part.index) {
            if first.identity.part == part {
                return Err(MergeEvalError::Duplicate { part, first: first.path.clone(), second: path.clone() });
            }
        }
        let entry = PartFile { path: path.clone(), identity, kind, run, file };
        if let Some(existing) = parts.get(&part.index) {
            // Same index, other count: reported as a mismatch below against the lowest part.
            return Err(mismatch(&entry, existing, "part count"));
        }
        parts.insert(part.index, entry);
    }
    let reference = parts.values().next().expect("one path at least");
    for part in parts.values() {
        let (ours, theirs) = (&reference.identity, &part.identity);
        let differs = if part.kind != reference.kind {
            Some("kind of evaluation (one model vs --reference/--candidate)")
        } else if theirs.part.count != ours.part.count {
            Some("part count")
        } else if theirs.version != ours.version {
            Some("squeeze version")
        } else if theirs.models != ours.models {
            Some("model (shard names, sizes or headers)")
        } else if theirs.input_sha256 != ours.input_sha256 || theirs.total_chunks != ours.total_chunks {
            Some("input (token chunks, --ctx or --chunks)")
        } else if options_of(&part.run) != options_of(&reference.run) {
            Some("flags (--modes, --kv-scales, --engine or the gates)")
        } else {
            None
        };
        if let Some(what) = differs {
            return Err(mismatch(part, reference, what));
        }
        let expected = theirs.part.range(theirs.total_chunks);
        if theirs.chunks != [expected.start, expected.end] {
            return Err(mismatch(part, reference, "chunk split"));
        }
    }
    let count = reference.identity.part.count;
    for part in (Part { index: 1, count }).siblings() {
        if !parts.contains_key(&part.index) {
            let range = part.range(reference.identity.total_chunks);
            return Err(MergeEvalError::Missing { part, start: range.start, end: range.end });
        }
    }
    Ok(parts)
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

fn mismatch(part: &PartFile, reference: &PartFile, what: &'static str) -> MergeEvalError {
    MergeEvalError::Mismatch {
        part: part.identity.part,
        path: part.path.clone(),
        reference: reference.identity.part,
        reference_path: reference.path.clone(),
        what,
    }
}

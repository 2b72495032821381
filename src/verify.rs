//! `squeeze verify`: re-hash an output against its manifest, check every quantized tensor against the
//! compressed-tensors conventions, and with a source, dequantize both and measure per-tensor error
//! (`--engine` hands the folder to the `lint` rules as well).

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;

use crate::engines::lint::LintReport;
use crate::engines::EngineChoice;
use crate::format::compressed_tensors::{
    check_int4_conventions, fp4_modules, int4_args, int4_modules, Fp4Module, Int4Args, Int4Module,
};
use crate::format::row_reader::RowReader;
use crate::format::vendor_source::{items_from_checkpoint, SourceItem, SourceKind};
use crate::io::dtype::{first_nonfinite, Dtype};
use crate::io::manifest::Manifest;
use crate::io::writer::sha256_file;
use crate::io::{Checkpoint, IoError};

/// INT4 group quantization of smooth Gaussian-like weights lands near 0.1 relative L2 error; 0.25 means the
/// tensor is damaged (wrong scales, wrong packing order), not merely quantized.
pub const DEFAULT_MAX_INT4_ERROR: f64 = 0.25;
/// The INT4 limit for routed experts of a `--method gptq` output (when `--max-int4-error` is lower). GPTQ trades
/// weight error for output error on the calibration inputs: in input directions the calibration tokens hardly
/// excite, it moves rounding error freely, so an expert that saw fewer tokens than its input width (common: GLM-5's
/// experts read 6144 channels) lands at 0.3–0.45 relative L2 in weight space while its outputs on real inputs are
/// closer than round-to-nearest's; a damaged tensor (wrong packing order or scales) is at ≥ 1.
pub const GPTQ_MAX_INT4_ERROR: f64 = 0.75;
/// BF16 rounding alone gives at most 2^-9 relative error per element.
pub const MAX_BF16_ERROR: f64 = 1.0 / 256.0;

#[derive(Debug, Clone)]
pub struct VerifyOptions {
    pub output: PathBuf,
    pub source: Option<PathBuf>,
    pub max_int4_error: f64,
    pub worst: usize,
    /// Also check the engine load rules for these engines (`none`: skip them).
    pub engine: EngineChoice,
    /// Tensor-parallel size for the rules; `None`: `lint::default_tp` of the model.
    pub tp: Option<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TensorError {
    pub name: String,
    pub scheme: String,
    pub relative_l2: f64,
    pub max_abs: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub output: String,
    pub shards_checked: usize,
    pub quantized_tensors: usize,
    pub compared_tensors: usize,
    pub problems: Vec<String>,
    /// What was not checked and why (a folder not written by squeeze has no manifest to re-hash against).
    pub notes: Vec<String>,
    pub worst: Vec<TensorError>,
    /// The engine load rules (`None` without `--engine`).
    pub engine_rules: Option<LintReport>,
    pub passed: bool,
}

pub fn verify(options: &VerifyOptions) -> Result<VerifyReport, IoError> {
    let out = &options.output;
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let manifest = Manifest::read(out)?;
    let shards_checked = check_shards(out, manifest.as_ref(), &mut problems, &mut notes)?;
    // Opening the folder removes the lock of a run killed after it finished; a folder to upload must hold none.
    let locks = crate::io::lock::found(out);
    let checkpoint = Checkpoint::open(out)?;
    report_locks(out, locks, &mut problems, &mut notes);
    let packed = int4_modules(&checkpoint);
    let fp4 = fp4_modules(&checkpoint);
    let read = int4_args(checkpoint.config());
    let args = read.clone().unwrap_or_default();
    if let Err(problem) = read {
        problems.push(problem);
    } else if args.is_none() && (!packed.is_empty() || fp4.is_empty()) {
        problems.push("config.json has no compressed-tensors INT4 group in quantization_config".into());
    }
    for module in &packed {
        if let Err(problem) = check_int4_conventions(&checkpoint, module, args.as_ref()) {
            problems.push(problem);
        }
    }
    for module in &fp4 {
        if let Err(problem) = Fp4Module::read(&checkpoint, module) {
            problems.push(problem);
        }
    }
    // The weights agree with config.json (layers, shapes, MTP layers).
    if let Some(json) = checkpoint.config() {
        match crate::model::ModelConfig::from_json(json) {
            Ok(config) => problems.extend(crate::load::validate::mismatches(&checkpoint, &config)),
            Err(error) => problems.push(format!("config.json: {error}")),
        }
    }
    // Every float tensor finite (quantize refuses non-finite sources unless --allow-nonfinite); INT4 scales were
    // checked with their modules above.
    let int4_modules: std::collections::HashSet<&str> = packed.iter().chain(&fp4).map(String::as_str).collect();
    let names = checkpoint.names_in_file_order();
    let nonfinite: Vec<String> = names
        .par_iter()
        .filter(|name| {
            name.strip_suffix(".weight_scale")
                .is_none_or(|module| !int4_modules.contains(checkpoint.text_name(module).as_str()))
        })
        .filter_map(|name| {
            let tensor = checkpoint.get(name)?;
            let index = first_nonfinite(tensor.dtype, tensor.bytes)?;
            Some(format!("{name}: element {index} is NaN or infinite"))
        })
        .collect();
    problems.extend(nonfinite);

    // A GPTQ output's routed experts get the GPTQ limit (the manifest records the method).
    let gptq = manifest.as_ref().and_then(|m| m.expert_coverage.as_ref()).and_then(|c| c.get("method"))
        == Some(&serde_json::Value::String("gptq".into()));
    let (errors, compared) = match &options.source {
        Some(source_dir) => compare_with_source(options, source_dir, &checkpoint, args.as_ref(), gptq, &mut problems)?,
        None => (Vec::new(), 0),
    };
    let engines = options.engine.engines();
    let engine_rules = (!engines.is_empty()).then(|| {
        let description = crate::engines::lint::written::describe(&checkpoint);
        let tp = options.tp.unwrap_or_else(|| crate::engines::lint::default_tp(&description.config));
        crate::engines::lint::lint(&description, &engines, tp)
    });
    let rules_passed = engine_rules.as_ref().is_none_or(|rules| rules.passed);
    Ok(VerifyReport {
        output: out.display().to_string(),
        shards_checked,
        quantized_tensors: packed.len() + fp4.len(),
        compared_tensors: compared,
        passed: problems.is_empty() && rules_passed,
        problems,
        notes,
        worst: errors,
        engine_rules,
    })
}

/// The shards against the manifest's hashes and sizes (in parallel); a folder without a manifest (a vendor's or a
/// peer's) gets a note instead. Returns the shards checked.
fn check_shards(
    out: &Path,
    manifest: Option<&Manifest>,
    problems: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Result<usize, IoError> {
    let mut shards_checked = 0;
    match manifest {
        // A vendor's or a peer's checkpoint (Kimi K2.6 as Moonshot ships it): every other check still applies.
        None => notes.push(format!(
            "{}: no squeeze-manifest.json, so not written by squeeze quantize: shard hashes not checked",
            out.display()
        )),
        Some(manifest) => {
            if !manifest.complete {
                problems.push("manifest says the conversion did not finish; rerun quantize with --resume".into());
            }
            let results: Vec<Result<Option<String>, IoError>> = manifest
                .shards
                .par_iter()
                .map(|record| {
                    let path = out.join(&record.file);
                    if !path.exists() {
                        return Ok(Some(format!("{}: missing", record.file)));
                    }
                    let (bytes, sha256) = sha256_file(&path)?;
                    Ok(match &record.sha256 {
                        Some(expected) if *expected == sha256 && bytes == record.bytes => None,
                        Some(_) => {
                            Some(format!("{}: SHA-256 or size differs from the manifest ({bytes} bytes)", record.file))
                        }
                        None => Some(format!("{}: not recorded as finished in the manifest", record.file)),
                    })
                })
                .collect();
            for result in results {
                shards_checked += 1;
                if let Some(problem) = result? {
                    problems.push(problem);
                }
            }
        }
    }
    Ok(shards_checked)
}

/// The lock files found in the folder (before opening it removed those of gone runs): a note for each removed, a
/// problem for each left (a folder to upload must hold none).
fn report_locks(
    out: &Path,
    locks: Vec<crate::io::lock::FoundLock>,
    problems: &mut Vec<String>,
    notes: &mut Vec<String>,
) {
    for lock in locks {
        let still_there = out.join(&lock.name).exists();
        match (lock.gone, still_there) {
            (true, false) => notes.push(format!(
                "{}: held {} of a run that is gone ({}), killed after it finished writing; removed now, as a \
                 finished folder holds no lock (if a copy of this folder was uploaded, delete {} there too)",
                out.display(),
                lock.name,
                lock.holder,
                lock.name
            )),
            (true, true) => problems.push(format!(
                "{} is the lock of a run that is gone ({}) and could not be removed: remove it before uploading \
                 the folder",
                lock.name, lock.holder
            )),
            (false, _) => problems.push(format!(
                "{} is held by a squeeze run ({}): the folder is being written or the run's state is unknown \
                 (another host); wait for it to end before using or uploading the folder, or remove the file if \
                 that process is gone",
                lock.name, lock.holder
            )),
        }
    }
}

/// Every item of the source at `source_dir` compared with the output (in parallel): each tensor's relative error
/// against its scheme's limit (a GPTQ output's routed experts get the GPTQ limit), a problem for each over it.
/// Returns the `options.worst` largest errors and the number compared.
fn compare_with_source(
    options: &VerifyOptions,
    source_dir: &Path,
    checkpoint: &Checkpoint,
    args: Option<&Int4Args>,
    gptq: bool,
    problems: &mut Vec<String>,
) -> Result<(Vec<TensorError>, usize), IoError> {
    let mut errors = Vec::new();
    let mut compared = 0;
    let source = Checkpoint::open(source_dir)?;
    check_source(&source, source_dir)?;
    let items = items_from_checkpoint(&source)?;
    let measured: Vec<Result<Option<TensorError>, String>> =
        items.par_iter().map(|item| compare(&source, item, checkpoint, args)).collect();
    for result in measured {
        match result {
            Ok(Some(error)) => {
                compared += 1;
                let four_bit = matches!(error.scheme.as_str(), "int4" | "nvfp4" | "mxfp4");
                let limit = if error.scheme == "int4" && gptq && error.name.contains(".mlp.experts.") {
                    options.max_int4_error.max(GPTQ_MAX_INT4_ERROR)
                } else if four_bit {
                    options.max_int4_error
                } else if error.scheme == "bf16" {
                    MAX_BF16_ERROR
                } else {
                    0.0
                };
                if error.relative_l2.is_nan() || error.relative_l2 > limit {
                    problems.push(format!(
                        "{}: relative error {:.4} over the {} limit {limit}",
                        error.name, error.relative_l2, error.scheme
                    ));
                }
                errors.push(error);
            }
            Ok(None) => {}
            Err(problem) => problems.push(problem),
        }
    }
    errors.sort_by(|a, b| b.relative_l2.total_cmp(&a.relative_l2));
    errors.truncate(options.worst);
    Ok((errors, compared))
}

/// The `--source` checked against its own config.json as quantize checks its source
/// ([`crate::load::validate::check_source`]): comparing an output with a source whose config does not
/// belong to its weights proves nothing, so it is an error (exit 2) naming the tensor, not a failed check.
fn check_source(source: &Checkpoint, dir: &std::path::Path) -> Result<(), IoError> {
    let Some(json) = source.config() else { return Ok(()) };
    let named = |problem: String| IoError::folder(format!("--source {}", dir.display()), problem);
    let config = crate::model::ModelConfig::from_json(json).map_err(|error| named(format!("config.json: {error}")))?;
    crate::load::validate::check_source(source, &config).map_err(|error| named(error.to_string()))
}

/// Compares one source item with what the output holds for it.
fn compare(
    source: &Checkpoint,
    item: &SourceItem,
    output: &Checkpoint,
    args: Option<&Int4Args>,
) -> Result<Option<TensorError>, String> {
    let module = item.name.strip_suffix(".weight").unwrap_or(&item.name);
    let fp4 = output.get(&format!("{module}.weight_packed")).is_some_and(|packed| packed.dtype == Dtype::U8);
    let (scheme, got) = if fp4 {
        let fp4 = Fp4Module::read(output, module)?;
        if [fp4.rows, fp4.columns].as_slice() != item.shape.as_slice() {
            return Err(format!(
                "{module}: weight_packed holds [{}, {}] but the source has {:?}",
                fp4.rows, fp4.columns, item.shape
            ));
        }
        (fp4.kind.name(), fp4.dequantize())
    } else if let (true, Some(args)) = (output.contains(&format!("{module}.weight_packed")), args) {
        let int4 = Int4Module::read(output, module, args)?;
        let shape = [int4.rows, int4.columns];
        if shape.as_slice() != item.shape.as_slice() {
            return Err(format!("{module}: weight_shape {shape:?} but the source has {:?}", item.shape));
        }
        ("int4", int4.dequantize())
    } else if let Some(tensor) = output.get(&item.name) {
        if !item.is_fp8() && tensor.dtype == item.dtype {
            let original = source.get(&item.name).map(|t| t.bytes).unwrap_or_default();
            if original != tensor.bytes {
                return Err(format!("{}: copied tensor differs from the source", item.name));
            }
            return Ok(None);
        }
        if tensor.dtype == Dtype::F8_E4M3 {
            return Ok(None); // kept FP8: its bytes are the source's, checked by the manifest hash
        }
        let output_item = SourceItem {
            name: item.name.clone(),
            dtype: tensor.dtype,
            shape: tensor.shape.to_vec(),
            kind: SourceKind::Plain,
        };
        let values = RowReader::new(output, &output_item).map_err(|e| e.to_string())?.read_all();
        ("bf16", values)
    } else {
        return Err(format!("{}: in the source but not in the output", item.name));
    };
    let reference = RowReader::new(source, item).map_err(|e| e.to_string())?.read_all();
    if reference.len() != got.len() {
        return Err(format!("{}: {} values in the output, {} in the source", item.name, got.len(), reference.len()));
    }
    let (mut difference, mut norm, mut max_abs) = (0f64, 0f64, 0f64);
    for (a, b) in got.iter().zip(&reference) {
        let delta = (*a as f64) - (*b as f64);
        difference += delta * delta;
        norm += (*b as f64) * (*b as f64);
        max_abs = max_abs.max(delta.abs());
    }
    let relative_l2 = if norm > 0.0 { (difference / norm).sqrt() } else { difference.sqrt() };
    Ok(Some(TensorError { name: module.to_string(), scheme: scheme.into(), relative_l2, max_abs }))
}

//! Running a plan: tensors transformed in order on the rayon pool while a writer thread streams finished bytes into
//! shards (in the folder [`super::output_folder`] prepared), then config, index, companions, the model card and the
//! final manifest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use crate::engines::lint::{ConfigFix, LintReport};
use crate::io::lock::FolderLock;
use crate::io::manifest::{Manifest, RecipeRecord, ShardRecord, TensorRecord};
use crate::io::writer::{sha256_file, ShardWriter};
use crate::io::{Checkpoint, IoError};
use crate::plan::calibration::{
    routed_expert, Calibration, CalibrationOptions, CalibrationSet, ExpertCoverage, Method,
};
use crate::plan::prepare::{check_int4_source, prepare, Prepared};
use crate::plan::{transform, Action, ClassSummary, Plan, PlannedItem};
use crate::progress::{peak_rss_bytes, Reporter};
use crate::recipe::{Recipe, RecipeError};
use crate::runtime::device::{select, DeviceSelection};

use super::calibrate;
use super::calibrated::{self, CalibrationOutput};
use super::options::{ConvertError, QuantizeOptions};
use super::output_folder::{
    check_output, prepare_output, prepare_part_output, remove_leftover_temporaries, remove_own_temporaries,
};
use super::parts::{PartManifest, PartOptions};
use super::{engine_check, output_files, quant_config};

/// The result of `quantize` (or its dry run).
#[derive(Debug, Clone, serde::Serialize)]
pub struct QuantizeReport {
    pub dry_run: bool,
    pub input: PathBuf,
    pub output: PathBuf,
    pub architecture: Option<String>,
    pub recipe: String,
    pub input_bytes: u64,
    pub output_bytes: u64,
    pub tensors_quantized: usize,
    pub tensors_converted: usize,
    pub tensors_copied: usize,
    pub shards: usize,
    pub shards_reused: usize,
    pub seconds: f64,
    pub peak_rss_bytes: Option<u64>,
    pub classes: BTreeMap<String, ClassSummary>,
    /// The engine load rules checked on the plan (`None` with `--engine none`).
    pub engine_rules: Option<LintReport>,
    /// Keys added to the output's `config.json` because an engine needs them (safe, standard fixes).
    pub config_fixes: Vec<ConfigFix>,
    /// `--method imatrix|gptq`: calibration tokens per layer and routed expert, and the experts that fell back to
    /// mse.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_coverage: Option<ExpertCoverage>,
    /// `--method gptq --resume`: MoE layers whose quantized experts the interrupted run had finished (not redone).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration_layers_reused: Option<usize>,
    /// `--method gptq`: where GPTQ's algebra (Hessians, factors, column loops) ran: `host`, or `device` when the
    /// calibration pass ran on one (`--device cuda|emulated`); absent when no layer was quantized by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gptq_algebra: Option<&'static str>,
    /// `--part I/N`: what this part writes (`shards` and `output_bytes` above are the whole plan's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part: Option<PartSummary>,
}

/// The share of one part in a conversion.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PartSummary {
    /// `I/N`.
    pub part: String,
    /// Its shard files, in plan order.
    pub shards: Vec<String>,
    /// Bytes of those files.
    pub output_bytes: u64,
    /// Source tensor bytes it reads.
    pub input_bytes: u64,
    /// The part manifest it writes (`merge` reads it).
    pub manifest: String,
}

/// W4A4 NVFP4 rules need calibration (their `input_global_scale`), of routed experts only (what the pass
/// measures); `--calibration` with `--method rtn` needs such a rule (it calibrates nothing else).
fn check_activation_calibration(
    plan: &Plan,
    recipe: &Recipe,
    calibration: Option<&CalibrationOptions>,
) -> Result<(), ConvertError> {
    let invalid = |message: String| {
        Err(ConvertError::Recipe(RecipeError::Invalid { source_name: recipe.name().to_string(), message }))
    };
    let w4a4: Vec<&PlannedItem> =
        plan.items.iter().filter(|item| matches!(item.action, Action::Fp4 { fp4_activations: true, .. })).collect();
    if let Some(item) = w4a4.iter().find(|item| routed_expert(&item.source.name).is_none()) {
        return invalid(format!(
            "an nvfp4-w4a4 rule selects {}, which is not a routed expert's projection; W4A4 calibrates the routed \
             experts' inputs only: narrow the rule's match to `.mlp.experts.N.(gate|up|down)_proj.weight`",
            item.source.name
        ));
    }
    match (w4a4.first(), calibration.map(|c| c.method)) {
        (Some(item), None) => invalid(format!(
            "its nvfp4-w4a4 rule quantizes activations too (W4A4): {} needs an input_global_scale measured on \
             calibration text; pass --calibration FILE (text or input_ids), or use a weights-only nvfp4 recipe",
            item.module()
        )),
        (None, Some(Method::Rtn)) => Err(ConvertError::Recipe(RecipeError::Invalid {
            source_name: "--calibration".into(),
            message: format!(
                "with --method rtn, --calibration measures W4A4 activation scales only, and recipe {} has no \
                 nvfp4-w4a4 rule: drop --calibration, or pass --method imatrix or gptq for an int4 recipe",
                recipe.name()
            ),
        })),
        _ => Ok(()),
    }
}

/// Converts a checkpoint as the options say.
pub fn quantize(options: &QuantizeOptions, reporter: &dyn Reporter) -> Result<QuantizeReport, ConvertError> {
    let started = Instant::now();
    let mut checked = check(options)?;
    if options.dry_run {
        return Ok(checked.report.finished(started));
    }
    let opened = calibrate(options, &checked, reporter)?;
    let written = run(options, &mut checked, &opened, reporter)?;
    finish(options, checked, written, opened.lock, started)
}

/// What the check stage leaves: the plan, the output's config, the report so far and the shards this run writes.
struct Checked {
    prepared: Prepared,
    output_config: Option<(serde_json::Value, Vec<ConfigFix>)>,
    report: QuantizeReport,
    own_shards: std::ops::Range<usize>,
}

impl QuantizeReport {
    fn finished(mut self, started: Instant) -> Self {
        self.seconds = started.elapsed().as_secs_f64();
        self.peak_rss_bytes = peak_rss_bytes();
        self
    }
}

/// Stage 1, nothing written: opens and plans the source, checks what the recipe and flags ask for, builds the
/// output's config and lints it for the engines (refusing a failed plan unless it is a dry run).
fn check(options: &QuantizeOptions) -> Result<Checked, ConvertError> {
    let prepared = prepare(
        &options.input,
        options.recipe.as_deref(),
        options.group_size,
        options.scale_rule,
        options.max_shard_bytes,
    )?;
    let Prepared { checkpoint, config, recipe, plan } = &prepared;
    check_int4_source(plan, recipe, &options.input, config.as_ref())?;
    if !options.allow_inexact_cast {
        crate::plan::transform::check_casts(checkpoint, plan)?;
    }
    check_activation_calibration(plan, recipe, options.calibration.as_ref())?;
    if let (Some(calibration), Some(fp4)) = (
        options.calibration.as_ref().filter(|calibration| calibration.method != Method::Rtn),
        plan.items.iter().find(|item| matches!(item.action, Action::Fp4 { .. })),
    ) {
        return Err(ConvertError::Recipe(RecipeError::Invalid {
            source_name: "--method".into(),
            message: format!(
                "{} calibrates INT4 rules only; the recipe's {} rule selects {} (FP4 scales come from each group's \
                 absmax): drop --method or use an int4 recipe",
                format!("--method {:?}", calibration.method).to_lowercase(),
                fp4.action.name(),
                fp4.source.name
            ),
        }));
    }
    let output_config = checkpoint.config().map(|json| {
        let mut quantization_config = quant_config::quantization_config(plan, recipe);
        if options.calibration.as_ref().is_some_and(|c| c.method == Method::Imatrix) {
            calibrated::mark_observer(&mut quantization_config);
        }
        engine_check::output_config(json, quantization_config, plan)
    });
    let engines = options.engine.engines();
    let engine_rules = (!engines.is_empty()).then(|| {
        let config = output_config.as_ref().map(|(config, _)| config);
        let tp =
            options.tp.unwrap_or_else(|| crate::engines::lint::default_tp(config.unwrap_or(&serde_json::Value::Null)));
        crate::engines::lint::lint(&engine_check::planned_output(plan, config), &engines, tp)
    });
    let mut report = QuantizeReport {
        dry_run: options.dry_run,
        input: options.input.clone(),
        output: options.output.clone(),
        architecture: config.as_ref().map(|c| c.architecture.name().to_string()),
        recipe: recipe.name().to_string(),
        input_bytes: checkpoint.shard_bytes(),
        output_bytes: plan.output_bytes(),
        tensors_quantized: plan.count(|a| matches!(a, Action::Int4 { .. } | Action::Fp4 { .. })),
        tensors_converted: plan.count(|a| matches!(a, Action::Bf16 | Action::Fp8Block)),
        tensors_copied: plan.count(|a| matches!(a, Action::Copy)),
        shards: plan.shards.len(),
        shards_reused: 0,
        seconds: 0.0,
        peak_rss_bytes: None,
        classes: plan.by_class().into_iter().map(|(class, summary)| (class.name().to_string(), summary)).collect(),
        engine_rules,
        config_fixes: output_config.as_ref().map(|(_, fixes)| fixes.clone()).unwrap_or_default(),
        expert_coverage: None,
        calibration_layers_reused: None,
        gptq_algebra: None,
        part: None,
    };
    let own_shards = match options.part {
        Some(part) => {
            let range = part.range(plan.shards.len());
            if part.count > plan.shards.len() {
                return Err(ConvertError::Output {
                    path: options.output.clone(),
                    problem: format!(
                        "--part {part}: the plan has only {} shard(s), so some parts would write nothing; use at most \
                         {} parts, or a smaller --max-shard-size for more shards",
                        plan.shards.len(),
                        plan.shards.len()
                    ),
                });
            }
            report.part = Some(PartSummary {
                part: part.to_string(),
                shards: plan.shards[range.clone()].iter().map(|shard| shard.file.clone()).collect(),
                output_bytes: plan.shards[range.clone()].iter().map(|shard| shard.bytes).sum(),
                input_bytes: plan
                    .items
                    .iter()
                    .filter(|item| range.contains(&item.shard))
                    .map(|item| item.source.bytes())
                    .sum(),
                manifest: super::parts::manifest_file(part),
            });
            range
        }
        None => 0..plan.shards.len(),
    };
    // A dry run reports the rule results; a real run refuses before touching the output folder.
    if let Some(rules) = report.engine_rules.as_ref().filter(|rules| !rules.passed && !options.dry_run) {
        return Err(ConvertError::EngineRules(engine_check::refusal(rules)));
    }
    Ok(Checked { prepared, output_config, report, own_shards })
}

/// What the calibrate stage leaves: the device, the locked output folder (and what a previous run left there), the
/// plan's digest and the calibration results.
struct Opened {
    device: Option<std::sync::Arc<dyn crate::runtime::device::Device>>,
    calibration_set: Option<CalibrationSet>,
    calibration: Option<Calibration>,
    source_sha256: String,
    plan_sha256: String,
    previous: Option<Manifest>,
    lock: crate::io::lock::FolderLock,
}

/// Stage 2: picks the device, locks the output folder (checking what is in it) and runs the calibration pass there
/// (GPTQ keeps its quantized experts in it).
fn calibrate(options: &QuantizeOptions, checked: &Checked, reporter: &dyn Reporter) -> Result<Opened, ConvertError> {
    let Prepared { checkpoint, recipe, plan, .. } = &checked.prepared;
    let device = match select(options.device)? {
        DeviceSelection::CpuFallback(reason) => {
            reporter.warn(&format!("quantizing on the CPU: {reason}"));
            None
        }
        selection => selection.into_device(),
    };
    check_output(&options.output, options)?;
    if options.part.is_none() {
        crate::card::check_readme_slot(&options.output, Some(&options.input.join(crate::card::README)))?;
    }
    let calibration_set = match &options.calibration {
        Some(calibration) => Some(CalibrationSet::load(&options.input, calibration)?),
        None => None,
    };
    let out = &options.output;
    let recipe_digest = match &calibration_set {
        Some(set) => format!("{}|{}", recipe.sha256(), set.digest),
        None => recipe.sha256(),
    };
    let source_sha256 = checkpoint.fingerprint();
    let plan_sha256 = plan.sha256(&source_sha256, &recipe_digest);
    let (previous, lock) = match options.part {
        Some(part) => {
            let own: Vec<&str> =
                plan.shards[checked.own_shards.clone()].iter().map(|shard| shard.file.as_str()).collect();
            prepare_part_output(out, options, part, &own, &plan_sha256)?
        }
        None => prepare_output(out, options, &plan_sha256)?,
    };
    let calibration = match (&options.calibration, &calibration_set) {
        (Some(calibration), Some(set)) => {
            let output = CalibrationOutput { dir: out, plan_sha256: &plan_sha256, resume: options.resume };
            Some(calibrate::calibrate(&options.input, calibration, set, plan, output, reporter)?)
        }
        _ => None,
    };
    crate::io::interrupt::set_hint(format!(
        "rerun `squeeze quantize {} {}{} --resume` to continue",
        options.input.display(),
        out.display(),
        options.part.map(|part| format!(" --part {part}")).unwrap_or_default()
    ));
    Ok(Opened { device, calibration_set, calibration, source_sha256, plan_sha256, previous, lock })
}

/// What the run stage leaves: the manifest of the written shards and, for a part, its part manifest.
struct Written {
    manifest: Manifest,
    part_manifest: Option<PartManifest>,
}

/// Where the manifest goes while the run goes on: the folder's manifest, or this part's.
fn save(out: &Path, manifest: &Manifest, part_manifest: &Option<PartManifest>) -> Result<(), IoError> {
    match part_manifest {
        Some(part_manifest) => PartManifest { manifest: manifest.clone(), ..part_manifest.clone() }.write(out),
        None => manifest.write(out),
    }
}

/// Stage 3: records the run in the manifest, reuses the shards a previous run of the same plan finished (re-hashed)
/// and transforms and writes the rest.
fn run(
    options: &QuantizeOptions,
    checked: &mut Checked,
    opened: &Opened,
    reporter: &dyn Reporter,
) -> Result<Written, ConvertError> {
    let Checked { prepared: Prepared { checkpoint, recipe, plan, .. }, report, own_shards, output_config } = checked;
    let out = &options.output;
    let calibration = opened.calibration.as_ref();
    let mut manifest = Manifest {
        tool: "squeeze".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        complete: false,
        plan_sha256: opened.plan_sha256.clone(),
        source: options.input.display().to_string(),
        recipe: RecipeRecord { name: recipe.name().into(), sha256: recipe.sha256(), text: recipe.canonical_text() },
        shards: plan
            .shards
            .iter()
            .map(|s| ShardRecord { file: s.file.clone(), bytes: s.bytes, sha256: None })
            .collect(),
        tensors: plan
            .items
            .iter()
            .map(|item| TensorRecord {
                name: item.module().to_string(),
                class: item.class.name().into(),
                scheme: item.action.name().into(),
                source_dtype: item.source.dtype.to_string(),
                bytes_in: item.source.bytes(),
                bytes_out: item.bytes_out(),
                shard: plan.shards[item.shard].file.clone(),
            })
            .collect(),
        expert_coverage: calibration.and_then(|c| serde_json::to_value(&c.coverage).ok()),
        card: crate::io::card_record::CardRecord::of_run(
            options.base_model.clone(),
            options.tp,
            options.calibration.as_ref().zip(opened.calibration_set.as_ref()),
            opened.previous.as_ref(),
        )?,
    };
    report.expert_coverage = calibration.map(|c| c.coverage.clone());
    report.calibration_layers_reused = calibration.map(|c| c.layers_reused);
    report.gptq_algebra = calibration.and_then(|c| c.gptq_algebra);
    // Reuse shards a previous run of the same plan finished, after re-hashing them.
    let mut reused = vec![false; plan.shards.len()];
    if let Some(previous) = &opened.previous {
        for (index, record) in previous.shards.iter().enumerate() {
            if !own_shards.contains(&index) {
                continue;
            }
            let Some(finished) = record.finished() else { continue };
            let path = out.join(&finished.file);
            if path.exists() && sha256_file(&path)? == (finished.bytes, finished.sha256.clone()) {
                manifest.shards[index].sha256 = Some(finished.sha256);
                reused[index] = true;
            }
        }
    }
    report.shards_reused = reused.iter().filter(|r| **r).count();
    let source_identity = match options.part {
        Some(_) => super::parts::source_identity(checkpoint, &opened.source_sha256)?,
        None => String::new(),
    };
    let part_manifest = options.part.map(|part| PartManifest {
        part,
        shards: [own_shards.start, own_shards.end],
        source_sha256: source_identity,
        options: PartOptions {
            recipe: options.recipe.clone(),
            group_size: options.group_size,
            scale_rule: options.scale_rule,
            max_shard_bytes: options.max_shard_bytes,
            allow_nonfinite: options.allow_nonfinite,
            allow_inexact_cast: options.allow_inexact_cast,
        },
        config: output_config.as_ref().map(|(config, _)| config.clone()),
        companions: Vec::new(),
        manifest: manifest.clone(),
    });
    save(out, &manifest, &part_manifest)?;

    let work: Vec<usize> = (0..plan.items.len())
        .filter(|&i| own_shards.contains(&plan.items[i].shard) && !reused[plan.items[i].shard])
        .collect();
    reporter.begin("quantize", work.iter().map(|&i| plan.items[i].source.bytes()).sum());
    let absmax = transform::AbsmaxCache::default();
    let compute = transform::Compute {
        device: opened.device.as_deref(),
        allow_nonfinite: options.allow_nonfinite,
        allow_inexact_cast: options.allow_inexact_cast,
        calibration,
        absmax: Some(&absmax),
    };
    let result = {
        let save = |manifest: &Manifest| save(out, manifest, &part_manifest);
        let destination = Destination { out, manifest: &mut manifest, save: &save };
        run_items(checkpoint, plan, &work, destination, reporter, compute)
    };
    reporter.end();
    result?;
    Ok(Written { manifest, part_manifest })
}

/// Stage 4: a part records itself complete (part 1 with the companions) for `merge`; a whole run writes the
/// companions, index, config and model card, removes leftover temporaries, and releases the folder's `lock` as it
/// writes the complete manifest (so that a finished folder never holds it).
fn finish(
    options: &QuantizeOptions,
    checked: Checked,
    written: Written,
    lock: FolderLock,
    started: Instant,
) -> Result<QuantizeReport, ConvertError> {
    let Checked { prepared: Prepared { checkpoint, plan, .. }, output_config, report, own_shards } = checked;
    let Written { mut manifest, part_manifest } = written;
    let out = &options.output;
    if let Some(mut part_manifest) = part_manifest {
        // Part 1 carries the companions; `merge` writes the index, config and final manifest.
        if part_manifest.part.index == 1 {
            part_manifest.companions = output_files::copy_companions(&checkpoint, out)?;
        }
        manifest.complete = true;
        remove_own_temporaries(out, &plan.shards[own_shards].iter().map(|s| s.file.as_str()).collect::<Vec<_>>())?;
        lock.release_with(|| save(out, &manifest, &Some(part_manifest)))?;
        return Ok(report.finished(started));
    }
    output_files::copy_companions(&checkpoint, out)?;
    output_files::write_index(out, &plan)?;
    if let Some((config, _)) = &output_config {
        output_files::write_config(out, config)?;
    }
    manifest.complete = true;
    crate::card::write(out, &manifest, output_config.as_ref().map(|(config, _)| config))?;
    remove_leftover_temporaries(out)?;
    lock.release_with(|| manifest.write(out))?;
    Ok(report.finished(started))
}

/// Where [`run_items`] writes: the output folder, the manifest it keeps up to date and how that manifest is saved.
struct Destination<'a> {
    out: &'a Path,
    manifest: &'a mut Manifest,
    save: &'a (dyn Fn(&Manifest) -> Result<(), IoError> + Sync),
}

/// Transforms `work` items in order on this thread (rows in parallel) while a writer thread streams them out;
/// `destination.save` records the manifest after each finished shard.
fn run_items(
    checkpoint: &Checkpoint,
    plan: &Plan,
    work: &[usize],
    destination: Destination,
    reporter: &dyn Reporter,
    compute: transform::Compute,
) -> Result<(), ConvertError> {
    let Destination { out, manifest, save } = destination;
    let (sender, receiver) = sync_channel::<(usize, Vec<Vec<u8>>)>(2);
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> Result<(), ConvertError> {
            let mut current: Option<(usize, ShardWriter)> = None;
            let finish = |shard: usize, writer: ShardWriter, manifest: &mut Manifest| -> Result<(), ConvertError> {
                let finished = writer.finish()?;
                manifest.shards[shard].sha256 = Some(finished.sha256);
                save(manifest)?;
                Ok(())
            };
            let outcome = (|| {
                for (item_index, outputs) in receiver.iter() {
                    let item = &plan.items[item_index];
                    if current.as_ref().map(|(shard, _)| *shard) != Some(item.shard) {
                        if let Some((shard, writer)) = current.take() {
                            finish(shard, writer, manifest)?;
                        }
                        let planned = &plan.shards[item.shard];
                        current =
                            Some((item.shard, ShardWriter::create(&out.join(&planned.file), planned.tensors.clone())?));
                    }
                    let (_, writer) = current.as_mut().expect("a shard is open");
                    for (tensor, bytes) in item.outputs.iter().zip(&outputs) {
                        writer.write_tensor(&tensor.name, bytes)?;
                    }
                }
                if let Some((shard, writer)) = current.take() {
                    finish(shard, writer, manifest)?;
                }
                Ok(())
            })();
            if let Some((_, writer)) = current.take() {
                writer.abandon();
            }
            outcome
        });
        let mut produced = Ok(());
        for &index in work {
            let item = &plan.items[index];
            match transform::transform(checkpoint, item, compute) {
                Ok(outputs) => {
                    if sender.send((index, outputs)).is_err() {
                        break; // the writer failed; its error is reported below
                    }
                    reporter.advance(item.source.bytes());
                }
                Err(error) => {
                    produced = Err(ConvertError::from(error));
                    break;
                }
            }
        }
        drop(sender);
        let written = writer.join().unwrap_or_else(|_| {
            Err(ConvertError::Output { path: out.to_path_buf(), problem: "writer thread panicked".into() })
        });
        // A failed transform ends the stream early, so the writer's complaint about the unfinished shard follows
        // from it: report the cause.
        produced.and(written)
    })
}

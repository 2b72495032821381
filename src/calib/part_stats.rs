//! The raw observations of one part of a split KV calibration (`calibrate-kv --part I/N --save-stats FILE`): per
//! layer and head the amax, count and |x| histogram of K and V; and `merge-calib`, which checks the parts against
//! each other and the model, adds them up (exact: integer counts and maxima) and summarizes them as one run does,
//! so the scales are one run's.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{summarize, AbsStats, CalibOptions, CalibReport, LayerObservation, Observations, Strategy};
use crate::arch::Model;
use crate::chunks::EvalInput;
use crate::engines::Engine;
use crate::io::stats_file::StatsFile;
use crate::io::IoError;
use crate::job_error::JobError;
use crate::part::{check_parts, PartEntry, PartIdentity, PartsError};

/// The flags that decide the scales, as a part records them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CalibRun {
    percentile: Option<f64>,
    strategy: Strategy,
    engines: Vec<Engine>,
    /// Heads per layer in the file (1, or the KV heads with --strategy head).
    heads: usize,
    layers: usize,
    samples: usize,
    seq_len: usize,
    seconds: f64,
}

/// Writes one part's observations.
pub fn write(
    path: &Path,
    identity: &PartIdentity,
    options: &CalibOptions,
    observed: &Observations,
    seconds: f64,
) -> Result<(), IoError> {
    let run = CalibRun {
        percentile: options.percentile,
        strategy: options.strategy,
        engines: options.engines.clone(),
        heads: observed.layers.first().map_or(1, |layer| layer.k.len()),
        layers: observed.layers.len(),
        samples: observed.samples,
        seq_len: observed.seq_len,
        seconds,
    };
    let mut file = StatsFile::new(json!({ "kind": "calibrate-kv", "identity": identity, "run": run }));
    for (layer, observation) in observed.layers.iter().enumerate() {
        for (name, stats) in [("k", &observation.k), ("v", &observation.v)] {
            for (head, stats) in stats.iter().enumerate() {
                let prefix = format!("layer.{layer}.{name}.{head}");
                file.put_f64(format!("{prefix}.amax"), vec![stats.amax as f64]);
                file.put_u64(format!("{prefix}.count"), vec![stats.count]);
                file.put_u64(format!("{prefix}.histogram"), stats.histogram().to_vec());
            }
        }
    }
    file.write(path)
}

#[derive(Debug, thiserror::Error)]
pub enum MergeCalibError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Calib(#[from] JobError),
    #[error(transparent)]
    Parts(#[from] PartsError),
    #[error("{}: {problem}; the files were not written by `squeeze calibrate-kv --save-stats`", path.display())]
    Format { path: PathBuf, problem: String },
    #[error("{}: is not the model the parts calibrated (its shard names, sizes or headers differ from those {} records); give the model folder the parts ran on", model.display(), file.display())]
    OtherModel { model: PathBuf, file: PathBuf },
}

/// Reads and checks the parts' files and returns the report one calibration of `model` over all their sequences
/// gives (write it with [`super::write_scales`]).
pub fn merge(model: &Path, paths: &[PathBuf]) -> Result<CalibReport, MergeCalibError> {
    let mut files = Vec::new();
    for path in paths {
        let file = StatsFile::read(path)?;
        let format = |problem: String| MergeCalibError::Format { path: path.clone(), problem };
        if file.header.get("kind").and_then(Value::as_str) != Some("calibrate-kv") {
            return Err(format("it holds other statistics".into()));
        }
        let identity: PartIdentity = serde_json::from_value(file.header["identity"].clone())
            .map_err(|e| format(format!("its header has no part identity ({e})")))?;
        let run: CalibRun = serde_json::from_value(file.header["run"].clone())
            .map_err(|e| format(format!("its header does not parse ({e})")))?;
        files.push((path.clone(), identity, run, file));
    }
    let entries = files
        .iter()
        .map(|(path, identity, run, _)| {
            let mut options = serde_json::to_value(run).unwrap_or_default();
            if let Some(map) = options.as_object_mut() {
                for key in ["samples", "seq_len", "seconds"] {
                    map.remove(key);
                }
            }
            PartEntry { path: path.clone(), identity: identity.clone(), options }
        })
        .collect();
    let ordered = check_parts(entries, "flags (--percentile, --strategy or --engine)")?;
    let opened = Model::open(model).map_err(JobError::from)?;
    if opened.checkpoint().fingerprint() != ordered[0].identity.models[0] {
        return Err(MergeCalibError::OtherModel { model: model.to_path_buf(), file: ordered[0].path.clone() });
    }

    let mut observed: Option<Observations> = None;
    let mut first_run: Option<CalibRun> = None;
    let mut seconds = 0.0;
    for entry in &ordered {
        let (path, _, run, file) = files.iter().find(|(path, ..)| path == &entry.path).expect("an entry per file");
        let mut layers = Vec::with_capacity(run.layers);
        for layer in 0..run.layers {
            let read = |name: &str| -> Result<Vec<AbsStats>, MergeCalibError> {
                (0..run.heads)
                    .map(|head| {
                        let prefix = format!("layer.{layer}.{name}.{head}");
                        let amax = file.f64(path, &format!("{prefix}.amax"))?.first().copied().unwrap_or(0.0);
                        let count = file.u64(path, &format!("{prefix}.count"))?.first().copied().unwrap_or(0);
                        let histogram = file.u64(path, &format!("{prefix}.histogram"))?.to_vec();
                        AbsStats::from_parts(amax as f32, count, histogram).ok_or_else(|| MergeCalibError::Format {
                            path: path.clone(),
                            problem: format!("`{prefix}.histogram` has another bin count than this squeeze's"),
                        })
                    })
                    .collect()
            };
            layers.push(LayerObservation { k: read("k")?, v: read("v")? });
        }
        observed = Some(match observed {
            None => Observations { layers, samples: run.samples, seq_len: run.seq_len },
            Some(mut total) => {
                for (sum, part) in total.layers.iter_mut().zip(&layers) {
                    sum.k.iter_mut().zip(&part.k).for_each(|(a, b)| a.merge(b));
                    sum.v.iter_mut().zip(&part.v).for_each(|(a, b)| a.merge(b));
                }
                total.samples += run.samples;
                total.seq_len = total.seq_len.max(run.seq_len);
                total
            }
        });
        first_run.get_or_insert_with(|| run.clone());
        seconds += run.seconds;
    }
    let (observed, run) = (observed.expect("one part at least"), first_run.expect("one part at least"));
    let options = CalibOptions {
        model: model.to_path_buf(),
        input: EvalInput::Tokens { path: PathBuf::new(), flag: "--tokens" },
        samples: observed.samples,
        percentile: run.percentile,
        strategy: run.strategy,
        engines: run.engines,
        part: None,
        save_stats: None,
        allow_long_context: false,
    };
    Ok(summarize(opened.config(), &options, &observed, seconds))
}

//! Writes calibrated KV scales the way the engines read them: F32 `model.layers.N.<name>` for every name pair of
//! the report (`self_attn.k_scale`/`.v_scale`, and the names each target engine loads: [`crate::engines`]),
//! `[1]` or `[kv_heads, 1, 1]` per head (names, shapes and `kv_cache_scheme`: [`crate::format::kv_scales`]), in a new shard `kv-scales.safetensors` added to the index, and
//! `quantization_config.kv_cache_scheme` in `config.json` — as one transaction ([`crate::io::journal`]): all three
//! are written complete under staged names, then renamed shard, index, config, so that no reader sees a config
//! naming scales the index lacks, and a failure before the commit leaves the folder as it was.
//! Optionally SGLang's `--quantization-param-path` JSON.
//!
//! F32, not the module dtype (BF16): vLLM and SGLang load the scale into an f32 parameter from either, and BF16
//! would round amax/448 to 8 significant bits — rounding down lets the amax value saturate.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::{CalibReport, Strategy};
use crate::format::kv_scales::{kv_cache_scheme, quantization_param_json, tensor_name, tensor_shape};
use crate::io::checkpoint::{read_json, CONFIG_FILE, INDEX_FILE, SINGLE_FILE};
use crate::io::composite::{self, NameStyle};
use crate::io::dtype::Dtype;
use crate::io::lock::FolderLock;
use crate::io::writer::{PlannedTensor, ShardWriter};
use crate::io::{atomic, journal, IoError, ShardFile};

pub const SCALES_FILE: &str = "kv-scales.safetensors";

/// What was written where.
#[derive(Debug, Clone)]
pub struct WrittenFiles {
    pub files: Vec<PathBuf>,
}

/// Takes the lock of the folder the scales go to (`target`, created if needed) for the whole run, completes an
/// edit an interrupted run left half-committed and removes what a run killed before its commit staged.
pub fn open_for_edit(target: &Path) -> Result<FolderLock, IoError> {
    std::fs::create_dir_all(target).map_err(|e| IoError::file(target, e))?;
    let lock = FolderLock::acquire(target, "calibrate-kv")?;
    journal::complete(target)?;
    journal::remove_orphans(target)?;
    Ok(lock)
}

/// Writes the scales into `model` (or, with `out`, writes `config.json`, the index and the scales shard into `out`
/// and leaves `model` untouched), and SGLang's JSON to `sglang` if given. The caller holds the folder
/// ([`open_for_edit`]) when other runs could touch it.
pub fn write_scales(
    report: &CalibReport,
    model: &Path,
    out: Option<&Path>,
    sglang: Option<&Path>,
) -> Result<WrittenFiles, IoError> {
    let target = out.unwrap_or(model);
    if let Some(out) = out {
        std::fs::create_dir_all(out).map_err(|e| IoError::file(out, e))?;
    }
    let staged = write_staged(report, model, target);
    if staged.is_err() {
        let _ = journal::remove_orphans(target);
    }
    let config = staged?;
    journal::commit(target, "calibrate-kv", &[SCALES_FILE, INDEX_FILE, CONFIG_FILE])?;
    let mut files: Vec<PathBuf> = [SCALES_FILE, INDEX_FILE, CONFIG_FILE].iter().map(|f| target.join(f)).collect();
    if let Some(path) = sglang {
        let model_type = config.get("model_type").cloned().unwrap_or(Value::Null);
        atomic::write_json(path, &sglang_json(report, model_type))?;
        files.push(path.to_path_buf());
    }
    Ok(WrittenFiles { files })
}

/// Writes the shard, the index and the config under their staged names in `target`; returns the new config.
fn write_staged(report: &CalibReport, model: &Path, target: &Path) -> Result<Value, IoError> {
    let config_path = model.join(CONFIG_FILE);
    let mut config = read_json(&config_path)?;
    let index_path = model.join(INDEX_FILE);
    let mut index = if index_path.exists() {
        read_json(&index_path)?
    } else {
        let single = model.join(SINGLE_FILE);
        let shard = ShardFile::open(&single)?;
        let map: Map<String, Value> =
            shard.entries().keys().map(|name| (name.clone(), Value::from(SINGLE_FILE))).collect();
        json!({ "metadata": { "total_size": shard.file_bytes() }, "weight_map": map })
    };
    // Inside a vision-language wrapper the scales take the text model's stored prefix, which the engines' wrapper
    // loaders strip (`language_model.model.layers.N.…` for Kimi K2.6).
    let names = index.get("weight_map").and_then(Value::as_object).into_iter().flat_map(|map| map.keys());
    let style = NameStyle::of_folder(Some(&config), names.map(String::as_str));

    // 1. the shard
    let mut planned = Vec::new();
    let mut payload: Vec<(String, Vec<u8>)> = Vec::new();
    for layer in &report.layers {
        for (k_name, v_name) in &report.tensor_names {
            for (suffix, values) in [(k_name, &layer.k_scale), (v_name, &layer.v_scale)] {
                let name = composite::stored_name(&tensor_name(layer.layer, suffix), style);
                let shape = tensor_shape(values.len(), report.strategy == Strategy::Head);
                planned.push(PlannedTensor::new(name.clone(), Dtype::F32, shape));
                payload.push((name, values.iter().flat_map(|v| v.to_le_bytes()).collect()));
            }
        }
    }
    let shard_path = journal::staged(&target.join(SCALES_FILE));
    let mut writer = ShardWriter::create(&shard_path, planned)?;
    for (name, bytes) in &payload {
        if let Err(error) = writer.write_tensor(name, bytes) {
            writer.abandon();
            return Err(error);
        }
    }
    writer.finish()?;

    // 2. the index: every existing entry, the scale names routed to the new shard
    let weight_map = index
        .get_mut("weight_map")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| IoError::folder(&index_path, "has no weight_map object"))?;
    weight_map.retain(|_, file| file.as_str() != Some(SCALES_FILE));
    for (name, _) in &payload {
        weight_map.insert(name.clone(), Value::from(SCALES_FILE));
    }
    // `total_size` is the sum of the tensors' data bytes (no headers), recounted from the shards so that a
    // rerun with other names or another strategy stays exact.
    let total = tensor_bytes_of(weight_map, model, &shard_path)?;
    match index.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(metadata) => {
            metadata.insert("total_size".into(), Value::from(total));
        }
        None => {
            index
                .as_object_mut()
                .ok_or_else(|| IoError::folder(&index_path, "is not a JSON object"))?
                .insert("metadata".into(), json!({ "total_size": total }));
        }
    }
    atomic::write_json(&journal::staged(&target.join(INDEX_FILE)), &index)?;

    // 3. config.json: `kv_cache_scheme` in the `quantization_config` the engines read — the top level's, else the
    // wrapped text model's (where Moonshot keeps it; a new top-level one would hide it from vLLM) — else on its own.
    let scheme = kv_cache_scheme(report.strategy == Strategy::Head);
    if !config.is_object() {
        return Err(IoError::folder(&config_path, "is not a JSON object"));
    }
    match composite::quantization_config_mut(&mut config).and_then(Value::as_object_mut) {
        Some(quantization) => {
            quantization.insert("kv_cache_scheme".into(), scheme);
        }
        None => {
            if let Some(object) = config.as_object_mut() {
                object.insert("kv_cache_scheme".into(), scheme);
            }
        }
    }
    atomic::write_json(&journal::staged(&target.join(CONFIG_FILE)), &config)?;
    Ok(config)
}

/// The data bytes of every tensor the weight map lists, read from the shard headers (the scales shard from
/// `scales`, the others from `model`).
fn tensor_bytes_of(weight_map: &Map<String, Value>, model: &Path, scales: &Path) -> Result<u64, IoError> {
    let mut shards: std::collections::BTreeMap<&str, ShardFile> = std::collections::BTreeMap::new();
    let mut total = 0u64;
    for (name, file) in weight_map {
        let file =
            file.as_str().ok_or_else(|| IoError::tensor(model.join(INDEX_FILE), name, "maps to a non-string file"))?;
        if !shards.contains_key(file) {
            let path = if file == SCALES_FILE { scales.to_path_buf() } else { model.join(file) };
            shards.insert(file, ShardFile::open(&path)?);
        }
        let entry = shards[file]
            .entries()
            .get(name)
            .ok_or_else(|| IoError::tensor(model.join(file), name, "is listed in the index but not in this shard"))?;
        total += (entry.end - entry.start) as u64;
    }
    Ok(total)
}

/// SGLang's `--quantization-param-path` JSON ([`quantization_param_json`]) of a report: its one scale per layer
/// is the larger of K and V (and of the heads) so that nothing saturates.
pub fn sglang_json(report: &CalibReport, model_type: Value) -> Value {
    let layers = report
        .layers
        .iter()
        .map(|layer| (layer.layer, layer.k_scale.iter().chain(&layer.v_scale).copied().fold(0.0f32, f32::max)));
    quantization_param_json(model_type, layers)
}

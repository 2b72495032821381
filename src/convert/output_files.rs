//! The small files of an output folder: `config.json` with the new `quantization_config`, the index, and the
//! companion files (tokenizer, templates, custom code, the README as `README.source.md`) copied from the source. All
//! written atomically.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde_json::{json, Value};

use crate::io::atomic::{temporary_sibling, write_json};
use crate::io::checkpoint::{CONFIG_FILE, INDEX_FILE};
use crate::io::{Checkpoint, IoError};

use crate::plan::Plan;

/// Writes `model.safetensors.index.json` for the plan.
pub fn write_index(out: &Path, plan: &Plan) -> Result<(), IoError> {
    let mut weight_map = BTreeMap::new();
    for shard in &plan.shards {
        for tensor in &shard.tensors {
            weight_map.insert(tensor.name.clone(), shard.file.clone());
        }
    }
    write_index_map(out, &weight_map, plan.tensor_bytes())
}

/// Writes `model.safetensors.index.json` from its tensor → shard file map and the tensors' total bytes (what
/// `merge` rebuilds from the shard headers).
pub fn write_index_map(out: &Path, weight_map: &BTreeMap<String, String>, total_size: u64) -> Result<(), IoError> {
    write_json(&out.join(INDEX_FILE), &json!({ "metadata": { "total_size": total_size }, "weight_map": weight_map }))
}

/// Writes the output config (made by `engine_check::output_config`).
pub fn write_config(out: &Path, config: &Value) -> Result<(), IoError> {
    write_json(&out.join(CONFIG_FILE), config)
}

/// Copies every companion file of the source, its README as `README.source.md` ([`crate::card::companion_target`]);
/// returns their names in the output.
pub fn copy_companions(checkpoint: &Checkpoint, out: &Path) -> Result<Vec<String>, IoError> {
    let mut copied = Vec::new();
    let companions = checkpoint.companion_files()?;
    for source in &companions {
        let Some(name) = crate::card::companion_target(source, &companions) else { continue };
        let target = out.join(&name);
        let temporary = temporary_sibling(&target);
        fs::copy(source, &temporary).and_then(|_| fs::rename(&temporary, &target)).map_err(|e| {
            let _ = fs::remove_file(&temporary);
            IoError::file(&target, e)
        })?;
        copied.push(name);
    }
    Ok(copied)
}

//! `squeeze-manifest.json`: what a conversion wrote (tool version, recipe and its hash, per-shard SHA-256 and
//! bytes, per-tensor scheme and bytes) and whether it finished. `--resume` and `verify` trust nothing else.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::checkpoint::{read_json, MANIFEST_FILE};
use super::writer::FinishedShard;
use super::IoError;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub tool: String,
    pub version: String,
    /// False while a conversion is running or after it failed; true only when every file is in place.
    pub complete: bool,
    /// SHA-256 over the source fingerprint, recipe and every planned output tensor: resume requires equality.
    pub plan_sha256: String,
    pub source: String,
    pub recipe: RecipeRecord,
    pub shards: Vec<ShardRecord>,
    pub tensors: Vec<TensorRecord>,
    /// `--method imatrix`: calibration tokens per layer and routed expert, and the experts that fell back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_coverage: Option<serde_json::Value>,
    /// What the model card (`README.md`) is rendered from besides the rest of this manifest: `--base-model`,
    /// `--tp`, the calibration data, accuracy results ([`super::card_record`]); absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card: Option<super::card_record::CardRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RecipeRecord {
    pub name: String,
    pub sha256: String,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShardRecord {
    pub file: String,
    /// Planned size; equal to the finished file's size.
    pub bytes: u64,
    /// Present once the shard is finished.
    pub sha256: Option<String>,
}

impl ShardRecord {
    pub fn finished(&self) -> Option<FinishedShard> {
        self.sha256.as_ref().map(|sha256| FinishedShard {
            file: self.file.clone(),
            bytes: self.bytes,
            sha256: sha256.clone(),
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorRecord {
    /// Module-level name (`model.layers.3.mlp.experts.7.down_proj`) or full tensor name for plain copies.
    pub name: String,
    pub class: String,
    pub scheme: String,
    pub source_dtype: String,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub shard: String,
}

impl Manifest {
    pub fn read(dir: &Path) -> Result<Option<Self>, IoError> {
        let path = dir.join(MANIFEST_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let value = read_json(&path)?;
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| IoError::folder(&path, format!("is not a squeeze manifest: {e}")))
    }

    pub fn write(&self, dir: &Path) -> Result<(), IoError> {
        super::atomic::write_json(&dir.join(MANIFEST_FILE), self)
    }
}

//! A Hugging Face model folder: `config.json`, one `model.safetensors` or shards routed by
//! `model.safetensors.index.json`, and the other files (tokenizer, templates, custom code) that travel with it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::composite::{self, NameStyle};
use super::shard::{ShardFile, TensorRef};
use super::IoError;

pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";
pub const CONFIG_FILE: &str = "config.json";
/// What `squeeze quantize` wrote ([`super::manifest`]).
pub const MANIFEST_FILE: &str = "squeeze-manifest.json";

/// An opened model folder with every shard validated.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    config: Option<Value>,
    shards: Vec<ShardFile>,
    /// tensor name → index into `shards`
    locations: BTreeMap<String, usize>,
    /// How the text model's tensors are named ([`composite`]); inside a wrapper every lookup by a text-model name
    /// (`model.layers.0.…`) finds the stored one (`language_model.model.layers.0.…`).
    style: NameStyle,
}

impl Checkpoint {
    /// Opens `dir`, validating every shard header and the index against the shards.
    pub fn open(dir: &Path) -> Result<Self, IoError> {
        if !dir.is_dir() {
            return Err(IoError::folder(
                dir,
                "is not a model folder (expected a directory with config.json and *.safetensors)",
            ));
        }
        // A run killed after finishing this folder left its lock: the folder is complete, so it must not look locked.
        super::lock::clear_stale(dir);
        let config = read_config(dir)?;
        let index_path = dir.join(INDEX_FILE);
        let (shard_names, weight_map) = if index_path.exists() {
            let index = read_json(&index_path)?;
            let map = index.get("weight_map").and_then(Value::as_object).ok_or_else(|| {
                IoError::folder(
                    &index_path,
                    "has no `weight_map` object; regenerate the index or remove it for a single-file model",
                )
            })?;
            let mut weight_map = BTreeMap::new();
            for (tensor, file) in map {
                let file = file
                    .as_str()
                    .ok_or_else(|| IoError::tensor(&index_path, tensor, "maps to a non-string file name"))?;
                weight_map.insert(tensor.clone(), file.to_string());
            }
            let mut shard_names: Vec<String> = weight_map.values().cloned().collect();
            shard_names.sort();
            shard_names.dedup();
            (shard_names, Some(weight_map))
        } else if dir.join(SINGLE_FILE).exists() {
            (vec![SINGLE_FILE.to_string()], None)
        } else {
            return Err(IoError::folder(dir, format!("has neither {INDEX_FILE} nor {SINGLE_FILE}")));
        };

        let mut shards = Vec::with_capacity(shard_names.len());
        for name in &shard_names {
            let path = dir.join(name);
            if !path.exists() {
                let tensor = weight_map
                    .as_ref()
                    .and_then(|map| map.iter().find(|(_, file)| *file == name).map(|(t, _)| t.clone()))
                    .unwrap_or_default();
                return Err(IoError::tensor(
                    &index_path,
                    tensor,
                    format!("is mapped to {name}, which does not exist; download the missing shard"),
                ));
            }
            shards.push(ShardFile::open(&path)?);
        }

        let mut locations = BTreeMap::new();
        for (position, shard) in shards.iter().enumerate() {
            for name in shard.entries().keys() {
                if let Some(previous) = locations.insert(name.clone(), position) {
                    return Err(IoError::tensor(
                        shard.path(),
                        name,
                        format!(
                            "also appears in {}; a tensor must live in exactly one shard",
                            shards[previous].path().display()
                        ),
                    ));
                }
                if let Some(map) = &weight_map {
                    match map.get(name) {
                        Some(file) if file == &shard_names[position] => {}
                        Some(file) => {
                            return Err(IoError::tensor(
                                &index_path,
                                name,
                                format!("is mapped to {file} but lives in {}", shard_names[position]),
                            ))
                        }
                        None => {
                            return Err(IoError::tensor(
                                &index_path,
                                name,
                                format!(
                                    "is in {} but missing from the index; regenerate the index",
                                    shard_names[position]
                                ),
                            ))
                        }
                    }
                }
            }
        }
        if let Some(map) = &weight_map {
            for (tensor, file) in map {
                if !locations.contains_key(tensor) {
                    return Err(IoError::tensor(
                        dir.join(file),
                        tensor,
                        format!("is listed in {INDEX_FILE} but not present in {file}"),
                    ));
                }
            }
        }
        let style = NameStyle::of_folder(config.as_ref(), locations.keys().map(String::as_str));
        Ok(Self { dir: dir.to_path_buf(), config, shards, locations, style })
    }

    /// How the folder names its text model's tensors (plain, or inside a vision-language wrapper).
    pub fn name_style(&self) -> NameStyle {
        self.style
    }

    /// The text model's name of stored tensor `stored` (itself in a plain folder, and for a wrapper's vision tower).
    pub fn text_name(&self, stored: &str) -> String {
        match self.style {
            NameStyle::Plain => stored.to_string(),
            _ => composite::text_name(stored).unwrap_or_else(|| stored.to_string()),
        }
    }

    /// The shard index and stored name of `name`, a stored name or the text model's name of a wrapped tensor.
    fn location<'a>(&self, name: &'a str) -> Option<(usize, Cow<'a, str>)> {
        if let Some(&shard) = self.locations.get(name) {
            return Some((shard, Cow::Borrowed(name)));
        }
        if self.style == NameStyle::Plain {
            return None;
        }
        let stored = composite::stored_name(name, self.style);
        self.locations.get(&stored).map(|&shard| (shard, Cow::Owned(stored)))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed `config.json`, if the folder has one.
    pub fn config(&self) -> Option<&Value> {
        self.config.as_ref()
    }

    pub fn shards(&self) -> &[ShardFile] {
        &self.shards
    }

    /// Whether tensor `name` (stored, or the text model's name inside a wrapper) exists.
    pub fn contains(&self, name: &str) -> bool {
        self.location(name).is_some()
    }

    /// Tensor `name` (stored, or the text model's name inside a wrapper).
    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        let (shard, stored) = self.location(name)?;
        self.shards[shard].get(&stored)
    }

    /// The bytes of tensor `name`, held in place in its shard's mapping.
    pub fn mapped(&self, name: &str) -> Option<super::shard::MappedBytes> {
        let (shard, stored) = self.location(name)?;
        self.shards[shard].mapped(&stored)
    }

    /// Starts reading the named tensors' pages in the background, all at once: reading many small tensors spread
    /// over the shards (an INT4 checkpoint's `weight_shape`s, one per module) then costs one wait for the disk
    /// instead of one per tensor (480 of them on a cold cache: 2.8 s one by one, 7 ms after this, on the
    /// development machine's disk).
    pub fn will_need<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            if let Some((shard, stored)) = self.location(name) {
                self.shards[shard].will_need(&stored);
            }
        }
    }

    /// The shard holding `name`.
    pub fn shard_of(&self, name: &str) -> Option<&ShardFile> {
        self.location(name).map(|(shard, _)| &self.shards[shard])
    }

    /// Every tensor name in reading order: shard by shard, by offset within a shard.
    pub fn names_in_file_order(&self) -> Vec<&str> {
        self.shards.iter().flat_map(|shard| shard.names_by_offset()).collect()
    }

    pub fn tensor_count(&self) -> usize {
        self.locations.len()
    }

    /// Digest of the shard names, sizes and headers (what a conversion's plan digest and a job's part files
    /// identify the model by without reading its weights).
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        for shard in &self.shards {
            hasher.update(shard.path().file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default());
            hasher.update(shard.file_bytes().to_le_bytes());
            for (name, entry) in shard.entries() {
                hasher.update(format!("{name}|{}|{:?}|{}|{};", entry.dtype, entry.shape, entry.start, entry.end));
            }
        }
        crate::hex::hex(&hasher.finalize())
    }

    /// Bytes of all shard files.
    pub fn shard_bytes(&self) -> u64 {
        self.shards.iter().map(ShardFile::file_bytes).sum()
    }

    /// Top-level files that are neither weights, the index nor `config.json` (tokenizer, templates, code).
    pub fn companion_files(&self) -> Result<Vec<PathBuf>, IoError> {
        let mut files = Vec::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| IoError::file(&self.dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| IoError::file(&self.dir, e))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            let is_weights = name.ends_with(".safetensors");
            let is_ours = name == INDEX_FILE
                || name == CONFIG_FILE
                || name == MANIFEST_FILE
                || super::lock::is_lock_file(&name)
                || name == super::journal::JOURNAL_FILE
                || name.ends_with(super::journal::STAGED_SUFFIX)
                || name.ends_with(".squeeze-tmp");
            if path.is_file() && !is_weights && !is_ours {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }
}

fn read_config(dir: &Path) -> Result<Option<Value>, IoError> {
    let path = dir.join(CONFIG_FILE);
    if !path.exists() {
        return Ok(None);
    }
    read_json(&path).map(Some)
}

/// Reads and parses a JSON file, naming it in any error.
pub fn read_json(path: &Path) -> Result<Value, IoError> {
    let text = fs::read_to_string(path).map_err(|e| IoError::file(path, e))?;
    serde_json::from_str(&text).map_err(|e| IoError::folder(path, format!("is not valid JSON: {e}")))
}

//! The part manifest (`squeeze-part-0000I-of-0000N.json`) in which one part of a split conversion records what it
//! wrote (its shards of the plan, its source, flags and output config), for `squeeze merge`.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::io::checkpoint::read_json;
use crate::io::manifest::Manifest;
use crate::io::{Checkpoint, IoError};
use crate::quant::ScaleRule;

pub use crate::part::Part;

/// Prefix and suffix of every part manifest's file name.
const MANIFEST_PREFIX: &str = "squeeze-part-";
const MANIFEST_SUFFIX: &str = ".json";

/// The part manifest's file name of `part`.
pub fn manifest_file(part: Part) -> String {
    format!("{MANIFEST_PREFIX}{:05}-of-{:05}{MANIFEST_SUFFIX}", part.index, part.count)
}

/// The lock file `part` holds in its output folder (parts may share one folder, so each has its own).
pub fn lock_file(part: Part) -> String {
    format!(".squeeze-part-{:05}-of-{:05}.lock", part.index, part.count)
}

/// The part a file name is the manifest of, if it is one.
pub fn part_of_manifest_file(name: &str) -> Option<Part> {
    let middle = name.strip_prefix(MANIFEST_PREFIX)?.strip_suffix(MANIFEST_SUFFIX)?;
    let (index, count) = middle.split_once("-of-")?;
    let part = Part { index: index.parse().ok()?, count: count.parse().ok()? };
    (part.index >= 1 && part.index <= part.count).then_some(part)
}

/// Bytes read from each of three places (start, middle, end) of every source shard's tensor data.
const SOURCE_SAMPLE_BYTES: u64 = 1 << 16;

/// What tells two parts' sources apart: `fingerprint` (shard names, sizes, headers) and samples of every shard's
/// tensor data (a re-released checkpoint with the same layout but other weights differs there), read cheaply
/// (3 × 64 KiB a shard) since every part computes it and no part reads the whole source.
pub fn source_identity(checkpoint: &Checkpoint, fingerprint: &str) -> Result<String, IoError> {
    let mut hasher = Sha256::new();
    hasher.update(fingerprint);
    let mut buffer = vec![0u8; SOURCE_SAMPLE_BYTES as usize];
    for shard in checkpoint.shards() {
        let path = shard.path();
        let data_start = shard.entries().values().map(|entry| entry.start as u64).min().unwrap_or(0);
        let data_end = shard.file_bytes();
        let span = data_end.saturating_sub(data_start);
        let mut file = File::open(path).map_err(|e| IoError::file(path, e))?;
        for offset in [0, span / 2, span.saturating_sub(SOURCE_SAMPLE_BYTES)] {
            let length = SOURCE_SAMPLE_BYTES.min(span - offset.min(span)) as usize;
            file.seek(SeekFrom::Start(data_start + offset))
                .and_then(|_| file.read_exact(&mut buffer[..length]))
                .map_err(|e| IoError::file(path, e))?;
            hasher.update(&buffer[..length]);
        }
    }
    Ok(crate::hex::hex(&hasher.finalize()))
}

/// The flags of a part that decide its output bytes; every part of one conversion must have run with the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartOptions {
    /// `--recipe` as given (`None`: the architecture's default).
    pub recipe: Option<String>,
    pub group_size: Option<usize>,
    pub scale_rule: Option<ScaleRule>,
    pub max_shard_bytes: u64,
    pub allow_nonfinite: bool,
    /// `--allow-inexact-cast` (absent from the manifests of runs without it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_inexact_cast: bool,
}

impl PartOptions {
    /// The first option that differs from `other`'s, as `name: ours vs theirs`.
    pub fn difference(&self, other: &PartOptions) -> Option<String> {
        let show = |value: Value| value.to_string();
        let fields = [
            ("--recipe", show(self.recipe.clone().into()), show(other.recipe.clone().into())),
            ("--group-size", show(self.group_size.into()), show(other.group_size.into())),
            ("--scale-rule", format!("{:?}", self.scale_rule), format!("{:?}", other.scale_rule)),
            ("--max-shard-size", self.max_shard_bytes.to_string(), other.max_shard_bytes.to_string()),
            ("--allow-nonfinite", self.allow_nonfinite.to_string(), other.allow_nonfinite.to_string()),
            ("--allow-inexact-cast", self.allow_inexact_cast.to_string(), other.allow_inexact_cast.to_string()),
        ];
        fields
            .into_iter()
            .find(|(_, ours, theirs)| ours != theirs)
            .map(|(name, ours, theirs)| format!("{name} {ours} vs {theirs}"))
    }
}

/// What one part wrote: enough for `merge` to check it against the other parts and to write the final files
/// without the source. Paths in it are file names inside the part's folder, never absolute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartManifest {
    pub part: Part,
    /// The plan's shards this part writes (indices into `manifest.shards`), `[start, end)`.
    pub shards: [usize; 2],
    /// [`source_identity`] of the source.
    pub source_sha256: String,
    pub options: PartOptions,
    /// The output `config.json` (`None` when the source has none).
    pub config: Option<Value>,
    /// Companion files (tokenizer, templates) copied into the folder: part 1 copies them, the others list none.
    pub companions: Vec<String>,
    /// What a single run's `squeeze-manifest.json` holds, with only this part's shards finished; `complete` once
    /// the part has written all of them.
    pub manifest: Manifest,
}

impl PartManifest {
    pub fn read(path: &Path) -> Result<Self, IoError> {
        serde_json::from_value(read_json(path)?).map_err(|e| {
            IoError::folder(path, format!("is not a squeeze part manifest ({e}); remove it or rerun its part"))
        })
    }

    pub fn write(&self, dir: &Path) -> Result<(), IoError> {
        crate::io::atomic::write_json(&dir.join(manifest_file(self.part)), self)
    }

    pub fn shard_range(&self) -> Range<usize> {
        self.shards[0]..self.shards[1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_manifests_are_named_by_their_part() {
        let part: Part = "2/3".parse().unwrap();
        assert_eq!(manifest_file(part), "squeeze-part-00002-of-00003.json");
        assert_eq!(part_of_manifest_file(&manifest_file(part)), Some(part));
        assert_eq!(part_of_manifest_file("squeeze-manifest.json"), None);
        assert_eq!(part_of_manifest_file("squeeze-part-00004-of-00003.json"), None);
    }
}

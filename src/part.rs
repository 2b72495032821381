//! `--part I/N`: one of N independent parts of a job (a conversion's shards, an evaluation's or calibration's
//! chunks), the contiguous run of items it takes (the same arithmetic in every job and in `scripts/cluster/`), and
//! the identity a chunk-split part records so that a merge can check the parts belong together.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::io::Checkpoint;

/// Part `index` (1-based) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Part {
    pub index: usize,
    pub count: usize,
}

impl FromStr for Part {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("expected I/N with 1 ≤ I ≤ N (e.g. 2/8: the second of eight parts), got `{text}`");
        let (index, count) = text.split_once('/').ok_or_else(invalid)?;
        let index: usize = index.trim().parse().map_err(|_| invalid())?;
        let count: usize = count.trim().parse().map_err(|_| invalid())?;
        if index == 0 || count == 0 || index > count {
            return Err(invalid());
        }
        Ok(Part { index, count })
    }
}

impl fmt::Display for Part {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}/{}", self.index, self.count)
    }
}

impl Part {
    /// The single part of a job that is not split.
    pub const WHOLE: Part = Part { index: 1, count: 1 };

    /// The items of `total` this part takes: `[(I−1)·total/N, I·total/N)`, a contiguous run, the runs of all parts
    /// as even as whole items allow (lengths differ by at most one), in order, together covering every item once.
    pub fn range(&self, total: usize) -> Range<usize> {
        let start = (self.index - 1) * total / self.count;
        let end = self.index * total / self.count;
        start..end
    }

    /// Every part of this part's job, in order.
    pub fn siblings(&self) -> impl Iterator<Item = Part> {
        let count = self.count;
        (1..=count).map(move |index| Part { index, count })
    }
}

/// The chunks `part` takes of `all` (every chunk without a part), and their range; more parts than chunks is an
/// error (some part would have nothing to do).
pub fn select<T: Clone>(all: &[T], part: Option<Part>) -> Result<(Vec<T>, Range<usize>), String> {
    let part = part.unwrap_or(Part::WHOLE);
    if part.count > all.len() {
        return Err(format!(
            "--part {part}: the input has only {} chunk(s), so some parts would have none; use at most {} parts",
            all.len(),
            all.len()
        ));
    }
    let range = part.range(all.len());
    Ok((all[range.clone()].to_vec(), range))
}

/// What every part of one chunk-split job must agree on, and which chunks this one took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartIdentity {
    pub version: String,
    pub part: Part,
    /// `[start, end)` of the chunks of the whole input.
    pub chunks: [usize; 2],
    pub total_chunks: usize,
    /// SHA-256 of every chunk's token ids (every part reads the whole input).
    pub input_sha256: String,
    /// The models' fingerprints (shard names, sizes and headers).
    pub models: Vec<String>,
}

impl PartIdentity {
    pub fn of(all: &[Vec<u32>], models: &[&Checkpoint], part: Part, chunks: Range<usize>) -> Self {
        let mut hasher = Sha256::new();
        for sequence in all {
            hasher.update((sequence.len() as u64).to_le_bytes());
            for id in sequence {
                hasher.update(id.to_le_bytes());
            }
        }
        PartIdentity {
            version: env!("CARGO_PKG_VERSION").into(),
            part,
            chunks: [chunks.start, chunks.end],
            total_chunks: all.len(),
            input_sha256: crate::hex::hex(&hasher.finalize()),
            models: models.iter().map(|checkpoint| checkpoint.fingerprint()).collect(),
        }
    }
}

/// One part's file as a merge sees it: where it is, its identity, and the flags that decide its statistics.
#[derive(Debug, Clone)]
pub struct PartEntry {
    pub path: PathBuf,
    pub identity: PartIdentity,
    /// Compared as a whole between parts; `what_options` names it in the error.
    pub options: Value,
}

/// Why the parts of a chunk-split job do not merge.
#[derive(Debug, thiserror::Error)]
pub enum PartsError {
    #[error("no statistics files given; pass the --save-stats FILE of every part")]
    Empty,
    #[error("part {part} is missing: no file holds chunks {start}..{end}; run that part with --part {part} --save-stats FILE and merge again")]
    Missing { part: Part, start: usize, end: usize },
    #[error("part {part} appears twice, in {} and {}; give each part's file once", first.display(), second.display())]
    Duplicate { part: Part, first: PathBuf, second: PathBuf },
    #[error("part {part} ({}) was made with a different {what} than part {reference} ({}); rerun part {part} with the same models, input and flags as the others", path.display(), reference_path.display())]
    Mismatch { part: Part, path: PathBuf, reference: Part, reference_path: PathBuf, what: String },
}

/// Checks that `entries` are every part of one job once: same part count, squeeze version, models, input and
/// options, each with the chunks its number gives it, none missing; returns them ordered by part.
pub fn check_parts(entries: Vec<PartEntry>, what_options: &str) -> Result<Vec<PartEntry>, PartsError> {
    let first = entries.first().ok_or(PartsError::Empty)?;
    if let Some(other) = entries.iter().find(|entry| entry.identity.part.count != first.identity.part.count) {
        return Err(PartsError::Mismatch {
            part: other.identity.part,
            path: other.path.clone(),
            reference: first.identity.part,
            reference_path: first.path.clone(),
            what: "part count".into(),
        });
    }
    let mut parts: BTreeMap<usize, PartEntry> = BTreeMap::new();
    for entry in entries {
        let part = entry.identity.part;
        if let Some(first) = parts.get(&part.index) {
            return Err(PartsError::Duplicate { part, first: first.path.clone(), second: entry.path });
        }
        parts.insert(part.index, entry);
    }
    let reference = parts.values().next().ok_or(PartsError::Empty)?;
    let ours = &reference.identity;
    for entry in parts.values() {
        let theirs = &entry.identity;
        let expected = theirs.part.range(theirs.total_chunks);
        let differs = if theirs.part.count != ours.part.count {
            Some("part count".to_string())
        } else if theirs.version != ours.version {
            Some("squeeze version".into())
        } else if theirs.models != ours.models {
            Some("model (shard names, sizes or headers)".into())
        } else if theirs.input_sha256 != ours.input_sha256 || theirs.total_chunks != ours.total_chunks {
            Some("input (token chunks, --ctx/--seq-len, --chunks/--samples)".into())
        } else if entry.options != reference.options {
            Some(what_options.to_string())
        } else if theirs.chunks != [expected.start, expected.end] {
            Some("chunk split".into())
        } else {
            None
        };
        if let Some(what) = differs {
            return Err(PartsError::Mismatch {
                part: theirs.part,
                path: entry.path.clone(),
                reference: ours.part,
                reference_path: reference.path.clone(),
                what,
            });
        }
    }
    for part in ours.part.siblings() {
        if !parts.contains_key(&part.index) {
            let range = part.range(ours.total_chunks);
            return Err(PartsError::Missing { part, start: range.start, end: range.end });
        }
    }
    Ok(parts.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_parse_and_print() {
        let part: Part = "2/3".parse().unwrap();
        assert_eq!(part, Part { index: 2, count: 3 });
        assert_eq!(part.to_string(), "2/3");
        for bad in ["0/3", "4/3", "3", "a/b", "1/0", ""] {
            assert!(bad.parse::<Part>().unwrap_err().contains("I/N"), "{bad}");
        }
    }

    #[test]
    fn the_parts_cover_every_item_once_in_order() {
        for total in 0..23 {
            for count in 1..9 {
                let mut next = 0;
                for part in (Part { index: 1, count }).siblings() {
                    let range = part.range(total);
                    assert_eq!(range.start, next);
                    assert!(range.len() <= total.div_ceil(count) && range.len() + 1 >= total / count);
                    next = range.end;
                }
                assert_eq!(next, total);
            }
        }
    }
}

//! `squeeze merge`: the parts of a split conversion (`quantize --part I/N`) checked against each other and joined
//! into one output folder, byte for byte what a single `quantize` run writes (model card included).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::io::atomic::temporary_sibling;
use crate::io::checkpoint::{CONFIG_FILE, INDEX_FILE, MANIFEST_FILE};
use crate::io::lock::FolderLock;
use crate::io::shard::ShardFile;
use crate::io::writer::sha256_file;
use crate::io::IoError;

use super::output_files;
use super::parts::{Part, PartManifest};

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("{}: holds no part manifest (squeeze-part-0000I-of-0000N.json); give the folders `squeeze quantize --part I/N` wrote", dir.display())]
    NoParts { dir: PathBuf },
    #[error("part {part} is missing: no {file} in {searched}; run `squeeze quantize SOURCE DIR --part {part}` with the other parts' flags and merge again")]
    Missing { part: Part, file: String, searched: String },
    #[error("part {part} appears twice, in {} and {}; give each part once (remove the extra copy)", first.display(), second.display())]
    Duplicate { part: Part, first: PathBuf, second: PathBuf },
    #[error("part {part} ({}) ran with a different {what} than part {reference}: {detail}; rerun part {part} with the same source and flags as the others", file.display())]
    Mismatch { part: Part, reference: Part, file: PathBuf, what: &'static str, detail: String },
    #[error("part {part} ({}) has not finished; rerun `squeeze quantize SOURCE DIR --part {part} --resume`", file.display())]
    Unfinished { part: Part, file: PathBuf },
    #[error("part {part}: {}: {problem}; rerun `squeeze quantize SOURCE DIR --part {part} --resume` to redo it", file.display())]
    Shard { part: Part, file: PathBuf, problem: String },
    #[error("{}: {problem}", path.display())]
    Output { path: PathBuf, problem: String },
}

/// The result of a merge.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MergeReport {
    pub output: PathBuf,
    /// N: the number of parts merged.
    pub parts: usize,
    pub shards: usize,
    /// Bytes of the shard files.
    pub output_bytes: u64,
    /// Shards hard-linked from a part's folder on the same file system, copied from one elsewhere, or already
    /// in the output folder (the parts wrote there).
    pub shards_linked: usize,
    pub shards_copied: usize,
    pub shards_in_place: usize,
    /// `plan_sha256` every part agrees on.
    pub plan_sha256: String,
}

/// One part found on disk.
struct Found {
    dir: PathBuf,
    file: PathBuf,
    manifest: PartManifest,
}

/// Checks the parts in `part_dirs` (the output folder itself when empty) and writes the merged folder `out`.
pub fn merge(out: &Path, part_dirs: &[PathBuf]) -> Result<MergeReport, MergeError> {
    let dirs: Vec<PathBuf> = if part_dirs.is_empty() { vec![out.to_path_buf()] } else { part_dirs.to_vec() };
    let parts = find_parts(&dirs)?;
    let reference = check_parts(&parts, &dirs)?;
    for found in parts.values() {
        check_shards(found)?;
    }

    fs::create_dir_all(out).map_err(|e| IoError::file(out, e))?;
    let lock = FolderLock::acquire(out, "merge")?;
    let shard_files: Vec<String> = reference.manifest.manifest.shards.iter().map(|s| s.file.clone()).collect();
    check_output(out, &shard_files)?;
    crate::card::check_readme_slot(out, Some(&reference.dir.join(crate::card::SOURCE_README)))?;
    for name in [CONFIG_FILE, INDEX_FILE, MANIFEST_FILE] {
        let path = out.join(name);
        if path.exists() {
            fs::remove_file(&path).map_err(|e| IoError::file(&path, e))?;
        }
    }

    let mut report = MergeReport {
        output: out.to_path_buf(),
        parts: reference.manifest.part.count,
        shards: shard_files.len(),
        output_bytes: reference.manifest.manifest.shards.iter().map(|s| s.bytes).sum(),
        shards_linked: 0,
        shards_copied: 0,
        shards_in_place: 0,
        plan_sha256: reference.manifest.manifest.plan_sha256.clone(),
    };
    let mut manifest = reference.manifest.manifest.clone();
    for found in parts.values() {
        for index in found.manifest.shard_range() {
            let record = &found.manifest.manifest.shards[index];
            match place(&found.dir.join(&record.file), &out.join(&record.file))? {
                Placed::InPlace => report.shards_in_place += 1,
                Placed::Linked => report.shards_linked += 1,
                Placed::Copied => report.shards_copied += 1,
            }
            manifest.shards[index].sha256 = record.sha256.clone();
        }
    }
    // A lock file is never a companion (a part manifest written before that rule may list one).
    for name in reference.manifest.companions.iter().filter(|name| !crate::io::lock::is_lock_file(name)) {
        place(&reference.dir.join(name), &out.join(name))?;
    }

    // The index from the shards' own headers: the tensors each holds and their bytes.
    let mut weight_map = BTreeMap::new();
    let mut total_size = 0u64;
    for file in &shard_files {
        let shard = ShardFile::open(&out.join(file))?;
        for (name, entry) in shard.entries() {
            weight_map.insert(name.clone(), file.clone());
            total_size += (entry.end - entry.start) as u64;
        }
    }
    output_files::write_index_map(out, &weight_map, total_size)?;
    if let Some(config) = &reference.manifest.config {
        output_files::write_config(out, config)?;
    }
    manifest.complete = true;
    crate::card::write(out, &manifest, reference.manifest.config.as_ref())?;
    // The lock goes as the manifest says the folder is complete (a finished folder never holds it). Then the part
    // manifests in the output folder go: the folder is now what one run writes. So do the locks parts of an older
    // squeeze killed after finishing left there (their holders gone): a complete folder does not look locked.
    lock.release_with(|| manifest.write(out))?;
    for found in parts.values() {
        if same_folder(&found.dir, out) {
            fs::remove_file(&found.file).map_err(|e| IoError::file(&found.file, e))?;
        }
    }
    crate::io::lock::clear_stale(out);
    Ok(report)
}

/// Every part manifest in `dirs`, by part; a part found twice is an error.
fn find_parts(dirs: &[PathBuf]) -> Result<BTreeMap<Part, Found>, MergeError> {
    let mut parts: BTreeMap<Part, Found> = BTreeMap::new();
    let mut seen_dirs: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        if seen_dirs.iter().any(|seen| same_folder(seen, dir)) {
            continue; // the same folder named twice (e.g. OUT among the part folders)
        }
        seen_dirs.push(dir.clone());
        let entries = fs::read_dir(dir).map_err(|e| IoError::file(dir, e))?;
        let mut names: Vec<(String, Part)> = Vec::new();
        for entry in entries {
            let name = entry.map_err(|e| IoError::file(dir, e))?.file_name().to_string_lossy().into_owned();
            if let Some(part) = super::parts::part_of_manifest_file(&name) {
                names.push((name, part));
            }
        }
        if names.is_empty() {
            return Err(MergeError::NoParts { dir: dir.clone() });
        }
        names.sort();
        for (name, part) in names {
            let file = dir.join(&name);
            let manifest = PartManifest::read(&file)?;
            if manifest.part != part {
                return Err(MergeError::Output {
                    path: file,
                    problem: format!("records part {}, not the {part} its name says; rerun that part", manifest.part),
                });
            }
            if let Some(first) = parts.get(&part) {
                return Err(MergeError::Duplicate { part, first: first.file.clone(), second: file });
            }
            parts.insert(part, Found { dir: dir.clone(), file, manifest });
        }
    }
    Ok(parts)
}

/// Checks that the parts are of one conversion (tool version, source, options, recipe, plan, part count), that
/// each finished and claims the shards its number gives it, and that none is missing; returns the first part.
fn check_parts<'a>(parts: &'a BTreeMap<Part, Found>, dirs: &[PathBuf]) -> Result<&'a Found, MergeError> {
    let reference = parts.values().next().ok_or_else(|| MergeError::NoParts { dir: dirs[0].clone() })?;
    let ours = &reference.manifest;
    for found in parts.values() {
        let theirs = &found.manifest;
        let mismatch = |what: &'static str, detail: String| MergeError::Mismatch {
            part: theirs.part,
            reference: ours.part,
            file: found.file.clone(),
            what,
            detail,
        };
        if theirs.part.count != ours.part.count {
            return Err(mismatch("part count", format!("{} parts vs {}", theirs.part.count, ours.part.count)));
        }
        if theirs.manifest.version != ours.manifest.version {
            let detail = format!("squeeze {} vs {}", theirs.manifest.version, ours.manifest.version);
            return Err(mismatch("squeeze version", detail));
        }
        if theirs.source_sha256 != ours.source_sha256 {
            let detail = format!(
                "source {} (shard names, sizes and headers {}) vs {} ({})",
                theirs.manifest.source,
                short(&theirs.source_sha256),
                ours.manifest.source,
                short(&ours.source_sha256)
            );
            return Err(mismatch("source", detail));
        }
        if let Some(detail) = theirs.options.difference(&ours.options) {
            return Err(mismatch("options", detail));
        }
        if theirs.manifest.recipe != ours.manifest.recipe {
            let detail = format!(
                "recipe {} ({}) vs {} ({})",
                theirs.manifest.recipe.name,
                short(&theirs.manifest.recipe.sha256),
                ours.manifest.recipe.name,
                short(&ours.manifest.recipe.sha256)
            );
            return Err(mismatch("recipe", detail));
        }
        if theirs.manifest.card != ours.manifest.card {
            let flags = |manifest: &crate::io::manifest::Manifest| {
                crate::io::card_record::CardRecord::flags(manifest.card.as_ref())
            };
            let detail = format!("{} vs {}", flags(&theirs.manifest), flags(&ours.manifest));
            return Err(mismatch("--base-model or --tp", detail));
        }
        if theirs.manifest.plan_sha256 != ours.manifest.plan_sha256 || theirs.config != ours.config {
            let detail =
                format!("plan digest {} vs {}", short(&theirs.manifest.plan_sha256), short(&ours.manifest.plan_sha256));
            return Err(mismatch("plan", detail));
        }
        if !theirs.manifest.complete {
            return Err(MergeError::Unfinished { part: theirs.part, file: found.file.clone() });
        }
        let expected = theirs.part.range(theirs.manifest.shards.len());
        if theirs.shard_range() != expected {
            return Err(mismatch(
                "shard assignment",
                format!("shards {:?} vs the {expected:?} its number gives", theirs.shard_range()),
            ));
        }
    }
    let searched = dirs.iter().map(|dir| dir.display().to_string()).collect::<Vec<_>>().join(", ");
    for index in 1..=ours.part.count {
        let part = Part { index, count: ours.part.count };
        if !parts.contains_key(&part) {
            return Err(MergeError::Missing { part, file: super::parts::manifest_file(part), searched });
        }
    }
    Ok(reference)
}

/// Re-hashes the shards a part claims against its manifest.
fn check_shards(found: &Found) -> Result<(), MergeError> {
    let part = found.manifest.part;
    for index in found.manifest.shard_range() {
        let record = &found.manifest.manifest.shards[index];
        let path = found.dir.join(&record.file);
        let shard_error = |problem: String| MergeError::Shard { part, file: path.clone(), problem };
        let Some(sha256) = &record.sha256 else {
            return Err(shard_error("is not recorded as finished in the part manifest".into()));
        };
        if !path.exists() {
            return Err(shard_error("is missing".into()));
        }
        if sha256_file(&path)? != (record.bytes, sha256.clone()) {
            return Err(shard_error("differs from the SHA-256 or size its part manifest records".into()));
        }
    }
    Ok(())
}

/// Refuses an output folder holding shard files no part planned (a different conversion's).
fn check_output(out: &Path, shard_files: &[String]) -> Result<(), MergeError> {
    for entry in fs::read_dir(out).map_err(|e| IoError::file(out, e))? {
        let name = entry.map_err(|e| IoError::file(out, e))?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") && !shard_files.contains(&name) {
            return Err(MergeError::Output {
                path: out.to_path_buf(),
                problem: format!("holds {name}, which no part planned; merge into a new folder or remove it"),
            });
        }
    }
    Ok(())
}

enum Placed {
    InPlace,
    Linked,
    Copied,
}

/// Puts `from` at `to`: nothing when it is the same file, else a hard link (same file system) or a copy, made
/// under a temporary name and renamed, so that an interrupted merge leaves no partial file under the final name.
fn place(from: &Path, to: &Path) -> Result<Placed, IoError> {
    if let (Ok(a), Ok(b)) = (fs::canonicalize(from), fs::canonicalize(to)) {
        if a == b {
            return Ok(Placed::InPlace);
        }
    }
    let temporary = temporary_sibling(to);
    let _ = fs::remove_file(&temporary);
    let placed = if fs::hard_link(from, &temporary).is_ok() {
        Placed::Linked
    } else {
        fs::copy(from, &temporary).map_err(|e| {
            let _ = fs::remove_file(&temporary);
            IoError::file(to, e)
        })?;
        Placed::Copied
    };
    fs::rename(&temporary, to).map_err(|e| {
        let _ = fs::remove_file(&temporary);
        IoError::file(to, e)
    })?;
    // Renaming a link onto a link of the same file (a merge run again) does nothing: the temporary stays.
    if temporary.exists() {
        fs::remove_file(&temporary).map_err(|e| IoError::file(&temporary, e))?;
    }
    Ok(placed)
}

fn same_folder(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The first 12 hex digits of a digest, enough to tell two apart in a message.
fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

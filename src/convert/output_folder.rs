//! The output folder around a run: checked before any long work (not a file, not the input, empty unless
//! `--resume`/`--force`), then locked and prepared for the plan (a resumed run keeps the finished shards its manifest
//! records; a part keeps only its own), with an interrupted run's temporaries removed.

use std::fs;
use std::path::Path;

use crate::io::checkpoint::{CONFIG_FILE, INDEX_FILE, MANIFEST_FILE};
use crate::io::lock::{FolderLock, LOCK_FILE};
use crate::io::manifest::Manifest;
use crate::io::IoError;

use super::options::{ConvertError, QuantizeOptions};
use super::parts::{Part, PartManifest};

/// The checks of the output folder that need no plan digest, run before any long work (the calibration pass): not
/// a file, not the input, and empty unless `--resume` or `--force` (an interrupted run's lock and temporaries do
/// not count).
pub fn check_output(out: &Path, options: &QuantizeOptions) -> Result<(), ConvertError> {
    let output_error = |problem: String| ConvertError::Output { path: out.to_path_buf(), problem };
    if out.exists() && !out.is_dir() {
        return Err(output_error("exists and is not a folder".into()));
    }
    if let (Ok(a), Ok(b)) = (fs::canonicalize(out), fs::canonicalize(&options.input)) {
        if a == b {
            return Err(output_error("is the input folder; write the output to a new folder".into()));
        }
    }
    // A part's folder may hold the other parts' files: `prepare_part_output` checks only its own.
    if options.resume || options.force || !out.is_dir() || options.part.is_some() {
        return Ok(());
    }
    for entry in fs::read_dir(out).map_err(|e| IoError::file(out, e))? {
        let name = entry.map_err(|e| IoError::file(out, e))?.file_name().to_string_lossy().into_owned();
        if name != LOCK_FILE && !name.ends_with(".squeeze-tmp") {
            return Err(output_error(
                "is not empty; pass --resume to continue an interrupted run or --force to overwrite".into(),
            ));
        }
    }
    Ok(())
}

/// Checks and prepares the output folder and locks it for this run; returns the previous manifest when resuming
/// the same plan. Leftover temporary files (an interrupted run) do not make the folder count as used; `--force`
/// also removes the previous run's shards, index, config and manifest, so that no stray shard of another run
/// survives next to this one.
pub fn prepare_output(
    out: &Path,
    options: &QuantizeOptions,
    plan_sha256: &str,
) -> Result<(Option<Manifest>, FolderLock), ConvertError> {
    let output_error = |problem: String| ConvertError::Output { path: out.to_path_buf(), problem };
    check_output(out, options)?;
    fs::create_dir_all(out).map_err(|e| IoError::file(out, e))?;
    let lock = FolderLock::acquire(out, "quantize")?;
    let mut non_empty = false;
    for entry in fs::read_dir(out).map_err(|e| IoError::file(out, e))? {
        let path = entry.map_err(|e| IoError::file(out, e))?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name == LOCK_FILE {
            continue;
        }
        if name.ends_with(".squeeze-tmp") {
            continue; // an interrupted run's temporary: rewritten when its shard is, removed at the end
        }
        let ours = name.ends_with(".safetensors") || name == MANIFEST_FILE || crate::card::removable_by_force(&path);
        if options.force && !options.resume && ours {
            fs::remove_file(&path).map_err(|e| IoError::file(&path, e))?;
            continue;
        }
        non_empty = true;
    }
    let previous = Manifest::read(out)?;
    if non_empty && !options.resume && !options.force {
        return Err(output_error(
            "is not empty; pass --resume to continue an interrupted run or --force to overwrite".into(),
        ));
    }
    let previous = match previous {
        Some(previous) if options.resume && previous.plan_sha256 == plan_sha256 => Some(previous),
        Some(_) if options.resume && !options.force => {
            return Err(output_error(format!(
                "holds a {MANIFEST_FILE} from a different source, recipe or options; pass --force to start over"
            )))
        }
        _ => None,
    };
    if options.resume && previous.is_none() && non_empty && !options.force {
        return Err(output_error(format!("has no {MANIFEST_FILE} to resume from; pass --force to start over")));
    }
    // Nothing may look complete until this run finishes.
    for name in [CONFIG_FILE, INDEX_FILE] {
        let path = out.join(name);
        if path.exists() {
            fs::remove_file(&path).map_err(|e| IoError::file(&path, e))?;
        }
    }
    Ok((previous, lock))
}

/// Checks and prepares a part's output folder, which other parts may share: locks the part's own lock file, refuses
/// a folder holding a finished conversion, and looks only at this part's shards and manifest (`--resume`: the
/// previous part manifest when it is of the same plan; `--force`: this part's files removed).
pub fn prepare_part_output(
    out: &Path,
    options: &QuantizeOptions,
    part: Part,
    own: &[&str],
    plan_sha256: &str,
) -> Result<(Option<Manifest>, FolderLock), ConvertError> {
    let output_error = |problem: String| ConvertError::Output { path: out.to_path_buf(), problem };
    check_output(out, options)?;
    fs::create_dir_all(out).map_err(|e| IoError::file(out, e))?;
    let lock = FolderLock::acquire_named(out, &super::parts::lock_file(part), &format!("quantize --part {part}"))?;
    if out.join(MANIFEST_FILE).exists() {
        return Err(output_error(format!(
            "holds a finished conversion ({MANIFEST_FILE}); write the parts to a new folder, or remove it"
        )));
    }
    let manifest_path = out.join(super::parts::manifest_file(part));
    let present = manifest_path.exists() || own.iter().any(|file| out.join(file).exists());
    if present && !options.resume && !options.force {
        return Err(output_error(format!(
            "already holds files of part {part}; pass --resume to continue it or --force to redo it"
        )));
    }
    if options.force && !options.resume {
        for name in own.iter().copied().chain([manifest_path.file_name().and_then(|n| n.to_str()).unwrap_or("")]) {
            let path = out.join(name);
            if !name.is_empty() && path.exists() {
                fs::remove_file(&path).map_err(|e| IoError::file(&path, e))?;
            }
        }
        return Ok((None, lock));
    }
    let previous = if manifest_path.exists() { Some(PartManifest::read(&manifest_path)?) } else { None };
    let previous = match previous {
        Some(previous) if previous.manifest.plan_sha256 == plan_sha256 => Some(previous.manifest),
        Some(_) if !options.force => {
            return Err(output_error(format!(
                "holds {} from a different source, recipe or options; pass --force to redo part {part}",
                super::parts::manifest_file(part)
            )))
        }
        _ => None,
    };
    if previous.is_none() && present && !options.force {
        return Err(output_error(format!(
            "has no {} to resume part {part} from; pass --force to redo it",
            super::parts::manifest_file(part)
        )));
    }
    Ok((previous, lock))
}

/// Removes the temporaries an interrupted earlier run of this part left for its own shards (the other parts
/// sharing the folder may be writing theirs).
pub fn remove_own_temporaries(out: &Path, own: &[&str]) -> Result<(), IoError> {
    for file in own {
        let path = crate::io::atomic::temporary_sibling(&out.join(file));
        if path.exists() {
            fs::remove_file(&path).map_err(|e| IoError::file(&path, e))?;
        }
    }
    Ok(())
}

/// Removes the temporary files an interrupted earlier run left (this run's own are all renamed by now).
pub fn remove_leftover_temporaries(out: &Path) -> Result<(), IoError> {
    for entry in fs::read_dir(out).map_err(|e| IoError::file(out, e))? {
        let path = entry.map_err(|e| IoError::file(out, e))?.path();
        if path.to_string_lossy().ends_with(".squeeze-tmp") {
            fs::remove_file(&path).map_err(|e| IoError::file(&path, e))?;
        }
    }
    Ok(())
}

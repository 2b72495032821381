//! Editing a folder as one transaction: every new file is first written complete under a staged name, then a
//! journal (`.squeeze-journal.json`) records the renames, the renames run in order, and the journal is removed.
//! A run killed before the journal exists leaves the folder as it was (the staged files are cleaned up next time);
//! one killed during the renames is completed by [`complete`], which the next editing run calls first, and readers
//! refuse the folder while a journal exists ([`pending`]).

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{atomic, IoError};

pub const JOURNAL_FILE: &str = ".squeeze-journal.json";
/// Suffix of a file written complete and waiting for its rename.
pub const STAGED_SUFFIX: &str = ".squeeze-staged";
/// Test-only failpoint: exit the process (status 3, like a kill) after this many renames of a commit.
pub const FAIL_AFTER_RENAMES_ENV: &str = "SQUEEZE_FAIL_AFTER_RENAMES";

#[derive(Debug, Serialize, Deserialize)]
struct Journal {
    command: String,
    /// `[staged, final]` file names inside the folder, in commit order.
    renames: Vec<[String; 2]>,
}

/// The staged name of `final_path`.
pub fn staged(final_path: &Path) -> PathBuf {
    let mut name = final_path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(STAGED_SUFFIX);
    final_path.with_file_name(name)
}

/// Commits staged files into `folder`: each of `finals` (file names in `folder`, in the order a reader must see
/// them appear) replaces its file with the staged one.
pub fn commit(folder: &Path, command: &str, finals: &[&str]) -> Result<(), IoError> {
    let journal = Journal {
        command: command.into(),
        renames: finals.iter().map(|f| [format!("{f}{STAGED_SUFFIX}"), f.to_string()]).collect(),
    };
    let journal_path = folder.join(JOURNAL_FILE);
    atomic::write_json(&journal_path, &journal)?;
    let fail_after: Option<usize> = std::env::var(FAIL_AFTER_RENAMES_ENV).ok().and_then(|v| v.parse().ok());
    for (done, [from, to]) in journal.renames.iter().enumerate() {
        if fail_after == Some(done) {
            std::process::exit(3);
        }
        rename(folder, from, to)?;
    }
    fs::remove_file(&journal_path).map_err(|e| IoError::file(&journal_path, e))
}

/// Completes an interrupted commit in `folder`, if there is one; returns whether there was.
pub fn complete(folder: &Path) -> Result<bool, IoError> {
    let journal_path = folder.join(JOURNAL_FILE);
    if !journal_path.exists() {
        return Ok(false);
    }
    let text = fs::read(&journal_path).map_err(|e| IoError::file(&journal_path, e))?;
    let journal: Journal = serde_json::from_slice(&text)
        .map_err(|e| IoError::folder(&journal_path, format!("is not a squeeze journal ({e}); remove it")))?;
    for [from, to] in &journal.renames {
        if folder.join(from).exists() {
            rename(folder, from, to)?;
        }
    }
    fs::remove_file(&journal_path).map_err(|e| IoError::file(&journal_path, e))?;
    Ok(true)
}

/// An error for readers when `folder` has an unfinished commit.
pub fn pending(folder: &Path) -> Option<String> {
    let journal_path = folder.join(JOURNAL_FILE);
    let journal: Journal = serde_json::from_slice(&fs::read(&journal_path).ok()?).ok()?;
    Some(format!(
        "{}: an interrupted `squeeze {}` left {JOURNAL_FILE}; rerun it on this folder to complete the edit",
        folder.display(),
        journal.command
    ))
}

/// Removes staged files no journal refers to (a run killed before its commit).
pub fn remove_orphans(folder: &Path) -> Result<(), IoError> {
    for entry in fs::read_dir(folder).map_err(|e| IoError::file(folder, e))? {
        let path = entry.map_err(|e| IoError::file(folder, e))?.path();
        if path.to_string_lossy().ends_with(STAGED_SUFFIX) {
            fs::remove_file(&path).map_err(|e| IoError::file(&path, e))?;
        }
    }
    Ok(())
}

fn rename(folder: &Path, from: &str, to: &str) -> Result<(), IoError> {
    let (from, to) = (folder.join(from), folder.join(to));
    fs::rename(&from, &to).map_err(|e| IoError::file(&to, e))?;
    // The rename is durable once the folder is synced.
    if let Ok(dir) = fs::File::open(folder) {
        let _ = dir.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_then_complete_after_a_partial_commit() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a"), "old a").unwrap();
        fs::write(staged(&dir.path().join("a")), "new a").unwrap();
        fs::write(staged(&dir.path().join("b")), "new b").unwrap();
        commit(dir.path(), "calibrate-kv", &["a", "b"]).unwrap();
        assert_eq!(fs::read_to_string(dir.path().join("a")).unwrap(), "new a");
        assert_eq!(fs::read_to_string(dir.path().join("b")).unwrap(), "new b");
        assert!(!dir.path().join(JOURNAL_FILE).exists() && pending(dir.path()).is_none());
        // A commit interrupted after its first rename: readers refuse, the next run completes it.
        fs::write(staged(&dir.path().join("b")), "newer b").unwrap();
        let journal = Journal {
            command: "calibrate-kv".into(),
            renames: vec![[format!("a{STAGED_SUFFIX}"), "a".into()], [format!("b{STAGED_SUFFIX}"), "b".into()]],
        };
        fs::write(dir.path().join(JOURNAL_FILE), serde_json::to_vec(&journal).unwrap()).unwrap();
        assert!(pending(dir.path()).unwrap().contains("squeeze calibrate-kv"));
        assert!(complete(dir.path()).unwrap());
        assert_eq!(fs::read_to_string(dir.path().join("b")).unwrap(), "newer b");
        assert!(!complete(dir.path()).unwrap());
    }
}

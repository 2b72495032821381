//! One writer per folder: an advisory lock file `.squeeze.lock` (pid, host, command) created exclusively in a
//! folder for the whole run and removed when the run ends. A second run fails naming the holder; a lock left by a
//! process that is gone (same host, no `/proc/PID`) is reclaimed.
//!
//! A finished folder never holds the lock: a run makes its folder complete through [`FolderLock::release_with`],
//! which removes the lock file first and then runs the final rename, while a `flock` on the folder (taken around
//! every lock file's creation too, and dropped by the kernel when a process dies) keeps any other squeeze command
//! from taking the lock in between. A kill at any moment leaves either a locked, unfinished folder (a resume
//! reclaims the lock) or a finished, unlocked one. Locks a run of an older squeeze left in a finished folder are
//! removed by every command that opens the folder ([`clear_stale`]) and reported by `verify`.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::IoError;

pub const LOCK_FILE: &str = ".squeeze.lock";

/// A held lock; dropping it removes the file.
#[derive(Debug)]
pub struct FolderLock {
    path: PathBuf,
}

impl FolderLock {
    /// Takes the lock of `folder` (which must exist) for a run described by `what` (e.g. "quantize").
    pub fn acquire(folder: &Path, what: &str) -> Result<Self, IoError> {
        Self::acquire_named(folder, LOCK_FILE, what)
    }

    /// Takes the lock file `name` of `folder`: runs that may share a folder (the parts of one conversion) each
    /// hold their own.
    pub fn acquire_named(folder: &Path, name: &str, what: &str) -> Result<Self, IoError> {
        let path = folder.join(name);
        // Not while another run commits its folder (see `release_with`).
        let _commit = CommitGuard::take(folder);
        let holder = format!("{}\n{}\n{what}\n", std::process::id(), host());
        for _ in 0..2 {
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut file) => {
                    file.write_all(holder.as_bytes()).map_err(|e| IoError::file(&path, e))?;
                    let lock = Self { path };
                    crate::io::interrupt::register_lock(&lock.path);
                    return Ok(lock);
                }
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = Holder::read(&path);
                    if !holder.gone() {
                        return Err(IoError::folder(
                            folder,
                            format!(
                                "is in use by another squeeze run ({}); wait for it to finish, or remove {} if that \
                                 process is gone",
                                holder.describe(),
                                path.display()
                            ),
                        ));
                    }
                    // The holder died without cleaning up: reclaim.
                    holder.remove(&path);
                }
                Err(error) => return Err(IoError::file(&path, error)),
            }
        }
        Err(IoError::folder(folder, format!("could not take {}; another run keeps recreating it", path.display())))
    }
}

impl FolderLock {
    /// Releases the lock and then runs `commit` (the rename that makes the folder complete), with no other squeeze
    /// command able to take the lock in between: a run killed at any moment never leaves a finished folder holding
    /// the lock. Should `commit` fail, the folder is left unlocked and unfinished (a resume's state).
    pub fn release_with<T>(self, commit: impl FnOnce() -> Result<T, IoError>) -> Result<T, IoError> {
        let folder = self.path.parent().map(Path::to_path_buf).unwrap_or_default();
        let _commit = CommitGuard::take(&folder);
        drop(self);
        commit()
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        crate::io::interrupt::unregister_lock(&self.path);
        let _ = fs::remove_file(&self.path);
    }
}

/// An exclusive `flock` on a folder, held while a lock file is created or while a run commits its folder, released
/// when dropped or by the kernel when the process dies. Best effort: where the folder cannot be opened or the file
/// system has no `flock`, runs go on without it (the lock file alone, as before).
struct CommitGuard(Option<fs::File>);

impl CommitGuard {
    fn take(folder: &Path) -> Self {
        use std::os::fd::AsRawFd;
        let Ok(dir) = fs::File::open(folder) else { return Self(None) };
        // SAFETY: `flock` on a descriptor this guard owns; it blocks only while another run commits (a rename).
        let locked = unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) } == 0;
        Self(locked.then_some(dir))
    }
}

impl Drop for CommitGuard {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        if let Some(dir) = &self.0 {
            // SAFETY: unlocks the descriptor locked in `take` (closing it would too).
            unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_UN) };
        }
    }
}

/// What a lock file says of its holder, and its text (to remove only the lock that was read).
struct Holder {
    text: String,
    pid: Option<u32>,
    host: Option<String>,
    command: String,
}

impl Holder {
    fn read(path: &Path) -> Self {
        let text = fs::read_to_string(path).unwrap_or_default();
        let mut lines = text.lines();
        let pid = lines.next().and_then(|p| p.trim().parse().ok());
        let host = lines.next().map(str::to_string);
        let command = lines.next().unwrap_or("squeeze").to_string();
        Self { pid, host, command, text }
    }

    /// `COMMAND, pid PID, host HOST` (`?` for what the file does not say).
    fn describe(&self) -> String {
        format!(
            "{}, pid {}, host {}",
            self.command,
            self.pid.map_or("?".into(), |p| p.to_string()),
            self.host.as_deref().unwrap_or("?")
        )
    }

    /// Whether the holder is known to be gone: a process of this host that no longer exists. Another host's
    /// process cannot be checked from here, and an unreadable lock is never taken for a stale one.
    fn gone(&self) -> bool {
        match self.pid {
            Some(pid) => self.host.as_deref() == Some(host().as_str()) && !process_alive(pid),
            None => false,
        }
    }

    /// Removes the lock at `path` if it still says what was read (a new holder's lock is left alone).
    fn remove(&self, path: &Path) -> bool {
        fs::read_to_string(path).is_ok_and(|now| now == self.text) && fs::remove_file(path).is_ok()
    }
}

/// Whether `name` is one of squeeze's lock files: the folder's `.squeeze.lock` or a part's
/// `.squeeze-part-…-of-….lock`. Never a companion file of a model: no command copies one.
pub fn is_lock_file(name: &str) -> bool {
    name.starts_with(".squeeze") && name.ends_with(".lock")
}

/// A lock file found in a folder: its name, its holder (`COMMAND, pid PID, host HOST`) and whether that holder is
/// known to be gone (then [`clear_stale`] removes it).
#[derive(Debug, Clone)]
pub struct FoundLock {
    pub name: String,
    pub holder: String,
    pub gone: bool,
}

/// The lock files of `folder`, sorted by name (`verify` reports them: a folder to upload must hold none).
pub fn found(folder: &Path) -> Vec<FoundLock> {
    let Ok(entries) = fs::read_dir(folder) else { return Vec::new() };
    let mut found: Vec<FoundLock> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            is_lock_file(&name).then(|| {
                let holder = Holder::read(&entry.path());
                FoundLock { name, holder: holder.describe(), gone: holder.gone() }
            })
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// Removes the lock files of `folder` whose holder is gone (see [`Holder::gone`]) and returns their names: a run
/// killed after it finished the folder left them, and a complete folder must not look locked. Best effort: a
/// folder this process may not write (a read-only copy) keeps its locks, which then say what happened.
pub fn clear_stale(folder: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(folder) else { return Vec::new() };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_lock_file(&name) {
            continue;
        }
        let path = entry.path();
        let holder = Holder::read(&path);
        if holder.gone() && holder.remove(&path) {
            removed.push(name);
        }
    }
    removed.sort();
    removed
}

fn host() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Whether process `pid` exists (Linux `/proc`; elsewhere every holder counts as alive).
fn process_alive(pid: u32) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commit runs with the lock file already gone (so a kill after it leaves no lock in the finished folder),
    /// and a run that wants the lock meanwhile gets it only after the commit: never a moment without either.
    #[test]
    fn the_commit_runs_unlocked_yet_no_other_run_takes_the_lock_before_it_ends() {
        use std::sync::mpsc;
        use std::time::{Duration, Instant};
        let dir = tempfile::tempdir().unwrap();
        let lock = FolderLock::acquire(dir.path(), "quantize").unwrap();
        let (sender, receiver) = mpsc::channel();
        let committed = lock
            .release_with(|| {
                assert!(!dir.path().join(LOCK_FILE).exists(), "the lock file is gone before the commit");
                let folder = dir.path().to_path_buf();
                let waiter = std::thread::spawn(move || {
                    let second = FolderLock::acquire(&folder, "merge").unwrap();
                    sender.send(Instant::now()).unwrap();
                    drop(second);
                });
                std::thread::sleep(Duration::from_millis(300));
                assert!(receiver.try_recv().is_err(), "another run took the lock during the commit");
                Ok((Instant::now(), waiter))
            })
            .unwrap();
        let (commit_end, waiter) = committed;
        waiter.join().unwrap();
        assert!(receiver.recv().unwrap() >= commit_end);
        assert!(!dir.path().join(LOCK_FILE).exists());
    }

    #[test]
    fn second_holder_is_refused_and_a_dead_holder_reclaimed() {
        let dir = tempfile::tempdir().unwrap();
        let lock = FolderLock::acquire(dir.path(), "quantize").unwrap();
        let error = FolderLock::acquire(dir.path(), "calibrate-kv").unwrap_err().to_string();
        assert!(error.contains("in use by another squeeze run (quantize") && error.contains(LOCK_FILE), "{error}");
        drop(lock);
        assert!(!dir.path().join(LOCK_FILE).exists());
        // A pid that cannot exist on this host (above the kernel's pid_max ceiling of 2^22).
        fs::write(dir.path().join(LOCK_FILE), format!("{}\n{}\nquantize\n", (1u32 << 22) + 1, host())).unwrap();
        let reclaimed = FolderLock::acquire(dir.path(), "quantize").unwrap();
        drop(reclaimed);
        // Another host's lock is never reclaimed: its process cannot be checked from here.
        fs::write(dir.path().join(LOCK_FILE), format!("{}\nother-host\nquantize\n", (1u32 << 22) + 1)).unwrap();
        assert!(FolderLock::acquire(dir.path(), "quantize").is_err());
    }

    #[test]
    fn only_the_locks_of_gone_holders_are_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let dead = format!("{}\n{}\nquantize\n", (1u32 << 22) + 1, host());
        fs::write(dir.path().join(LOCK_FILE), &dead).unwrap();
        fs::write(dir.path().join(".squeeze-part-00002-of-00002.lock"), &dead).unwrap();
        // A live holder (this process), another host's and an unreadable lock stay; other files are not locks.
        let live = dir.path().join(".squeeze-part-00001-of-00002.lock");
        fs::write(&live, format!("{}\n{}\nquantize\n", std::process::id(), host())).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        fs::write(elsewhere.path().join(LOCK_FILE), format!("{}\nother-host\nmerge\n", (1u32 << 22) + 1)).unwrap();
        fs::write(dir.path().join("notes.lock"), &dead).unwrap();
        assert_eq!(clear_stale(dir.path()), [".squeeze-part-00002-of-00002.lock", LOCK_FILE]);
        assert!(live.exists() && dir.path().join("notes.lock").exists());
        assert!(clear_stale(elsewhere.path()).is_empty());
        fs::write(elsewhere.path().join(LOCK_FILE), "garbage").unwrap();
        assert!(clear_stale(elsewhere.path()).is_empty());
        assert!(
            is_lock_file(LOCK_FILE) && is_lock_file(".squeeze-part-00001-of-00004.lock") && !is_lock_file("a.lock")
        );
    }
}

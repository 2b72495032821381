//! One writer per folder: an advisory lock file `.squeeze.lock` (pid, host, command) created exclusively in a
//! folder for the whole run and removed when the run ends. A second run fails naming the holder; a lock left by a
//! process that is gone (same host, no `/proc/PID`) is reclaimed.

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
                    let text = fs::read_to_string(&path).unwrap_or_default();
                    let mut lines = text.lines();
                    let (pid, lock_host, command) = (lines.next(), lines.next(), lines.next().unwrap_or("squeeze"));
                    let pid: Option<u32> = pid.and_then(|p| p.trim().parse().ok());
                    let stale = match pid {
                        Some(pid) => lock_host == Some(host().as_str()) && !process_alive(pid),
                        None => false,
                    };
                    if !stale {
                        return Err(IoError::folder(
                            folder,
                            format!(
                                "is in use by another squeeze run ({command}, pid {}, host {}); wait for it to finish, \
                                 or remove {} if that process is gone",
                                pid.map_or("?".into(), |p| p.to_string()),
                                lock_host.unwrap_or("?"),
                                path.display()
                            ),
                        ));
                    }
                    // The holder died without cleaning up: reclaim.
                    let _ = fs::remove_file(&path);
                }
                Err(error) => return Err(IoError::file(&path, error)),
            }
        }
        Err(IoError::folder(folder, format!("could not take {}; another run keeps recreating it", path.display())))
    }
}

impl Drop for FolderLock {
    fn drop(&mut self) {
        crate::io::interrupt::unregister_lock(&self.path);
        let _ = fs::remove_file(&self.path);
    }
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
}

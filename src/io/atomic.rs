//! Atomic writes of small files: write a temporary sibling, flush it to disk, rename it over the target.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::IoError;

/// The temporary sibling a file is written to before it is renamed into place.
pub fn temporary_sibling(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".squeeze-tmp");
    path.with_file_name(name)
}

/// Writes `bytes` to `path` atomically.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), IoError> {
    let temporary = temporary_sibling(path);
    let result = (|| {
        let mut file = super::interrupt::create_temporary(&temporary, || fs::File::create(&temporary))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temporary, path)
    })();
    super::interrupt::unregister_temporary(&temporary);
    result.map_err(|source| {
        let _ = fs::remove_file(&temporary);
        IoError::file(path, source)
    })
}

/// Writes `value` as pretty JSON (with a trailing newline) to `path` atomically.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), IoError> {
    let mut text =
        serde_json::to_vec_pretty(value).map_err(|error| IoError::file(path, std::io::Error::other(error)))?;
    text.push(b'\n');
    write_file(path, &text)
}

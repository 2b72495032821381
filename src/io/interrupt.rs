//! SIGINT/SIGTERM during a run: remove the temporary files being written and the folder locks held, say how to
//! continue, and exit 130. Every visible file is written to a temporary sibling and renamed, so what remains after
//! an interrupt is either complete (and recorded in the manifest) or absent; `--resume` continues from there.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

#[derive(Default)]
struct Pending {
    temporaries: Vec<PathBuf>,
    locks: Vec<PathBuf>,
    /// What to tell the user, e.g. "rerun with --resume to continue".
    hint: Option<String>,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending { temporaries: Vec::new(), locks: Vec::new(), hint: None });
static INSTALL: Once = Once::new();

/// Installs the handler (once per process; later calls do nothing).
pub fn install() {
    INSTALL.call_once(|| {
        // A handler that cannot be installed (another one is set) leaves the default: the process dies and
        // `--resume` still cleans up after it.
        let _ = ctrlc::set_handler(|| {
            let pending = PENDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            for path in pending.temporaries.iter().chain(&pending.locks) {
                let _ = std::fs::remove_file(path);
            }
            match &pending.hint {
                Some(hint) => eprintln!("interrupted: nothing half-written was left; {hint}"),
                None => eprintln!("interrupted"),
            }
            std::process::exit(130);
        });
    });
}

fn with(edit: impl FnOnce(&mut Pending)) {
    edit(&mut PENDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
}

/// Creates the temporary file `path` with `create` and registers it, with the handler held off meanwhile: an
/// interrupt removes the file whichever side of its creation it lands on (registering after the creation left a
/// window in which an interrupt kept the file; registering before left one in which the handler removed the path
/// before it existed and the file was created while the process exited).
pub fn create_temporary<T>(path: &Path, create: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    let mut pending = PENDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let created = create()?;
    pending.temporaries.push(path.to_path_buf());
    Ok(created)
}

pub fn unregister_temporary(path: &Path) {
    with(|p| p.temporaries.retain(|t| t != path));
}

pub fn register_lock(path: &Path) {
    with(|p| p.locks.push(path.to_path_buf()));
}

pub fn unregister_lock(path: &Path) {
    with(|p| p.locks.retain(|t| t != path));
}

/// What to print after an interrupt (the command that continues the run).
pub fn set_hint(hint: impl Into<String>) {
    with(|p| p.hint = Some(hint.into()));
}

//! What every subcommand's runner shares: its [`Outcome`] (the exit code), result lines and JSON on stdout, and the
//! runtime backend opened for `--device` with its notice on stderr, and an error's context said once
//! ([`ContextUnlessNamed`]).

/// What a subcommand concluded.
pub enum Outcome {
    Success,
    /// A check the user asked for failed (verify mismatch, eval gate, integrity fault).
    GateFailed,
}

/// The runtime backend for `--device`, printing the CPU-fallback notice of `auto` to stderr.
pub(crate) fn open_backend(
    choice: crate::runtime::device::DeviceChoice,
) -> anyhow::Result<Box<dyn crate::runtime::Backend>> {
    let (backend, notice) = crate::runtime::open_backend::open_backend(choice)?;
    if let Some(notice) = notice {
        eprintln!("note: {notice}");
    }
    Ok(backend)
}

/// Writes one line to stdout; on a closed pipe exits 0 (the reader has what it wanted), on another write error
/// exits 2 naming it.
pub(crate) fn print_line(line: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(error) = out.write_fmt(line).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush()) {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {error}");
        std::process::exit(2);
    }
}

/// Prints a serializable report as pretty JSON on stdout.
pub(super) fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// `with_context` for a job's error that names its own folder or file: the context (`quantize DIR`) is added only
/// where the error's chain does not already name `subject` (as `SUBJECT:` or `SUBJECT/…`), so that a chain says
/// each fact once ("quantize DIR: DIR: is not a model folder" otherwise).
pub(crate) trait ContextUnlessNamed<T> {
    fn context_unless_named(self, subject: &str, context: impl FnOnce() -> String) -> anyhow::Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> ContextUnlessNamed<T> for Result<T, E> {
    fn context_unless_named(self, subject: &str, context: impl FnOnce() -> String) -> anyhow::Result<T> {
        self.map_err(|error| {
            let error = anyhow::Error::new(error);
            let text = format!("{error:#}");
            if text.contains(&format!("{subject}:")) || text.contains(&format!("{subject}/")) {
                error
            } else {
                error.context(context())
            }
        })
    }
}

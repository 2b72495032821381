//! What every subcommand's runner shares: its [`Outcome`] (the exit code), result lines and JSON on stdout, and the
//! runtime backend opened for `--device` with its notice on stderr.

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

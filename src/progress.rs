//! How long-running jobs report progress without printing: the CLI hands them a [`Reporter`].

/// Receives progress from a job. Implementations must be cheap and thread-safe.
pub trait Reporter: Sync {
    /// A phase with `total` units (bytes, tensors, layers) begins.
    fn begin(&self, label: &str, total: u64);
    /// `units` more are done.
    fn advance(&self, units: u64);
    /// The phase ends.
    fn end(&self);
    /// A warning or notice for the user (printed on stderr by the CLI).
    fn warn(&self, message: &str);
}

/// A reporter that discards everything (library use, tests).
pub struct Silent;

impl Reporter for Silent {
    fn begin(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn end(&self) {}
    fn warn(&self, _: &str) {}
}

/// Peak resident set size of this process in bytes (`VmHWM`), if the platform reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

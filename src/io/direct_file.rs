//! A large file written front to back without passing through the page cache (Linux `O_DIRECT`, through two
//! aligned staging buffers and a thread that writes one while the caller fills the other) where the filesystem
//! allows it, buffered with early writeback elsewhere.
//!
//! Why: a buffered write makes the kernel copy every byte into the page cache (on a 2-core VM that copy was 36 %
//! of a `ct-minmax` conversion's CPU samples) and leaves gigabytes of dirty pages for the closing `fsync`; a
//! direct write hands the buffer to the disk, costs almost no CPU, and keeps the output out of the page cache,
//! which then holds the input it is still reading. The bytes on disk are the same either way.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, Write};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

/// Alignment of the buffer address, file offsets and lengths of direct writes: the largest logical block size of
/// common devices, so every filesystem that accepts `O_DIRECT` accepts it.
const BLOCK: usize = 4096;

/// Bytes staged before one write: large enough for full-speed sequential disk writes (two such buffers exist per
/// file).
const BUFFER_BYTES: usize = 8 << 20;

/// Buffered mode only: how many written bytes accumulate before their writeback starts, so the `fsync` that ends
/// the file waits for the last few MiB instead of everything past `dirty_background_ratio`.
const WRITEBACK_BYTES: u64 = 64 << 20;

/// A file being written sequentially. The caller's bytes are copied into a staging buffer; a full buffer goes to
/// the file's disk thread, which writes it (a direct write waits for the disk) while the caller fills the other.
/// `finish` writes the tail, sets the exact length and syncs the file to disk.
pub struct SequentialFile {
    staging: Staging,
    filled: usize,
    /// The second buffer while the disk thread holds none.
    spare: Option<Staging>,
    to_disk: Option<SyncSender<Job>>,
    from_disk: Receiver<Staging>,
    disk: Option<JoinHandle<io::Result<()>>>,
}

/// `BUFFER_BYTES` block-aligned bytes (inside a `Vec` one block longer; moving it keeps the alignment).
struct Staging {
    bytes: Vec<u8>,
    start: usize,
}

impl Staging {
    fn new() -> Self {
        let bytes = vec![0u8; BUFFER_BYTES + BLOCK];
        let start = bytes.as_ptr().align_offset(BLOCK);
        Self { bytes, start }
    }

    fn area(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + BUFFER_BYTES]
    }
}

/// What the disk thread is handed: a full buffer, or the tail (its length) that ends the file.
enum Job {
    Write(Staging),
    Finish(Staging, usize),
}

impl SequentialFile {
    /// Creates (truncates) `path`, opened for direct writes where the filesystem supports them.
    pub fn create(path: &Path) -> io::Result<Self> {
        Self::create_with(path, true)
    }

    fn create_with(path: &Path, try_direct: bool) -> io::Result<Self> {
        let (file, direct) = open(path, try_direct)?;
        let disk = Disk { file, direct, written: 0, handed_to_disk: 0 };
        let (to_disk, jobs) = sync_channel(1);
        let (returned, from_disk) = sync_channel(2);
        let thread = std::thread::Builder::new().name("squeeze-disk".into()).spawn(move || disk.run(jobs, returned))?;
        Ok(Self {
            staging: Staging::new(),
            filled: 0,
            spare: Some(Staging::new()),
            to_disk: Some(to_disk),
            from_disk,
            disk: Some(thread),
        })
    }

    /// Appends `bytes`.
    pub fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let take = (BUFFER_BYTES - self.filled).min(bytes.len());
            self.staging.area()[self.filled..self.filled + take].copy_from_slice(&bytes[..take]);
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled == BUFFER_BYTES {
                self.hand_over()?;
            }
        }
        Ok(())
    }

    /// Writes the staged tail and flushes the file to disk; the error of any earlier write surfaces here at the
    /// latest.
    pub fn finish(mut self) -> io::Result<()> {
        let staging = std::mem::replace(&mut self.staging, Staging { bytes: Vec::new(), start: 0 });
        let sent = self.to_disk.take().is_some_and(|to_disk| to_disk.send(Job::Finish(staging, self.filled)).is_ok());
        let outcome = self.join_disk();
        if !sent && outcome.is_ok() {
            return Err(io::Error::other("the disk thread stopped before the file was finished"));
        }
        outcome
    }

    /// Sends the full staging buffer to the disk thread and continues in the other one.
    fn hand_over(&mut self) -> io::Result<()> {
        let next = match self.spare.take() {
            Some(spare) => spare,
            None => match self.from_disk.recv() {
                Ok(returned) => returned,
                Err(_) => return Err(self.disk_failure()),
            },
        };
        let full = std::mem::replace(&mut self.staging, next);
        self.filled = 0;
        let sent = self.to_disk.as_ref().is_some_and(|to_disk| to_disk.send(Job::Write(full)).is_ok());
        if sent {
            Ok(())
        } else {
            Err(self.disk_failure())
        }
    }

    /// The error that stopped the disk thread.
    fn disk_failure(&mut self) -> io::Error {
        self.to_disk = None;
        match self.join_disk() {
            Err(error) => error,
            Ok(()) => io::Error::other("the disk thread stopped before the file was finished"),
        }
    }

    fn join_disk(&mut self) -> io::Result<()> {
        self.to_disk = None;
        match self.disk.take().map(JoinHandle::join) {
            None => Ok(()),
            Some(Ok(outcome)) => outcome,
            Some(Err(_)) => Err(io::Error::other("the disk thread panicked")),
        }
    }
}

impl Drop for SequentialFile {
    /// An unfinished file (the caller gave up) is closed before the caller removes it.
    fn drop(&mut self) {
        let _ = self.join_disk();
    }
}

/// The disk thread's side: the open file and what has been written to it.
struct Disk {
    file: File,
    direct: bool,
    /// Bytes written to the file so far.
    written: u64,
    /// Buffered mode: bytes whose writeback has been started.
    handed_to_disk: u64,
}

impl Disk {
    /// Writes the buffers it is handed, returning each once written, until the tail ends the file; stops at the
    /// first error (the caller sees the channels close and collects the error by joining).
    fn run(mut self, jobs: Receiver<Job>, returned: SyncSender<Staging>) -> io::Result<()> {
        for job in jobs {
            match job {
                Job::Write(mut staging) => {
                    self.write(&staging.area()[..BUFFER_BYTES])?;
                    let _ = returned.send(staging);
                }
                Job::Finish(mut staging, tail) => return self.finish(staging.area(), tail),
            }
        }
        Ok(()) // the caller gave up: the file stays as it is, to be removed
    }

    /// Writes the first `tail` bytes of `area` (padded to a block for a direct write, then cut back to the exact
    /// length) and syncs the file.
    fn finish(&mut self, area: &mut [u8], tail: usize) -> io::Result<()> {
        if tail > 0 {
            if self.direct {
                let padded = tail.div_ceil(BLOCK) * BLOCK;
                area[tail..padded].fill(0);
                self.write(&area[..padded])?;
                // The padding was written past the end; the file's length is what was appended.
                self.written -= (padded - tail) as u64;
                self.file.set_len(self.written)?;
            } else {
                self.write(&area[..tail])?;
            }
        }
        self.file.sync_all()
    }

    /// Writes `bytes` at the file's current position.
    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self.file.write_all(bytes) {
            // A filesystem may accept `O_DIRECT` at open and refuse a write (alignment it wants larger, or a short
            // write leaving an unaligned remainder): the rest of the file is written buffered.
            Err(error) if self.direct && error.raw_os_error() == Some(EINVAL) => {
                self.direct = false;
                leave_direct(&self.file)?;
                let done = (self.file.stream_position()? - self.written) as usize;
                self.file.write_all(&bytes[done..])?;
            }
            other => other?,
        }
        self.written += bytes.len() as u64;
        if !self.direct && self.written - self.handed_to_disk >= WRITEBACK_BYTES {
            start_writeback(&self.file, self.handed_to_disk, self.written - self.handed_to_disk);
            self.handed_to_disk = self.written;
        }
        Ok(())
    }
}

#[cfg(target_os = "linux")]
const EINVAL: i32 = libc::EINVAL;
#[cfg(not(target_os = "linux"))]
const EINVAL: i32 = 22;

/// Opens `path` for writing, with `O_DIRECT` when `try_direct` and the filesystem takes it; says which.
#[cfg(target_os = "linux")]
fn open(path: &Path, try_direct: bool) -> io::Result<(File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    let options = || {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        options
    };
    if !try_direct {
        return Ok((options().open(path)?, false));
    }
    match options().custom_flags(libc::O_DIRECT).open(path) {
        Ok(file) => Ok((file, true)),
        // tmpfs and some network filesystems refuse O_DIRECT.
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => Ok((options().open(path)?, false)),
        Err(error) => Err(error),
    }
}

#[cfg(not(target_os = "linux"))]
fn open(path: &Path, _try_direct: bool) -> io::Result<(File, bool)> {
    Ok((OpenOptions::new().write(true).create(true).truncate(true).open(path)?, false))
}

/// Clears `O_DIRECT` on an open file, so later writes go through the page cache.
#[cfg(target_os = "linux")]
fn leave_direct(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain fcntl calls on a descriptor that stays open for their duration; no memory is passed.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_DIRECT) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn leave_direct(_file: &File) -> io::Result<()> {
    Ok(())
}

/// Starts writing `length` bytes from `offset` of `file` to disk without waiting for them (a hint: the `fsync` in
/// `finish` is what makes the file durable, so a failure here changes nothing and is ignored).
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, length: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(length)) = (libc::off64_t::try_from(offset), libc::off64_t::try_from(length)) else {
        return;
    };
    // SAFETY: the descriptor is open for the duration of the call and the call reads no memory of ours.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, length, libc::SYNC_FILE_RANGE_WRITE) };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _length: u64) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(length: usize, seed: usize) -> Vec<u8> {
        (0..length).map(|j| (j.wrapping_mul(31) ^ seed.wrapping_mul(0x9E37)) as u8).collect()
    }

    /// Pieces that straddle the staging buffer and end off a block boundary, in direct and buffered mode alike,
    /// give a file of exactly the bytes appended.
    #[test]
    fn the_file_holds_exactly_the_bytes_appended_in_either_mode() {
        let dir = tempfile::tempdir().unwrap();
        for (case, sizes) in [
            vec![0, 1, 4095, 4097],
            vec![BUFFER_BYTES - 3, 5, BUFFER_BYTES + 11, 100],
            vec![BUFFER_BYTES],
            vec![3 * BUFFER_BYTES + BLOCK],
        ]
        .iter()
        .enumerate()
        {
            for buffered in [false, true] {
                let path = dir.path().join(format!("case{case}-{buffered}"));
                let mut file = SequentialFile::create_with(&path, !buffered).unwrap();
                let mut expected = Vec::new();
                for (i, &size) in sizes.iter().enumerate() {
                    let bytes = pattern(size, i);
                    file.write_all(&bytes).unwrap();
                    expected.extend_from_slice(&bytes);
                }
                file.finish().unwrap();
                let written = std::fs::read(&path).unwrap();
                assert_eq!(written.len(), expected.len(), "case {case}, buffered {buffered}");
                assert!(written == expected, "case {case}, buffered {buffered}: contents differ");
            }
        }
    }

    /// A write the disk refuses (`/dev/full`: no space) is an error of a later `write_all` or of `finish`, never
    /// lost in the disk thread.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_refused_write_is_reported_to_the_caller() {
        let mut file = SequentialFile::create(Path::new("/dev/full")).unwrap();
        let mut failed = Vec::new();
        for i in 0..4 {
            if let Err(error) = file.write_all(&pattern(BUFFER_BYTES, i)) {
                failed.push(error);
                break;
            }
        }
        let error = match failed.pop() {
            Some(error) => error,
            None => file.finish().expect_err("finish must report the refused writes"),
        };
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    }
}

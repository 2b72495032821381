//! A large file written front to back without passing through the page cache (Linux `O_DIRECT`, through an
//! aligned staging buffer) where the filesystem allows it, buffered with early writeback elsewhere.
//!
//! Why: a buffered write makes the kernel copy every byte into the page cache (on a 2-core VM that copy was 36 %
//! of a `ct-minmax` conversion's CPU samples) and leaves gigabytes of dirty pages for the closing `fsync`; a
//! direct write hands the buffer to the disk, costs almost no CPU, and keeps the output out of the page cache,
//! which then holds the input it is still reading. The bytes on disk are the same either way.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, Write};
use std::path::Path;

/// Alignment of the buffer address, file offsets and lengths of direct writes: the largest logical block size of
/// common devices, so every filesystem that accepts `O_DIRECT` accepts it.
const BLOCK: usize = 4096;

/// Bytes staged before one write: large enough for full-speed sequential disk writes.
const BUFFER_BYTES: usize = 8 << 20;

/// Buffered mode only: how many written bytes accumulate before their writeback starts, so the `fsync` that ends
/// the file waits for the last few MiB instead of everything past `dirty_background_ratio`.
const WRITEBACK_BYTES: u64 = 64 << 20;

/// A file being written sequentially; `finish` writes the tail, sets the exact length and syncs it to disk.
pub struct SequentialFile {
    file: File,
    /// `BUFFER_BYTES + BLOCK` bytes, of which `BUFFER_BYTES` from `start` are block-aligned.
    buffer: Vec<u8>,
    start: usize,
    filled: usize,
    /// Bytes handed to the file so far (the staged ones excluded).
    written: u64,
    direct: bool,
    /// Buffered mode: bytes whose writeback has been started.
    handed_to_disk: u64,
}

impl SequentialFile {
    /// Creates (truncates) `path`, opened for direct writes where the filesystem supports them.
    pub fn create(path: &Path) -> io::Result<Self> {
        let (file, direct) = open(path)?;
        let buffer = vec![0u8; BUFFER_BYTES + BLOCK];
        let start = buffer.as_ptr().align_offset(BLOCK);
        Ok(Self { file, buffer, start, filled: 0, written: 0, direct, handed_to_disk: 0 })
    }

    /// Appends `bytes`.
    pub fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let take = (BUFFER_BYTES - self.filled).min(bytes.len());
            let at = self.start + self.filled;
            self.buffer[at..at + take].copy_from_slice(&bytes[..take]);
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled == BUFFER_BYTES {
                self.write_staged(BUFFER_BYTES)?;
                self.filled = 0;
            }
        }
        Ok(())
    }

    /// Writes the staged tail (padded to a block for a direct write, then cut back to the exact length) and
    /// flushes the file to disk.
    pub fn finish(mut self) -> io::Result<()> {
        let tail = self.filled;
        if tail > 0 {
            if self.direct {
                let padded = tail.div_ceil(BLOCK) * BLOCK;
                self.buffer[self.start + tail..self.start + padded].fill(0);
                self.write_staged(padded)?;
                // The padding was written past the end; the file's length is what was appended.
                self.written -= (padded - tail) as u64;
                self.file.set_len(self.written)?;
            } else {
                self.write_staged(tail)?;
            }
        }
        self.file.sync_all()
    }

    /// Writes the first `length` staged bytes at the file's current position.
    fn write_staged(&mut self, length: usize) -> io::Result<()> {
        let staged = &self.buffer[self.start..self.start + length];
        match self.file.write_all(staged) {
            // A filesystem may accept `O_DIRECT` at open and refuse a write (alignment it wants larger, or a short
            // write leaving an unaligned remainder): the rest of the file is written buffered.
            Err(error) if self.direct && error.raw_os_error() == Some(EINVAL) => {
                self.direct = false;
                leave_direct(&self.file)?;
                let done = (self.file.stream_position()? - self.written) as usize;
                self.file.write_all(&staged[done..])?;
            }
            other => other?,
        }
        self.written += length as u64;
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

#[cfg(target_os = "linux")]
fn open(path: &Path) -> io::Result<(File, bool)> {
    use std::os::unix::fs::OpenOptionsExt;
    let options = || {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        options
    };
    match options().custom_flags(libc::O_DIRECT).open(path) {
        Ok(file) => Ok((file, true)),
        // tmpfs and some network filesystems refuse O_DIRECT.
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => Ok((options().open(path)?, false)),
        Err(error) => Err(error),
    }
}

#[cfg(not(target_os = "linux"))]
fn open(path: &Path) -> io::Result<(File, bool)> {
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
                let mut file = SequentialFile::create(&path).unwrap();
                if buffered && file.direct {
                    leave_direct(&file.file).unwrap();
                    file.direct = false;
                }
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
}

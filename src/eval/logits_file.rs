//! A single-tensor safetensors file (`logits`, F32 `[n, ctx, vocab]`) written sequence by sequence to a temporary
//! sibling and renamed into place when complete, so a killed run never leaves a file that looks whole.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::io::atomic::temporary_sibling;
use crate::io::IoError;

pub struct LogitsWriter {
    path: PathBuf,
    temporary: PathBuf,
    out: BufWriter<File>,
    remaining: u64,
}

impl LogitsWriter {
    pub fn create(path: &Path, shape: [usize; 3]) -> Result<Self, IoError> {
        let bytes = shape.iter().product::<usize>() as u64 * 4;
        let mut header =
            serde_json::json!({ "logits": { "dtype": "F32", "shape": shape, "data_offsets": [0, bytes] } })
                .to_string()
                .into_bytes();
        while !header.len().is_multiple_of(8) {
            header.push(b' ');
        }
        let temporary = temporary_sibling(path);
        let file = File::create(&temporary).map_err(|e| IoError::file(&temporary, e))?;
        let mut out = BufWriter::with_capacity(8 << 20, file);
        let result = out.write_all(&(header.len() as u64).to_le_bytes()).and_then(|_| out.write_all(&header));
        result.map_err(|e| IoError::file(&temporary, e))?;
        Ok(Self { path: path.to_path_buf(), temporary, out, remaining: bytes })
    }

    /// Appends the next sequence's `[ctx, vocab]` logits.
    pub fn append(&mut self, logits: &[f32]) -> Result<(), IoError> {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        if bytes.len() as u64 > self.remaining {
            return Err(IoError::file(
                &self.path,
                std::io::Error::other("more logits than the planned shape (internal error)"),
            ));
        }
        self.remaining -= bytes.len() as u64;
        self.out.write_all(&bytes).map_err(|e| IoError::file(&self.temporary, e))
    }

    /// Flushes, syncs and renames the file into place.
    pub fn finish(mut self) -> Result<(), IoError> {
        if self.remaining != 0 {
            let _ = fs::remove_file(&self.temporary);
            return Err(IoError::file(
                &self.path,
                std::io::Error::other("fewer logits than the planned shape (internal error)"),
            ));
        }
        let result = self
            .out
            .flush()
            .and_then(|_| self.out.get_ref().sync_all())
            .and_then(|_| fs::rename(&self.temporary, &self.path));
        result.map_err(|e| {
            let _ = fs::remove_file(&self.temporary);
            IoError::file(&self.path, e)
        })
    }

    /// Removes the temporary file after a failure.
    pub fn abandon(self) {
        let temporary = self.temporary.clone();
        drop(self.out);
        let _ = fs::remove_file(temporary);
    }
}

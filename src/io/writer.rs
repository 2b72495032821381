//! Streaming safetensors writer: the header is written first from the planned tensor list, tensor bytes are
//! appended in plan order while they are hashed (SHA-256), and the file is renamed into place only when complete.
//! The bytes go to disk as they come, bypassing the page cache where the filesystem allows (`SequentialFile`).

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::atomic::temporary_sibling;
use super::direct_file::SequentialFile;
use super::dtype::{dtype_name, tensor_bytes, Dtype};
use super::IoError;

/// One tensor of a planned shard.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlannedTensor {
    pub name: String,
    #[serde(with = "dtype_serde")]
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl PlannedTensor {
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: Vec<usize>) -> Self {
        Self { name: name.into(), dtype, shape }
    }

    pub fn bytes(&self) -> u64 {
        tensor_bytes(self.dtype, &self.shape)
    }
}

/// Serialized safetensors header (length prefix included) for tensors laid out in the given order.
pub fn header_bytes(tensors: &[PlannedTensor]) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    let mut metadata = serde_json::Map::new();
    metadata.insert("format".into(), "pt".into());
    map.insert("__metadata__".into(), serde_json::Value::Object(metadata));
    let mut offset = 0u64;
    for tensor in tensors {
        let end = offset + tensor.bytes();
        map.insert(
            tensor.name.clone(),
            serde_json::json!({ "dtype": dtype_name(tensor.dtype), "shape": tensor.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut json = serde_json::to_vec(&map).expect("a map of strings and numbers always serializes");
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut bytes = Vec::with_capacity(8 + json.len());
    bytes.extend_from_slice(&(json.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&json);
    bytes
}

/// Size of the finished file holding `tensors`.
pub fn file_bytes(tensors: &[PlannedTensor]) -> u64 {
    header_bytes(tensors).len() as u64 + tensors.iter().map(PlannedTensor::bytes).sum::<u64>()
}

/// Pieces from this size up are hashed beside their write ([`ShardWriter::put`]).
const PARALLEL_HASH_BYTES: usize = 1 << 20;

/// A shard being written: tensors must be appended in plan order with their exact sizes.
pub struct ShardWriter {
    path: PathBuf,
    temporary: PathBuf,
    out: SequentialFile,
    hasher: Sha256,
    tensors: Vec<PlannedTensor>,
    next: usize,
    written: u64,
}

/// What a finished shard looks like.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FinishedShard {
    pub file: String,
    pub bytes: u64,
    pub sha256: String,
}

impl ShardWriter {
    /// Creates the temporary sibling of `path` and writes the header.
    pub fn create(path: &Path, tensors: Vec<PlannedTensor>) -> Result<Self, IoError> {
        let temporary = temporary_sibling(path);
        let out = super::interrupt::create_temporary(&temporary, || SequentialFile::create(&temporary))
            .map_err(|e| IoError::file(&temporary, e))?;
        let mut writer =
            Self { path: path.to_path_buf(), temporary, out, hasher: Sha256::new(), tensors, next: 0, written: 0 };
        let header = header_bytes(&writer.tensors);
        writer.put(&header)?;
        Ok(writer)
    }

    /// Appends the bytes of the next planned tensor (possibly in several pieces, ended by `end_tensor`).
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<(), IoError> {
        let Some(planned) = self.tensors.get(self.next) else {
            return Err(IoError::tensor(
                &self.path,
                name,
                "written after the planned tensors were complete (internal error)",
            ));
        };
        if planned.name != name || planned.bytes() != bytes.len() as u64 {
            return Err(IoError::tensor(
                &self.path,
                name,
                format!(
                    "expected `{}` with {} bytes next but got {} bytes (internal error)",
                    planned.name,
                    planned.bytes(),
                    bytes.len()
                ),
            ));
        }
        self.next += 1;
        self.put(bytes)
    }

    /// Hashes and writes `bytes`; a large piece is hashed on a second thread while this one writes it, so that a
    /// conversion with little to compute (an MXFP4 pass-through or cast) costs the longer of the two, not their sum
    /// (SHA-256 was 58 % of such a run's CPU time, the writes waiting on it). The same bytes in the same order: the
    /// same digest.
    fn put(&mut self, bytes: &[u8]) -> Result<(), IoError> {
        self.written += bytes.len() as u64;
        let (hasher, out) = (&mut self.hasher, &mut self.out);
        let written = if bytes.len() >= PARALLEL_HASH_BYTES {
            std::thread::scope(|scope| {
                let hashing = scope.spawn(|| hasher.update(bytes));
                let written = out.write_all(bytes);
                hashing.join().map_err(|_| std::io::Error::other("the hashing thread panicked")).and(written)
            })
        } else {
            hasher.update(bytes);
            out.write_all(bytes)
        };
        written.map_err(|e| IoError::file(&self.temporary, e))
    }

    /// Flushes, syncs and renames the file into place.
    pub fn finish(self) -> Result<FinishedShard, IoError> {
        if self.next != self.tensors.len() {
            let missing = self.tensors[self.next].name.clone();
            let path = self.path.clone();
            self.abandon();
            return Err(IoError::tensor(path, missing, "was planned but never written (internal error)"));
        }
        let temporary = self.temporary.clone();
        let result = self.out.finish().and_then(|()| fs::rename(&self.temporary, &self.path));
        super::interrupt::unregister_temporary(&temporary);
        if let Err(source) = result {
            let _ = fs::remove_file(&temporary);
            return Err(IoError::file(&temporary, source));
        }
        let file = self.path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        Ok(FinishedShard { file, bytes: self.written, sha256: crate::hex::hex(&self.hasher.finalize()) })
    }

    /// Removes the temporary file after a failure.
    pub fn abandon(self) {
        let temporary = self.temporary.clone();
        drop(self.out);
        super::interrupt::unregister_temporary(&temporary);
        let _ = fs::remove_file(temporary);
    }
}

/// SHA-256 of a file, read in large blocks.
pub fn sha256_file(path: &Path) -> Result<(u64, String), IoError> {
    use std::io::Read;
    let mut file = File::open(path).map_err(|e| IoError::file(path, e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 8 << 20];
    let mut total = 0u64;
    loop {
        let read = file.read(&mut buffer).map_err(|e| IoError::file(path, e))?;
        if read == 0 {
            break;
        }
        total += read as u64;
        hasher.update(&buffer[..read]);
    }
    Ok((total, crate::hex::hex(&hasher.finalize())))
}

mod dtype_serde {
    use super::Dtype;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(dtype: &Dtype, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&dtype.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Dtype, D::Error> {
        let text = String::deserialize(deserializer)?;
        serde_json::from_value(serde_json::Value::String(text)).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard written in pieces that straddle the output file's staging buffer (8 MiB) and end off a block
    /// boundary holds exactly the header and the bytes appended, and its recorded hash is the file's.
    #[test]
    fn a_shard_is_written_whole_and_its_hash_is_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let step = 8 << 20;
        let sizes = [step - 3, step + 5, 1000, step / 2 + 7];
        let tensors: Vec<PlannedTensor> =
            sizes.iter().enumerate().map(|(i, &n)| PlannedTensor::new(format!("t{i}"), Dtype::U8, vec![n])).collect();
        let mut writer = ShardWriter::create(&path, tensors.clone()).unwrap();
        let mut expected = header_bytes(&tensors);
        for (i, &n) in sizes.iter().enumerate() {
            let bytes: Vec<u8> = (0..n).map(|j| (j * 31 + i * 7) as u8).collect();
            writer.write_tensor(&format!("t{i}"), &bytes).unwrap();
            expected.extend_from_slice(&bytes);
        }
        let finished = writer.finish().unwrap();
        let written = fs::read(&path).unwrap();
        assert_eq!(written.len(), expected.len());
        assert!(written == expected, "the file differs from the bytes appended");
        assert_eq!(finished.bytes, expected.len() as u64);
        assert_eq!(sha256_file(&path).unwrap(), (finished.bytes, finished.sha256));
    }
}

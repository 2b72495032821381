//! One safetensors file, memory-mapped, with its header validated against the file (offsets inside the file,
//! contiguous and non-overlapping, byte counts equal to dtype × shape).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Advice, Mmap, UncheckedAdvice};
use safetensors::SafeTensors;

use super::dtype::{tensor_bytes, Dtype};
use super::IoError;

/// Where one tensor lives inside a shard.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub end: usize,
}

/// A borrowed tensor: its dtype, shape and raw little-endian bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

/// A tensor's bytes inside a shard's mapping, kept mapped while held (after the shard itself is dropped too):
/// a weight can be read in place instead of copied.
#[derive(Debug, Clone)]
pub struct MappedBytes {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl MappedBytes {
    /// The first `length` bytes.
    pub fn prefix(mut self, length: usize) -> Self {
        self.end = self.start + length.min(self.end - self.start);
        self
    }
}

impl std::ops::Deref for MappedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

/// A memory-mapped, validated safetensors file.
#[derive(Debug)]
pub struct ShardFile {
    path: PathBuf,
    map: Arc<Mmap>,
    tensors: BTreeMap<String, TensorEntry>,
    metadata: BTreeMap<String, String>,
}

impl ShardFile {
    /// Opens and validates `path`.
    pub fn open(path: &Path) -> Result<Self, IoError> {
        let file = File::open(path).map_err(|e| IoError::file(path, e))?;
        // SAFETY: the file is opened read-only and squeeze never writes to its inputs; a concurrent writer
        // outside squeeze could change the bytes under us, which the safetensors format cannot prevent either.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| IoError::file(path, e))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&map).map_err(|error| {
            if let (safetensors::SafeTensorError::MetadataIncompleteBuffer, Some((name, end, available))) =
                (&error, tensor_past_end(&map))
            {
                return IoError::tensor(
                    path,
                    &name,
                    format!(
                        "has data up to byte {end} of the data section, but the file holds only {available} data \
                         bytes: the shard is truncated; download or copy it again"
                    ),
                );
            }
            if let (safetensors::SafeTensorError::TensorInvalidInfo, Some((name, problem))) =
                (&error, tensor_range_mismatch(&map))
            {
                return IoError::tensor(path, &name, problem);
            }
            IoError::Header { path: path.to_path_buf(), reason: header_reason(&error, map.len()) }
        })?;
        let data_start = 8 + header_len;
        let mut tensors = BTreeMap::new();
        for (name, info) in metadata.tensors() {
            let (start, end) = info.data_offsets;
            let expected = tensor_bytes(info.dtype, &info.shape);
            if (end - start) as u64 != expected {
                return Err(IoError::tensor(
                    path,
                    name,
                    format!("holds {} bytes but {:?} {:?} needs {expected}", end - start, info.dtype, info.shape),
                ));
            }
            tensors.insert(
                name,
                TensorEntry {
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: data_start + start,
                    end: data_start + end,
                },
            );
        }
        let metadata = metadata.metadata().clone().unwrap_or_default().into_iter().collect();
        Ok(Self { path: path.to_path_buf(), map: Arc::new(map), tensors, metadata })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_bytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// The header's `__metadata__` entries.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// All tensors, by name.
    pub fn entries(&self) -> &BTreeMap<String, TensorEntry> {
        &self.tensors
    }

    /// Tensor names ordered by their position in the file (the order that reads sequentially).
    pub fn names_by_offset(&self) -> Vec<&str> {
        let mut names: Vec<(&str, usize)> = self.tensors.iter().map(|(n, e)| (n.as_str(), e.start)).collect();
        names.sort_by_key(|&(_, start)| start);
        names.into_iter().map(|(name, _)| name).collect()
    }

    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        let entry = self.tensors.get(name)?;
        Some(TensorRef { dtype: entry.dtype, shape: &entry.shape, bytes: &self.map[entry.start..entry.end] })
    }

    /// The bytes of tensor `name`, held in place (see [`MappedBytes`]).
    pub fn mapped(&self, name: &str) -> Option<MappedBytes> {
        let entry = self.tensors.get(name)?;
        Some(MappedBytes { map: self.map.clone(), start: entry.start, end: entry.end })
    }

    /// Asks the kernel to start reading the tensor's pages now, without waiting for them (`MADV_WILLNEED`).
    pub fn will_need(&self, name: &str) {
        if let Some(entry) = self.tensors.get(name) {
            let page = 4096;
            let start = entry.start / page * page;
            let _ = self.map.advise_range(Advice::WillNeed, start, entry.end - start);
        }
    }

    /// Tells the kernel the tensor's pages will not be needed again, so that streaming a checkpoint larger
    /// than memory keeps a bounded resident set (the pages stay in the page cache, not in our RSS).
    pub fn release(&self, name: &str) {
        if let Some(entry) = self.tensors.get(name) {
            let page = 4096;
            let start = entry.start / page * page;
            let length = entry.end - start;
            // SAFETY: the mapping is read-only and file-backed; after MADV_DONTNEED a later access re-reads the
            // same bytes from the file, so no slice handed out earlier can observe different contents.
            let _ = unsafe { self.map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, length) };
        }
    }
}

/// The tensor whose `data_offsets` end furthest past the end of the file's data section, with that end and the
/// data bytes the file has; `None` when the header does not parse or no tensor runs past the end.
fn tensor_past_end(file: &[u8]) -> Option<(String, u64, u64)> {
    let length = u64::from_le_bytes(file.get(..8)?.try_into().ok()?);
    let header_end = 8usize.checked_add(usize::try_from(length).ok()?)?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(file.get(8..header_end)?).ok()?;
    let available = (file.len() - header_end) as u64;
    header
        .iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
        .filter_map(|(name, info)| Some((name.clone(), info.get("data_offsets")?.get(1)?.as_u64()?)))
        .filter(|&(_, end)| end > available)
        .max_by_key(|&(_, end)| end)
        .map(|(name, end)| (name, end, available))
}

/// The first tensor (in file order) whose `data_offsets` span a byte count other than its dtype × shape needs, with
/// the problem in words (and whether its end runs past the file's data); `None` when the header does not parse or
/// every range matches. safetensors reports this only as `TensorInvalidInfo`, naming no tensor.
fn tensor_range_mismatch(file: &[u8]) -> Option<(String, String)> {
    let length = u64::from_le_bytes(file.get(..8)?.try_into().ok()?);
    let header_end = 8usize.checked_add(usize::try_from(length).ok()?)?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(file.get(8..header_end)?).ok()?;
    let available = (file.len() - header_end) as u64;
    let mut ranges: Vec<(String, Dtype, Vec<usize>, u64, u64)> = header
        .into_iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
        .filter_map(|(name, info)| {
            let dtype: Dtype = serde_json::from_value(info.get("dtype")?.clone()).ok()?;
            let shape: Vec<usize> = serde_json::from_value(info.get("shape")?.clone()).ok()?;
            let offsets = info.get("data_offsets")?;
            Some((name, dtype, shape, offsets.get(0)?.as_u64()?, offsets.get(1)?.as_u64()?))
        })
        .collect();
    ranges.sort_by_key(|&(_, _, _, start, _)| start);
    ranges.into_iter().find_map(|(name, dtype, shape, start, end)| {
        let needed = tensor_bytes(dtype, &shape);
        let spanned = end.checked_sub(start)?;
        (spanned != needed).then(|| {
            let past_end = if end > available {
                format!(", and its end runs past the {available} data bytes the file holds")
            } else {
                String::new()
            };
            let problem = format!(
                "data_offsets [{start}, {end}] span {spanned} bytes but {dtype:?} {shape:?} needs {needed}{past_end}: \
                 the header is corrupt; download or copy the shard again"
            );
            (name, problem)
        })
    })
}

fn header_reason(error: &safetensors::SafeTensorError, file_len: usize) -> String {
    use safetensors::SafeTensorError as E;
    match error {
        E::HeaderTooSmall => format!("file is {file_len} bytes, too short for a header"),
        E::HeaderTooLarge => "declared header size is larger than the 100 MB limit".to_string(),
        E::InvalidHeaderLength => format!("declared header length runs past the end of the {file_len}-byte file"),
        E::MetadataIncompleteBuffer => {
            format!("tensor data does not end where the file ends ({file_len} bytes): truncated or padded file")
        }
        E::InvalidOffset(name) => format!("tensor `{name}` has offsets that overlap, leave a gap or run backwards"),
        E::TensorInvalidInfo => "a tensor's byte range does not match its dtype and shape".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512), header_len in 0u64..600) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("x.safetensors");
            let mut file = header_len.to_le_bytes().to_vec();
            file.extend_from_slice(&bytes);
            std::fs::write(&path, &file).unwrap();
            let _ = ShardFile::open(&path);
            std::fs::write(&path, &bytes).unwrap();
            let _ = ShardFile::open(&path);
        }

        #[test]
        fn json_like_headers_never_panic(body in "\\{(\"[a-z]{1,3}\":\\{\"dtype\":\"(F32|BF16|I4|F8_E4M3)\",\"shape\":\\[[0-9]{1,2}(,[0-9]{1,2})?\\],\"data_offsets\":\\[[0-9]{1,3},[0-9]{1,3}\\]\\},?){0,3}\\}", tail in 0usize..300) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("x.safetensors");
            let mut file = (body.len() as u64).to_le_bytes().to_vec();
            file.extend_from_slice(body.as_bytes());
            file.extend(std::iter::repeat_n(7u8, tail));
            std::fs::write(&path, &file).unwrap();
            let _ = ShardFile::open(&path);
        }
    }

    #[test]
    fn a_truncated_shard_names_the_tensor_past_the_end() {
        use crate::io::writer::{PlannedTensor, ShardWriter};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.safetensors");
        let tensors =
            vec![PlannedTensor::new("first", Dtype::F32, vec![4]), PlannedTensor::new("last", Dtype::F32, vec![4])];
        let mut writer = ShardWriter::create(&path, tensors).unwrap();
        writer.write_tensor("first", &[1u8; 16]).unwrap();
        writer.write_tensor("last", &[2u8; 16]).unwrap();
        writer.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        let error = ShardFile::open(&path).unwrap_err().to_string();
        assert!(error.contains("last") && !error.contains("first"), "{error}");
        assert!(error.contains("a.safetensors") && error.contains("truncated"), "{error}");
    }

    #[test]
    fn written_shards_read_back() {
        use crate::io::writer::{PlannedTensor, ShardWriter};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.safetensors");
        let tensors =
            vec![PlannedTensor::new("b", Dtype::BF16, vec![3, 5]), PlannedTensor::new("a", Dtype::I32, vec![7])];
        let mut writer = ShardWriter::create(&path, tensors).unwrap();
        writer.write_tensor("b", &[1u8; 30]).unwrap();
        writer.write_tensor("a", &[2u8; 28]).unwrap();
        let finished = writer.finish().unwrap();
        assert_eq!(finished.bytes, std::fs::metadata(&path).unwrap().len());
        let shard = ShardFile::open(&path).unwrap();
        assert_eq!(shard.names_by_offset(), vec!["b", "a"]);
        assert_eq!(shard.get("a").unwrap().bytes, &[2u8; 28]);
        assert_eq!(shard.get("b").unwrap().shape, &[3, 5]);
    }
}

//! Statistics files (`--save-stats FILE` of the split jobs): a safetensors file whose `__metadata__` holds one
//! JSON header under `squeeze_stats` and whose tensors are 1-D arrays of f64 or u64, stored bit for bit, so that a
//! merge recomputes exactly what one run computes.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::IoError;

/// The metadata key holding the header.
const HEADER_KEY: &str = "squeeze_stats";

/// One named array.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    F64(Vec<f64>),
    U64(Vec<u64>),
}

/// A statistics file in memory.
#[derive(Debug, Clone, Default)]
pub struct StatsFile {
    pub header: Value,
    pub arrays: BTreeMap<String, Array>,
}

impl StatsFile {
    pub fn new(header: Value) -> Self {
        Self { header, arrays: BTreeMap::new() }
    }

    pub fn put_f64(&mut self, name: impl Into<String>, values: Vec<f64>) {
        self.arrays.insert(name.into(), Array::F64(values));
    }

    pub fn put_u64(&mut self, name: impl Into<String>, values: Vec<u64>) {
        self.arrays.insert(name.into(), Array::U64(values));
    }

    /// The f64 array `name`, or an error naming the file and the array.
    pub fn f64(&self, path: &Path, name: &str) -> Result<&[f64], IoError> {
        match self.arrays.get(name) {
            Some(Array::F64(values)) => Ok(values),
            _ => Err(missing(path, name, "F64")),
        }
    }

    pub fn u64(&self, path: &Path, name: &str) -> Result<&[u64], IoError> {
        match self.arrays.get(name) {
            Some(Array::U64(values)) => Ok(values),
            _ => Err(missing(path, name, "U64")),
        }
    }

    /// Writes the file atomically.
    pub fn write(&self, path: &Path) -> Result<(), IoError> {
        let bytes: Vec<(String, Dtype, Vec<u8>)> = self
            .arrays
            .iter()
            .map(|(name, array)| match array {
                Array::F64(values) => (name.clone(), Dtype::F64, values.iter().flat_map(|v| v.to_le_bytes()).collect()),
                Array::U64(values) => (name.clone(), Dtype::U64, values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            })
            .collect();
        let views = bytes
            .iter()
            .map(|(name, dtype, data)| {
                TensorView::new(*dtype, vec![data.len() / 8], data).map(|view| (name.clone(), view))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| IoError::folder(path, format!("cannot be serialized: {e}")))?;
        let metadata = HashMap::from([(HEADER_KEY.to_string(), self.header.to_string())]);
        let file = safetensors::serialize(views, Some(metadata))
            .map_err(|e| IoError::folder(path, format!("cannot be serialized: {e}")))?;
        super::atomic::write_file(path, &file)
    }

    /// Reads a file written by [`StatsFile::write`].
    pub fn read(path: &Path) -> Result<Self, IoError> {
        let bytes = std::fs::read(path).map_err(|e| IoError::file(path, e))?;
        let not_ours = |problem: String| {
            IoError::folder(path, format!("is not a squeeze statistics file ({problem}); give the --save-stats files"))
        };
        let (_, metadata) = SafeTensors::read_metadata(&bytes).map_err(|e| not_ours(e.to_string()))?;
        let header = metadata
            .metadata()
            .as_ref()
            .and_then(|map| map.get(HEADER_KEY))
            .ok_or_else(|| not_ours(format!("no `{HEADER_KEY}` header")))?;
        let header: Value = serde_json::from_str(header).map_err(|e| not_ours(e.to_string()))?;
        let tensors = SafeTensors::deserialize(&bytes).map_err(|e| not_ours(e.to_string()))?;
        let mut arrays = BTreeMap::new();
        for (name, view) in tensors.tensors() {
            let data = view.data();
            let words = data.chunks_exact(8).map(|word| word.try_into().expect("8-byte chunks"));
            let array = match view.dtype() {
                Dtype::F64 => Array::F64(words.map(f64::from_le_bytes).collect()),
                Dtype::U64 => Array::U64(words.map(u64::from_le_bytes).collect()),
                other => return Err(not_ours(format!("array `{name}` has dtype {other}"))),
            };
            arrays.insert(name, array);
        }
        Ok(Self { header, arrays })
    }
}

fn missing(path: &Path, name: &str, dtype: &str) -> IoError {
    IoError::tensor(path, name, format!("missing or not {dtype}; the file was written by another squeeze version"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_and_header_round_trip_bit_for_bit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.safetensors");
        let mut file = StatsFile::new(serde_json::json!({ "kind": "eval", "chunks": [0, 3] }));
        let awkward = vec![0.1 + 0.2, f64::MIN_POSITIVE / 3.0, -0.0, 1e300, f64::NAN];
        file.put_f64("nll", awkward.clone());
        file.put_u64("counts", vec![0, u64::MAX, 7]);
        file.put_f64("empty", Vec::new());
        file.write(&path).unwrap();
        let read = StatsFile::read(&path).unwrap();
        assert_eq!(read.header, file.header);
        let bits = |values: &[f64]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(read.f64(&path, "nll").unwrap()), bits(&awkward));
        assert_eq!(read.u64(&path, "counts").unwrap(), &[0, u64::MAX, 7]);
        assert!(read.f64(&path, "empty").unwrap().is_empty());
        assert!(read.f64(&path, "counts").unwrap_err().to_string().contains("counts"));
        std::fs::write(&path, b"garbage").unwrap();
        assert!(StatsFile::read(&path).unwrap_err().to_string().contains("not a squeeze statistics file"));
    }
}

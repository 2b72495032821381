//! GPTQ's quantized routed experts on disk between the calibration pass and the write pass: one file per MoE layer
//! in the output folder (`gptq-layer-NNNN.squeeze-tmp`: each projection's packed words then its BF16 scales, in
//! the bytes the output shards take), appended expert batch by expert batch and, once the layer is done, an index
//! beside it (`gptq-layer-NNNN.index.squeeze-tmp`, JSON, written last) naming the run's plan digest, so that a
//! resumed run reuses every layer it finished. The files are temporaries: a finished run removes them.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::bf16;
use serde::{Deserialize, Serialize};

use crate::io::IoError;
use crate::quant::pack;
use crate::runtime::matrix::{Int4Weight, Matrix};

/// Where one projection's quantized form lies.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SpillEntry {
    #[serde(skip)]
    path: Arc<PathBuf>,
    pub expert: usize,
    pub projection: String,
    pub offset: u64,
    pub rows: usize,
    pub columns: usize,
    pub group_size: usize,
}

impl SpillEntry {
    fn packed_bytes(&self) -> u64 {
        (self.rows * pack::packed_columns(self.columns) * 4) as u64
    }

    fn scale_bytes(&self) -> u64 {
        (self.rows * (self.columns / self.group_size.max(1)) * 2) as u64
    }

    /// `(weight_packed, weight_scale)` bytes as the output shard holds them.
    pub fn read(&self) -> Result<(Vec<u8>, Vec<u8>), IoError> {
        let file = File::open(self.path.as_ref()).map_err(|e| IoError::file(self.path.as_ref(), e))?;
        let mut packed = vec![0u8; self.packed_bytes() as usize];
        let mut scales = vec![0u8; self.scale_bytes() as usize];
        file.read_exact_at(&mut packed, self.offset).map_err(|e| IoError::file(self.path.as_ref(), e))?;
        file.read_exact_at(&mut scales, self.offset + self.packed_bytes())
            .map_err(|e| IoError::file(self.path.as_ref(), e))?;
        Ok((packed, scales))
    }

    /// The weights as a packed INT4 runtime matrix (values `q · scale`, what an engine multiplies by).
    pub fn matrix(&self) -> Result<Matrix, IoError> {
        let (packed, scales) = self.read()?;
        let packed: Vec<u32> = packed.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let scales: Vec<u16> = scales.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        Ok(Matrix::packed(self.rows, self.columns, Int4Weight { packed, scales, group_size: self.group_size }))
    }
}

/// The index of a finished layer file.
#[derive(Serialize, Deserialize)]
struct Index {
    plan_sha256: String,
    layer: usize,
    bytes: u64,
    entries: Vec<SpillEntry>,
}

fn data_path(dir: &Path, layer: usize) -> PathBuf {
    dir.join(format!("gptq-layer-{layer:04}.squeeze-tmp"))
}

fn index_path(dir: &Path, layer: usize) -> PathBuf {
    dir.join(format!("gptq-layer-{layer:04}.index.squeeze-tmp"))
}

/// One layer's quantized experts: `(expert, projection)` → entry.
pub type LayerEntries = BTreeMap<(usize, String), SpillEntry>;

/// The entries of layer `layer` when a finished file of the same plan is in `dir`.
pub fn finished(dir: &Path, layer: usize, plan_sha256: &str) -> Option<LayerEntries> {
    let index: Index = serde_json::from_slice(&fs::read(index_path(dir, layer)).ok()?).ok()?;
    let data = data_path(dir, layer);
    let length = fs::metadata(&data).ok()?.len();
    if index.plan_sha256 != plan_sha256 || index.layer != layer || index.bytes != length {
        return None;
    }
    let path = Arc::new(data);
    Some(
        index
            .entries
            .into_iter()
            .map(|entry| ((entry.expert, entry.projection.clone()), SpillEntry { path: path.clone(), ..entry }))
            .collect(),
    )
}

/// A layer file being written.
pub struct LayerSpill {
    dir: PathBuf,
    layer: usize,
    path: Arc<PathBuf>,
    file: File,
    entries: LayerEntries,
    bytes: u64,
}

impl LayerSpill {
    /// Starts layer `layer`'s file in `dir` (replacing an unfinished one).
    pub fn create(dir: &Path, layer: usize) -> Result<Self, IoError> {
        let index = index_path(dir, layer);
        if index.exists() {
            fs::remove_file(&index).map_err(|e| IoError::file(&index, e))?;
        }
        let path = data_path(dir, layer);
        let file = File::create(&path).map_err(|e| IoError::file(&path, e))?;
        Ok(Self { dir: dir.to_path_buf(), layer, path: Arc::new(path), file, entries: BTreeMap::new(), bytes: 0 })
    }

    /// Appends one projection's codes (`[rows, columns]`, in `[-8, 7]`) and scales (`[rows, columns / group]`).
    pub fn append(
        &mut self,
        expert: usize,
        projection: &str,
        columns: usize,
        group_size: usize,
        codes: &[i8],
        scales: &[bf16],
    ) -> Result<(), IoError> {
        let rows = codes.len() / columns.max(1);
        let words_per_row = pack::packed_columns(columns);
        let mut words = vec![0u32; rows * words_per_row];
        for (row, out) in words.chunks_mut(words_per_row).enumerate() {
            pack::pack_row(&codes[row * columns..(row + 1) * columns], out);
        }
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend(scales.iter().flat_map(|s| s.to_le_bytes()));
        self.file.write_all(&bytes).map_err(|e| IoError::file(self.path.as_ref(), e))?;
        let entry = SpillEntry {
            path: self.path.clone(),
            expert,
            projection: projection.to_string(),
            offset: self.bytes,
            rows,
            columns,
            group_size,
        };
        self.bytes += bytes.len() as u64;
        self.entries.insert((expert, projection.to_string()), entry);
        Ok(())
    }

    /// Flushes the data and writes the index (a temporary renamed into place): the layer counts as finished.
    pub fn finish(mut self, plan_sha256: &str) -> Result<LayerEntries, IoError> {
        self.file.flush().map_err(|e| IoError::file(self.path.as_ref(), e))?;
        self.file.sync_data().map_err(|e| IoError::file(self.path.as_ref(), e))?;
        let index = Index {
            plan_sha256: plan_sha256.to_string(),
            layer: self.layer,
            bytes: self.bytes,
            entries: self.entries.values().cloned().collect(),
        };
        let path = index_path(&self.dir, self.layer);
        let partial = self.dir.join(format!("gptq-layer-{:04}.index.partial.squeeze-tmp", self.layer));
        let json = serde_json::to_vec(&index).map_err(|e| IoError::file(&partial, std::io::Error::other(e)))?;
        fs::write(&partial, json).map_err(|e| IoError::file(&partial, e))?;
        fs::rename(&partial, &path).map_err(|e| IoError::file(&path, e))?;
        Ok(self.entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_layer_reads_back_and_another_plan_does_not_reuse_it() {
        let dir = tempfile::tempdir().unwrap();
        let (columns, group) = (20, 4);
        let codes: Vec<i8> = (0..3 * columns).map(|i| (i % 16) as i8 - 8).collect();
        let scales: Vec<bf16> = (0..3 * columns / group).map(|i| bf16::from_f32(0.25 * (i + 1) as f32)).collect();
        let mut spill = LayerSpill::create(dir.path(), 2).unwrap();
        spill.append(5, "gate", columns, group, &codes, &scales).unwrap();
        spill.append(5, "down", columns, group, &codes[..columns], &scales[..columns / group]).unwrap();
        assert!(finished(dir.path(), 2, "plan").is_none(), "not finished yet");
        let written = spill.finish("plan").unwrap();
        let entries = finished(dir.path(), 2, "plan").expect("finished");
        assert_eq!(entries, written);
        assert!(finished(dir.path(), 2, "other plan").is_none());
        let down = &entries[&(5, "down".to_string())];
        let matrix = down.matrix().unwrap();
        assert_eq!((matrix.rows, matrix.columns), (1, columns));
        for (j, value) in matrix.values().iter().enumerate() {
            assert_eq!(*value, codes[j] as f32 * scales[j / group].to_f32());
        }
        let (packed, scale_bytes) = entries[&(5, "gate".to_string())].read().unwrap();
        assert_eq!(packed.len(), 3 * 3 * 4);
        assert_eq!(scale_bytes, scales.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>());
    }
}

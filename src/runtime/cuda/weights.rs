//! Device-resident weights: each loaded [`Matrix`] uploaded once (packed when it carries its INT4 form) and kept in
//! a bounded first-in-first-out cache keyed by the matrix id. The store is shared with the layer loader thread,
//! which uploads the next layer's weights ([`Prefetch`]) while the current layer computes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::runtime::backend::{Matrix, Prefetch, Uploads};
use crate::runtime::device::{CudaError, Device, DeviceBuffer};

/// Device bytes of weights kept resident: two layers' resident weights (the one computing and the one prefetched)
/// plus a batch of experts fit with room to spare on an 80–141 GB GPU (GLM-5: ~1.3 GB of f32 attention and shared
/// expert weights per layer); older entries are dropped first.
const WEIGHT_CACHE_BYTES: usize = 8 << 30;

/// A weight as it lives on the device.
pub(crate) enum DeviceWeight {
    /// f32 `[rows, columns]`.
    Dense(DeviceBuffer),
    /// compressed-tensors INT4: packed words and BF16 scale bits.
    Int4 { packed: DeviceBuffer, scales: DeviceBuffer, group_size: usize },
}

#[derive(Default)]
struct Cache {
    entries: VecDeque<(u64, Arc<DeviceWeight>, usize)>,
    bytes: usize,
}

/// The weight cache of one device.
pub(crate) struct WeightStore {
    device: Arc<dyn Device>,
    cache: Mutex<Cache>,
    uploads: Mutex<Uploads>,
}

impl WeightStore {
    pub fn new(device: Arc<dyn Device>) -> Self {
        Self { device, cache: Mutex::default(), uploads: Mutex::default() }
    }

    fn cached(&self, id: u64) -> Option<Arc<DeviceWeight>> {
        let cache = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cache.entries.iter().find(|(entry, _, _)| *entry == id).map(|(_, weight, _)| weight.clone())
    }

    /// The device copy of `matrix`, uploading it when absent. The upload runs outside the lock, so a prefetch and
    /// the compute thread never wait on each other's copies.
    pub fn get(&self, matrix: &Matrix) -> Result<Arc<DeviceWeight>, CudaError> {
        if let Some(weight) = self.cached(matrix.id) {
            return Ok(weight);
        }
        let device = self.device.as_ref();
        let started = Instant::now();
        let (weight, bytes) = match &matrix.int4 {
            Some(int4) => (
                DeviceWeight::Int4 {
                    packed: device.upload_resident(&int4.packed)?,
                    scales: device.upload_resident(&int4.scales)?,
                    group_size: int4.group_size,
                },
                int4.packed.len() * 4 + int4.scales.len() * 2,
            ),
            None => (DeviceWeight::Dense(device.upload_resident(&matrix.data)?), matrix.data.len() * 4),
        };
        let weight = Arc::new(weight);
        {
            let mut uploads = self.uploads.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            uploads.bytes += bytes as u64;
            uploads.seconds += started.elapsed().as_secs_f64();
        }
        let mut cache = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cache.entries.push_back((matrix.id, weight.clone(), bytes));
        cache.bytes += bytes;
        // An evicted weight still in use lives on through the op's Arc until that op has finished.
        while cache.bytes > WEIGHT_CACHE_BYTES && cache.entries.len() > 1 {
            if let Some((_, _, evicted)) = cache.entries.pop_front() {
                cache.bytes -= evicted;
            }
        }
        Ok(weight)
    }
}

impl WeightStore {
    /// Bytes uploaded so far and the seconds it took.
    pub fn uploads(&self) -> Uploads {
        *self.uploads.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Prefetch for WeightStore {
    fn prefetch(&self, matrices: &[&Matrix]) {
        for matrix in matrices {
            // A failed upload is retried, and reported, when the compute thread needs the weight.
            if self.get(matrix).is_err() {
                return;
            }
        }
    }
}

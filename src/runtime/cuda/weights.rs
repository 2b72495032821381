//! Device-resident weights: each loaded [`Matrix`] uploaded once (packed when it carries its INT4 form; as its FP8
//! codes and block scales when it still holds them, dequantized to f32 on the device; as BF16 when its values are
//! BF16 numbers; f32 otherwise) and kept
//! with the matrix itself, so the device memory is freed when the matrix is (a dropped layer frees its weights).
//! The store is shared with the layer loader thread, which uploads the next layer's weights ([`Prefetch`]) while
//! the current layer computes.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::runtime::backend::{Prefetch, Uploads};
use crate::runtime::device::{CudaError, Device, DeviceBuffer, DeviceWeight};
use crate::runtime::matrix::{Fp8Weight, Matrix};

use super::checks::unsupported;
use super::fp8::{self, Fp8OnDevice};
use super::split::split;

/// The weight uploads of one device.
pub(crate) struct WeightStore {
    device: Arc<dyn Device>,
    uploads: Mutex<Uploads>,
}

impl WeightStore {
    pub fn new(device: Arc<dyn Device>) -> Self {
        Self { device, uploads: Mutex::default() }
    }

    /// The key of this device in a matrix's copy slot.
    fn key(&self) -> usize {
        Arc::as_ptr(&self.device) as *const () as usize
    }

    /// The device copy of `matrix`, uploading it when absent. The upload runs outside any lock, so a prefetch and
    /// the compute thread never wait on each other's copies (both may upload a matrix neither had; one copy stays).
    pub fn get(&self, matrix: &Matrix) -> Result<Arc<DeviceWeight>, CudaError> {
        if let Some(weight) = matrix.device_copy(self.key()) {
            return Ok(weight);
        }
        if matrix.fp8_token_inputs {
            return Err(unsupported(
                "linear",
                "W4A8 weights: the device backend has no FP8 activation quantization yet; run with \
                          --device cpu",
            ));
        }
        let device = self.device.as_ref();
        let started = Instant::now();
        let fp8 = if matrix.int4.is_none() { matrix.fp8() } else { None };
        let (weight, bytes) = match (&matrix.int4, fp8) {
            (Some(int4), _) => (
                DeviceWeight::Int4 {
                    packed: device.upload_resident(&int4.packed)?,
                    scales: device.upload_resident(&int4.scales)?,
                    group_size: int4.group_size,
                },
                int4.packed.len() * 4 + int4.scales.len() * 2,
            ),
            (None, Some(fp8)) => (DeviceWeight::Bf16Pair(dequantized_pair(device, &fp8)?), fp8.bytes()),
            (None, None) if matrix.bf16_values => {
                let bits: Vec<u16> =
                    matrix.values().iter().map(|&value| half::bf16::from_f32(value).to_bits()).collect();
                (DeviceWeight::Bf16(device.upload_resident(&bits)?), bits.len() * 2)
            }
            (None, None) => (DeviceWeight::Dense(device.upload_resident(matrix.values())?), matrix.values().len() * 4),
        };
        let weight = Arc::new(weight);
        {
            let mut uploads = self.uploads.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            uploads.bytes += bytes as u64;
            uploads.seconds += started.elapsed().as_secs_f64();
        }
        matrix.keep_device_copy(self.key(), weight.clone());
        Ok(weight)
    }

    /// Bytes uploaded so far and the seconds it took.
    pub fn uploads(&self) -> Uploads {
        *self.uploads.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `fp8` as a BF16 weight pair made on the device: codes and scales uploaded (resident: on the copy stream), the
/// f32 values written by `fp8_block_dequant_f32` on the compute stream (the same bits as the host's
/// dequantization), then split in their BF16 halves. The uploaded codes and the f32 values are freed when this
/// returns, once the compute stream has passed the kernels.
fn dequantized_pair(device: &dyn Device, fp8: &Fp8Weight) -> Result<DeviceBuffer, CudaError> {
    let grid = fp8.grid;
    let codes = device.upload_resident(&fp8.codes[..])?;
    let scales = device.upload_resident(&fp8.scales)?;
    let values = device.alloc_for::<f32>((grid.rows * grid.columns).max(1))?;
    let tensor = Fp8OnDevice {
        codes: &codes,
        scales: &scales,
        rows: grid.rows,
        columns: grid.columns,
        first_row: 0,
        block: [grid.block_rows, grid.block_columns],
    };
    fp8::dequantize(device, &tensor, &values, false)?;
    split(device, &values, grid.rows * grid.columns)
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

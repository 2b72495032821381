//! The CUDA backend's state: the device it runs on (counting copies and launches), the store of the weights it
//! uploaded, and how its GEMMs take activations. Its ops are the [`crate::runtime::Backend`] implementation in `mod.rs`, one file per op family.

use std::sync::Arc;

use super::split::Activations;
use super::weights::WeightStore;
use crate::runtime::device::{Counted, CudaError, Device, DeviceWeight};
use crate::runtime::matrix::Matrix;

/// The CUDA backend over a device.
pub struct CudaBackend {
    pub(super) device: Arc<Counted>,
    pub(super) weights: Arc<WeightStore>,
    /// How the dense BF16 GEMMs take their activations.
    pub(super) activations: Activations,
}

impl CudaBackend {
    /// The backend on `device`, its GEMMs on split activations ([`Activations::Split`]).
    pub fn new(device: Arc<dyn Device>) -> Self {
        Self::with_activations(device, Activations::Split)
    }

    pub fn with_activations(device: Arc<dyn Device>, activations: Activations) -> Self {
        let device = Arc::new(Counted::new(device));
        Self { weights: Arc::new(WeightStore::new(device.clone())), device, activations }
    }

    /// The device every op runs on (counting its copies and launches).
    pub fn device(&self) -> &dyn Device {
        self.device.as_ref()
    }

    /// The same device, for copies of a stated kind ([`Counted::upload_as`]).
    pub(crate) fn counted(&self) -> &Counted {
        &self.device
    }

    /// The device copy of `matrix`, uploading it on first use (packed when it carries its INT4 form).
    pub(crate) fn weight(&self, matrix: &Matrix) -> Result<Arc<DeviceWeight>, CudaError> {
        self.weights.get(matrix)
    }
}

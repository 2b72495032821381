//! The backend a `--device` choice names: the CUDA backend on the selected device, or the CPU backend (with the
//! notice of an `auto` that fell back to it).

use super::backend::Backend;
use super::cpu::{Cpu, Products};
use super::cuda::linear::Activations;
use super::cuda::CudaBackend;
use super::device::{select, CudaError, DeviceChoice, DeviceSelection};

/// The runtime backend `choice` names; `auto` falls back to the CPU with a one-line notice (returned, for stderr).
pub fn open_backend(choice: DeviceChoice) -> Result<(Box<dyn Backend>, Option<String>), CudaError> {
    open_backend_with(choice, Products::Exact, Activations::Split)
}

/// [`open_backend`] whose CPU backend multiplies as `products` says and whose device GEMMs take `activations`.
pub fn open_backend_with(
    choice: DeviceChoice,
    products: Products,
    activations: Activations,
) -> Result<(Box<dyn Backend>, Option<String>), CudaError> {
    let selection = select(choice)?;
    let cpu = Cpu { products };
    if let DeviceSelection::CpuFallback(reason) = &selection {
        return Ok((Box::new(cpu), Some(format!("no usable GPU ({reason}); running on the CPU"))));
    }
    Ok(match selection.into_device() {
        Some(device) => (Box::new(CudaBackend::with_activations(device, activations)), None),
        None => (Box::new(cpu), None),
    })
}

//! `--device`: the choice, the driver probe, and what a choice resolves to — a device for the quantize command, a
//! runtime backend for eval, calibrate-kv and serve-test (the CPU backend, or the CUDA backend on the GPU or on the
//! emulated device).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::emulated::Emulator;
use super::{CudaError, Device, DeviceInfo, Gpu};
use crate::runtime::backend::Backend;
use crate::runtime::cpu::{Cpu, Products};
use crate::runtime::cuda::CudaBackend;

/// Whether this binary was built with the `cuda` feature.
pub const BUILT_WITH_CUDA: bool = cfg!(feature = "cuda");

/// `--device`: where numeric work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// The GPU when one is usable, else the CPU with one notice.
    #[default]
    Auto,
    Cpu,
    Cuda,
    /// The CUDA kernels compiled for the host and run under emulation (tests and development; slow).
    Emulated,
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Cuda => "cuda",
            DeviceChoice::Emulated => "emulated",
        })
    }
}

impl FromStr for DeviceChoice {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "gpu" => Ok(DeviceChoice::Cuda),
            "emulated" => Ok(DeviceChoice::Emulated),
            other => Err(format!("unknown device `{other}`; known: auto, cpu, cuda")),
        }
    }
}

/// Probes for the driver library and device 0 without creating a context.
pub fn probe() -> Result<DeviceInfo, CudaError> {
    #[cfg(feature = "cuda")]
    {
        super::gpu::probe()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(CudaError::BuiltWithoutCuda)
    }
}

/// The outcome of resolving `--device`.
pub enum DeviceSelection {
    Cpu,
    Gpu(Box<Gpu>),
    Emulated(Emulator),
    /// `auto` found no usable GPU; the reason is worth one line on stderr.
    CpuFallback(CudaError),
}

impl DeviceSelection {
    /// The selected device, `None` for the CPU.
    pub fn into_device(self) -> Option<Arc<dyn Device>> {
        match self {
            DeviceSelection::Gpu(gpu) => Some(Arc::new(*gpu)),
            DeviceSelection::Emulated(emulator) => Some(Arc::new(emulator)),
            DeviceSelection::Cpu | DeviceSelection::CpuFallback(_) => None,
        }
    }
}

/// Resolves `--device`: `cpu` never touches the driver, `cuda` fails with the reason, `emulated` starts the kernel
/// emulator, `auto` falls back to the CPU (silently in a build without CUDA, where the CPU is the only choice).
pub fn select(choice: DeviceChoice) -> Result<DeviceSelection, CudaError> {
    match choice {
        DeviceChoice::Cpu => Ok(DeviceSelection::Cpu),
        DeviceChoice::Emulated => Emulator::start().map(DeviceSelection::Emulated),
        DeviceChoice::Auto if !BUILT_WITH_CUDA => Ok(DeviceSelection::Cpu),
        DeviceChoice::Cuda => Gpu::open(0).map(|gpu| DeviceSelection::Gpu(Box::new(gpu))),
        DeviceChoice::Auto => Ok(match Gpu::open(0) {
            Ok(gpu) => DeviceSelection::Gpu(Box::new(gpu)),
            Err(reason) => DeviceSelection::CpuFallback(reason),
        }),
    }
}

/// The runtime backend `choice` names; `auto` falls back to the CPU with a one-line notice (returned, for stderr).
pub fn open_backend(choice: DeviceChoice) -> Result<(Box<dyn Backend>, Option<String>), CudaError> {
    open_backend_with(choice, Products::Exact)
}

/// [`open_backend`] whose CPU backend multiplies as `products` says (the GPU's is unaffected).
pub fn open_backend_with(
    choice: DeviceChoice,
    products: Products,
) -> Result<(Box<dyn Backend>, Option<String>), CudaError> {
    let selection = select(choice)?;
    let cpu = Cpu { products };
    if let DeviceSelection::CpuFallback(reason) = &selection {
        return Ok((Box::new(cpu), Some(format!("no usable GPU ({reason}); running on the CPU"))));
    }
    Ok(match selection.into_device() {
        Some(device) => (Box::new(CudaBackend::new(device)), None),
        None => (Box::new(cpu), None),
    })
}

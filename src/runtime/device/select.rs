//! `--device`: the choice, the driver probe, and the device a choice resolves to (the GPU, the emulated device, or
//! none); the runtime backend on it is [`crate::runtime::open_backend`]'s.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::emulated::Emulator;
use super::{CudaError, Device, DeviceInfo, Gpu};

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

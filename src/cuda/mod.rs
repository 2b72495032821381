//! The CUDA backend behind feature `cuda`: driver probing, the embedded kernels/ module and the GPU quantize path.
//! Without the feature, [`Gpu`] is a stub with the same API whose constructors return [`CudaError::BuiltWithoutCuda`].
//!
//! The driver library is loaded at run time (cudarc `dynamic-loading`), so a `cuda` build runs on machines without
//! CUDA; [`select`] probes for the library before creating a context (cudarc's constructor panics without it).

pub mod device;
pub mod emulated;
pub mod launch;

#[cfg(feature = "cuda")]
mod artifacts;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
mod quantize;
#[cfg(feature = "cuda")]
mod resident;
#[cfg(not(feature = "cuda"))]
mod stub;

pub mod selftest;

#[cfg(feature = "cuda")]
pub use driver::Gpu;
#[cfg(not(feature = "cuda"))]
pub use stub::Gpu;

use std::fmt;
use std::str::FromStr;

/// Whether this binary was built with the `cuda` feature.
pub const BUILT_WITH_CUDA: bool = cfg!(feature = "cuda");

/// Errors of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("this squeeze was built without CUDA support; rebuild with `cargo build --release --features cuda` or use --device cpu")]
    BuiltWithoutCuda,
    #[error("the CUDA driver library (libcuda.so.1) was not found; install the NVIDIA driver (CUDA 13.0 or newer) or use --device cpu")]
    NoDriver,
    #[error("no usable CUDA device: {0}; check `nvidia-smi` or use --device cpu")]
    NoDevice(String),
    #[error("CUDA {call} failed: {message}")]
    Driver { call: &'static str, message: String },
    #[error("loading the embedded kernels failed: {0}; the driver may be older than CUDA 13.0")]
    Module(String),
    #[error("tensor `{tensor}`: {problem}")]
    Unsupported { tensor: String, problem: String },
}

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

/// What the probe found about device 0.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub memory_bytes: u64,
    /// The driver's CUDA version, e.g. 13000 for 13.0.
    pub driver_version: i32,
    pub device_count: i32,
}

impl fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cuda:{} {} (sm_{}{}, {:.1} GiB, driver CUDA {}.{}, {} device(s))",
            self.ordinal,
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10,
            self.device_count
        )
    }
}

/// Probes for the driver library and device 0 without creating a context.
pub fn probe() -> Result<DeviceInfo, CudaError> {
    #[cfg(feature = "cuda")]
    {
        driver::probe()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(CudaError::BuiltWithoutCuda)
    }
}

/// The outcome of resolving `--device`.
pub enum Selection {
    Cpu,
    Gpu(Box<Gpu>),
    /// `auto` found no usable GPU; the reason is worth one line on stderr.
    CpuFallback(CudaError),
}

/// Resolves `--device`: `cpu` never touches the driver, `cuda` fails with the reason, `auto` falls back to the CPU
/// (silently in a build without CUDA, where the CPU is the only choice).
pub fn select(choice: DeviceChoice) -> Result<Selection, CudaError> {
    match choice {
        DeviceChoice::Cpu => Ok(Selection::Cpu),
        DeviceChoice::Emulated => Err(CudaError::Unsupported {
            tensor: "--device emulated".into(),
            problem: "the emulated device runs the runtime commands (eval, calibrate-kv, serve-test); quantize takes cpu, cuda or auto".into(),
        }),
        DeviceChoice::Auto if !BUILT_WITH_CUDA => Ok(Selection::Cpu),
        DeviceChoice::Cuda => Gpu::open(0).map(|gpu| Selection::Gpu(Box::new(gpu))),
        DeviceChoice::Auto => Ok(match Gpu::open(0) {
            Ok(gpu) => Selection::Gpu(Box::new(gpu)),
            Err(reason) => Selection::CpuFallback(reason),
        }),
    }
}

/// The INT4 output of one tensor: packed words `[rows, columns / 8]` and BF16 scale bits `[rows, columns / group]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Int4Output {
    pub packed: Vec<u32>,
    pub scales: Vec<u16>,
}

/// A block-scaled FP8 tensor as the GPU path takes it.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Tensor<'a> {
    pub name: &'a str,
    pub codes: &'a [u8],
    pub block_scales: &'a [f32],
    pub rows: usize,
    pub columns: usize,
    pub block_rows: usize,
    pub block_columns: usize,
}

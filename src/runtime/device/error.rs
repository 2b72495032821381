//! The device layer's error type: what went wrong on the GPU, the emulated device or a launch wrapper, with the
//! remedy.

/// Errors of the device layer and of the code that launches kernels through it.
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

/// Maps a driver error of `call` into [`CudaError::Driver`].
#[cfg(feature = "cuda")]
pub(super) fn driver(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
    move |error| CudaError::Driver { call, message: error.to_string() }
}

//! The GPU's API in a build without the `cuda` feature: its constructor reports `BuiltWithoutCuda`.

use super::{Arg, CudaError, Device, DeviceBuffer, DeviceInfo, LaunchShape};

/// A GPU; cannot be constructed without the `cuda` feature.
pub struct Gpu {
    never: std::convert::Infallible,
}

impl Gpu {
    /// Always fails: this build has no CUDA support.
    pub fn open(_ordinal: usize) -> Result<Gpu, CudaError> {
        Err(CudaError::BuiltWithoutCuda)
    }

    pub fn info(&self) -> &DeviceInfo {
        match self.never {}
    }

    pub fn image(&self) -> &'static str {
        match self.never {}
    }
}

impl Device for Gpu {
    fn describe(&self) -> String {
        match self.never {}
    }
    fn alloc(&self, _bytes: usize) -> Result<DeviceBuffer, CudaError> {
        match self.never {}
    }
    fn write(&self, _buffer: &DeviceBuffer, _bytes: &[u8]) -> Result<(), CudaError> {
        match self.never {}
    }
    fn read(&self, _buffer: &DeviceBuffer, _out: &mut [u8]) -> Result<(), CudaError> {
        match self.never {}
    }
    fn copy(&self, _source: &DeviceBuffer, _target: &DeviceBuffer, _offset: usize) -> Result<(), CudaError> {
        match self.never {}
    }
    fn launch(&self, _kernel: &str, _shape: LaunchShape, _args: &[Arg]) -> Result<(), CudaError> {
        match self.never {}
    }
}

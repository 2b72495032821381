//! The CUDA backend's API in a build without the `cuda` feature: every constructor reports `BuiltWithoutCuda`.

use crate::quant::scale_rule::{MseSearch, ScaleRule};

use super::{CudaError, DeviceInfo, Fp8Tensor, Int4Output};

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

    pub fn quantize_int4_fp8(
        &self,
        _tensor: &Fp8Tensor<'_>,
        _group_size: usize,
        _rule: ScaleRule,
        _search: MseSearch,
    ) -> Result<Int4Output, CudaError> {
        match self.never {}
    }

    #[allow(clippy::too_many_arguments)]
    pub fn quantize_int4_f32(
        &self,
        _name: &str,
        _values: &[f32],
        _rows: usize,
        _columns: usize,
        _group_size: usize,
        _rule: ScaleRule,
        _search: MseSearch,
    ) -> Result<Int4Output, CudaError> {
        match self.never {}
    }

    pub fn dequantize_fp8(&self, _tensor: &Fp8Tensor<'_>, _bf16: bool) -> Result<Vec<u8>, CudaError> {
        match self.never {}
    }

    pub fn poison_outputs(&self) -> Result<(), CudaError> {
        match self.never {}
    }

    pub fn copy_bandwidth(&self, _bytes: usize) -> Result<f64, CudaError> {
        match self.never {}
    }

    pub fn time_int4_fp8_kernel(
        &self,
        _tensor: &Fp8Tensor<'_>,
        _group_size: usize,
        _rule: ScaleRule,
        _search: MseSearch,
        _repeats: usize,
    ) -> Result<f64, CudaError> {
        match self.never {}
    }
}

impl super::device::Device for Gpu {
    fn describe(&self) -> String {
        match self.never {}
    }
    fn alloc(&self, _bytes: usize) -> Result<super::device::DeviceBuffer, CudaError> {
        match self.never {}
    }
    fn write(&self, _buffer: &super::device::DeviceBuffer, _bytes: &[u8]) -> Result<(), CudaError> {
        match self.never {}
    }
    fn read(&self, _buffer: &super::device::DeviceBuffer, _out: &mut [u8]) -> Result<(), CudaError> {
        match self.never {}
    }
    fn copy(
        &self,
        _source: &super::device::DeviceBuffer,
        _target: &super::device::DeviceBuffer,
        _offset: usize,
    ) -> Result<(), CudaError> {
        match self.never {}
    }
    fn launch(
        &self,
        _kernel: &str,
        _shape: super::device::LaunchShape,
        _args: &[super::device::Arg],
    ) -> Result<(), CudaError> {
        match self.never {}
    }
}

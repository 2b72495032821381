//! The real CUDA backend (feature `cuda`): probing, context and kernel module, device buffers and launches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::sys::{self, CUdevice_attribute};
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::quant::scale_rule::{MseSearch, ScaleRule};

use super::artifacts::ARTIFACTS;
use super::launch::{blocks_for, KERNELS, THREADS_PER_BLOCK};
use super::quantize::Staging;
use super::{CudaError, DeviceInfo, Fp8Tensor, Int4Output};

/// Maps a driver error of `call` into [`CudaError::Driver`].
pub(super) fn driver(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |error| CudaError::Driver { call, message: error.to_string() }
}

/// Probes the driver library and device 0 without creating a context.
pub fn probe() -> Result<DeviceInfo, CudaError> {
    // SAFETY: only tries to dlopen libcuda; nothing is called through it.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoDriver);
    }
    result::init().map_err(|e| CudaError::NoDevice(format!("cuInit: {e}")))?;
    let device_count = result::device::get_count().map_err(|e| CudaError::NoDevice(format!("{e}")))?;
    if device_count < 1 {
        return Err(CudaError::NoDevice("the driver reports 0 devices".into()));
    }
    let device = result::device::get(0).map_err(|e| CudaError::NoDevice(format!("{e}")))?;
    let name = result::device::get_name(device).map_err(driver("cuDeviceGetName"))?;
    // SAFETY: `device` is a valid handle from cuDeviceGet.
    let memory_bytes = unsafe { result::device::total_mem(device) }.map_err(driver("cuDeviceTotalMem"))? as u64;
    let attribute = |attribute| {
        // SAFETY: valid device handle and attribute enum.
        unsafe { result::device::get_attribute(device, attribute) }.map_err(driver("cuDeviceGetAttribute"))
    };
    let compute_capability = (
        attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    let mut driver_version = 0i32;
    // SAFETY: writes one int.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }.result().map_err(driver("cuDriverGetVersion"))?;
    Ok(DeviceInfo { ordinal: 0, name, compute_capability, memory_bytes, driver_version, device_count })
}

/// A GPU with squeeze's kernels loaded and two streams.
pub struct Gpu {
    info: DeviceInfo,
    /// Which embedded image loaded: the sm_90a cubin or the sm_90 PTX.
    image: &'static str,
    pub(super) context: Arc<CudaContext>,
    pub(super) streams: [Arc<CudaStream>; 2],
    modules: Vec<Arc<CudaModule>>,
    /// Functions looked up so far, by name (any module may export it).
    functions: Mutex<HashMap<String, CudaFunction>>,
    pub(super) staging: Mutex<Option<Staging>>,
    pub(super) resident_staging: Mutex<Option<super::resident::Staging>>,
}

impl Gpu {
    /// Probes, creates a context on device `ordinal` and loads the embedded kernels.
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        let mut info = probe()?;
        if ordinal as i32 >= info.device_count {
            return Err(CudaError::NoDevice(format!("device {ordinal} requested, {} present", info.device_count)));
        }
        info.ordinal = ordinal;
        let context = CudaContext::new(ordinal).map_err(driver("cuCtxCreate"))?;
        // The quantize path orders its copies and launches itself (two streams, explicit synchronization).
        // SAFETY: no CudaSlice is shared across streams without an explicit synchronize in this module.
        unsafe { context.disable_event_tracking() };
        let streams = [
            context.new_stream().map_err(driver("cuStreamCreate"))?,
            context.new_stream().map_err(driver("cuStreamCreate"))?,
        ];
        let use_cubin = info.compute_capability == (9, 0);
        let mut functions = HashMap::new();
        let mut modules = Vec::new();
        for artifact in &ARTIFACTS {
            let image = if use_cubin {
                Ptx::from_binary(artifact.cubin_sm90a.to_vec())
            } else {
                Ptx::from_src(artifact.ptx_sm90)
            };
            let module = context
                .load_module(image)
                .map_err(|e| CudaError::Module(format!("{} ({}): {e}", artifact.family, info.name)))?;
            for name in KERNELS {
                if let Ok(function) = module.load_function(name) {
                    functions.insert(name.to_string(), function);
                }
            }
            modules.push(module);
        }
        if let Some(missing) = KERNELS.iter().find(|name| !functions.contains_key(**name)) {
            return Err(CudaError::Module(format!("kernel {missing} is missing from the embedded module")));
        }
        let image = if use_cubin { "sm_90a cubin" } else { "sm_90 PTX (JIT)" };
        let functions = Mutex::new(functions);
        Ok(Gpu {
            info,
            image,
            context,
            streams,
            modules,
            functions,
            staging: Mutex::new(None),
            resident_staging: Mutex::new(None),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Which embedded kernel image this device runs.
    pub fn image(&self) -> &'static str {
        self.image
    }

    /// The kernel `name` from whichever embedded module exports it.
    pub(super) fn function(&self, name: &str) -> Result<CudaFunction, CudaError> {
        let mut functions = self.functions.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(function) = functions.get(name) {
            return Ok(function.clone());
        }
        let function = self
            .modules
            .iter()
            .find_map(|module| module.load_function(name).ok())
            .ok_or_else(|| CudaError::Module(format!("no kernel named {name} in the embedded modules")))?;
        functions.insert(name.to_string(), function.clone());
        Ok(function)
    }

    /// Allocates `len` uninitialized elements on `stream`.
    pub(super) fn alloc<T: cudarc::driver::DeviceRepr>(
        &self,
        stream: &Arc<CudaStream>,
        len: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        // SAFETY: every buffer is written (copy or kernel) before it is read.
        unsafe { stream.alloc::<T>(len.max(1)) }.map_err(driver("cuMemAlloc"))
    }

    /// Quantizes a block-scaled FP8 tensor to INT4 (pipelined over row chunks on two streams).
    pub fn quantize_int4_fp8(
        &self,
        tensor: &Fp8Tensor<'_>,
        group_size: usize,
        rule: ScaleRule,
        search: MseSearch,
    ) -> Result<Int4Output, CudaError> {
        super::quantize::run(self, super::quantize::Source::Fp8(tensor), group_size, rule, search)
    }

    /// Quantizes f32 values `[rows, columns]` to INT4.
    #[allow(clippy::too_many_arguments)]
    pub fn quantize_int4_f32(
        &self,
        name: &str,
        values: &[f32],
        rows: usize,
        columns: usize,
        group_size: usize,
        rule: ScaleRule,
        search: MseSearch,
    ) -> Result<Int4Output, CudaError> {
        let source = super::quantize::Source::F32 { name, values, rows, columns };
        super::quantize::run(self, source, group_size, rule, search)
    }

    /// Dequantizes a block-scaled FP8 tensor to f32 (`bf16 = false`, 4 bytes per element) or BF16 bits (2 bytes).
    pub fn dequantize_fp8(&self, tensor: &Fp8Tensor<'_>, bf16: bool) -> Result<Vec<u8>, CudaError> {
        let stream = &self.streams[0];
        let elements = tensor.rows * tensor.columns;
        let codes = stream.clone_htod(tensor.codes).map_err(driver("cuMemcpyHtoD"))?;
        let scales = stream.clone_htod(tensor.block_scales).map_err(driver("cuMemcpyHtoD"))?;
        let out_bytes = elements * if bf16 { 2 } else { 4 };
        let out = self.alloc::<u8>(stream, out_bytes)?;
        let (codes_ptr, _) = codes.device_ptr(stream);
        let (scales_ptr, _) = scales.device_ptr(stream);
        let (out_ptr, _) = out.device_ptr(stream);
        // Poison the output so an element the kernel skips cannot pass as a value.
        // SAFETY: `out` holds at least `out_bytes` bytes.
        unsafe { result::memset_d8_async(out_ptr, 0xA5, out_bytes, stream.cu_stream()) }
            .map_err(driver("cuMemsetD8Async"))?;
        let (rows, columns, first_row) = (tensor.rows as i64, tensor.columns as i64, 0i64);
        let (block_rows, block_columns) = (tensor.block_rows as i32, tensor.block_columns as i32);
        let function = self.function(if bf16 { "fp8_block_dequant_bf16" } else { "fp8_block_dequant_f32" })?;
        let mut launch = stream.launch_builder(&function);
        launch.arg(&codes_ptr).arg(&scales_ptr).arg(&out_ptr);
        launch.arg(&rows).arg(&columns).arg(&first_row).arg(&block_rows).arg(&block_columns);
        let config = LaunchConfig {
            grid_dim: (blocks_for(elements).min(1 << 20), 1, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument list matches fp8_block_dequant_* in kernels/fp8_dequant.cu; buffers hold rows·columns
        // codes, the whole scale grid and rows·columns outputs.
        unsafe { launch.launch(config) }.map_err(driver("cuLaunchKernel"))?;
        let bytes = stream.clone_dtoh(&out).map_err(driver("cuMemcpyDtoH"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
        Ok(bytes[..out_bytes].to_vec())
    }

    /// Fills the cached quantize output buffers with 0xA5 bytes (self-test).
    pub fn poison_outputs(&self) -> Result<(), CudaError> {
        super::quantize::poison(self)
    }

    /// Device-to-device copy bandwidth over `bytes` (read + write bytes per second), best of a few copies.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64, CudaError> {
        let stream = &self.streams[0];
        let source = self.alloc::<u8>(stream, bytes)?;
        let mut target = self.alloc::<u8>(stream, bytes)?;
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
            let started = Instant::now();
            stream.memcpy_dtod(&source, &mut target).map_err(driver("cuMemcpyDtoD"))?;
            stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
            best = best.min(started.elapsed().as_secs_f64());
        }
        Ok(2.0 * bytes as f64 / best)
    }

    /// Seconds one INT4 kernel launch takes over a device-resident FP8 tensor (best of `repeats`), without copies.
    pub fn time_int4_fp8_kernel(
        &self,
        tensor: &Fp8Tensor<'_>,
        group_size: usize,
        rule: ScaleRule,
        search: MseSearch,
        repeats: usize,
    ) -> Result<f64, CudaError> {
        super::quantize::time_kernel(self, tensor, group_size, rule, search, repeats)
    }
}

/// The device surface of the runtime backend, on stream 0 (copies synchronize it; launches are asynchronous).
impl super::device::Device for Gpu {
    fn describe(&self) -> String {
        format!("{} ({})", self.info, self.image)
    }

    fn alloc(&self, bytes: usize) -> Result<super::device::DeviceBuffer, CudaError> {
        let slice = self.alloc::<u8>(&self.streams[0], bytes)?;
        Ok(super::device::DeviceBuffer::new(bytes, Box::new(slice)))
    }

    fn upload_bytes_resident(&self, bytes: &[u8]) -> Result<super::device::DeviceBuffer, CudaError> {
        super::resident::upload(self, bytes)
    }

    fn write(&self, buffer: &super::device::DeviceBuffer, bytes: &[u8]) -> Result<(), CudaError> {
        let stream = &self.streams[0];
        let pointer = device_pointer(buffer, stream)?;
        if bytes.len() > buffer.bytes() {
            return Err(CudaError::Driver { call: "cuMemcpyHtoD", message: "write past the end of a buffer".into() });
        }
        // SAFETY: the buffer holds at least `bytes.len()` bytes (checked); the copy completes before returning.
        unsafe { result::memcpy_htod_async(pointer, bytes, stream.cu_stream()) }.map_err(driver("cuMemcpyHtoD"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    fn read(&self, buffer: &super::device::DeviceBuffer, out: &mut [u8]) -> Result<(), CudaError> {
        let stream = &self.streams[0];
        if out.len() > buffer.bytes() {
            return Err(CudaError::Driver { call: "cuMemcpyDtoH", message: "read past the end of a buffer".into() });
        }
        let pointer = device_pointer(buffer, stream)?;
        // SAFETY: the buffer holds at least `out.len()` bytes (checked); synchronized before `out` is used.
        unsafe { result::memcpy_dtoh_async(out, pointer, stream.cu_stream()) }.map_err(driver("cuMemcpyDtoH"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    fn copy(
        &self,
        source: &super::device::DeviceBuffer,
        target: &super::device::DeviceBuffer,
        offset: usize,
    ) -> Result<(), CudaError> {
        let stream = &self.streams[0];
        if offset + source.bytes() > target.bytes() {
            return Err(CudaError::Driver { call: "cuMemcpyDtoD", message: "copy past the end of a buffer".into() });
        }
        let (from, to) = (device_pointer(source, stream)?, device_pointer(target, stream)? + offset as u64);
        // SAFETY: both ranges lie inside their allocations (checked); stream-ordered with the launches on stream 0.
        unsafe { result::memcpy_dtod_async(to, from, source.bytes(), stream.cu_stream()) }
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    fn launch(
        &self,
        kernel: &str,
        shape: super::device::LaunchShape,
        args: &[super::device::Arg],
    ) -> Result<(), CudaError> {
        use super::device::Arg;
        let stream = &self.streams[0];
        let function = self.function(kernel)?;
        enum Value {
            Pointer(u64),
            I32(i32),
            I64(i64),
            U32(u32),
            F32(f32),
        }
        let mut values = Vec::with_capacity(args.len());
        for arg in args {
            values.push(match *arg {
                Arg::Buffer(buffer) => Value::Pointer(device_pointer(buffer, stream)?),
                Arg::At(buffer, offset) => Value::Pointer(device_pointer(buffer, stream)? + offset as u64),
                Arg::Null => Value::Pointer(0),
                Arg::I32(value) => Value::I32(value),
                Arg::I64(value) => Value::I64(value),
                Arg::U32(value) => Value::U32(value),
                Arg::F32(value) => Value::F32(value),
            });
        }
        let mut builder = stream.launch_builder(&function);
        for value in &values {
            match value {
                Value::Pointer(pointer) => builder.arg(pointer),
                Value::I32(value) => builder.arg(value),
                Value::I64(value) => builder.arg(value),
                Value::U32(value) => builder.arg(value),
                Value::F32(value) => builder.arg(value),
            };
        }
        let config = LaunchConfig {
            grid_dim: (shape.grid[0], shape.grid[1], shape.grid[2]),
            block_dim: (shape.block[0], shape.block[1], shape.block[2]),
            shared_mem_bytes: 0,
        };
        // SAFETY: every launch wrapper in src/runtime/cuda passes the argument kinds of the kernel's C signature
        // (checked against the emulated device, which rejects a mismatch) and buffers it sized for the shape.
        unsafe { builder.launch(config) }.map_err(driver("cuLaunchKernel")).map(|_| ())
    }
}

/// The device address of a buffer of this GPU (a stream-ordered `CudaSlice` or a resident allocation).
fn device_pointer(buffer: &super::device::DeviceBuffer, stream: &Arc<CudaStream>) -> Result<u64, CudaError> {
    if let Some(slice) = buffer.handle.downcast_ref::<CudaSlice<u8>>() {
        return Ok(slice.device_ptr(stream).0);
    }
    if let Some(resident) = buffer.handle.downcast_ref::<super::resident::Resident>() {
        return Ok(resident.pointer);
    }
    Err(CudaError::Driver { call: "launch", message: "a buffer of another device".into() })
}

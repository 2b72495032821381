//! The real GPU (feature `cuda`): probing, context and embedded kernel modules, and the [`Device`] surface on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdevice_attribute};
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::artifacts::{ARTIFACTS, KERNELS};
use super::cublas::Blas;
use super::error::driver;
use super::resident::{Resident, ResidentUploads};
use super::{
    Arg, CudaError, Device, DeviceBuffer, DeviceInfo, F64Matrix, GemmBf16, GemmF64, LaunchShape, REFERENCE_GEMM,
    REFERENCE_GEMM_F64,
};

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
    /// Stream 0 runs copies and launches; stream 1 is the resident uploads' copy stream.
    streams: [Arc<CudaStream>; 2],
    modules: Vec<Arc<CudaModule>>,
    /// Functions looked up so far, by name (any module may export it).
    functions: Mutex<HashMap<String, CudaFunction>>,
    resident: ResidentUploads,
    /// cuBLAS on stream 0 for the dense BF16 GEMMs, or why it could not load (the reference kernel runs then).
    blas: Result<Blas, String>,
}

/// Keeps memory freed to the device's default pool there instead of returning it to the driver at every
/// synchronization (the pool's release threshold, 0 by default): the activations of each op and the weights of
/// each streamed layer reuse it without a new mapping.
fn keep_pool_memory(context: &CudaContext) -> Result<(), CudaError> {
    // SAFETY: the device comes from a live context; the attribute's value is a u64 as the driver expects.
    unsafe {
        let pool =
            result::device::get_default_mem_pool(context.cu_device()).map_err(driver("cuDeviceGetDefaultMemPool"))?;
        let mut threshold = u64::MAX;
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .map_err(driver("cuMemPoolSetAttribute"))
    }
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
        if !context.has_async_alloc() {
            return Err(CudaError::NoDevice(format!(
                "device {ordinal} ({}) has no stream-ordered memory pool (cuMemAllocAsync); squeeze needs CUDA 11.2+ \
                 and a GPU that supports it",
                info.name
            )));
        }
        keep_pool_memory(&context)?;
        // Copies and launches are ordered explicitly (stream 0, resident uploads synchronized on stream 1).
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
        let resident = ResidentUploads::new(context, streams[1].clone(), streams[0].clone());
        let blas = Blas::open(streams[0].clone());
        Ok(Gpu { info, image, streams, modules, functions, resident, blas })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Which embedded kernel image this device runs.
    pub fn image(&self) -> &'static str {
        self.image
    }

    /// The kernel `name` from whichever embedded module exports it.
    fn function(&self, name: &str) -> Result<CudaFunction, CudaError> {
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
    fn alloc_on<T: cudarc::driver::DeviceRepr>(
        &self,
        stream: &Arc<CudaStream>,
        len: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        // SAFETY: every buffer is written (copy or kernel) before it is read.
        unsafe { stream.alloc::<T>(len.max(1)) }.map_err(driver("cuMemAlloc"))
    }
}

/// The device surface, on stream 0 (copies synchronize it; launches are asynchronous).
impl Device for Gpu {
    fn describe(&self) -> String {
        let gemm = match &self.blas {
            Ok(_) => "cuBLAS".to_string(),
            Err(why) => format!("no cuBLAS ({why}): reference GEMM kernel"),
        };
        format!("{} ({}, {gemm})", self.info, self.image)
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        let slice = self.alloc_on::<u8>(&self.streams[0], bytes)?;
        Ok(DeviceBuffer::new(bytes, Box::new(slice)))
    }

    fn upload_bytes_resident(&self, bytes: &[u8]) -> Result<DeviceBuffer, CudaError> {
        self.resident.upload(bytes)
    }

    fn write(&self, buffer: &DeviceBuffer, bytes: &[u8]) -> Result<(), CudaError> {
        let stream = &self.streams[0];
        let pointer = device_pointer(buffer, stream)?;
        if bytes.len() > buffer.bytes() {
            return Err(CudaError::Driver { call: "cuMemcpyHtoD", message: "write past the end of a buffer".into() });
        }
        // SAFETY: the buffer holds at least `bytes.len()` bytes (checked); the copy completes before returning.
        unsafe { result::memcpy_htod_async(pointer, bytes, stream.cu_stream()) }.map_err(driver("cuMemcpyHtoD"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    fn read(&self, buffer: &DeviceBuffer, out: &mut [u8]) -> Result<(), CudaError> {
        let stream = &self.streams[0];
        if out.len() > buffer.bytes() {
            return Err(CudaError::Driver { call: "cuMemcpyDtoH", message: "read past the end of a buffer".into() });
        }
        let pointer = device_pointer(buffer, stream)?;
        // SAFETY: the buffer holds at least `out.len()` bytes (checked); synchronized before `out` is used.
        unsafe { result::memcpy_dtoh_async(out, pointer, stream.cu_stream()) }.map_err(driver("cuMemcpyDtoH"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.streams[0].synchronize().map_err(driver("cuStreamSynchronize"))
    }

    fn copy(&self, source: &DeviceBuffer, target: &DeviceBuffer, offset: usize) -> Result<(), CudaError> {
        let stream = &self.streams[0];
        if offset + source.bytes() > target.bytes() {
            return Err(CudaError::Driver { call: "cuMemcpyDtoD", message: "copy past the end of a buffer".into() });
        }
        let (from, to) = (device_pointer(source, stream)?, device_pointer(target, stream)? + offset as u64);
        // SAFETY: both ranges lie inside their allocations (checked); stream-ordered with the launches on stream 0.
        unsafe { result::memcpy_dtod_async(to, from, source.bytes(), stream.cu_stream()) }
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    fn launch(&self, kernel: &str, shape: LaunchShape, args: &[Arg]) -> Result<(), CudaError> {
        let stream = &self.streams[0];
        let function = self.function(kernel)?;
        enum Value {
            Pointer(u64),
            I32(i32),
            I64(i64),
            U32(u32),
            F32(f32),
            F64(f64),
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
                Arg::F64(value) => Value::F64(value),
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
                Value::F64(value) => builder.arg(value),
            };
        }
        if shape.shared_bytes > 48 * 1024 {
            // Past 48 KiB a kernel's dynamic shared memory must be allowed explicitly.
            let attribute = cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            function.set_attribute(attribute, shape.shared_bytes as i32).map_err(driver("cuFuncSetAttribute"))?;
        }
        let config = LaunchConfig {
            grid_dim: (shape.grid[0], shape.grid[1], shape.grid[2]),
            block_dim: (shape.block[0], shape.block[1], shape.block[2]),
            shared_mem_bytes: shape.shared_bytes,
        };
        // SAFETY: every launch wrapper (src/runtime/cuda, src/runtime/cuda/int4_quantize.rs) passes the argument kinds of
        // the kernel's C signature (checked against the emulated device, which rejects a mismatch) and buffers sized
        // for the shape.
        unsafe { builder.launch(config) }.map_err(driver("cuLaunchKernel")).map(|_| ())
    }

    fn gemm_bf16(&self, gemm: &GemmBf16) -> Result<(), CudaError> {
        let Ok(blas) = &self.blas else {
            let (shape, args) = gemm.reference_launch()?;
            return self.launch(REFERENCE_GEMM, shape, &args);
        };
        let stream = &self.streams[0];
        let pointers =
            [device_pointer(gemm.weight, stream)?, device_pointer(gemm.x, stream)?, device_pointer(gemm.c, stream)?];
        blas.gemm_bf16(gemm, pointers)
    }

    fn gemm_f64(&self, gemm: &GemmF64) -> Result<(), CudaError> {
        let Ok(blas) = &self.blas else {
            let (shape, args) = gemm.reference_launch()?;
            return self.launch(REFERENCE_GEMM_F64, shape, &args);
        };
        let stream = &self.streams[0];
        let pointer =
            |view: &F64Matrix| Ok::<_, CudaError>(device_pointer(view.buffer, stream)? + 8 * view.offset as u64);
        blas.gemm_f64(gemm, [pointer(&gemm.a)?, pointer(&gemm.b)?, pointer(&gemm.c)?])
    }
}

/// The device address of a buffer of this GPU (a stream-ordered `CudaSlice` or a resident allocation).
fn device_pointer(buffer: &DeviceBuffer, stream: &Arc<CudaStream>) -> Result<u64, CudaError> {
    if let Some(slice) = buffer.handle.downcast_ref::<CudaSlice<u8>>() {
        return Ok(slice.device_ptr(stream).0);
    }
    if let Some(resident) = buffer.handle.downcast_ref::<Resident>() {
        return Ok(resident.pointer);
    }
    Err(CudaError::Driver { call: "launch", message: "a buffer of another device".into() })
}

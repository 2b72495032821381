//! The device surface every kernel launch goes through: memory, copies and launches by kernel name.
//! Two implementations: the real GPU ([`Gpu`], feature `cuda`; a stub returning "built without CUDA" otherwise) and
//! the emulated device ([`emulated::Emulator`]: the same kernels compiled for the host), so the CUDA runtime backend
//! and the quantize command's device path run in `cargo test` on machines without a GPU.
//!
//! The driver library is loaded at run time (cudarc `dynamic-loading`), so a `cuda` build runs on machines without
//! CUDA; [`select`] probes for the library before creating a context (cudarc's constructor panics without it).

#[cfg(feature = "cuda")]
mod artifacts;
mod counted;
#[cfg(feature = "cuda")]
mod cublas;
pub mod emulated;
mod error;
#[cfg(feature = "cuda")]
mod gpu;
mod launch_check;
#[cfg(feature = "cuda")]
mod resident;
pub mod select;
#[cfg(not(feature = "cuda"))]
mod stub;
mod weight;

pub use counted::{Counted, DeviceCounters, Direction, Traffic, Transfers};
pub use error::CudaError;
#[cfg(feature = "cuda")]
pub use gpu::Gpu;
pub use select::{probe, select, DeviceChoice, DeviceSelection, BUILT_WITH_CUDA};
#[cfg(not(feature = "cuda"))]
pub use stub::Gpu;
pub use weight::DeviceWeight;

use std::any::Any;

/// A device allocation; freed when dropped. `handle` is the implementation's own type.
pub struct DeviceBuffer {
    bytes: usize,
    pub(crate) handle: Box<dyn Any + Send + Sync>,
}

impl DeviceBuffer {
    pub(crate) fn new(bytes: usize, handle: Box<dyn Any + Send + Sync>) -> Self {
        Self { bytes, handle }
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} bytes)", self.bytes)
    }
}

/// One kernel argument. The kinds must match the kernel's C parameter types exactly: `I32` for `int`, `I64` for
/// `long long`, `U32` for `uint32_t`, `F32` for `float`, `F64` for `double`, a buffer or `Null` for a pointer.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Buffer(&'a DeviceBuffer),
    /// A buffer starting `offset` bytes in.
    At(&'a DeviceBuffer, usize),
    Null,
    I32(i32),
    I64(i64),
    U32(u32),
    F32(f32),
    F64(f64),
}

/// Grid and block shape of a launch, and its dynamic shared memory (the kernel's `extern __shared__` bytes, up to
/// [`MAX_DYNAMIC_SHARED_BYTES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchShape {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

/// The most shared memory one block may have on compute capability 9.0 (227 KiB, past 48 KiB only after the
/// kernel opts in, which the GPU launch does).
pub const MAX_DYNAMIC_SHARED_BYTES: u32 = 227 * 1024;

impl LaunchShape {
    /// A 1-D grid of `blocks` blocks of `threads` threads.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        Self { grid: [blocks.max(1), 1, 1], block: [threads, 1, 1], shared_bytes: 0 }
    }
}

/// Memory, copies and launches. Work is ordered: a read returns after every earlier launch finished.
pub trait Device: Send + Sync {
    /// E.g. `cuda:0 NVIDIA H200` or `emulated`.
    fn describe(&self) -> String;
    /// Allocates `bytes` (contents unspecified; the emulated device fills them with 0xA5).
    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError>;
    /// Copies `bytes` to the start of `buffer`.
    fn write(&self, buffer: &DeviceBuffer, bytes: &[u8]) -> Result<(), CudaError>;
    /// Copies the first `out.len()` bytes of `buffer` to `out`.
    fn read(&self, buffer: &DeviceBuffer, out: &mut [u8]) -> Result<(), CudaError>;
    /// Returns once every earlier launch and copy finished (the emulated device runs each call to its end).
    fn synchronize(&self) -> Result<(), CudaError> {
        Ok(())
    }
    /// A new buffer holding `bytes`, for data that stays resident (weights). A GPU copies on its copy stream through
    /// pinned staging, so another thread may upload while kernels run; the buffer is ready when this returns.
    fn upload_bytes_resident(&self, bytes: &[u8]) -> Result<DeviceBuffer, CudaError> {
        let buffer = self.alloc(bytes.len())?;
        self.write(&buffer, bytes)?;
        Ok(buffer)
    }
    /// Copies all of `source` into `target` starting `offset` bytes in, on the device (ordered with launches).
    fn copy(&self, source: &DeviceBuffer, target: &DeviceBuffer, offset: usize) -> Result<(), CudaError>;
    /// Launches kernel `kernel` (an `extern "C"` name in kernels/*.cu).
    fn launch(&self, kernel: &str, shape: LaunchShape, args: &[Arg]) -> Result<(), CudaError>;
    /// One BF16 GEMM ([`GemmBf16`], sizes checked by [`GemmBf16::check`]): cuBLAS on a GPU that can load it, the
    /// `gemm_bf16_reference` kernel (kernels/linear.cu) otherwise, as here.
    fn gemm_bf16(&self, gemm: &GemmBf16) -> Result<(), CudaError> {
        let (shape, args) = gemm.reference_launch()?;
        self.launch(REFERENCE_GEMM, shape, &args)
    }
    /// One f64 GEMM ([`GemmF64`], sizes checked by [`GemmF64::check`]): cuBLAS on a GPU that can load it, the
    /// `gemm_f64_reference` kernel (kernels/gptq.cu) otherwise, as here.
    fn gemm_f64(&self, gemm: &GemmF64) -> Result<(), CudaError> {
        let (shape, args) = gemm.reference_launch()?;
        self.launch(REFERENCE_GEMM_F64, shape, &args)
    }
}

/// The kernel [`Device::gemm_bf16`] launches without cuBLAS.
const REFERENCE_GEMM: &str = "gemm_bf16_reference";
/// The kernel [`Device::gemm_f64`] launches without cuBLAS.
const REFERENCE_GEMM_F64: &str = "gemm_f64_reference";

/// One operand of a [`GemmF64`]: row-major f64 values in `buffer` from element `offset`, rows `stride` elements
/// apart, read transposed where `transposed`.
#[derive(Clone, Copy)]
pub struct F64Matrix<'a> {
    pub buffer: &'a DeviceBuffer,
    pub offset: usize,
    pub stride: usize,
    pub transposed: bool,
}

impl<'a> F64Matrix<'a> {
    /// `buffer` from element `offset`, rows `stride` apart, as stored.
    pub fn at(buffer: &'a DeviceBuffer, offset: usize, stride: usize) -> Self {
        Self { buffer, offset, stride, transposed: false }
    }

    /// The same values read transposed.
    pub fn t(self) -> Self {
        Self { transposed: !self.transposed, ..self }
    }
}

/// `c[m, n] = alpha · a[m, k] · b[k, n] + beta · c` in f64 (`c` not read when `beta` is 0), each operand a
/// possibly transposed view ([`F64Matrix`]; `c` is never transposed).
pub struct GemmF64<'a> {
    pub a: F64Matrix<'a>,
    pub b: F64Matrix<'a>,
    pub c: F64Matrix<'a>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f64,
    pub beta: f64,
}

impl GemmF64<'_> {
    /// `[m, n, k]` as 32-bit ints; fails unless every view lies inside its buffer, `c` is not transposed and every
    /// dimension and stride fits.
    pub fn check(&self) -> Result<[i32; 3], CudaError> {
        if self.c.transposed {
            return Err(self.unsupported("the output cannot be transposed".into()));
        }
        for (what, view, rows, columns) in
            [("a", &self.a, self.m, self.k), ("b", &self.b, self.k, self.n), ("c", &self.c, self.m, self.n)]
        {
            let (stored_rows, stored_columns) = if view.transposed { (columns, rows) } else { (rows, columns) };
            if stored_rows == 0 || stored_columns == 0 {
                continue;
            }
            let last = view.offset + (stored_rows - 1) * view.stride + stored_columns;
            if stored_columns > view.stride || last * 8 > view.buffer.bytes() {
                return Err(self.unsupported(format!(
                    "{what}: {stored_rows} × {stored_columns} from element {} with row stride {} does not fit its \
                     {} bytes",
                    view.offset,
                    view.stride,
                    view.buffer.bytes()
                )));
            }
            self.int(view.stride)?;
        }
        Ok([self.int(self.m)?, self.int(self.n)?, self.int(self.k)?])
    }

    /// The grid and arguments of [`REFERENCE_GEMM_F64`] (16 × 16 output tiles of 256 threads).
    fn reference_launch(&self) -> Result<(LaunchShape, [Arg<'_>; 13]), CudaError> {
        let [m, n, k] = self.check()?;
        let shape = LaunchShape {
            grid: [(n as u32).div_ceil(16).max(1), (m as u32).div_ceil(16).max(1), 1],
            block: [256, 1, 1],
            shared_bytes: 0,
        };
        let (a, b, c) = (&self.a, &self.b, &self.c);
        let args = [
            Arg::At(a.buffer, a.offset * 8),
            Arg::At(b.buffer, b.offset * 8),
            Arg::At(c.buffer, c.offset * 8),
            Arg::I32(m),
            Arg::I32(n),
            Arg::I32(k),
            Arg::I32(a.stride as i32),
            Arg::I32(b.stride as i32),
            Arg::I32(c.stride as i32),
            Arg::I32(a.transposed as i32),
            Arg::I32(b.transposed as i32),
            Arg::F64(self.alpha),
            Arg::F64(self.beta),
        ];
        Ok((shape, args))
    }

    fn int(&self, value: usize) -> Result<i32, CudaError> {
        i32::try_from(value).map_err(|_| self.unsupported(format!("{value} does not fit a 32-bit int")))
    }

    fn unsupported(&self, problem: String) -> CudaError {
        CudaError::Unsupported {
            tensor: format!("gemm_f64 [{}, {}]·[{}, {}]", self.m, self.k, self.k, self.n),
            problem,
        }
    }
}

/// `c[rows, out] = x[rows, in] · w[out, in]ᵀ`: `weight` and `x` BF16 bits, `c` f32, all row-major, products
/// accumulated in f32.
pub struct GemmBf16<'a> {
    pub weight: &'a DeviceBuffer,
    pub x: &'a DeviceBuffer,
    pub c: &'a DeviceBuffer,
    pub rows: usize,
    pub in_features: usize,
    pub out_features: usize,
}

impl GemmBf16<'_> {
    /// `[rows, in, out]` as 32-bit ints; fails unless every buffer holds its matrix and every dimension fits.
    pub fn check(&self) -> Result<[i32; 3], CudaError> {
        let dimensions = [self.int(self.rows)?, self.int(self.in_features)?, self.int(self.out_features)?];
        let (rows, inner, out) = (self.rows as u64, self.in_features as u64, self.out_features as u64);
        for (what, buffer, need) in
            [("weight", self.weight, out * inner * 2), ("x", self.x, rows * inner * 2), ("c", self.c, rows * out * 4)]
        {
            if (buffer.bytes() as u64) < need {
                return Err(self.unsupported(format!("{what} buffer has {} bytes, needs {need}", buffer.bytes())));
            }
        }
        Ok(dimensions)
    }

    /// The grid and arguments of [`REFERENCE_GEMM`] (grid-stride, one thread per output value).
    fn reference_launch(&self) -> Result<(LaunchShape, [Arg<'_>; 6]), CudaError> {
        let [rows, in_features, out_features] = self.check()?;
        let blocks = (rows as u32).saturating_mul(out_features as u32).div_ceil(256).min(65_535);
        let args = [
            Arg::Buffer(self.weight),
            Arg::Buffer(self.x),
            Arg::Buffer(self.c),
            Arg::I32(rows),
            Arg::I32(in_features),
            Arg::I32(out_features),
        ];
        Ok((LaunchShape::linear(blocks, 256), args))
    }

    fn int(&self, value: usize) -> Result<i32, CudaError> {
        i32::try_from(value).map_err(|_| self.unsupported(format!("dimension {value} does not fit a 32-bit int")))
    }

    fn unsupported(&self, problem: String) -> CudaError {
        let shape = format!("[{}, {}]·[{}, {}]ᵀ", self.rows, self.in_features, self.out_features, self.in_features);
        CudaError::Unsupported { tensor: format!("gemm_bf16 {shape}"), problem }
    }
}

/// Plain element types that travel to and from the device as their little-endian bytes.
pub trait Plain: Copy + Default + 'static {}
impl Plain for f32 {}
impl Plain for f64 {}
impl Plain for i8 {}
impl Plain for u32 {}
impl Plain for i32 {}
impl Plain for u16 {}
impl Plain for u8 {}

fn bytes_of<T: Plain>(values: &[T]) -> &[u8] {
    // SAFETY: `Plain` types have no padding and no invalid bit patterns; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
}

fn bytes_of_mut<T: Plain>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`; every bit pattern is a valid `Plain` value.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
}

impl dyn Device + '_ {
    /// A new buffer holding `values`.
    pub fn upload<T: Plain>(&self, values: &[T]) -> Result<DeviceBuffer, CudaError> {
        let buffer = self.alloc(std::mem::size_of_val(values))?;
        self.write(&buffer, bytes_of(values))?;
        Ok(buffer)
    }

    /// A new resident buffer holding `values` (see [`Device::upload_bytes_resident`]).
    pub fn upload_resident<T: Plain>(&self, values: &[T]) -> Result<DeviceBuffer, CudaError> {
        self.upload_bytes_resident(bytes_of(values))
    }

    /// Copies `values` into the start of `buffer`.
    pub fn write_values<T: Plain>(&self, buffer: &DeviceBuffer, values: &[T]) -> Result<(), CudaError> {
        self.write(buffer, bytes_of(values))
    }

    /// A buffer of `count` elements of `T`.
    pub fn alloc_for<T: Plain>(&self, count: usize) -> Result<DeviceBuffer, CudaError> {
        self.alloc(count * std::mem::size_of::<T>())
    }

    /// The first `count` elements of `buffer`.
    pub fn download<T: Plain>(&self, buffer: &DeviceBuffer, count: usize) -> Result<Vec<T>, CudaError> {
        let mut out = vec![T::default(); count];
        self.read(buffer, bytes_of_mut(&mut out))?;
        Ok(out)
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

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

//! cuBLAS on the real GPU (feature `cuda`): the dense BF16 GEMM of [`Device::gemm_bf16`](super::Device::gemm_bf16)
//! on stream 0. libcublas is loaded at run time like the driver; a machine without it (or without a loadable
//! version) runs the `gemm_bf16_reference` kernel instead, and says so in the device's description.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::cublas::{result, CudaBlas};
use cudarc::driver::CudaStream;

use super::{CudaError, GemmBf16, GemmF64};

/// A cuBLAS handle bound to the launch stream. Calls are serialized (a handle is not for concurrent use).
pub struct Blas {
    handle: Mutex<CudaBlas>,
    stream: Arc<CudaStream>,
}

impl Blas {
    /// cuBLAS on `stream`, or why it is not available.
    pub fn open(stream: Arc<CudaStream>) -> Result<Blas, String> {
        // SAFETY: only tries to dlopen libcublas; nothing is called through it.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err("libcublas.so.13 not found on the library path".into());
        }
        let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cublasCreate: {e:?}"))?;
        Ok(Blas { handle: Mutex::new(blas), stream })
    }

    /// The handle, locked, with the stream's context current on this thread.
    fn bound(&self) -> Result<MutexGuard<'_, CudaBlas>, CudaError> {
        let blas = self.handle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| CudaError::Driver { call: "cuCtxSetCurrent", message: format!("{e}") })?;
        Ok(blas)
    }

    /// `gemm.c = x · wᵀ` (`pointers`: the device addresses of w, x, c) with `cublasGemmEx` (BF16 inputs, f32 output and compute, default
    /// algorithm: tensor cores). Row-major `x [rows, in]` and `w [out, in]` are column-major `[in, rows]` and
    /// `[in, out]`, and row-major `c [rows, out]` is column-major `[out, rows]`, so this is `c = wᵀ·x` in cuBLAS's
    /// terms: m = out, n = rows, k = in, A = w transposed.
    pub fn gemm_bf16(&self, gemm: &GemmBf16, pointers: [u64; 3]) -> Result<(), CudaError> {
        let [w, x, c] = pointers;
        let [n, k, m] = gemm.check()?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let blas = self.bound()?;
        let failed = |e: cudarc::cublas::result::CublasError| CudaError::Driver {
            call: "cublasGemmEx",
            message: format!("{e:?} for [{n}, {k}]·[{m}, {k}]ᵀ"),
        };
        // SAFETY: the three pointers are live device allocations of this context holding at least out·in and
        // rows·in BF16 values and rows·out f32 values (`check` above); alpha and beta are host scalars (the handle's
        // default pointer mode); the call is ordered on stream 0 with the launches.
        unsafe {
            result::gemm_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                k,
                (&alpha as *const f32).cast::<c_void>(),
                w as *const c_void,
                cudaDataType::CUDA_R_16BF,
                k,
                x as *const c_void,
                cudaDataType::CUDA_R_16BF,
                k,
                (&beta as *const f32).cast::<c_void>(),
                c as *mut c_void,
                cudaDataType::CUDA_R_32F,
                m,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(failed)
    }

    /// `gemm.c = alpha · op(a) · op(b) + beta · c` in f64 (`pointers`: the device addresses of a, b, c at their
    /// offsets) with `cublasGemmEx` (f64 data and compute). A row-major view is the column-major transpose of its
    /// memory, so this is `cᵀ = op(b)ᵀ · op(a)ᵀ` in cuBLAS's terms: m = n, n = m, A = b and B = a, each `OP_N` when
    /// read as stored and `OP_T` when read transposed.
    pub fn gemm_f64(&self, gemm: &GemmF64, pointers: [u64; 3]) -> Result<(), CudaError> {
        let [a, b, c] = pointers;
        let [m, n, k] = gemm.check()?;
        let operation = |transposed: bool| match transposed {
            true => cublasOperation_t::CUBLAS_OP_T,
            false => cublasOperation_t::CUBLAS_OP_N,
        };
        let stride = |value: usize| value as i32;
        let blas = self.bound()?;
        let failed = |e: cudarc::cublas::result::CublasError| CudaError::Driver {
            call: "cublasGemmEx",
            message: format!("{e:?} for f64 [{m}, {k}]·[{k}, {n}]"),
        };
        // SAFETY: the three pointers are live device allocations of this context at offsets whose views lie inside
        // them (`check` above); alpha and beta are host scalars (the handle's default pointer mode); the call is
        // ordered on stream 0 with the launches.
        unsafe {
            result::gemm_ex(
                *blas.handle(),
                operation(gemm.b.transposed),
                operation(gemm.a.transposed),
                n,
                m,
                k,
                (&gemm.alpha as *const f64).cast::<c_void>(),
                b as *const c_void,
                cudaDataType::CUDA_R_64F,
                stride(gemm.b.stride),
                a as *const c_void,
                cudaDataType::CUDA_R_64F,
                stride(gemm.a.stride),
                (&gemm.beta as *const f64).cast::<c_void>(),
                c as *mut c_void,
                cudaDataType::CUDA_R_64F,
                stride(gemm.c.stride),
                cublasComputeType_t::CUBLAS_COMPUTE_64F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(failed)
    }
}

//! Resident uploads on the GPU: weights copied on the copy stream (stream 1) through two pinned staging buffers,
//! so the layer loader thread moves the next layer while stream 0 runs the current one's kernels.
//!
//! The buffers come from the device's stream-ordered memory pool (`cuMemAllocAsync` on the copy stream, complete
//! once the upload has synchronized that stream) and go back to it with `cuMemFreeAsync` on stream 0: the memory is
//! reused only after every kernel queued there before the free, so a kernel still reading an evicted weight is never
//! left with freed memory, and dropping a layer's weights waits for nothing on the host. (With the synchronous
//! `cuMemAlloc`/`cuMemFree` pair, each free waiting for the GPU, and the pool releasing memory at every
//! synchronization, one more streamed GLM-5-shaped layer cost 186 ms of compute on an H200; 24 ms after.)

use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext, CudaStream, PinnedHostSlice};
use rayon::prelude::*;

use super::error::driver;
use super::{CudaError, DeviceBuffer};

/// Bytes per staging buffer: large enough that each copy runs at full PCIe speed, small enough to double-buffer.
const STAGING_BYTES: usize = 64 << 20;

/// A device allocation from the stream-ordered pool.
pub(super) struct Resident {
    pub pointer: sys::CUdeviceptr,
    compute: Arc<CudaStream>,
}

impl Drop for Resident {
    fn drop(&mut self) {
        let _ = self.compute.context().bind_to_thread();
        // SAFETY: `pointer` came from cuMemAllocAsync and is freed once, here, ordered after every kernel already
        // queued on the compute stream (the only stream that reads it).
        let _ = unsafe { result::free_async(self.pointer, self.compute.cu_stream()) };
    }
}

/// The two pinned staging buffers, allocated on the first resident upload.
struct Staging {
    buffers: [PinnedHostSlice<u8>; 2],
}

/// The GPU's resident-upload machinery: its context (for pinned memory), the copy stream, the compute stream that
/// frees must wait for, and the staging buffers.
pub(super) struct ResidentUploads {
    context: Arc<CudaContext>,
    copy: Arc<CudaStream>,
    compute: Arc<CudaStream>,
    staging: Mutex<Option<Staging>>,
}

impl ResidentUploads {
    pub(super) fn new(context: Arc<CudaContext>, copy: Arc<CudaStream>, compute: Arc<CudaStream>) -> Self {
        Self { context, copy, compute, staging: Mutex::new(None) }
    }

    /// Copies `bytes` into a new resident buffer on the copy stream: chunk i is copied into pinned buffer i % 2 (by
    /// all cores) while chunk i − 1 crosses the bus.
    pub(super) fn upload(&self, bytes: &[u8]) -> Result<DeviceBuffer, CudaError> {
        upload(self, bytes)
    }
}

fn upload(uploads: &ResidentUploads, bytes: &[u8]) -> Result<DeviceBuffer, CudaError> {
    let copy = &uploads.copy;
    uploads.context.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
    // SAFETY: plain allocation of at least one byte, ordered on the copy stream before the copies into it; the
    // stream is synchronized before the buffer is handed to the compute stream.
    let pointer =
        unsafe { result::malloc_async(copy.cu_stream(), bytes.len().max(1)) }.map_err(driver("cuMemAllocAsync"))?;
    let resident = Resident { pointer, compute: uploads.compute.clone() };
    let mut staging = uploads.staging.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if staging.is_none() {
        let allocate = || {
            // SAFETY: pinned memory is plain bytes; written by the CPU before each copy reads it.
            unsafe { uploads.context.alloc_pinned::<u8>(STAGING_BYTES) }.map_err(driver("cuMemHostAlloc"))
        };
        *staging = Some(Staging { buffers: [allocate()?, allocate()?] });
    }
    let Some(staging) = staging.as_mut() else { unreachable!("allocated above") };
    for (index, chunk) in bytes.chunks(STAGING_BYTES).enumerate() {
        let buffer = &mut staging.buffers[index % 2];
        if index >= 2 {
            // The copy that last read this buffer (chunk index − 2) must be done; it was queued before the
            // previous one, so synchronizing the stream waits for at most one more chunk than needed.
            copy.synchronize().map_err(driver("cuStreamSynchronize"))?;
        }
        let host = buffer.as_mut_slice().map_err(driver("cuEventSynchronize"))?;
        host[..chunk.len()].par_chunks_mut(1 << 20).zip(chunk.par_chunks(1 << 20)).for_each(|(to, from)| {
            to.copy_from_slice(from);
        });
        let target = pointer + (index * STAGING_BYTES) as u64;
        // SAFETY: the pinned source holds `chunk.len()` bytes and is not rewritten until this copy completed (the
        // synchronize above); the target lies inside the allocation.
        unsafe { result::memcpy_htod_async(target, &host[..chunk.len()], copy.cu_stream()) }
            .map_err(driver("cuMemcpyHtoDAsync"))?;
    }
    copy.synchronize().map_err(driver("cuStreamSynchronize"))?;
    Ok(DeviceBuffer::new(bytes.len(), Box::new(resident)))
}

//! GPU INT4 quantize of one tensor: row chunks staged through pinned host buffers, copies and kernels of
//! alternate chunks overlapped on two streams, results gathered in row order (byte-identical to the CPU path).

use std::time::Instant;

use cudarc::driver::{result, CudaSlice, DevicePtr, LaunchConfig, PinnedHostSlice, PushKernelArg};

use crate::quant::scale_rule::{MseSearch, ScaleRule};

use super::driver::{driver, Gpu};
use super::launch::{blocks_for, check_int4_shape, int4_kernel, rule_code, Int4Source, MseParams, THREADS_PER_BLOCK};
use super::{CudaError, Fp8Tensor, Int4Output};

/// Source bytes staged per chunk: large enough to keep the copy engines busy, small enough to pipeline.
const CHUNK_BYTES: usize = 32 << 20;

/// What to quantize.
pub enum Source<'a> {
    Fp8(&'a Fp8Tensor<'a>),
    F32 { name: &'a str, values: &'a [f32], rows: usize, columns: usize },
}

impl Source<'_> {
    fn name(&self) -> &str {
        match self {
            Source::Fp8(tensor) => tensor.name,
            Source::F32 { name, .. } => name,
        }
    }
    fn shape(&self) -> (usize, usize) {
        match self {
            Source::Fp8(tensor) => (tensor.rows, tensor.columns),
            Source::F32 { rows, columns, .. } => (*rows, *columns),
        }
    }
    fn element_bytes(&self) -> usize {
        match self {
            Source::Fp8(_) => 1,
            Source::F32 { .. } => 4,
        }
    }
    /// The source bytes of rows `rows`.
    fn bytes(&self, rows: std::ops::Range<usize>) -> &[u8] {
        match self {
            Source::Fp8(tensor) => &tensor.codes[rows.start * tensor.columns..rows.end * tensor.columns],
            Source::F32 { values, columns, .. } => {
                let values = &values[rows.start * columns..rows.end * columns];
                // SAFETY: f32 has no padding and u8 has alignment 1; same memory, 4 bytes per value.
                unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
            }
        }
    }
}

/// One pipeline slot: pinned host staging and device buffers for a chunk.
struct Slot {
    input: PinnedHostSlice<u8>,
    packed: PinnedHostSlice<u32>,
    scales: PinnedHostSlice<u16>,
    device_input: CudaSlice<u8>,
    device_packed: CudaSlice<u32>,
    device_scales: CudaSlice<u16>,
    /// The chunk in flight: (first packed word, words, first scale, scales).
    pending: Option<(usize, usize, usize, usize)>,
}

/// Both slots, kept across tensors (pinned allocation is slow) and grown when a chunk needs more room.
pub struct Staging {
    slots: Vec<Slot>,
    input_bytes: usize,
    words: usize,
    groups: usize,
}

fn new_staging(gpu: &Gpu, input_bytes: usize, words: usize, groups: usize) -> Result<Staging, CudaError> {
    let mut slots = Vec::new();
    for stream in &gpu.streams {
        // SAFETY: pinned buffers are plain memory; write-combined only for the input the CPU writes and never reads.
        let (input, packed, scales) = unsafe {
            (
                gpu.context.alloc_pinned::<u8>(input_bytes).map_err(driver("cuMemHostAlloc"))?,
                gpu.context.alloc_pinned_with_flags::<u32>(words, 0).map_err(driver("cuMemHostAlloc"))?,
                gpu.context.alloc_pinned_with_flags::<u16>(groups, 0).map_err(driver("cuMemHostAlloc"))?,
            )
        };
        slots.push(Slot {
            input,
            packed,
            scales,
            device_input: gpu.alloc(stream, input_bytes)?,
            device_packed: gpu.alloc(stream, words)?,
            device_scales: gpu.alloc(stream, groups)?,
            pending: None,
        });
    }
    Ok(Staging { slots, input_bytes, words, groups })
}

/// Fills every cached output buffer (device and pinned) with 0xA5 bytes, so a kernel that skips an element fails
/// the self-test instead of returning a previous tensor's value.
pub fn poison(gpu: &Gpu) -> Result<(), CudaError> {
    let mut staging = gpu.staging.lock().map_err(|_| CudaError::Module("staging lock poisoned".into()))?;
    let Some(staging) = staging.as_mut() else { return Ok(()) };
    for (stream, slot) in gpu.streams.iter().zip(staging.slots.iter_mut()) {
        let (packed, _) = slot.device_packed.device_ptr(stream);
        let (scales, _) = slot.device_scales.device_ptr(stream);
        // SAFETY: the pointers and byte counts are those of the slot's own allocations.
        unsafe {
            result::memset_d8_async(packed, 0xA5, slot.device_packed.len() * 4, stream.cu_stream())
                .map_err(driver("cuMemsetD8Async"))?;
            result::memset_d8_async(scales, 0xA5, slot.device_scales.len() * 2, stream.cu_stream())
                .map_err(driver("cuMemsetD8Async"))?;
        }
        stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
        slot.packed.as_mut_slice().map_err(driver("cuEventSynchronize"))?.fill(0xA5A5_A5A5);
        slot.scales.as_mut_slice().map_err(driver("cuEventSynchronize"))?.fill(0xA5A5);
    }
    Ok(())
}

/// The launch parameters shared by every chunk of one tensor.
struct Launch {
    function: String,
    group_size: i32,
    rule: i32,
    mse: MseParams,
    block_scales: Option<(u64, i32, i32)>,
}

/// Enqueues one chunk's kernel on `stream`: `rows` rows from absolute row `first_row`.
fn enqueue_kernel(
    gpu: &Gpu,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    launch: &Launch,
    (input, packed, scales): (u64, u64, u64),
    rows: usize,
    columns: usize,
    first_row: usize,
) -> Result<(), CudaError> {
    let function = gpu.function(&launch.function)?;
    let groups = rows * columns / launch.group_size as usize;
    let (rows, columns, first_row) = (rows as i64, columns as i64, first_row as i64);
    let mut builder = stream.launch_builder(&function);
    match &launch.block_scales {
        Some((block_scales, block_rows, block_columns)) => {
            builder.arg(&input).arg(block_scales).arg(&packed).arg(&scales);
            builder.arg(&rows).arg(&columns).arg(&first_row).arg(&launch.group_size);
            builder.arg(block_rows).arg(block_columns);
        }
        None => {
            builder.arg(&input).arg(&packed).arg(&scales).arg(&rows).arg(&columns).arg(&launch.group_size);
        }
    }
    builder.arg(&launch.rule).arg(&launch.mse.steps).arg(&launch.mse.grid).arg(&launch.mse.norm);
    let config = LaunchConfig {
        grid_dim: (blocks_for(groups), 1, 1),
        block_dim: (THREADS_PER_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the argument list matches int4_quantize_{fp8,f32}_* in kernels/int4_quantize.cu; the buffers hold
    // `rows` rows of input, rows·columns/8 words and rows·columns/group scales; shapes were checked.
    unsafe { builder.launch(config) }.map_err(driver("cuLaunchKernel"))?;
    Ok(())
}

/// Quantizes `source` on the GPU.
pub fn run(
    gpu: &Gpu,
    source: Source<'_>,
    group_size: usize,
    rule: ScaleRule,
    search: MseSearch,
) -> Result<Int4Output, CudaError> {
    let (rows, columns) = source.shape();
    check_int4_shape(source.name(), columns, group_size)?;
    let mut output = Int4Output { packed: vec![0; rows * columns / 8], scales: vec![0; rows * columns / group_size] };
    if rows * columns == 0 {
        return Ok(output);
    }
    let element_bytes = source.element_bytes();
    let rows_per_chunk = (CHUNK_BYTES / (columns * element_bytes)).clamp(1, rows);
    let (input_bytes, words, groups) =
        (rows_per_chunk * columns * element_bytes, rows_per_chunk * columns / 8, rows_per_chunk * columns / group_size);

    let mut staging_slot = gpu.staging.lock().map_err(|_| CudaError::Module("staging lock poisoned".into()))?;
    let fits =
        staging_slot.as_ref().is_some_and(|s| s.input_bytes >= input_bytes && s.words >= words && s.groups >= groups);
    if !fits {
        *staging_slot = None; // free the smaller set before allocating
        let sizes = (input_bytes.max(CHUNK_BYTES), words.max(CHUNK_BYTES / 8), groups.max(CHUNK_BYTES / 8));
        *staging_slot = Some(new_staging(gpu, sizes.0, sizes.1, sizes.2)?);
    }
    let staging = staging_slot.as_mut().expect("staging allocated above");

    // The block scales of the whole tensor, once, before any chunk runs.
    let block_scales_buffer = match &source {
        Source::Fp8(tensor) => {
            let buffer = gpu.streams[0].clone_htod(tensor.block_scales).map_err(driver("cuMemcpyHtoD"))?;
            gpu.streams[0].synchronize().map_err(driver("cuStreamSynchronize"))?;
            Some(buffer)
        }
        Source::F32 { .. } => None,
    };
    let launch = Launch {
        function: int4_kernel(
            if matches!(source, Source::Fp8(_)) { Int4Source::Fp8 } else { Int4Source::F32 },
            group_size,
        ),
        group_size: group_size as i32,
        rule: rule_code(rule),
        mse: MseParams::from(search),
        block_scales: match (&source, &block_scales_buffer) {
            (Source::Fp8(tensor), Some(buffer)) => {
                Some((buffer.device_ptr(&gpu.streams[0]).0, tensor.block_rows as i32, tensor.block_columns as i32))
            }
            _ => None,
        },
    };

    let result = (|| -> Result<(), CudaError> {
        let chunks = rows.div_ceil(rows_per_chunk);
        for chunk in 0..chunks + 2 {
            let index = chunk % 2;
            let stream = &gpu.streams[index];
            let slot = &mut staging.slots[index];
            if let Some((word, word_count, scale, scale_count)) = slot.pending.take() {
                stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
                let packed = slot.packed.as_slice().map_err(driver("cuEventSynchronize"))?;
                output.packed[word..word + word_count].copy_from_slice(&packed[..word_count]);
                let scales = slot.scales.as_slice().map_err(driver("cuEventSynchronize"))?;
                output.scales[scale..scale + scale_count].copy_from_slice(&scales[..scale_count]);
            }
            if chunk >= chunks {
                continue;
            }
            let first_row = chunk * rows_per_chunk;
            let chunk_rows = rows_per_chunk.min(rows - first_row);
            let bytes = source.bytes(first_row..first_row + chunk_rows);
            // Host side: the shard pages are read (from the page cache or the disk) while the other slot computes.
            let input = slot.input.as_mut_slice().map_err(driver("cuEventSynchronize"))?;
            input[..bytes.len()].copy_from_slice(bytes);
            let (input_ptr, _) = slot.device_input.device_ptr(stream);
            let (packed_ptr, _) = slot.device_packed.device_ptr(stream);
            let (scales_ptr, _) = slot.device_scales.device_ptr(stream);
            let (word_count, scale_count) = (chunk_rows * columns / 8, chunk_rows * columns / group_size);
            // SAFETY: pinned source and device target both hold at least `bytes.len()` bytes; the slot is not
            // touched again until its stream is synchronized above.
            unsafe { result::memcpy_htod_async(input_ptr, &input[..bytes.len()], stream.cu_stream()) }
                .map_err(driver("cuMemcpyHtoDAsync"))?;
            enqueue_kernel(gpu, stream, &launch, (input_ptr, packed_ptr, scales_ptr), chunk_rows, columns, first_row)?;
            let packed = slot.packed.as_mut_slice().map_err(driver("cuEventSynchronize"))?;
            // SAFETY: as above, the pinned targets outlive the copies, which complete before the next read.
            unsafe { result::memcpy_dtoh_async(&mut packed[..word_count], packed_ptr, stream.cu_stream()) }
                .map_err(driver("cuMemcpyDtoHAsync"))?;
            let scales = slot.scales.as_mut_slice().map_err(driver("cuEventSynchronize"))?;
            // SAFETY: as above.
            unsafe { result::memcpy_dtoh_async(&mut scales[..scale_count], scales_ptr, stream.cu_stream()) }
                .map_err(driver("cuMemcpyDtoHAsync"))?;
            slot.pending = Some((first_row * columns / 8, word_count, first_row * columns / group_size, scale_count));
        }
        Ok(())
    })();
    if result.is_err() {
        // Leave no chunk in flight against buffers that stay cached.
        for (stream, slot) in gpu.streams.iter().zip(staging.slots.iter_mut()) {
            let _ = stream.synchronize();
            slot.pending = None;
        }
    }
    result.map(|()| output)
}

/// Seconds of one kernel launch over a device-resident FP8 tensor (best of `repeats`).
pub fn time_kernel(
    gpu: &Gpu,
    tensor: &Fp8Tensor<'_>,
    group_size: usize,
    rule: ScaleRule,
    search: MseSearch,
    repeats: usize,
) -> Result<f64, CudaError> {
    check_int4_shape(tensor.name, tensor.columns, group_size)?;
    let stream = &gpu.streams[0];
    let codes = stream.clone_htod(tensor.codes).map_err(driver("cuMemcpyHtoD"))?;
    let block_scales = stream.clone_htod(tensor.block_scales).map_err(driver("cuMemcpyHtoD"))?;
    let elements = tensor.rows * tensor.columns;
    let packed = gpu.alloc::<u32>(stream, elements / 8)?;
    let scales = gpu.alloc::<u16>(stream, elements / group_size)?;
    let launch = Launch {
        function: int4_kernel(Int4Source::Fp8, group_size),
        group_size: group_size as i32,
        rule: rule_code(rule),
        mse: MseParams::from(search),
        block_scales: Some((block_scales.device_ptr(stream).0, tensor.block_rows as i32, tensor.block_columns as i32)),
    };
    let pointers = (codes.device_ptr(stream).0, packed.device_ptr(stream).0, scales.device_ptr(stream).0);
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
        let started = Instant::now();
        enqueue_kernel(gpu, stream, &launch, pointers, tensor.rows, tensor.columns, 0)?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
        best = best.min(started.elapsed().as_secs_f64());
    }
    Ok(best)
}

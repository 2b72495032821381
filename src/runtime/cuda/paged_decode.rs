//! The decode step's paged attention on the device: a device copy of the [`KvPool`] kept with the pool across steps,
//! new rows written into it as they arrive (kernels/kv_write.cu), and batched decode attention whose launch also
//! verifies every mapping against the page tags (kernels/paged_attention.cu).
//!
//! The host pool stays the source of truth for block tables, tags and the DSA indexer keys, and keeps its own copy
//! of the rows (for the layers that attend on the host). The device copy is synchronized lazily: created from the
//! host pool on first use, rows written with `kv_write_rows` as they arrive, tags uploaded when the host's tag version
//! moved (allocation, release, injected fault), and the whole page array re-uploaded only if rows were written
//! behind the backend's back.
//!
//! Requests with a DSA key selection attend on the host (the kernel takes no key mask); the rest on the device.

use std::sync::Arc;

use super::paged::{self, DecodeBatch, DecodeRequest, DevicePool};
use super::CudaBackend;
use crate::runtime::backend::{KvRow, PagedDecode, PagedLayout, PagedStep};
use crate::runtime::cpu::paged::attend_cached;
use crate::runtime::device::{CudaError, Device, DeviceBuffer};
use crate::runtime::kv_cache::{KvPool, PoolError};

/// The device copy of a pool, kept in the pool ([`KvPool::keep_resident`]).
struct ResidentPool {
    /// The device it lives on (by address: a pool used with another backend is mirrored afresh).
    device: usize,
    pool: DevicePool,
    /// The host pool's [`KvPool::writes`] and [`KvPool::tag_version`] this copy reflects.
    writes: u64,
    tag_version: u64,
    batch: Option<CachedBatch>,
}

/// The last decode batch uploaded: reused by every layer of a step while the tables stay the same.
struct CachedBatch {
    key: Vec<u64>,
    layout: PagedLayout,
    batch: DecodeBatch,
    q: DeviceBuffer,
    out: DeviceBuffer,
    faults: DeviceBuffer,
}

fn device_key(backend: &CudaBackend) -> usize {
    Arc::as_ptr(&backend.device) as *const () as usize
}

/// The pool's device copy, brought up to date with the host pool (taken out of the pool; give it back with
/// `pool.keep_resident`).
fn resident(backend: &CudaBackend, pool: &mut KvPool) -> Result<ResidentPool, CudaError> {
    let device = backend.device();
    let shape = pool.shape();
    let kept = pool.take_resident().and_then(|kept| kept.downcast::<ResidentPool>().ok()).map(|kept| *kept);
    let mut resident = match kept {
        Some(kept) if kept.device == device_key(backend) && kept.pool.dtype() == pool.dtype() => {
            let same = kept.pool.shape();
            if (same.pages, same.layers, same.row_width, same.page_size)
                == (shape.pages, shape.layers, shape.row_width, shape.page_size)
            {
                Some(kept)
            } else {
                None
            }
        }
        _ => None,
    };
    if let Some(kept) = resident.as_mut() {
        if kept.writes != pool.writes() {
            device.write(&kept.pool.pages, pool.page_data())?;
            kept.writes = pool.writes();
        }
        if kept.tag_version != pool.tag_version() {
            kept.pool.upload_tags(device, pool)?;
            kept.tag_version = pool.tag_version();
        }
    }
    match resident {
        Some(kept) => Ok(kept),
        None => Ok(ResidentPool {
            device: device_key(backend),
            pool: DevicePool::mirror(device, pool)?,
            writes: pool.writes(),
            tag_version: pool.tag_version(),
            batch: None,
        }),
    }
}

/// Writes `rows` into the host pool and, with one `kv_write_rows` launch, into the device copy. With `tolerant`, a
/// row whose mapping disagrees with its page's tag is skipped (the attention's verification reports the request);
/// otherwise it is an error.
fn write(
    device: &dyn Device,
    resident: &mut ResidentPool,
    pool: &mut KvPool,
    layer: usize,
    rows: &[KvRow<'_>],
    tolerant: bool,
) -> Result<Result<(), PoolError>, CudaError> {
    let row_width = pool.shape().row_width;
    let (mut values, mut slots) = (Vec::with_capacity(rows.len() * row_width), Vec::with_capacity(rows.len()));
    for row in rows {
        if tolerant && !pool.mapping_agrees(row.request, row.position) {
            continue;
        }
        let slot = match pool.slot(row.request, row.position) {
            Ok(slot) => slot,
            Err(error) => return Ok(Err(error)),
        };
        if let Err(error) = pool.write(row.request, layer, row.position, row.row, row.aux) {
            return Ok(Err(error));
        }
        values.extend_from_slice(&row.row[..row_width]);
        slots.push(slot as u32);
    }
    if !slots.is_empty() {
        paged::write_rows(device, &resident.pool, layer, &values, &slots)?;
    }
    resident.writes = pool.writes();
    Ok(Ok(()))
}

/// [`crate::runtime::Backend::kv_write`] on the device.
pub fn kv_write(
    backend: &CudaBackend,
    pool: &mut KvPool,
    layer: usize,
    rows: &[KvRow<'_>],
) -> Result<Result<(), PoolError>, CudaError> {
    let mut resident = resident(backend, pool)?;
    let result = write(backend.device(), &mut resident, pool, layer, rows, false);
    if result.is_ok() {
        pool.keep_resident(Box::new(resident));
    }
    result
}

/// [`crate::runtime::Backend::paged_decode`] on the device.
pub fn decode(backend: &CudaBackend, pool: &mut KvPool, step: &PagedStep<'_>) -> Result<PagedDecode, CudaError> {
    let mut resident = resident(backend, pool)?;
    let result = decode_with(backend.device(), &mut resident, pool, step);
    if result.is_ok() {
        pool.keep_resident(Box::new(resident));
    }
    result
}

fn decode_with(
    device: &dyn Device,
    resident: &mut ResidentPool,
    pool: &mut KvPool,
    step: &PagedStep<'_>,
) -> Result<PagedDecode, CudaError> {
    let layout = step.layout;
    let (heads, qk_dim, v_dim) = (layout.heads, layout.qk_dim, layout.v_dim);
    let count = step.requests.len();
    let mut out = vec![f32::NAN; count * heads * v_dim];
    let mut faults: Vec<Option<PoolError>> = vec![None; count];
    let rows: Vec<KvRow> = step.requests.iter().map(|request| request.row).collect();
    // Tolerant writes cannot fail: a row with a bad mapping is skipped and its request faults below.
    let _ = write(device, resident, pool, step.layer, &rows, true)?;

    // Requests with a key selection, and every request when the kernel cannot take this layout, attend on the host.
    let on_device = paged::check_layout(&layout, pool.shape().row_width).is_ok();
    let (mut device_side, mut host_side) = (Vec::new(), Vec::new());
    for (index, request) in step.requests.iter().enumerate() {
        let known = pool.table(request.row.request).is_some();
        if on_device && known && request.selection.is_none() {
            device_side.push(index);
        } else {
            host_side.push(index);
        }
    }
    let mut verify_seconds = 0.0;
    for &index in &host_side {
        let request = &step.requests[index];
        let id = request.row.request;
        let y = &mut out[index * heads * v_dim..][..heads * v_dim];
        let q = &step.q[index * heads * qk_dim..][..heads * qk_dim];
        let result = (|| -> Result<(), PoolError> {
            if step.verify || !pool.mapping_agrees(id, request.row.position) {
                let started = std::time::Instant::now();
                let verified = pool.verify(id);
                verify_seconds += started.elapsed().as_secs_f64();
                verified?;
            }
            attend_cached(pool, step.layer, &layout, q, id, request.row.position + 1, request.selection, y)
        })();
        if let Err(error) = result {
            y.fill(f32::NAN);
            faults[index] = Some(error);
        }
    }
    if device_side.is_empty() {
        return Ok(PagedDecode { out, faults, verify_seconds });
    }

    let requests: Vec<DecodeRequest> = device_side
        .iter()
        .map(|&index| {
            let id = step.requests[index].row.request;
            let entries = pool.table(id).map_or(&[][..], |table| &table.entries[..]);
            DecodeRequest { id, context: step.requests[index].row.position + 1, entries }
        })
        .collect();
    let key: Vec<u64> = requests
        .iter()
        .flat_map(|request| {
            [request.id, request.context as u64, request.entries.len() as u64]
                .into_iter()
                .chain(request.entries.iter().flat_map(|mapping| [mapping.page as u64, mapping.generation]))
        })
        .collect();
    let reuse = resident.batch.as_ref().is_some_and(|cached| cached.key == key && cached.layout == layout);
    if !reuse {
        let page_size = pool.shape().page_size;
        let batch = DecodeBatch::new(device, &layout, page_size, &requests, None)?;
        resident.batch = Some(CachedBatch {
            key,
            layout,
            batch,
            q: device.alloc_for::<f32>(requests.len() * heads * qk_dim)?,
            out: device.alloc_for::<f32>(requests.len() * heads * v_dim)?,
            faults: device.alloc_for::<u32>(requests.len())?,
        });
    }
    let cached = resident.batch.as_ref().expect("a batch was just cached");
    let q: Vec<f32> =
        device_side.iter().flat_map(|&index| &step.q[index * heads * qk_dim..][..heads * qk_dim]).copied().collect();
    device.write_values(&cached.q, &q)?;
    paged::decode_on(
        device,
        &resident.pool,
        step.layer,
        &layout,
        &cached.batch,
        &cached.q,
        &cached.out,
        &cached.faults,
    )?;
    let device_out: Vec<f32> = device.download(&cached.out, requests.len() * heads * v_dim)?;
    let device_faults: Vec<u32> = device.download(&cached.faults, requests.len())?;
    let (mut verified, mut detected) = (0, 0);
    for (slot, &index) in device_side.iter().enumerate() {
        let request = &requests[slot];
        if step.verify {
            verified += request.entries.len() as u64;
        }
        let fault = device_faults[slot];
        if fault == 0 {
            out[index * heads * v_dim..][..heads * v_dim]
                .copy_from_slice(&device_out[slot * heads * v_dim..][..heads * v_dim]);
            continue;
        }
        // The device names the first bad logical page; the host's tags say what disagrees.
        detected += 1;
        faults[index] = Some(match pool.check(request.id) {
            Err(error) => error.into(),
            Ok(()) => PoolError::DeviceTags { request: request.id, index: fault as usize - 1 },
        });
    }
    pool.counters.mappings_verified += verified;
    pool.counters.faults_detected += detected;
    Ok(PagedDecode { out, faults, verify_seconds })
}

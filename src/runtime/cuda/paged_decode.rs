//! The decode step's paged attention on the device: the backend's own pages of a [`KvPool`] kept with the pool across
//! steps, new rows written into them from the device tensors that hold them (kernels/kv_write.cu), and batched
//! decode attention whose launch also verifies every mapping against the page tags (kernels/paged_attention.cu).
//!
//! The host pool keeps the page table (block tables, tags, free list); the rows and GLM-5's DSA indexer keys live
//! only here, and a DSA layer's key selection runs here too (kernels/indexer.cu `paged_index_*`). What crosses the
//! bus is the table's state, as decisions: tags when the host's tag version moved (allocation, release, injected
//! fault), the batch's block tables when they change, the slots each write goes to, and the per-request fault flags
//! — never a row, a key, a query or an output.

use std::sync::Arc;

use super::checks::unsupported;
use super::indexer;
use super::paged::{self, AllowedKeys, DecodeBatch, DecodeRequest, DevicePool};
use super::state::CudaBackend;
use super::tensor::{alloc, buffer};
use crate::runtime::backend::IndexerShape;
use crate::runtime::device::{CudaError, Device, DeviceBuffer};
use crate::runtime::kv_cache::{
    KeyChoice, KvAt, KvDtype, KvPool, KvRows, PagedDecode, PagedLayout, PagedStep, PoolError, PoolShape,
};
use crate::runtime::tensor::Tensor;

/// The backend's pages of a pool, kept in the pool ([`KvPool::keep_resident`]).
pub(crate) struct ResidentPool {
    /// The device it lives on (by address: a pool used with another backend gets pages of its own there).
    device: usize,
    pool: DevicePool,
    /// The aux values (GLM-5's DSA indexer keys) as an F32 pool of `aux_width`-wide rows; `None` when 0 wide.
    aux: Option<DevicePool>,
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
    faults: DeviceBuffer,
}

fn device_key(backend: &CudaBackend) -> usize {
    Arc::as_ptr(&backend.device) as *const () as usize
}

/// The pool's device pages with the host's tags, made on first use (taken out of the pool; give them back with
/// `pool.keep_resident`).
fn resident(backend: &CudaBackend, pool: &mut KvPool) -> Result<ResidentPool, CudaError> {
    let decisions = backend.counted().decisions();
    let shape = pool.shape();
    // A copy another backend kept is not this backend's: it is dropped and made anew.
    let kept = pool.take_resident().and_then(|kept| kept.downcast::<ResidentPool>().ok()).map(|kept| *kept);
    let kept = kept.filter(|kept| {
        let same = kept.pool.shape();
        kept.device == device_key(backend)
            && kept.pool.dtype() == pool.dtype()
            && (same.pages, same.layers, same.row_width, same.page_size)
                == (shape.pages, shape.layers, shape.row_width, shape.page_size)
    });
    let Some(mut kept) = kept else {
        if pool.page_data().is_some() {
            return Err(unsupported(
                "kv pool",
                "the pool's rows were written on the host; write a pool's rows through one backend",
            ));
        }
        let aux = (shape.aux_width > 0)
            .then(|| {
                let aux_shape = PoolShape { row_width: shape.aux_width, aux_width: 0, ..shape };
                DevicePool::allocate(
                    &decisions,
                    aux_shape,
                    KvDtype::F32,
                    &vec![vec![1.0; shape.aux_width]; shape.layers],
                )
            })
            .transpose()?;
        return Ok(ResidentPool {
            device: device_key(backend),
            pool: DevicePool::mirror(&decisions, pool)?,
            aux,
            writes: pool.writes(),
            tag_version: pool.tag_version(),
            batch: None,
        });
    };
    if kept.writes != pool.writes() {
        return Err(unsupported(
            "kv pool",
            "rows were written into the pool's host pages after the device took its own; write a pool's rows \
             through one backend",
        ));
    }
    if kept.tag_version != pool.tag_version() {
        kept.pool.upload_tags(&decisions, pool)?;
        kept.tag_version = pool.tag_version();
    }
    Ok(kept)
}

/// Writes row `r` of `rows` (and `aux`) at `at[r]`: one `kv_write_rows` launch each into the device pages (and the
/// aux pages), the written length into the host pool's table. With `tolerant`, a row whose mapping disagrees
/// with its page's tag is skipped (the attention's verification reports the request); otherwise it is an error.
fn write(
    backend: &CudaBackend,
    resident: &ResidentPool,
    pool: &mut KvPool,
    layer: usize,
    rows: &KvRows<'_>,
    tolerant: bool,
) -> Result<Result<(), PoolError>, CudaError> {
    let mut slots = Vec::with_capacity(rows.at.len());
    for &KvAt { request, position } in rows.at {
        if tolerant && !pool.mapping_agrees(request, position) {
            slots.push(-1);
            continue;
        }
        match pool.record(request, position) {
            Ok(slot) => slots.push(slot as i32),
            Err(error) => return Ok(Err(error)),
        }
    }
    if !slots.is_empty() {
        let decisions = backend.counted().decisions();
        let slots_buffer = (&decisions as &dyn Device).upload(&slots)?;
        let device = backend.device();
        paged::write_rows_on(device, &resident.pool, layer, buffer(rows.rows)?, &slots_buffer, slots.len())?;
        if let Some(aux) = &resident.aux {
            paged::write_rows_on(device, aux, layer, buffer(rows.aux)?, &slots_buffer, slots.len())?;
        }
    }
    Ok(Ok(()))
}

/// [`crate::runtime::Backend::kv_write`] on the device.
pub fn kv_write(
    backend: &CudaBackend,
    pool: &mut KvPool,
    layer: usize,
    rows: &KvRows<'_>,
) -> Result<Result<(), PoolError>, CudaError> {
    let resident = resident(backend, pool)?;
    let result = write(backend, &resident, pool, layer, rows, false);
    pool.keep_resident(Box::new(resident));
    result
}

/// [`crate::runtime::Backend::paged_decode`] on the device.
pub fn decode(backend: &CudaBackend, pool: &mut KvPool, step: &PagedStep<'_>) -> Result<PagedDecode, CudaError> {
    let mut resident = resident(backend, pool)?;
    let result = decode_with(backend, &mut resident, pool, step);
    pool.keep_resident(Box::new(resident));
    result
}

fn decode_with(
    backend: &CudaBackend,
    resident: &mut ResidentPool,
    pool: &mut KvPool,
    step: &PagedStep<'_>,
) -> Result<PagedDecode, CudaError> {
    let layout = step.layout;
    paged::check_layout(&layout, pool.shape().row_width)?;
    let count = step.requests.len();
    // Tolerant writes fail only on an unknown request, which the attention below faults as well.
    let rows = KvRows { rows: step.rows, aux: step.aux, at: step.requests };
    let _ = write(backend, resident, pool, step.layer, &rows, true)?;

    let requests: Vec<DecodeRequest> = step
        .requests
        .iter()
        .map(|at| {
            let entries = pool.table(at.request).map_or(&[][..], |table| &table.entries[..]);
            DecodeRequest { id: at.request, context: at.position + 1, entries }
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
    let decisions = backend.counted().decisions();
    let reuse = resident.batch.as_ref().is_some_and(|cached| cached.key == key && cached.layout == layout);
    if !reuse {
        let page_size = pool.shape().page_size;
        let batch = DecodeBatch::new(&decisions, &layout, page_size, &requests, None)?;
        resident.batch = Some(CachedBatch { key, layout, batch, faults: backend.device().alloc_for::<u32>(count)? });
    }
    let cached = resident.batch.as_ref().expect("a batch was just cached");
    let selected = match step.keys {
        Some(KeyChoice::Select { q, head_weights, heads, dim, top_k }) => {
            let aux = resident
                .aux
                .as_ref()
                .ok_or_else(|| unsupported("kv pool", "a DSA selection needs the pool's aux keys"))?;
            let shape = IndexerShape { tokens: count, heads, head_dim: dim, top_k };
            let stride = step.key_columns();
            Some(indexer::paged_select(backend, aux, step.layer, &cached.batch, (q, head_weights), &shape, stride)?)
        }
        Some(KeyChoice::SelectPools { .. }) => {
            return Err(unsupported(
                "paged_decode",
                "the k-pool DSA selection (GLM-5.3-Flash) has no device kernel yet; run with --device cpu",
            ))
        }
        _ => None,
    };
    let allowed = match (step.keys, &selected) {
        (Some(KeyChoice::Reuse(mask)), _) | (_, Some(mask)) => {
            Some(AllowedKeys { mask: buffer(mask)?, stride: mask.columns() })
        }
        _ => None,
    };
    let out: Tensor = alloc(backend.device(), count, layout.heads * layout.v_dim)?;
    paged::decode_on(
        backend.device(),
        (&resident.pool, step.layer),
        &layout,
        &cached.batch,
        buffer(step.q)?,
        (buffer(&out)?, &cached.faults),
        allowed,
    )?;
    let device_faults: Vec<u32> = (&decisions as &dyn Device).download(&cached.faults, count)?;
    let mut faults: Vec<Option<PoolError>> = vec![None; count];
    let (mut verified, mut detected) = (0, 0);
    for (index, request) in requests.iter().enumerate() {
        if step.verify {
            verified += request.entries.len() as u64;
        }
        let fault = device_faults[index];
        if fault == 0 {
            continue;
        }
        // The device names the first bad logical page; the host's tags say what disagrees.
        detected += 1;
        faults[index] = Some(match (pool.table(request.id), pool.check(request.id)) {
            (None, _) => PoolError::Unknown(request.id),
            (Some(_), Err(error)) => error.into(),
            (Some(_), Ok(())) => PoolError::DeviceTags { request: request.id, index: fault as usize - 1 },
        });
    }
    pool.counters.mappings_verified += verified;
    pool.counters.faults_detected += detected;
    Ok(PagedDecode { out, faults, keys: selected, verify_seconds: 0.0 })
}

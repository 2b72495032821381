//! Paged decode on the host (the CPU backend's pages are the pool's host pages): the pool's own row write, [`KvPool::verify`], and single-query softmax attention over
//! the rows [`KvPool::read`] decodes (the arithmetic of [`super::attention::attend`]).

use std::time::Instant;

use super::attention::{attend, KeyValues};
use crate::runtime::backend::{PagedLayout, PagedStep};
use crate::runtime::kv_cache::{KvPool, PoolError, RequestId};

/// Writes the rows `rows` `[n, row_width]` and `aux` `[n, aux_width]` of `layer` at `at` into `pool`'s host pages.
pub fn kv_write(
    pool: &mut KvPool,
    layer: usize,
    rows: &[f32],
    aux: &[f32],
    at: &[crate::runtime::backend::KvAt],
) -> Result<(), PoolError> {
    let (row_width, aux_width) = (pool.shape().row_width, pool.shape().aux_width);
    for (r, at) in at.iter().enumerate() {
        pool.write(
            at.request,
            layer,
            at.position,
            &rows[r * row_width..][..row_width],
            &aux[r * aux_width..][..aux_width],
        )?;
    }
    Ok(())
}

/// Verify (when asked), write, attend, per request in order: `q`, `rows` and `aux` are `step`'s tensors' values;
/// returns the `[requests, heads · v_dim]` outputs and each request's fault.
pub fn decode(
    pool: &mut KvPool,
    step: &PagedStep<'_>,
    q: &[f32],
    rows: &[f32],
    aux: &[f32],
) -> (Vec<f32>, Vec<Option<PoolError>>, f64) {
    let PagedLayout { heads, qk_dim, v_dim, .. } = step.layout;
    let (row_width, aux_width) = (pool.shape().row_width, pool.shape().aux_width);
    let mut out = vec![0f32; step.requests.len() * heads * v_dim];
    let mut faults = vec![None; step.requests.len()];
    let mut verify_seconds = 0.0;
    for (index, request) in step.requests.iter().enumerate() {
        let (id, position) = (request.at.request, request.at.position);
        let y = &mut out[index * heads * v_dim..][..heads * v_dim];
        let result = (|| -> Result<(), PoolError> {
            if step.verify {
                let started = Instant::now();
                let verified = pool.verify(id);
                verify_seconds += started.elapsed().as_secs_f64();
                verified?;
            }
            let row = &rows[index * row_width..][..row_width];
            pool.write(id, step.layer, position, row, &aux[index * aux_width..][..aux_width])?;
            let q = &q[index * heads * qk_dim..][..heads * qk_dim];
            attend_cached(pool, step.layer, &step.layout, q, id, position + 1, request.selection, y)
        })();
        if let Err(error) = result {
            y.fill(f32::NAN);
            faults[index] = Some(error);
        }
    }
    (out, faults, verify_seconds)
}

/// Attends one request's query `q` `[heads, qk_dim]` over its cached positions `0..context` of `layer` (no
/// verification) into `y` `[heads, v_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn attend_cached(
    pool: &KvPool,
    layer: usize,
    layout: &PagedLayout,
    q: &[f32],
    request: RequestId,
    context: usize,
    selection: Option<&[bool]>,
    y: &mut [f32],
) -> Result<(), PoolError> {
    let (mut rows, mut aux) = (Vec::new(), Vec::new());
    pool.read(request, layer, context, &mut rows, &mut aux)?;
    attend_rows(layout, q, &rows, pool.shape().row_width, context, selection, y);
    Ok(())
}

/// Softmax attention of one query `q` `[heads, qk_dim]` over `count` rows `[count, row_width]` laid out as
/// `layout`, restricted to the `allowed` keys when given, into `y` `[heads, v_dim]` (overwritten).
pub fn attend_rows(
    layout: &PagedLayout,
    q: &[f32],
    rows: &[f32],
    row_width: usize,
    count: usize,
    allowed: Option<&[bool]>,
    y: &mut [f32],
) {
    let PagedLayout { heads, kv_heads, qk_dim, v_dim, k_stride, v_base, v_stride, scale } = *layout;
    let group = heads / kv_heads.max(1);
    // Keys and values `[count, kv_heads, dim]`, the layout `attend` reads.
    let mut k = Vec::with_capacity(count * kv_heads * qk_dim);
    let mut v = Vec::with_capacity(count * kv_heads * v_dim);
    for row in rows[..count * row_width].chunks(row_width) {
        for head in 0..kv_heads {
            k.extend_from_slice(&row[head * k_stride..][..qk_dim]);
        }
        for head in 0..kv_heads {
            v.extend_from_slice(&row[v_base + head * v_stride..][..v_dim]);
        }
    }
    y.fill(0.0);
    for (head, out) in y.chunks_mut(v_dim).enumerate().take(heads) {
        let keys = KeyValues { k: &k, v: &v, kv_heads, kv_head: head / group.max(1), qk_dim, v_dim };
        let q_row = &q[head * qk_dim..][..qk_dim];
        attend(q_row, &keys, count, scale, |key| allowed.is_none_or(|mask| mask[key]), out);
    }
}

//! Paged decode on the host (the CPU backend's pages are the pool's host pages): the pool's own row write,
//! [`KvPool::verify`], the DSA key choice over the cached indexer keys ([`super::indexer::select`]), and
//! single-query softmax attention over the rows [`KvPool::read`] decodes (the arithmetic of
//! [`super::attention::attend_block`]).

use std::time::Instant;

use super::attention::{attend_block, KeysValues};
use super::indexer::{pooled_keys, select, select_pools, split_pooled_rows};
use crate::runtime::backend::IndexerShape;
use crate::runtime::kv_cache::{KeyChoice, KvAt, KvPool, PagedLayout, PagedStep, PoolError};

/// Writes the rows `rows` `[n, row_width]` and `aux` `[n, aux_width]` of `layer` at `at` into `pool`'s host pages.
pub fn kv_write(pool: &mut KvPool, layer: usize, rows: &[f32], aux: &[f32], at: &[KvAt]) -> Result<(), PoolError> {
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

/// Verify (when asked), write, choose the DSA keys (with `step.keys`), attend, per request in order: `q`, `rows`,
/// `aux` are `step`'s tensors' values and `keys` those of its [`KeyChoice`] (the query and head weights to select
/// with, or the mask to reuse). Returns the `[requests, heads · v_dim]` outputs, each request's fault and, when
/// this layer selected, the `[requests, stride]` mask of the keys it chose.
pub fn decode(
    pool: &mut KvPool,
    step: &PagedStep<'_>,
    (q, rows, aux): (&[f32], &[f32], &[f32]),
    keys: Option<(&[f32], &[f32])>,
) -> Decoded {
    let PagedLayout { heads, qk_dim, v_dim, .. } = step.layout;
    let (row_width, aux_width) = (pool.shape().row_width, pool.shape().aux_width);
    let count = step.requests.len();
    let stride = step.key_columns();
    let mut out = vec![0f32; count * heads * v_dim];
    let mut mask = step.keys.map(|_| vec![0f32; count * stride]);
    let mut faults = vec![None; count];
    let mut verify_seconds = 0.0;
    let (mut cached, mut kept) = (Vec::new(), Vec::new());
    for (index, &KvAt { request: id, position }) in step.requests.iter().enumerate() {
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
            let allowed = match (step.keys, keys, mask.as_mut()) {
                (Some(choice), Some((first, second)), Some(mask)) => {
                    let mask = &mut mask[index * stride..][..position + 1];
                    choose(pool, step, choice, (first, second), index, mask, (&mut cached, &mut kept))?;
                    Some(&kept[..])
                }
                _ => None,
            };
            let q = &q[index * heads * qk_dim..][..heads * qk_dim];
            attend_cached(pool, step, KvAt { request: id, position }, q, allowed, y)
        })();
        if let Err(error) = result {
            y.fill(f32::NAN);
            faults[index] = Some(error);
        }
    }
    let selected = matches!(step.keys, Some(KeyChoice::Select { .. } | KeyChoice::SelectPools { .. }));
    Decoded { out, faults, keys: mask.filter(|_| selected).map(|mask| (mask, stride)), verify_seconds }
}

/// [`decode`]'s results.
pub struct Decoded {
    pub out: Vec<f32>,
    pub faults: Vec<Option<PoolError>>,
    /// The `[requests, stride]` mask and its stride.
    pub keys: Option<(Vec<f32>, usize)>,
    pub verify_seconds: f64,
}

/// Request `index` of `step`'s DSA keys into `mask` (`[position + 1]`, 1.0 kept) and `kept` (`cached` is scratch):
/// selected by this layer's indexer over the host pool's cached keys (`values` = its query and head weights), or
/// reused (`values.0` = the earlier mask).
fn choose(
    pool: &KvPool,
    step: &PagedStep<'_>,
    choice: KeyChoice<'_>,
    values: (&[f32], &[f32]),
    index: usize,
    mask: &mut [f32],
    (cached, kept): (&mut Vec<f32>, &mut Vec<bool>),
) -> Result<(), PoolError> {
    let (layer, at) = (step.layer, step.requests[index]);
    let context = at.position + 1;
    kept.clear();
    kept.resize(context, false);
    match choice {
        KeyChoice::Select { heads, dim, top_k, .. } => {
            pool.read_aux(at.request, layer, context, cached)?;
            let shape = IndexerShape { tokens: context, heads, head_dim: dim, top_k };
            let query = &values.0[index * heads * dim..][..heads * dim];
            select(query, &values.1[index * heads..][..heads], cached, context, &shape, kept);
        }
        KeyChoice::SelectPools { heads, dim, top_k, size, select_tail, ape, .. } => {
            pool.read_aux(at.request, layer, context, cached)?;
            let (keys, gates) = split_pooled_rows(cached, dim);
            let pools = context / size;
            let pooled = pooled_keys(&keys, &gates, ape, (size, dim, pools));
            let pool_shape = IndexerShape { tokens: pools, heads, head_dim: dim, top_k: top_k / size };
            let query = (&values.0[index * heads * dim..][..heads * dim], &values.1[index * heads..][..heads]);
            select_pools(query, &pooled, &pool_shape, (size, select_tail), kept);
        }
        KeyChoice::Reuse(earlier) => {
            let row = &values.0[index * earlier.columns()..][..context];
            kept.iter_mut().zip(row).for_each(|(keep, &value)| *keep = value != 0.0);
        }
    }
    mask.iter_mut().zip(kept.iter()).for_each(|(slot, &keep)| *slot = if keep { 1.0 } else { 0.0 });
    Ok(())
}

/// Attends one request's query `q` `[heads, qk_dim]` over its cached positions `0..=at.position` of `step`'s layer
/// (no verification) into `y` `[heads, v_dim]`.
pub fn attend_cached(
    pool: &KvPool,
    step: &PagedStep<'_>,
    at: KvAt,
    q: &[f32],
    selection: Option<&[bool]>,
    y: &mut [f32],
) -> Result<(), PoolError> {
    let (layer, layout, request, context) = (step.layer, &step.layout, at.request, at.position + 1);
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
    let rows = &rows[..count * row_width];
    let by_head: Vec<KeysValues> = (0..kv_heads)
        .map(|head| {
            KeysValues::gather(
                count,
                qk_dim,
                v_dim,
                |key| &rows[key * row_width + head * k_stride..][..qk_dim],
                |key| &rows[key * row_width + v_base + head * v_stride..][..v_dim],
            )
        })
        .collect();
    for (head, out) in y.chunks_mut(v_dim).enumerate().take(heads) {
        let q_row = &q[head * qk_dim..][..qk_dim];
        let admits = |_: usize, key: usize| allowed.is_none_or(|mask| mask[key]);
        attend_block((q_row, 1), &by_head[head / group.max(1)], count, |_| count, admits, scale, out);
    }
}

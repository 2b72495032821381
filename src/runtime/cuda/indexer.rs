//! The DSA indexer's top-k selection on the device: kernels/indexer.cu (index scores, then a per-query top-k mask),
//! over one sequence's keys or, in a decode step, over each request's keys in the paged cache.

use crate::runtime::backend::INDEXER_NEAR_TIE_RELATIVE as NEAR_TIE_RELATIVE;
use crate::runtime::backend::{IndexerShape, KeySelection};
use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};

use super::checks::buffers_hold;
use std::ops::Range;

use crate::runtime::tensor::Tensor;

use super::checks::unsupported;
use super::paged::{DecodeBatch, DevicePool};
use super::state::CudaBackend;
use super::tensor::{alloc, buffer, download_decisions, row_range, sequence_inputs, words};

/// Threads per block of both kernels (one block per query).
const THREADS: u32 = 256;
/// Query row values held in shared memory (the kernel's `kIndexerMaxQuery`).
pub const MAX_QUERY_WIDTH: usize = 4096;
/// Head weights held in shared memory (the kernel's `kIndexerMaxHeads`).
pub const MAX_HEADS: usize = 128;

/// Checks what the kernels support.
pub fn check(shape: &IndexerShape) -> Result<(), CudaError> {
    let IndexerShape { tokens, heads, head_dim, top_k } = *shape;
    if heads == 0 || heads > MAX_HEADS || head_dim == 0 || heads * head_dim > MAX_QUERY_WIDTH {
        return Err(unsupported(
            "indexer_top_k",
            format!(
                "{heads} heads of dimension {head_dim}; the indexer kernels take up to {MAX_HEADS} heads and \
             {MAX_QUERY_WIDTH} query values"
            ),
        ));
    }
    if top_k == 0 {
        return Err(unsupported("indexer_top_k", "top-k 0 keeps no key"));
    }
    if tokens.checked_mul(tokens).is_none_or(|cells| cells > i64::MAX as usize / 4) || tokens > i32::MAX as usize {
        return Err(unsupported("indexer_top_k", format!("{tokens} tokens overflow the score matrix")));
    }
    Ok(())
}

/// Device buffers of one sequence: `q` f32 `[tokens, heads, head_dim]`, `k` f32 `[tokens, head_dim]`,
/// `head_weights` f32 `[tokens, heads]`; scratch `scores` f32 `[tokens, tokens]`; out `mask` u8 `[tokens, tokens]`
/// and `near_tie` i32 `[tokens]`.
pub struct IndexerBuffers<'a> {
    pub q: &'a DeviceBuffer,
    pub k: &'a DeviceBuffer,
    pub head_weights: &'a DeviceBuffer,
    pub scores: &'a DeviceBuffer,
    pub mask: &'a DeviceBuffer,
    pub near_tie: &'a DeviceBuffer,
}

/// Launches `indexer_scores` then `indexer_top_k_mask` on device-resident buffers.
pub fn launch_indexer_top_k(
    device: &dyn Device,
    buffers: &IndexerBuffers,
    shape: &IndexerShape,
) -> Result<(), CudaError> {
    check(shape)?;
    let IndexerShape { tokens, heads, head_dim, top_k } = *shape;
    let sizes = [
        ("q", buffers.q.bytes(), tokens * heads * head_dim * 4),
        ("k", buffers.k.bytes(), tokens * head_dim * 4),
        ("head weight", buffers.head_weights.bytes(), tokens * heads * 4),
        ("score", buffers.scores.bytes(), tokens * tokens * 4),
        ("mask", buffers.mask.bytes(), tokens * tokens),
        ("near-tie", buffers.near_tie.bytes(), tokens * 4),
    ];
    buffers_hold("indexer_top_k", &sizes)?;
    if tokens == 0 {
        return Ok(());
    }
    let softmax_scale = (head_dim as f32).powf(-0.5);
    let head_scale = (heads as f32).powf(-0.5);
    let grid = LaunchShape::linear(tokens as u32, THREADS);
    device.launch(
        "indexer_scores",
        grid,
        &[
            Arg::Buffer(buffers.q),
            Arg::Buffer(buffers.k),
            Arg::Buffer(buffers.head_weights),
            Arg::Buffer(buffers.scores),
            Arg::I32(tokens as i32),
            Arg::I32(heads as i32),
            Arg::I32(head_dim as i32),
            Arg::F32(softmax_scale),
            Arg::F32(head_scale),
        ],
    )?;
    device.launch(
        "indexer_top_k_mask",
        grid,
        &[
            Arg::Buffer(buffers.scores),
            Arg::Buffer(buffers.mask),
            Arg::Buffer(buffers.near_tie),
            Arg::I32(tokens as i32),
            Arg::I32(top_k.min(tokens) as i32),
            Arg::F32(NEAR_TIE_RELATIVE),
        ],
    )
}

/// The keys each query of the sequence in rows `rows` keeps, computed on the device; the mask comes back as a
/// decision.
pub fn top_k(
    backend: &CudaBackend,
    (q, k, head_weights): (&Tensor, &Tensor, &Tensor),
    rows: Range<usize>,
    shape: &IndexerShape,
) -> Result<KeySelection, CudaError> {
    check(shape)?;
    let IndexerShape { tokens, heads, head_dim, .. } = *shape;
    let widths = [("q", q, heads * head_dim), ("k", k, head_dim), ("head weights", head_weights, heads)];
    sequence_inputs("indexer_top_k", &widths, &rows, tokens)?;
    if tokens == 0 {
        return Ok(KeySelection { mask: Vec::new(), near_ties: 0 });
    }
    let device = backend.device();
    let (q, k, head_weights) = (
        row_range(device, q, rows.clone())?,
        row_range(device, k, rows.clone())?,
        row_range(device, head_weights, rows)?,
    );
    let scores = device.alloc_for::<f32>(tokens * tokens)?;
    let mask = device.alloc_for::<u8>(tokens * tokens)?;
    let near_tie = device.alloc_for::<i32>(tokens)?;
    let buffers = IndexerBuffers {
        q: buffer(&q)?,
        k: buffer(&k)?,
        head_weights: buffer(&head_weights)?,
        scores: &scores,
        mask: &mask,
        near_tie: &near_tie,
    };
    launch_indexer_top_k(device, &buffers, shape)?;
    let [cells, flags] = download_decisions(backend, [&mask, &near_tie])?;
    let near_ties = words(&flags).take(tokens).filter(|&tie| tie != 0).count();
    Ok(KeySelection { mask: cells[..tokens * tokens].iter().map(|&cell| cell != 0).collect(), near_ties })
}

/// A decode step's DSA selection over a paged cache: request `r`'s index query and head weights (rows of `q`
/// `[requests, heads · head_dim]`, `head_weights` `[requests, heads]`) score its cached keys in `aux` (an F32 pool of
/// `head_dim`-wide rows) through `batch`'s block tables, and the best `shape.top_k` of its `context` keys are kept
/// (kernels/indexer.cu `paged_index_scores`, `paged_index_top_k`; the arithmetic of [`top_k`]'s kernels). Returns
/// the f32 0/1 mask `[requests, stride]`, on the device.
pub fn paged_select(
    backend: &CudaBackend,
    aux: &DevicePool,
    layer: usize,
    batch: &DecodeBatch,
    (q, head_weights): (&Tensor, &Tensor),
    shape: &IndexerShape,
    stride: usize,
) -> Result<Tensor, CudaError> {
    check(&IndexerShape { tokens: 1, ..*shape })?;
    let IndexerShape { heads, head_dim, top_k, .. } = *shape;
    let requests = batch.requests;
    let aux_shape = aux.shape();
    if aux_shape.row_width != head_dim || layer >= aux_shape.layers {
        return Err(unsupported(
            "indexer_top_k",
            format!(
                "layer {layer}'s cached keys are {} wide in a {}-layer pool; the indexer's are {head_dim}",
                aux_shape.row_width, aux_shape.layers
            ),
        ));
    }
    let widths = [("q", q, heads * head_dim), ("head weights", head_weights, heads)];
    sequence_inputs("paged indexer", &widths, &(0..requests), requests)?;
    let device = backend.device();
    let scores = device.alloc_for::<f32>((requests * stride).max(1))?;
    let mask = alloc(device, requests, stride)?;
    let blocks = stride.div_ceil(THREADS as usize).clamp(1, 65_535) as u32;
    device.launch(
        "paged_index_scores",
        LaunchShape { grid: [blocks, requests as u32, 1], block: [THREADS, 1, 1], shared_bytes: 0 },
        &[
            Arg::Buffer(buffer(q)?),
            Arg::Buffer(buffer(head_weights)?),
            Arg::Buffer(&aux.pages),
            Arg::Buffer(&batch.descriptors),
            Arg::Buffer(&batch.mappings),
            Arg::Buffer(&scores),
            Arg::I32(stride as i32),
            Arg::I32(aux_shape.pages as i32),
            Arg::I32(aux_shape.layers as i32),
            Arg::I32(layer as i32),
            Arg::I32(aux_shape.page_size as i32),
            Arg::I32(heads as i32),
            Arg::I32(head_dim as i32),
            Arg::F32((head_dim as f32).powf(-0.5)),
            Arg::F32((heads as f32).powf(-0.5)),
        ],
    )?;
    device.launch(
        "paged_index_top_k",
        LaunchShape::linear(requests as u32, THREADS),
        &[
            Arg::Buffer(&scores),
            Arg::Buffer(&batch.descriptors),
            Arg::Buffer(buffer(&mask)?),
            Arg::I32(stride as i32),
            Arg::I32(top_k as i32),
        ],
    )?;
    Ok(mask)
}

//! The paged KV cache on the device: a pool with the CPU [`KvPool`]'s byte layout and tags, the row write
//! (kernels/kv_write.cu) and batched single-query decode attention that verifies each request's mappings in the
//! same launch (kernels/paged_attention.cu).
//!
//! Tags live on the device as [`TAG_WORDS`] u32 per page (owner lo/hi, logical index, generation lo/hi, state);
//! block tables travel per batch as [`REQUEST_WORDS`] u32 per request (id lo/hi, context, first mapping, mapping
//! count) and [`MAPPING_WORDS`] u32 per mapping (page, generation lo/hi). A request whose mappings disagree with the
//! tags gets `faults[request] = 1 + first bad logical page` and NaN output; the others are computed as usual.

use crate::runtime::device::{Arg, CudaError, Device, DeviceBuffer, LaunchShape};
use crate::runtime::kv_cache::{KvDtype, KvPool, Mapping, PageTag, PagedLayout, PoolShape, RequestId};

use super::checks::buffers_hold;
use super::checks::unsupported;

pub const TAG_WORDS: usize = 8;
pub const REQUEST_WORDS: usize = 8;
pub const MAPPING_WORDS: usize = 4;
const TAGGED: u32 = 1;
const ON_FREE_LIST: u32 = 2;

/// Threads per block of `kv_write_rows`, `paged_decode_partial` and `paged_decode_combine`.
const WRITE_THREADS: u32 = 256;
const DECODE_THREADS: u32 = 256;
const COMBINE_THREADS: u32 = 128;
/// Query heads one `paged_decode_partial` block serves (`kDecodeHeads`).
const HEADS_PER_BLOCK: usize = 4;
/// Query heads one `paged_mla_decode_partial` block serves (`kMlaHeads`), the most row elements it stages
/// (`kMlaMaxWidth`), and its shared-memory geometry (`kMlaKeys`, `kMlaRowPad`, `kMlaScorePitch`, `kMlaWeightPitch`).
const MLA_HEADS_PER_BLOCK: usize = 64;
const MLA_MAX_WIDTH: usize = 576;
const MLA_KEYS: usize = 32;
const MLA_ROW_PAD: usize = 8;
/// Widths the decode kernel holds in shared memory / registers.
pub const MAX_QK_DIM: usize = 1024;
pub const MAX_V_DIM: usize = 512;
/// Keys one split aims at, and the most splits per request, when the plan is derived from the context.
const KEYS_PER_SPLIT: usize = 512;
const MAX_SPLITS: usize = 64;

fn dtype_code(dtype: KvDtype) -> i32 {
    match dtype {
        KvDtype::F32 => 0,
        KvDtype::Bf16 => 1,
        KvDtype::Fp8 => 2,
    }
}

fn low(value: u64) -> u32 {
    value as u32
}

fn high(value: u64) -> u32 {
    (value >> 32) as u32
}

/// The device words of one page's tag (`None` = untagged) and free-list state.
pub fn tag_words(tag: Option<PageTag>, on_free: bool) -> [u32; TAG_WORDS] {
    let state = if on_free { ON_FREE_LIST } else { 0 };
    match tag {
        Some(PageTag { owner, index, generation }) => {
            [low(owner), high(owner), index, low(generation), high(generation), state | TAGGED, 0, 0]
        }
        None => [0, 0, 0, 0, 0, state, 0, 0],
    }
}

/// A KV pool on the device: `pages` bytes `[pages, layers, page_size, row_width]` of `dtype` (the CPU pool's layout),
/// `tags` `[pages, TAG_WORDS]` u32, `scales` f32 `[layers, row_width]`. The DSA indexer's aux values are not kept here.
pub struct DevicePool {
    shape: PoolShape,
    dtype: KvDtype,
    pub pages: DeviceBuffer,
    pub tags: DeviceBuffer,
    pub scales: DeviceBuffer,
}

impl DevicePool {
    /// An empty pool (zero bytes, every page free and untagged) with `scales[layer][element]`.
    pub fn new(device: &dyn Device, shape: PoolShape, dtype: KvDtype, scales: &[Vec<f32>]) -> Result<Self, CudaError> {
        Self::check_shape(shape, scales)?;
        let bytes = shape.pages * shape.layers * shape.page_size * shape.row_width * dtype.bytes();
        let tags: Vec<u32> = (0..shape.pages).flat_map(|_| tag_words(None, true)).collect();
        Ok(Self {
            shape,
            dtype,
            pages: device.upload(&vec![0u8; bytes])?,
            tags: device.upload(&tags)?,
            scales: device.upload(&scales.concat())?,
        })
    }

    /// A pool of `shape` whose rows are written before they are read (nothing uploaded but `scales`, as weights);
    /// its tags are not kept (the aux keys beside a pool whose tags are).
    pub fn allocate(
        device: &dyn Device,
        shape: PoolShape,
        dtype: KvDtype,
        scales: &[Vec<f32>],
    ) -> Result<Self, CudaError> {
        Self::check_shape(shape, scales)?;
        let bytes = shape.pages * shape.layers * shape.page_size * shape.row_width * dtype.bytes();
        Ok(Self {
            shape,
            dtype,
            pages: device.alloc(bytes)?,
            tags: device.alloc_for::<u32>(TAG_WORDS)?,
            scales: device.upload_resident(&scales.concat())?,
        })
    }

    /// A copy of `pool`: its host pages' bytes (none allocated: rows unset), tags and scales. A backend's own pages
    /// start from a pool the host never wrote: nothing but the tags and scales crosses the bus, and a row is read
    /// only after the backend wrote it.
    pub fn mirror(device: &dyn Device, pool: &KvPool) -> Result<Self, CudaError> {
        let shape = pool.shape();
        let scales: Vec<Vec<f32>> = (0..shape.layers).map(|layer| pool.layer_scales(layer).to_vec()).collect();
        Self::check_shape(shape, &scales)?;
        let bytes = shape.pages * shape.layers * shape.page_size * shape.row_width * pool.dtype().bytes();
        let pages = match pool.page_data() {
            Some(data) => device.upload(data)?,
            None => device.alloc(bytes)?,
        };
        let this = Self {
            shape,
            dtype: pool.dtype(),
            pages,
            tags: device.alloc_for::<u32>(shape.pages * TAG_WORDS)?,
            scales: device.upload_resident(&scales.concat())?,
        };
        this.upload_tags(device, pool)?;
        Ok(this)
    }

    fn check_shape(shape: PoolShape, scales: &[Vec<f32>]) -> Result<(), CudaError> {
        if scales.len() != shape.layers || scales.iter().any(|row| row.len() != shape.row_width) {
            return Err(unsupported(
                "kv pool",
                format!("need {} scale rows of {} values", shape.layers, shape.row_width),
            ));
        }
        let slots = shape.pages.saturating_mul(shape.page_size);
        if shape.page_size == 0 || slots > i32::MAX as usize || shape.row_width > i32::MAX as usize {
            return Err(unsupported(
                "kv pool",
                format!("{} pages of {} tokens exceed the kernels' 32-bit slot ids", shape.pages, shape.page_size),
            ));
        }
        Ok(())
    }

    /// Replaces the device tags with `pool`'s (after allocations, releases or fault injection on the host).
    pub fn upload_tags(&self, device: &dyn Device, pool: &KvPool) -> Result<(), CudaError> {
        let pages = self.shape.pages.min(pool.shape().pages);
        let words: Vec<u32> = (0..pages)
            .flat_map(|page| {
                let (tag, on_free) = pool.page_state(page);
                tag_words(tag, on_free)
            })
            .collect();
        device.write_values(&self.tags, &words)
    }

    pub fn shape(&self) -> PoolShape {
        self.shape
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// The pool's bytes (the layout of [`KvPool::page_data`]).
    pub fn download_pages(&self, device: &dyn Device) -> Result<Vec<u8>, CudaError> {
        device.download(&self.pages, self.pages.bytes())
    }

    fn scales_at(&self, layer: usize) -> Arg<'_> {
        Arg::At(&self.scales, layer * self.shape.row_width * 4)
    }

    fn check_layer(&self, layer: usize) -> Result<(), CudaError> {
        if layer >= self.shape.layers {
            return Err(unsupported("kv pool", format!("layer {layer} of a {}-layer pool", self.shape.layers)));
        }
        Ok(())
    }
}

/// Launches `kv_write_rows`: `rows` f32 `[tokens, row_width]` into `slots` i32 `[tokens]` (page · page_size + offset)
/// of `layer`, encoded as the pool's dtype.
pub fn write_rows_on(
    device: &dyn Device,
    pool: &DevicePool,
    layer: usize,
    rows: &DeviceBuffer,
    slots: &DeviceBuffer,
    tokens: usize,
) -> Result<(), CudaError> {
    pool.check_layer(layer)?;
    let PoolShape { layers, row_width, page_size, pages, .. } = pool.shape;
    if rows.bytes() < tokens * row_width * 4 || slots.bytes() < tokens * 4 {
        return Err(unsupported("kv rows", format!("buffers too small for {tokens} rows of {row_width}")));
    }
    if tokens == 0 {
        return Ok(());
    }
    let blocks = (tokens * row_width).div_ceil(WRITE_THREADS as usize).min(1 << 16) as u32;
    device.launch(
        "kv_write_rows",
        LaunchShape::linear(blocks, WRITE_THREADS),
        &[
            Arg::Buffer(rows),
            Arg::Buffer(slots),
            pool.scales_at(layer),
            Arg::Buffer(&pool.pages),
            Arg::I32(tokens as i32),
            Arg::I32(row_width as i32),
            Arg::I32(pages as i32),
            Arg::I32(layers as i32),
            Arg::I32(layer as i32),
            Arg::I32(page_size as i32),
            Arg::I32(dtype_code(pool.dtype)),
        ],
    )
}

/// Writes `rows` (`[slots.len(), row_width]`) of `layer` into `slots` (page · page_size + offset, as
/// `KvPool::write` places them).
pub fn write_rows(
    device: &dyn Device,
    pool: &DevicePool,
    layer: usize,
    rows: &[f32],
    slots: &[u32],
) -> Result<(), CudaError> {
    let PoolShape { row_width, page_size, pages, .. } = pool.shape;
    if rows.len() != slots.len() * row_width {
        return Err(unsupported("kv rows", format!("{} values for {} rows of {row_width}", rows.len(), slots.len())));
    }
    if let Some(slot) = slots.iter().find(|&&slot| slot as usize >= pages * page_size) {
        return Err(unsupported("kv rows", format!("slot {slot} is outside the pool of {pages} pages of {page_size}")));
    }
    let slots: Vec<i32> = slots.iter().map(|&slot| slot as i32).collect();
    let rows_buffer = device.upload(rows)?;
    let slots_buffer = device.upload(&slots)?;
    write_rows_on(device, pool, layer, &rows_buffer, &slots_buffer, slots.len())
}

/// Where each head finds its key and value in a cached row (the backend's [`PagedLayout`]).
pub type DecodeLayout = PagedLayout;

/// Whether the kernels can run `layout` over `row_width`-wide rows.
pub fn check_layout(layout: &DecodeLayout, row_width: usize) -> Result<(), CudaError> {
    let DecodeLayout { heads, kv_heads, qk_dim, v_dim, k_stride, v_base, v_stride, .. } = *layout;
    let problem = if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
        format!("{heads} query heads cannot be grouped over {kv_heads} key/value heads")
    } else if qk_dim == 0 || qk_dim > MAX_QK_DIM || v_dim == 0 || v_dim > MAX_V_DIM {
        format!("head widths qk {qk_dim} / v {v_dim}: the kernel supports 1..={MAX_QK_DIM} / 1..={MAX_V_DIM}")
    } else if (kv_heads - 1) * k_stride + qk_dim > row_width || v_base + (kv_heads - 1) * v_stride + v_dim > row_width {
        format!("keys or values of {kv_heads} heads reach past the {row_width}-wide cached row")
    } else {
        return Ok(());
    };
    Err(unsupported("paged attention", problem))
}

/// The row elements `paged_mla_decode_partial` stages for `layout` (the key's and the value's, rounded up to 16),
/// or `None` where that kernel does not serve it: more than one key head, an F32 cache, or wider rows.
fn mla_width(layout: &DecodeLayout, dtype: KvDtype) -> Option<usize> {
    let width = layout.qk_dim.max(layout.v_base + layout.v_dim).next_multiple_of(16);
    (layout.kv_heads == 1 && dtype != KvDtype::F32 && width <= MLA_MAX_WIDTH && layout.v_dim <= MAX_V_DIM)
        .then_some(width)
}

/// The dynamic shared memory of `paged_mla_decode_partial` at `width` (kernels/paged_mla_decode.cu `mla_shared`:
/// each array rounded up to 16 bytes).
fn mla_shared_bytes(width: usize) -> u32 {
    let pitch = width + MLA_ROW_PAD;
    let heads = MLA_HEADS_PER_BLOCK;
    let arrays = [
        heads * pitch * 2,                  // q_hi
        heads * pitch * 2,                  // q_lo
        MLA_KEYS * pitch * 2,               // keys
        heads * (MLA_KEYS + 1) * 4,         // scores
        heads * (MLA_KEYS + 8) * 2,         // p_hi
        heads * (MLA_KEYS + 8) * 2,         // p_lo
        heads * 4,                          // row_max
        heads * 4,                          // row_sum
        heads * 4,                          // correction
        256 * 2,                            // fp8_bf16
        MLA_KEYS * 4,                       // key_counts
        (DECODE_THREADS as usize / 32) * 4, // warp_bad
    ];
    arrays.iter().map(|bytes| bytes.next_multiple_of(16)).sum::<usize>() as u32
}

/// The tensor-core flops `paged_mla_decode_partial` spends on `keys` cached keys of one request (every 32-key tile
/// of every 64-head group: scores over the query's hi and lo terms, value sums over the weights' hi and lo terms),
/// or `None` where that kernel does not serve `layout` — what a benchmark divides by the time to see how close the
/// kernel runs to the MMA peak.
pub fn mla_tensor_flops(layout: &DecodeLayout, dtype: KvDtype, keys: usize) -> Option<f64> {
    mla_width(layout, dtype)?;
    let (row_tiles, key_tiles) = (MLA_HEADS_PER_BLOCK / 16, MLA_KEYS / 8);
    let scores = row_tiles * key_tiles * layout.qk_dim.div_ceil(16) * 2;
    let values = row_tiles * layout.v_dim.div_ceil(8) * (MLA_KEYS / 16) * 2;
    let tiles = keys.div_ceil(MLA_KEYS) * layout.heads.div_ceil(MLA_HEADS_PER_BLOCK);
    Some((tiles * (scores + values)) as f64 * (2.0 * 16.0 * 8.0 * 16.0))
}

/// One request of a decode batch: its id, how many cached positions its query attends to, and its block table.
#[derive(Debug, Clone, Copy)]
pub struct DecodeRequest<'a> {
    pub id: RequestId,
    pub context: usize,
    pub entries: &'a [Mapping],
}

/// How the context is split across blocks: split `s` owns logical pages `[s · pages_per_split, (s + 1) ·
/// pages_per_split)`; `splits · pages_per_split` must cover every request's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    pub pages_per_split: usize,
    pub splits: usize,
}

impl DecodePlan {
    /// `pages_per_split` pages per split, enough splits for `max_pages`.
    pub fn with_pages_per_split(max_pages: usize, pages_per_split: usize) -> Self {
        let pages_per_split = pages_per_split.max(1);
        Self { pages_per_split, splits: max_pages.div_ceil(pages_per_split).max(1) }
    }

    /// About [`KEYS_PER_SPLIT`] keys per split, at most [`MAX_SPLITS`] splits (32K context: 64 splits of 512).
    pub fn for_pages(max_pages: usize, page_size: usize) -> Self {
        let by_keys = KEYS_PER_SPLIT.div_ceil(page_size.max(1));
        let by_count = max_pages.div_ceil(MAX_SPLITS);
        Self::with_pages_per_split(max_pages, by_keys.max(by_count))
    }
}

/// A decode batch on the device: request descriptors, block tables and the split workspace.
pub struct DecodeBatch {
    pub requests: usize,
    pub plan: DecodePlan,
    /// Verify every mapping inside the attention launch (always, except to time the verification's share).
    pub verify: bool,
    pub descriptors: DeviceBuffer,
    pub mappings: DeviceBuffer,
    partial_max: DeviceBuffer,
    partial_sum: DeviceBuffer,
    partial_acc: DeviceBuffer,
    split_faults: DeviceBuffer,
}

impl DecodeBatch {
    /// Uploads `requests`' descriptors and tables for `layout` on a pool of `page_size`; `plan` defaults to
    /// [`DecodePlan::for_pages`] of the longest context.
    pub fn new(
        device: &dyn Device,
        layout: &DecodeLayout,
        page_size: usize,
        requests: &[DecodeRequest],
        plan: Option<DecodePlan>,
    ) -> Result<Self, CudaError> {
        let max_pages = requests.iter().map(|request| request.context.div_ceil(page_size.max(1))).max().unwrap_or(0);
        let plan = plan.unwrap_or_else(|| DecodePlan::for_pages(max_pages, page_size));
        if plan.pages_per_split == 0 || plan.splits * plan.pages_per_split < max_pages {
            return Err(unsupported(
                "paged attention",
                format!("{} splits of {} pages do not cover {max_pages} pages", plan.splits, plan.pages_per_split),
            ));
        }
        let total: usize = requests.iter().map(|request| request.entries.len()).sum();
        if requests.is_empty() || total.max(max_pages * page_size) > i32::MAX as usize || plan.splits > 65_535 {
            return Err(unsupported(
                "paged attention",
                format!("a batch of {} requests is out of range", requests.len()),
            ));
        }
        let (mut descriptors, mut mappings) = (Vec::new(), Vec::with_capacity(total * MAPPING_WORDS));
        for request in requests {
            let first = (mappings.len() / MAPPING_WORDS) as u32;
            descriptors.extend_from_slice(&[
                low(request.id),
                high(request.id),
                request.context as u32,
                first,
                request.entries.len() as u32,
                0,
                0,
                0,
            ]);
            for mapping in request.entries {
                mappings.extend_from_slice(&[mapping.page, low(mapping.generation), high(mapping.generation), 0]);
            }
        }
        if mappings.is_empty() {
            mappings.extend_from_slice(&[0; MAPPING_WORDS]); // no zero-byte buffer
        }
        let slots = requests.len() * plan.splits;
        Ok(Self {
            requests: requests.len(),
            plan,
            verify: true,
            descriptors: device.upload(&descriptors)?,
            mappings: device.upload(&mappings)?,
            partial_max: device.alloc_for::<f32>(slots * layout.heads)?,
            partial_sum: device.alloc_for::<f32>(slots * layout.heads)?,
            partial_acc: device.alloc_for::<f32>(slots * layout.heads * layout.v_dim)?,
            split_faults: device.alloc_for::<i32>(slots)?,
        })
    }
}

/// The keys each request of a batch may attend to: f32 `[requests, stride]`, key `t` of request `r` at
/// `r · stride + t` (nonzero = allowed).
#[derive(Clone, Copy)]
pub struct AllowedKeys<'a> {
    pub mask: &'a DeviceBuffer,
    pub stride: usize,
}

/// Launches `paged_mla_decode_partial` (one key head over a BF16 or FP8 cache: absorbed MLA, on tensor cores) or
/// `paged_decode_partial` (the rest), then `paged_decode_combine`: `q` f32 `[requests, heads, qk_dim]` → `out` f32
/// `[requests, heads, v_dim]` and `faults` i32 `[requests]` (0, or 1 + the first bad logical page; NaN output),
/// attending only the `allowed` keys when given, over layer `layer` of `pool`. `batch` must have been built for the
/// same `layout`.
pub fn decode_on(
    device: &dyn Device,
    (pool, layer): (&DevicePool, usize),
    layout: &DecodeLayout,
    batch: &DecodeBatch,
    q: &DeviceBuffer,
    (out, faults): (&DeviceBuffer, &DeviceBuffer),
    allowed: Option<AllowedKeys<'_>>,
) -> Result<(), CudaError> {
    pool.check_layer(layer)?;
    let PoolShape { layers, row_width, page_size, pages, .. } = pool.shape;
    check_layout(layout, row_width)?;
    let DecodeLayout { heads, kv_heads, qk_dim, v_dim, k_stride, v_base, v_stride, scale } = *layout;
    let requests = batch.requests;
    let sizes = [
        ("q", q.bytes(), requests * heads * qk_dim * 4),
        ("out", out.bytes(), requests * heads * v_dim * 4),
        ("faults", faults.bytes(), requests * 4),
        ("workspace", batch.partial_acc.bytes(), requests * batch.plan.splits * heads * v_dim * 4),
        (
            "allowed keys",
            allowed.map_or(0, |keys| keys.mask.bytes()),
            allowed.map_or(0, |keys| requests * keys.stride * 4),
        ),
    ];
    buffers_hold("paged attention", &sizes)?;
    let shared = [
        Arg::Buffer(q),
        Arg::Buffer(&pool.pages),
        pool.scales_at(layer),
        Arg::Buffer(&pool.tags),
        Arg::Buffer(&batch.descriptors),
        Arg::Buffer(&batch.mappings),
        Arg::Buffer(&batch.partial_max),
        Arg::Buffer(&batch.partial_sum),
        Arg::Buffer(&batch.partial_acc),
        Arg::Buffer(&batch.split_faults),
        Arg::Buffer(allowed.map_or(q, |keys| keys.mask)),
        Arg::I32(allowed.map_or(0, |keys| keys.stride) as i32),
        Arg::I32(pages as i32),
        Arg::I32(layers as i32),
        Arg::I32(layer as i32),
        Arg::I32(page_size as i32),
        Arg::I32(row_width as i32),
        Arg::I32(dtype_code(pool.dtype)),
        Arg::I32(heads as i32),
    ];
    let tail = [Arg::F32(scale), Arg::I32(batch.plan.pages_per_split as i32), Arg::I32(batch.verify as i32)];
    if let Some(width) = mla_width(layout, pool.dtype) {
        let shape = LaunchShape {
            grid: [heads.div_ceil(MLA_HEADS_PER_BLOCK) as u32, batch.plan.splits as u32, requests as u32],
            block: [DECODE_THREADS, 1, 1],
            shared_bytes: mla_shared_bytes(width),
        };
        let widths = [Arg::I32(qk_dim as i32), Arg::I32(v_dim as i32), Arg::I32(v_base as i32)];
        device.launch("paged_mla_decode_partial", shape, &[&shared[..], &widths, &tail].concat())?;
    } else {
        let head_blocks = kv_heads * (heads / kv_heads).div_ceil(HEADS_PER_BLOCK);
        let shape = LaunchShape {
            grid: [batch.plan.splits as u32, head_blocks as u32, requests as u32],
            block: [DECODE_THREADS, 1, 1],
            shared_bytes: 0,
        };
        let widths = [kv_heads, qk_dim, v_dim, k_stride, v_base, v_stride].map(|n| Arg::I32(n as i32));
        device.launch("paged_decode_partial", shape, &[&shared[..], &widths, &tail].concat())?;
    }
    let combine =
        LaunchShape { grid: [heads as u32, requests as u32, 1], block: [COMBINE_THREADS, 1, 1], shared_bytes: 0 };
    device.launch(
        "paged_decode_combine",
        combine,
        &[
            Arg::Buffer(&batch.partial_max),
            Arg::Buffer(&batch.partial_sum),
            Arg::Buffer(&batch.partial_acc),
            Arg::Buffer(&batch.split_faults),
            Arg::Buffer(faults),
            Arg::Buffer(out),
            Arg::I32(heads as i32),
            Arg::I32(v_dim as i32),
            Arg::I32(batch.plan.splits as i32),
        ],
    )
}

/// Decode attention's results: `out` `[requests, heads, v_dim]` (NaN rows for faulted requests) and per request
/// 0 or 1 + its first bad logical page.
#[derive(Debug, Clone)]
pub struct DecodeOutput {
    pub out: Vec<f32>,
    pub faults: Vec<u32>,
}

/// Host-level decode: uploads `q` (`[requests, heads, qk_dim]`), the tables and the `allowed` keys (`(mask, stride)`
/// as [`AllowedKeys`]), verifies and attends, downloads.
pub fn decode(
    device: &dyn Device,
    (pool, layer): (&DevicePool, usize),
    layout: &DecodeLayout,
    q: &[f32],
    requests: &[DecodeRequest],
    plan: Option<DecodePlan>,
    allowed: Option<(&[f32], usize)>,
) -> Result<DecodeOutput, CudaError> {
    check_layout(layout, pool.shape.row_width)?;
    if q.len() != requests.len() * layout.heads * layout.qk_dim {
        return Err(unsupported(
            "paged attention",
            format!(
                "q has {} values for {} requests × {} heads × {}",
                q.len(),
                requests.len(),
                layout.heads,
                layout.qk_dim
            ),
        ));
    }
    let batch = DecodeBatch::new(device, layout, pool.shape.page_size, requests, plan)?;
    let q_buffer = device.upload(q)?;
    let mask = allowed.map(|(mask, _)| device.upload(mask)).transpose()?;
    let allowed = mask.as_ref().zip(allowed).map(|(mask, (_, stride))| AllowedKeys { mask, stride });
    let count = requests.len() * layout.heads * layout.v_dim;
    let out = device.alloc_for::<f32>(count)?;
    let faults = device.alloc_for::<u32>(requests.len())?;
    decode_on(device, (pool, layer), layout, &batch, &q_buffer, (&out, &faults), allowed)?;
    Ok(DecodeOutput { out: device.download(&out, count)?, faults: device.download(&faults, requests.len())? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mla_kernel_serves_one_key_head_over_bf16_or_fp8_and_counts_its_mmas() {
        let glm5 = DecodeLayout::mla_absorbed(64, 512, 64, 0.04);
        // Per 32-key tile of a 64-head group: scores 4 × 4 tiles × 36 k-steps × 2, values 4 × 64 tiles × 2 × 2.
        let per_tile = (4 * 4 * 36 * 2 + 4 * 64 * 2 * 2) as f64 * 4096.0;
        assert_eq!(mla_tensor_flops(&glm5, KvDtype::Fp8, 32), Some(per_tile));
        assert_eq!(mla_tensor_flops(&glm5, KvDtype::Bf16, 33), Some(2.0 * per_tile));
        let deepseek = DecodeLayout::mla_absorbed(128, 512, 64, 0.04);
        assert_eq!(mla_tensor_flops(&deepseek, KvDtype::Fp8, 32), Some(2.0 * per_tile));
        assert_eq!(mla_tensor_flops(&glm5, KvDtype::F32, 32), None);
        assert_eq!(mla_tensor_flops(&DecodeLayout::gqa(96, 8, 128, 0.08), KvDtype::Fp8, 32), None);
        assert_eq!(mla_shared_bytes(576), 207_008);
    }
}

//! The paged KV cache's device op cases: the KV row write byte for byte against `KvPool::write`, paged decode
//! attention against an f64 softmax over the rows `KvPool::read` decodes, and GLM-5's DSA key selection inside a
//! decode step against the CPU backend; with the pools, tables and layouts the
//! fault-flag tests (tests/integration/device_ops.rs) reuse.

use crate::quant::fp8;
use crate::rng::Rng;
use crate::runtime::cuda::paged::{self, DecodeLayout, DecodePlan, DecodeRequest, DevicePool};
use crate::runtime::cuda::CudaBackend;
use crate::runtime::device::CudaError;
use crate::runtime::kv_cache::{
    KeyChoice, KvAt, KvDtype, KvPool, KvRows, Mapping, PagedLayout, PagedStep, PoolError, PoolShape,
};
use crate::runtime::{Backend, Cpu, RuntimeError};

use super::backend_ops::row;
use super::SelftestRow;

/// Paged decode against an f64 reference over the same decoded rows: f32 rounding of 576-term dot products and of
/// the softmax, measured ~1e-7 (kernels/paged_attention.cu); with the MLA kernel's hi/lo BF16 operands on tensor
/// cores ~1e-6 (kernels/paged_mla_decode.cu; BF16 operands alone would be ~7e-4 and fail).
const DECODE_REL_L2: f64 = 2e-5;
/// The KV write encodes as `KvPool::write` does (the same division by the scale, the same BF16/FP8 rounding):
/// bit-identical, byte for byte.
const EXACT: f64 = 0.0;

/// A pool error (the case's own fixture) as a device-case error naming it.
fn pool_error(what: &str) -> impl Fn(PoolError) -> CudaError + '_ {
    move |error| CudaError::Unsupported { tensor: what.into(), problem: error.to_string() }
}

/// Values that probe the FP8 encoder once divided by a power-of-two scale: every midpoint between adjacent e4m3
/// codes and its neighbours one ulp away, saturation, infinities, NaNs of both signs, zeros, subnormal ties.
fn fp8_probe_values() -> Vec<f32> {
    let mut values = Vec::new();
    for code in 0u8..0x7E {
        let (a, b) = (fp8::decode(code), fp8::decode(code + 1));
        let middle = (a + b) / 2.0;
        for v in [a, middle, f32::from_bits(middle.to_bits() + 1), f32::from_bits(middle.to_bits().max(1) - 1)] {
            values.extend([v, -v]);
        }
    }
    let tiny = 2f32.powi(-10);
    values.extend([
        448.0,
        449.0,
        464.0,
        480.0,
        1e9,
        -1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        0.0,
        -0.0,
        tiny,
        3.0 * tiny,
        5.0 * tiny,
        1e-30,
        -1e-30,
    ]);
    values
}

/// The KV row write for BF16, FP8 and F32 caches: a GQA-like row of 2 K and 2 V heads of 9 (awkward), one scale per
/// head (power-of-two scales keep the probe values' ties exact after the division, 0.37 exercises the division's
/// rounding), three requests of 21/30/5 tokens with interleaved reservations (block tables that are not contiguous
/// runs of pages), layers 0 and 2 of 3; half the elements are FP8 probes. Byte for byte against `KvPool::write`.
pub fn kv_write(backend: &CudaBackend, rng: &mut Rng) -> Result<Vec<SelftestRow>, CudaError> {
    let device = backend.device();
    let (head_dim, kv_heads) = (9usize, 2usize);
    let row_width = 2 * kv_heads * head_dim;
    let head_scales = [0.5f32, 2.0, 0.37, 0.125];
    let layer_scales: Vec<f32> = (0..row_width).map(|e| head_scales[e / head_dim]).collect();
    let shape = PoolShape { layers: 3, row_width, aux_width: 0, page_size: 16, pages: 11 };
    let probes = fp8_probe_values();
    let contexts = [21usize, 30, 5];
    let mut rows = Vec::new();
    for dtype in [KvDtype::Bf16, KvDtype::Fp8, KvDtype::F32] {
        let scales = vec![layer_scales.clone(); shape.layers];
        let mut pool = KvPool::new(shape, dtype, scales.clone());
        for request in 0..contexts.len() {
            pool.open(request as u64);
        }
        for step in 1..=30usize {
            for (request, &context) in contexts.iter().enumerate() {
                pool.reserve(request as u64, step.min(context)).map_err(pool_error("kv write pool"))?;
            }
        }
        let mut next_probe = 0;
        let mut writes: Vec<(usize, Vec<f32>, Vec<u32>)> = Vec::new(); // (layer, rows, slots)
        for layer in [0usize, 2] {
            let (mut layer_rows, mut slots) = (Vec::new(), Vec::new());
            for (request, &context) in contexts.iter().enumerate() {
                let entries = pool.table(request as u64).map(|table| table.entries.clone()).unwrap_or_default();
                for position in 0..context {
                    let mut values = rng.values(row_width, 3.0);
                    for value in values.iter_mut().step_by(2) {
                        // half the elements are probes, placed in every head (so under every scale)
                        *value = probes[next_probe % probes.len()] * layer_scales[0];
                        next_probe += 1;
                    }
                    pool.write(request as u64, layer, position, &values, &[]).map_err(pool_error("kv write pool"))?;
                    let mapping = entries[position / shape.page_size];
                    slots.push(mapping.page * shape.page_size as u32 + (position % shape.page_size) as u32);
                    layer_rows.extend(values);
                }
            }
            writes.push((layer, layer_rows, slots));
        }
        let device_pool = DevicePool::new(device, shape, dtype, &scales)?;
        for (layer, layer_rows, slots) in &writes {
            paged::write_rows(device, &device_pool, *layer, layer_rows, slots)?;
        }
        let got = device_pool.download_pages(device)?;
        let want = pool.page_data().unwrap_or_default();
        let differing = got.iter().zip(want).filter(|(a, b)| a != b).count() + got.len().abs_diff(want.len());
        let first = got.iter().zip(want).position(|(a, b)| a != b);
        let label = format!("{dtype:?}, row {row_width} (2×2 heads of 9), 3 requests, layers 0 and 2 of 3");
        let note = match first {
            Some(first) => format!("byte for byte vs KvPool::write: {differing} differ, the first at {first}"),
            None => "byte for byte vs KvPool::write".to_string(),
        };
        rows.push(row("kv_write", label, &[], &[], differing, EXACT).with_note(note));
    }
    Ok(rows)
}

/// Tokens of the decode requests: one token, a page less one, two pages and one, 100 (7 pages of 16).
pub const CONTEXTS: [usize; 4] = [1, 15, 33, 100];

/// The decode layouts with their row widths: GQA (6 query heads over 2 KV heads of 24: kernels/paged_attention.cu),
/// and absorbed MLA (kernels/paged_mla_decode.cu) at 4 heads over one 576-wide latent row, at 20 heads over a
/// 40-wide row (a partial head tile, rows no 16-byte loads fit) and at 80 heads (two head groups, the second partial).
pub fn layouts() -> [(&'static str, usize, DecodeLayout); 4] {
    [
        ("gqa", 2 * 2 * 24, DecodeLayout::gqa(6, 2, 24, 1.0 / 24f32.sqrt())),
        ("mla", 576, DecodeLayout::mla_absorbed(4, 512, 64, 1.0 / 192f32.sqrt())),
        ("mla 20 heads, 40-wide rows", 40, DecodeLayout::mla_absorbed(20, 32, 8, 1.0 / 40f32.sqrt())),
        ("mla 80 heads", 576, DecodeLayout::mla_absorbed(80, 512, 64, 1.0 / 192f32.sqrt())),
    ]
}

/// A pool of 16 pages of 16 with `contexts[r]` tokens of random rows (from `seed`) written for request r in both
/// layers; reservations interleaved 7 tokens at a time, so the block tables are not contiguous runs.
pub fn filled_pool(dtype: KvDtype, row_width: usize, contexts: &[usize], seed: u64) -> Result<KvPool, PoolError> {
    let shape = PoolShape { layers: 2, row_width, aux_width: 0, page_size: 16, pages: 16 };
    let scales: Vec<Vec<f32>> = (0..shape.layers)
        .map(|layer| (0..row_width).map(|e| 0.01 + 0.002 * ((e / 8 + layer) % 5) as f32).collect())
        .collect();
    let mut pool = KvPool::new(shape, dtype, scales);
    for request in 0..contexts.len() {
        pool.open(request as u64);
    }
    let longest = contexts.iter().copied().max().unwrap_or(0);
    for step in (1..=longest).step_by(7) {
        for (request, &context) in contexts.iter().enumerate() {
            pool.reserve(request as u64, step.min(context))?;
        }
    }
    for (request, &context) in contexts.iter().enumerate() {
        pool.reserve(request as u64, context)?;
    }
    let mut rng = Rng::new(seed);
    for layer in 0..shape.layers {
        for (request, &context) in contexts.iter().enumerate() {
            for position in 0..context {
                pool.write(request as u64, layer, position, &rng.values(row_width, 2.0), &[])?;
            }
        }
    }
    Ok(pool)
}

/// Each request's `(id, context, block table)`; requests are numbered from 0 as [`filled_pool`] opens them.
pub fn requests_of(pool: &KvPool, contexts: &[usize]) -> Vec<(u64, usize, Vec<Mapping>)> {
    contexts
        .iter()
        .enumerate()
        .map(|(request, &context)| {
            let entries = pool.table(request as u64).map(|table| table.entries.clone()).unwrap_or_default();
            (request as u64, context, entries)
        })
        .collect()
}

/// The decode descriptors of [`requests_of`]'s tables.
pub fn as_requests(tables: &[(u64, usize, Vec<Mapping>)]) -> Vec<DecodeRequest<'_>> {
    tables.iter().map(|(id, context, entries)| DecodeRequest { id: *id, context: *context, entries }).collect()
}

/// f64 softmax attention of each request's query heads over the rows `KvPool::read` decodes; with `allowed`
/// (`(mask, stride)`), over the keys whose mask entry is nonzero.
fn reference_decode(
    pool: &KvPool,
    layer: usize,
    layout: &DecodeLayout,
    q: &[f32],
    contexts: &[usize],
    allowed: Option<(&[f32], usize)>,
) -> Result<Vec<f32>, PoolError> {
    let DecodeLayout { heads, kv_heads, qk_dim, v_dim, k_stride, v_base, v_stride, scale } = *layout;
    let row_width = pool.shape().row_width;
    let mut out = Vec::new();
    for (request, &context) in contexts.iter().enumerate() {
        let (mut rows, mut aux) = (Vec::new(), Vec::new());
        pool.read(request as u64, layer, context, &mut rows, &mut aux)?;
        let keys: Vec<usize> =
            (0..context).filter(|&t| allowed.is_none_or(|(mask, stride)| mask[request * stride + t] != 0.0)).collect();
        for head in 0..heads {
            let kv_head = head / (heads / kv_heads);
            let q_row = &q[(request * heads + head) * qk_dim..][..qk_dim];
            let scores: Vec<f64> = keys
                .iter()
                .map(|&t| {
                    let key = &rows[t * row_width + kv_head * k_stride..][..qk_dim];
                    q_row.iter().zip(key).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale as f64
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for e in 0..v_dim {
                let value: f64 = keys
                    .iter()
                    .zip(&weights)
                    .map(|(&t, weight)| weight * rows[t * row_width + v_base + kv_head * v_stride + e] as f64)
                    .sum();
                out.push(if total > 0.0 { (value / total) as f32 } else { 0.0 });
            }
        }
    }
    Ok(out)
}

/// Paged decode attention with fused page-tag verification over BF16 and FP8 caches in every [`layouts`] layout, the
/// [`CONTEXTS`] requests on layer 1: one split per request (the default plan here), 2-page splits (4 splits merged
/// for 100 tokens), and one split attending only the keys a random mask keeps (as GLM-5's DSA selection does; request
/// 0 keeps none of its one key): no request flagged on the clean pool, outputs within [`DECODE_REL_L2`] of the f64
/// reference.
pub fn paged_decode(backend: &CudaBackend, rng: &mut Rng) -> Result<Vec<SelftestRow>, CudaError> {
    let device = backend.device();
    let mut rows = Vec::new();
    let stride = CONTEXTS.iter().copied().max().unwrap_or(0);
    let mut mask: Vec<f32> =
        (0..CONTEXTS.len() * stride).map(|_| !rng.next_u64().is_multiple_of(3) as u32 as f32).collect();
    mask[0] = 0.0;
    for (name, row_width, layout) in layouts() {
        for dtype in [KvDtype::Bf16, KvDtype::Fp8] {
            let pool = filled_pool(dtype, row_width, &CONTEXTS, rng.next_u64()).map_err(pool_error("decode pool"))?;
            let q = rng.values(CONTEXTS.len() * layout.heads * layout.qk_dim, 1.0);
            let tables = requests_of(&pool, &CONTEXTS);
            let requests = as_requests(&tables);
            let device_pool = DevicePool::mirror(device, &pool)?;
            let runs = [
                (None, None, "one split"),
                (Some(DecodePlan::with_pages_per_split(7, 2)), None, "2 pages a split"),
                (None, Some((&mask[..], stride)), "one split, masked keys"),
            ];
            for (plan, allowed, splits) in runs {
                let want =
                    reference_decode(&pool, 1, &layout, &q, &CONTEXTS, allowed).map_err(pool_error("decode pool"))?;
                let got = paged::decode(device, (&device_pool, 1), &layout, &q, &requests, plan, allowed)?;
                let flagged = got.faults.iter().filter(|&&fault| fault != 0).count();
                let label = format!("{name} {dtype:?}, contexts {CONTEXTS:?}, {splits}");
                let mut checked = row("paged_decode", label, &got.out, &want, flagged, DECODE_REL_L2);
                checked.note = format!("{} (vs f64 over KvPool::read); {flagged} requests flagged", checked.note);
                rows.push(checked);
            }
        }
    }
    Ok(rows)
}

/// One decode step of a GLM-5-like DSA layer on `backend`: three requests whose earlier keys are cached attend with
/// this layer's indexer selection over them (kernels/indexer.cu `paged_index_*` on a device). Returns the kept-key
/// mask `[3, 17]` and the attention outputs.
fn dsa_decode_step(backend: &dyn Backend, seed: u64) -> Result<(Vec<f32>, Vec<f32>), RuntimeError> {
    let (heads, dim, top_k) = (3, 20, 5); // a key width that is no multiple of the dot product's 8 lanes
    let layout = PagedLayout::gqa(2, 1, 16, 0.25);
    let shape = PoolShape { layers: 2, row_width: 32, aux_width: dim, page_size: 4, pages: 16 };
    let contexts = [3usize, 9, 17]; // the first under top_k: every key kept
    let mut pool = KvPool::new(shape, KvDtype::F32, vec![vec![1.0; shape.row_width]; shape.layers]);
    for (request, &context) in contexts.iter().enumerate() {
        pool.open(request as u64);
        pool.reserve(request as u64, context)?;
    }
    let mut rng = Rng::new(seed);
    let mut tensor = |rows: usize, columns: usize| backend.upload(&rng.values(rows * columns, 1.0), columns);
    for (request, &context) in contexts.iter().enumerate() {
        let at: Vec<KvAt> = (0..context - 1).map(|position| KvAt { request: request as u64, position }).collect();
        let (rows, aux) = (tensor(at.len(), shape.row_width)?, tensor(at.len(), dim)?);
        backend.kv_write(&mut pool, 1, &KvRows { rows: &rows, aux: &aux, at: &at })?;
    }
    let requests: Vec<KvAt> = contexts
        .iter()
        .enumerate()
        .map(|(request, &context)| KvAt { request: request as u64, position: context - 1 })
        .collect();
    let (q, rows, aux) = (tensor(3, layout.heads * layout.qk_dim)?, tensor(3, shape.row_width)?, tensor(3, dim)?);
    let (index_q, head_weights) = (tensor(3, heads * dim)?, tensor(3, heads)?);
    let keys = Some(KeyChoice::Select { q: &index_q, head_weights: &head_weights, heads, dim, top_k });
    let step = PagedStep { layer: 1, layout, verify: true, q: &q, rows: &rows, aux: &aux, requests: &requests, keys };
    let decoded = backend.paged_decode(&mut pool, &step)?;
    if let Some(fault) = decoded.faults.iter().flatten().next() {
        return Err(RuntimeError::Input(format!("a clean pool faulted: {fault}")));
    }
    let mask = match &decoded.keys {
        Some(keys) => backend.download(keys)?,
        None => return Err(RuntimeError::Input("a selecting layer returned no keys".into())),
    };
    Ok((mask, backend.download(&decoded.out)?))
}

/// GLM-5's DSA selection inside a paged decode step against the CPU backend: the kept keys bit for bit (kept counts
/// 3, 5, 5 with top-k 5: one request under top-k), the attention over them within [`DECODE_REL_L2`].
pub fn paged_select(backend: &CudaBackend, rng: &mut Rng) -> Result<Vec<SelftestRow>, CudaError> {
    let seed = rng.next_u64();
    let failed =
        |error: RuntimeError| CudaError::Unsupported { tensor: "paged_select".into(), problem: error.to_string() };
    let (want_mask, want) = dsa_decode_step(&Cpu::default(), seed).map_err(failed)?;
    let (mask, got) = dsa_decode_step(backend, seed).map_err(failed)?;
    let differing = mask.iter().zip(&want_mask).filter(|(a, b)| a != b).count() + mask.len().abs_diff(want_mask.len());
    let kept: Vec<usize> = mask.chunks(17).map(|row| row.iter().filter(|&&v| v != 0.0).count()).collect();
    let label = "3 index heads of 20, top-k 5, contexts [3, 9, 17], pages of 4".to_string();
    let mut checked = row("paged_select", label, &got, &want, differing, DECODE_REL_L2);
    checked.passed &= kept == [3, 5, 5];
    checked.note = format!("{}; kept keys {kept:?}, {differing} mask entries differ from the cpu", checked.note);
    Ok(vec![checked])
}

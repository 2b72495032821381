//! The runtime backend's ops in `squeeze selftest`: every CUDA backend op against the CPU backend on random awkward shapes
//! (the same comparisons the integration tests make on the emulated device), then, on a real GPU, the issue's
//! benchmarks: INT4 W4A16 matrix-vector at batch 1–16 on GLM-5 expert shapes against the device copy bandwidth and
//! against BF16 weights, FP8 paged decode attention at 32 K tokens with the share of its fused page verification,
//! and the host-to-device bandwidth of resident (weight) uploads.

use std::time::Instant;

use half::bf16;

use crate::rng::Rng;
use crate::runtime::backend::{
    AttentionShape, Backend, IndexerShape, Int4Weight, Matrix, PagedLayout, RopeStyle, RoutingShape,
};
use crate::runtime::cpu::Cpu;
use crate::runtime::cuda::linear::{linear_bf16, w4a16_linear};
use crate::runtime::cuda::paged::{decode_on, DecodeBatch, DecodeRequest, DevicePool};
use crate::runtime::cuda::CudaBackend;
use crate::runtime::device::{CudaError, Device, DeviceBuffer};
use crate::runtime::kv_cache::{KvDtype, KvPool, Mapping, PoolError, PoolShape};

use super::SelftestRow;

/// Products and attention sum in another order than the CPU (shuffle trees, split rows): rel L2 ~1e-7 measured;
/// 1e-5 still catches a wrong index, scale or mask.
const ORDER_REL_L2: f64 = 1e-5;

fn random(rng: &mut Rng, count: usize, scale: f32) -> Vec<f32> {
    (0..count).map(|_| (rng.uniform() * 2.0 - 1.0) * scale).collect()
}

/// Relative L2 error of `got` against `want` (infinite when `got` has a non-finite value).
fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() || got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        diff += (g as f64 - w as f64).powi(2);
        norm += (w as f64).powi(2);
    }
    (diff / norm.max(1e-30)).sqrt()
}

fn row(op: &str, shape: String, error: f64, mismatches: usize, tolerance: f64) -> SelftestRow {
    SelftestRow {
        op: op.into(),
        shape,
        max_rel_error: error,
        mismatches,
        passed: error <= tolerance && mismatches == 0,
        seconds: None,
        gb_per_s: None,
        copy_share: None,
        note: format!("rel L2 vs cpu ≤ {tolerance:.0e}"),
    }
}

/// A random INT4 matrix `[rows, columns]` quantized with squeeze's own quantizer; `data` is its dequantized form.
fn int4_matrix(rng: &mut Rng, rows: usize, columns: usize, group_size: usize) -> Matrix {
    let (int4, data) = Int4Weight::quantize(&random(rng, rows * columns, 0.05), columns, group_size);
    Matrix::new(rows, columns, data).with_int4(int4)
}

/// Every backend op against the CPU on fresh random inputs from `seed`.
pub fn check_ops(backend: &CudaBackend, seed: u64) -> Vec<SelftestRow> {
    let mut rng = Rng::new(seed ^ 0x5EED_F0B5);
    let mut rows = Vec::new();

    for (tokens, out, inner) in [(1, 75, 200), (7, 41, 75), (37, 96, 130)] {
        let x = random(&mut rng, tokens * inner, 1.0);
        let weight = Matrix::new(out, inner, random(&mut rng, out * inner, 0.1));
        let bias = random(&mut rng, out, 0.1);
        let error =
            rel_l2(&backend.linear(&x, tokens, &weight, Some(&bias)), &Cpu.linear(&x, tokens, &weight, Some(&bias)));
        rows.push(row("linear f32", format!("[{tokens}, {inner}]·[{out}, {inner}]ᵀ"), error, 0, ORDER_REL_L2));
    }
    for (tokens, out, inner, group) in [(1, 70, 256, 32), (16, 45, 384, 128), (5, 33, 200, 40)] {
        let x = random(&mut rng, tokens * inner, 1.0);
        let weight = int4_matrix(&mut rng, out, inner, group);
        let error = rel_l2(&backend.linear(&x, tokens, &weight, None), &Cpu.linear(&x, tokens, &weight, None));
        rows.push(row(
            "linear w4a16",
            format!("[{tokens}, {inner}]·[{out}, {inner}]ᵀ g{group}"),
            error,
            0,
            ORDER_REL_L2,
        ));
    }
    for width in [77, 301] {
        let data = random(&mut rng, 3 * width, 2.0);
        let (weight, bias) = (random(&mut rng, width, 1.0), random(&mut rng, width, 1.0));
        let (mut got, mut want) = (data.clone(), data.clone());
        backend.rms_norm(&mut got, width, &weight, 1e-6);
        Cpu.rms_norm(&mut want, width, &weight, 1e-6);
        rows.push(row("rms_norm", format!("[3, {width}]"), rel_l2(&got, &want), 0, ORDER_REL_L2));
        let (mut got, mut want) = (data.clone(), data);
        backend.layer_norm(&mut got, width, &weight, &bias, 1e-6);
        Cpu.layer_norm(&mut want, width, &weight, &bias, 1e-6);
        rows.push(row("layer_norm", format!("[3, {width}]"), rel_l2(&got, &want), 0, ORDER_REL_L2));
    }
    for style in [RopeStyle::Interleaved, RopeStyle::Half] {
        let (tokens, heads, head_dim, offset, rotary) = (9, 3, 40, 8, 24);
        let data = random(&mut rng, tokens * heads * head_dim, 1.0);
        let half = rotary / 2;
        let angles: Vec<f32> = (0..tokens * half).map(|i| (i / half) as f32 * 0.3 / (1 + i % half) as f32).collect();
        let (cos, sin): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| (a.cos(), a.sin())).unzip();
        let (mut got, mut want) = (data.clone(), data);
        backend.rope(&mut got, tokens, heads * head_dim, head_dim, offset, rotary, &cos, &sin, style);
        Cpu.rope(&mut want, tokens, heads * head_dim, head_dim, offset, rotary, &cos, &sin, style);
        let mismatches = got.iter().zip(&want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
        rows.push(row(
            &format!("rope {style:?}"),
            format!("[{tokens}, {heads}, {head_dim}]"),
            rel_l2(&got, &want),
            mismatches,
            0.0,
        ));
    }
    let (gate, up) = (random(&mut rng, 3001, 6.0), random(&mut rng, 3001, 2.0));
    rows.push(row(
        "silu_mul",
        "[3001]".into(),
        rel_l2(&backend.silu_mul(&gate, &up), &Cpu.silu_mul(&gate, &up)),
        0,
        1e-6,
    ));

    let shape = AttentionShape { tokens: 19, heads: 4, kv_heads: 2, qk_dim: 40, v_dim: 24, scale: 0.15 };
    let q = random(&mut rng, shape.tokens * shape.heads * shape.qk_dim, 1.0);
    let k = random(&mut rng, shape.tokens * shape.kv_heads * shape.qk_dim, 1.0);
    let v = random(&mut rng, shape.tokens * shape.kv_heads * shape.v_dim, 1.0);
    let allowed: Vec<bool> =
        (0..shape.tokens * shape.tokens).map(|i| i % (shape.tokens + 1) == 0 || rng.below(3) > 0).collect();
    let error = rel_l2(
        &backend.attention(&q, &k, &v, &shape, Some(&allowed)),
        &Cpu.attention(&q, &k, &v, &shape, Some(&allowed)),
    );
    rows.push(row("attention causal+mask", "19 tokens, 4/2 heads, qk 40, v 24".into(), error, 0, ORDER_REL_L2));

    let routing = RoutingShape {
        experts: 24,
        top_k: 6,
        groups: 4,
        topk_group: 3,
        norm_topk_prob: true,
        routed_scaling_factor: 2.5,
    };
    let tokens = 37;
    let logits = random(&mut rng, tokens * routing.experts, 3.0);
    let bias = random(&mut rng, routing.experts, 0.1);
    let (got, want) = (backend.route(&logits, tokens, &bias, &routing), Cpu.route(&logits, tokens, &bias, &routing));
    let mismatches = got.experts.iter().zip(&want.experts).filter(|(g, w)| g != w).count();
    rows.push(row(
        "route grouped top-k",
        "37 tokens, 24 experts, 4 groups keep 3, top 6".into(),
        rel_l2(&got.weights, &want.weights),
        mismatches,
        1e-6,
    ));

    let shape = IndexerShape { tokens: 33, heads: 3, head_dim: 32, top_k: 8 };
    let q = random(&mut rng, shape.tokens * shape.heads * shape.head_dim, 1.0);
    let k = random(&mut rng, shape.tokens * shape.head_dim, 1.0);
    let weights = random(&mut rng, shape.tokens * shape.heads, 1.0);
    let (got, want) = (backend.indexer_top_k(&q, &k, &weights, &shape), Cpu.indexer_top_k(&q, &k, &weights, &shape));
    let mismatches = got.mask.iter().zip(&want.mask).filter(|(g, w)| g != w).count();
    rows.push(row("indexer top-k", "33 tokens, 3×32, top 8".into(), 0.0, mismatches, 0.0));

    if let Some(failure) = backend.failure() {
        rows.push(SelftestRow {
            op: "device".into(),
            shape: String::new(),
            max_rel_error: f64::INFINITY,
            mismatches: 1,
            passed: false,
            seconds: None,
            gb_per_s: None,
            copy_share: None,
            note: failure,
        });
    }
    rows
}

/// Seconds per call of `launch` (best of 3 rounds of `repeats` calls), with the device drained around each round.
fn time_launches(
    device: &dyn Device,
    fence: &DeviceBuffer,
    repeats: usize,
    mut launch: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    let mut best = f64::INFINITY;
    launch()?; // warm-up (module load, caches)
    for _ in 0..3 {
        device.download::<u8>(fence, 1)?;
        let started = Instant::now();
        for _ in 0..repeats {
            launch()?;
        }
        device.download::<u8>(fence, 1)?;
        best = best.min(started.elapsed().as_secs_f64() / repeats as f64);
    }
    Ok(best)
}

fn bench_row(op: String, shape: String, seconds: f64, bytes: usize, copy_gb_per_s: f64, note: String) -> SelftestRow {
    let gb_per_s = bytes as f64 / seconds / 1e9;
    SelftestRow {
        op,
        shape,
        max_rel_error: 0.0,
        mismatches: 0,
        passed: true,
        seconds: Some(seconds),
        gb_per_s: Some(gb_per_s),
        copy_share: Some(gb_per_s / copy_gb_per_s),
        note,
    }
}

/// GLM-5 routed-expert shapes: gate/up `[2048, 6144]`, down `[6144, 2048]` (group 32).
const EXPERT_SHAPES: [(&str, usize, usize); 2] = [("gate/up", 2048, 6144), ("down", 6144, 2048)];
const GROUP: usize = 32;

/// The W4A16 and H2D benchmarks on device-resident data; `copy_gb_per_s` is the device copy bandwidth
/// (read + write bytes per second).
pub fn bench(backend: &CudaBackend, copy_gb_per_s: f64) -> Result<Vec<SelftestRow>, CudaError> {
    let device = backend.device();
    let mut rng = Rng::new(0xBE7C);
    let mut rows = Vec::new();
    let fence = device.alloc(64)?;
    for (name, out, inner) in EXPERT_SHAPES {
        // Timing does not depend on the values: random words and small positive BF16 scales.
        let words: Vec<u32> = (0..out * inner / 8).map(|_| rng.next_u64() as u32).collect();
        let scales: Vec<u16> =
            (0..out * inner / GROUP).map(|_| bf16::from_f32(1e-3 + rng.uniform() * 1e-3).to_bits()).collect();
        let bf16_weight: Vec<u16> = (0..out * inner).map(|_| bf16::from_f32(rng.uniform() - 0.5).to_bits()).collect();
        let (packed, scales_buffer, bf16_buffer) =
            (device.upload(&words)?, device.upload(&scales)?, device.upload(&bf16_weight)?);
        let int4_bytes = words.len() * 4 + scales.len() * 2;
        let mut bf16_batch1 = 0.0;
        for batch in [1usize, 2, 4, 8, 16] {
            let x = device.upload(&random(&mut rng, batch * inner, 1.0))?;
            let y = device.alloc_for::<f32>(batch * out)?;
            if batch == 1 {
                bf16_batch1 = time_launches(device, &fence, 50, || {
                    linear_bf16(device, &x, &bf16_buffer, None, &y, 1, inner, out)
                })?;
                rows.push(bench_row(
                    "linear bf16".into(),
                    format!("{name} [{out}, {inner}] batch 1"),
                    bf16_batch1,
                    out * inner * 2,
                    copy_gb_per_s,
                    "the baseline W4A16 must beat 3x at batch 1".into(),
                ));
            }
            let seconds = time_launches(device, &fence, 50, || {
                w4a16_linear(device, &x, &packed, &scales_buffer, GROUP, None, &y, batch, inner, out)
            })?;
            rows.push(bench_row(
                "linear w4a16".into(),
                format!("{name} [{out}, {inner}] g{GROUP} batch {batch}"),
                seconds,
                int4_bytes,
                copy_gb_per_s,
                format!("{:.2}x faster than bf16 batch 1; target >= 70% of copy bw", bf16_batch1 / seconds),
            ));
        }
    }
    rows.extend(bench_paged(device, &fence, copy_gb_per_s)?);
    let bytes = 1usize << 30;
    let payload = vec![0x5Au8; bytes];
    let started = Instant::now();
    let resident = device.upload_bytes_resident(&payload)?;
    let seconds = started.elapsed().as_secs_f64();
    drop(resident);
    rows.push(bench_row(
        "h2d resident upload".into(),
        "1 GiB".into(),
        seconds,
        bytes,
        copy_gb_per_s,
        "pinned double-buffered staging on the copy stream".into(),
    ));
    let pageable = device.alloc(bytes)?;
    let started = Instant::now();
    device.write(&pageable, &payload)?;
    let seconds = started.elapsed().as_secs_f64();
    rows.push(bench_row(
        "h2d pageable write".into(),
        "1 GiB".into(),
        seconds,
        bytes,
        copy_gb_per_s,
        "activations path".into(),
    ));
    Ok(rows)
}

/// Paged FP8-KV decode attention over 32 K tokens per request on device-resident pages: GLM-5's absorbed MLA (64
/// heads over one 576-wide latent row, page 64) at batch 1 and 8, and GLM-4.5's GQA (96 heads over 8 KV heads of 128,
/// page 16) at batch 1; GB/s counts the KV bytes read once. The verification share is the time the same launch
/// loses to its fused page-tag checks (measured against the launch with the checks skipped).
fn bench_paged(device: &dyn Device, fence: &DeviceBuffer, copy_gb_per_s: f64) -> Result<Vec<SelftestRow>, CudaError> {
    const CONTEXT: usize = 32 * 1024;
    let pool_error =
        |e: PoolError| CudaError::Unsupported { tensor: "paged decode benchmark".into(), problem: e.to_string() };
    let mut rng = Rng::new(0xDEC0DE);
    let mut rows = Vec::new();
    let cases = [
        ("mla absorbed", PagedLayout::mla_absorbed(64, 512, 64, 0.0417), 576, 64, 1),
        ("mla absorbed", PagedLayout::mla_absorbed(64, 512, 64, 0.0417), 576, 64, 8),
        ("gqa", PagedLayout::gqa(96, 8, 128, 0.0884), 2 * 8 * 128, 16, 1),
    ];
    for (name, layout, row_width, page_size, requests) in cases {
        let shape = PoolShape { layers: 1, row_width, aux_width: 0, page_size, pages: requests * CONTEXT / page_size };
        let mut pool = KvPool::new(shape, KvDtype::Fp8, vec![vec![0.05; row_width]]);
        for request in 0..requests as u64 {
            pool.open(request);
            pool.reserve(request, CONTEXT).map_err(pool_error)?;
        }
        let device_pool = DevicePool::mirror(device, &pool)?;
        let tables: Vec<Vec<Mapping>> = (0..requests as u64)
            .map(|request| pool.table(request).map(|table| table.entries.clone()).unwrap_or_default())
            .collect();
        let descriptors: Vec<DecodeRequest> = tables
            .iter()
            .enumerate()
            .map(|(id, entries)| DecodeRequest { id: id as u64, context: CONTEXT, entries })
            .collect();
        let mut batch = DecodeBatch::new(device, &layout, page_size, &descriptors, None)?;
        let q = device.upload(&random(&mut rng, requests * layout.heads * layout.qk_dim, 1.0))?;
        let out = device.alloc_for::<f32>(requests * layout.heads * layout.v_dim)?;
        let faults = device.alloc_for::<i32>(requests)?;
        let timed = |batch: &DecodeBatch| {
            time_launches(device, fence, 20, || decode_on(device, &device_pool, 0, &layout, batch, &q, &out, &faults))
        };
        let verified = timed(&batch)?;
        batch.verify = false;
        let unverified = timed(&batch)?;
        let share = (verified - unverified).max(0.0) / verified;
        let kv_bytes = requests * CONTEXT * row_width;
        rows.push(bench_row(
            format!("paged decode fp8 {name}"),
            format!("{requests} × 32768 tokens, {} heads, row {row_width}, page {page_size}", layout.heads),
            verified,
            kv_bytes,
            copy_gb_per_s,
            format!("verification {:.2}% of the step (target < 1%); target >= 60% of copy bw", share * 100.0),
        ));
    }
    Ok(rows)
}

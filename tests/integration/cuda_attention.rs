//! The CUDA attention family's decode side against the CPU (causal prefill attention is a case of the op table,
//! tests/integration/device_ops.rs): the KV row write
//! (byte for byte against `KvPool::write`), and paged decode attention with fused page-tag verification (against an
//! f64 softmax over the rows `KvPool::read` decodes, and against `KvPool::verify` on injected mapping faults).

use squeeze::metrics;
use squeeze::quant::fp8;
use squeeze::rng::Rng;
use squeeze::runtime::cuda::paged::{self, DecodeLayout, DecodePlan, DecodeRequest, DevicePool};
use squeeze::runtime::kv_cache::{inject, FaultKind, IntegrityError, KvDtype, KvPool, Mapping, PoolShape};

use crate::device_ops::cuda_backends;

/// Paged decode against an f64 reference over the same decoded rows: f32 rounding of 576-term dot products and of
/// the softmax; measured ~1e-7.
const DECODE_REL_L2: f64 = 2e-5;

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

#[test]
fn kv_write_is_byte_identical_to_the_cpu_pool() {
    let backends = cuda_backends();
    // GQA-like row: 2 K heads and 2 V heads of 9 (awkward), one scale per head; power-of-two scales keep the probe
    // values' ties exact after the division, 0.37 exercises the division's rounding.
    let (head_dim, kv_heads) = (9usize, 2usize);
    let row_width = 2 * kv_heads * head_dim;
    let head_scales = [0.5f32, 2.0, 0.37, 0.125];
    let layer_scales: Vec<f32> = (0..row_width).map(|e| head_scales[e / head_dim]).collect();
    let shape = PoolShape { layers: 3, row_width, aux_width: 0, page_size: 16, pages: 11 };
    let probes = fp8_probe_values();
    for dtype in [KvDtype::Bf16, KvDtype::Fp8, KvDtype::F32] {
        let scales = vec![layer_scales.clone(); shape.layers];
        let mut pool = KvPool::new(shape, dtype, scales.clone());
        let contexts = [21usize, 30, 5];
        for (request, _) in contexts.iter().enumerate() {
            pool.open(request as u64);
        }
        // Interleaved reservations so that block tables are not contiguous runs of pages.
        for step in 1..=30usize {
            for (request, &context) in contexts.iter().enumerate() {
                pool.reserve(request as u64, step.min(context)).unwrap();
            }
        }
        let mut rng = Rng::new(5 + dtype.bytes() as u64);
        let mut next_probe = 0;
        let mut writes: Vec<(usize, Vec<f32>, Vec<u32>)> = Vec::new(); // (layer, rows, slots)
        for layer in [0usize, 2] {
            let (mut rows, mut slots) = (Vec::new(), Vec::new());
            for (request, &context) in contexts.iter().enumerate() {
                let table = pool.table(request as u64).unwrap().clone();
                for position in 0..context {
                    let mut row = rng.values(row_width, 3.0);
                    for value in row.iter_mut().step_by(2) {
                        // half the elements are probes, placed in every head (so under every scale)
                        *value = probes[next_probe % probes.len()] * layer_scales[0];
                        next_probe += 1;
                    }
                    pool.write(request as u64, layer, position, &row, &[]).unwrap();
                    let mapping = table.entries[position / shape.page_size];
                    slots.push(mapping.page * shape.page_size as u32 + (position % shape.page_size) as u32);
                    rows.extend(row);
                }
            }
            writes.push((layer, rows, slots));
        }
        for backend in &backends {
            let device = backend.device();
            let device_pool = DevicePool::new(device, shape, dtype, &scales).unwrap();
            for (layer, rows, slots) in &writes {
                paged::write_rows(device, &device_pool, *layer, rows, slots).unwrap();
            }
            let got = device_pool.download_pages(device).unwrap();
            let want = pool.page_data();
            let differing = got.iter().zip(want).filter(|(a, b)| a != b).count();
            let first = got.iter().zip(want).position(|(a, b)| a != b);
            assert_eq!(differing, 0, "{dtype:?}: {differing} bytes differ, first at {first:?}");
        }
    }
}

/// A pool with `contexts[r]` tokens of random rows written for request r in every layer.
fn filled_pool(dtype: KvDtype, row_width: usize, contexts: &[usize], seed: u64) -> KvPool {
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
            pool.reserve(request as u64, step.min(context)).unwrap();
        }
    }
    for (request, &context) in contexts.iter().enumerate() {
        pool.reserve(request as u64, context).unwrap();
    }
    let mut rng = Rng::new(seed);
    for layer in 0..shape.layers {
        for (request, &context) in contexts.iter().enumerate() {
            for position in 0..context {
                pool.write(request as u64, layer, position, &rng.values(row_width, 2.0), &[]).unwrap();
            }
        }
    }
    pool
}

/// f64 softmax attention of each request's query heads over the rows `KvPool::read` decodes.
fn reference_decode(pool: &KvPool, layer: usize, layout: &DecodeLayout, q: &[f32], contexts: &[usize]) -> Vec<f32> {
    let DecodeLayout { heads, kv_heads, qk_dim, v_dim, k_stride, v_base, v_stride, scale } = *layout;
    let row_width = pool.shape().row_width;
    let mut out = Vec::new();
    for (request, &context) in contexts.iter().enumerate() {
        let (mut rows, mut aux) = (Vec::new(), Vec::new());
        pool.read(request as u64, layer, context, &mut rows, &mut aux).unwrap();
        for head in 0..heads {
            let kv_head = head / (heads / kv_heads);
            let q_row = &q[(request * heads + head) * qk_dim..][..qk_dim];
            let scores: Vec<f64> = (0..context)
                .map(|t| {
                    let key = &rows[t * row_width + kv_head * k_stride..][..qk_dim];
                    q_row.iter().zip(key).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale as f64
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for e in 0..v_dim {
                let value: f64 = (0..context)
                    .map(|t| weights[t] * rows[t * row_width + v_base + kv_head * v_stride + e] as f64)
                    .sum();
                out.push(if total > 0.0 { (value / total) as f32 } else { 0.0 });
            }
        }
    }
    out
}

fn requests_of(pool: &KvPool, contexts: &[usize]) -> Vec<(u64, usize, Vec<Mapping>)> {
    contexts
        .iter()
        .enumerate()
        .map(|(request, &context)| (request as u64, context, pool.table(request as u64).unwrap().entries.clone()))
        .collect()
}

fn as_requests(tables: &[(u64, usize, Vec<Mapping>)]) -> Vec<DecodeRequest<'_>> {
    tables.iter().map(|(id, context, entries)| DecodeRequest { id: *id, context: *context, entries }).collect()
}

const CONTEXTS: [usize; 4] = [1, 15, 33, 100];

fn layouts() -> [(&'static str, usize, DecodeLayout); 2] {
    [
        ("gqa", 2 * 2 * 24, DecodeLayout::gqa(6, 2, 24, 1.0 / 24f32.sqrt())),
        ("mla", 576, DecodeLayout::mla_absorbed(4, 512, 64, 1.0 / 192f32.sqrt())),
    ]
}

#[test]
fn paged_decode_matches_an_f64_reference() {
    let backends = cuda_backends();
    for (name, row_width, layout) in layouts() {
        for dtype in [KvDtype::Bf16, KvDtype::Fp8] {
            let pool = filled_pool(dtype, row_width, &CONTEXTS, 17);
            let mut rng = Rng::new(23);
            let q = rng.values(CONTEXTS.len() * layout.heads * layout.qk_dim, 1.0);
            let want = reference_decode(&pool, 1, &layout, &q, &CONTEXTS);
            let tables = requests_of(&pool, &CONTEXTS);
            let requests = as_requests(&tables);
            for backend in &backends {
                let device = backend.device();
                let device_pool = DevicePool::mirror(device, &pool).unwrap();
                // One split per request (the default plan here) and 2-page splits (4 splits merged for 100 tokens).
                for plan in [None, Some(DecodePlan::with_pages_per_split(7, 2))] {
                    let got = paged::decode(device, &device_pool, 1, &layout, &q, &requests, plan).unwrap();
                    assert_eq!(got.faults, vec![0; CONTEXTS.len()], "{name} {dtype:?} {plan:?}");
                    let metrics::Errors { rel_l2: rel, max_abs, .. } = metrics::errors(&got.out, &want);
                    assert!(rel < DECODE_REL_L2, "{name} {dtype:?} {plan:?}: rel L2 {rel:e} (max abs {max_abs:e})");
                }
            }
        }
    }
}

/// The logical page `KvPool::verify` blames.
fn blamed_index(error: &IntegrityError) -> usize {
    match *error {
        IntegrityError::OutOfRange { index, .. }
        | IntegrityError::OnFreeList { index, .. }
        | IntegrityError::Untagged { index, .. }
        | IntegrityError::TagMismatch { index, .. } => index,
        IntegrityError::Length { entries, .. } => entries,
    }
}

#[test]
fn paged_decode_flags_exactly_the_corrupted_requests() {
    let backends = cuda_backends();
    let (name, row_width, layout) = layouts()[0];
    let clean_pool = filled_pool(KvDtype::Fp8, row_width, &CONTEXTS, 29);
    let mut rng = Rng::new(31);
    let q = rng.values(CONTEXTS.len() * layout.heads * layout.qk_dim, 1.0);
    let plan = Some(DecodePlan::with_pages_per_split(7, 2));
    for backend in &backends {
        let device = backend.device();
        let device_pool = DevicePool::mirror(device, &clean_pool).unwrap();
        let clean_tables = requests_of(&clean_pool, &CONTEXTS);
        let clean = paged::decode(device, &device_pool, 1, &layout, &q, &as_requests(&clean_tables), plan).unwrap();
        assert_eq!(clean.faults, vec![0; CONTEXTS.len()]);

        // Faults the pool's own injector makes (tags and tables), checked against KvPool::verify.
        for kind in FaultKind::ALL {
            let mut pool = filled_pool(KvDtype::Fp8, row_width, &CONTEXTS, 29);
            let active: Vec<u64> = (0..CONTEXTS.len() as u64).collect();
            let injected = inject(&mut pool, kind, 2, &active).expect("injectable");
            device_pool.upload_tags(device, &pool).unwrap();
            let tables = requests_of(&pool, &CONTEXTS);
            let got = paged::decode(device, &device_pool, 1, &layout, &q, &as_requests(&tables), plan).unwrap();
            let want_faults: Vec<u32> = active
                .iter()
                .map(|&request| pool.verify(request).err().map_or(0, |error| 1 + blamed_index(&error) as u32))
                .collect();
            assert_eq!(got.faults, want_faults, "{name} {kind:?}: {}", injected.description);
            check_others_unchanged(&got, &clean.out, &got.faults, layout.heads * layout.v_dim, &format!("{kind:?}"));
        }
        device_pool.upload_tags(device, &clean_pool).unwrap();

        // Table corruptions made directly, one field at a time, on request 3's logical page 4 (of 7).
        let pages = clean_pool.shape().pages as u32;
        let other_page = clean_tables[1].2[0];
        let own_page = clean_tables[3].2[5];
        let corruptions: [(&str, Mapping); 4] = [
            ("owner", other_page),
            ("generation", Mapping { generation: clean_tables[3].2[4].generation + 1, ..clean_tables[3].2[4] }),
            ("logical index", own_page),
            ("out of range", Mapping { page: pages + 1, ..clean_tables[3].2[4] }),
        ];
        for (what, mapping) in corruptions {
            let mut tables = clean_tables.clone();
            tables[3].2[4] = mapping;
            let got = paged::decode(device, &device_pool, 1, &layout, &q, &as_requests(&tables), plan).unwrap();
            assert_eq!(got.faults, vec![0, 0, 0, 5], "{what}");
            check_others_unchanged(&got, &clean.out, &got.faults, layout.heads * layout.v_dim, what);
        }
        // A table too short for its context: blamed at its first missing logical page.
        let mut tables = clean_tables.clone();
        tables[2].2.truncate(2);
        let got = paged::decode(device, &device_pool, 1, &layout, &q, &as_requests(&tables), plan).unwrap();
        assert_eq!(got.faults, vec![0, 0, 3, 0], "short table");
        check_others_unchanged(&got, &clean.out, &got.faults, layout.heads * layout.v_dim, "short table");
    }
}

/// Flagged requests' outputs are NaN; every other request's output is bit-identical to the clean run.
fn check_others_unchanged(got: &paged::DecodeOutput, clean: &[f32], faults: &[u32], per_request: usize, what: &str) {
    for (request, &fault) in faults.iter().enumerate() {
        let rows = &got.out[request * per_request..][..per_request];
        let clean_rows = &clean[request * per_request..][..per_request];
        if fault == 0 {
            let same = rows.iter().zip(clean_rows).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{what}: request {request} output changed although its mappings are intact");
        } else {
            assert!(rows.iter().all(|value| value.is_nan()), "{what}: flagged request {request} has output");
        }
    }
}

/// The self-test times the verification share against the same launch with `verify = false`: that launch must do
/// exactly the attention (bit-identical output on a clean batch) and nothing of the checking (a corrupted mapping is
/// not flagged).
#[test]
fn unverified_launch_is_the_same_attention_without_the_checks() {
    let (_, row_width, layout) = layouts()[0];
    let pool = filled_pool(KvDtype::Fp8, row_width, &CONTEXTS, 29);
    let q = Rng::new(37).values(CONTEXTS.len() * layout.heads * layout.qk_dim, 1.0);
    let plan = Some(DecodePlan::with_pages_per_split(7, 2));
    for backend in cuda_backends() {
        let device = backend.device();
        let device_pool = DevicePool::mirror(device, &pool).unwrap();
        let run = |tables: &[(u64, usize, Vec<Mapping>)], verify: bool| {
            let mut batch = paged::DecodeBatch::new(device, &layout, 16, &as_requests(tables), plan).unwrap();
            batch.verify = verify;
            let q_buffer = device.upload(&q).unwrap();
            let count = CONTEXTS.len() * layout.heads * layout.v_dim;
            let out = device.alloc_for::<f32>(count).unwrap();
            let faults = device.alloc_for::<u32>(CONTEXTS.len()).unwrap();
            paged::decode_on(device, &device_pool, 1, &layout, &batch, &q_buffer, &out, &faults).unwrap();
            (device.download::<f32>(&out, count).unwrap(), device.download::<u32>(&faults, CONTEXTS.len()).unwrap())
        };
        let clean = requests_of(&pool, &CONTEXTS);
        let (verified, _) = run(&clean, true);
        let (unverified, faults) = run(&clean, false);
        assert_eq!(faults, vec![0; CONTEXTS.len()]);
        assert!(verified.iter().zip(&unverified).all(|(a, b)| a.to_bits() == b.to_bits()));
        let mut corrupted = clean.clone();
        corrupted[3].2[4].generation += 1;
        assert_eq!(run(&corrupted, true).1, vec![0, 0, 0, 5]);
        assert_eq!(run(&corrupted, false).1, vec![0; CONTEXTS.len()]);
    }
}

//! The op table (src/opcheck/, the same one `squeeze selftest` runs) on the emulated device always (kernels/*.cu
//! compiled for the host) and on a real GPU too when one is usable (skipped with a printed reason otherwise): one
//! test per op, every row must pass. Also what is no comparison with the CPU: the device ops' refusals (W4A16
//! layouts, a routed token outside the batch), paged decode's fault flags and its unverified launch, the CPU's
//! batching contract, the emulation's own primitives; and the backends the other device tests run on.

use std::sync::Arc;

use half::bf16;
use squeeze::opcheck::expert_ops::{batch, expert, routes, Expert};
use squeeze::opcheck::kv_ops::{as_requests, filled_pool, layouts, requests_of, CONTEXTS};
use squeeze::opcheck::{self, Mode, Target, CASES};
use squeeze::quant::pack;
use squeeze::rng::Rng;
use squeeze::runtime::backend::RoutedExpert;
use squeeze::runtime::cuda::paged::{self, DecodePlan};
use squeeze::runtime::cuda::CudaBackend;
use squeeze::runtime::device::emulated::Emulator;
use squeeze::runtime::device::{Arg, Device, LaunchShape};
use squeeze::runtime::kv_cache::{inject, FaultKind, IntegrityError, KvDtype, KvPool, Mapping};
use squeeze::runtime::matrix::Int4Weight;
use squeeze::runtime::{Backend, Cpu, Matrix};

/// The backends under test: emulated always, the GPU when the probe finds one.
pub fn cuda_backends() -> Vec<CudaBackend> {
    let mut backends =
        vec![CudaBackend::new(Arc::new(Emulator::start().expect("the kernel emulator builds and starts")))];
    match squeeze::runtime::device::Gpu::open(0) {
        Ok(gpu) => backends.push(CudaBackend::new(Arc::new(gpu))),
        Err(reason) => eprintln!("real-GPU twin skipped: {reason}"),
    }
    backends
}

/// Seed of the table's inputs in CI (the self-test draws a fresh one per run).
const SEED: u64 = 0x5EED_0015;

/// Runs the table's case `op` on every backend; every row must pass.
fn check(op: &str) {
    assert!(CASES.iter().any(|case| case.op == op), "no case {op} in the table");
    for (index, backend) in cuda_backends().iter().enumerate() {
        // The emulated device (index 0) runs the host's libm: bit-identical where a GPU may tie within rounding.
        let target = Target { backend, exact: index == 0 };
        let rows = opcheck::run(&target, SEED, Some(op), Mode::Test).expect("test mode returns its rows").rows;
        assert!(!rows.is_empty(), "{op}: no rows");
        for row in &rows {
            eprintln!(
                "{} {} [{}]: error {:.2e}, mismatches {}, {}",
                backend.device().describe(),
                row.op,
                row.shape,
                row.max_rel_error,
                row.mismatches,
                row.note
            );
        }
        let failed: Vec<_> = rows.iter().filter(|row| !row.passed).collect();
        assert!(failed.is_empty(), "{op} on {}: {failed:#?}", backend.device().describe());
    }
}

#[test]
fn every_case_of_the_table_has_its_test() {
    let tested = [
        "fp4_dequant",
        "fp8_block_dequant",
        "int4_quantize_fp8",
        "int4_quantize_f32",
        "linear f32",
        "linear bf16",
        "gemm_bf16",
        "linear w4a16",
        "w4a16_grouped",
        "norm",
        "rope",
        "silu_mul",
        "attention",
        "kv_write",
        "paged_decode",
        "paged_select",
        "route",
        "moe_experts",
        "indexer",
        "gptq",
    ];
    let table: Vec<&str> = CASES.iter().map(|case| case.op).collect();
    assert_eq!(table, tested, "a case without a test below (or a test without a case)");
    // `run` selects by substring: a name inside another would run that case twice.
    for (index, op) in table.iter().enumerate() {
        let inside: Vec<_> =
            table.iter().enumerate().filter(|&(other, name)| other != index && name.contains(op)).collect();
        assert!(inside.is_empty(), "{op} is inside {inside:?}");
    }
}

#[test]
fn fp4_dequant_matches_the_cpu_bit_for_bit() {
    check("fp4_dequant");
}

#[test]
fn fp8_block_dequant_matches_the_cpu() {
    check("fp8_block_dequant");
}

#[test]
fn int4_quantize_of_fp8_matches_the_cpu_for_every_rule() {
    check("int4_quantize_fp8");
}

#[test]
fn int4_quantize_of_f32_matches_the_cpu_for_every_rule() {
    check("int4_quantize_f32");
}

#[test]
fn dense_linear_matches_cpu() {
    check("linear f32");
}

#[test]
fn bf16_linear_matches_cpu_on_the_rounded_weights() {
    check("linear bf16");
}

#[test]
fn split_bf16_gemm_matches_cpu_on_the_rounded_weights_and_f32_activations() {
    check("gemm_bf16");
}

#[test]
fn w4a16_linear_matches_cpu_on_the_dequantized_weights() {
    check("linear w4a16");
}

#[test]
fn w4a16_grouped_matches_per_expert_cpu_products_and_nans_an_unknown_expert() {
    check("w4a16_grouped");
}

#[test]
fn norms_match_cpu() {
    check("norm");
}

#[test]
fn rope_is_bit_identical_to_cpu() {
    check("rope");
}

#[test]
fn silu_mul_matches_cpu() {
    check("silu_mul");
}

#[test]
fn prefill_attention_matches_cpu() {
    check("attention");
}

#[test]
fn kv_write_is_byte_identical_to_the_cpu_pool() {
    check("kv_write");
}

#[test]
fn paged_decode_matches_an_f64_reference() {
    check("paged_decode");
}

#[test]
fn routing_matches_cpu_and_refuses_what_the_kernel_cannot_route() {
    check("route");
}

#[test]
fn routed_experts_match_cpu() {
    check("moe_experts");
}

#[test]
fn indexer_top_k_matches_cpu() {
    check("indexer");
}

#[test]
fn gptq_factor_and_codes_match_the_host() {
    check("gptq");
}

#[test]
fn grouped_w4a16_benchmark_rows_run_at_a_small_shape() {
    // The GPU benchmark (GLM-5's expert shapes) at shapes the emulated device runs in seconds: every row timed.
    let device = Emulator::start().expect("the kernel emulator builds and starts");
    let rows = squeeze::opcheck::expert_ops::bench_grouped_at(&device, 1.0, &[("tiny", 40, 64)], 1).unwrap();
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert!(rows.iter().all(|row| row.seconds.is_some_and(|s| s > 0.0) && row.gb_per_s.is_some()), "{rows:?}");
}

#[test]
fn gptq_benchmark_rows_run_at_a_small_shape() {
    // The GPU benchmark (GLM-5 width) at a width the emulated device runs in seconds: every row timed.
    let device = Emulator::start().expect("the kernel emulator builds and starts");
    let rows = squeeze::opcheck::gptq_ops::bench_expert(&device, 40, (96, 64), 10).unwrap();
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert!(rows.iter().all(|row| row.seconds.is_some_and(|s| s > 0.0) && row.passed), "{rows:?}");
    assert!(rows[4].note.contains("10 such experts"), "{}", rows[4].note);
}

#[test]
fn emulation_primitives_behave_like_cuda() {
    let device = Emulator::start().expect("the kernel emulator builds and starts");
    let device: &dyn Device = &device;
    let (blocks, threads) = (3usize, 256usize);
    // Small integers: exact sums in any order.
    let input: Vec<f32> = (0..blocks * threads).map(|i| ((i * 7919) % 61) as f32 - 30.0).collect();
    let warps = input.len() / 32;
    let in_buffer = device.upload(&input).unwrap();
    let block_sums = device.alloc_for::<f32>(blocks).unwrap();
    let warp_sums = device.alloc_for::<f32>(2 * warps).unwrap();
    let (ballots, broadcast) = (device.alloc_for::<u32>(warps).unwrap(), device.alloc_for::<f32>(warps).unwrap());
    let args = [
        Arg::Buffer(&in_buffer),
        Arg::Buffer(&block_sums),
        Arg::Buffer(&warp_sums),
        Arg::Buffer(&ballots),
        Arg::Buffer(&broadcast),
    ];
    device.launch("emulation_primitives", LaunchShape::linear(blocks as u32, threads as u32), &args).unwrap();
    let block_sums = device.download::<f32>(&block_sums, blocks).unwrap();
    let warp_sums = device.download::<f32>(&warp_sums, 2 * warps).unwrap();
    let ballots = device.download::<u32>(&ballots, warps).unwrap();
    let broadcast = device.download::<f32>(&broadcast, warps).unwrap();
    for (block, sum) in block_sums.iter().enumerate() {
        let want: f32 = input[block * threads..][..threads].iter().sum();
        assert_eq!(*sum, want, "block {block} sum");
    }
    for warp in 0..warps {
        let lanes = &input[warp * 32..][..32];
        let want: f32 = lanes.iter().sum();
        let want_ballot = lanes.iter().enumerate().filter(|(_, v)| **v > 0.0).fold(0u32, |b, (l, _)| b | 1 << l);
        assert_eq!((warp_sums[2 * warp], warp_sums[2 * warp + 1]), (want, want), "warp {warp}: xor and down sums");
        assert_eq!(ballots[warp], want_ballot, "warp {warp} ballot");
        assert_eq!(broadcast[warp], lanes[0], "warp {warp} lane-0 broadcast");
    }
}

#[test]
fn w4a16_rejects_group_sizes_it_cannot_read() {
    let backend = cuda_backends().remove(0);
    let mut rng = Rng::new(14);
    // group 12 is not a multiple of 8; in 200 is not a multiple of group 16.
    for (in_features, group_size) in [(96, 12), (200, 16)] {
        let words = pack::packed_columns(in_features);
        let int4 = Int4Weight {
            packed: vec![0x8888_8888; 5 * words],
            scales: vec![bf16::ONE.to_bits(); 5 * in_features.div_ceil(group_size)],
            group_size,
        };
        let matrix = Matrix::new(5, in_features, vec![0.0; 5 * in_features]).with_int4(int4);
        let x = backend.upload(&rng.values(in_features, 1.0), in_features).unwrap();
        let error = backend.linear(&x, &matrix, None).expect_err("an unreadable INT4 layout is refused");
        let message = error.to_string();
        assert!(message.contains("group size") && message.contains("CPU backend"), "{message}");
    }
}

#[test]
fn routed_experts_refuse_a_token_outside_the_batch() {
    let backend = cuda_backends().remove(0);
    let mut rng = Rng::new(43);
    let one = expert(&mut rng, 32, 16, Some(16), false);
    let tokens = [(0usize, 1.0f32), (2, 0.5)];
    let [gate, up, down] = &one.device;
    let x = backend.upload(&rng.values(2 * 32, 1.0), 32).unwrap();
    let mut output = backend.zeros(2, 32).unwrap();
    let refused = backend.routed_experts(
        &x,
        &[RoutedExpert { gate, up, down, tokens: &tokens, inputs: Default::default(), swiglu_limit: None }],
        &mut output,
    );
    let failure = refused.expect_err("a token index past x is refused").to_string();
    assert!(failure.contains("token 2 of 2"), "{failure}");
    assert!(
        backend.download(&output).unwrap().iter().all(|&v| v == 0.0),
        "a refused batch leaves the output as it was"
    );
}

#[test]
fn cpu_batches_split_anywhere_sum_to_the_same_bits() {
    // moe.rs cuts the hit experts into batches; each token must still add its experts in one order, so any split
    // gives the bits of one whole batch.
    let mut rng = Rng::new(44);
    let (hidden, inner, tokens, count) = (40, 24, 9, 7);
    let experts: Vec<Expert> = (0..count).map(|_| expert(&mut rng, hidden, inner, None, false)).collect();
    let assigned = routes(&mut rng, tokens, count, 3, &[]);
    let x = rng.values(tokens * hidden, 2.0);
    let all = batch(experts.iter().map(|e| &e.cpu), &assigned);
    let x = Cpu::default().upload(&x, hidden).unwrap();
    let mut whole = Cpu::default().zeros(tokens, hidden).unwrap();
    Cpu::default().routed_experts(&x, &all, &mut whole).unwrap();
    let whole = Cpu::default().download(&whole).unwrap();
    for per_batch in [1, 2, 3, 6] {
        let mut split = Cpu::default().zeros(tokens, hidden).unwrap();
        for chunk in all.chunks(per_batch) {
            Cpu::default().routed_experts(&x, chunk, &mut split).unwrap();
        }
        let split = Cpu::default().download(&split).unwrap();
        let differ = split.iter().zip(&whole).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "batches of {per_batch}: {differ} values differ from one batch");
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
        IntegrityError::NoState { .. } | IntegrityError::StateSlot { .. } | IntegrityError::CachePage { .. } => {
            unreachable!("these pools keep no KDA state or DeepSeek-V4 cache: {error}")
        }
    }
}

fn fp8_pool(row_width: usize) -> KvPool {
    filled_pool(KvDtype::Fp8, row_width, &CONTEXTS, 29).expect("the fixture pool fits")
}

/// In every decode kernel's layouts (kernels/paged_attention.cu for GQA, kernels/paged_mla_decode.cu for MLA).
#[test]
fn paged_decode_flags_exactly_the_corrupted_requests() {
    for (name, row_width, layout) in layouts() {
        flags_exactly_the_corrupted_requests(name, row_width, layout);
    }
}

fn flags_exactly_the_corrupted_requests(name: &str, row_width: usize, layout: paged::DecodeLayout) {
    let backends = cuda_backends();
    let clean_pool = fp8_pool(row_width);
    let mut rng = Rng::new(31);
    let q = rng.values(CONTEXTS.len() * layout.heads * layout.qk_dim, 1.0);
    let plan = Some(DecodePlan::with_pages_per_split(7, 2));
    for backend in &backends {
        let device = backend.device();
        let device_pool = paged::DevicePool::mirror(device, &clean_pool).unwrap();
        let clean_tables = requests_of(&clean_pool, &CONTEXTS);
        let clean =
            paged::decode(device, (&device_pool, 1), &layout, &q, &as_requests(&clean_tables), plan, None).unwrap();
        assert_eq!(clean.faults, vec![0; CONTEXTS.len()]);

        // Faults the pool's own injector makes (tags and tables), checked against KvPool::verify.
        for kind in FaultKind::ALL {
            let mut pool = fp8_pool(row_width);
            let active: Vec<u64> = (0..CONTEXTS.len() as u64).collect();
            let injected = inject(&mut pool, kind, 2, &active).expect("injectable");
            device_pool.upload_tags(device, &pool).unwrap();
            let tables = requests_of(&pool, &CONTEXTS);
            let got = paged::decode(device, (&device_pool, 1), &layout, &q, &as_requests(&tables), plan, None).unwrap();
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
            let got = paged::decode(device, (&device_pool, 1), &layout, &q, &as_requests(&tables), plan, None).unwrap();
            assert_eq!(got.faults, vec![0, 0, 0, 5], "{name} {what}");
            check_others_unchanged(&got, &clean.out, &got.faults, layout.heads * layout.v_dim, what);
        }
        // A table too short for its context: blamed at its first missing logical page.
        let mut tables = clean_tables.clone();
        tables[2].2.truncate(2);
        let got = paged::decode(device, (&device_pool, 1), &layout, &q, &as_requests(&tables), plan, None).unwrap();
        assert_eq!(got.faults, vec![0, 0, 3, 0], "{name} short table");
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
    for (_, row_width, layout) in layouts() {
        unverified_launch_matches(row_width, layout);
    }
}

fn unverified_launch_matches(row_width: usize, layout: paged::DecodeLayout) {
    let pool = fp8_pool(row_width);
    let q = Rng::new(37).values(CONTEXTS.len() * layout.heads * layout.qk_dim, 1.0);
    let plan = Some(DecodePlan::with_pages_per_split(7, 2));
    for backend in cuda_backends() {
        let device = backend.device();
        let device_pool = paged::DevicePool::mirror(device, &pool).unwrap();
        let run = |tables: &[(u64, usize, Vec<Mapping>)], verify: bool| {
            let mut batch = paged::DecodeBatch::new(device, &layout, 16, &as_requests(tables), plan).unwrap();
            batch.verify = verify;
            let q_buffer = device.upload(&q).unwrap();
            let count = CONTEXTS.len() * layout.heads * layout.v_dim;
            let out = device.alloc_for::<f32>(count).unwrap();
            let faults = device.alloc_for::<u32>(CONTEXTS.len()).unwrap();
            paged::decode_on(device, (&device_pool, 1), &layout, &batch, &q_buffer, (&out, &faults), None).unwrap();
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

#[test]
fn paged_select_keeps_the_keys_the_cpu_keeps() {
    check("paged_select");
}

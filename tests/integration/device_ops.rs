//! The op table (src/opcheck/, the same one `squeeze selftest` runs) on the emulated device always (kernels/*.cu
//! compiled for the host) and on a real GPU too when one is usable (skipped with a printed reason otherwise): one
//! test per op, every row must pass. Also the emulation's own primitives, and the backends the other device tests
//! run on.

use std::sync::Arc;

use squeeze::opcheck::{self, Mode, Target, CASES};
use squeeze::runtime::cuda::CudaBackend;
use squeeze::runtime::device::emulated::Emulator;
use squeeze::runtime::device::{Arg, Device, LaunchShape};

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
        "fp8_block_dequant",
        "int4_quantize_fp8",
        "int4_quantize_f32",
        "linear f32",
        "linear w4a16",
        "norm",
        "rope",
        "silu_mul",
        "attention",
        "route",
        "indexer",
    ];
    let table: Vec<&str> = CASES.iter().map(|case| case.op).collect();
    assert_eq!(table, tested, "a case without a test below (or a test without a case)");
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
fn w4a16_linear_matches_cpu_on_the_dequantized_weights() {
    check("linear w4a16");
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
fn routing_matches_cpu_and_refuses_what_the_kernel_cannot_route() {
    check("route");
}

#[test]
fn indexer_top_k_matches_cpu() {
    check("indexer");
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

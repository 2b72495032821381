//! The CUDA backend's device-level linear launches (BF16 weights, grouped MoE W4A16 with an unknown expert) and the
//! W4A16 layout refusals against the CPU backend, on the emulated device always and on a GPU when present (the
//! host-level dense and W4A16 linears, norms and RoPE are cases of the op table: tests/integration/device_ops.rs).

use half::bf16;
use squeeze::metrics;
use squeeze::quant::pack;
use squeeze::rng::Rng;
use squeeze::runtime::backend::Int4Weight;
use squeeze::runtime::cuda::linear::{self, GroupedInt4};
use squeeze::runtime::cuda::CudaBackend;
use squeeze::runtime::{Backend, Cpu, Matrix};

use crate::device_ops::cuda_backends;

/// Dot products of up to ~400 terms summed in another order than the CPU's (32 lanes × 4–8, then a butterfly,
/// against 8 strided lanes): each sum carries a few f32 roundings (≤ ~1e-7 relative each) over √K-ish growth.
const DOT_ORDER_REL_L2: f64 = 1e-5;

fn check(name: &str, backend: &CudaBackend, got: &[f32], want: &[f32], tolerance: f64) {
    assert_eq!(backend.failure(), None, "{name}: device failure");
    let metrics::Errors { rel_l2: rel, max_abs, .. } = metrics::errors(got, want);
    eprintln!("{name} ({}): rel L2 {rel:.3e}, max abs {max_abs:.3e}", backend.device().describe());
    assert!(rel <= tolerance, "{name}: rel L2 {rel:e} > {tolerance:e} (max abs {max_abs:e})");
}

#[test]
fn bf16_linear_matches_cpu_on_the_rounded_weights() {
    let backends = cuda_backends();
    let mut rng = Rng::new(12);
    for (rows, in_features, out_features) in [(1, 200, 75), (16, 75, 41), (21, 96, 19)] {
        let bits: Vec<u16> =
            rng.values(out_features * in_features, 0.5).iter().map(|&w| bf16::from_f32(w).to_bits()).collect();
        let rounded =
            Matrix::new(out_features, in_features, bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect());
        let input = rng.values(rows * in_features, 2.0);
        let bias = rng.values(out_features, 1.0);
        let want = Cpu.linear(&input, rows, &rounded, Some(&bias));
        for backend in &backends {
            let device = backend.device();
            let x = device.upload(&input).unwrap();
            let w = device.upload(&bits).unwrap();
            let b = device.upload(&bias).unwrap();
            let y = device.alloc_for::<f32>(rows * out_features).unwrap();
            linear::linear_bf16(device, &x, &w, Some(&b), &y, rows, in_features, out_features).unwrap();
            let got = device.download::<f32>(&y, rows * out_features).unwrap();
            check(&format!("linear_bf16 {rows}×{in_features}→{out_features}"), backend, &got, &want, DOT_ORDER_REL_L2);
        }
    }
}

/// A random `[rows, columns]` weight through squeeze's INT4 quantizer: packed form and dequantized values.
fn quantized(rng: &mut Rng, rows: usize, columns: usize, group_size: usize) -> (Int4Weight, Vec<f32>) {
    Int4Weight::quantize(&rng.values(rows * columns, 0.3), columns, group_size)
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
        let error = linear::linear(&backend, &rng.values(in_features, 1.0), 1, &matrix, None)
            .expect_err("an unreadable INT4 layout is refused");
        let message = error.to_string();
        assert!(message.contains("group size") && message.contains("CPU backend"), "{message}");
    }
}

#[test]
fn w4a16_grouped_matches_per_expert_cpu_products() {
    let backends = cuda_backends();
    let mut rng = Rng::new(15);
    let (experts, in_features, out_features, group_size) = (3, 256, 37, 32);
    let mut weights = Vec::new();
    let (mut packed, mut scales) = (Vec::new(), Vec::new());
    for _ in 0..experts {
        let (int4, values) = quantized(&mut rng, out_features, in_features, group_size);
        packed.extend_from_slice(&int4.packed);
        scales.extend_from_slice(&int4.scales);
        weights.push(Matrix::new(out_features, in_features, values));
    }
    // Rows sorted by expert: expert 0 has 5 rows, expert 1 none, expert 2 has 18 (two 16-row tiles).
    let segment_expert = [0i32, 1, 2];
    let segment_start = [0i32, 5, 5, 23];
    let rows = 23;
    let input = rng.values(rows * in_features, 2.0);
    let mut want = Vec::new();
    for (s, &expert) in segment_expert.iter().enumerate() {
        let (start, end) = (segment_start[s] as usize, segment_start[s + 1] as usize);
        let x = &input[start * in_features..end * in_features];
        want.extend(Cpu.linear(x, end - start, &weights[expert as usize], None));
    }
    for backend in &backends {
        let device = backend.device();
        let x = device.upload(&input).unwrap();
        let packed = device.upload(&packed).unwrap();
        let scales = device.upload(&scales).unwrap();
        let experts_buffer = device.upload(&segment_expert).unwrap();
        let starts = device.upload(&segment_start).unwrap();
        let y = device.alloc_for::<f32>(rows * out_features).unwrap();
        let grouped = GroupedInt4 { packed: &packed, scales: &scales, group_size, experts, in_features, out_features };
        linear::w4a16_grouped(device, &x, &grouped, &experts_buffer, &starts, 3, rows, &y).unwrap();
        let got = device.download::<f32>(&y, rows * out_features).unwrap();
        check("w4a16_grouped 3 experts, 23 rows", backend, &got, &want, DOT_ORDER_REL_L2);

        // A segment naming an expert that does not exist gets NaN rows instead of another expert's product.
        device.write_values(&experts_buffer, &[0i32, 1, 7]).unwrap();
        linear::w4a16_grouped(device, &x, &grouped, &experts_buffer, &starts, 3, rows, &y).unwrap();
        let got = device.download::<f32>(&y, rows * out_features).unwrap();
        assert!(got[..5 * out_features].iter().all(|v| v.is_finite()), "valid segment stays finite");
        assert!(got[5 * out_features..].iter().all(|v| v.is_nan()), "unknown expert gives NaN rows");
    }
}

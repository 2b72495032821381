//! The CUDA backend's linear layers (dense f32 and BF16, INT4 W4A16, grouped MoE W4A16), RMSNorm/LayerNorm and
//! RoPE against the CPU backend on random awkward shapes, on the emulated device always and on a GPU when present.

use half::bf16;
use squeeze::quant::pack;
use squeeze::runtime::backend::Int4Weight;
use squeeze::runtime::cuda::linear::{self, GroupedInt4};
use squeeze::runtime::cuda::CudaBackend;
use squeeze::runtime::{Backend, Cpu, Matrix, RopeStyle};

use crate::cuda_ops::{cuda_backends, errors, Rng};

/// Dot products of up to ~400 terms summed in another order than the CPU's (32 lanes × 4–8, then a butterfly,
/// against 8 strided lanes): each sum carries a few f32 roundings (≤ ~1e-7 relative each) over √K-ish growth.
const DOT_ORDER_REL_L2: f64 = 1e-5;
/// Norms: only the row sums differ in order (width ≤ 300); everything after them is the CPU's arithmetic.
const NORM_REL_L2: f64 = 2e-6;

fn check(name: &str, backend: &CudaBackend, got: &[f32], want: &[f32], tolerance: f64) {
    assert_eq!(backend.failure(), None, "{name}: device failure");
    let (rel, max_abs) = errors(got, want);
    eprintln!("{name} ({}): rel L2 {rel:.3e}, max abs {max_abs:.3e}", backend.device().describe());
    assert!(rel <= tolerance, "{name}: rel L2 {rel:e} > {tolerance:e} (max abs {max_abs:e})");
}

#[test]
fn dense_linear_matches_cpu() {
    let backends = cuda_backends();
    let mut rng = Rng(11);
    // (rows, in, out): decode rows 1/5/16, a prefill tile and a half (37); `in` a multiple of 4 (16-byte loads)
    // and not (75: one element per lane).
    for (rows, in_features, out_features) in [(1, 200, 75), (5, 200, 75), (16, 75, 41), (37, 96, 75), (3, 75, 9)] {
        let weight = Matrix::new(out_features, in_features, rng.values(out_features * in_features, 0.5));
        let input = rng.values(rows * in_features, 2.0);
        let bias = rng.values(out_features, 1.0);
        for bias in [None, Some(bias.as_slice())] {
            let want = Cpu.linear(&input, rows, &weight, bias);
            for backend in &backends {
                let got = backend.linear(&input, rows, &weight, bias);
                let name = format!("linear {rows}×{in_features}→{out_features} bias {}", bias.is_some());
                check(&name, backend, &got, &want, DOT_ORDER_REL_L2);
            }
        }
    }
}

#[test]
fn bf16_linear_matches_cpu_on_the_rounded_weights() {
    let backends = cuda_backends();
    let mut rng = Rng(12);
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
fn w4a16_linear_matches_cpu_on_the_dequantized_weights() {
    let backends = cuda_backends();
    let mut rng = Rng(13);
    // (in, group, out): 16-byte word loads (in a multiple of 32) with group 32 and 128 (one scale per 4 words) and
    // 16 (a scale per word); one word per lane (200 / 8 = 25 words) with group 40.
    for (in_features, group_size, out_features) in [(256, 32, 75), (384, 128, 37), (256, 16, 23), (200, 40, 19)] {
        let (int4, values) = quantized(&mut rng, out_features, in_features, group_size);
        let dense = Matrix::new(out_features, in_features, values);
        // The device copy of this matrix is the packed form only: NaN dense data proves W4A16 ran.
        let packed = Matrix::new(out_features, in_features, vec![f32::NAN; out_features * in_features]).with_int4(int4);
        let bias = rng.values(out_features, 1.0);
        for rows in [1, 3, 16, 21] {
            let input = rng.values(rows * in_features, 2.0);
            for bias in [None, Some(bias.as_slice())] {
                let want = Cpu.linear(&input, rows, &dense, bias);
                for backend in &backends {
                    let got = backend.linear(&input, rows, &packed, bias);
                    let name =
                        format!("w4a16 {rows}×{in_features}→{out_features} group {group_size} bias {}", bias.is_some());
                    check(&name, backend, &got, &want, DOT_ORDER_REL_L2);
                }
            }
        }
    }
}

#[test]
fn w4a16_rejects_group_sizes_it_cannot_read() {
    let backend = cuda_backends().remove(0);
    let mut rng = Rng(14);
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
    let mut rng = Rng(15);
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

#[test]
fn norms_match_cpu() {
    let backends = cuda_backends();
    let mut rng = Rng(16);
    for (rows, width) in [(5, 77), (3, 300), (1, 1000)] {
        // An offset mean so that LayerNorm's centering matters.
        let data: Vec<f32> = rng.values(rows * width, 3.0).iter().map(|v| v + 1.5).collect();
        let weight = rng.values(width, 1.0);
        let bias = rng.values(width, 0.5);
        let mut want_rms = data.clone();
        Cpu.rms_norm(&mut want_rms, width, &weight, 1e-6);
        let mut want_layer = data.clone();
        Cpu.layer_norm(&mut want_layer, width, &weight, &bias, 1e-5);
        for backend in &backends {
            let mut got = data.clone();
            backend.rms_norm(&mut got, width, &weight, 1e-6);
            check(&format!("rms_norm {rows}×{width}"), backend, &got, &want_rms, NORM_REL_L2);
            let mut got = data.clone();
            backend.layer_norm(&mut got, width, &weight, &bias, 1e-5);
            check(&format!("layer_norm {rows}×{width}"), backend, &got, &want_layer, NORM_REL_L2);
        }
    }
}

#[test]
fn rope_is_bit_identical_to_cpu() {
    let backends = cuda_backends();
    let mut rng = Rng(17);
    // (tokens, heads, head_dim, offset, rotary_dim): DeepSeek-like full 64, partial with an offset, and a rotary
    // dim whose 48 pairs need a second pass of the warp.
    for (tokens, heads, head_dim, offset, rotary_dim) in [(5, 3, 64, 0, 64), (7, 2, 40, 8, 24), (3, 3, 100, 4, 96)] {
        let row_width = heads * head_dim;
        let half = rotary_dim / 2;
        let angles: Vec<f32> = rng.values(tokens * half, 3.0);
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        let data = rng.values(tokens * row_width, 2.0);
        for style in [RopeStyle::Interleaved, RopeStyle::Half] {
            let mut want = data.clone();
            Cpu.rope(&mut want, tokens, row_width, head_dim, offset, rotary_dim, &cos, &sin, style);
            for backend in &backends {
                let mut got = data.clone();
                backend.rope(&mut got, tokens, row_width, head_dim, offset, rotary_dim, &cos, &sin, style);
                assert_eq!(backend.failure(), None);
                let mismatches = got.iter().zip(&want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
                assert_eq!(
                    mismatches, 0,
                    "rope {style:?} {tokens}×{heads}×{head_dim} offset {offset} rotary {rotary_dim}: \
                     {mismatches} values differ"
                );
            }
        }
    }
}

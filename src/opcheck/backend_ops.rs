//! The runtime backend's op cases: each CUDA backend op (and the device-level BF16 linear) against the CPU backend
//! on seeded inputs of awkward shapes (test mode), then, on a real GPU, the benchmarks (perf mode): INT4 W4A16 matrix-vector at batch 1–16 on GLM-5
//! expert shapes against the device copy bandwidth and against BF16 weights, FP8 paged decode attention at 32 K
//! tokens with the share of its fused page verification, and the host-to-device bandwidth of resident uploads.

use std::time::Instant;

use half::bf16;

use crate::metrics;
use crate::rng::Rng;
use crate::runtime::backend::{AttentionShape, IndexerShape, RopeCall, RopeStyle, RoutingShape};
use crate::runtime::cpu::Cpu;
use crate::runtime::cuda::linear::{
    linear_bf16, linear_bf16_gemm, linear_bf16_pair, w4a16_linear, Activations, LinearShape, W4a16Weight, GEMM_MIN_ROWS,
};
use crate::runtime::cuda::paged::{decode_on, mla_tensor_flops, DecodeBatch, DecodeRequest, DevicePool};
use crate::runtime::cuda::split::split;
use crate::runtime::cuda::CudaBackend;
use crate::runtime::device::{CudaError, Device, DeviceBuffer};
use crate::runtime::kv_cache::{KvDtype, KvPool, Mapping, PagedLayout, PoolError, PoolShape};
use crate::runtime::matrix::{Int4Weight, Matrix};
use crate::runtime::rope_table::RopeTable;

use super::host::Host;
use super::timing::time_launches;
use super::SelftestRow;

/// Dot products of up to ~400 terms (and attention's softmax sums) summed in another order than the CPU's (32 lanes
/// × 4–8, then a butterfly, against 8 strided lanes): each sum carries a few f32 roundings (≤ ~1e-7 relative each)
/// over √K-ish growth; measured ~1e-7, 1e-5 still catches a wrong index, scale or mask.
pub(super) const DOT_ORDER_REL_L2: f64 = 1e-5;
/// Norms: only the row sums differ in order (width ≤ 1000); everything after them is the CPU's arithmetic.
const NORM_REL_L2: f64 = 2e-6;
/// Elementwise ops and gate weights differ from the CPU only by the exponential's last bit (the same libm function
/// under emulation, within 2 ulp for CUDA's expf; a normalization over at most 32 weights keeps that relative size).
const ELEMENTWISE_REL_L2: f64 = 1e-6;
/// Bit-identical: RoPE, selections (experts, keys) and the quantize kernels do the CPU's operations in its order.
const EXACT: f64 = 0.0;

/// A row comparing `got` with `want` by relative L2 within `tolerance` (`mismatches` counted by the caller).
pub(super) fn row(
    op: &str,
    shape: String,
    got: &[f32],
    want: &[f32],
    mismatches: usize,
    tolerance: f64,
) -> SelftestRow {
    let errors = metrics::errors(got, want);
    SelftestRow {
        op: op.into(),
        shape,
        max_rel_error: errors.rel_l2,
        mismatches,
        passed: errors.rel_l2 <= tolerance && mismatches == 0,
        seconds: None,
        gb_per_s: None,
        copy_share: None,
        note: format!("rel L2 vs cpu ≤ {tolerance:.0e}, max abs {:.1e}", errors.max_abs),
    }
}

/// A row that holds when `passed`, with `note` saying what was checked.
pub(super) fn verdict(op: &str, shape: String, passed: bool, note: String) -> SelftestRow {
    let mismatches = usize::from(!passed);
    SelftestRow { passed, ..row(op, shape, &[], &[], mismatches, EXACT) }.with_note(note)
}

impl SelftestRow {
    pub(super) fn with_note(mut self, note: String) -> Self {
        self.note = note;
        self
    }
}

/// A random INT4 matrix `[rows, columns]` quantized with squeeze's own quantizer: packed form and dequantized values.
fn int4_weight(rng: &mut Rng, rows: usize, columns: usize, group_size: usize, scale: f32) -> (Int4Weight, Vec<f32>) {
    Int4Weight::quantize(&rng.values(rows * columns, scale), columns, group_size)
}

/// `linear` with dense f32 weights: decode rows 1/5/16, a prefill tile and a half (37); `in` a multiple of 4
/// (16-byte loads) and not (75: one element per lane); with and without bias.
pub fn linear_f32(backend: &CudaBackend, rng: &mut Rng) -> Vec<SelftestRow> {
    let mut rows = Vec::new();
    let cases = [(1, 200, 75), (5, 200, 75), (16, 75, 41), (37, 96, 75), (3, 75, 9), (7, 75, 41), (37, 130, 96)];
    for (tokens, inner, out) in cases {
        let weight = Matrix::new(out, inner, rng.values(out * inner, 0.5));
        let x = rng.values(tokens * inner, 2.0);
        let bias = rng.values(out, 1.0);
        for bias in [None, Some(bias.as_slice())] {
            let (got, want) = (
                Host::new(backend).linear(&x, tokens, &weight, bias),
                Host::new(&Cpu::default()).linear(&x, tokens, &weight, bias),
            );
            let shape = format!("[{tokens}, {inner}]·[{out}, {inner}]ᵀ bias {}", bias.is_some());
            rows.push(row("linear f32", shape, &got, &want, 0, DOT_ORDER_REL_L2));
        }
    }
    rows
}

/// The device-level BF16 linear (the bandwidth baseline of the W4A16 benchmarks) on BF16 weight bits against the CPU
/// `linear` on the same weights rounded to BF16, with bias: decode rows 1, a tile of 16 and 21; `in` 200 and 75/96.
pub fn linear_bf16_weights(backend: &CudaBackend, rng: &mut Rng) -> Result<Vec<SelftestRow>, CudaError> {
    let device = backend.device();
    let mut rows = Vec::new();
    for (tokens, inner, out) in [(1, 200, 75), (16, 75, 41), (21, 96, 19)] {
        let bits: Vec<u16> = rng.values(out * inner, 0.5).iter().map(|&w| bf16::from_f32(w).to_bits()).collect();
        let rounded = Matrix::new(out, inner, bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect());
        let input = rng.values(tokens * inner, 2.0);
        let bias = rng.values(out, 1.0);
        let want = Host::new(&Cpu::default()).linear(&input, tokens, &rounded, Some(&bias));
        let (x, weight, bias) = (device.upload(&input)?, device.upload(&bits)?, device.upload(&bias)?);
        let y = device.alloc_for::<f32>(tokens * out)?;
        linear_bf16(device, &x, &weight, Some(&bias), &y, LinearShape::new(tokens, inner, out))?;
        let got = device.download::<f32>(&y, tokens * out)?;
        let shape = format!("[{tokens}, {inner}]·[{out}, {inner}]ᵀ bias true");
        rows.push(row("linear bf16", shape, &got, &want, 0, DOT_ORDER_REL_L2));
    }
    Ok(rows)
}

/// The BF16 GEMM ([`linear_bf16_gemm`]; cuBLAS on a GPU, the reference kernel here) against the CPU `linear` on the
/// same BF16 weights: rows from [`GEMM_MIN_ROWS`] up, `in` a multiple of 8 and not, with and without bias; and an f32
/// weight as its BF16 pair ([`linear_bf16_pair`], the device form of block-FP8 weights) on both of its paths. With
/// split activations against the f32 activations: the halves keep x within 2⁻¹⁸ (≈ 4e-6) relative, so a sum is off
/// by about that over the dot-order noise (one BF16 rounding of x, 2⁻⁹, would be ≈ 1e-3 and fail). With BF16
/// activations ([`Activations::Bf16`]) against the CPU on the activations rounded to BF16: the same products, the
/// same tolerance.
pub fn linear_bf16_split_gemm(backend: &CudaBackend, rng: &mut Rng) -> Result<Vec<SelftestRow>, CudaError> {
    const SPLIT_REL_L2: f64 = 2e-5;
    let device = backend.device();
    let mut rows = Vec::new();
    let to_bf16 = |values: &[f32]| -> Vec<f32> { values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect() };
    for (tokens, inner, out) in [(GEMM_MIN_ROWS, 200, 75), (45, 96, 19), (70, 75, 41)] {
        let bits: Vec<u16> = rng.values(out * inner, 0.5).iter().map(|&w| bf16::from_f32(w).to_bits()).collect();
        let rounded = Matrix::new(out, inner, bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect());
        let input = rng.values(tokens * inner, 2.0);
        let bias_values = rng.values(out, 1.0);
        let (x, weight, bias) = (device.upload(&input)?, device.upload(&bits)?, device.upload(&bias_values)?);
        // An f32 weight (as block-FP8 dequantizes) as its BF16 pair.
        let dense = Matrix::new(out, inner, rng.values(out * inner, 0.5));
        let pair = split(device, &device.upload(dense.values())?, out * inner)?;
        for activations in [Activations::Split, Activations::Bf16] {
            let seen = if activations == Activations::Bf16 { to_bf16(&input) } else { input.clone() };
            let cpu_backend = Cpu::default();
            let cpu = Host::new(&cpu_backend);
            for with_bias in [false, true] {
                let want = cpu.linear(&seen, tokens, &rounded, with_bias.then_some(bias_values.as_slice()));
                let y = device.alloc_for::<f32>(tokens * out)?;
                let shape = LinearShape::new(tokens, inner, out);
                linear_bf16_gemm(device, &x, &weight, with_bias.then_some(&bias), (&y, shape), activations)?;
                let got = device.download::<f32>(&y, tokens * out)?;
                let shape = format!("[{tokens}, {inner}]·[{out}, {inner}]ᵀ bias {with_bias}, {activations:?} x");
                rows.push(row("gemm_bf16", shape, &got, &want, 0, SPLIT_REL_L2));
            }
            // Below GEMM_MIN_ROWS the pair runs on the matrix-vector kernel with f32 x, whatever `activations` says.
            for tokens in [5, tokens] {
                let seen = if tokens < GEMM_MIN_ROWS { &input } else { &seen };
                let want = cpu.linear(&seen[..tokens * inner], tokens, &dense, Some(&bias_values));
                let y = device.alloc_for::<f32>(tokens * out)?;
                linear_bf16_pair(
                    device,
                    &x,
                    &pair,
                    Some(&bias),
                    (&y, LinearShape::new(tokens, inner, out)),
                    activations,
                )?;
                let got = device.download::<f32>(&y, tokens * out)?;
                let shape =
                    format!("[{tokens}, {inner}]·([{out}, {inner}] f32 as a BF16 pair)ᵀ bias true, {activations:?} x");
                rows.push(row("gemm_bf16", shape, &got, &want, 0, SPLIT_REL_L2));
            }
        }
    }
    Ok(rows)
}

/// `linear` with INT4 weights (W4A16 on the packed form; the device copy's dense data is NaN, so only the packed
/// form can give finite outputs): 16-byte word loads (in a multiple of 32) with group 32 and 128 (one scale per 4
/// words) and 16 (a scale per word); one word per lane (200 / 8 = 25 words) with group 40; rows 1–21.
pub fn linear_w4a16(backend: &CudaBackend, rng: &mut Rng) -> Vec<SelftestRow> {
    let mut rows = Vec::new();
    for (inner, group_size, out) in [(256, 32, 75), (384, 128, 37), (256, 16, 23), (200, 40, 19)] {
        let (int4, values) = int4_weight(rng, out, inner, group_size, 0.3);
        let dense = Matrix::new(out, inner, values);
        let packed = Matrix::new(out, inner, vec![f32::NAN; out * inner]).with_int4(int4);
        let bias = rng.values(out, 1.0);
        for tokens in [1, 3, 16, 21] {
            let x = rng.values(tokens * inner, 2.0);
            for bias in [None, Some(bias.as_slice())] {
                let (got, want) = (
                    Host::new(backend).linear(&x, tokens, &packed, bias),
                    Host::new(&Cpu::default()).linear(&x, tokens, &dense, bias),
                );
                let shape = format!("[{tokens}, {inner}]·[{out}, {inner}]ᵀ g{group_size} bias {}", bias.is_some());
                rows.push(row("linear w4a16", shape, &got, &want, 0, DOT_ORDER_REL_L2));
            }
        }
    }
    rows
}

/// RMSNorm and LayerNorm on rows of awkward widths, with an offset mean so that LayerNorm's centering matters.
pub fn norms(backend: &CudaBackend, rng: &mut Rng) -> Vec<SelftestRow> {
    let mut rows = Vec::new();
    for (count, width) in [(5, 77), (3, 300), (3, 301), (1, 1000)] {
        let data: Vec<f32> = rng.values(count * width, 3.0).iter().map(|v| v + 1.5).collect();
        let (weight, bias) = (rng.values(width, 1.0), rng.values(width, 0.5));
        let (mut got, mut want) = (data.clone(), data.clone());
        Host::new(backend).rms_norm(&mut got, width, &weight, 1e-6);
        Host::new(&Cpu::default()).rms_norm(&mut want, width, &weight, 1e-6);
        rows.push(row("rms_norm", format!("[{count}, {width}]"), &got, &want, 0, NORM_REL_L2));
        let (mut got, mut want) = (data.clone(), data);
        Host::new(backend).layer_norm(&mut got, width, &weight, &bias, 1e-5);
        Host::new(&Cpu::default()).layer_norm(&mut want, width, &weight, &bias, 1e-5);
        rows.push(row("layer_norm", format!("[{count}, {width}]"), &got, &want, 0, NORM_REL_L2));
    }
    rows
}

/// RoPE, both styles, bit-identical: DeepSeek-like full 64, partial with an offset, and a rotary dim whose 48 pairs
/// need a second pass of the warp.
pub fn rope(backend: &CudaBackend, rng: &mut Rng) -> Vec<SelftestRow> {
    let mut rows = Vec::new();
    for (tokens, heads, head_dim, offset, rotary) in
        [(5, 3, 64, 0, 64), (7, 2, 40, 8, 24), (3, 3, 100, 4, 96), (9, 3, 40, 8, 24)]
    {
        let row_width = heads * head_dim;
        let angles = rng.values(tokens * rotary / 2, 3.0);
        let (cos, sin): (Vec<f32>, Vec<f32>) = angles.iter().map(|a| (a.cos(), a.sin())).unzip();
        let data = rng.values(tokens * row_width, 2.0);
        // Token `t` at position `t` of the `[tokens, rotary / 2]` tables (one table per run, each a new matrix).
        let table = || RopeTable {
            rotary_dim: rotary,
            positions: tokens,
            cos: Matrix::new(tokens, rotary / 2, cos.clone()),
            sin: Matrix::new(tokens, rotary / 2, sin.clone()),
        };
        for style in [RopeStyle::Interleaved, RopeStyle::Half] {
            let (mut got, mut want) = (data.clone(), data.clone());
            let call = |table| RopeCall {
                rows: 0..tokens,
                first_position: 0,
                head_dim,
                offset,
                rotary_dim: rotary,
                table,
                style,
            };
            let got_table = table();
            Host::new(backend).rope(&mut got, row_width, &call(&got_table));
            let want_table = table();
            Host::new(&Cpu::default()).rope(&mut want, row_width, &call(&want_table));
            let mismatches = metrics::bit_mismatches(&got, &want);
            let shape = format!("[{tokens}, {heads}, {head_dim}] offset {offset} rotary {rotary}");
            rows.push(row(&format!("rope {style:?}"), shape, &got, &want, mismatches, EXACT));
        }
    }
    rows
}

/// SiLU-gate over a length that is not a multiple of the block.
pub fn silu_mul(backend: &CudaBackend, rng: &mut Rng) -> Vec<SelftestRow> {
    let count = 1000 * 3 + 17;
    let (gate, up) = (rng.values(count, 6.0), rng.values(count, 2.0));
    let (got, want) = (Host::new(backend).silu_mul(&gate, &up), Host::new(&Cpu::default()).silu_mul(&gate, &up));
    vec![row("silu_mul", format!("[{count}]"), &got, &want, 0, ELEMENTWISE_REL_L2)]
}

/// Causal prefill attention, with and without a DSA mask (the diagonal always allowed): tokens 1/7/19/33, 1–4 KV
/// heads under 4 query heads, qk/v dims 24/20, 40/24 and 72/64.
pub fn attention(backend: &CudaBackend, rng: &mut Rng) -> Vec<SelftestRow> {
    let mut rows = Vec::new();
    let mut shapes = Vec::new();
    for tokens in [1, 7, 33] {
        for kv_heads in [1, 2, 4] {
            for (qk_dim, v_dim) in [(24, 20), (72, 64)] {
                shapes.push((tokens, kv_heads, qk_dim, v_dim, 1.0 / (qk_dim as f32).sqrt()));
            }
        }
    }
    shapes.push((19, 2, 40, 24, 0.15));
    for (tokens, kv_heads, qk_dim, v_dim, scale) in shapes {
        let shape = AttentionShape { tokens, heads: 4, kv_heads, qk_dim, v_dim, scale };
        for masked in [false, true] {
            let q = rng.values(tokens * shape.heads * qk_dim, 1.5);
            let k = rng.values(tokens * kv_heads * qk_dim, 1.5);
            let v = rng.values(tokens * kv_heads * v_dim, 1.0);
            let mask: Option<Vec<bool>> =
                masked.then(|| (0..tokens * tokens).map(|i| i / tokens == i % tokens || rng.below(3) > 0).collect());
            let got = Host::new(backend).attention(&q, &k, &v, &shape, mask.as_deref());
            let want = Host::new(&Cpu::default()).attention(&q, &k, &v, &shape, mask.as_deref());
            let name = if masked { "attention causal+mask" } else { "attention causal" };
            let shape = format!("{tokens} tokens, 4/{kv_heads} heads, qk {qk_dim}, v {v_dim}");
            rows.push(row(name, shape, &got, &want, 0, DOT_ORDER_REL_L2));
        }
    }
    rows
}

/// MoE routing with grouped top-k: the tiny synthetic DeepseekV3 (8 experts, 2 per token), the Kimi K2 / GLM-4.5
/// presets, DeepSeek-V3-style group-limited routing on awkward sizes (26 experts in 4 groups of 6: the last two in
/// no group, never masked, as on the CPU), one expert per group, and logits rounded to 1/4 with a zero bias (exact
/// ties everywhere, broken by the lower expert). The same experts, the same near-tie count, weights within
/// [`ELEMENTWISE_REL_L2`]. A shape beyond the kernel (513 experts) is a reported failure with NaN weights.
pub fn route(backend: &CudaBackend, rng: &mut Rng) -> Vec<SelftestRow> {
    let shape = |experts, top_k, groups, topk_group, norm_topk_prob, routed_scaling_factor| RoutingShape {
        experts,
        top_k,
        groups,
        topk_group,
        norm_topk_prob,
        routed_scaling_factor,
    };
    let cases = [
        ("kimi-synth", shape(8, 2, 1, 1, true, 2.827), false),
        ("kimi-k2", shape(384, 8, 1, 1, true, 2.827), false),
        ("glm-4.5", shape(160, 8, 1, 1, true, 2.5), false),
        ("grouped", shape(26, 5, 4, 2, true, 2.5), false),
        ("grouped-unnormalized", shape(24, 6, 4, 3, false, 1.0), false),
        ("grouped-selftest", shape(24, 6, 4, 3, true, 2.5), false),
        ("singleton-groups-ties", shape(12, 3, 12, 5, true, 2.5), true),
        ("glm-4.5-ties", shape(160, 8, 1, 1, true, 2.5), true),
    ];
    let mut rows = Vec::new();
    for (name, shape, exact_ties) in cases {
        for tokens in [1, 37] {
            let mut logits = rng.values(tokens * shape.experts, 4.0);
            let mut bias = rng.values(shape.experts, 0.05);
            if exact_ties {
                logits.iter_mut().for_each(|l| *l = (*l * 4.0).round() / 4.0);
                bias.fill(0.0);
            }
            let (got, want) = (
                Host::new(backend).route(&logits, tokens, &bias, &shape),
                Host::new(&Cpu::default()).route(&logits, tokens, &bias, &shape),
            );
            let (got, want) = match (got, want) {
                (Ok(got), Ok(want)) => (got, want),
                (got, want) => {
                    let problem = format!("{:?} / {:?}", got.err(), want.err());
                    rows.push(verdict("route grouped top-k", format!("{name}: {tokens} tokens"), false, problem));
                    continue;
                }
            };
            let mismatches = got.experts.iter().zip(&want.experts).filter(|(g, w)| g != w).count()
                + got.experts.len().abs_diff(want.experts.len())
                + usize::from(got.top_k != want.top_k)
                + usize::from(got.near_ties != want.near_ties);
            let label = format!("{name}: {tokens} tokens, {} experts, top {}", shape.experts, shape.top_k);
            rows.push(row("route grouped top-k", label, &got.weights, &want.weights, mismatches, ELEMENTWISE_REL_L2));
        }
    }
    let beyond = shape(513, 8, 1, 1, true, 2.5);
    let refused = Host::new(backend).route(&rng.values(2 * 513, 1.0), 2, &[0.0; 513], &beyond);
    let failure = refused.err().map(|error| error.to_string()).unwrap_or_default();
    let passed = failure.contains("513 experts");
    rows.push(verdict("route grouped top-k", "513 experts".into(), passed, format!("refused: {failure}")));
    rows
}

/// The DSA indexer's top-k key selection: the synthetic GLM-5's 4×32 heads and an awkward 3×36 (a dot-product
/// tail), up to 300 tokens; signed head weights give negative and zero (all-ReLU-off) scores, so ties at ±0 are
/// common. The same mask cell for cell (the CPU keeps min(t + 1, top_k) keys per query) and the same near ties.
pub fn indexer_top_k(backend: &CudaBackend, rng: &mut Rng) -> Vec<SelftestRow> {
    let mut rows = Vec::new();
    for (tokens, heads, head_dim, top_k) in
        [(5, 4, 32, 3), (33, 3, 36, 8), (33, 3, 32, 8), (70, 4, 32, 13), (70, 3, 36, 64), (300, 3, 36, 200)]
    {
        let shape = IndexerShape { tokens, heads, head_dim, top_k };
        let q = rng.values(tokens * heads * head_dim, 1.0);
        let k = rng.values(tokens * head_dim, 1.0);
        let head_weights = rng.values(tokens * heads, 1.0);
        let want = Host::new(&Cpu::default()).indexer_top_k(&q, &k, &head_weights, &shape);
        let got = Host::new(backend).indexer_top_k(&q, &k, &head_weights, &shape);
        let kept = want.mask.iter().filter(|&&m| m).count();
        let expected: usize = (0..tokens).map(|t| (t + 1).min(top_k)).sum();
        let mismatches = got.mask.iter().zip(&want.mask).filter(|(g, w)| g != w).count()
            + got.mask.len().abs_diff(want.mask.len())
            + usize::from(got.near_ties != want.near_ties)
            + usize::from(kept != expected);
        let label = format!("{tokens} tokens, {heads}×{head_dim}, top {top_k}");
        rows.push(row("indexer top-k", label, &[], &[], mismatches, EXACT));
    }
    rows
}

pub(super) fn bench_row(
    op: String,
    shape: String,
    seconds: f64,
    bytes: usize,
    copy_gb_per_s: f64,
    note: String,
) -> SelftestRow {
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
            let x = device.upload(&rng.values(batch * inner, 1.0))?;
            let y = device.alloc_for::<f32>(batch * out)?;
            if batch == 1 {
                bf16_batch1 = time_launches(device, &fence, 50, || {
                    linear_bf16(device, &x, &bf16_buffer, None, &y, LinearShape::new(1, inner, out))
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
                w4a16_linear(
                    device,
                    &x,
                    &W4a16Weight { packed: &packed, scales: &scales_buffer, group_size: GROUP },
                    None,
                    &y,
                    LinearShape::new(batch, inner, out),
                )
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
    rows.extend(super::dense_bench::bench(device, &fence)?);
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
    // The MLA rows run kernels/paged_mla_decode.cu (tensor cores; target >= 1 TB/s of KV bytes at batch 8, issue
    // 48), the GQA row kernels/paged_attention.cu.
    let cases = [
        ("mla absorbed", PagedLayout::mla_absorbed(64, 512, 64, 0.0417), 576, 64, 1, "target >= 1 TB/s at batch 8"),
        ("mla absorbed", PagedLayout::mla_absorbed(64, 512, 64, 0.0417), 576, 64, 8, "target >= 1 TB/s"),
        ("gqa", PagedLayout::gqa(96, 8, 128, 0.0884), 2 * 8 * 128, 16, 1, "target >= 60% of copy bw"),
    ];
    for (name, layout, row_width, page_size, requests, target) in cases {
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
        let q = device.upload(&rng.values(requests * layout.heads * layout.qk_dim, 1.0))?;
        let out = device.alloc_for::<f32>(requests * layout.heads * layout.v_dim)?;
        let faults = device.alloc_for::<i32>(requests)?;
        let timed = |batch: &DecodeBatch| {
            time_launches(device, fence, 20, || {
                decode_on(device, (&device_pool, 0), &layout, batch, &q, (&out, &faults), None)
            })
        };
        let verified = timed(&batch)?;
        batch.verify = false;
        let unverified = timed(&batch)?;
        let share = (verified - unverified).max(0.0) / verified;
        let kv_bytes = requests * CONTEXT * row_width;
        let tensor = mla_tensor_flops(&layout, KvDtype::Fp8, CONTEXT).map_or(String::new(), |flops| {
            format!("; tensor cores {:.0} TFLOP/s (hi/lo MMAs)", requests as f64 * flops / verified / 1e12)
        });
        rows.push(bench_row(
            format!("paged decode fp8 {name}"),
            format!("{requests} × 32768 tokens, {} heads, row {row_width}, page {page_size}", layout.heads),
            verified,
            kv_bytes,
            copy_gb_per_s,
            format!("verification {:.2}% of the step (target < 1%); {target}{tensor}", share * 100.0),
        ));
    }
    Ok(rows)
}

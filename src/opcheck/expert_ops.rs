//! The MoE expert op cases: routed experts through the backend ([`Backend::routed_experts`]: grouped W4A16 for INT4
//! batches, per-expert dense linears otherwise) and the device-level grouped W4A16 launch (with an unknown expert)
//! against per-expert CPU products; with the experts and routes the batching tests (tests/integration/device_ops.rs)
//! reuse.

use crate::rng::Rng;
use crate::runtime::backend::RoutedExpert;
use crate::runtime::cpu::Cpu;
use crate::runtime::cuda::linear::{linear_bf16, w4a16_grouped, GroupedInt4, LinearShape, Segments};
use crate::runtime::cuda::CudaBackend;
use crate::runtime::device::{CudaError, Device};
use crate::runtime::matrix::{Int4Weight, Matrix};

use super::backend_ops::{bench_row, row, verdict, DOT_ORDER_REL_L2};
use super::host::Host;
use super::timing::time_launches;
use super::SelftestRow;

/// Two chained dot products (gate/up over `hidden`, down over `inner`, both ≤ 96 terms) summed in another order than
/// the CPU's, the SiLU's exponential in between: each output carries a few f32 roundings (~1e-7 relative each).
const EXPERTS_REL_L2: f64 = 1e-5;

/// One expert's three matrices (gate, up, down): what the CPU multiplies (dense values) and what the device gets.
pub struct Expert {
    pub cpu: [Matrix; 3],
    pub device: [Matrix; 3],
}

/// `[inner, hidden]` gate and up, `[hidden, inner]` down. `group_size: Some` quantizes them with squeeze's INT4
/// quantizer; the device copies then carry NaN dense values (only the packed form can produce finite outputs:
/// proves the grouped W4A16 path ran) unless `keep_dense`.
pub fn expert(rng: &mut Rng, hidden: usize, inner: usize, group_size: Option<usize>, keep_dense: bool) -> Expert {
    let made = [(inner, hidden), (inner, hidden), (hidden, inner)].map(|(rows, columns)| match group_size {
        Some(group_size) => {
            let (int4, values) = Int4Weight::quantize(&rng.values(rows * columns, 0.3), columns, group_size);
            let device_values = if keep_dense { values.clone() } else { vec![f32::NAN; rows * columns] };
            (Matrix::new(rows, columns, values), Matrix::new(rows, columns, device_values).with_int4(int4))
        }
        None => {
            let values = rng.values(rows * columns, 0.3);
            (Matrix::new(rows, columns, values.clone()), Matrix::new(rows, columns, values))
        }
    });
    let [gate, up, down] = made;
    Expert { cpu: [gate.0, up.0, down.0], device: [gate.1, up.1, down.1] }
}

/// Routes each of `tokens` tokens to `top_k` distinct experts out of `experts` (at most as many as there are
/// candidates), never to the ones in `unused`; positive weights. Returns the `(token, weight)` lists per expert,
/// tokens ascending.
pub fn routes(rng: &mut Rng, tokens: usize, experts: usize, top_k: usize, unused: &[usize]) -> Vec<Vec<(usize, f32)>> {
    let mut assigned = vec![Vec::new(); experts];
    let candidates: Vec<usize> = (0..experts).filter(|e| !unused.contains(e)).collect();
    for token in 0..tokens {
        let mut pool = candidates.clone();
        for _ in 0..top_k.min(candidates.len()) {
            let pick = pool.remove(rng.below(pool.len()));
            assigned[pick].push((token, 0.05 + rng.signed().abs()));
        }
    }
    assigned
}

/// The batch of `matrices` (one expert's gate, up, down each) with their routed tokens.
pub fn batch<'a>(
    matrices: impl Iterator<Item = &'a [Matrix; 3]>,
    assigned: &'a [Vec<(usize, f32)>],
) -> Vec<RoutedExpert<'a>> {
    matrices
        .zip(assigned)
        .map(|([gate, up, down], tokens)| RoutedExpert {
            gate,
            up,
            down,
            tokens,
            inputs: Default::default(),
            swiglu_limit: None,
        })
        .collect()
}

/// One batch through the CPU and the device, `output` starting from the same nonzero values; a CPU batch that
/// changed nothing (rows of tokens routed nowhere keep their start values) is a mismatch of the case itself.
fn check_batch(
    backend: &CudaBackend,
    label: String,
    hidden: usize,
    tokens: usize,
    experts: &[Expert],
    assigned: &[Vec<(usize, f32)>],
    rng: &mut Rng,
) -> SelftestRow {
    let x = rng.values(tokens * hidden, 2.0);
    let start = rng.values(tokens * hidden, 0.5);
    let mut want = start.clone();
    Host::new(&Cpu::default()).routed_experts(&x, hidden, &batch(experts.iter().map(|e| &e.cpu), assigned), &mut want);
    let mut got = start.clone();
    Host::new(backend).routed_experts(&x, hidden, &batch(experts.iter().map(|e| &e.device), assigned), &mut got);
    let unchanged = usize::from(want == start);
    row("moe_experts", label, &got, &want, unchanged, EXPERTS_REL_L2)
}

/// Routed experts: INT4 batches through grouped W4A16 — 16-byte word loads (hidden 96 = 12 words, group 32), one
/// word per lane (hidden 80 = 10 words, group 16), a single decode token with top-8, experts no token reaches —;
/// dense f32 experts (FP8/BF16 checkpoints); INT4 experts with one dense among them and two group sizes (the batch
/// falls back to dense).
pub fn moe_experts(backend: &CudaBackend, rng: &mut Rng) -> Vec<SelftestRow> {
    let mut rows = Vec::new();
    // (hidden, inner, group, experts, tokens, top_k, unused experts)
    let int4_cases =
        [(96, 64, 32, 6, 13, 2, vec![3]), (80, 48, 16, 8, 1, 8, vec![]), (96, 32, 32, 9, 21, 5, vec![0, 7])];
    for (hidden, inner, group_size, count, tokens, top_k, unused) in int4_cases {
        let experts: Vec<Expert> = (0..count).map(|_| expert(rng, hidden, inner, Some(group_size), false)).collect();
        let assigned = routes(rng, tokens, count, top_k, &unused);
        let label = format!("int4 {count}×({hidden}→{inner}) g{group_size}, {tokens} tokens top-{top_k}");
        rows.push(check_batch(backend, label, hidden, tokens, &experts, &assigned, rng));
    }
    let (hidden, inner, tokens) = (72, 40, 11);
    let dense: Vec<Expert> = (0..5).map(|_| expert(rng, hidden, inner, None, false)).collect();
    let assigned = routes(rng, tokens, 5, 3, &[1]);
    let label = format!("dense 5×({hidden}→{inner}), {tokens} tokens top-3");
    rows.push(check_batch(backend, label, hidden, tokens, &dense, &assigned, rng));
    let (hidden, inner, tokens) = (64, 32, 7);
    let mut mixed: Vec<Expert> = (0..3).map(|_| expert(rng, hidden, inner, Some(32), true)).collect();
    mixed.push(expert(rng, hidden, inner, None, false));
    mixed.push(expert(rng, hidden, inner, Some(16), true));
    let assigned = routes(rng, tokens, 5, 4, &[]);
    let label = format!("mixed int4 g32/g16/dense 5×({hidden}→{inner}), {tokens} tokens top-4");
    rows.push(check_batch(backend, label, hidden, tokens, &mixed, &assigned, rng));
    rows
}

/// The device-level grouped W4A16 launch against per-expert CPU products within [`DOT_ORDER_REL_L2`]: 3 experts
/// `[37, 256]` group 32 (16-byte word loads), 23 rows sorted by expert (expert 0 has 5 rows, expert 1 none, expert
/// 2 has 18: three row tiles, the last of 2), and 3 experts `[45, 1096]` group 8 (two input chunks, the second of
/// 72 columns; 137 words per row: single-word loads); then a segment naming an expert that does not exist gets NaN
/// rows instead of another expert's product while the valid segment stays finite.
pub fn w4a16_grouped_experts(backend: &CudaBackend, rng: &mut Rng) -> Result<Vec<SelftestRow>, CudaError> {
    let mut checked = grouped_case(backend, rng, (256, 37, 32), true)?;
    checked.extend(grouped_case(backend, rng, (1096, 45, 8), false)?);
    Ok(checked)
}

fn grouped_case(
    backend: &CudaBackend,
    rng: &mut Rng,
    (in_features, out_features, group_size): (usize, usize, usize),
    with_fault: bool,
) -> Result<Vec<SelftestRow>, CudaError> {
    let device = backend.device();
    let experts = 3;
    let mut weights = Vec::new();
    let (mut packed, mut scales) = (Vec::new(), Vec::new());
    for _ in 0..experts {
        let (int4, values) =
            Int4Weight::quantize(&rng.values(out_features * in_features, 0.3), in_features, group_size);
        packed.extend_from_slice(&int4.packed);
        scales.extend_from_slice(&int4.scales);
        weights.push(Matrix::new(out_features, in_features, values));
    }
    let segment_expert = [0i32, 1, 2];
    let segment_start = [0usize, 5, 5, 23];
    let rows = 23;
    let input = rng.values(rows * in_features, 2.0);
    let mut want = Vec::new();
    for (segment, weight) in weights.iter().enumerate() {
        let (start, end) = (segment_start[segment], segment_start[segment + 1]);
        want.extend(Host::new(&Cpu::default()).linear(
            &input[start * in_features..end * in_features],
            end - start,
            weight,
            None,
        ));
    }
    let x = device.upload(&input)?;
    let packed = device.upload(&packed)?;
    let scales = device.upload(&scales)?;
    // Both lists in one buffer, as the runtime uploads them: experts at byte 0, starts after them.
    let lists = device.upload(&[segment_expert.as_slice(), &segment_start.map(|start| start as i32)].concat())?;
    let segments = Segments { lists: &lists, expert_at: 0, start_at: 12, count: 3 };
    let y = device.alloc_for::<f32>(rows * out_features)?;
    let grouped = GroupedInt4 { packed: &packed, scales: &scales, group_size, experts, in_features, out_features };
    w4a16_grouped(device, &x, &grouped, &segments, rows, &y)?;
    let got = device.download::<f32>(&y, rows * out_features)?;
    let shape = format!("{experts} experts [{out_features}, {in_features}] g{group_size}, {rows} rows in 5/0/18");
    let mut checked = vec![row("w4a16_grouped", shape, &got, &want, 0, DOT_ORDER_REL_L2)];
    if !with_fault {
        return Ok(checked);
    }

    device.write_values(&lists, &[0i32, 1, 7])?;
    w4a16_grouped(device, &x, &grouped, &segments, rows, &y)?;
    let got = device.download::<f32>(&y, rows * out_features)?;
    let (valid, unknown) = got.split_at(5 * out_features);
    let passed = valid.iter().all(|v| v.is_finite()) && unknown.iter().all(|v| v.is_nan());
    let note = "the valid segment stays finite, the unknown expert's rows are NaN".to_string();
    checked.push(verdict("w4a16_grouped", "segments of experts 0, 1, 7 (of 3)".into(), passed, note));
    Ok(checked)
}

/// Routed experts per token in the grouped benchmark (GLM-5's top-8).
const BENCH_EXPERTS: usize = 8;

/// The grouped W4A16 launch at GLM-5's expert shapes (gate/up `[2048, 6144]`, down `[6144, 2048]`, group 32): a batch
/// of 1–16 tokens, each routed to the same 8 experts (8 segments of `batch` rows: every expert's weights read once
/// per launch), against the device copy bandwidth and the BF16 weights' matrix-vector time at batch 1 (one expert's
/// `linear bf16` launch × 8). Issue 48's targets: ≥ 1.5 TB/s of weight bytes, ≥ 2.5× faster than BF16 at batch 1.
pub fn bench_grouped(device: &dyn Device, copy_gb_per_s: f64) -> Result<Vec<SelftestRow>, CudaError> {
    bench_grouped_at(device, copy_gb_per_s, &[("gate/up", 2048, 6144), ("down", 6144, 2048)], 50)
}

/// [`bench_grouped`] at the given `(name, out, in)` shapes, each timing the best of 3 rounds of `repeats` launches.
pub fn bench_grouped_at(
    device: &dyn Device,
    copy_gb_per_s: f64,
    shapes: &[(&str, usize, usize)],
    repeats: usize,
) -> Result<Vec<SelftestRow>, CudaError> {
    let mut rng = Rng::new(0x0006_E00B);
    let fence = device.alloc(64)?;
    let mut rows = Vec::new();
    for &(name, out, inner) in shapes {
        // Timing does not depend on the values: random words and small positive BF16 scales.
        let words: Vec<u32> = (0..BENCH_EXPERTS * out * inner / 8).map(|_| rng.next_u64() as u32).collect();
        let scales: Vec<u16> = (0..BENCH_EXPERTS * out * inner / BENCH_GROUP)
            .map(|_| half::bf16::from_f32(1e-3 + rng.uniform() * 1e-3).to_bits())
            .collect();
        let bf16_weight: Vec<u16> =
            (0..out * inner).map(|_| half::bf16::from_f32(rng.uniform() - 0.5).to_bits()).collect();
        let (packed, scales, bf16_buffer) =
            (device.upload(&words)?, device.upload(&scales)?, device.upload(&bf16_weight)?);
        let weight_bytes = words.len() * 4 + BENCH_EXPERTS * out * inner / BENCH_GROUP * 2;
        let x1 = device.upload(&rng.values(inner, 1.0))?;
        let y1 = device.alloc_for::<f32>(out)?;
        let bf16_one = time_launches(device, &fence, repeats, || {
            linear_bf16(device, &x1, &bf16_buffer, None, &y1, LinearShape::new(1, inner, out))
        })?;
        let bf16_batch1 = bf16_one * BENCH_EXPERTS as f64;
        let grouped = GroupedInt4 {
            packed: &packed,
            scales: &scales,
            group_size: BENCH_GROUP,
            experts: BENCH_EXPERTS,
            in_features: inner,
            out_features: out,
        };
        for batch in [1usize, 2, 4, 8, 16] {
            let total = BENCH_EXPERTS * batch;
            let x = device.upload(&rng.values(total * inner, 1.0))?;
            let y = device.alloc_for::<f32>(total * out)?;
            let experts: Vec<i32> = (0..BENCH_EXPERTS as i32).collect();
            let starts: Vec<i32> = (0..=BENCH_EXPERTS).map(|e| (e * batch) as i32).collect();
            let lists = device.upload(&[experts, starts].concat())?;
            let segments = Segments { lists: &lists, expert_at: 0, start_at: BENCH_EXPERTS * 4, count: BENCH_EXPERTS };
            let seconds =
                time_launches(device, &fence, repeats, || w4a16_grouped(device, &x, &grouped, &segments, total, &y))?;
            rows.push(bench_row(
                "w4a16_grouped".into(),
                format!("{BENCH_EXPERTS} experts {name} [{out}, {inner}] g{BENCH_GROUP}, {batch} rows each"),
                seconds,
                weight_bytes,
                copy_gb_per_s,
                format!(
                    "{:.2}x faster than bf16 at batch 1 ({BENCH_EXPERTS} launches of {:.4} ms); targets 1.5 TB/s, 2.5x",
                    bf16_batch1 / seconds,
                    bf16_one * 1e3
                ),
            ));
        }
    }
    Ok(rows)
}

/// Group size of the grouped benchmark (the INT4 recipes' g32).
const BENCH_GROUP: usize = 32;

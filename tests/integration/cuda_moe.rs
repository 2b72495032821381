//! Routed MoE experts on the CUDA backend ([`Backend::routed_experts`]: grouped W4A16 for INT4 batches, per-expert
//! dense linears otherwise) against the CPU backend, op by op on random awkward batches and end to end: `eval`
//! with `--device emulated` against `--device cpu` on INT4 GLM-5 and Kimi K2 tiny models with 8 experts.

use serde_json::Value;
use squeeze::metrics;
use squeeze::rng::Rng;
use squeeze::runtime::backend::{Int4Weight, RoutedExpert};
use squeeze::runtime::cuda::CudaBackend;
use squeeze::runtime::{Backend, Cpu, Matrix};

use crate::common::{path_str, squeeze, synth};
use crate::cuda_backend::{eval, read_logits};
use crate::device_ops::cuda_backends;

/// Two chained dot products (gate/up over `hidden`, down over `inner`, both ≤ 96 terms) summed in another order than
/// the CPU's, the SiLU's exponential in between: each output carries a few f32 roundings (~1e-7 relative each).
const EXPERTS_REL_L2: f64 = 1e-5;
/// End to end: see tests/integration/cuda_backend.rs (summation order over a few layers moves logits by ~1e-6).
const LOGITS_REL_L2: f64 = 1e-4;

/// A random `[rows, columns]` weight through squeeze's INT4 quantizer: packed form and dequantized values.
fn quantized(rng: &mut Rng, rows: usize, columns: usize, group_size: usize) -> (Int4Weight, Vec<f32>) {
    Int4Weight::quantize(&rng.values(rows * columns, 0.3), columns, group_size)
}

/// One expert's three matrices: what the CPU multiplies (dense values) and what the device gets.
struct Expert {
    cpu: [Matrix; 3],
    device: [Matrix; 3],
}

/// `[inner, hidden]` gate and up, `[hidden, inner]` down. `group_size: Some` quantizes them; the device copies then
/// carry NaN dense values (only the packed form can produce finite outputs: proves the grouped W4A16 path ran)
/// unless `keep_dense`.
fn expert(rng: &mut Rng, hidden: usize, inner: usize, group_size: Option<usize>, keep_dense: bool) -> Expert {
    let shapes = [(inner, hidden), (inner, hidden), (hidden, inner)];
    let made: Vec<(Matrix, Matrix)> = shapes
        .iter()
        .map(|&(rows, columns)| match group_size {
            Some(group_size) => {
                let (int4, values) = quantized(rng, rows, columns, group_size);
                let device_values = if keep_dense { values.clone() } else { vec![f32::NAN; rows * columns] };
                (Matrix::new(rows, columns, values), Matrix::new(rows, columns, device_values).with_int4(int4))
            }
            None => {
                let values = rng.values(rows * columns, 0.3);
                (Matrix::new(rows, columns, values.clone()), Matrix::new(rows, columns, values))
            }
        })
        .collect();
    let [(g0, g1), (u0, u1), (d0, d1)]: [(Matrix, Matrix); 3] = made.try_into().ok().unwrap();
    Expert { cpu: [g0, u0, d0], device: [g1, u1, d1] }
}

/// Routes each of `tokens` tokens to `top_k` distinct experts out of `experts`, never to the ones in `unused`;
/// positive weights. Returns the `(token, weight)` lists per expert, tokens ascending.
fn routes(rng: &mut Rng, tokens: usize, experts: usize, top_k: usize, unused: &[usize]) -> Vec<Vec<(usize, f32)>> {
    let mut assigned = vec![Vec::new(); experts];
    let candidates: Vec<usize> = (0..experts).filter(|e| !unused.contains(e)).collect();
    assert!(top_k <= candidates.len());
    for token in 0..tokens {
        let mut pool = candidates.clone();
        for _ in 0..top_k {
            let pick = pool.remove((rng.next_u64() % pool.len() as u64) as usize);
            assigned[pick].push((token, 0.05 + rng.signed().abs()));
        }
    }
    assigned
}

fn batch<'a>(
    matrices: impl Iterator<Item = &'a [Matrix; 3]>,
    assigned: &'a [Vec<(usize, f32)>],
) -> Vec<RoutedExpert<'a>> {
    matrices.zip(assigned).map(|([gate, up, down], tokens)| RoutedExpert { gate, up, down, tokens }).collect()
}

/// One batch through the CPU and every CUDA backend, `output` starting from the same nonzero values.
fn check_batch(
    name: &str,
    backends: &[CudaBackend],
    hidden: usize,
    tokens: usize,
    experts: &[Expert],
    rng: &mut Rng,
    assigned: &[Vec<(usize, f32)>],
) {
    let x = rng.values(tokens * hidden, 2.0);
    let start = rng.values(tokens * hidden, 0.5);
    let mut want = start.clone();
    Cpu.routed_experts(&x, hidden, &batch(experts.iter().map(|e| &e.cpu), assigned), &mut want);
    // Rows of tokens routed nowhere keep their start values on the CPU: the batch must have added somewhere.
    assert_ne!(want, start, "{name}: the CPU batch changed nothing");
    for backend in backends {
        let mut got = start.clone();
        backend.routed_experts(&x, hidden, &batch(experts.iter().map(|e| &e.device), assigned), &mut got);
        assert_eq!(backend.failure(), None, "{name}: device failure");
        let metrics::Errors { rel_l2: rel, max_abs, .. } = metrics::errors(&got, &want);
        eprintln!("{name} ({}): rel L2 {rel:.3e}, max abs {max_abs:.3e}", backend.device().describe());
        assert!(rel <= EXPERTS_REL_L2, "{name}: rel L2 {rel:e} > {EXPERTS_REL_L2:e} (max abs {max_abs:e})");
    }
}

#[test]
fn int4_routed_experts_match_cpu() {
    let backends = cuda_backends();
    let mut rng = Rng::new(41);
    // (hidden, inner, group, experts, tokens, top_k, unused experts): 16-byte word loads (hidden 96 = 12 words, group
    // 32), one word per lane (hidden 80 = 10 words, group 16), a single decode token with top-8, and experts that no
    // token reaches (with top-2 over 13 tokens more may stay empty).
    let cases = [(96, 64, 32, 6, 13, 2, vec![3]), (80, 48, 16, 8, 1, 8, vec![]), (96, 32, 32, 9, 21, 5, vec![0, 7])];
    for (hidden, inner, group_size, count, tokens, top_k, unused) in cases {
        let experts: Vec<Expert> =
            (0..count).map(|_| expert(&mut rng, hidden, inner, Some(group_size), false)).collect();
        let assigned = routes(&mut rng, tokens, count, top_k, &unused);
        let name = format!("int4 experts {count}×({hidden}→{inner}) group {group_size}, {tokens} tokens top-{top_k}");
        check_batch(&name, &backends, hidden, tokens, &experts, &mut rng, &assigned);
    }
}

#[test]
fn dense_and_mixed_routed_experts_match_cpu() {
    let backends = cuda_backends();
    let mut rng = Rng::new(42);
    let (hidden, inner, tokens) = (72, 40, 11);
    // Dense f32 experts (FP8/BF16 checkpoints).
    let experts: Vec<Expert> = (0..5).map(|_| expert(&mut rng, hidden, inner, None, false)).collect();
    let assigned = routes(&mut rng, tokens, 5, 3, &[1]);
    check_batch("dense experts 5, 11 tokens top-3", &backends, hidden, tokens, &experts, &mut rng, &assigned);
    // INT4 experts with one dense among them, and INT4 experts of two group sizes: the batch falls back to dense.
    let (hidden, inner) = (64, 32);
    let mut mixed: Vec<Expert> = (0..3).map(|_| expert(&mut rng, hidden, inner, Some(32), true)).collect();
    mixed.push(expert(&mut rng, hidden, inner, None, false));
    mixed.push(expert(&mut rng, hidden, inner, Some(16), true));
    let assigned = routes(&mut rng, 7, 5, 4, &[]);
    check_batch("mixed int4/dense experts 5, 7 tokens top-4", &backends, hidden, 7, &mixed, &mut rng, &assigned);
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
    let mut whole = vec![0f32; tokens * hidden];
    Cpu.routed_experts(&x, hidden, &all, &mut whole);
    for per_batch in [1, 2, 3, 6] {
        let mut split = vec![0f32; tokens * hidden];
        for chunk in all.chunks(per_batch) {
            Cpu.routed_experts(&x, hidden, chunk, &mut split);
        }
        let differ = split.iter().zip(&whole).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "batches of {per_batch}: {differ} values differ from one batch");
    }
}

#[test]
fn routed_experts_refuse_a_token_outside_the_batch() {
    let backend = cuda_backends().remove(0);
    let mut rng = Rng::new(43);
    let one = expert(&mut rng, 32, 16, Some(16), false);
    let tokens = [(0usize, 1.0f32), (2, 0.5)];
    let [gate, up, down] = &one.device;
    let mut output = vec![0f32; 2 * 32];
    backend.routed_experts(
        &rng.values(2 * 32, 1.0),
        32,
        &[RoutedExpert { gate, up, down, tokens: &tokens }],
        &mut output,
    );
    let failure = backend.failure().expect("a token index past x is refused");
    assert!(failure.contains("token 2 of 2"), "{failure}");
    assert!(output.iter().all(|v| v.is_nan()), "a refused batch leaves NaN rows");
}

/// INT4 tiny model with 8 routed experts: `eval` on the emulated device matches the CPU.
fn int4_eval_matches_cpu(arch: &str) {
    const HIDDEN: usize = 96;
    const INNER: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let fp8 = synth(
        dir.path(),
        "fp8",
        arch,
        &["--layers", "2", "--hidden", "96", "--experts", "8", "--moe-intermediate", "64", "--vocab", "260"],
    );
    let model = dir.path().join("int4");
    squeeze(&["quantize", path_str(&fp8), path_str(&model)]).ok();
    // The experts must be readable by the grouped kernel (a group size dividing hidden and inner), or this test
    // would only exercise the dense fallback.
    let config: Value = serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let group_size = config["quantization_config"]["config_groups"]
        .as_object()
        .and_then(|groups| groups.values().find_map(|g| g["weights"]["group_size"].as_u64()))
        .expect("an INT4 group size in config.json") as usize;
    assert!(HIDDEN.is_multiple_of(group_size) && INNER.is_multiple_of(group_size), "group size {group_size}");

    let (cpu_logits, gpu_logits) = (dir.path().join("cpu.safetensors"), dir.path().join("gpu.safetensors"));
    let cpu = eval(&model, "cpu", &cpu_logits);
    let gpu = eval(&model, "emulated", &gpu_logits);
    assert!(gpu["backend"].as_str().unwrap().starts_with("cuda: emulated"), "{gpu}");
    assert_eq!(cpu["backend"], "cpu");
    let (got, want) = (read_logits(&gpu_logits), read_logits(&cpu_logits));
    let metrics::Errors { rel_l2: rel, max_abs, .. } = metrics::errors(&got, &want);
    eprintln!("{arch} int4 8 experts: logits rel L2 {rel:.2e}, max abs {max_abs:.2e}");
    assert!(rel < LOGITS_REL_L2, "{arch}: logits rel L2 {rel:e}");
}

#[test]
fn int4_eval_with_grouped_experts_matches_the_cpu_glm5() {
    int4_eval_matches_cpu("glm5");
}

#[test]
fn int4_eval_with_grouped_experts_matches_the_cpu_kimi_k2() {
    int4_eval_matches_cpu("kimi-k2");
}

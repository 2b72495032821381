//! GPTQ's algebra on the emulated device (kernels/gptq.cu through `DeviceGptq`: what `quantize --method gptq` runs
//! on a GPU) against the host path (src/quant/gptq.rs): the Hessian sums, the damped inverse's factor, the codes and
//! scales of every scale rule, and the whole method on a synth model. The device sums in another order, so values
//! agree within f64 rounding and codes but where a working value lands within rounding of a code boundary.

use std::path::Path;

use half::bf16;

use squeeze::quant::gptq::{quantize, quantize_factored, GptqError, GptqSettings, Hessian, InverseFactor, Quantized};
use squeeze::quant::int4::quantize_row;
use squeeze::quant::ScaleRule;
use squeeze::rng::Rng;
use squeeze::runtime::cuda::gptq::{DeviceGptq, DeviceGptqError};
use squeeze::runtime::device::emulated::Emulator;

use crate::calibrate::never_routed_expert_source;
use crate::common::{path_str, squeeze};

/// Share of codes the device must give as the host does from the same Hessian: the llm-compressor goldens' bound
/// for the same algorithm in another summation order (tests/integration/gptq_golden.rs).
const MIN_CODE_AGREEMENT: f64 = 0.999;

fn random(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal()).collect()
}

/// Inputs with correlated channels (a few shared directions plus noise) and `dead` channels no input excites.
fn inputs(rng: &mut Rng, samples: usize, columns: usize, dead: &[usize]) -> Vec<f32> {
    let basis = random(rng, 6 * columns);
    let mut x = random(rng, samples * columns);
    for row in x.chunks_mut(columns) {
        let mix = random(rng, 6);
        for (k, m) in mix.iter().enumerate() {
            for (v, b) in row.iter_mut().zip(&basis[k * columns..(k + 1) * columns]) {
                *v = 0.3 * *v + m * b;
            }
        }
        for &d in dead {
            row[d] = 0.0;
        }
    }
    x
}

fn agreement(a: &Quantized, b: &Quantized) -> f64 {
    a.codes.iter().zip(&b.codes).filter(|(x, y)| x == y).count() as f64 / a.codes.len() as f64
}

#[test]
fn hessian_sums_and_factor_equal_the_hosts_within_rounding() {
    let device = Emulator::start().expect("the kernel emulator builds and starts");
    let gptq = DeviceGptq::new(&device);
    // Widths below, at and past the factorization's 32-column panels; fewer samples than columns (the damping
    // makes the matrix definite) and dead channels (diagonal 0 → 1).
    for (seed, columns, samples) in [(1u64, 7usize, 30usize), (2, 32, 20), (3, 100, 70), (4, 161, 400)] {
        let mut rng = Rng::new(seed);
        let x = inputs(&mut rng, samples, columns, &[0, columns / 2]);
        let mut host = Hessian::new(columns);
        host.add(&x);
        let mut on_device = gptq.hessian(columns).unwrap();
        // Two additions: the sum carries over.
        let split = (samples / 3) * columns;
        gptq.add(&mut on_device, &x[..split]).unwrap();
        gptq.add(&mut on_device, &x[split..]).unwrap();
        let sums = gptq.download_hessian(&on_device).unwrap();
        let scale = host.upper_sums().iter().fold(0f64, |m, v| m.max(v.abs()));
        for i in 0..columns {
            for j in i..columns {
                let (got, want) = (sums[i * columns + j], host.upper_sums()[i * columns + j]);
                assert!((got - want).abs() <= 1e-12 * scale, "{columns}: H[{i}][{j}] {got} vs {want}");
            }
        }
        let damping = GptqSettings::default().damping;
        let expected = InverseFactor::new(&host, damping).unwrap();
        for factor in [
            gptq.factor(&on_device, damping).unwrap(),
            gptq.factor(&gptq.upload_hessian(&host).unwrap(), damping).unwrap(),
        ] {
            let upper = gptq.download_factor(&factor).unwrap();
            let scale = expected.upper().iter().fold(0f64, |m, v| m.max(v.abs()));
            let worst = upper.iter().zip(expected.upper()).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
            assert!(worst <= 1e-9 * scale, "{columns} columns: factor differs by {worst:e} (scale {scale:e})");
            for i in 0..columns {
                assert!((0..i).all(|j| upper[i * columns + j] == 0.0), "{columns}: row {i} below the diagonal");
            }
        }
    }
}

#[test]
fn codes_and_scales_equal_the_hosts_for_every_rule_and_group() {
    let device = Emulator::start().expect("the kernel emulator builds and starts");
    let gptq = DeviceGptq::new(&device);
    let settings = GptqSettings::default();
    // group 256 > the 128-column block: the device's block holds the whole group; 96: a block of 96.
    for (seed, rows, columns, group) in [(5u64, 24usize, 192usize, 32usize), (6, 9, 256, 256), (7, 12, 288, 96)] {
        let mut rng = Rng::new(seed);
        let weights = random(&mut rng, rows * columns);
        let mut hessian = Hessian::new(columns);
        hessian.add(&inputs(&mut rng, columns / 2, columns, &[3]));
        let factor = gptq.factor(&gptq.upload_hessian(&hessian).unwrap(), settings.damping).unwrap();
        let host_factor = InverseFactor::new(&hessian, settings.damping).unwrap();
        for rule in ScaleRule::ALL {
            let host = quantize_factored(&weights, rows, columns, &host_factor, group, rule, settings.block).unwrap();
            let device = gptq.quantize(&weights, (rows, columns), &factor, (group, rule), settings.block).unwrap();
            let share = agreement(&host, &device);
            let scales = host.scales.iter().zip(&device.scales).filter(|(a, b)| a == b).count();
            println!(
                "{rows}×{columns} group {group} {rule}: codes {:.4} %, scales {scales}/{}",
                100.0 * share,
                host.scales.len()
            );
            assert!(share >= MIN_CODE_AGREEMENT, "{rule} group {group}: {:.4} % of codes equal", 100.0 * share);
            // Every group's first scale is taken before any feedback arrives in its row... only the first group's.
            for r in 0..rows {
                assert_eq!(host.scales[r * columns / group], device.scales[r * columns / group], "{rule}: row {r}");
            }
            assert!(device.codes.iter().all(|&c| (-8..=7).contains(&c)));
        }
        // Given scales: codes in [-8, 7] against them.
        let given: Vec<bf16> =
            quantize(&weights, rows, columns, &hessian, group, ScaleRule::CtMinmax, settings).unwrap().scales;
        let host =
            squeeze::quant::gptq::quantize_with_scales(&weights, rows, columns, &hessian, group, &given, settings)
                .unwrap();
        let device =
            gptq.quantize_with_scales(&weights, (rows, columns), &factor, (group, &given), settings.block).unwrap();
        assert_eq!(device.scales, given);
        assert!(agreement(&host, &device) >= MIN_CODE_AGREEMENT);
    }
}

#[test]
fn a_diagonal_hessian_gives_round_to_nearest_bit_for_bit() {
    // No feedback: the device's scale rules (mse's search split over a warp) and codes equal the host's RTN.
    let device = Emulator::start().expect("the kernel emulator builds and starts");
    let gptq = DeviceGptq::new(&device);
    let (rows, columns, group) = (16, 128, 32);
    let mut rng = Rng::new(9);
    let weights = random(&mut rng, rows * columns);
    let mut unit = vec![0f32; columns * columns];
    for i in 0..columns {
        unit[i * columns + i] = 0.5 + (i % 3) as f32;
    }
    let mut hessian = gptq.hessian(columns).unwrap();
    gptq.add(&mut hessian, &unit).unwrap();
    let factor = gptq.factor(&hessian, 0.01).unwrap();
    for rule in ScaleRule::ALL {
        let mut codes = vec![0i8; rows * columns];
        let mut scales = vec![bf16::ZERO; rows * columns / group];
        for r in 0..rows {
            let (c, s) = (
                &mut codes[r * columns..(r + 1) * columns],
                &mut scales[r * columns / group..(r + 1) * columns / group],
            );
            quantize_row(&weights[r * columns..(r + 1) * columns], group, rule, c, s);
        }
        let device = gptq.quantize(&weights, (rows, columns), &factor, (group, rule), 128).unwrap();
        assert_eq!(device, Quantized { codes, scales }, "{rule}");
    }
}

#[test]
fn a_non_finite_hessian_and_bad_shapes_are_named() {
    let device = Emulator::start().expect("the kernel emulator builds and starts");
    let gptq = DeviceGptq::new(&device);
    let mut hessian = gptq.hessian(40).unwrap();
    let mut x = vec![1f32; 2 * 40];
    x[45] = f32::NAN;
    gptq.add(&mut hessian, &x).unwrap();
    match gptq.factor(&hessian, 0.01) {
        Err(DeviceGptqError::Gptq(GptqError::NotPositiveDefinite { column })) => assert!(column < 40),
        other => panic!("expected a column that is not positive definite, got {:?}", other.map(|_| ())),
    }
    let mut good = Hessian::new(8);
    good.add(&[1.0, 2.0, 0.5, 0.0, 1.0, 3.0, 1.0, 1.0]);
    let factor = gptq.factor(&gptq.upload_hessian(&good).unwrap(), 0.01).unwrap();
    let shape = gptq.quantize(&[0.0; 10], (2, 8), &factor, (4, ScaleRule::CtMinmax), 128);
    assert!(matches!(shape, Err(DeviceGptqError::Gptq(GptqError::Shape { rows: 2, columns: 8, got: 10 }))));
    let scales = gptq.quantize_with_scales(&[0.0; 16], (2, 8), &factor, (4, &[bf16::ONE; 3]), 128);
    assert!(matches!(scales, Err(DeviceGptqError::Gptq(GptqError::Scales { rows: 2, groups: 2, got: 3 }))));
}

#[test]
fn gptq_on_the_emulated_device_runs_its_algebra_there_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let (source, tokens) = never_routed_expert_source(dir.path());
    let out = dir.path().join("gptq-device");
    let report = squeeze(&[
        "quantize",
        path_str(&source),
        path_str(&out),
        "--method",
        "gptq",
        "--device",
        "emulated",
        "--calibration",
        path_str(&tokens),
        "--json",
    ])
    .ok()
    .json();
    assert_eq!(report["gptq_algebra"], "device");
    assert!(report["expert_coverage"]["calibrated"].as_u64().unwrap() > 0);
    squeeze(&["verify", path_str(&out), "--source", path_str(&source)]).ok();

    // `--bf16-activations`: the pass's GEMMs on activations rounded once — other statistics, other codes, still a
    // valid output; on the CPU the flag changes nothing.
    let run = |device: &str, name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let args = ["quantize", path_str(&source), path_str(&out), "--method", "gptq", "--device", device];
        squeeze(&[&args[..], &["--calibration", path_str(&tokens)], extra].concat()).ok();
        out
    };
    let bf16 = run("emulated", "gptq-device-bf16", &["--bf16-activations"]);
    squeeze(&["verify", path_str(&bf16), "--source", path_str(&source)]).ok();
    let shard = "model-00001-of-00001.safetensors";
    let read = |dir: &Path| std::fs::read(dir.join(shard)).unwrap();
    assert_ne!(read(&bf16), read(&out), "--bf16-activations changed nothing on the emulated device");
    let (cpu, cpu_bf16) = (run("cpu", "gptq-cpu", &[]), run("cpu", "gptq-cpu-bf16", &["--bf16-activations"]));
    assert_eq!(read(&cpu), read(&cpu_bf16), "--bf16-activations changed the CPU's output");
}

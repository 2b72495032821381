//! squeeze's GPTQ against llm-compressor 0.14.0.1's `quantize_weight` on the committed cases of `tests/golden/gptq/`
//! (written by `scripts/oracle/gptq/make-golden.py`; no Python needed here).
//!
//! Each case holds two llm-compressor runs on the same BF16-exact weights and inputs: an F32 model with
//! `scale_dtype: bfloat16` (`f32.*`: BF16 scale values, error feedback against the exact `code × scale`, which is
//! squeeze's contract) and a BF16 model (`bf16.*`: the same scales, feedback against `bf16(code × scale)`, because
//! compressed-tensors' fake-quantize multiplies in the scale's dtype). llm-compressor takes its group scales from
//! the original weights before GPTQ runs (its observer); squeeze's [`quantize`] takes them from the weights as
//! updated when a group starts. So codes are compared through [`quantize_with_scales`] given llm-compressor's
//! scales (the same algorithm from there on), and squeeze's default by its output error.
//!
//! Each case runs twice: GPTQ on the host, and GPTQ's algebra on the emulated device (kernels/gptq.cu: the Hessian
//! sum, the factor and the column loop as a GPU runs them), held to the same bounds.

use std::path::PathBuf;

use half::bf16;

use squeeze::io::dtype::Dtype;
use squeeze::io::ShardFile;
use squeeze::quant::gptq::{quantize, quantize_with_scales, GptqSettings, Hessian, Quantized};
use squeeze::quant::int4::quantize_row;
use squeeze::quant::ScaleRule;
use squeeze::runtime::cuda::gptq::DeviceGptq;
use squeeze::runtime::device::emulated::Emulator;

/// Share of live-column codes equal to the F32 model's when squeeze runs with its scales: the same algorithm and
/// the same feedback convention, f32 torch against f64 here. llm-compressor itself agrees with an f64 run of its own
/// code on 100 % of codes here (a working value lands within f32 rounding of a .5 boundary about once in 10⁵).
/// Measured: 100 % on all three cases (not one code differs). 0.999 allows a flip or two and its cascade along a
/// row should a summation order change; a convention difference (bf16 feedback, H scaling, damping base, block
/// order) gives 95–99 %.
const MIN_AGREEMENT_EXACT_FEEDBACK: f64 = 0.999;
/// Share of live-column codes equal to the BF16 model's. The BF16 model feeds back `w − bf16(code × scale)`, so its
/// codes differ from the F32 model's (llm-compressor against itself: 95.51 %, 97.56 %, 98.48 %); squeeze follows
/// the F32 model, so it can only match that: measured 95.51 %, 97.56 %, 98.45 % (max |Δcode| 2).
const MIN_AGREEMENT_BF16_FEEDBACK: f64 = 0.95;
/// `‖X Wᵀ − X Ŵᵀ‖` of squeeze with llm-compressor's scales against the F32 model's, as a ratio: measured
/// exactly 1 (the same codes). 0.1 % allows a few flipped codes; a wrong damping base or block update costs percents.
const MAX_ERROR_RATIO_EXACT_FEEDBACK: f64 = 1e-3;
/// squeeze's default (scales from the updated weights) against the F32 and BF16 models' output errors: measured
/// 1.015 / 0.974 / 1.036 × the F32 model's and 1.002 / 0.917 / 1.043 × the BF16 model's. The scale timing is a real
/// difference (over 40 random [32, 256] matrices squeeze's timing is 0.3 % worse on average at group 32, 0.5 % at
/// group 128, each way within ±2.5 %), so the bound is wider than for the fixed-scale run.
const MAX_DEFAULT_ERROR_RATIO: f64 = 1.06;
/// Every GPTQ run must beat round-to-nearest's output error by at least this factor: measured 0.68–0.71 on the
/// correlated full-rank inputs, 0.16–0.17 on the low-rank ones.
const MAX_ERROR_VS_RTN: f64 = 0.75;

struct Case {
    rows: usize,
    columns: usize,
    group: usize,
    dead: Vec<usize>,
    weight: Vec<f32>,
    inputs: Vec<f32>,
    /// llm-compressor on a BF16 model: codes, scales and its output `bf16(code × scale)`.
    bf16: Quantized,
    bf16_output: Vec<bf16>,
    /// llm-compressor on an F32 model with BF16 scale values.
    f32: Quantized,
}

fn bf16s(bytes: &[u8]) -> Vec<bf16> {
    bytes.chunks_exact(2).map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))).collect()
}

fn load(name: &'static str) -> Case {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/gptq").join(format!("{name}.safetensors"));
    let file = ShardFile::open(&path)
        .unwrap_or_else(|e| panic!("{e}: golden data missing; run scripts/oracle/gptq/make-golden.py"));
    let tensor = |key: &str, dtype: Dtype| {
        let tensor = file.get(key).unwrap_or_else(|| panic!("{name}: no tensor {key}"));
        assert_eq!(tensor.dtype, dtype, "{name}: {key}");
        (tensor.shape.to_vec(), tensor.bytes.to_vec())
    };
    let (shape, weight) = tensor("weight", Dtype::F32);
    let (rows, columns) = (shape[0], shape[1]);
    let weight = weight.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let (input_shape, inputs) = tensor("inputs", Dtype::BF16);
    assert_eq!(input_shape[1], columns);
    let inputs = bf16s(&inputs).into_iter().map(bf16::to_f32).collect();
    let run = |prefix: &str| Quantized {
        codes: tensor(&format!("{prefix}.codes"), Dtype::I8).1.into_iter().map(|b| b as i8).collect(),
        scales: bf16s(&tensor(&format!("{prefix}.scales"), Dtype::BF16).1),
    };
    let (bf16, f32) = (run("bf16"), run("f32"));
    let bf16_output = bf16s(&tensor("bf16.dequantized", Dtype::BF16).1);
    let metadata = file.metadata();
    let group = metadata["group_size"].parse().unwrap();
    let dead = metadata["dead_columns"].split(',').filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    Case { rows, columns, group, dead, weight, inputs, bf16, bf16_output, f32 }
}

/// `w = code × scale`, exactly (what a packed checkpoint holds).
fn dequantize(q: &Quantized, group: usize) -> Vec<f32> {
    q.codes.iter().enumerate().map(|(index, &code)| code as f32 * q.scales[index / group].to_f32()).collect()
}

/// Share of codes outside the dead columns that are equal, and the largest |Δcode| there.
fn agreement(case: &Case, a: &Quantized, b: &Quantized) -> (f64, i32) {
    let (mut equal, mut live, mut max_step) = (0usize, 0usize, 0i32);
    for (index, (&x, &y)) in a.codes.iter().zip(&b.codes).enumerate() {
        if case.dead.contains(&(index % case.columns)) {
            continue;
        }
        live += 1;
        equal += (x == y) as usize;
        max_step = max_step.max((x as i32 - y as i32).abs());
    }
    (equal as f64 / live as f64, max_step)
}

/// `‖X Wᵀ − X Ŵᵀ‖ / ‖X Wᵀ‖` over the calibration inputs, in f64.
fn output_error(case: &Case, approx: &[f32]) -> f64 {
    let columns = case.columns;
    let (mut difference, mut norm) = (0f64, 0f64);
    for x in case.inputs.chunks(columns) {
        for r in 0..case.rows {
            let w = &case.weight[r * columns..(r + 1) * columns];
            let a = &approx[r * columns..(r + 1) * columns];
            let (exact, delta) = x.iter().zip(w.iter().zip(a)).fold((0f64, 0f64), |(e, d), (&x, (&w, &a))| {
                (e + x as f64 * w as f64, d + x as f64 * (w as f64 - a as f64))
            });
            difference += delta * delta;
            norm += exact * exact;
        }
    }
    (difference / norm).sqrt()
}

fn round_to_nearest(case: &Case) -> Quantized {
    let (columns, groups) = (case.columns, case.columns / case.group);
    let mut codes = vec![0i8; case.rows * columns];
    let mut scales = vec![bf16::ZERO; case.rows * groups];
    for r in 0..case.rows {
        quantize_row(
            &case.weight[r * columns..(r + 1) * columns],
            case.group,
            ScaleRule::CtMinmax,
            &mut codes[r * columns..(r + 1) * columns],
            &mut scales[r * groups..(r + 1) * groups],
        );
    }
    Quantized { codes, scales }
}

/// Where the GPTQ under test runs.
#[derive(Debug, Clone, Copy)]
enum Place {
    Host,
    EmulatedDevice,
}

/// GPTQ with llm-compressor's scales and with squeeze's default, both against the case's inputs.
fn run(case: &Case, place: Place, scales: &[bf16]) -> (Quantized, Quantized) {
    let (rows, columns, group) = (case.rows, case.columns, case.group);
    let settings = GptqSettings::default();
    match place {
        Place::Host => {
            let mut hessian = Hessian::new(columns);
            hessian.add(&case.inputs);
            let fixed = quantize_with_scales(&case.weight, rows, columns, &hessian, group, scales, settings).unwrap();
            let default = quantize(&case.weight, rows, columns, &hessian, group, ScaleRule::CtMinmax, settings);
            (fixed, default.unwrap())
        }
        Place::EmulatedDevice => {
            let device = Emulator::start().expect("the kernel emulator builds and starts");
            let gptq = DeviceGptq::new(&device);
            let mut hessian = gptq.hessian(columns).unwrap();
            gptq.add(&mut hessian, &case.inputs).unwrap();
            let factor = gptq.factor(&hessian, settings.damping).unwrap();
            let shape = (rows, columns);
            let fixed = gptq.quantize_with_scales(&case.weight, shape, &factor, (group, scales), settings.block);
            let default = gptq.quantize(&case.weight, shape, &factor, (group, ScaleRule::CtMinmax), settings.block);
            (fixed.unwrap(), default.unwrap())
        }
    }
}

fn check(name: &'static str, place: Place) {
    let case = load(name);
    let (rows, columns, group) = (case.rows, case.columns, case.group);
    let groups = columns / group;

    // The golden's own consistency: the BF16 model's output is bf16(code × scale); both models got the same scales.
    for (index, (&code, &value)) in case.bf16.codes.iter().zip(&case.bf16_output).enumerate() {
        assert!((-8..=7).contains(&code), "{name}: code {code} at {index}");
        assert_eq!(value, bf16::from_f32(code as f32 * case.bf16.scales[index / group].to_f32()), "{name}: {index}");
    }
    assert_eq!(case.bf16.scales, case.f32.scales, "{name}: the golden's two runs have different scales");

    // Scales: llm-compressor's observer on the original weights is squeeze's ct-minmax rule, bit for bit.
    let rtn = round_to_nearest(&case);
    assert_eq!(rtn.scales, case.f32.scales, "{name}: ct-minmax scales differ from llm-compressor's observer");

    let (fixed, default) = run(&case, place, &case.f32.scales);

    // llm-compressor zeroes the columns no input excites; squeeze keeps them, rounded to nearest (their feedback
    // to the other columns is zero, since H⁻¹ has no off-diagonal entries in their row and column).
    for &column in &case.dead {
        for r in 0..rows {
            let index = r * columns + column;
            assert_eq!((case.f32.codes[index], case.bf16.codes[index]), (0, 0), "{name}: dead column {column}");
            assert_eq!(fixed.codes[index], rtn.codes[index], "{name}: dead column {column} row {r} is not RTN");
        }
    }

    let (exact_agreement, exact_step) = agreement(&case, &fixed, &case.f32);
    let (bf16_agreement, bf16_step) = agreement(&case, &fixed, &case.bf16);
    let error = |q: &Quantized| output_error(&case, &dequantize(q, group));
    let (f32_error, bf16_error) = (error(&case.f32), error(&case.bf16));
    let (fixed_error, default_error, rtn_error) = (error(&fixed), error(&default), error(&rtn));
    let scales_equal = default.scales.iter().zip(&case.f32.scales).filter(|(a, b)| a == b).count();
    println!(
        "{name} ({place:?}): squeeze with llm-compressor's scales: codes equal to the f32 model {:.3} % (max |Δ| {exact_step}), \
         to the bf16 model {:.3} % (max |Δ| {bf16_step}). Output error: f32 model {f32_error:.5}, bf16 model \
         {bf16_error:.5}, squeeze fixed scales {fixed_error:.5}, squeeze default {default_error:.5} ({:.4}× f32, \
         {:.4}× bf16; scales equal {scales_equal}/{}), rtn {rtn_error:.5}",
        100.0 * exact_agreement,
        100.0 * bf16_agreement,
        default_error / f32_error,
        default_error / bf16_error,
        default.scales.len(),
    );
    assert!(
        exact_agreement >= MIN_AGREEMENT_EXACT_FEEDBACK,
        "{name}: {:.3} % of codes equal to llm-compressor's f32 model",
        100.0 * exact_agreement
    );
    assert!(
        bf16_agreement >= MIN_AGREEMENT_BF16_FEEDBACK,
        "{name}: {:.3} % of codes equal to llm-compressor's bf16 model",
        100.0 * bf16_agreement
    );
    assert!(
        (fixed_error / f32_error - 1.0).abs() <= MAX_ERROR_RATIO_EXACT_FEEDBACK,
        "{name}: output error with llm-compressor's scales {fixed_error:.5} vs its f32 model {f32_error:.5}"
    );
    for (model, reference) in [("f32", f32_error), ("bf16", bf16_error)] {
        assert!(
            default_error <= MAX_DEFAULT_ERROR_RATIO * reference,
            "{name}: default output error {default_error:.5} vs llm-compressor's {model} model {reference:.5}"
        );
    }
    // Before the first group's first column no feedback has arrived: its scales are the observer's.
    assert!((0..rows).all(|r| default.scales[r * groups] == case.f32.scales[r * groups]), "{name}: first group");
    for (label, error) in [("f32 model", f32_error), ("bf16 model", bf16_error), ("squeeze", default_error)] {
        assert!(error <= MAX_ERROR_VS_RTN * rtn_error, "{name}: {label} {error:.5} vs rtn {rtn_error:.5}");
    }
}

#[test]
fn full_rank_inputs_match_llm_compressor() {
    check("full_rank_g32", Place::Host);
}

#[test]
fn low_rank_inputs_over_two_blocks_match_llm_compressor() {
    check("low_rank_g128", Place::Host);
}

#[test]
fn dead_columns_match_llm_compressor_elsewhere() {
    check("dead_columns_g32", Place::Host);
}

#[test]
fn full_rank_inputs_match_llm_compressor_on_the_emulated_device() {
    check("full_rank_g32", Place::EmulatedDevice);
}

#[test]
fn low_rank_inputs_over_two_blocks_match_llm_compressor_on_the_emulated_device() {
    check("low_rank_g128", Place::EmulatedDevice);
}

#[test]
fn dead_columns_match_llm_compressor_elsewhere_on_the_emulated_device() {
    check("dead_columns_g32", Place::EmulatedDevice);
}
